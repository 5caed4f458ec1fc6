//! Reports, written as results arrive so a crash still leaves a readable partial report:
//! results.jsonl (streamed), results.json (canonical), junit.xml and summary.md.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
use serde::{Deserialize, Serialize};

use crate::probe::HostFacts;

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    Skip,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct MetricSummary {
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub count: usize,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub count: u64,
    /// (upper bound in µs, count) per power-of-two bucket, for histograms.
    #[serde(default)]
    pub histogram: Vec<(f64, u64)>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Stacks {
    pub repeat: u32,
    pub rank: u32,
    pub pid: u32,
    pub text: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Evidence {
    pub failures: Vec<String>,
    pub notes: Vec<String>,
    pub faults: Vec<String>,
    pub stacks: Vec<Stacks>,
    pub rank_logs: Vec<PathBuf>,
    pub rejected_rendezvous_connections: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ScenarioResult {
    pub name: String,
    pub file: PathBuf,
    pub verdict: Verdict,
    pub reason: Option<String>,
    pub duration_s: f64,
    pub repeats: u32,
    pub repeats_failed: u32,
    pub metrics: BTreeMap<String, MetricSummary>,
    /// Latency percentiles per message size (bytes), over every rank and repeat.
    pub latency: BTreeMap<String, Latency>,
    pub evidence: Evidence,
}

#[derive(Debug, Serialize)]
pub struct RunMeta {
    pub run_id: String,
    pub wringer_version: &'static str,
    pub host_profile: String,
    pub seed: u64,
    pub hosts: Vec<HostFacts>,
    pub started_unix: u64,
}

#[derive(Serialize)]
struct Document<'a> {
    #[serde(flatten)]
    meta: &'a RunMeta,
    complete: bool,
    interrupted: bool,
    duration_s: f64,
    counts: BTreeMap<&'static str, usize>,
    scenarios: &'a [ScenarioResult],
}

pub struct Reporter {
    dir: PathBuf,
    meta: RunMeta,
    results: Vec<ScenarioResult>,
    jsonl: File,
}

impl Reporter {
    pub fn create(dir: &Path, meta: RunMeta) -> Result<Reporter> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the report folder {}", dir.display()))?;
        let jsonl = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("results.jsonl"))?;
        let r = Reporter {
            dir: dir.to_owned(),
            meta,
            results: vec![],
            jsonl,
        };
        r.write_all(false, false, Duration::ZERO)?;
        Ok(r)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn results(&self) -> &[ScenarioResult] {
        &self.results
    }

    /// Record one scenario: append its line, then rewrite the other files.
    pub fn record(&mut self, result: ScenarioResult, elapsed: Duration) -> Result<()> {
        let mut line = serde_json::to_vec(&result)?;
        line.push(b'\n');
        self.jsonl.write_all(&line)?;
        self.jsonl.flush()?;
        self.results.push(result);
        self.write_all(false, false, elapsed)
    }

    pub fn finish(&self, interrupted: bool, elapsed: Duration) -> Result<()> {
        self.write_all(!interrupted, interrupted, elapsed)
    }

    fn write_all(&self, complete: bool, interrupted: bool, elapsed: Duration) -> Result<()> {
        let mut counts = BTreeMap::new();
        for v in [Verdict::Pass, Verdict::Fail, Verdict::Skip] {
            let key = match v {
                Verdict::Pass => "pass",
                Verdict::Fail => "fail",
                Verdict::Skip => "skip",
            };
            counts.insert(key, self.results.iter().filter(|r| r.verdict == v).count());
        }
        let doc = Document {
            meta: &self.meta,
            complete,
            interrupted,
            duration_s: elapsed.as_secs_f64(),
            counts,
            scenarios: &self.results,
        };
        write_atomically(
            &self.dir.join("results.json"),
            &serde_json::to_vec_pretty(&doc)?,
        )?;
        write_atomically(&self.dir.join("junit.xml"), self.junit()?.as_bytes())?;
        write_atomically(
            &self.dir.join("summary.md"),
            self.summary(complete, interrupted).as_bytes(),
        )?;
        Ok(())
    }

    fn junit(&self) -> Result<String> {
        let mut suite = TestSuite::new(format!("wringer ({})", self.meta.host_profile));
        for r in &self.results {
            let status = match r.verdict {
                Verdict::Pass => TestCaseStatus::success(),
                Verdict::Skip => {
                    let mut s = TestCaseStatus::skipped();
                    s.set_message(r.reason.clone().unwrap_or_default());
                    s
                }
                Verdict::Fail => {
                    let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                    s.set_message(r.reason.clone().unwrap_or_default());
                    s.set_description(evidence_summary(r));
                    s
                }
            };
            let mut case = TestCase::new(r.name.clone(), status);
            case.set_classname(r.file.display().to_string());
            case.set_time(Duration::from_secs_f64(r.duration_s));
            suite.add_test_case(case);
        }
        let mut report = Report::new("wringer");
        report.add_test_suite(suite);
        Ok(report.to_string()?)
    }

    fn summary(&self, complete: bool, interrupted: bool) -> String {
        let mut s = format!(
            "## wringer run `{}` ({})\n\n",
            self.meta.run_id, self.meta.host_profile
        );
        if interrupted {
            s.push_str("**Interrupted**: this report is partial.\n\n");
        } else if !complete {
            s.push_str("_In progress: this report is partial._\n\n");
        }
        s.push_str("| scenario | verdict | time | details |\n|---|---|---|---|\n");
        for r in &self.results {
            let verdict = match r.verdict {
                Verdict::Pass => "✅ pass",
                Verdict::Fail => "❌ fail",
                Verdict::Skip => "⏭️ skip",
            };
            let mut details = r.reason.clone().unwrap_or_default();
            if details.is_empty() {
                details = headline_metrics(r);
            }
            s.push_str(&format!(
                "| {} | {verdict} | {:.1} s | {} |\n",
                r.name,
                r.duration_s,
                details.replace('|', "\\|").replace('\n', " ")
            ));
        }
        let (p, f, k) = count(&self.results);
        s.push_str(&format!("\n{p} passed, {f} failed, {k} skipped.\n"));
        s
    }
}

fn count(rs: &[ScenarioResult]) -> (usize, usize, usize) {
    let c = |v| rs.iter().filter(|r| r.verdict == v).count();
    (c(Verdict::Pass), c(Verdict::Fail), c(Verdict::Skip))
}

/// A few numbers that say what a passing scenario measured.
fn headline_metrics(r: &ScenarioResult) -> String {
    let mut parts: Vec<String> = r
        .latency
        .iter()
        .filter(|(size, _)| matches!(size.as_str(), "8" | "4096" | "1048576" | "4194304"))
        .map(|(size, l)| format!("{size} B p50/p99 {:.0}/{:.0} µs", l.p50_us, l.p99_us))
        .collect();
    for key in [
        "cycles",
        "shutdown_p99_ms",
        "detect_ms",
        "frames_intact",
        "eof_cases",
        "gpu_bandwidth_gbps",
        "gpu_dmabuf",
    ] {
        if let Some(m) = r.metrics.get(key) {
            parts.push(format!(
                "{key} {}",
                if m.max >= 100.0 {
                    format!("{:.0}", m.max)
                } else {
                    format!("{:.2}", m.max)
                }
            ));
        }
    }
    if r.repeats > 1 {
        parts.push(format!("{} repeats", r.repeats));
    }
    parts.join(", ")
}

fn evidence_summary(r: &ScenarioResult) -> String {
    let mut s = r.evidence.failures.join("\n");
    for st in &r.evidence.stacks {
        s.push_str(&format!(
            "\n--- stacks of rank {} (pid {}), repeat {}\n{}",
            st.rank, st.pid, st.repeat, st.text
        ));
    }
    for log in &r.evidence.rank_logs {
        s.push_str(&format!("\nrank log: {}", log.display()));
    }
    s
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
