//! The `wringer` binary end to end: verdicts, exit codes, the watchdog, SIGINT, the rendezvous
//! token, and that no rank process outlives a run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::processes_with;
use serde_json::Value;

mod common;

const WRINGER: &str = env!("CARGO_BIN_EXE_wringer");

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// A unique marker in the environment: ranks inherit it, so we can find every process a run
/// started, and prove none is left.
fn marker() -> String {
    format!(
        "wringer-test-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    )
}

/// wringer with `args`, its processes marked `marker` (see `common::processes_with`).
fn marked(marker: &str, args: &[&str]) -> Command {
    let mut c = common::wringer();
    c.args(args).env("WRINGER_TEST_MARKER", marker);
    c
}

/// Start a run in the background (output discarded) for tests that act on it while it runs.
fn spawn_run(marker: &str, args: &[&str]) -> std::process::Child {
    marked(marker, args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("wringer starts")
}

fn run_to_end(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("wringer runs")
}

fn results(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("results.json")).expect("results.json")).unwrap()
}

fn report_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wringer-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn passing_scenario_exits_zero_with_all_reports() {
    let dir = report_dir("pass");
    let m = marker();
    let out = run_to_end(marked(
        &m,
        &[
            "run",
            "scenarios/tcp-exact-reads.yaml",
            "--report-dir",
            dir.to_str().unwrap(),
        ],
    ));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let r = results(&dir);
    assert_eq!(r["complete"], true);
    assert_eq!(r["scenarios"][0]["verdict"], "pass");
    assert_eq!(r["scenarios"][0]["metrics"]["frames_corrupt"]["max"], 0.0);
    for f in ["results.jsonl", "junit.xml", "summary.md"] {
        assert!(dir.join(f).exists(), "{f} missing");
    }
    let junit = std::fs::read_to_string(dir.join("junit.xml")).unwrap();
    assert!(junit.contains("tcp-exact-reads") && !junit.contains("<failure"));
    assert!(processes_with(&m).is_empty());
}

#[test]
fn unmet_expectation_is_a_failure_with_exit_one() {
    let dir = report_dir("impossible");
    let out = run_to_end(marked(
        &marker(),
        &[
            "run",
            fixture("impossible.yaml").to_str().unwrap(),
            "--report-dir",
            dir.to_str().unwrap(),
        ],
    ));
    assert_eq!(out.status.code(), Some(1));
    let r = results(&dir);
    assert_eq!(r["scenarios"][0]["verdict"], "fail");
    let reason = r["scenarios"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("frames_intact") && reason.contains("999"),
        "{reason}"
    );
    let junit = std::fs::read_to_string(dir.join("junit.xml")).unwrap();
    assert!(junit.contains("<failure"), "{junit}");
}

#[test]
fn broken_yaml_is_exit_two_with_file_line_and_column() {
    for (file, line_col, what) in [
        ("unknown-key.yaml", ":5:1:", "unknown field `stepz`"),
        ("bad-type.yaml", ":7:15:", "invalid u32"),
        (
            "renamed-kind.yaml",
            ":9:",
            "step kind `rdma-peer-death` is now `peer-death` with `fabric: rdma`",
        ),
        (
            "misspelt-fault-point.yaml",
            ":11:5:",
            "fault at `midstream`: no step reaches that point, so the fault would never strike; its steps report `mid-stream`",
        ),
        (
            "qp-error-unobserved.yaml",
            ":7:5:",
            "a `qp-error` fault moves the rank's QPs through the verbs observer: add `audit: [verbs-lifecycle]`",
        ),
        (
            "wire-loss-out-of-range.yaml",
            ":7:5:",
            "fault: percent must be 1..=99, got 100 (all packets: `roce-blackhole`)",
        ),
    ] {
        let path = fixture(file);
        let out = run_to_end(marked(
            &marker(),
            &[
                "run",
                path.to_str().unwrap(),
                "--report-dir",
                report_dir("broken").to_str().unwrap(),
            ],
        ));
        assert_eq!(out.status.code(), Some(2), "{file}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{}{line_col}", path.display())),
            "{file}: {err}"
        );
        assert!(err.contains(what), "{file}: {err}");
        let v = run_to_end(marked(&marker(), &["validate", path.to_str().unwrap()]));
        assert_eq!(v.status.code(), Some(2));
    }
}

