//! The wait-for audit (`waits`): deadlocks that did not happen, from the sync observer's
//! markers. Pure: fed per process, in trace order, with which thread holds, lets go of and
//! waits for what; it says what could block for ever.
//!
//! - **Lock order**: a cycle in "lock L held while M taken", over any number of threads, except
//!   a cycle that lies within one thread, or that one common gate lock guards throughout (the
//!   false alarms ThreadSanitizer's users report).
//! - **Waiting under a lock**: a thread joins, or waits on a semaphore, a barrier or a
//!   condition (other than the one whose mutex it gives up), while holding a lock that another
//!   thread takes somewhere in the run. That thread is stalled for as long as the wait lasts,
//!   and if it is the one that would end the wait (the joined thread, the poster, the
//!   signaller), for ever: DAQIRI's event loop joined a worker under `threads_mutex_`, which
//!   its stats thread takes.
//! - **Waits without a bound** (with `unbounded-waits`): untimed joins, condition, semaphore and
//!   barrier waits.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::sync_marker::WaitKind;

pub type Tid = u32;

/// One finding, with the threads, locks and call sites it names.
#[derive(Clone, Debug, PartialEq)]
pub struct WaitFinding {
    pub check: &'static str,
    pub detail: String,
    /// Trace lines (0-based) that show it.
    pub lines: Vec<usize>,
}

#[derive(Clone, Debug)]
struct Edge {
    tid: Tid,
    /// Where the first lock was taken and where the second was.
    sites: (u64, u64),
    line: usize,
    /// The other locks the thread held when it took the second: a gate if held on every edge.
    also_held: BTreeSet<u64>,
}

#[derive(Clone, Debug)]
struct Held {
    lock: u64,
    site: u64,
}

#[derive(Clone, Debug)]
struct Wait {
    tid: Tid,
    kind: WaitKind,
    object: u64,
    timed: bool,
    site: u64,
    line: usize,
    held: Vec<Held>,
}

#[derive(Default, Debug)]
pub struct WaitFor {
    held: BTreeMap<Tid, Vec<Held>>,
    /// Where each lock was first taken, and by whom.
    first: BTreeMap<u64, (Tid, u64, usize)>,
    takers: BTreeMap<u64, BTreeSet<Tid>>,
    /// Threads that released (posted, signalled, arrived at) each object.
    releasers: BTreeMap<u64, BTreeSet<Tid>>,
    /// Threads that took (acquired) each object: with `releasers`, whether a semaphore is used
    /// as a lock.
    acquirers: BTreeMap<u64, BTreeSet<Tid>>,
    /// A thread's handle (pthread_t) -> the thread.
    handles: BTreeMap<u64, Tid>,
    edges: BTreeMap<(u64, u64), Edge>,
    waits: Vec<Wait>,
    /// Each thread's wait in progress: told, and nothing of the thread seen since.
    current: BTreeMap<Tid, Wait>,
}

fn hex(a: u64) -> String {
    format!("{a:#x}")
}

/// A call site by address; 0 is a marker a program sent itself (wringer's Rust transport,
/// `sync_marks.rs`), which carries none.
fn site(a: u64) -> String {
    if a == 0 {
        "a site it does not record (a marker the program sends itself)".into()
    } else {
        hex(a)
    }
}

impl WaitFor {
    /// `tid` holds `lock` from here; `tried`: it took it by a try-lock, which never blocks, so
    /// it closes no lock-order cycle and is no taker a holder could stall.
    pub fn hold(&mut self, tid: Tid, lock: u64, site: u64, line: usize, tried: bool) {
        self.first.entry(lock).or_insert((tid, site, line));
        if tried {
            self.held.entry(tid).or_default().push(Held { lock, site });
            return;
        }
        self.takers.entry(lock).or_default().insert(tid);
        let held = self.held.entry(tid).or_default();
        let others: BTreeSet<u64> = held.iter().map(|h| h.lock).collect();
        for h in held.iter().filter(|h| h.lock != lock) {
            let mut also = others.clone();
            also.remove(&h.lock);
            self.edges.entry((h.lock, lock)).or_insert(Edge {
                tid,
                sites: (h.site, site),
                line,
                also_held: also,
            });
        }
        held.push(Held { lock, site });
    }

