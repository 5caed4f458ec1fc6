//! rdma-peer-death: rank 1 streams SENDs to rank 0 and reports `mid-stream` (where faults strike); rank 0 must see the death within `detect_timeout`.

use crate::model::invalid::Invalid;
use super::support::{DETECT_MS, SURVIVOR_DETECTED};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use transport::rdma::rc::RdmaError;

use crate::rank::context::Ctx;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::rdma_support::*;
use super::StepKind;
use crate::model::duration::Dur;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaPeerDeath {
    pub frames_before_fault: u32,
    pub detect_timeout: Dur,
    pub deadline: Dur,
}

/// The point its ranks report, where a scenario's fault may strike.
const MID_STREAM: &str = "mid-stream";

impl super::Describe for RdmaPeerDeath {
    const ABOUT: &'static str = "an RDMA peer killed mid-stream; the survivor detects it";
}

impl StepSpec for RdmaPeerDeath {
    fn points(&self) -> Vec<String> {
        vec![MID_STREAM.into()]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[SURVIVOR_DETECTED, DETECT_MS]
    }

    fn deadline(&self) -> Duration {
        self.deadline.0
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        super::in_range("frames_before_fault", self.frames_before_fault, 0, super::MAX_COUNT)
    }
}

impl StepKind for RdmaPeerDeath {
    fn run(&self, ctx: &Ctx, step: usize, report: &mut StepReport) -> Result<()> {
        peer_death(
            ctx,
            step,
            self.frames_before_fault,
            self.detect_timeout.0,
            self.deadline.0,
            report,
        )
    }
}

pub fn peer_death(
    ctx: &Ctx,
    step: usize,
    frames_before_fault: u32,
    detect_timeout: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if !ctx.in_pair() {
        return Ok(());
    }
    let mut c = pair(ctx, step, 4096, deadline)?;
    let payload = vec![0xd1u8; 1024];
    if ctx.rank == 1 {
        for _ in 0..frames_before_fault {
            c.send(&payload, deadline)?;
        }
        ctx.control.point(step, MID_STREAM)?;
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if c.send(&payload, detect_timeout).is_err() {
                break;
            }
        }
        bail!("still alive at the end of the step: no fault struck at `mid-stream`");
    }
    let mut frames = 0u64;
    let mut last = Instant::now();
    let error = loop {
        match c.recv(detect_timeout) {
            Ok(_) => {
                frames += 1;
                last = Instant::now();
            }
            Err(e) => break e,
        }
    };
    let detect_ms = last.elapsed().as_secs_f64() * 1e3;
    report.metrics.insert(SURVIVOR_DETECTED, 1.0);
    report.metrics.insert(DETECT_MS, detect_ms);
    let how = match error {
        RdmaError::Disconnected => "rdma_cm DISCONNECTED".to_string(),
        e => e.to_string(),
    };
    report.notes.push(format!(
        "rank 0 received {frames} messages, then: {how} ({detect_ms:.1} ms after the last)"
    ));
    Ok(())
}
