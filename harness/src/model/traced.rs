//! One traced syscall as the lifecycle audit reads it, whichever recorder wrote it: strace's
//! text is read into it (`orchestration::audit::strace_line`), and the eBPF recorder decodes
//! its kernel events straight into it (`hosts::syscall_trace::decode`), so the checker parses
//! no text of its own recorder. What a syscall does by its name alone (which descriptors it
//! uses, makes, waits on or releases) is here too, for both.

pub mod codec;

use super::sync_marker::SyncMarker;

/// One line of a trace: its number in the trace's text (0-based), the thread, the event.
#[derive(Clone, Debug, PartialEq)]
pub struct Traced {
    pub line: usize,
    pub tid: u32,
    pub event: Event,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A call that completed on this line.
    Call(Call),
    /// A call that started and did not finish yet: what it was given (no result, nothing made).
    Started(Call),
    /// The end of a call started earlier on this thread: the whole call, its result included.
    Resumed(Call),
    /// The thread ended.
    Exited,
    /// Something else about the thread (strace's signal lines).
    Other,
}

/// A syscall and what it does to descriptors, threads and the audit's bookkeeping.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Call {
    pub name: String,
    pub ret: Ret,
    /// The descriptors it acts on or waits for directly (none for a probe: `fcntl` F_GETFD and
    /// kin ask about a number without using it).
    pub fds: Vec<i32>,
    /// The descriptors it made (known once it returned).
    pub made: Vec<i32>,
    /// What it made is close-on-exec.
    pub cloexec: bool,
    /// It may block with no timeout.
    pub unbounded: bool,
    /// A clone that made a thread of the same process (`CLONE_THREAD`), not a process.
    pub thread: bool,
    pub operand: Operand,
}

/// What a call returned.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Ret {
    /// Still in progress, or the recorder could not say (`?`).
    #[default]
    Unknown,
    Value(i64),
    /// Failed with this errno (`EBADF`).
    Error(String),
}

impl Ret {
    pub fn value(&self) -> Option<i64> {
        match self {
            Ret::Value(v) => Some(*v),
            _ => None,
        }
    }

    pub fn is_error(&self, errno: &str) -> bool {
        matches!(self, Ret::Error(e) if e == errno)
    }

    /// It failed (an errno, or a negative number a recorder printed as one).
    pub fn failed(&self) -> bool {
        matches!(self, Ret::Error(_)) || self.value().is_some_and(|v| v < 0)
    }
}

/// The operands the checker reads beyond the descriptors, by the kind of call.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Operand {
    #[default]
    None,
    /// A marker of the sync observer, the recorder or the harness (`prctl(SYNC_MARKER, …)`).
    Marker(SyncMarker),
    /// The thread names itself the receiver of this descriptor (`wringer-rx-FD`).
    Receiver(i32),
    Futex {
        addr: u64,
        op: FutexOp,
    },
    /// `execve`, with the program's path where the recorder read it.
    Exec {
        path: Option<String>,
    },
    /// `fcntl(fd, F_SETFD, …)`: close-on-exec on or off.
    SetCloexec {
        fd: i32,
        on: bool,
    },
    EpollCtl {
        epfd: i32,
        op: EpollOp,
        fd: i32,
    },
    Close {
        fd: i64,
    },
    CloseRange {
        first: i64,
        last: i64,
        /// Only marks them close-on-exec (`CLOSE_RANGE_CLOEXEC`).
        cloexec: bool,
    },
    /// `dup2` and `dup3`.
    Dup {
        old: i64,
        new: i64,
    },
    /// An io_uring operation took descriptor `fd` (opcode as liburing names it, without
    /// `IORING_OP_`), for request `req`.
    UringOp {
        fd: i32,
        op: String,
        req: u64,
    },
    /// The io_uring request `req` completed.
    UringDone {
        req: u64,
    },
    /// A write carrying the rank's step report to the coordinator.
    Step(StepMark),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FutexOp {
    /// `FUTEX_WAIT` and kin: a return of 0 means a wake ended it.
    Wait,
    /// `FUTEX_WAKE` and kin: a positive return woke someone.
    Wake,
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpollOp {
    Add,
    Del,
    Other,
}

/// Where a rank's step report bounds its step (for `leaks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepMark {
    Start,
    End,
}

