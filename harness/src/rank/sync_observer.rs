//! The rank's side of the happens-before audit: a rank whose descriptors are audited preloads
//! the sync observer (`harness/sync-audit/wringer_sync.c`, built by `build.rs`) into itself and
//! so into every program it starts. Its markers land in the syscall trace (see
//! `model::sync_marker`).

use anyhow::{bail, Result};

/// Set once the observer is preloaded: the rank does not exec itself again.
const ENV: &str = "WRINGER_SYNC_OBSERVED";

/// Where the observer writes each process's module map (a prefix; see `wringer_sync.c`).
pub const MAPS_ENV: &str = "WRINGER_SYNC_MAPS";

#[cfg(sync_observer)]
const OBSERVER: Option<&[u8]> = Some(include_bytes!(concat!(
    env!("OUT_DIR"),
    "/libwringer-sync.so"
)));
#[cfg(not(sync_observer))]
const OBSERVER: Option<&[u8]> = None;

/// Whether this build carries the observer (a C compiler built it).
pub fn available() -> bool {
    OBSERVER.is_some()
}

/// Re-exec this rank with the sync observer preloaded. Returns (and does nothing) when that
/// is already so.
pub fn preload_self() -> Result<()> {
    if std::env::var_os(ENV).is_some() {
        return Ok(());
    }
    let Some(observer) = OBSERVER else {
        bail!("this wringer was built without the sync observer (no C compiler at build time)");
    };
    let paths = super::preload::write_private(&[("libwringer-sync.so", observer)])?;
    super::preload::prepend(&paths[0]);
    std::env::set_var(ENV, "1");
    super::preload::reexec("with the sync observer")
}
