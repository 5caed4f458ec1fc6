//! A framed TCP connection with one receiver thread and a teardown that is right by construction.
//!
//! Teardown order: publish stop, `shutdown(Both)`, join the receiver, and only then release the
//! descriptor. The socket is shared as `Arc<Socket>` between the connection, its receiver and a
//! caller inside `recv`, so the descriptor is closed when the last owner drops it: it cannot be
//! closed, or its number reused, while any thread can still call `recv` on it.
//!
//! Who reads the stream: the read side ([`Reading`]) is one lock. A caller waiting in `recv`
//! holds it and reads its frame itself, so a message costs the one wake-up the kernel gives the
//! reader, as with a plain socket. While nobody receives, the receiver thread waits for bytes
//! (in `poll`, which leaves a pending reset to whoever reads it, woken by `shutdown` as a receive
//! is) and reads them into the queue, so
//! a peer's death or garbage is noticed, and published, whether or not the application is in
//! `recv`. Frames the receiver queued are always delivered before any the caller reads after
//! them: the receiver queues while it holds the read side, and a caller that takes the read
//! side drains the queue first.

use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::TryLockError;
use std::time::Duration;

#[cfg(wringer_model)]
use crate::model_socket::Socket;
use crate::sync::channel::{self, send_unless_woken, Receiver, RecvTimeoutError, Sender};
use crate::sync::{park_timeout, sleep, Builder, Instant, JoinHandle, Thread};
use crate::sync::{Arc, AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize};
use crate::sync::{Mutex, MutexGuard, OnceLock, RwLock};
#[cfg(not(wringer_model))]
use socket2::Socket;

use crate::deadline::Deadline;
use crate::error::{Error, ReceiverError, Result, Terminal};
use crate::frame::{Frame, Header, Kind, ReadOutcome, DEFAULT_MAX_PAYLOAD};
use crate::stream::{readable_now, wait_for_bytes, FrameReader, ReadError, ReadUntil, WriteError};

/// How long after a caller leaves `recv` the application still counts as receiving (it is
/// about to come back, as a ping-pong does): the receiver stays off the socket until then.
const RECEIVING_GRACE: Duration = Duration::from_millis(1);

/// The longest the receiver leaves the socket to callers before it looks whether they are
/// still receiving: how late a peer's end may be noticed once the application stops receiving.
const LONGEST_ASIDE: Duration = Duration::from_millis(16);

/// A caller that cannot take the read side (the receiver is in the middle of a frame) waits for
/// the queue this long at a time before it tries again.
const QUEUE_SLICE: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, Debug)]
pub struct ConnectionOptions {
    /// Largest payload accepted from the peer.
    pub max_payload: u32,
    /// Frames the receiver may hold before it waits for the application to take them.
    pub queue_depth: usize,
    /// Spin this long in `recv` on the socket before sleeping in `poll`. Trades a core for
    /// latency: no wake-up at all when the frame comes within the spin.
    pub busy_poll: Option<Duration>,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            max_payload: DEFAULT_MAX_PAYLOAD,
            queue_depth: 64,
            busy_poll: None,
        }
    }
}

pub struct Connection {
    /// `None` once torn down. Senders clone the `Arc` for the duration of one write.
    socket: RwLock<Option<Arc<Socket>>>,
    /// Serialises writers so frames never interleave; holds the next outgoing sequence number.
    sender: Mutex<SendState>,
    /// The read side of the stream: whoever holds it may read the socket.
    reading: Arc<Mutex<Reading>>,
    /// Frames the receiver read while no caller was receiving.
    frames: Receiver<Frame>,
    terminal: Arc<OnceLock<Terminal>>,
    counters: Arc<ReadCounters>,
    stop: Arc<AtomicBool>,
    presence: Arc<Presence>,
    /// Dropped at teardown to wake a receiver that is blocked handing a frame over.
    wake: Mutex<Option<Sender<()>>>,
    /// Payload buffers handed back by the application for the receiver to reuse.
    recycled: Sender<Vec<u8>>,
    /// The receiver's handle until it is joined. Held for the whole teardown, so a second
    /// caller waits for the first to finish and then finds nothing left to do.
    receiver: Mutex<Option<JoinHandle<()>>>,
    /// For waking the receiver where it waits for the application to stop receiving.
    receiver_thread: Thread,
    receiver_tid: Arc<AtomicI32>,
    busy_poll: Option<Duration>,
    fd: RawFd,
    local: SocketAddr,
    peer: SocketAddr,
}

