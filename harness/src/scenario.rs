//! Scenario files: the schema, loading, and the checks that make bad input a located error.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use crate::duration::Dur;
use crate::input::{located, InputError};
use crate::probe::Requirement;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub requires: Vec<Requirement>,
    pub ranks: Spanned<u32>,
    /// Whole-scenario deadline, per repeat.
    pub deadline: Dur,
    #[serde(default = "one")]
    pub repeat: u32,
    #[serde(default)]
    pub faults: Vec<Spanned<Fault>>,
    pub steps: Vec<Spanned<Step>>,
    pub expect: BTreeMap<Metric, Spanned<Bound>>,
}

fn one() -> u32 {
    1
}

/// Kill or freeze a rank when it reports reaching a named point.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub rank: u32,
    pub at: String,
    pub action: FaultAction,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FaultAction {
    /// Kill the rank's process.
    Sigkill,
    /// Freeze the rank's process (its sockets stay open).
    Sigstop,
    /// Kill the rank's whole host (container hosts only).
    HostKill,
    /// Freeze the rank's whole host (docker pause).
    HostFreeze,
    /// Cut the host's data link silently: no FIN, no RST.
    LinkCut,
    /// Rate-limit the host's data link to 10 Mbit/s (tc tbf).
    RateLimit,
}

impl FaultAction {
    /// Acts on a host, so it needs hosts the harness controls (the containers profile).
    pub fn is_host_level(self) -> bool {
        !matches!(self, FaultAction::Sigkill | FaultAction::Sigstop)
    }

    /// The rank will not finish by itself afterwards (it is dead or frozen).
    pub fn stops_the_rank(self) -> bool {
        matches!(
            self,
            FaultAction::Sigkill
                | FaultAction::Sigstop
                | FaultAction::HostKill
                | FaultAction::HostFreeze
        )
    }

    /// The rank's own errors afterwards are the fault's doing, not the transport's.
    pub fn excuses_the_rank(self) -> bool {
        self != FaultAction::RateLimit
    }
}

