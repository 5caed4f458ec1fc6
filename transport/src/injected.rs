//! Test-only lifecycle bugs (feature `bug-injection`), chosen at run time with
//! `WRINGER_TRANSPORT_BUG`, so the harness's audit can be shown to catch each class. Each
//! reproduces a real transport's mistake; none is reachable in a build without the feature.

#[cfg(not(wringer_model))]
use std::os::fd::RawFd;
#[cfg(not(wringer_model))]
use std::sync::OnceLock;
#[cfg(not(wringer_model))]
use std::time::{Duration, Instant};

/// A teardown written the wrong way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bug {
    /// MSCCL++'s race: the descriptor is released right after `shutdown(Both)`, before the
    /// receiver is joined.
    CloseBeforeJoin,
    /// The descriptor is closed while the receiver is still blocked in `recv` on it (a dup
    /// wakes the receiver afterwards, so the bug does not also hang).
    CloseWhileInUse,
    /// The receiver goes on touching the descriptor after teardown released it.
    UseAfterClose,
    /// Gloo review 2f: a lazy-connect wait reports its timeout even when a connection was
    /// handed to it at that moment (the connection is lost; the initiator believes it is
    /// connected).
    LateTimer,
    /// Gloo review 1a: the initiator waits for the listener's answer with no backstop.
    NoHelloBackstop,
    /// DAQIRI's deadlock half: a disconnect joins its worker while holding the registry lock.
    LockAcrossJoin,
    /// MSCCL++'s exact reads: a short read on the large-payload (direct) path is taken as the
    /// whole rest of the frame.
    ShortDirectRead,
    /// The read path's hand-over: `recv` looks at the receiver's queue, then waits for the read
    /// side, and does not look again once it has it, so it can read a later frame while the
    /// receiver, which held the read side meanwhile, has queued an earlier one.
    QueueBeforeReadSide,
    /// `recv` looks at the queue, then only tries the read side and waits on the queue when
    /// the try fails (the shape before review): a frame the receiver queues and lets go of
    /// between the caller's two looks waits for the next slice, and one it reads meanwhile can
    /// be passed by the caller's own read.
    QueueBeforeTryReadSide,
    /// The receiver thread lets go of the read side before it queues the frame it read: a
    /// caller that takes the read side in between reads the next frame before it.
    QueueAfterReadSide,
    /// The receiver lets go of the read side before it publishes the end it read: after a
    /// reset (read once), a caller that takes the read side reads a clean end and publishes
    /// that, so the connection says the peer closed when it reset.
    EndPublishedAfterReadSide,
    /// A `recv` whose deadline passes in the middle of a frame throws away what it had read of
    /// it: the next read starts inside the frame.
    TimeoutDropsPartialFrame,
    /// A caller that reads the connection's end itself returns it without publishing it: `send`,
    /// `flush` and the other callers never learn it (and a reset reads as a clean close later).
    CallerEndUnpublished,
    /// `close` skips the shutdown while the application is receiving, believing the receiver
    /// waits aside: a caller blocked in `recv`, or a receiver already waiting for bytes, is not woken.
    CloseSkipsShutdownWhileReceiving,
    /// RDMA teardown destroys the QP with its receives still posted: never moved to the error
    /// state, its flushed completions never polled.
    DestroyWithReceivesPosted,
    /// RDMA teardown deregisters the receive buffer's memory region first, under the receives
    /// still posted into it.
    DeregUnderPostedReceive,
    /// DAQIRI's pool half: a disconnect hands the connection's buffers back to the pool before
    /// its worker is joined (and joins off the CM thread), so the next connection posts into
    /// memory the old QP's receives still target.
    BuffersToPoolBeforeJoin,
}

impl Bug {
    /// A bug in the connection's teardown (the others live in the listener and handshake).
    pub(crate) fn in_teardown(self) -> bool {
        matches!(
            self,
            Bug::CloseBeforeJoin | Bug::CloseWhileInUse | Bug::UseAfterClose
        )
    }
}

/// The bug this process was asked to have, if any (read once: the read path asks per message).
#[cfg(not(wringer_model))]
pub(crate) fn bug() -> Option<Bug> {
    static BUG: OnceLock<Option<Bug>> = OnceLock::new();
    *BUG.get_or_init(from_env)
}

/// Under the model checker each test says which bug it switches on (`set_model_bug`).
#[cfg(wringer_model)]
static MODEL_BUG: std::sync::Mutex<Option<Bug>> = std::sync::Mutex::new(None);

