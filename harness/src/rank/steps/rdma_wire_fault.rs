//! rdma-wire-fault: rank 1 SENDs a checked stream to rank 0 over RC; after `fault_after`
//! messages both ranks reach `mid-stream`, where the scenario strikes a fault on one host's
//! RoCE wire. Then the stream goes on, and the step judges what a correct RC transport must
//! show for the `outcome` the scenario names:
//!
//! - `intact`: every message arrives once, in order, unaltered, with no error completion (RC
//!   retransmits what loss, corruption or reordering took).
//! - `fails`: the sender's outstanding request completes with an error within the bound its
//!   QP's attributes give (4.096 µs × 2^timeout × (retry_cnt + 1)), never a hang.
//!
//! Both ranks watch their own device's asynchronous events, so a port that goes down is seen
//! the way a program sees it.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use wringer_transport::rdma::port_events::PortEvents;
use wringer_transport::rdma::rc::{RcConnection, RdmaError, Received};

use super::pattern;
use super::rdma_lossless_stream::{RDMA_DROPPED, RDMA_RX_BYTES};
use super::rdma_support::*;
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::invalid::Invalid;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

crate::declare_metrics! {
    /// From the strike to the sender's failed completion.
    pub FAULT_TO_ERROR_MS = "fault_to_error_ms", Milliseconds, Lower;
    /// The most a correct provider may take: the QP's ACK timeout times its tries.
    pub RETRY_BOUND_MS = "retry_bound_ms", Milliseconds, Neither;
    /// 1 when the sender's error came within the retry bound (and its grace).
    pub WITHIN_RETRY_BOUND = "within_retry_bound", Flag, Higher;
    /// PORT_ERR events a rank's device reported after the strike (only ranks that saw one).
    pub PORT_ERR_EVENTS = "port_err_events", Count, Neither;
    /// From the strike to the first PORT_ERR.
    pub PORT_ERR_MS = "port_err_ms", Milliseconds, Lower;
}

/// Where the fault strikes.
pub const MID_STREAM: &str = "mid-stream";

/// Scheduling allowance on top of the retry bound: the provider's timers run on a kernel
/// that may itself be emulated (TCG), and each wait ends a little after its nominal length
/// (rxe in the VM pair: 15.5 to 16.0 s against a nominal 15.0 s); a quarter of the bound, and
/// at least two seconds. A provider that retries for ever still misses it by far.
fn grace(bound: Duration) -> Duration {
    (bound / 4).max(Duration::from_secs(2))
}

/// How long the receiver waits for more once the sender says it is done.
const TAIL: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The stream survives the fault, whole and in order.
    Intact,
    /// The sender's connection fails, within the QP's retry bound.
    Fails,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaWireFault {
    pub messages: u32,
    pub size: u32,
    /// Messages sent (and completed) before the fault strikes.
    pub fault_after: u32,
    pub outcome: Outcome,
    pub deadline: HumanDuration,
}

impl super::Describe for RdmaWireFault {
    const ABOUT: &'static str =
        "a checked RC stream under a fault on the RoCE wire: intact, or failed within the QP's retry bound";
}

impl StepSpec for RdmaWireFault {
    fn requires(&self) -> Vec<crate::model::requirement::Requirement> {
        vec![crate::model::requirement::Requirement::Rdma]
    }

    fn points(&self) -> Vec<String> {
        vec![MID_STREAM.into()]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            RDMA_TX_MESSAGES,
            RDMA_RX_MESSAGES,
            RDMA_RX_BYTES,
            RDMA_DROPPED,
            RDMA_COMPLETION_ERRORS,
            RETRY_EXC_ERR,
            FAULT_TO_ERROR_MS,
            RETRY_BOUND_MS,
            WITHIN_RETRY_BOUND,
            PORT_ERR_EVENTS,
            PORT_ERR_MS,
        ]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        super::in_range("size", self.size, 1, super::MAX_MESSAGE)?;
        super::in_range("messages", self.messages, 1, super::MAX_COUNT)?;
        if self.fault_after >= self.messages {
            return Err(format!(
                "fault_after ({}) must be below messages ({}): the fault strikes mid-stream",
                self.fault_after, self.messages
            )
            .into());
        }
        Ok(())
    }
}

