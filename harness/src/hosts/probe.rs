//! What a host can do, and why a scenario's requirement is not met (a typed skip reason).

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::profile::{GpuVendor, HostProfile};
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

/// One GPU as its runtime (CUDA or HIP) describes it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GpuFact {
    pub index: usize,
    /// "nvidia" or "amd" (hosts probed before AMD support only ever reported NVIDIA).
    #[serde(default = "nvidia")]
    pub vendor: String,
    pub model: String,
    pub memory_mib: u64,
    /// The compiler target: "sm_90", "gfx942".
    #[serde(default)]
    pub arch: String,
    pub compute_capability: String,
    /// The GPU can export memory as a dmabuf (the RDMA path can register it directly).
    pub dmabuf: bool,
    /// Why the pattern kernels cannot be built for this GPU here (AMD: the host's ROCm does
    /// not know its architecture), when they cannot.
    #[serde(default)]
    pub unsupported: Option<String>,
}

fn nvidia() -> String {
    "nvidia".into()
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
    /// The driver's version ("12.8" for CUDA), when a driver answered.
    #[serde(default)]
    pub gpu_driver: Option<String>,
    /// The runtime that answered and its library ("HIP 6.2.41133 (libamdhip64.so.6)").
    #[serde(default)]
    pub gpu_runtime: Option<String>,
    /// Why no GPU is usable, when none is,
    #[serde(default)]
    pub gpu_absent: Option<String>,
    /// and the skip code that says it (`no-gpu`, or `no-hip-runtime` for an AMD GPU that no
    /// HIP runtime drives).
    #[serde(default)]
    pub gpu_absent_code: Option<SkipCode>,
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
    let gpu = gpus();
    HostFacts {
        host: read_trim("/proc/sys/kernel/hostname").unwrap_or_else(|| "localhost".into()),
        kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_default(),
        // SAFETY: geteuid has no preconditions and cannot fail.
        root: unsafe { libc::geteuid() } == 0,
        rdma_absent,
        rdma_devices,
        gpus: gpu.gpus,
        gpu_driver: gpu.driver,
        gpu_runtime: gpu.runtime,
        gpu_absent: gpu.absent,
        gpu_absent_code: gpu.absent_code,
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
            Requirement::Gpu => self.check_gpu(profile.gpu),
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

impl HostFacts {
    /// A GPU the scenarios can use: of the profile's vendor when it names one, with kernels
    /// that build for it.
    fn check_gpu(&self, wanted: Option<GpuVendor>) -> Result<(), SkipReason> {
        let skip = |code, detail: String| Err(SkipReason { code, detail });
        let of_vendor: Vec<&GpuFact> = self
            .gpus
            .iter()
            .filter(|g| wanted.is_none_or(|v| g.vendor == v.as_str()))
            .collect();
        if of_vendor.iter().any(|g| g.unsupported.is_none()) {
            return Ok(());
        }
        if let Some(g) = of_vendor.first() {
            return skip(
                SkipCode::HipArchUnsupported,
                format!(
                    "GPU {} ({}, {}): {}",
                    g.index,
                    g.model,
                    g.arch,
                    g.unsupported.as_deref().unwrap_or("")
                ),
            );
        }
        if let (Some(v), Some(other)) = (wanted, self.gpus.first()) {
            return skip(
                SkipCode::NoGpu,
                format!(
                    "the host profile says `gpu: {}` but this host's GPU is {} ({})",
                    v.as_str(),
                    other.model,
                    other.vendor
                ),
            );
        }
        let why = self.gpu_absent.clone().unwrap_or_else(|| "no GPU".into());
        match self.gpu_absent_code {
            Some(code) => skip(code, why),
            // The profile wants AMD and the kernel lists an AMD GPU: what is missing is HIP.
            None if wanted == Some(GpuVendor::Amd) && self.amd_kfd => {
                skip(SkipCode::NoHipRuntime, why)
            }
            None => skip(SkipCode::NoGpu, why),
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

/// What the probe says about GPUs.
struct GpuProbe {
    gpus: Vec<GpuFact>,
    driver: Option<String>,
    runtime: Option<String>,
    absent: Option<String>,
    absent_code: Option<SkipCode>,
}

/// GPUs as their runtime reports them (NVIDIA's through CUDA, else AMD's through HIP, each
/// loaded at run time: no runtime, no GPUs). For AMD GPUs the host's ROCm must also know the
/// architecture, or the kernels cannot be compiled.
fn gpus() -> GpuProbe {
    use wringer_transport::gpu::{hip, hip::rtc, GpuError, Vendor};
    match wringer_transport::gpu::inventory() {
        Ok(inv) => {
            let known = (inv.vendor == Vendor::Amd).then(rtc::known_architectures);
            let gpus = inv
                .devices
                .into_iter()
                .map(|d| GpuFact {
                    index: d.ordinal,
                    vendor: d.vendor.as_str().into(),
                    unsupported: match &known {
                        Some(Ok(k)) if !k.contains(&d.arch) => Some(format!(
                            "this host's ROCm ({}) cannot compile for {}; it knows {}",
                            inv.runtime,
                            if d.arch.is_empty() {
                                "an unknown architecture"
                            } else {
                                &d.arch
                            },
                            k.join(", ")
                        )),
                        Some(Err(why)) => Some(format!("no kernel compiler: {why}")),
                        _ => None,
                    },
                    model: d.name,
                    memory_mib: d.memory_bytes >> 20,
                    arch: d.arch,
                    compute_capability: format!(
                        "{}.{}",
                        d.compute_capability.0, d.compute_capability.1
                    ),
                    // AMD: the runtime has the export; whether the driver takes it is tried here.
                    dmabuf: d.dmabuf
                        && (d.vendor != Vendor::Amd || hip::dmabuf_export_works(d.ordinal)),
                })
                .collect();
            GpuProbe {
                gpus,
                driver: Some(inv.driver_version),
                runtime: Some(inv.runtime),
                absent: None,
                absent_code: None,
            }
        }
        Err(e) => GpuProbe {
            gpus: vec![],
            driver: None,
            runtime: None,
            absent_code: Some(match e {
                GpuError::NoHipRuntime(_) => SkipCode::NoHipRuntime,
                _ => SkipCode::NoGpu,
            }),
            absent: Some(e.to_string()),
        },
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
            gpu_runtime: None,
            gpu_absent: Some("no GPU: NVIDIA: libcuda.so cannot be loaded (no NVIDIA driver); AMD: the HIP 5.2.21153 runtime (libamdhip64.so.5) reports no device".into()),
            gpu_absent_code: Some(SkipCode::NoGpu),
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

    fn gpu(vendor: &str, model: &str, arch: &str) -> GpuFact {
        GpuFact {
            index: 0,
            vendor: vendor.into(),
            model: model.into(),
            memory_mib: 143_771,
            arch: arch.into(),
            compute_capability: "9.0".into(),
            dmabuf: true,
            unsupported: None,
        }
    }

    fn wanting(vendor: Option<GpuVendor>) -> HostProfile {
        HostProfile {
            gpu: vendor,
            ..profile()
        }
    }

    #[test]
    fn an_amd_gpu_without_a_hip_runtime_is_no_hip_runtime() {
        let f = HostFacts {
            amd_kfd: true,
            gpu_absent: Some("the kernel lists 8 AMD GPU(s) (gfx942, …) but no HIP runtime could be loaded (tried libamdhip64.so.6: …)".into()),
            gpu_absent_code: Some(SkipCode::NoHipRuntime),
            ..facts()
        };
        let err = f.check(Requirement::Gpu, &profile()).unwrap_err();
        assert_eq!(err.code, SkipCode::NoHipRuntime);
        assert!(
            err.to_string()
                .starts_with("no-hip-runtime: the kernel lists 8 AMD GPU(s)"),
            "{err}"
        );
    }

    #[test]
    fn a_profile_naming_amd_on_a_kfd_host_without_hip_is_no_hip_runtime() {
        // A probe from before the code was reported: /dev/kfd and the profile decide it.
        let f = HostFacts {
            amd_kfd: true,
            gpu_absent_code: None,
            ..facts()
        };
        let err = f
            .check(Requirement::Gpu, &wanting(Some(GpuVendor::Amd)))
            .unwrap_err();
        assert_eq!(err.code, SkipCode::NoHipRuntime, "{err}");
        let err = f.check(Requirement::Gpu, &profile()).unwrap_err();
        assert_eq!(err.code, SkipCode::NoGpu, "{err}");
    }

    #[test]
    fn an_amd_gpu_this_rocm_cannot_compile_for_is_hip_arch_unsupported() {
        let f = HostFacts {
            amd_kfd: true,
            gpus: vec![GpuFact {
                unsupported: Some(
                    "this host's ROCm (HIP 5.2.21153) cannot compile for gfx942".into(),
                ),
                ..gpu("amd", "AMD Instinct MI300X", "gfx942")
            }],
            gpu_absent: None,
            gpu_absent_code: None,
            ..facts()
        };
        let err = f.check(Requirement::Gpu, &profile()).unwrap_err();
        assert_eq!(err.code, SkipCode::HipArchUnsupported);
        assert!(
            err.detail.contains("MI300X") && err.detail.contains("gfx942"),
            "{err}"
        );
    }

    #[test]
    fn the_profiles_vendor_decides_which_gpu_counts() {
        let f = HostFacts {
            gpus: vec![gpu("nvidia", "NVIDIA H200", "sm_90")],
            gpu_absent: None,
            gpu_absent_code: None,
            ..facts()
        };
        assert_eq!(f.check(Requirement::Gpu, &wanting(None)), Ok(()));
        assert_eq!(
            f.check(Requirement::Gpu, &wanting(Some(GpuVendor::Nvidia))),
            Ok(())
        );
        let err = f
            .check(Requirement::Gpu, &wanting(Some(GpuVendor::Amd)))
            .unwrap_err();
        assert_eq!(err.code, SkipCode::NoGpu);
        assert!(
            err.detail.contains("`gpu: amd`") && err.detail.contains("H200"),
            "{err}"
        );
        let amd = HostFacts {
            gpus: vec![gpu("amd", "AMD Instinct MI300X", "gfx942")],
            ..f
        };
        assert_eq!(
            amd.check(Requirement::Gpu, &wanting(Some(GpuVendor::Amd))),
            Ok(())
        );
    }

    #[test]
    fn an_nvidia_gpu_meets_the_requirement_even_beside_dev_kfd() {
        let f = HostFacts {
            amd_kfd: true,
            gpus: vec![gpu("nvidia", "NVIDIA H200", "sm_90")],
            gpu_driver: Some("12.8".into()),
            gpu_absent: None,
            gpu_absent_code: None,
            ..facts()
        };
        assert_eq!(f.check(Requirement::Gpu, &profile()), Ok(()));
    }

    #[test]
    fn this_machines_probe_answers_without_panicking() {
        let f = local();
        assert_eq!(f.gpus.is_empty(), f.gpu_absent.is_some(), "{f:?}");
        assert_eq!(f.gpus.is_empty(), f.gpu_absent_code.is_some(), "{f:?}");
        assert_eq!(f.gpus.is_empty(), f.gpu_runtime.is_none(), "{f:?}");
    }
}
