//! What a host can do, and why a scenario's requirement is not met (a typed skip reason).

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::profile::HostProfile;
use crate::model::requirement::{Requirement, SkipCode, SkipReason};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RdmaPort {
    pub port: u32,
    pub state: PortStatus,
}

/// A port's state as sysfs reports it, typed (`ACTIVE` in JSON, as rdma-core prints it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PortStatus {
    Down,
    Init,
    Armed,
    Active,
    Other(u32),
}

impl From<wringer_transport::rdma::discovery::PortState> for PortStatus {
    fn from(s: wringer_transport::rdma::discovery::PortState) -> PortStatus {
        use wringer_transport::rdma::discovery::PortState;
        match s {
            PortState::Down => PortStatus::Down,
            PortState::Init => PortStatus::Init,
            PortState::Armed => PortStatus::Armed,
            PortState::Active => PortStatus::Active,
            PortState::Other(n) => PortStatus::Other(n),
        }
    }
}

impl fmt::Display for PortStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortStatus::Other(n) => write!(f, "state {n}"),
            s => write!(f, "{}", format!("{s:?}").to_uppercase()),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RdmaDevice {
    pub name: String,
    pub rxe: bool,
    pub ports: Vec<RdmaPort>,
}

/// One NVIDIA GPU as the CUDA driver describes it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GpuFact {
    pub index: usize,
    pub model: String,
    pub memory_mib: u64,
    pub compute_capability: String,
    /// The GPU can export memory as a dmabuf (the RDMA path can register it directly).
    pub dmabuf: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostFacts {
    pub host: String,
    pub kernel: String,
    pub root: bool,
    /// Why RDMA discovery found nothing, when it found nothing.
    pub rdma_absent: Option<String>,
    pub rdma_devices: Vec<RdmaDevice>,
    pub gpus: Vec<GpuFact>,
    /// The CUDA driver's version ("12.8"), when a driver answered.
    #[serde(default)]
    pub gpu_driver: Option<String>,
    /// Why no GPU is usable, when none is.
    #[serde(default)]
    pub gpu_absent: Option<String>,
    pub amd_kfd: bool,
    pub netns: bool,
    pub docker: bool,
    pub vm: bool,
    pub gdb: bool,
    /// strace is installed (the lifecycle audit's fallback, and what injects perturbations).
    #[serde(default)]
    pub strace: bool,
    /// Why the audit cannot record syscalls with eBPF here (`None`: it can).
    #[serde(default = "ebpf_unknown")]
    pub ebpf_absent: Option<String>,
}

/// A host whose probe predates the eBPF backend has not said it can use it.
fn ebpf_unknown() -> Option<String> {
    Some("this host's wringer did not report on eBPF".into())
}

/// Probe this machine.
pub fn local() -> HostFacts {
    let (rdma_devices, rdma_absent) = rdma();
    let (gpus, gpu_driver, gpu_absent) = gpus();
    HostFacts {
        host: read_trim("/proc/sys/kernel/hostname").unwrap_or_else(|| "localhost".into()),
        kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_default(),
        // SAFETY: geteuid has no preconditions and cannot fail.
        root: unsafe { libc::geteuid() } == 0,
        rdma_absent,
        rdma_devices,
        gpus,
        gpu_driver,
        gpu_absent,
        amd_kfd: Path::new("/dev/kfd").exists(),
        netns: Path::new("/proc/self/ns/net").exists() && on_path("ip"),
        docker: Path::new("/var/run/docker.sock").exists(),
        vm: on_path("vng") && on_path("qemu-system-x86_64"),
        gdb: on_path("gdb"),
        strace: on_path("strace"),
        ebpf_absent: crate::hosts::syscall_trace::unusable(),
    }
}

