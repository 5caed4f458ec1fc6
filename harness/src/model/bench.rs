//! What a bench run records (`bench.json`): each measure's row, ours against the reference
//! tool in alternating rounds, as the bench writes it and the page reads it.

use serde::{Deserialize, Serialize};

/// One side's figure for one round, with what it did to get it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    pub value: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99: Option<f64>,
    /// Messages (or round trips) measured in this round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

/// One kept round: both sides, and ours over theirs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Round {
    pub ours: Sample,
    pub reference: Sample,
    pub ratio: f64,
}

/// Where the two ends of a measurement run: the server end on one half of this process's CPUs,
/// the client end on the other, the same for ours and the reference. Only with four CPUs or
/// more: an end of ours is two threads (the caller and its receiver), and one CPU per end would
/// force every hand-off through a context switch that sockperf's single thread never pays.
/// With fewer, or without `taskset`, neither side is pinned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuPinning {
    pub server_cpus: Vec<usize>,
    pub client_cpus: Vec<usize>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Row {
    pub measure: String,
    pub unit: String,
    /// Our median over the kept rounds (or our single figure, for rows without a reference).
    pub ours: Option<f64>,
    pub reference: Option<f64>,
    pub tool: Option<String>,
    /// The median of the per-round ratios ours / reference.
    pub ratio: Option<f64>,
    /// Interquartile range of the per-round ratios over their median.
    #[serde(default)]
    pub spread: Option<f64>,
    /// The spread is wider than the bench's unstable spread: this row's ratio is not to be trusted.
    #[serde(default)]
    pub unstable: bool,
    /// Median p99 of each side, for latency rows.
    #[serde(default)]
    pub ours_p99: Option<f64>,
    #[serde(default)]
    pub reference_p99: Option<f64>,
    /// Every kept round, raw.
    #[serde(default)]
    pub rounds: Vec<Round>,
    pub goal: Option<String>,
    pub met: Option<bool>,
    /// Why this row has no numbers.
    pub skipped: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct BenchReport {
    /// Seconds each side runs per latency round.
    #[serde(alias = "seconds_per_measure")]
    pub seconds_per_round: u64,
    /// Rounds kept per compared measure, and warm-up rounds discarded before them.
    #[serde(default)]
    pub rounds: usize,
    #[serde(default)]
    pub warmup_rounds: usize,
    /// CPUs of the server and client ends, both sides alike (`None`: not pinned).
    #[serde(default)]
    pub placement: Option<CpuPinning>,
    #[serde(default)]
    pub quick: bool,
    pub rows: Vec<Row>,
}
