//! Reachability: a scenario fails when no repeat reached a point it requires, and the report
//! counts per point the repeats that reached it; a point no step declares is a load error.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

mod common;

use common::repo;

const WRINGER: &str = env!("CARGO_BIN_EXE_wringer");

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wringer-reach-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn a_required_point_no_repeat_reached_fails_the_scenario_though_every_bound_holds() {
    let dir = temp("unreachable");
    let out = Command::new(WRINGER)
        .current_dir(repo())
        .args([
            "run",
            "harness/tests/fixtures/unreachable-mid-payload.yaml",
            "--repeat",
            "2",
            "--report-dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    let s = &v["scenarios"][0];
    assert_eq!(s["verdict"], "fail");
    assert_eq!(
        s["repeats_failed"], 0,
        "every repeat held its bounds: {s:#}"
    );
    let failures = s["evidence"]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{failures:#?}");
    assert_eq!(failures[0]["kind"], "never-reached");
    assert_eq!(failures[0]["point"], "timeout-mid-payload");
    assert!(
        s["reason"]
            .as_str()
            .unwrap()
            .starts_with("never reached: `timeout-mid-payload`"),
        "{s:#}"
    );
    // The report counts each point's repeats.
    let reach = s["evidence"]["reach"].as_array().unwrap();
    let header = reach
        .iter()
        .find(|r| r["point"] == "timeout-mid-header")
        .unwrap();
    assert_eq!(
        (
            header["repeats_reached"].as_u64(),
            header["repeats"].as_u64()
        ),
        (Some(2), Some(2)),
        "{header:#}"
    );
    assert!(
        header["times"].as_u64().unwrap() >= 2 * 10 * 2,
        "{header:#}"
    );
    let payload = reach
        .iter()
        .find(|r| r["point"] == "timeout-mid-payload")
        .unwrap();
    assert_eq!(payload["repeats_reached"], 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_point_no_step_declares_is_bad_input_with_its_place() {
    let dir = temp("unknown-point");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("s.yaml");
    let text = std::fs::read_to_string(repo().join("scenarios/tcp-teardown-cycles.yaml"))
        .unwrap()
        .replace(
            "must_reach: [closed-with-receiver-blocked]",
            "must_reach: [closed-with-receiver-blokced]",
        );
    std::fs::write(&file, text).unwrap();
    let out = Command::new(WRINGER)
        .args(["validate"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("s.yaml:") && err.contains("closed-with-receiver-blokced"),
        "{err}"
    );
    assert!(
        err.contains("`closed-with-receiver-blocked`"),
        "names what it declares: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
