//! Launchers compared: the time to start N ranks over the same three hosts and finish the
//! rendezvous, through Slurm (one `srun` step) against our SSH fan-out (one `ssh` per rank),
//! alternating in rounds like every other bench row. Ours is srun here: it is the launcher
//! being brought in, and SSH the one it must beat.

use std::path::Path;

use anyhow::{Context, Result};

use super::{ours, versus, Goal, Row};
use super::{Method, Sample};
use crate::hosts::placement::{self, Placement};

/// 64 ranks through srun, started and joined, within this (the issue's goal on this machine).
const GOAL_64_MS: f64 = 2000.0;

pub fn rows(
    slurm_profile: &Path,
    ssh_profile: &Path,
    ranks: &[u32],
    method: Method,
    logs: &Path,
) -> Result<Vec<Row>> {
    let run_id = format!("bench-{}", std::process::id());
    let prepare = |p: &Path, tag: &str| -> Result<Placement> {
        let profile = crate::hosts::profile::load(p)?;
        placement::prepare(&profile, &format!("{run_id}-{tag}"))
            .with_context(|| format!("bringing up {}", p.display()))
    };
    let slurm = prepare(slurm_profile, "s")?;
    let ssh = prepare(ssh_profile, "r")?;
    let hosts = |p: &Placement| p.hosts().len().max(1);
    let sample = |placement: &Placement, side: &str, n: u32| -> Result<Sample> {
        let dir = logs.join(format!("launch-{side}-{n}"));
        Ok(Sample {
            value: ours::startup_once(n, placement, &dir)?,
            p99: None,
            count: None,
        })
    };
    let mut rows = vec![];
    for &n in ranks {
        rows.push(versus(
            method,
            (
                format!(
                    "start {n} ranks + rendezvous over {} hosts: srun vs SSH",
                    hosts(&slurm)
                ),
                "ms",
                "wringer's SSH fan-out",
                (n == 64).then_some(Goal::ValueAtMost(GOAL_64_MS)),
            ),
            || sample(&slurm, "srun", n),
            || sample(&ssh, "ssh", n),
        ));
    }
    Ok(rows)
}
