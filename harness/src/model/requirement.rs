//! What a scenario requires of its hosts, and the typed reason a host falls short.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Requirement {
    Rdma,
    Gpu,
    Xhost,
    Root,
    Netns,
    Docker,
    Vm,
}

/// Why a scenario was skipped: a stable code for machines and a detail for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkipReason {
    pub code: &'static str,
    pub detail: String,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}
