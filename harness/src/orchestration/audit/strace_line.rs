//! strace's text (`-f -ttt`) read into the typed events the checker reads: each line's
//! arguments and result are read here, once. The eBPF recorder decodes its events into the
//! same [`Traced`] without any text (`hosts::syscall_trace::decode`).

use std::collections::BTreeMap;

use crate::model::sync_marker;
use crate::model::traced::*;

/// Every event of a trace, in order, each with its line number.
pub(super) fn read(text: &str) -> Vec<Traced> {
    let mut started: BTreeMap<u32, &str> = BTreeMap::new();
    let mut out = Vec::new();
    for (line, text) in text.lines().enumerate() {
        let Some((tid, ev)) = parse_line(text) else {
            continue;
        };
        let event = match ev {
            Text::Call { name, args, ret } => Event::Call(call(name, args, ret)),
            Text::Started { name, args } => {
                started.insert(tid, args);
                Event::Started(call(name, args, ""))
            }
            Text::Resumed { name, args, ret } => {
                // strace prints only the rest at the return (`[3, 4]) = 0`), after what it
                // printed at the start; where a call's operands are known only then (the fds
                // a pipe made, the bytes a write sent) both are read.
                let before = started.remove(&tid).unwrap_or("");
                let joined;
                let args = if !args.is_empty() && returns_args(name) {
                    joined = format!("{before}{args}");
                    &joined
                } else {
                    before
                };
                Event::Resumed(call(name, args, ret))
            }
            Text::Exited => {
                started.remove(&tid);
                Event::Exited
            }
            Text::Other => Event::Other,
        };
        out.push(Traced { line, tid, event });
    }
    out
}

/// One line of an `strace -f -ttt` trace, as text.
#[derive(Debug, PartialEq)]
enum Text<'a> {
    Call {
        name: &'a str,
        args: &'a str,
        ret: &'a str,
    },
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
    Exited,
    Other,
}

