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
//!
//! By concept: `recorder` (the command a rank runs under: strace or eBPF), `strace_line`
//! (strace's text read into typed calls; the eBPF recorder writes them typed), this module
//! (per-process state and the pass over a trace's typed events), `descriptors` (the
//! descriptor rules), `sync_events` (the sync observer's markers), `inheritance` (`fork`,
//! `execve` and exit). What a syscall does by its name is in `model::traced`.

mod descriptors;
mod inheritance;
mod recorder;
mod strace_line;
mod sync_events;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::model::scenario::AuditCheck;
use crate::model::sync_marker::SyncKind;
use crate::model::traced::*;
use crate::orchestration::happens_before::{Epoch, HappensBefore, Object};
use crate::orchestration::wait_for::WaitFor;

pub use self::recorder::{
    exact_perturbations, path_word, perturb_mechanism, preload_rules, statically_linked,
    strace_command, tracer_command, PerturbBy,
};

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
    /// Judged by happens-before alone (nothing in the trace orders two calls; the race did not
    /// necessarily show): sound only where the process's synchronization is all in the trace.
    pub by_order: bool,
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
    call: Call,
    /// The epoll set it waits on (`epoll_wait`), whose members it waits for as they are now.
    epoll: Option<i32>,
    line: usize,
}

/// Read a whole strace trace and return every violation of the chosen checks, as after a hang.
pub fn analyse(trace: &str, checks: &[AuditCheck]) -> Vec<Violation> {
    analyse_after(trace, None, checks, true)
}

/// Check a whole trace and return every violation of the chosen checks: its typed events
/// where the recorder wrote them (`calls`, the eBPF recorder's), else its text read as
/// strace's. The text is the evidence either way: findings quote its lines. Syscalls still in
/// progress without a timeout count (`unbounded-waits`) only when the run `hung`; the sync
/// observer's untimed waits count whenever that check is on.
pub fn analyse_after(
    trace: &str,
    calls: Option<Vec<Traced>>,
    checks: &[AuditCheck],
    hung: bool,
) -> Vec<Violation> {
    let lines: Vec<&str> = trace.lines().collect();
    let mut events: Vec<Option<Traced>> = vec![None; lines.len()];
    for t in calls.unwrap_or_else(|| strace_line::read(trace)) {
        if let Some(slot) = events.get_mut(t.line) {
            *slot = Some(t);
        }
    }
    Audit {
        lines,
        events,
        checks,
        hung,
        ..Audit::default()
    }
    .run()
}

/// The channel a descriptor's `shutdown` releases into and the read it ends (EOF) acquires.
fn shutdown_channel(fd: i32) -> u64 {
    (1 << 63) | fd as u32 as u64
}

#[derive(Default)]
struct Audit<'a> {
    lines: Vec<&'a str>,
    /// Each line's event, where it is one.
    events: Vec<Option<Traced>>,
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
    /// Per thread, the call site its calls of each syscall come from, as the eBPF recorder
    /// told it (its `CallSite` markers).
    sites: BTreeMap<u32, Vec<(&'static str, u64)>>,
    /// The call site of the call that starts on each line, where one is known.
    line_sites: BTreeMap<usize, u64>,
    /// The harness's own tools and their children (see [`Lineage`]).
    tools: BTreeSet<u32>,
    /// Processes with synchronization the observer cannot see (see [`Lineage`]).
    own_sync: BTreeSet<u32>,
    /// What was stuck when the harness started its first tool (the watchdog's gdb, taking a
    /// hung program's stacks): attaching it can end a blocked call (a write to a full pipe
    /// returns short), so the hang is judged as it was then, not at the trace's end.
    at_hang: Option<HangState>,
}

/// Calls stuck without a bound, and wait-for cycles, at one moment of a trace.
struct HangState {
    stuck: Vec<(u32, String, usize)>,
    cycles: Vec<(u32, crate::orchestration::wait_for::WaitFinding)>,
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

    /// Record a violation; the caller may mark it judged by order alone.
    fn flag(
        &mut self,
        check: &'static str,
        pid: u32,
        fd: Option<i32>,
        detail: String,
        at: usize,
        also: &[usize],
    ) -> &mut Violation {
        let context = self.context(at, also);
        let program = self.procs.get(&pid).and_then(|p| p.exe.clone());
        self.out.push(Violation {
            check,
            pid,
            program,
            fd,
            detail,
            context,
            by_order: false,
        });
        self.out.last_mut().expect("just pushed")
    }

