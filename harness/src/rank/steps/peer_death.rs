//! peer-death: rank `victim` streams to rank 0 over the step's fabric (TCP or RDMA) and reports
//! the point `mid-stream`, where faults strike; rank 0 must see the death within
//! `detect_timeout`.

use std::time::Instant;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::fabric::Fabric;
use super::support::{DETECT_MS, SURVIVOR_DETECTED};
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::invalid::Invalid;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PeerDeath {
    #[serde(default)]
    pub fabric: Fabric,
    #[serde(default = "first")]
    pub victim: u32,
    pub frames_before_fault: u32,
    pub detect_timeout: HumanDuration,
    pub deadline: HumanDuration,
}

fn first() -> u32 {
    1
}

/// The point its ranks report, where a scenario's fault may strike.
const MID_STREAM: &str = "mid-stream";

impl super::Describe for PeerDeath {
    const ABOUT: &'static str =
        "a streaming peer (TCP or RDMA) killed or frozen; the survivor detects it in time";
}

crate::reach_points! {
    pub PEER_END_WHILE_RECEIVING = "peer-end-while-receiving",
        "the dead peer's end (EOF, reset, error completion) reached the survivor while it was blocked receiving";
    pub SILENCE_OUTLASTED_TIMEOUT = "silence-outlasted-timeout",
        "the survivor's receive timed out on a silent (frozen) peer";
}

impl StepSpec for PeerDeath {
    fn reach_points(&self) -> &'static [crate::model::reach::ReachPoint] {
        &[PEER_END_WHILE_RECEIVING, SILENCE_OUTLASTED_TIMEOUT]
    }

    fn requires(&self) -> Vec<crate::model::requirement::Requirement> {
        self.fabric.requires()
    }

    fn points(&self) -> Vec<String> {
        vec![MID_STREAM.into()]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[SURVIVOR_DETECTED, DETECT_MS]
    }

    fn check(&self, ranks: u32) -> Result<(), Invalid> {
        self.fabric.check_peer(self.victim, ranks)?;
        super::in_range(
            "frames_before_fault",
            self.frames_before_fault,
            0,
            super::MAX_COUNT,
        )
    }
}

impl StepKind for PeerDeath {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        let (detect_timeout, deadline) = (self.detect_timeout.0, self.deadline.0);
        let end = Instant::now() + deadline;
        let Some(mut link) = self.fabric.link(ctx, step, self.victim, 4096, deadline)? else {
            return Ok(());
        };
        let payload = vec![0xd1u8; 1024];
        if ctx.rank == self.victim {
            for _ in 0..self.frames_before_fault {
                link.send(&payload, deadline)?;
            }
            ctx.control.point(step, MID_STREAM)?;
            // Keep streaming until the fault strikes (or the peer gives up on us).
            while Instant::now() < end {
                if link.send(&payload, detect_timeout).is_err() {
                    break;
                }
            }
            bail!("still alive at the end of the step: no fault struck at `{MID_STREAM}`");
        }
        let mut frames = 0u64;
        let mut last_ok = Instant::now();
        let error = loop {
            match link.recv(detect_timeout) {
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
        // The peer's end (EOF, reset, an error completion) came before the recv's own timeout:
        // it arrived while the survivor was blocked receiving. Otherwise silence outlasted it.
        report.reach(if last_ok.elapsed() < detect_timeout.mul_f64(0.9) {
            PEER_END_WHILE_RECEIVING
        } else {
            SILENCE_OUTLASTED_TIMEOUT
        });
        report.metrics.insert(SURVIVOR_DETECTED, 1.0);
        report.metrics.insert(DETECT_MS, detect_ms);
        report.notes.push(format!(
            "rank 0 received {frames} messages over {:?}, then: {error} ({detect_ms:.1} ms after the last)",
            self.fabric
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(yaml: &str) -> PeerDeath {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn tcp_is_the_default_fabric_and_rank_1_the_default_victim() {
        let s = step("{ frames_before_fault: 5, detect_timeout: 2s, deadline: 30s }");
        assert_eq!((s.fabric, s.victim), (Fabric::Tcp, 1));
        assert!(s.check(2).is_ok());
    }

    #[test]
    fn the_victim_must_be_a_peer_the_fabric_can_pair_with_rank_0() {
        let tcp = step("{ victim: 2, frames_before_fault: 5, detect_timeout: 2s, deadline: 30s }");
        assert!(tcp.check(3).is_ok());
        assert!(tcp.check(2).unwrap_err().contains("other than 0"));
        let rdma = step(
            "{ fabric: rdma, victim: 2, frames_before_fault: 5, detect_timeout: 2s, deadline: 30s }",
        );
        assert!(rdma.check(3).unwrap_err().contains("must be 1"));
        let huge = step("{ frames_before_fault: 4000000000, detect_timeout: 2s, deadline: 30s }");
        assert!(huge.check(2).is_err());
    }

    #[test]
    fn a_scenario_over_rdma_requires_rdma_even_when_it_does_not_say_so() {
        let yaml = "name: s\ndescription: d\nranks: 2\ndeadline: 60s\nfaults:\n  - { rank: 1, at: mid-stream, action: sigkill }\nsteps:\n  - peer-death: { fabric: rdma, frames_before_fault: 5, detect_timeout: 2s, deadline: 30s }\nexpect:\n  survivor_detected: { equals: 1 }\n";
        let loaded = crate::rank::steps::parse(std::path::Path::new("s.yaml"), yaml).unwrap();
        assert_eq!(
            loaded.scenario.requires,
            vec![crate::model::requirement::Requirement::Rdma]
        );
        let tcp = yaml.replace("fabric: rdma, ", "");
        let loaded = crate::rank::steps::parse(std::path::Path::new("s.yaml"), &tcp).unwrap();
        assert!(loaded.scenario.requires.is_empty());
    }
}