#[test]
fn hung_rank_fires_the_watchdog_with_stacks_and_leaves_nothing() {
    let dir = report_dir("hang");
    let m = marker();
    let out = run_to_end(marked(
        &m,
        &[
            "run",
            fixture("stall.yaml").to_str().unwrap(),
            "--report-dir",
            dir.to_str().unwrap(),
        ],
    ));
    assert_eq!(out.status.code(), Some(1));
    let s = &results(&dir)["scenarios"][0];
    assert_eq!(s["verdict"], "fail");
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains("watchdog") && reason.contains("step 0 (stall)"),
        "{reason}"
    );
    let stacks = s["evidence"]["stacks"].as_array().unwrap();
    assert_eq!(stacks.len(), 2, "one stack capture per rank");
    assert!(stacks
        .iter()
        .all(|st| st["text"].as_str().unwrap().contains("--- thread")));
    assert!(processes_with(&m).is_empty(), "ranks outlived the run");
}

#[test]
fn eight_hung_ranks_are_frozen_at_once_and_their_stacks_read_in_parallel() {
    let dir = report_dir("hang8");
    let m = marker();
    let out = run_to_end(marked(
        &m,
        &[
            "run",
            fixture("hung8.yaml").to_str().unwrap(),
            "--report-dir",
            dir.to_str().unwrap(),
        ],
    ));
    assert_eq!(out.status.code(), Some(1));
    let stacks = results(&dir)["scenarios"][0]["evidence"]["stacks"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(stacks.len(), 8, "a stack capture per rank");
    let texts: Vec<&str> = stacks
        .iter()
        .map(|st| st["text"].as_str().unwrap())
        .collect();
    assert!(texts.iter().all(|t| t.contains("--- thread")));
    // Frozen at once, before any stack was read: every thread of every rank was stopped when
    // its kernel stack was taken (the evidence, not the wall clock, of one freeze for all).
    for t in &texts {
        for header in t.lines().filter(|l| l.starts_with("--- thread")) {
            assert!(
                header.contains(" state=T "),
                "not frozen when read: {header}"
            );
        }
    }
    // gdb, slow and a core each, for the first two only: kernel stacks for all eight.
    let with_gdb = texts.iter().filter(|t| t.contains("--- gdb")).count();
    assert!(with_gdb <= 2, "{with_gdb} ranks read with gdb");
    assert!(processes_with(&m).is_empty(), "ranks outlived the run");
}

/// The rendezvous address a rank was started with (its `--rendezvous` argument).
fn rendezvous_of(rank: u32) -> String {
    let cmdline =
        String::from_utf8(std::fs::read(format!("/proc/{rank}/cmdline")).unwrap()).unwrap();
    let args: Vec<&str> = cmdline.split('\0').collect();
    args[args.iter().position(|a| *a == "--rendezvous").unwrap() + 1].to_string()
}

/// Wait (bounded) until a run's ranks exist; returns their pids.
fn wait_for_ranks(m: &str, n: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ranks: Vec<u32> = processes_with(m)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| c.windows(4).any(|w| w == b"rank"))
                    .unwrap_or(false)
            })
            .collect();
        if ranks.len() >= n {
            return ranks;
        }
        assert!(Instant::now() < deadline, "ranks never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigint_mid_run_writes_a_partial_report_and_leaves_nothing() {
    let dir = report_dir("sigint");
    let m = marker();
    let mut child = spawn_run(
        &m,
        &[
            "run",
            fixture("slow.yaml").to_str().unwrap(),
            "scenarios/tcp-exact-reads.yaml",
            "--report-dir",
            dir.to_str().unwrap(),
        ],
    );
    wait_for_ranks(&m, 2);
    // SAFETY: kill with a pid we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("wringer did not exit after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1));
    let r = results(&dir);
    assert_eq!(r["interrupted"], true);
    assert_eq!(r["complete"], false);
    assert_eq!(r["scenarios"][0]["verdict"], "fail");
    assert_eq!(
        r["scenarios"].as_array().unwrap().len(),
        1,
        "the second scenario must not start"
    );
    assert!(std::fs::read_to_string(dir.join("summary.md"))
        .unwrap()
        .contains("Interrupted"));
    assert!(
        processes_with(&m).is_empty(),
        "ranks outlived the interrupted run"
    );
}

