//! Host profiles (`hosts/*.yaml`): where ranks run, how to reach those hosts, and what they
//! must have. Placeholders and values that could smuggle options or shell syntax into an SSH
//! command line are rejected here, before any connection is tried.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::hosts::values::{placeholder, safe, spanned, Charset};
use crate::model::input::{located, InputError};
use crate::model::known::{self, KnownFailure};
use crate::model::requirement::Requirement;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostProfile {
    #[serde(deserialize_with = "crate::model::name::checked")]
    pub name: String,
    pub description: String,
    pub kind: ProfileKind,
    /// Hardware this profile must have: a skip for one of these becomes a failure.
    #[serde(default)]
    pub must_have: Vec<Requirement>,
    /// Lifecycle audit checks for every scenario run on this profile (added to the
    /// scenario's own `audit`).
    #[serde(default)]
    pub audit: Vec<crate::model::scenario::AuditCheck>,
    /// `containers` profiles: how many test hosts, from which locally built image.
    #[serde(default)]
    pub containers: Option<ContainerSpec>,
    /// `ssh` profiles: the hosts.
    #[serde(default)]
    pub hosts: Vec<Spanned<Host>>,
    /// `ssh` profiles: the address of this machine that every host can reach (the rendezvous
    /// listens there).
    #[serde(default)]
    pub coordinator_addr: Option<Spanned<String>>,
    /// `rxe-vm` profiles: the VM.
    #[serde(default)]
    pub vm: Option<VmSpec>,
    /// `slurm` profiles: the allocation and how steps are launched.
    #[serde(default)]
    pub slurm: Option<crate::hosts::slurm::profile::SlurmSpec>,
    /// Scenarios expected to fail here, each with a reason and a link (see `model::known`),
    #[serde(default)]
    pub known_failures: Vec<Spanned<KnownFailure>>,
    /// and a file of more of them (relative to this profile's folder).
    #[serde(default)]
    pub known_failures_file: Option<PathBuf>,
    /// `local` and `containers` profiles: where the scenarios that need RDMA run when the
    /// hosts' kernel has no RDMA device: an `rxe-vm` profile for `local`, an `rxe-vm-pair` one
    /// for `containers` (relative to this profile's folder). WRINGER_NO_VM=1 skips them
    /// instead.
    #[serde(default)]
    pub rdma_vm: Option<PathBuf>,
    /// That profile, read and checked.
    #[serde(skip)]
    pub rdma_fallback: Option<Box<HostProfile>>,
    /// Both, read and checked.
    #[serde(skip)]
    pub known: Vec<KnownFailure>,
    #[serde(skip)]
    pub file: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    /// The kernel to boot (`just setup-rxe` unpacks Debian's).
    pub kernel: PathBuf,
    #[serde(default = "default_memory")]
    pub memory: String,
    #[serde(default = "default_cpus")]
    pub cpus: u32,
    /// How many rxe devices to create, each on its own veth (10.213.N.1/24).
    #[serde(default = "one")]
    pub rxe_devices: u32,
}

fn default_memory() -> String {
    "2G".into()
}

fn default_cpus() -> u32 {
    2
}

