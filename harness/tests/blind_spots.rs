//! The blind-spot scenarios each catch their own class of bug, switched into the transport by
//! the test-only `bug-injection` feature (`WRINGER_TRANSPORT_BUG`), and pass without it.

#![cfg(feature = "bug-injection")]

mod common;

use common::run_with_bug as run_with;

/// Run one scenario file with `bug` switched on; returns (exit code, failures).
fn run(file: &str, bug: &str, tag: &str) -> (i32, Vec<String>) {
    run_with(file, bug, tag, &[])
}

#[test]
fn a_late_timer_that_loses_a_handed_over_connection_is_a_disagreement() {
    let file = "scenarios/tcp-lazy-connect-deadline-race.yaml";
    for round in 0..2 {
        let (code, failures) = run(file, "late-timer", &format!("late-{round}"));
        assert_eq!(code, 1, "round {round} passed");
        assert!(
            failures
                .iter()
                .any(|f| f.contains("`disagreements` from both sides' evidence")),
            "{failures:#?}"
        );
    }
    // The correct transport's run is test-local's (in release, one scenario at a time): here,
    // beside every other test on two cores, a starved handshake can outlast its backstop.
}

#[test]
fn an_initiator_without_a_hello_backstop_hangs_and_the_watchdog_says_where() {
    let file = "harness/tests/fixtures/never-answers-short.yaml";
    let (code, failures) = run(file, "no-hello-backstop", "backstop");
    assert_eq!(code, 1);
    assert!(
        failures
            .iter()
            .any(|f| f.contains("hung in step 0 (listener-never-answers)")),
        "{failures:#?}"
    );
    let (code, failures) = run(file, "none", "backstop-ok");
    assert_eq!(code, 0, "{failures:#?}");
}

#[test]
fn a_short_read_on_the_large_payload_path_taken_as_a_frame_fails_exact_reads() {
    let (code, failures) = run(
        "scenarios/tcp-exact-reads.yaml",
        "short-direct-read",
        "short",
    );
    assert_eq!(code, 1, "{failures:#?}");
    let (code, failures) = run("scenarios/tcp-exact-reads.yaml", "none", "exact-ok");
    assert_eq!(code, 0, "{failures:#?}");
}

#[test]
fn a_receiver_that_reads_after_teardown_raises_the_ebadf_count_without_the_audit() {
    // The read errors of a stopped receiver are counted by kind, never folded into a normal
    // local close, so the outcome check can fail too.
    let file = "scenarios/tcp-teardown-cycles.yaml";
    let (code, failures) = run_with(file, "use-after-close", "ebadf", &["--no-audit"]);
    assert_eq!(code, 1);
    assert!(
        failures.iter().any(|f| f.contains("`ebadf` on rank 0")),
        "{failures:#?}"
    );
}
