//! The rendezvous protocol between the coordinator and its ranks: JSON lines over TCP on
//! loopback. A rank proves it belongs to the run with the per-run token in its first line.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::scenario::Step;

/// Environment variable that carries the run token to ranks (never on the command line, where
/// every user of the machine could read it).
pub const TOKEN_ENV: &str = "WRINGER_RUN_TOKEN";

/// Where a rank can be reached.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerAddrs {
    /// The transport `Listener` (lazy connects with hello and token).
    pub transport: SocketAddr,
    /// A plain TCP listener for adversarial raw peers.
    pub raw: SocketAddr,
    /// The address of this rank's first active RoCE interface, when it has one.
    #[serde(default)]
    pub rdma: Option<std::net::IpAddr>,
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
    /// Wait until `parties` ranks have reached `name`.
    Barrier {
        name: String,
        parties: u32,
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

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct StepReport {
    pub step: usize,
    pub metrics: BTreeMap<String, f64>,
    /// Raw samples (for example latencies in µs per message size) for the coordinator's
    /// histograms.
    #[serde(default)]
    pub samples: BTreeMap<String, Vec<f64>>,
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum CoordMsg {
    Start {
        steps: Vec<Step>,
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