fn parse_line(line: &str) -> Option<(u32, Text<'_>)> {
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
        return Some((tid, Text::Exited));
    }
    if let Some(r) = rest.strip_prefix("<... ") {
        let (name, after) = r.split_once(" resumed>")?;
        let args = after.rfind(") = ").map_or("", |i| &after[..i]);
        return Some((
            tid,
            Text::Resumed {
                name,
                args,
                ret: result_of(after),
            },
        ));
    }
    let open = rest.find('(')?;
    let name = &rest[..open];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Some((tid, Text::Other));
    }
    let body = &rest[open + 1..];
    if let Some(args) = body.strip_suffix(" <unfinished ...>") {
        return Some((tid, Text::Started { name, args }));
    }
    if matches!(name, "exit") {
        return Some((tid, Text::Exited));
    }
    Some((
        tid,
        Text::Call {
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

/// A call read from its name, its argument text and its result text (empty: not returned).
pub(super) fn call(name: &str, args: &str, ret: &str) -> Call {
    let cloned = matches!(name, "clone" | "clone3" | "vfork" | "fork");
    Call {
        name: name.to_string(),
        ret: result(ret),
        fds: fds_of(name, args),
        made: creates_fds(name, args, ret),
        cloexec: born_cloexec(name, args),
        unbounded: unbounded(name, args),
        thread: cloned && args.contains("CLONE_THREAD"),
        operand: operand(name, args),
    }
}

/// `0`, `-1 EBADF (Bad file descriptor)`, `0x7f3c…`, `?`.
fn result(ret: &str) -> Ret {
    let mut words = ret.split_whitespace();
    let Some(first) = words.next() else {
        return Ret::Unknown;
    };
    if first == "-1" {
        if let Some(errno) = words.next().filter(|w| w.starts_with('E')) {
            return Ret::Error(errno.to_string());
        }
    }
    let value = match first.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok().map(|v| v as i64),
        None => first.parse().ok(),
    };
    value.map_or(Ret::Unknown, Ret::Value)
}

/// The `n`th argument as a number (`~0` for all ones in 32 bits, as strace writes it).
fn nth(args: &str, n: usize) -> Option<i64> {
    let a = args.split([',', ')']).nth(n)?.trim();
    match a {
        "~0" | "~0U" | "4294967295" => Some(u32::MAX as i64),
        _ => a.parse().ok(),
    }
}

fn operand(name: &str, args: &str) -> Operand {
    let int = |n: usize| nth(args, n);
    match name {
        "prctl" => {
            if let Some(m) = sync_marker::parse(args) {
                return Operand::Marker(m);
            }
            let named = args
                .strip_prefix("PR_SET_NAME, \"")
                .and_then(|a| a.split('"').next());
            named
                .and_then(receiver_named)
                .map_or(Operand::None, Operand::Receiver)
        }
        "futex" => {
            let mut a = args.split(',').map(str::trim);
            let addr = a
                .next()
                .and_then(|w| u64::from_str_radix(w.strip_prefix("0x")?, 16).ok());
            let op = a.next().unwrap_or("");
            let op = if op.starts_with("FUTEX_WAKE") {
                FutexOp::Wake
            } else if op.starts_with("FUTEX_WAIT") {
                FutexOp::Wait
            } else {
                FutexOp::Other
            };
            addr.map_or(Operand::None, |addr| Operand::Futex { addr, op })
        }
        "execve" => Operand::Exec {
            path: args
                .strip_prefix('"')
                .and_then(|a| a.split('"').next())
                .filter(|p| !p.is_empty())
                .map(str::to_string),
        },
        "fcntl" if args.contains("F_SETFD") => {
            let mut a = args.split(',').map(str::trim);
            match (a.next().map(str::parse::<i32>), a.nth(1)) {
                (Some(Ok(fd)), Some(flag)) => Operand::SetCloexec {
                    fd,
                    on: flag.contains("FD_CLOEXEC")
                        || flag.parse::<u64>().is_ok_and(|v| v & 1 == 1),
                },
                _ => Operand::None,
            }
        }
        "epoll_ctl" => {
            let mut parts = args.split(',').map(str::trim);
            let (Some(epfd), Some(op), Some(fd)) = (parts.next(), parts.next(), parts.next())
            else {
                return Operand::None;
            };
            let (Ok(epfd), Ok(fd)) = (epfd.parse::<i32>(), fd.parse::<i32>()) else {
                return Operand::None;
            };
            let op = match op {
                "EPOLL_CTL_ADD" => EpollOp::Add,
                "EPOLL_CTL_DEL" => EpollOp::Del,
                _ => EpollOp::Other,
            };
            Operand::EpollCtl { epfd, op, fd }
        }
        "close" => int(0).map_or(Operand::None, |fd| Operand::Close { fd }),
        "close_range" => match (int(0), int(1)) {
            (Some(first), Some(last)) => Operand::CloseRange {
                first,
                last,
                cloexec: args.contains("CLOSE_RANGE_CLOEXEC"),
            },
            _ => Operand::None,
        },
        "dup2" | "dup3" => match (int(0), int(1)) {
            (Some(old), Some(new)) => Operand::Dup { old, new },
            _ => Operand::None,
        },
        "io_uring_op" | "io_uring_done" => uring(name, args),
        "write" | "sendto" => {
            StepMark::in_bytes(args.as_bytes()).map_or(Operand::None, Operand::Step)
        }
        _ => Operand::None,
    }
}

/// An io_uring line: `io_uring_op(FD, IORING_OP_RECV, 0xREQ)` or `io_uring_done(0xREQ)`.
fn uring(name: &str, args: &str) -> Operand {
    let args = args.rsplit_once(") = ").map_or(args, |(a, _)| a);
    let req = args
        .rsplit(',')
        .next()
        .and_then(|last| u64::from_str_radix(last.trim().strip_prefix("0x")?, 16).ok());
    let Some(req) = req else {
        return Operand::None;
    };
    if name == "io_uring_done" {
        return Operand::UringDone { req };
    }
    let mut a = args.split(',').map(str::trim);
    match (a.next().map(str::parse::<i32>), a.next()) {
        (Some(Ok(fd)), Some(op)) if fd >= 0 => Operand::UringOp {
            fd,
            op: op.trim_start_matches("IORING_OP_").to_string(),
            req,
        },
        _ => Operand::None,
    }
}

/// Calls whose arguments that matter may be printed only at their return: the fds a pipe
/// made, the bytes a write sent (the eBPF backend reads them then).
fn returns_args(name: &str) -> bool {
    MAKES_TWO_FDS.contains(&name) || matches!(name, "write" | "sendto")
}

/// The descriptors a syscall acts on: its first argument for most, every one a `poll` or
/// `select` waits for, both ends of a `splice`-like copy. A thread asleep in a `poll` on
/// several is inside a call on each of them, as much as one asleep in `recvfrom`.
pub(super) fn fds_of(name: &str, args: &str) -> Vec<i32> {
    if is_probe(name, args) {
        return vec![];
    }
    let fd = |n: usize| -> Option<i32> {
        let a = args.split([',', ')']).nth(n)?.trim();
        a.parse().ok().filter(|fd: &i32| *fd >= 0)
    };
    match name {
        "poll" | "ppoll" => polled_fds(args),
        "select" | "pselect6" => selected_fds(args),
        "sendfile" | "tee" => [fd(0), fd(1)].into_iter().flatten().collect(),
        "splice" | "copy_file_range" => [fd(0), fd(2)].into_iter().flatten().collect(),
        _ if takes_fd(name) => fd(0).into_iter().collect(),
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
fn is_probe(name: &str, args: &str) -> bool {
    name == "fcntl"
        && ["F_GETFD", "F_SETFD", "F_GETFL", "F_SETFL"]
            .iter()
            .any(|op| args.contains(op))
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

/// Whether a descriptor maker made its descriptor close-on-exec (`SOCK_CLOEXEC`, `O_CLOEXEC`,
/// `EFD_CLOEXEC`, `F_DUPFD_CLOEXEC` and kin; pidfds and io_uring instances always are).
fn born_cloexec(name: &str, args: &str) -> bool {
    if !(MAKES_ONE_FD.contains(&name) || MAKES_TWO_FDS.contains(&name) || name == "fcntl") {
        return false;
    }
    match name {
        "pidfd_open" | "pidfd_getfd" | "io_uring_setup" => true,
        "dup" | "dup2" => false,
        "fcntl" => args.contains("F_DUPFD_CLOEXEC"),
        _ => args.contains("CLOEXEC"),
    }
}

/// A blocking call that was given no timeout.
fn unbounded(name: &str, args: &str) -> bool {
    let args = args.rsplit_once(") = ").map_or(args, |(a, _)| a);
    let arg = |n: usize| args.split(", ").nth(n).map(str::trim);
    // Counted from the end: a poll's list has commas of its own.
    let from_end = |n: usize| args.rsplit(", ").nth(n).map(str::trim);
    let negative = |a: Option<&str>| a.and_then(|t| t.parse::<i64>().ok()).is_some_and(|t| t < 0);
    match name {
        "futex" => args.contains("FUTEX_WAIT") && args.trim_end().ends_with("NULL"),
        "poll" => negative(from_end(0)),
        "ppoll" => from_end(2) == Some("NULL"),
        "epoll_wait" | "epoll_pwait" => negative(arg(3)),
        "epoll_pwait2" => arg(3) == Some("NULL"),
        "select" | "pselect6" | "recvmmsg" => arg(4) == Some("NULL"),
        // A parent waiting for a child that never ends, without WNOHANG.
        "wait4" | "waitid" => !args.contains("WNOHANG"),
        // Reads and writes that block until a peer acts (a full pipe, an empty socket).
        _ => blocks_until_a_peer_acts(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_into_calls_with_their_results() {
        let t = read(
            "12 1.5 pipe2([3, 4], O_CLOEXEC) = 0\n\
             12 1.6 close(9) = -1 EBADF (Bad file descriptor)\n\
             # a comment\n\
             13 1.7 read(3,  <unfinished ...>\n\
             12 1.8 write(4, \"x\", 1) = 1\n\
             13 1.9 <... read resumed>\"x\", 1) = 1\n\
             13 2.0 +++ exited with 0 +++\n",
        );
        assert_eq!(t.len(), 6);
        let Event::Call(pipe) = &t[0].event else {
            panic!("{t:?}")
        };
        assert_eq!((pipe.made.clone(), pipe.cloexec), (vec![3, 4], true));
        let Event::Call(close) = &t[1].event else {
            panic!()
        };
        assert!(close.ret.is_error("EBADF"));
        assert_eq!(close.operand, Operand::Close { fd: 9 });
        assert_eq!((t[2].line, t[2].tid), (3, 13));
        assert!(
            matches!(&t[2].event, Event::Started(c) if c.fds == vec![3] && c.ret == Ret::Unknown)
        );
        assert!(
            matches!(&t[4].event, Event::Resumed(c) if c.fds == vec![3] && c.ret == Ret::Value(1))
        );
        assert_eq!(t[5].event, Event::Exited);
    }

    #[test]
    fn a_pipe_split_by_another_thread_makes_its_fds_where_it_returns() {
        let t = read("5 1.0 pipe2( <unfinished ...>\n6 1.1 getpid() = 6\n5 1.2 <... pipe2 resumed>[7, 8], O_CLOEXEC) = 0\n");
        let Event::Resumed(c) = &t[2].event else {
            panic!()
        };
        assert_eq!(c.made, vec![7, 8]);
        assert!(c.cloexec);
    }

    #[test]
    fn operands_are_read_by_the_kind_of_call() {
        let c = call(
            "epoll_ctl",
            "5, EPOLL_CTL_ADD, 7, {events=EPOLLIN, data=0x7}",
            "0",
        );
        assert_eq!(
            c.operand,
            Operand::EpollCtl {
                epfd: 5,
                op: EpollOp::Add,
                fd: 7
            }
        );
        let c = call("close_range", "3, ~0U, CLOSE_RANGE_CLOEXEC", "0");
        assert_eq!(
            c.operand,
            Operand::CloseRange {
                first: 3,
                last: u32::MAX as i64,
                cloexec: true
            }
        );
        let c = call("futex", "0x7f10, FUTEX_WAIT_PRIVATE, 2, NULL", "");
        assert!(c.unbounded);
        assert_eq!(
            c.operand,
            Operand::Futex {
                addr: 0x7f10,
                op: FutexOp::Wait
            }
        );
        assert_eq!(
            call("prctl", "PR_SET_NAME, \"wringer-rx-9\"", "0").operand,
            Operand::Receiver(9)
        );
        let c = call("clone3", "{flags=CLONE_VM|CLONE_THREAD, ...}, 88", "4242");
        assert_eq!(c.cloned(), Some((4242, true)));
        assert!(
            call("fcntl", "255, F_GETFD", "-1 EBADF (Bad file descriptor)")
                .fds
                .is_empty()
        );
        assert_eq!(
            call("io_uring_op", "7, IORING_OP_RECV, 0x55aa", "0").operand,
            Operand::UringOp {
                fd: 7,
                op: "RECV".into(),
                req: 0x55aa
            }
        );
        assert_eq!(
            call("write", "9, \"{\\\"t\\\":\\\"step-start\\\"}\", 18", "18").operand,
            Operand::Step(StepMark::Start)
        );
    }

    #[test]
    fn timeouts_decide_what_is_unbounded() {
        assert!(call("poll", "[{fd=3, events=POLLIN}], 1, -1", "").unbounded);
        assert!(!call("poll", "[{fd=3, events=POLLIN}], 1, 100", "").unbounded);
        assert!(
            call(
                "poll",
                "[{fd=3, events=POLLIN}, {fd=4, events=POLLIN}], 2, -1) = 1",
                "1"
            )
            .unbounded
        );
        assert!(call("ppoll", "[{fd=3, events=POLLIN}], 1, NULL, NULL, 8", "").unbounded);
        assert!(call("epoll_wait", "5, 0x1, 8, -1", "").unbounded);
        assert!(!call("epoll_wait", "5, 0x1, 8, 500", "").unbounded);
        assert!(call("wait4", "-1, 0x7ff, 0, NULL", "").unbounded);
        assert!(!call("wait4", "-1, 0x7ff, WNOHANG, NULL", "").unbounded);
        assert!(call("recvfrom", "3, 0x1, 10, 0, NULL, NULL", "").unbounded);
        assert!(!call("getpid", "", "").unbounded);
    }

    #[test]
    fn results_are_typed() {
        assert_eq!(result("0"), Ret::Value(0));
        assert_eq!(
            result("-1 EBADF (Bad file descriptor)"),
            Ret::Error("EBADF".into())
        );
        assert_eq!(result("?"), Ret::Unknown);
        assert_eq!(result(""), Ret::Unknown);
        assert_eq!(result("0x10"), Ret::Value(16));
    }

    /// The eBPF recorder's typed events are what its own text, read as strace's, says: one
    /// checker, two ways in, no difference between them.
    #[test]
    fn the_ebpf_recorders_typed_events_agree_with_its_text() {
        use crate::hosts::syscall_trace::render::{Event as Raw, Kind, Out, Renderer};
        use crate::model::sync_marker::SYNC_MARKER;
        let ev = Raw::of;
        let mut r = Renderer::new(100, 0);
        let mut out = Out::default();
        let call = |r: &mut Renderer, out: &mut Out, tid, name, args, ret, caps: [Vec<u8>; 2]| {
            let mut enter = ev(tid, Kind::Enter, name, args, 0);
            enter.captures = caps.clone();
            r.feed(enter, out);
            let mut exit = ev(tid, Kind::Exit, name, args, ret);
            exit.captures = caps;
            r.feed(exit, out);
        };
        let none = || [vec![], vec![]];
        let pair = |a: i32, b: i32| [[a.to_ne_bytes(), b.to_ne_bytes()].concat(), vec![]];
        call(&mut r, &mut out, 100, "execve", [0; 6], 0, none());
        let cloexec = libc::O_CLOEXEC as u64;
        call(
            &mut r,
            &mut out,
            100,
            "socket",
            [2, 1 | cloexec, 0, 0, 0, 0],
            3,
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "pipe2",
            [0x10, cloexec, 0, 0, 0, 0],
            0,
            pair(4, 5),
        );
        call(
            &mut r,
            &mut out,
            100,
            "socketpair",
            [1, 1, 0, 0x20, 0, 0],
            0,
            pair(6, 7),
        );
        call(
            &mut r,
            &mut out,
            100,
            "accept4",
            [3, 0, 0, cloexec, 0, 0],
            8,
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "fcntl",
            [8, libc::F_SETFD as u64, 1, 0, 0, 0],
            0,
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "fcntl",
            [255, libc::F_GETFD as u64, 0, 0, 0, 0],
            -9,
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "fcntl",
            [8, libc::F_DUPFD_CLOEXEC as u64, 20, 0, 0, 0],
            20,
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "epoll_create1",
            [cloexec, 0, 0, 0, 0, 0],
            9,
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "epoll_ctl",
            [9, libc::EPOLL_CTL_ADD as u64, 8, 0x30, 0, 0],
            0,
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "epoll_wait",
            [9, 0x40, 8, u64::MAX, 0, 0],
            1,
            none(),
        );
        let mut polled = vec![];
        for fd in [4i32, 6] {
            polled.extend(fd.to_ne_bytes());
            polled.extend([1, 0, 0, 0]);
        }
        call(
            &mut r,
            &mut out,
            100,
            "poll",
            [0x50, 2, 100, 0, 0, 0],
            1,
            [polled, vec![]],
        );
        let mut set = vec![0u8; 128];
        set[0] = 0b0101_0000;
        call(
            &mut r,
            &mut out,
            100,
            "pselect6",
            [8, 0x60, 0, 0, 0, 0],
            1,
            [set, vec![]],
        );
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD) as u64;
        call(
            &mut r,
            &mut out,
            100,
            "clone3",
            [0x70, 88, 0, 0, 0, 0],
            101,
            [thread.to_ne_bytes().to_vec(), vec![]],
        );
        call(
            &mut r,
            &mut out,
            101,
            "prctl",
            [libc::PR_SET_NAME as u64, 0x80, 0, 0, 0, 0],
            0,
            [b"wringer-rx-8\0".to_vec(), vec![]],
        );
        call(
            &mut r,
            &mut out,
            101,
            "prctl",
            [SYNC_MARKER, 2, 0x5000, 0x6000, 0x24d4, 0],
            -22,
            none(),
        );
        // A read split by another thread's close: a start line, and the end where it returns.
        let mut recv = ev(101, Kind::Enter, "read", [8, 0x90, 16, 0, 0, 0], 0);
        recv.site = 0x55aa;
        r.feed(recv, &mut out);
        call(
            &mut r,
            &mut out,
            100,
            "shutdown",
            [8, 2, 0, 0, 0, 0],
            0,
            none(),
        );
        r.feed(
            ev(101, Kind::Exit, "read", [8, 0x90, 16, 0, 0, 0], 0),
            &mut out,
        );
        call(
            &mut r,
            &mut out,
            100,
            "futex",
            [
                0xa0,
                (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as u64,
                1,
                0,
                0,
                0,
            ],
            1,
            none(),
        );
        call(
            &mut r,
            &mut out,
            101,
            "futex",
            [0xa0, libc::FUTEX_WAIT as u64, 2, 0, 0, 0],
            0,
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "write",
            [5, 0xb0, 18, 0, 0, 0],
            18,
            [br#"{"t":"step-start"}"#.to_vec(), vec![]],
        );
        call(&mut r, &mut out, 100, "dup2", [6, 8, 0, 0, 0, 0], 8, none());
        call(
            &mut r,
            &mut out,
            100,
            "close",
            [8, 0, 0, 0, 0, 0],
            0,
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "close",
            [8, 0, 0, 0, 0, 0],
            -(libc::EBADF as i64),
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "close_range",
            [
                10,
                u32::MAX as u64,
                libc::CLOSE_RANGE_CLOEXEC as u64,
                0,
                0,
                0,
            ],
            0,
            none(),
        );
        call(
            &mut r,
            &mut out,
            100,
            "wait4",
            [u64::MAX, 0, 0, 0, 0, 0],
            300,
            none(),
        );
        let mut op = ev(100, Kind::UringOp, "read", [0xc0, 4, 27, 0, 0, 0], 0);
        op.nr = 0;
        r.feed(op, &mut out);
        let mut done = ev(100, Kind::UringDone, "read", [0xc0, 0, 0, 0, 0, 0], 5);
        done.nr = 0;
        r.feed(done, &mut out);
        r.feed(ev(101, Kind::ThreadExit, "read", [0; 6], 0), &mut out);
        r.finish(&mut out);
        let typed = out.events.clone();
        let read = read(&out.text);
        assert_eq!(typed.len(), 31, "{}", out.text);
        assert_eq!(typed.len(), read.len(), "{}", out.text);
        for (t, s) in typed.iter().zip(&read) {
            assert_eq!(
                t,
                s,
                "line {}: {}",
                t.line + 1,
                out.text.lines().nth(t.line).unwrap_or("")
            );
        }
    }
}
