//! What the scenario-running tests share: run `wringer run` on one file with a transport bug
//! switched on (test-only `bug-injection`) and read back the scenario's failures, and find the
//! processes a run left behind. (Each test file uses some of it.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Run `file` with `WRINGER_TRANSPORT_BUG=bug` and `extra` arguments; returns the exit code
/// and the first scenario's failures.
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
    let failures = results["scenarios"][0]["evidence"]["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
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
