//! The kernel side's events as strace's lines (`-f -ttt`), so that a reader sees one format
//! whichever recorder ran; beside each line, the checker's typed event for it (`decode`), so
//! the checker reads no text. Pure: events in, lines and typed events out.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::model::sync_marker::{self, CALL_SITE};
use crate::model::traced::{self, Call, Operand, Ret, Traced};

use super::decode;
use super::table::{self, Syscall};

/// What the renderer writes: the trace's text, and the typed event of each of its lines that
/// is one, numbered as the text's lines are.
#[derive(Default)]
pub struct Out {
    pub text: String,
    pub events: Vec<Traced>,
    /// Lines written so far, over every drain (the text and the events are taken away between
    /// drains; the numbering goes on).
    lines: usize,
}

impl Out {
    /// One line of text and the event it is.
    fn line(&mut self, tid: u32, event: traced::Event, text: std::fmt::Arguments) {
        let _ = self.text.write_fmt(text);
        self.text.push('\n');
        self.events.push(Traced {
            line: self.lines,
            tid,
            event,
        });
        self.lines += 1;
    }

    /// A line that is no event (a note of the recorder's own).
    pub fn note(&mut self, text: &str) {
        self.text.push_str(text);
        self.text.push('\n');
        self.lines += 1;
    }

    /// Both parts written so far, taken away (the numbering goes on).
    pub fn take(&mut self) -> (String, Vec<Traced>) {
        (
            std::mem::take(&mut self.text),
            std::mem::take(&mut self.events),
        )
    }
}

impl std::ops::Deref for Out {
    type Target = String;
    fn deref(&self) -> &String {
        &self.text
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Bytes in one event (`struct event` in `audit.bpf.c`).
pub const EVENT_SIZE: usize = 352;
const CAPTURE: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Enter,
    Exit,
    ThreadExit,
    /// An io_uring operation took its descriptor (args: request, fd, opcode).
    UringOp,
    /// An io_uring operation completed (args: request; ret: its result).
    UringDone,
}

/// One event from the kernel side.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Nanoseconds on the monotonic clock.
    pub ts: u64,
    pub tid: u32,
    pub tgid: u32,
    pub kind: Kind,
    pub nr: i64,
    pub args: [u64; 6],
    pub ret: i64,
    pub captures: [Vec<u8>; 2],
    /// Where the program called it from (the sync observer's slot), or 0.
    pub site: u64,
}

impl Event {
    /// Decode one ring-buffer record; `None` when it is not one.
    pub fn decode(b: &[u8]) -> Option<Event> {
        if b.len() < EVENT_SIZE {
            return None;
        }
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let kind = match u32_at(16) {
            0 => Kind::Enter,
            1 => Kind::Exit,
            2 => Kind::ThreadExit,
            3 => Kind::UringOp,
            4 => Kind::UringDone,
            _ => return None,
        };
        let cap = |i: usize| {
            let n = (u32_at(80 + 4 * i) as usize).min(CAPTURE);
            b[88 + CAPTURE * i..88 + CAPTURE * i + n].to_vec()
        };
        Some(Event {
            ts: u64_at(0),
            tid: u32_at(8),
            tgid: u32_at(12),
            kind,
            nr: u32_at(20) as i32 as i64,
            args: std::array::from_fn(|i| u64_at(24 + 8 * i)),
            ret: u64_at(72) as i64,
            captures: [cap(0), cap(1)],
            site: u64_at(344),
        })
    }
}

impl Event {
    /// A call of `name` (a recorded syscall) in process 100, one second into the clock, with
    /// nothing captured: the events tests and benches make.
    pub fn of(tid: u32, kind: Kind, name: &str, args: [u64; 6], ret: i64) -> Event {
        Event {
            ts: 1_000_000_000,
            tid,
            tgid: 100,
            kind,
            nr: table::recorded(true)
                .find(|s| s.name == name)
                .map_or(-1, |s| s.nr),
            args,
            ret,
            captures: [vec![], vec![]],
            site: 0,
        }
    }
}

/// A call in progress this long is printed as unfinished, so that a trace cut by a kill still
/// shows where its threads were.
const PENDING_NS: u64 = 50_000_000;

