//! eof-truncation: rank 1 (an adversarial raw peer) ends streams cleanly, inside a header, inside a payload, with garbage, or not at all (rank 0 shuts down locally); rank 0 must tell the four outcomes apart.

use std::io::Write;
use std::net::Shutdown;
use std::time::Duration;

use anyhow::Result;
use wringer_transport::frame::{FrameError, Section, HEADER_LEN};
use wringer_transport::ReceiverError;

use super::raw_connect;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::raw_peer::*;
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub EOF_CASES = "eof_cases", Count, Neither;
    pub EOF_MISCLASSIFIED = "eof_misclassified", Count, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EofTruncation {
    pub deadline: HumanDuration,
}

impl super::Describe for EofTruncation {
    const ABOUT: &'static str =
        "clean EOF, truncated header or payload, garbage, local shutdown told apart";
}

impl StepSpec for EofTruncation {
    fn metrics(&self) -> &'static [Metric] {
        &[EOF_CASES, EOF_MISCLASSIFIED]
    }
}

impl StepKind for EofTruncation {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        eof_truncation(ctx, step, self.deadline.0, report)
    }
}

/// The cases, in the order rank 1 plays them, each with the outcome rank 0 must observe.
const ENDINGS: [&str; 5] = [
    "clean-eof",
    "truncated-header",
    "truncated-payload",
    "garbage-header",
    "local-shutdown",
];

pub fn eof_truncation(
    ctx: &RankContext,
    step: usize,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let barrier = format!("eof-{step}-local-shutdown-done");
    match ctx.rank {
        1 => {
            let frame = data(ctx.seed, 0, 10);
            let cut = data(ctx.seed, 1, 100);
            for case in ENDINGS {
                let mut s = raw_connect(ctx.peers[0].raw, deadline)?;
                match case {
                    "clean-eof" => s.write_all(&frame)?,
                    "truncated-header" => s.write_all(&cut[..7])?,
                    "truncated-payload" => s.write_all(&cut[..HEADER_LEN + 33])?,
                    "garbage-header" => s.write_all(b"GARBAGE!GARBAGE!GARBAGE!")?,
                    _ => {
                        // Half a frame, then hold the connection open: rank 0 stops its side.
                        s.write_all(&cut[..30])?;
                        ctx.control.barrier(&barrier, 2, deadline)?;
                    }
                }
                s.shutdown(Shutdown::Both).ok();
            }
        }
        0 => {
            let mut misclassified = 0;
            for case in ENDINGS {
                let conn = accept_conn(ctx, deadline)?;
                let observed = observe(&conn, case, deadline)?;
                let expected = match case {
                    "clean-eof" => "frame, then clean EOF".to_string(),
                    "truncated-header" => truncated(Section::Header, HEADER_LEN, 7),
                    "truncated-payload" => truncated(Section::Payload, 100, 33),
                    "garbage-header" => format!(
                        "{}",
                        ReceiverError::Frame(FrameError::BadMagic { found: *b"GARB" })
                    ),
                    _ => "local shutdown".to_string(),
                };
                if observed != expected {
                    misclassified += 1;
                }
                report.notes.push(format!(
                    "{case}: expected `{expected}`, observed `{observed}`"
                ));
                if case == "local-shutdown" {
                    ctx.control.barrier(&barrier, 2, deadline)?;
                }
            }
            report.metrics.insert(EOF_CASES, ENDINGS.len() as f64);
            report
                .metrics
                .insert(EOF_MISCLASSIFIED, misclassified as f64);
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn every_ending_is_counted_and_unknown_parameters_are_refused() {
        let s = accepted("eof-truncation: { deadline: 30s }", 2);
        assert_eq!(s.metrics(), &[EOF_CASES, EOF_MISCLASSIFIED]);
        assert_eq!(ENDINGS.len(), 5, "the scenario expects five endings");
        assert!(refused("eof-truncation: { deadline: 30s, cases: 9 }", 2).contains("unknown field"));
    }
}
