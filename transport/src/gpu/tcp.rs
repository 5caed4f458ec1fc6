//! Device buffers over a TCP [`Connection`]: a socket cannot read device memory, so each
//! message is staged through pinned host memory (device -> pinned -> socket, and
//! socket -> pinned -> device). Pinned memory lets the copy engine move it at full speed
//! instead of the driver staging pageable memory in small pieces.

use std::time::Duration;

use crate::Connection;

use super::{DeviceBuffer, Gpu, GpuError, PinnedBuffer, Result};

/// The staging memory for one connection: one pinned buffer per direction, sized for the
/// largest message.
pub struct TcpStaging {
    send: PinnedBuffer,
    recv: PinnedBuffer,
}

impl TcpStaging {
    pub fn new(gpu: &Gpu, max_message: usize) -> Result<TcpStaging> {
        Ok(TcpStaging {
            send: gpu.alloc_pinned(max_message)?,
            recv: gpu.alloc_pinned(max_message)?,
        })
    }

    /// Send the first `len` bytes of `src` as one frame.
    pub fn send(
        &mut self,
        gpu: &Gpu,
        conn: &Connection,
        src: &DeviceBuffer,
        len: usize,
        timeout: Duration,
    ) -> Result<()> {
        let capacity = self.send.len();
        let host = self
            .send
            .bytes_mut()?
            .get_mut(..len)
            .ok_or(GpuError::TooLong { len, capacity })?;
        gpu.to_host(src, host)?;
        conn.send(host, timeout)?;
        Ok(())
    }

    /// Receive one frame into the start of `dst`; returns its length.
    pub fn recv(
        &mut self,
        gpu: &Gpu,
        conn: &Connection,
        dst: &mut DeviceBuffer,
        timeout: Duration,
    ) -> Result<usize> {
        let frame = conn.recv(timeout)?;
        let len = frame.payload.len();
        let capacity = self.recv.len().min(dst.len());
        if len > capacity {
            conn.recycle(frame.payload);
            return Err(GpuError::TooLong { len, capacity });
        }
        let host = &mut self.recv.bytes_mut()?[..len];
        host.copy_from_slice(&frame.payload);
        conn.recycle(frame.payload);
        gpu.to_device(host, dst)?;
        Ok(len)
    }
}
