//! One trait for every kind of host a profile names: local processes, hosts over SSH, container
//! hosts, Slurm nodes and soft-RoCE VMs. The orchestration asks a backend where ranks go, how
//! they start, what it can strike, and how it heals; it never asks which kind it is.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use crate::hosts::shell::HostShell;
use crate::hosts::slurm::Slurm;
use crate::model::faults::{HostPlane, Site, WirePlane};
use crate::model::scenario::{FaultAction, Strikes};

/// Where the rendezvous listens here, and the address ranks are told to reach it at (the
/// same, except where the hosts see this machine under another address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    pub bind: IpAddr,
    pub advertise: IpAddr,
}

impl Rendezvous {
    pub fn at(ip: IpAddr) -> Rendezvous {
        Rendezvous {
            bind: ip,
            advertise: ip,
        }
    }
}

/// A host that ranks run on (over SSH, or a Slurm node), with this build of wringer on it.
#[derive(Clone, Debug)]
pub struct RemoteHost {
    pub target: HostShell,
    pub exe: String,
    /// What ranks on this host bind to and advertise.
    pub data_addr: String,
}

/// How a backend's ranks start.
pub enum Launch<'a> {
    /// Children of this process.
    Local,
    /// One `ssh` child per rank, to the rank's host's shell.
    PerRank,
    /// One Slurm job step carries them all.
    Step(&'a Arc<Slurm>),
}

/// A prepared set of hosts. Dropping it takes down whatever it started (containers, VMs, a
/// test cluster, an allocation).
pub trait Backend: Send + Sync {
    /// A name for messages: the profile's kind.
    fn kind(&self) -> &'static str;

    /// The hosts ranks run on, each with a shell; empty when ranks are local processes.
    fn hosts(&self) -> &[RemoteHost] {
        &[]
    }

    /// The host rank `rank` runs on (round-robin over the hosts unless the backend lays ranks
    /// out itself).
    fn host_of(&self, rank: u32) -> usize {
        match self.hosts().len() {
            0 => 0,
            n => rank as usize % n,
        }
    }

    /// A shell on host `host`, for probes, signals, stacks, traces and leftovers.
    fn shell(&self, host: usize) -> Option<&HostShell> {
        self.hosts().get(host).map(|h| &h.target)
    }

    fn rendezvous(&self) -> Rendezvous;

    fn launch(&self) -> Launch<'_>;

    /// The fault planes that can be struck here: whole hosts (kill, freeze, link cut, rate
    /// limit), the RoCE wire (loss, delay, reorder, corruption, blackhole, port down).
    fn strikes(&self) -> Strikes {
        Strikes::default()
    }

    /// Host `host` as a host-level fault reaches it (kill, freeze, link cut, rate limit),
    /// where this backend can strike whole hosts.
    fn host_plane(&self, host: usize) -> Option<Box<dyn HostPlane + '_>> {
        let _ = host;
        None
    }

    /// Host `host`'s end of the RoCE wire, where this backend can strike it.
    fn wire_plane(&self, host: usize) -> Option<Box<dyn WirePlane + '_>> {
        let _ = host;
        None
    }

    /// Strike a host-level or wire fault on host `host`, through the plane it reaches;
    /// `seed` fixes any pattern it has.
    fn strike(&self, action: FaultAction, host: usize, seed: u64) -> Result<()> {
        let (hosts, wire) = (self.host_plane(host), self.wire_plane(host));
        let site = Site {
            backend: self.kind(),
            rank: None,
            host: hosts.as_deref(),
            wire: wire.as_deref(),
            seed,
        };
        action.kind().strike(&site)
    }

    /// What the struck faults did, read before they are healed (packets a wire fault matched,
    /// say): evidence that a fault did strike, one line per host.
    fn fault_evidence(&self) -> Vec<String> {
        vec![]
    }

    /// Undo every strike, so the hosts can be reached and used again.
    fn heal(&self) -> Result<()> {
        Ok(())
    }

    /// Once an attempt's processes are gone: put back what healing could not while they
    /// lived (a VM's rxe device after its link went down).
    fn renew(&self) -> Result<()> {
        Ok(())
    }

    /// What the backend's own machinery left on host `host` of an attempt that is over: the
    /// processes whose command line holds `needle` or whose group is one of `groups`. Local
    /// ranks are checked by their launcher from /proc; a remote host's table comes from `ps`.
    fn leftovers(&self, host: usize, needle: &str, groups: &[u32]) -> Vec<String> {
        let Some(shell) = self.shell(host) else {
            return vec![];
        };
        match shell.check(
            &["ps", "-eo", "pid,pgid,stat,args"],
            Duration::from_secs(60),
        ) {
            Ok(table) => table
                .lines()
                .filter(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    // A zombie is already dead; its parent (sshd) reaps it.
                    f.len() > 3
                        && !f[2].starts_with('Z')
                        && (l.contains(needle) || groups.iter().any(|g| g.to_string() == f[1]))
                })
                .map(|l| format!("{}: {}", shell.name, l.trim()))
                .collect(),
            Err(e) => vec![format!("{}: could not list processes: {e:#}", shell.name)],
        }
    }
}

/// Every rank a local process on loopback.
pub struct LocalHost;

impl Backend for LocalHost {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn rendezvous(&self) -> Rendezvous {
        Rendezvous::at(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    fn launch(&self) -> Launch<'_> {
        Launch::Local
    }
}

/// Hosts reached over SSH (an inventory), each with this build deployed.
pub struct SshHosts {
    pub hosts: Vec<RemoteHost>,
    /// This machine's address as the hosts see it.
    pub rendezvous: IpAddr,
}

impl Backend for SshHosts {
    fn kind(&self) -> &'static str {
        "ssh"
    }

    fn hosts(&self) -> &[RemoteHost] {
        &self.hosts
    }

    fn rendezvous(&self) -> Rendezvous {
        Rendezvous::at(self.rendezvous)
    }

    fn launch(&self) -> Launch<'_> {
        Launch::PerRank
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_without_host_control_refuses_a_host_fault_by_name() {
        let local = LocalHost;
        assert_eq!(local.strikes(), Strikes::default());
        let why = local.strike(FaultAction::HostKill, 0, 1).unwrap_err();
        assert!(why.to_string().contains("local hosts cannot"), "{why}");
        assert!(local.heal().is_ok());
        assert_eq!(local.host_of(7), 0);
        assert!(local.leftovers(0, "x", &[]).is_empty());
    }
}
