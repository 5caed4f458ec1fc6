//! Suppression files: a finding an entry names (by check and program, or by call site) passes
//! and is counted in the report; one it does not name still fails; a bad file is an input
//! error at its line and column (exit 2).

mod common;

use std::path::Path;
use std::process::Command;

use common::{audit_once, build_fixture, scratch};

/// `wringer audit` of `exe` with `args` before `--`: (exit code, results.json's first scenario).
fn audit(dir: &Path, exe: &Path, args: &[&str]) -> (i32, serde_json::Value) {
    audit_once(&dir.join("report"), exe, args)
}

#[test]
fn a_named_finding_is_counted_not_failed_and_others_still_fail() {
    let dir = scratch("suppressions", "named");
    let leaky = build_fixture(&dir, "happens_before", "exit_leak", false);
    let file = dir.join("suppress.yaml");
    std::fs::write(
        &file,
        "# the fixture's error path is what is tested elsewhere\n\
         - check: leak\n  program: \"*exit_leak\"\n  reason: its error path leaks on purpose\n",
    )
    .unwrap();
    let supp = file.to_str().unwrap();
    for backend in ["ebpf", "strace"] {
        let (code, s) = audit(
            &dir,
            &leaky,
            &[
                "--audit-backend",
                backend,
                "--check",
                "leaks",
                "--suppressions",
                supp,
            ],
        );
        assert_eq!(code, 0, "{backend}: {s}");
        let notes = s["evidence"]["notes"].to_string();
        assert!(
            notes.contains(
                "3 finding(s) suppressed: leak in *exit_leak (its error path leaks on purpose)"
            ),
            "{backend}: {notes}"
        );
    }
    // Another program's findings are not this entry's.
    let abba = build_fixture(&dir, "waits", "abba", false);
    let (code, _) = audit(&dir, &abba, &["--check", "waits", "--suppressions", supp]);
    assert_eq!(code, 1);
    // By call site: the lock-order cycle names the fixture's function and file.
    std::fs::write(
        &file,
        "- check: lock order\n  site: \"second at abba.c:\"\n  reason: a test of suppressions\n",
    )
    .unwrap();
    let (code, s) = audit(&dir, &abba, &["--check", "waits", "--suppressions", supp]);
    assert_eq!(code, 0, "{s}");
    assert!(s["evidence"]["notes"]
        .to_string()
        .contains("suppressed: lock order at second at abba.c:"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_suppressions_file_is_an_input_error_where_it_is_wrong() {
    let dir = scratch("suppressions", "bad");
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "- check: leak\n  program: x\n  reason: fine\n- check: lek\n  program: x\n  reason: r\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_wringer"))
        .current_dir(&dir)
        .args(["audit", "--suppressions"])
        .arg(&file)
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.yaml:4:"), "{err}");
    assert!(err.contains("names no finding"), "{err}");
    assert!(
        !dir.join("reports").exists(),
        "bad input wrote a report folder"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
