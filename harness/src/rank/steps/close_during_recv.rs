//! close-during-recv: one thread closes the connection while others are blocked in `recv`, the peer alive and silent, over many cycles; the blocked callers must return local shutdown, and `close` must return, both within a small bound, never waiting for the peer.
//!
//! Each cycle finds one of the two states a caller can be blocked in: the receiver thread
//! parked aside (the callers had been receiving), or the receiver already waiting for bytes in
//! `poll` when the callers came. A `close` that skips the shutdown because the application is
//! receiving wakes neither the caller in `poll` nor a receiver waiting in its `poll`. The peer closes its
//! side after `peer_patience` without commands, so even that bug ends, as evidence.

use super::support::{CYCLES, FD_DELTA, SHUTDOWN_P99_MS, THREAD_DELTA};
use crate::model::invalid::Invalid;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use wringer_transport::{Connection, Error};

use super::raw_peer::accept_conn;
use super::scripted_peer::{pair, stop_peer, Driver, Script};
use super::{fd_is_closed, in_range, percentile, settle, Seeded, StepKind};
use crate::hosts::procfs::{gettid, open_fds, thread_sleeps_in, threads, wait_until, POLL_CALLS};
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

crate::declare_metrics! {
    pub CYCLES_RECEIVER_PARKED = "cycles_receiver_parked", Count, Neither;
    pub CYCLES_RECEIVER_WAITING = "cycles_receiver_waiting", Count, Neither;
    pub CLOSES_WAITING_FOR_PEER = "closes_waiting_for_peer", Count, Lower;
    pub CALLERS_NOT_WOKEN_BY_CLOSE = "callers_not_woken_by_close", Count, Lower;
    pub CALLER_WAKE_MAX_MS = "caller_wake_max_ms", Milliseconds, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CloseDuringRecv {
    pub cycles: u32,
    /// How long `close`, and each blocked caller's return after it, may take.
    pub bound: HumanDuration,
    pub deadline: HumanDuration,
}

const MAX_CYCLES: u32 = 100_000;
/// How long the peer waits for a command (or our close) before it closes its side.
const PEER_PATIENCE: Duration = Duration::from_secs(3);
/// A blocked caller's own deadline: past the peer's patience, so only close can end it first.
const CALLER_WAIT: Duration = Duration::from_secs(4);
/// Frames the peer may send to get the receiver to step aside.
const NUDGES: usize = 8;
const PATIENCE: Duration = Duration::from_secs(5);
const NOTED: usize = 4;

impl super::Describe for CloseDuringRecv {
    const ABOUT: &'static str =
        "close with callers blocked in recv: local shutdown and close within a bound";
}

crate::reach_points! {
    pub RECEIVER_PARKED_AT_CLOSE = "receiver-parked-at-close",
        "a close came while callers were blocked in recv and the receiver thread was parked aside";
    pub RECEIVER_WAITING_AT_CLOSE = "receiver-waiting-at-close",
        "a close came while callers were blocked in recv and the receiver thread waited for bytes";
    pub CLOSE_WOKE_A_BLOCKED_CALLER = "close-woke-a-blocked-caller",
        "a caller blocked in recv was woken by the close with local shutdown";
}

impl StepSpec for CloseDuringRecv {
    fn reach_points(&self) -> &'static [crate::model::reach::ReachPoint] {
        &[
            RECEIVER_PARKED_AT_CLOSE,
            RECEIVER_WAITING_AT_CLOSE,
            CLOSE_WOKE_A_BLOCKED_CALLER,
        ]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            CYCLES,
            CYCLES_RECEIVER_PARKED,
            CYCLES_RECEIVER_WAITING,
            CLOSES_WAITING_FOR_PEER,
            CALLERS_NOT_WOKEN_BY_CLOSE,
            SHUTDOWN_P99_MS,
            CALLER_WAKE_MAX_MS,
            FD_DELTA,
            THREAD_DELTA,
        ]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        in_range("cycles", self.cycles, 1, MAX_CYCLES)?;
        if self.bound.0.is_zero() || self.bound.0 >= PEER_PATIENCE {
            return Err(format!(
                "bound must be above 0 and below the peer's patience ({PEER_PATIENCE:?})"
            )
            .into());
        }
        Ok(())
    }
}

