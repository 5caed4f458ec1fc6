//! gpu-pingpong-tcp: ranks 0 and 1, each on a GPU: ping-pong of device buffers over TCP (staged through pinned host memory), the pattern written and checked on the device at every size; then `stream_messages` of the largest size one way, for bandwidth.

use crate::model::invalid::Invalid;
use super::gpu_support::{GPU_BANDWIDTH_GBPS, GPU_DATA_MISMATCHES, GPU_MESSAGES, GPU_PATTERN_HOST_MISMATCHES};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use wringer_transport::gpu::tcp::TcpStaging;
use wringer_transport::Connection;

use super::{connect_to, seq};
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::gpu_support::*;
use super::StepKind;
use crate::model::metric::{Metric, Series};
use crate::model::scenario::StepSpec;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(transparent)]
pub struct GpuPingpongTcp(pub GpuParams);

impl super::Describe for GpuPingpongTcp {
    const ABOUT: &'static str = "device buffers over TCP (pinned staging), checked on the GPU";
}

impl StepSpec for GpuPingpongTcp {
    fn requires(&self) -> Vec<crate::model::requirement::Requirement> {
        vec![crate::model::requirement::Requirement::Gpu]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            GPU_MESSAGES,
            GPU_DATA_MISMATCHES,
            GPU_PATTERN_HOST_MISMATCHES,
            GPU_BANDWIDTH_GBPS,
        ]
    }

    fn series(&self) -> &'static [Series] {
        &[Series::Latency]
    }

    fn deadline(&self) -> Duration {
        self.0.deadline.0
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        self.0.check()
    }
}

impl StepKind for GpuPingpongTcp {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        tcp(ctx, step, &self.0, report)
    }
}

pub fn tcp(ctx: &RankContext, step: usize, plan: &GpuParams, report: &mut StepReport) -> Result<()> {
    let deadline = plan.deadline.0;
    if !ctx.in_pair() {
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

#[cfg(test)]
mod tests {
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn sizes_and_iterations_are_checked() {
        let s = accepted("gpu-pingpong-tcp: { sizes: [64, 4096], iterations: 50, stream_messages: 32, deadline: 60s }", 2);
        assert!(!s.metrics().is_empty());
        assert!(refused("gpu-pingpong-tcp: { sizes: [64], iterations: 0, stream_messages: 32, deadline: 60s }", 2).contains("iterations"));
    }
}
