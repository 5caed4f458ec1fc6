//! `wringer list`: the scenarios and whether this profile can run each; or the step kinds, or
//! the metrics they declare.

use std::path::PathBuf;

use wringer::hosts::probe;
use wringer::hosts::profile as hosts;
use wringer::orchestration::policy::{Decision, Policy};
use wringer::outputs::progress::printable;

#[derive(clap::Args)]
pub struct Args {
    #[arg(default_value = "scenarios")]
    pub paths: Vec<PathBuf>,
    #[arg(long, default_value = "hosts/local.yaml")]
    pub hosts: PathBuf,
    /// List the metrics the step kinds declare (name, unit, which way is better) instead.
    #[arg(long, conflicts_with = "kinds")]
    pub metrics: bool,
    /// List the step kinds (the registry) and what each is for instead.
    #[arg(long)]
    pub kinds: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    if a.kinds {
        for (name, about) in wringer::rank::steps::Step::ABOUT {
            wringer::say!("{name:<28} {about}");
        }
        return Ok(0);
    }
    if a.metrics {
        for m in wringer::model::metric::Metric::all() {
            let unit = serde_json::to_value(m.unit()).unwrap_or_default();
            let better = serde_json::to_value(m.better()).unwrap_or_default();
            wringer::say!(
                "{:<32} unit={:<16} better={}",
                m.as_str(),
                unit.as_str().unwrap_or_default(),
                better.as_str().unwrap_or_default()
            );
        }
        return Ok(0);
    }
    let (paths, hosts) = (a.paths, a.hosts);
    let profile = hosts::load(&hosts)?;
    // This machine's facts, judged by the same policy a run uses.
    let facts = [probe::local()];
    let policy = Policy {
        profile: &profile,
        facts: &facts,
        strict: false,
        strikes: profile.strikes(),
        no_audit: false,
    };
    for l in super::scenarios::load_all(&paths)? {
        let s = &l.scenario;
        let reqs: Vec<String> = s
            .requires
            .iter()
            .map(|r| format!("{r:?}").to_lowercase())
            .collect();
        let verdict = match policy.decide(s) {
            Decision::Run => "runnable".to_string(),
            Decision::Skip(reason) => format!("skip ({})", printable(&reason.to_string())),
            Decision::Fail(reason) => format!("fail ({})", printable(&reason.to_string())),
        };
        wringer::say!(
            "{:<42} ranks={:<3} requires=[{}]  {verdict}",
            printable(&s.name),
            s.ranks.value,
            reqs.join(", ")
        );
    }
    Ok(0)
}