/// Turns events into trace lines. The root process is recorded from its `execve`, as strace
/// records a program it starts.
pub struct Renderer {
    root: u32,
    root_started: bool,
    /// Add to a monotonic timestamp for the time of day.
    epoch_offset_ns: i128,
    pending: BTreeMap<u32, Event>,
    /// Calls printed as unfinished, until they return: the typed event of their end is the
    /// whole call, what it was given included.
    unfinished: BTreeMap<u32, Event>,
    /// Each error's text, made once: libc's message goes through its locale lookup, and a
    /// sync marker's EINVAL comes back thousands of times a second.
    errors: BTreeMap<i32, String>,
    /// The call site last told per thread and syscall: a marker line goes before a call only
    /// when its site differs, so a loop from one place costs one line.
    sites: BTreeMap<(u32, i64), u64>,
}

impl Renderer {
    pub fn new(root: u32, epoch_offset_ns: i128) -> Renderer {
        Renderer {
            root,
            root_started: false,
            epoch_offset_ns,
            pending: BTreeMap::new(),
            unfinished: BTreeMap::new(),
            errors: BTreeMap::new(),
            sites: BTreeMap::new(),
        }
    }

    /// Add the lines `e` makes to `out`.
    pub fn feed(&mut self, e: Event, out: &mut Out) {
        if e.tgid == self.root && !self.root_started {
            // What the tracer's child did before it became the program is not the program's.
            let execed = e.kind == Kind::Exit
                && table::by_nr(e.nr).is_some_and(|s| s.name.starts_with("execve"))
                && e.ret == 0;
            if !execed {
                return;
            }
            self.root_started = true;
            let exec = Call {
                name: "execve".into(),
                ret: Ret::Value(0),
                operand: Operand::Exec { path: None },
                ..Call::default()
            };
            out.line(
                e.tid,
                traced::Event::Call(exec),
                format_args!("{} {} execve(...) = 0", e.tid, self.time(e.ts)),
            );
            return;
        }
        // io_uring's operations run beside their submitter's calls: a line of their own, in
        // the form the checker reads, splitting nothing.
        match e.kind {
            Kind::UringOp => {
                let (fd, op) = (e.args[1] as i64 as i32, uring_op_name(e.args[2]));
                let call = Call {
                    name: "io_uring_op".into(),
                    ret: Ret::Value(0),
                    operand: if fd >= 0 {
                        Operand::UringOp {
                            fd,
                            op: op.trim_start_matches("IORING_OP_").to_string(),
                            req: e.args[0],
                        }
                    } else {
                        Operand::None
                    },
                    ..Call::default()
                };
                out.line(
                    e.tid,
                    traced::Event::Call(call),
                    format_args!(
                        "{} {} io_uring_op({fd}, {op}, {:#x}) = 0",
                        e.tid,
                        self.time(e.ts),
                        e.args[0]
                    ),
                );
                return;
            }
            Kind::UringDone => {
                let call = Call {
                    name: "io_uring_done".into(),
                    ret: Ret::Value(e.ret),
                    operand: Operand::UringDone { req: e.args[0] },
                    ..Call::default()
                };
                out.line(
                    e.tid,
                    traced::Event::Call(call),
                    format_args!(
                        "{} {} io_uring_done({:#x}) = {}",
                        e.tid,
                        self.time(e.ts),
                        e.args[0],
                        e.ret
                    ),
                );
                return;
            }
            _ => {}
        }
        // Another thread's event splits the calls in progress, as strace does.
        while let Some(t) = self.pending.keys().copied().find(|t| *t != e.tid) {
            self.print_unfinished(t, out);
        }
        match e.kind {
            Kind::Enter => {
                if self.pending.contains_key(&e.tid) {
                    // exit and execve do not return: their entry stands alone.
                    self.print_unfinished(e.tid, out);
                }
                self.pending.insert(e.tid, e);
            }
            Kind::Exit => {
                let Some(s) = table::by_nr(e.nr) else { return };
                match self.pending.remove(&e.tid) {
                    Some(p) if p.nr == e.nr => {
                        self.tell_site(s, &p, out);
                        let args = args_text(s, &p, Some(&e));
                        let ret = self.ret_text(e.ret);
                        out.line(
                            e.tid,
                            traced::Event::Call(decode::call(s, &p, Some(&e))),
                            format_args!(
                                "{} {} {}({}) = {}",
                                e.tid,
                                self.time(p.ts),
                                s.name,
                                args,
                                ret
                            ),
                        );
                    }
                    other => {
                        if let Some(p) = other {
                            self.pending.insert(e.tid, p);
                            self.print_unfinished(e.tid, out);
                        }
                        let after = if s.captures.iter().flatten().any(|c| c.at_exit) {
                            args_text(s, &e, Some(&e))
                        } else {
                            String::new()
                        };
                        // The whole call, from its start; without one (it started before the
                        // trace did), what its end alone says.
                        let call = match self.unfinished.remove(&e.tid) {
                            Some(start) if start.nr == e.nr => decode::call(s, &start, Some(&e)),
                            _ => Call {
                                name: s.name.to_string(),
                                ret: decode::result(e.ret),
                                ..Call::default()
                            },
                        };
                        let ret = self.ret_text(e.ret);
                        out.line(
                            e.tid,
                            traced::Event::Resumed(call),
                            format_args!(
                                "{} {} <... {} resumed>{}) = {}",
                                e.tid,
                                self.time(e.ts),
                                s.name,
                                after,
                                ret
                            ),
                        );
                    }
                }
            }
            Kind::UringOp | Kind::UringDone => {}
            Kind::ThreadExit => {
                if let Some(p) = self.pending.remove(&e.tid) {
                    self.pending.insert(e.tid, p);
                    self.print_unfinished(e.tid, out);
                }
                out.line(
                    e.tid,
                    traced::Event::Exited,
                    format_args!("{} {} +++ exited +++", e.tid, self.time(e.ts)),
                );
                self.unfinished.remove(&e.tid);
                self.sites.retain(|(t, _), _| *t != e.tid);
            }
        }
    }

