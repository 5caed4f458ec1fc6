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

/// A host profile, read and checked: what every backend shares, and its own backend's part.
#[derive(Debug)]
pub struct HostProfile {
    pub name: String,
    pub description: String,
    /// Hardware this profile must have: a skip for one of these becomes a failure.
    pub must_have: Vec<Requirement>,
    /// The GPU vendor every host has (`gpu: amd`): a host without a usable GPU of that vendor
    /// does not meet the `gpu` requirement, and the reason names what it lacks.
    pub gpu: Option<GpuVendor>,
    /// Lifecycle audit checks for every scenario run on this profile (added to the
    /// scenario's own `audit`).
    pub audit: Vec<crate::model::scenario::AuditCheck>,
    pub backend: BackendSpec,
    /// The profile that runs the scenarios needing RDMA when the hosts' kernel has none
    /// (`rdma_vm:`), read and checked.
    pub rdma_fallback: Option<Box<HostProfile>>,
    /// Known failures, inline and from `known_failures_file`, read and checked.
    pub known: Vec<KnownFailure>,
    pub file: PathBuf,
}

/// A GPU vendor, as a profile names it.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GpuVendor {
    Nvidia,
    Amd,
}

impl GpuVendor {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuVendor::Nvidia => "nvidia",
            GpuVendor::Amd => "amd",
        }
    }
}

/// One variant per backend, each with only its own settings.
#[derive(Debug)]
pub enum BackendSpec {
    /// Every rank is a local process on loopback.
    Local,
    /// N throwaway containers on private Docker networks, reached over SSH like real hosts.
    Containers(ContainerSpec),
    /// Real hosts reached with the system `ssh` (so ~/.ssh/config applies), and the address of
    /// this machine that every host can reach (the rendezvous listens there).
    Ssh {
        hosts: Vec<Spanned<Host>>,
        coordinator_addr: Spanned<String>,
    },
    /// One VM (virtme-ng, TCG) with soft-RoCE devices, for machines whose kernel has no RDMA.
    RxeVm(VmSpec),
    /// Two such VMs joined by a qemu socket link on 127.0.0.1, one rxe device each: a real
    /// two-host RoCE link on one machine.
    RxeVmPair(VmSpec),
    /// Ranks as one Slurm job step per repeat (`srun`), inside the caller's allocation or one
    /// wringer obtains; optionally on a test cluster of containers started for the run (then
    /// no `coordinator_addr`).
    Slurm {
        slurm: Box<crate::hosts::slurm::profile::SlurmSpec>,
        coordinator_addr: Option<Spanned<String>>,
    },
}

