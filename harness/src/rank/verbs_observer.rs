//! The rank's side of the verbs audit: a rank asked to be observed writes the embedded verbs
//! observer (`harness/verbs-audit/wringer_verbs.c`, built by `build.rs`) out on its own host and
//! execs itself with it preloaded (see `preload`). Same PID, same arguments; every program an exec step starts
//! inherits the preload, so other people's programs are observed too. Each process writes
//! `PREFIX.<pid>.verbs`.

use std::ffi::{CStr, CString};
use std::sync::OnceLock;

use anyhow::{bail, Result};

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
    let paths = super::preload::write_private(&[
        ("libwringer-verbs.so", observer),
        ("libwringer-verbs-scope.so", scope),
    ])?;
    std::env::set_var(SCOPE_ENV, &paths[1]);
    super::preload::prepend(&paths[0]);
    std::env::set_var(TRACE_ENV, prefix);
    super::preload::reexec("with the verbs observer")
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
