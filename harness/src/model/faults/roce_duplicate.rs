//! `roce-duplicate`: every packet the host's RoCE link sends goes twice (netem `duplicate
//! 100%`, no randomness). RC must take each request once: a duplicate SEND is acknowledged
//! again, never delivered again.

use super::wire::{netem, WireScripts};
use super::{FaultKind, Reach, Site};
use anyhow::Result;

/// Send every packet of the host's RoCE link twice.
pub struct RoceDuplicate;

impl FaultKind for RoceDuplicate {
    fn reach(&self) -> Reach {
        Reach::Wire
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.wire_plane()?.apply(&scripts())
    }
}

fn scripts() -> WireScripts {
    WireScripts::struck(netem("duplicate 100%"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_packet_goes_twice_and_healing_removes_it_with_the_qdisc() {
        let s = super::scripts();
        assert!(
            s.struck.contains("root netem limit 100000 duplicate 100%"),
            "{s:?}"
        );
        assert_eq!(s.peer, None);
    }
}
