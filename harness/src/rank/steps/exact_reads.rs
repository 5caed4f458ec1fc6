//! exact-reads: rank 1 (an adversarial raw peer) dribbles frames byte by byte and splits one at every offset; rank 0 must read every frame whole.

use std::io::Write;
use std::net::Shutdown;
use std::time::Duration;

use anyhow::Result;
use transport::frame::HEADER_LEN;

use super::{pattern, raw_connect};
use crate::rank::context::Ctx;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::raw_peer::*;
use super::StepKind;
use crate::model::duration::Dur;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExactReads {
    pub dribbled_frames: u32,
    pub split_payload_bytes: u32,
    pub deadline: Dur,
}

impl StepSpec for ExactReads {
    fn metrics(&self) -> &'static [Metric] {
        &[
            Metric::FramesIntact,
            Metric::FramesCorrupt,
            Metric::FramesMissing,
        ]
    }

    fn deadline(&self) -> Duration {
        self.deadline.0
    }
}

impl StepKind for ExactReads {
    fn run(&self, ctx: &Ctx, _step: usize, report: &mut StepReport) -> Result<()> {
        exact_reads(
            ctx,
            self.dribbled_frames,
            self.split_payload_bytes,
            self.deadline.0,
            report,
        )
    }
}

pub fn exact_reads(
    ctx: &Ctx,
    dribbled: u32,
    split_len: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let split_len = split_len as usize;
    let splits = HEADER_LEN + split_len - 1;
    let expected = dribbled as usize + splits;
    match ctx.rank {
        1 => {
            let mut s = raw_connect(ctx.peers[0].raw, deadline)?;
            let mut seq = 0u64;
            for _ in 0..dribbled {
                for byte in data(ctx.seed, seq, 100 + seq as usize) {
                    s.write_all(&[byte])?;
                }
                seq += 1;
            }
            for split in 1..=splits {
                let bytes = data(ctx.seed, seq, split_len);
                s.write_all(&bytes[..split])?;
                s.write_all(&bytes[split..])?;
                seq += 1;
            }
            s.shutdown(Shutdown::Write)?;
            ctx.control.barrier("exact-reads-checked", 2, deadline)?;
        }
        0 => {
            let conn = accept_conn(ctx, deadline)?;
            let (mut intact, mut corrupt) = (0u32, 0u32);
            for seq in 0..expected as u64 {
                let len = if seq < dribbled as u64 {
                    100 + seq as usize
                } else {
                    split_len
                };
                match conn.recv(deadline) {
                    Ok(f)
                        if f.payload == pattern(ctx.seed, seq, len) && f.header.sequence == seq =>
                    {
                        intact += 1
                    }
                    Ok(f) => {
                        corrupt += 1;
                        report.notes.push(format!(
                            "frame {seq}: {} bytes differ from the pattern",
                            f.payload.len()
                        ));
                    }
                    Err(e) => {
                        report.notes.push(format!("after {intact} frames: {e}"));
                        break;
                    }
                }
            }
            let m = &mut report.metrics;
            m.insert(Metric::FramesIntact, intact as f64);
            m.insert(Metric::FramesCorrupt, corrupt as f64);
            m.insert(
                Metric::FramesMissing,
                (expected as u32 - intact - corrupt) as f64,
            );
            report.notes.push(format!("{expected} frames expected: {dribbled} dribbled byte by byte, {splits} split at every offset"));
            ctx.control.barrier("exact-reads-checked", 2, deadline)?;
        }
        _ => {}
    }
    Ok(())
}