impl HostFacts {
    /// `Ok` when `req` is met on this host under `profile`, else the typed reason.
    pub fn check(&self, req: Requirement, profile: &HostProfile) -> Result<(), SkipReason> {
        let skip = |code, detail: String| Err(SkipReason { code, detail });
        match req {
            Requirement::Rdma => {
                if let Some(why) = &self.rdma_absent {
                    return skip(SkipCode::NoRdmaDevice, why.clone());
                }
                let active = self
                    .rdma_devices
                    .iter()
                    .any(|d| d.ports.iter().any(|p| p.state == PortStatus::Active));
                if !active {
                    let names: Vec<_> = self.rdma_devices.iter().map(|d| d.name.as_str()).collect();
                    return skip(
                        SkipCode::RdmaPortDown,
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
                        SkipCode::RocmUnsupported,
                        "an AMD GPU (/dev/kfd) is present but wringer moves GPU memory through \
                         CUDA only; ROCm (HIP) is not supported yet"
                            .into(),
                    )
                } else {
                    skip(
                        SkipCode::NoGpu,
                        self.gpu_absent
                            .clone()
                            .unwrap_or_else(|| "no NVIDIA GPU".into()),
                    )
                }
            }
            Requirement::Xhost if profile.hosts() < 2 => skip(
                SkipCode::SingleHostProfile,
                format!(
                    "host profile `{}` has {} host; cross-host scenarios need two",
                    profile.name,
                    profile.hosts()
                ),
            ),
            Requirement::Xhost => Ok(()),
            Requirement::Root if !self.root => skip(
                SkipCode::NotRoot,
                "needs root (CAP_NET_ADMIN and friends)".into(),
            ),
            Requirement::Root => Ok(()),
            Requirement::Netns if !(self.netns && self.root) => skip(
                SkipCode::NoNetns,
                "network namespaces need root and iproute2's `ip`".into(),
            ),
            Requirement::Netns => Ok(()),
            Requirement::Docker if !self.docker => {
                skip(SkipCode::NoDocker, "/var/run/docker.sock is absent".into())
            }
            Requirement::Docker => Ok(()),
            Requirement::Vm if !self.vm => skip(
                SkipCode::NoVm,
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
    use wringer_transport::rdma::discovery::{discover, DiscoveryError};
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
                            state: p.state.into(),
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

/// NVIDIA GPUs as the CUDA driver reports them (loaded at run time: no driver, no GPUs).
fn gpus() -> (Vec<GpuFact>, Option<String>, Option<String>) {
    match wringer_transport::gpu::inventory() {
        Ok(inv) => {
            let gpus = inv
                .devices
                .into_iter()
                .map(|d| GpuFact {
                    index: d.ordinal,
                    model: d.name,
                    memory_mib: d.memory_bytes >> 20,
                    compute_capability: format!(
                        "{}.{}",
                        d.compute_capability.0, d.compute_capability.1
                    ),
                    dmabuf: d.dmabuf,
                })
                .collect();
            (gpus, Some(inv.driver_version), None)
        }
        Err(e) => (vec![], None, Some(e.to_string())),
    }
}

pub fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> HostFacts {
        HostFacts {
            host: "h".into(),
            kernel: "6.1".into(),
            root: true,
            rdma_absent: Some("no RDMA".into()),
            rdma_devices: vec![],
            gpus: vec![],
            gpu_driver: None,
            gpu_absent: Some("libcuda.so cannot be loaded (no NVIDIA driver)".into()),
            amd_kfd: false,
            netns: true,
            docker: true,
            vm: false,
            gdb: true,
            strace: true,
            ebpf_absent: None,
        }
    }

    fn profile() -> HostProfile {
        let path =
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../hosts/local.yaml"));
        crate::hosts::profile::load(path).unwrap()
    }

    #[test]
    fn no_gpu_skip_carries_the_drivers_reason() {
        let err = facts().check(Requirement::Gpu, &profile()).unwrap_err();
        assert_eq!(err.code, SkipCode::NoGpu);
        assert!(err.detail.contains("libcuda.so"), "{err}");
    }

    #[test]
    fn an_amd_gpu_without_cuda_says_rocm_is_unsupported() {
        let f = HostFacts {
            amd_kfd: true,
            ..facts()
        };
        let err = f.check(Requirement::Gpu, &profile()).unwrap_err();
        assert_eq!(err.code, SkipCode::RocmUnsupported);
        assert!(err.detail.contains("ROCm"), "{err}");
    }

    #[test]
    fn an_nvidia_gpu_meets_the_requirement_even_beside_dev_kfd() {
        let f = HostFacts {
            amd_kfd: true,
            gpus: vec![GpuFact {
                index: 0,
                model: "NVIDIA H200".into(),
                memory_mib: 143_771,
                compute_capability: "9.0".into(),
                dmabuf: true,
            }],
            gpu_driver: Some("12.8".into()),
            gpu_absent: None,
            ..facts()
        };
        assert_eq!(f.check(Requirement::Gpu, &profile()), Ok(()));
    }

    #[test]
    fn this_machines_probe_answers_without_panicking() {
        let f = local();
        assert_eq!(f.gpus.is_empty(), f.gpu_absent.is_some(), "{f:?}");
    }
}
