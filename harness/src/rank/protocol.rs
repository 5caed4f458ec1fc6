//! The rendezvous protocol between the coordinator and its ranks: JSON lines over TCP on
//! loopback. A rank proves it belongs to the run with the per-run token in its first line.

use crate::model::invalid::Invalid;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::model::metric::{Metric, SampleKey, Series};

/// Environment variable that carries the run token to ranks (never on the command line, where
/// every user of the machine could read it).
pub const TOKEN_ENV: &str = "WRINGER_RUN_TOKEN";

/// The transport bug a `bug-injection` build switches on in a rank (tests only).
pub const TRANSPORT_BUG_ENV: &str = "WRINGER_TRANSPORT_BUG";

/// Where a rank can be reached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerAddrs {
    /// The transport `Listener` (lazy connects with hello and token).
    pub transport: SocketAddr,
    /// A plain TCP listener for adversarial raw peers.
    pub raw: SocketAddr,
    /// The address of this rank's first active RoCE interface, when it has one.
    #[serde(default)]
    pub rdma: Option<std::net::IpAddr>,
    /// A free TCP port on this rank's host, reserved for an external program (exec steps).
    #[serde(default)]
    pub exec_port: u16,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum RankMsg {
    Hello {
        rank: u32,
        token: String,
        pid: u32,
    },
    Ready {
        addrs: PeerAddrs,
    },
    StepStart {
        step: usize,
    },
    /// The rank reached a named point; faults strike here.
    Point {
        step: usize,
        name: String,
    },
    /// Wait until `parties` ranks have reached `name`. When `members` names them, a member a
    /// fault stops (killed, frozen, its host gone) is no longer waited for.
    Barrier {
        name: String,
        parties: u32,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<u32>,
    },
    StepResult(StepReport),
    StepError {
        step: usize,
        error: String,
    },
    /// The rank is about to exit on purpose (part of the scenario).
    ExitingByDesign {
        step: usize,
        reason: String,
    },
    Done,
}

/// A rank's evidence from one step: typed metrics, latency samples by series and size, notes.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct StepReport {
    pub step: usize,
    pub metrics: BTreeMap<Metric, f64>,
    /// Raw latency samples (µs) for the coordinator's histograms.
    #[serde(default)]
    pub samples: BTreeMap<SampleKey, Vec<f64>>,
    #[serde(default)]
    pub notes: Vec<String>,
    /// Per-attempt outcomes, for steps whose verdict needs both sides (see
    /// `StepKind::reconcile`): each a value of the kind's own outcome type (see
    /// [`StepReport::outcome`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outcomes: Vec<serde_json::Value>,
    /// Times each declared reachability point was reached.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reached: BTreeMap<String, u64>,
}

impl StepReport {
    pub fn new(step: usize) -> StepReport {
        StepReport {
            step,
            ..StepReport::default()
        }
    }

    /// This rank reached `point` (once more).
    pub fn reach(&mut self, point: crate::model::reach::ReachPoint) {
        *self.reached.entry(point.name.to_string()).or_default() += 1;
    }

    /// This rank reached `point` `times` times (nothing when 0).
    pub fn reach_times(&mut self, point: crate::model::reach::ReachPoint, times: u64) {
        if times > 0 {
            *self.reached.entry(point.name.to_string()).or_default() += times;
        }
    }

    /// Add latency samples (µs) of `series` at message size `size`.
    pub fn sample(&mut self, series: Series, size: u64, values: Vec<f64>) {
        let key = SampleKey { series, size };
        self.samples.entry(key).or_default().extend(values);
    }

    /// Record one outcome of the step kind's own type.
    pub fn outcome<T: Serialize>(&mut self, outcome: &T) -> serde_json::Result<()> {
        self.outcomes.push(serde_json::to_value(outcome)?);
        Ok(())
    }

