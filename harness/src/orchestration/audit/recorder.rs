//! How a rank runs under the syscall recorder: strace's command line (its trace filter and
//! `--inject` perturbations) or `wringer trace-syscalls` (eBPF).

use std::path::Path;

use super::calls::{MAKES_ONE_FD, MAKES_TWO_FDS};
use crate::model::scenario::{AuditBackend, AuditCheck, Perturb};

/// The syscalls the audit needs to see (strace's `-e trace=`): sockets, threads and processes,
/// every call that makes a descriptor, and the calls that use or close one. Not mmap, stat and
/// the like, which a program's start-up makes by the thousand (under TCG each stop costs a
/// millisecond).
const TRACED: &str = "%network,%process,read,readv,pread64,preadv,preadv2,write,writev,\
pwrite64,pwritev,pwritev2,close,fcntl,ioctl,epoll_ctl,epoll_wait,epoll_pwait,poll,ppoll,\
pselect6,sendfile,splice,tee,copy_file_range,prctl";

/// Traced where the architecture and strace know them (`?`): `select` is not on arm64,
/// `close_range` and `epoll_pwait2` are newer than some strace releases.
const TRACED_IF_KNOWN: &[&str] = &["select", "close_range", "epoll_pwait2"];

/// strace's `-e trace=` list. A `?` before a name lets strace skip a syscall this
/// architecture lacks (`open`, `pipe` and `epoll_create` are not on arm64).
pub(super) fn trace_filter() -> String {
    let mut list = TRACED.to_string();
    for name in MAKES_ONE_FD
        .iter()
        .chain(MAKES_TWO_FDS)
        .chain(TRACED_IF_KNOWN)
    {
        list.push_str(",?");
        list.push_str(name);
    }
    list
}

/// The strace command line that runs a rank under the audit, writing its trace to `out`.
/// Perturbations become `--inject` delays (their syscalls are traced too); a probability
/// becomes every n-th call from an offset drawn from `seed`, so a run replays from its seed.
pub fn strace_command(
    checks: &[AuditCheck],
    perturb: &[Perturb],
    seed: u64,
    out: &Path,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "strace",
        "-f",
        "-q",
        "-ttt",
        "-s",
        "96",
        "--seccomp-bpf",
        "-e",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut traced = trace_filter();
    if checks.contains(&AuditCheck::UnboundedWaits) {
        traced.push_str(",futex");
    }
    for p in perturb {
        traced.push(',');
        traced.push_str(&p.syscall);
    }
    args.push(format!("trace={traced}"));
    for (i, p) in perturb.iter().enumerate() {
        args.push(format!(
            "--inject={}",
            inject_expr(&p.exact(seed.wrapping_add(i as u64)))
        ));
    }
    args.extend(["-o".into(), path_word(out), "--".into()]);
    args
}

/// A path as a word for a tool that reads some names as commands or options: strace runs an
/// `-o` name starting with `!` or `|` through `sh -c`, and any tool reads `-x` as an option. An
/// absolute path (or, failing that, `./`-prefixed) is never either.
pub fn path_word(p: &Path) -> String {
    match std::path::absolute(p) {
        Ok(a) => a.display().to_string(),
        Err(_) => Path::new(".").join(p).display().to_string(),
    }
}

/// The words that run a rank under the syscall recorder, before its own command: `exe
/// trace-syscalls` (eBPF) or strace. Perturbations need strace's injection, so they get strace
/// whichever backend was chosen.
pub fn tracer_command(
    backend: AuditBackend,
    exe: &str,
    checks: &[AuditCheck],
    perturb: &[Perturb],
    seed: u64,
    out: &Path,
) -> Vec<String> {
    if backend == AuditBackend::Strace || !perturb.is_empty() {
        return strace_command(checks, perturb, seed, out);
    }
    let mut w = vec![
        exe.to_string(),
        "trace-syscalls".into(),
        format!("--out={}", path_word(out)),
    ];
    if checks.contains(&AuditCheck::UnboundedWaits) {
        w.push("--futex".into());
    }
    w.push("--".into());
    w
}

/// Perturbations as a run with `seed` applies them, each with its calls spelled out.
pub fn exact_perturbations(perturb: &[Perturb], seed: u64) -> Vec<Perturb> {
    (0..perturb.len())
        .map(|i| perturb[i].exact(seed.wrapping_add(i as u64)))
        .collect()
}

/// strace's `--inject` for an exact perturbation (`when` set, or every call).
fn inject_expr(p: &Perturb) -> String {
    let mut e = p.syscall.clone();
    if let Some(d) = p.delay_enter {
        e.push_str(&format!(":delay_enter={}", d.0.as_micros().max(1)));
    }
    if let Some(d) = p.delay_exit {
        e.push_str(&format!(":delay_exit={}", d.0.as_micros().max(1)));
    }
    if let Some(when) = &p.when {
        e.push_str(&format!(":when={when}"));
    }
    e
}
