//! The sync observer's markers in a trace: locks, waits, thread and channel edges, and the
//! step markers `leaks` counts between.

use super::*;

impl Audit<'_> {
    /// A sync observer's marker: an edge of happens-before, or the observer saying it is here.
    pub(super) fn sync(
        &mut self,
        pid: u32,
        tid: u32,
        m: crate::model::sync_marker::SyncMarker,
        i: usize,
    ) {
        let object = Object::Address {
            pid,
            addr: m.object,
        };
        if m.kind != SyncKind::Wait {
            self.waits.entry(pid).or_default().running(tid);
        }
        match m.kind {
            SyncKind::Attach => self.procs.entry(pid).or_default().observed = true,
            // The recorder's call-site bookkeeping, read before a line reaches here.
            // Read before the trace is (see `Lineage`), or the recorder's and harness's own.
            SyncKind::SiteSlot | SyncKind::CallSite | SyncKind::Tool | SyncKind::OwnSync => {}
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

    /// The rank reports each step's start and end to the coordinator; those writes bound the
    /// step for the leak check.
    pub(super) fn marker(&mut self, pid: u32, mark: StepMark, i: usize) {
        if mark == StepMark::Start {
            self.step.insert(pid, i);
            let p = self.procs.entry(pid).or_default();
            p.stepped = true;
            p.fds.values_mut().for_each(|f| f.created = None);
            p.threads.values_mut().for_each(|t| t.created = None);
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
