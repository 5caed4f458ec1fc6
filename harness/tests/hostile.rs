//! Hostile and careless input: every bad value is refused by `wringer validate` with exit 2 and
//! the file, line and column, before anything runs: no panic, no huge allocation.

use std::process::Command;

const WRINGER: &str = env!("CARGO_BIN_EXE_wringer");

fn validate(tag: &str, yaml: &str) -> (i32, String) {
    validate_at(tag, "s.yaml", yaml)
}

/// Write `text` to `name` (a path under a fresh folder) and run `wringer validate` on it.
fn validate_at(tag: &str, name: &str, text: &str) -> (i32, String) {
    let dir = std::env::temp_dir().join(format!("wringer-hostile-{tag}-{}", std::process::id()));
    let file = dir.join(name);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, text).unwrap();
    let out = Command::new(WRINGER)
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scenario(deadline: &str, step: &str) -> String {
    format!(
        "name: h\ndescription: d\nranks: 2\ndeadline: {deadline}\nsteps:\n  - {step}\nexpect: {{}}\n"
    )
}

#[test]
fn a_duration_no_clock_can_hold_is_a_located_error() {
    let (code, err) = validate(
        "dur",
        &scenario(
            "99999999999999999999s",
            "stall: { duration: 1s, deadline: 5s }",
        ),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("s.yaml:4:11") && err.contains("7 days"),
        "{err}"
    );
}

#[test]
fn every_parameter_that_sizes_work_has_a_bound() {
    let huge = "4294967295";
    let steps = [
        format!("teardown-cycles: {{ cycles: {huge}, deadline: 10s }}"),
        format!("pingpong: {{ sizes: [64], iterations: {huge}, deadline: 10s }}"),
        "pingpong: { sizes: [4294967295], iterations: 1, deadline: 10s }".to_string(),
        format!("pingpong: {{ fabric: rdma, sizes: [64], iterations: {huge}, deadline: 10s }}"),
        format!("rdma-lossless-stream: {{ messages: 1, size: {huge}, deadline: 10s }}"),
        format!("rdma-lossless-stream: {{ messages: {huge}, size: 64, deadline: 10s }}"),
        format!("rdma-interop-rc-pingpong: {{ size: 64, iterations: {huge}, deadline: 10s }}"),
        format!("rdma-graceful-shutdown: {{ connections: {huge}, messages: 1, stats_period: 5ms, deadline: 10s }}"),
        format!("peer-death: {{ fabric: rdma, frames_before_fault: {huge}, detect_timeout: 1s, deadline: 10s }}"),
        format!("rdma-xhost-send: {{ messages: {huge}, server_seconds: 1s, deadline: 10s }}"),
        format!("peer-death: {{ victim: 1, frames_before_fault: {huge}, detect_timeout: 1s, deadline: 10s }}"),
        format!("exact-reads: {{ dribbled_frames: 1, split_payload_bytes: {huge}, large_sizes: [], random_splits: 0, deadline: 10s }}"),
        format!("lazy-connect-deadline-race: {{ attempts: {huge}, wait_timeout: 20ms, spread: 10ms, deadline: 60s }}"),
    ];
    for (i, step) in steps.iter().enumerate() {
        let (code, err) = validate(&format!("bound-{i}"), &scenario("60s", step));
        assert_eq!(code, 2, "{step}: {err}");
        assert!(err.contains("s.yaml:6:5"), "{step}: {err}");
        assert!(
            err.contains("must be") || err.contains("needs"),
            "{step}: {err}"
        );
    }
}

#[test]
fn a_name_that_would_leave_the_report_folder_is_a_located_error() {
    for (i, name) in [
        "\"../escape\"",
        "\"\"",
        "\"a\\nPASS\"",
        "\"\\e]0;title\\a\"",
    ]
    .iter()
    .enumerate()
    {
        let yaml = scenario("10s", "stall: { duration: 1s, deadline: 5s }")
            .replace("name: h", &format!("name: {name}"));
        let (code, err) = validate(&format!("name-{i}"), &yaml);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(err.contains("s.yaml:1:7"), "{name}: {err}");
        // The message never echoes a control character back to the terminal.
        assert!(
            !err.contains('\u{1b}') && !err.contains('\u{7}'),
            "{name}: {err:?}"
        );
    }
}

