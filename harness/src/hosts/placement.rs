//! From a host profile to a ready [`Placement`]: container hosts started, every host reached
//! over SSH, this build of wringer deployed and version-checked on each.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::hosts::containers::{self, ContainerHosts};
use crate::hosts::profile::{HostProfile, ProfileKind};
use crate::hosts::shell::{HostShell, Via};
use crate::hosts::slurm::cluster::TestCluster;
use crate::hosts::slurm::{BindRule, Slurm};
use crate::hosts::ssh::{deploy, deploy_shipped, SshTarget};

/// A host that ranks run on (over SSH, or a Slurm node), with this build of wringer on it.
#[derive(Clone, Debug)]
pub struct RemoteHost {
    pub target: HostShell,
    pub exe: String,
    /// What ranks on this host bind to and advertise.
    pub data_addr: String,
}

/// Where a run's ranks go.
#[derive(Clone)]
pub enum Placement {
    Local,
    Remote {
        hosts: Vec<RemoteHost>,
        /// This machine's address as the hosts see it; the rendezvous listens there.
        rendezvous: std::net::IpAddr,
        /// Ranks as one Slurm step per repeat, in this allocation (dropped before the test
        /// cluster it may live on).
        slurm: Option<Arc<Slurm>>,
        /// The Slurm test cluster, whose daemons a healed container needs started again.
        cluster: Option<Arc<TestCluster>>,
        /// Host-level fault control, when the hosts are our containers.
        containers: Option<Arc<ContainerHosts>>,
    },
}

impl Placement {
    pub fn rendezvous_ip(&self) -> std::net::IpAddr {
        match self {
            Placement::Local => std::net::IpAddr::from([127, 0, 0, 1]),
            Placement::Remote { rendezvous, .. } => *rendezvous,
        }
    }

    /// The host index rank `rank` runs on (ranks go round-robin over the hosts, or as the
    /// Slurm profile lays them out).
    pub fn host_of(&self, rank: u32) -> usize {
        match self {
            Placement::Local => 0,
            Placement::Remote {
                slurm: Some(s),
                hosts,
                ..
            } => s.layout.node_of(rank, hosts.len()),
            Placement::Remote { hosts, .. } => rank as usize % hosts.len(),
        }
    }

    pub fn slurm(&self) -> Option<&Arc<Slurm>> {
        match self {
            Placement::Remote { slurm, .. } => slurm.as_ref(),
            Placement::Local => None,
        }
    }

    pub fn test_cluster(&self) -> Option<&TestCluster> {
        match self {
            Placement::Remote {
                cluster: Some(c), ..
            } => Some(c),
            _ => None,
        }
    }

    pub fn containers(&self) -> Option<&ContainerHosts> {
        match self {
            Placement::Remote {
                containers: Some(c),
                ..
            } => Some(c),
            _ => None,
        }
    }
}

const REMOTE_DIR: &str = "~/.cache/wringer";

pub fn prepare(profile: &HostProfile, run_id: &str) -> Result<Placement> {
    prepare_sharing(profile, run_id, &[])
}

/// [`prepare`], with folders of this machine that container hosts must see at the same path
/// (read-only): the releases the run's scenarios use. Other kinds of host have their own.
pub fn prepare_sharing(
    profile: &HostProfile,
    run_id: &str,
    shares: &[PathBuf],
) -> Result<Placement> {
    match profile.kind {
        // An rxe-vm run happens inside its VM (see `vm`), where ranks are local.
        ProfileKind::Local | ProfileKind::RxeVm | ProfileKind::RxeVmPair => Ok(Placement::Local),
        ProfileKind::Containers => {
            let spec = profile
                .containers
                .as_ref()
                .context("a containers profile needs `containers:`")?;
            containers::sweep_leftovers();
            let c = ContainerHosts::start(spec.count, &spec.image, run_id, shares)?;
            c.wait_ssh(Duration::from_secs(60))?;
            let mut hosts = vec![];
            for (i, h) in c.hosts.iter().enumerate() {
                let target = c.target(i);
                let exe = deploy(&target, REMOTE_DIR)
                    .with_context(|| format!("deploying wringer to {}", h.name))?;
                deploy_shipped(&target, &exe)
                    .with_context(|| format!("deploying exec programs to {}", h.name))?;
                hosts.push(RemoteHost {
                    target: HostShell::ssh(target),
                    exe,
                    data_addr: h.data_ip.to_string(),
                });
            }
            let rendezvous = c.gateway;
            Ok(Placement::Remote {
                hosts,
                rendezvous,
                slurm: None,
                cluster: None,
                containers: Some(Arc::new(c)),
            })
        }
        ProfileKind::Slurm => prepare_slurm(profile, run_id),
        ProfileKind::Ssh => {
            let addr = profile
                .coordinator_addr
                .as_ref()
                .context("an ssh profile needs coordinator_addr")?;
            let rendezvous: IpAddr = addr.value.parse().with_context(|| {
                format!(
                    "{}: coordinator_addr `{}` must be an IP address of this machine",
                    profile.file.display(),
                    addr.value
                )
            })?;
            let mut hosts = vec![];
            for h in &profile.hosts {
                let h = &h.value;
                let target = SshTarget {
                    name: h.name.value.clone(),
                    host: h.ssh.host.value.clone(),
                    user: h.ssh.user.as_ref().map(|u| u.value.clone()),
                    port: h.ssh.port,
                    identity: h
                        .ssh
                        .identity
                        .as_ref()
                        .map(|i| PathBuf::from(shellexpand_home(&i.value))),
                    trust_new_host_keys: h.ssh.trust_new_host_keys,
                };
                let dir = h
                    .remote_dir
                    .as_ref()
                    .map(|d| d.value.as_str())
                    .unwrap_or(REMOTE_DIR);
                let exe = deploy(&target, dir)
                    .with_context(|| format!("reaching {} over SSH", target.name))?;
                deploy_shipped(&target, &exe)
                    .with_context(|| format!("deploying exec programs to {}", target.name))?;
                hosts.push(RemoteHost {
                    target: HostShell::ssh(target),
                    exe,
                    data_addr: h.data_addr.value.clone(),
                });
            }
            Ok(Placement::Remote {
                hosts,
                rendezvous,
                slurm: None,
                cluster: None,
                containers: None,
            })
        }
    }
}