struct SendState {
    next_sequence: u64,
    broken: bool,
}

impl Connection {
    /// Wrap a connected stream (no handshake). Starts the receiver thread.
    #[cfg(not(wringer_model))]
    pub fn from_stream(stream: std::net::TcpStream, opts: ConnectionOptions) -> Result<Connection> {
        Connection::from_socket(Socket::from(stream), opts)
    }

    #[cfg(not(wringer_model))]
    pub(crate) fn from_socket(socket: Socket, opts: ConnectionOptions) -> Result<Connection> {
        Connection::from_shared(Arc::new(socket), opts)
    }

    /// A connection over one end of a model stream (`model_socket::pair`), for model tests.
    #[cfg(wringer_model)]
    pub fn over_model(socket: Socket, opts: ConnectionOptions) -> Result<Connection> {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        Connection::start(Arc::new(socket), addr, addr, opts)
    }

    /// `socket` must have no other owner left that could outlive this connection's teardown.
    #[cfg(not(wringer_model))]
    pub(crate) fn from_shared(socket: Arc<Socket>, opts: ConnectionOptions) -> Result<Connection> {
        let local = socket.local_addr()?.as_socket().ok_or_else(not_inet)?;
        let peer = socket.peer_addr()?.as_socket().ok_or_else(not_inet)?;
        // Handshakes may have set a read timeout; the receiver blocks until shutdown wakes it.
        socket.set_read_timeout(None)?;
        Connection::start(socket, local, peer, opts)
    }

    /// Start the receiver thread on `socket`.
    fn start(
        socket: Arc<Socket>,
        local: SocketAddr,
        peer: SocketAddr,
        opts: ConnectionOptions,
    ) -> Result<Connection> {
        let fd = socket.as_raw_fd();
        let (frames_tx, frames) = channel::bounded(opts.queue_depth.max(1));
        let (wake, woken) = channel::bounded::<()>(0);
        let (recycled, reusable) = channel::bounded(4);
        let counters = Arc::new(ReadCounters::default());
        let reading = Arc::new(Mutex::new(Reading {
            reader: FrameReader::new(opts.max_payload),
            max_payload: opts.max_payload,
            expected: 0,
            reusable,
            last_reader: None,
            counters: Arc::clone(&counters),
        }));
        let terminal = Arc::new(OnceLock::new());
        let stop = Arc::new(AtomicBool::new(false));
        let presence = Arc::new(Presence::new());
        let receiver_tid = Arc::new(AtomicI32::new(0));
        let worker = ReceiverThread {
            socket: Arc::clone(&socket),
            reading: Arc::clone(&reading),
            stop: Arc::clone(&stop),
            presence: Arc::clone(&presence),
            frames: frames_tx,
            woken,
            terminal: Arc::clone(&terminal),
            counters: Arc::clone(&counters),
            tid: Arc::clone(&receiver_tid),
        };
        let handle = Builder::new()
            .name(format!("wringer-rx-{fd}"))
            .spawn(move || worker.run())?;
        Ok(Connection {
            socket: RwLock::new(Some(socket)),
            sender: Mutex::new(SendState {
                next_sequence: 0,
                broken: false,
            }),
            reading,
            frames,
            terminal,
            counters,
            stop,
            presence,
            wake: Mutex::new(Some(wake)),
            recycled,
            receiver_thread: handle.thread().clone(),
            receiver: Mutex::new(Some(handle)),
            receiver_tid,
            busy_poll: opts.busy_poll,
            fd,
            local,
            peer,
        })
    }

