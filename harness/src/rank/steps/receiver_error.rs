//! receiver-error: rank 1 sends garbage; rank 0's send and flush must report the receiver's failure.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Result};
use wringer_transport::Error;

use super::raw_connect;
use crate::hosts::procfs::wait_until;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::raw_peer::*;
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub SEND_SAW_RECEIVER_ERROR = "send_saw_receiver_error", Flag, Neither;
    pub FLUSH_SAW_RECEIVER_ERROR = "flush_saw_receiver_error", Flag, Neither;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverError {
    pub deadline: HumanDuration,
}

impl super::Describe for ReceiverError {
    const ABOUT: &'static str = "a receiver's failure reaches send and flush";
}

impl StepSpec for ReceiverError {
    fn metrics(&self) -> &'static [Metric] {
        &[SEND_SAW_RECEIVER_ERROR, FLUSH_SAW_RECEIVER_ERROR]
    }
}

impl StepKind for ReceiverError {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        receiver_error(ctx, step, self.deadline.0, report)
    }
}

pub fn receiver_error(
    ctx: &RankContext,
    step: usize,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let barrier = format!("receiver-error-{step}-checked");
    match ctx.rank {
        1 => {
            let mut s: TcpStream = raw_connect(ctx.peers[0].raw, deadline)?;
            s.write_all(b"this is not a wringer frame")?;
            ctx.control.barrier(&barrier, 2, deadline)?;
        }
        0 => {
            let conn = accept_conn(ctx, deadline)?;
            if !wait_until(|| conn.terminal().is_some(), deadline) {
                bail!("the receiver never failed on the garbage");
            }
            let send = conn.send(b"after the failure", deadline);
            let flush = conn.flush(deadline);
            let saw = |r: &wringer_transport::Result<()>| {
                matches!(r, Err(Error::Receiver(_))) as u8 as f64
            };
            report.metrics.insert(SEND_SAW_RECEIVER_ERROR, saw(&send));
            report.metrics.insert(FLUSH_SAW_RECEIVER_ERROR, saw(&flush));
            report
                .notes
                .push(format!("receiver ended: {:?}", conn.terminal()));
            report
                .notes
                .push(format!("send: {send:?}; flush: {flush:?}"));
            ctx.control.barrier(&barrier, 2, deadline)?;
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
    fn send_and_flush_each_declare_what_they_saw() {
        let s = accepted("receiver-error: { deadline: 30s }", 2);
        assert_eq!(
            s.metrics(),
            &[SEND_SAW_RECEIVER_ERROR, FLUSH_SAW_RECEIVER_ERROR]
        );
        assert!(refused("receiver-error: { }", 2).contains("deadline"));
    }
}
