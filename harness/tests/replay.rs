//! A failure hands back its reproducer: the replay line a failed attempt prints reruns it
//! alone (10 of 10), `--until-fail` stops at the first failure, `--shrink` reduces a noisy
//! perturbation list to the one that matters, and `wringer audit -- PROGRAM` audits any command.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

#[cfg_attr(not(feature = "bug-injection"), allow(dead_code))]
mod common;

use common::repo;

const WRINGER: &str = env!("CARGO_BIN_EXE_wringer");

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wringer-replay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// wringer with `args` and the transport bug `bug` switched on ("" for none).
fn with_bug(args: &[&str], bug: &str) -> Output {
    common::wringer()
        .args(args)
        .env("WRINGER_TRANSPORT_BUG", bug)
        .output()
        .unwrap()
}

fn first_result(dir: &Path) -> Value {
    let v: Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    v["scenarios"][0].clone()
}

/// `wringer run FILE EXTRA… --report-dir DIR` with `bug` switched in.
fn run_fixture(file: &str, extra: &[&str], dir: &Path, bug: &str) -> Output {
    let d = dir.display().to_string();
    let mut args = vec!["run", file];
    args.extend_from_slice(extra);
    args.extend(["--report-dir", d.as_str()]);
    with_bug(&args, bug)
}

/// A printed line, run as the user would paste it (`wringer` is this build), with more words.
fn run_line(line: &str, more: &str, bug: &str) -> Output {
    let rest = line
        .strip_prefix("wringer ")
        .expect("a wringer command line");
    Command::new("bash")
        .current_dir(repo())
        .arg("-c")
        .arg(format!("'{WRINGER}' {rest} {more}"))
        .env("CI", "true")
        .env("WRINGER_TRANSPORT_BUG", bug)
        .output()
        .unwrap()
}

