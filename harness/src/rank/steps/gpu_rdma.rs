//! The GPU ping-pong over RDMA (`gpu-pingpong` with `fabric: rdma`): an RC connection with RDMA WRITE, GPU memory registered through dmabuf where the GPU and NIC allow it, else staged through pinned host memory.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use wringer_transport::gpu::rdma::GpuRegion;
use wringer_transport::gpu::Gpu;
use wringer_transport::rdma::rc::{RcConnection, Received, RemoteRegion};

use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

use super::gpu_support::*;

crate::declare_metrics! {
    pub GPU_DMABUF = "gpu_dmabuf", Flag, Neither;
}

/// Rank 0 or 1 of the pair, on its opened GPU.
pub(super) fn gpu_over_rdma(
    ctx: &RankContext,
    step: usize,
    plan: &GpuParams,
    gpu: Gpu,
    report: &mut StepReport,
) -> Result<()> {
    let deadline = plan.deadline.0;
    let max = plan.max();
    let mut c = super::rdma_support::pair(ctx, step, 64, deadline)?;
    // The regions go before the connection (declared after it, dropped first).
    let mut tx = GpuRegion::new(&gpu, &mut c, max)?;
    let mut rx = GpuRegion::new(&gpu, &mut c, max * SLOTS)?;
    report.notes.push(format!(
        "rank {}: send region: {}; receive region: {}",
        ctx.rank,
        tx.path(),
        rx.path()
    ));
    report.metrics.insert(
        GPU_DMABUF,
        (tx.path().is_dmabuf() && rx.path().is_dmabuf()) as u8 as f64,
    );
    c.send(&rx.remote().to_bytes(), deadline)?;
    let peer = match c.recv(deadline)? {
        Received::Message(m) => {
            RemoteRegion::from_bytes(&m).context("the peer's region advert is not 16 bytes")?
        }
        other => bail!("expected the peer's region advert, got {other:?}"),
    };
    let mut t = Tally {
        host_mismatches: kernel_self_check(&gpu, tx.device_mut(), max.min(1 << 20), ctx.seed)?,
        ..Tally::default()
    };
    for &size in &plan.sizes {
        let size = size as usize;
        for it in 0..plan.iterations {
            let s = seed(ctx, step, size, it, false);
            if ctx.rank == 1 {
                gpu.fill_pattern(tx.device_mut(), size, s)?;
                let started = Instant::now();
                tx.write_to(&gpu, &mut c, size, &peer, 0, it, deadline)?;
                let n = landed(&gpu, &mut c, &mut rx, it, 0, deadline)?;
                let rtt = started.elapsed();
                t.samples
                    .entry(size as u32)
                    .or_default()
                    .push(rtt.as_secs_f64() * 1e6 / 2.0);
                t.mismatches += verify(&gpu, rx.device(), 0, n, size, s)?;
            } else {
                let n = landed(&gpu, &mut c, &mut rx, it, 0, deadline)?;
                t.mismatches += verify(&gpu, rx.device(), 0, n, size, s)?;
                // Echo from the device buffer the bytes landed in.
                rx.write_to(&gpu, &mut c, n, &peer, 0, it, deadline)?;
            }
            t.messages += 1;
        }
    }
    if ctx.rank == 1 {
        let started = Instant::now();
        let (mut credits, mut returned) = (SLOTS, 0u32);
        for k in 0..plan.stream_messages {
            if credits == 0 {
                await_credit(&mut c, deadline)?;
                (credits, returned) = (credits + 1, returned + 1);
            }
            gpu.fill_pattern(tx.device_mut(), max, seed(ctx, step, max, k, true))?;
            let offset = (k as usize % SLOTS * max) as u64;
            tx.write_to(&gpu, &mut c, max, &peer, offset, k, deadline)?;
            credits -= 1;
        }
        while returned < plan.stream_messages {
            await_credit(&mut c, deadline)?;
            returned += 1;
        }
        t.bandwidth_gbps = Some(gbps(max * plan.stream_messages as usize, started.elapsed()));
    } else {
        for k in 0..plan.stream_messages {
            let offset = k as usize % SLOTS * max;
            let n = landed(&gpu, &mut c, &mut rx, k, offset, deadline)?;
            t.mismatches += verify(
                &gpu,
                rx.device(),
                offset,
                n,
                max,
                seed(ctx, step, max, k, true),
            )?;
            c.send(b"credit", deadline)?;
        }
    }
    t.messages += plan.stream_messages;
    super::rdma_support::counts_into(&c, report);
    ctx.pair_barrier(step, "gpu-done", deadline)?;
    drop((tx, rx));
    t.into_report(report);
    Ok(())
}

/// Wait for the peer's write number `imm` into `rx` at `offset`, and bring it to the device.
fn landed(
    gpu: &Gpu,
    c: &mut RcConnection,
    rx: &mut GpuRegion,
    imm: u32,
    offset: usize,
    deadline: Duration,
) -> Result<usize> {
    match c.recv(deadline)? {
        Received::WrittenToRegion { imm: got, len } if got == imm => {
            rx.landed(gpu, offset, len)?;
            Ok(len)
        }
        other => bail!("expected region write {imm}, got {other:?}"),
    }
}

fn await_credit(c: &mut RcConnection, deadline: Duration) -> Result<()> {
    match c.recv(deadline)? {
        Received::Message(m) if m == b"credit" => Ok(()),
        other => bail!("expected a stream credit, got {other:?}"),
    }
}