    /// `tid` took `lock` at some point the trace does not show (the observer tells a lock's
    /// earlier holder when a second thread first takes it).
    pub fn taker(&mut self, tid: Tid, lock: u64) {
        self.takers.entry(lock).or_default().insert(tid);
    }

    pub fn drop_lock(&mut self, tid: Tid, lock: u64) {
        let held = self.held.entry(tid).or_default();
        if let Some(i) = held.iter().rposition(|h| h.lock == lock) {
            held.remove(i);
        }
    }

    pub fn release(&mut self, tid: Tid, object: u64) {
        self.releasers.entry(object).or_default().insert(tid);
    }

    /// `tid` took `object` (a lock, a semaphore's count, a condition's signal).
    pub fn acquired(&mut self, tid: Tid, object: u64) {
        self.acquirers.entry(object).or_default().insert(tid);
    }

    /// A semaphore used as a lock (CPython's `threading.Lock`, its import lock): every thread
    /// that posts it took it first. Waiting for it is taking a lock, which lock order judges,
    /// not a hand-shake with whoever posts it next.
    fn lock_like(&self, object: u64) -> bool {
        let (Some(posters), Some(takers)) =
            (self.releasers.get(&object), self.acquirers.get(&object))
        else {
            return false;
        };
        posters.is_subset(takers)
    }

    pub fn end(&mut self, tid: Tid, handle: u64) {
        self.handles.insert(handle, tid);
        self.held.remove(&tid);
    }

    pub fn wait(
        &mut self,
        tid: Tid,
        kind: WaitKind,
        object: u64,
        timed: bool,
        site: u64,
        line: usize,
    ) {
        if kind == WaitKind::Barrier {
            self.releasers.entry(object).or_default().insert(tid);
        }
        let w = Wait {
            tid,
            kind,
            object,
            timed,
            site,
            line,
            held: self.held.get(&tid).cloned().unwrap_or_default(),
        };
        self.current.insert(tid, w.clone());
        // A busy lock under another is lock order's business, not a wait under a lock.
        if kind != WaitKind::Lock {
            self.waits.push(w);
        }
    }

    /// The thread `handle` names started.
    pub fn start(&mut self, tid: Tid, handle: u64) {
        self.handles.insert(handle, tid);
    }

    /// `tid` did something after its last wait: that wait is over.
    pub fn running(&mut self, tid: Tid) {
        self.current.remove(&tid);
    }

