//! lazy-connect: Gloo's listener cases between rank 0 (listener) and rank 1 (initiator),
//! ordered with barriers. Each case reports what happened; the coordinator judges it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use transport::{
    connect, ConnectOptions, Connection, Error, Hello, Listener, ListenerOptions, RejectReason,
};

use super::seq;
use crate::procfs::wait_until;
use crate::protocol::StepReport;
use crate::rank::Ctx;

pub fn run(
    ctx: &Ctx,
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

fn initiate(
    ctx: &Ctx,
    step: usize,
    n: u64,
    generation: u64,
    deadline: Duration,
) -> transport::Result<Connection> {
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

/// The two sides of this step meet at named points so each case runs in order.
fn barrier(ctx: &Ctx, step: usize, name: &str, deadline: Duration) -> Result<()> {
    ctx.control
        .barrier(&format!("lazy-{step}-{name}"), 2, deadline)
}

fn initiator_side(
    ctx: &Ctx,
    step: usize,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let b = |name: &str| barrier(ctx, step, name, deadline);
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
        .insert("late_socket_rejected".into(), rejected as u8 as f64);
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
    ctx: &Ctx,
    step: usize,
    wait: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let b = |name: &str| barrier(ctx, step, name, deadline);
    let l = &ctx.listener;
    let m = &mut report.metrics;

    // listener timeout: nobody connects.
    let started = Instant::now();
    let r = l.wait_for(seq(step, 1), wait);
    m.insert(
        "listener_timeout_fired".into(),
        matches!(r, Err(Error::Timeout { .. })) as u8 as f64,
    );
    m.insert(
        "listener_timeout_ms".into(),
        started.elapsed().as_secs_f64() * 1e3,
    );
    report.notes.push(format!(
        "wait with nobody connecting: {:?} after {:?}",
        r.as_ref().err(),
        started.elapsed()
    ));

    // no spurious timeout after success, even once the wait's deadline has long passed.
    let timed_out_before = l.stats().timed_out;
    let conn = l.wait_for(seq(step, 2), wait * 4)?;
    std::thread::sleep(wait * 5);
    m.insert(
        "spurious_timeouts".into(),
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
        "stale_dropped".into(),
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
    m.insert("reuse_connections_ok".into(), ok as f64);

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
    m.insert("duplicate_wait_rejected".into(), dup);

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
    m.insert("shutdown_waiters_failed".into(), failed as f64);
    m.insert(
        "shutdown_release_ms".into(),
        started.elapsed().as_secs_f64() * 1e3,
    );
    b("done")?;
    Ok(())
}

/// A partition during a lazy connect: the initiator's host loses its data link just before it
/// connects. The listener's wait must time out once, on time; the initiator's connect must give
/// up at its deadline.
pub fn partition(
    ctx: &Ctx,
    step: usize,
    wait: Duration,
    connect_deadline: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let m = &mut report.metrics;
    match ctx.rank {
        0 => {
            let started = Instant::now();
            let r = ctx.listener.wait_for(seq(step, 0), wait);
            m.insert(
                "listener_timeout_fired".into(),
                matches!(r, Err(Error::Timeout { .. })) as u8 as f64,
            );
            m.insert(
                "listener_timeout_ms".into(),
                started.elapsed().as_secs_f64() * 1e3,
            );
            report
                .notes
                .push(format!("listener wait across the partition: {:?}", r.err()));
        }
        1 => {
            ctx.control.point_and_wait(step, "partitioned", deadline)?;
            let started = Instant::now();
            let r = initiate(ctx, step, 0, 0, connect_deadline);
            let failed = r.is_err();
            m.insert("initiator_connect_failed".into(), failed as u8 as f64);
            m.insert(
                "connect_fail_ms".into(),
                started.elapsed().as_secs_f64() * 1e3,
            );
            report.notes.push(format!(
                "initiator connect across the partition: {:?}",
                r.err()
            ));
        }
        _ => {}
    }
    Ok(())
}