    /// Send one data frame, blocking at most `timeout`.
    pub fn send(&self, payload: &[u8], timeout: Duration) -> Result<()> {
        let mut deadline = Deadline::After(timeout);
        self.checked(|| {
            let socket = self.socket()?;
            let mut state = lock_by(&self.sender, &mut deadline);
            if state.broken {
                return Err(Error::SendBroken);
            }
            let len = u32::try_from(payload.len()).map_err(|_| {
                Error::InvalidArgument(format!("payload of {} bytes exceeds 4 GiB", payload.len()))
            })?;
            let header = Header {
                kind: Kind::Data,
                flags: 0,
                sequence: state.next_sequence,
                len,
            };
            match crate::stream::write_frame(&socket, &header, payload, &mut deadline) {
                Ok(()) => {
                    state.next_sequence += 1;
                    Ok(())
                }
                Err(WriteError::Timeout { written: 0 }) => Err(Error::Timeout {
                    during: "send",
                    after: timeout,
                }),
                Err(WriteError::Io { written: 0, error }) => Err(Error::Io(error)),
                Err(WriteError::Timeout { .. } | WriteError::Io { .. }) => {
                    // Half a frame is on the wire: nothing sent after it could be decoded.
                    state.broken = true;
                    let _ = socket.shutdown(Shutdown::Write);
                    Err(Error::SendBroken)
                }
            }
        })
    }

