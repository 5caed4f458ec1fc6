//! The AMD backend: HIP loaded at run time ([`runtime`]), kernels compiled by the host's hiprtc
//! for the GPU's architecture ([`rtc`]), the architecture read from KFD ([`kfd`]). One device
//! with one stream, as on CUDA: every copy and kernel is ordered on it.

pub mod kfd;
pub mod rtc;
pub mod runtime;

use std::ffi::{c_char, c_void, CStr};
use std::path::Path;

use runtime::{Function, Module, Runtime, Stream};

use crate::gpu::pattern::{grid, key, BLOCK};
use crate::gpu::{check_len, GpuError, GpuInfo, Inventory, Result, Vendor};

/// Every AMD GPU the runtime sees. No runtime is [`GpuError::NoHipRuntime`], a runtime without
/// devices [`GpuError::NoDevice`].
pub fn inventory() -> Result<Inventory> {
    let rt = runtime::get()?;
    let version = rt.version()?;
    let mut count = 0;
    // SAFETY: writes one int through a valid pointer.
    let status = unsafe { (rt.get_device_count)(&mut count) };
    let nodes = kfd::gpus(Path::new("/sys"));
    // Without a GPU in the kernel's topology, any failure to count is "no device" (runtimes
    // differ in which status they give without /dev/kfd).
    if status == runtime::NO_DEVICE
        || (status == runtime::SUCCESS && count <= 0)
        || (status != runtime::SUCCESS && nodes.is_empty())
    {
        let why = rt.check("hipGetDeviceCount", status).err();
        return Err(GpuError::NoDevice(format!(
            "the HIP {version} runtime ({}) reports no device{}",
            rt.soname,
            why.map(|e| format!(" ({e})")).unwrap_or_default()
        )));
    }
    rt.check("hipGetDeviceCount", status)?;
    let mut driver = 0;
    // SAFETY: writes one int through a valid pointer.
    rt.check("hipDriverGetVersion", unsafe {
        (rt.driver_get_version)(&mut driver)
    })?;
    let devices = (0..count as usize)
        .map(|i| describe(rt, i, &nodes))
        .collect::<Result<Vec<_>>>()?;
    Ok(Inventory {
        vendor: Vendor::Amd,
        driver_version: runtime::format_version(driver),
        runtime: format!("HIP {version} ({})", rt.soname),
        devices,
    })
}

fn describe(rt: &Runtime, ordinal: usize, nodes: &[kfd::KfdGpu]) -> Result<GpuInfo> {
    let dev = ordinal as i32;
    let mut name = [0 as c_char; 256];
    // SAFETY: HIP writes at most `len` bytes, NUL included, into the buffer.
    rt.check("hipDeviceGetName", unsafe {
        (rt.device_get_name)(name.as_mut_ptr(), name.len() as i32, dev)
    })?;
    let mut pci = [0 as c_char; 64];
    // SAFETY: as above.
    rt.check("hipDeviceGetPCIBusId", unsafe {
        (rt.device_get_pci_bus_id)(pci.as_mut_ptr(), pci.len() as i32, dev)
    })?;
    let mut memory = 0usize;
    // SAFETY: writes one size_t through a valid pointer.
    rt.check("hipDeviceTotalMem", unsafe {
        (rt.device_total_mem)(&mut memory, dev)
    })?;
    // SAFETY: both buffers were zeroed and HIP NUL-terminates what it writes.
    let (name, pci) = unsafe {
        (
            CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
            CStr::from_ptr(pci.as_ptr()).to_string_lossy().into_owned(),
        )
    };
    let node = kfd::by_pci(nodes, &pci).or_else(|| nodes.get(ordinal));
    Ok(GpuInfo {
        vendor: Vendor::Amd,
        ordinal,
        name,
        arch: node.map(|n| n.arch.clone()).unwrap_or_default(),
        memory_bytes: memory as u64,
        compute_capability: node.map_or((0, 0), |n| n.version),
        // Whether the export works is tried by the probe ([`dmabuf_export_works`]), not here:
        // every rank takes an inventory, and a trial allocation would touch every GPU.
        dmabuf: rt.mem_get_handle_for_address_range.is_some(),
    })
}