    /// At the end of a drain, at `now` on the events' clock: calls in progress for a while
    /// are printed as unfinished.
    pub fn drained(&mut self, now: u64, out: &mut Out) {
        let old: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, p)| now.saturating_sub(p.ts) >= PENDING_NS)
            .map(|(t, _)| *t)
            .collect();
        for t in old {
            self.print_unfinished(t, out);
        }
    }

    /// The end of the trace: whatever is in progress stays unfinished.
    pub fn finish(&mut self, out: &mut Out) {
        let all: Vec<u32> = self.pending.keys().copied().collect();
        for t in all {
            self.print_unfinished(t, out);
        }
    }

    fn print_unfinished(&mut self, tid: u32, out: &mut Out) {
        let Some(p) = self.pending.remove(&tid) else {
            return;
        };
        let Some(s) = table::by_nr(p.nr) else {
            return;
        };
        self.tell_site(s, &p, out);
        out.line(
            tid,
            traced::Event::Started(decode::call(s, &p, None)),
            format_args!(
                "{} {} {}({} <unfinished ...>",
                tid,
                self.time(p.ts),
                s.name,
                args_text(s, &p, None)
            ),
        );
        self.unfinished.insert(tid, p);
    }

    /// Before a call's first line: its call site, as a marker the checker reads like the sync
    /// observer's (`prctl(SYNC_MARKER, CALL_SITE, nr, site, 0)`), when it is not the one this
    /// thread's calls of that syscall had last (0: none known).
    fn tell_site(&mut self, s: &Syscall, p: &Event, out: &mut Out) {
        let last = self.sites.get(&(p.tid, s.nr)).copied().unwrap_or(0);
        if p.site == last {
            return;
        }
        if p.site == 0 {
            self.sites.remove(&(p.tid, s.nr));
        } else {
            self.sites.insert((p.tid, s.nr), p.site);
        }
        let marker = Call {
            name: "prctl".into(),
            ret: Ret::Error("EINVAL".into()),
            operand: sync_marker::from_words(CALL_SITE, s.nr as u64, p.site, 0)
                .map_or(Operand::None, Operand::Marker),
            ..Call::default()
        };
        out.line(
            p.tid,
            traced::Event::Call(marker),
            format_args!(
                "{} {} prctl({:#x} /* PR_??? */, {:#x}, {}, {:#x}, 0) = -1 EINVAL (Invalid argument)",
                p.tid,
                self.time(p.ts),
                sync_marker::SYNC_MARKER,
                CALL_SITE,
                s.nr,
                p.site
            ),
        );
    }

    /// `-1 EBADF (Bad file descriptor)` for an error, the number otherwise.
    fn ret_text(&mut self, ret: i64) -> String {
        if !(-4095..0).contains(&ret) {
            return ret.to_string();
        }
        let errno = (-ret) as i32;
        self.errors
            .entry(errno)
            .or_insert_with(|| error_text(errno))
            .clone()
    }

    fn time(&self, ts: u64) -> Time {
        Time((ts as i128 + self.epoch_offset_ns).clamp(0, u64::MAX as i128) as u64)
    }
}

