//! The syscall-level lifecycle audit: ranks run under strace, and their traces are checked
//! for the order of events that outcome checks cannot see. Parsing and checking are pure (a
//! trace in, violations out), so they are unit-tested on hand-written traces.
//!
//! Invariants, per process:
//! - close while in use: an fd is closed while another thread is inside a syscall on it;
//! - close before the receiver is done: an fd is closed while a thread that received on it, or
//!   waited in `poll` for it alone, (since it was created) has not exited. A process that
//!   names its receiver threads (wringer's transport: `wringer-rx-FD`) has said which they are:
//!   there only those count, since its other threads read their own frames and live on;
//! - use after close: a thread that used an fd before its close uses the number again after
//!   it (EBADF, or someone else's reused descriptor), or any call on it fails with EBADF;
//! - double close: a thread that held a descriptor closes its number again (EBADF);
//!
//! Where the sync observer is loaded (its `prctl` markers in the trace), order is judged by
//! happens-before, not by timing: a release is a violation when another thread's wait or
//! receive on the descriptor is not ordered before it (no join, lock, condition, semaphore or
//! message between them), whether or not the race showed in this run; a thread that held the
//! previous descriptor of a reused number and uses (or closes) the new one without being
//! ordered after its creation is using a stale handle. Probes (`fcntl` F_GETFD/F_SETFD/
//! F_GETFL/F_SETFL) are not uses, and a program image's descriptors end at its `execve`.
//! - leaks (`leaks`): fds and threads created during a step and still open or alive at its end;
//! - waits without a bound (`unbounded-waits`): blocking calls with no timeout still in progress
//!   when the trace ends (reported when the watchdog fired).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use crate::model::scenario::{AuditBackend, AuditCheck, Perturb};
use crate::model::sync_marker::{self, SyncKind};
use crate::orchestration::happens_before::{Epoch, HappensBefore, Object};
use crate::orchestration::wait_for::WaitFor;

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

/// The name wringer's transport gives a connection's receiver thread, before its fd.
const RECEIVER_NAME: &str = "wringer-rx-";

/// Every syscall whose result is one new descriptor. A creator the audit missed would make
/// the next use of a reused number look like a use after close (Gloo's `epoll_create` did).
const MAKES_ONE_FD: &[&str] = &[
    "socket",
    "accept",
    "accept4",
    "open",
    "openat",
    "openat2",
    "creat",
    "open_by_handle_at",
    "dup",
    "dup2",
    "dup3",
    "eventfd",
    "eventfd2",
    "epoll_create",
    "epoll_create1",
    "timerfd_create",
    "signalfd",
    "signalfd4",
    "memfd_create",
    "inotify_init",
    "inotify_init1",
    "fanotify_init",
    "userfaultfd",
    "pidfd_open",
    "pidfd_getfd",
    "perf_event_open",
    "io_uring_setup",
];

/// Syscalls whose result is two new descriptors, written into their first argument.
const MAKES_TWO_FDS: &[&str] = &["pipe", "pipe2", "socketpair"];

/// strace's `-e trace=` list. A `?` before a name lets strace skip a syscall this
/// architecture lacks (`open`, `pipe` and `epoll_create` are not on arm64).
fn trace_filter() -> String {
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

/// One broken invariant, with the trace lines around it.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    pub check: &'static str,
    pub pid: u32,
    /// The program the process ran, where the trace names it (its `execve`).
    pub program: Option<String>,
    pub fd: Option<i32>,
    pub detail: String,
    /// Trace line numbers (1-based) and text around the violation.
    pub context: Vec<(usize, String)>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in pid {}: {}", self.check, self.pid, self.detail)?;
        for (n, l) in &self.context {
            write!(f, "\n    {n:>6}: {l}")?;
        }
        Ok(())
    }
}

/// One line of an `strace -f -ttt` trace.
#[derive(Debug, PartialEq)]
enum Event<'a> {
    /// A call that completed on this line.
    Call {
        name: &'a str,
        args: &'a str,
        ret: &'a str,
    },
    /// A call that started and did not finish yet.
    Started {
        name: &'a str,
        args: &'a str,
    },
    /// The rest of a call started earlier on this thread, with the arguments it printed at
    /// return (a pipe's fds: `<... pipe2 resumed>[3, 4], 0) = 0`).
    Resumed {
        name: &'a str,
        args: &'a str,
        ret: &'a str,
    },
    /// The thread ended.
    Exited,
    Other,
}

fn parse_line(line: &str) -> Option<(u32, Event<'_>)> {
    let (tid, rest) = line.trim_start().split_once(' ')?;
    let tid: u32 = tid.trim().parse().ok()?;
    // Skip the timestamp when there is one (strace pads short pids with spaces).
    let rest = rest.trim_start();
    let rest = match rest.split_once(' ') {
        Some((ts, r)) if ts.contains('.') && ts.chars().all(|c| c.is_ascii_digit() || c == '.') => {
            r
        }
        _ => rest,
    };
    let rest = rest.trim_start();
    if rest.starts_with("+++ exited") || rest.starts_with("+++ killed") {
        return Some((tid, Event::Exited));
    }
    if let Some(r) = rest.strip_prefix("<... ") {
        let (name, after) = r.split_once(" resumed>")?;
        let args = after.rfind(") = ").map_or("", |i| &after[..i]);
        return Some((
            tid,
            Event::Resumed {
                name,
                args,
                ret: result_of(after),
            },
        ));
    }
    let open = rest.find('(')?;
    let name = &rest[..open];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Some((tid, Event::Other));
    }
    let body = &rest[open + 1..];
    if let Some(args) = body.strip_suffix(" <unfinished ...>") {
        return Some((tid, Event::Started { name, args }));
    }
    if matches!(name, "exit") {
        return Some((tid, Event::Exited));
    }
    Some((
        tid,
        Event::Call {
            name,
            args: body,
            ret: result_of(body),
        },
    ))
}

/// The text after the last ` = `, e.g. `0`, `-1 EBADF (Bad file descriptor)`, `?`.
fn result_of(s: &str) -> &str {
    s.rfind(") = ")
        .map(|i| s[i + 4..].trim())
        .or_else(|| s.rfind(" = ").map(|i| s[i + 3..].trim()))
        .unwrap_or("")
}

/// The fd whose receiver a thread names itself for (`prctl(PR_SET_NAME, "wringer-rx-7")`).
fn named_receiver(args: &str) -> Option<i32> {
    let name = args.strip_prefix("PR_SET_NAME, \"")?.split('"').next()?;
    name.strip_prefix(RECEIVER_NAME)?.parse().ok()
}

/// The descriptors a syscall acts on: its first argument for most, every one a `poll` or
/// `select` waits for, both ends of a `splice`-like copy. A thread asleep in a `poll` on
/// several is inside a call on each of them, as much as one asleep in `recvfrom`.
fn fds_of(name: &str, args: &str) -> Vec<i32> {
    if is_probe(name, args) {
        return vec![];
    }
    let nth = |n: usize| -> Option<i32> {
        let a = args.split([',', ')']).nth(n)?.trim();
        a.parse().ok().filter(|fd: &i32| *fd >= 0)
    };
    match name {
        "poll" | "ppoll" => polled_fds(args),
        "select" | "pselect6" => selected_fds(args),
        "sendfile" | "tee" => [nth(0), nth(1)].into_iter().flatten().collect(),
        "splice" | "copy_file_range" => [nth(0), nth(2)].into_iter().flatten().collect(),
        _ if takes_fd(name) => nth(0).into_iter().collect(),
        _ => vec![],
    }
}

/// The descriptors of a `poll` (`[{fd=7, events=POLLIN}, {fd=9, events=POLLIN}], 2, 5000`).
fn polled_fds(args: &str) -> Vec<i32> {
    let list = args.split("}]").next().unwrap_or("");
    list.split("{fd=")
        .skip(1)
        .filter_map(|r| {
            let end = r.find(|c: char| !c.is_ascii_digit() && c != '-')?;
            r[..end].parse().ok().filter(|fd: &i32| *fd >= 0)
        })
        .collect()
}

/// The descriptors in a `select`'s sets (`8, [3 5], [], NULL, NULL`): every number inside
/// brackets (the timeout is in braces).
fn selected_fds(args: &str) -> Vec<i32> {
    let mut fds: Vec<i32> = args
        .split('[')
        .skip(1)
        .filter_map(|r| r.split(']').next())
        .flat_map(|set| set.split_whitespace().filter_map(|n| n.parse().ok()))
        .collect();
    fds.sort_unstable();
    fds.dedup();
    fds
}

/// A call that asks about a number without using what it names: whether it is open and how
/// (bash probes its script's fd 255 this way; launchers mark every number close-on-exec). An
/// EBADF there is an answer, not a use after close.
fn is_probe(name: &str, args: &str) -> bool {
    name == "fcntl"
        && ["F_GETFD", "F_SETFD", "F_GETFL", "F_SETFL"]
            .iter()
            .any(|op| args.contains(op))
}

/// Calls in which a thread waits for what a descriptor brings: its receiver, in the sense of
/// the happens-before check of a release.
fn waits_on(name: &str) -> bool {
    receives(name)
        || waits_on_epoll(name)
        || matches!(
            name,
            "poll" | "ppoll" | "select" | "pselect6" | "accept" | "accept4"
        )
}

/// Calls that put a message into a kernel channel (a pipe, socket pair or eventfd).
fn sends(name: &str) -> bool {
    matches!(
        name,
        "write" | "writev" | "pwrite64" | "sendto" | "sendmsg" | "sendmmsg"
    )
}

fn waits_on_epoll(name: &str) -> bool {
    matches!(name, "epoll_wait" | "epoll_pwait" | "epoll_pwait2")
}

fn takes_fd(name: &str) -> bool {
    matches!(
        name,
        "read"
            | "readv"
            | "pread64"
            | "preadv"
            | "write"
            | "writev"
            | "pwrite64"
            | "close"
            | "recvfrom"
            | "recvmsg"
            | "recvmmsg"
            | "sendto"
            | "sendmsg"
            | "sendmmsg"
            | "shutdown"
            | "accept"
            | "accept4"
            | "connect"
            | "bind"
            | "listen"
            | "getsockopt"
            | "setsockopt"
            | "getsockname"
            | "getpeername"
            | "fcntl"
            | "ioctl"
            | "fstat"
            | "newfstatat"
            | "lseek"
            | "epoll_ctl"
            | "epoll_wait"
            | "epoll_pwait"
            | "epoll_pwait2"
            | "preadv2"
            | "pwritev"
            | "pwritev2"
            | "fsync"
            | "ftruncate"
            | "dup"
            | "dup2"
            | "dup3"
            | "sendfile"
            | "splice"
    )
}

/// Calls whose arguments that matter may be printed only at their return: the fds a pipe
/// made, the bytes a write sent (the eBPF backend reads them then).
fn returns_args(name: &str) -> bool {
    MAKES_TWO_FDS.contains(&name) || matches!(name, "write" | "sendto")
}

/// Calls that release a descriptor.
fn releases(name: &str) -> bool {
    matches!(name, "close" | "close_range" | "dup2" | "dup3")
}

fn receives(name: &str) -> bool {
    matches!(name, "read" | "readv" | "recvfrom" | "recvmsg" | "recvmmsg")
}

