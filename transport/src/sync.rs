//! The connection's synchronisation, swappable for a model checker. Every real build uses
//! std's locks, atomics and threads and crossbeam's channels, unchanged and at no cost. Built
//! with `--cfg wringer_model` (`just model-check`), the same code runs on shuttle's, whose
//! scheduler chooses every interleaving; time is a logical clock there, and every bounded wait
//! may end at any moment, as a timeout may (shuttle itself never fires one).

#[cfg(not(wringer_model))]
pub(crate) use real::*;

#[cfg(wringer_model)]
pub(crate) use model::*;
#[cfg(wringer_model)]
pub use model::{pass_time, reset_clock};

#[cfg(not(wringer_model))]
mod real {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize};
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
    pub(crate) use std::thread::{park_timeout, sleep, Builder, JoinHandle, Thread};
    pub(crate) use std::time::Instant;

    pub(crate) mod channel {
        pub(crate) use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

        /// Hand `item` over on `tx` unless `woken` says to stop first: `Ok` once sent, `Err`
        /// with what stopped it (`true`: woken; `false`: nobody will take it).
        pub(crate) fn send_unless_woken<T>(
            tx: &Sender<T>,
            item: T,
            woken: &Receiver<()>,
        ) -> Result<(), bool> {
            crossbeam_channel::select! {
                send(tx, item) -> sent => sent.map_err(|_| false),
                recv(woken) -> _ => Err(true),
            }
        }
    }
}

#[cfg(wringer_model)]
mod model {
    pub(crate) use shuttle::sync::atomic::{
        AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize,
    };
    pub(crate) use shuttle::sync::{Arc, Mutex, MutexGuard, RwLock};
    pub(crate) use shuttle::thread::{Builder, JoinHandle, Thread};

    use std::cell::UnsafeCell;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// The model's clock: every look at it moves it on by one tick, so a deadline passes after
    /// a bounded number of looks whatever the schedule. Reset by each model test's iteration.
    static CLOCK_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    const TICK_NS: u64 = 10_000;

    pub fn reset_clock() {
        CLOCK_NS.store(0, Ordering::SeqCst);
    }

