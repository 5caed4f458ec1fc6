//! Perturbations without a tracer: a rank whose scenario perturbs calls preloads the
//! perturbation observer (`harness/perturb/wringer_perturb.c`, built by `build.rs`) into itself
//! and so into every program it starts. The observer delays the chosen calls in libc's wrappers,
//! counted per thread as strace's `--inject` counts them; no thread stops at any other call.

use anyhow::{bail, Result};

/// The rules (see the observer's source for their form).
pub const RULES_ENV: &str = "WRINGER_PERTURB";

/// Where each observed process writes which calls it delayed (`PREFIX.<pid>`).
pub const LOG_ENV: &str = "WRINGER_PERTURB_LOG";

/// Set once the observer is preloaded: the rank does not exec itself again.
const ENV: &str = "WRINGER_PERTURB_OBSERVED";

/// The syscalls the observer can delay, through the libc wrappers that make them.
pub const SYSCALLS: &[&str] = &[
    "poll",
    "ppoll",
    "accept",
    "accept4",
    "connect",
    "recvfrom",
    "recvmsg",
    "sendto",
    "sendmsg",
    "read",
    "write",
    "readv",
    "writev",
    "close",
    "shutdown",
    "epoll_wait",
    "epoll_pwait",
];

#[cfg(perturb_observer)]
const OBSERVER: Option<&[u8]> = Some(include_bytes!(concat!(
    env!("OUT_DIR"),
    "/libwringer-perturb.so"
)));
#[cfg(not(perturb_observer))]
const OBSERVER: Option<&[u8]> = None;

/// Whether this build carries the observer (a C compiler built it).
pub fn available() -> bool {
    OBSERVER.is_some()
}

/// Re-exec this rank with the observer preloaded, delaying by `rules` and writing what it
/// delayed under `log`. Returns (and does nothing) when that is already so.
pub fn preload_self(rules: &str, log: Option<&str>) -> Result<()> {
    if std::env::var_os(ENV).is_some() {
        return Ok(());
    }
    let Some(observer) = OBSERVER else {
        bail!("this wringer was built without the perturbation observer (no C compiler at build time)");
    };
    let paths = super::preload::write_private(&[("libwringer-perturb.so", observer)])?;
    super::preload::prepend(&paths[0]);
    std::env::set_var(RULES_ENV, rules);
    if let Some(log) = log {
        std::env::set_var(LOG_ENV, log);
    }
    std::env::set_var(ENV, "1");
    super::preload::reexec("with the perturbation observer")
}

/// What the processes of one rank wrote at exit, one line per rule and process: `rule 0 poll
/// delayed 12 4711:3 4711:5 …` (thread:call of the first ones).
pub fn read_logs(prefix: &std::path::Path) -> Vec<(u32, String)> {
    let (Some(dir), Some(stem)) = (prefix.parent(), prefix.file_name()) else {
        return vec![];
    };
    let stem = format!("{}.", stem.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut out = vec![];
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name.strip_prefix(&stem).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(text) = std::fs::read_to_string(e.path()) {
            out.extend(text.lines().map(|l| (pid, l.to_string())));
        }
    }
    out.sort();
    out
}