impl StepMark {
    /// The step report in bytes a rank wrote to its coordinator, if these are one.
    pub fn in_bytes(b: &[u8]) -> Option<StepMark> {
        let has = |w: &[u8]| b.windows(w.len()).any(|x| x == w);
        if has(b"step-start") {
            Some(StepMark::Start)
        } else if has(b"step-result") || has(b"step-error") {
            Some(StepMark::End)
        } else {
            None
        }
    }
}

impl Call {
    /// The thread or process a clone made, and whether it is a thread.
    pub fn cloned(&self) -> Option<(u32, bool)> {
        if !matches!(self.name.as_str(), "clone" | "clone3" | "vfork" | "fork") {
            return None;
        }
        let child = self.ret.value().filter(|c| *c > 0)?;
        Some((child as u32, self.thread))
    }

    pub fn marker(&self) -> Option<&SyncMarker> {
        match &self.operand {
            Operand::Marker(m) => Some(m),
            _ => None,
        }
    }
}

/// The name wringer's transport gives a connection's receiver thread, before its fd.
pub const RECEIVER_NAME: &str = "wringer-rx-";

/// The fd whose receiver a thread's name says it is (`wringer-rx-7`).
pub fn receiver_named(name: &str) -> Option<i32> {
    name.strip_prefix(RECEIVER_NAME)?.parse().ok()
}

/// Every syscall whose result is one new descriptor. A creator the audit missed would make
/// the next use of a reused number look like a use after close (Gloo's `epoll_create` did).
pub const MAKES_ONE_FD: &[&str] = &[
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
pub const MAKES_TWO_FDS: &[&str] = &["pipe", "pipe2", "socketpair"];

/// Calls in which a thread waits for what a descriptor brings: its receiver, in the sense of
/// the happens-before check of a release.
pub fn waits_on(name: &str) -> bool {
    receives(name)
        || waits_on_epoll(name)
        || matches!(
            name,
            "poll" | "ppoll" | "select" | "pselect6" | "accept" | "accept4"
        )
}

/// Calls that put a message into a kernel channel (a pipe, socket pair or eventfd).
pub fn sends(name: &str) -> bool {
    matches!(
        name,
        "write" | "writev" | "pwrite64" | "sendto" | "sendmsg" | "sendmmsg"
    )
}

pub fn waits_on_epoll(name: &str) -> bool {
    matches!(name, "epoll_wait" | "epoll_pwait" | "epoll_pwait2")
}

/// Calls whose first argument is the descriptor they act on.
pub fn takes_fd(name: &str) -> bool {
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

/// Calls that release a descriptor.
pub fn releases(name: &str) -> bool {
    matches!(name, "close" | "close_range" | "dup2" | "dup3")
}

pub fn receives(name: &str) -> bool {
    matches!(name, "read" | "readv" | "recvfrom" | "recvmsg" | "recvmmsg")
}

/// The kind of descriptor whose peer sees an end only when every copy of it is closed.
pub fn conduit_of(name: &str) -> Option<&'static str> {
    match name {
        "socket" | "accept" | "accept4" | "socketpair" => Some("socket"),
        "pipe" | "pipe2" => Some("pipe"),
        // (its write end: the second of the two)
        _ => None,
    }
}

/// Calls that are a wait in themselves, whatever descriptor they are on: a read of an empty
/// socket, a write to a full pipe, a parent's wait for a child.
pub fn blocks_until_a_peer_acts(name: &str) -> bool {
    matches!(
        name,
        "recvfrom"
            | "recvmsg"
            | "read"
            | "readv"
            | "accept"
            | "accept4"
            | "write"
            | "writev"
            | "sendto"
            | "sendmsg"
            | "sendmmsg"
            | "connect"
            | "pause"
            | "rt_sigsuspend"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_say_what_they_are() {
        assert!(Ret::Error("EBADF".into()).is_error("EBADF"));
        assert!(Ret::Error("EBADF".into()).failed());
        assert!(Ret::Value(-5).failed());
        assert!(!Ret::Value(0).failed() && !Ret::Unknown.failed());
        assert_eq!(Ret::Value(3).value(), Some(3));
    }

    #[test]
    fn step_reports_are_found_in_written_bytes() {
        assert_eq!(
            StepMark::in_bytes(b"{\"t\":\"step-start\"}"),
            Some(StepMark::Start)
        );
        assert_eq!(StepMark::in_bytes(b"x step-error y"), Some(StepMark::End));
        assert_eq!(StepMark::in_bytes(b"step-resul"), None);
    }
}
