//! rdma-pingpong: RC over rdma_cm between rank 0 (server) and rank 1: SEND ping-pong, then WRITE with immediate ping-pong, then WRITE into registered regions, at every size, every byte checked.

use crate::model::invalid::Invalid;
use super::rdma_support::{RDMA_COMPLETION_ERRORS, RDMA_DATA_MISMATCHES, RETRY_EXC_ERR};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use wringer_transport::rdma::rc::{RcConnection, Received, RemoteRegion};

use super::pattern;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::rdma_support::*;
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::{Metric, Series};
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub RDMA_MESSAGES = "rdma_messages", Count, Neither;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaPingpong {
    pub sizes: Vec<u32>,
    pub iterations: u32,
    pub deadline: HumanDuration,
}

impl super::Describe for RdmaPingpong {
    const ABOUT: &'static str = "RC SEND, WRITE with immediate and registered-region WRITE ping-pong";
}

impl StepSpec for RdmaPingpong {
    fn metrics(&self) -> &'static [Metric] {
        &[
            RDMA_MESSAGES,
            RDMA_DATA_MISMATCHES,
            RDMA_COMPLETION_ERRORS,
            RETRY_EXC_ERR,
        ]
    }

    fn series(&self) -> &'static [Series] {
        &[
            Series::Latency,
            Series::WriteLatency,
            Series::RegionWriteLatency,
        ]
    }

    fn deadline(&self) -> Duration {
        self.deadline.0
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        super::check_sizes(&self.sizes, self.iterations)
    }
}

impl StepKind for RdmaPingpong {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        pingpong(
            ctx,
            step,
            &self.sizes,
            self.iterations,
            self.deadline.0,
            report,
        )
    }
}

pub fn pingpong(
    ctx: &RankContext,
    step: usize,
    sizes: &[u32],
    iterations: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if !ctx.in_pair() {
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
                    Series::WriteLatency
                } else {
                    Series::Latency
                };
                report.sample(series, size as u64, samples);
            }
            let _ = kind;
        }
    }
    let (m, bad) = region_pingpong(ctx, &mut c, sizes, iterations, deadline, report)?;
    messages += m;
    mismatches += bad;
    report.metrics.insert(RDMA_MESSAGES, messages as f64);
    report
        .metrics
        .insert(RDMA_DATA_MISMATCHES, mismatches as f64);
    counts_into(&c, report);
    ctx.pair_barrier(step, "done", deadline)?;
    Ok(())
}

/// Ping-pong by RDMA WRITE between memory the step owns and registered itself (the path GPU
/// buffers take when staged): the receiver finds the bytes in its own region, nothing copied.
fn region_pingpong(
    ctx: &RankContext,
    c: &mut RcConnection,
    sizes: &[u32],
    iterations: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<(u32, u32)> {
    let max = sizes.iter().copied().max().unwrap_or(64) as usize;
    // Each side writes from its first half into the peer's second half; every message has its
    // own pattern, so stale bytes from an earlier one never pass for a new one.
    let mut memory = vec![0u8; 2 * max].into_boxed_slice();
    // SAFETY: `memory` is a boxed slice that neither moves nor is freed before `region`, which
    // is dropped at the end of this function, before `memory`.
    let region = unsafe { c.register_host(memory.as_mut_ptr(), 2 * max) }?;
    c.send(&region.remote().to_bytes(), deadline)?;
    let peer = match c.recv(deadline)? {
        Received::Message(m) => RemoteRegion::from_bytes(&m).context("region advert")?,
        other => bail!("expected the peer's region advert, got {other:?}"),
    };
    let (mut messages, mut mismatches) = (0, 0);
    for &size in sizes {
        let size = size as usize;
        let mut samples = vec![];
        for it in 0..iterations {
            let expected = pattern(ctx.seed, (size as u64) << 20 | it as u64 | 3 << 60, size);
            let started = Instant::now();
            if ctx.rank == 1 {
                memory[..size].copy_from_slice(&expected);
                c.write_region_imm(&region, 0, size, &peer, max as u64, it, deadline)?;
            }
            let got = c.recv(deadline)?;
            // The bytes landed before the WRITE_WITH_IMM's receive completed.
            let ok = got == Received::WrittenToRegion { imm: it, len: size }
                && memory[max..max + size] == expected[..];
            mismatches += !ok as u32;
            if ctx.rank == 1 {
                samples.push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
            } else {
                // Echo the bytes from where they landed.
                c.write_region_imm(&region, max, size, &peer, max as u64, it, deadline)?;
            }
            messages += 1;
        }
        if !samples.is_empty() {
            report.sample(Series::RegionWriteLatency, size as u64, samples);
        }
    }
    drop(region);
    Ok((messages, mismatches))
}

fn matches_payload(got: &Received, expected: &[u8], write: bool, it: u32) -> bool {
    match got {
        Received::Message(m) => !write && m == expected,
        Received::Written { imm, data } => write && *imm == it && data == expected,
        Received::WrittenToRegion { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn three_series_and_checked_sizes() {
        let s = accepted("rdma-pingpong: { sizes: [64, 4096, 65536], iterations: 20, deadline: 90s }", 2);
        assert_eq!(s.series().len(), 3, "SEND, WRITE with immediate, region WRITE");
        assert!(refused("rdma-pingpong: { sizes: [64], iterations: 0, deadline: 90s }", 2).contains("iterations"));
    }
}
