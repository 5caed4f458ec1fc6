//! The GPU ping-pong over TCP (`gpu-pingpong` with `fabric: tcp`): device buffers staged through pinned host memory, the pattern written and checked on the device at every size; then `stream_messages` of the largest size one way, for bandwidth.

use std::time::Instant;

use anyhow::{bail, Result};
use wringer_transport::gpu::tcp::TcpStaging;
use wringer_transport::gpu::Gpu;
use wringer_transport::Connection;

use super::{connect_to, seq};
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

use super::gpu_support::*;

/// Rank 0 or 1 of the pair, on its opened GPU.
pub(super) fn gpu_over_tcp(
    ctx: &RankContext,
    step: usize,
    plan: &GpuParams,
    gpu: Gpu,
    report: &mut StepReport,
) -> Result<()> {
    let deadline = plan.deadline.0;
    report.notes.push(format!(
        "rank {}: TCP path: staged through pinned host memory",
        ctx.rank
    ));
    let conn: Connection = if ctx.rank == 1 {
        connect_to(ctx, 0, seq(step, 1), deadline)?
    } else {
        ctx.listener.wait_for(seq(step, 1), deadline)?
    };
    let max = plan.max();
    let mut staging = TcpStaging::new(&gpu, max)?;
    let (mut tx, mut rx) = (gpu.alloc(max)?, gpu.alloc(max)?);
    let mut t = Tally {
        host_mismatches: kernel_self_check(&gpu, &mut tx, max.min(1 << 20), ctx.seed)?,
        ..Tally::default()
    };
    for &size in &plan.sizes {
        let size = size as usize;
        for it in 0..plan.iterations {
            let s = seed(ctx, step, size, it, false);
            if ctx.rank == 1 {
                gpu.fill_pattern(&mut tx, size, s)?;
                let started = Instant::now();
                staging.send(&gpu, &conn, &tx, size, deadline)?;
                let n = staging.recv(&gpu, &conn, &mut rx, deadline)?;
                let rtt = started.elapsed();
                t.samples
                    .entry(size as u32)
                    .or_default()
                    .push(rtt.as_secs_f64() * 1e6 / 2.0);
                t.mismatches += verify(&gpu, &rx, 0, n, size, s)?;
            } else {
                let n = staging.recv(&gpu, &conn, &mut rx, deadline)?;
                t.mismatches += verify(&gpu, &rx, 0, n, size, s)?;
                staging.send(&gpu, &conn, &rx, n, deadline)?;
            }
            t.messages += 1;
        }
    }
    // One way, back to back; the receiver verifies every message, then acknowledges the lot.
    if ctx.rank == 1 {
        let started = Instant::now();
        for k in 0..plan.stream_messages {
            gpu.fill_pattern(&mut tx, max, seed(ctx, step, max, k, true))?;
            staging.send(&gpu, &conn, &tx, max, deadline)?;
        }
        let ack = conn.recv(deadline)?;
        if ack.payload != b"verified" {
            bail!(
                "expected the stream acknowledgement, got {} bytes",
                ack.payload.len()
            );
        }
        t.bandwidth_gbps = Some(gbps(max * plan.stream_messages as usize, started.elapsed()));
    } else {
        for k in 0..plan.stream_messages {
            let n = staging.recv(&gpu, &conn, &mut rx, deadline)?;
            t.mismatches += verify(&gpu, &rx, 0, n, max, seed(ctx, step, max, k, true))?;
        }
        conn.send(b"verified", deadline)?;
    }
    t.messages += plan.stream_messages;
    conn.close()?;
    t.into_report(report);
    Ok(())
}