fn profile(tag: &str, hosts: &str, addr: &str) -> (i32, String) {
    let yaml = format!(
        "name: pair\ndescription: d\nkind: ssh\ncoordinator_addr: \"{addr}\"\nhosts:\n{hosts}"
    );
    validate_at(&format!("p-{tag}"), "hosts/pair.yaml", &yaml)
}

#[test]
fn inventories_with_a_non_address_a_zero_port_or_twin_hosts_are_refused() {
    let host = |name: &str, port: &str| {
        format!("  - name: {name}\n    ssh: {{ host: \"10.0.0.1\"{port} }}\n    data_addr: \"10.0.0.1\"\n")
    };
    let two = format!("{}{}", host("a", ""), host("b", ""));
    assert_eq!(profile("ok", &two, "10.0.0.9").0, 0);
    let (code, err) = profile("addr", &two, "not an address");
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("pair.yaml:4:") && err.contains("coordinator_addr"),
        "{err}"
    );
    let (code, err) = profile(
        "port",
        &format!("{}{}", host("a", ", port: 0"), host("b", "")),
        "10.0.0.9",
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("pair.yaml:") && err.contains("port 0"),
        "{err}"
    );
    let (code, err) = profile(
        "twins",
        &format!("{}{}", host("a", ""), host("a", "")),
        "10.0.0.9",
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("pair.yaml:9:") && err.contains("used twice"),
        "{err}"
    );
}

#[test]
fn slurm_profiles_with_unsafe_or_malformed_values_are_refused_where_they_are() {
    let slurm = |tag: &str, body: &str| {
        let yaml = format!(
            "name: s\ndescription: d\nkind: slurm\ncoordinator_addr: \"10.0.0.9\"\nslurm:\n{body}"
        );
        validate_at(&format!("s-{tag}"), "hosts/s.yaml", &yaml)
    };
    let good = "  partition: batch\n  nodes: \"gpu[01-03]\"\n  time_limit: \"1:00:00\"\n  srun_options: [\"--exclusive\", \"--gres=gpu:1\"]\n";
    assert_eq!(slurm("ok", good).0, 0, "{}", slurm("ok", good).1);
    let cases = [
        // (tag, body, where, what the error must say)
        (
            "export",
            "  nodes: 2\n  time_limit: \"30\"\n  srun_options: [\"--export=ALL\"]\n",
            "s.yaml:8:",
            "not allowed",
        ),
        (
            "shell",
            "  nodes: 2\n  time_limit: \"30\"\n  srun_options: [\"--gres=gpu;reboot\"]\n",
            "s.yaml:8:",
            "not allowed",
        ),
        (
            "prolog",
            "  nodes: 2\n  time_limit: \"30\"\n  srun_options:\n    - \"--task-prolog=/tmp/x\"\n",
            "s.yaml:9:",
            "not allowed",
        ),
        (
            "nodelist",
            "  nodes: \"n[0-2\"\n  time_limit: \"30\"\n",
            "s.yaml:6:",
            "without `]`",
        ),
        (
            "zero",
            "  nodes: 0\n  time_limit: \"30\"\n",
            "s.yaml:6:",
            "1..=4096",
        ),
        (
            "time",
            "  nodes: 2\n  time_limit: \"1:2:3:4\"\n",
            "s.yaml:7:",
            "not a Slurm time",
        ),
        (
            "option",
            "  partition: \"-p\"\n  nodes: 2\n  time_limit: \"30\"\n",
            "s.yaml:6:",
            "not starting with `-`",
        ),
        (
            "account",
            "  account: \"a b\"\n  nodes: 2\n  time_limit: \"30\"\n",
            "s.yaml:6:",
            "slurm.account",
        ),
        (
            "cluster-list",
            "  nodes: \"n[0-2]\"\n  time_limit: \"30\"\n  test_cluster: {}\n",
            "s.yaml:6:",
            "given as a count",
        ),
    ];
    for (tag, body, at, what) in cases {
        let (code, err) = slurm(tag, body);
        assert_eq!(code, 2, "{tag}: {err}");
        assert!(err.contains(at) && err.contains(what), "{tag}: {err}");
    }
    // Without a test cluster, the rendezvous needs an address the nodes reach.
    let (code, err) = validate_at(
        "s-addr",
        "hosts/s.yaml",
        "name: s\ndescription: d\nkind: slurm\nslurm: { nodes: 2, time_limit: \"30\" }\n",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("coordinator_addr"), "{err}");
}