/// A Slurm profile: the test cluster started when asked for, the allocation obtained (or the
/// caller's used), this build of wringer where the nodes can run it.
fn prepare_slurm(profile: &HostProfile, run_id: &str) -> Result<Placement> {
    let spec = profile
        .slurm
        .as_ref()
        .context("a slurm profile needs `slurm:`")?;
    let partition = spec
        .partition
        .as_ref()
        .map_or("wringer", |p| p.value.as_str());
    let (cluster, env, rendezvous) = match &spec.test_cluster {
        Some(t) => {
            containers::sweep_leftovers();
            let c = TestCluster::start(spec.node_count() as u32, &t.image, partition, run_id)?;
            let (env, gateway) = (c.env.clone(), c.hosts.gateway);
            (Some(Arc::new(c)), env, gateway)
        }
        None => {
            let addr = profile
                .coordinator_addr
                .as_ref()
                .context("a slurm profile needs coordinator_addr: this machine's address that the nodes can reach (the rendezvous listens there)")?;
            let ip: IpAddr = addr.value.parse().with_context(|| {
                format!(
                    "{}: coordinator_addr `{}` must be an IP address",
                    profile.file.display(),
                    addr.value
                )
            })?;
            (None, vec![], ip)
        }
    };
    let mut slurm = Slurm::obtain(spec, env, run_id, cluster.is_some())?;
    if let Some(c) = &cluster {
        // The test cluster's nodes get this build (and the exec programs) over SSH; a real
        // cluster has it on a shared filesystem (`slurm.exe`).
        for i in 0..c.nodes {
            let target = c.hosts.target(i);
            slurm.exe = deploy(&target, REMOTE_DIR)
                .with_context(|| format!("deploying wringer to {}", target.name))?;
            deploy_shipped(&target, &slurm.exe)
                .with_context(|| format!("deploying exec programs to {}", target.name))?;
        }
        slurm.bind = BindRule::PerNode(c.data_addrs());
        slurm.chdir = Some("/tmp".into());
    }
    let slurm = Arc::new(slurm);
    let hosts = slurm
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| RemoteHost {
            target: HostShell {
                name: node.clone(),
                via: Via::Slurm {
                    slurm: Arc::clone(&slurm),
                    node: node.clone(),
                },
            },
            exe: slurm.exe.clone(),
            data_addr: match &slurm.bind {
                BindRule::PerNode(a) => a.get(i).map_or(String::new(), |a| a.to_string()),
                _ => String::new(),
            },
        })
        .collect();
    let containers = cluster.as_ref().map(|c| Arc::clone(&c.hosts));
    Ok(Placement::Remote {
        hosts,
        rendezvous,
        slurm: Some(slurm),
        cluster,
        containers,
    })
}

fn shellexpand_home(p: &str) -> String {
    match (p.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) => format!("{home}/{rest}"),
        _ => p.to_string(),
    }
}

/// What each host of a placement has: probed where it runs (`wringer probe --json` over SSH).
pub fn facts(placement: &Placement) -> Result<Vec<crate::hosts::probe::HostFacts>> {
    match placement {
        Placement::Local => Ok(vec![crate::hosts::probe::local()]),
        Placement::Remote { hosts, .. } => hosts
            .iter()
            .map(|h| {
                let json = h
                    .target
                    .check(&[&h.exe, "probe", "--json"], Duration::from_secs(30))?;
                serde_json::from_str(&json)
                    .with_context(|| format!("{}: unreadable probe output", h.target.name))
            })
            .collect(),
    }
}
