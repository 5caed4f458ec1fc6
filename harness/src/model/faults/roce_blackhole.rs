//! `roce-blackhole`: every RoCE packet to and from the host is dropped.

use super::wire::{arriving_chain, roce, roce_from, WireScripts};
use super::{FaultKind, Reach, Site};
use anyhow::Result;

/// Drop every RoCE packet to and from the host.
pub struct RoceBlackhole;

impl FaultKind for RoceBlackhole {
    fn reach(&self) -> Reach {
        Reach::Wire
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        let wire = site.wire_plane()?;
        wire.apply(&scripts(wire.address()))
    }
}

fn scripts(address: &str) -> WireScripts {
    WireScripts {
        struck: arriving_chain("arriving", &format!("{} counter drop", roce())),
        peer: Some(arriving_chain(
            "departing",
            &format!("{} counter drop", roce_from(address)),
        )),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_directions_are_dropped_where_they_arrive() {
        let s = super::scripts("10.0.0.1");
        assert!(s.struck.contains("udp dport 4791 counter drop"), "{s:?}");
        assert!(s
            .peer
            .unwrap()
            .contains("ip saddr 10.0.0.1 udp dport 4791 counter drop"));
    }
}
