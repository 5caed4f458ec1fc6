//! The HIP runtime, loaded at run time: the few symbols wringer calls, resolved from whichever
//! `libamdhip64` the host has (ROCm 6.x on users' MI300X hosts, Debian's ROCm 5.2 here) into a
//! table. Nothing links against HIP, so a build runs on any host and a missing runtime is a
//! typed error, not a loader failure.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use libloading::Library;

use crate::gpu::{GpuError, Result};

/// The sonames tried, newest first: ROCm 7 and 6, ROCm 5, an unversioned development link, and
/// ROCm's own prefix when it is not on the loader's path.
pub const SONAMES: &[&str] = &[
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
    "/opt/rocm/lib/libamdhip64.so",
];

pub(crate) type HipError = c_int;
pub(crate) type Stream = *mut c_void;
pub(crate) type Module = *mut c_void;
pub(crate) type Function = *mut c_void;

pub(crate) const SUCCESS: HipError = 0;
/// `hipErrorNoDevice`.
pub(crate) const NO_DEVICE: HipError = 100;
/// `hipMemcpyKind`.
pub(crate) const HOST_TO_DEVICE: c_int = 1;
pub(crate) const DEVICE_TO_HOST: c_int = 2;
/// `hipMemRangeHandleTypeDmaBufFd`.
pub(crate) const DMA_BUF_FD: c_int = 1;

/// The resolved functions. Each field's type is the C signature from `hip_runtime_api.h`,
/// unchanged from ROCm 5.0 to 6.x for these calls.
pub(crate) struct Runtime {
    pub soname: String,
    pub get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub set_device: unsafe extern "C" fn(c_int) -> HipError,
    pub device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    pub device_get_pci_bus_id: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    pub device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> HipError,
    pub driver_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub runtime_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub get_error_string: unsafe extern "C" fn(HipError) -> *const c_char,
    pub malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    pub free: unsafe extern "C" fn(*mut c_void) -> HipError,
    pub host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError,
    pub host_free: unsafe extern "C" fn(*mut c_void) -> HipError,
    pub memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, Stream) -> HipError,
    pub memset: unsafe extern "C" fn(*mut c_void, c_int, usize) -> HipError,
    pub stream_create: unsafe extern "C" fn(*mut Stream) -> HipError,
    pub stream_synchronize: unsafe extern "C" fn(Stream) -> HipError,
    pub stream_destroy: unsafe extern "C" fn(Stream) -> HipError,
    pub module_load_data: unsafe extern "C" fn(*mut Module, *const c_void) -> HipError,
    pub module_get_function: unsafe extern "C" fn(*mut Function, Module, *const c_char) -> HipError,
    #[allow(clippy::type_complexity)]
    pub module_launch_kernel: unsafe extern "C" fn(
        Function,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Stream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    pub module_unload: unsafe extern "C" fn(Module) -> HipError,
    /// ROCm 5.6 and newer only: exports device memory as a dmabuf.
    pub mem_get_handle_for_address_range:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, u64) -> HipError>,
    /// Kept open for as long as the table lives (the process's lifetime once cached).
    _library: Library,
}

/// The runtime this process uses, loaded once: `WRINGER_HIP_LIBRARY` (a path to
/// libamdhip64, for a ROCm installed where the loader does not look) or the first of
/// [`SONAMES`].
pub(crate) fn get() -> Result<&'static Runtime> {
    static RUNTIME: OnceLock<Result<Runtime>> = OnceLock::new();
    let loaded = RUNTIME.get_or_init(|| match std::env::var("WRINGER_HIP_LIBRARY") {
        Ok(path) => regular_file(&path).and_then(|()| Runtime::load(&[path.as_str()])),
        Err(_) => Runtime::load(SONAMES),
    });
    match loaded {
        Ok(rt) => Ok(rt),
        Err(GpuError::NoHipRuntime(why)) => Err(GpuError::NoHipRuntime(why.clone())),
        Err(e) => Err(GpuError::NoHipRuntime(e.to_string())),
    }
}

/// `WRINGER_HIP_LIBRARY` must name a regular file: the loader's open of a FIFO blocks for
/// ever (and a device may never end), which would hang `probe`, `list` and every run.
fn regular_file(path: &str) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) => Err(GpuError::NoHipRuntime(format!(
            "WRINGER_HIP_LIBRARY={path} is not a regular file ({}): name libamdhip64.so itself",
            if std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()) {
                "a FIFO"
            } else if m.is_dir() {
                "a folder"
            } else {
                "a device or socket"
            }
        ))),
        Err(e) => Err(GpuError::NoHipRuntime(format!(
            "WRINGER_HIP_LIBRARY={path}: {e}"
        ))),
    }
}

