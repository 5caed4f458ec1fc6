//! pingpong: full-mesh ping-pong with data verification at every size.

use crate::model::invalid::Invalid;
use super::support::{DATA_MISMATCHES};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use wringer_transport::Connection;

use super::{connect_to, pattern, seq};
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::{check_sizes, StepKind};
use crate::model::duration::HumanDuration;
use crate::model::metric::{Metric, Series};
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub PAIRS_VERIFIED = "pairs_verified", Count, Neither;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Pingpong {
    pub sizes: Vec<u32>,
    pub iterations: u32,
    pub deadline: HumanDuration,
}

/// The point its ranks report, where a scenario's fault may strike.
const MESH_READY: &str = "mesh-ready";

impl super::Describe for Pingpong {
    const ABOUT: &'static str = "full-mesh ping-pong, every byte checked, latency per size";
}

impl StepSpec for Pingpong {
    fn points(&self) -> Vec<String> {
        vec![MESH_READY.into()]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[PAIRS_VERIFIED, DATA_MISMATCHES]
    }

    fn series(&self) -> &'static [Series] {
        &[Series::Latency]
    }

    fn deadline(&self) -> Duration {
        self.deadline.0
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        check_sizes(&self.sizes, self.iterations)
    }
}

impl StepKind for Pingpong {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        run(
            ctx,
            step,
            &self.sizes,
            self.iterations,
            self.deadline.0,
            report,
        )
    }
}

pub fn run(
    ctx: &RankContext,
    step: usize,
    sizes: &[u32],
    iterations: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let conns = mesh(ctx, step, deadline)?;
    // Faults that shape the data phase (a rate limit) strike here, before any data moves.
    ctx.control.point_and_wait(step, MESH_READY, deadline)?;
    let mut samples: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    let (mut pairs_verified, mut mismatches) = (0u32, 0u32);
    for partner in schedule(ctx.rank, ctx.ranks) {
        let Some(partner) = partner else { continue };
        let conn = &conns[&partner];
        let pinger = ctx.rank < partner;
        let mut pair_mismatches = 0;
        for &size in sizes {
            for it in 0..iterations {
                let tag = (ctx.rank.min(partner) as u64) << 48
                    | (partner.max(ctx.rank) as u64) << 32
                    | (size as u64) << 8
                    | it as u64;
                let expected = pattern(ctx.seed, tag, size as usize);
                if pinger {
                    let started = Instant::now();
                    conn.send(&expected, deadline)?;
                    let back = conn.recv(deadline)?;
                    samples
                        .entry(size)
                        .or_default()
                        .push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
                    pair_mismatches += (back.payload != expected) as u32;
                    conn.recycle(back.payload);
                } else {
                    let got = conn.recv(deadline)?;
                    pair_mismatches += (got.payload != expected) as u32;
                    conn.send(&got.payload, deadline)?;
                    conn.recycle(got.payload);
                }
            }
        }
        mismatches += pair_mismatches;
        if pair_mismatches == 0 {
            pairs_verified += 1;
        }
    }
    for c in conns.values() {
        c.close()?;
    }
    report
        .metrics
        .insert(PAIRS_VERIFIED, pairs_verified as f64);
    report
        .metrics
        .insert(DATA_MISMATCHES, mismatches as f64);
    for (size, v) in samples {
        report.sample(Series::Latency, size as u64, v);
    }
    Ok(())
}

/// Connect to every other rank: initiate towards higher ranks, wait for lower ones.
fn mesh(ctx: &RankContext, step: usize, deadline: Duration) -> Result<BTreeMap<u32, Connection>> {
    std::thread::scope(|s| {
        let initiators: Vec<_> = (ctx.rank + 1..ctx.ranks)
            .map(|peer| {
                (
                    peer,
                    s.spawn(move || connect_to(ctx, peer, seq(step, ctx.rank as u64), deadline)),
                )
            })
            .collect();
        let mut conns = BTreeMap::new();
        for peer in 0..ctx.rank {
            conns.insert(
                peer,
                ctx.listener.wait_for(seq(step, peer as u64), deadline)?,
            );
        }
        for (peer, h) in initiators {
            conns.insert(
                peer,
                h.join().map_err(|_| anyhow!("connect thread panicked"))??,
            );
        }
        Ok(conns)
    })
}

/// Round-robin (circle method): in each round every rank has one partner, or none (odd count).
fn schedule(rank: u32, ranks: u32) -> Vec<Option<u32>> {
    let m = ranks + ranks % 2;
    (0..m - 1)
        .map(|round| {
            let partner = if rank == m - 1 {
                // The fixed seat meets whoever sits opposite it this round.
                round
            } else if rank == round {
                m - 1
            } else {
                (2 * round + (m - 1) - rank) % (m - 1)
            };
            (partner < ranks && partner != rank).then_some(partner)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::schedule;

    #[test]
    fn every_pair_meets_exactly_once_and_symmetrically() {
        for ranks in 2..=9u32 {
            let table: Vec<_> = (0..ranks).map(|r| schedule(r, ranks)).collect();
            for r in 0..ranks {
                let mut met: Vec<u32> = table[r as usize].iter().flatten().copied().collect();
                for (round, p) in table[r as usize].iter().enumerate() {
                    if let Some(p) = p {
                        assert_eq!(
                            table[*p as usize][round],
                            Some(r),
                            "ranks={ranks} round={round}"
                        );
                    }
                }
                met.sort();
                let others: Vec<u32> = (0..ranks).filter(|&o| o != r).collect();
                assert_eq!(met, others, "ranks={ranks} rank={r}");
            }
        }
    }
}