    /// After a hang: a cycle among the threads still waiting, each for a lock another of them
    /// holds or for the end of another of them, named thread by thread.
    pub fn deadlock(&self) -> Option<WaitFinding> {
        let waits_for = |w: &Wait| -> Option<(Tid, String)> {
            match w.kind {
                // Another holder first; a lock only the waiter holds (a non-recursive mutex
                // taken again, a read lock upgraded in place) is a cycle of one.
                WaitKind::Lock => {
                    let holding = |others: bool| {
                        self.held.iter().find_map(|(t, held)| {
                            let h = held.iter().find(|h| h.lock == w.object)?;
                            ((*t != w.tid) == others).then_some((*t, h.site))
                        })
                    };
                    let (t, at) = holding(true).or_else(|| holding(false))?;
                    let whom = if t == w.tid {
                        format!("which it holds itself (taken at {})", site(at))
                    } else {
                        format!("held by thread {t} (taken at {})", site(at))
                    };
                    Some((t, whom))
                }
                WaitKind::Join => {
                    let t = *self.handles.get(&w.object)?;
                    (t != w.tid).then(|| (t, format!("thread {t}, which has not ended")))
                }
                _ => None,
            }
        };
        for &start in self.current.keys() {
            let mut path: Vec<(Tid, String)> = vec![];
            let mut at = start;
            while path.len() <= self.current.len() {
                let w = self.current.get(&at)?;
                let Some((next, why)) = waits_for(w) else {
                    break;
                };
                let what = match w.kind {
                    WaitKind::Lock => format!("lock {}", hex(w.object)),
                    _ => String::new(),
                };
                path.push((
                    at,
                    format!(
                        "thread {at} waits (at {}) for {}{}{}",
                        site(w.site),
                        what,
                        if what.is_empty() { "" } else { " " },
                        why
                    ),
                ));
                if let Some(k) = path.iter().position(|(t, _)| *t == next) {
                    let cycle = &path[k..];
                    let lines = cycle
                        .iter()
                        .filter_map(|(t, _)| self.current.get(t).map(|w| w.line))
                        .collect();
                    return Some(WaitFinding {
                        check: "deadlock",
                        detail: format!(
                            "the run hung in a wait-for cycle: {}; none of them can move",
                            cycle
                                .iter()
                                .map(|(_, s)| s.as_str())
                                .collect::<Vec<_>>()
                                .join("; ")
                        ),
                        lines,
                    });
                }
                at = next;
            }
        }
        None
    }

    fn lock_name(&self, lock: u64) -> String {
        match self.first.get(&lock) {
            Some((t, at, _)) => format!(
                "lock {} (first taken by thread {t} at {})",
                hex(lock),
                site(*at)
            ),
            None => format!("lock {}", hex(lock)),
        }
    }

    /// Every finding, lock-order cycles and waits under a lock; untimed waits too when asked.
    pub fn findings(&self, unbounded: bool) -> Vec<WaitFinding> {
        let mut out = self.cycles();
        out.extend(self.waits_under_a_lock());
        if unbounded {
            let stuck = self.may_wait_for_ever();
            let unbounded_wait = |w: &&Wait| {
                !w.timed
                    && match w.kind {
                        WaitKind::Condition => true,
                        WaitKind::Semaphore => !self.lock_like(w.object),
                        WaitKind::Join => self
                            .handles
                            .get(&w.object)
                            .is_some_and(|t| stuck.contains(t)),
                        WaitKind::Barrier | WaitKind::Lock => false,
                    }
            };
            out.extend(
                self.waits
                    .iter()
                    .filter(unbounded_wait)
                    .map(|w| WaitFinding {
                        check: "wait without a bound",
                        detail: format!(
                            "thread {} made {} {} with no deadline (at {})",
                            w.tid,
                            w.kind.noun(),
                            self.waited(w),
                            site(w.site)
                        ),
                        lines: vec![w.line],
                    }),
            );
        }
        out
    }

    /// Threads that make an untimed condition or semaphore wait, or join one that does (to a
    /// fixpoint): a join of such a thread has no bound either.
    fn may_wait_for_ever(&self) -> BTreeSet<Tid> {
        let mut stuck: BTreeSet<Tid> = self
            .waits
            .iter()
            .filter(|w| !w.timed && matches!(w.kind, WaitKind::Condition | WaitKind::Semaphore))
            .filter(|w| !(w.kind == WaitKind::Semaphore && self.lock_like(w.object)))
            .map(|w| w.tid)
            .collect();
        loop {
            let more: Vec<Tid> = self
                .waits
                .iter()
                .filter(|w| !w.timed && w.kind == WaitKind::Join && !stuck.contains(&w.tid))
                .filter(|w| {
                    self.handles
                        .get(&w.object)
                        .is_some_and(|t| stuck.contains(t))
                })
                .map(|w| w.tid)
                .collect();
            if more.is_empty() {
                return stuck;
            }
            stuck.extend(more);
        }
    }

    /// What a wait waits on, in words.
    fn waited(&self, w: &Wait) -> String {
        match (w.kind, self.handles.get(&w.object)) {
            (WaitKind::Join, Some(t)) => format!("thread {t}"),
            (WaitKind::Join, None) => format!("thread handle {}", hex(w.object)),
            _ => hex(w.object),
        }
    }

