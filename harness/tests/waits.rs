//! The wait-for audit (`--check waits`, `--check unbounded-waits`) on deadlocks that did not
//! happen: each program exits 0 in an ordinary run, and is flagged on every run with both
//! recorders; each correct twin (the lock let go before the join or the wait, one lock order,
//! a gate lock, a predicate and a deadline) on none.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::repo;

const WRINGER: &str = env!("CARGO_BIN_EXE_wringer");
const RUNS: u32 = 5;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wringer-waits-{name}-{}", std::process::id()));
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
    let src = repo().join(format!("harness/tests/fixtures/waits/{name}.c"));
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

/// `wringer audit` with `checks`, `runs` times: (runs that failed, the failures' text).
fn audit(dir: &Path, exe: &Path, backend: &str, checks: &[&str], runs: u32) -> (u64, String) {
    let report = dir.join(format!(
        "{}-{backend}",
        exe.file_name().unwrap().to_string_lossy()
    ));
    let mut cmd = Command::new(WRINGER);
    cmd.args([
        "audit",
        "--audit-backend",
        backend,
        "--repeat",
        &runs.to_string(),
    ]);
    for c in checks {
        cmd.args(["--check", c]);
    }
    let out = cmd
        .arg("--report-dir")
        .arg(&report)
        .arg("--")
        .arg(exe)
        .env("WRINGER_REPLAYS", "0")
        .env("CI", "true")
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
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

fn flagged_every_run_and_the_twin_never(name: &str, checks: &[&str], says: &str) {
    let dir = scratch(name);
    let broken = build(&dir, name, false);
    let twin = build(&dir, name, true);
    for backend in ["ebpf", "strace"] {
        let (failed, text) = audit(&dir, &broken, backend, checks, RUNS);
        assert_eq!(failed, u64::from(RUNS), "{name} ({backend}): {text}");
        assert!(
            text.contains(says),
            "{name} ({backend}): no {says:?} in {text}"
        );
        let (failed, text) = audit(&dir, &twin, backend, checks, 2);
        assert_eq!(failed, 0, "{name}'s correct twin ({backend}): {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_join_under_a_lock_the_joined_thread_takes() {
    flagged_every_run_and_the_twin_never(
        "join_under_lock",
        &["waits"],
        "which would end that wait",
    );
}

#[test]
fn daqiri_s_join_under_the_registry_lock_a_stats_thread_takes() {
    flagged_every_run_and_the_twin_never("daqiri", &["waits"], "wait under a lock");
}

#[test]
fn a_join_by_semaphore_under_a_pool_lock() {
    flagged_every_run_and_the_twin_never("semaphore_join", &["waits"], "a semaphore wait on");
}

#[test]
fn an_abba_inversion() {
    flagged_every_run_and_the_twin_never("abba", &["waits"], "lock order");
}

#[test]
fn a_three_lock_cycle_and_its_gated_twin() {
    flagged_every_run_and_the_twin_never("three_locks", &["waits"], "lock order");
}

#[test]
fn an_untimed_condition_wait_whose_signal_can_come_first() {
    flagged_every_run_and_the_twin_never(
        "lost_wakeup",
        &["waits", "unbounded-waits"],
        "wait without a bound",
    );
}
