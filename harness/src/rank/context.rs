//! What a step sees of its rank: its number, its peers, its listeners, and its line to the
//! coordinator (points where faults strike, barriers).

use std::collections::HashSet;
use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use wringer_transport::Listener;

use super::protocol::{write_line, PeerAddrs, RankMsg};

/// The rank's line to the coordinator, shared by the steps.
pub struct Control {
    writer: Mutex<TcpStream>,
    releases: Receiver<String>,
    released: Mutex<HashSet<String>>,
}

impl Control {
    pub fn new(writer: TcpStream, releases: Receiver<String>) -> Control {
        Control {
            writer: Mutex::new(writer),
            releases,
            released: Mutex::new(HashSet::new()),
        }
    }
}

impl Control {
    pub fn send(&self, msg: &RankMsg) -> Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        write_line(&mut *w, msg).context("writing to the coordinator")
    }

    /// Tell the coordinator we reached `name` (a fault may strike here).
    pub fn point(&self, step: usize, name: &str) -> Result<()> {
        self.send(&RankMsg::Point {
            step,
            name: name.into(),
        })
    }

    /// Report a point and wait until the coordinator has applied whatever fault strikes there.
    pub fn point_and_wait(&self, step: usize, name: &str, timeout: Duration) -> Result<()> {
        self.point(step, name)?;
        self.wait_release(&point_release(name), timeout)
    }

    /// Wait until `parties` ranks have reached the barrier `name`.
    pub fn barrier(&self, name: &str, parties: u32, timeout: Duration) -> Result<()> {
        self.send(&RankMsg::Barrier {
            name: name.into(),
            parties,
            members: vec![],
        })?;
        self.wait_release(name, timeout)
    }

    /// Wait until every rank of `members` has reached the barrier `name`, or been stopped by a
    /// fault (a survivor never waits for a rank the scenario killed).
    pub fn barrier_among(&self, name: &str, members: &[u32], timeout: Duration) -> Result<()> {
        self.send(&RankMsg::Barrier {
            name: name.into(),
            parties: members.len() as u32,
            members: members.to_vec(),
        })?;
        self.wait_release(name, timeout)
    }

    fn wait_release(&self, name: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self
                .released
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(name)
            {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.releases.recv_timeout(left) {
                Ok(n) if n == name => return Ok(()),
                Ok(other) => {
                    self.released
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(other);
                }
                Err(RecvTimeoutError::Timeout) => {
                    bail!("`{name}` not released within {timeout:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("the coordinator went away while we waited for `{name}`")
                }
            }
        }
    }
}

/// The release the coordinator sends once it has handled a point.
pub fn point_release(name: &str) -> String {
    format!("point:{name}")
}

/// Everything a step needs to know about the run.
pub struct RankContext {
    pub rank: u32,
    pub ranks: u32,
    pub peers: Vec<PeerAddrs>,
    pub token: u128,
    pub seed: u64,
    pub listener: Listener,
    pub raw: TcpListener,
    pub control: Control,
    /// A folder for this repeat's external programs, shared by the ranks of one host: named
    /// from the run's secret token, so nobody else can make it first (see [`Self::run_dir`]).
    pub run_folder: std::path::PathBuf,
}

impl RankContext {
    /// This repeat's folder for external programs (torch's FileStore, the GPU kernel cache),
    /// made private (0700) here, or checked to be this user's private folder when a rank of the
    /// same host made it first: a file in it is never one another user planted.
    pub fn run_dir(&self) -> Result<std::path::PathBuf> {
        crate::hosts::private::ensure_dir(&self.run_folder)?;
        Ok(self.run_folder.clone())
    }

    /// Two-party steps run between ranks 0 and 1; every other rank sits them out.
    pub fn in_pair(&self) -> bool {
        self.rank <= 1
    }

    /// A barrier between ranks 0 and 1, named per step so steps never share one.
    pub fn pair_barrier(&self, step: usize, name: &str, deadline: Duration) -> Result<()> {
        self.control
            .barrier(&format!("step-{step}-{name}"), 2, deadline)
    }
}
