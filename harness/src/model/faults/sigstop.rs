//! `sigstop`: freeze the rank's process; its sockets stay open.

use super::{FaultKind, Reach, Site};
use anyhow::Result;
use nix::sys::signal::Signal;

/// Freeze the rank's process (its sockets stay open).
pub struct Sigstop;

impl FaultKind for Sigstop {
    fn reach(&self) -> Reach {
        Reach::Rank
    }

    fn stops_the_rank(&self) -> bool {
        true
    }

    fn signal(&self) -> Option<Signal> {
        Some(Signal::SIGSTOP)
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.rank_plane()?.signal(Signal::SIGSTOP)
    }
}
