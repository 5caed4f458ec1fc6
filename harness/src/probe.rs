//! What a host can do, and why a scenario's requirement is not met (a typed skip reason).

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::hosts::HostProfile;

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Requirement {
    Rdma,
    Gpu,
    Xhost,
    Root,
    Netns,
    Docker,
    Vm,
}

/// Why a scenario was skipped: a stable code for machines and a detail for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkipReason {
    pub code: &'static str,
    pub detail: String,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RdmaPort {
    pub port: u32,
    pub state: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RdmaDevice {
    pub name: String,
    pub rxe: bool,
    pub ports: Vec<RdmaPort>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostFacts {
    pub host: String,
    pub kernel: String,
    pub root: bool,
    /// Why RDMA discovery found nothing, when it found nothing.
    pub rdma_absent: Option<String>,
    pub rdma_devices: Vec<RdmaDevice>,
    pub gpus: Vec<String>,
    pub amd_kfd: bool,
    pub netns: bool,
    pub docker: bool,
    pub vm: bool,
    pub gdb: bool,
}

/// Probe this machine.
pub fn local() -> HostFacts {
    let (rdma_devices, rdma_absent) = rdma();
    HostFacts {
        host: read_trim("/proc/sys/kernel/hostname").unwrap_or_else(|| "localhost".into()),
        kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_default(),
        // SAFETY: geteuid has no preconditions and cannot fail.
        root: unsafe { libc::geteuid() } == 0,
        rdma_absent,
        rdma_devices,
        gpus: nvidia_gpus(),
        amd_kfd: Path::new("/dev/kfd").exists(),
        netns: Path::new("/proc/self/ns/net").exists() && on_path("ip"),
        docker: Path::new("/var/run/docker.sock").exists(),
        vm: on_path("vng") && on_path("qemu-system-x86_64"),
        gdb: on_path("gdb"),
    }
}

impl HostFacts {
    /// `Ok` when `req` is met on this host under `profile`, else the typed reason.
    pub fn check(&self, req: Requirement, profile: &HostProfile) -> Result<(), SkipReason> {
        let skip = |code, detail: String| Err(SkipReason { code, detail });
        match req {
            Requirement::Rdma => {
                if let Some(why) = &self.rdma_absent {
                    return skip("no-rdma-device", why.clone());
                }
                let active = self
                    .rdma_devices
                    .iter()
                    .any(|d| d.ports.iter().any(|p| p.state.contains("ACTIVE")));
                if !active {
                    let names: Vec<_> = self.rdma_devices.iter().map(|d| d.name.as_str()).collect();
                    return skip(
                        "rdma-port-down",
                        format!("no ACTIVE port on {}", names.join(", ")),
                    );
                }
                Ok(())
            }
            Requirement::Gpu => {
                if !self.gpus.is_empty() {
                    Ok(())
                } else if self.amd_kfd {
                    skip(
                        "rocm-unsupported",
                        "an AMD GPU (/dev/kfd) is present; ROCm is not supported yet".into(),
                    )
                } else {
                    skip(
                        "no-gpu",
                        "no NVIDIA GPU (/proc/driver/nvidia/gpus is absent or empty)".into(),
                    )
                }
            }
            Requirement::Xhost if profile.hosts() < 2 => skip(
                "single-host-profile",
                format!(
                    "host profile `{}` has {} host; cross-host scenarios need two",
                    profile.name,
                    profile.hosts()
                ),
            ),
            Requirement::Xhost => Ok(()),
            Requirement::Root if !self.root => {
                skip("not-root", "needs root (CAP_NET_ADMIN and friends)".into())
            }
            Requirement::Root => Ok(()),
            Requirement::Netns if !(self.netns && self.root) => skip(
                "no-netns",
                "network namespaces need root and iproute2's `ip`".into(),
            ),
            Requirement::Netns => Ok(()),
            Requirement::Docker if !self.docker => {
                skip("no-docker", "/var/run/docker.sock is absent".into())
            }
            Requirement::Docker => Ok(()),
            Requirement::Vm if !self.vm => skip(
                "no-vm",
                "virtme-ng (`vng`) or qemu-system-x86_64 is not installed".into(),
            ),
            Requirement::Vm => Ok(()),
        }
    }
}

fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// RDMA devices as the transport's discovery sees them (one reading of sysfs for both).
fn rdma() -> (Vec<RdmaDevice>, Option<String>) {
    use transport::rdma::discovery::{discover, DiscoveryError, PortState};
    match discover(Path::new("/sys")) {
        Ok(devices) => {
            let devices = devices
                .into_iter()
                .map(|d| RdmaDevice {
                    rxe: d.is_rxe(),
                    ports: d
                        .ports
                        .iter()
                        .map(|p| RdmaPort {
                            port: p.number,
                            state: match p.state {
                                PortState::Active => "ACTIVE".into(),
                                PortState::Down => "DOWN".into(),
                                PortState::Init => "INIT".into(),
                                PortState::Armed => "ARMED".into(),
                                PortState::Other(n) => format!("state {n}"),
                            },
                        })
                        .collect(),
                    name: d.name,
                })
                .collect();
            (devices, None)
        }
        Err(DiscoveryError::NoRdma(why)) => (vec![], Some(why)),
        Err(e) => (vec![], Some(e.to_string())),
    }
}

fn nvidia_gpus() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc/driver/nvidia/gpus") else {
        return vec![];
    };
    entries
        .flatten()
        .map(|g| {
            read_trim(g.path().join("information"))
                .and_then(|i| {
                    i.lines()
                        .find(|l| l.starts_with("Model:"))
                        .map(|l| l[6..].trim().to_string())
                })
                .unwrap_or_else(|| g.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

pub fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}