fn one() -> u32 {
    1
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ProfileKind {
    /// Every rank is a local process on loopback.
    Local,
    /// N throwaway containers on private Docker networks, reached over SSH like real hosts.
    Containers,
    /// Real hosts reached with the system `ssh` (so ~/.ssh/config applies).
    Ssh,
    /// One VM (virtme-ng, TCG) with soft-RoCE devices, for machines whose kernel has no RDMA:
    /// the whole run happens inside it, on this machine's filesystem.
    RxeVm,
    /// Two such VMs joined by a qemu socket link on 127.0.0.1, one rxe device each: a real
    /// two-host RoCE link on one machine. The run happens in the first, reaching both over SSH.
    RxeVmPair,
    /// Ranks as one Slurm job step per repeat (`srun`), inside the caller's allocation or one
    /// wringer obtains; optionally on a test cluster of containers started for the run.
    Slurm,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerSpec {
    pub count: u32,
    #[serde(default = "default_image")]
    pub image: String,
}

fn default_image() -> String {
    "wringer-host:bookworm".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub name: Spanned<String>,
    pub ssh: SshSpec,
    /// The address other ranks use to reach this host's ranks (the data plane).
    pub data_addr: Spanned<String>,
    #[serde(default)]
    pub interfaces: Vec<Spanned<String>>,
    #[serde(default)]
    pub rdma: Option<RdmaSpec>,
    #[serde(default)]
    pub gpu: Option<Spanned<String>>,
    /// Where the wringer binary is kept on the host (default ~/.cache/wringer).
    #[serde(default)]
    pub remote_dir: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SshSpec {
    /// A host name, an address, or a `Host` alias from ~/.ssh/config.
    pub host: Spanned<String>,
    #[serde(default)]
    pub user: Option<Spanned<String>>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub identity: Option<Spanned<String>>,
    /// Accept a host key never seen before (throwaway test hosts only).
    #[serde(default)]
    pub trust_new_host_keys: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaSpec {
    pub device: Spanned<String>,
    pub port: u32,
}

impl HostProfile {
    /// How many distinct hosts ranks are spread over.
    pub fn hosts(&self) -> usize {
        match self.kind {
            ProfileKind::Local => 1,
            ProfileKind::Containers => self
                .containers
                .as_ref()
                .map(|c| c.count as usize)
                .unwrap_or(0),
            ProfileKind::Ssh => self.hosts.len(),
            ProfileKind::RxeVm => 1,
            ProfileKind::RxeVmPair => 2,
            ProfileKind::Slurm => self.slurm.as_ref().map_or(0, |s| s.node_count()),
        }
    }
}

pub fn load(path: &Path) -> Result<HostProfile, InputError> {
    let text = crate::model::input::read_text(path, crate::model::input::FileKind::Profile)?;
    let mut p = parse(path, &text)?;
    if let Some(f) = &p.known_failures_file {
        let f = path.parent().unwrap_or(Path::new(".")).join(f);
        p.known.extend(known::load(&f)?);
    }
    if let Some(f) = &p.rdma_vm {
        let f = path.parent().unwrap_or(Path::new(".")).join(f);
        let vm = load(&f)?;
        let wanted = match p.kind {
            ProfileKind::Containers => ProfileKind::RxeVmPair,
            _ => ProfileKind::RxeVm,
        };
        if vm.kind != wanted {
            return Err(InputError::plain(
                path,
                format!(
                    "rdma_vm names {}, a {:?} profile: a {:?} profile's must be {wanted:?}",
                    f.display(),
                    vm.kind,
                    p.kind
                ),
            ));
        }
        p.rdma_fallback = Some(Box::new(vm));
    }
    Ok(p)
}

/// Parse and check a profile's text (`path` names it in errors); files it refers to are not
/// read.
pub fn parse(path: &Path, text: &str) -> Result<HostProfile, InputError> {
    let mut p: HostProfile = crate::model::input::parse_yaml(path, text)?;
    p.file = path.to_owned();
    check(path, &p)?;
    for k in &p.known_failures {
        known::check(&k.value).map_err(|why| located(path, &k.referenced, why.0))?;
    }
    known::check_list(p.known_failures.iter().map(|k| &k.value))
        .map_err(|why| InputError::plain(path, why))?;
    p.known = p.known_failures.iter().map(|k| k.value.clone()).collect();
    Ok(p)
}

fn check(path: &Path, p: &HostProfile) -> Result<(), InputError> {
    match p.kind {
        _ if p.rdma_vm.is_some()
            && !matches!(p.kind, ProfileKind::Local | ProfileKind::Containers) =>
        {
            return Err(InputError::plain(
                path,
                "only `local` and `containers` profiles take `rdma_vm` (the others bring their own RDMA hosts)",
            ));
        }
        ProfileKind::Local => {
            if p.containers.is_some() || !p.hosts.is_empty() {
                return Err(InputError::plain(
                    path,
                    "a `local` profile takes no `containers` or `hosts`",
                ));
            }
        }
        ProfileKind::RxeVm | ProfileKind::RxeVmPair => match &p.vm {
            None => {
                return Err(InputError::plain(
                    path,
                    "an `rxe-vm` profile needs `vm: { kernel: PATH }`",
                ))
            }
            Some(v) if !(1..=4).contains(&v.rxe_devices) => {
                return Err(InputError::plain(
                    path,
                    format!("vm.rxe_devices must be 1..=4, got {}", v.rxe_devices),
                ))
            }
            Some(v) => safe(path, None, "vm.memory", &v.memory, Charset::Name)?,
        },
        ProfileKind::Containers => match &p.containers {
            None => {
                return Err(InputError::plain(
                    path,
                    "a `containers` profile needs `containers: { count: N }`",
                ))
            }
            Some(c) if !(1..=16).contains(&c.count) => {
                return Err(InputError::plain(
                    path,
                    format!("containers.count must be 1..=16, got {}", c.count),
                ))
            }
            Some(c) => safe(path, None, "containers.image", &c.image, Charset::Image)?,
        },
        ProfileKind::Slurm => match &p.slurm {
            None => {
                return Err(InputError::plain(
                    path,
                    "a `slurm` profile needs `slurm: { nodes: N, time_limit: ... }`",
                ))
            }
            Some(s) => {
                if p.containers.is_some() || !p.hosts.is_empty() || p.vm.is_some() {
                    return Err(InputError::plain(
                        path,
                        "a `slurm` profile takes no `containers`, `hosts` or `vm`: Slurm places the ranks",
                    ));
                }
                s.check(path)?;
                match (&s.test_cluster, &p.coordinator_addr) {
                    (Some(_), _) => {}
                    (None, None) => return Err(InputError::plain(path, "a `slurm` profile needs `coordinator_addr`: this machine's address that every node can reach (the rendezvous listens there)")),
                    (None, Some(addr)) => coordinator_addr(path, addr)?,
                }
            }
        },
        ProfileKind::Ssh => {
            if p.hosts.is_empty() {
                return Err(InputError::plain(path, "an `ssh` profile needs `hosts:`"));
            }
            let Some(addr) = &p.coordinator_addr else {
                return Err(InputError::plain(path, "an `ssh` profile needs `coordinator_addr`: this machine's address that every host can reach"));
            };
            coordinator_addr(path, addr)?;
            let mut seen = std::collections::BTreeSet::new();
            for h in &p.hosts {
                let h = &h.value;
                spanned(path, "name", &h.name, Charset::Name)?;
                crate::model::name::check(&h.name.value)
                    .map_err(|why| located(path, &h.name.referenced, why.0))?;
                if !seen.insert(h.name.value.clone()) {
                    return Err(located(
                        path,
                        &h.name.referenced,
                        format!(
                            "host name `{}` is used twice; each host needs its own",
                            h.name.value
                        ),
                    ));
                }
                if h.ssh.port == Some(0) {
                    return Err(located(
                        path,
                        &h.ssh.host.referenced,
                        "ssh.port 0 is not a port; leave it out for 22".into(),
                    ));
                }
                spanned(path, "ssh.host", &h.ssh.host, Charset::Address)?;
                spanned(path, "data_addr", &h.data_addr, Charset::Address)?;
                if let Some(u) = &h.ssh.user {
                    spanned(path, "ssh.user", u, Charset::Name)?;
                }
                if let Some(i) = &h.ssh.identity {
                    spanned(path, "ssh.identity", i, Charset::Path)?;
                }
                if let Some(d) = &h.remote_dir {
                    spanned(path, "remote_dir", d, Charset::Path)?;
                }
                for i in &h.interfaces {
                    spanned(path, "interfaces", i, Charset::Name)?;
                }
                if let Some(r) = &h.rdma {
                    spanned(path, "rdma.device", &r.device, Charset::Name)?;
                }
                if let Some(g) = &h.gpu {
                    placeholder(path, "gpu", g)?;
                }
            }
        }
    }
    Ok(())
}

fn coordinator_addr(path: &Path, addr: &Spanned<String>) -> Result<(), InputError> {
    spanned(path, "coordinator_addr", addr, Charset::Address)?;
    if let Ok(ip) = addr.value.parse::<std::net::IpAddr>() {
        let broadcast = matches!(ip, std::net::IpAddr::V4(v4) if v4.is_broadcast());
        if ip.is_unspecified() || ip.is_multicast() || broadcast {
            return Err(located(
                path,
                &addr.referenced,
                format!(
                    "coordinator_addr `{}` must be a unicast address (not a broadcast, multicast or unspecified one): the rendezvous listens on it and every host connects to it",
                    addr.value
                ),
            ));
        }
    } else {
        return Err(located(
            path,
            &addr.referenced,
            format!(
                "coordinator_addr `{}` must be an IP address of this machine that every host can reach (the rendezvous listens on it)",
                addr.value
            ),
        ));
    }
    Ok(())
}
