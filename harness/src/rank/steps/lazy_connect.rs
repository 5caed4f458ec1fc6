//! lazy-connect: Gloo's lazy-connect cases between rank 0 (listener) and rank 1 (initiator), ordered with barriers.

use super::support::{LISTENER_TIMEOUT_FIRED, LISTENER_TIMEOUT_MS};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use wringer_transport::{
    connect, ConnectOptions, Connection, Error, Hello, Listener, ListenerOptions, RejectReason,
};

use super::seq;
use crate::hosts::procfs::wait_until;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub SPURIOUS_TIMEOUTS = "spurious_timeouts", Count, Lower;
    pub LATE_SOCKET_REJECTED = "late_socket_rejected", Flag, Neither;
    pub STALE_DROPPED = "stale_dropped", Flag, Neither;
    pub REUSE_CONNECTIONS_OK = "reuse_connections_ok", Flag, Neither;
    pub DUPLICATE_WAIT_REJECTED = "duplicate_wait_rejected", Flag, Neither;
    pub SHUTDOWN_WAITERS_FAILED = "shutdown_waiters_failed", Count, Lower;
    pub SHUTDOWN_RELEASE_MS = "shutdown_release_ms", Milliseconds, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LazyConnect {
    pub wait_timeout: HumanDuration,
    pub deadline: HumanDuration,
}

impl super::Describe for LazyConnect {
    const ABOUT: &'static str =
        "Gloo's listener-side cases (timeouts, late sockets, duplicates, shutdown)";
}

crate::reach_points! {
    pub SHUTDOWN_WITH_WAITERS_PENDING = "shutdown-with-waiters-pending",
        "the listener shut down with three lazy-connect waits pending";
}

impl StepSpec for LazyConnect {
    fn reach_points(&self) -> &'static [crate::model::reach::ReachPoint] {
        &[SHUTDOWN_WITH_WAITERS_PENDING]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            LISTENER_TIMEOUT_FIRED,
            LISTENER_TIMEOUT_MS,
            SPURIOUS_TIMEOUTS,
            LATE_SOCKET_REJECTED,
            STALE_DROPPED,
            REUSE_CONNECTIONS_OK,
            DUPLICATE_WAIT_REJECTED,
            SHUTDOWN_WAITERS_FAILED,
            SHUTDOWN_RELEASE_MS,
        ]
    }
}

impl StepKind for LazyConnect {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        run(ctx, step, self.wait_timeout.0, self.deadline.0, report)
    }
}

pub fn run(
    ctx: &RankContext,
    step: usize,
    wait: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    match ctx.rank {
        0 => listener_side(ctx, step, wait, deadline, report),
        1 => initiator_side(ctx, step, deadline, report),
        _ => Ok(()),
    }
}

pub(super) fn initiate(
    ctx: &RankContext,
    step: usize,
    n: u64,
    generation: u64,
    deadline: Duration,
) -> wringer_transport::Result<Connection> {
    let hello = Hello {
        rank: ctx.rank,
        sequence: seq(step, n),
        generation,
        token: ctx.token,
    };
    connect(
        ctx.peers[0].transport,
        &hello,
        &ConnectOptions {
            deadline,
            ..ConnectOptions::default()
        },
    )
}

fn initiator_side(
    ctx: &RankContext,
    step: usize,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let b = |name: &str| ctx.pair_barrier(step, name, deadline);
    // no spurious timeout: connect well within the listener's wait, answer its ping later.
    let conn = initiate(ctx, step, 2, 0, deadline)?;
    let ping = conn.recv(deadline)?;
    conn.send(&ping.payload, deadline)?;
    // late socket after timeout: arrive only after the listener's wait has expired.
    b("late-1")?;
    let late = initiate(ctx, step, 3, 0, deadline);
    let rejected = matches!(late, Err(Error::Rejected(RejectReason::StaleGeneration)));
    report
        .metrics
        .insert(LATE_SOCKET_REJECTED, rejected as u8 as f64);
    report
        .notes
        .push(format!("late socket for a timed-out generation: {late:?}"));
    b("late-2")?;
    let next = initiate(ctx, step, 3, 1, deadline)?;
    next.send(b"next generation", deadline)?;
    // sequence reuse across two groups: the same sequence, generations 0 and 1.
    let group_a = initiate(ctx, step, 4, 0, deadline)?;
    let group_b = initiate(ctx, step, 4, 1, deadline)?;
    group_a.send(b"A", deadline)?;
    group_b.send(b"B", deadline)?;
    // duplicate pending wait: connect once the listener has refused the duplicate.
    b("dup")?;
    let dup = initiate(ctx, step, 5, 0, deadline)?;
    dup.send(b"first waiter", deadline)?;
    b("done")?;
    Ok(())
}

