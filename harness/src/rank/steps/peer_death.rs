//! peer-death: rank `victim` streams to rank 0 and reports the point `mid-stream`, where faults strike; rank 0 must see the death within `detect_timeout`.

use crate::model::invalid::Invalid;
use super::support::{DETECT_MS, SURVIVOR_DETECTED};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::{connect_to, seq};
use crate::rank::context::Ctx;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::StepKind;
use crate::model::duration::Dur;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PeerDeath {
    pub victim: u32,
    pub frames_before_fault: u32,
    pub detect_timeout: Dur,
    pub deadline: Dur,
}

/// The point its ranks report, where a scenario's fault may strike.
const MID_STREAM: &str = "mid-stream";

impl super::Describe for PeerDeath {
    const ABOUT: &'static str = "a streaming peer killed or frozen; the survivor detects it in time";
}

impl StepSpec for PeerDeath {
    fn points(&self) -> Vec<String> {
        vec![MID_STREAM.into()]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[SURVIVOR_DETECTED, DETECT_MS]
    }

    fn deadline(&self) -> Duration {
        self.deadline.0
    }

    fn check(&self, ranks: u32) -> Result<(), Invalid> {
        if self.victim == 0 || self.victim >= ranks {
            return Err(format!(
                "victim must be a rank other than 0 (1..{ranks}), got {}",
                self.victim
            ).into());
        }
        super::in_range("frames_before_fault", self.frames_before_fault, 0, super::MAX_COUNT)
    }
}

impl StepKind for PeerDeath {
    fn run(&self, ctx: &Ctx, step: usize, report: &mut StepReport) -> Result<()> {
        peer_death(
            ctx,
            step,
            self.victim,
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
    victim: u32,
    frames_before_fault: u32,
    detect_timeout: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let end = Instant::now() + deadline;
    let payload = vec![0xd1u8; 1024];
    match ctx.rank {
        r if r == victim => {
            let conn = connect_to(ctx, 0, seq(step, 0), deadline)?;
            for _ in 0..frames_before_fault {
                conn.send(&payload, deadline)?;
            }
            ctx.control.point(step, MID_STREAM)?;
            // Keep streaming until the fault strikes (or the peer gives up on us).
            while Instant::now() < end {
                if conn.send(&payload, detect_timeout).is_err() {
                    break;
                }
            }
            bail!("still alive at the end of the step: no fault struck at `mid-stream`");
        }
        0 => {
            let conn = ctx.listener.wait_for(seq(step, 0), deadline)?;
            let mut frames = 0u64;
            let mut last_ok = Instant::now();
            let error = loop {
                match conn.recv(detect_timeout) {
                    Ok(_) => {
                        frames += 1;
                        last_ok = Instant::now();
                    }
                    Err(e) => break e,
                }
                if Instant::now() > end {
                    bail!("the peer kept sending for the whole step");
                }
            };
            let detect_ms = last_ok.elapsed().as_secs_f64() * 1e3;
            report.metrics.insert(SURVIVOR_DETECTED, 1.0);
            report.metrics.insert(DETECT_MS, detect_ms);
            report.notes.push(format!("rank 0 received {frames} frames, then: {error} ({detect_ms:.1} ms after the last frame)"));
        }
        _ => {}
    }
    Ok(())
}
