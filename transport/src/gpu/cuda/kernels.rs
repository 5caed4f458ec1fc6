//! The pattern kernels on CUDA: the PTX of [`super::super::pattern`], loaded by the driver (no
//! NVRTC needed).

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{result, CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::gpu::pattern::{grid, key, BLOCK, PTX};
use crate::gpu::{call, Result};

/// The module and its two functions, loaded into one context.
pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    fill: sys::CUfunction,
    check: sys::CUfunction,
}

// SAFETY: module and function handles are plain driver handles, valid in any thread once the
// owning context is current; every use below binds the context first.
unsafe impl Send for Kernels {}
// SAFETY: as for Send: the handles are shared read-only, and each use binds the context first.
unsafe impl Sync for Kernels {}

impl Kernels {
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        let src = CString::new(PTX).expect("the PTX text has no NUL byte");
        call("cuModuleLoadData", || {
            ctx.bind_to_thread()?;
            // SAFETY: `src` is a NUL-terminated PTX image that lives for the call; the names
            // are entries of that module.
            unsafe {
                let module = result::module::load_data(src.as_ptr() as *const c_void)?;
                let fill =
                    result::module::get_function(module, CString::new("wringer_fill").unwrap())?;
                let check =
                    result::module::get_function(module, CString::new("wringer_check").unwrap())?;
                Ok(Kernels {
                    ctx: Arc::clone(ctx),
                    module,
                    fill,
                    check,
                })
            }
        })
    }

    /// Launch `f` over `len` bytes with `params` (pointers to its u64 parameters).
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list, and every address among them must
    /// point into live device memory covering what the kernel touches for `len`.
    unsafe fn launch(
        &self,
        f: sys::CUfunction,
        stream: &CudaStream,
        len: usize,
        params: &mut [*mut c_void],
    ) -> Result<(), cudarc::driver::DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller's contract.
        unsafe {
            result::launch_kernel(
                f,
                (grid(len), 1, 1),
                (BLOCK, 1, 1),
                0,
                stream.cu_stream(),
                params,
            )
        }
    }

    pub(crate) fn fill(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut CudaSlice<u8>,
        len: usize,
        seed: u64,
    ) -> Result<()> {
        call("cuLaunchKernel(wringer_fill)", || {
            let (mut ptr, _written) = buf.device_ptr_mut(stream);
            let (mut n, mut k) = (len as u64, key(seed));
            let mut params = [
                &mut ptr as *mut u64 as *mut c_void,
                &mut n as *mut u64 as *mut c_void,
                &mut k as *mut u64 as *mut c_void,
            ];
            // SAFETY: wringer_fill takes (out, n, key), three u64s; it writes only
            // [ptr, ptr + n), inside `buf` (the caller checked len <= buf.len()). `_written`
            // records the write for cudarc's stream tracking.
            unsafe { self.launch(self.fill, stream, len, &mut params) }
        })
    }

    pub(crate) fn count_mismatches(
        &self,
        stream: &Arc<CudaStream>,
        buf: &impl DevicePtr<u8>,
        len: usize,
        seed: u64,
    ) -> Result<u64> {
        let mut counter = call("cuMemAlloc", || stream.alloc_zeros::<u32>(1))?;
        call("cuLaunchKernel(wringer_check)", || {
            let (mut ptr, _read) = buf.device_ptr(stream);
            let (mut out, _counted) = counter.device_ptr_mut(stream);
            let (mut n, mut k) = (len as u64, key(seed));
            let mut params = [
                &mut ptr as *mut u64 as *mut c_void,
                &mut n as *mut u64 as *mut c_void,
                &mut k as *mut u64 as *mut c_void,
                &mut out as *mut u64 as *mut c_void,
            ];
            // SAFETY: wringer_check takes (buf, n, key, mismatches), four u64s; it reads
            // [ptr, ptr + n) inside `buf` and adds to the one u32 at `out`, a live allocation
            // of this stream.
            unsafe { self.launch(self.check, stream, len, &mut params) }
        })?;
        let mut host = [0u32; 1];
        call("cuMemcpyDtoH", || stream.memcpy_dtoh(&counter, &mut host))?;
        call("cuStreamSynchronize", || stream.synchronize())?;
        Ok(host[0] as u64)
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        let _ = call("cuModuleUnload", || {
            self.ctx.bind_to_thread()?;
            // SAFETY: the module was loaded by `load` and is unloaded once, here; no launch
            // can follow because `self` is going away.
            unsafe { result::module::unload(self.module) }
        });
    }
}
