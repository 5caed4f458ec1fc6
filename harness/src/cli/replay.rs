//! Replaying, repeating until a failure and shrinking: the flags `run` and `audit` share, and
//! `--shrink`'s output.

use wringer::hosts::profile::HostProfile;
use wringer::model::duration::HumanDuration;
use wringer::model::input::InputError;
use wringer::model::invalid::Invalid;
use wringer::model::scenario::{Fault, Perturb};
use wringer::orchestration::runner::{self, RunOptions};
use wringer::orchestration::shrink;
use wringer::rank::steps::Loaded;

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
    /// flaky goes into the report); 0 turns it off. Not for a hang, nor for a scenario the
    /// profile lists as a known failure.
    #[arg(long, env = "WRINGER_REPLAYS", default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=100))]
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

/// `--fault` overrides get every check a fault in the scenario file gets, against each
/// scenario they replace the faults of: bad input (exit 2) naming the flag, never a run that
/// fails with "never struck".
pub fn check_overrides(scenarios: &[Loaded], r: &ReplayArgs) -> Result<(), InputError> {
    for l in scenarios {
        for f in &r.fault {
            if let Err(why) = wringer::model::scenario::fault_problem(&l.scenario, f) {
                return Err(InputError::Flag {
                    flag: format!("--fault '{}'", runner::flow_yaml(f)),
                    message: format!("for {}: {why}", l.path.display()),
                });
            }
        }
    }
    Ok(())
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

/// `--shrink`: shrink one failed attempt, print the smallest perturbations and faults that
/// still fail, as a scenario snippet.
pub fn shrink(
    scenarios: Vec<Loaded>,
    profile: &HostProfile,
    opts: RunOptions,
    a: &ReplayArgs,
) -> anyhow::Result<i32> {
    if opts.seed.is_none() || opts.attempt.is_none() {
        return Err(InputError::Flag {
            flag: "--shrink".into(),
            message:
                "a shrink needs --seed and --attempt: the failed attempt's replay line gives both"
                    .into(),
        }
        .into());
    }
    let chosen: Vec<Loaded> = scenarios
        .into_iter()
        .filter(|l| runner::selects(opts.filter.as_deref(), l))
        .collect();
    let [loaded] = <[Loaded; 1]>::try_from(chosen).map_err(|v| InputError::Flag {
        flag: "--shrink".into(),
        message: format!(
            "takes one scenario; {} were given (name one file, or --filter)",
            v.len()
        ),
    })?;
    let dir = shrink::folder(opts.report_dir.as_deref());
    let budget = a.shrink_budget.0;
    eprintln!(
        "shrinking attempt {} of seed {} of {} (each candidate must fail {} of {} replays; at most {:?}); tries in {}",
        opts.attempt.unwrap_or(0),
        opts.seed.unwrap_or(0),
        loaded.scenario.name,
        a.shrink_replays,
        a.shrink_replays,
        budget,
        dir.display()
    );
    let out = shrink::shrink(&loaded, profile, &opts, a.shrink_replays, budget, &dir)?;
    let line = opts.rerun.line(
        &loaded.path,
        runner::release_env(&loaded),
        opts.seed.unwrap_or(0),
        opts.attempt.unwrap_or(0),
        &out.end.perturb,
        &out.end.faults,
        false,
    );
    print!("{}", out.describe(&line));
    let (failed, of) = out.start_failed;
    Ok(if of > 0 && failed == of { 0 } else { 1 })
}
