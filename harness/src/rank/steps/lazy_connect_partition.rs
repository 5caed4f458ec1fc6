//! lazy-connect-partition: rank 1 reports `partitioned` (where a link cut strikes), then lazily connects to rank 0: both sides must fail within their deadlines instead of hanging.

use super::support::{LISTENER_TIMEOUT_FIRED, LISTENER_TIMEOUT_MS};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::seq;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::lazy_connect::{initiate, wait_out};
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub INITIATOR_CONNECT_FAILED = "initiator_connect_failed", Flag, Neither;
    pub CONNECT_FAIL_MS = "connect_fail_ms", Milliseconds, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LazyConnectPartition {
    pub wait_timeout: HumanDuration,
    pub connect_deadline: HumanDuration,
    pub deadline: HumanDuration,
}

/// The point its ranks report, where a scenario's fault may strike.
const PARTITIONED: &str = "partitioned";

impl super::Describe for LazyConnectPartition {
    const ABOUT: &'static str = "a silent link cut during a lazy connect; both sides fail in time";
}

impl StepSpec for LazyConnectPartition {
    fn points(&self) -> Vec<String> {
        vec![PARTITIONED.into()]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            LISTENER_TIMEOUT_FIRED,
            LISTENER_TIMEOUT_MS,
            INITIATOR_CONNECT_FAILED,
            CONNECT_FAIL_MS,
        ]
    }
}

impl StepKind for LazyConnectPartition {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        partition(
            ctx,
            step,
            self.wait_timeout.0,
            self.connect_deadline.0,
            self.deadline.0,
            report,
        )
    }
}

/// A partition during a lazy connect: the initiator's host loses its data link just before it
/// connects. The listener's wait must time out once, on time; the initiator's connect must give
/// up at its deadline.
pub fn partition(
    ctx: &RankContext,
    step: usize,
    wait: Duration,
    connect_deadline: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let m = &mut report.metrics;
    match ctx.rank {
        0 => {
            let r = wait_out(&ctx.listener, seq(step, 0), wait, m);
            report
                .notes
                .push(format!("listener wait across the partition: {:?}", r.err()));
        }
        1 => {
            ctx.control.point_and_wait(step, PARTITIONED, deadline)?;
            let started = Instant::now();
            let r = initiate(ctx, step, 0, 0, connect_deadline);
            let failed = r.is_err();
            m.insert(INITIATOR_CONNECT_FAILED, failed as u8 as f64);
            m.insert(CONNECT_FAIL_MS, started.elapsed().as_secs_f64() * 1e3);
            report.notes.push(format!(
                "initiator connect across the partition: {:?}",
                r.err()
            ));
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
    fn the_partition_point_is_declared_for_the_link_cut() {
        let s = accepted(
            "lazy-connect-partition: { wait_timeout: 2s, connect_deadline: 2s, deadline: 30s }",
            2,
        );
        assert_eq!(s.points(), vec![PARTITIONED.to_string()]);
        assert!(refused(
            "lazy-connect-partition: { wait_timeout: 2s, deadline: 30s }",
            2
        )
        .contains("connect_deadline"));
    }
}