fn listener_side(
    ctx: &RankContext,
    step: usize,
    wait: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let b = |name: &str| ctx.pair_barrier(step, name, deadline);
    let l = &ctx.listener;
    let m = &mut report.metrics;

    // listener timeout: nobody connects.
    let r = wait_out(l, seq(step, 1), wait, m);
    report.notes.push(format!(
        "wait with nobody connecting: {:?} after {:.1} ms",
        r.as_ref().err(),
        m[&LISTENER_TIMEOUT_MS]
    ));

    // no spurious timeout after success, even once the wait's deadline has long passed.
    let timed_out_before = l.stats().timed_out;
    let conn = l.wait_for(seq(step, 2), wait * 4)?;
    std::thread::sleep(wait * 5);
    m.insert(
        SPURIOUS_TIMEOUTS,
        (l.stats().timed_out - timed_out_before) as f64,
    );
    conn.send(b"still here", deadline)?;
    if conn.recv(deadline)?.payload != b"still here" {
        bail!("the connection that survived its wait's deadline corrupted data");
    }

    // late socket after timeout, then the next generation of the same sequence.
    let stale_before = l.stats().stale_dropped;
    if l.wait_for(seq(step, 3), wait).is_ok() {
        bail!("a wait for sequence 3 succeeded before its initiator was told to connect");
    }
    b("late-1")?;
    b("late-2")?;
    m.insert(
        STALE_DROPPED,
        (l.stats().stale_dropped - stale_before) as f64,
    );
    let next = l.wait_for(seq(step, 3), deadline)?;
    let first = next.recv(deadline)?;
    report.notes.push(format!(
        "next generation after the late socket: {:?}",
        String::from_utf8_lossy(&first.payload)
    ));

    // sequence reuse across two groups: each generation gets its own group's peer.
    let a = l.wait_for(seq(step, 4), deadline)?;
    let bconn = l.wait_for(seq(step, 4), deadline)?;
    let ok =
        (a.recv(deadline)?.payload == b"A") as u8 + (bconn.recv(deadline)?.payload == b"B") as u8;
    m.insert(REUSE_CONNECTIONS_OK, ok as f64);

    // duplicate pending wait: the second wait is refused, the first still completes.
    let dup = std::thread::scope(|s| -> Result<f64> {
        let first = s.spawn(|| l.wait_for(seq(step, 5), deadline));
        if !wait_until(|| l.stats().pending > 0, deadline) {
            bail!("the first wait never became pending");
        }
        let second = l.wait_for(seq(step, 5), deadline);
        let refused = matches!(second, Err(Error::DuplicateWait { .. }));
        b("dup")?;
        let conn = first
            .join()
            .map_err(|_| anyhow::anyhow!("first waiter panicked"))??;
        if conn.recv(deadline)?.payload != b"first waiter" {
            bail!("the first waiter got someone else's connection");
        }
        Ok(refused as u8 as f64)
    })?;
    m.insert(DUPLICATE_WAIT_REJECTED, dup);

    // shutdown with pending waiters: every one fails with ListenerClosed, promptly.
    let other = Arc::new(Listener::bind(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        ListenerOptions::new(ctx.token),
    )?);
    let waiters: Vec<_> = (0..3)
        .map(|n| {
            let other = Arc::clone(&other);
            std::thread::spawn(move || other.wait_for(n, deadline * 4))
        })
        .collect();
    if !wait_until(|| other.stats().pending == 3, deadline) {
        bail!("the three waits never became pending");
    }
    let started = Instant::now();
    other.shutdown();
    let mut failed = 0;
    for w in waiters {
        if matches!(w.join(), Ok(Err(Error::ListenerClosed))) {
            failed += 1;
        }
    }
    m.insert(SHUTDOWN_WAITERS_FAILED, failed as f64);
    m.insert(SHUTDOWN_RELEASE_MS, started.elapsed().as_secs_f64() * 1e3);
    // The three waits were pending when it shut down (or the step bailed above).
    report.reach(SHUTDOWN_WITH_WAITERS_PENDING);
    b("done")?;
    Ok(())
}

/// Wait on the listener for a connect nobody makes; record whether the wait timed out, and
/// after how long.
pub(super) fn wait_out(
    l: &Listener,
    sequence: u64,
    wait: Duration,
    m: &mut std::collections::BTreeMap<Metric, f64>,
) -> wringer_transport::Result<Connection> {
    let started = Instant::now();
    let r = l.wait_for(sequence, wait);
    m.insert(
        LISTENER_TIMEOUT_FIRED,
        matches!(r, Err(Error::Timeout { .. })) as u8 as f64,
    );
    m.insert(LISTENER_TIMEOUT_MS, started.elapsed().as_secs_f64() * 1e3);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn the_listener_cases_declare_their_evidence() {
        let s = accepted("lazy-connect: { wait_timeout: 200ms, deadline: 30s }", 2);
        assert!(s.metrics().contains(&SPURIOUS_TIMEOUTS));
        assert!(refused("lazy-connect: { wait_timeout: 200ms }", 2).contains("deadline"));
    }
}
