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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipReason {
    pub code: SkipCode,
    pub detail: String,
}

/// The stable codes of every skip: what a host lacks for a scenario to run there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipCode {
    NoRdmaDevice,
    RdmaPortDown,
    NoGpu,
    /// An AMD GPU without a HIP runtime that can drive it (reports before HIP support said
    /// `rocm-unsupported` for the same host).
    #[serde(alias = "rocm-unsupported")]
    NoHipRuntime,
    /// The host's ROCm cannot compile for its GPU's architecture.
    HipArchUnsupported,
    SingleHostProfile,
    NotRoot,
    NoNetns,
    NoDocker,
    NoVm,
    NoStrace,
    NoHostControl,
    NoWireControl,
    MissingProgram,
    Precheck,
    NoTorch,
    NoVerbsObserver,
}

impl SkipCode {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipCode::NoRdmaDevice => "no-rdma-device",
            SkipCode::RdmaPortDown => "rdma-port-down",
            SkipCode::NoGpu => "no-gpu",
            SkipCode::NoHipRuntime => "no-hip-runtime",
            SkipCode::HipArchUnsupported => "hip-arch-unsupported",
            SkipCode::SingleHostProfile => "single-host-profile",
            SkipCode::NotRoot => "not-root",
            SkipCode::NoNetns => "no-netns",
            SkipCode::NoDocker => "no-docker",
            SkipCode::NoVm => "no-vm",
            SkipCode::NoStrace => "no-strace",
            SkipCode::NoHostControl => "no-host-control",
            SkipCode::NoWireControl => "no-wire-control",
            SkipCode::MissingProgram => "missing-program",
            SkipCode::Precheck => "precheck",
            SkipCode::NoTorch => "no-torch",
            SkipCode::NoVerbsObserver => "no-verbs-observer",
        }
    }
}

impl fmt::Display for SkipCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}