#[test]
fn rendezvous_connection_with_a_wrong_token_is_rejected() {
    let dir = report_dir("token");
    let m = marker();
    let child = spawn_run(
        &m,
        &[
            "run",
            fixture("slow.yaml").to_str().unwrap(),
            "--report-dir",
            dir.to_str().unwrap(),
        ],
    );
    let addr = rendezvous_of(wait_for_ranks(&m, 1)[0]);
    let mut intruder = std::net::TcpStream::connect(&addr).unwrap();
    writeln!(
        intruder,
        r#"{{"type":"hello","rank":0,"token":"00000000000000000000000000000000","pid":1}}"#
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the intruder must not disturb the run"
    );
    let s = &results(&dir)["scenarios"][0];
    assert_eq!(s["verdict"], "pass");
    assert_eq!(s["evidence"]["rejected_rendezvous_connections"], 1);
}

#[test]
fn a_stranger_dribbling_bytes_into_the_rendezvous_cannot_hold_the_run_open() {
    let dir = report_dir("dribble");
    let m = marker();
    let child = spawn_run(
        &m,
        &[
            "run",
            fixture("slow.yaml").to_str().unwrap(),
            "--report-dir",
            dir.to_str().unwrap(),
        ],
    );
    let addr = rendezvous_of(wait_for_ranks(&m, 1)[0]);
    // Forty strangers, each sending a byte every 2 s and never a newline, until cut off.
    // Each returns whether it was cut off before its 30th byte (60 s): a run they could hold
    // open would let every one of them finish.
    let dribblers: Vec<_> = (0..40)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let Ok(mut s) = std::net::TcpStream::connect(&addr) else {
                    return true;
                };
                for _ in 0..30 {
                    if s.write_all(b"{").is_err() {
                        return true;
                    }
                    std::thread::sleep(Duration::from_secs(2));
                }
                false
            })
        })
        .collect();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let s = &results(&dir)["scenarios"][0];
    assert_eq!(s["verdict"], "pass");
    // The run ended and closed the rendezvous under them: every stranger was cut off.
    let cut = dribblers
        .into_iter()
        .map(|d| d.join().unwrap())
        .filter(|cut| *cut)
        .count();
    assert_eq!(
        cut, 40,
        "strangers that dribbled to the end held the run open"
    );
    assert!(processes_with(&m).is_empty());
}

fn write_inventory(tag: &str, body: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wringer-inv-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("inventory.yaml");
    std::fs::write(&f, body).unwrap();
    f
}

