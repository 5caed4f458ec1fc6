//! `wringer report`: one self-contained HTML page from run folders and the history.

use std::path::PathBuf;

use wringer::model::invalid::Invalid;
use wringer::outputs::site;

#[derive(clap::Args)]
pub struct Args {
    /// Run folders (each holding results.json, and optionally bench.json).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The history file; these runs are added to it.
    #[arg(long, default_value = "reports/history.jsonl")]
    pub history: PathBuf,
    #[arg(long, default_value = "reports/site/index.html")]
    pub out: PathBuf,
    /// Flag a trend value worse than the earlier runs' median by more than this fraction.
    #[arg(long, default_value_t = 0.2, value_parser = fraction)]
    pub threshold: f64,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let opts = site::ReportOptions {
        runs: a.runs,
        history: a.history,
        out: a.out,
        threshold: a.threshold,
    };
    let page = site::write(&opts)?;
    wringer::say!("report: {}", page.display());
    Ok(0)
}

/// A fraction for `--threshold`: a finite number from 0 to 100 (NaN would flag nothing, ever).
fn fraction(s: &str) -> Result<f64, Invalid> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && (0.0..=100.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("`{s}` must be a finite number from 0 to 100 (0.2 flags 20% worse)").into())
    }
}
