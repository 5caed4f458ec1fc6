//! One GPU API over both vendors: the inventory, a device with one stream, and the buffers the
//! transports move. Which backend serves a GPU is decided once, when it is opened; a buffer
//! belongs to the backend that allocated it.

use std::path::Path;

use super::cuda::{CudaDevice, CudaGpu, CudaPinned};
use super::hip::{HipDevice, HipGpu, HipPinned};
use super::{GpuError, Result};

/// Who made the GPU, and so which runtime drives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// CUDA, through libcuda.
    Nvidia,
    /// HIP, through libamdhip64.
    Amd,
}

impl Vendor {
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
        }
    }
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One GPU as its runtime describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    pub vendor: Vendor,
    pub ordinal: usize,
    pub name: String,
    /// The compiler's target: "sm_90" on NVIDIA, "gfx942" on AMD (from KFD; empty when the
    /// kernel does not list the device).
    pub arch: String,
    pub memory_bytes: u64,
    /// NVIDIA's compute capability; on AMD the gfx major and minor version.
    pub compute_capability: (i32, i32),
    /// The device's memory can be exported as a dmabuf, which an RDMA NIC can then register
    /// directly (NVIDIA: `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`; AMD: the runtime has the
    /// export, and [`hip::dmabuf_export_works`](super::hip::dmabuf_export_works) tries one).
    pub dmabuf: bool,
}

/// Every GPU one runtime sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inventory {
    pub vendor: Vendor,
    /// The driver's version: CUDA's ("12.8"), or HIP's view of the AMD driver.
    pub driver_version: String,
    /// The runtime and the library it was loaded from ("HIP 6.2.41133 (libamdhip64.so.6)").
    pub runtime: String,
    pub devices: Vec<GpuInfo>,
}

/// The GPUs of `vendor`.
pub fn inventory_of(vendor: Vendor) -> Result<Inventory> {
    match vendor {
        Vendor::Nvidia => super::cuda::inventory(),
        Vendor::Amd => super::hip::inventory(),
    }
}

/// The GPUs this host has: NVIDIA's when a CUDA driver answers with devices, else AMD's. Never
/// panics; when neither vendor has a usable GPU the error says why for both, and is the most
/// specific one: an AMD GPU in the kernel without a HIP runtime is [`GpuError::NoHipRuntime`].
pub fn inventory() -> Result<Inventory> {
    let nvidia = match super::cuda::inventory() {
        Ok(inv) => return Ok(inv),
        Err(e) if e.is_absent() => e,
        Err(e) => return Err(e),
    };
    let amd = match super::hip::inventory() {
        Ok(inv) => return Ok(inv),
        Err(e) if e.is_absent() => e,
        Err(e) => return Err(e),
    };
    Err(absence(
        nvidia,
        amd,
        &super::hip::kfd::gpus(Path::new("/sys")),
    ))
}

/// The one error for a host where neither runtime found a GPU: an AMD GPU that the kernel
/// lists but no HIP runtime can drive is named as such (`no-hip-runtime`), anything else is
/// "no GPU" with both runtimes' reasons.
fn absence(nvidia: GpuError, amd: GpuError, kfd_gpus: &[super::hip::kfd::KfdGpu]) -> GpuError {
    match amd {
        GpuError::NoHipRuntime(why) if !kfd_gpus.is_empty() => {
            let archs: Vec<_> = kfd_gpus.iter().map(|g| g.arch.as_str()).collect();
            GpuError::NoHipRuntime(format!(
                "the kernel lists {} AMD GPU(s) ({}) but {why}",
                kfd_gpus.len(),
                archs.join(", ")
            ))
        }
        amd => GpuError::NoGpu {
            nvidia: nvidia.to_string(),
            amd: amd.to_string(),
        },
    }
}

/// Device memory, from either backend.
pub struct DeviceBuffer(pub(crate) DeviceMemory);

pub(crate) enum DeviceMemory {
    Cuda(CudaDevice),
    Hip(HipDevice),
}

