//! `roce-loss: { percent }`: drop that share of the RoCE packets the host sends and receives,
//! picked by packet count from the run's seed, so a replay drops the same packets.

use serde::{Deserialize, Serialize};

use super::wire::{arriving_chain, check_percent, residues, roce, roce_from, WireScripts};
use super::{FaultKind, Reach, Site};
use crate::model::invalid::Invalid;
use anyhow::Result;

/// Drop `percent` % of the RoCE v2 packets (UDP 4791) the host sends and receives.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RoceLoss {
    pub percent: u8,
}

impl FaultKind for RoceLoss {
    fn reach(&self) -> Reach {
        Reach::Wire
    }

    fn check(&self) -> Result<(), Invalid> {
        check_percent(self.percent)
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        let wire = site.wire_plane()?;
        wire.apply(&self.scripts(site.seed, wire.address()))
    }
}

impl RoceLoss {
    fn scripts(&self, seed: u64, address: &str) -> WireScripts {
        let (sent, arriving) = (
            residues(seed, 1, self.percent),
            residues(seed, 2, self.percent),
        );
        WireScripts {
            struck: arriving_chain(
                "arriving",
                &format!(
                    "{} numgen inc mod 100 {{ {arriving} }} counter drop",
                    roce()
                ),
            ),
            peer: Some(arriving_chain(
                "departing",
                &format!(
                    "{} numgen inc mod 100 {{ {sent} }} counter drop",
                    roce_from(address)
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_host_sends_is_dropped_at_its_peer_and_what_it_receives_at_itself() {
        let loss = RoceLoss { percent: 1 }.scripts(7, "10.0.0.2");
        assert!(
            loss.struck.contains("udp dport 4791 numgen inc mod 100 {"),
            "{}",
            loss.struck
        );
        assert!(loss.struck.contains("hook input") && !loss.struck.contains("hook output"));
        let sent = loss
            .peer
            .clone()
            .expect("what the struck host sends is dropped at its peer");
        assert!(
            sent.contains("ip saddr 10.0.0.2 udp dport 4791 numgen"),
            "{sent}"
        );
        assert!(
            sent.contains("hook input"),
            "dropped where it arrives: {sent}"
        );
        assert_eq!(loss, RoceLoss { percent: 1 }.scripts(7, "10.0.0.2"));
        assert_ne!(loss, RoceLoss { percent: 1 }.scripts(8, "10.0.0.2"));
    }
}
