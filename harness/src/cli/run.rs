//! `wringer run`: load the scenarios and the host profile, run them, report.

use std::path::PathBuf;

use wringer::hosts::profile as hosts;
use wringer::model::duration::HumanDuration;
use wringer::model::invalid::Invalid;
use wringer::model::scenario::{Fault, Perturb};
use wringer::orchestration::runner;
use wringer::outputs::progress::Progress;
use wringer::outputs::report::ReportWriter;

#[derive(clap::Args)]
pub struct Args {
    /// Scenario files or folders.
    #[arg(default_value = "scenarios")]
    pub paths: Vec<PathBuf>,
    #[arg(long, default_value = "hosts/local.yaml")]
    pub hosts: PathBuf,
    /// Where to write the report (default: reports/<run-id>/).
    #[arg(long)]
    pub report_dir: Option<PathBuf>,
    /// Only scenarios whose name contains this text, or that require it (`xhost`, `rdma`).
    #[arg(long)]
    pub filter: Option<String>,
    /// Override every scenario's repeat count (1 to 10,000).
    #[arg(long, value_parser = |s: &str| s.parse::<u32>().map_err(|e| Invalid(e.to_string())).and_then(wringer::model::scenario::check_repeat))]
    pub repeat: Option<u32>,
    /// Seed for payload patterns (recorded in the report).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Turn every skip into a failure.
    #[arg(long)]
    pub strict: bool,
    /// Run without the lifecycle audit and perturbations the scenarios and profile ask
    /// for (to measure what the audit costs, or where strace cannot run).
    #[arg(long)]
    pub no_audit: bool,
    #[command(flatten)]
    pub replay: ReplayArgs,
}

/// Replaying, repeating until a failure, and shrinking: shared by `run` and `audit`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Run attempt N of the seed alone (what a printed replay line gives); with --repeat K,
    /// K times, to see how often it fails.
    #[arg(long, requires = "seed")]
    pub attempt: Option<u32>,
    /// A perturbation in place of the scenario's, as YAML: '{syscall: poll, delay_exit:
    /// 100us, when: "3+2"}' (repeatable).
    #[arg(long, value_parser = parse_perturb)]
    pub perturb: Vec<Perturb>,
    /// A scenario-level fault in place of the scenario's, as YAML: '{rank: 1, at:
    /// mid-stream, action: sigkill}' (repeatable).
    #[arg(long, value_parser = parse_fault)]
    pub fault: Vec<Fault>,
    /// Repeat until the first failure, at most N attempts; then print the replay and shrink
    /// lines.
    #[arg(long, conflicts_with_all = ["attempt"], value_parser = |s: &str| s.parse::<u32>().map_err(|e| Invalid(e.to_string())).and_then(wringer::model::scenario::check_repeat))]
    pub until_fail: Option<u32>,
    /// Replay a failed scenario's first failed attempt this many times (deterministic or
    /// flaky goes into the report); 0 turns it off.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub replays: u32,
    /// Shrink the attempt given by --seed and --attempt: the smallest perturbations, faults
    /// and cycles that still fail on every one of --shrink-replays runs.
    #[arg(long, requires = "attempt")]
    pub shrink: bool,
    /// Runs each candidate of the shrink must fail, every one.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub shrink_replays: u32,
    /// How long the shrink may take; it stops early, and says so, past it.
    #[arg(long, default_value = "10m", value_parser = |s: &str| HumanDuration::parse(s))]
    pub shrink_budget: HumanDuration,
}

impl ReplayArgs {
    pub fn perturb(&self) -> Option<Vec<Perturb>> {
        (!self.perturb.is_empty()).then(|| self.perturb.clone())
    }
    pub fn faults(&self) -> Option<Vec<Fault>> {
        (!self.fault.is_empty()).then(|| self.fault.clone())
    }
}

fn parse_perturb(s: &str) -> Result<Perturb, Invalid> {
    let p: Perturb =
        serde_saphyr::from_str(s).map_err(|e| Invalid(format!("--perturb `{s}`: {e}")))?;
    p.check()
        .map_err(|e| Invalid(format!("--perturb `{s}`: {}", e.0)))?;
    Ok(p)
}

fn parse_fault(s: &str) -> Result<Fault, Invalid> {
    let f: Fault = serde_saphyr::from_str(s).map_err(|e| Invalid(format!("--fault `{s}`: {e}")))?;
    f.action
        .check()
        .map_err(|e| Invalid(format!("--fault `{s}`: {}", e.0)))?;
    Ok(f)
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let profile = hosts::load(&a.hosts)?;
    let scenarios = super::scenarios::load_all(&a.paths)?;
    let rerun = runner::Rerun {
        head: vec![
            "wringer".into(),
            "run".into(),
            "--hosts".into(),
            a.hosts.display().to_string(),
        ],
        tail: None,
    };
    let opts = runner::RunOptions {
        report_dir: a.report_dir,
        filter: a.filter,
        repeat: a.repeat,
        seed: a.seed,
        strict: a.strict,
        no_audit: a.no_audit,
        attempt: a.replay.attempt,
        perturb: a.replay.perturb(),
        faults: a.replay.faults(),
        until_fail: a.replay.until_fail,
        replays: a.replay.replays,
        rerun,
    };
    if a.replay.shrink {
        return super::shrink::run(scenarios, &profile, opts, &a.replay);
    }
    let mut progress = Progress::default();
    let mut files = ReportWriter::default();
    runner::run(scenarios, &profile, &opts, &mut [&mut progress, &mut files])
}