impl StepKind for RdmaWireFault {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        if !ctx.in_pair() {
            return Ok(());
        }
        let deadline = self.deadline.0;
        let end = Instant::now() + deadline;
        // Before the connection, so that nothing the fault causes is missed.
        let events = match local_gid() {
            Some((device, _, _)) => match PortEvents::watch(&device) {
                Ok(w) => Some(w),
                Err(e) => {
                    report
                        .notes
                        .push(format!("no async events from {device}: {e}"));
                    None
                }
            },
            None => None,
        };
        let mut c = pair(ctx, step, self.size, deadline)?;
        let struck = if ctx.rank == 1 {
            self.send(ctx, step, &mut c, end, report)?
        } else {
            self.receive(ctx, step, &mut c, end, report)?
        };
        counts_into(&c, report);
        if ctx.rank == 0 {
            // Only the sender posts SENDs: its count of RETRY_EXC_ERR is the one a bound reads.
            report.metrics.remove(&RETRY_EXC_ERR);
        }
        drop(c);
        if let Some(w) = events {
            let seen = w.events();
            let errs: Vec<_> = seen
                .iter()
                // From the point on: the event may come before the strike's answer does.
                .filter(|e| e.kind == "PORT_ERR" && e.at >= struck.reached)
                .collect();
            let all: Vec<String> = seen
                .iter()
                .map(|e| format!("{}@{:.0}ms", e.kind, ms_since(struck.reached, e.at)))
                .collect();
            report.notes.push(format!(
                "rank {} async events on {} (ms after reaching the fault's point): {}",
                ctx.rank,
                w.device(),
                if all.is_empty() {
                    "none".into()
                } else {
                    all.join(", ")
                }
            ));
            if let Some(first) = errs.first() {
                report.metrics.insert(PORT_ERR_EVENTS, errs.len() as f64);
                report
                    .metrics
                    .insert(PORT_ERR_MS, ms_since(struck.reached, first.at));
            }
        }
        Ok(())
    }
}

fn ms_since(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1e3
}

impl RdmaWireFault {
    /// Rank 1: the stream, the fault, and what the sender saw. Returns when the fault struck.
    fn send(
        &self,
        ctx: &RankContext,
        step: usize,
        c: &mut RcConnection,
        end: Instant,
        report: &mut StepReport,
    ) -> Result<Struck> {
        let left = || end.saturating_duration_since(Instant::now());
        let mut sent = 0u32;
        for i in 0..self.fault_after {
            c.send(&pattern(ctx.seed, i as u64, self.size as usize), left())?;
            sent += 1;
        }
        let struck = strike(ctx, step, left())?;
        // Errors are timed from the moment the fault had surely struck.
        let struck_at = struck.known;
        let ack = c.ack_timing();
        let bound = ack.and_then(|a| a.retry_bound());
        match (ack, bound) {
            (Some(a), Some(b)) => {
                report.metrics.insert(RETRY_BOUND_MS, b.as_secs_f64() * 1e3);
                report.notes.push(format!(
                    "sender QP: timeout {} ({:.1} ms per ACK wait) x (retry_cnt {} + 1) = retry bound {:.0} ms, grace {:.0} ms",
                    a.timeout,
                    a.ack_timeout().unwrap_or_default().as_secs_f64() * 1e3,
                    a.retry_cnt,
                    b.as_secs_f64() * 1e3,
                    grace(b).as_secs_f64() * 1e3
                ));
            }
            (Some(a), None) => report.notes.push(format!(
                "sender QP: timeout 0 (waits for an ACK forever), retry_cnt {}: no retry bound",
                a.retry_cnt
            )),
            (None, _) => report
                .notes
                .push("sender QP: its attributes could not be queried".into()),
        }
        let mut failed: Option<(u32, RdmaError, Duration)> = None;
        for i in self.fault_after..self.messages {
            match c.send(&pattern(ctx.seed, i as u64, self.size as usize), left()) {
                Ok(()) => sent += 1,
                Err(e) => {
                    failed = Some((i, e, struck_at.elapsed()));
                    break;
                }
            }
        }
        report.metrics.insert(RDMA_TX_MESSAGES, sent as f64);
        match &failed {
            Some((i, e, after)) => {
                let is_completion = matches!(e, RdmaError::Completion { .. });
                report.notes.push(format!(
                    "sender: message {i} of {} failed {:.0} ms after the strike: {e}",
                    self.messages,
                    after.as_secs_f64() * 1e3
                ));
                if is_completion {
                    report
                        .metrics
                        .insert(FAULT_TO_ERROR_MS, after.as_secs_f64() * 1e3);
                }
                let within = is_completion && bound.is_some_and(|b| *after <= b + grace(b));
                report
                    .metrics
                    .insert(WITHIN_RETRY_BOUND, f64::from(u8::from(within)));
            }
            None => {
                report.notes.push(format!(
                    "sender: all {} messages completed after the strike",
                    self.messages - self.fault_after
                ));
                report.metrics.insert(WITHIN_RETRY_BOUND, 0.0);
            }
        }
        if self.outcome == Outcome::Intact {
            if let Some((i, e, _)) = failed {
                bail!("the stream did not survive the fault: message {i} failed: {e}");
            }
        }
        ctx.pair_barrier(step, "sender-done", left())?;
        Ok(struck)
    }

