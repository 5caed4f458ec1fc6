//! The transport's own locks and joins, told to the audit's sync observer. Rust's std locks
//! do not go through pthreads, so the preloaded observer never sees them (it sees Rust's
//! threads start, end and join through pthread_create and pthread_join only when they are
//! joined through it). Where the observer is loaded (the audited rank sets
//! `WRINGER_SYNC_OBSERVED`), [`lock`] and [`join`] tell each lock held, let go and waited
//! under with the observer's own marker syscall (`harness/sync-audit/wringer_sync.c`), so the
//! wait-for audit judges the transport like a C program: DAQIRI's join under the registry
//! lock is a "wait under a lock". Elsewhere each costs one load of a cached flag.

use std::cell::RefCell;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

/// prctl's first argument for a marker ("WSNC"): the kernel answers EINVAL, the recorder
/// records it in the thread's order.
const MARKER: libc::c_long = 0x5753_4e43;
const ACQUIRE: libc::c_long = 2;
const RELEASE: libc::c_long = 3;
const WAIT: libc::c_long = 4;
const HOLD: libc::c_long = 5;
const DROP: libc::c_long = 6;
const WAIT_JOIN: libc::c_long = 1;

fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("WRINGER_SYNC_OBSERVED").is_some())
}

thread_local! {
    /// The locks this thread holds through [`lock`], and whether each one's holding was told.
    static HELD: RefCell<Vec<(usize, bool)>> = const { RefCell::new(Vec::new()) };
}

fn mark(kind: libc::c_long, object: usize, aux: libc::c_long) {
    // SAFETY: errno is this thread's own; it is read before and written back after, so the
    // marker's EINVAL never reaches a caller reading errno.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: prctl with an option the kernel does not know touches no memory and fails
    // with EINVAL; its other arguments are plain numbers.
    unsafe {
        libc::syscall(
            libc::SYS_prctl,
            MARKER,
            kind,
            object,
            0 as libc::c_long,
            aux,
        );
        *libc::__errno_location() = saved;
    }
}

/// Tell every lock this thread holds that is not told yet (before a wait, or a nested lock).
fn tell_held() {
    let _ = HELD.try_with(|h| {
        for (lock, told) in h.borrow_mut().iter_mut().filter(|(_, t)| !*t) {
            mark(HOLD, *lock, 0);
            *told = true;
        }
    });
}

/// A lock held through [`lock`]: the std guard, and its letting go told when it drops.
pub struct Held<'a, T> {
    guard: MutexGuard<'a, T>,
    addr: usize,
}

impl<T> std::ops::Deref for Held<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for Held<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for Held<'_, T> {
    fn drop(&mut self) {
        if !on() {
            return;
        }
        // (A lock dropped while the thread's locals are torn down is simply not found.)
        let told = HELD
            .try_with(|h| {
                let mut h = h.borrow_mut();
                let i = h.iter().rposition(|(l, _)| *l == self.addr)?;
                Some(h.remove(i).1)
            })
            .ok()
            .flatten();
        if told == Some(true) {
            mark(DROP, self.addr, 0);
        }
        // Before the std guard lets go (it drops after this body): the next taker is ordered
        // after everything done under it.
        mark(RELEASE, self.addr, 0);
    }
}

/// Lock `m` (a poisoned lock is taken as it is: the transport's state stays consistent
/// under a panicking holder), telling the observer when it is loaded.
pub fn lock<T>(m: &Mutex<T>) -> Held<'_, T> {
    let guard = m.lock().unwrap_or_else(|p| p.into_inner());
    let addr = m as *const Mutex<T> as usize;
    if on() {
        mark(ACQUIRE, addr, 0);
        // Taken under another: a lock-order edge, told with what it is taken under.
        let nested = HELD.try_with(|h| !h.borrow().is_empty()).unwrap_or(false);
        if nested {
            tell_held();
            mark(HOLD, addr, 0);
        }
        let _ = HELD.try_with(|h| h.borrow_mut().push((addr, nested)));
    }
    Held { guard, addr }
}

/// Join `handle`, telling the wait (and the locks held across it) when the observer is loaded.
pub fn join<T>(handle: JoinHandle<T>) -> std::thread::Result<T> {
    if on() {
        use std::os::unix::thread::JoinHandleExt;
        tell_held();
        mark(WAIT, handle.as_pthread_t() as usize, WAIT_JOIN);
    }
    handle.join()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_derefs_to_its_value_and_lets_go_on_drop() {
        let m = Mutex::new(vec![1]);
        {
            let mut g = lock(&m);
            g.push(2);
        }
        assert_eq!(*lock(&m), vec![1, 2]);
        assert!(m.try_lock().is_ok(), "let go");
        let t = std::thread::spawn(|| 7);
        assert_eq!(join(t).unwrap(), 7);
    }
}
