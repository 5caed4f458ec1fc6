//! The NVIDIA backend: cudarc over libcuda (loaded at run time). The inventory, a device
//! context with one stream, and the buffers the transports move.

mod kernels;

use std::mem::ManuallyDrop;
use std::path::Path;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdevice_attribute};
use cudarc::driver::{result, CudaContext, CudaSlice, CudaStream, PinnedHostSlice};

use kernels::Kernels;

use crate::gpu::{call, check_len, GpuError, GpuInfo, Inventory, Result, Vendor};

/// Can libcuda be loaded here? (Nothing is called; only `dlopen` is tried.)
pub fn libcuda_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names; nothing is called.
    unsafe { sys::is_culib_present() }
}

/// Ask the driver what it has. Never panics: no libcuda is [`GpuError::NoDriver`], a driver
/// without devices [`GpuError::NoDevice`].
pub fn inventory() -> Result<Inventory> {
    if !libcuda_present() {
        return Err(GpuError::NoDriver {
            kernel_driver: Path::new("/proc/driver/nvidia").exists(),
        });
    }
    match call("cuInit", result::init) {
        Err(GpuError::Driver { error, .. }) if error.contains("NO_DEVICE") => {
            return Err(GpuError::NoDevice(format!(
                "the CUDA driver reports no device: {error}"
            )))
        }
        other => other?,
    }
    let version = call("cuDriverGetVersion", || {
        let mut v = 0;
        // SAFETY: writes one int through a valid pointer.
        unsafe { sys::cuDriverGetVersion(&mut v) }.result()?;
        Ok(v)
    })?;
    let count = call("cuDeviceGetCount", result::device::get_count)?;
    if count <= 0 {
        return Err(GpuError::NoDevice(
            "the CUDA driver reports 0 devices".into(),
        ));
    }
    let devices = (0..count as usize)
        .map(describe)
        .collect::<Result<Vec<_>>>()?;
    let version = format!("{}.{}", version / 1000, version % 1000 / 10);
    Ok(Inventory {
        vendor: Vendor::Nvidia,
        runtime: format!("CUDA driver {version} (libcuda)"),
        driver_version: version,
        devices,
    })
}

fn describe(ordinal: usize) -> Result<GpuInfo> {
    call("cuDeviceGet*", || {
        let dev = result::device::get(ordinal as i32)?;
        // SAFETY: `dev` is a device handle the driver just returned; attribute queries only
        // read.
        let attr = |a| unsafe { result::device::get_attribute(dev, a) };
        let cc = (
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        Ok(GpuInfo {
            vendor: Vendor::Nvidia,
            ordinal,
            name: result::device::get_name(dev)?,
            arch: format!("sm_{}{}", cc.0, cc.1),
            // SAFETY: as above.
            memory_bytes: unsafe { result::device::total_mem(dev) }? as u64,
            compute_capability: cc,
            dmabuf: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)? == 1,
        })
    })
}

/// Device memory. Freed when dropped: stream-ordered for pool memory, after a stream
/// synchronize for exportable (`cuMemAlloc`) memory.
pub struct CudaDevice {
    pub(crate) slice: ManuallyDrop<CudaSlice<u8>>,
    /// Allocated with plain `cuMemAlloc` (not from the stream-ordered pool), so it can be
    /// exported as a dmabuf, and freed with `cuMemFree`.
    exportable: bool,
}

impl CudaDevice {
    pub fn len(&self) -> usize {
        self.slice.len()
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // SAFETY: `slice` is taken exactly once, here, and never used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        if !self.exportable {
            drop(slice);
            return;
        }
        let stream = Arc::clone(slice.stream());
        let _ = call("cuMemFree", || {
            stream.synchronize()?;
            let ptr = slice.leak();
            stream.context().bind_to_thread()?;
            // SAFETY: `ptr` came from cuMemAlloc in `alloc_exportable`, the stream that used
            // it is idle, and the slice that owned it was leaked, so this is the only free.
            unsafe { result::free_sync(ptr) }
        });
    }
}

/// Page-locked host memory: the staging area between a device buffer and a socket or NIC.
/// Allocated without write-combining, because the CPU reads it (to send it).
pub struct CudaPinned {
    pub(crate) slice: PinnedHostSlice<u8>,
}

impl CudaPinned {
    /// The bytes, once every copy into them has finished.
    pub fn bytes(&self) -> Result<&[u8]> {
        call("cuEventSynchronize", || self.slice.as_slice())
    }

    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        call("cuEventSynchronize", || self.slice.as_mut_slice())
    }

    pub fn len(&self) -> usize {
        self.slice.len()
    }
}

/// One GPU: its context, one stream that orders every copy and kernel, and the pattern
/// kernels loaded into it.
pub struct CudaGpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    kernels: Kernels,
}

impl CudaGpu {
    /// Open GPU `ordinal` (one the inventory listed). Checks libcuda first: `CudaContext::new`
    /// would panic without it.
    pub fn open(ordinal: usize) -> Result<CudaGpu> {
        if !libcuda_present() {
            return Err(GpuError::NoDriver {
                kernel_driver: Path::new("/proc/driver/nvidia").exists(),
            });
        }
        let ctx = call("cuDevicePrimaryCtxRetain", || CudaContext::new(ordinal))?;
        let stream = call("cuStreamCreate", || ctx.new_stream())?;
        let kernels = Kernels::load(&ctx)?;
        Ok(CudaGpu {
            ctx,
            stream,
            kernels,
        })
    }