/// Can GPU `ordinal`'s memory be exported as a dmabuf? Tried on a 2 MiB allocation: the
/// runtime must have `hipMemGetHandleForAddressRange` (ROCm 5.6 and newer), and the kernel
/// driver must support the export too.
pub fn dmabuf_export_works(ordinal: usize) -> bool {
    let Ok(rt) = runtime::get() else {
        return false;
    };
    let Some(export) = rt.mem_get_handle_for_address_range else {
        return false;
    };
    // SAFETY: selects a device for this thread's later calls; an ordinal that does not exist
    // is an error status, not undefined behaviour.
    if unsafe { (rt.set_device)(ordinal as i32) } != runtime::SUCCESS {
        return false;
    }
    let mut ptr: *mut c_void = std::ptr::null_mut();
    let size = 2 << 20;
    // SAFETY: HIP writes the new allocation's address through the pointer.
    if unsafe { (rt.malloc)(&mut ptr, size) } != runtime::SUCCESS {
        return false;
    }
    let mut fd: i32 = -1;
    // SAFETY: the range is the whole allocation just made; HIP writes one int (the fd).
    let ok = unsafe {
        export(
            &mut fd as *mut i32 as *mut c_void,
            ptr,
            size,
            runtime::DMA_BUF_FD,
            0,
        )
    } == runtime::SUCCESS
        && fd >= 0;
    if fd >= 0 {
        // SAFETY: the descriptor was created for us by the export and is closed once.
        unsafe { libc::close(fd) };
    }
    // SAFETY: frees the allocation made above, used by nothing else.
    unsafe { (rt.free)(ptr) };
    ok
}

/// Device memory from `hipMalloc` (exportable as a dmabuf where the driver allows it).
pub(crate) struct HipDevice {
    ptr: *mut c_void,
    len: usize,
    rt: &'static Runtime,
}

// SAFETY: a device address is valid from any host thread of the process; HIP serialises the
// calls that use it.
unsafe impl Send for HipDevice {}
// SAFETY: as for Send: the address is shared, never the memory behind it without a HIP call.
unsafe impl Sync for HipDevice {}

