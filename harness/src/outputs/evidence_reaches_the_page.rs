//! Every latency series and metric a step can record travels rank -> coordinator -> runner ->
//! results.json -> the HTML page, and none is dropped on the way.

use std::path::Path;
use std::time::Duration;

use super::report::ReportWriter;
use super::site::{self, ReportOptions};
use crate::hosts::probe;
use crate::model::metric::{Metric, SampleKey, Series};
use crate::model::result::{ScenarioResult, Verdict};
use crate::orchestration::events::{Counts, Reporter, RunEvent, RunMeta};
use crate::orchestration::runner::{summarise, Observed};
use crate::rank::protocol::StepReport;

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("wringer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The page `wringer report` makes of the run in `dir`.
fn render(dir: &Path) -> String {
    let page = dir.join("index.html");
    site::write(&ReportOptions {
        runs: vec![dir.to_owned()],
        history: dir.join("history.jsonl"),
        out: page.clone(),
        threshold: 0.2,
    })
    .unwrap();
    std::fs::read_to_string(&page).unwrap()
}

#[test]
fn every_series_a_step_records_reaches_results_json_and_the_page() {
    // What ranks would report: every series at two sizes, and a few metrics.
    let mut seen = Observed::default();
    for series in Series::ALL {
        for size in [64u64, 65536] {
            let mut r = StepReport::new(0);
            r.sample(series, size, vec![10.0, 12.0, 30.0]);
            for (k, v) in r.samples {
                seen.samples.entry(k).or_default().extend(v);
            }
        }
    }
    seen.metrics
        .insert(Metric::named("rdma_messages").unwrap(), vec![4.0]);
    let mut result = ScenarioResult::not_run(
        "every-series",
        Path::new("x.yaml"),
        Verdict::Pass,
        String::new(),
    );
    result.reason = None;
    summarise(&mut result, seen);
    result.evidence.replays.push(crate::model::result::Replay {
        repeat: 0,
        command: "wringer run --seed 7 --attempt 0 x.yaml".into(),
        shrink: "wringer run --seed 7 --attempt 0 --shrink x.yaml".into(),
        replayed: Some((2, 2)),
    });
    result.evidence.reach.push(crate::model::result::Reach {
        point: "closed-with-receiver-blocked".into(),
        meaning: "a close under a blocked receiver".into(),
        required: true,
        repeats_reached: 3,
        repeats: 3,
        times: 7500,
    });

    result.evidence.audit_recorder = Some(crate::model::result::AuditRecorder {
        backend: crate::model::scenario::AuditBackend::Strace,
        fallback: Some("perturbations are injected by strace".into()),
    });

    let dir = temp_dir("series");
    let meta = RunMeta::new("r1".into(), "local".into(), 1, vec![probe::local()], 1);
    let mut writer = ReportWriter::default();
    for e in [
        RunEvent::Started {
            meta: &meta,
            dir: &dir,
            scenarios: 1,
        },
        RunEvent::ScenarioFinished {
            index: 0,
            result: &result,
            elapsed: Duration::ZERO,
        },
        RunEvent::Finished {
            counts: Counts {
                pass: 1,
                ..Counts::default()
            },
            interrupted: false,
            elapsed: Duration::ZERO,
        },
    ] {
        writer.on_event(&e).unwrap();
    }

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["schema"], crate::model::result::SCHEMA);
    let latency = &json["scenarios"][0]["latency"];
    let back: ScenarioResult =
        serde_json::from_value(json["scenarios"][0].clone()).expect("results.json reads back");
    for series in Series::ALL {
        for size in [64u64, 65536] {
            let key = SampleKey { series, size };
            assert!(
                latency.get(key.to_string()).is_some(),
                "{key} missing: {latency}"
            );
            assert!(back.latency.contains_key(&key));
        }
    }
    assert!(json["scenarios"][0]["metrics"]["rdma_messages"].is_object());

    let html = render(&dir);
    // A failed attempt's replay and shrink lines, and the points reached, are on the page.
    assert!(
        html.contains("wringer run --seed 7 --attempt 0 x.yaml"),
        "no replay line"
    );
    assert!(html.contains("deterministic: failed 2 of 2 replays"));
    assert!(html.contains("--shrink x.yaml"));
    assert!(
        html.contains("closed-with-receiver-blocked (required): reached in 3 of 3 repeats"),
        "no reachability"
    );
    assert_eq!(back.evidence.reach.len(), 1);
    assert!(
        html.contains("syscalls recorded by strace (perturbations are injected by strace)"),
        "no audit backend"
    );
    assert_eq!(
        json["scenarios"][0]["evidence"]["audit_recorder"]["backend"],
        "strace"
    );
    assert_eq!(back.evidence.replays[0].replayed, Some((2, 2)));
    for series in Series::ALL {
        assert!(
            html.contains(&format!(
                "every-series (local): {} by message size",
                series.title()
            )),
            "the page has no chart for {series:?}"
        );
    }
    assert!(html.contains("rdma_messages"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Write one run of these results, as `wringer run` does, into `dir`.
fn write_run(dir: &Path, results: &[ScenarioResult]) {
    let meta = RunMeta::new("r1".into(), "local".into(), 1, vec![probe::local()], 1);
    let mut writer = ReportWriter::default();
    writer
        .on_event(&RunEvent::Started {
            meta: &meta,
            dir,
            scenarios: results.len(),
        })
        .unwrap();
    let mut counts = Counts::default();
    for (index, result) in results.iter().enumerate() {
        counts.add(result.verdict);
        writer
            .on_event(&RunEvent::ScenarioFinished {
                index,
                result,
                elapsed: Duration::ZERO,
            })
            .unwrap();
    }
    writer
        .on_event(&RunEvent::Finished {
            counts,
            interrupted: false,
            elapsed: Duration::ZERO,
        })
        .unwrap();
}

#[test]
fn a_failure_and_a_skip_reach_results_json_and_the_page_typed() {
    use crate::model::failure::{Failed, Failure, FailureKind};
    use crate::model::metric::Bound;
    use crate::model::requirement::{SkipCode, SkipReason};
    let mut failed = ScenarioResult::not_run("f", Path::new("f.yaml"), Verdict::Fail, "x".into());
    failed.evidence.failures = vec![
        Failed {
            repeat: Some(0),
            failure: Failure::Bound {
                metric: Metric::named("detect_ms").unwrap(),
                rank: Some(1),
                value: Some(4200.0),
                expected: Bound {
                    min: None,
                    max: Some(3000.0),
                    equals: None,
                },
            },
        },
        Failed {
            repeat: Some(1),
            failure: Failure::Watchdog {
                summary: "rank 1 still running".into(),
            },
        },
    ];
    let skipped = ScenarioResult::skipped(
        "s",
        Path::new("s.yaml"),
        SkipReason {
            code: SkipCode::NoRdmaDevice,
            detail: "/sys/class/infiniband is absent".into(),
        },
    );
    let dir = temp_dir("typed");
    write_run(&dir, &[failed, skipped]);
    let run = site::load_run(&dir).expect("the run reads back");
    assert_eq!(
        run.scenarios[0].failure_kinds(),
        [FailureKind::Bound, FailureKind::Watchdog]
    );
    assert_eq!(
        run.scenarios[1].skip.as_ref().map(|s| s.code),
        Some(SkipCode::NoRdmaDevice)
    );
    let html = render(&dir);
    assert!(
        html.contains(
            "<span class=\"kind\">bound</span> repeat 0: `detect_ms` on rank 1: 4200 &gt; max 3000"
        ),
        "{html}"
    );
    assert!(html
        .contains("<span class=\"kind\">watchdog</span> repeat 1: watchdog: rank 1 still running"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_schema_2_failure_list_reads_as_recorded_text_and_renders() {
    let old = r#"{"run_id":"old","host_profile":"local","started_unix":1,"schema":2,"scenarios":[
        {"name":"pp","file":"s.yaml","verdict":"fail","reason":"no-rdma-device: absent","duration_s":1.0,
         "repeats":1,"repeats_failed":1,"metrics":{},"latency":{},
         "evidence":{"failures":["repeat 0: watchdog: rank 2 hung"]}}]}"#;
    let dir = temp_dir("schema-2");
    std::fs::write(dir.join("results.json"), old).unwrap();
    let run = site::load_run(&dir).expect("a schema 2 results.json reads");
    assert_eq!(
        run.scenarios[0].failure_kinds(),
        [crate::model::failure::FailureKind::Recorded]
    );
    assert!(render(&dir).contains("repeat 0: watchdog: rank 2 hung"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_results_json_from_before_schema_2_still_reads() {
    let old = r#"{"run_id":"old","host_profile":"local","started_unix":1,"scenarios":[
        {"name":"pp","file":"s.yaml","verdict":"pass","reason":null,"duration_s":1.0,
         "repeats":1,"repeats_failed":0,"metrics":{"pairs_verified":{"min":1,"max":1,"mean":1,"count":1}},
         "latency":{"64":{"p50_us":5.0,"p99_us":9.0,"count":10,"histogram":[]}},
         "evidence":{}}]}"#;
    let dir = temp_dir("old-schema");
    std::fs::write(dir.join("results.json"), old).unwrap();
    let run = site::load_run(&dir).expect("an old results.json reads");
    let key = SampleKey {
        series: Series::Latency,
        size: 64,
    };
    assert_eq!(run.scenarios[0].latency[&key].p50_us, 5.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_results_file_that_names_logs_outside_its_run_copies_nothing_of_them_into_the_page() {
    let dir = temp_dir("outside-logs");
    let secret = temp_dir("outside-secret").join("secret.txt");
    std::fs::write(&secret, "TOP-SECRET-TOKEN").unwrap();
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    std::fs::write(
        dir.join("logs/rank-0.log"),
        format!("{}LAST-LINE-OF-RANK-0", "x".repeat(10_000)),
    )
    .unwrap();
    // A symlink inside the run that leads out of it is outside too.
    std::os::unix::fs::symlink(&secret, dir.join("logs/rank-1.log")).unwrap();
    let logs = [
        dir.join("logs/rank-0.log"),
        dir.join("logs/rank-1.log"),
        secret.clone(),
        dir.join("logs/../..")
            .join(secret.strip_prefix(std::env::temp_dir()).unwrap()),
    ];
    let results = serde_json::json!({
        "run_id": "r", "host_profile": "local", "started_unix": 1, "schema": 2,
        "scenarios": [{"name": "s", "file": "s.yaml", "verdict": "fail", "reason": "x",
            "duration_s": 1.0, "repeats": 1, "repeats_failed": 1, "metrics": {}, "latency": {},
            "evidence": {"rank_logs": logs}}]});
    std::fs::write(dir.join("results.json"), results.to_string()).unwrap();
    let html = render(&dir);
    assert!(
        !html.contains("TOP-SECRET-TOKEN"),
        "an outside file reached the page"
    );
    assert_eq!(
        html.matches("is outside the run's folder").count(),
        3,
        "{html}"
    );
    // The log inside the run shows its tail only, read with a seek.
    assert!(html.contains("LAST-LINE-OF-RANK-0"));
    assert!(!html.contains(&"x".repeat(5_000)));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(secret.parent().unwrap());
}
