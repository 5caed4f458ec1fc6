//! From a host profile to a ready [`Backend`]: container hosts started, every host reached
//! over SSH, this build of wringer deployed and version-checked on each, VMs booted, a Slurm
//! allocation obtained.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

pub use crate::hosts::backend::RemoteHost;
use crate::hosts::backend::{Backend, Launch, LocalHost, Rendezvous, SshHosts};
use crate::hosts::containers::{self, ContainerHosts};
use crate::hosts::profile::{BackendSpec, HostProfile};
use crate::hosts::shell::{HostShell, Via};
use crate::hosts::slurm::cluster::TestCluster;
use crate::hosts::slurm::profile::SlurmSpec;
use crate::hosts::slurm::{BindRule, Slurm};
use crate::hosts::ssh::{deploy, deploy_shipped, SshTarget};
use crate::hosts::vm::{self, VmHosts};
use crate::model::faults::{HostPlane, WirePlane};
use crate::model::scenario::Strikes;
use serde_saphyr::Spanned;

/// Where a run's ranks go: a prepared backend, shared by the attempts of the run.
pub type Placement = Arc<dyn Backend>;

/// Ranks as local processes.
pub fn local() -> Placement {
    Arc::new(LocalHost)
}

/// Container hosts on private networks, reached over SSH, which take host-level faults.
struct ContainerBackend {
    hosts: Vec<RemoteHost>,
    containers: ContainerHosts,
}

impl Backend for ContainerBackend {
    fn kind(&self) -> &'static str {
        "containers"
    }

    fn hosts(&self) -> &[RemoteHost] {
        &self.hosts
    }

    fn rendezvous(&self) -> Rendezvous {
        Rendezvous::at(self.containers.gateway)
    }

    fn launch(&self) -> Launch<'_> {
        Launch::PerRank
    }

    fn strikes(&self) -> Strikes {
        Strikes {
            host: true,
            wire: false,
        }
    }

    fn host_plane(&self, host: usize) -> Option<Box<dyn HostPlane + '_>> {
        Some(Box::new(ContainerHost {
            hosts: &self.containers,
            host,
        }))
    }

    fn heal(&self) -> Result<()> {
        self.containers.heal()
    }
}

/// One container host, as a host-level fault strikes it.
struct ContainerHost<'a> {
    hosts: &'a ContainerHosts,
    host: usize,
}

impl HostPlane for ContainerHost<'_> {
    fn kill(&self) -> Result<()> {
        self.hosts.kill(self.host)
    }

    fn freeze(&self) -> Result<()> {
        self.hosts.freeze(self.host)
    }

    fn cut_link(&self) -> Result<()> {
        self.hosts.cut_link(self.host)
    }

    fn rate_limit(&self, rate: &str) -> Result<()> {
        self.hosts.rate_limit(self.host, rate)
    }
}

/// Ranks as one Slurm step per attempt, in an allocation; on a test cluster of containers, the
/// nodes take host-level faults.
struct SlurmBackend {
    hosts: Vec<RemoteHost>,
    rendezvous: IpAddr,
    /// Dropped before the test cluster it may live on (fields drop in order).
    slurm: Arc<Slurm>,
    cluster: Option<TestCluster>,
}

impl Backend for SlurmBackend {
    fn kind(&self) -> &'static str {
        "slurm"
    }

    fn hosts(&self) -> &[RemoteHost] {
        &self.hosts
    }

    fn host_of(&self, rank: u32) -> usize {
        self.slurm.layout.node_of(rank, self.hosts.len())
    }

    fn rendezvous(&self) -> Rendezvous {
        Rendezvous::at(self.rendezvous)
    }

    fn launch(&self) -> Launch<'_> {
        Launch::Step(&self.slurm)
    }

    fn strikes(&self) -> Strikes {
        Strikes {
            host: self.cluster.is_some(),
            wire: false,
        }
    }

    // Without the test cluster there are no hosts of the harness's own to strike.
    fn host_plane(&self, host: usize) -> Option<Box<dyn HostPlane + '_>> {
        let c = self.cluster.as_ref()?;
        Some(Box::new(ContainerHost {
            hosts: &c.hosts,
            host,
        }))
    }

    fn heal(&self) -> Result<()> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        cluster.hosts.heal()?;
        // A step that ran on a node killed under it never completes while its job lives: the
        // allocation goes (the next attempt obtains a new one).
        if !cluster.recover()?.is_empty() {
            self.slurm.release();
        }
        Ok(())
    }
}