    /// Wait until everything sent has been acknowledged by the peer's TCP stack (the kernel send
    /// queue is empty), at most `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        self.checked(|| {
            let socket = self.socket()?;
            let _writers = lock(&self.sender);
            // The kernel offers no event for "send queue drained", so poll SIOCOUTQ with a
            // short, growing pause.
            let mut pause = Duration::from_micros(20);
            loop {
                if unsent_bytes(&socket)? == 0 {
                    return Ok(());
                }
                // A receiver failure published meanwhile ends the wait early.
                self.receiver_error()?;
                let now = Instant::now();
                if now >= deadline {
                    return Err(Error::Timeout {
                        during: "flush",
                        after: timeout,
                    });
                }
                sleep(pause.min(deadline - now));
                pause = (pause * 2).min(Duration::from_millis(5));
            }
        })
    }

    /// Next data frame from the peer, waiting at most `timeout`. Frames that arrived before the
    /// connection ended are still delivered; after them comes the reason it ended. A frame cut
    /// short by the deadline is kept, and finished by the next `recv` or by the receiver.
    pub fn recv(&self, timeout: Duration) -> Result<Frame> {
        let mut deadline = Deadline::After(timeout);
        let _receiving = self.presence.enter();
        loop {
            #[cfg(feature = "bug-injection")]
            if crate::injected::is(crate::injected::Bug::QueueBeforeTryReadSide) {
                // The pre-review shape: the queue first, then only a try of the read side.
                if let Ok(frame) = self.frames.try_recv() {
                    return Ok(self.dequeued(frame));
                }
                if self.terminal.get().is_some() {
                    return Err(self.ended());
                }
                if let Ok(mut reading) = self.reading.try_lock() {
                    return self.read_own_frame(&mut reading, deadline, timeout);
                }
                if deadline.left(Instant::now()).is_none() {
                    return Err(Error::Timeout {
                        during: "recv",
                        after: timeout,
                    });
                }
                match self.frames.recv_timeout(QUEUE_SLICE) {
                    Ok(frame) => return Ok(self.dequeued(frame)),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return Err(self.ended()),
                }
            }
            #[cfg(feature = "bug-injection")]
            if crate::injected::is(crate::injected::Bug::QueueBeforeReadSide) {
                if let Ok(frame) = self.frames.try_recv() {
                    return Ok(self.dequeued(frame));
                }
                if self.terminal.get().is_some() {
                    return Err(self.ended());
                }
                let mut reading = lock(&self.reading);
                return self.read_own_frame(&mut reading, deadline, timeout);
            }
            // The read side first: the receiver queues only while it holds it, so whatever it
            // queued before letting go is in the queue below. The end next: a frame queued
            // before the end was published is then in the queue too.
            let reading = self.reading.try_lock().ok();
            let ended = self.terminal.get().is_some();
            if let Ok(frame) = self.frames.try_recv() {
                return Ok(self.dequeued(frame));
            }
            if ended {
                return Err(self.ended());
            }
            if let Some(mut reading) = reading {
                return self.read_own_frame(&mut reading, deadline, timeout);
            }
            // The receiver is reading a frame, and queues it when it has it.
            let Some(left) = deadline.left(Instant::now()) else {
                return Err(Error::Timeout {
                    during: "recv",
                    after: timeout,
                });
            };
            match self.frames.recv_timeout(left.min(QUEUE_SLICE)) {
                Ok(frame) => return Ok(self.dequeued(frame)),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Err(self.ended()),
            }
        }
    }

    /// The caller's own read, holding the read side, with the queue found empty.
    fn read_own_frame(
        &self,
        reading: &mut Reading,
        deadline: Deadline,
        timeout: Duration,
    ) -> Result<Frame> {
        let Ok(socket) = self.socket() else {
            return Err(self.ended());
        };
        let mut source = ReadUntil::new(&socket, deadline, self.busy_poll);
        match reading.next(&mut source, &self.stop, Reader::Caller) {
            Next::Frame(frame) => Ok(frame),
            Next::TimedOut => {
                #[cfg(feature = "bug-injection")]
                if crate::injected::is(crate::injected::Bug::TimeoutDropsPartialFrame) {
                    reading.reader = FrameReader::new(reading.max_payload);
                }
                Err(Error::Timeout {
                    during: "recv",
                    after: timeout,
                })
            }
            Next::End(end) => {
                #[cfg(feature = "bug-injection")]
                if crate::injected::is(crate::injected::Bug::CallerEndUnpublished) {
                    return Err(error_for(Some(&end)));
                }
                // Published once, by whichever reader saw the end first; the receiver, woken,
                // finds it and leaves.
                if self.terminal.set(end).is_ok() {
                    self.counters.ended_by(Reader::Caller);
                }
                self.receiver_thread.unpark();
                Err(self.ended())
            }
        }
    }

    /// A frame `recv` took from the receiver's queue.
    fn dequeued(&self, frame: Frame) -> Frame {
        self.counters.dequeued.fetch_add(1, Ordering::Relaxed);
        frame
    }

    /// The error for a connection that has ended.
    fn ended(&self) -> Error {
        error_for(self.terminal.get())
    }

    /// Tear down: publish stop, `shutdown(Both)`, join the receiver, release the descriptor.
    /// Idempotent and safe from several threads at once; bounded because `shutdown` (not a
    /// timeout) wakes a receiver blocked in `recv`.
    pub fn close(&self) -> Result<()> {
        let mut receiver = lock(&self.receiver);
        let Some(handle) = receiver.take() else {
            return Ok(());
        };
        self.stop.store(true, Ordering::Release);
        // Wakes a receiver that waits for the application to stop receiving...
        self.receiver_thread.unpark();
        // ...and one that waits to queue a frame.
        drop(lock(&self.wake).take());
        let socket = self
            .socket
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        #[cfg(feature = "bug-injection")]
        if let Some(bug) = crate::injected::bug().filter(|b| b.in_teardown()) {
            return self.close_wrongly(bug, handle, socket);
        }
        #[cfg(feature = "bug-injection")]
        let wake = !(crate::injected::is(crate::injected::Bug::CloseSkipsShutdownWhileReceiving)
            && self.presence.receiving());
        #[cfg(not(feature = "bug-injection"))]
        let wake = true;
        if let Some(socket) = socket.as_ref().filter(|_| wake) {
            // ENOTCONN when the peer already reset us: nothing left to wake, not a failure.
            let _ = socket.shutdown(Shutdown::Both);
        }
        let joined = handle.join();
        // Only now may the descriptor go: the receiver's reference died with its thread.
        drop(socket);
        joined.map_err(|_| {
            Error::Receiver(ReceiverError::Io {
                kind: std::io::ErrorKind::Other,
                errno: None,
                message: "receiver thread panicked".into(),
            })
        })
    }

    /// Teardown the wrong way (test-only): see [`crate::injected::Bug`].
    #[cfg(feature = "bug-injection")]
    fn close_wrongly(
        &self,
        bug: crate::injected::Bug,
        handle: JoinHandle<()>,
        socket: Option<Arc<Socket>>,
    ) -> Result<()> {
        use crate::injected::Bug;
        #[cfg(not(wringer_model))]
        use crate::injected::{close_raw, dup, shutdown_and_close};
        match bug {
            Bug::CloseBeforeJoin | Bug::UseAfterClose => {
                if let Some(s) = &socket {
                    let _ = s.shutdown(Shutdown::Both);
                }
                #[cfg(not(wringer_model))]
                close_raw(self.fd);
                #[cfg(wringer_model)]
                if let Some(s) = &socket {
                    crate::model_socket::close_number(s);
                }
                let _ = handle.join();
            }
            Bug::CloseWhileInUse => {
                #[cfg(not(wringer_model))]
                {
                    let spare = dup(self.fd);
                    close_raw(self.fd);
                    shutdown_and_close(spare);
                }
                #[cfg(wringer_model)]
                if let Some(s) = &socket {
                    crate::model_socket::close_number(s);
                }
                let _ = handle.join();
            }
            _ => unreachable!("not a teardown bug"),
        }
        // The number is closed already; the Socket must not close it again.
        std::mem::forget(socket);
        Ok(())
    }

    /// Hand a received payload back so the receiver can reuse its memory for a later frame
    /// (optional; worthwhile for large frames). Dropped when enough are waiting already.
    pub fn recycle(&self, payload: Vec<u8>) {
        let _ = self.recycled.try_send(payload);
    }

    /// How the receiver ended, once it has.
    pub fn terminal(&self) -> Option<&Terminal> {
        self.terminal.get()
    }

    /// Who has read this connection's stream, and how its frames were delivered so far.
    pub fn read_stats(&self) -> ReadStats {
        self.counters.snapshot()
    }

    /// The descriptor number this connection owns (for diagnostics; closed after [`close`]).
    ///
    /// [`close`]: Connection::close
    pub fn raw_fd(&self) -> RawFd {
        self.fd
    }

    /// Kernel thread id of the receiver (0 until it has started), for stack capture and tests.
    pub fn receiver_tid(&self) -> i32 {
        self.receiver_tid.load(Ordering::Acquire)
    }

    /// True while the receiver thread sleeps on the socket (read from /proc, Linux only): in a
    /// receive for the rest of a frame, or waiting for bytes in `poll`; really blocked, not
    /// merely about to be. For tests and harnesses that must tear down a connection whose
    /// receiver is blocked.
    pub fn receiver_blocked_in_recv(&self) -> bool {
        let tid = self.receiver_tid();
        let mut calls = vec![libc::SYS_recvfrom, libc::SYS_read];
        calls.extend_from_slice(crate::procfs::POLL_CALLS);
        tid != 0 && crate::procfs::thread_sleeps_in(tid, &calls)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    fn socket(&self) -> Result<Arc<Socket>> {
        self.socket
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(Error::Closed)
    }

    fn receiver_error(&self) -> Result<()> {
        match self.terminal.get() {
            Some(Terminal::Failed(e)) => Err(Error::Receiver(e.clone())),
            _ => Ok(()),
        }
    }

    /// Check the receiver's published failure before and after `op`, so a failure is reported
    /// on the next operation and never swallowed (MSCCL++'s `runWithReceiverErrorCheck`).
    fn checked<T>(&self, op: impl FnOnce() -> Result<T>) -> Result<T> {
        self.receiver_error()?;
        let out = op();
        self.receiver_error()?;
        out
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .field("fd", &self.fd)
            .finish()
    }
}

