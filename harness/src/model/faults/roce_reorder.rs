//! `roce-reorder: { delay, gap }`: every `gap`-th packet the host sends goes at once, the
//! others `delay` later (netem, no randomness).

use serde::{Deserialize, Serialize};

use super::wire::{check_delay, netem, WireScripts};
use super::{FaultKind, Reach, Site};
use crate::model::duration::HumanDuration;
use crate::model::invalid::Invalid;
use anyhow::Result;

/// Reorder what the host sends: every `gap`-th packet overtakes the others.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RoceReorder {
    pub delay: HumanDuration,
    pub gap: u32,
}

impl FaultKind for RoceReorder {
    fn reach(&self) -> Reach {
        Reach::Wire
    }

    fn check(&self) -> Result<(), Invalid> {
        check_delay(self.delay.0)?;
        if !(2..=1000).contains(&self.gap) {
            return Err(format!(
                "gap must be 2..=1000 (every gap-th packet overtakes), got {}",
                self.gap
            )
            .into());
        }
        Ok(())
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.wire_plane()?.apply(&self.scripts())
    }
}

impl RoceReorder {
    fn scripts(&self) -> WireScripts {
        WireScripts::struck(netem(&format!(
            "delay {}us reorder 100% gap {}",
            self.delay.0.as_micros(),
            self.gap
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_gap_th_packet_overtakes_and_the_gap_is_bounded() {
        let r = RoceReorder {
            delay: HumanDuration(Duration::from_millis(20)),
            gap: 5,
        };
        assert!(r
            .scripts()
            .struck
            .contains("netem limit 100000 delay 20000us reorder 100% gap 5"));
        assert!(r.check().is_ok());
        assert!(RoceReorder { gap: 1, ..r }.check().is_err());
    }
}
