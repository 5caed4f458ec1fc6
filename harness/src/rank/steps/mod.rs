//! The step kinds, one file each, behind one trait and one registry.
//!
//! A new step kind is a file holding its parameters (the YAML mapping under the kind's name),
//! its metrics (`declare_metrics!`), its [`Describe`] line, its [`StepKind`] implementation
//! and its unit tests, plus one line in [`registry!`] below. Nothing else lists the kinds.

mod external;
pub mod fabric;
pub use external::wall_us;
mod gpu_rdma;
mod gpu_support;
mod gpu_tcp;
mod raw_peer;
pub mod rdma_support;
mod scripted_peer;
mod support;
mod template;

use crate::model::invalid::Invalid;

use anyhow::Result;
use serde::{Deserialize, Serialize};

pub use support::*;

use crate::model::input::InputError;
use crate::model::metric::{Metric, Series};
use crate::model::scenario::{self, Named, StepSpec};
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

/// One step kind: what it declares ([`StepSpec`], checked before anything runs) and what a
/// rank does in it.
pub trait StepKind: StepSpec {
    /// What this rank does in the step; evidence goes into `report`.
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()>;

    /// Evidence only the coordinator can derive, from every rank's report of this step (both
    /// sides of each connection agreeing, say). The metrics must be among those declared;
    /// expectations judge them like any other.
    /// Notes explain what the metrics count (the attempts where the sides disagreed, say).
    /// `faults` are the scenario's faults that struck, with when (the coordinator's wall clock).
    fn reconcile(&self, _reports: &[(u32, &StepReport)], _faults: &[StruckFault]) -> Reconciled {
        Reconciled::default()
    }

    /// Programs and checks that must succeed on every host before the step can run there;
    /// one that does not is a typed skip, not a failure.
    fn preflight(&self) -> Vec<Preflight> {
        vec![]
    }
}

/// What a step kind is for, in one line: `wringer list --kinds` prints it beside the kind's
/// name, so the kind's file is the only place it is written.
pub trait Describe {
    const ABOUT: &'static str;
}

/// A scenario fault that struck a rank (or its host), and when, in µs since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StruckFault {
    pub rank: u32,
    pub action: crate::model::scenario::FaultAction,
    pub at_us: u64,
}

/// What the coordinator derived from every rank's report of one step.
#[derive(Debug, Default, PartialEq)]
pub struct Reconciled {
    pub metrics: Vec<(Metric, f64)>,
    pub notes: Vec<String>,
    /// Expectations that only both sides' evidence can judge, broken: each fails the repeat.
    pub failures: Vec<String>,
}

/// Something a host must have for a step to run there.
#[derive(Clone, Debug, PartialEq)]
pub enum Preflight {
    /// A program in PATH, and the Debian package that has it.
    Program {
        name: String,
        package: Option<String>,
    },
    /// A command that must exit 0; otherwise the step skips with `reason`.
    Check {
        command: Vec<String>,
        reason: String,
    },
}

/// The registry: each line names a step kind as YAML spells it and the file (module) that
/// holds it; the line declares the module too.
macro_rules! registry {
    (
        $($variant:ident($module:ident::$ty:ident) = $name:literal,)*
        ;
        renamed: $($old_variant:ident = $old:literal => $now:literal,)*
    ) => {
        /// One step of a scenario: the kind's name as the YAML key, its parameters as the value.
        #[derive(Clone, Debug, Deserialize, Serialize)]
        pub enum Step {
            $(#[serde(rename = $name)] $variant($module::$ty),)*
            // Kinds that were renamed: reading one is an error at its line that says what to
            // write now; they never hold a value.
            $(#[doc(hidden)] #[serde(rename = $old)] $old_variant(renamed::$old_variant),)*
        }

        /// One type per renamed kind whose reading fails with what to write instead.
        mod renamed {
            use serde::{Deserialize, Deserializer, Serialize, Serializer};

            #[derive(Clone, Debug)]
            pub enum Never {}

            $(
                #[derive(Clone, Debug)]
                pub struct $old_variant(pub Never);

                impl<'de> Deserialize<'de> for $old_variant {
                    fn deserialize<D: Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
                        Err(serde::de::Error::custom(format!(
                            "step kind `{}` is now {}",
                            $old, $now
                        )))
                    }
                }

                impl Serialize for $old_variant {
                    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                        match self.0 {}
                    }
                }
            )*
        }

        impl Step {
            /// Every registered kind's name, in registry order.
            pub const NAMES: &'static [&'static str] = &[$($name),*];

            /// Every registered kind's name and what it is for, in registry order.
            pub const ABOUT: &'static [(&'static str, &'static str)] =
                &[$(($name, <$module::$ty as Describe>::ABOUT)),*];

            pub fn kind(&self) -> &dyn StepKind {
                match self {
                    $(Step::$variant(p) => p,)*
                    $(Step::$old_variant(r) => match r.0 {},)*
                }
            }

            /// The step's own deadline: every kind's parameters have one (`deadline:`), read
            /// here, once.
            pub fn deadline(&self) -> std::time::Duration {
                match self {
                    $(Step::$variant(p) => p.deadline.0,)*
                    $(Step::$old_variant(r) => match r.0 {},)*
                }
            }

            fn kind_name(&self) -> &'static str {
                match self {
                    $(Step::$variant(_) => $name,)*
                    $(Step::$old_variant(r) => match r.0 {},)*
                }
            }
        }
    };
}