#[test]
#[cfg(feature = "bug-injection")]
fn a_failed_attempts_replay_line_fails_on_every_one_of_ten_replays() {
    let dir = temp("close-before-join");
    let out = run_fixture(
        "harness/tests/fixtures/audited-teardown.yaml",
        &["--until-fail", "5", "--replays", "2"],
        &dir,
        "close-before-join",
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = first_result(&dir);
    assert_eq!(
        r["repeats"], 1,
        "--until-fail stops at the first failure: {r:#}"
    );
    let replay = &r["evidence"]["replays"][0];
    assert_eq!(replay["replayed"], serde_json::json!([2, 2]), "{replay:#}");
    let line = replay["command"].as_str().unwrap();
    assert!(
        line.contains("--seed") && line.contains("--attempt 0"),
        "{line}"
    );
    // The same line is printed, and in summary.md and junit.xml.
    let printed =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(printed.contains(line), "not printed: {printed}");
    for f in ["summary.md", "junit.xml"] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        assert!(text.contains("--attempt 0"), "{f}: {text}");
    }
    let again = temp("close-before-join-again");
    let out = run_line(
        line,
        &format!("--repeat 10 --replays 0 --report-dir {}", again.display()),
        "close-before-join",
    );
    assert_eq!(out.status.code(), Some(1));
    let r = first_result(&again);
    assert_eq!(
        (r["repeats"].as_u64(), r["repeats_failed"].as_u64()),
        (Some(10), Some(10)),
        "{r:#}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&again);
}

#[test]
#[cfg(feature = "bug-injection")]
fn until_fail_runs_every_attempt_when_nothing_fails() {
    let dir = temp("until-fail-correct");
    let out = run_fixture(
        "harness/tests/fixtures/audited-teardown.yaml",
        &["--until-fail", "3"],
        &dir,
        "none",
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(first_result(&dir)["repeats"], 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shrink_reduces_eight_perturbations_to_the_one_that_breaks_the_bound() {
    let dir = temp("noisy");
    let out = run_fixture(
        "harness/tests/fixtures/noisy-teardown.yaml",
        &["--replays", "0"],
        &dir,
        "none",
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = first_result(&dir);
    let shrink = r["evidence"]["replays"][0]["shrink"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(shrink.matches("--perturb").count(), 8, "{shrink}");
    let tries = temp("noisy-shrink");
    let out = run_line(
        &shrink,
        &format!("--shrink-replays 2 --report-dir {}", tries.display()),
        "none",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kept: Vec<&str> = text.lines().filter(|l| l.starts_with("  - {")).collect();
    assert_eq!(kept.len(), 1, "{text}");
    assert!(kept[0].contains("syscall: shutdown"), "{text}");
    assert!(text.contains("removed: 7 of 8 perturbations"), "{text}");
    assert!(
        text.contains("cycles 8 -> "),
        "the cycles shrink too: {text}"
    );
    assert!(text.contains(" runs in "), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&tries);
}

fn cc(src: &str, out: &Path, correct: bool) {
    let mut c = Command::new("cc");
    c.args(["-O0", "-pthread", "-o"])
        .arg(out)
        .arg(repo().join(src));
    if correct {
        c.arg("-DCORRECT");
    }
    assert!(c.status().unwrap().success(), "compiling {src}");
}

#[test]
fn wringer_audit_flags_a_broken_program_and_passes_correct_ones_and_gloo() {
    let dir = temp("audit-cmd");
    std::fs::create_dir_all(&dir).unwrap();
    let broken = dir.join("close_in_use");
    cc(
        "harness/tests/fixtures/broken/close_in_use.c",
        &broken,
        false,
    );
    let report = dir.join("broken");
    let out = Command::new(WRINGER)
        .args(["audit", "--replays", "0", "--report-dir"])
        .arg(&report)
        .arg("--")
        .arg(&broken)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = first_result(&report);
    let failures = r["evidence"]["failures"].to_string();
    assert!(failures.contains("close while in use"), "{failures}");
    assert!(failures.contains("use after close"), "{failures}");
    let line = r["evidence"]["replays"][0]["command"].as_str().unwrap();
    assert!(
        line.starts_with("wringer audit ") && line.contains(" -- "),
        "{line}"
    );
    assert!(report.join("junit.xml").is_file());

    // A command that is not there is bad input, not a skip.
    let out = Command::new(WRINGER)
        .args(["audit", "--", "/nonexistent/wringer-test-program"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    let twin = dir.join("select_loop_correct");
    cc(
        "harness/tests/fixtures/lifecycle/select_loop.c",
        &twin,
        true,
    );
    let out = Command::new(WRINGER)
        .args(["audit", "--report-dir"])
        .arg(dir.join("twin"))
        .arg("--")
        .arg(&twin)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The real Gloo's allreduce, two processes: no violation.
    let gloo = repo().join("target/external/wringer-gloo");
    assert!(
        gloo.is_file(),
        "{} is missing: `just external` builds it (`just test` does)",
        gloo.display()
    );
    let out = Command::new(WRINGER)
        .args(["audit", "--ranks", "2", "--report-dir"])
        .arg(dir.join("gloo"))
        .arg("--")
        .arg(&gloo)
        .args([
            "--rank",
            "{rank}",
            "--size",
            "{ranks}",
            "--store",
            "{dir}",
            "--host",
            "{host}",
            "--timeout-ms",
            "5000",
            "--rounds",
            "5",
            "--sizes",
            "64,65536",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let r = first_result(&dir.join("gloo"));
    assert_eq!(r["verdict"], "pass", "{r:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_shrink_without_the_attempt_it_shrinks_is_bad_input() {
    let out = with_bug(&["shrink", "scenarios/tcp-teardown-cycles.yaml"], "none");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--seed and --attempt"), "{err}");
    let out = with_bug(
        &["run", "--shrink", "scenarios/tcp-teardown-cycles.yaml"],
        "none",
    );
    assert_eq!(out.status.code(), Some(2), "--shrink requires --attempt");
}

#[test]
fn an_audited_command_is_recorded_as_a_scenario_that_run_takes_back() {
    let dir = temp("audit-record");
    std::fs::create_dir_all(&dir).unwrap();
    // A name longer than any scenario's may be: the scenario's name is cut from it, the
    // program keeps it.
    let long = dir.join(format!("a-program-with-a-long-name-{}", "x".repeat(90)));
    std::fs::copy("/bin/true", &long).unwrap();
    let report = dir.join("report");
    let out = Command::new(WRINGER)
        .args(["audit", "--replays", "0", "--ranks", "2", "--report-dir"])
        .arg(&report)
        .arg("--")
        .arg(&long)
        .arg("{rank}")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let record = report.join("audit.yaml");
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(text.contains(&*long.to_string_lossy()), "{text}");
    assert!(
        text.contains("{rank}") && text.contains("fd-lifecycle"),
        "{text}"
    );
    let out = Command::new(WRINGER)
        .arg("validate")
        .arg(&record)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the record is a scenario `wringer run` takes: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = first_result(&report);
    assert!(
        r["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("audit-a-program-with-a-long-name-") && n.len() <= 64),
        "{r:#}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `wringer audit --perturb … -- poll_calls` (built `static` or not): its report.
fn perturbed_audit(dir: &Path, exe: &Path, tag: &str, extra: &[&str]) -> (Output, Value) {
    let report = dir.join(tag);
    let out = Command::new(WRINGER)
        .args(["audit", "--replays", "0", "--report-dir"])
        .arg(&report)
        .args([
            "--perturb",
            "{ syscall: poll, delay_exit: 2ms, when: \"3..7+2\" }",
        ])
        .args(extra)
        .arg("--")
        .arg(exe)
        .output()
        .unwrap();
    (out, first_result(&report))
}

#[test]
fn without_the_audit_a_scenario_keeps_the_perturbations_the_observer_delays() {
    // tcp-teardown-cycles ships with a `poll` exit delay that widens the seed's race window:
    // under --no-audit it still runs, delayed by the preloaded observer with no recorder, and
    // its delays are evidence as in an audited run.
    let dir = temp("no-audit-perturbed");
    let out = run_fixture(
        "scenarios/tcp-teardown-cycles.yaml",
        &["--no-audit", "--replays", "0"],
        &dir,
        "",
    );
    let r = first_result(&dir);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    let by = r["evidence"]["perturbed_by"].as_str().unwrap_or_default();
    assert!(by.starts_with("the preloaded observer"), "{r:#}");
    assert!(
        r["evidence"]["audit_recorder"].is_null(),
        "no recorder: {r:#}"
    );
    let notes = r["evidence"]["notes"].to_string();
    assert!(
        notes.contains("poll: ") && notes.contains("call(s) delayed"),
        "{notes}"
    );
    // --no-perturb sets them aside too.
    let out = run_fixture(
        "scenarios/tcp-teardown-cycles.yaml",
        &["--no-audit", "--no-perturb", "--replays", "0"],
        &dir,
        "",
    );
    let r = first_result(&dir);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert!(r["evidence"]["perturbed_by"].is_null(), "{r:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_dynamically_linked_program_is_perturbed_without_ptrace_and_a_static_one_by_strace() {
    let dir = temp("perturb");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("poll_calls");
    cc("harness/tests/fixtures/perturb/poll_calls.c", &exe, false);
    let (out, r) = perturbed_audit(&dir, &exe, "dynamic", &[]);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    let by = r["evidence"]["perturbed_by"].as_str().unwrap_or_default();
    assert!(by.starts_with("the preloaded observer"), "{r:#}");
    // Calls 3, 5 and 7 of each thread, counted per thread: three on the main thread, and the
    // second thread's call 3 (it makes four).
    let notes = r["evidence"]["notes"].to_string();
    assert!(
        notes.contains("poll: 4 call(s) delayed"),
        "the program's delays are evidence: {notes}"
    );
    for call in [":3 ", ":5 ", ":7 "] {
        assert!(notes.contains(call), "call {call} delayed: {notes}");
    }
    let log = std::fs::read_to_string(
        dir.join("dynamic/logs")
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("repeat-0/rank-0.log"),
    )
    .unwrap();
    // (The log escapes the tab.)
    assert!(log.contains("TracerPid:\\t0"), "no tracer attached: {log}");

    // The same when the run fails: its replay line names the same perturbation, so a replay
    // delays the same calls.
    let (out, r) = perturbed_audit(&dir, &exe, "failing", &["--exit", "3"]);
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    let line = r["evidence"]["replays"][0]["command"].as_str().unwrap();
    assert!(
        line.contains("--perturb") && line.contains("3..7+2"),
        "{line}"
    );

    // A static program: no preloaded library reaches it, so strace injects, and says why.
    let fixed = dir.join("poll_calls_static");
    let built = Command::new("cc")
        .args(["-O0", "-static", "-pthread", "-o"])
        .arg(&fixed)
        .arg(repo().join("harness/tests/fixtures/perturb/poll_calls.c"))
        .status()
        .unwrap();
    assert!(built.success(), "a static build needs libc6-dev's libc.a");
    let (out, r) = perturbed_audit(&dir, &fixed, "static", &[]);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    let by = r["evidence"]["perturbed_by"].as_str().unwrap_or_default();
    assert!(
        by.starts_with("strace's --inject") && by.contains("statically linked"),
        "{r:#}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