impl HipDevice {
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(feature = "rdma")]
    pub(crate) fn address(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for HipDevice {
    fn drop(&mut self) {
        // SAFETY: allocated by hipMalloc in `HipGpu::alloc`, freed once, here; hipFree waits
        // for the device to finish using it.
        unsafe { (self.rt.free)(self.ptr) };
    }
}

/// Page-locked host memory from `hipHostMalloc` (coherent, not write-combined: the CPU reads
/// it to send it).
pub(crate) struct HipPinned {
    ptr: *mut u8,
    len: usize,
    rt: &'static Runtime,
}

// SAFETY: plain host memory owned by this value; `&`/`&mut` access follows Rust's rules.
unsafe impl Send for HipPinned {}
// SAFETY: as for Send: shared access is through `&`, which Rust's rules govern.
unsafe impl Sync for HipPinned {}

impl HipPinned {
    /// The bytes. Every copy into them was synchronised before the call that made it returned.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` bytes owned by this value for its lifetime, zeroed at
        // allocation, and no copy is in flight (every copy is synchronised).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for HipPinned {
    fn drop(&mut self) {
        // SAFETY: allocated by hipHostMalloc in `HipGpu::alloc_pinned`, freed once, here.
        unsafe { (self.rt.host_free)(self.ptr as *mut c_void) };
    }
}

/// One AMD GPU: its stream and the pattern kernels loaded for its architecture.
pub(crate) struct HipGpu {
    rt: &'static Runtime,
    device: i32,
    stream: Stream,
    module: Module,
    fill: Function,
    check: Function,
}

// SAFETY: the stream, module and function handles are process-wide HIP handles; every call
// selects the device first (`hipSetDevice` is per thread).
unsafe impl Send for HipGpu {}
// SAFETY: as for Send: the handles are shared read-only, and each call selects the device first.
unsafe impl Sync for HipGpu {}

impl HipGpu {
    /// Open GPU `info.ordinal`, loading the pattern kernels compiled for `info.arch` (from
    /// `kernel_cache` when an earlier rank compiled them).
    pub fn open(info: &GpuInfo, kernel_cache: Option<&Path>) -> Result<HipGpu> {
        let rt = runtime::get()?;
        if info.arch.is_empty() {
            return Err(GpuError::HipArchUnsupported {
                arch: "unknown".into(),
                why: format!(
                    "GPU {} has no KFD topology node (/sys/class/kfd), so its architecture is unknown",
                    info.ordinal
                ),
            });
        }
        let code = rtc::code_object(&info.arch, kernel_cache)?;
        let device = info.ordinal as i32;
        // SAFETY: selects an existing device (the inventory listed it) for this thread.
        rt.check("hipSetDevice", unsafe { (rt.set_device)(device) })?;
        let mut stream: Stream = std::ptr::null_mut();
        // SAFETY: HIP writes the new stream's handle through the pointer.
        rt.check("hipStreamCreate", unsafe {
            (rt.stream_create)(&mut stream)
        })?;
        let mut gpu = HipGpu {
            rt,
            device,
            stream,
            module: std::ptr::null_mut(),
            fill: std::ptr::null_mut(),
            check: std::ptr::null_mut(),
        };
        // SAFETY: `code` is a complete code object (ELF) that outlives the call; HIP copies it.
        rt.check("hipModuleLoadData", unsafe {
            (rt.module_load_data)(&mut gpu.module, code.as_ptr() as *const c_void)
        })?;
        for (name, slot) in [
            (c"wringer_fill", &mut gpu.fill),
            (c"wringer_check", &mut gpu.check),
        ] {
            // SAFETY: `module` is loaded; the name is NUL-terminated; HIP writes the handle.
            rt.check("hipModuleGetFunction", unsafe {
                (rt.module_get_function)(slot, gpu.module, name.as_ptr())
            })?;
        }
        Ok(gpu)
    }

    fn current(&self) -> Result<()> {
        // SAFETY: selects this GPU's device (valid since `open`) for the calling thread.
        self.rt
            .check("hipSetDevice", unsafe { (self.rt.set_device)(self.device) })
    }

    pub fn sync(&self) -> Result<()> {
        self.current()?;
        // SAFETY: `stream` is live until `drop`.
        self.rt.check("hipStreamSynchronize", unsafe {
            (self.rt.stream_synchronize)(self.stream)
        })
    }

    /// `len` bytes of zeroed device memory.
    pub fn alloc(&self, len: usize) -> Result<HipDevice> {
        self.current()?;
        let len = len.max(1);
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: HIP writes the new allocation's address through the pointer.
        let rc = unsafe { (self.rt.malloc)(&mut ptr, len) };
        self.rt.check("hipMalloc", rc)?;
        let buf = HipDevice {
            ptr,
            len,
            rt: self.rt,
        };
        // SAFETY: zeroes exactly the allocation just made (synchronous with the host).
        let rc = unsafe { (self.rt.memset)(ptr, 0, len) };
        self.rt.check("hipMemset", rc)?;
        Ok(buf)
    }

    /// `len` bytes of zeroed pinned host memory.
    pub fn alloc_pinned(&self, len: usize) -> Result<HipPinned> {
        self.current()?;
        let len = len.max(1);
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: HIP writes the new allocation's address through the pointer; flags 0 is
        // hipHostMallocDefault (portable, not write-combined).
        self.rt.check("hipHostMalloc", unsafe {
            (self.rt.host_malloc)(&mut ptr, len, 0)
        })?;
        let mut buf = HipPinned {
            ptr: ptr as *mut u8,
            len,
            rt: self.rt,
        };
        buf.bytes_mut().fill(0);
        Ok(buf)
    }

    /// Copy the first `dst.len()` bytes of `src` to the host; returns once they are there.
    pub fn to_host(&self, src: &HipDevice, dst: &mut [u8]) -> Result<()> {
        check_len(dst.len(), src.len)?;
        self.current()?;
        // SAFETY: `dst` is `dst.len()` writable host bytes and `src` holds at least as many
        // (checked); the sync below completes the copy before `dst` can be used.
        self.rt.check("hipMemcpyAsync(DtoH)", unsafe {
            (self.rt.memcpy_async)(
                dst.as_mut_ptr() as *mut c_void,
                src.ptr,
                dst.len(),
                runtime::DEVICE_TO_HOST,
                self.stream,
            )
        })?;
        self.sync()
    }

    /// Copy `src` into `dst` at `offset`; returns once the copy is done.
    pub fn to_device_at(&self, src: &[u8], dst: &mut HipDevice, offset: usize) -> Result<()> {
        check_len(offset + src.len(), dst.len)?;
        self.current()?;
        // SAFETY: the destination range lies inside `dst` (checked); `src` stays borrowed
        // until the sync below has completed the copy.
        self.rt.check("hipMemcpyAsync(HtoD)", unsafe {
            (self.rt.memcpy_async)(
                (dst.ptr as *mut u8).add(offset) as *mut c_void,
                src.as_ptr() as *const c_void,
                src.len(),
                runtime::HOST_TO_DEVICE,
                self.stream,
            )
        })?;
        self.sync()
    }

    /// Launch `f` over `len` bytes with `params`.
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list, and every address among them must
    /// point into live device memory covering what the kernel touches for `len`.
    unsafe fn launch(&self, f: Function, len: usize, params: &mut [*mut c_void]) -> Result<()> {
        self.current()?;
        // SAFETY: the caller's contract; no `extra` arguments.
        self.rt.check("hipModuleLaunchKernel", unsafe {
            (self.rt.module_launch_kernel)(
                f,
                grid(len),
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// Write the pattern for `seed` into the first `len` bytes, on the device.
    pub fn fill_pattern(&self, buf: &mut HipDevice, len: usize, seed: u64) -> Result<()> {
        check_len(len, buf.len)?;
        let (mut ptr, mut n, mut k) = (buf.ptr, len as u64, key(seed));
        let mut params = [
            &mut ptr as *mut *mut c_void as *mut c_void,
            &mut n as *mut u64 as *mut c_void,
            &mut k as *mut u64 as *mut c_void,
        ];
        // SAFETY: wringer_fill takes (out, n, key) as a pointer and two u64s; it writes only
        // [ptr, ptr + n), inside `buf` (checked).
        unsafe { self.launch(self.fill, len, &mut params) }?;
        self.sync()
    }

    /// How many of the `len` bytes at `offset` differ from the pattern for `seed`.
    pub fn pattern_mismatches_at(
        &self,
        buf: &HipDevice,
        offset: usize,
        len: usize,
        seed: u64,
    ) -> Result<u64> {
        check_len(offset + len, buf.len)?;
        let counter = self.alloc(4)?;
        // SAFETY: `offset` + `len` lies inside `buf` (checked).
        let mut ptr = unsafe { (buf.ptr as *mut u8).add(offset) } as *mut c_void;
        let (mut n, mut k, mut out) = (len as u64, key(seed), counter.ptr);
        let mut params = [
            &mut ptr as *mut *mut c_void as *mut c_void,
            &mut n as *mut u64 as *mut c_void,
            &mut k as *mut u64 as *mut c_void,
            &mut out as *mut *mut c_void as *mut c_void,
        ];
        // SAFETY: wringer_check takes (buf, n, key, mismatches); it reads [ptr, ptr + n)
        // inside `buf` and adds to the one zeroed u32 of `counter`, live until the copy below
        // has completed.
        unsafe { self.launch(self.check, len, &mut params) }?;
        let mut host = [0u8; 4];
        self.to_host(&counter, &mut host)?;
        Ok(u32::from_ne_bytes(host) as u64)
    }

    /// Export the whole allocation as a dmabuf (`hipMemGetHandleForAddressRange`).
    #[cfg(feature = "rdma")]
    pub(crate) fn export_dmabuf(&self, buf: &HipDevice) -> Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        let Some(export) = self.rt.mem_get_handle_for_address_range else {
            return Err(GpuError::Hip {
                call: "hipMemGetHandleForAddressRange",
                code: -1,
                error: format!("{} predates it (ROCm 5.6)", self.rt.soname),
            });
        };
        self.current()?;
        let mut fd: i32 = -1;
        // SAFETY: the range is a whole hipMalloc allocation; HIP writes one int (the fd).
        self.rt.check("hipMemGetHandleForAddressRange", unsafe {
            export(
                &mut fd as *mut i32 as *mut c_void,
                buf.ptr,
                buf.len,
                runtime::DMA_BUF_FD,
                0,
            )
        })?;
        // SAFETY: the runtime just created this descriptor for us; nothing else owns it.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for HipGpu {
    fn drop(&mut self) {
        let _ = self.sync();
        // SAFETY: the module and stream were created by `open` and are released once, here;
        // the sync above finished every launch that used them.
        unsafe {
            if !self.module.is_null() {
                (self.rt.module_unload)(self.module);
            }
            (self.rt.stream_destroy)(self.stream);
        }
    }
}