/// A time of day as strace's `-ttt` prints it (nanoseconds since the epoch), written straight
/// into the line.
struct Time(u64);

impl std::fmt::Display for Time {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{:06}",
            self.0 / 1_000_000_000,
            (self.0 % 1_000_000_000) / 1000
        )
    }
}

/// An io_uring opcode as liburing names it (the common ones; the number otherwise).
fn uring_op_name(op: u64) -> String {
    const NAMES: &[&str] = &[
        "NOP",
        "READV",
        "WRITEV",
        "FSYNC",
        "READ_FIXED",
        "WRITE_FIXED",
        "POLL_ADD",
        "POLL_REMOVE",
        "SYNC_FILE_RANGE",
        "SENDMSG",
        "RECVMSG",
        "TIMEOUT",
        "TIMEOUT_REMOVE",
        "ACCEPT",
        "ASYNC_CANCEL",
        "LINK_TIMEOUT",
        "CONNECT",
        "FALLOCATE",
        "OPENAT",
        "CLOSE",
        "FILES_UPDATE",
        "STATX",
        "READ",
        "WRITE",
        "FADVISE",
        "MADVISE",
        "SEND",
        "RECV",
        "OPENAT2",
        "EPOLL_CTL",
        "SPLICE",
        "PROVIDE_BUFFERS",
        "REMOVE_BUFFERS",
        "TEE",
        "SHUTDOWN",
    ];
    match NAMES.get(op as usize) {
        Some(n) => format!("IORING_OP_{n}"),
        None => op.to_string(),
    }
}

/// `-1 EBADF (Bad file descriptor)`.
fn error_text(errno: i32) -> String {
    let msg = std::io::Error::from_raw_os_error(errno).to_string();
    let msg = msg.split(" (os error").next().unwrap_or("");
    format!("-1 {} ({msg})", super::decode::errno_name(errno))
}

