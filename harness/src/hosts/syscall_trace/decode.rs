//! The kernel side's events decoded straight into the checker's typed calls, from their
//! numbers: no text is written for the checker to read back (`render` writes the text a
//! person reads, line for line beside these). Pure: events in, calls out.

use crate::model::sync_marker::{self, SYNC_MARKER};
use crate::model::traced::*;

use super::render::{cloexec_flag, in_set, trim_nul, Event};
use super::table::Syscall;

/// The call `enter` started (and `exit` ended, when it did).
pub fn call(s: &Syscall, enter: &Event, exit: Option<&Event>) -> Call {
    let ret = exit.map_or(Ret::Unknown, |e| result(e.ret));
    let name = s.name;
    let made = exit.map_or_else(Vec::new, |e| made(s, enter, e));
    Call {
        name: name.to_string(),
        ret,
        fds: fds(s, enter),
        made,
        cloexec: cloexec(name, enter),
        unbounded: unbounded(name, enter),
        thread: clone_flags(name, enter) & libc::CLONE_THREAD as u64 != 0,
        operand: operand(s, enter, exit),
    }
}

/// A result: a value, or an errno (the kernel returns -errno).
pub fn result(ret: i64) -> Ret {
    if (-4095..0).contains(&ret) {
        Ret::Error(errno_name((-ret) as i32))
    } else {
        Ret::Value(ret)
    }
}

/// The name the checker reads an errno by (`EBADF`), or `E<n>` for the rest.
pub fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::EINTR => "EINTR",
        libc::EINPROGRESS => "EINPROGRESS",
        libc::ECONNRESET => "ECONNRESET",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EPIPE => "EPIPE",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ENOTCONN => "ENOTCONN",
        libc::ENOENT => "ENOENT",
        libc::EINVAL => "EINVAL",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::ECHILD => "ECHILD",
        libc::ENOSYS => "ENOSYS",
        libc::EPERM => "EPERM",
        libc::EEXIST => "EEXIST",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::ENOTTY => "ENOTTY",
        libc::ERESTART => "ERESTARTSYS",
        _ => return format!("E{e}"),
    };
    name.to_string()
}

/// An argument as the descriptor it is, when it is one.
fn fd_arg(e: &Event, i: usize) -> Option<i32> {
    Some(e.args[i] as i64 as i32).filter(|fd| *fd >= 0)
}

/// The descriptors a call acts on or waits for (none for a probe).
fn fds(s: &Syscall, e: &Event) -> Vec<i32> {
    match s.name {
        "fcntl" if is_probe(e) => vec![],
        "poll" | "ppoll" => e.captures[0]
            .chunks_exact(8)
            .map(|c| i32::from_ne_bytes(c[0..4].try_into().expect("4 bytes")))
            .filter(|fd| *fd >= 0)
            .collect(),
        "select" | "pselect6" => {
            let n = e.args[0] as usize;
            let mut fds: Vec<i32> = (0..2)
                .filter(|k| e.args[1 + k] != 0)
                .flat_map(|k| in_set(&e.captures[k], n))
                .collect();
            fds.sort_unstable();
            fds.dedup();
            fds
        }
        "sendfile" | "tee" => [fd_arg(e, 0), fd_arg(e, 1)].into_iter().flatten().collect(),
        "splice" | "copy_file_range" => {
            [fd_arg(e, 0), fd_arg(e, 2)].into_iter().flatten().collect()
        }
        n if takes_fd(n) => fd_arg(e, 0).into_iter().collect(),
        _ => vec![],
    }
}

/// `fcntl` asking about a number, or setting its flags, without using what it names.
fn is_probe(e: &Event) -> bool {
    matches!(
        e.args[1] as i32,
        libc::F_GETFD | libc::F_SETFD | libc::F_GETFL | libc::F_SETFL
    )
}

/// What a call that returned made: its result, or the pair it wrote (pipes, socket pairs).
fn made(s: &Syscall, enter: &Event, exit: &Event) -> Vec<i32> {
    let name = s.name;
    let one = || Some(exit.ret as i32).filter(|fd| *fd >= 0 && exit.ret >= 0);
    let dupfd =
        name == "fcntl" && matches!(enter.args[1] as i32, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC);
    if MAKES_ONE_FD.contains(&name) || dupfd {
        return one().into_iter().collect();
    }
    if MAKES_TWO_FDS.contains(&name) && exit.ret == 0 {
        let pair = returned(s, exit, 0);
        if let Some(b) = pair.filter(|b| b.len() >= 8) {
            return vec![
                i32::from_ne_bytes(b[0..4].try_into().expect("4 bytes")),
                i32::from_ne_bytes(b[4..8].try_into().expect("4 bytes")),
            ];
        }
    }
    vec![]
}

