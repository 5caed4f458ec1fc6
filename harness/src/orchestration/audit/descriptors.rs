//! The descriptor rules: uses, releases, double closes, stale handles, and releases judged
//! by happens-before against other threads' waits.

use super::*;

impl Audit<'_> {
    /// Whether `c`, a call in progress in process `pid`, is on `fd` or waits for it through
    /// its epoll set (as the set is now); and which of the two.
    pub(super) fn waits_for(&self, pid: u32, c: &Inside, fd: i32) -> Option<bool> {
        if c.call.fds.contains(&fd) {
            return Some(false);
        }
        let set = self.procs.get(&pid)?.epoll_sets.get(&c.epoll?)?;
        set.contains(&fd).then_some(true)
    }

    /// A call that releases descriptors, once it returned: `close`; `close_range` (all the
    /// open ones in its range, unless it only marks them close-on-exec); `dup2` and `dup3`,
    /// which release their target when it was open, then make it anew.
    pub(super) fn release(&mut self, pid: u32, tid: u32, c: &Call, i: usize) {
        let name = c.name.as_str();
        let ok = c.ret.value() == Some(0)
            || (name != "close" && name != "close_range" && !c.ret.failed());
        match c.operand {
            Operand::Close { fd } if c.ret.is_error("EBADF") => {
                if fd >= 0 {
                    self.double_close(pid, tid, fd as i32, i);
                }
            }
            Operand::Close { fd } => {
                if ok && fd >= 0 {
                    self.close(pid, tid, fd as i32, "close", i);
                }
            }
            Operand::CloseRange {
                first,
                last,
                cloexec,
            } => {
                if !ok {
                    return;
                }
                if cloexec {
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
            _ if matches!(name, "close" | "close_range") => {}
            _ => {
                // dup2(old, new) = new: `new`, when open and not `old`, is closed first.
                self.touch(pid, tid, name, &c.fds, i);
                if let Operand::Dup { old, new } = c.operand {
                    let open = self
                        .procs
                        .get(&pid)
                        .and_then(|p| p.fds.get(&(new as i32)))
                        .is_some_and(|f| f.closed_at.is_none());
                    if ok && open && old != new {
                        self.close(pid, tid, new as i32, name, i);
                    }
                }
                self.effects(pid, tid, c, i);
            }
        }
    }

    /// The thread is now inside (or through) `name` on `fd`: note the use, or flag a use after
    /// close.
    pub(super) fn touch(&mut self, pid: u32, tid: u32, name: &str, fds: &[i32], i: usize) {
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

    pub(super) fn use_fd(&mut self, pid: u32, tid: u32, name: &str, fd: i32, i: usize) {
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
                            "thread {tid} called {name}(){} on fd {fd} after its close (line {}{})",
                            self.site(i),
                            c + 1,
                            self.site(c)
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
    pub(super) fn close(&mut self, pid: u32, tid: u32, fd: i32, how: &str, i: usize) {
        self.touch(pid, tid, how, &[], i);
        self.stale_handle(pid, tid, fd, how, i);
        if self.on(AuditCheck::FdLifecycle) {
            let in_use: Vec<(u32, String, bool, usize)> = self
                .inside
                .iter()
                .filter(|(t, _)| **t != tid && self.tgid.get(t) == Some(&pid))
                .filter_map(|(t, c)| {
                    let through_set = self.waits_for(pid, c, fd)?;
                    Some((*t, c.call.name.clone(), through_set, c.line))
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
                        "thread {tid} {verb} fd {fd}{} while an io_uring {op} submitted by thread \
                         {by} (line {}) was still in flight on it: the operation keeps the \
                         descriptor's file (and its peer) alive past the close and completes \
                         later; cancel it (IORING_OP_ASYNC_CANCEL) and wait for its completion \
                         before the close",
                        self.site(i),
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
                        "thread {tid} {verb} fd {fd}{} while thread {other} was inside {name}(){} {on}",
                        self.site(i),
                        self.site(at)
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
            // A process that synchronizes through futexes of its own (Rust's std, C++20 atomic
            // waits) can order a hand-over with nothing in the trace (a lock-free queue): there
            // neither order nor timing can judge a release, only what is certain (a call on
            // the descriptor still in progress, EBADF, a second close).
            let own_sync = self.own_sync.contains(&pid);
            let by_order = p.observed && !p.names_receivers && !own_sync;
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
                            !own_sync && th.receiving == Some(fd)
                        }
                })
                .map(|(t, _)| *t)
                .collect();
            for r in receivers {
                self.flag(
                    "close before the receiver is done",
                    pid,
                    Some(fd),
                    format!(
                        "thread {tid} {verb} fd {fd}{} while thread {r}, its receiver, had not exited",
                        self.site(i)
                    ),
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
                            self.tgid.get(t) == Some(&h.pid) && c.call.name != "exit_group"
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
    pub(super) fn double_close(&mut self, pid: u32, tid: u32, fd: i32, i: usize) {
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
                "thread {tid} closed fd {fd} again{}: thread {by} had closed it (line {}{}), and \
                 the close failed with EBADF; had the number been reopened in between, it would \
                 have closed someone else's descriptor",
                self.site(i),
                closed + 1,
                self.site(closed)
            ),
            i,
            &[closed],
        );
    }

    /// Whether the close of `fd` at line `i` is one of a sweep over every number (before an
    /// exec, or a daemon's start): this thread's closes around it make a run of three
    /// consecutive numbers with it.
    pub(super) fn in_sweep(&self, tid: u32, fd: i32, i: usize) -> bool {
        let closed_by_tid = |t: &Option<Traced>| -> Option<i32> {
            match t.as_ref()? {
                Traced {
                    tid: t,
                    event: Event::Call(c) | Event::Started(c),
                    ..
                } if *t == tid => match c.operand {
                    Operand::Close { fd } => i32::try_from(fd).ok(),
                    _ => None,
                },
                _ => None,
            }
        };
        let next: Vec<i32> = self.events[i + 1..]
            .iter()
            .take(128)
            .filter_map(&closed_by_tid)
            .take(2)
            .collect();
        // Its own start, when strace split it, is not a neighbour.
        let prev: Vec<i32> = self.events[..i]
            .iter()
            .rev()
            .take(128)
            .filter_map(&closed_by_tid)
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
    pub(super) fn stale_handle(&mut self, pid: u32, tid: u32, fd: i32, name: &str, i: usize) {
        if self.own_sync.contains(&pid) {
            // Its reopening may be ordered by what no trace shows (see `close`).
            return;
        }
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
                "thread {tid} {how} fd {fd} with {name}(){} through a stale handle: the \
                 descriptor it held was closed by thread {closer} and the number reopened by \
                 thread {}, and nothing orders this call after that reopening",
                self.site(i),
                made.tid
            ),
            i,
            &[],
        )
        .by_order = true;
    }

    /// The happens-before check of a release by `tid`: every other thread's last wait or
    /// receive on `fd` must be ordered before it.
    pub(super) fn unordered_waits(&mut self, pid: u32, tid: u32, fd: i32, verb: &str, i: usize) {
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
                    "thread {tid} {verb} fd {fd}{}, and nothing orders thread {other}'s \
                     {call}({fd}) (line {}{}) before it: no join, lock, condition, semaphore or \
                     message between them, so in another run that {call} comes after the close",
                    self.site(i),
                    line + 1,
                    self.site(line)
                ),
                i,
                &[line],
            )
            .by_order = true;
        }
    }

    /// `epoll_ctl(5, EPOLL_CTL_ADD, 7, {…}) = 0`: 7 joins (or with DEL leaves) set 5.
    pub(super) fn epoll_ctl(&mut self, pid: u32, epfd: i32, op: EpollOp, fd: i32) {
        let sets = &mut self.procs.entry(pid).or_default().epoll_sets;
        match op {
            EpollOp::Add => {
                sets.entry(epfd).or_default().insert(fd);
            }
            EpollOp::Del => {
                sets.entry(epfd).or_default().remove(&fd);
            }
            EpollOp::Other => {}
        }
    }
}