    /// A thread that steps away for `d` (the application busy elsewhere): the clock moves on.
    pub fn pass_time(d: Duration) {
        CLOCK_NS.fetch_add(d.as_nanos() as u64, Ordering::SeqCst);
        shuttle::thread::yield_now();
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub(crate) struct Instant(u64);

    impl Instant {
        pub(crate) fn now() -> Instant {
            Instant(CLOCK_NS.fetch_add(TICK_NS, Ordering::SeqCst) + TICK_NS)
        }
        pub(crate) fn elapsed(&self) -> Duration {
            Instant::now() - *self
        }
    }

    impl std::ops::Add<Duration> for Instant {
        type Output = Instant;
        fn add(self, d: Duration) -> Instant {
            Instant(self.0.saturating_add(d.as_nanos() as u64))
        }
    }

    impl std::ops::Sub for Instant {
        type Output = Duration;
        fn sub(self, earlier: Instant) -> Duration {
            Duration::from_nanos(self.0.saturating_sub(earlier.0))
        }
    }

    /// A bounded park: returns at once (the timeout fired), after letting others run.
    pub(crate) fn park_timeout(_: Duration) {
        shuttle::thread::yield_now();
    }

    pub(crate) fn sleep(_: Duration) {
        shuttle::thread::yield_now();
    }

    /// std's `OnceLock`, as far as the connection uses it, on the model's primitives: set
    /// once under a lock, published by a flag.
    pub(crate) struct OnceLock<T> {
        set: AtomicBool,
        writing: Mutex<()>,
        value: UnsafeCell<Option<T>>,
    }

    // SAFETY: the value is written once, under `writing`, before `set` is stored (release);
    // it is read only after `set` is loaded true (acquire) and never written again.
    unsafe impl<T: Send + Sync> Sync for OnceLock<T> {}

    impl<T> OnceLock<T> {
        pub(crate) fn new() -> OnceLock<T> {
            OnceLock {
                set: AtomicBool::new(false),
                writing: Mutex::new(()),
                value: UnsafeCell::new(None),
            }
        }

        pub(crate) fn get(&self) -> Option<&T> {
            if self.set.load(Ordering::Acquire) {
                // SAFETY: see the `Sync` impl: set, so written once and never again.
                unsafe { (*self.value.get()).as_ref() }
            } else {
                None
            }
        }

        pub(crate) fn set(&self, v: T) -> Result<(), T> {
            let _w = self.writing.lock().unwrap();
            if self.set.load(Ordering::Acquire) {
                return Err(v);
            }
            // SAFETY: under `writing` and before `set`: no reader looks at it yet.
            unsafe { *self.value.get() = Some(v) };
            self.set.store(true, Ordering::Release);
            Ok(())
        }
    }

    /// crossbeam's bounded channel, as far as the connection uses it, on a lock and a
    /// condition variable.
    pub(crate) mod channel {
        use shuttle::sync::{Arc, Condvar, Mutex};
        use std::collections::VecDeque;
        use std::time::Duration;

        struct State<T> {
            queue: VecDeque<T>,
            cap: usize,
            senders: usize,
            receivers: usize,
        }

        struct Shared<T> {
            state: Mutex<State<T>>,
            changed: Condvar,
        }

        pub(crate) struct Sender<T>(Arc<Shared<T>>);
        pub(crate) struct Receiver<T>(Arc<Shared<T>>);

        const LONG_WAIT: Duration = Duration::from_secs(1);

        #[derive(Debug, PartialEq, Eq)]
        pub(crate) enum RecvTimeoutError {
            Timeout,
            Disconnected,
        }

        /// A rendezvous channel (capacity 0) holds one item here: the connection uses one
        /// only as a wake-up, by dropping its sender.
        pub(crate) fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
            let shared = Arc::new(Shared {
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    cap: cap.max(1),
                    senders: 1,
                    receivers: 1,
                }),
                changed: Condvar::new(),
            });
            (Sender(Arc::clone(&shared)), Receiver(shared))
        }

        impl<T> Sender<T> {
            pub(crate) fn try_send(&self, item: T) -> Result<(), T> {
                let mut s = self.0.state.lock().unwrap();
                if s.receivers == 0 || s.queue.len() >= s.cap {
                    return Err(item);
                }
                s.queue.push_back(item);
                self.0.changed.notify_all();
                Ok(())
            }
        }

        impl<T> Receiver<T> {
            pub(crate) fn try_recv(&self) -> Result<T, ()> {
                let mut s = self.0.state.lock().unwrap();
                let item = s.queue.pop_front().ok_or(())?;
                self.0.changed.notify_all();
                Ok(item)
            }

            /// A short bounded wait ends at any moment: one look, then (empty) a timeout. A
            /// long one (a second or more: a backstop correct code never reaches, since its
            /// sender only has to finish what it started) waits for an item, as shuttle's
            /// own timeouts do, so that one that never comes is a deadlock the model reports.
            pub(crate) fn recv_timeout(&self, d: Duration) -> Result<T, RecvTimeoutError> {
                if d >= LONG_WAIT {
                    let mut s = self.0.state.lock().unwrap();
                    loop {
                        if let Some(item) = s.queue.pop_front() {
                            self.0.changed.notify_all();
                            return Ok(item);
                        }
                        if s.senders == 0 {
                            return Err(RecvTimeoutError::Disconnected);
                        }
                        s = self.0.changed.wait(s).unwrap();
                    }
                }
                {
                    let mut s = self.0.state.lock().unwrap();
                    if let Some(item) = s.queue.pop_front() {
                        self.0.changed.notify_all();
                        return Ok(item);
                    }
                    if s.senders == 0 {
                        return Err(RecvTimeoutError::Disconnected);
                    }
                }
                shuttle::thread::yield_now();
                Err(RecvTimeoutError::Timeout)
            }

            fn disconnected(&self) -> bool {
                self.0.state.lock().unwrap().senders == 0
            }
        }

        impl<T> Drop for Sender<T> {
            fn drop(&mut self) {
                self.0.state.lock().unwrap().senders -= 1;
                self.0.changed.notify_all();
            }
        }

        impl<T> Drop for Receiver<T> {
            fn drop(&mut self) {
                self.0.state.lock().unwrap().receivers -= 1;
                self.0.changed.notify_all();
            }
        }

        /// As the real one: blocks until `item` is queued, `woken`'s sender is gone (`true`)
        /// or nobody will take it (`false`).
        pub(crate) fn send_unless_woken<T>(
            tx: &Sender<T>,
            item: T,
            woken: &Receiver<()>,
        ) -> Result<(), bool> {
            let mut item = Some(item);
            loop {
                if woken.disconnected() {
                    return Err(true);
                }
                let mut s = tx.0.state.lock().unwrap();
                if s.receivers == 0 {
                    return Err(false);
                }
                if s.queue.len() < s.cap {
                    s.queue.push_back(item.take().unwrap());
                    tx.0.changed.notify_all();
                    return Ok(());
                }
                // Woken by a receive (room) or, through the wake channel's own condition
                // variable, not at all: look again after the others moved.
                drop(s);
                shuttle::thread::yield_now();
            }
        }
    }
}
