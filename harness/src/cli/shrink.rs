//! `wringer run --shrink` (and `wringer audit --shrink`): shrink one failed attempt, print the
//! smallest perturbations and faults that still fail, as a scenario snippet.

use wringer::hosts::profile::HostProfile;
use wringer::orchestration::runner::RunOptions;
use wringer::orchestration::shrink;
use wringer::rank::steps::Loaded;

pub fn run(
    scenarios: Vec<Loaded>,
    profile: &HostProfile,
    opts: RunOptions,
    a: &super::run::ReplayArgs,
) -> anyhow::Result<i32> {
    let chosen: Vec<Loaded> = scenarios
        .into_iter()
        .filter(|l| {
            opts.filter
                .as_deref()
                .is_none_or(|f| l.scenario.name.contains(f))
        })
        .collect();
    let [loaded] = <[Loaded; 1]>::try_from(chosen).map_err(|v| {
        anyhow::anyhow!(
            "--shrink takes one scenario; {} were given (name one file, or --filter)",
            v.len()
        )
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
