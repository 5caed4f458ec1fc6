//! The fault actions, one file each, behind one trait and one registry.
//!
//! A new fault action is a file holding its parameters (the YAML value under its name, or
//! none for a bare name like `sigkill`), their checks, where it can strike ([`Reach`]) and how
//! it strikes ([`FaultKind::strike`]), plus one line in [`registry!`] below. Nothing else
//! lists the actions. A fault strikes through the planes a backend gives ([`Site`]): signals
//! to a rank, a whole host, or the RoCE wire; it does no IO itself. Healing is the plane's:
//! the backend undoes every strike of its plane at once when the attempt ends.

use anyhow::{bail, Result};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use crate::model::invalid::Invalid;

pub mod wire;

// The actions' modules, one per action; `registry!` below names each one's type.
pub mod host_freeze;
pub mod host_kill;
pub mod link_cut;
pub mod link_down;
pub mod link_flap;
pub mod qp_error;
pub mod rate_limit;
pub mod roce_blackhole;
pub mod roce_corrupt;
pub mod roce_delay;
pub mod roce_duplicate;
pub mod roce_loss;
pub mod roce_reorder;
pub mod sigkill;
pub mod sigstop;

/// What a fault action declares and how it strikes.
pub trait FaultKind {
    /// Which plane it strikes, and so which backends can take it.
    fn reach(&self) -> Reach;

    /// Its parameters are ones its plane can apply (checked when the scenario is read).
    fn check(&self) -> Result<(), Invalid> {
        Ok(())
    }

    /// The rank will not finish by itself afterwards (it is dead or frozen).
    fn stops_the_rank(&self) -> bool {
        false
    }

    /// The rank's own errors afterwards are the fault's doing, not the transport's. A wire
    /// fault's are not: what a transport does under loss, delay or a dead port is what its
    /// step judges.
    fn excuses_the_rank(&self) -> bool {
        self.reach() != Reach::Wire
    }

    /// It acts through the verbs observer, so the scenario must have `audit: [verbs-lifecycle]`.
    fn needs_verbs_observer(&self) -> bool {
        false
    }

    /// The signal it is, when it is one: an exec step sends it to its program itself.
    fn signal(&self) -> Option<Signal> {
        None
    }

    /// Strike, through the plane it reaches at `site`.
    fn strike(&self, site: &Site<'_>) -> Result<()>;
}

impl FaultAction {
    pub fn reach(self) -> Reach {
        self.kind().reach()
    }

    /// Acts on a host (or its wire), so it needs a backend that can.
    pub fn is_host_level(self) -> bool {
        self.reach() != Reach::Rank
    }

    pub fn check(self) -> Result<(), Invalid> {
        self.kind().check()
    }

    pub fn stops_the_rank(self) -> bool {
        self.kind().stops_the_rank()
    }

    pub fn excuses_the_rank(self) -> bool {
        self.kind().excuses_the_rank()
    }
}

/// Who can strike a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// A signal to the rank's process: anywhere.
    Rank,
    /// The whole host: hosts the harness started (containers, a Slurm test cluster).
    Host,
    /// The RoCE wire between two hosts: the soft-RoCE VM pair.
    Wire,
}

/// The fault planes a backend can strike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Strikes {
    pub host: bool,
    pub wire: bool,
}

impl Strikes {
    pub fn allows(self, action: FaultAction) -> bool {
        match action.reach() {
            Reach::Rank => true,
            Reach::Host => self.host,
            Reach::Wire => self.wire,
        }
    }
}

/// A rank's process, as a fault reaches it.
pub trait RankPlane {
    fn signal(&self, signal: Signal) -> Result<()>;
    /// Move every live QP of the rank (and of the programs it started) to the error state.
    fn force_qp_error(&self) -> Result<()>;
}

/// A whole host the harness started.
pub trait HostPlane {
    fn kill(&self) -> Result<()>;
    fn freeze(&self) -> Result<()>;
    /// Cut its data link silently: no FIN, no RST.
    fn cut_link(&self) -> Result<()>;
    /// Shape its data link to `rate` (tc's form, `10mbit`).
    fn rate_limit(&self, rate: &str) -> Result<()>;
}

/// A host's end of the RoCE wire.
pub trait WirePlane {
    /// The struck host's address on the wire.
    fn address(&self) -> &str;
    /// Run a wire fault's commands on the struck host and on its peers.
    fn apply(&self, scripts: &wire::WireScripts) -> Result<()>;
    /// The struck host's link goes down: its rxe device is renewed once the attempt is over.
    fn link_goes_down(&self);
}