/// Syscalls whose result is a new fd (or two, for pipes and socket pairs).
fn creates_fds(name: &str, args: &str, ret: &str) -> Vec<i32> {
    let ok = ret
        .split_whitespace()
        .next()
        .and_then(|r| r.parse::<i32>().ok());
    match name {
        _ if MAKES_ONE_FD.contains(&name) => ok.filter(|fd| *fd >= 0).into_iter().collect(),
        "fcntl" if args.contains("F_DUPFD") => ok.filter(|fd| *fd >= 0).into_iter().collect(),
        _ if MAKES_TWO_FDS.contains(&name) && ok == Some(0) => {
            // pipe2([3, 4], O_CLOEXEC) = 0
            args.split('[')
                .nth(1)
                .and_then(|s| s.split(']').next())
                .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
                .unwrap_or_default()
        }
        _ => vec![],
    }
}

/// The request of an io_uring line the eBPF recorder wrote: `io_uring_op(FD, OP, 0xREQ)` or
/// `io_uring_done(0xREQ)`.
fn uring_request(name: &str, args: &str) -> Option<u64> {
    if !matches!(name, "io_uring_op" | "io_uring_done") {
        return None;
    }
    let args = args.rsplit_once(") = ").map_or(args, |(a, _)| a);
    let last = args.rsplit(',').next()?;
    u64::from_str_radix(last.trim().strip_prefix("0x")?, 16).ok()
}

/// Whether a descriptor maker made its descriptor close-on-exec (`SOCK_CLOEXEC`, `O_CLOEXEC`,
/// `EFD_CLOEXEC`, `F_DUPFD_CLOEXEC` and kin; pidfds and io_uring instances always are).
fn born_cloexec(name: &str, args: &str) -> bool {
    match name {
        "pidfd_open" | "pidfd_getfd" | "io_uring_setup" => true,
        "dup" | "dup2" => false,
        "fcntl" => args.contains("F_DUPFD_CLOEXEC"),
        _ => args.contains("CLOEXEC"),
    }
}

/// The kind of descriptor whose peer sees an end only when every copy of it is closed.
fn conduit_of(name: &str) -> Option<&'static str> {
    match name {
        "socket" | "accept" | "accept4" | "socketpair" => Some("socket"),
        "pipe" | "pipe2" => Some("pipe"),
        // (its write end: the second of the two)
        _ => None,
    }
}

/// The thread a clone made, when it is a thread (shares the process) rather than a process.
fn cloned_thread(name: &str, args: &str, ret: &str) -> Option<(u32, bool)> {
    if !matches!(name, "clone" | "clone3" | "vfork" | "fork") {
        return None;
    }
    let child: u32 = ret.split_whitespace().next()?.parse().ok()?;
    Some((child, args.contains("CLONE_THREAD")))
}

#[derive(Default)]
struct Fd {
    /// Threads that used it at all since it was created.
    users: BTreeSet<u32>,
    /// Where it was closed, while it stays closed, and by which thread.
    closed_at: Option<usize>,
    closer: Option<u32>,
    /// Where it was created, when that was inside the running step (for `leaks`).
    created: Option<usize>,
    /// Each other thread's last wait or receive on it, for the happens-before check of its
    /// release.
    last_wait: BTreeMap<u32, Use>,
    /// When and by which thread this descriptor of the number was made (none: before the
    /// trace began).
    made: Option<Epoch>,
    /// The threads that used the previous descriptor of this number, and who closed that one:
    /// a use by one of them not ordered after `made` is a stale handle.
    stale: BTreeSet<u32>,
    stale_closer: Option<u32>,
    /// The kernel channel it is an end of (pipe, socket pair, eventfd): a message sent into it
    /// orders the sender before the receiver.
    channel: Option<u64>,
    /// Which descriptor this is, trace-wide (0: one the trace never saw made); a forked
    /// child's copy keeps its original's (`origin`).
    id: u64,
    /// Close-on-exec: it does not survive an `execve`.
    cloexec: bool,
    /// A socket or pipe: what a peer reads its end of (EOF) only when every copy is closed.
    conduit: Option<&'static str>,
    /// The process and descriptor this copy was inherited from at a fork (the first one,
    /// through a chain of forks).
    origin: Option<(u32, u64)>,
    /// Where the current program image made it (for `leaks` at the program's exit).
    image_made: Option<usize>,
    /// Its entry in the audit's inherited copies, once it crossed an `execve`.
    inherited: Option<usize>,
}

/// A socket or pipe a process inherited and carried across its `execve`: its new program
/// never heard of it unless it uses it.
#[derive(Clone)]
struct Inherited {
    pid: u32,
    fd: i32,
    origin: (u32, u64),
    exec_line: usize,
    used: bool,
    closed: Option<usize>,
    conduit: &'static str,
    /// It was seen alive when its origin closed its own copy: inside a call then, or making
    /// one after (a recorder may print its end after the close that followed it).
    held_then: bool,
}

/// One thread's call on a descriptor, as the happens-before check needs it.
struct Use {
    at: Epoch,
    line: usize,
    call: String,
}

#[derive(Default)]
struct Thread {
    /// Where it was created, when that was inside the running step (for `leaks`).
    created: Option<usize>,
    /// The fd this thread receives on: set by a receive (or a `poll` on that fd alone), kept
    /// while its calls stay on that fd, dropped by any other call (the thread has moved on, as
    /// a handshake thread does once it hands a socket over) or by its exit.
    receiving: Option<i32>,
    /// The fd whose receiver this thread is by its name (`wringer-rx-FD`).
    named_receiver_of: Option<i32>,
}

/// Per-process state while reading a trace.
#[derive(Default)]
struct Process {
    fds: BTreeMap<i32, Fd>,
    threads: BTreeMap<u32, Thread>,
    /// It names its receiver threads: only they must exit before their fd's close.
    names_receivers: bool,
    /// Each epoll instance's registered descriptors (`epoll_ctl` ADD and DEL): a thread in
    /// `epoll_wait` waits for every one of them.
    epoll_sets: BTreeMap<i32, BTreeSet<i32>>,
    /// The sync observer is loaded in it: its pthread synchronisation is in the trace, and
    /// releases are judged by happens-before.
    observed: bool,
    /// It reported a step (a rank): `leaks` counts between its step markers, not at its exit.
    stepped: bool,
    /// It called `exit_group` (or its last thread `exit`): it ended by itself, not by a kill.
    exiting: bool,
    /// Where its main thread's end was seen.
    ended: Option<usize>,
    /// The program it runs, from its last `execve` (when the recorder printed the path).
    exe: Option<String>,
}

/// A call in progress on a thread.
struct Inside {
    name: String,
    args: String,
    /// The descriptors it acts on or waits for directly.
    fds: Vec<i32>,
    /// The epoll set it waits on (`epoll_wait`), whose members it waits for as they are now.
    epoll: Option<i32>,
    line: usize,
}

/// Read a whole trace and return every violation of the chosen checks, as after a hang.
pub fn analyse(trace: &str, checks: &[AuditCheck]) -> Vec<Violation> {
    analyse_after(trace, checks, true)
}

/// Read a whole trace and return every violation of the chosen checks. Syscalls still in
/// progress without a timeout count (`unbounded-waits`) only when the run `hung`; the sync
/// observer's untimed waits count whenever that check is on.
pub fn analyse_after(trace: &str, checks: &[AuditCheck], hung: bool) -> Vec<Violation> {
    Audit {
        lines: trace.lines().collect(),
        checks,
        hung,
        ..Audit::default()
    }
    .run()
}

#[derive(Default)]
struct Audit<'a> {
    lines: Vec<&'a str>,
    checks: &'a [AuditCheck],
    tgid: BTreeMap<u32, u32>,
    procs: BTreeMap<u32, Process>,
    inside: BTreeMap<u32, Inside>,
    /// Per process, the line where the running step started.
    step: BTreeMap<u32, usize>,
    out: Vec<Violation>,
    hb: HappensBefore,
    /// Whether the run hung (for waits still in progress at the end).
    hung: bool,
    /// Per process, who holds and waits for what (the `waits` check).
    waits: BTreeMap<u32, WaitFor>,
    /// Kernel channels (pipes, socket pairs, eventfds) numbered as they are made.
    channels: u64,
    /// Descriptors numbered as they are made (0 stays "never seen made").
    fd_ids: u64,
    /// Every process's parent (a fork, not a thread), from the whole trace first: a child's
    /// first calls come before its parent's `vfork` returns.
    parents: BTreeMap<u32, u32>,
    /// Processes whose inherited descriptors are already copied from their parent.
    copied: BTreeSet<u32>,
    /// Sockets and pipes carried across an `execve`, for the inherited-leak rule.
    inherited: Vec<Inherited>,
    /// Where each process closed its own copy of a socket or pipe, by its id.
    own_closes: BTreeMap<(u32, u64), usize>,
    /// io_uring operations in flight, by process and request: who submitted it, on which
    /// descriptor, what, and where.
    uring: BTreeMap<(u32, u64), InFlight>,
}

/// An io_uring operation that took its descriptor and has not completed.
struct InFlight {
    tid: u32,
    fd: i32,
    op: String,
    line: usize,
}