/// A profile as written: one flat map whose `kind` says which of the backend sections apply.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    #[serde(deserialize_with = "crate::model::name::checked")]
    name: String,
    description: String,
    kind: ProfileKind,
    /// Hardware this profile must have: a skip for one of these becomes a failure.
    #[serde(default)]
    must_have: Vec<Requirement>,
    /// The GPU vendor every host has: `nvidia` or `amd`.
    #[serde(default)]
    gpu: Option<GpuVendor>,
    /// Lifecycle audit checks for every scenario run on this profile (added to the
    /// scenario's own `audit`).
    #[serde(default)]
    audit: Vec<crate::model::scenario::AuditCheck>,
    /// `containers` profiles: how many test hosts, from which locally built image.
    #[serde(default)]
    containers: Option<ContainerSpec>,
    /// `ssh` profiles: the hosts.
    #[serde(default)]
    hosts: Vec<Spanned<Host>>,
    /// `ssh` profiles: the address of this machine that every host can reach (the rendezvous
    /// listens there).
    #[serde(default)]
    coordinator_addr: Option<Spanned<String>>,
    /// `rxe-vm` profiles: the VM.
    #[serde(default)]
    vm: Option<VmSpec>,
    /// `slurm` profiles: the allocation and how steps are launched.
    #[serde(default)]
    slurm: Option<crate::hosts::slurm::profile::SlurmSpec>,
    /// Scenarios expected to fail here, each with a reason and a link (see `model::known`),
    #[serde(default)]
    known_failures: Vec<Spanned<KnownFailure>>,
    /// and a file of more of them (relative to this profile's folder).
    #[serde(default)]
    known_failures_file: Option<PathBuf>,
    /// `local` and `containers` profiles: where the scenarios that need RDMA run when the
    /// hosts' kernel has no RDMA device: an `rxe-vm` profile for `local`, an `rxe-vm-pair` one
    /// for `containers` (relative to this profile's folder). WRINGER_NO_VM=1 skips them
    /// instead.
    #[serde(default)]
    rdma_vm: Option<PathBuf>,
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
    /// One VM (virtme-ng, TCG) with soft-RoCE devices, for machines whose kernel has no RDMA,
    /// reached over SSH once booted.
    RxeVm,
    /// Two such VMs joined by a qemu socket link on 127.0.0.1, one rxe device each: a real
    /// two-host RoCE link on one machine.
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
        match &self.backend {
            BackendSpec::Local | BackendSpec::RxeVm(_) => 1,
            BackendSpec::Containers(c) => c.count as usize,
            BackendSpec::Ssh { hosts, .. } => hosts.len(),
            BackendSpec::RxeVmPair(_) => 2,
            BackendSpec::Slurm { slurm, .. } => slurm.node_count(),
        }
    }

    /// The `kind:` it was written with.
    pub fn kind(&self) -> ProfileKind {
        match &self.backend {
            BackendSpec::Local => ProfileKind::Local,
            BackendSpec::Containers(_) => ProfileKind::Containers,
            BackendSpec::Ssh { .. } => ProfileKind::Ssh,
            BackendSpec::RxeVm(_) => ProfileKind::RxeVm,
            BackendSpec::RxeVmPair(_) => ProfileKind::RxeVmPair,
            BackendSpec::Slurm { .. } => ProfileKind::Slurm,
        }
    }

    /// Its soft-RoCE VM settings, when it is a VM profile.
    pub fn vm(&self) -> Option<&VmSpec> {
        match &self.backend {
            BackendSpec::RxeVm(v) | BackendSpec::RxeVmPair(v) => Some(v),
            _ => None,
        }
    }

    /// The fault planes its hosts take: host-level faults (kill, freeze, link cut, rate
    /// limit) on hosts the harness started itself, as containers; wire faults on the
    /// soft-RoCE VM pair.
    pub fn strikes(&self) -> crate::model::scenario::Strikes {
        crate::model::scenario::Strikes {
            host: match &self.backend {
                BackendSpec::Containers(_) => true,
                BackendSpec::Slurm { slurm, .. } => slurm.test_cluster.is_some(),
                _ => false,
            },
            wire: matches!(self.backend, BackendSpec::RxeVmPair(_)),
        }
    }
}

