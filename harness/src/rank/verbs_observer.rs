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
    let (lib, scope) = write_out(observer, scope)?;
    std::env::set_var(SCOPE_ENV, scope);
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

/// Where this process wrote the observer: a fresh private folder (`mkdtemp`, 0700), so no file
/// another user placed in `$TMPDIR` is ever preloaded. Programs the rank starts load the
/// observer from it at their exec, so it lives as long as the rank; [`remove_written`] removes
/// it when the rank is done.
pub const DIR_ENV: &str = "WRINGER_VERBS_DIR";

/// The observer and its scope written new (`O_EXCL|O_NOFOLLOW`) into a fresh private folder.
fn write_out(observer: &[u8], scope: &[u8]) -> Result<(PathBuf, PathBuf)> {
    let dir = crate::hosts::private::fresh_dir("wringer-verbs")?;
    std::env::set_var(DIR_ENV, &dir);
    let lib = dir.join("libwringer-verbs.so");
    let scope_lib = dir.join("libwringer-verbs-scope.so");
    crate::hosts::private::write_new(&lib, observer, 0o500)?;
    crate::hosts::private::write_new(&scope_lib, scope, 0o500)?;
    Ok((lib, scope_lib))
}

/// Remove the folder this rank wrote the observer into (its programs have ended by now).
pub fn remove_written() {
    if let Some(dir) = std::env::var_os(DIR_ENV) {
        let dir = PathBuf::from(dir);
        if crate::hosts::private::check_dir(&dir).is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
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
