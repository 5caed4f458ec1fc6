//! The exec step kind end to end: external programs as ranks, faults on them, the timing of
//! their survivors, typed skips, known failures, and nothing left behind. The programs are
//! python3 and sh, which every machine that runs these tests has.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod common;

const WRINGER: &str = env!("CARGO_BIN_EXE_wringer");

fn fixture(name: &str) -> String {
    format!("harness/tests/fixtures/exec/{name}")
}

fn marker(tag: &str) -> String {
    format!("wringer-exec-{tag}-{}", std::process::id())
}

/// Run `wringer run` on fixtures; returns the output and results.json.
fn run(tag: &str, args: &[&str]) -> (Output, Value) {
    run_with_path(tag, args, None)
}

/// The same, with `extra` in front of PATH (for programs a test built).
fn run_with_path(tag: &str, args: &[&str], extra: Option<&Path>) -> (Output, Value) {
    let path = match extra {
        Some(dir) => format!(
            "{}:{}",
            dir.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
        None => std::env::var("PATH").unwrap_or_default(),
    };
    run_env(tag, args, &[("PATH", path)])
}

/// `wringer run` with these variables set; returns the output and results.json.
fn run_env(tag: &str, args: &[&str], env: &[(&str, String)]) -> (Output, Value) {
    let dir = std::env::temp_dir().join(format!("wringer-exec-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(WRINGER)
        .current_dir(common::repo())
        .arg("run")
        .args(args)
        .arg("--report-dir")
        .arg(&dir)
        .env("CI", "true")
        .env("WRINGER_TEST_MARKER", marker(tag))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let results = std::fs::read(dir.join("results.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    (out, results)
}

/// Every scenario's (name, verdict).
fn verdicts(r: &Value) -> Vec<(String, String)> {
    r["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().into(),
                s["verdict"].as_str().unwrap().into(),
            )
        })
        .collect()
}

fn left_behind(tag: &str) -> Vec<u32> {
    common::processes_with(&marker(tag))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn rank_log(results: &Value, rank: usize) -> String {
    let path = results["scenarios"][0]["evidence"]["rank_logs"][rank]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::read_to_string(PathBuf::from(path)).unwrap()
}

#[test]
fn a_killed_server_is_noticed_and_timed_per_survivor() {
    let (out, r) = run("death", &[&fixture("server-death.yaml")]);
    let s = &r["scenarios"][0];
    assert_eq!(out.status.code(), Some(0), "{s:#}");
    assert_eq!(s["verdict"], "pass");
    let detect = s["metrics"]["detect_ms"]["max"].as_f64().unwrap();
    let exit = s["metrics"]["exit_ms"]["max"].as_f64().unwrap();
    assert!(
        detect >= 0.0 && detect <= exit,
        "detect {detect} ms, exit {exit} ms"
    );
    let notes = strings(&s["evidence"]["notes"]);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("rank 1 (client)") && n.contains("detect_ms")),
        "{notes:?}"
    );
    // Every line the programs printed is in the rank logs, with its time.
    let log = rank_log(&r, 1);
    assert!(log.contains("[exec client rank 1 +"), "{log}");
    assert!(log.contains("out] rounds=5"), "{log}");
    assert!(rank_log(&r, 0).contains("fault: Sigkill"));
    assert!(left_behind("death").is_empty());
}

#[test]
fn a_survivor_that_logs_the_error_but_never_exits_fails_with_stacks_and_is_ended() {
    let (out, r) = run("never", &[&fixture("never-exits.yaml")]);
    let s = &r["scenarios"][0];
    assert_eq!(out.status.code(), Some(1), "{s:#}");
    let failures = common::failures(s).join("\n");
    assert!(
        failures.contains("[reconcile-disagreement] repeat 0: step 0, from every rank's evidence: rank 1 (survivor): logged the error")
            && failures.contains("but never exited (printed nothing for 3s"),
        "{failures}"
    );
    assert!(failures.contains("`error: peer gone`"), "{failures}");
    let log = rank_log(&r, 1);
    assert!(log.contains("stacks of pid"), "{log}");
    assert!(
        left_behind("never").is_empty(),
        "{:?}",
        left_behind("never")
    );
}

#[test]
fn known_failures_are_xfail_and_a_known_failure_that_passes_is_xpass() {
    let profile = fixture("known-failures.yaml");
    let never = fixture("never-exits.yaml");
    let death = fixture("server-death.yaml");
    let args = ["--hosts", &profile, &never, &death];
    let (out, r) = run("known", &args);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    let verdicts = verdicts(&r);
    assert!(
        verdicts.contains(&("exec-never-exits".into(), "xfail".into())),
        "{verdicts:?}"
    );
    assert!(
        verdicts.contains(&("exec-server-death".into(), "xpass".into())),
        "{verdicts:?}"
    );
    let xfail = r["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["verdict"] == "xfail")
        .unwrap();
    let reason = xfail["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "known failure: the survivor never exits (test fixture) (https://example.org/1)"
        ),
        "{reason}"
    );
    assert!(reason.contains("never exited"), "{reason}");
    // The summary and JUnit say so too.
    let dir = std::env::temp_dir().join(format!("wringer-exec-known-{}", std::process::id()));
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(
        summary.contains("xfail") && summary.contains("xpass"),
        "{summary}"
    );
    let junit = std::fs::read_to_string(dir.join("junit.xml")).unwrap();
    assert!(junit.contains("xfail: known failure"), "{junit}");
    // Under --strict the stale entry fails the run.
    let (out, r) = run("strict", &["--hosts", &profile, "--strict", &death]);
    assert_eq!(out.status.code(), Some(1));
    assert!(r["scenarios"][0]["reason"]
        .as_str()
        .unwrap()
        .starts_with("xpass under --strict"));
}

#[test]
fn the_audit_sees_what_a_broken_external_program_does_to_its_descriptors() {
    let dir = std::env::temp_dir().join(format!("wringer-exec-cc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = common::repo().join("harness/tests/fixtures/broken/close_in_use.c");
    let cc = Command::new("cc")
        .args(["-O0", "-pthread", "-o"])
        .arg(dir.join("close_in_use"))
        .arg(&src)
        .status()
        .expect("a C compiler (Debian's gcc; `just external` installs g++)");
    assert!(cc.success());
    let (out, r) = run_with_path("broken", &[&fixture("broken-audited.yaml")], Some(&dir));
    let failures = common::failures(&r["scenarios"][0]).join("\n");
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    assert!(
        failures.contains("[audit-violation] repeat 0: audit: rank "),
        "{failures}"
    );
    assert!(failures.contains("close while in use"), "{failures}");
    assert!(failures.contains("use after close"), "{failures}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_daemon_the_program_leaves_behind_is_ended_with_the_step() {
    let (out, r) = run("daemon", &[&fixture("daemon.yaml")]);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert!(rank_log(&r, 0).contains("ended 1 processes the program left behind"));
    assert!(
        left_behind("daemon").is_empty(),
        "{:?}",
        left_behind("daemon")
    );
}

#[test]
fn a_missing_program_and_a_failing_precheck_are_typed_skips() {
    let (out, r) = run(
        "skips",
        &[&fixture("missing.yaml"), &fixture("precheck.yaml")],
    );
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    let reasons: Vec<String> = r["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("{} {}", s["verdict"], s["reason"].as_str().unwrap_or("")))
        .collect();
    assert!(reasons.contains(
        &"\"skip\" missing-program: wringer-no-such-program (Debian package wringer-example-package)".to_string()
    ), "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r
                .starts_with("\"skip\" precheck: no verbs provider here (`sh -c exit 61` exited")),
        "{reasons:?}"
    );
}

#[test]
fn a_placeholder_typo_is_a_located_error_with_exit_code_2() {
    let out = Command::new(WRINGER)
        .current_dir(common::repo())
        .args(["validate", &fixture("typo.yaml")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("typo.yaml:6:"), "{err}");
    assert!(err.contains("unknown placeholder `{prot:1}`"), "{err}");
    assert!(Path::new(&common::repo().join(fixture("typo.yaml"))).exists());
}

/// A fake release of torch in `root`: what the release discovery reads (bin/python, the
/// package's version.py), with bin/python a shell script that plays either role.
fn fake_release(root: &Path, version: &str, delay_s: &str) {
    let site = root.join("lib/python3.11/site-packages/torch");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::write(
        site.join("version.py"),
        format!("__version__ = '{version}+cpu'\n"),
    )
    .unwrap();
    std::fs::write(root.join("delay"), delay_s).unwrap();
    let python = root.join("bin/python");
    std::fs::write(
        &python,
        "#!/bin/sh\ncase \"$1\" in\n  leave) echo \"leaving now\"; exit 0 ;;\n  survive) sleep \"$(cat \"$2\")\"; echo \"error: the peer left ($0)\"; exit 1 ;;\nesac\nexit 3\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn run_releases(tag: &str, releases: &[&Path], args: &[&str]) -> (Output, Value) {
    let list: Vec<String> = releases.iter().map(|p| p.display().to_string()).collect();
    let releases_fixture = fixture("releases.yaml");
    let mut all = args.to_vec();
    all.push(&releases_fixture);
    run_env(tag, &all, &[("WRINGER_TORCH", list.join(":"))])
}

#[test]
fn a_scenario_runs_once_per_release_and_a_departure_times_the_survivors() {
    let base = std::env::temp_dir().join(format!("wringer-releases-{}", std::process::id()));
    let (fast, slow) = (base.join("fast"), base.join("slow"));
    fake_release(&fast, "1.0.0", "0.3");
    fake_release(&slow, "2.0.0", "1.5");
    let (out, r) = run_releases("releases", &[&slow, &fast], &[]);
    let scenarios = r["scenarios"].as_array().cloned().unwrap_or_default();
    let by_name = |n: &str| {
        scenarios
            .iter()
            .find(|s| s["name"] == n)
            .cloned()
            .unwrap_or(Value::Null)
    };
    // One result per release, named with it (oldest first), each run against its own folder.
    let names: Vec<&str> = scenarios
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["torch-1.0.0-fixture-release", "torch-2.0.0-fixture-release"],
        "{r:#}"
    );
    let fast_run = by_name("torch-1.0.0-fixture-release");
    assert_eq!(fast_run["verdict"], "pass", "{fast_run:#}");
    // Timed from the leaver's announcement: about the survivor's 0.3 s, never negative.
    let detect = fast_run["metrics"]["detect_ms"]["max"].as_f64().unwrap();
    assert!((250.0..1000.0).contains(&detect), "detect_ms {detect}");
    let notes = strings(&fast_run["evidence"]["notes"]).join("\n");
    assert!(
        notes.contains("rank 0 (leaver): left on purpose (exit 0)"),
        "{notes}"
    );
    assert!(notes.contains("after the exit of rank 0"), "{notes}");
    assert!(rank_log(&r, 1).contains(&format!("{}/bin/python", fast.display())));
    // The slow release breaks the bound: a failure of that release alone.
    let slow_run = by_name("torch-2.0.0-fixture-release");
    assert_eq!(slow_run["verdict"], "fail", "{slow_run:#}");
    assert!(common::failures(&slow_run)
        .iter()
        .any(|f| f.contains("noticed the fault after")));
    assert_eq!(out.status.code(), Some(1));
    // Listed as a known failure of 2.0.0 for that failure: xfail, and the run passes.
    let profile = fixture("release-known-failures.yaml");
    let (out, r) = run_releases("releases-known", &[&fast, &slow], &["--hosts", &profile]);
    let verdicts = verdicts(&r);
    assert!(
        verdicts.contains(&("torch-2.0.0-fixture-release".into(), "xfail".into())),
        "{verdicts:?}"
    );
    assert!(
        verdicts.contains(&("torch-1.0.0-fixture-release".into(), "pass".into())),
        "{verdicts:?}"
    );
    assert_eq!(out.status.code(), Some(0));
    // The same release failing another way (its survivor never prints the error) is not hidden.
    std::fs::write(
        slow.join("bin/python"),
        "#!/bin/sh\n[ \"$1\" = leave ] && { echo 'leaving now'; exit 0; }\nexit 1\n",
    )
    .unwrap();
    let (out, r) = run_releases("releases-other", &[&slow], &["--hosts", &profile]);
    let s = &r["scenarios"][0];
    assert_eq!(s["verdict"], "fail", "{s:#}");
    assert!(
        s["reason"]
            .as_str()
            .unwrap()
            .contains("but this is another"),
        "{s:#}"
    );
    assert_eq!(out.status.code(), Some(1));
    // A folder that holds no torch is bad input, named, with exit code 2.
    let (out, _) = run_releases("releases-bad", &[&base], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("WRINGER_TORCH") && err.contains("has no bin/python"),
        "{err}"
    );
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn arguments_and_output_cannot_forge_a_line_of_the_rank_log() {
    let (out, r) = run("forged", &[&fixture("forged-lines.yaml")]);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    let log = rank_log(&r, 0);
    assert!(
        !log.lines().any(|l| l.starts_with("starting: forged")),
        "{log}"
    );
    assert!(log.contains("a\\nstarting: forged"), "{log}");
    assert!(!log.contains('\r') && !log.contains('\u{1b}'), "{log:?}");
    assert!(
        log.contains("ok\\r[exec only rank 0] forged \\u{1b}[31mred"),
        "{log}"
    );
    assert!(left_behind("forged").is_empty());
}

#[test]
fn an_output_flood_is_read_whole_with_bounded_memory_and_a_capped_log() {
    let (out, r) = run("flood", &[&fixture("flood.yaml")]);
    let s = &r["scenarios"][0];
    assert_eq!(out.status.code(), Some(0), "{s:#}");
    // The last line, after 200 MB, was read: nothing was dropped on the way.
    assert_eq!(s["metrics"]["rounds"]["max"], 7.0, "{s:#}");
    let notes = strings(&s["evidence"]["notes"]).join("\n");
    assert!(
        notes.contains("its log was cut at the 1 MiB limit"),
        "{notes}"
    );
    let peak: f64 = notes
        .split("rank peak memory ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no peak memory note: {notes}"));
    assert!(
        peak < 64.0,
        "the rank peaked at {peak} MiB under a 200 MB flood"
    );
    let log = rank_log(&r, 0);
    assert!(log.len() < 2 << 20, "the rank log is {} bytes", log.len());
    assert!(
        log.contains("output past the 1 MiB log limit is not logged"),
        "{}",
        &log[log.len().saturating_sub(2000)..]
    );
    assert!(log.contains("the log was cut:"));
}

#[test]
fn a_role_that_never_becomes_ready_is_the_reason_and_says_what_it_waited_for() {
    let (out, r) = run("never-ready", &[&fixture("never-ready.yaml")]);
    let s = &r["scenarios"][0];
    assert_eq!(out.status.code(), Some(1), "{s:#}");
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains(
            "rank 0 (server): never became ready within 1s: nothing listened on its port"
        ),
        "{reason}"
    );
    assert!(!reason.contains("can never be released"), "{reason}");
    // The client was released when the server's readiness failed, not left to wait out the
    // step's 20 s: its log says it started, at an offset (the step's own clock) short of that.
    let client = rank_log(&r, 1);
    let started_at_ms: f64 = client
        .lines()
        .find(|l| l.contains("starting:"))
        .and_then(|l| l.split(" +").nth(1))
        .and_then(|l| l.split("ms]").next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("the client never started: {client}"));
    assert!(
        started_at_ms < 20_000.0,
        "the client waited out the step: {client}"
    );
    assert!(left_behind("never-ready").is_empty());
}

#[test]
fn the_programs_of_a_step_start_together_whatever_came_before() {
    let (out, r) = run("start-together", &[&fixture("start-together.yaml")]);
    let s = &r["scenarios"][0];
    assert_eq!(out.status.code(), Some(0), "{s:#}");
    let started: Vec<i64> = (0..2)
        .map(|rank| {
            let log = rank_log(&r, rank);
            log.lines()
                .find_map(|l| l.split("out] started_at_ms=").nth(1)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("rank {rank} printed no start: {log}"))
        })
        .collect();
    // Rank 1 sat out the 2 s step: without a start together it would start 2 s early.
    let apart = (started[0] - started[1]).abs();
    assert!(apart < 1000, "the programs started {apart} ms apart");
    assert!(left_behind("start-together").is_empty());
}