impl Runtime {
    /// Load the first of `sonames` that opens and has every required symbol; the error names
    /// each one tried and why it failed.
    pub(crate) fn load(sonames: &[&str]) -> Result<Runtime> {
        let mut tried = Vec::new();
        for name in sonames {
            // SAFETY: loading libamdhip64 runs its initialisers, which only set up HIP's own
            // state (no device is touched until a call is made).
            match unsafe { Library::new(*name) } {
                Ok(lib) => match Runtime::resolve(lib, name) {
                    Ok(rt) => return Ok(rt),
                    Err(e) => tried.push(format!("{name}: {e}")),
                },
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(GpuError::NoHipRuntime(format!(
            "no HIP runtime could be loaded (tried {})",
            tried.join("; ")
        )))
    }

    fn resolve(library: Library, soname: &str) -> std::result::Result<Runtime, String> {
        // SAFETY (every `sym!` below): each symbol is looked up by its exported C name and
        // given the signature that `hip_runtime_api.h` declares for it; the function pointer
        // stays valid while `library` is loaded, and the table owns `library`.
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: see above (hip_runtime_api.h's signature; the table owns `library`).
                *unsafe { library.get($name) }.map_err(|e| {
                    format!(
                        "{}: {e}",
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    )
                })?
            };
        }
        Ok(Runtime {
            soname: soname.to_string(),
            get_device_count: sym!(b"hipGetDeviceCount\0"),
            set_device: sym!(b"hipSetDevice\0"),
            device_get_name: sym!(b"hipDeviceGetName\0"),
            device_get_pci_bus_id: sym!(b"hipDeviceGetPCIBusId\0"),
            device_total_mem: sym!(b"hipDeviceTotalMem\0"),
            driver_get_version: sym!(b"hipDriverGetVersion\0"),
            runtime_get_version: sym!(b"hipRuntimeGetVersion\0"),
            get_error_string: sym!(b"hipGetErrorString\0"),
            malloc: sym!(b"hipMalloc\0"),
            free: sym!(b"hipFree\0"),
            host_malloc: sym!(b"hipHostMalloc\0"),
            host_free: sym!(b"hipHostFree\0"),
            memcpy_async: sym!(b"hipMemcpyAsync\0"),
            memset: sym!(b"hipMemset\0"),
            stream_create: sym!(b"hipStreamCreate\0"),
            stream_synchronize: sym!(b"hipStreamSynchronize\0"),
            stream_destroy: sym!(b"hipStreamDestroy\0"),
            module_load_data: sym!(b"hipModuleLoadData\0"),
            module_get_function: sym!(b"hipModuleGetFunction\0"),
            module_launch_kernel: sym!(b"hipModuleLaunchKernel\0"),
            module_unload: sym!(b"hipModuleUnload\0"),
            // SAFETY: as above; absent before ROCm 5.6, which is not an error.
            mem_get_handle_for_address_range: unsafe {
                library.get(b"hipMemGetHandleForAddressRange\0")
            }
            .ok()
            .map(|s| *s),
            _library: library,
        })
    }

    /// Turn a HIP status into a result, naming the call.
    pub(crate) fn check(&self, call: &'static str, status: HipError) -> Result<()> {
        if status == SUCCESS {
            return Ok(());
        }
        // SAFETY: hipGetErrorString returns a pointer to a static NUL-terminated string (or
        // NULL, handled) for any status value.
        let text = unsafe {
            let p = (self.get_error_string)(status);
            if p.is_null() {
                "unknown error".to_string()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(GpuError::Hip {
            call,
            code: status,
            error: text,
        })
    }

    /// "6.2.41133" from HIP's packed version number (major * 10^7 + minor * 10^5 + patch).
    pub(crate) fn version(&self) -> Result<String> {
        let mut v = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("hipRuntimeGetVersion", unsafe {
            (self.runtime_get_version)(&mut v)
        })?;
        Ok(format_version(v))
    }
}

pub(crate) fn format_version(v: c_int) -> String {
    format!("{}.{}.{}", v / 10_000_000, v / 100_000 % 100, v % 100_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_without_the_hip_symbols_is_not_a_runtime() {
        // libc loads but has none of HIP's functions: the reason names the missing symbol.
        let err = match Runtime::load(&["libc.so.6"]) {
            Ok(_) => panic!("libc passed for a HIP runtime"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("libc.so.6") && err.contains("hipGetDeviceCount"),
            "{err}"
        );
    }

    #[test]
    fn versions_unpack_as_hip_packs_them() {
        // Debian's ROCm 5.2.3 reports 50221153; ROCm 6.2 reports 60241133.
        assert_eq!(format_version(50_221_153), "5.2.21153");
        assert_eq!(format_version(60_241_133), "6.2.41133");
    }

    #[test]
    fn a_missing_runtime_is_no_hip_runtime_naming_every_soname_tried() {
        let err = match Runtime::load(&["libamdhip64-absent.so.9", "/nonexistent/libamdhip64.so"]) {
            Ok(_) => panic!("a library that does not exist loaded"),
            Err(e) => e,
        };
        assert!(err.is_absent(), "{err:?}");
        let GpuError::NoHipRuntime(why) = err else {
            panic!("{err:?}");
        };
        assert!(why.contains("libamdhip64-absent.so.9"), "{why}");
        assert!(why.contains("/nonexistent/libamdhip64.so"), "{why}");
    }

    #[test]
    fn a_fifo_named_as_the_library_is_refused_without_opening_it() {
        let dir = std::env::temp_dir().join(format!("wringer-hip-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("libamdhip64.so");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening the FIFO would block for ever: the check must answer without it.
        let err = regular_file(fifo.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("a FIFO"), "{err}");
        assert!(regular_file(dir.to_str().unwrap()).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
