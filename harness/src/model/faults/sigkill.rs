//! `sigkill`: kill the rank's process.

use super::{FaultKind, Reach, Site};
use anyhow::Result;
use nix::sys::signal::Signal;

/// Kill the rank's process.
pub struct Sigkill;

impl FaultKind for Sigkill {
    fn reach(&self) -> Reach {
        Reach::Rank
    }

    fn stops_the_rank(&self) -> bool {
        true
    }

    fn signal(&self) -> Option<Signal> {
        Some(Signal::SIGKILL)
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.rank_plane()?.signal(Signal::SIGKILL)
    }
}