impl StepKind for CloseDuringRecv {
    fn run(&self, ctx: &RankContext, _step: usize, report: &mut StepReport) -> Result<()> {
        pair(ctx, self.deadline.0, PEER_PATIENCE, |deadline| {
            self.close_cycles(ctx, deadline, report)
        })
    }
}

/// Where the receiver thread was when `close` came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Receiver {
    /// Parked aside, the callers reading for themselves.
    Parked,
    /// Waiting for bytes, beside the callers.
    Waiting,
}

/// One cycle's evidence.
struct Cycle {
    receiver: Receiver,
    close_ms: f64,
    /// Each blocked caller's outcome and how long after `close` began it returned.
    callers: Vec<(wringer_transport::Result<()>, f64)>,
}

impl CloseDuringRecv {
    fn close_cycles(
        &self,
        ctx: &RankContext,
        deadline: Instant,
        report: &mut StepReport,
    ) -> Result<()> {
        let mut rng = Seeded::new(ctx.seed, 0x434c_4f53);
        let (fds_before, threads_before) = (open_fds(), threads());
        let bound_ms = self.bound.0.as_secs_f64() * 1e3;
        let (mut parked, mut waiting, mut late_closes, mut not_woken) = (0u64, 0u64, 0u64, 0u64);
        let (mut close_ms, mut wake_max) = (vec![], 0f64);
        let mut done = 0u64;
        for i in 0..self.cycles as u64 {
            if Instant::now() >= deadline {
                bail!(
                    "only {i} of {} cycles fit in the step deadline",
                    self.cycles
                );
            }
            let want_parked = rng.range(0, 2) == 0;
            let callers = rng.range(1, 3) as usize;
            let c = cycle(ctx, i, want_parked, callers)?;
            done += 1;
            match c.receiver {
                Receiver::Parked => parked += 1,
                Receiver::Waiting => waiting += 1,
            }
            report.reach(match c.receiver {
                Receiver::Parked => RECEIVER_PARKED_AT_CLOSE,
                Receiver::Waiting => RECEIVER_WAITING_AT_CLOSE,
            });
            close_ms.push(c.close_ms);
            let mut failed = false;
            if c.close_ms > bound_ms {
                late_closes += 1;
                failed = true;
                if late_closes as usize <= NOTED {
                    report.notes.push(format!(
                        "cycle {i} (receiver {:?}, {callers} caller(s) in recv): close took \
                         {:.0} ms: it waited for the peer",
                        c.receiver, c.close_ms
                    ));
                }
            }
            for (k, (outcome, ms)) in c.callers.iter().enumerate() {
                wake_max = wake_max.max(*ms);
                let local = matches!(outcome, Err(Error::Closed));
                if local {
                    report.reach(CLOSE_WOKE_A_BLOCKED_CALLER);
                }
                if !local || *ms > bound_ms {
                    not_woken += 1;
                    failed = true;
                    if not_woken as usize <= NOTED {
                        let what = match outcome {
                            Ok(()) => "a frame".to_string(),
                            Err(e) => format!("`{e}`"),
                        };
                        report.notes.push(format!(
                            "cycle {i} (receiver {:?}): blocked caller {k} returned {what} \
                             {ms:.0} ms after close began, not local shutdown within the bound",
                            c.receiver
                        ));
                    }
                }
            }
            // One failed cycle is the evidence; more would only cost the peer's patience each.
            if failed {
                break;
            }
        }
        stop_peer(ctx, PATIENCE)?;
        let (fd_delta, thread_delta) = settle(fds_before, threads_before, Duration::from_secs(2));
        let m = &mut report.metrics;
        m.insert(CYCLES, done as f64);
        m.insert(CYCLES_RECEIVER_PARKED, parked as f64);
        m.insert(CYCLES_RECEIVER_WAITING, waiting as f64);
        m.insert(CLOSES_WAITING_FOR_PEER, late_closes as f64);
        m.insert(CALLERS_NOT_WOKEN_BY_CLOSE, not_woken as f64);
        m.insert(SHUTDOWN_P99_MS, percentile(&close_ms, 99.0));
        m.insert(CALLER_WAKE_MAX_MS, wake_max);
        m.insert(FD_DELTA, fd_delta);
        m.insert(THREAD_DELTA, thread_delta);
        report.notes.push(format!(
            "{done} closes with callers blocked in recv ({parked} with the receiver parked \
             aside, {waiting} with it waiting for bytes): close p99 {:.1} ms, slowest caller back \
             {wake_max:.1} ms after close began",
            percentile(&close_ms, 99.0)
        ));
        Ok(())
    }
}

