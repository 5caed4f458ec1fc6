//! The pattern kernels compiled at run time by the host's hiprtc for the GPU's architecture,
//! and cached per architecture (a compile takes seconds; a cached code object loads at once).
//!
//! ROCm 5.2's hiprtc corrupts its heap and aborts the process when asked for an architecture
//! its compiler does not know (measured here with gfx940, gfx942 and gfx1100), so the
//! architecture is first checked against the ISAs the code-object manager (comgr, which
//! hiprtc compiles through) lists: an unknown one is [`GpuError::HipArchUnsupported`].

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

use crate::gpu::pattern::HIP_SOURCE;
use crate::gpu::{GpuError, Result};

/// hiprtc is its own library from ROCm 5.3 on; before that its symbols are in libamdhip64.
const HIPRTC_SONAMES: &[&str] = &[
    "libhiprtc.so.7",
    "libhiprtc.so.6",
    "libhiprtc.so.5",
    "libhiprtc.so",
    "/opt/rocm/lib/libhiprtc.so",
];
const COMGR_SONAMES: &[&str] = &[
    "libamd_comgr.so.3",
    "libamd_comgr.so.2",
    "libamd_comgr.so",
    "/opt/rocm/lib/libamd_comgr.so",
];

type Program = *mut std::ffi::c_void;
type Status = c_int;

struct Hiprtc {
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    code_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    code: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    _library: Library,
}

fn hiprtc() -> Result<&'static Hiprtc> {
    static RTC: OnceLock<std::result::Result<Hiprtc, String>> = OnceLock::new();
    RTC.get_or_init(|| {
        let runtime = super::runtime::get().map(|rt| rt.soname.as_str());
        let mut tried = Vec::new();
        for name in HIPRTC_SONAMES.iter().copied().chain(runtime.ok()) {
            // SAFETY: loading hiprtc (or libamdhip64, already loaded) runs only its own
            // initialisers.
            let lib = match unsafe { Library::new(name) } {
                Ok(lib) => lib,
                Err(e) => {
                    tried.push(format!("{name}: {e}"));
                    continue;
                }
            };
            // SAFETY (every `sym!`): each symbol gets the signature `hiprtc.h` declares for it
            // and stays valid while `_library`, owned by the same table, is loaded.
            macro_rules! sym {
                ($name:literal) => {
                    // SAFETY: see above (the signature is hiprtc.h's; `lib` outlives the symbol).
                    match unsafe { lib.get($name) } {
                        Ok(s) => *s,
                        Err(e) => {
                            tried.push(format!("{name}: {e}"));
                            continue;
                        }
                    }
                };
            }
            return Ok(Hiprtc {
                create: sym!(b"hiprtcCreateProgram\0"),
                compile: sym!(b"hiprtcCompileProgram\0"),
                code_size: sym!(b"hiprtcGetCodeSize\0"),
                code: sym!(b"hiprtcGetCode\0"),
                log_size: sym!(b"hiprtcGetProgramLogSize\0"),
                log: sym!(b"hiprtcGetProgramLog\0"),
                destroy: sym!(b"hiprtcDestroyProgram\0"),
                _library: lib,
            });
        }
        Err(format!(
            "no hiprtc could be loaded (tried {})",
            tried.join("; ")
        ))
    })
    .as_ref()
    .map_err(|why| GpuError::NoHipRuntime(why.clone()))
}

/// The architectures ("gfx90a", …) the host's comgr can compile for, in comgr's order (oldest
/// first), or why they cannot be listed.
pub fn known_architectures() -> std::result::Result<Vec<String>, String> {
    // comgr stays loaded for the process's lifetime: unloading it and letting HIP load it again
    // later runs LLVM's static initialisers twice, which aborts ("Option 'disassemble'
    // registered more than once", measured with ROCm 5.2).
    static KNOWN: OnceLock<std::result::Result<(Library, Vec<String>), String>> = OnceLock::new();
    KNOWN
        .get_or_init(|| {
            let mut tried = Vec::new();
            for name in COMGR_SONAMES {
                // SAFETY: comgr's initialisers only set up its own state.
                match unsafe { Library::new(*name) } {
                    Ok(lib) => {
                        return list_isas(&lib)
                            .map(|isas| (lib, isas))
                            .map_err(|e| format!("{name}: {e}"))
                    }
                    Err(e) => tried.push(format!("{name}: {e}")),
                }
            }
            Err(format!(
                "no comgr could be loaded (tried {})",
                tried.join("; ")
            ))
        })
        .as_ref()
        .map(|(_, isas)| isas.clone())
        .map_err(String::clone)
}

fn list_isas(lib: &Library) -> std::result::Result<Vec<String>, String> {
    type Count = unsafe extern "C" fn(*mut usize) -> c_int;
    type Name = unsafe extern "C" fn(usize, *mut *const c_char) -> c_int;
    // SAFETY: the signatures `amd_comgr.h` declares (stable since comgr 1.x); `lib` outlives
    // both calls.
    let (count, name): (Count, Name) = unsafe {
        (
            *lib.get(b"amd_comgr_get_isa_count\0")
                .map_err(|e| e.to_string())?,
            *lib.get(b"amd_comgr_get_isa_name\0")
                .map_err(|e| e.to_string())?,
        )
    };
    let mut n = 0usize;
    // SAFETY: writes one size_t through a valid pointer.
    if unsafe { count(&mut n) } != 0 {
        return Err("amd_comgr_get_isa_count failed".into());
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `i` < the count comgr gave; it writes a pointer to a static string.
        if unsafe { name(i, &mut p) } != 0 || p.is_null() {
            return Err(format!("amd_comgr_get_isa_name({i}) failed"));
        }
        // SAFETY: a static NUL-terminated string owned by comgr.
        let isa = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        // "amdgcn-amd-amdhsa--gfx90a" (features, when listed, follow a colon).
        if let Some(arch) = isa.rsplit("--").next() {
            out.push(arch.split(':').next().unwrap_or(arch).to_string());
        }
    }
    Ok(out)
}