/// The error `recv` returns for a connection that ended with `end`.
fn error_for(end: Option<&Terminal>) -> Error {
    match end {
        Some(Terminal::PeerClosed) => Error::PeerClosed,
        Some(Terminal::Failed(e)) => Error::Receiver(e.clone()),
        Some(Terminal::LocalShutdown) | None => Error::Closed,
    }
}

/// Who read from the socket: a caller of `recv`, or the connection's receiver thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    Caller,
    Receiver,
}

/// How a connection's stream was read (see [`Connection::read_stats`]): the evidence a test or
/// scenario needs that the caller's own reads, the receiver's queue and the hand-over between
/// them were each exercised, and who found the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Frames a caller of `recv` read from the stream itself.
    pub frames_read_by_callers: u64,
    /// Frames the receiver thread read and queued.
    pub frames_queued: u64,
    /// Frames `recv` took from the receiver's queue.
    pub frames_dequeued: u64,
    /// Bytes read from the socket, by either reader.
    pub bytes: u64,
    /// Socket reads that brought bytes, by callers and by the receiver.
    pub reads_by_callers: u64,
    pub reads_by_receiver: u64,
    /// Times the reader of the stream changed (caller to receiver, or back).
    pub handovers: u64,
    /// Who published the connection's end, once it has ended.
    pub ended_by: Option<Reader>,
}