pub fn load(path: &Path) -> Result<HostProfile, InputError> {
    let text = crate::model::input::read_text(path, crate::model::input::FileKind::Profile)?;
    let (mut p, file) = parse_file(path, &text)?;
    if let Some(f) = &file.known_failures_file {
        let f = path.parent().unwrap_or(Path::new(".")).join(f);
        p.known.extend(known::load(&f)?);
    }
    if let Some(f) = &file.rdma_vm {
        let f = path.parent().unwrap_or(Path::new(".")).join(f);
        let vm = load(&f)?;
        let wanted = match p.kind() {
            ProfileKind::Containers => ProfileKind::RxeVmPair,
            _ => ProfileKind::RxeVm,
        };
        if vm.kind() != wanted {
            return Err(InputError::plain(
                path,
                format!(
                    "rdma_vm names {}, a {:?} profile: a {:?} profile's must be {wanted:?}",
                    f.display(),
                    vm.kind(),
                    p.kind()
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
    parse_file(path, text).map(|(p, _)| p)
}

fn parse_file(path: &Path, text: &str) -> Result<(HostProfile, ProfileFile), InputError> {
    let mut f: ProfileFile = crate::model::input::parse_yaml(path, text)?;
    if f.rdma_vm.is_some() && !matches!(f.kind, ProfileKind::Local | ProfileKind::Containers) {
        return Err(InputError::plain(
            path,
            "only `local` and `containers` profiles take `rdma_vm` (the others bring their own RDMA hosts)",
        ));
    }
    let backend = match f.kind {
        ProfileKind::Local => local(path, &mut f)?,
        ProfileKind::Containers => containers(path, &mut f)?,
        ProfileKind::Ssh => ssh(path, &mut f)?,
        ProfileKind::RxeVm | ProfileKind::RxeVmPair => vm(path, &mut f)?,
        ProfileKind::Slurm => slurm(path, &mut f)?,
    };
    for k in &f.known_failures {
        known::check(&k.value).map_err(|why| located(path, &k.referenced, why.0))?;
    }
    known::check_list(f.known_failures.iter().map(|k| &k.value))
        .map_err(|why| InputError::plain(path, why))?;
    let p = HostProfile {
        name: std::mem::take(&mut f.name),
        description: std::mem::take(&mut f.description),
        must_have: std::mem::take(&mut f.must_have),
        gpu: f.gpu,
        audit: std::mem::take(&mut f.audit),
        backend,
        rdma_fallback: None,
        known: f.known_failures.iter().map(|k| k.value.clone()).collect(),
        file: path.to_owned(),
    };
    Ok((p, f))
}

/// The sections a kind takes; any other backend's section is an error that names the kind.
fn only(path: &Path, f: &ProfileFile, takes: &[&str]) -> Result<(), InputError> {
    let given = [
        ("containers", f.containers.is_some()),
        ("hosts", !f.hosts.is_empty()),
        ("coordinator_addr", f.coordinator_addr.is_some()),
        ("vm", f.vm.is_some()),
        ("slurm", f.slurm.is_some()),
    ];
    match given
        .iter()
        .find(|(name, set)| *set && !takes.contains(name))
    {
        Some((name, _)) => Err(InputError::plain(
            path,
            format!(
                "a `{}` profile takes no `{name}`{}",
                kind_name(f.kind),
                if takes.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (it takes {})",
                        takes
                            .iter()
                            .map(|t| format!("`{t}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            ),
        )),
        None => Ok(()),
    }
}

fn kind_name(kind: ProfileKind) -> &'static str {
    match kind {
        ProfileKind::Local => "local",
        ProfileKind::Containers => "containers",
        ProfileKind::Ssh => "ssh",
        ProfileKind::RxeVm => "rxe-vm",
        ProfileKind::RxeVmPair => "rxe-vm-pair",
        ProfileKind::Slurm => "slurm",
    }
}

fn local(path: &Path, f: &mut ProfileFile) -> Result<BackendSpec, InputError> {
    only(path, f, &[])?;
    Ok(BackendSpec::Local)
}

fn vm(path: &Path, f: &mut ProfileFile) -> Result<BackendSpec, InputError> {
    only(path, f, &["vm"])?;
    let Some(v) = f.vm.take() else {
        return Err(InputError::plain(
            path,
            format!(
                "an `{}` profile needs `vm: {{ kernel: PATH }}`",
                kind_name(f.kind)
            ),
        ));
    };
    if !(1..=4).contains(&v.rxe_devices) {
        return Err(InputError::plain(
            path,
            format!("vm.rxe_devices must be 1..=4, got {}", v.rxe_devices),
        ));
    }
    safe(path, None, "vm.memory", &v.memory, Charset::Name)?;
    Ok(match f.kind {
        ProfileKind::RxeVmPair => BackendSpec::RxeVmPair(v),
        _ => BackendSpec::RxeVm(v),
    })
}

fn containers(path: &Path, f: &mut ProfileFile) -> Result<BackendSpec, InputError> {
    only(path, f, &["containers"])?;
    let Some(c) = f.containers.take() else {
        return Err(InputError::plain(
            path,
            "a `containers` profile needs `containers: { count: N }`",
        ));
    };
    if !(1..=16).contains(&c.count) {
        return Err(InputError::plain(
            path,
            format!("containers.count must be 1..=16, got {}", c.count),
        ));
    }
    safe(path, None, "containers.image", &c.image, Charset::Image)?;
    Ok(BackendSpec::Containers(c))
}

fn slurm(path: &Path, f: &mut ProfileFile) -> Result<BackendSpec, InputError> {
    if f.containers.is_some() || !f.hosts.is_empty() || f.vm.is_some() {
        return Err(InputError::plain(
            path,
            "a `slurm` profile takes no `containers`, `hosts` or `vm`: Slurm places the ranks",
        ));
    }
    let Some(s) = f.slurm.take() else {
        return Err(InputError::plain(
            path,
            "a `slurm` profile needs `slurm: { nodes: N, time_limit: ... }`",
        ));
    };
    s.check(path)?;
    match (&s.test_cluster, &f.coordinator_addr) {
        (Some(_), _) => {}
        (None, None) => return Err(InputError::plain(path, "a `slurm` profile needs `coordinator_addr`: this machine's address that every node can reach (the rendezvous listens there)")),
        (None, Some(addr)) => coordinator_addr(path, addr)?,
    }
    Ok(BackendSpec::Slurm {
        slurm: Box::new(s),
        coordinator_addr: f.coordinator_addr.take(),
    })
}

fn ssh(path: &Path, f: &mut ProfileFile) -> Result<BackendSpec, InputError> {
    only(path, f, &["hosts", "coordinator_addr"])?;
    if f.hosts.is_empty() {
        return Err(InputError::plain(path, "an `ssh` profile needs `hosts:`"));
    }
    let Some(addr) = f.coordinator_addr.take() else {
        return Err(InputError::plain(path, "an `ssh` profile needs `coordinator_addr`: this machine's address that every host can reach"));
    };
    coordinator_addr(path, &addr)?;
    let mut seen = std::collections::BTreeSet::new();
    for h in &f.hosts {
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
    Ok(BackendSpec::Ssh {
        hosts: std::mem::take(&mut f.hosts),
        coordinator_addr: addr,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<HostProfile, String> {
        parse(Path::new("p.yaml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn each_kind_reads_into_its_own_backend_with_only_its_settings() {
        let local = parsed("name: l\ndescription: d\nkind: local\n").unwrap();
        assert!(matches!(local.backend, BackendSpec::Local));
        assert_eq!((local.hosts(), local.strikes().host), (1, false));
        let c = parsed("name: c\ndescription: d\nkind: containers\ncontainers: { count: 3 }\n")
            .unwrap();
        assert!(matches!(&c.backend, BackendSpec::Containers(s) if s.count == 3));
        assert_eq!((c.hosts(), c.strikes().host), (3, true));
        let pair = parsed("name: v\ndescription: d\nkind: rxe-vm-pair\nvm: { kernel: /boot/k }\n")
            .unwrap();
        assert_eq!((pair.kind(), pair.hosts()), (ProfileKind::RxeVmPair, 2));
        assert_eq!(pair.vm().map(|v| v.rxe_devices), Some(1));
        let ssh = parsed(
            "name: s\ndescription: d\nkind: ssh\ncoordinator_addr: 10.1.0.1\nhosts:\n  - { name: a, ssh: { host: a }, data_addr: 10.1.0.2 }\n",
        )
        .unwrap();
        assert!(
            matches!(&ssh.backend, BackendSpec::Ssh { hosts, coordinator_addr } if hosts.len() == 1 && coordinator_addr.value == "10.1.0.1")
        );
    }

    #[test]
    fn a_profile_names_its_gpu_vendor_or_gets_a_located_error() {
        let amd = parsed("name: l\ndescription: d\nkind: local\ngpu: amd\n").unwrap();
        assert_eq!(amd.gpu, Some(GpuVendor::Amd));
        let any = parsed("name: l\ndescription: d\nkind: local\n").unwrap();
        assert_eq!(any.gpu, None);
        let why = parsed("name: l\ndescription: d\nkind: local\ngpu: intel\n").unwrap_err();
        assert!(why.contains("p.yaml:4:6"), "file, line and column: {why}");
        assert!(why.contains("intel"), "{why}");
    }

    #[test]
    fn another_backends_section_is_refused_naming_the_kind_and_what_it_takes() {
        let why = parsed("name: l\ndescription: d\nkind: local\nvm: { kernel: /k }\n").unwrap_err();
        assert!(why.contains("a `local` profile takes no `vm`"), "{why}");
        let why = parsed(
            "name: v\ndescription: d\nkind: rxe-vm\nvm: { kernel: /k }\ncontainers: { count: 2 }\n",
        )
        .unwrap_err();
        assert!(
            why.contains("takes no `containers` (it takes `vm`)"),
            "{why}"
        );
        let why = parsed("name: v\ndescription: d\nkind: rxe-vm\n").unwrap_err();
        assert!(why.contains("needs `vm: { kernel: PATH }`"), "{why}");
        let why = parsed("name: s\ndescription: d\nkind: ssh\nhosts: []\n").unwrap_err();
        assert!(why.contains("needs `hosts:`"), "{why}");
        let why =
            parsed("name: v\ndescription: d\nkind: rxe-vm\nvm: { kernel: /k }\nrdma_vm: x.yaml\n")
                .unwrap_err();
        assert!(why.contains("only `local` and `containers`"), "{why}");
    }
}