/// One step and its typed parameters. Every step carries its own deadline.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum Step {
    /// Rank 1 connects to rank 0, both receivers block, rank 0 tears down; `cycles` times.
    TeardownCycles { cycles: u32, deadline: Dur },
    /// Rank 1 (adversarial raw peer) dribbles frames byte by byte and splits one at every offset.
    ExactReads {
        dribbled_frames: u32,
        split_payload_bytes: u32,
        deadline: Dur,
    },
    /// Rank 1 (adversarial raw peer) ends streams cleanly, inside a header, inside a payload,
    /// with garbage, or not at all (rank 0 shuts down locally).
    EofTruncation { deadline: Dur },
    /// Rank 1 sends garbage; rank 0's send and flush must report the receiver's failure.
    ReceiverError { deadline: Dur },
    /// Rank `victim` streams to rank 0 and reports the point `mid-stream` (where faults strike).
    PeerDeath {
        victim: u32,
        frames_before_fault: u32,
        detect_timeout: Dur,
        deadline: Dur,
    },
    /// Gloo's lazy-connect cases between rank 0 (listener) and rank 1 (initiator).
    LazyConnect { wait_timeout: Dur, deadline: Dur },
    /// Rank 1 reports `partitioned` (where a link cut strikes), then lazily connects to rank 0:
    /// both sides must fail within their deadlines instead of hanging.
    LazyConnectPartition {
        wait_timeout: Dur,
        connect_deadline: Dur,
        deadline: Dur,
    },
    /// Full-mesh lazy connect and a first exchange, with one rank exiting before it.
    ExitBeforeFirstExchange {
        exiting_rank: u32,
        connect_timeout: Dur,
        deadline: Dur,
    },
    /// Full-mesh ping-pong with data verification at every size.
    Pingpong {
        sizes: Vec<u32>,
        iterations: u32,
        deadline: Dur,
    },
    /// RC over rdma_cm between rank 0 (server) and rank 1: SEND ping-pong, then WRITE with
    /// immediate ping-pong, at every size, every byte checked.
    RdmaPingpong {
        sizes: Vec<u32>,
        iterations: u32,
        deadline: Dur,
    },
    /// Rank 1 SENDs `messages` messages of `size` bytes to rank 0, which counts and checks them.
    RdmaLosslessStream {
        messages: u32,
        size: u32,
        deadline: Dur,
    },
    /// Rank 0 runs the DAQIRI-shaped RDMA server (worker per connection, stats thread); rank 1
    /// connects, exchanges `messages` and disconnects, `connections` times; then the server
    /// shuts down gracefully.
    RdmaGracefulShutdown {
        connections: u32,
        messages: u32,
        stats_period: Dur,
        deadline: Dur,
    },
    /// The server is configured with every local RoCE interface in reverse order; rank 1
    /// connects once to each address and says which one it dialled.
    RdmaInterfaceIndex { deadline: Dur },
    /// Rank `victim` streams SENDs to rank 0 and reports `mid-stream` (where faults strike).
    RdmaPeerDeath {
        frames_before_fault: u32,
        detect_timeout: Dur,
        deadline: Dur,
    },
    /// DAQIRI #113 across hosts: rank 0 runs the RDMA server for `server_seconds`, rank 1 (on the
    /// other host) SENDs `messages` and receives every echo; then the server's timer ends it.
    RdmaXhostSend {
        messages: u32,
        server_seconds: Dur,
        deadline: Dur,
    },
    /// Rank 0 plays ping-pong with rdma-core's `ibv_rc_pingpong` on this host, in both roles,
    /// speaking its out-of-band exchange.
    RdmaInteropRcPingpong {
        size: u32,
        iterations: u32,
        deadline: Dur,
    },
    /// Ranks 0 and 1, each on a GPU: ping-pong of device buffers over TCP (staged through
    /// pinned host memory), the pattern written and checked on the device at every size; then
    /// `stream_messages` of the largest size one way, for bandwidth.
    GpuPingpongTcp {
        sizes: Vec<u32>,
        iterations: u32,
        stream_messages: u32,
        deadline: Dur,
    },
    /// The same over an RC connection with RDMA WRITE: GPU memory registered through dmabuf
    /// where the GPU and NIC allow it, else staged through pinned host memory.
    GpuPingpongRdma {
        sizes: Vec<u32>,
        iterations: u32,
        stream_messages: u32,
        deadline: Dur,
    },
    /// Do nothing for `duration`: a harness self-test for the watchdog.
    Stall { duration: Dur, deadline: Dur },
}

