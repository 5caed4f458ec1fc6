//! GPU steps: ranks 0 and 1 move device buffers, over TCP (staged through pinned host memory)
//! or over an RC connection (GPU memory registered through dmabuf, or staged). The pattern is
//! written by a kernel on the sender's GPU and counted by a kernel on the receiver's, so a
//! round trip is verified where the data lives.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use transport::gpu::rdma::GpuRegion;
use transport::gpu::tcp::TcpStaging;
use transport::gpu::{inventory, pattern, DeviceBuffer, Gpu};
use transport::rdma::rc::{RcConnection, Received, RemoteRegion};
use transport::Connection;

use super::{connect_to, seq};
use crate::protocol::StepReport;
use crate::rank::Ctx;

/// What a GPU step does: ping-pong at each size, then a one-way stream of the largest.
pub struct Plan<'a> {
    pub sizes: &'a [u32],
    pub iterations: u32,
    pub stream_messages: u32,
}

impl Plan<'_> {
    fn max(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(1) as usize
    }
}

/// Receive slots of the RDMA stream: the sender may run this many messages ahead of the
/// receiver's verification, and no further (each verified message returns a credit).
const SLOTS: usize = 4;

/// The pattern seed of one message: distinct per step, size, iteration and phase, so a message
/// delivered to the wrong place or twice is a mismatch.
fn seed(ctx: &Ctx, step: usize, size: usize, n: u32, stream: bool) -> u64 {
    ctx.seed ^ (step as u64) << 56 ^ (stream as u64) << 55 ^ (size as u64) << 24 ^ n as u64
}

/// Open this rank's GPU (rank modulo the GPUs this host has) and note what it is.
fn open(ctx: &Ctx, report: &mut StepReport) -> Result<Gpu> {
    let count = inventory()
        .context("this step needs an NVIDIA GPU")?
        .devices
        .len();
    let gpu = Gpu::open(ctx.rank as usize % count).context("opening the GPU")?;
    let i = gpu.info();
    report.notes.push(format!(
        "rank {} on GPU {} ({}, {} MiB, compute {}.{}, CUDA driver {})",
        ctx.rank,
        i.ordinal,
        i.name,
        i.memory_bytes >> 20,
        i.compute_capability.0,
        i.compute_capability.1,
        gpu.driver_version()
    ));
    Ok(gpu)
}

/// The device fill kernel against the host's reference, byte for byte (a wrong kernel would
/// otherwise verify its own wrong pattern).
fn kernel_self_check(gpu: &Gpu, buf: &mut DeviceBuffer, len: usize, s: u64) -> Result<u64> {
    gpu.fill_pattern(buf, len, s)?;
    let mut host = vec![0u8; len];
    gpu.to_host(buf, &mut host)?;
    Ok(host
        .iter()
        .zip(pattern::bytes(s, len))
        .filter(|(a, b)| **a != *b)
        .count() as u64)
}

/// Counts and samples a step reports.
#[derive(Default)]
struct Tally {
    messages: u32,
    mismatches: u64,
    host_mismatches: u64,
    samples: std::collections::BTreeMap<u32, Vec<f64>>,
    bandwidth_gbps: Option<f64>,
}

impl Tally {
    fn into_report(self, report: &mut StepReport) {
        let m = &mut report.metrics;
        m.insert("gpu_messages".into(), self.messages as f64);
        m.insert("gpu_data_mismatches".into(), self.mismatches as f64);
        m.insert(
            "gpu_pattern_host_mismatches".into(),
            self.host_mismatches as f64,
        );
        if let Some(bw) = self.bandwidth_gbps {
            m.insert("gpu_bandwidth_gbps".into(), bw);
        }
        for (size, v) in self.samples {
            report.samples.insert(format!("latency_us/{size}"), v);
        }
    }
}

fn gbps(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 * 8.0 / elapsed.as_secs_f64().max(1e-9) / 1e9
}

pub fn tcp(
    ctx: &Ctx,
    step: usize,
    plan: &Plan,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank > 1 {
        return Ok(());
    }
    let gpu = open(ctx, report)?;
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
    for &size in plan.sizes {
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

/// Mismatching bytes of a received message (a wrong length counts as all of it).
fn verify(
    gpu: &Gpu,
    buf: &DeviceBuffer,
    offset: usize,
    got: usize,
    want: usize,
    s: u64,
) -> Result<u64> {
    if got != want {
        return Ok(want.max(got) as u64);
    }
    Ok(gpu.pattern_mismatches_at(buf, offset, got, s)?)
}

pub fn rdma(
    ctx: &Ctx,
    step: usize,
    plan: &Plan,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank > 1 {
        return Ok(());
    }
    let gpu = open(ctx, report)?;
    let max = plan.max();
    let mut c = super::rdma::pair(ctx, step, 64, deadline)?;
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
        "gpu_dmabuf".into(),
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
    for &size in plan.sizes {
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
    super::rdma::counts_into(&c, report);
    super::rdma::barrier(ctx, step, "gpu-done", deadline)?;
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
