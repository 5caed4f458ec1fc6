//! `link-flap: { down_for }`: the host's RoCE netdev goes down for `down_for`, then up again.

use serde::{Deserialize, Serialize};

use super::wire::WireScripts;
use super::{FaultKind, Reach, Site};
use crate::model::duration::HumanDuration;
use crate::model::invalid::Invalid;
use anyhow::Result;
use std::time::Duration;

/// Take the host's RoCE netdev down for `down_for`, then up again.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LinkFlap {
    pub down_for: HumanDuration,
}

impl FaultKind for LinkFlap {
    fn reach(&self) -> Reach {
        Reach::Wire
    }

    fn check(&self) -> Result<(), Invalid> {
        let d = self.down_for.0;
        if d.is_zero() || d > Duration::from_secs(600) {
            return Err(format!("down_for must be above 0 and at most 600s, got {d:?}").into());
        }
        Ok(())
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        let wire = site.wire_plane()?;
        wire.link_goes_down();
        wire.apply(&self.scripts())
    }
}

impl LinkFlap {
    /// Down now; up again from a process of its own (its pid kept, so healing can stop it).
    fn scripts(&self) -> WireScripts {
        WireScripts::struck(format!(
            "ip link set $D down\n\
             setsid sh -c 'sleep {:.3}; ip link set '$D' up' </dev/null >/dev/null 2>&1 &\n\
             echo $! > /tmp/wringer-link-up.pid\n",
            self.down_for.0.as_secs_f64()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_comes_back_after_down_for() {
        let flap = LinkFlap {
            down_for: HumanDuration(Duration::from_millis(1500)),
        }
        .scripts()
        .struck;
        assert!(
            flap.contains("ip link set $D down") && flap.contains("sleep 1.500"),
            "{flap}"
        );
    }
}