    /// Rank 0: count and check every message until the sender is done.
    fn receive(
        &self,
        ctx: &RankContext,
        step: usize,
        c: &mut RcConnection,
        end: Instant,
        report: &mut StepReport,
    ) -> Result<Struck> {
        let left = || end.saturating_duration_since(Instant::now());
        let (mut received, mut bytes, mut wrong) = (0u32, 0u64, 0u32);
        let mut check = |m: Vec<u8>, received: &mut u32| {
            wrong += (m != pattern(ctx.seed, *received as u64, self.size as usize)) as u32;
            bytes += m.len() as u64;
            *received += 1;
        };
        while received < self.fault_after {
            match c.recv(left())? {
                Received::Message(m) => check(m, &mut received),
                other => bail!("unexpected {other:?} in a SEND stream"),
            }
        }
        let struck = strike(ctx, step, left())?;
        // The sender's "done" arrives over the control line, which the fault does not touch.
        let done = std::sync::atomic::AtomicBool::new(false);
        let outcome: Result<()> = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let r = ctx.pair_barrier(step, "sender-done", left());
                done.store(true, std::sync::atomic::Ordering::Relaxed);
                r
            });
            let mut quiet_since: Option<Instant> = None;
            let mut error = None;
            while received < self.messages && !left().is_zero() {
                if done.load(std::sync::atomic::Ordering::Relaxed)
                    && quiet_since.is_some_and(|q| q.elapsed() >= TAIL)
                {
                    break;
                }
                match c.recv(Duration::from_millis(100).min(left())) {
                    Ok(Received::Message(m)) => {
                        check(m, &mut received);
                        quiet_since = None;
                    }
                    Ok(other) => {
                        error = Some(anyhow::anyhow!("unexpected {other:?} in a SEND stream"));
                        break;
                    }
                    Err(e) if e.is_timeout() => {
                        quiet_since.get_or_insert_with(Instant::now);
                    }
                    Err(e) => {
                        report
                            .notes
                            .push(format!("receiver: after {received} messages: {e}"));
                        if self.outcome == Outcome::Intact {
                            error = Some(e.into());
                        }
                        break;
                    }
                }
            }
            let barrier = waiter
                .join()
                .unwrap_or_else(|_| bail!("the barrier waiter panicked"));
            match error {
                Some(e) => Err(e),
                None => barrier,
            }
        });
        report.metrics.insert(RDMA_RX_MESSAGES, received as f64);
        report.metrics.insert(RDMA_RX_BYTES, bytes as f64);
        report
            .metrics
            .insert(RDMA_DROPPED, (self.messages - received + wrong) as f64);
        if wrong > 0 {
            report.notes.push(format!(
                "receiver: {wrong} of {received} messages were not the expected bytes at their place in the stream (corrupt, duplicated or out of order)"
            ));
        }
        outcome?;
        Ok(struck)
    }
}

/// When a rank reached the fault's point, and when both knew it had struck.
#[derive(Clone, Copy)]
struct Struck {
    reached: Instant,
    known: Instant,
}

/// Both ranks reach `mid-stream` (the fault names one of them) and wait until it is struck.
fn strike(ctx: &RankContext, step: usize, limit: Duration) -> Result<Struck> {
    let reached = Instant::now();
    ctx.control.point_and_wait(step, MID_STREAM, limit)?;
    ctx.pair_barrier(step, "struck", limit)?;
    Ok(Struck {
        reached,
        known: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::steps::testing::{accepted, refused};
    use wringer_transport::rdma::rc::WcStatus;

    #[test]
    fn the_fault_must_strike_mid_stream_and_the_outcome_is_named() {
        let s = accepted(
            "rdma-wire-fault: { messages: 100, size: 1024, fault_after: 20, outcome: fails, deadline: 60s }",
            2,
        );
        assert!(s.metrics().contains(&WITHIN_RETRY_BOUND));
        assert_eq!(s.points(), vec![MID_STREAM.to_string()]);
        assert!(refused(
            "rdma-wire-fault: { messages: 100, size: 1024, fault_after: 100, outcome: intact, deadline: 60s }",
            2
        )
        .contains("fault_after"));
        assert!(refused(
            "rdma-wire-fault: { messages: 100, size: 1024, fault_after: 10, outcome: maybe, deadline: 60s }",
            2
        )
        .contains("outcome"));
    }

    #[test]
    fn the_grace_is_a_quarter_of_the_bound_and_at_least_two_seconds() {
        assert_eq!(grace(Duration::from_secs(4)), Duration::from_secs(2));
        assert_eq!(grace(Duration::from_secs(40)), Duration::from_secs(10));
    }

    #[test]
    fn a_send_error_that_is_not_a_completion_is_never_within_the_bound() {
        // The judgement in `send`: a timeout (no completion at all) is a hang, not an error
        // the provider reported.
        let timeout = RdmaError::Timeout {
            during: "waiting for a send completion",
            after: Duration::from_secs(1),
        };
        assert!(!matches!(timeout, RdmaError::Completion { .. }));
        let retry = RdmaError::Completion {
            status: WcStatus::RetryExcErr,
            wr_id: 1,
        };
        assert!(matches!(retry, RdmaError::Completion { .. }));
    }
}
