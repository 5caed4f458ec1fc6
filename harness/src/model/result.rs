//! What a run records about each scenario: the verdict, its reason, the metrics and latency
//! series observed, and the evidence. `results.json` is these records.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::failure::{Failed, Failure};
use super::metric::{Metric, SampleKey};
use super::requirement::SkipReason;

/// The schema of `results.json`. 3: failures are typed ([`Failed`]) and a skip carries its
/// code ([`SkipReason`]); 2 and before recorded both as text, which still reads (as
/// [`Failure::Recorded`](super::failure::Failure::Recorded) and the reason alone). 2: latency
/// is keyed by series and size (`latency/4096`); before it (no `schema` field) by size alone,
/// which still reads as the `latency` series.
pub const SCHEMA: u32 = 3;

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    Skip,
    /// A failure the host profile lists as known: reported with its evidence, the run passes.
    Xfail,
    /// A known failure that passed: its entry is stale (a failure under `--strict`).
    Xpass,
}

impl Verdict {
    pub const ALL: [Verdict; 5] = [
        Verdict::Pass,
        Verdict::Fail,
        Verdict::Skip,
        Verdict::Xfail,
        Verdict::Xpass,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Skip => "skip",
            Verdict::Xfail => "xfail",
            Verdict::Xpass => "xpass",
        }
    }
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
    pub failures: Vec<Failed>,
    pub notes: Vec<String>,
    pub faults: Vec<String>,
    pub stacks: Vec<Stacks>,
    pub rank_logs: Vec<PathBuf>,
    pub rejected_rendezvous_connections: u64,
    /// For each failed attempt, the command that reruns it alone.
    pub replays: Vec<Replay>,
    /// The points the scenario's steps declare, and how many repeats reached each.
    pub reach: Vec<Reach>,
    /// What recorded the ranks' syscalls for the audit, when something did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_recorder: Option<AuditRecorder>,
    /// What delayed the perturbed calls (the preloaded observer, or strace and why), when the
    /// scenario had perturbations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perturbed_by: Option<String>,
}

/// The audit's syscall recorder for one scenario, and why it is not eBPF when it is not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditRecorder {
    pub backend: super::scenario::AuditBackend,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

impl std::fmt::Display for AuditRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.backend)?;
        if let Some(why) = &self.fallback {
            write!(f, " ({why})")?;
        }
        Ok(())
    }
}

/// How to rerun one failed attempt alone, and how often it failed again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Replay {
    pub repeat: u32,
    /// The attempt alone: scenario, profile, seed, attempt index, and its perturbations (each
    /// call chosen by count) and faults spelled out. `--repeat N` replays it N times.
    pub command: String,
    /// The same attempt, shrunk to the smallest perturbations and faults that still fail.
    pub shrink: String,
    /// Replays of it right after the run: (failed, of).
    pub replayed: Option<(u32, u32)>,
}

impl Replay {
    /// Deterministic, flaky, or not reproduced, from the replays.
    pub fn stability(&self) -> Option<String> {
        let (failed, of) = self.replayed?;
        Some(match failed {
            _ if failed == of => format!("deterministic: failed {failed} of {of} replays"),
            0 => format!("not reproduced: passed {of} of {of} replays"),
            _ => format!("flaky: failed {failed} of {of} replays"),
        })
    }
}

/// A point a step declares its purpose depends on (a receiver blocked when EOF came, say),
/// and how many repeats reached it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Reach {
    pub point: String,
    pub meaning: String,
    /// The scenario fails when no repeat reached it.
    pub required: bool,
    pub repeats_reached: u32,
    pub repeats: u32,
    /// Times reached, over every rank and repeat.
    pub times: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ScenarioResult {
    pub name: String,
    pub file: PathBuf,
    pub verdict: Verdict,
    pub reason: Option<String>,
    /// Why it was skipped, for a skip (and for a skip that `--strict` turned into a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip: Option<SkipReason>,
    pub duration_s: f64,
    pub repeats: u32,
    pub repeats_failed: u32,
    pub metrics: BTreeMap<Metric, MetricSummary>,
    /// Latency percentiles per series and message size, over every rank and repeat.
    pub latency: BTreeMap<SampleKey, Latency>,
    pub evidence: Evidence,
}

impl ScenarioResult {
    /// A result for a scenario that did not run (skipped, or failed before it started).
    pub fn not_run(name: &str, file: &std::path::Path, verdict: Verdict, reason: String) -> Self {
        ScenarioResult {
            name: name.to_string(),
            file: file.to_owned(),
            verdict,
            reason: Some(reason),
            skip: None,
            duration_s: 0.0,
            repeats: 0,
            repeats_failed: 0,
            metrics: Default::default(),
            latency: Default::default(),
            evidence: Evidence::default(),
        }
    }

    /// Each failed attempt's replay line, how often it failed again, and its shrink line.
    pub fn replay_lines(&self) -> Vec<String> {
        let mut out = vec![];
        for x in &self.evidence.replays {
            let stability = x.stability().map(|s| format!(" ({s})")).unwrap_or_default();
            out.push(format!(
                "replay repeat {}{stability}: {}",
                x.repeat, x.command
            ));
            out.push(format!("shrink it: {}", x.shrink));
        }
        out
    }

    /// A scenario skipped for `why`.
    pub fn skipped(name: &str, file: &std::path::Path, why: SkipReason) -> Self {
        let mut r = Self::not_run(name, file, Verdict::Skip, why.to_string());
        r.skip = Some(why);
        r
    }

    /// A scenario that failed before any repeat ran.
    pub fn failed_before_running(name: &str, file: &std::path::Path, why: Failure) -> Self {
        let mut r = Self::not_run(name, file, Verdict::Fail, why.to_string());
        if let Failure::Unmet { skip, .. } = &why {
            r.skip = Some(skip.clone());
        }
        r.evidence.failures.push(Failed {
            repeat: None,
            failure: why,
        });
        r
    }

    /// Every failure's kind, in order (none for a pass or a skip).
    pub fn failure_kinds(&self) -> Vec<super::failure::FailureKind> {
        self.evidence
            .failures
            .iter()
            .map(|f| f.failure.kind())
            .collect()
    }
}
