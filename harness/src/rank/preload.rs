//! Observers preloaded into a rank and everything it starts: the rank writes the libraries
//! into a fresh private folder (never a name in `$TMPDIR` another user could plant first; see
//! docs/trust.md) and execs itself with them in `LD_PRELOAD`. Same PID, same arguments; every
//! program an exec step starts inherits the preload and loads the libraries from that folder
//! at its own exec, so the folder lives until the rank ends ([`remove_written`]).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use anyhow::{Context, Result};

/// The folders this rank wrote observers into (colon-separated), removed when it ends.
const DIRS_ENV: &str = "WRINGER_OBSERVER_DIRS";

/// Write `libs` (file name, bytes) new into a fresh private folder; their paths.
pub fn write_private(libs: &[(&str, &[u8])]) -> Result<Vec<PathBuf>> {
    let dir = crate::hosts::private::fresh_dir("wringer-observer")?;
    let dirs = match std::env::var_os(DIRS_ENV) {
        Some(d) if !d.is_empty() => format!("{}:{}", d.to_string_lossy(), dir.display()),
        _ => dir.display().to_string(),
    };
    std::env::set_var(DIRS_ENV, dirs);
    libs.iter()
        .map(|(name, bytes)| {
            let path = dir.join(name);
            crate::hosts::private::write_new(&path, bytes, 0o500)?;
            Ok(path)
        })
        .collect()
}

/// Put `lib` first in `LD_PRELOAD`.
pub fn prepend(lib: &std::path::Path) {
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", lib.display()),
        _ => lib.display().to_string(),
    };
    std::env::set_var("LD_PRELOAD", preload);
}

/// Exec this rank again, as it was started, with the environment as it is now. Returns only
/// on failure.
pub fn reexec(why: &str) -> Result<()> {
    let exe = CString::new(std::fs::read_link("/proc/self/exe")?.as_os_str().as_bytes())?;
    let args: Vec<CString> = std::env::args_os()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: `exe` and every argument are NUL-terminated and outlive the call; argv ends
    // with a null pointer. execv returns only on failure.
    unsafe { libc::execv(exe.as_ptr(), argv.as_ptr()) };
    Err(std::io::Error::last_os_error()).with_context(|| format!("re-executing the rank {why}"))
}

/// Remove the folders this rank wrote observers into (its programs have ended by now).
pub fn remove_written() {
    let Some(dirs) = std::env::var_os(DIRS_ENV) else {
        return;
    };
    for dir in dirs.to_string_lossy().split(':').filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if crate::hosts::private::check_dir(&dir).is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
