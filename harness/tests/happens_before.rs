//! The descriptor rules judged by happens-before, on programs of the seed's class that exit 0
//! and whose race does not show in an ordinary run: each broken one is flagged on every run
//! (20 of 20, with eBPF and with strace), each correct twin (a hand-over through a join, a
//! condition variable, a semaphore, a mutex) on none. The sync observer is preloaded into the
//! program by `wringer audit`.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::repo;

const WRINGER: &str = env!("CARGO_BIN_EXE_wringer");
const RUNS: u32 = 20;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wringer-hb-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn build(dir: &Path, name: &str, correct: bool) -> PathBuf {
    let exe = dir.join(if correct {
        format!("{name}_correct")
    } else {
        name.into()
    });
    let src = repo().join(format!("harness/tests/fixtures/happens_before/{name}.c"));
    let mut cc = Command::new("cc");
    cc.args(["-O0", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src);
    if correct {
        cc.arg("-DCORRECT");
    }
    assert!(
        cc.status().unwrap().success(),
        "compiling {}",
        src.display()
    );
    exe
}

/// `wringer audit --repeat runs` of `exe`: (runs that failed, every failure's text).
fn audit(dir: &Path, exe: &Path, backend: &str, runs: u32) -> (u64, String) {
    let report = dir.join(format!(
        "{}-{backend}",
        exe.file_name().unwrap().to_string_lossy()
    ));
    let out = Command::new(WRINGER)
        .args([
            "audit",
            "--audit-backend",
            backend,
            "--repeat",
            &runs.to_string(),
        ])
        .arg("--report-dir")
        .arg(&report)
        .arg("--")
        .arg(exe)
        .env("WRINGER_REPLAYS", "0")
        .env("CI", "true")
        .output()
        .unwrap();
    let code = out.status.code();
    assert!(
        matches!(code, Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.join("results.json")).unwrap()).unwrap();
    let s = &v["scenarios"][0];
    (
        s["repeats_failed"].as_u64().unwrap(),
        s["evidence"]["failures"].to_string(),
    )
}

fn flagged_every_run_and_the_twin_never(name: &str, check: &str) {
    let dir = scratch(name);
    let broken = build(&dir, name, false);
    let twin = build(&dir, name, true);
    for backend in ["ebpf", "strace"] {
        let (failed, text) = audit(&dir, &broken, backend, RUNS);
        assert_eq!(failed, u64::from(RUNS), "{name} ({backend}): {text}");
        assert!(
            text.contains(check),
            "{name} ({backend}): no {check:?} in {text}"
        );
        let (failed, text) = audit(&dir, &twin, backend, 5);
        assert_eq!(failed, 0, "{name}'s correct twin ({backend}): {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn close_then_join() {
    flagged_every_run_and_the_twin_never("close_then_join", "close before the receiver is done");
}

#[test]
fn a_hand_over_through_a_condition_variable() {
    flagged_every_run_and_the_twin_never("handover_condvar", "close before the receiver is done");
}

#[test]
fn a_hand_over_through_a_semaphore() {
    flagged_every_run_and_the_twin_never("handover_semaphore", "close before the receiver is done");
}

#[test]
fn a_timer_closed_under_its_event_loop() {
    flagged_every_run_and_the_twin_never("timer_close", "close before the receiver is done");
}

#[test]
fn a_stale_handle_on_a_reused_number() {
    flagged_every_run_and_the_twin_never("stale_handle", "stale handle");
}

#[test]
fn a_double_close() {
    flagged_every_run_and_the_twin_never("double_close", "double close");
}

/// Probes of numbers a program never held, a close-on-exec sweep and an exec chain are not
/// uses after close.
#[test]
fn probes_sweeps_and_exec_chains_are_clean() {
    let dir = scratch("probes");
    let exe = build(&dir, "probes", true);
    for backend in ["ebpf", "strace"] {
        let (failed, text) = audit(&dir, &exe, backend, 3);
        assert_eq!(failed, 0, "probes ({backend}): {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three threads spin on non-blocking receives (millions of EAGAIN calls on two cores) while
/// the main thread opens and closes descriptors: the eBPF recorder folds the repeats in the
/// kernel, loses no event, and the program is clean. Without the folding, this run dropped
/// 3.3 million events and could only be "trace incomplete".
#[test]
fn threads_spinning_on_non_blocking_receives_lose_no_event() {
    let dir = scratch("spinning");
    let exe = build(&dir, "spinning", true);
    let (failed, text) = audit(&dir, &exe, "ebpf", 2);
    assert_eq!(failed, 0, "spinning (ebpf): {text}");
    assert!(!text.contains("incomplete"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