/// Where a fault strikes: the planes there (each backend gives those it has), and the seed
/// that fixes any pattern the fault has (which packets a loss drops).
pub struct Site<'a> {
    /// The backend's kind (`local`, `containers`, …), for the refusal when a plane is missing.
    pub backend: &'a str,
    pub rank: Option<&'a dyn RankPlane>,
    pub host: Option<&'a dyn HostPlane>,
    pub wire: Option<&'a dyn WirePlane>,
    pub seed: u64,
}

impl<'a> Site<'a> {
    /// A rank's process, anywhere.
    pub fn rank(backend: &'a str, rank: &'a dyn RankPlane, seed: u64) -> Site<'a> {
        Site {
            backend,
            rank: Some(rank),
            host: None,
            wire: None,
            seed,
        }
    }

    pub fn rank_plane(&self) -> Result<&'a dyn RankPlane> {
        match self.rank {
            Some(r) => Ok(r),
            None => bail!("a rank's signals are sent by the coordinator, not by a host fault"),
        }
    }

    pub fn host_plane(&self) -> Result<&'a dyn HostPlane> {
        match self.host {
            Some(h) => Ok(h),
            None => bail!(
                "{} hosts cannot take a host-level fault: use the containers profile (host faults) or rxe-vm-pair (wire faults)",
                self.backend
            ),
        }
    }

    pub fn wire_plane(&self) -> Result<&'a dyn WirePlane> {
        match self.wire {
            Some(w) => Ok(w),
            None => bail!(
                "{} hosts cannot take a fault on the RoCE wire, which they do not have: use rxe-vm-pair",
                self.backend
            ),
        }
    }
}

/// Builds [`FaultAction`] from the actions' lines: `bare:` ones are written as their name
/// alone (`action: sigkill`), the others as their name over their parameters
/// (`action: { roce-loss: { percent: 2 } }`).
macro_rules! registry {
    (
        bare: $($bare:ident($bare_module:ident::$bare_ty:ident) = $bare_name:literal,)*
        ;
        with: $($variant:ident($module:ident::$ty:ident) = $name:literal,)*
    ) => {
        /// A fault's action: its name as the YAML value (or key, over its parameters).
        #[derive(Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
        pub enum FaultAction {
            $(#[serde(rename = $bare_name)] $bare,)*
            $(#[serde(rename = $name)] $variant($module::$ty),)*
        }

        impl FaultAction {
            /// Every registered action's name, in registry order.
            pub const NAMES: &'static [&'static str] = &[$($bare_name,)* $($name,)*];

            pub fn kind(&self) -> &dyn FaultKind {
                match self {
                    $(FaultAction::$bare => &$bare_module::$bare_ty,)*
                    $(FaultAction::$variant(p) => p,)*
                }
            }

            /// The action's name, as a scenario writes it.
            pub fn name(&self) -> &'static str {
                match self {
                    $(FaultAction::$bare => $bare_name,)*
                    $(FaultAction::$variant(_) => $name,)*
                }
            }
        }

        // The form reports and logs have always printed: `Sigkill`, `RoceLoss { percent: 2 }`.
        impl std::fmt::Debug for FaultAction {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self {
                    $(FaultAction::$bare => f.write_str(stringify!($bare)),)*
                    $(FaultAction::$variant(p) => p.fmt(f),)*
                }
            }
        }
    };
}

registry! {
    bare:
    Sigkill(sigkill::Sigkill) = "sigkill",
    Sigstop(sigstop::Sigstop) = "sigstop",
    QpError(qp_error::QpError) = "qp-error",
    HostKill(host_kill::HostKill) = "host-kill",
    HostFreeze(host_freeze::HostFreeze) = "host-freeze",
    LinkCut(link_cut::LinkCut) = "link-cut",
    RateLimit(rate_limit::RateLimit) = "rate-limit",
    RoceBlackhole(roce_blackhole::RoceBlackhole) = "roce-blackhole",
    RoceDuplicate(roce_duplicate::RoceDuplicate) = "roce-duplicate",
    LinkDown(link_down::LinkDown) = "link-down",
    ;
    with:
    RoceLoss(roce_loss::RoceLoss) = "roce-loss",
    RoceCorrupt(roce_corrupt::RoceCorrupt) = "roce-corrupt",
    RoceDelay(roce_delay::RoceDelay) = "roce-delay",
    RoceReorder(roce_reorder::RoceReorder) = "roce-reorder",
    LinkFlap(link_flap::LinkFlap) = "link-flap",
}

#[cfg(test)]
mod tests;
