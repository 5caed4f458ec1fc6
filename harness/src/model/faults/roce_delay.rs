//! `roce-delay: { delay }`: every packet the host's RoCE link sends waits `delay` (netem).

use serde::{Deserialize, Serialize};

use super::wire::{check_delay, netem, WireScripts};
use super::{FaultKind, Reach, Site};
use crate::model::duration::HumanDuration;
use crate::model::invalid::Invalid;
use anyhow::Result;

/// Delay every packet the host's RoCE link sends by `delay`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RoceDelay {
    pub delay: HumanDuration,
}

impl FaultKind for RoceDelay {
    fn reach(&self) -> Reach {
        Reach::Wire
    }

    fn check(&self) -> Result<(), Invalid> {
        check_delay(self.delay.0)
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.wire_plane()?
            .apply(&WireScripts::struck(netem(&format!(
                "delay {}us",
                self.delay.0.as_micros()
            ))))
    }
}