    fn waits_under_a_lock(&self) -> Vec<WaitFinding> {
        let mut out = vec![];
        let mut seen = BTreeSet::new();
        for w in &self.waits {
            if w.kind == WaitKind::Semaphore && self.lock_like(w.object) {
                continue;
            }
            for h in &w.held {
                let others: Vec<Tid> = self
                    .takers
                    .get(&h.lock)
                    .map(|t| t.iter().copied().filter(|t| *t != w.tid).collect())
                    .unwrap_or_default();
                let Some(&other) = others.first() else {
                    continue;
                };
                if !seen.insert((w.tid, w.object, h.lock)) {
                    continue;
                }
                // The thread that would end the wait, when it also takes the lock: for ever.
                let enders: BTreeSet<Tid> = match w.kind {
                    WaitKind::Join => self.handles.get(&w.object).copied().into_iter().collect(),
                    _ => self.releasers.get(&w.object).cloned().unwrap_or_default(),
                };
                let ender = others.iter().find(|t| enders.contains(t));
                // A join waits out a whole thread's life: any thread that takes the lock is
                // stalled as long (DAQIRI's stats thread). A semaphore, condition or barrier
                // wait is a hand-shake: only its ender taking the lock can make it last.
                if ender.is_none() && w.kind != WaitKind::Join {
                    continue;
                }
                let consequence = match ender {
                    Some(e) => format!(
                        "thread {e}, which would end that wait, takes the same lock: if it needs it \
                         first, neither moves again"
                    ),
                    None => format!(
                        "thread {other} takes the same lock, and is stalled for as long as the \
                         wait lasts (for ever, if what ends the wait needs it)"
                    ),
                };
                out.push(WaitFinding {
                    check: "wait under a lock",
                    detail: format!(
                        "thread {} made {} {} (at {}) while holding {} (taken at {}); {consequence}",
                        w.tid,
                        w.kind.noun(),
                        self.waited(w),
                        site(w.site),
                        self.lock_name(h.lock),
                        site(h.site)
                    ),
                    lines: vec![w.line],
                });
            }
        }
        out
    }

    /// Simple cycles of the lock graph (each found once), short of a gate or one thread.
    fn cycles(&self) -> Vec<WaitFinding> {
        let mut next: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (a, b) in self.edges.keys() {
            next.entry(*a).or_default().push(*b);
        }
        let mut out = vec![];
        let mut found: BTreeSet<Vec<u64>> = BTreeSet::new();
        for &start in next.keys() {
            let mut path = vec![start];
            self.walk(start, &next, &mut path, &mut found, &mut out);
        }
        out
    }

    fn walk(
        &self,
        start: u64,
        next: &BTreeMap<u64, Vec<u64>>,
        path: &mut Vec<u64>,
        found: &mut BTreeSet<Vec<u64>>,
        out: &mut Vec<WaitFinding>,
    ) {
        if path.len() > 6 {
            return;
        }
        let here = *path.last().unwrap();
        for &to in next.get(&here).into_iter().flatten() {
            if to == start {
                self.report_cycle(path, found, out);
            } else if to > start && !path.contains(&to) {
                path.push(to);
                self.walk(start, next, path, found, out);
                path.pop();
            }
        }
    }

