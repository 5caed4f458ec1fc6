//! `roce-corrupt: { percent }`: flip a byte inside that share of the RoCE packets the host
//! receives (seeded as for loss); the receiver's ICRC check must catch every one.

use serde::{Deserialize, Serialize};

use super::wire::{arriving_chain, check_percent, residues, roce, WireScripts};
use super::{FaultKind, Reach, Site};
use crate::model::invalid::Invalid;
use anyhow::Result;

/// Flip a byte inside `percent` % of the RoCE packets the host receives.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RoceCorrupt {
    pub percent: u8,
}

impl FaultKind for RoceCorrupt {
    fn reach(&self) -> Reach {
        Reach::Wire
    }

    fn check(&self) -> Result<(), Invalid> {
        check_percent(self.percent)
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.wire_plane()?.apply(&self.scripts(site.seed))
    }
}

impl RoceCorrupt {
    fn scripts(&self, seed: u64) -> WireScripts {
        // A byte of the BTH's payload side (20 bytes past the UDP header), under the ICRC.
        let picked = residues(seed, 3, self.percent);
        WireScripts::struck(arriving_chain(
            "arriving",
            &format!(
                "{} numgen inc mod 100 {{ {picked} }} @th,160,8 set 0x5a counter",
                roce()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_byte_under_the_icrc_is_overwritten() {
        let s = super::RoceCorrupt { percent: 2 }.scripts(1);
        assert!(s.struck.contains("@th,160,8 set 0x5a"), "{s:?}");
        assert_eq!(s.peer, None);
    }
}