/// The code object of the pattern kernels for `arch`: read from `cache` when an earlier run
/// compiled it, else compiled and written there.
pub fn code_object(arch: &str, cache: Option<&Path>) -> Result<Vec<u8>> {
    let file = cache.map(|dir| cache_file(dir, arch));
    if let Some(bytes) = file.as_ref().and_then(|f| std::fs::read(f).ok()) {
        if bytes.starts_with(b"\x7fELF") {
            return Ok(bytes);
        }
    }
    let code = compile(arch)?;
    if let (Some(dir), Some(f)) = (cache, &file) {
        // A cache that cannot be written costs a compile next time, nothing more; written
        // whole then renamed, so a concurrent rank never reads half a file.
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(&tmp, &code))
            .and_then(|_| std::fs::rename(&tmp, f))
            .is_err()
        {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(code)
}

/// One file per architecture and source text, so an edited kernel is never read stale.
pub fn cache_file(dir: &Path, arch: &str) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    HIP_SOURCE.hash(&mut h);
    dir.join(format!("wringer-pattern-{arch}-{:016x}.hsaco", h.finish()))
}

/// Compile the pattern kernels for `arch` ("gfx942"), refusing architectures the toolchain
/// does not list (see the module's note).
pub fn compile(arch: &str) -> Result<Vec<u8>> {
    let well_formed = arch.starts_with("gfx")
        && arch.len() > 3
        && arch[3..].bytes().all(|b| b.is_ascii_alphanumeric());
    if !well_formed {
        return Err(GpuError::HipArchUnsupported {
            arch: arch.into(),
            why: "not an AMD GPU architecture name (gfxNNN)".into(),
        });
    }
    match known_architectures() {
        Ok(known) if !known.iter().any(|k| k == arch) => {
            return Err(GpuError::HipArchUnsupported {
                arch: arch.into(),
                why: format!(
                    "this ROCm's compiler knows {} (a newer ROCm is needed)",
                    known.join(", ")
                ),
            })
        }
        _ => {}
    }
    let rtc = hiprtc()?;
    let src = CString::new(HIP_SOURCE).expect("the HIP source has no NUL byte");
    let option = CString::new(format!("--offload-arch={arch}")).expect("checked above");
    let options = [option.as_ptr()];
    let mut prog: Program = std::ptr::null_mut();
    let fail = |call: &'static str, status: Status, log: String| GpuError::HipCompile {
        arch: arch.into(),
        call,
        status,
        log,
    };
    // SAFETY: `src` and the name are NUL-terminated and outlive the call; no headers are
    // passed (count 0, null arrays).
    let status = unsafe {
        (rtc.create)(
            &mut prog,
            src.as_ptr(),
            c"wringer_pattern.hip".as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if status != 0 {
        return Err(fail("hiprtcCreateProgram", status, String::new()));
    }
    let program = ProgramGuard { rtc, prog };
    // SAFETY: `prog` is a live program; `options` holds one NUL-terminated string that
    // outlives the call.
    let status = unsafe { (rtc.compile)(program.prog, 1, options.as_ptr()) };
    if status != 0 {
        return Err(fail("hiprtcCompileProgram", status, program.log()));
    }
    let mut size = 0usize;
    // SAFETY: writes one size_t for a compiled program.
    let status = unsafe { (rtc.code_size)(program.prog, &mut size) };
    if status != 0 || size == 0 {
        return Err(fail("hiprtcGetCodeSize", status, program.log()));
    }
    let mut code = vec![0u8; size];
    // SAFETY: `code` has the `size` bytes hiprtc said the code object takes.
    let status = unsafe { (rtc.code)(program.prog, code.as_mut_ptr() as *mut c_char) };
    if status != 0 {
        return Err(fail("hiprtcGetCode", status, program.log()));
    }
    Ok(code)
}

/// Destroys the program on every path out of [`compile`].
struct ProgramGuard {
    rtc: &'static Hiprtc,
    prog: Program,
}

impl ProgramGuard {
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: writes one size_t for a live program.
        if unsafe { (self.rtc.log_size)(self.prog, &mut size) } != 0 || size == 0 {
            return String::new();
        }
        let mut log = vec![0u8; size];
        // SAFETY: `log` has the `size` bytes hiprtc asked for, NUL included.
        if unsafe { (self.rtc.log)(self.prog, log.as_mut_ptr() as *mut c_char) } != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .to_string()
    }
}

impl Drop for ProgramGuard {
    fn drop(&mut self) {
        // SAFETY: the program was created by `compile` and is destroyed once, here.
        unsafe { (self.rtc.destroy)(&mut self.prog) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_architectures_never_reach_the_compiler() {
        for arch in ["sm_90", "gfx", "gfx9-0a", "gfx90a --save-temps", ""] {
            match compile(arch) {
                Err(GpuError::HipArchUnsupported { .. }) => {}
                other => panic!("{arch:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_cache_file_names_the_architecture_and_the_source() {
        let f = cache_file(Path::new("/run"), "gfx942");
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("wringer-pattern-gfx942-"), "{name}");
        assert_ne!(f, cache_file(Path::new("/run"), "gfx90a"));
    }
}