#[test]
fn placeholder_inventories_are_refused_before_any_connection() {
    // An ssh first on PATH that records being started: refused before any connection means
    // it never runs.
    let bin = std::env::temp_dir().join(format!("wringer-fake-ssh-{}", std::process::id()));
    std::fs::create_dir_all(&bin).unwrap();
    let ssh_log = bin.join("ssh-was-started");
    let fake = bin.join("ssh");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\ntouch '{}'\nexit 255\n", ssh_log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for inv in [
        "hosts/dgx-spark-pair.yaml",
        "hosts/a100-pair.yaml",
        "hosts/mi300x-pair.yaml",
    ] {
        let mut cmd = marked(
            &marker(),
            &[
                "run",
                "--hosts",
                inv,
                "--report-dir",
                report_dir("placeholder").to_str().unwrap(),
            ],
        );
        cmd.env("PATH", &path);
        let out = run_to_end(cmd);
        assert_eq!(out.status.code(), Some(2), "{inv}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{inv}:")) && err.contains("placeholder"),
            "{inv}: {err}"
        );
        assert!(
            !ssh_log.exists(),
            "{inv}: ssh was started before the placeholders were refused"
        );
        assert_eq!(
            run_to_end(marked(&marker(), &["validate", inv]))
                .status
                .code(),
            Some(2)
        );
    }
}

/// Values that would become ssh options or remote shell syntax are refused at load time, and
/// nothing they say is executed.
#[test]
fn hostile_inventory_values_are_refused_and_never_run() {
    let canary = std::env::temp_dir().join(format!("wringer-pwned-{}", std::process::id()));
    let hostile = [
        (
            "user",
            format!(
                "ssh: {{ host: 127.0.0.1, user: \"-oProxyCommand=touch {}\" }}",
                canary.display()
            ),
        ),
        (
            "host",
            format!("ssh: {{ host: \"$(touch {})\" }}", canary.display()),
        ),
        (
            "host-option",
            "ssh: { host: \"-oProxyCommand=id\" }".to_string(),
        ),
        (
            "identity",
            format!(
                "ssh: {{ host: 127.0.0.1, identity: \"/tmp/k; touch {}\" }}",
                canary.display()
            ),
        ),
    ];
    for (field, ssh) in hostile {
        let body = format!(
            "name: hostile\ndescription: d\nkind: ssh\ncoordinator_addr: 127.0.0.1\nhosts:\n  - name: h\n    {ssh}\n    data_addr: 127.0.0.1\n"
        );
        let inv = write_inventory(field, &body);
        let out = run_to_end(marked(
            &marker(),
            &[
                "run",
                "scenarios/tcp-exact-reads.yaml",
                "--hosts",
                inv.to_str().unwrap(),
            ],
        ));
        assert_eq!(
            out.status.code(),
            Some(2),
            "{field}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is not allowed") && err.contains(":7:"),
            "{field}: {err}"
        );
        assert!(!canary.exists(), "{field}: a hostile value was executed");
    }
}

/// A host that does not answer is a clear failure (exit 1, names the host), never a hang.
/// Loopback with a closed port: nothing leaves this machine.
#[test]
fn unreachable_host_fails_fast_with_a_clear_message() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let body = format!(
        "name: unreachable\ndescription: d\nkind: ssh\ncoordinator_addr: 127.0.0.1\nhosts:\n  - name: gone\n    ssh: {{ host: 127.0.0.1, port: {port} }}\n    data_addr: 127.0.0.1\n  - name: gone-too\n    ssh: {{ host: 127.0.0.1, port: {port} }}\n    data_addr: 127.0.0.1\n"
    );
    let inv = write_inventory("unreachable", &body);
    let out = run_to_end(marked(
        &marker(),
        &[
            "run",
            "scenarios/tcp-exact-reads.yaml",
            "--hosts",
            inv.to_str().unwrap(),
            "--report-dir",
            report_dir("unreachable").to_str().unwrap(),
        ],
    ));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("reaching gone over SSH") && err.contains("ssh could not connect"),
        "{err}"
    );
}

/// A reader that goes away early (`wringer list | head -1`) is not a panic.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    for args in [&["list"][..], &["probe"][..]] {
        let mut child = Command::new(WRINGER)
            .args(args)
            .current_dir(workspace())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}");
    }
}

