//! teardown-cycles: rank 1 connects to rank 0, both receivers block, rank 0 tears down; `cycles` times (the MSCCL++ validation across two processes).

use super::support::{CYCLES, FD_DELTA, SHUTDOWN_P99_MS, THREAD_DELTA};
use crate::model::invalid::Invalid;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use wringer_transport::Terminal;

use super::{connect_to, fd_is_closed, percentile, seq, settle};
use crate::hosts::procfs::{open_fds, threads, wait_until};
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub SHUTDOWN_P50_MS = "shutdown_p50_ms", Milliseconds, Lower;
    pub EBADF = "ebadf", Count, Lower;
    pub CLOSER_NOT_LOCAL_SHUTDOWN = "closer_not_local_shutdown", Count, Lower;
}

crate::reach_points! {
    pub CLOSED_WITH_RECEIVER_BLOCKED = "closed-with-receiver-blocked",
        "rank 0 tore a connection down while its receiver thread was blocked in recv on it (the MSCCL++ race window)";
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TeardownCycles {
    pub cycles: u32,
    pub deadline: HumanDuration,
}

impl super::Describe for TeardownCycles {
    const ABOUT: &'static str =
        "MSCCL++ teardown: receivers blocked in recv, ordered close, fd and thread counts";
}

impl StepSpec for TeardownCycles {
    fn metrics(&self) -> &'static [Metric] {
        &[
            CYCLES,
            SHUTDOWN_P50_MS,
            SHUTDOWN_P99_MS,
            EBADF,
            FD_DELTA,
            THREAD_DELTA,
            CLOSER_NOT_LOCAL_SHUTDOWN,
        ]
    }

    fn reach_points(&self) -> &'static [crate::model::reach::ReachPoint] {
        &[CLOSED_WITH_RECEIVER_BLOCKED]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        super::in_range("cycles", self.cycles, 1, super::MAX_COUNT)
    }
}

impl StepKind for TeardownCycles {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        run(ctx, step, self.cycles, self.deadline.0, report)
    }
}

pub fn run(
    ctx: &RankContext,
    step: usize,
    cycles: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if !ctx.in_pair() {
        return Ok(());
    }
    let end = Instant::now() + deadline;
    let (fds_before, threads_before) = (open_fds(), threads());
    // Rank 1 connects only once both baselines are taken: an early connect would put rank 0's
    // short-lived handshake thread into its baseline, and the delta would read -1.
    ctx.control
        .barrier(&format!("teardown-{step}-baseline"), 2, deadline)?;
    let mut shutdown_ms = Vec::with_capacity(cycles as usize);
    let mut ebadf = 0u32;
    let mut not_local = 0u32;
    let mut done = 0u32;
    for i in 0..cycles {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("only {done} of {cycles} cycles fit in the step deadline");
        }
        let conn = if ctx.rank == 0 {
            ctx.listener.wait_for(seq(step, i as u64), left)?
        } else {
            connect_to(ctx, 0, seq(step, i as u64), left)?
        };
        // Rank 1's receiver may already have seen rank 0's close instead of blocking.
        let settled =
            || (ctx.rank == 1 && conn.terminal().is_some()) || conn.receiver_blocked_in_recv();
        if !wait_until(settled, left) {
            bail!("cycle {i}: the receiver never blocked in recv");
        }
        if ctx.rank == 1 {
            // Rank 0 tears down first, with our receiver blocked; we see it close, then close.
            match conn.recv(left) {
                Err(wringer_transport::Error::PeerClosed) => {}
                Err(wringer_transport::Error::Receiver(e)) if e.is_ebadf() => ebadf += 1,
                other => bail!("cycle {i}: expected the peer to close, got {other:?}"),
            }
        }
        if ctx.rank == 0 && conn.receiver_blocked_in_recv() {
            report.reach(CLOSED_WITH_RECEIVER_BLOCKED);
        }
        let started = Instant::now();
        conn.close()?;
        shutdown_ms.push(started.elapsed().as_secs_f64() * 1e3);
        if !fd_is_closed(conn.raw_fd()) {
            bail!(
                "cycle {i}: descriptor {} is still open after teardown",
                conn.raw_fd()
            );
        }
        match conn.terminal() {
            Some(Terminal::Failed(e)) if e.is_ebadf() => ebadf += 1,
            Some(Terminal::Failed(e)) => bail!("cycle {i}: receiver failed: {e}"),
            // Rank 0 closes with its receiver blocked: that receiver must end by our own
            // shutdown, nothing else.
            Some(Terminal::LocalShutdown) => {}
            other if ctx.rank == 0 => {
                not_local += 1;
                if not_local <= 3 {
                    report.notes.push(format!(
                        "cycle {i}: the closing side's receiver ended {other:?}"
                    ));
                }
            }
            _ => {}
        }
        done += 1;
    }
    let (fd_delta, thread_delta) = settle(fds_before, threads_before, Duration::from_secs(2));
    let m = &mut report.metrics;
    m.insert(CYCLES, done as f64);
    m.insert(SHUTDOWN_P50_MS, percentile(&shutdown_ms, 50.0));
    m.insert(SHUTDOWN_P99_MS, percentile(&shutdown_ms, 99.0));
    m.insert(EBADF, ebadf as f64);
    m.insert(FD_DELTA, fd_delta);
    m.insert(THREAD_DELTA, thread_delta);
    if ctx.rank == 0 {
        m.insert(CLOSER_NOT_LOCAL_SHUTDOWN, not_local as f64);
    }
    report.notes.push(format!(
        "rank {}: {done} cycles, max shutdown {:.3} ms",
        ctx.rank,
        shutdown_ms.iter().copied().fold(0.0, f64::max)
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn cycles_are_bounded_and_ebadf_is_declared() {
        let s = accepted("teardown-cycles: { cycles: 2500, deadline: 150s }", 2);
        assert!(s.metrics().contains(&EBADF));
        assert!(refused("teardown-cycles: { cycles: 0, deadline: 150s }", 2).contains("cycles"));
        assert!(
            refused("teardown-cycles: { cycles: 4000000000, deadline: 150s }", 2)
                .contains("cycles")
        );
    }
}