/// The arguments as strace prints them, in the forms the checker reads: descriptors as
/// numbers, poll and select sets spelled out, epoll and fcntl operations named, the bytes a
/// write sends as a string. `exit` carries the reads made at return (pipe fds).
fn args_text(s: &Syscall, enter: &Event, exit: Option<&Event>) -> String {
    let a = |i: usize| enter.args[i];
    let int = |i: usize| (a(i) as i64 as i32).to_string();
    let ptr = |i: usize| {
        if a(i) == 0 {
            "NULL".to_string()
        } else {
            format!("{:#x}", a(i))
        }
    };
    let cap = |i: usize| enter.captures[i].as_slice();
    let returned = |i: usize| -> Option<&[u8]> {
        let e = exit?;
        let c = s.captures[i]?;
        (c.at_exit && !e.captures[i].is_empty()).then_some(e.captures[i].as_slice())
    };
    let rest = |from: usize| -> Vec<String> { (from..s.arity as usize).map(int).collect() };
    let parts: Vec<String> = match s.name {
        "write" | "sendto" => {
            let data = match returned(0) {
                Some(b) => quoted(b, a(2) as usize),
                None => ptr(1),
            };
            let mut p = vec![int(0), data];
            p.extend((2..s.arity as usize).map(|i| if i == 2 { a(2).to_string() } else { ptr(i) }));
            p
        }
        // The sync observer's markers, as strace prints them (every argument in hex).
        "prctl" if a(0) == crate::model::sync_marker::SYNC_MARKER => {
            let hex = |i: usize| {
                if a(i) == 0 {
                    "0".to_string()
                } else {
                    format!("{:#x}", a(i))
                }
            };
            vec![
                format!("{:#x} /* PR_??? */", a(0)),
                hex(1),
                hex(2),
                hex(3),
                hex(4),
            ]
        }
        "prctl" if a(0) == libc::PR_SET_NAME as u64 => {
            vec!["PR_SET_NAME".into(), quoted(trim_nul(cap(0)), usize::MAX)]
        }
        "poll" | "ppoll" => {
            let fds: Vec<String> = cap(0)
                .chunks_exact(8)
                .map(|c| {
                    let fd = i32::from_ne_bytes(c[0..4].try_into().unwrap());
                    let ev = i16::from_ne_bytes(c[4..6].try_into().unwrap());
                    format!("{{fd={fd}, events={ev:#x}}}")
                })
                .collect();
            let mut p = vec![format!("[{}]", fds.join(", ")), a(1).to_string()];
            if s.name == "poll" {
                p.push(int(2));
            } else {
                p.extend([ptr(2), ptr(3), a(4).to_string()]);
            }
            p
        }
        "select" | "pselect6" => {
            let n = a(0) as usize;
            let mut p = vec![
                a(0).to_string(),
                fd_set(cap(0), n, a(1)),
                fd_set(cap(1), n, a(2)),
            ];
            p.extend((3..s.arity as usize).map(ptr));
            p
        }
        "epoll_ctl" => {
            let op = match a(1) as i32 {
                libc::EPOLL_CTL_ADD => "EPOLL_CTL_ADD".to_string(),
                libc::EPOLL_CTL_DEL => "EPOLL_CTL_DEL".to_string(),
                libc::EPOLL_CTL_MOD => "EPOLL_CTL_MOD".to_string(),
                o => o.to_string(),
            };
            vec![int(0), op, int(2), ptr(3)]
        }
        "epoll_wait" | "epoll_pwait" | "epoll_pwait2" => {
            let mut p = vec![int(0), ptr(1), int(2), int(3)];
            p.extend((4..s.arity as usize).map(ptr));
            p
        }
        "fcntl" => {
            let cmd = match a(1) as i32 {
                libc::F_DUPFD => "F_DUPFD".to_string(),
                libc::F_DUPFD_CLOEXEC => "F_DUPFD_CLOEXEC".to_string(),
                libc::F_GETFL => "F_GETFL".to_string(),
                libc::F_SETFL => "F_SETFL".to_string(),
                libc::F_GETFD => "F_GETFD".to_string(),
                libc::F_SETFD => "F_SETFD".to_string(),
                c => c.to_string(),
            };
            vec![int(0), cmd, int(2)]
        }
        "close_range" => {
            let flags = if a(2) & libc::CLOSE_RANGE_CLOEXEC as u64 != 0 {
                "CLOSE_RANGE_CLOEXEC".to_string()
            } else {
                a(2).to_string()
            };
            vec![(a(0) as u32).to_string(), (a(1) as u32).to_string(), flags]
        }
        "clone" | "clone3" => {
            let flags = if s.name == "clone" {
                a(0)
            } else {
                cap(0)
                    .get(..8)
                    .map(|b| u64::from_ne_bytes(b.try_into().unwrap()))
                    .unwrap_or(0)
            };
            let thread = if flags & libc::CLONE_THREAD as u64 != 0 {
                "|CLONE_THREAD"
            } else {
                ""
            };
            vec![format!("flags={flags:#x}{thread}")]
        }
        "futex" => {
            let op = a(1) as i32;
            let name = match op & 0x7f {
                libc::FUTEX_WAIT => "FUTEX_WAIT",
                libc::FUTEX_WAIT_BITSET => "FUTEX_WAIT_BITSET",
                libc::FUTEX_WAKE => "FUTEX_WAKE",
                _ => "FUTEX_OTHER",
            };
            let private = if op & libc::FUTEX_PRIVATE_FLAG != 0 {
                "_PRIVATE"
            } else {
                ""
            };
            let mut p = vec![ptr(0), format!("{name}{private}"), int(2), ptr(3)];
            if op & 0x7f != libc::FUTEX_WAIT {
                p.extend([ptr(4), int(5)]);
            }
            p
        }
        "pipe" | "pipe2" | "socketpair" => {
            let at = if s.name == "socketpair" { 3 } else { 0 };
            let pair = match returned(0) {
                Some(b) if b.len() >= 8 => format!(
                    "[{}, {}]",
                    i32::from_ne_bytes(b[0..4].try_into().unwrap()),
                    i32::from_ne_bytes(b[4..8].try_into().unwrap())
                ),
                _ => ptr(at),
            };
            let mut p = rest(0);
            if let Some(slot) = p.get_mut(at) {
                *slot = pair;
            }
            p
        }
        "openat" | "openat2" | "execveat" => {
            let mut p = vec![int(0), quoted(trim_nul(cap(0)), usize::MAX)];
            p.extend(rest(2));
            p
        }
        "open" | "creat" | "execve" => {
            let mut p = vec![quoted(trim_nul(cap(0)), usize::MAX)];
            p.extend(rest(1));
            p
        }
        _ => rest(0),
    };
    let mut parts = parts;
    if let Some((at, bit, label)) = cloexec_flag(s.name, enter) {
        if let Some(slot) = parts.get_mut(at) {
            let rest = a(at) & !bit;
            *slot = if rest == 0 {
                label.to_string()
            } else {
                format!("{rest}|{label}")
            };
        }
    }
    parts.join(", ")
}

