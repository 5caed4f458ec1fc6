//! `rate-limit`: the host's data link is shaped to 10 Mbit/s (tc tbf).

use super::{FaultKind, Reach, Site};
use anyhow::Result;

/// Rate-limit the host's data link to 10 Mbit/s.
pub struct RateLimit;

/// Slow enough that a bulk transfer notices, fast enough that every handshake completes.
const RATE: &str = "10mbit";

impl FaultKind for RateLimit {
    fn reach(&self) -> Reach {
        Reach::Host
    }

    // A slow link is no excuse: the rank must still finish, only later.
    fn excuses_the_rank(&self) -> bool {
        false
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.host_plane()?.rate_limit(RATE)
    }
}
