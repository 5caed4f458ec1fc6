//! Descriptors across `fork` and `execve`: what a child inherits, what a new program image
//! carries without knowing, and what is still open at a program's exit (`leaks`).

use super::*;

impl Audit<'_> {
    /// A forked process starts with a copy of its parent's open descriptors, as the parent's
    /// are when the child's first call or the fork's return is read, whichever comes first
    /// (a `vfork` returns only after the child's `execve`).
    pub(super) fn inherit(&mut self, child: u32) {
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
    pub(super) fn alive(&mut self, pid: u32) {
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
    pub(super) fn new_image(&mut self, pid: u32, i: usize) {
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
    pub(super) fn inherited_leaks(&mut self) {
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
    pub(super) fn exit_leaks(&mut self) {
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
}