/// The bytes capture `i` read at the call's return, where it reads them then.
fn returned<'a>(s: &Syscall, exit: &'a Event, i: usize) -> Option<&'a [u8]> {
    let c = s.captures[i]?;
    (c.at_exit && !exit.captures[i].is_empty()).then_some(exit.captures[i].as_slice())
}

/// Whether what a call made is close-on-exec: the flag the renderer spells out, where the call
/// takes one.
fn cloexec(name: &str, e: &Event) -> bool {
    match name {
        "pidfd_open" | "pidfd_getfd" | "io_uring_setup" => true,
        "fcntl" => e.args[1] as i32 == libc::F_DUPFD_CLOEXEC,
        _ => cloexec_flag(name, e).is_some(),
    }
}

/// Whether a call may block with no timeout.
fn unbounded(name: &str, e: &Event) -> bool {
    let a = |i: usize| e.args[i];
    match name {
        "futex" => a(1) as i32 & 0x7f == libc::FUTEX_WAIT && a(3) == 0,
        "poll" => (a(2) as i64 as i32) < 0,
        "ppoll" | "epoll_pwait2" => a(if name == "ppoll" { 2 } else { 3 }) == 0,
        "epoll_wait" | "epoll_pwait" => (a(3) as i64 as i32) < 0,
        "select" | "pselect6" | "recvmmsg" => a(4) == 0,
        "wait4" => a(2) & libc::WNOHANG as u64 == 0,
        "waitid" => a(3) & libc::WNOHANG as u64 == 0,
        _ => blocks_until_a_peer_acts(name),
    }
}

/// A clone's flags (clone3 carries them in its argument struct).
fn clone_flags(name: &str, e: &Event) -> u64 {
    match name {
        "clone" => e.args[0],
        "clone3" => e.captures[0]
            .get(..8)
            .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes"))),
        _ => 0,
    }
}

fn operand(s: &Syscall, enter: &Event, exit: Option<&Event>) -> Operand {
    let a = |i: usize| enter.args[i];
    let int = |i: usize| a(i) as i64 as i32 as i64;
    match s.name {
        "prctl" if a(0) == SYNC_MARKER => {
            sync_marker::from_words(a(1), a(2), a(3), a(4)).map_or(Operand::None, Operand::Marker)
        }
        "prctl" if a(0) == libc::PR_SET_NAME as u64 => {
            receiver_named(&String::from_utf8_lossy(trim_nul(&enter.captures[0])))
                .map_or(Operand::None, Operand::Receiver)
        }
        "futex" => {
            let op = match a(1) as i32 & 0x7f {
                libc::FUTEX_WAIT | libc::FUTEX_WAIT_BITSET | libc::FUTEX_WAIT_REQUEUE_PI => {
                    FutexOp::Wait
                }
                libc::FUTEX_WAKE | libc::FUTEX_WAKE_BITSET | libc::FUTEX_WAKE_OP => FutexOp::Wake,
                _ => FutexOp::Other,
            };
            Operand::Futex { addr: a(0), op }
        }
        "execve" => Operand::Exec {
            path: Some(String::from_utf8_lossy(trim_nul(&enter.captures[0])).into_owned())
                .filter(|p| !p.is_empty()),
        },
        "fcntl" if a(1) as i32 == libc::F_SETFD => Operand::SetCloexec {
            fd: a(0) as i64 as i32,
            on: a(2) & libc::FD_CLOEXEC as u64 != 0,
        },
        "epoll_ctl" => Operand::EpollCtl {
            epfd: a(0) as i64 as i32,
            op: match a(1) as i32 {
                libc::EPOLL_CTL_ADD => EpollOp::Add,
                libc::EPOLL_CTL_DEL => EpollOp::Del,
                _ => EpollOp::Other,
            },
            fd: a(2) as i64 as i32,
        },
        "close" => Operand::Close { fd: int(0) },
        "close_range" => Operand::CloseRange {
            first: a(0) as u32 as i64,
            last: a(1) as u32 as i64,
            cloexec: a(2) & libc::CLOSE_RANGE_CLOEXEC as u64 != 0,
        },
        "dup2" | "dup3" => Operand::Dup {
            old: int(0),
            new: int(1),
        },
        "write" | "sendto" => exit
            .and_then(|e| returned(s, e, 0))
            .and_then(StepMark::in_bytes)
            .map_or(Operand::None, Operand::Step),
        _ => Operand::None,
    }
}

#[cfg(test)]
mod tests;