    fn run(mut self) -> Vec<Violation> {
        let lineage = threads_of(&self.events);
        (self.tgid, self.parents, self.tools, self.own_sync) = (
            lineage.tgid,
            lineage.parents,
            lineage.tools,
            lineage.own_sync,
        );
        for i in 0..self.events.len() {
            // (A copy: the sweep check reads the neighbouring lines' events.)
            let Some(Traced { tid, event, .. }) = self.events[i].clone() else {
                continue;
            };
            if let Event::Call(c) = &event {
                // The recorder's call-site bookkeeping is no call of the program's.
                match c.marker().map(|m| (m.kind, m)) {
                    Some((SyncKind::CallSite, m)) => {
                        self.site_told(tid, m.object as i64, m.site);
                        continue;
                    }
                    Some((SyncKind::SiteSlot, _)) => continue,
                    Some((SyncKind::Tool, _)) => {
                        if self.at_hang.is_none() {
                            // The process starting the tool is the harness's rank, waiting
                            // for the program: its own waits are not the hang's.
                            let rank = self.tgid.get(&tid).copied().unwrap_or(tid);
                            self.at_hang = Some(self.hang_state(Some(rank)));
                        }
                        continue;
                    }
                    _ => {}
                }
            }
            if let Event::Call(c) | Event::Started(c) = &event {
                self.note_site(tid, &c.name, i);
            }
            let pid = *self.tgid.entry(tid).or_insert(tid);
            if self.tools.contains(&pid) {
                continue;
            }
            self.inherit(pid);
            if let Event::Call(c) | Event::Started(c) = &event {
                self.alive(pid);
                // A thread that makes a call (other than the futex its wait sleeps in, or the
                // next marker) is not waiting any more; the end of a call is judged where it
                // started.
                if c.name != "futex" && c.marker().is_none() {
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
            match event {
                Event::Call(c) => self.call(pid, tid, &c, i),
                Event::Started(c) => {
                    if c.name == "exit_group" {
                        // It does not return: the eBPF recorder prints it as unfinished.
                        self.procs.entry(pid).or_default().exiting = true;
                    }
                    // A release is judged where it returns (a close of a closed number fails
                    // there with EBADF); its start is not a use of what it releases.
                    let used: &[i32] = if releases(&c.name) { &[] } else { &c.fds };
                    self.touch(pid, tid, &c.name, used, i);
                    let epoll = c.fds.first().copied().filter(|_| waits_on_epoll(&c.name));
                    self.inside.insert(
                        tid,
                        Inside {
                            call: c,
                            epoll,
                            line: i,
                        },
                    );
                }
                Event::Resumed(c) => {
                    if let Some(started) =
                        self.inside.remove(&tid).filter(|s| s.call.name == c.name)
                    {
                        if let Some(site) = self.line_sites.get(&started.line).copied() {
                            self.line_sites.insert(i, site);
                        }
                        // Usage was noted when it started; its effects count where it returned,
                        // with what it made or sent (known only then).
                        if releases(&c.name) {
                            self.release(pid, tid, &c, i);
                        } else {
                            self.effects(pid, tid, &c, i);
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
                    self.sites.remove(&tid);
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
        // The hang as it was when the harness took its stacks, else at the trace's end.
        // Stacks taken mean the program was still running at its deadline: it hung.
        let hung = self.hung || self.at_hang.is_some();
        let (hang, when) = match self.at_hang.take() {
            Some(h) => (h, "when the run was found hung"),
            None => (self.hang_state(None), "when the trace ended"),
        };
        // A cycle among threads still waiting in a process that did not exit by itself is the
        // hang's, named whichever checks were asked.
        for (pid, f) in hang.cycles {
            let at = f.lines.first().copied().unwrap_or(0);
            self.flag(f.check, pid, None, f.detail, at, &f.lines);
        }
        if hung && untimed {
            for (tid, name, at) in hang.stuck {
                let pid = *self.tgid.get(&tid).unwrap_or(&tid);
                self.flag(
                    "wait without a bound",
                    pid,
                    None,
                    format!(
                        "thread {tid} was still inside {name}(){} with no timeout {when}",
                        self.site(at)
                    ),
                    at,
                    &[],
                );
            }
        }
        self.out
    }

    /// The calls in progress with no bound, and the wait-for cycles of processes that have
    /// not exited by themselves (stopped by a watchdog or a step's deadline; a kill ends
    /// their threads without a word of theirs), as of now; none of process `harness`'s.
    fn hang_state(&self, harness: Option<u32>) -> HangState {
        let theirs = |tid: &u32| Some(self.tgid.get(tid).copied().unwrap_or(*tid)) != harness;
        let stuck = self
            .inside
            .iter()
            .filter(|(t, c)| theirs(t) && c.call.unbounded)
            .map(|(t, c)| (*t, c.call.name.clone(), c.line))
            .collect();
        let cycles = self
            .waits
            .iter()
            .filter(|(pid, _)| Some(**pid) != harness)
            .filter(|(pid, _)| self.procs.get(pid).is_some_and(|p| !p.exiting))
            .filter_map(|(pid, w)| Some((*pid, w.deadlock()?)))
            .collect();
        HangState { stuck, cycles }
    }

    /// The recorder says `tid`'s calls of syscall `nr` come from `site` (0: unknown) from now.
    fn site_told(&mut self, tid: u32, nr: i64, site: u64) {
        let Some(name) = crate::hosts::syscall_trace::table::by_nr(nr).map(|s| s.name) else {
            return;
        };
        let told = self.sites.entry(tid).or_default();
        told.retain(|(n, _)| *n != name);
        if site != 0 {
            told.push((name, site));
        }
    }

    /// Where the call `tid` starts on line `i` was made, when the recorder said.
    fn note_site(&mut self, tid: u32, name: &str, i: usize) {
        if let Some((_, site)) = self
            .sites
            .get(&tid)
            .and_then(|told| told.iter().find(|(n, _)| *n == name))
        {
            self.line_sites.insert(i, *site);
        }
    }

    /// ` at 0x55d0…` for the call on line `i`, where its call site is known (the report names
    /// it as function and file:line); else nothing.
    fn site(&self, i: usize) -> String {
        self.line_sites
            .get(&i)
            .map_or_else(String::new, |a| format!(" at {a:#x}"))
    }

    /// A call that completed on one line.
    fn call(&mut self, pid: u32, tid: u32, c: &Call, i: usize) {
        match &c.operand {
            Operand::UringDone { req } => {
                self.uring.remove(&(pid, *req));
                return;
            }
            Operand::UringOp { fd, op, req } => {
                // `io_uring_op(7, IORING_OP_RECV, 0x…)`: in flight on fd 7 until its completion.
                self.use_fd(pid, tid, &c.name, *fd, i);
                self.uring.insert(
                    (pid, *req),
                    InFlight {
                        tid,
                        fd: *fd,
                        op: op.clone(),
                        line: i,
                    },
                );
                return;
            }
            // (One the recorder could not read.)
            _ if matches!(c.name.as_str(), "io_uring_op" | "io_uring_done") => return,
            _ => {}
        }
        if releases(&c.name) {
            self.release(pid, tid, c, i);
            return;
        }
        self.touch(pid, tid, &c.name, &c.fds, i);
        self.effects(pid, tid, c, i);
    }

    /// What a finished call leaves behind: new fds, new threads, EBADF, step markers.
    fn effects(&mut self, pid: u32, tid: u32, c: &Call, i: usize) {
        let in_step = self.step.contains_key(&pid).then_some(i);
        let name = c.name.as_str();
        match &c.operand {
            Operand::Marker(m) => {
                self.sync(pid, tid, *m, i);
                return;
            }
            Operand::Receiver(fd) => {
                let p = self.procs.entry(pid).or_default();
                p.names_receivers = true;
                p.threads.entry(tid).or_default().named_receiver_of = Some(*fd);
                return;
            }
            _ => {}
        }
        if let Some((child, thread)) = c.cloned() {
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
        let returned = c.ret.value();
        if let Operand::Futex { addr, op } = c.operand {
            // Code that does not go through pthreads (Rust's std locks, Go): a wake that woke
            // someone orders the waker before the wait it ended, where futex is recorded.
            let object = Object::Address { pid, addr };
            if op == FutexOp::Wake && returned.is_some_and(|n| n > 0) {
                self.hb.release(tid, object);
            } else if op == FutexOp::Wait && returned == Some(0) {
                self.hb.acquire(tid, object);
            }
            return;
        }
        if name == "futex" {
            return;
        }
        if matches!(name, "wait4" | "waitid") {
            if let Some(child) = returned.filter(|r| *r > 0) {
                self.hb.acquire(tid, Object::ProcessEnd(child as u32));
            }
        }
        if let Operand::Exec { path } = &c.operand {
            if returned == Some(0) {
                self.new_image(pid, i);
                self.procs.entry(pid).or_default().exe = path.clone();
            }
        }
        if let Operand::SetCloexec { fd, on } = c.operand {
            if returned == Some(0) {
                if let Some(f) = self.procs.entry(pid).or_default().fds.get_mut(&fd) {
                    f.cloexec = on;
                }
            }
        }
        let first_fd = c.fds.first().copied();
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
        let channel = (c.made.len() == 2 || name.starts_with("eventfd")).then(|| {
            self.channels += 1;
            self.channels
        });
        // A copy (dup, F_DUPFD) is of its source's kind; close-on-exec is the copy's own.
        let source_conduit = matches!(name, "dup" | "dup2" | "dup3" | "fcntl")
            .then_some(first_fd)
            .flatten()
            .and_then(|fd| self.procs.get(&pid)?.fds.get(&fd)?.conduit);
        let conduit = conduit_of(name).or(source_conduit);
        for (k, new) in c.made.iter().copied().enumerate() {
            // A pipe's reader waits for the end of its write end only.
            let conduit = conduit.filter(|c| *c != "pipe" || k == 1);
            // The kernel hands out a number only once it is free: a close of it still in
            // progress on another thread (its return not yet in the trace) is over by now.
            let closing: Vec<u32> = self
                .inside
                .iter()
                .filter(|(t, s)| {
                    s.call.name == "close"
                        && s.call.fds.contains(&new)
                        && self.tgid.get(t) == Some(&pid)
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
                    cloexec: c.cloexec,
                    conduit,
                    image_made: Some(i),
                    ..Fd::default()
                },
            );
        }
        if let (Operand::EpollCtl { epfd, op, fd }, Some(0)) = (&c.operand, returned) {
            self.epoll_ctl(pid, *epfd, *op, *fd);
        }
        let fds = if c.ret.is_error("EBADF") && self.on(AuditCheck::FdLifecycle) {
            c.fds.clone()
        } else {
            vec![]
        };
        for fd in fds {
            let closed = self.procs[&pid].fds.get(&fd).and_then(|f| f.closed_at);
            let already = self.out.iter().any(|v| {
                v.check == "use after close" && v.context.iter().any(|(n, _)| *n == i + 1)
            });
            if let (Some(closed), false) = (closed, already) {
                self.flag(
                    "use after close",
                    pid,
                    Some(fd),
                    format!(
                        "thread {tid} called {name}() on fd {fd} after its close (line {}): EBADF",
                        closed + 1
                    ),
                    i,
                    &[closed],
                );
            }
        }
        if let Operand::Step(mark) = c.operand {
            self.marker(pid, mark, i);
        }
    }
}

/// Every thread's process, from the whole trace first: a new thread's calls can come before
/// its creator's clone returns (strace and the ring buffer both show that under load), and
/// read in one pass they would be taken for another process's.
/// Also every process's parent.
fn threads_of(events: &[Option<Traced>]) -> Lineage {
    let mut tgid: BTreeMap<u32, u32> = BTreeMap::new();
    let mut parents: BTreeMap<u32, u32> = BTreeMap::new();
    let mut tools: BTreeSet<u32> = BTreeSet::new();
    // Threads that said their next process is the harness's tool.
    let mut starting_tool: BTreeSet<u32> = BTreeSet::new();
    // Threads whose process said it synchronizes through futexes of its own.
    let mut own_sync_threads: BTreeSet<u32> = BTreeSet::new();
    for Traced { tid, event, .. } in events.iter().flatten() {
        let tid = *tid;
        let c = match event {
            Event::Call(c) => {
                match c.marker().map(|m| m.kind) {
                    Some(SyncKind::Tool) => {
                        starting_tool.insert(tid);
                        continue;
                    }
                    Some(SyncKind::OwnSync) => {
                        own_sync_threads.insert(tid);
                        continue;
                    }
                    _ => {}
                }
                c
            }
            Event::Resumed(c) => c,
            _ => continue,
        };
        match c.cloned() {
            Some((child, true)) => {
                let root = *tgid.get(&tid).unwrap_or(&tid);
                tgid.insert(child, root);
            }
            Some((child, false)) => {
                let parent = *tgid.get(&tid).unwrap_or(&tid);
                parents.insert(child, parent);
                if starting_tool.remove(&tid) || tools.contains(&parent) {
                    tools.insert(child);
                }
            }
            None => {}
        }
    }
    let own_sync = own_sync_threads
        .iter()
        .map(|t| *tgid.get(t).unwrap_or(t))
        .collect();
    Lineage {
        tgid,
        parents,
        tools,
        own_sync,
    }
}

/// Who is whom in a trace, read from the whole of it first.
struct Lineage {
    /// Each thread's process.
    tgid: BTreeMap<u32, u32>,
    /// Each process's parent (a fork, not a thread).
    parents: BTreeMap<u32, u32>,
    /// The harness's own tools inside an audited rank (the watchdog's gdb) and their children:
    /// not the program's, so not checked.
    tools: BTreeSet<u32>,
    /// Processes that synchronize through futexes of their own (the observer's `OwnSync`),
    /// known from the whole trace: a release before that marker is judged the same way.
    own_sync: BTreeSet<u32>,
}