/// [`ReadStats`]' counters, updated by whoever holds the read side and read without a lock.
#[derive(Default)]
struct ReadCounters {
    by_callers: AtomicU64,
    queued: AtomicU64,
    dequeued: AtomicU64,
    bytes: AtomicU64,
    reads_by_callers: AtomicU64,
    reads_by_receiver: AtomicU64,
    handovers: AtomicU64,
    /// 0 until the end is published; then 1 for a caller, 2 for the receiver.
    ended_by: AtomicU8,
}

impl ReadCounters {
    fn ended_by(&self, reader: Reader) {
        let code = match reader {
            Reader::Caller => 1,
            Reader::Receiver => 2,
        };
        self.ended_by.store(code, Ordering::Release);
    }

    fn snapshot(&self) -> ReadStats {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ReadStats {
            frames_read_by_callers: n(&self.by_callers),
            frames_queued: n(&self.queued),
            frames_dequeued: n(&self.dequeued),
            bytes: n(&self.bytes),
            reads_by_callers: n(&self.reads_by_callers),
            reads_by_receiver: n(&self.reads_by_receiver),
            handovers: n(&self.handovers),
            ended_by: match self.ended_by.load(Ordering::Acquire) {
                1 => Some(Reader::Caller),
                2 => Some(Reader::Receiver),
                _ => None,
            },
        }
    }
}

/// A source that counts, as they happen, the reads that brought bytes and the bytes (a reader
/// blocked for the rest of a frame has already counted its first part).
struct Counted<'a, R> {
    inner: &'a mut R,
    counters: &'a ReadCounters,
    reads: &'a AtomicU64,
    read_any: bool,
}

impl<R: std::io::Read> Counted<'_, R> {
    fn counted(&mut self, n: usize) -> usize {
        if n > 0 {
            self.read_any = true;
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
        }
        n
    }
}

impl<R: std::io::Read> std::io::Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        Ok(self.counted(n))
    }

    fn read_vectored(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
        let n = self.inner.read_vectored(bufs)?;
        Ok(self.counted(n))
    }
}

/// The read side of the stream: the frame reader, the sequence the next frame must carry, the
/// payload buffers the application handed back, and who read last.
struct Reading {
    reader: FrameReader,
    /// Kept for the test-only bug that starts a new reader after a timeout.
    #[cfg_attr(not(feature = "bug-injection"), allow(dead_code))]
    max_payload: u32,
    expected: u64,
    reusable: Receiver<Vec<u8>>,
    last_reader: Option<Reader>,
    counters: Arc<ReadCounters>,
}

/// What one read of the stream came to.
enum Next {
    Frame(Frame),
    /// The connection's end (published once by whoever read it).
    End(Terminal),
    /// A caller's deadline passed; what was read of the frame is kept.
    TimedOut,
}

