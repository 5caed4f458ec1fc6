//! exit-before-first-exchange: full-mesh lazy connect and a first exchange, with one rank exiting before it (seed 003's #520 repro).

use super::support::{DETECT_MS, SURVIVOR_DETECTED};
use std::time::{Duration, Instant};

use crate::model::invalid::Invalid;

use anyhow::Result;
use wringer_transport::Connection;

use super::{connect_to, seq};
use crate::rank::context::RankContext;
use crate::rank::protocol::{RankMsg, StepReport};
use serde::{Deserialize, Serialize};

use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExitBeforeFirstExchange {
    pub exiting_rank: u32,
    pub connect_timeout: HumanDuration,
    pub deadline: HumanDuration,
}

impl super::Describe for ExitBeforeFirstExchange {
    const ABOUT: &'static str = "a rank leaves before a lazily connected group's first exchange";
}

impl StepSpec for ExitBeforeFirstExchange {
    fn metrics(&self) -> &'static [Metric] {
        &[SURVIVOR_DETECTED, DETECT_MS]
    }

    fn min_ranks(&self) -> u32 {
        3
    }

    fn check(&self, ranks: u32) -> Result<(), Invalid> {
        if self.exiting_rank >= ranks {
            return Err(format!(
                "exiting_rank {} is not a rank (0..{ranks})",
                self.exiting_rank
            )
            .into());
        }
        Ok(())
    }
}

impl StepKind for ExitBeforeFirstExchange {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        exit_before_first_exchange(ctx, step, self.exiting_rank, self.connect_timeout.0, report)
    }
}

pub fn exit_before_first_exchange(
    ctx: &RankContext,
    step: usize,
    exiting: u32,
    connect_timeout: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank == exiting {
        ctx.control.send(&RankMsg::ExitingByDesign {
            step,
            reason: "leaves before the first exchange".into(),
        })?;
        std::process::exit(0);
    }
    // The departure comes first, every time: wait (bounded) until the leaving rank's process no
    // longer accepts connections, so no connect can race its exit: every connect to it is
    // refused and retries to its deadline.
    let gone = ctx.peers[exiting as usize].transport;
    let departed = crate::hosts::procfs::wait_until(
        || std::net::TcpStream::connect_timeout(&gone, Duration::from_millis(100)).is_err(),
        connect_timeout * 5,
    );
    if !departed {
        anyhow::bail!(
            "rank {exiting} was still accepting connections {:?} after it said it would leave",
            connect_timeout * 5
        );
    }
    let started = Instant::now();
    // Full mesh, lazily: connect to higher ranks, wait for lower ones; all at once.
    let ranks = ctx.ranks;
    let outcome: Result<Vec<Connection>> = std::thread::scope(|s| {
        let initiators: Vec<_> = (ctx.rank + 1..ranks)
            .map(|peer| {
                s.spawn(move || {
                    connect_to(ctx, peer, seq(step, ctx.rank as u64), connect_timeout)
                        .map_err(|e| anyhow::anyhow!("connect to rank {peer}: {e}"))
                })
            })
            .collect();
        let mut conns = vec![];
        let mut first_error = None;
        for peer in 0..ctx.rank {
            match ctx
                .listener
                .wait_for(seq(step, peer as u64), connect_timeout)
            {
                Ok(c) => conns.push(c),
                Err(e) => {
                    first_error.get_or_insert(anyhow::anyhow!("wait for rank {peer}: {e}"));
                }
            }
        }
        for h in initiators {
            match h
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("connect thread panicked")))
            {
                Ok(c) => conns.push(c),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(conns),
        }
    });
    // The first exchange: everyone sends to everyone, then receives from everyone.
    let failure = match outcome {
        Err(e) => Some(e.to_string()),
        Ok(conns) => {
            let mut err = None;
            for c in &conns {
                if let Err(e) = c.send(&ctx.rank.to_be_bytes(), connect_timeout) {
                    err.get_or_insert(format!("send: {e}"));
                }
            }
            for c in &conns {
                if let Err(e) = c.recv(connect_timeout) {
                    err.get_or_insert(format!("recv: {e}"));
                }
            }
            err
        }
    };
    match failure {
        Some(e) => {
            let detect_ms = started.elapsed().as_secs_f64() * 1e3;
            report.metrics.insert(SURVIVOR_DETECTED, 1.0);
            report.metrics.insert(DETECT_MS, detect_ms);
            report
                .notes
                .push(format!("rank {}: {e} after {detect_ms:.0} ms", ctx.rank));
        }
        None => {
            report.metrics.insert(SURVIVOR_DETECTED, 0.0);
            report.notes.push(format!(
                "rank {}: the first exchange completed without rank {exiting}",
                ctx.rank
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn the_exiting_rank_must_be_one_of_the_group() {
        let s = accepted(
            "exit-before-first-exchange: { exiting_rank: 3, connect_timeout: 2s, deadline: 30s }",
            4,
        );
        assert_eq!(s.min_ranks(), 3);
        assert!(refused(
            "exit-before-first-exchange: { exiting_rank: 4, connect_timeout: 2s, deadline: 30s }",
            4
        )
        .contains("not a rank"));
    }
}