impl Audit<'_> {
    fn on(&self, c: AuditCheck) -> bool {
        self.checks.contains(&c)
    }

    fn context(&self, at: usize, also: &[usize]) -> Vec<(usize, String)> {
        let last = self.lines.len().saturating_sub(1);
        let mut idx: BTreeSet<usize> = (at.saturating_sub(3)..=(at + 2).min(last)).collect();
        idx.extend(also.iter().copied());
        idx.into_iter()
            .map(|i| (i + 1, self.lines[i].to_string()))
            .collect()
    }

    fn flag(
        &mut self,
        check: &'static str,
        pid: u32,
        fd: Option<i32>,
        detail: String,
        at: usize,
        also: &[usize],
    ) {
        let context = self.context(at, also);
        let program = self.procs.get(&pid).and_then(|p| p.exe.clone());
        self.out.push(Violation {
            check,
            pid,
            program,
            fd,
            detail,
            context,
        });
    }

    fn run(mut self) -> Vec<Violation> {
        (self.tgid, self.parents) = threads_of(&self.lines);
        for i in 0..self.lines.len() {
            let line = self.lines[i];
            let Some((tid, ev)) = parse_line(line) else {
                continue;
            };
            let pid = *self.tgid.entry(tid).or_insert(tid);
            self.inherit(pid);
            if matches!(ev, Event::Call { .. } | Event::Started { .. }) {
                self.alive(pid);
            }
            // A thread that makes a call (other than the futex its wait sleeps in, or the
            // next marker) is not waiting any more.
            let call = match &ev {
                Event::Call { name, args, .. } | Event::Started { name, args } => {
                    Some((*name, *args))
                }
                // The end of a call judged where it started.
                _ => None,
            };
            if let Some((name, args)) = call {
                let marker = name == "prctl" && sync_marker::parse(args).is_some();
                if name != "futex" && !marker {
                    if let Some(w) = self.waits.get_mut(&pid) {
                        w.running(tid);
                    }
                }
            }
            self.procs
                .entry(pid)
                .or_default()
                .threads
                .entry(tid)
                .or_default();
            match ev {
                Event::Call { name, args, ret } => self.call(pid, tid, name, args, ret, i),
                Event::Started { name, args } => {
                    if name == "exit_group" {
                        // It does not return: the eBPF recorder prints it as unfinished.
                        self.procs.entry(pid).or_default().exiting = true;
                    }
                    let fds = fds_of(name, args);
                    // A release is judged where it returns (a close of a closed number fails
                    // there with EBADF); its start is not a use of what it releases.
                    let used: &[i32] = if releases(name) { &[] } else { &fds };
                    self.touch(pid, tid, name, used, i);
                    let epoll = fds.first().copied().filter(|_| waits_on_epoll(name));
                    self.inside.insert(
                        tid,
                        Inside {
                            name: name.to_string(),
                            args: args.to_string(),
                            fds,
                            epoll,
                            line: i,
                        },
                    );
                }
                Event::Resumed { name, args, ret } => {
                    if let Some(call) = self.inside.remove(&tid).filter(|c| c.name == name) {
                        // Usage was noted when it started; its effects count where it returned,
                        // with what the call wrote (fds) or sent, when printed only then.
                        // strace prints only the rest there (`[3, 4]) = 0`), after the flags
                        // it printed at the start: both are read.
                        let joined;
                        let args = if !args.is_empty() && returns_args(name) {
                            joined = format!("{}{args}", call.args);
                            &joined
                        } else {
                            &call.args
                        };
                        if releases(&call.name) {
                            self.release(pid, tid, &call.name, args, ret, i);
                        } else {
                            self.effects(pid, tid, &call.name, args, ret, i);
                        }
                    }
                }
                Event::Exited => {
                    if tid == pid {
                        self.procs.entry(pid).or_default().ended = Some(i);
                        // Its descriptors close with it.
                        for h in self.inherited.iter_mut().filter(|h| h.pid == pid) {
                            h.closed.get_or_insert(i);
                        }
                    }
                    self.hb.release(tid, Object::ProcessEnd(pid));
                    self.inside.remove(&tid);
                    if let Some(p) = self.procs.get_mut(&pid) {
                        p.threads.remove(&tid);
                    }
                }
                Event::Other => {}
            }
        }
        let untimed = self.on(AuditCheck::UnboundedWaits);
        if self.on(AuditCheck::Waits) || untimed {
            let found: Vec<(u32, crate::orchestration::wait_for::WaitFinding)> = self
                .waits
                .iter()
                .flat_map(|(pid, w)| w.findings(untimed).into_iter().map(|f| (*pid, f)))
                .filter(|(_, f)| self.on(AuditCheck::Waits) || f.check == "wait without a bound")
                .collect();
            for (pid, f) in found {
                let at = f.lines.first().copied().unwrap_or(0);
                self.flag(f.check, pid, None, f.detail, at, &f.lines);
            }
        }
        self.inherited_leaks();
        self.exit_leaks();
        {
            // Threads still waiting when the trace ended in a process that did not exit by
            // itself (stopped by a watchdog or a step's deadline; a kill ends its threads
            // without a word of theirs): a cycle among them is the hang's, named whichever
            // checks were asked.
            let found: Vec<(u32, crate::orchestration::wait_for::WaitFinding)> = self
                .waits
                .iter()
                .filter(|(pid, _)| self.procs.get(pid).is_some_and(|p| !p.exiting))
                .filter_map(|(pid, w)| Some((*pid, w.deadlock()?)))
                .collect();
            for (pid, f) in found {
                let at = f.lines.first().copied().unwrap_or(0);
                self.flag(f.check, pid, None, f.detail, at, &f.lines);
            }
        }
        if self.hung && untimed {
            let stuck: Vec<(u32, String, usize)> = self
                .inside
                .iter()
                .filter(|(_, c)| unbounded(&c.name, &c.args))
                .map(|(t, c)| (*t, c.name.clone(), c.line))
                .collect();
            for (tid, name, at) in stuck {
                let pid = *self.tgid.get(&tid).unwrap_or(&tid);
                self.flag(
                    "wait without a bound",
                    pid,
                    None,
                    format!("thread {tid} was still inside {name}() with no timeout when the trace ended"),
                    at,
                    &[],
                );
            }
        }
        self.out
    }

    /// A call that completed on one line.
    fn call(&mut self, pid: u32, tid: u32, name: &str, args: &str, ret: &str, i: usize) {
        if let Some(req) = uring_request(name, args) {
            // `io_uring_op(7, IORING_OP_RECV, 0x…)`: in flight on fd 7 until its completion.
            if name == "io_uring_done" {
                self.uring.remove(&(pid, req));
                return;
            }
            let mut a = args.split(',').map(str::trim);
            if let (Some(Ok(fd)), Some(op)) = (a.next().map(str::parse::<i32>), a.next()) {
                if fd >= 0 {
                    self.use_fd(pid, tid, name, fd, i);
                    let op = op.trim_start_matches("IORING_OP_").to_string();
                    self.uring.insert(
                        (pid, req),
                        InFlight {
                            tid,
                            fd,
                            op,
                            line: i,
                        },
                    );
                }
            }
            return;
        }
        if releases(name) {
            self.release(pid, tid, name, args, ret, i);
            return;
        }
        self.touch(pid, tid, name, &fds_of(name, args), i);
        self.effects(pid, tid, name, args, ret, i);
    }

    /// Whether `c`, a call in progress in process `pid`, is on `fd` or waits for it through
    /// its epoll set (as the set is now); and which of the two.
    fn waits_for(&self, pid: u32, c: &Inside, fd: i32) -> Option<bool> {
        if c.fds.contains(&fd) {
            return Some(false);
        }
        let set = self.procs.get(&pid)?.epoll_sets.get(&c.epoll?)?;
        set.contains(&fd).then_some(true)
    }

    /// A call that releases descriptors, once it returned: `close`; `close_range` (all the
    /// open ones in its range, unless it only marks them close-on-exec); `dup2` and `dup3`,
    /// which release their target when it was open, then make it anew.
    fn release(&mut self, pid: u32, tid: u32, name: &str, args: &str, ret: &str, i: usize) {
        let ok = ret.starts_with('0')
            || (name != "close" && name != "close_range" && !ret.starts_with('-'));
        let arg = |n: usize| -> Option<i64> {
            let a = args.split([',', ')']).nth(n)?.trim();
            match a {
                "~0" | "~0U" | "4294967295" => Some(u32::MAX as i64),
                _ => a.parse().ok(),
            }
        };
        match name {
            "close" if ret.contains("EBADF") => {
                if let Some(fd) = arg(0).filter(|fd| *fd >= 0) {
                    self.double_close(pid, tid, fd as i32, i);
                }
            }
            "close" => {
                if let Some(fd) = arg(0).filter(|fd| ok && *fd >= 0) {
                    self.close(pid, tid, fd as i32, "close", i);
                }
            }
            "close_range" => {
                let (Some(first), Some(last)) = (arg(0), arg(1)) else {
                    return;
                };
                if !ok {
                    return;
                }
                if args.contains("CLOSE_RANGE_CLOEXEC") {
                    let p = self.procs.entry(pid).or_default();
                    for (_, f) in p
                        .fds
                        .range_mut(first as i32..=last.min(i32::MAX as i64) as i32)
                    {
                        f.cloexec = true;
                    }
                    return;
                }
                let open: Vec<i32> = self
                    .procs
                    .get(&pid)
                    .map(|p| {
                        p.fds
                            .iter()
                            .filter(|(n, f)| {
                                f.closed_at.is_none() && (first..=last).contains(&(**n as i64))
                            })
                            .map(|(n, _)| *n)
                            .collect()
                    })
                    .unwrap_or_default();
                for fd in open {
                    self.close(pid, tid, fd, "close_range", i);
                }
            }
            _ => {
                // dup2(old, new) = new: `new`, when open and not `old`, is closed first.
                let (old, new) = (arg(0), arg(1));
                self.touch(pid, tid, name, &fds_of(name, args), i);
                if let (Some(old), Some(new)) = (old, new) {
                    let open = self
                        .procs
                        .get(&pid)
                        .and_then(|p| p.fds.get(&(new as i32)))
                        .is_some_and(|f| f.closed_at.is_none());
                    if ok && open && old != new {
                        self.close(pid, tid, new as i32, name, i);
                    }
                }
                self.effects(pid, tid, name, args, ret, i);
            }
        }
    }

    /// The thread is now inside (or through) `name` on `fd`: note the use, or flag a use after
    /// close.
    fn touch(&mut self, pid: u32, tid: u32, name: &str, fds: &[i32], i: usize) {
        let p = self.procs.entry(pid).or_default();
        let th = p.threads.entry(tid).or_default();
        if th.receiving.is_some_and(|r| !fds.contains(&r)) {
            th.receiving = None;
        }
        if name == "exit" {
            // It runs no more code of its own: its join may return before strace reports
            // the exit.
            th.named_receiver_of = None;
        }
        // A thread receives on one descriptor: a receive, or a poll on it alone.
        if let [fd] = fds {
            if receives(name) || matches!(name, "poll" | "ppoll") {
                th.receiving = Some(*fd);
            }
        }
        for &fd in fds {
            self.use_fd(pid, tid, name, fd, i);
        }
    }

    fn use_fd(&mut self, pid: u32, tid: u32, name: &str, fd: i32, i: usize) {
        let now = self.hb.now(tid);
        let p = self.procs.entry(pid).or_default();
        let f = p.fds.entry(fd).or_default();
        if let Some(k) = f.inherited.filter(|_| f.closed_at.is_none()) {
            self.inherited[k].used = true;
        }
        if waits_on(name) {
            f.last_wait.insert(
                tid,
                Use {
                    at: now,
                    line: i,
                    call: name.to_string(),
                },
            );
        }
        // A message into a pipe, socket pair or eventfd orders its sender before whoever
        // reads it: released as it is sent, before the reader can return with it.
        if let Some(id) = f.channel.filter(|_| sends(name)) {
            self.hb.release(tid, Object::Channel { pid, id });
        }
        self.stale_handle(pid, tid, fd, name, i);
        let p = self.procs.entry(pid).or_default();
        let f = p.fds.entry(fd).or_default();
        match f.closed_at {
            Some(c) if f.users.contains(&tid) => {
                if self.on(AuditCheck::FdLifecycle) {
                    self.flag(
                        "use after close",
                        pid,
                        Some(fd),
                        format!(
                            "thread {tid} called {name}() on fd {fd} after its close (line {})",
                            c + 1
                        ),
                        i,
                        &[c],
                    );
                }
            }
            Some(_) => {}
            None => {
                f.users.insert(tid);
            }
        }
    }

    /// `fd` is released by `how` (close, close_range, dup2, dup3) on thread `tid`.
    fn close(&mut self, pid: u32, tid: u32, fd: i32, how: &str, i: usize) {
        self.touch(pid, tid, how, &[], i);
        self.stale_handle(pid, tid, fd, how, i);
        if self.on(AuditCheck::FdLifecycle) {
            let in_use: Vec<(u32, String, bool, usize)> = self
                .inside
                .iter()
                .filter(|(t, _)| **t != tid && self.tgid.get(t) == Some(&pid))
                .filter_map(|(t, c)| {
                    let through_set = self.waits_for(pid, c, fd)?;
                    Some((*t, c.name.clone(), through_set, c.line))
                })
                .collect();
            let verb = if how == "close" {
                "closed".to_string()
            } else {
                format!("released (by {how})")
            };
            let in_flight: Vec<(u32, String, usize)> = self
                .uring
                .range((pid, 0)..=(pid, u64::MAX))
                .filter(|(_, op)| op.fd == fd)
                .map(|(_, op)| (op.tid, op.op.clone(), op.line))
                .collect();
            for (by, op, at) in in_flight {
                self.flag(
                    "close while in use",
                    pid,
                    Some(fd),
                    format!(
                        "thread {tid} {verb} fd {fd} while an io_uring {op} submitted by thread \
                         {by} (line {}) was still in flight on it: the operation keeps the \
                         descriptor's file (and its peer) alive past the close and completes \
                         later; cancel it (IORING_OP_ASYNC_CANCEL) and wait for its completion \
                         before the close",
                        at + 1
                    ),
                    i,
                    &[at],
                );
            }
            for (other, name, through_set, at) in in_use {
                let on = if through_set {
                    "waiting for it in its epoll set"
                } else {
                    "on it"
                };
                self.flag(
                    "close while in use",
                    pid,
                    Some(fd),
                    format!(
                        "thread {tid} {verb} fd {fd} while thread {other} was inside {name}() {on}"
                    ),
                    i,
                    &[at],
                );
            }
            let p = &self.procs[&pid];
            // A process that names its receivers (wringer's transport) has said which threads
            // must be done before a close: they must have exited. Its callers hand the socket
            // on by shared ownership (atomics no trace shows), so order between them is not
            // judged by happens-before there.
            let by_order = p.observed && !p.names_receivers;
            if by_order {
                self.unordered_waits(pid, tid, fd, &verb, i);
            }
            let p = &self.procs[&pid];
            let receivers: Vec<u32> = p
                .threads
                .iter()
                .filter(|(t, th)| {
                    **t != tid
                        && !by_order
                        && if p.names_receivers {
                            th.named_receiver_of == Some(fd)
                        } else {
                            th.receiving == Some(fd)
                        }
                })
                .map(|(t, _)| *t)
                .collect();
            for r in receivers {
                self.flag(
                    "close before the receiver is done",
                    pid,
                    Some(fd),
                    format!("thread {tid} {verb} fd {fd} while thread {r}, its receiver, had not exited"),
                    i,
                    &[],
                );
            }
        }
        let p = self.procs.entry(pid).or_default();
        for th in p.threads.values_mut() {
            if th.receiving == Some(fd) {
                th.receiving = None;
            }
        }
        let f = p.fds.entry(fd).or_default();
        if f.closed_at.is_none() {
            if f.conduit.is_some() && f.id != 0 {
                self.own_closes.insert((pid, f.id), i);
                let origin = (pid, f.id);
                for h in self.inherited.iter_mut() {
                    if h.origin == origin && h.closed.is_none() {
                        h.held_then |= self.inside.iter().any(|(t, c)| {
                            self.tgid.get(t) == Some(&h.pid) && c.name != "exit_group"
                        });
                    }
                }
            }
            if let Some(k) = f.inherited {
                self.inherited[k].closed = Some(i);
            }
        }
        f.closed_at = Some(i);
        f.closer = Some(tid);
        // The kernel drops a closed descriptor from every epoll set (its last reference).
        p.epoll_sets.remove(&fd);
        p.epoll_sets.values_mut().for_each(|s| {
            s.remove(&fd);
        });
    }

    /// A close that failed with EBADF, by a thread that held the descriptor (used it, or
    /// closed it already): a double close. A sweep that closes every number (before an exec)
    /// never held the ones it misses, and is not one.
    fn double_close(&mut self, pid: u32, tid: u32, fd: i32, i: usize) {
        let Some(f) = self.procs.get(&pid).and_then(|p| p.fds.get(&fd)) else {
            return;
        };
        let Some(closed) = f.closed_at else {
            return;
        };
        let held = f.users.contains(&tid) || f.closer == Some(tid);
        if !held || !self.on(AuditCheck::FdLifecycle) || self.in_sweep(tid, fd, i) {
            return;
        }
        let by = f.closer.map_or_else(|| "?".into(), |t| t.to_string());
        self.flag(
            "double close",
            pid,
            Some(fd),
            format!(
                "thread {tid} closed fd {fd} again: thread {by} had closed it (line {}), and the \
                 close failed with EBADF; had the number been reopened in between, it would \
                 have closed someone else's descriptor",
                closed + 1
            ),
            i,
            &[closed],
        );
    }

    /// Whether the close of `fd` at line `i` is one of a sweep over every number (before an
    /// exec, or a daemon's start): this thread's closes around it make a run of three
    /// consecutive numbers with it.
    fn in_sweep(&self, tid: u32, fd: i32, i: usize) -> bool {
        let closed_by_tid = |line: &str| -> Option<i32> {
            let (t, ev) = parse_line(line)?;
            match ev {
                Event::Call {
                    name: "close",
                    args,
                    ..
                }
                | Event::Started {
                    name: "close",
                    args,
                } if t == tid => args.split([',', ')']).next()?.trim().parse().ok(),
                _ => None,
            }
        };
        let next: Vec<i32> = self.lines[i + 1..]
            .iter()
            .take(128)
            .filter_map(|l| closed_by_tid(l))
            .take(2)
            .collect();
        // Its own start, when strace split it, is not a neighbour.
        let prev: Vec<i32> = self.lines[..i]
            .iter()
            .rev()
            .take(128)
            .filter_map(|l| closed_by_tid(l))
            .filter(|n| *n != fd)
            .take(2)
            .collect();
        // A run of three consecutive numbers with this one in it.
        let after = |k: usize| next.get(k) == Some(&(fd + 1 + k as i32));
        let before = |k: usize| prev.get(k) == Some(&(fd - 1 - k as i32));
        (after(0) && after(1)) || (before(0) && before(1)) || (before(0) && after(0))
    }

    /// A stale handle: `tid` held the number's previous descriptor (someone else closed it)
    /// and uses or closes the new one with nothing ordering it after its creation. Checked
    /// once per thread and descriptor, where the sync observer is loaded.
    fn stale_handle(&mut self, pid: u32, tid: u32, fd: i32, name: &str, i: usize) {
        let Some(p) = self.procs.get_mut(&pid).filter(|p| p.observed) else {
            return;
        };
        let Some(f) = p.fds.get_mut(&fd) else {
            return;
        };
        if f.closed_at.is_some() || !f.stale.remove(&tid) || f.stale_closer == Some(tid) {
            return;
        }
        let Some(made) = f.made.filter(|m| m.tid != tid) else {
            return;
        };
        let closer = f.stale_closer.map_or_else(|| "?".into(), |t| t.to_string());
        if self.hb.ordered_before(made, tid) || !self.on(AuditCheck::FdLifecycle) {
            return;
        }
        let (check, how) = if name == "close" {
            ("double close", "closed")
        } else {
            ("use after close", "used")
        };
        self.flag(
            check,
            pid,
            Some(fd),
            format!(
                "thread {tid} {how} fd {fd} with {name}() through a stale handle: the descriptor \
                 it held was closed by thread {closer} and the number reopened by thread {}, and \
                 nothing orders this call after that reopening",
                made.tid
            ),
            i,
            &[],
        );
    }

    /// The happens-before check of a release by `tid`: every other thread's last wait or
    /// receive on `fd` must be ordered before it.
    fn unordered_waits(&mut self, pid: u32, tid: u32, fd: i32, verb: &str, i: usize) {
        let p = &self.procs[&pid];
        let candidates: Vec<(u32, Epoch, usize, String)> = p
            .fds
            .get(&fd)
            .map(|f| {
                f.last_wait
                    .iter()
                    .filter(|(t, _)| **t != tid)
                    .map(|(t, u)| (*t, u.at, u.line, u.call.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for (other, at, line, call) in candidates {
            if self.hb.ordered_before(at, tid) {
                continue;
            }
            self.flag(
                "close before the receiver is done",
                pid,
                Some(fd),
                format!(
                    "thread {tid} {verb} fd {fd}, and nothing orders thread {other}'s {call}({fd}) \
                     (line {}) before it: no join, lock, condition, semaphore or message between \
                     them, so in another run that {call} comes after the close",
                    line + 1
                ),
                i,
                &[line],
            );
        }
    }

    /// A sync observer's marker: an edge of happens-before, or the observer saying it is here.
    fn sync(&mut self, pid: u32, tid: u32, m: sync_marker::SyncMarker, i: usize) {
        let object = Object::Address {
            pid,
            addr: m.object,
        };
        if m.kind != SyncKind::Wait {
            self.waits.entry(pid).or_default().running(tid);
        }
        match m.kind {
            SyncKind::Attach => self.procs.entry(pid).or_default().observed = true,
            SyncKind::Start => self.waits.entry(pid).or_default().start(tid, m.object),
            SyncKind::Release => {
                self.hb.release(tid, object);
                self.waits.entry(pid).or_default().release(tid, m.object);
            }
            SyncKind::End => {
                self.hb.release(tid, object);
                self.waits.entry(pid).or_default().end(tid, m.object);
            }
            SyncKind::Hold => {
                self.waits
                    .entry(pid)
                    .or_default()
                    .hold(tid, m.object, m.site, i, m.tried())
            }
            SyncKind::Drop => self.waits.entry(pid).or_default().drop_lock(tid, m.object),
            SyncKind::Wait => {
                if let Some((kind, timed)) = m.wait() {
                    self.waits
                        .entry(pid)
                        .or_default()
                        .wait(tid, kind, m.object, timed, m.site, i);
                }
            }
            SyncKind::Acquire => {
                // Takers of a lock: whoever acquires it from another thread, and the thread
                // that held it before it was shared (aux).
                // A try-lock never blocks: it is no taker the lock's holder could stall.
                let w = self.waits.entry(pid).or_default();
                w.acquired(tid, m.object);
                if !m.tried() {
                    w.taker(tid, m.object);
                }
                let releaser = m.releaser();
                if let Some((t, false)) = releaser {
                    w.taker(t as u32, m.object);
                }
                if !self.hb.acquire(tid, object) {
                    if let Some((t, _)) = releaser {
                        self.hb.acquire_from_thread(tid, t as u32);
                    }
                }
            }
        }
    }

    /// What a finished call leaves behind: new fds, new threads, EBADF, step markers.
    fn effects(&mut self, pid: u32, tid: u32, name: &str, args: &str, ret: &str, i: usize) {
        let in_step = self.step.contains_key(&pid).then_some(i);
        if let Some(m) = (name == "prctl")
            .then(|| sync_marker::parse(args))
            .flatten()
        {
            self.sync(pid, tid, m, i);
            return;
        }
        if let Some(fd) = (name == "prctl").then(|| named_receiver(args)).flatten() {
            let p = self.procs.entry(pid).or_default();
            p.names_receivers = true;
            p.threads.entry(tid).or_default().named_receiver_of = Some(fd);
            return;
        }
        if let Some((child, thread)) = cloned_thread(name, args, ret) {
            self.hb.spawn(tid, child);
            if thread {
                self.tgid.insert(child, pid);
                let p = self.procs.entry(pid).or_default();
                p.threads.entry(child).or_default().created = in_step;
            } else {
                self.parents.insert(child, pid);
                self.inherit(child);
            }
            return;
        }
        if name == "exit_group" {
            self.procs.entry(pid).or_default().exiting = true;
            return;
        }
        let returned: Option<i64> = ret.split_whitespace().next().and_then(|r| r.parse().ok());
        if name == "futex" {
            // Code that does not go through pthreads (Rust's std locks, Go): a wake that woke
            // someone orders the waker before the wait it ended, where futex is recorded.
            let mut a = args.split(',').map(str::trim);
            let word = a
                .next()
                .and_then(|w| u64::from_str_radix(w.strip_prefix("0x")?, 16).ok());
            let op = a.next().unwrap_or("");
            if let Some(addr) = word {
                let object = Object::Address { pid, addr };
                if op.starts_with("FUTEX_WAKE") && returned.is_some_and(|n| n > 0) {
                    self.hb.release(tid, object);
                } else if op.starts_with("FUTEX_WAIT") && returned == Some(0) {
                    self.hb.acquire(tid, object);
                }
            }
            return;
        }
        if matches!(name, "wait4" | "waitid") {
            if let Some(child) = returned.filter(|r| *r > 0) {
                self.hb.acquire(tid, Object::ProcessEnd(child as u32));
            }
        }
        if name == "execve" && returned == Some(0) {
            self.new_image(pid, i);
            let path = args.strip_prefix('"').and_then(|a| a.split('"').next());
            self.procs.entry(pid).or_default().exe =
                path.filter(|p| !p.is_empty()).map(str::to_string);
        }
        if name == "fcntl" && args.contains("F_SETFD") && returned == Some(0) {
            let mut a = args.split(',').map(str::trim);
            if let (Some(Ok(fd)), Some(flag)) = (a.next().map(str::parse::<i32>), a.nth(1)) {
                let on =
                    flag.contains("FD_CLOEXEC") || flag.parse::<u64>().is_ok_and(|v| v & 1 == 1);
                if let Some(f) = self.procs.entry(pid).or_default().fds.get_mut(&fd) {
                    f.cloexec = on;
                }
            }
        }
        let first_fd = fds_of(name, args).first().copied();
        if let Some(fd) = first_fd {
            let channel = self
                .procs
                .get(&pid)
                .and_then(|p| p.fds.get(&fd))
                .and_then(|f| f.channel);
            if name == "shutdown" && returned == Some(0) {
                // The read a shutdown ends (its EOF) is ordered after the shutdown.
                self.hb.release(
                    tid,
                    Object::Channel {
                        pid,
                        id: shutdown_channel(fd),
                    },
                );
            }
            if receives(name) && returned == Some(0) {
                self.hb.acquire(
                    tid,
                    Object::Channel {
                        pid,
                        id: shutdown_channel(fd),
                    },
                );
            }
            if let Some(id) = channel.filter(|_| receives(name) && returned.is_some_and(|n| n > 0))
            {
                self.hb.acquire(tid, Object::Channel { pid, id });
            }
        }
        let made = creates_fds(name, args, ret);
        let channel = (made.len() == 2 || name.starts_with("eventfd")).then(|| {
            self.channels += 1;
            self.channels
        });
        // A copy (dup, F_DUPFD) is of its source's kind; close-on-exec is the copy's own.
        let source_conduit = matches!(name, "dup" | "dup2" | "dup3" | "fcntl")
            .then(|| first_fd)
            .flatten()
            .and_then(|fd| self.procs.get(&pid)?.fds.get(&fd)?.conduit);
        let conduit = conduit_of(name).or(source_conduit);
        let cloexec = born_cloexec(name, args);
        for (k, new) in made.into_iter().enumerate() {
            // A pipe's reader waits for the end of its write end only.
            let conduit = conduit.filter(|c| *c != "pipe" || k == 1);
            // The kernel hands out a number only once it is free: a close of it still in
            // progress on another thread (its return not yet in the trace) is over by now.
            let closing: Vec<u32> = self
                .inside
                .iter()
                .filter(|(t, c)| {
                    c.name == "close" && c.fds.contains(&new) && self.tgid.get(t) == Some(&pid)
                })
                .map(|(t, _)| *t)
                .collect();
            for closer in closing {
                self.inside.remove(&closer);
                self.close(pid, closer, new, "close", i);
            }
            let made_at = self.hb.now(tid);
            let fds = &mut self.procs.entry(pid).or_default().fds;
            let (stale, stale_closer) = match fds.get(&new) {
                Some(old) if old.closed_at.is_some() => (old.users.clone(), old.closer),
                _ => (BTreeSet::new(), None),
            };
            self.fd_ids += 1;
            fds.insert(
                new,
                Fd {
                    created: in_step,
                    made: Some(made_at),
                    stale,
                    stale_closer,
                    channel,
                    id: self.fd_ids,
                    cloexec,
                    conduit,
                    image_made: Some(i),
                    ..Fd::default()
                },
            );
        }
        if name == "epoll_ctl" && ret.starts_with('0') {
            self.epoll_ctl(pid, args);
        }
        let fds = if ret.contains("EBADF") && self.on(AuditCheck::FdLifecycle) {
            fds_of(name, args)
        } else {
            vec![]
        };
        for fd in fds {
            let closed = self.procs[&pid].fds.get(&fd).and_then(|f| f.closed_at);
            let already = self.out.iter().any(|v| {
                v.check == "use after close" && v.context.iter().any(|(n, _)| *n == i + 1)
            });
            if let (Some(c), false) = (closed, already) {
                self.flag(
                    "use after close",
                    pid,
                    Some(fd),
                    format!(
                        "thread {tid} called {name}() on fd {fd} after its close (line {}): EBADF",
                        c + 1
                    ),
                    i,
                    &[c],
                );
            }
        }
        if matches!(name, "write" | "sendto") {
            self.marker(pid, args, i);
        }
    }

    /// A forked process starts with a copy of its parent's open descriptors, as the parent's
    /// are when the child's first call or the fork's return is read, whichever comes first
    /// (a `vfork` returns only after the child's `execve`).
    fn inherit(&mut self, child: u32) {
        let Some(&parent) = self.parents.get(&child) else {
            return;
        };
        if !self.copied.insert(child) {
            return;
        }
        let copies: Vec<(i32, Fd)> = self
            .procs
            .get(&parent)
            .map(|p| {
                p.fds
                    .iter()
                    .filter(|(_, f)| f.closed_at.is_none())
                    .map(|(n, f)| {
                        let copy = Fd {
                            id: f.id,
                            cloexec: f.cloexec,
                            conduit: f.conduit,
                            channel: f.channel,
                            origin: f.origin.or((f.id != 0).then_some((parent, f.id))),
                            ..Fd::default()
                        };
                        (*n, copy)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let fds = &mut self.procs.entry(child).or_default().fds;
        for (n, copy) in copies {
            fds.entry(n).or_insert(copy);
        }
    }

    /// `pid` makes a call: every inherited copy it still holds whose origin has closed its own
    /// was held then.
    fn alive(&mut self, pid: u32) {
        if self.own_closes.is_empty() {
            return;
        }
        for h in self.inherited.iter_mut() {
            if h.pid == pid && h.closed.is_none() && self.own_closes.contains_key(&h.origin) {
                h.held_then = true;
            }
        }
    }

    /// A successful `execve`: close-on-exec descriptors are gone, the rest carry on into a
    /// program that knows of them only if it is told (and then uses them); the old image's
    /// closes and users are not the new one's.
    fn new_image(&mut self, pid: u32, i: usize) {
        let p = self.procs.entry(pid).or_default();
        p.fds.retain(|_, f| f.closed_at.is_none() && !f.cloexec);
        for (&n, f) in p.fds.iter_mut() {
            f.users.clear();
            f.last_wait.clear();
            f.stale.clear();
            f.image_made = None;
            let (Some(origin), Some(conduit)) = (f.origin, f.conduit) else {
                continue;
            };
            // Standard input, output and error are handed over on purpose.
            if n <= 2 {
                continue;
            }
            let unheard = f.inherited.is_some_and(|k| !self.inherited[k].used);
            if !unheard {
                f.inherited = Some(self.inherited.len());
                self.inherited.push(Inherited {
                    pid,
                    fd: n,
                    origin,
                    exec_line: i,
                    used: false,
                    closed: None,
                    conduit,
                    held_then: false,
                });
            }
        }
    }

    /// A socket or pipe that crossed an `execve` without close-on-exec into a program that
    /// never used it, still open there when the process it came from closed its own copy:
    /// the peer sees no end (EOF, a reset) until that program closes it or exits.
    fn inherited_leaks(&mut self) {
        if !(self.on(AuditCheck::FdLifecycle) || self.on(AuditCheck::Leaks)) {
            return;
        }
        let found: Vec<(Inherited, usize)> = self
            .inherited
            .iter()
            .filter(|h| !h.used && h.held_then)
            .filter_map(|h| {
                let own = *self.own_closes.get(&h.origin)?;
                // Closed by its origin while this copy was open: before the `execve` too,
                // since the copy then crossed it.
                h.closed.is_none_or(|c| c > own).then(|| (h.clone(), own))
            })
            .collect();
        for (h, own) in found {
            let until = match h.closed {
                Some(c) => format!("until line {}", c + 1),
                None => "while it lived".to_string(),
            };
            self.flag(
                "leak",
                h.pid,
                Some(h.fd),
                format!(
                    "process {} inherited fd {} (a {}) from process {} without close-on-exec and \
                     carried it across its execve (line {}) into a program that never used it; \
                     process {} closed its own copy (line {}), but the {} stayed open in process \
                     {} {until}, so its peer saw no end: make it close-on-exec \
                     (SOCK_CLOEXEC, O_CLOEXEC, FD_CLOEXEC) or close it in the child",
                    h.pid,
                    h.fd,
                    h.conduit,
                    h.origin.0,
                    h.exec_line + 1,
                    h.origin.0,
                    own + 1,
                    h.conduit,
                    h.pid
                ),
                own,
                &[h.exec_line],
            );
        }
    }

    /// `leaks` for a program that reports no steps (`wringer audit`): every descriptor its
    /// last program image made and did not close by the time it exited by itself, as
    /// valgrind's `--track-fds` reports them. Standard input, output and error are not counted.
    fn exit_leaks(&mut self) {
        if !self.on(AuditCheck::Leaks) {
            return;
        }
        let found: Vec<(u32, i32, usize, usize)> = self
            .procs
            .iter()
            .filter(|(_, p)| !p.stepped && p.exiting)
            .filter_map(|(pid, p)| Some((pid, p, p.ended?)))
            .flat_map(|(pid, p, end)| {
                p.fds
                    .iter()
                    .filter(|(n, f)| **n > 2 && f.closed_at.is_none())
                    .filter_map(move |(n, f)| Some((*pid, *n, f.image_made?, end)))
            })
            .collect();
        for (pid, fd, made, end) in found {
            self.flag(
                "leak",
                pid,
                Some(fd),
                format!(
                    "fd {fd}, made by process {pid}'s program (line {}), was still open when it \
                     exited (line {})",
                    made + 1,
                    end + 1
                ),
                made,
                &[end],
            );
        }
    }

    /// `epoll_ctl(5, EPOLL_CTL_ADD, 7, {…}) = 0`: 7 joins (or with DEL leaves) set 5.
    fn epoll_ctl(&mut self, pid: u32, args: &str) {
        let mut parts = args.split(',').map(str::trim);
        let (Some(epfd), Some(op), Some(fd)) = (parts.next(), parts.next(), parts.next()) else {
            return;
        };
        let (Ok(epfd), Ok(fd)) = (epfd.parse::<i32>(), fd.parse::<i32>()) else {
            return;
        };
        let sets = &mut self.procs.entry(pid).or_default().epoll_sets;
        match op {
            "EPOLL_CTL_ADD" => {
                sets.entry(epfd).or_default().insert(fd);
            }
            "EPOLL_CTL_DEL" => {
                sets.entry(epfd).or_default().remove(&fd);
            }
            _ => {}
        }
    }

    /// The rank reports each step's start and end to the coordinator; those writes bound the
    /// step for the leak check.
    fn marker(&mut self, pid: u32, args: &str, i: usize) {
        if args.contains("step-start") {
            self.step.insert(pid, i);
            let p = self.procs.entry(pid).or_default();
            p.stepped = true;
            p.fds.values_mut().for_each(|f| f.created = None);
            p.threads.values_mut().for_each(|t| t.created = None);
            return;
        }
        if !(args.contains("step-result") || args.contains("step-error")) {
            return;
        }
        let Some(start) = self.step.remove(&pid) else {
            return;
        };
        if !self.on(AuditCheck::Leaks) {
            return;
        }
        let p = &self.procs[&pid];
        let fds: Vec<(i32, usize)> = p
            .fds
            .iter()
            .filter(|(_, f)| f.closed_at.is_none())
            .filter_map(|(n, f)| f.created.map(|c| (*n, c)))
            .collect();
        let threads: Vec<(u32, usize)> = p
            .threads
            .iter()
            .filter_map(|(t, th)| th.created.map(|c| (*t, c)))
            .collect();
        for (n, c) in fds {
            self.flag(
                "leak",
                pid,
                Some(n),
                format!(
                    "fd {n} created in the step (line {}) is still open at its end",
                    c + 1
                ),
                i,
                &[start, c],
            );
        }
        for (t, c) in threads {
            self.flag(
                "leak",
                pid,
                None,
                format!(
                    "thread {t} started in the step (line {}) is still alive at its end",
                    c + 1
                ),
                i,
                &[start, c],
            );
        }
    }
}

/// Every thread's process, from the whole trace first: a new thread's calls can come before
/// its creator's clone returns (strace and the ring buffer both show that under load), and
/// read in one pass they would be taken for another process's.
/// Also every process's parent.
fn threads_of(lines: &[&str]) -> (BTreeMap<u32, u32>, BTreeMap<u32, u32>) {
    let mut tgid: BTreeMap<u32, u32> = BTreeMap::new();
    let mut parents: BTreeMap<u32, u32> = BTreeMap::new();
    let mut started: BTreeMap<u32, &str> = BTreeMap::new();
    for line in lines {
        let Some((tid, ev)) = parse_line(line) else {
            continue;
        };
        let (name, args, ret) = match ev {
            Event::Started { name, args } if name.starts_with("clone") => {
                started.insert(tid, args);
                continue;
            }
            Event::Call { name, args, ret } => (name, args, ret),
            Event::Resumed { name, ret, .. } => (name, started.remove(&tid).unwrap_or(""), ret),
            _ => continue,
        };
        match cloned_thread(name, args, ret) {
            Some((child, true)) => {
                let root = *tgid.get(&tid).unwrap_or(&tid);
                tgid.insert(child, root);
            }
            Some((child, false)) => {
                parents.insert(child, *tgid.get(&tid).unwrap_or(&tid));
            }
            None => {}
        }
    }
    (tgid, parents)
}

/// The channel a descriptor's `shutdown` releases into and the read it ends (EOF) acquires.
fn shutdown_channel(fd: i32) -> u64 {
    (1 << 63) | fd as u32 as u64
}

/// A blocking call that was given no timeout.
fn unbounded(name: &str, args: &str) -> bool {
    match name {
        "futex" => args.contains("FUTEX_WAIT") && args.trim_end().ends_with("NULL"),
        "poll" | "ppoll" => args.contains(", -1") || args.ends_with("NULL"),
        "epoll_wait" | "epoll_pwait" => args.contains(", -1"),
        "recvfrom" | "recvmsg" | "read" | "accept" | "accept4" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::duration::HumanDuration;

    const LIFECYCLE: &[AuditCheck] = &[AuditCheck::FdLifecycle];

    fn checks_of(trace: &str, checks: &[AuditCheck]) -> Vec<&'static str> {
        analyse(trace, checks).iter().map(|v| v.check).collect()
    }

    /// The correct teardown: shutdown wakes the receiver, it exits, then the fd is closed.
    const CORRECT: &str = "\
100 1.000 socket(AF_INET, SOCK_STREAM|SOCK_CLOEXEC, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM, child_tid=0x1} => {parent_tid=[101]}, 88) = 101
101 1.002 recvfrom(7,  <unfinished ...>
100 1.003 shutdown(7, SHUT_RDWR) = 0
101 1.004 <... recvfrom resumed>\"\", 65536, 0, NULL, NULL) = 0
101 1.005 exit(0)                 = ?
101 1.006 +++ exited with 0 +++
100 1.007 close(7)                = 0
";

    const M: &str = "prctl(0x57534e43 /* PR_??? */";

    /// The sync observer's lines: attach, and (thread, kind, object).
    fn observed(body: &str) -> String {
        format!("100 0.9 {M}, 0x1, 0x64, 0, 0) = -1 EINVAL (Invalid argument)\n{body}")
    }

    /// A reader that read once and ended, and a close with or without the join before it.
    fn read_then(join_first: bool) -> String {
        let join = format!(
            "101 1.004 {M}, 0x3, 0x7f00, 0x1, 0) = -1 EINVAL\n101 1.005 +++ exited with 0 +++\n\
             100 1.006 {M}, 0x2, 0x7f00, 0x2, 0) = -1 EINVAL\n"
        );
        let close = "100 1.007 close(7) = 0\n";
        let head = "100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0\n\
                    100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101\n\
                    101 1.002 read(7, \"x\", 8) = 1\n";
        if join_first {
            observed(&format!("{head}{join}{close}"))
        } else {
            observed(&format!("{head}{close}{join}"))
        }
    }

    #[test]
    fn a_release_is_judged_by_happens_before_where_the_observer_is_loaded() {
        assert_eq!(checks_of(&read_then(true), LIFECYCLE), Vec::<&str>::new());
        let v = analyse(&read_then(false), LIFECYCLE);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(v[0].check, "close before the receiver is done");
        assert!(
            v[0].detail.contains("nothing orders thread 101's read(7)"),
            "{}",
            v[0].detail
        );
    }

    #[test]
    fn a_thread_whose_calls_come_before_its_clone_returns_is_still_of_its_process() {
        // strace printed the reader's read before the creator's clone3 returned.
        let trace = observed(&format!(
            "100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0\n\
             100 1.001 clone3({{flags=CLONE_VM|CLONE_THREAD}} <unfinished ...>\n\
             101 1.002 read(7, \"x\", 8) = 1\n\
             100 1.003 <... clone3 resumed> => {{parent_tid=[101]}}, 88) = 101\n\
             100 1.007 close(7) = 0\n\
             101 1.008 {M}, 0x7, 0x7f00, 0x1, 0) = -1 EINVAL\n"
        ));
        assert_eq!(
            checks_of(&trace, LIFECYCLE),
            vec!["close before the receiver is done"]
        );
    }

    #[test]
    fn a_message_through_a_pipe_orders_its_sender_before_its_reader() {
        let trace = observed(
            "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7\n\
             100 1.001 pipe2([8, 9], 0) = 0\n\
             100 1.002 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101\n\
             101 1.003 recvfrom(7, \"\", 8, 0, NULL, NULL) = 0\n\
             101 1.004 write(9, \"d\", 1) = 1\n\
             100 1.005 read(8, \"d\", 1) = 1\n\
             100 1.006 close(7) = 0\n",
        );
        assert!(checks_of(&trace, LIFECYCLE).is_empty());
        // Without the message, the same close is not ordered after the receive.
        let racy = trace.replace("101 1.004 write(9, \"d\", 1) = 1\n", "");
        assert_eq!(
            checks_of(&racy, LIFECYCLE),
            vec!["close before the receiver is done"]
        );
    }

    #[test]
    fn probes_and_a_new_image_are_not_uses_after_close() {
        let trace = "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5\n\
                     100 1.001 read(5, \"\", 8) = 0\n\
                     100 1.002 close(5) = 0\n\
                     100 1.003 fcntl(5, F_GETFD) = -1 EBADF (Bad file descriptor)\n\
                     100 1.004 fcntl(5, F_SETFD, FD_CLOEXEC) = -1 EBADF (Bad file descriptor)\n\
                     100 1.005 execve(\"/bin/sh\", [\"sh\"], 0x1) = 0\n\
                     100 1.006 read(5, \"\", 8) = -1 EBADF (Bad file descriptor)\n";
        assert!(
            checks_of(trace, LIFECYCLE).is_empty(),
            "{:#?}",
            analyse(trace, LIFECYCLE)
        );
    }

    #[test]
    fn a_second_close_by_the_holder_is_a_double_close_and_a_sweep_is_not() {
        let head = "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5\n\
                    100 1.001 read(5, \"\", 8) = 0\n\
                    100 1.002 close(5) = 0\n";
        let twice = format!("{head}100 1.003 close(5) = -1 EBADF (Bad file descriptor)\n");
        assert_eq!(checks_of(&twice, LIFECYCLE), vec!["double close"]);
        let sweep = format!(
            "{head}100 1.003 close(4) = -1 EBADF (Bad file descriptor)\n\
             100 1.004 close(5) = -1 EBADF (Bad file descriptor)\n\
             100 1.005 close(6) = -1 EBADF (Bad file descriptor)\n"
        );
        assert!(checks_of(&sweep, LIFECYCLE).is_empty());
        // strace splits a close when another thread's line comes between its start and end.
        let split = sweep.replace(
            "100 1.004 close(5) = -1 EBADF (Bad file descriptor)\n",
            "100 1.004 close(5 <unfinished ...>\n99 1.0045 wait4(100,  <unfinished ...>\n\
             100 1.0046 <... close resumed>) = -1 EBADF (Bad file descriptor)\n",
        );
        assert!(
            checks_of(&split, LIFECYCLE).is_empty(),
            "{:#?}",
            analyse(&split, LIFECYCLE)
        );
    }

    /// A socket a child carries across its execve without close-on-exec into a program that
    /// never uses it, while the parent closes its own copy: a leak. With SOCK_CLOEXEC, or when
    /// the program uses the number (it was told it), or once the child is gone: none.
    #[test]
    fn a_socket_inherited_across_exec_without_close_on_exec_is_a_leak() {
        let trace = |flags: &str, child_use: &str| {
            format!(
                "100 1.000 socketpair(AF_UNIX, {flags}, 0, [3, 4]) = 0\n\
                 100 1.001 clone(child_stack=NULL, flags=SIGCHLD) = 200\n\
                 200 1.002 execve(\"/bin/sleep\", [\"sleep\"], 0x1 /* 1 var */) = 0\n\
                 {child_use}\
                 100 1.003 close(3) = 0\n\
                 200 1.004 nanosleep({{tv_sec=1, tv_nsec=0}}, NULL) = 0\n\
                 200 1.005 exit_group(0) = ?\n\
                 200 1.006 +++ exited with 0 +++\n"
            )
        };
        let leaky = trace("SOCK_STREAM", "");
        assert_eq!(checks_of(&leaky, LIFECYCLE), vec!["leak"], "{leaky}");
        assert!(checks_of(&trace("SOCK_STREAM|SOCK_CLOEXEC", ""), LIFECYCLE).is_empty());
        let told = trace("SOCK_STREAM", "200 1.0025 write(3, \"x\", 1) = 1\n");
        assert!(checks_of(&told, LIFECYCLE).is_empty());
        // Marked close-on-exec after it was made, before the fork.
        let marked = leaky.replace(
            "100 1.001 clone",
            "100 1.0005 fcntl(3, F_SETFD, FD_CLOEXEC) = 0\n100 1.001 clone",
        );
        assert!(checks_of(&marked, LIFECYCLE).is_empty());
        // The child ended before the parent's close (its end printed late by strace).
        let gone = "100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [3, 4]) = 0\n\
                    100 1.001 clone(child_stack=NULL, flags=SIGCHLD) = 200\n\
                    200 1.002 execve(\"/bin/true\", [\"true\"], 0x1 /* 1 var */) = 0\n\
                    200 1.003 exit_group(0) = ?\n\
                    100 1.004 close(3) = 0\n\
                    200 1.005 +++ exited with 0 +++\n";
        assert!(checks_of(gone, LIFECYCLE).is_empty());
    }

    /// Where futex is recorded: a wake that woke someone orders the waker before the wait it
    /// ended (Rust's std locks and condition variables, which skip pthreads).
    #[test]
    fn a_futex_wake_that_woke_orders_its_waiter() {
        let trace = |wake_ret: &str| {
            observed(&format!(
                "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5\n\
                 100 1.001 clone(child_stack=NULL, flags=CLONE_VM|CLONE_THREAD) = 101\n\
                 101 1.002 recvfrom(5, \"x\", 1, 0, NULL, NULL) = 1\n\
                 100 1.003 futex(0x7f10, FUTEX_WAIT_PRIVATE, 0, NULL <unfinished ...>\n\
                 101 1.004 futex(0x7f10, FUTEX_WAKE_PRIVATE, 1) = {wake_ret}\n\
                 100 1.005 <... futex resumed>) = 0\n\
                 100 1.006 close(5) = 0\n"
            ))
        };
        assert!(
            checks_of(&trace("1"), LIFECYCLE).is_empty(),
            "{:#?}",
            analyse(&trace("1"), LIFECYCLE)
        );
        assert_eq!(
            checks_of(&trace("0"), LIFECYCLE),
            vec!["close before the receiver is done"]
        );
    }

    /// An io_uring operation in flight on a descriptor is a use of it: its close before the
    /// completion is a close while in use; after the completion it is not.
    #[test]
    fn a_close_under_an_io_uring_operation_in_flight_is_a_close_while_in_use() {
        let head = "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5\n\
                    100 1.001 io_uring_op(5, IORING_OP_RECV, 0xffff8881) = 0\n";
        let done = "100 1.002 io_uring_done(0xffff8881) = -125\n";
        let close = "100 1.003 close(5) = 0\n";
        let early = format!("{head}{close}{done}");
        let found = analyse(&early, LIFECYCLE);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0]
            .detail
            .contains("io_uring RECV submitted by thread 100 (line 2)"));
        assert!(checks_of(&format!("{head}{done}{close}"), LIFECYCLE).is_empty());
    }

    /// `leaks` for a program without steps: what its image made and left open at its exit,
    /// not standard streams, not what it inherited, not after a kill.
    #[test]
    fn what_a_program_leaves_open_at_its_exit_is_a_leak_when_asked() {
        let run = |end: &str| {
            format!(
                "100 1.000 execve(\"/bin/x\", [\"x\"], 0x1 /* 1 var */) = 0\n\
                 100 1.001 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5\n\
                 100 1.002 dup2(5, 1) = 1\n\
                 100 1.003 read(7, \"\", 8) = 0\n\
                 {end}"
            )
        };
        let exited = run("100 1.004 exit_group(0) = ?\n100 1.005 +++ exited with 0 +++\n");
        let found = analyse(&exited, &[AuditCheck::Leaks]);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!((found[0].check, found[0].fd), ("leak", Some(5)));
        assert!(checks_of(&exited, LIFECYCLE).is_empty());
        let killed = run("100 1.005 +++ killed by SIGKILL +++\n");
        assert!(checks_of(&killed, &[AuditCheck::Leaks]).is_empty());
    }

    #[test]
    fn a_stale_handle_on_a_reused_number_is_a_use_after_close() {
        let trace = |handed: bool| {
            let hand = if handed {
                format!(
                    "100 1.005 {M}, 0x3, 0x10, 0x1, 0) = -1 EINVAL\n101 1.006 {M}, 0x2, 0x10, 0x1, 0) = -1 EINVAL\n"
                )
            } else {
                String::new()
            };
            observed(&format!(
                "100 1.000 openat(AT_FDCWD, \"/a\", O_RDWR) = 3\n\
                 100 1.001 clone3({{flags=CLONE_VM|CLONE_THREAD}} => {{parent_tid=[101]}}, 88) = 101\n\
                 101 1.002 write(3, \"a\", 1) = 1\n\
                 100 1.003 close(3) = 0\n\
                 100 1.004 openat(AT_FDCWD, \"/b\", O_RDWR) = 3\n\
                 {hand}\
                 101 1.007 write(3, \"b\", 1) = 1\n"
            ))
        };
        let v = analyse(&trace(false), LIFECYCLE);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert!(v[0].detail.contains("stale handle"), "{}", v[0].detail);
        assert!(checks_of(&trace(true), LIFECYCLE).is_empty());
    }

    #[test]
    fn the_correct_teardown_order_has_no_violation() {
        assert!(analyse(CORRECT, LIFECYCLE).is_empty());
    }

    #[test]
    fn closing_before_the_receiver_exits_is_flagged() {
        let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 recvfrom(7,  <unfinished ...>
100 1.003 shutdown(7, SHUT_RDWR) = 0
101 1.004 <... recvfrom resumed>\"\", 65536, 0, NULL, NULL) = 0
100 1.005 close(7)                = 0
101 1.006 exit(0)                 = ?
";
        let v = analyse(t, LIFECYCLE);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].check, "close before the receiver is done");
        assert_eq!(v[0].fd, Some(7));
        assert_eq!(v[0].pid, 100);
        assert!(v[0]
            .context
            .iter()
            .any(|(n, l)| *n == 6 && l.contains("close(7)")));
    }

    /// A receiver closes its own descriptor; the close's return reaches the trace only after
    /// another thread was handed the same number for a file (as a CI run showed).
    const SPLIT_CLOSE_THEN_REUSE: &str = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 14
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[102]}, 88) = 102
101 1.002 recvfrom(14, \"x\", 4, 0, NULL, NULL) = 1
101 1.003 close(14 <unfinished ...>
102 1.004 openat(AT_FDCWD, \"/sys/devices/system/cpu/online\", O_RDONLY|O_CLOEXEC <unfinished ...>
102 1.005 <... openat resumed>) = 14
101 1.006 <... close resumed>) = 0
102 1.007 read(14, \"0-1\\n\", 1024) = 4
102 1.008 close(14) = 0
101 1.009 exit(0) = ?
";

    #[test]
    fn a_close_whose_return_comes_after_the_number_is_reused_is_no_violation() {
        let v = analyse(SPLIT_CLOSE_THEN_REUSE, LIFECYCLE);
        assert!(v.is_empty(), "{v:?}");
    }

    #[test]
    fn a_close_split_across_lines_still_counts_as_a_close() {
        // Before, a close whose return came on a later line was never recorded, so a use of
        // the number after it went unseen.
        let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 recvfrom(7, \"x\", 4, 0, NULL, NULL) = 1
100 1.003 close(7 <unfinished ...>
101 1.004 write(1, \"tick\", 4) = 4
100 1.005 <... close resumed>) = 0
101 1.006 recvfrom(7, 0x1, 4, 0, NULL, NULL) = -1 EBADF (Bad file descriptor)
";
        let found = checks_of(t, LIFECYCLE);
        assert_eq!(found, vec!["use after close"]);
    }

    #[test]
    fn closing_while_another_thread_waits_in_poll_on_the_fd_is_flagged() {
        // A caller waiting for its own frame sleeps in poll, not in recvfrom.
        let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone(child_stack=0x1, flags=CLONE_VM|CLONE_THREAD) = 101
101 1.002 poll([{fd=7, events=POLLIN}], 1, 10000 <unfinished ...>
100 1.003 close(7)                = 0
101 1.004 <... poll resumed>)     = 1 ([{fd=7, revents=POLLNVAL}])
101 1.005 exit(0)                 = ?
";
        let found = checks_of(t, LIFECYCLE);
        assert!(found.contains(&"close while in use"), "{found:?}");
        assert_eq!(polled_fds("[{fd=7, events=POLLIN}], 1, 10000"), vec![7]);
        assert_eq!(
            polled_fds("[{fd=7, events=POLLIN}, {fd=9, events=POLLIN}], 2, -1"),
            vec![7, 9]
        );
        assert!(polled_fds("NULL, 0, 10").is_empty());
        assert_eq!(
            selected_fds("8, [3 7], [], NULL, {tv_sec=1, tv_usec=0}"),
            vec![3, 7]
        );
    }

    /// Every shape of "a thread waits for the descriptor another thread releases".
    #[test]
    fn releasing_a_descriptor_any_waiting_thread_is_inside_is_flagged() {
        let head = "\
100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0
100 1.000 pipe2([5, 6], 0) = 0
100 1.000 epoll_create1(EPOLL_CLOEXEC) = 9
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
";
        let cases = [
            ("101 1.002 select(8, [5 7], NULL, NULL, NULL <unfinished ...>\n", "close(7) = 0", "select() on it"),
            ("101 1.002 poll([{fd=5, events=POLLIN}, {fd=7, events=POLLIN}], 2, -1 <unfinished ...>\n", "close(7) = 0", "poll() on it"),
            ("100 1.001 epoll_ctl(9, EPOLL_CTL_ADD, 7, {events=EPOLLIN, data={u32=7, u64=7}}) = 0\n101 1.002 epoll_wait(9,  <unfinished ...>\n", "close(7) = 0", "waiting for it in its epoll set"),
            ("101 1.002 read(7,  <unfinished ...>\n", "dup2(5, 7) = 7", "released (by dup2)"),
            ("101 1.002 recvmsg(7,  <unfinished ...>\n", "close_range(3, 4294967295, 0) = 0", "released (by close_range)"),
            ("101 1.002 splice(5, NULL, 7, NULL, 4096, 0 <unfinished ...>\n", "dup3(8, 7, O_CLOEXEC) = 7", "splice() on it"),
        ];
        for (wait, release, says) in cases {
            let t = format!("{head}{wait}100 1.003 {release}\n");
            let v = analyse(&t, LIFECYCLE);
            assert!(
                v.iter().any(|v| v.check == "close while in use"
                    && v.fd == Some(7)
                    && v.detail.contains(says)),
                "{release} under {wait}: {v:#?}"
            );
        }
    }

    /// Their correct twins: the set forgets what was removed, a dup2 onto a free number or
    /// onto itself releases nothing, close_range with CLOEXEC closes nothing.
    #[test]
    fn releasing_what_no_thread_waits_for_is_not_flagged() {
        let t = "\
100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0
100 1.000 epoll_create1(EPOLL_CLOEXEC) = 9
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
100 1.001 epoll_ctl(9, EPOLL_CTL_ADD, 7, {events=EPOLLIN, data={u32=7, u64=7}}) = 0
101 1.002 epoll_wait(9,  <unfinished ...>
100 1.003 epoll_ctl(9, EPOLL_CTL_DEL, 7, NULL) = 0
100 1.003 close(7) = 0
100 1.004 dup2(8, 8) = 8
100 1.004 dup2(8, 12) = 12
100 1.005 close_range(3, 4294967295, CLOSE_RANGE_CLOEXEC) = 0
101 1.006 <... epoll_wait resumed>[], 64, -1) = 0
";
        assert!(
            analyse(t, LIFECYCLE).is_empty(),
            "{:#?}",
            analyse(t, LIFECYCLE)
        );
    }

    #[test]
    fn a_select_on_a_closed_descriptor_is_a_use_after_close() {
        let t = "\
100 1.000 socketpair(AF_UNIX, SOCK_STREAM, 0, [7, 8]) = 0
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 select(8, [7], NULL, NULL, NULL) = 1 (in [7])
100 1.003 close(7) = 0
101 1.004 select(8, [7], NULL, NULL, NULL) = -1 EBADF (Bad file descriptor)
";
        let found = checks_of(t, LIFECYCLE);
        assert!(found.contains(&"use after close"), "{found:?}");
    }

    #[test]
    fn closing_while_another_thread_is_inside_a_call_on_the_fd_is_flagged() {
        let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone(child_stack=0x1, flags=CLONE_VM|CLONE_THREAD) = 101
101 1.002 recvfrom(7,  <unfinished ...>
100 1.003 close(7)                = 0
101 1.004 <... recvfrom resumed>\"\", 65536, 0, NULL, NULL) = 0
101 1.005 exit(0)                 = ?
";
        let found = checks_of(t, LIFECYCLE);
        assert!(found.contains(&"close while in use"), "{found:?}");
    }

    #[test]
    fn a_call_on_a_closed_fd_by_its_old_user_is_a_use_after_close() {
        let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 recvfrom(7, \"x\", 65536, 0, NULL, NULL) = 1
101 1.003 futex(0x1, FUTEX_WAKE_PRIVATE, 1) = 0
100 1.004 close(7)                = 0
101 1.005 recvfrom(7, 0x1, 65536, 0, NULL, NULL) = -1 EBADF (Bad file descriptor)
";
        assert_eq!(checks_of(t, LIFECYCLE), vec!["use after close"]);
    }

    #[test]
    fn a_reused_number_is_a_new_descriptor_for_whoever_created_it() {
        let t = "\
100 1.000 openat(AT_FDCWD, \"/a\", O_RDONLY) = 3
100 1.001 read(3, \"a\", 10) = 1
100 1.002 close(3)                = 0
100 1.003 openat(AT_FDCWD, \"/b\", O_RDONLY) = 3
100 1.004 read(3, \"b\", 10) = 1
100 1.005 close(3)                = 0
";
        assert!(analyse(t, LIFECYCLE).is_empty());
    }

    #[test]
    fn where_receivers_are_named_a_caller_that_saw_the_end_need_not_exit_first() {
        // wringer's transport: a caller of recv, woken by close's shutdown, reads the end and
        // lives on; the named receiver exits, and only then is the fd closed.
        let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 prctl(PR_SET_NAME, \"wringer-rx-7\") = 0
100 1.003 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[102]}, 88) = 102
101 1.004 poll([{fd=7, events=POLLIN}], 1, -1 <unfinished ...>
102 1.005 poll([{fd=7, events=POLLIN}], 1, 4000 <unfinished ...>
100 1.006 shutdown(7, SHUT_RDWR) = 0
101 1.007 <... poll resumed>)     = 1 ([{fd=7, revents=POLLIN|POLLHUP}])
102 1.008 <... poll resumed>)     = 1 ([{fd=7, revents=POLLIN|POLLHUP}])
102 1.009 recvfrom(7, \"\", 8192, MSG_DONTWAIT, NULL, NULL) = 0
101 1.010 exit(0 <unfinished ...>
101 1.010 <... exit resumed>)     = ?
100 1.011 close(7)                = 0
101 1.011 +++ exited with 0 +++
102 1.012 exit(0)                 = ?
";
        let v = analyse(t, LIFECYCLE);
        assert!(v.is_empty(), "{v:?}");
        // The same, but the fd closed before the named receiver exits: flagged.
        let early = t.replace(
            "101 1.010 exit(0 <unfinished ...>\n101 1.010 <... exit resumed>)     = ?\n100 1.011 close(7)                = 0\n",
            "100 1.011 close(7)                = 0\n101 1.010 exit(0 <unfinished ...>\n101 1.010 <... exit resumed>)     = ?\n",
        );
        let v = analyse(&early, LIFECYCLE);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].check, "close before the receiver is done");
        assert!(v[0].detail.contains("thread 101"), "{v:?}");
    }

    #[test]
    fn a_thread_waiting_in_poll_for_one_fd_is_its_receiver() {
        let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 poll([{fd=7, events=POLLIN}], 1, -1 <unfinished ...>
100 1.003 shutdown(7, SHUT_RDWR) = 0
101 1.004 <... poll resumed>)     = 1 ([{fd=7, revents=POLLIN|POLLHUP}])
100 1.005 close(7)                = 0
101 1.006 exit(0)                 = ?
";
        let v = analyse(t, LIFECYCLE);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].check, "close before the receiver is done");
    }

    #[test]
    fn a_thread_that_handed_its_socket_over_is_not_its_receiver() {
        // A handshake thread reads the hello, answers, starts the connection's receiver and
        // moves on; the connection is then torn down correctly while it still lives.
        let t = "\
100 1.000 accept4(3, {sa_family=AF_INET}, [16], SOCK_CLOEXEC) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[102]}, 88) = 102
102 1.002 recvfrom(7, \"hello\", 44, 0, NULL, NULL) = 44
102 1.003 sendto(7, \"ack\", 20, MSG_NOSIGNAL, NULL, 0) = 20
102 1.004 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[103]}, 88) = 103
103 1.005 recvfrom(7,  <unfinished ...>
100 1.006 shutdown(7, SHUT_RDWR) = 0
103 1.007 <... recvfrom resumed>\"\", 65536, 0, NULL, NULL) = 0
103 1.008 exit(0)                 = ?
100 1.009 close(7)                = 0
102 1.010 exit(0)                 = ?
";
        assert!(
            analyse(t, LIFECYCLE).is_empty(),
            "{:?}",
            analyse(t, LIFECYCLE)
        );
    }

    #[test]
    fn separate_processes_never_share_descriptors() {
        let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|SIGCHLD) = 200
200 1.002 recvfrom(7,  <unfinished ...>
100 1.003 close(7)                = 0
";
        assert!(analyse(t, LIFECYCLE).is_empty());
    }

    #[test]
    fn checks_that_were_not_asked_for_report_nothing() {
        let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
101 1.002 recvfrom(7,  <unfinished ...>
100 1.003 close(7)                = 0
";
        assert!(analyse(t, &[AuditCheck::Leaks]).is_empty());
    }

    #[test]
    fn a_step_that_leaves_an_fd_and_a_thread_behind_leaks_both() {
        let t = "\
100 1.000 write(5, \"{\\\"type\\\":\\\"step-start\\\",\\\"step\\\":0}\\n\", 31) = 31
100 1.001 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.002 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 8
100 1.003 close(8)                = 0
100 1.004 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
100 1.005 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[102]}, 88) = 102
102 1.006 exit(0)                 = ?
100 1.007 write(5, \"{\\\"type\\\":\\\"step-result\\\",\\\"step\\\":0}\\n\", 32) = 32
";
        let v = analyse(t, &[AuditCheck::Leaks]);
        let details: Vec<&str> = v.iter().map(|v| v.detail.as_str()).collect();
        assert_eq!(v.len(), 2, "{details:?}");
        assert!(details[0].starts_with("fd 7 created in the step"));
        assert!(details[1].starts_with("thread 101 started in the step"));
    }

    #[test]
    fn what_existed_before_the_step_is_not_its_leak() {
        let t = "\
100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
100 1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[101]}, 88) = 101
100 1.002 write(5, \"step-start\", 31) = 31
100 1.003 write(5, \"step-result\", 32) = 32
";
        assert!(analyse(t, &[AuditCheck::Leaks]).is_empty());
    }

    #[test]
    fn a_blocking_call_without_a_timeout_at_the_end_is_an_unbounded_wait() {
        let t = "\
100 1.000 futex(0x7f, FUTEX_WAIT_PRIVATE, 2, NULL <unfinished ...>
101 1.001 futex(0x7e, FUTEX_WAIT_BITSET_PRIVATE|FUTEX_CLOCK_REALTIME, 0, {tv_sec=1, tv_nsec=0}, FUTEX_BITSET_MATCH_ANY <unfinished ...>
102 1.002 poll([{fd=3, events=POLLIN}], 1, -1 <unfinished ...>
103 1.003 poll([{fd=4, events=POLLIN}], 1, 500 <unfinished ...>
";
        let v = analyse(t, &[AuditCheck::UnboundedWaits]);
        let threads: Vec<u32> = v.iter().map(|v| v.pid).collect();
        assert_eq!(threads, vec![100, 102], "{v:?}");
    }

    #[test]
    fn pipes_and_dups_make_descriptors_too() {
        let t = "\
100 1.000 pipe2([3, 4], O_CLOEXEC) = 0
100 1.001 dup(3)                  = 5
100 1.002 read(5, \"\", 1) = 0
100 1.003 close(5)                = 0
100 1.004 close(4)                = 0
100 1.005 close(3)                = 0
";
        assert!(analyse(t, LIFECYCLE).is_empty());
    }

    #[test]
    fn a_number_reused_by_any_descriptor_maker_is_a_new_descriptor() {
        // Gloo closes a probe socket, then epoll_create (not epoll_create1) reuses its number.
        for maker in MAKES_ONE_FD {
            let t = format!(
                "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_TCP) = 3\n\
                 100 1.000 bind(3, {{sa_family=AF_INET}}, 16) = 0\n\
                 100 1.001 close(3)                = 0\n\
                 100 1.002 {maker}(1)                = 3\n\
                 100 1.003 epoll_ctl(3, EPOLL_CTL_ADD, 4, {{events=EPOLLIN}}) = 0\n"
            );
            assert!(
                analyse(&t, LIFECYCLE).is_empty(),
                "{maker}: {:?}",
                checks_of(&t, LIFECYCLE)
            );
        }
        // Without the maker, the same use is one after close.
        let t = "100 1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_TCP) = 3\n\
                 100 1.000 bind(3, {sa_family=AF_INET}, 16) = 0\n\
                 100 1.001 close(3)                = 0\n\
                 100 1.003 epoll_ctl(3, EPOLL_CTL_ADD, 4, {events=EPOLLIN}) = 0\n";
        assert_eq!(checks_of(t, LIFECYCLE), vec!["use after close"]);
    }

    #[test]
    fn strace_traces_every_descriptor_maker_and_skips_those_an_architecture_lacks() {
        let filter = trace_filter();
        for maker in MAKES_ONE_FD.iter().chain(MAKES_TWO_FDS) {
            assert!(
                filter.contains(&format!(",?{maker}")),
                "{maker} is not traced"
            );
        }
    }

    #[test]
    fn short_pids_padded_with_spaces_parse_the_same() {
        let padded = CORRECT.replace("100 ", "100  ").replace("101 ", "101   ");
        assert!(analyse(&padded, LIFECYCLE).is_empty());
        let broken = "\
7868  1.000 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 7
7868  1.001 clone3({flags=CLONE_VM|CLONE_THREAD} => {parent_tid=[7869]}, 88) = 7869
7869  1.002 recvfrom(7,  <unfinished ...>
7868  1.003 close(7)                = 0
";
        assert_eq!(checks_of(broken, LIFECYCLE)[0], "close while in use");
    }

    #[test]
    fn lines_strace_did_not_write_as_calls_are_ignored() {
        let t = "\
garbage
100 1.000 --- SIGCHLD {si_signo=SIGCHLD} ---
100 1.001 +++ killed by SIGKILL +++
not-a-pid 1.0 close(3) = 0
";
        assert!(analyse(t, LIFECYCLE).is_empty());
    }

    #[test]
    fn the_strace_command_carries_seeded_perturbations() {
        let p = Perturb {
            syscall: "recvfrom".into(),
            delay_enter: None,
            delay_exit: Some(HumanDuration(std::time::Duration::from_micros(200))),
            probability: Some(0.25),
            when: None,
        };
        let a = strace_command(&[], std::slice::from_ref(&p), 7, Path::new("/tmp/t"));
        let b = strace_command(&[], std::slice::from_ref(&p), 7, Path::new("/tmp/t"));
        assert_eq!(a, b, "the same seed gives the same perturbation");
        let inject = a.iter().find(|x| x.starts_with("--inject=")).unwrap();
        assert!(
            inject.starts_with("--inject=recvfrom:delay_exit=200:when="),
            "{inject}"
        );
        assert!(inject.ends_with("+4"), "every 4th call: {inject}");
        assert_eq!(&a[a.len() - 3..], ["-o", "/tmp/t", "--"]);
        let always = Perturb {
            probability: None,
            ..p.clone()
        };
        let c = strace_command(&[], &[always], 7, Path::new("/tmp/t"));
        assert!(
            c.contains(&"--inject=recvfrom:delay_exit=200".to_string()),
            "{c:?}"
        );
        // The exact form replays the same calls without the seed.
        let exact = exact_perturbations(std::slice::from_ref(&p), 7);
        assert_eq!(exact[0].probability, None);
        let d = strace_command(&[], &exact, 99, Path::new("/tmp/t"));
        assert_eq!(a, d, "exact perturbations replay without the seed");
    }
}
