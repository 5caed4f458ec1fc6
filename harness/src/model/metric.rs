//! Typed evidence: the metrics a step records, the latency series it samples, and the bounds a
//! scenario's `expect` puts on them. The same types travel from a rank's step to the page.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

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
    /// Case-table steps (an adversary plays several cases): how many cases ran,
    Cases,
    /// how many ended with another outcome than the case demands,
    CasesMisclassified,
    /// how many ended later than the case's deadline allows,
    CasesLate,
    /// and the slowest case's time to its outcome.
    SlowestCaseMs,
    /// The RDMA server's stats thread: its longest wait for the registry lock.
    RdmaStatsMaxLockWaitMs,
    /// The longest an RDMA disconnect waited for its worker to leave.
    RdmaWorkerExitMs,
    /// Teardowns whose closing side's receiver ended some other way than by its own shutdown.
    CloserNotLocalShutdown,
    /// Attempts a race step made,
    Attempts,
    /// those both sides saw connected,
    BothConnected,
    /// those neither side did (the initiator refused or closed, never left in silence),
    NeitherConnected,
    /// and those where the two sides disagree, or the initiator was left in silence.
    Disagreements,
    /// An external program: from the fault to its exit (the slowest survivor),
    ExitMs,
    /// and what it printed of itself: median and tail latency,
    LatencyP50Us,
    LatencyP99Us,
    /// mean latency, where that is all it prints,
    LatencyAvgUs,
    /// bandwidth,
    BandwidthGbps,
    /// and rounds (iterations, collectives) completed.
    Rounds,
    /// The read path's hand-over: frames delivered,
    FramesDelivered,
    /// those delivered out of order, twice, never, or not as sent,
    FramesOutOfOrder,
    /// those a caller read itself, those taken from the receiver thread's queue,
    FramesReadDirectly,
    FramesFromQueue,
    /// how often the stream changed readers, and the rounds where a caller arrived while the
    /// receiver held half a frame.
    ReadHandovers,
    HandoverRounds,
    /// Frames not returned whole by the `recv` after deadlines expired inside them,
    FramesLostAfterTimeout,
    /// and the deadlines that expired inside a header, and inside a payload.
    MidHeaderTimeouts,
    MidPayloadTimeouts,
    /// Ends a caller read that a caller, `send`, `flush` or the connection reported otherwise,
    EndsMisreported,
    /// and ends the receiver thread found instead of a caller (the case tested no caller).
    EndsFoundByReceiver,
    /// Closes with callers blocked in `recv`: with the receiver parked aside, and with it
    /// waiting for bytes;
    CyclesReceiverParked,
    CyclesReceiverWaiting,
    /// closes that outlasted their bound (waited for the peer),
    ClosesWaitingForPeer,
    /// blocked callers that did not return local shutdown within the bound,
    CallersNotWokenByClose,
    /// and the slowest blocked caller's return after `close` began.
    CallerWakeMaxMs,
}

impl Metric {
    /// The metric's name in YAML, JSON and on the page.
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
    /// Whether any value can meet the bound: finite numbers, min not above max, and an
    /// `equals` inside both.
    pub fn satisfiable(&self) -> Result<(), String> {
        let all = [self.min, self.max, self.equals];
        if all.iter().flatten().any(|v| !v.is_finite()) {
            return Err("bounds must be finite numbers (not NaN or infinity)".into());
        }
        if let (Some(lo), Some(hi)) = (self.min, self.max) {
            if lo > hi {
                return Err(format!("min {lo} is above max {hi}: no value can meet it"));
            }
        }
        if let Some(e) = self.equals {
            if self.min.is_some_and(|lo| e < lo) || self.max.is_some_and(|hi| e > hi) {
                return Err(format!(
                    "equals {e} lies outside min/max: no value can meet it"
                ));
            }
        }
        Ok(())
    }

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

/// A series of latency samples (µs, one-way), kept per message size.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Series {
    /// Ping-pong round trip / 2: TCP frames, RDMA SEND, GPU buffers.
    Latency,
    /// RDMA WRITE with immediate, round trip / 2.
    WriteLatency,
    /// RDMA WRITE into caller-registered regions, round trip / 2.
    RegionWriteLatency,
}

impl Series {
    pub const ALL: [Series; 3] = [
        Series::Latency,
        Series::WriteLatency,
        Series::RegionWriteLatency,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Series::Latency => "latency",
            Series::WriteLatency => "write_latency",
            Series::RegionWriteLatency => "region_write_latency",
        }
    }

    /// What the page calls it.
    pub fn title(self) -> &'static str {
        match self {
            Series::Latency => "one-way latency",
            Series::WriteLatency => "RDMA WRITE one-way latency",
            Series::RegionWriteLatency => "RDMA WRITE (registered regions) one-way latency",
        }
    }
}

/// One latency series at one message size: how samples are keyed from rank to page.
/// In JSON it is the text `series/size` (`latency/4096`); a bare size (`4096`), as reports
/// before schema 2 wrote it, reads as the `latency` series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SampleKey {
    pub series: Series,
    pub size: u64,
}

impl fmt::Display for SampleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.series.as_str(), self.size)
    }
}

impl FromStr for SampleKey {
    type Err = String;

    fn from_str(s: &str) -> Result<SampleKey, String> {
        let (series, size) = match s.split_once('/') {
            Some((name, size)) => {
                let series = Series::ALL
                    .into_iter()
                    .find(|x| x.as_str() == name)
                    .ok_or_else(|| format!("unknown latency series `{name}`"))?;
                (series, size)
            }
            None => (Series::Latency, s),
        };
        let size = size
            .parse()
            .map_err(|_| format!("`{s}`: the size is not a number of bytes"))?;
        Ok(SampleKey { series, size })
    }
}

impl Serialize for SampleKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SampleKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SampleKey, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_keys_round_trip_and_read_the_old_bare_size() {
        for series in Series::ALL {
            let k = SampleKey { series, size: 4096 };
            assert_eq!(k.to_string().parse::<SampleKey>(), Ok(k));
        }
        assert_eq!(
            "64".parse::<SampleKey>(),
            Ok(SampleKey {
                series: Series::Latency,
                size: 64
            })
        );
        assert!("nope/64".parse::<SampleKey>().is_err());
        assert!("latency/x".parse::<SampleKey>().is_err());
    }

    #[test]
    fn a_metric_is_named_in_snake_case() {
        assert_eq!(Metric::ShutdownP99Ms.as_str(), "shutdown_p99_ms");
        assert_eq!(Metric::GpuDmabuf.to_string(), "gpu_dmabuf");
    }
}
