//! GPU buffers (cargo feature `gpu`): device memory moved by the TCP and RDMA transports, on
//! NVIDIA (CUDA) and AMD (HIP) GPUs.
//!
//! Both runtimes are loaded at run time (cudarc loads libcuda; the HIP backend resolves a table
//! of symbols from libamdhip64), so building needs neither and a binary built with this feature
//! still runs on a host without a GPU: [`Gpu::open`] and [`inventory`] return a typed
//! [`GpuError`] there instead of panicking (cudarc's `CudaContext::new` panics when libcuda is
//! missing, so its presence is checked first and every driver call is caught at this boundary).
//!
//! - [`device`]: one API over both vendors: the inventory, a device with its stream, device
//!   and pinned buffers.
//! - `cuda`, [`hip`]: the two backends ([`hip`] also compiles the kernels for the GPU's
//!   architecture, and reads architectures from the kernel's KFD topology).
//! - [`pattern`]: fill and check kernels (PTX; HIP source) and their host reference.
//! - [`tcp`]: TCP moves device memory by staging it through pinned host memory.
//! - [`rdma`] (with `rdma`): GPU memory registered through dmabuf, or staged when that fails.

mod cuda;
pub mod device;
pub mod hip;
pub mod pattern;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod tcp;

pub use cuda::libcuda_present;
pub use device::{
    inventory, inventory_of, DeviceBuffer, Gpu, GpuInfo, Inventory, PinnedBuffer, Vendor,
};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum GpuError {
    /// No NVIDIA user-space driver to load: the skip reason `no-gpu`.
    #[error("libcuda.so cannot be loaded (no NVIDIA driver){}", if *.kernel_driver { "; the kernel driver is loaded (/proc/driver/nvidia), so the user-space library is missing" } else { "" })]
    NoDriver { kernel_driver: bool },
    /// The driver or runtime loaded but reports no usable device: also `no-gpu`.
    #[error("{0}")]
    NoDevice(String),
    /// Neither vendor has a usable GPU here: `no-gpu`, with each runtime's reason.
    #[error("no GPU: NVIDIA: {nvidia}; AMD: {amd}")]
    NoGpu { nvidia: String, amd: String },
    /// No HIP runtime (libamdhip64) or hiprtc could be loaded: the skip reason `no-hip-runtime`.
    #[error("{0}")]
    NoHipRuntime(String),
    /// The host's HIP toolchain cannot compile for this GPU: `hip-arch-unsupported`.
    #[error("cannot compile the pattern kernels for {arch}: {why}")]
    HipArchUnsupported { arch: String, why: String },
    #[error("HIP call {call} failed: {error} ({code})")]
    Hip {
        call: &'static str,
        code: i32,
        error: String,
    },
    #[error(
        "hiprtc could not compile the pattern kernels for {arch}: {call} returned {status}: {log}"
    )]
    HipCompile {
        arch: String,
        call: &'static str,
        status: i32,
        log: String,
    },
    #[error("GPU {ordinal} does not exist (the driver reports {count})")]
    NoSuchOrdinal { ordinal: usize, count: usize },
    #[error("CUDA driver call {call} failed: {error}")]
    Driver { call: &'static str, error: String },
    /// The driver library lacks a symbol this build calls (older than CUDA 12.8), or cudarc
    /// panicked for another reason; caught so that it is a result, not a crash.
    #[error("CUDA driver call {call} panicked: {message}")]
    Panicked { call: &'static str, message: String },
    #[error("{len} bytes do not fit a {capacity}-byte buffer")]
    TooLong { len: usize, capacity: usize },
    #[error("transport: {0}")]
    Transport(#[from] crate::Error),
    #[cfg(feature = "rdma")]
    #[error("rdma: {0}")]
    Rdma(#[from] crate::rdma::rc::RdmaError),
    #[error("protocol: {0}")]
    Protocol(String),
}

impl GpuError {
    /// True when the host simply has no usable GPU, or no runtime for the one it has (a skip,
    /// not a failure, unless the host profile says the GPU must be there).
    pub fn is_absent(&self) -> bool {
        matches!(
            self,
            GpuError::NoDriver { .. }
                | GpuError::NoDevice(_)
                | GpuError::NoGpu { .. }
                | GpuError::NoHipRuntime(_)
        )
    }
}

fn check_len(len: usize, capacity: usize) -> Result<()> {
    if len > capacity {
        return Err(GpuError::TooLong { len, capacity });
    }
    Ok(())
}

pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// Run one driver interaction, turning an error or a panic inside cudarc into a [`GpuError`].
pub(crate) fn call<T>(
    call: &'static str,
    f: impl FnOnce() -> Result<T, cudarc::driver::DriverError>,
) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(GpuError::Driver {
            call,
            error: format!("{e:?}"),
        }),
        Err(p) => Err(GpuError::Panicked {
            call,
            message: p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into()),
        }),
    }
}