// The step kinds' modules, declared here rather than by `registry!` so that rustfmt and
// every other tool sees them; `registry!` below names each one's type.
pub mod caller_sees_end;
pub mod close_during_recv;
pub mod eof_truncation;
pub mod exact_reads;
pub mod exec;
pub mod exit_before_first_exchange;
pub mod gpu_pingpong;
pub mod handover_order;
pub mod lazy_connect;
pub mod lazy_connect_deadline_race;
pub mod lazy_connect_partition;
pub mod listener_never_answers;
pub mod mid_frame_deadlines;
pub mod peer_death;
pub mod pingpong;
pub mod rdma_graceful_shutdown;
pub mod rdma_interface_index;
pub mod rdma_interop_rc_pingpong;
pub mod rdma_lossless_stream;
pub mod rdma_wire_fault;
pub mod rdma_xhost_send;
pub mod receiver_error;
pub mod stall;
pub mod teardown_cycles;

registry! {
    TeardownCycles(teardown_cycles::TeardownCycles) = "teardown-cycles",
    ExactReads(exact_reads::ExactReads) = "exact-reads",
    EofTruncation(eof_truncation::EofTruncation) = "eof-truncation",
    ReceiverError(receiver_error::ReceiverError) = "receiver-error",
    PeerDeath(peer_death::PeerDeath) = "peer-death",
    ExitBeforeFirstExchange(exit_before_first_exchange::ExitBeforeFirstExchange) = "exit-before-first-exchange",
    LazyConnect(lazy_connect::LazyConnect) = "lazy-connect",
    LazyConnectPartition(lazy_connect_partition::LazyConnectPartition) = "lazy-connect-partition",
    LazyConnectDeadlineRace(lazy_connect_deadline_race::LazyConnectDeadlineRace) = "lazy-connect-deadline-race",
    Pingpong(pingpong::Pingpong) = "pingpong",
    RdmaLosslessStream(rdma_lossless_stream::RdmaLosslessStream) = "rdma-lossless-stream",
    RdmaGracefulShutdown(rdma_graceful_shutdown::RdmaGracefulShutdown) = "rdma-graceful-shutdown",
    RdmaInterfaceIndex(rdma_interface_index::RdmaInterfaceIndex) = "rdma-interface-index",
    RdmaXhostSend(rdma_xhost_send::RdmaXhostSend) = "rdma-xhost-send",
    RdmaWireFault(rdma_wire_fault::RdmaWireFault) = "rdma-wire-fault",
    RdmaInteropRcPingpong(rdma_interop_rc_pingpong::RdmaInteropRcPingpong) = "rdma-interop-rc-pingpong",
    GpuPingpong(gpu_pingpong::GpuPingpong) = "gpu-pingpong",
    ListenerNeverAnswers(listener_never_answers::ListenerNeverAnswers) = "listener-never-answers",
    HandoverOrder(handover_order::HandoverOrder) = "handover-order",
    MidFrameDeadlines(mid_frame_deadlines::MidFrameDeadlines) = "mid-frame-deadlines",
    CallerSeesEnd(caller_sees_end::CallerSeesEnd) = "caller-sees-end",
    CloseDuringRecv(close_during_recv::CloseDuringRecv) = "close-during-recv",
    Stall(stall::Stall) = "stall",
    Exec(exec::Exec) = "exec",
    ;
    renamed:
    RdmaPeerDeath = "rdma-peer-death" => "`peer-death` with `fabric: rdma` (and `victim: 1`, the default)",
    RdmaPingpong = "rdma-pingpong" => "`pingpong` with `fabric: rdma`",
    GpuPingpongTcp = "gpu-pingpong-tcp" => "`gpu-pingpong` (`fabric: tcp` is the default)",
    GpuPingpongRdma = "gpu-pingpong-rdma" => "`gpu-pingpong` with `fabric: rdma`",
}

