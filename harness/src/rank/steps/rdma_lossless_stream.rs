//! rdma-lossless-stream: rank 1 SENDs `messages` messages of `size` bytes to rank 0, which counts and checks them.

use super::rdma_support::{
    RDMA_COMPLETION_ERRORS, RDMA_RX_MESSAGES, RDMA_TX_MESSAGES, RETRY_EXC_ERR,
};
use crate::model::invalid::Invalid;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use wringer_transport::rdma::rc::Received;

use super::pattern;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::rdma_support::*;
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub RDMA_RX_BYTES = "rdma_rx_bytes", Bytes, Neither;
    pub RDMA_DROPPED = "rdma_dropped", Count, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaLosslessStream {
    pub messages: u32,
    pub size: u32,
    pub deadline: HumanDuration,
}

impl super::Describe for RdmaLosslessStream {
    const ABOUT: &'static str = "SENDs counted and checked, completion errors by status";
}

impl StepSpec for RdmaLosslessStream {
    fn requires(&self) -> Vec<crate::model::requirement::Requirement> {
        vec![crate::model::requirement::Requirement::Rdma]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            RDMA_TX_MESSAGES,
            RDMA_RX_MESSAGES,
            RDMA_RX_BYTES,
            RDMA_DROPPED,
            RDMA_COMPLETION_ERRORS,
            RETRY_EXC_ERR,
        ]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        super::in_range("size", self.size, 1, super::MAX_MESSAGE)?;
        super::in_range("messages", self.messages, 1, super::MAX_COUNT)
    }
}

impl StepKind for RdmaLosslessStream {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        stream(ctx, step, self.messages, self.size, self.deadline.0, report)
    }
}

pub fn stream(
    ctx: &RankContext,
    step: usize,
    messages: u32,
    size: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if !ctx.in_pair() {
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
        report.metrics.insert(RDMA_TX_MESSAGES, sent as f64);
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
        report.metrics.insert(RDMA_RX_MESSAGES, received as f64);
        report.metrics.insert(RDMA_RX_BYTES, bytes as f64);
        report
            .metrics
            .insert(RDMA_DROPPED, (messages - received + corrupt) as f64);
    }
    counts_into(&c, report);
    ctx.pair_barrier(step, "done", deadline)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn message_sizes_are_bounded() {
        let s = accepted(
            "rdma-lossless-stream: { messages: 300, size: 4096, deadline: 90s }",
            2,
        );
        assert!(s.metrics().contains(&RDMA_DROPPED));
        assert!(refused(
            "rdma-lossless-stream: { messages: 300, size: 33554432, deadline: 90s }",
            2
        )
        .contains("size"));
    }
}