#[cfg(wringer_model)]
pub(crate) fn bug() -> Option<Bug> {
    *MODEL_BUG.lock().unwrap_or_else(|p| p.into_inner())
}

/// Switch a bug on by its `WRINGER_TRANSPORT_BUG` name (None: off) for the model tests that
/// follow; false for a name that is no bug.
#[cfg(wringer_model)]
pub fn set_model_bug(name: Option<&str>) -> bool {
    let bug = match name {
        Some(n) => match from_name(n) {
            Some(b) => Some(b),
            None => return false,
        },
        None => None,
    };
    *MODEL_BUG.lock().unwrap_or_else(|p| p.into_inner()) = bug;
    true
}

#[cfg(not(wringer_model))]
fn from_env() -> Option<Bug> {
    from_name(&std::env::var("WRINGER_TRANSPORT_BUG").ok()?)
}

fn from_name(name: &str) -> Option<Bug> {
    match name {
        "close-before-join" => Some(Bug::CloseBeforeJoin),
        "close-while-in-use" => Some(Bug::CloseWhileInUse),
        "use-after-close" => Some(Bug::UseAfterClose),
        "late-timer" => Some(Bug::LateTimer),
        "no-hello-backstop" => Some(Bug::NoHelloBackstop),
        "short-direct-read" => Some(Bug::ShortDirectRead),
        "lock-across-join" => Some(Bug::LockAcrossJoin),
        "queue-before-read-side" => Some(Bug::QueueBeforeReadSide),
        "queue-before-try-read-side" => Some(Bug::QueueBeforeTryReadSide),
        "queue-after-read-side" => Some(Bug::QueueAfterReadSide),
        "end-published-after-read-side" => Some(Bug::EndPublishedAfterReadSide),
        "timeout-drops-partial-frame" => Some(Bug::TimeoutDropsPartialFrame),
        "caller-end-unpublished" => Some(Bug::CallerEndUnpublished),
        "close-skips-shutdown-while-receiving" => Some(Bug::CloseSkipsShutdownWhileReceiving),
        "destroy-with-receives-posted" => Some(Bug::DestroyWithReceivesPosted),
        "dereg-under-posted-receive" => Some(Bug::DeregUnderPostedReceive),
        "buffers-to-pool-before-join" => Some(Bug::BuffersToPoolBeforeJoin),
        _ => None,
    }
}

/// Whether `this` bug is the one switched on.
pub(crate) fn is(this: Bug) -> bool {
    bug() == Some(this)
}

/// How many bytes a direct read is taken to have delivered: `n`, or with
/// [`Bug::ShortDirectRead`] the whole slot it was offered.
pub(crate) fn direct_read(n: usize, offered: usize) -> usize {
    if bug() == Some(Bug::ShortDirectRead) {
        offered
    } else {
        n
    }
}

#[cfg(not(wringer_model))]
/// The receiver's part of [`Bug::UseAfterClose`]: once stopped, it waits (bounded) until
/// teardown has closed its descriptor, then reads it again instead of ending. The read neither
/// blocks nor consumes (the number may already be someone else's); its error is what it
/// returns.
pub(crate) fn read_again_after_close(fd: RawFd) -> Option<std::io::Error> {
    if bug() != Some(Bug::UseAfterClose) {
        return None;
    }
    let until = Instant::now() + Duration::from_millis(50);
    while Instant::now() < until {
        if std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_err() {
            let mut byte = 0u8;
            // SAFETY: one byte into a local; the fd is closed (the bug), so this fails with
            // EBADF, or, reused meanwhile, returns at once (MSG_DONTWAIT).
            let n = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_DONTWAIT) };
            return (n < 0).then(std::io::Error::last_os_error);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

#[cfg(not(wringer_model))]
/// Close `fd` out from under its owners.
pub(crate) fn close_raw(fd: RawFd) {
    // SAFETY: deliberately wrong (that is the bug); the caller forgets the owning `Socket`, so
    // the number is not closed a second time.
    unsafe { libc::close(fd) };
}

#[cfg(not(wringer_model))]
/// A second descriptor for the same socket, to wake a receiver after the first was closed.
pub(crate) fn dup(fd: RawFd) -> RawFd {
    // SAFETY: dup has no memory-safety preconditions.
    unsafe { libc::dup(fd) }
}

#[cfg(not(wringer_model))]
/// Shut down and close a descriptor made by [`dup`].
pub(crate) fn shutdown_and_close(fd: RawFd) {
    // SAFETY: `fd` came from `dup` and has no other owner.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
        libc::close(fd);
    }
}