fn cycle(ctx: &RankContext, i: u64, want_parked: bool, callers: usize) -> Result<Cycle> {
    let conn = accept_conn(ctx, PATIENCE)?;
    let d = Driver::new(
        &conn,
        Script::new(ctx.seed, i << 8, vec![16; NUDGES]),
        PATIENCE,
    )?;
    let tids = Mutex::new(Vec::<i32>::new());
    let outcomes = Mutex::new(Vec::<(wringer_transport::Result<()>, Instant)>::new());
    let a_caller_polls = || {
        let tids = tids.lock().unwrap_or_else(|p| p.into_inner());
        tids.iter().any(|t| thread_sleeps_in(*t, POLL_CALLS))
    };
    let mut receiver = Receiver::Waiting;
    let mut close_ms = 0.0;
    let began = std::thread::scope(|s| -> Result<Instant> {
        let spawn_callers = || {
            for _ in 0..callers {
                s.spawn(|| {
                    tids.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(gettid());
                    let outcome: wringer_transport::Result<()> = loop {
                        match conn.recv(CALLER_WAIT) {
                            Ok(_) => continue,
                            Err(e) => break Err(e),
                        }
                    };
                    let at = Instant::now();
                    outcomes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((outcome, at));
                });
            }
        };
        if want_parked {
            spawn_callers();
            // Frames arrive with the callers in recv, until the receiver has stepped aside.
            for n in 0..NUDGES {
                d.write_to(d.script.end(n))?;
                let st = || conn.read_stats();
                let delivered = || st().frames_read_by_callers + st().frames_dequeued > n as u64;
                if !wait_until(|| delivered() && a_caller_polls(), PATIENCE) {
                    bail!("cycle {i}: the callers never went back to waiting in recv");
                }
                if wait_until(|| receiver_parked(&conn), Duration::from_millis(40)) {
                    receiver = Receiver::Parked;
                    break;
                }
            }
        } else {
            if !wait_until(|| conn.receiver_blocked_in_recv(), PATIENCE) {
                bail!("cycle {i}: the receiver never waited for bytes");
            }
            spawn_callers();
        }
        let settled = || {
            a_caller_polls() && (receiver == Receiver::Parked) != conn.receiver_blocked_in_recv()
        };
        if !wait_until(settled, PATIENCE) {
            bail!("cycle {i}: no caller blocked in recv with the receiver {receiver:?}");
        }
        let began = Instant::now();
        // Bounded even when wrong: the peer closes its side after its patience.
        conn.close()?;
        close_ms = began.elapsed().as_secs_f64() * 1e3;
        Ok(began)
    })?;
    if !fd_is_closed(conn.raw_fd()) {
        bail!(
            "cycle {i}: descriptor {} is still open after close",
            conn.raw_fd()
        );
    }
    let callers = outcomes
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|(o, at)| (o, at.saturating_duration_since(began).as_secs_f64() * 1e3))
        .collect();
    Ok(Cycle {
        receiver,
        close_ms,
        callers,
    })
}

/// The receiver thread sleeps parked aside (in a futex), not in a receive.
fn receiver_parked(conn: &Connection) -> bool {
    thread_sleeps_in(conn.receiver_tid(), &[libc::SYS_futex])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn closes_have_a_bound_below_the_peers_patience() {
        let s = accepted(
            "close-during-recv: { cycles: 300, bound: 250ms, deadline: 220s }",
            2,
        );
        assert!(s.metrics().contains(&CALLERS_NOT_WOKEN_BY_CLOSE));
        assert!(refused(
            "close-during-recv: { cycles: 0, bound: 250ms, deadline: 220s }",
            2
        )
        .contains("cycles"));
        // A bound at or past the peer's patience could not tell a close that waits for the
        // peer from one that does not.
        assert!(refused(
            "close-during-recv: { cycles: 3, bound: 3s, deadline: 220s }",
            2
        )
        .contains("patience"));
    }
}