impl Step {
    pub fn name(&self) -> &'static str {
        match self {
            Step::TeardownCycles { .. } => "teardown-cycles",
            Step::ExactReads { .. } => "exact-reads",
            Step::EofTruncation { .. } => "eof-truncation",
            Step::ReceiverError { .. } => "receiver-error",
            Step::PeerDeath { .. } => "peer-death",
            Step::LazyConnect { .. } => "lazy-connect",
            Step::LazyConnectPartition { .. } => "lazy-connect-partition",
            Step::ExitBeforeFirstExchange { .. } => "exit-before-first-exchange",
            Step::Pingpong { .. } => "pingpong",
            Step::RdmaPingpong { .. } => "rdma-pingpong",
            Step::RdmaLosslessStream { .. } => "rdma-lossless-stream",
            Step::RdmaGracefulShutdown { .. } => "rdma-graceful-shutdown",
            Step::RdmaInterfaceIndex { .. } => "rdma-interface-index",
            Step::RdmaPeerDeath { .. } => "rdma-peer-death",
            Step::RdmaXhostSend { .. } => "rdma-xhost-send",
            Step::RdmaInteropRcPingpong { .. } => "rdma-interop-rc-pingpong",
            Step::GpuPingpongTcp { .. } => "gpu-pingpong-tcp",
            Step::GpuPingpongRdma { .. } => "gpu-pingpong-rdma",
            Step::Stall { .. } => "stall",
        }
    }

    pub fn deadline(&self) -> Dur {
        match self {
            Step::TeardownCycles { deadline, .. }
            | Step::ExactReads { deadline, .. }
            | Step::EofTruncation { deadline }
            | Step::ReceiverError { deadline }
            | Step::PeerDeath { deadline, .. }
            | Step::LazyConnect { deadline, .. }
            | Step::LazyConnectPartition { deadline, .. }
            | Step::ExitBeforeFirstExchange { deadline, .. }
            | Step::Pingpong { deadline, .. }
            | Step::RdmaPingpong { deadline, .. }
            | Step::RdmaLosslessStream { deadline, .. }
            | Step::RdmaGracefulShutdown { deadline, .. }
            | Step::RdmaInterfaceIndex { deadline }
            | Step::RdmaPeerDeath { deadline, .. }
            | Step::RdmaXhostSend { deadline, .. }
            | Step::RdmaInteropRcPingpong { deadline, .. }
            | Step::GpuPingpongTcp { deadline, .. }
            | Step::GpuPingpongRdma { deadline, .. }
            | Step::Stall { deadline, .. } => *deadline,
        }
    }

    /// Fewest ranks the step needs.
    fn min_ranks(&self) -> u32 {
        match self {
            Step::Stall { .. } | Step::RdmaInteropRcPingpong { .. } => 1,
            Step::ExitBeforeFirstExchange { .. } => 3,
            _ => 2,
        }
    }

    /// The evidence (metrics) this step reports, so expectations can be checked at load time.
    pub fn metrics(&self) -> &'static [Metric] {
        use Metric::*;
        match self {
            Step::TeardownCycles { .. } => &[
                Cycles,
                ShutdownP50Ms,
                ShutdownP99Ms,
                Ebadf,
                FdDelta,
                ThreadDelta,
            ],
            Step::ExactReads { .. } => &[FramesIntact, FramesCorrupt, FramesMissing],
            Step::EofTruncation { .. } => &[EofCases, EofMisclassified],
            Step::ReceiverError { .. } => &[SendSawReceiverError, FlushSawReceiverError],
            Step::PeerDeath { .. } | Step::ExitBeforeFirstExchange { .. } => {
                &[SurvivorDetected, DetectMs]
            }
            Step::LazyConnect { .. } => &[
                ListenerTimeoutFired,
                ListenerTimeoutMs,
                SpuriousTimeouts,
                LateSocketRejected,
                StaleDropped,
                ReuseConnectionsOk,
                DuplicateWaitRejected,
                ShutdownWaitersFailed,
                ShutdownReleaseMs,
            ],
            Step::LazyConnectPartition { .. } => &[
                ListenerTimeoutFired,
                ListenerTimeoutMs,
                InitiatorConnectFailed,
                ConnectFailMs,
            ],
            Step::Pingpong { .. } => &[PairsVerified, DataMismatches],
            Step::RdmaPingpong { .. } => &[
                RdmaMessages,
                RdmaDataMismatches,
                RdmaCompletionErrors,
                RetryExcErr,
            ],
            Step::RdmaLosslessStream { .. } => &[
                RdmaTxMessages,
                RdmaRxMessages,
                RdmaRxBytes,
                RdmaDropped,
                RdmaCompletionErrors,
                RetryExcErr,
            ],
            Step::RdmaGracefulShutdown { .. } => &[
                RdmaConnectionsServed,
                RdmaWorkersJoined,
                RdmaPoolLeaked,
                RdmaShutdownMs,
                RdmaStatsSamples,
                RdmaDataMismatches,
                RdmaCompletionErrors,
            ],
            Step::RdmaInterfaceIndex { .. } => &[RdmaInterfacesServed, RdmaInterfaceMismatches],
            Step::RdmaPeerDeath { .. } => &[SurvivorDetected, DetectMs],
            Step::RdmaXhostSend { .. } => &[
                RdmaTxMessages,
                RdmaRxMessages,
                RdmaEchoes,
                RetryExcErr,
                RdmaShutdownMs,
                RdmaCompletionErrors,
            ],
            Step::RdmaInteropRcPingpong { .. } => {
                &[InteropAsClient, InteropAsServer, RdmaCompletionErrors]
            }
            Step::GpuPingpongTcp { .. } => &[
                GpuMessages,
                GpuDataMismatches,
                GpuPatternHostMismatches,
                GpuBandwidthGbps,
            ],
            Step::GpuPingpongRdma { .. } => &[
                GpuMessages,
                GpuDataMismatches,
                GpuPatternHostMismatches,
                GpuBandwidthGbps,
                GpuDmabuf,
                RdmaCompletionErrors,
            ],
            Step::Stall { .. } => &[],
        }
    }
}

