//! Every loopback TCP scenario of `scenarios/`, as a test: the test command `just mutants` adds
//! for the mutants the transport's own tests let through. `just test-local` runs the same
//! scenarios as the main job, so `just test` leaves this one out.

use std::process::Command;

mod common;

#[test]
#[ignore = "runs every loopback TCP scenario (about a minute); just test-local runs them as the main job, just mutants runs this test"]
fn every_loopback_tcp_scenario_passes() {
    let dir = std::env::temp_dir().join(format!("wringer-tcp-scenarios-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_wringer"))
        .current_dir(common::repo())
        .args(["run", "scenarios", "--filter", "tcp-", "--report-dir"])
        .arg(&dir)
        .env("CI", "true")
        .output()
        .unwrap();
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    let scenarios = results["scenarios"].as_array().unwrap();
    let verdict = |s: &serde_json::Value| s["verdict"].as_str().unwrap_or("").to_string();
    let ran: Vec<_> = scenarios
        .iter()
        .filter(|s| verdict(s) != "skip")
        .map(|s| (s["name"].as_str().unwrap_or("").to_string(), verdict(s)))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    // The cross-host ones skip on loopback; every other TCP scenario runs.
    assert!(
        ran.len() >= 10,
        "only {} TCP scenarios ran: {ran:?}",
        ran.len()
    );
    let failed: Vec<_> = ran.iter().filter(|(_, v)| v != "pass").collect();
    assert!(
        failed.is_empty() && out.status.success(),
        "failed: {failed:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
