//! `host-kill`: the rank's whole host dies (container hosts, a Slurm test cluster).

use super::{FaultKind, Reach, Site};
use anyhow::Result;

/// Kill the rank's whole host.
pub struct HostKill;

impl FaultKind for HostKill {
    fn reach(&self) -> Reach {
        Reach::Host
    }

    fn stops_the_rank(&self) -> bool {
        true
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.host_plane()?.kill()
    }
}
