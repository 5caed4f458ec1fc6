//! stall: do nothing for `duration`. A harness self-test for the watchdog.

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Stall {
    pub duration: HumanDuration,
    pub deadline: HumanDuration,
}

impl super::Describe for Stall {
    const ABOUT: &'static str = "a watchdog self-test";
}

impl StepSpec for Stall {
    fn metrics(&self) -> &'static [Metric] {
        &[]
    }

    fn min_ranks(&self) -> u32 {
        1
    }
}

impl StepKind for Stall {
    fn run(&self, _ctx: &RankContext, _step: usize, _report: &mut StepReport) -> Result<()> {
        std::thread::sleep(self.duration.0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn a_stall_needs_one_rank_and_records_nothing() {
        let s = accepted("stall: { duration: 3s, deadline: 30s }", 1);
        assert_eq!((s.min_ranks(), s.metrics().len()), (1, 0));
        assert!(refused("stall: { duration: 3s }", 1).contains("deadline"));
    }
}
