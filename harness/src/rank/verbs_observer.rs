//! The rank's side of the verbs audit: a rank asked to be observed writes the embedded verbs
//! observer (`harness/verbs-audit/wringer_verbs.c`, built by `build.rs`) out on its own host and
//! execs itself with it preloaded. Same PID, same arguments; every program an exec step starts
//! inherits the preload, so other people's programs are observed too. Each process writes
//! `PREFIX.<pid>.verbs`.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};

/// The environment variable naming the trace prefix (read by the observer).
pub const TRACE_ENV: &str = "WRINGER_VERBS_TRACE";

/// The environment variable naming the observer's lookup scope (see `verbs-audit/scope.c`).
const SCOPE_ENV: &str = "WRINGER_VERBS_SCOPE";

/// The observer and its lookup scope.
#[cfg(verbs_observer)]
const OBSERVER: Option<(&[u8], &[u8])> = Some((
    include_bytes!(concat!(env!("OUT_DIR"), "/libwringer-verbs.so")),
    include_bytes!(concat!(env!("OUT_DIR"), "/libwringer-verbs-scope.so")),
));
#[cfg(not(verbs_observer))]
const OBSERVER: Option<(&[u8], &[u8])> = None;

/// Whether this build carries the observer (it needs libibverbs' headers to build).
pub fn available() -> bool {
    OBSERVER.is_some()
}

/// Re-exec this rank with the observer preloaded, tracing to `prefix`. Returns (and does
/// nothing) when that is already so.
pub fn preload_self(prefix: &str) -> Result<()> {
    if std::env::var(TRACE_ENV).ok().as_deref() == Some(prefix) {
        return Ok(());
    }
    let Some((observer, scope)) = OBSERVER else {
        bail!("this wringer was built without the verbs observer (install libibverbs-dev and librdmacm-dev, then rebuild)");
    };
    let lib = write_out(observer, "wringer-verbs")?;
    std::env::set_var(SCOPE_ENV, write_out(scope, "wringer-verbs-scope")?);
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", lib.display()),
        _ => lib.display().to_string(),
    };
    std::env::set_var("LD_PRELOAD", preload);
    std::env::set_var(TRACE_ENV, prefix);
    let exe = CString::new(std::fs::read_link("/proc/self/exe")?.as_os_str().as_bytes())?;
    let args: Vec<CString> = std::env::args_os()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: `exe` and every argument are NUL-terminated and outlive the call; argv ends
    // with a null pointer. execv returns only on failure.
    unsafe { libc::execv(exe.as_ptr(), argv.as_ptr()) };
    Err(std::io::Error::last_os_error()).context("re-executing the rank with the verbs observer")
}

/// The observer, written once per content on this host (named by its hash, renamed into
/// place, so concurrent ranks never see half a file).
fn write_out(bytes: &[u8], name: &str) -> Result<PathBuf> {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let path = std::env::temp_dir().join(format!("{name}-{hash:016x}.so"));
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
        return Ok(path);
    }
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("placing {}", path.display()))?;
    Ok(path)
}

/// Mark a point in this process's verbs trace (a step's start and end bound its leak check).
/// Does nothing when the observer is not loaded.
pub fn mark(what: &str) {
    type Mark = unsafe extern "C" fn(*const libc::c_char);
    static MARK: OnceLock<Option<Mark>> = OnceLock::new();
    let mark = MARK.get_or_init(|| {
        let name: &CStr = c"wringer_verbs_mark";
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks a symbol up.
        let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        // SAFETY: the observer defines `wringer_verbs_mark` as `void (const char *)`.
        (!sym.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, Mark>(sym) })
    });
    if let (Some(f), Ok(text)) = (mark, CString::new(what)) {
        // SAFETY: a NUL-terminated string that outlives the call; the observer copies it.
        unsafe { f(text.as_ptr()) };
    }
}
