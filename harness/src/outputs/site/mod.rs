//! `wringer report`: one self-contained HTML page from one or more runs plus the history of
//! earlier runs. The history is a small JSON-lines file (one line per run) so CI can cache it.

mod page;
pub mod svg;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::model::bench::BenchReport;
use crate::model::input::{read_bytes, FileKind, InputError};
use crate::model::metric::{Better, SampleKey, Series as MetricSeries, Unit};
use crate::model::result::{ScenarioResult, Verdict};

pub struct ReportOptions {
    pub runs: Vec<PathBuf>,
    pub history: PathBuf,
    pub out: PathBuf,
    /// A value worse than the median of earlier runs by more than this fraction is flagged.
    pub threshold: f64,
}

/// One run as read back from its report folder.
#[derive(Debug, Deserialize)]
pub struct Run {
    pub run_id: String,
    pub host_profile: String,
    pub started_unix: u64,
    #[serde(default)]
    pub duration_s: f64,
    #[serde(default)]
    pub complete: bool,
    #[serde(default)]
    pub interrupted: bool,
    pub scenarios: Vec<ScenarioResult>,
    #[serde(skip)]
    pub bench: Option<BenchReport>,
    #[serde(skip)]
    pub dir: PathBuf,
}

/// What the history keeps of a run: enough for trends.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub run_id: String,
    pub host_profile: String,
    pub started_unix: u64,
    pub scenarios: BTreeMap<String, HistoryScenario>,
    pub bandwidth_gbps: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistoryScenario {
    pub verdict: Verdict,
    pub duration_s: f64,
    /// series/size -> (p50 µs, p99 µs); older history lines hold bare sizes (the latency
    /// series).
    pub latency: BTreeMap<SampleKey, (f64, f64)>,
}

/// A trend value of the newest run judged against the earlier ones.
#[derive(Debug)]
pub struct Regression {
    pub profile: String,
    pub series: String,
    pub latest: f64,
    pub baseline: f64,
    pub change: f64,
}

pub fn load_run(dir: &Path) -> Result<Run> {
    let path = dir.join("results.json");
    let bytes = read_bytes(&path, FileKind::Results)?;
    let mut run: Run = read_back(&path, &bytes)?;
    check_run(&path, &run)?;
    run.dir = dir.to_owned();
    let bench = dir.join("bench.json");
    if bench.exists() {
        run.bench = Some(
            serde_json::from_slice(&read_bytes(&bench, FileKind::Results)?)
                .with_context(|| format!("reading {}", bench.display()))?,
        );
    }
    Ok(run)
}

/// `results.json` parsed, or bad input that names the field and where it is.
fn read_back<T: serde::de::DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, InputError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        InputError::Located {
            file: path.to_owned(),
            line: inner.line() as u64,
            column: inner.column() as u64,
            message: format!("not a wringer results.json: field `{field}`: {inner}"),
        }
    })
}

/// The longest text of one field the page shows from a results file: a run's own reasons
/// and notes are far shorter; a longer one is not a file wringer wrote.
const MAX_TEXT: usize = 1 << 20;

/// What a results file read back must hold before a page is made of it: names that are names
/// (they become element ids and file names), texts of bounded size.
fn check_run(path: &Path, run: &Run) -> Result<(), InputError> {
    let bad =
        |field: String, why: String| InputError::plain(path, format!("field `{field}`: {why}"));
    for (field, name) in [("run_id", &run.run_id), ("host_profile", &run.host_profile)] {
        crate::model::name::check(name).map_err(|e| bad(field.into(), e.0))?;
    }
    let long = |t: &str| t.len() > MAX_TEXT;
    let too_long = || {
        format!(
            "over {} KiB, longer than any text a run writes",
            MAX_TEXT >> 10
        )
    };
    for (i, s) in run.scenarios.iter().enumerate() {
        crate::model::name::check(&s.name).map_err(|e| bad(format!("scenarios[{i}].name"), e.0))?;
        if s.reason.as_deref().is_some_and(long) {
            return Err(bad(format!("scenarios[{i}].reason"), too_long()));
        }
        let e = &s.evidence;
        let texts = e.notes.iter().chain(&e.faults).map(String::as_str).chain(
            e.replays
                .iter()
                .flat_map(|r| [r.command.as_str(), r.shrink.as_str()]),
        );
        for t in texts {
            if long(t) {
                return Err(bad(format!("scenarios[{i}].evidence"), too_long()));
            }
        }
    }
    Ok(())
}