    /// Every outcome, read back as the kind's type; one that does not read is an error that
    /// names it (never dropped, or an attempt would go uncounted).
    pub fn outcomes<T: serde::de::DeserializeOwned>(&self) -> Result<Vec<T>, Invalid> {
        self.outcomes
            .iter()
            .enumerate()
            .map(|(i, v)| {
                T::deserialize(v).map_err(|e| {
                    Invalid(format!(
                        "step {}'s outcome {i} does not read: {e}: {v}",
                        self.step
                    ))
                })
            })
            .collect()
    }

    /// Every metric and series recorded must be one the step kind declared: evidence nobody
    /// declared would reach no expectation and no page, silently.
    pub fn check_declared(&self, metrics: &[Metric], series: &[Series]) -> Result<(), Invalid> {
        let stray: Vec<String> = self
            .metrics
            .keys()
            .filter(|m| !metrics.contains(m))
            .map(|m| m.to_string())
            .chain(
                self.samples
                    .keys()
                    .filter(|k| !series.contains(&k.series))
                    .map(|k| format!("samples {k}")),
            )
            .collect();
        if stray.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the step recorded evidence its kind does not declare: {}",
                stray.join(", ")
            )
            .into())
        }
    }
}

/// What the coordinator sends a rank. Generic over the step type, so the protocol does not
/// depend on the step kinds (the worker and the coordinator both use `rank::steps::Step`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum CoordMsg<S> {
    Start {
        steps: Vec<S>,
        peers: Vec<PeerAddrs>,
        seed: u64,
        token: String,
    },
    Release {
        name: String,
    },
}

pub fn write_line<W: Write, T: Serialize>(w: &mut W, msg: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// Read one message; `Ok(None)` at EOF.
pub fn read_line<R: BufRead, T: for<'de> Deserialize<'de>>(
    r: &mut R,
) -> std::io::Result<Option<T>> {
    let mut line = String::new();
    // Lines are small; cap them so a confused peer cannot grow this without bound.
    let n = std::io::Read::take(&mut *r, 16 << 20).read_line(&mut line)?;
    if n == 0 {
        return Ok(None);
    }
    serde_json::from_str(&line)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::declare_metrics! {
        TEST_CYCLES = "test_protocol_cycles", Count, Neither;
        TEST_EBADF = "test_protocol_ebadf", Count, Lower;
        TEST_DETECT_MS = "test_protocol_detect_ms", Milliseconds, Lower;
    }

    #[test]
    fn evidence_a_step_did_not_declare_is_refused() {
        let mut r = StepReport::new(0);
        r.metrics.insert(TEST_CYCLES, 1.0);
        r.sample(Series::Latency, 64, vec![1.0]);
        assert!(r.check_declared(&[TEST_CYCLES], &[Series::Latency]).is_ok());
        let err = r
            .check_declared(&[TEST_EBADF], &[Series::Latency])
            .unwrap_err();
        assert!(err.contains("test_protocol_cycles"), "{err}");
        let err = r.check_declared(&[TEST_CYCLES], &[]).unwrap_err();
        assert!(err.contains("samples latency/64"), "{err}");
    }

    #[test]
    fn a_step_report_crosses_the_wire_typed() {
        let mut r = StepReport::new(3);
        r.metrics.insert(TEST_DETECT_MS, 2.5);
        r.sample(Series::WriteLatency, 4096, vec![1.0, 2.0]);
        let mut line = vec![];
        write_line(&mut line, &RankMsg::StepResult(r)).unwrap();
        let back: RankMsg = read_line(&mut &line[..]).unwrap().unwrap();
        let RankMsg::StepResult(back) = back else {
            panic!("not a step result: {back:?}")
        };
        assert_eq!(back.metrics.get(&TEST_DETECT_MS), Some(&2.5));
        let key = SampleKey {
            series: Series::WriteLatency,
            size: 4096,
        };
        assert_eq!(back.samples.get(&key), Some(&vec![1.0, 2.0]));
    }
}
