//! Happens-before between a trace's threads, by vector clocks (as race detectors order memory
//! accesses; here, descriptor calls). Pure: the audit feeds it the edges the trace shows and
//! asks whether one thread's call is ordered before another's.
//!
//! Edges: a thread's start after its creator's clone; a release (unlock, signal, post, a
//! thread's end, a write into a pipe) before every later acquire of the same object (lock,
//! wait, join, a read from the pipe); a process's end before the wait that reaps it.
//!
//! Each thread's own component counts its releases: a call made at component `c` is ordered
//! before another thread's point when that thread has acquired a release made at `c` or later.

use std::collections::HashMap;

pub type Tid = u32;

/// What a thread knows of every thread's history: thread -> how many of its epochs.
/// A thread's (or an object's) knowledge of every thread's progress, by the threads' dense
/// indexes: a join is an element-wise max (thousands of threads, a short-lived one per
/// connection, stay linear). A component counts one thread's releases, which stay far below
/// 2^32 in any trace a machine can hold; 32 bits halve what every join reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VectorClock(Vec<u32>);

impl VectorClock {
    fn get(&self, i: usize) -> u64 {
        self.0.get(i).copied().map_or(0, u64::from)
    }

    fn join(&mut self, other: &VectorClock) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            *mine = (*mine).max(*theirs);
        }
    }

    fn tick(&mut self, i: usize) {
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        self.0[i] += 1;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epoch {
    pub tid: Tid,
    pub clock: u64,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Object {
    Address { pid: u32, addr: u64 },
    Channel { pid: u32, id: u64 },
    ProcessEnd(u32),
}

#[derive(Debug, Default)]
pub struct HappensBefore {
    /// Each thread's dense index into the clocks.
    index: HashMap<Tid, usize>,
    threads: Vec<VectorClock>,
    objects: HashMap<Object, VectorClock>,
}

impl HappensBefore {
    /// `t`'s index, its clock started (ticked once) when it is first seen.
    fn slot(&mut self, t: Tid) -> usize {
        if let Some(&i) = self.index.get(&t) {
            return i;
        }
        let i = self.threads.len();
        self.index.insert(t, i);
        let mut c = VectorClock::default();
        c.tick(i);
        self.threads.push(c);
        i
    }

    pub fn now(&mut self, t: Tid) -> Epoch {
        let i = self.slot(t);
        Epoch {
            tid: t,
            clock: self.threads[i].get(i),
        }
    }

    pub fn spawn(&mut self, parent: Tid, child: Tid) {
        let p = self.slot(parent);
        let c = self.slot(child);
        self.learn(c, p);
        self.threads[p].tick(p);
    }

    /// Thread `into` learns what thread `from` knows now (no copy of either clock).
    fn learn(&mut self, into: usize, from: usize) {
        if into == from {
            return;
        }
        let (low, high) = self.threads.split_at_mut(into.max(from));
        let (dst, src) = if into < from {
            (&mut low[into], &high[0])
        } else {
            (&mut high[0], &low[from])
        };
        dst.join(src);
    }

    /// What `t` did so far is ordered before every later acquire of `object`.
    pub fn release(&mut self, t: Tid, object: Object) {
        let i = self.slot(t);
        self.objects
            .entry(object)
            .or_default()
            .join(&self.threads[i]);
        self.threads[i].tick(i);
    }

    /// `t` is now ordered after every release of `object` so far. False when there was none.
    pub fn acquire(&mut self, t: Tid, object: Object) -> bool {
        let i = self.slot(t);
        let Some(o) = self.objects.get(&object) else {
            return false;
        };
        self.threads[i].join(o);
        true
    }

    /// `t` is now ordered after everything `other` did so far: for an acquire whose release
    /// was not reported (the observer reports a lock's release only once it is shared), the
    /// last releaser's history up to now. Wider than the truth, so it can hide a race but
    /// never invent one.
    pub fn acquire_from_thread(&mut self, t: Tid, other: Tid) {
        let (i, o) = (self.slot(t), self.slot(other));
        self.learn(i, o);
        self.threads[o].tick(o);
    }

    /// Whether the call `thread's` history was at `at` is ordered before where `t` is now.
    pub fn ordered_before(&mut self, at: Epoch, t: Tid) -> bool {
        if at.tid == t {
            return true;
        }
        let (i, a) = (self.slot(t), self.slot(at.tid));
        self.threads[i].get(a) >= at.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Object = Object::Address { pid: 1, addr: 0x10 };

    #[test]
    fn nothing_orders_two_threads_that_never_synchronise() {
        let mut hb = HappensBefore::default();
        hb.spawn(1, 2);
        let read = hb.now(2);
        assert!(
            !hb.ordered_before(read, 1),
            "the parent's later close races the read"
        );
        let close = hb.now(1);
        assert!(!hb.ordered_before(close, 2));
    }

    #[test]
    fn the_creator_s_past_is_ordered_before_the_child() {
        let mut hb = HappensBefore::default();
        let open = hb.now(1);
        hb.spawn(1, 2);
        assert!(hb.ordered_before(open, 2));
        // but not what the creator does after the clone
        let later = hb.now(1);
        assert!(!hb.ordered_before(later, 2));
    }

    #[test]
    fn a_release_orders_what_came_before_it_and_nothing_after() {
        let mut hb = HappensBefore::default();
        hb.spawn(1, 2);
        let read = hb.now(2);
        hb.release(2, L);
        let after = hb.now(2);
        assert!(hb.acquire(1, L));
        assert!(hb.ordered_before(read, 1));
        assert!(
            !hb.ordered_before(after, 1),
            "a call after the release is not covered"
        );
    }

    #[test]
    fn an_acquire_before_any_release_orders_nothing() {
        let mut hb = HappensBefore::default();
        hb.spawn(1, 2);
        let read = hb.now(2);
        assert!(!hb.acquire(1, L));
        assert!(!hb.ordered_before(read, 1));
        hb.release(2, L);
        assert!(
            !hb.ordered_before(read, 1),
            "a release after the acquire does not count"
        );
    }

    #[test]
    fn order_is_transitive_through_a_third_thread() {
        let mut hb = HappensBefore::default();
        hb.spawn(1, 2);
        hb.spawn(1, 3);
        let read = hb.now(2);
        hb.release(2, L);
        hb.acquire(3, L);
        let m = Object::Address { pid: 1, addr: 0x20 };
        hb.release(3, m);
        hb.acquire(1, m);
        assert!(hb.ordered_before(read, 1));
    }

    #[test]
    fn a_thread_s_end_orders_its_whole_history_before_its_join() {
        let mut hb = HappensBefore::default();
        hb.spawn(1, 2);
        let last = hb.now(2);
        let handle = Object::Address {
            pid: 1,
            addr: 0x7f00,
        };
        hb.release(2, handle);
        assert!(!hb.ordered_before(last, 1));
        hb.acquire(1, handle);
        assert!(hb.ordered_before(last, 1));
    }

    #[test]
    fn an_unreported_release_orders_the_releaser_s_past() {
        let mut hb = HappensBefore::default();
        hb.spawn(1, 2);
        let read = hb.now(2);
        hb.acquire_from_thread(1, 2);
        assert!(hb.ordered_before(read, 1));
        let after = hb.now(2);
        assert!(!hb.ordered_before(after, 1));
    }

    #[test]
    fn objects_of_different_processes_are_different_objects() {
        let mut hb = HappensBefore::default();
        hb.spawn(1, 2);
        let read = hb.now(2);
        hb.release(2, Object::Address { pid: 1, addr: 0x10 });
        assert!(!hb.acquire(1, Object::Address { pid: 9, addr: 0x10 }));
        assert!(!hb.ordered_before(read, 1));
    }
}