#[test]
fn validate_locates_every_bad_file_and_never_passes_one_silently() {
    let stall = "stall: { duration: 1s, deadline: 5s }";
    let cases = [
        (
            "repeat",
            scenario("10s", stall).replace("ranks: 2", "ranks: 2\nrepeat: 0"),
            "s.yaml:4:9",
            "at least 1",
        ),
        (
            "steps",
            scenario("10s", stall).replace(&format!("steps:\n  - {stall}"), "steps: []"),
            "s.yaml:5:8",
            "at least one step",
        ),
        (
            "nan",
            scenario("10s", stall).replace("expect: {}", "expect:\n  cycles: { min: .nan }"),
            "s.yaml:8:11",
            "finite",
        ),
        (
            "minmax",
            scenario("10s", stall).replace("expect: {}", "expect:\n  cycles: { min: 5, max: 1 }"),
            "s.yaml:8:11",
            "above max",
        ),
    ];
    for (tag, yaml, at, what) in cases {
        let yaml = if tag == "nan" || tag == "minmax" {
            yaml.replace(stall, "teardown-cycles: { cycles: 10, deadline: 5s }")
        } else {
            yaml
        };
        let (code, err) = validate(tag, &yaml);
        assert_eq!(code, 2, "{tag}: {err}");
        assert!(err.contains(at) && err.contains(what), "{tag}: {err}");
    }
    // Not UTF-8: the line and column of the first bad byte.
    let dir = std::env::temp_dir().join(format!("wringer-hostile-bytes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bytes.yaml");
    std::fs::write(&file, b"name: h\ndescription: \xff\xfe\n").unwrap();
    let out = Command::new(WRINGER)
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bytes.yaml:2:14") && err.contains("not UTF-8"),
        "{err}"
    );
    // A folder named like a scenario file is no scenario.
    let folder = dir.join("x.yaml");
    std::fs::create_dir_all(&folder).unwrap();
    let out = Command::new(WRINGER)
        .arg("validate")
        .arg(&folder)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A host profile is checked as one wherever it lies.
    let profile = dir.join("my-profile.yaml");
    std::fs::write(
        &profile,
        "name: p\ndescription: d\nkind: local\nmust_have: [gpu]\n",
    )
    .unwrap();
    let out = Command::new(WRINGER)
        .arg("validate")
        .arg(&profile)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_threshold_that_is_not_a_finite_fraction_is_refused() {
    for bad in ["NaN", "inf", "-1", "x"] {
        let out = Command::new(WRINGER)
            .args(["report", &format!("--threshold={bad}"), "/nonexistent"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--threshold"),
            "{bad}"
        );
    }
}

#[test]
fn an_error_that_quotes_the_input_never_writes_a_control_character_raw() {
    let yaml = scenario("10s", "stall: { duration: 1s, deadline: 5s }")
        .replace("ranks: 2", "ranks: 2\n\"\\e]0;pwned\\a\": 1");
    let (code, err) = validate("ctl", &yaml);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("s.yaml:"), "{err}");
    assert!(!err.contains('\u{1b}') && !err.contains('\u{7}'), "{err:?}");
}

#[test]
fn a_release_placeholder_or_family_that_cannot_be_filled_is_a_located_error() {
    let step = r#"exec: { deadline: 10s, roles: { a: { ranks: [0, 1], program: "{release}/bin/python" } } }"#;
    let (code, err) = validate("release", &scenario("30s", step));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("s.yaml:6:5") && err.contains("only a scenario with `releases:`"),
        "{err}"
    );
    let unknown = scenario("30s", step).replace("ranks: 2\n", "ranks: 2\nreleases: tensorflow\n");
    let (code, err) = validate("release-family", &unknown);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("s.yaml:4:11") && err.contains("expected one of torch"),
        "{err}"
    );
}

