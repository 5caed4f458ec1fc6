//! gpu-pingpong: ranks 0 and 1, each on a GPU: ping-pong of device buffers, the pattern
//! written and checked on the device at every size; then `stream_messages` of the largest size
//! one way, for bandwidth. `fabric: tcp` stages through pinned host memory (`gpu_tcp`);
//! `fabric: rdma` writes with RDMA WRITE, registering GPU memory through dmabuf where it can
//! (`gpu_rdma`).

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::fabric::Fabric;
use super::gpu_rdma::GPU_DMABUF;
use super::gpu_support::*;
use super::rdma_support::{RDMA_COMPLETION_ERRORS, RETRY_EXC_ERR};
use super::StepKind;
use crate::model::invalid::Invalid;
use crate::model::metric::{Metric, Series};
use crate::model::requirement::Requirement;
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(transparent)]
pub struct GpuPingpong(pub GpuParams);

impl std::ops::Deref for GpuPingpong {
    type Target = GpuParams;

    fn deref(&self) -> &GpuParams {
        &self.0
    }
}

impl super::Describe for GpuPingpong {
    const ABOUT: &'static str =
        "device buffers over TCP (pinned staging) or RC WRITE (dmabuf or staged), checked on the GPU";
}

impl StepSpec for GpuPingpong {
    fn requires(&self) -> Vec<Requirement> {
        match self.0.fabric {
            Fabric::Tcp => vec![Requirement::Gpu],
            Fabric::Rdma => vec![Requirement::Gpu, Requirement::Rdma],
        }
    }

    fn metrics(&self) -> &'static [Metric] {
        match self.0.fabric {
            Fabric::Tcp => &[
                GPU_MESSAGES,
                GPU_DATA_MISMATCHES,
                GPU_PATTERN_HOST_MISMATCHES,
                GPU_BANDWIDTH_GBPS,
            ],
            Fabric::Rdma => &[
                GPU_MESSAGES,
                GPU_DATA_MISMATCHES,
                GPU_PATTERN_HOST_MISMATCHES,
                GPU_BANDWIDTH_GBPS,
                GPU_DMABUF,
                RDMA_COMPLETION_ERRORS,
                RETRY_EXC_ERR,
            ],
        }
    }

    fn series(&self) -> &'static [Series] {
        &[Series::Latency]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        self.0.check()
    }
}

impl StepKind for GpuPingpong {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        if !ctx.in_pair() {
            return Ok(());
        }
        let gpu = open(ctx, report)?;
        match self.0.fabric {
            Fabric::Tcp => super::gpu_tcp::gpu_over_tcp(ctx, step, &self.0, gpu, report),
            Fabric::Rdma => super::gpu_rdma::gpu_over_rdma(ctx, step, &self.0, gpu, report),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn the_fabric_decides_what_it_requires_and_records() {
        let tcp = accepted(
            "gpu-pingpong: { sizes: [64, 4096], iterations: 50, stream_messages: 32, deadline: 60s }",
            2,
        );
        assert_eq!(tcp.requires(), vec![Requirement::Gpu]);
        assert!(!tcp.metrics().contains(&GPU_DMABUF));
        let rdma = accepted(
            "gpu-pingpong: { fabric: rdma, sizes: [64], iterations: 5, stream_messages: 4, deadline: 60s }",
            2,
        );
        assert_eq!(rdma.requires(), vec![Requirement::Gpu, Requirement::Rdma]);
        assert!(rdma.metrics().contains(&GPU_DMABUF));
    }

    #[test]
    fn sizes_iterations_and_the_fabric_are_checked() {
        let base = "sizes: [64], stream_messages: 32, deadline: 60s";
        assert!(
            refused(&format!("gpu-pingpong: {{ {base}, iterations: 0 }}"), 2)
                .contains("iterations")
        );
        assert!(refused(
            "gpu-pingpong: { sizes: [], iterations: 50, stream_messages: 32, deadline: 60s }",
            2
        )
        .contains("size"));
        assert!(refused(
            &format!("gpu-pingpong: {{ {base}, iterations: 5, fabric: ib }}"),
            2
        )
        .contains("fabric"));
    }

    #[test]
    fn the_old_kinds_say_what_to_write() {
        let why = refused(
            "gpu-pingpong-rdma: { sizes: [64], iterations: 5, stream_messages: 4, deadline: 60s }",
            2,
        );
        assert!(why.contains("`gpu-pingpong` with `fabric: rdma`"), "{why}");
    }
}
