//! Hostile and careless input: every bad value is refused by `wringer validate` with exit 2 and
//! the file, line and column, before anything runs: no panic, no huge allocation.

use std::process::Command;

const WRINGER: &str = env!("CARGO_BIN_EXE_wringer");

fn validate(tag: &str, yaml: &str) -> (i32, String) {
    let dir = std::env::temp_dir().join(format!("wringer-hostile-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("s.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(WRINGER)
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scenario(deadline: &str, step: &str) -> String {
    format!(
        "name: h\ndescription: d\nranks: 2\ndeadline: {deadline}\nsteps:\n  - {step}\nexpect: {{}}\n"
    )
}

#[test]
fn a_duration_no_clock_can_hold_is_a_located_error() {
    let (code, err) = validate(
        "dur",
        &scenario(
            "99999999999999999999s",
            "stall: { duration: 1s, deadline: 5s }",
        ),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("s.yaml:4:11") && err.contains("7 days"),
        "{err}"
    );
}

#[test]
fn every_parameter_that_sizes_work_has_a_bound() {
    let huge = "4294967295";
    let steps = [
        format!("teardown-cycles: {{ cycles: {huge}, deadline: 10s }}"),
        format!("pingpong: {{ sizes: [64], iterations: {huge}, deadline: 10s }}"),
        "pingpong: { sizes: [4294967295], iterations: 1, deadline: 10s }".to_string(),
        format!("rdma-pingpong: {{ sizes: [64], iterations: {huge}, deadline: 10s }}"),
        format!("rdma-lossless-stream: {{ messages: 1, size: {huge}, deadline: 10s }}"),
        format!("rdma-lossless-stream: {{ messages: {huge}, size: 64, deadline: 10s }}"),
        format!("rdma-interop-rc-pingpong: {{ size: 64, iterations: {huge}, deadline: 10s }}"),
        format!("rdma-graceful-shutdown: {{ connections: {huge}, messages: 1, stats_period: 5ms, deadline: 10s }}"),
        format!("rdma-peer-death: {{ frames_before_fault: {huge}, detect_timeout: 1s, deadline: 10s }}"),
        format!("rdma-xhost-send: {{ messages: {huge}, server_seconds: 1s, deadline: 10s }}"),
        format!("peer-death: {{ victim: 1, frames_before_fault: {huge}, detect_timeout: 1s, deadline: 10s }}"),
        format!("exact-reads: {{ dribbled_frames: 1, split_payload_bytes: {huge}, large_sizes: [], random_splits: 0, deadline: 10s }}"),
        format!("lazy-connect-deadline-race: {{ attempts: {huge}, wait_timeout: 20ms, spread: 10ms, deadline: 60s }}"),
    ];
    for (i, step) in steps.iter().enumerate() {
        let (code, err) = validate(&format!("bound-{i}"), &scenario("60s", step));
        assert_eq!(code, 2, "{step}: {err}");
        assert!(err.contains("s.yaml:6:5"), "{step}: {err}");
        assert!(
            err.contains("must be") || err.contains("needs"),
            "{step}: {err}"
        );
    }
}