#[test]
fn special_files_in_every_input_end_at_once_with_exit_2_and_say_what_they_are() {
    let dir = std::env::temp_dir().join(format!("wringer-hostile-special-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("hosts")).unwrap();
    std::fs::create_dir_all(dir.join("run")).unwrap();
    let fifo = |name: &str| {
        let p = dir.join(name);
        assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
        p
    };
    let scenario = fifo("s.yaml");
    let profile = fifo("hosts/p.yaml");
    fifo("run/results.json");
    std::fs::write(
        dir.join("hosts/zero.yaml"),
        "name: zero\ndescription: d\nkind: local\nknown_failures_file: /dev/zero\n",
    )
    .unwrap();
    // Nobody ever opens the other end of these FIFOs: a wringer that opened one would wait
    // forever, so ending by itself at all is the check (no wall-clock bound a busy machine
    // could miss; the deadline only keeps a regression from hanging the suite).
    let wringer = |args: &[&std::ffi::OsStr]| {
        let mut child = Command::new(WRINGER)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{args:?} waited on a FIFO nobody writes (killed after 60 s)");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        (status.code(), err)
    };
    let (code, err) = wringer(&["validate".as_ref(), scenario.as_os_str()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("is a FIFO (named pipe), not a regular file: name a scenario file"),
        "{err}"
    );
    let (code, err) = wringer(&["validate".as_ref(), profile.as_os_str()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("not a regular file: name a host profile file"),
        "{err}"
    );
    let (code, err) = wringer(&["validate".as_ref(), dir.join("hosts/zero.yaml").as_os_str()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("/dev/zero: is a character device"), "{err}");
    let (code, err) = wringer(&[
        "report".as_ref(),
        dir.join("run").as_os_str(),
        "--out".as_ref(),
        dir.join("page.html").as_os_str(),
        "--history".as_ref(),
        dir.join("history.jsonl").as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("results.json: is a FIFO"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn values_run_would_stumble_on_are_refused_by_validate() {
    let exec = |role: &str| {
        format!(
            r#"exec: {{ deadline: 10s, roles: {{ "{role}": {{ ranks: [0, 1], program: sh }} }} }}"#
        )
    };
    // A role name with markup or a newline would reach summary.md and the rank logs raw.
    for bad in ["<b>x</b>", "a\\nstarting: forged", "../up"] {
        let (code, err) = validate("role", &scenario("30s", &exec(bad)));
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(
            err.contains("s.yaml:6:5") && err.contains("role name"),
            "{bad}: {err}"
        );
    }
    assert_eq!(
        validate("role-ok", &scenario("30s", &exec("client-1"))).0,
        0
    );
    // Repeats past the bound, and a perturbation on a syscall that does not exist.
    let many = scenario("30s", &exec("a")).replace("ranks: 2\n", "ranks: 2\nrepeat: 4294967295\n");
    let (code, err) = validate("repeat", &many);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("s.yaml:4:9") && err.contains("repeat is at most 10000"),
        "{err}"
    );
    let perturbed = scenario("30s", &exec("a")).replace(
        "ranks: 2\n",
        "ranks: 2\nperturb:\n  - { syscall: recvfromm, delay_enter: 1ms }\n",
    );
    let (code, err) = validate("perturb", &perturbed);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("s.yaml:5:5") && err.contains("`recvfromm` is not a syscall"),
        "{err}"
    );
    // A coordinator address nobody can connect to.
    let host = "  - name: a\n    ssh: { host: \"10.0.0.1\" }\n    data_addr: \"10.0.0.1\"\n";
    for addr in ["255.255.255.255", "224.0.0.1", "0.0.0.0", "ff02::1"] {
        let (code, err) = profile("bcast", host, addr);
        assert_eq!(code, 2, "{addr}: {err}");
        assert!(
            err.contains("pair.yaml:4:") && err.contains("must be a unicast address"),
            "{addr}: {err}"
        );
    }
    // A known failure for every scenario, unless it says so.
    let every = "name: p\ndescription: d\nkind: local\nknown_failures:\n  - { scenario: \"*\", kind: bound, reason: r }\n";
    let (code, err) = validate_at("every", "hosts/p.yaml", every);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("p.yaml:5:5") && err.contains("matches every scenario"),
        "{err}"
    );
    let meant = every.replace("reason: r }", "reason: r, match_all: true }");
    let (code, err) = validate_at("every-meant", "hosts/p.yaml", &meant);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: known failure `*` has match_all: true"),
        "{err}"
    );
}

#[test]
fn a_repeat_override_of_zero_is_refused_not_run_as_a_pass() {
    let out = Command::new(WRINGER)
        .args(["run", "--repeat", "0", "scenarios/tcp-exact-reads.yaml"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("repeat must be at least 1"), "{err}");
}