/// Every metric a step can report. Expectations name these; a typo is a located error.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Cycles,
    ShutdownP50Ms,
    ShutdownP99Ms,
    Ebadf,
    FdDelta,
    ThreadDelta,
    FramesIntact,
    FramesCorrupt,
    FramesMissing,
    EofCases,
    EofMisclassified,
    SendSawReceiverError,
    FlushSawReceiverError,
    SurvivorDetected,
    DetectMs,
    ListenerTimeoutFired,
    ListenerTimeoutMs,
    SpuriousTimeouts,
    LateSocketRejected,
    StaleDropped,
    ReuseConnectionsOk,
    DuplicateWaitRejected,
    ShutdownWaitersFailed,
    ShutdownReleaseMs,
    PairsVerified,
    DataMismatches,
    InitiatorConnectFailed,
    ConnectFailMs,
    RdmaMessages,
    RdmaDataMismatches,
    RdmaCompletionErrors,
    RetryExcErr,
    RdmaTxMessages,
    RdmaRxMessages,
    RdmaRxBytes,
    RdmaDropped,
    RdmaConnectionsServed,
    RdmaWorkersJoined,
    RdmaPoolLeaked,
    RdmaShutdownMs,
    RdmaStatsSamples,
    RdmaInterfacesServed,
    RdmaInterfaceMismatches,
    RdmaEchoes,
    InteropAsClient,
    InteropAsServer,
    GpuMessages,
    GpuDataMismatches,
    /// Bytes where the device's fill kernel and the host's reference pattern disagree.
    GpuPatternHostMismatches,
    GpuBandwidthGbps,
    /// 1 when both of a rank's GPU regions were registered through dmabuf, 0 when staged.
    GpuDmabuf,
}

impl Metric {
    pub fn as_str(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str())
    }
}

/// A typed bound that every observation of a metric must satisfy.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Bound {
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub equals: Option<f64>,
}

impl Bound {
    pub fn check(&self, value: f64) -> Result<(), String> {
        if let Some(e) = self.equals {
            if value != e {
                return Err(format!("{value} != {e}"));
            }
        }
        if let Some(m) = self.min {
            if value < m {
                return Err(format!("{value} < min {m}"));
            }
        }
        if let Some(m) = self.max {
            if value > m {
                return Err(format!("{value} > max {m}"));
            }
        }
        Ok(())
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = vec![];
        if let Some(v) = self.equals {
            parts.push(format!("= {v}"));
        }
        if let Some(v) = self.min {
            parts.push(format!(">= {v}"));
        }
        if let Some(v) = self.max {
            parts.push(format!("<= {v}"));
        }
        f.write_str(&parts.join(", "))
    }
}

/// A scenario as loaded from disk, with where it came from.
#[derive(Debug)]
pub struct Loaded {
    pub path: PathBuf,
    pub scenario: Scenario,
}

impl Loaded {
    pub fn steps(&self) -> Vec<Step> {
        self.scenario
            .steps
            .iter()
            .map(|s| s.value.clone())
            .collect()
    }

    pub fn faults(&self) -> Vec<Fault> {
        self.scenario
            .faults
            .iter()
            .map(|f| f.value.clone())
            .collect()
    }

