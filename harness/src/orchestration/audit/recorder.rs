//! How a rank runs under the syscall recorder: strace's command line (its trace filter and
//! `--inject` perturbations) or `wringer trace-syscalls` (eBPF).

use std::path::Path;

use crate::model::scenario::{AuditBackend, AuditCheck, Perturb};
use crate::model::traced::{MAKES_ONE_FD, MAKES_TWO_FDS};

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

/// What delays a scenario's perturbed calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerturbBy {
    /// The perturbation observer, preloaded: libc's wrappers sleep; nothing is traced.
    Preload,
    /// strace's `--inject`: every thread stops at every traced call.
    Strace,
}

/// How `perturb` can be applied: by the preloaded observer where this build has it, every
/// perturbed syscall is one it delays and every program is dynamically linked (`statics`:
/// those that are not), else by strace, with why. `WRINGER_PERTURB_BY=strace` asks for strace.
pub fn perturb_mechanism(
    perturb: &[Perturb],
    statics: &[String],
    launched_as_step: bool,
) -> (PerturbBy, Option<String>) {
    let strace = |why: String| (PerturbBy::Strace, Some(why));
    if std::env::var("WRINGER_PERTURB_BY").is_ok_and(|v| v == "strace") {
        return strace("WRINGER_PERTURB_BY=strace".into());
    }
    if !crate::rank::perturb_observer::available() {
        return strace(
            "this wringer was built without the perturbation observer (no C compiler)".into(),
        );
    }
    if launched_as_step {
        return strace("Slurm steps start ranks with strace's command line".into());
    }
    if let Some(p) = perturb
        .iter()
        .find(|p| !crate::rank::perturb_observer::SYSCALLS.contains(&p.syscall.as_str()))
    {
        return strace(format!(
            "the observer does not delay `{}` (it delays {})",
            p.syscall,
            crate::rank::perturb_observer::SYSCALLS.join(", ")
        ));
    }
    if let Some(program) = statics.first() {
        return strace(format!(
            "{program} is statically linked: no preloaded library reaches its calls"
        ));
    }
    (PerturbBy::Preload, None)
}

/// The observer's rules for `perturb` as a run with `seed` applies them (the same calls
/// strace's `--inject` would be told): `SYSCALL,ENTER_US,EXIT_US,FIRST,LAST,STEP;…`.
pub fn preload_rules(perturb: &[Perturb], seed: u64) -> String {
    exact_perturbations(perturb, seed)
        .iter()
        .map(|p| {
            let (first, last, step) = p
                .when
                .as_deref()
                .and_then(|w| crate::model::scenario::parse_when(w).ok())
                .unwrap_or((0, None, None));
            let us = |d: Option<crate::model::duration::HumanDuration>| {
                d.map_or(0, |d| d.0.as_micros().max(1))
            };
            format!(
                "{},{},{},{first},{},{}",
                p.syscall,
                us(p.delay_enter),
                us(p.delay_exit),
                last.unwrap_or(0),
                step.unwrap_or(0)
            )
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Whether the ELF file at `path` is statically linked (no program interpreter). Scripts and
/// what cannot be read count as dynamic: their interpreter is what runs.
pub fn statically_linked(path: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let mut header = [0u8; 64];
    // ELF64, little-endian: program headers at e_phoff, e_phnum of e_phentsize bytes each.
    if file.read_exact_at(&mut header, 0).is_err()
        || &header[..4] != b"\x7fELF"
        || header[4] != 2
        || header[5] != 1
    {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([header[o], header[o + 1]]) as u64;
    let mut phoff = [0u8; 8];
    phoff.copy_from_slice(&header[0x20..0x28]);
    let (phoff, size, count) = (u64::from_le_bytes(phoff), u16_at(0x36), u16_at(0x38));
    const PT_INTERP: u32 = 3;
    !(0..count).any(|i| {
        let mut kind = [0u8; 4];
        file.read_exact_at(&mut kind, phoff + i * size).is_ok()
            && u32::from_le_bytes(kind) == PT_INTERP
    })
}

/// The words that run a rank under the syscall recorder, before its own command: `exe
/// trace-syscalls` (eBPF) or strace. Perturbations left to strace's injection get strace
/// whichever backend was chosen (the caller passes none when the observer delays them).
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
