//! Device buffers over an RC connection. The NIC reads and writes GPU memory directly when the
//! GPU exports it as a dmabuf and the NIC driver registers it (`ibv_reg_dmabuf_mr`); otherwise
//! the bytes are staged through pinned host memory that the NIC can register. Which path a
//! region took, and why, is part of its evidence ([`MemoryPath`]).

use std::fmt;
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::rdma::rc::{RcConnection, Region, RemoteRegion};

use super::{DeviceBuffer, Gpu, GpuError, PinnedBuffer, Result, Vendor};

/// How a region's device memory reaches the NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryPath {
    /// Registered directly: the NIC reads and writes GPU memory.
    Dmabuf,
    /// Copied through pinned host memory, for the reason given.
    Staged { reason: String },
}

impl MemoryPath {
    pub fn is_dmabuf(&self) -> bool {
        *self == MemoryPath::Dmabuf
    }
}

impl fmt::Display for MemoryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryPath::Dmabuf => f.write_str("dmabuf (GPU memory registered with the NIC)"),
            MemoryPath::Staged { reason } => {
                write!(f, "staged through pinned host memory ({reason})")
            }
        }
    }
}

/// dmabuf export works on whole pages; device allocations are rounded up to this.
const GRANULE: usize = 2 << 20;

/// A device buffer that one connection can write from and the peer can write into. Field order
/// is drop order: the registration goes before the memory it covers.
pub struct GpuRegion {
    region: Region,
    staging: Option<PinnedBuffer>,
    device: DeviceBuffer,
    path: MemoryPath,
}

impl GpuRegion {
    /// `len` bytes of device memory registered with `conn`: through dmabuf when the GPU and the
    /// NIC allow it, else through a pinned staging buffer.
    pub fn new(gpu: &Gpu, conn: &mut RcConnection, len: usize) -> Result<GpuRegion> {
        let device = gpu.alloc_exportable(len.div_ceil(GRANULE).max(1) * GRANULE)?;
        let reason = if gpu.info().dmabuf {
            match register_dmabuf(gpu, conn, &device, len) {
                Ok(region) => {
                    return Ok(GpuRegion {
                        region,
                        staging: None,
                        device,
                        path: MemoryPath::Dmabuf,
                    })
                }
                Err(why) => why,
            }
        } else {
            match gpu.vendor() {
                Vendor::Nvidia => {
                    "the GPU cannot export dmabufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0)"
                }
                Vendor::Amd => "the HIP runtime or the amdgpu driver cannot export dmabufs",
            }
            .into()
        };
        let mut staging = gpu.alloc_pinned(len)?;
        let ptr = staging.bytes_mut()?.as_mut_ptr();
        // SAFETY: the pinned buffer is owned by the returned value, never moves (page-locked
        // driver allocation), and is dropped after `region` (field order).
        let region = unsafe { conn.register_host(ptr, len) }?;
        Ok(GpuRegion {
            region,
            staging: Some(staging),
            device,
            path: MemoryPath::Staged { reason },
        })
    }

    pub fn path(&self) -> &MemoryPath {
        &self.path
    }

    /// What the peer needs to write here.
    pub fn remote(&self) -> RemoteRegion {
        self.region.remote()
    }

    pub fn device(&self) -> &DeviceBuffer {
        &self.device
    }

    pub fn device_mut(&mut self) -> &mut DeviceBuffer {
        &mut self.device
    }

    pub fn len(&self) -> usize {
        self.region.len()
    }

    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// WRITE the first `len` device bytes into `remote` at `remote_offset`, with `imm`
    /// (staged: copied to pinned memory first). Returns once the NIC has completed it.
    #[allow(clippy::too_many_arguments)]
    pub fn write_to(
        &mut self,
        gpu: &Gpu,
        conn: &mut RcConnection,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
        imm: u32,
        timeout: Duration,
    ) -> Result<()> {
        if let Some(staging) = &mut self.staging {
            let capacity = staging.len();
            let host = staging
                .bytes_mut()?
                .get_mut(..len)
                .ok_or(GpuError::TooLong { len, capacity })?;
            gpu.to_host(&self.device, host)?;
        }
        conn.write_region_imm(&self.region, 0, len, remote, remote_offset, imm, timeout)?;
        Ok(())
    }

    /// Bring `len` bytes the peer wrote at `offset` to the same offset of the device buffer
    /// (staged: copy them from pinned memory; dmabuf: they are already there).
    pub fn landed(&mut self, gpu: &Gpu, offset: usize, len: usize) -> Result<()> {
        if let Some(staging) = &self.staging {
            let capacity = staging.len();
            let host = staging
                .bytes()?
                .get(offset..offset.saturating_add(len))
                .ok_or(GpuError::TooLong {
                    len: offset.saturating_add(len),
                    capacity,
                })?;
            gpu.to_device_at(host, &mut self.device, offset)?;
        }
        Ok(())
    }
}

/// Export the buffer as a dmabuf and register it; the error says which half failed.
fn register_dmabuf(
    gpu: &Gpu,
    conn: &mut RcConnection,
    device: &DeviceBuffer,
    len: usize,
) -> std::result::Result<Region, String> {
    let dptr = gpu.device_address(device).map_err(|e| e.to_string())?;
    let fd = gpu
        .export_dmabuf(device)
        .map_err(|e| format!("dmabuf export failed: {e}"))?;
    // SAFETY: the dmabuf covers the whole allocation, which the GpuRegion owns and drops after
    // the region. The registration holds its own reference to the dmabuf, so `fd` can close.
    unsafe { conn.register_dmabuf(fd.as_raw_fd(), 0, len, dptr) }.map_err(|e| {
        format!("ibv_reg_dmabuf_mr failed, the NIC driver or kernel lacks dmabuf support: {e}")
    })
}
