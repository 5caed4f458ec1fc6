//! What each syscall does to descriptors and threads, read from its name and its argument
//! text as the recorders print it: which descriptors it uses, makes or releases, whether it
//! waits, sends or only probes.

/// The name wringer's transport gives a connection's receiver thread, before its fd.
pub(super) const RECEIVER_NAME: &str = "wringer-rx-";

/// Every syscall whose result is one new descriptor. A creator the audit missed would make
/// the next use of a reused number look like a use after close (Gloo's `epoll_create` did).
pub(super) const MAKES_ONE_FD: &[&str] = &[
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
pub(super) const MAKES_TWO_FDS: &[&str] = &["pipe", "pipe2", "socketpair"];

/// The fd whose receiver a thread names itself for (`prctl(PR_SET_NAME, "wringer-rx-7")`).
pub(super) fn named_receiver(args: &str) -> Option<i32> {
    let name = args.strip_prefix("PR_SET_NAME, \"")?.split('"').next()?;
    name.strip_prefix(RECEIVER_NAME)?.parse().ok()
}

/// The descriptors a syscall acts on: its first argument for most, every one a `poll` or
/// `select` waits for, both ends of a `splice`-like copy. A thread asleep in a `poll` on
/// several is inside a call on each of them, as much as one asleep in `recvfrom`.
pub(super) fn fds_of(name: &str, args: &str) -> Vec<i32> {
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
pub(super) fn polled_fds(args: &str) -> Vec<i32> {
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
pub(super) fn selected_fds(args: &str) -> Vec<i32> {
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
pub(super) fn is_probe(name: &str, args: &str) -> bool {
    name == "fcntl"
        && ["F_GETFD", "F_SETFD", "F_GETFL", "F_SETFL"]
            .iter()
            .any(|op| args.contains(op))
}

/// Calls in which a thread waits for what a descriptor brings: its receiver, in the sense of
/// the happens-before check of a release.
pub(super) fn waits_on(name: &str) -> bool {
    receives(name)
        || waits_on_epoll(name)
        || matches!(
            name,
            "poll" | "ppoll" | "select" | "pselect6" | "accept" | "accept4"
        )
}

/// Calls that put a message into a kernel channel (a pipe, socket pair or eventfd).
pub(super) fn sends(name: &str) -> bool {
    matches!(
        name,
        "write" | "writev" | "pwrite64" | "sendto" | "sendmsg" | "sendmmsg"
    )
}

pub(super) fn waits_on_epoll(name: &str) -> bool {
    matches!(name, "epoll_wait" | "epoll_pwait" | "epoll_pwait2")
}

pub(super) fn takes_fd(name: &str) -> bool {
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
pub(super) fn returns_args(name: &str) -> bool {
    MAKES_TWO_FDS.contains(&name) || matches!(name, "write" | "sendto")
}

/// Calls that release a descriptor.
pub(super) fn releases(name: &str) -> bool {
    matches!(name, "close" | "close_range" | "dup2" | "dup3")
}

pub(super) fn receives(name: &str) -> bool {
    matches!(name, "read" | "readv" | "recvfrom" | "recvmsg" | "recvmmsg")
}

/// Syscalls whose result is a new fd (or two, for pipes and socket pairs).
pub(super) fn creates_fds(name: &str, args: &str, ret: &str) -> Vec<i32> {
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
pub(super) fn uring_request(name: &str, args: &str) -> Option<u64> {
    if !matches!(name, "io_uring_op" | "io_uring_done") {
        return None;
    }
    let args = args.rsplit_once(") = ").map_or(args, |(a, _)| a);
    let last = args.rsplit(',').next()?;
    u64::from_str_radix(last.trim().strip_prefix("0x")?, 16).ok()
}

/// Whether a descriptor maker made its descriptor close-on-exec (`SOCK_CLOEXEC`, `O_CLOEXEC`,
/// `EFD_CLOEXEC`, `F_DUPFD_CLOEXEC` and kin; pidfds and io_uring instances always are).
pub(super) fn born_cloexec(name: &str, args: &str) -> bool {
    match name {
        "pidfd_open" | "pidfd_getfd" | "io_uring_setup" => true,
        "dup" | "dup2" => false,
        "fcntl" => args.contains("F_DUPFD_CLOEXEC"),
        _ => args.contains("CLOEXEC"),
    }
}

/// The kind of descriptor whose peer sees an end only when every copy of it is closed.
pub(super) fn conduit_of(name: &str) -> Option<&'static str> {
    match name {
        "socket" | "accept" | "accept4" | "socketpair" => Some("socket"),
        "pipe" | "pipe2" => Some("pipe"),
        // (its write end: the second of the two)
        _ => None,
    }
}

/// The thread a clone made, when it is a thread (shares the process) rather than a process.
pub(super) fn cloned_thread(name: &str, args: &str, ret: &str) -> Option<(u32, bool)> {
    if !matches!(name, "clone" | "clone3" | "vfork" | "fork") {
        return None;
    }
    let child: u32 = ret.split_whitespace().next()?.parse().ok()?;
    Some((child, args.contains("CLONE_THREAD")))
}

/// The channel a descriptor's `shutdown` releases into and the read it ends (EOF) acquires.
pub(super) fn shutdown_channel(fd: i32) -> u64 {
    (1 << 63) | fd as u32 as u64
}

/// A blocking call that was given no timeout.
pub(super) fn unbounded(name: &str, args: &str) -> bool {
    match name {
        "futex" => args.contains("FUTEX_WAIT") && args.trim_end().ends_with("NULL"),
        "poll" | "ppoll" => args.contains(", -1") || args.ends_with("NULL"),
        "epoll_wait" | "epoll_pwait" => args.contains(", -1"),
        "select" | "pselect6" => args.split(", ").nth(4) == Some("NULL"),
        "recvmmsg" => args.trim_end().ends_with("NULL"),
        // A parent waiting for a child that never ends, without WNOHANG.
        "wait4" | "waitid" => !args.contains("WNOHANG"),
        // Reads and writes that block until a peer acts (a full pipe, an empty socket).
        "recvfrom" | "recvmsg" | "read" | "readv" | "accept" | "accept4" | "write" | "writev"
        | "sendto" | "sendmsg" | "sendmmsg" | "connect" | "pause" | "rt_sigsuspend" => true,
        _ => false,
    }
}