fn history_entry(run: &Run) -> HistoryEntry {
    let scenarios = run
        .scenarios
        .iter()
        .map(|s| {
            let latency = s
                .latency
                .iter()
                .map(|(k, l)| (*k, (l.p50_us, l.p99_us)))
                .collect();
            (
                s.name.clone(),
                HistoryScenario {
                    verdict: s.verdict,
                    duration_s: s.duration_s,
                    latency,
                },
            )
        })
        .collect();
    let bandwidth_gbps = run.bench.as_ref().and_then(|b| {
        b.rows
            .iter()
            .find(|r| r.measure.starts_with("TCP stream"))
            .and_then(|r| r.ours)
    });
    HistoryEntry {
        run_id: run.run_id.clone(),
        host_profile: run.host_profile.clone(),
        started_unix: run.started_unix,
        scenarios,
        bandwidth_gbps,
    }
}

/// Read the history, add these runs (once each), write it back; oldest first.
fn update_history(path: &Path, runs: &[Run]) -> Result<Vec<HistoryEntry>> {
    let mut entries: Vec<HistoryEntry> =
        match path.exists().then(|| read_bytes(path, FileKind::History)) {
            // A line cut short (a disk filled, a job killed mid-write) must not stop every later
            // report: it is skipped with a warning that names it, and dropped when the file is
            // written back.
            Some(Ok(bytes)) => String::from_utf8_lossy(&bytes)
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .filter_map(|(i, l)| match serde_json::from_str(l) {
                    Ok(e) => Some(e),
                    Err(e) => {
                        eprintln!(
                            "warning: {}:{}: not a history entry ({e}); skipped",
                            path.display(),
                            i + 1
                        );
                        None
                    }
                })
                .collect(),
            None => vec![],
            Some(Err(e)) => return Err(e.into()),
        };
    for run in runs {
        if !entries.iter().any(|e| e.run_id == run.run_id) {
            entries.push(history_entry(run));
        }
    }
    entries.sort_by_key(|e| e.started_unix);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::File::create(path)?;
    for e in &entries {
        writeln!(f, "{}", serde_json::to_string(e)?)?;
    }
    Ok(entries)
}

/// A series of (run start time, value), oldest first, with its unit and which way is better.
#[derive(Debug, PartialEq)]
pub struct Trend {
    pub unit: Unit,
    pub better: Better,
    pub points: Vec<(u64, f64)>,
}

impl Trend {
    fn new(unit: Unit, better: Better) -> Trend {
        Trend {
            unit,
            better,
            points: vec![],
        }
    }

    /// The least change that matters for its unit: relative change alone flags noise on tiny
    /// values (4 ms -> 20 ms is +400%).
    fn floor(&self) -> f64 {
        match self.unit {
            Unit::Seconds => 0.25,
            Unit::Microseconds | Unit::Milliseconds => 5.0,
            _ => 0.5,
        }
    }
}

/// Named series per host profile: scenario durations, latency p50/p99 per size, bandwidth.
pub fn series(history: &[HistoryEntry], profile: &str) -> BTreeMap<String, Trend> {
    let mut out: BTreeMap<String, Trend> = BTreeMap::new();
    for e in history.iter().filter(|e| e.host_profile == profile) {
        for (name, s) in &e.scenarios {
            if s.verdict == Verdict::Skip {
                continue;
            }
            out.entry(format!("{name} · duration s"))
                .or_insert_with(|| Trend::new(Unit::Seconds, Better::Lower))
                .points
                .push((e.started_unix, s.duration_s));
            for (key, (p50, p99)) in &s.latency {
                // The latency series keeps its old trend names, so history stays continuous.
                let what = match key.series {
                    MetricSeries::Latency => format!("{} B", key.size),
                    other => format!("{} {} B", other.as_str(), key.size),
                };
                out.entry(format!("{name} · {what} p50 µs"))
                    .or_insert_with(|| Trend::new(Unit::Microseconds, Better::Lower))
                    .points
                    .push((e.started_unix, *p50));
                out.entry(format!("{name} · {what} p99 µs"))
                    .or_insert_with(|| Trend::new(Unit::Microseconds, Better::Lower))
                    .points
                    .push((e.started_unix, *p99));
            }
        }
        if let Some(bw) = e.bandwidth_gbps {
            out.entry("TCP stream bandwidth Gbit/s".into())
                .or_insert_with(|| Trend::new(Unit::GbitPerSecond, Better::Higher))
                .points
                .push((e.started_unix, bw));
        }
    }
    out
}

