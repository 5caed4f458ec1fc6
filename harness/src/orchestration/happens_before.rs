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

use std::collections::{BTreeMap, HashMap};

pub type Tid = u32;

/// What a thread knows of every thread's history: thread -> how many of its epochs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VectorClock(BTreeMap<Tid, u64>);

impl VectorClock {
    pub fn get(&self, t: Tid) -> u64 {
        self.0.get(&t).copied().unwrap_or(0)
    }

    fn join(&mut self, other: &VectorClock) {
        for (t, c) in &other.0 {
            let mine = self.0.entry(*t).or_insert(0);
            *mine = (*mine).max(*c);
        }
    }

    fn tick(&mut self, t: Tid) {
        *self.0.entry(t).or_insert(0) += 1;
    }
}

/// One instant of one thread: the thread and its own component then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epoch {
    pub tid: Tid,
    pub clock: u64,
}

/// What a release is made on and an acquire reads from.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Object {
    /// A lock, condition, semaphore, barrier or thread handle at an address of a process.
    Address { pid: u32, addr: u64 },
    /// A kernel object messages cross: a pipe, a socket pair, an eventfd; a socket's shutdown
    /// (the read it ends).
    Channel { pid: u32, id: u64 },
    /// Every thread of a process has ended: what the wait that reaps it acquires.
    ProcessEnd(u32),
}

#[derive(Debug, Default)]
pub struct HappensBefore {
    threads: HashMap<Tid, VectorClock>,
    objects: HashMap<Object, VectorClock>,
}

impl HappensBefore {
    fn clock(&mut self, t: Tid) -> &mut VectorClock {
        self.threads.entry(t).or_insert_with(|| {
            let mut c = VectorClock::default();
            c.tick(t);
            c
        })
    }

    /// Where thread `t` is now.
    pub fn now(&mut self, t: Tid) -> Epoch {
        Epoch {
            tid: t,
            clock: self.clock(t).get(t),
        }
    }

    /// `child` (a thread or a process) starts knowing what `parent` knew at its clone.
    pub fn spawn(&mut self, parent: Tid, child: Tid) {
        let known = self.clock(parent).clone();
        self.clock(parent).tick(parent);
        let c = self.clock(child);
        c.join(&known);
    }

    /// What `t` did so far is ordered before every later acquire of `object`.
    pub fn release(&mut self, t: Tid, object: Object) {
        let known = self.clock(t).clone();
        self.objects.entry(object).or_default().join(&known);
        self.clock(t).tick(t);
    }

    /// `t` is now ordered after every release of `object` so far. False when there was none.
    pub fn acquire(&mut self, t: Tid, object: Object) -> bool {
        let Some(o) = self.objects.get(&object).cloned() else {
            return false;
        };
        self.clock(t).join(&o);
        true
    }

    /// `t` is now ordered after everything `other` did so far: for an acquire whose release
    /// was not reported (the observer reports a lock's release only once it is shared), the
    /// last releaser's history up to now. Wider than the truth, so it can hide a race but
    /// never invent one.
    pub fn acquire_from_thread(&mut self, t: Tid, other: Tid) {
        let known = self.clock(other).clone();
        self.clock(other).tick(other);
        self.clock(t).join(&known);
    }

    /// Whether the call `thread's` history was at `at` is ordered before where `t` is now.
    pub fn ordered_before(&mut self, at: Epoch, t: Tid) -> bool {
        at.tid == t || self.clock(t).get(at.tid) >= at.clock
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