impl Backend for VmHosts {
    fn kind(&self) -> &'static str {
        "rxe-vm"
    }

    fn hosts(&self) -> &[RemoteHost] {
        &self.hosts
    }

    fn rendezvous(&self) -> Rendezvous {
        Rendezvous {
            bind: IpAddr::from([127, 0, 0, 1]),
            advertise: vm::HOST_FROM_GUEST,
        }
    }

    fn launch(&self) -> Launch<'_> {
        Launch::PerRank
    }

    fn strikes(&self) -> Strikes {
        Strikes {
            host: false,
            // One VM's ranks talk through rxe's loopback, which no packet filter sees.
            wire: self.hosts.len() > 1,
        }
    }

    fn wire_plane(&self, host: usize) -> Option<Box<dyn WirePlane + '_>> {
        self.wire(host)
            .map(|w| Box::new(w) as Box<dyn WirePlane + '_>)
    }

    fn fault_evidence(&self) -> Vec<String> {
        self.wire_counters()
    }

    fn heal(&self) -> Result<()> {
        self.heal_wires()
    }

    fn renew(&self) -> Result<()> {
        self.renew_after_link_down()
    }
}

const REMOTE_DIR: &str = "~/.cache/wringer";

/// What bringing hosts up may need besides the profile.
#[derive(Default)]
pub struct Prepare<'a> {
    pub run_id: &'a str,
    /// Folders of this machine that container hosts must see at the same path (read-only):
    /// the releases the run's scenarios use. Other kinds of host have their own.
    pub shares: &'a [PathBuf],
    /// Where a VM's consoles go (the run's report folder).
    pub dir: Option<&'a Path>,
}

pub fn prepare(profile: &HostProfile, run_id: &str) -> Result<Placement> {
    prepare_with(
        profile,
        &Prepare {
            run_id,
            ..Prepare::default()
        },
    )
}

pub fn prepare_with(profile: &HostProfile, cx: &Prepare) -> Result<Placement> {
    let run_id = cx.run_id;
    match &profile.backend {
        BackendSpec::Local => Ok(local()),
        BackendSpec::RxeVm(_) | BackendSpec::RxeVmPair(_) => {
            if let Some(why) = vm::unavailable(profile) {
                anyhow::bail!("{why}");
            }
            let count = if matches!(profile.backend, BackendSpec::RxeVmPair(_)) {
                2
            } else {
                1
            };
            // Without a report folder, a fresh private one (never a name in /tmp another user
            // could make first: the VM runs its scripts as root).
            let folder = match cx.dir {
                Some(d) => d.join("vm"),
                None => crate::hosts::private::fresh_dir(&format!("wringer-vm-{run_id}"))?,
            };
            Ok(Arc::new(vm::boot(profile, count, &folder)?))
        }
        BackendSpec::Containers(spec) => {
            containers::sweep_leftovers();
            let c = ContainerHosts::start(spec.count, &spec.image, run_id, cx.shares)?;
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
            Ok(Arc::new(ContainerBackend {
                hosts,
                containers: c,
            }))
        }
        BackendSpec::Slurm {
            slurm,
            coordinator_addr,
        } => prepare_slurm(profile, slurm, coordinator_addr.as_ref(), run_id),
        BackendSpec::Ssh {
            hosts: inventory,
            coordinator_addr: addr,
        } => {
            let rendezvous: IpAddr = addr.value.parse().with_context(|| {
                format!(
                    "{}: coordinator_addr `{}` must be an IP address of this machine",
                    profile.file.display(),
                    addr.value
                )
            })?;
            let mut hosts = vec![];
            for h in inventory {
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
                    control: None,
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
            Ok(Arc::new(SshHosts { hosts, rendezvous }))
        }
    }
}

/// A Slurm profile: the test cluster started when asked for, the allocation obtained (or the
/// caller's used), this build of wringer where the nodes can run it.
fn prepare_slurm(
    profile: &HostProfile,
    spec: &SlurmSpec,
    coordinator_addr: Option<&Spanned<String>>,
    run_id: &str,
) -> Result<Placement> {
    let partition = spec
        .partition
        .as_ref()
        .map_or("wringer", |p| p.value.as_str());
    let (cluster, env, rendezvous) = match &spec.test_cluster {
        Some(t) => {
            containers::sweep_leftovers();
            let c = TestCluster::start(spec.node_count() as u32, &t.image, partition, run_id)?;
            let (env, gateway) = (c.env.clone(), c.hosts.gateway);
            (Some(c), env, gateway)
        }
        None => {
            let addr = coordinator_addr
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
    Ok(Arc::new(SlurmBackend {
        hosts,
        rendezvous,
        slurm,
        cluster,
    }))
}

fn shellexpand_home(p: &str) -> String {
    match (p.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) => format!("{home}/{rest}"),
        _ => p.to_string(),
    }
}

/// What each host of a placement has: probed where it runs (`wringer probe --json` over its
/// shell), or here when ranks are local.
pub fn facts(placement: &Placement) -> Result<Vec<crate::hosts::probe::HostFacts>> {
    if placement.hosts().is_empty() {
        return Ok(vec![crate::hosts::probe::local()]);
    }
    placement
        .hosts()
        .iter()
        .map(|h| {
            let json = h
                .target
                .check(&[&h.exe, "probe", "--json"], Duration::from_secs(30))?;
            serde_json::from_str(&json)
                .with_context(|| format!("{}: unreadable probe output", h.target.name))
        })
        .collect()
}