    pub fn ranks(&self) -> u32 {
        self.scenario.ranks.value
    }
}

/// Parse and check one scenario file.
pub fn load(path: &Path) -> Result<Loaded, InputError> {
    let text = std::fs::read_to_string(path).map_err(|e| InputError::io(path, e))?;
    let scenario: Scenario = crate::input::parse_yaml(path, &text)?;
    check(path, &scenario)?;
    Ok(Loaded {
        path: path.to_owned(),
        scenario,
    })
}

fn check(path: &Path, s: &Scenario) -> Result<(), InputError> {
    let ranks = s.ranks.value;
    if !(1..=256).contains(&ranks) {
        return Err(located(
            path,
            &s.ranks.referenced,
            format!("ranks must be 1..=256, got {ranks}"),
        ));
    }
    if s.repeat == 0 {
        return Err(InputError::plain(path, "repeat must be at least 1"));
    }
    if s.steps.is_empty() {
        return Err(InputError::plain(
            path,
            "a scenario needs at least one step",
        ));
    }
    for step in &s.steps {
        if ranks < step.value.min_ranks() {
            return Err(located(
                path,
                &step.referenced,
                format!(
                    "step `{}` needs at least {} ranks, the scenario has {ranks}",
                    step.value.name(),
                    step.value.min_ranks()
                ),
            ));
        }
        if let Step::PeerDeath { victim, .. } = step.value {
            if victim == 0 || victim >= ranks {
                return Err(located(
                    path,
                    &step.referenced,
                    format!("victim must be a rank other than 0 (1..{ranks}), got {victim}"),
                ));
            }
        }
        if let Step::ExitBeforeFirstExchange { exiting_rank, .. } = step.value {
            if exiting_rank >= ranks {
                return Err(located(
                    path,
                    &step.referenced,
                    format!("exiting_rank {exiting_rank} is not a rank (0..{ranks})"),
                ));
            }
        }
        if let Step::Pingpong {
            sizes, iterations, ..
        }
        | Step::GpuPingpongTcp {
            sizes, iterations, ..
        }
        | Step::GpuPingpongRdma {
            sizes, iterations, ..
        } = &step.value
        {
            if sizes.is_empty() || *iterations == 0 || sizes.iter().any(|&b| b == 0 || b > 16 << 20)
            {
                return Err(located(
                    path,
                    &step.referenced,
                    format!(
                        "{} needs sizes in 1..=16MiB and iterations >= 1",
                        step.value.name()
                    ),
                ));
            }
        }
    }
    for fault in &s.faults {
        if fault.value.rank >= ranks {
            return Err(located(
                path,
                &fault.referenced,
                format!(
                    "fault names rank {}, the scenario has {ranks}",
                    fault.value.rank
                ),
            ));
        }
    }
    let produced: Vec<Metric> = s
        .steps
        .iter()
        .flat_map(|st| st.value.metrics().iter().copied())
        .collect();
    for (metric, bound) in &s.expect {
        if !produced.contains(metric) {
            return Err(located(
                path,
                &bound.referenced,
                format!("no step of this scenario reports `{metric}`; it would never be checked"),
            ));
        }
        let b = bound.value;
        if b.min.is_none() && b.max.is_none() && b.equals.is_none() {
            return Err(located(
                path,
                &bound.referenced,
                "a bound needs min, max or equals".into(),
            ));
        }
    }
    Ok(())
}

/// Expand files and folders into scenario files, sorted, so a run's order is stable.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>, InputError> {
    let mut found = vec![];
    for p in paths {
        if p.is_dir() {
            let entries = std::fs::read_dir(p).map_err(|e| InputError::io(p, e))?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| matches!(f.extension().and_then(|x| x.to_str()), Some("yaml" | "yml")))
                .collect();
            files.sort();
            found.extend(files);
        } else if p.is_file() {
            found.push(p.clone());
        } else {
            return Err(InputError::plain(p, "no such scenario file or folder"));
        }
    }
    Ok(found)
}