    fn report_cycle(
        &self,
        cycle: &[u64],
        found: &mut BTreeSet<Vec<u64>>,
        out: &mut Vec<WaitFinding>,
    ) {
        if !found.insert(cycle.to_vec()) {
            return;
        }
        let edges: Vec<(u64, u64, &Edge)> = (0..cycle.len())
            .map(|i| {
                let (a, b) = (cycle[i], cycle[(i + 1) % cycle.len()]);
                (a, b, &self.edges[&(a, b)])
            })
            .collect();
        let threads: BTreeSet<Tid> = edges.iter().map(|(_, _, e)| e.tid).collect();
        if threads.len() < 2 {
            return;
        }
        let mut gates = edges[0].2.also_held.clone();
        for (_, _, e) in &edges[1..] {
            gates = gates.intersection(&e.also_held).copied().collect();
        }
        if !gates.is_empty() {
            return;
        }
        let steps: Vec<String> = edges
            .iter()
            .map(|(a, b, e)| {
                format!(
                    "thread {} took {} (at {}) while holding {} (taken at {})",
                    e.tid,
                    hex(*b),
                    site(e.sites.1),
                    hex(*a),
                    site(e.sites.0)
                )
            })
            .collect();
        let locks: Vec<String> = cycle.iter().map(|l| self.lock_name(*l)).collect();
        out.push(WaitFinding {
            check: "lock order",
            detail: format!(
                "the locks {} are taken in a cycle: {}; run with these threads at those points \
                 together, each waits for the next for ever",
                locks.join(", "),
                steps.join("; ")
            ),
            lines: edges.iter().map(|(_, _, e)| e.line).collect(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: u64 = 0x10;
    const M: u64 = 0x20;
    const N: u64 = 0x30;
    const G: u64 = 0x40;

    fn checks(w: &WaitFor) -> Vec<&'static str> {
        w.findings(false).iter().map(|f| f.check).collect()
    }

    #[test]
    fn two_threads_taking_two_locks_in_opposite_orders_are_a_cycle() {
        let mut w = WaitFor::default();
        w.hold(1, L, 0xa, 1, false);
        w.hold(1, M, 0xb, 2, false);
        w.drop_lock(1, M);
        w.drop_lock(1, L);
        w.hold(2, M, 0xc, 3, false);
        w.hold(2, L, 0xd, 4, false);
        let f = w.findings(false);
        assert_eq!(checks(&w), vec!["lock order"], "{f:#?}");
        assert!(
            f[0].detail
                .contains("thread 2 took 0x10 (at 0xd) while holding 0x20"),
            "{}",
            f[0].detail
        );
    }

    #[test]
    fn a_three_lock_cycle_is_found_once() {
        let mut w = WaitFor::default();
        for (t, a, b) in [(1, L, M), (2, M, N), (3, N, L)] {
            w.hold(t, a, 1, 0, false);
            w.hold(t, b, 2, 0, false);
            w.drop_lock(t, b);
            w.drop_lock(t, a);
        }
        assert_eq!(checks(&w), vec!["lock order"]);
    }

    #[test]
    fn one_thread_s_own_inversions_and_a_gated_cycle_are_not_cycles() {
        let mut w = WaitFor::default();
        w.hold(1, L, 1, 0, false);
        w.hold(1, M, 2, 0, false);
        w.drop_lock(1, M);
        w.drop_lock(1, L);
        w.hold(1, M, 3, 0, false);
        w.hold(1, L, 4, 0, false);
        assert!(checks(&w).is_empty());
        let mut g = WaitFor::default();
        for (t, a, b) in [(1, L, M), (2, M, L)] {
            g.hold(t, G, 0, 0, false);
            g.hold(t, a, 1, 0, false);
            g.hold(t, b, 2, 0, false);
            g.drop_lock(t, b);
            g.drop_lock(t, a);
            g.drop_lock(t, G);
        }
        assert!(checks(&g).is_empty(), "{:#?}", g.findings(false));
    }

    #[test]
    fn a_join_under_a_lock_the_joined_thread_takes_is_for_ever() {
        let mut w = WaitFor::default();
        w.hold(2, L, 0xa, 0, false);
        w.drop_lock(2, L);
        w.hold(1, L, 0xb, 1, false);
        w.wait(1, WaitKind::Join, 0x7f00, false, 0xc, 2);
        w.drop_lock(1, L);
        w.end(2, 0x7f00);
        let f = w.findings(false);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].check, "wait under a lock");
        assert!(
            f[0].detail.contains("a join of thread 2"),
            "{}",
            f[0].detail
        );
        assert!(
            f[0].detail.contains("which would end that wait"),
            "{}",
            f[0].detail
        );
    }

    #[test]
    fn daqiri_s_join_under_the_registry_lock_a_stats_thread_takes() {
        let mut w = WaitFor::default();
        w.hold(3, L, 0xa, 0, false); // stats
        w.drop_lock(3, L);
        w.hold(1, L, 0xb, 1, false); // event loop
        w.wait(1, WaitKind::Join, 0x7f00, false, 0xc, 2);
        w.end(2, 0x7f00); // the worker, which never takes L
        let f = w.findings(false);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert!(
            f[0].detail.contains("thread 3 takes the same lock"),
            "{}",
            f[0].detail
        );
    }

    #[test]
    fn waits_with_nothing_held_or_a_lock_no_one_else_takes_are_fine() {
        let mut w = WaitFor::default();
        w.wait(1, WaitKind::Semaphore, 0x50, false, 1, 0);
        w.hold(1, L, 1, 1, false);
        w.wait(1, WaitKind::Condition, 0x60, false, 2, 2);
        w.drop_lock(1, L);
        assert!(checks(&w).is_empty());
        let f = w.findings(true);
        assert_eq!(
            f.iter()
                .filter(|f| f.check == "wait without a bound")
                .count(),
            2,
            "{f:#?}"
        );
    }

    #[test]
    fn a_join_is_unbounded_only_when_the_joined_thread_waits_without_a_bound() {
        let mut w = WaitFor::default();
        w.wait(1, WaitKind::Join, 0x7f00, false, 1, 0);
        w.end(2, 0x7f00);
        assert!(
            w.findings(true).is_empty(),
            "a join of a thread that never waits untimed"
        );
        w.wait(3, WaitKind::Join, 0x7f10, false, 2, 1);
        w.wait(4, WaitKind::Semaphore, 0x50, false, 3, 2);
        w.end(4, 0x7f10);
        let f = w.findings(true);
        assert_eq!(f.len(), 2, "{f:#?}");
        assert!(
            f.iter().any(|f| f.detail.contains("a join of thread 4")),
            "{f:#?}"
        );
    }

    /// Threads still waiting, each for a lock another holds or for another's end: the cycle
    /// is named; a wait that is over (the thread ran on) is not part of one.
    #[test]
    fn threads_still_waiting_for_each_other_are_a_deadlock() {
        let mut w = WaitFor::default();
        w.hold(1, 0xa, 0x11, 0, false);
        w.hold(2, 0xb, 0x22, 1, false);
        w.wait(1, WaitKind::Lock, 0xb, false, 0x13, 2);
        assert!(w.deadlock().is_none(), "thread 2 is not waiting");
        w.wait(2, WaitKind::Lock, 0xa, false, 0x23, 3);
        let d = w.deadlock().expect("a cycle");
        assert_eq!(d.check, "deadlock");
        assert!(
            d.detail
                .contains("thread 1 waits (at 0x13) for lock 0xb held by thread 2 (taken at 0x22)"),
            "{}",
            d.detail
        );
        assert!(
            d.detail
                .contains("thread 2 waits (at 0x23) for lock 0xa held by thread 1 (taken at 0x11)"),
            "{}",
            d.detail
        );
        w.running(2);
        assert!(w.deadlock().is_none());
        // A join of a thread that waits for a lock its joiner holds.
        let mut j = WaitFor::default();
        j.start(5, 0x7f00);
        j.hold(4, 0xc, 0x31, 0, false);
        j.wait(4, WaitKind::Join, 0x7f00, false, 0x32, 1);
        j.wait(5, WaitKind::Lock, 0xc, false, 0x51, 2);
        let d = j.deadlock().expect("a cycle");
        assert!(
            d.detail.contains("for thread 5, which has not ended"),
            "{}",
            d.detail
        );
    }

    /// A thread waiting for a lock only it holds (a plain mutex locked twice) is a cycle of
    /// one; where another thread holds it too (read locks), that one is named instead. Two
    /// threads that join each other are a cycle, the main thread's handle included.
    #[test]
    fn a_thread_waiting_for_its_own_lock_or_a_join_cycle_is_a_deadlock() {
        let mut w = WaitFor::default();
        w.hold(1, 0xa, 0x11, 0, false);
        w.wait(1, WaitKind::Lock, 0xa, false, 0x12, 1);
        let d = w.deadlock().expect("a cycle of one");
        assert!(
            d.detail.contains(
                "thread 1 waits (at 0x12) for lock 0xa which it holds itself (taken at 0x11)"
            ),
            "{}",
            d.detail
        );
        w.hold(2, 0xa, 0x21, 2, false);
        w.wait(2, WaitKind::Lock, 0xa, false, 0x22, 3);
        let d = w.deadlock().expect("a cycle through thread 2");
        assert!(d.detail.contains("held by thread 2"), "{}", d.detail);
        let mut j = WaitFor::default();
        j.start(1, 0x7f01);
        j.start(2, 0x7f02);
        j.wait(1, WaitKind::Join, 0x7f02, false, 0x13, 4);
        j.wait(2, WaitKind::Join, 0x7f01, false, 0x23, 5);
        let d = j.deadlock().expect("a join cycle");
        assert!(
            d.detail.contains("for thread 2, which has not ended")
                && d.detail.contains("for thread 1, which has not ended"),
            "{}",
            d.detail
        );
    }

    /// A try-lock never blocks: no lock-order edge ends in it, and a thread that takes a lock
    /// only by trying (Gloo's event loop on a pair's mutex) is no taker a wait under it stalls.
    /// A hand-shake wait (here a condition) under a lock is flagged only when its ender takes
    /// the lock blocking; a join under one whenever anyone does.
    #[test]
    fn try_locks_close_no_cycle_and_stall_no_one() {
        let mut w = WaitFor::default();
        w.hold(1, L, 1, 0, false);
        w.hold(1, M, 2, 0, false);
        w.drop_lock(1, M);
        w.drop_lock(1, L);
        w.hold(2, M, 3, 1, false);
        w.hold(2, L, 4, 1, true);
        assert!(w.findings(false).is_empty(), "{:#?}", w.findings(false));
        let mut c = WaitFor::default();
        c.hold(1, L, 1, 0, false);
        c.release(2, 0xc0);
        c.hold(2, L, 2, 1, true);
        c.wait(1, WaitKind::Condition, 0xc0, false, 3, 2);
        assert!(c.findings(false).is_empty(), "{:#?}", c.findings(false));
        c.hold(3, L, 4, 3, false);
        assert!(
            c.findings(false).is_empty(),
            "a bystander does not end a condition wait"
        );
        c.hold(2, L, 5, 4, false);
        assert_eq!(
            c.findings(false).len(),
            1,
            "its signaller takes the lock blocking"
        );
    }

    /// A semaphore every poster of which took it first is a lock (CPython's locks): a wait
    /// for it under another lock is lock order's question, not a hand-shake's.
    #[test]
    fn a_semaphore_used_as_a_lock_is_no_hand_shake() {
        let mut w = WaitFor::default();
        w.hold(2, L, 1, 0, false);
        w.wait(2, WaitKind::Semaphore, 0x5e, false, 2, 1);
        w.acquired(2, 0x5e);
        w.release(2, 0x5e);
        w.acquired(1, 0x5e);
        w.release(1, 0x5e);
        w.hold(1, L, 3, 2, false);
        assert!(w.findings(true).is_empty(), "{:#?}", w.findings(true));
        // A poster that never takes it: a hand-shake, its ender takes the lock.
        w.release(3, 0x5e);
        w.hold(3, L, 4, 3, false);
        assert_eq!(w.findings(false).len(), 1, "{:#?}", w.findings(false));
    }
}
