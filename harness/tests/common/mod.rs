//! What the scenario-running tests share: run `wringer run` on one file with a transport bug
//! switched on (test-only `bug-injection`) and read back the scenario's failures, and find the
//! processes a run left behind. (Each test file uses some of it.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The wringer binary under test, run from the repository root as CI runs it (`CI=true`: plain
/// progress lines).
pub fn wringer() -> Command {
    wringer_at(env!("CARGO_BIN_EXE_wringer"))
}

/// [`wringer`], or the binary `$WRINGER_BIN` names where it is set: the release build the
/// stage running this test ran its scenarios with (`just test-slurm`; CI builds this test once
/// with the others, and no release build of it is needed).
pub fn wringer_given() -> Command {
    match std::env::var_os("WRINGER_BIN") {
        Some(bin) => wringer_at(bin),
        None => wringer(),
    }
}

fn wringer_at(bin: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(bin);
    c.current_dir(repo()).env("CI", "true");
    c
}

/// The failures of a `results.json` scenario entry, read as the typed records they are, each
/// as `[kind] sentence` (`[bound] repeat 0: ...`).
pub fn failures(scenario: &serde_json::Value) -> Vec<String> {
    let failed: Vec<wringer::model::failure::Failed> =
        serde_json::from_value(scenario["evidence"]["failures"].clone())
            .expect("failures are typed records");
    failed
        .iter()
        .map(|f| format!("[{}] {f}", f.failure.kind()))
        .collect()
}

/// Run `file` with `WRINGER_TRANSPORT_BUG=bug` and `extra` arguments; returns the exit code
/// and the first scenario's failures (see [`failures`]).
pub fn run_with_bug(file: &str, bug: &str, tag: &str, extra: &[&str]) -> (i32, Vec<String>) {
    let dir = std::env::temp_dir().join(format!("wringer-bug-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_wringer"))
        .current_dir(repo())
        .args(["run", file])
        .args(extra)
        .arg("--report-dir")
        .arg(&dir)
        .env("CI", "true")
        .env("WRINGER_TRANSPORT_BUG", bug)
        .output()
        .unwrap();
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    let failures = failures(&results["scenarios"][0]);
    let _ = std::fs::remove_dir_all(&dir);
    (out.status.code().unwrap_or(-1), failures)
}

/// Every process whose environment holds `WRINGER_TEST_MARKER=marker`: ranks, and the programs
/// they start, inherit it, so a run's leftovers can be found.
pub fn processes_with(marker: &str) -> Vec<u32> {
    let needle = format!("WRINGER_TEST_MARKER={marker}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// A fresh scratch folder under `$TMPDIR` for one test (`tag` names the test file).
pub fn scratch(tag: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wringer-{tag}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Build the C fixture `harness/tests/fixtures/FOLDER/NAME.c` into `dir`, broken or as its
/// correct twin (`-DCORRECT`).
pub fn build_fixture(dir: &Path, folder: &str, name: &str, correct: bool) -> PathBuf {
    build_fixture_linked(dir, folder, name, correct, &[])
}

/// As [`build_fixture`], linked with `libs` (`-luring`).
pub fn build_fixture_linked(
    dir: &Path,
    folder: &str,
    name: &str,
    correct: bool,
    libs: &[&str],
) -> PathBuf {
    let exe = dir.join(if correct {
        format!("{name}_correct")
    } else {
        name.to_string()
    });
    let src = repo().join(format!("harness/tests/fixtures/{folder}/{name}.c"));
    let mut cc = Command::new("cc");
    cc.args(["-O0", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src);
    if correct {
        cc.arg("-DCORRECT");
    }
    cc.args(libs);
    assert!(
        cc.status().unwrap().success(),
        "compiling {}",
        src.display()
    );
    exe
}

/// `wringer audit` of `exe` with `args` before `--`, its report in `report` (made afresh):
/// the exit code and results.json's first scenario (null when the run wrote none).
pub fn audit_once(report: &Path, exe: &Path, args: &[&str]) -> (i32, serde_json::Value) {
    let _ = std::fs::remove_dir_all(report);
    let out = Command::new(env!("CARGO_BIN_EXE_wringer"))
        .arg("audit")
        .args(args)
        .arg("--report-dir")
        .arg(report)
        .arg("--")
        .arg(exe)
        .env("WRINGER_REPLAYS", "0")
        .env("CI", "true")
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(
        matches!(code, 0 | 1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let scenario = std::fs::read(report.join("results.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .map(|v| v["scenarios"][0].clone())
        .unwrap_or(serde_json::Value::Null);
    (code, scenario)
}

/// `wringer audit` of `exe` with `checks` (none: its defaults), `runs` times, its syscalls
/// recorded by `backend`: (runs that failed, the failures' text).
pub fn audit_repeats(
    dir: &Path,
    exe: &Path,
    backend: &str,
    checks: &[&str],
    runs: u32,
) -> (u64, String) {
    let report = dir.join(format!(
        "{}-{backend}",
        exe.file_name().unwrap().to_string_lossy()
    ));
    let runs = runs.to_string();
    let mut args = vec!["--audit-backend", backend, "--repeat", &runs];
    for c in checks {
        args.extend(["--check", c]);
    }
    let (_, s) = audit_once(&report, exe, &args);
    (
        s["repeats_failed"].as_u64().unwrap(),
        s["evidence"]["failures"].to_string(),
    )
}
