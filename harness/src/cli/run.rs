//! `wringer run`: load the scenarios and the host profile, run them, report.

use std::path::PathBuf;

use wringer::hosts::profile as hosts;
use wringer::model::invalid::Invalid;
use wringer::model::scenario::AuditBackend;
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
    /// Run without the lifecycle audit the scenarios and profile ask for (to measure what the
    /// audit costs, or where strace cannot run). Their perturbations still run where the
    /// preloaded observer delays them (no tracer); those only strace can inject are set aside.
    #[arg(long)]
    pub no_audit: bool,
    /// Keep the audit but set the scenarios' perturbations aside (to measure a recorder alone).
    #[arg(long, conflicts_with = "perturb")]
    pub no_perturb: bool,
    /// What records the ranks' syscalls for the audit (default: eBPF where every host can
    /// use it, else strace; also WRINGER_AUDIT_BACKEND). Perturbations are applied by a
    /// preloaded observer where the ranks are dynamically linked, else by strace.
    #[arg(long, value_enum)]
    pub audit_backend: Option<AuditBackend>,
    /// A suppressions file for the audit (repeatable): findings it names are counted, not
    /// failed (docs/audit.md).
    #[arg(long = "suppressions")]
    pub suppressions: Vec<PathBuf>,
    #[command(flatten)]
    pub replay: super::replay::ReplayArgs,
}

/// Read every suppressions file (a bad one is an input error, exit 2), and name each in the
/// replay line's `head`: a replay judged without them would fail on what they silence.
pub fn load_suppressions(
    files: &[PathBuf],
    head: &mut Vec<String>,
) -> anyhow::Result<Vec<wringer::model::suppression::Suppression>> {
    let mut all = vec![];
    for f in files {
        all.extend(wringer::model::suppression::load(f)?);
        head.extend(["--suppressions".into(), runner::path_arg(f)]);
    }
    Ok(all)
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let profile = hosts::load(&a.hosts)?;
    let scenarios = super::scenarios::load_all(&a.paths)?;
    super::replay::check_overrides(&scenarios, &a.replay)?;
    let mut head = vec![
        "wringer".into(),
        "run".into(),
        "--hosts".into(),
        a.hosts.display().to_string(),
    ];
    let suppressions = load_suppressions(&a.suppressions, &mut head)?;
    let rerun = runner::Rerun { head, tail: None };
    let opts = runner::RunOptions {
        report_dir: a.report_dir,
        filter: a.filter,
        repeat: a.repeat,
        seed: a.seed,
        strict: a.strict,
        no_audit: a.no_audit,
        attempt: a.replay.attempt,
        perturb: if a.no_perturb {
            Some(vec![])
        } else {
            a.replay.perturb()
        },
        faults: a.replay.faults(),
        until_fail: a.replay.until_fail,
        replays: a.replay.replays,
        rerun,
        audit_backend: a.audit_backend.or_else(runner::audit_backend_from_env),
        suppressions,
    };
    if a.replay.shrink {
        return super::replay::shrink(scenarios, &profile, opts, &a.replay);
    }
    let mut progress = Progress::default();
    let mut files = ReportWriter::default();
    runner::run(scenarios, &profile, &opts, &mut [&mut progress, &mut files])
}
