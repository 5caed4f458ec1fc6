//! `qp-error`: every live QP of the rank goes to the error state, as a fatal device error
//! would put it.

use super::{FaultKind, Reach, Site};
use anyhow::Result;

/// Move every live QP of the rank (and of the programs it started) to the error state,
/// through the verbs observer, so it needs `audit: [verbs-lifecycle]`.
pub struct QpError;

impl FaultKind for QpError {
    fn reach(&self) -> Reach {
        Reach::Rank
    }

    fn needs_verbs_observer(&self) -> bool {
        true
    }

    fn strike(&self, site: &Site<'_>) -> Result<()> {
        site.rank_plane()?.force_qp_error()
    }
}
