//! From a host profile to a ready [`Placement`]: container hosts started, every host reached
//! over SSH, this build of wringer deployed and version-checked on each.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::hosts::containers::{self, ContainerHosts};
use crate::hosts::profile::{HostProfile, ProfileKind};
use crate::hosts::ssh::{deploy, deploy_shipped, SshTarget};

/// A host that ranks run on over SSH, with this build of wringer deployed.
#[derive(Clone, Debug)]
pub struct RemoteHost {
    pub target: SshTarget,
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

    /// The host index rank `rank` runs on (ranks go round-robin over the hosts).
    pub fn host_of(&self, rank: u32) -> usize {
        match self {
            Placement::Local => 0,
            Placement::Remote { hosts, .. } => rank as usize % hosts.len(),
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
    match profile.kind {
        // An rxe-vm run happens inside its VM (see `vm`), where ranks are local.
        ProfileKind::Local | ProfileKind::RxeVm | ProfileKind::RxeVmPair => Ok(Placement::Local),
        ProfileKind::Containers => {
            let spec = profile
                .containers
                .as_ref()
                .context("a containers profile needs `containers:`")?;
            containers::sweep_leftovers();
            let c = ContainerHosts::start(spec.count, &spec.image, run_id)?;
            c.wait_ssh(Duration::from_secs(60))?;
            let mut hosts = vec![];
            for (i, h) in c.hosts.iter().enumerate() {
                let target = c.target(i);
                let exe = deploy(&target, REMOTE_DIR)
                    .with_context(|| format!("deploying wringer to {}", h.name))?;
                deploy_shipped(&target, &exe)
                    .with_context(|| format!("deploying exec programs to {}", h.name))?;
                hosts.push(RemoteHost {
                    target,
                    exe,
                    data_addr: h.data_ip.to_string(),
                });
            }
            let rendezvous = c.gateway;
            Ok(Placement::Remote {
                hosts,
                rendezvous,
                containers: Some(Arc::new(c)),
            })
        }
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
                    target,
                    exe,
                    data_addr: h.data_addr.value.clone(),
                });
            }
            Ok(Placement::Remote {
                hosts,
                rendezvous,
                containers: None,
            })
        }
    }
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
