//! `link-cut`: the host's data link goes silent: no FIN, no RST.

use super::{FaultKind, Reach, Site};
use anyhow::Result;

/// Cut the host's data link silently.
pub struct LinkCut;

impl FaultKind for LinkCut {
    fn reach(&self) -> Reach {
        Reach::Host
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.host_plane()?.cut_link()
    }
}
