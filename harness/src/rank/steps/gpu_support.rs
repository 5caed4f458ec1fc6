//! What the GPU steps share: the plan, per-message pattern seeds, opening a GPU, tallies.

use crate::model::invalid::Invalid;
use std::time::Duration;

use anyhow::{Context, Result};
use wringer_transport::gpu::{inventory, pattern, DeviceBuffer, Gpu};

use crate::model::duration::HumanDuration;
use crate::model::metric::Series;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

crate::declare_metrics! {
    pub GPU_MESSAGES = "gpu_messages", Count, Neither;
    pub GPU_DATA_MISMATCHES = "gpu_data_mismatches", Count, Lower;
    pub GPU_PATTERN_HOST_MISMATCHES = "gpu_pattern_host_mismatches", Count, Lower;
    pub GPU_BANDWIDTH_GBPS = "gpu_bandwidth_gbps", GbitPerSecond, Higher;
}

/// What a GPU step does: ping-pong at each size, then `stream_messages` of the largest one
/// way, for bandwidth, over `fabric`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GpuParams {
    #[serde(default)]
    pub fabric: super::fabric::Fabric,
    pub sizes: Vec<u32>,
    pub iterations: u32,
    pub stream_messages: u32,
    pub deadline: HumanDuration,
}

impl GpuParams {
    pub(super) fn max(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(1) as usize
    }

    pub(super) fn check(&self) -> Result<(), Invalid> {
        super::check_sizes(&self.sizes, self.iterations)
    }
}

/// Receive slots of the RDMA stream: the sender may run this many messages ahead of the
/// receiver's verification, and no further (each verified message returns a credit).
pub(super) const SLOTS: usize = 4;

/// The pattern seed of one message: distinct per step, size, iteration and phase, so a message
/// delivered to the wrong place or twice is a mismatch.
pub(super) fn seed(ctx: &RankContext, step: usize, size: usize, n: u32, stream: bool) -> u64 {
    ctx.seed ^ (step as u64) << 56 ^ (stream as u64) << 55 ^ (size as u64) << 24 ^ n as u64
}

/// Open this rank's GPU (rank modulo the GPUs this host has, of whichever vendor) and note
/// what it is. AMD kernels are compiled once per architecture into the run folder.
pub(super) fn open(ctx: &RankContext, report: &mut StepReport) -> Result<Gpu> {
    let inv = inventory().context("this step needs a GPU (NVIDIA with CUDA, or AMD with HIP)")?;
    let ordinal = ctx.rank as usize % inv.devices.len().max(1);
    let cache = ctx.run_dir()?.join("gpu-kernels");
    let gpu = Gpu::open_with(inv, ordinal, Some(&cache)).context("opening the GPU")?;
    let i = gpu.info();
    report.notes.push(format!(
        "rank {} on GPU {} ({} {}, {}, {} MiB, {}, driver {})",
        ctx.rank,
        i.ordinal,
        i.vendor,
        i.name,
        i.arch,
        i.memory_bytes >> 20,
        gpu.runtime(),
        gpu.driver_version()
    ));
    Ok(gpu)
}

/// The device fill kernel against the host's reference, byte for byte (a wrong kernel would
/// otherwise verify its own wrong pattern).
pub(super) fn kernel_self_check(
    gpu: &Gpu,
    buf: &mut DeviceBuffer,
    len: usize,
    s: u64,
) -> Result<u64> {
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
pub(super) struct Tally {
    pub(super) messages: u32,
    pub(super) mismatches: u64,
    pub(super) host_mismatches: u64,
    pub(super) samples: std::collections::BTreeMap<u32, Vec<f64>>,
    pub(super) bandwidth_gbps: Option<f64>,
}

impl Tally {
    pub(super) fn into_report(self, report: &mut StepReport) {
        let m = &mut report.metrics;
        m.insert(GPU_MESSAGES, self.messages as f64);
        m.insert(GPU_DATA_MISMATCHES, self.mismatches as f64);
        m.insert(GPU_PATTERN_HOST_MISMATCHES, self.host_mismatches as f64);
        if let Some(bw) = self.bandwidth_gbps {
            m.insert(GPU_BANDWIDTH_GBPS, bw);
        }
        for (size, v) in self.samples {
            report.sample(Series::Latency, size as u64, v);
        }
    }
}

pub(super) fn gbps(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 * 8.0 / elapsed.as_secs_f64().max(1e-9) / 1e9
}

/// Mismatching bytes of a received message (a wrong length counts as all of it).
pub(super) fn verify(
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
