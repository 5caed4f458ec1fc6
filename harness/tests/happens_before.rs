//! The descriptor rules judged by happens-before, on programs of the seed's class that exit 0
//! and whose race does not show in an ordinary run: each broken one is flagged on every run
//! (20 of 20, with eBPF and with strace), each correct twin (a hand-over through a join, a
//! condition variable, a semaphore, a mutex) on none. The sync observer is preloaded into the
//! program by `wringer audit`.

mod common;

use common::{audit_repeats, build_fixture, build_fixture_linked, scratch};

const RUNS: u32 = 20;

fn flagged_every_run_and_the_twin_never(name: &str, check: &str) {
    flagged_with(name, check, &[]);
}

/// As above, with `checks` asked for (none: `wringer audit`'s defaults).
fn flagged_with(name: &str, check: &str, checks: &[&str]) {
    flagged_at(name, check, checks, &[]);
}

/// As above; under eBPF the finding also names each of `sites` (`fixture.c:LINE`): the calls'
/// call sites, read from the sync observer's slot.
fn flagged_at(name: &str, check: &str, checks: &[&str], sites: &[&str]) {
    let dir = scratch("hb", name);
    let broken = build_fixture(&dir, "happens_before", name, false);
    let twin = build_fixture(&dir, "happens_before", name, true);
    for backend in ["ebpf", "strace"] {
        let (failed, text) = audit_repeats(&dir, &broken, backend, checks, RUNS);
        assert_eq!(failed, u64::from(RUNS), "{name} ({backend}): {text}");
        assert!(
            text.contains(check),
            "{name} ({backend}): no {check:?} in {text}"
        );
        for site in sites.iter().filter(|_| backend == "ebpf") {
            assert!(
                text.contains(&format!("{name}.c:{site}")),
                "{name} ({backend}): no call site {name}.c:{site} in {text}"
            );
        }
        let (failed, text) = audit_repeats(&dir, &twin, backend, checks, 5);
        assert_eq!(failed, 0, "{name}'s correct twin ({backend}): {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn close_then_join() {
    // The close in main, and the reader's read that nothing orders before it.
    flagged_at(
        "close_then_join",
        "close before the receiver is done",
        &[],
        &["26)", "13)"],
    );
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
    // The common cleanup's close, and the error path's before it.
    flagged_at("double_close", "double close", &[], &["18)", "14)"]);
}

/// A socket inherited across `exec` without close-on-exec by a program that never uses it,
/// still open there when the parent closes its own end; the twin makes it close-on-exec and
/// hands a pipe over on purpose (the child writes to it).
#[test]
fn a_socket_inherited_without_close_on_exec() {
    flagged_every_run_and_the_twin_never("inherited_socket", "without close-on-exec");
}

/// `--check leaks` under `wringer audit`: what the program made and left open at its exit.
#[test]
fn a_descriptor_left_open_at_exit() {
    flagged_with("exit_leak", "still open when it exited", &["leaks"]);
}

/// An io_uring receive in flight on a socket at its close (eBPF reads io_uring's tracepoints;
/// strace sees only `io_uring_enter`, so this class is eBPF's alone); the twin cancels it and
/// reaps both completions first.
#[test]
fn an_io_uring_receive_in_flight_at_the_close() {
    let dir = scratch("hb", "uring");
    let broken = build_fixture_linked(&dir, "io_uring", "recv_in_flight", false, &["-luring"]);
    let twin = build_fixture_linked(&dir, "io_uring", "recv_in_flight", true, &["-luring"]);
    let (failed, text) = audit_repeats(&dir, &broken, "ebpf", &[], RUNS);
    assert_eq!(failed, u64::from(RUNS), "{text}");
    assert!(text.contains("io_uring RECV"), "{text}");
    let (failed, text) = audit_repeats(&dir, &twin, "ebpf", &[], 5);
    assert_eq!(failed, 0, "the twin: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Probes of numbers a program never held, a close-on-exec sweep and an exec chain are not
/// uses after close.
#[test]
fn probes_sweeps_and_exec_chains_are_clean() {
    let dir = scratch("hb", "probes");
    let exe = build_fixture(&dir, "happens_before", "probes", true);
    for backend in ["ebpf", "strace"] {
        let (failed, text) = audit_repeats(&dir, &exe, backend, &[], 3);
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
    let dir = scratch("hb", "spinning");
    let exe = build_fixture(&dir, "happens_before", "spinning", true);
    let (failed, text) = audit_repeats(&dir, &exe, "ebpf", &[], 2);
    assert_eq!(failed, 0, "spinning (ebpf): {text}");
    assert!(!text.contains("incomplete"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A correct Rust program whose hand-over the trace cannot show: a socket read by one thread,
/// sent through a std channel to another that closes it. Rust's std synchronizes through its
/// own futexes (the observer tells the process so), so the release is judged only by what is
/// certain, and the program is clean on every run with both recorders.
#[test]
fn a_hand_over_through_a_rust_channel_is_never_flagged() {
    let dir = scratch("hb", "channel_handover");
    let src = common::repo().join("harness/tests/fixtures/happens_before/channel_handover.rs");
    let exe = dir.join("channel_handover");
    let built = std::process::Command::new("rustc")
        .args(["-O", "-g", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(built.success(), "compiling {}", src.display());
    for backend in ["ebpf", "strace"] {
        let (failed, text) = audit_repeats(&dir, &exe, backend, &[], 5);
        assert_eq!(failed, 0, "channel_handover ({backend}): {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
