//! From a host profile to a ready [`Placement`]: container hosts started, every host reached
//! over SSH, this build of wringer deployed and version-checked on each.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::containers::{self, ContainerHosts};
use crate::hosts::{HostProfile, ProfileKind};
use crate::launcher::{Placement, RemoteHost};
use crate::ssh::{deploy, SshTarget};

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
pub fn facts(placement: &Placement) -> Result<Vec<crate::probe::HostFacts>> {
    match placement {
        Placement::Local => Ok(vec![crate::probe::local()]),
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