impl DeviceBuffer {
    pub fn len(&self) -> usize {
        match &self.0 {
            DeviceMemory::Cuda(b) => b.len(),
            DeviceMemory::Hip(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Page-locked host memory: the staging area between a device buffer and a socket or NIC.
pub struct PinnedBuffer(PinnedMemory);

enum PinnedMemory {
    Cuda(CudaPinned),
    Hip(HipPinned),
}

impl PinnedBuffer {
    /// The bytes, once every copy into them has finished.
    pub fn bytes(&self) -> Result<&[u8]> {
        match &self.0 {
            PinnedMemory::Cuda(b) => b.bytes(),
            PinnedMemory::Hip(b) => Ok(b.bytes()),
        }
    }

    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        match &mut self.0 {
            PinnedMemory::Cuda(b) => b.bytes_mut(),
            PinnedMemory::Hip(b) => Ok(b.bytes_mut()),
        }
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            PinnedMemory::Cuda(b) => b.len(),
            PinnedMemory::Hip(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One GPU of either vendor: a device with one stream that orders every copy and kernel, and
/// the pattern kernels loaded into it.
pub struct Gpu {
    backend: Backend,
    info: GpuInfo,
    driver_version: String,
    runtime: String,
}

enum Backend {
    Cuda(CudaGpu),
    Hip(HipGpu),
}

/// A buffer handed to a GPU of the other vendor.
fn foreign() -> GpuError {
    GpuError::Protocol("a buffer allocated by one GPU backend was given to the other".into())
}

impl Gpu {
    /// Open GPU `ordinal` of whichever vendor this host has.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        Gpu::open_with(inventory()?, ordinal, None)
    }

    /// Open GPU `ordinal` of `inventory`; AMD kernels compiled for it are cached in
    /// `kernel_cache` (the run folder), so the ranks after the first load them at once.
    pub fn open_with(
        inventory: Inventory,
        ordinal: usize,
        kernel_cache: Option<&Path>,
    ) -> Result<Gpu> {
        let info = inventory
            .devices
            .get(ordinal)
            .cloned()
            .ok_or(GpuError::NoSuchOrdinal {
                ordinal,
                count: inventory.devices.len(),
            })?;
        let backend = match inventory.vendor {
            Vendor::Nvidia => Backend::Cuda(CudaGpu::open(ordinal)?),
            Vendor::Amd => Backend::Hip(HipGpu::open(&info, kernel_cache)?),
        };
        Ok(Gpu {
            backend,
            info,
            driver_version: inventory.driver_version,
            runtime: inventory.runtime,
        })
    }

    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    pub fn vendor(&self) -> Vendor {
        self.info.vendor
    }

    pub fn driver_version(&self) -> &str {
        &self.driver_version
    }

    /// The runtime and its library ("CUDA driver 12.8 (libcuda)", "HIP 6.2.41133 (…)").
    pub fn runtime(&self) -> &str {
        &self.runtime
    }

    /// `len` bytes of zeroed device memory.
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        Ok(DeviceBuffer(match &self.backend {
            Backend::Cuda(g) => DeviceMemory::Cuda(g.alloc(len)?),
            Backend::Hip(g) => DeviceMemory::Hip(g.alloc(len)?),
        }))
    }

    /// `len` bytes of zeroed device memory that can be exported as a dmabuf (on CUDA, plain
    /// `cuMemAlloc` rather than the stream-ordered pool; every `hipMalloc` allocation can be).
    pub fn alloc_exportable(&self, len: usize) -> Result<DeviceBuffer> {
        Ok(DeviceBuffer(match &self.backend {
            Backend::Cuda(g) => DeviceMemory::Cuda(g.alloc_exportable(len)?),
            Backend::Hip(g) => DeviceMemory::Hip(g.alloc(len)?),
        }))
    }

    /// `len` bytes of zeroed pinned host memory.
    pub fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer> {
        Ok(PinnedBuffer(match &self.backend {
            Backend::Cuda(g) => PinnedMemory::Cuda(g.alloc_pinned(len)?),
            Backend::Hip(g) => PinnedMemory::Hip(g.alloc_pinned(len)?),
        }))
    }

    /// Copy the first `dst.len()` bytes of `src` to the host; returns once they are there.
    pub fn to_host(&self, src: &DeviceBuffer, dst: &mut [u8]) -> Result<()> {
        match (&self.backend, &src.0) {
            (Backend::Cuda(g), DeviceMemory::Cuda(b)) => g.to_host(b, dst),
            (Backend::Hip(g), DeviceMemory::Hip(b)) => g.to_host(b, dst),
            _ => Err(foreign()),
        }
    }

    /// Copy `src` into the start of `dst`; returns once the copy is done.
    pub fn to_device(&self, src: &[u8], dst: &mut DeviceBuffer) -> Result<()> {
        self.to_device_at(src, dst, 0)
    }

    /// Copy `src` into `dst` at `offset`; returns once the copy is done.
    pub fn to_device_at(&self, src: &[u8], dst: &mut DeviceBuffer, offset: usize) -> Result<()> {
        match (&self.backend, &mut dst.0) {
            (Backend::Cuda(g), DeviceMemory::Cuda(b)) => g.to_device_at(src, b, offset),
            (Backend::Hip(g), DeviceMemory::Hip(b)) => g.to_device_at(src, b, offset),
            _ => Err(foreign()),
        }
    }

    /// Write the pattern for `seed` into the first `len` bytes, on the device.
    pub fn fill_pattern(&self, buf: &mut DeviceBuffer, len: usize, seed: u64) -> Result<()> {
        match (&self.backend, &mut buf.0) {
            (Backend::Cuda(g), DeviceMemory::Cuda(b)) => g.fill_pattern(b, len, seed),
            (Backend::Hip(g), DeviceMemory::Hip(b)) => g.fill_pattern(b, len, seed),
            _ => Err(foreign()),
        }
    }

    /// How many of the first `len` bytes differ from the pattern for `seed`, counted on the
    /// device.
    pub fn pattern_mismatches(&self, buf: &DeviceBuffer, len: usize, seed: u64) -> Result<u64> {
        self.pattern_mismatches_at(buf, 0, len, seed)
    }

    /// The same for the `len` bytes at `offset` (which hold pattern bytes 0..len).
    pub fn pattern_mismatches_at(
        &self,
        buf: &DeviceBuffer,
        offset: usize,
        len: usize,
        seed: u64,
    ) -> Result<u64> {
        match (&self.backend, &buf.0) {
            (Backend::Cuda(g), DeviceMemory::Cuda(b)) => {
                g.pattern_mismatches_at(b, offset, len, seed)
            }
            (Backend::Hip(g), DeviceMemory::Hip(b)) => {
                g.pattern_mismatches_at(b, offset, len, seed)
            }
            _ => Err(foreign()),
        }
    }

    /// The buffer's device address (for dmabuf export and as the RDMA iova).
    #[cfg(feature = "rdma")]
    pub(crate) fn device_address(&self, buf: &DeviceBuffer) -> Result<u64> {
        match (&self.backend, &buf.0) {
            (Backend::Cuda(g), DeviceMemory::Cuda(b)) => Ok(g.device_address(b)),
            (Backend::Hip(_), DeviceMemory::Hip(b)) => Ok(b.address()),
            _ => Err(foreign()),
        }
    }

    /// Export the whole allocation as a dmabuf.
    #[cfg(feature = "rdma")]
    pub(crate) fn export_dmabuf(&self, buf: &DeviceBuffer) -> Result<std::os::fd::OwnedFd> {
        match (&self.backend, &buf.0) {
            (Backend::Cuda(g), DeviceMemory::Cuda(b)) => g.export_dmabuf(b),
            (Backend::Hip(g), DeviceMemory::Hip(b)) => g.export_dmabuf(b),
            _ => Err(foreign()),
        }
    }

    pub fn sync(&self) -> Result<()> {
        match &self.backend {
            Backend::Cuda(g) => g.sync(),
            Backend::Hip(g) => g.sync(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::hip::kfd::KfdGpu;
    use super::*;

    fn no_driver() -> GpuError {
        GpuError::NoDriver {
            kernel_driver: false,
        }
    }

    #[test]
    fn an_amd_gpu_without_a_runtime_is_no_hip_runtime_not_no_gpu() {
        let mi300x = KfdGpu {
            arch: "gfx942".into(),
            version: (9, 4),
            domain: 0,
            location_id: 0xc100,
        };
        let err = absence(
            no_driver(),
            GpuError::NoHipRuntime(
                "no HIP runtime could be loaded (tried libamdhip64.so.6)".into(),
            ),
            &[mi300x.clone(), mi300x],
        );
        assert!(err.is_absent());
        let GpuError::NoHipRuntime(why) = &err else {
            panic!("{err:?}");
        };
        assert!(why.contains("2 AMD GPU(s) (gfx942, gfx942)"), "{why}");
        assert!(why.contains("libamdhip64.so.6"), "{why}");
    }

    #[test]
    fn no_gpu_of_either_vendor_gives_both_reasons() {
        for amd in [
            GpuError::NoHipRuntime("no HIP runtime could be loaded".into()),
            GpuError::NoDevice("the HIP 5.2.21153 runtime reports no device".into()),
        ] {
            let err = absence(no_driver(), amd, &[]);
            assert!(matches!(err, GpuError::NoGpu { .. }), "{err:?}");
            let text = err.to_string();
            assert!(
                text.contains("libcuda.so") && text.contains("HIP"),
                "{text}"
            );
        }
    }
}