impl Named for Step {
    fn name(&self) -> &'static str {
        self.kind_name()
    }
}

impl StepSpec for Step {
    fn metrics(&self) -> &'static [Metric] {
        self.kind().metrics()
    }
    fn series(&self) -> &'static [Series] {
        self.kind().series()
    }
    fn min_ranks(&self) -> u32 {
        self.kind().min_ranks()
    }
    fn check(&self, ranks: u32) -> Result<(), Invalid> {
        self.kind().check(ranks)
    }
    fn faults(&self, step: usize) -> Vec<scenario::Fault> {
        self.kind().faults(step)
    }
    fn uses_release(&self) -> bool {
        self.kind().uses_release()
    }
    fn points(&self) -> Vec<String> {
        self.kind().points()
    }
    fn reach_points(&self) -> &'static [crate::model::reach::ReachPoint] {
        self.kind().reach_points()
    }
    fn requires(&self) -> Vec<crate::model::requirement::Requirement> {
        self.kind().requires()
    }
}

impl Step {
    /// This step with `{release}` put in as `root` (only exec steps name it).
    pub fn for_release(&self, root: &str) -> Result<Step, Invalid> {
        match self {
            Step::Exec(e) => e.for_release(root).map(Step::Exec),
            other => Ok(other.clone()),
        }
    }
}

/// One copy of the scenario per release, each named with its release and with `{release}` put
/// in; with no release installed, the scenario as it is (the policy skips it, naming the
/// recipe that installs one).
pub fn for_releases(
    loaded: Loaded,
    releases: &[scenario::Release],
) -> Result<Vec<Loaded>, Invalid> {
    if loaded.scenario.releases.is_none() || releases.is_empty() {
        return Ok(vec![loaded]);
    }
    let mut out = vec![];
    for r in releases {
        let mut copy = loaded.clone();
        let root = r.root.display().to_string();
        for step in &mut copy.scenario.steps {
            step.value = step.value.for_release(&root)?;
        }
        if let Some(family) = copy.scenario.releases {
            copy.scenario.name = family.name(&loaded.scenario.name, &r.version);
        }
        crate::model::name::check(&copy.scenario.name)?;
        copy.scenario.release = Some(r.clone());
        out.push(copy);
    }
    Ok(out)
}

/// Everything the scenario's steps need of a host before it runs.
pub fn preflight(steps: &[Step]) -> Vec<Preflight> {
    let mut all: Vec<Preflight> = vec![];
    for p in steps.iter().flat_map(|s| s.kind().preflight()) {
        if !all.contains(&p) {
            all.push(p);
        }
    }
    all
}

/// A scenario whose steps are the registered kinds.
pub type Loaded = scenario::Loaded<Step>;

/// Parse and check one scenario file against the registry.
pub fn load(path: &std::path::Path) -> Result<Loaded, InputError> {
    scenario::load::<Step>(path)
}

/// Parse and check a scenario's text against the registry (`path` names it in errors).
pub fn parse(path: &std::path::Path, text: &str) -> Result<Loaded, InputError> {
    scenario::parse::<Step>(path, text)
}

/// Run one step on this rank and check that its evidence is what the kind declared.
pub fn run(step: &Step, ctx: &RankContext, index: usize) -> Result<StepReport> {
    let mut report = StepReport::new(index);
    step.kind().run(ctx, index, &mut report)?;
    report
        .check_declared(step.metrics(), step.series())
        .map_err(anyhow::Error::msg)?;
    Ok(report)
}

/// What the kinds' unit tests share: a step as the scenario YAML writes it, checked.
#[cfg(test)]
pub(crate) mod testing {
    use super::Step;
    use crate::model::scenario::StepSpec;

    /// `yaml` (one step: `kind: { params }`) read and checked against `ranks`.
    pub fn accepted(yaml: &str, ranks: u32) -> Step {
        let step: Step = serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        if let Err(why) = step.check(ranks) {
            panic!("{yaml} with {ranks} ranks refused: {why}");
        }
        step
    }

    /// Why `yaml` is refused, as a reading error or by the kind's checks against `ranks`.
    pub fn refused(yaml: &str, ranks: u32) -> String {
        match serde_saphyr::from_str::<Step>(yaml) {
            Err(e) => e.to_string(),
            Ok(step) => match step.check(ranks) {
                Err(why) => why.0,
                Ok(()) => panic!("{yaml} with {ranks} ranks was accepted"),
            },
        }
    }
}
