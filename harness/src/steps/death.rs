//! Peer death: a rank killed or frozen mid-stream, and a rank that exits before the first
//! exchange of a lazily connected group (seed 003's #520 repro).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use transport::Connection;

use super::{connect_to, seq};
use crate::protocol::{RankMsg, StepReport};
use crate::rank::Ctx;

pub fn peer_death(
    ctx: &Ctx,
    step: usize,
    victim: u32,
    frames_before_fault: u32,
    detect_timeout: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let end = Instant::now() + deadline;
    let payload = vec![0xd1u8; 1024];
    match ctx.rank {
        r if r == victim => {
            let conn = connect_to(ctx, 0, seq(step, 0), deadline)?;
            for _ in 0..frames_before_fault {
                conn.send(&payload, deadline)?;
            }
            ctx.control.point(step, "mid-stream")?;
            // Keep streaming until the fault strikes (or the peer gives up on us).
            while Instant::now() < end {
                if conn.send(&payload, detect_timeout).is_err() {
                    break;
                }
            }
            bail!("still alive at the end of the step: no fault struck at `mid-stream`");
        }
        0 => {
            let conn = ctx.listener.wait_for(seq(step, 0), deadline)?;
            let mut frames = 0u64;
            let mut last_ok = Instant::now();
            let error = loop {
                match conn.recv(detect_timeout) {
                    Ok(_) => {
                        frames += 1;
                        last_ok = Instant::now();
                    }
                    Err(e) => break e,
                }
                if Instant::now() > end {
                    bail!("the peer kept sending for the whole step");
                }
            };
            let detect_ms = last_ok.elapsed().as_secs_f64() * 1e3;
            report.metrics.insert("survivor_detected".into(), 1.0);
            report.metrics.insert("detect_ms".into(), detect_ms);
            report.notes.push(format!("rank 0 received {frames} frames, then: {error} ({detect_ms:.1} ms after the last frame)"));
        }
        _ => {}
    }
    Ok(())
}

pub fn exit_before_first_exchange(
    ctx: &Ctx,
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
    let started = Instant::now();
    // Full mesh, lazily: connect to higher ranks, wait for lower ones; all at once.
    let ranks = ctx.ranks;
    let outcome: Result<Vec<Connection>, String> = std::thread::scope(|s| {
        let initiators: Vec<_> = (ctx.rank + 1..ranks)
            .map(|peer| {
                s.spawn(move || {
                    connect_to(ctx, peer, seq(step, ctx.rank as u64), connect_timeout)
                        .map_err(|e| format!("connect to rank {peer}: {e}"))
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
                    first_error.get_or_insert(format!("wait for rank {peer}: {e}"));
                }
            }
        }
        for h in initiators {
            match h
                .join()
                .unwrap_or_else(|_| Err("connect thread panicked".into()))
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
        Err(e) => Some(e),
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
            report.metrics.insert("survivor_detected".into(), 1.0);
            report.metrics.insert("detect_ms".into(), detect_ms);
            report
                .notes
                .push(format!("rank {}: {e} after {detect_ms:.0} ms", ctx.rank));
        }
        None => {
            report.metrics.insert("survivor_detected".into(), 0.0);
            report.notes.push(format!(
                "rank {}: the first exchange completed without rank {exiting}",
                ctx.rank
            ));
        }
    }
    Ok(())
}
