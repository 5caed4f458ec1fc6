//! GPU buffers (cargo feature `gpu`): device memory moved by the TCP and RDMA transports.
//!
//! cudarc loads libcuda at run time, so building needs no CUDA and a binary built with this
//! feature still runs on a host without a GPU: [`Gpu::open`] and [`inventory`] return a typed
//! [`GpuError`] there instead of panicking (cudarc's `CudaContext::new` panics when libcuda is
//! missing, so its presence is checked first and every driver call is caught at this boundary).
//!
//! - [`device`]: the inventory, a device context with its stream, device and pinned buffers.
//! - [`pattern`]: fill and check kernels (PTX, no NVRTC needed) and their host reference.
//! - [`tcp`]: TCP moves device memory by staging it through pinned host memory.
//! - [`rdma`] (with `rdma`): GPU memory registered through dmabuf, or staged when that fails.

pub mod device;
pub mod pattern;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod tcp;

pub use device::{inventory, libcuda_present, DeviceBuffer, Gpu, GpuInfo, Inventory, PinnedBuffer};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum GpuError {
    /// No NVIDIA user-space driver to load: the skip reason `no-gpu`.
    #[error("libcuda.so cannot be loaded (no NVIDIA driver){}", if *.kernel_driver { "; the kernel driver is loaded (/proc/driver/nvidia), so the user-space library is missing" } else { "" })]
    NoDriver { kernel_driver: bool },
    /// The driver loaded but reports no usable device: also `no-gpu`.
    #[error("the CUDA driver reports no device: {0}")]
    NoDevice(String),
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
    /// True when the host simply has no usable NVIDIA GPU (a skip, not a failure).
    pub fn is_absent(&self) -> bool {
        matches!(self, GpuError::NoDriver { .. } | GpuError::NoDevice(_))
    }
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
