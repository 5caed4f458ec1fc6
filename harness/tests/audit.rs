//! The lifecycle audit end to end: lifecycle bugs switched into the transport (test-only, see
//! transport's `bug-injection` feature) fail an audited teardown scenario on every run, the
//! correct transport passes it, and the audit works on a program wringer did not write. Each
//! runs on both syscall recorders (eBPF and strace), which must give the same verdicts.

use std::path::PathBuf;
use std::process::Command;

#[cfg_attr(not(feature = "bug-injection"), allow(dead_code))]
mod common;

use common::repo;
use wringer::model::scenario::{AuditBackend, AuditCheck};
use wringer::orchestration::audit;

fn need(tool: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    assert!(
        found,
        "{tool} is not installed: install Debian's `{tool}` (`just test` and .ci/run do)"
    );
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wringer-audit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Both recorders; eBPF is asked for, so a host where it cannot load fails the test rather
/// than falling back to strace unseen.
const BACKENDS: [&str; 2] = ["ebpf", "strace"];

/// Run the audited teardown fixture with `bug` switched on, its syscalls recorded by
/// `backend`; returns (exit code, failures).
#[cfg(feature = "bug-injection")]
fn audited_teardown(bug: &str, run: u32, backend: &str) -> (i32, Vec<String>) {
    need("strace");
    let file = "harness/tests/fixtures/audited-teardown.yaml";
    common::run_with_bug(
        file,
        bug,
        &format!("audit-{bug}-{backend}-{run}"),
        &["--audit-backend", backend],
    )
}

#[cfg(feature = "bug-injection")]
fn caught_every_time(bug: &str, check: &str) {
    for backend in BACKENDS {
        for run in 0..3 {
            let (code, failures) = audited_teardown(bug, run, backend);
            assert_eq!(
                code, 1,
                "{backend}: run {run} of {bug} passed: {failures:?}"
            );
            assert!(
                failures
                    .iter()
                    .any(|f| f.contains(&format!("audit: rank 0: {check} in pid"))),
                "{backend}: run {run} of {bug}: no `{check}` among {failures:#?}"
            );
        }
    }
}

#[test]
#[cfg(feature = "bug-injection")]
fn releasing_the_descriptor_before_joining_the_receiver_fails_every_run() {
    caught_every_time("close-before-join", "close before the receiver is done");
}

#[test]
#[cfg(feature = "bug-injection")]
fn closing_a_descriptor_the_receiver_is_blocked_on_fails_every_run() {
    caught_every_time("close-while-in-use", "close while in use");
}

#[test]
#[cfg(feature = "bug-injection")]
fn touching_the_descriptor_after_teardown_fails_every_run() {
    caught_every_time("use-after-close", "use after close");
}

#[test]
#[cfg(feature = "bug-injection")]
fn the_correct_transport_passes_the_audited_teardown() {
    for backend in BACKENDS {
        for run in 0..3 {
            let (code, failures) = audited_teardown("none", run, backend);
            assert_eq!(code, 0, "{backend}: run {run}: {failures:#?}");
            assert!(failures.is_empty());
        }
    }
}

#[test]
fn the_audit_catches_a_broken_program_wringer_did_not_write() {
    need("strace");
    need("cc");
    let dir = temp("c-fixture");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("close_in_use");
    let src = repo().join("harness/tests/fixtures/broken/close_in_use.c");
    let cc = Command::new("cc")
        .args(["-O0", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(cc.success(), "compiling {}", src.display());
    for backend in [AuditBackend::Ebpf, AuditBackend::Strace] {
        let (found, text) = audited_checks(&dir, &exe, backend);
        let found: Vec<&str> = found.iter().map(|v| v.split(':').next().unwrap()).collect();
        assert!(
            found.contains(&"close while in use"),
            "{backend}: {found:?}\n{text}"
        );
        assert!(
            found.contains(&"use after close"),
            "{backend}: {found:?}\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Build a fixture of `fixtures/lifecycle/`, broken or as its correct twin (`-DCORRECT`).
fn build_lifecycle_fixture(dir: &std::path::Path, name: &str, correct: bool) -> PathBuf {
    common::build_fixture(dir, "lifecycle", name, correct)
}

/// Run `exe` with its syscalls recorded by `backend`; the checks it trips.
fn audited_checks(
    dir: &std::path::Path,
    exe: &std::path::Path,
    backend: AuditBackend,
) -> (Vec<String>, String) {
    let trace = dir.join(format!(
        "{}.{backend}.trace",
        exe.file_name().unwrap().to_string_lossy()
    ));
    let words = audit::tracer_command(
        backend,
        env!("CARGO_BIN_EXE_wringer"),
        &[AuditCheck::FdLifecycle],
        &[],
        1,
        &trace,
    );
    let status = Command::new(&words[0])
        .args(&words[1..])
        .arg(exe)
        .status()
        .unwrap();
    assert!(status.success(), "{} exited with {status}", exe.display());
    let text = std::fs::read_to_string(&trace).unwrap();
    let checks = [AuditCheck::FdLifecycle];
    let by_text: Vec<String> = audit::analyse(&text, &checks)
        .iter()
        .map(|v| format!("{}: {}", v.check, v.detail))
        .collect();
    if backend != AuditBackend::Ebpf {
        return (by_text, text);
    }
    // The eBPF recorder's typed events, beside its trace, are what the checker reads; its
    // text, read as strace's, must say the same.
    let calls_path = wringer::hosts::syscall_trace::calls_path(&trace);
    let calls =
        std::fs::read(&calls_path).unwrap_or_else(|e| panic!("{}: {e}", calls_path.display()));
    let typed = wringer::hosts::syscall_trace::typed_events(&text, &calls)
        .unwrap_or_else(|| panic!("{} does not cover its trace", calls_path.display()));
    assert!(typed.len() > 10, "{} typed events\n{text}", typed.len());
    let found: Vec<String> = audit::analyse_after(&text, Some(typed), &checks, true)
        .iter()
        .map(|v| format!("{}: {}", v.check, v.detail))
        .collect();
    assert_eq!(found, by_text, "typed events and text disagree\n{text}");
    (found, text)
}

/// Programs built around their descriptors in other shapes than `close_in_use.c` (a `select`
/// loop, an epoll event loop, a `dup2` over a blocked read, a forked child's `close_range`):
/// each broken one is caught by the release that breaks it, each correct twin is clean.
#[test]
fn the_audit_catches_every_release_under_a_waiting_thread_and_passes_the_correct_twins() {
    need("strace");
    need("cc");
    let dir = temp("lifecycle-shapes");
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("select_loop", "select"),
        ("epoll_loop", "waiting for it in its epoll set"),
        ("dup2_interrupt", "released (by dup2)"),
        ("forked_close_range", "released (by close_range)"),
    ];
    for (name, says) in cases {
        let broken = build_lifecycle_fixture(&dir, name, false);
        let twin = build_lifecycle_fixture(&dir, name, true);
        let mut verdicts = vec![];
        for backend in [AuditBackend::Ebpf, AuditBackend::Strace] {
            let (found, text) = audited_checks(&dir, &broken, backend);
            assert!(
                found
                    .iter()
                    .any(|v| v.starts_with("close while in use") && v.contains(says)),
                "{name} ({backend}): no close while in use {says:?} among {found:#?}\n{text}"
            );
            let mut kinds: Vec<&str> = found.iter().map(|v| v.split(':').next().unwrap()).collect();
            kinds.sort_unstable();
            kinds.dedup();
            verdicts.push(kinds.join(", "));
            let (found, text) = audited_checks(&dir, &twin, backend);
            assert!(
                found.is_empty(),
                "{name}'s correct twin ({backend}): {found:#?}\n{text}"
            );
        }
        assert_eq!(verdicts[0], verdicts[1], "{name}: eBPF and strace disagree");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A ring buffer too small for the program's syscalls drops events; the trace says how many,
/// so that the audit reads it as incomplete, never as clean.
#[test]
fn events_the_ring_buffer_drops_are_counted_in_the_trace() {
    let dir = temp("lossy");
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("lossy.trace");
    let status = Command::new(env!("CARGO_BIN_EXE_wringer"))
        .args(["trace-syscalls", "--out"])
        .arg(&trace)
        .args([
            "--",
            "dd",
            "if=/dev/zero",
            "of=/dev/null",
            "bs=1",
            "count=20000",
        ])
        // One page: a dozen events, and the reader is not woken before far more are waiting.
        .env("WRINGER_EBPF_RING_BYTES", "4096")
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "dd under the recorder: {status}");
    let text = std::fs::read_to_string(&trace).unwrap();
    let lost = wringer::hosts::syscall_trace::lost_events(&text);
    assert!(lost > 1000, "{lost} events counted lost in\n{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