impl Reading {
    /// Read the next data frame from `source` as `by`, checking its kind and sequence.
    fn next(&mut self, source: &mut impl std::io::Read, stop: &AtomicBool, by: Reader) -> Next {
        while let Ok(buf) = self.reusable.try_recv() {
            self.reader.give_buffer(buf);
        }
        let counters: &ReadCounters = &self.counters;
        let mut counted = Counted {
            inner: source,
            counters,
            reads: match by {
                Reader::Caller => &counters.reads_by_callers,
                Reader::Receiver => &counters.reads_by_receiver,
            },
            read_any: false,
        };
        let outcome = self.reader.read_frame(&mut counted, stop);
        let read_any = counted.read_any;
        self.count(by, read_any, matches!(outcome, Ok(ReadOutcome::Frame(_))));
        let frame = match outcome {
            Ok(ReadOutcome::Frame(frame)) => frame,
            Ok(ReadOutcome::CleanEof) => return Next::End(Terminal::PeerClosed),
            Ok(ReadOutcome::LocalShutdown) => return Next::End(Terminal::LocalShutdown),
            Ok(ReadOutcome::Truncated {
                section,
                expected,
                got,
            }) => {
                return Next::End(Terminal::Failed(ReceiverError::Truncated {
                    section,
                    expected,
                    got,
                }))
            }
            Err(ReadError::Frame(e)) => return Next::End(Terminal::Failed(e.into())),
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                return Next::TimedOut
            }
            Err(ReadError::Io(e)) => return Next::End(Terminal::Failed(ReceiverError::io(&e))),
        };
        if frame.header.kind != Kind::Data {
            return Next::End(Terminal::Failed(ReceiverError::UnexpectedKind(
                frame.header.kind,
            )));
        }
        if frame.header.sequence != self.expected {
            return Next::End(Terminal::Failed(ReceiverError::OutOfSequence {
                expected: self.expected,
                got: frame.header.sequence,
            }));
        }
        self.expected += 1;
        Next::Frame(frame)
    }

    /// Count a frame read by `by`, and a hand-over when the stream changed readers.
    fn count(&mut self, by: Reader, read_any: bool, frame: bool) {
        if !read_any && !frame {
            return;
        }
        let c = &self.counters;
        if self.last_reader.is_some_and(|last| last != by) {
            c.handovers.fetch_add(1, Ordering::Relaxed);
        }
        self.last_reader = Some(by);
        if frame {
            let frames = match by {
                Reader::Caller => &c.by_callers,
                Reader::Receiver => &c.queued,
            };
            frames.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Whether the application is receiving: a caller is inside `recv`, or left it less than
/// [`RECEIVING_GRACE`] ago. Only decides who reads; correctness rests on the read-side lock.
struct Presence {
    inside: AtomicUsize,
    /// When the last caller left, in nanoseconds since `epoch`.
    left_at: AtomicU64,
    epoch: Instant,
}

impl Presence {
    fn new() -> Presence {
        Presence {
            inside: AtomicUsize::new(0),
            left_at: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn enter(&self) -> Inside<'_> {
        self.inside.fetch_add(1, Ordering::Relaxed);
        Inside(self)
    }

    fn receiving(&self) -> bool {
        if self.inside.load(Ordering::Relaxed) > 0 {
            return true;
        }
        let left_at = self.left_at.load(Ordering::Relaxed);
        left_at > 0 && self.now() < left_at + RECEIVING_GRACE.as_nanos() as u64
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// A caller inside `recv`.
struct Inside<'a>(&'a Presence);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        // The time first, so there is no moment with nobody inside and an old time.
        self.0.left_at.store(self.0.now().max(1), Ordering::Relaxed);
        self.0.inside.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The receiver thread's state.
struct ReceiverThread {
    socket: Arc<Socket>,
    reading: Arc<Mutex<Reading>>,
    stop: Arc<AtomicBool>,
    presence: Arc<Presence>,
    frames: Sender<Frame>,
    woken: Receiver<()>,
    terminal: Arc<OnceLock<Terminal>>,
    counters: Arc<ReadCounters>,
    tid: Arc<AtomicI32>,
}

impl ReceiverThread {
    fn run(self) {
        // SAFETY: gettid has no preconditions.
        self.tid.store(unsafe { libc::gettid() }, Ordering::Release);
        let end = self.receive_until_end();
        self.publish(end);
        // Dropping `self.frames` here tells `recv` that no more frames will come.
    }

    /// Published once: a caller may have read the end first.
    fn publish(&self, end: Terminal) {
        if self.terminal.set(end).is_ok() {
            self.counters.ended_by(Reader::Receiver);
        }
    }

    fn receive_until_end(&self) -> Terminal {
        // How long to leave the socket to a caller before looking again: doubled while the
        // application keeps receiving, so a busy connection wakes its receiver rarely.
        let mut aside = RECEIVING_GRACE;
        loop {
            if self.stop.load(Ordering::Acquire) {
                return self.local_shutdown();
            }
            if let Some(end) = self.terminal.get() {
                return end.clone();
            }
            if self.presence.receiving() {
                // The caller reads its own frames; look again when it may have stopped.
                park_timeout(aside);
                aside = (aside * 2).min(LONGEST_ASIDE);
                continue;
            }
            aside = RECEIVING_GRACE;
            // Bytes already read (the rest of a read that brought several frames) are decoded
            // first: a frame, or garbage, must not wait in the buffer for a caller.
            let pending = self
                .reading
                .try_lock()
                .is_ok_and(|r| r.reader.has_buffered());
            if !pending {
                // Wait for bytes without taking them, so a caller that comes meanwhile reads
                // them. An error is left for the read below to report.
                if let Err(e) = wait_for_bytes(&self.socket) {
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                }
                if self.stop.load(Ordering::Acquire) {
                    return self.local_shutdown();
                }
                if self.presence.receiving() {
                    continue;
                }
            }
            let Ok(mut reading) = self.reading.try_lock() else {
                continue;
            };
            // A caller may have taken the bytes between the wait and the lock: never block
            // holding the read side with nothing to read.
            if !reading.reader.has_buffered() && !readable_now(&self.socket) {
                continue;
            }
            let frame = match reading.next(&mut &*self.socket, &self.stop, Reader::Receiver) {
                Next::Frame(frame) => frame,
                Next::End(Terminal::LocalShutdown) => return self.local_shutdown(),
                Next::End(end) => {
                    // Published before the read side is let go: a reset reads once, and a
                    // caller taking the read side next would read a clean end after it and
                    // publish that instead (found by the model checker, `just model-check`).
                    #[cfg(feature = "bug-injection")]
                    if crate::injected::is(crate::injected::Bug::EndPublishedAfterReadSide) {
                        drop(reading);
                        return end;
                    }
                    self.publish(end.clone());
                    return end;
                }
                // Cannot happen: the socket has no read timeout.
                Next::TimedOut => continue,
            };
            #[cfg(feature = "bug-injection")]
            if crate::injected::is(crate::injected::Bug::QueueAfterReadSide) {
                drop(reading);
            }
            // Queued while the read side is held, so a caller finds it before reading on.
            match send_unless_woken(&self.frames, frame, &self.woken) {
                Ok(()) => {}
                Err(true) => return self.local_shutdown(),
                // Cannot happen while the Connection lives (it owns the other end).
                Err(false) => return Terminal::LocalShutdown,
            }
        }
    }

    fn local_shutdown(&self) -> Terminal {
        #[cfg(all(feature = "bug-injection", wringer_model))]
        if crate::injected::is(crate::injected::Bug::UseAfterClose) {
            // As the real bug: read the number again while the closer closes it.
            for _ in 0..16 {
                shuttle::thread::yield_now();
                let mut byte = [0u8; 1];
                let _ = self
                    .socket
                    .recv_now(&mut [std::io::IoSliceMut::new(&mut byte)]);
            }
        }
        #[cfg(all(feature = "bug-injection", not(wringer_model)))]
        if let Some(e) = crate::injected::read_again_after_close(self.socket.as_raw_fd()) {
            return Terminal::Failed(ReceiverError::io(&e));
        }
        Terminal::LocalShutdown
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves no broken invariant worth propagating.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`lock`], for a call bounded by `deadline`: a lock another thread holds fixes the deadline
/// before the wait for it, so the call's bound counts that wait too.
fn lock_by<'m, T>(m: &'m Mutex<T>, deadline: &mut Deadline) -> MutexGuard<'m, T> {
    match m.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => {
            deadline.fixed(Instant::now());
            lock(m)
        }
    }
}

#[cfg(not(wringer_model))]
fn not_inet() -> Error {
    Error::InvalidArgument("only TCP/IP sockets are supported".into())
}

#[cfg(wringer_model)]
fn unsent_bytes(socket: &Socket) -> Result<i32> {
    Ok(socket.unsent() as i32)
}

#[cfg(not(wringer_model))]
fn unsent_bytes(socket: &Socket) -> Result<i32> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one c_int through the pointer, which points at `n`. The fd is kept
    // open by the `&Socket` borrow.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    if rc < 0 {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    Ok(n)
}