/// Flag series whose newest value is worse than the median of up to ten earlier ones by more
/// than `threshold`, in the direction its trend calls worse.
pub fn regressions(history: &[HistoryEntry], threshold: f64) -> Vec<Regression> {
    let mut profiles: Vec<&str> = history.iter().map(|e| e.host_profile.as_str()).collect();
    profiles.sort();
    profiles.dedup();
    let mut out = vec![];
    for profile in profiles {
        for (name, trend) in series(history, profile) {
            let Some((&(_, latest), earlier)) = trend.points.split_last() else {
                continue;
            };
            if earlier.is_empty() {
                continue;
            }
            let mut base: Vec<f64> = earlier.iter().rev().take(10).map(|p| p.1).collect();
            base.sort_by(|a, b| a.total_cmp(b));
            let baseline = base[base.len() / 2];
            if baseline <= 0.0 {
                continue;
            }
            let change = (latest - baseline) / baseline;
            let worse = match trend.better {
                Better::Higher => -change,
                Better::Lower => change,
                Better::Neither => continue,
            };
            if worse > threshold && (latest - baseline).abs() >= trend.floor() {
                out.push(Regression {
                    profile: profile.to_string(),
                    series: name,
                    latest,
                    baseline,
                    change,
                });
            }
        }
    }
    out
}

pub fn write(opts: &ReportOptions) -> Result<PathBuf> {
    anyhow::ensure!(
        !opts.runs.is_empty(),
        "name at least one run folder (one holding results.json)"
    );
    let runs: Vec<Run> = opts
        .runs
        .iter()
        .map(|d| load_run(d))
        .collect::<Result<_>>()?;
    let history = update_history(&opts.history, &runs)?;
    let regressions = regressions(&history, opts.threshold);
    let html = page::render(&runs, &history, &regressions, opts.threshold);
    if let Some(dir) = opts.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&opts.out, html).with_context(|| format!("writing {}", opts.out.display()))?;
    Ok(opts.out.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, t: u64, p50: f64, bw: f64) -> HistoryEntry {
        let mut latency = BTreeMap::new();
        latency.insert("8".parse().unwrap(), (p50, p50 * 2.0));
        let mut scenarios = BTreeMap::new();
        scenarios.insert(
            "pp".to_string(),
            HistoryScenario {
                verdict: Verdict::Pass,
                duration_s: 1.0,
                latency,
            },
        );
        HistoryEntry {
            run_id: id.into(),
            host_profile: "local".into(),
            started_unix: t,
            scenarios,
            bandwidth_gbps: Some(bw),
        }
    }

    #[test]
    fn a_history_line_cut_short_is_skipped_and_dropped_not_fatal() {
        let dir = std::env::temp_dir().join(format!("wringer-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let good = serde_json::to_string(&entry("a", 1, 10.0, 20.0)).unwrap();
        std::fs::write(&path, format!("{good}\n{}", &good[..good.len() / 2])).unwrap();
        let entries = update_history(&path, &[]).unwrap();
        assert_eq!(entries.len(), 1);
        // Written back whole: the next report reads every line.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(serde_json::from_str::<HistoryEntry>(text.lines().next().unwrap()).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn flags_latency_up_and_bandwidth_down_beyond_threshold_only() {
        let steady = vec![
            entry("a", 1, 10.0, 20.0),
            entry("b", 2, 11.0, 21.0),
            entry("c", 3, 10.5, 20.5),
        ];
        assert!(regressions(&steady, 0.2).is_empty());
        let mut worse = steady.clone();
        worse.push(entry("d", 4, 20.0, 12.0));
        let flagged: Vec<String> = regressions(&worse, 0.2)
            .into_iter()
            .map(|r| r.series)
            .collect();
        assert!(
            flagged.contains(&"pp · 8 B p50 µs".to_string()),
            "{flagged:?}"
        );
        assert!(
            flagged.contains(&"TCP stream bandwidth Gbit/s".to_string()),
            "{flagged:?}"
        );
        assert!(
            !flagged.iter().any(|f| f.contains("duration")),
            "{flagged:?}"
        );
        // A faster run is never a regression.
        let mut better = steady;
        better.push(entry("e", 5, 5.0, 40.0));
        assert!(regressions(&better, 0.2).is_empty());
    }
}
