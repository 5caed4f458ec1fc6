//! `host-freeze`: the rank's whole host stops (docker pause); its connections stay open.

use super::{FaultKind, Reach, Site};
use anyhow::Result;

/// Freeze the rank's whole host.
pub struct HostFreeze;

impl FaultKind for HostFreeze {
    fn reach(&self) -> Reach {
        Reach::Host
    }

    fn stops_the_rank(&self) -> bool {
        true
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.host_plane()?.freeze()
    }
}
