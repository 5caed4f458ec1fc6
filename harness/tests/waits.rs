//! The wait-for audit (`--check waits`, `--check unbounded-waits`) on deadlocks that did not
//! happen: each program exits 0 in an ordinary run, and is flagged on every run (20 of 20) with
//! both recorders, its call sites named by file and line; each correct twin (the lock let go before the join or the wait, one lock order,
//! a gate lock, a predicate and a deadline) on none.

mod common;

use common::{audit_once, audit_repeats, build_fixture, scratch};

const RUNS: u32 = 20;

fn flagged_every_run_and_the_twin_never(name: &str, checks: &[&str], says: &str) {
    let dir = scratch("waits", name);
    let broken = build_fixture(&dir, "waits", name, false);
    let twin = build_fixture(&dir, "waits", name, true);
    for backend in ["ebpf", "strace"] {
        let (failed, text) = audit_repeats(&dir, &broken, backend, checks, RUNS);
        assert_eq!(failed, u64::from(RUNS), "{name} ({backend}): {text}");
        assert!(
            text.contains(says),
            "{name} ({backend}): no {says:?} in {text}"
        );
        // Call sites by file and line (the fixtures have debug information).
        assert!(
            text.contains(&format!("{name}.c:")),
            "{name} ({backend}): no call site in {name}.c named in {text}"
        );
        let (failed, text) = audit_repeats(&dir, &twin, backend, checks, 2);
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

/// A deadlock that happens: the run hangs until its deadline, and its verdict names the
/// wait-for cycle (each thread, the lock it waits for and where, who holds it and where it was
/// taken), with both recorders; the twin (one lock order) ends and passes.
#[test]
fn a_forced_deadlock_s_verdict_names_its_cycle() {
    let dir = scratch("waits", "deadlock");
    let broken = build_fixture(&dir, "waits", "deadlock", false);
    let twin = build_fixture(&dir, "waits", "deadlock", true);
    for backend in ["ebpf", "strace"] {
        let report = dir.join(format!("report-{backend}"));
        let (code, scenario) = audit_once(
            &report,
            &broken,
            &["--audit-backend", backend, "--deadline", "5s"],
        );
        assert_eq!(code, 1, "{backend}");
        // Every failure of the run (the page's table shows the first: the watchdog's, when it
        // fired before the step's own deadline).
        let summary = scenario["evidence"]["failures"].to_string();
        for says in [
            "the run hung in a wait-for cycle",
            "(main at deadlock.c:33)) for lock",
            "(second at deadlock.c:18)) for lock",
            "held by thread",
            // and where the watchdog's stacks of those threads are
            "the threads' stacks: ",
        ] {
            assert!(
                summary.contains(says),
                "{backend}: no {says:?} in {summary}"
            );
        }
        let (failed, text) = audit_repeats(&dir, &twin, backend, &[], 2);
        assert_eq!(failed, 0, "the twin ({backend}): {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hang that happens, with `checks`: the run fails, and its verdict says each of `says`
/// (with eBPF also each of `sites`, the calls' call sites); the twin ends and passes.
fn hangs_and_is_named(name: &str, checks: &[&str], says: &[&str], sites: &[&str]) {
    let dir = scratch("waits", name);
    let broken = build_fixture(&dir, "waits", name, false);
    let twin = build_fixture(&dir, "waits", name, true);
    for backend in ["ebpf", "strace"] {
        let report = dir.join(format!("report-{backend}"));
        let mut args = vec!["--audit-backend", backend, "--deadline", "5s"];
        for c in checks {
            args.extend(["--check", c]);
        }
        let (code, scenario) = audit_once(&report, &broken, &args);
        assert_eq!(code, 1, "{name} ({backend})");
        let summary = scenario["evidence"]["failures"].to_string();
        let sites = sites.iter().filter(|_| backend == "ebpf");
        for s in says
            .iter()
            .map(|s| s.to_string())
            .chain(sites.map(|s| format!("{name}.c:{s}")))
        {
            assert!(
                summary.contains(&s),
                "{name} ({backend}): no {s:?} in {summary}"
            );
        }
        // The harness's own tool (gdb, taking the stacks) is never judged as the program.
        assert!(!summary.contains("gdb"), "{name} ({backend}): {summary}");
        let (failed, text) = audit_repeats(&dir, &twin, backend, checks, 2);
        assert_eq!(failed, 0, "{name}'s twin ({backend}): {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plain mutex taken again by the thread that holds it: a wait-for cycle of one.
#[test]
fn a_thread_that_locks_what_it_holds() {
    hangs_and_is_named(
        "relock",
        &["waits"],
        &["the run hung in a wait-for cycle", "which it holds itself"],
        &["9)", "20)"],
    );
}

/// Two threads joining each other, the main thread one of them.
#[test]
fn two_threads_that_join_each_other() {
    hangs_and_is_named(
        "join_cycle",
        &["waits"],
        &["the run hung in a wait-for cycle", "which has not ended"],
        &[],
    );
}

/// Two processes blocked writing to each other (no locks, no threads): each blocked write is
/// named as it was when the run was found hung (gdb's attach may end a write short).
#[test]
fn two_processes_that_write_to_each_other_first() {
    hangs_and_is_named(
        "pipe_cycle",
        &["unbounded-waits"],
        &[
            "was still inside write()",
            "with no timeout when the run was found hung",
        ],
        &["13)"],
    );
}
