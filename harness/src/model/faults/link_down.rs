//! `link-down`: the host's RoCE netdev goes down (its port goes DOWN, an async event) until
//! the attempt ends.

use super::wire::WireScripts;
use super::{FaultKind, Reach, Site};
use anyhow::Result;

/// Take the host's RoCE netdev down until the attempt ends.
pub struct LinkDown;

impl FaultKind for LinkDown {
    fn reach(&self) -> Reach {
        Reach::Wire
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        let wire = site.wire_plane()?;
        wire.link_goes_down();
        wire.apply(&WireScripts::struck("ip link set $D down\n".into()))
    }
}