    /// `len` bytes of zeroed device memory.
    pub fn alloc(&self, len: usize) -> Result<CudaDevice> {
        let slice = call("cuMemAllocAsync", || {
            self.stream.alloc_zeros::<u8>(len.max(1))
        })?;
        self.sync()?;
        Ok(CudaDevice {
            slice: ManuallyDrop::new(slice),
            exportable: false,
        })
    }

    /// `len` bytes of zeroed device memory from plain `cuMemAlloc`: memory from the
    /// stream-ordered pool (what [`Gpu::alloc`] returns where pools exist) cannot be exported
    /// as a dmabuf.
    pub fn alloc_exportable(&self, len: usize) -> Result<CudaDevice> {
        let len = len.max(1);
        let slice = call("cuMemAlloc", || {
            self.ctx.bind_to_thread()?;
            // SAFETY: a fresh allocation of `len` bytes, zeroed before anyone reads it, and
            // owned from here on by the slice (freed in `DeviceBuffer::drop`).
            unsafe {
                let ptr = result::malloc_sync(len)?;
                result::memset_d8_sync(ptr, 0, len)?;
                Ok(self.stream.upgrade_device_ptr::<u8>(ptr, len))
            }
        })?;
        Ok(CudaDevice {
            slice: ManuallyDrop::new(slice),
            exportable: true,
        })
    }

    /// `len` bytes of zeroed pinned host memory.
    pub fn alloc_pinned(&self, len: usize) -> Result<CudaPinned> {
        // SAFETY: the memory is zeroed below before anyone can read it; flags 0 means neither
        // write-combined nor mapped.
        let slice = call("cuMemHostAlloc", || unsafe {
            self.ctx.alloc_pinned_with_flags::<u8>(len.max(1), 0)
        })?;
        let mut buf = CudaPinned { slice };
        buf.bytes_mut()?.fill(0);
        Ok(buf)
    }

    /// Copy the first `dst.len()` bytes of `src` to the host; returns once they are there.
    pub fn to_host(&self, src: &CudaDevice, dst: &mut [u8]) -> Result<()> {
        check_len(dst.len(), src.len())?;
        let view = src.slice.slice(..dst.len());
        call("cuMemcpyDtoH", || self.stream.memcpy_dtoh(&view, dst))?;
        self.sync()
    }

    /// Copy `src` into `dst` at `offset`; returns once the copy is done.
    pub fn to_device_at(&self, src: &[u8], dst: &mut CudaDevice, offset: usize) -> Result<()> {
        check_len(offset + src.len(), dst.len())?;
        let mut view = dst.slice.slice_mut(offset..offset + src.len());
        call("cuMemcpyHtoD", || self.stream.memcpy_htod(src, &mut view))?;
        self.sync()
    }

    /// Write the pattern for `seed` into the first `len` bytes, on the device.
    pub fn fill_pattern(&self, buf: &mut CudaDevice, len: usize, seed: u64) -> Result<()> {
        check_len(len, buf.len())?;
        self.kernels.fill(&self.stream, &mut buf.slice, len, seed)?;
        self.sync()
    }

    /// How many of the `len` bytes at `offset` (pattern bytes 0..len) differ from the pattern
    /// for `seed`, counted on the device.
    pub fn pattern_mismatches_at(
        &self,
        buf: &CudaDevice,
        offset: usize,
        len: usize,
        seed: u64,
    ) -> Result<u64> {
        check_len(offset + len, buf.len())?;
        let view = buf.slice.slice(offset..offset + len);
        self.kernels
            .count_mismatches(&self.stream, &view, len, seed)
    }

    /// The buffer's device address (for dmabuf export and as the RDMA iova).
    #[cfg(feature = "rdma")]
    pub(crate) fn device_address(&self, buf: &CudaDevice) -> u64 {
        use cudarc::driver::DevicePtr;
        let (ptr, _sync) = buf.slice.device_ptr(&self.stream);
        ptr
    }

    /// Export the whole allocation as a dmabuf (`cuMemGetHandleForAddressRange`).
    #[cfg(feature = "rdma")]
    pub(crate) fn export_dmabuf(&self, buf: &CudaDevice) -> Result<std::os::fd::OwnedFd> {
        use cudarc::driver::sys::CUmemRangeHandleType;
        use std::os::fd::FromRawFd;
        let dptr = self.device_address(buf);
        let size = buf.len();
        let fd = call("cuMemGetHandleForAddressRange", || {
            let mut fd: i32 = -1;
            // SAFETY: the driver writes one int (the new fd) through the pointer; the range is
            // a whole device allocation whose size is a multiple of the 2 MiB granule.
            unsafe {
                sys::cuMemGetHandleForAddressRange(
                    &mut fd as *mut i32 as *mut std::ffi::c_void,
                    dptr,
                    size,
                    CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    0,
                )
            }
            .result()?;
            Ok(fd)
        })?;
        // SAFETY: the driver just created this descriptor for us; nothing else owns it.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    pub fn sync(&self) -> Result<()> {
        call("cuStreamSynchronize", || self.stream.synchronize())
    }
}