/// `probe --json` names the GPU vendor and runtime when a GPU answers, and otherwise what each
/// vendor's runtime said, with the skip code the GPU scenarios will carry.
#[test]
fn probe_json_names_the_gpu_vendor_and_runtime_or_why_there_is_none() {
    let m = marker();
    let out = run_to_end(marked(&m, &["probe", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let facts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    match facts["gpus"].as_array().unwrap().first() {
        Some(g) => {
            assert!(
                ["nvidia", "amd"].contains(&g["vendor"].as_str().unwrap()),
                "{g}"
            );
            let runtime = facts["gpu_runtime"].as_str().unwrap();
            assert!(
                runtime.starts_with("CUDA") || runtime.starts_with("HIP"),
                "{runtime}"
            );
        }
        None => {
            let code = facts["gpu_absent_code"].as_str().unwrap();
            assert!(["no-gpu", "no-hip-runtime"].contains(&code), "{code}");
            let absent = facts["gpu_absent"].as_str().unwrap();
            if std::env::var_os("WRINGER_REQUIRE_HIP").is_some() {
                // Debian's HIP 5.2 loaded and said it has no device.
                assert!(absent.contains("AMD: the HIP 5."), "{absent}");
            }
        }
    }
    assert!(processes_with(&m).is_empty());
}

/// On a host without a GPU (CI) both GPU scenarios are skips that say why, in every report,
/// and the probe names what it tried of each vendor; on a host with one, this test has nothing
/// to prove and says so.
#[test]
fn gpu_scenarios_skip_with_the_no_gpu_reason_where_there_is_no_gpu() {
    if wringer_transport::gpu::inventory().is_ok() {
        eprintln!("skipped: this host has a usable GPU; the scenarios run instead");
        return;
    }
    let dir = report_dir("gpu-skip");
    let m = marker();
    // The RDMA one runs in the soft-RoCE VM on a kernel without RDMA: where the VM is not set
    // up yet (`just test` runs before `just test-local` sets it up), only the TCP one can get
    // as far as the GPU probe.
    let vm = Command::new("sh")
        .args(["-c", "command -v vng"])
        .output()
        .is_ok_and(|o| o.status.success())
        || std::path::Path::new("/sys/class/infiniband").exists();
    let mut args = vec![
        "run",
        "--hosts",
        "hosts/local.yaml",
        "--report-dir",
        dir.to_str().unwrap(),
        "scenarios/gpu-pingpong-tcp.yaml",
    ];
    if vm {
        args.push("scenarios/gpu-pingpong-rdma.yaml");
    } else {
        eprintln!("no soft-RoCE VM here yet: gpu-pingpong-rdma left out");
    }
    let out = run_to_end(marked(&m, &args));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let r = results(&dir);
    let host = &r["hosts"][0];
    assert_eq!(host["gpus"], serde_json::json!([]));
    let absent = host["gpu_absent"].as_str().expect("the probe says why");
    let code = host["gpu_absent_code"]
        .as_str()
        .expect("and with which code");
    // Both vendors were asked: CUDA's reason and HIP's (a runtime, or why none loaded).
    assert!(
        absent.contains("NVIDIA: ") && absent.contains("AMD: "),
        "{absent}"
    );
    if std::env::var_os("WRINGER_REQUIRE_HIP").is_some() {
        assert!(
            absent.contains("libamdhip64"),
            "the HIP runtime answered: {absent}"
        );
    }
    for s in r["scenarios"].as_array().unwrap() {
        assert_eq!(s["verdict"], "skip", "{s}");
        assert_eq!(s["reason"].as_str().unwrap(), format!("{code}: {absent}"));
    }
    let junit = std::fs::read_to_string(dir.join("junit.xml")).unwrap();
    assert_eq!(
        junit
            .matches(&format!("<skipped message=\"{code}: "))
            .count(),
        args.len() - 5,
        "{junit}"
    );
    assert!(processes_with(&m).is_empty());
}
