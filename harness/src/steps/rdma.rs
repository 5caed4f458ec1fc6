//! RDMA steps: RC connections over rdma_cm between rank 0 (server) and rank 1 (client), on the
//! first active RoCE interface each rank found.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use transport::rdma::discovery::{discover, GidType, PortState};
use transport::rdma::rc::{connect, RcConnection, RcListener, RcOptions, Received};

use super::pattern;
use crate::protocol::StepReport;
use crate::rank::Ctx;

/// This host's first active RoCE v2 address (IPv4), if it has RDMA at all.
pub fn local_address() -> Option<IpAddr> {
    let devices = discover(Path::new("/sys")).ok()?;
    devices
        .iter()
        .flat_map(|d| d.ports.iter())
        .filter(|p| p.state == PortState::Active)
        .flat_map(|p| p.gids.iter())
        .find(|g| g.kind == GidType::RoceV2 && matches!(g.ip, Some(IpAddr::V4(_))))
        .and_then(|g| g.ip)
}

/// rdma_cm port for a step: distinct per step, so a listener of an earlier step never answers.
fn port(step: usize) -> u16 {
    7471 + step as u16
}

fn options(max: u32, deadline: Duration) -> RcOptions {
    RcOptions {
        max_message: (max as usize).max(64),
        recv_depth: 16,
        timeout: deadline,
    }
}

/// Rank 0 accepts, rank 1 connects; the barrier makes sure the listener exists first.
fn pair(ctx: &Ctx, step: usize, max: u32, deadline: Duration) -> Result<RcConnection> {
    let server = ctx.peers[0]
        .rdma
        .context("rank 0 has no active RoCE interface")?;
    let addr = SocketAddr::new(server, port(step));
    let opts = options(max, deadline);
    if ctx.rank == 0 {
        let listener =
            RcListener::bind(addr, opts).with_context(|| format!("rdma_cm listen on {addr}"))?;
        ctx.control
            .barrier(&format!("rdma-{step}-listening"), 2, deadline)?;
        Ok(listener
            .accept(deadline)
            .context("accepting the RC connection")?)
    } else {
        ctx.control
            .barrier(&format!("rdma-{step}-listening"), 2, deadline)?;
        Ok(connect(addr, opts).with_context(|| format!("connecting to {addr}"))?)
    }
}

fn counts_into(c: &RcConnection, report: &mut StepReport) {
    report
        .metrics
        .insert("rdma_completion_errors".into(), c.counts().errors() as f64);
    report.metrics.insert(
        "retry_exc_err".into(),
        c.counts().get("RETRY_EXC_ERR") as f64,
    );
    report
        .notes
        .push(format!("rank completions by status: {:?}", c.counts().0));
}

pub fn pingpong(
    ctx: &Ctx,
    step: usize,
    sizes: &[u32],
    iterations: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank > 1 {
        return Ok(());
    }
    let max = sizes.iter().copied().max().unwrap_or(64);
    let mut c = pair(ctx, step, max, deadline)?;
    let (mut messages, mut mismatches) = (0u32, 0u32);
    for &size in sizes {
        for (kind, write) in [("send", false), ("write", true)] {
            let mut samples = vec![];
            for it in 0..iterations {
                let expected = pattern(
                    ctx.seed,
                    (size as u64) << 20 | it as u64 | (write as u64) << 60,
                    size as usize,
                );
                if ctx.rank == 1 {
                    let started = Instant::now();
                    if write {
                        c.write_imm(&expected, it, deadline)?;
                    } else {
                        c.send(&expected, deadline)?;
                    }
                    let back = c.recv(deadline)?;
                    samples.push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
                    mismatches += !matches_payload(&back, &expected, write, it) as u32;
                } else {
                    let got = c.recv(deadline)?;
                    mismatches += !matches_payload(&got, &expected, write, it) as u32;
                    if write {
                        c.write_imm(&expected, it, deadline)?;
                    } else {
                        c.send(&expected, deadline)?;
                    }
                }
                messages += 1;
            }
            if !samples.is_empty() {
                let series = if write {
                    "write_latency_us"
                } else {
                    "latency_us"
                };
                report.samples.insert(format!("{series}/{size}"), samples);
            }
            let _ = kind;
        }
    }
    report
        .metrics
        .insert("rdma_messages".into(), messages as f64);
    report
        .metrics
        .insert("rdma_data_mismatches".into(), mismatches as f64);
    counts_into(&c, report);
    ctx.control
        .barrier(&format!("rdma-{step}-done"), 2, deadline)?;
    Ok(())
}

fn matches_payload(got: &Received, expected: &[u8], write: bool, it: u32) -> bool {
    match got {
        Received::Message(m) => !write && m == expected,
        Received::Written { imm, data } => write && *imm == it && data == expected,
    }
}

pub fn stream(
    ctx: &Ctx,
    step: usize,
    messages: u32,
    size: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank > 1 {
        return Ok(());
    }
    let mut c = pair(ctx, step, size, deadline)?;
    let end = Instant::now() + deadline;
    if ctx.rank == 1 {
        let mut sent = 0u32;
        for i in 0..messages {
            c.send(
                &pattern(ctx.seed, i as u64, size as usize),
                end.saturating_duration_since(Instant::now()),
            )?;
            sent += 1;
        }
        report
            .metrics
            .insert("rdma_tx_messages".into(), sent as f64);
    } else {
        let (mut received, mut bytes, mut corrupt) = (0u32, 0u64, 0u32);
        while received < messages {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("only {received} of {messages} messages arrived within the step deadline");
            }
            match c.recv(left)? {
                Received::Message(m) => {
                    corrupt += (m != pattern(ctx.seed, received as u64, size as usize)) as u32;
                    bytes += m.len() as u64;
                    received += 1;
                }
                other => bail!("unexpected {other:?} in a SEND stream"),
            }
        }
        report
            .metrics
            .insert("rdma_rx_messages".into(), received as f64);
        report.metrics.insert("rdma_rx_bytes".into(), bytes as f64);
        report.metrics.insert(
            "rdma_dropped".into(),
            (messages - received + corrupt) as f64,
        );
    }
    counts_into(&c, report);
    ctx.control
        .barrier(&format!("rdma-{step}-done"), 2, deadline)?;
    Ok(())
}