/// Where a call's close-on-exec flag is, when it is set: the argument, its bit and strace's
/// name for it (the checker follows close-on-exec across `execve`).
pub(super) fn cloexec_flag(name: &str, e: &Event) -> Option<(usize, u64, &'static str)> {
    let o = libc::O_CLOEXEC as u64;
    let (at, bit, label) = match name {
        "socket" | "socketpair" => (1, o, "SOCK_CLOEXEC"),
        "accept4" => (3, o, "SOCK_CLOEXEC"),
        "open" | "pipe2" | "eventfd2" | "timerfd_create" => (1, o, "O_CLOEXEC"),
        "openat" | "dup3" => (2, o, "O_CLOEXEC"),
        "signalfd4" => (3, o, "O_CLOEXEC"),
        "epoll_create1" | "inotify_init1" => (0, o, "O_CLOEXEC"),
        "memfd_create" => (1, libc::MFD_CLOEXEC as u64, "MFD_CLOEXEC"),
        "fcntl" if e.args[1] as i32 == libc::F_SETFD => (2, libc::FD_CLOEXEC as u64, "FD_CLOEXEC"),
        _ => return None,
    };
    (e.args[at] & bit != 0).then_some((at, bit, label))
}

/// `[3 5]`: the descriptors below `n` set in a select set (`NULL` for none given).
fn fd_set(bytes: &[u8], n: usize, ptr: u64) -> String {
    if ptr == 0 {
        return "NULL".into();
    }
    let fds: Vec<String> = in_set(bytes, n).iter().map(|fd| fd.to_string()).collect();
    format!("[{}]", fds.join(" "))
}

/// The descriptors below `n` set in a select set's bytes.
pub(super) fn in_set(bytes: &[u8], n: usize) -> Vec<i32> {
    (0..n.min(bytes.len() * 8))
        .filter(|fd| bytes[fd / 8] & (1 << (fd % 8)) != 0)
        .map(|fd| fd as i32)
        .collect()
}

pub(super) fn trim_nul(b: &[u8]) -> &[u8] {
    b.split(|c| *c == 0).next().unwrap_or(b)
}

/// Bytes as a C string literal, `...` after it when the call had more than was read.
fn quoted(b: &[u8], total: usize) -> String {
    let mut s = String::from("\"");
    for &c in b {
        match c {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\t' => s.push_str("\\t"),
            0x20..=0x7e => s.push(c as char),
            _ => {
                let _ = write!(s, "\\x{c:02x}");
            }
        }
    }
    s.push('"');
    if total != usize::MAX && total > b.len() {
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests;
