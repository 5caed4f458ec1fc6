//! A framed TCP connection with one receiver thread and a teardown that is right by construction.
//!
//! Teardown order: publish stop, `shutdown(Both)`, join the receiver, and only then release the
//! descriptor. The socket is shared as `Arc<Socket>` between the connection and its receiver, so
//! the descriptor is closed when the last owner drops it: it cannot be closed, or its number
//! reused, while the receiver can still call `recv` on it.

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, RecvTimeoutError, Sender};
use socket2::Socket;

use crate::error::{Error, ReceiverError, Result, Terminal};
use crate::frame::{Frame, Header, Kind, ReadOutcome, DEFAULT_MAX_PAYLOAD};
use crate::stream::{FrameReader, ReadError, WriteError};

#[derive(Clone, Copy, Debug)]
pub struct ConnectionOptions {
    /// Largest payload accepted from the peer.
    pub max_payload: u32,
    /// Frames the receiver may hold before it waits for the application to take them.
    pub queue_depth: usize,
    /// Spin this long in `recv` for a frame before sleeping. Trades a core for latency: a
    /// sleeping caller needs a wake-up from the receiver thread (a context switch each way).
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
    frames: Receiver<Frame>,
    terminal: Arc<OnceLock<Terminal>>,
    stop: Arc<AtomicBool>,
    /// Dropped at teardown to wake a receiver that is blocked handing a frame over.
    wake: Mutex<Option<Sender<()>>>,
    /// Payload buffers handed back by the application for the receiver to reuse.
    recycled: Sender<Vec<u8>>,
    /// The receiver's handle until it is joined. Held for the whole teardown, so a second
    /// caller waits for the first to finish and then finds nothing left to do.
    receiver: Mutex<Option<JoinHandle<()>>>,
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
    pub fn from_stream(stream: TcpStream, opts: ConnectionOptions) -> Result<Connection> {
        Connection::from_socket(Socket::from(stream), opts)
    }

    pub(crate) fn from_socket(socket: Socket, opts: ConnectionOptions) -> Result<Connection> {
        Connection::from_shared(Arc::new(socket), opts)
    }

    /// `socket` must have no other owner left that could outlive this connection's teardown.
    pub(crate) fn from_shared(socket: Arc<Socket>, opts: ConnectionOptions) -> Result<Connection> {
        let local = socket.local_addr()?.as_socket().ok_or_else(not_inet)?;
        let peer = socket.peer_addr()?.as_socket().ok_or_else(not_inet)?;
        // Handshakes may have set a read timeout; the receiver blocks until shutdown wakes it.
        socket.set_read_timeout(None)?;
        let fd = socket.as_raw_fd();
        let (frames_tx, frames) = crossbeam_channel::bounded(opts.queue_depth.max(1));
        let (wake, woken) = crossbeam_channel::bounded::<()>(0);
        let (recycled, reusable) = crossbeam_channel::bounded(4);
        let terminal = Arc::new(OnceLock::new());
        let stop = Arc::new(AtomicBool::new(false));
        let receiver_tid = Arc::new(AtomicI32::new(0));
        let worker = Receiving {
            socket: Arc::clone(&socket),
            stop: Arc::clone(&stop),
            frames: frames_tx,
            woken,
            reusable,
            terminal: Arc::clone(&terminal),
            tid: Arc::clone(&receiver_tid),
            max_payload: opts.max_payload,
        };
        let handle = std::thread::Builder::new()
            .name(format!("wringer-rx-{fd}"))
            .spawn(move || worker.run())?;
        Ok(Connection {
            socket: RwLock::new(Some(socket)),
            sender: Mutex::new(SendState {
                next_sequence: 0,
                broken: false,
            }),
            frames,
            terminal,
            stop,
            wake: Mutex::new(Some(wake)),
            recycled,
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
        let deadline = Instant::now() + timeout;
        self.checked(|| {
            let socket = self.socket()?;
            let mut state = lock(&self.sender);
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
            match crate::stream::write_frame(&socket, &header, payload, deadline) {
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
                std::thread::sleep(pause.min(deadline - now));
                pause = (pause * 2).min(Duration::from_millis(5));
            }
        })
    }

    /// Next data frame from the peer. Frames that arrived before the receiver stopped are
    /// still delivered; after them comes the reason it stopped.
    pub fn recv(&self, timeout: Duration) -> Result<Frame> {
        if let Some(spin) = self.busy_poll {
            let until = Instant::now() + spin.min(timeout);
            while Instant::now() < until {
                if let Ok(frame) = self.frames.try_recv() {
                    return Ok(frame);
                }
                std::hint::spin_loop();
            }
        }
        match self.frames.recv_timeout(timeout) {
            Ok(frame) => Ok(frame),
            Err(RecvTimeoutError::Timeout) => Err(Error::Timeout {
                during: "recv",
                after: timeout,
            }),
            Err(RecvTimeoutError::Disconnected) => Err(match self.terminal.get() {
                Some(Terminal::PeerClosed) => Error::PeerClosed,
                Some(Terminal::Failed(e)) => Error::Receiver(e.clone()),
                Some(Terminal::LocalShutdown) | None => Error::Closed,
            }),
        }
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
        if let Some(socket) = &socket {
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
        use crate::injected::{close_raw, dup, shutdown_and_close, Bug};
        match bug {
            Bug::CloseBeforeJoin | Bug::UseAfterClose => {
                if let Some(s) = &socket {
                    let _ = s.shutdown(Shutdown::Both);
                }
                close_raw(self.fd);
                let _ = handle.join();
            }
            Bug::CloseWhileInUse => {
                let spare = dup(self.fd);
                close_raw(self.fd);
                shutdown_and_close(spare);
                let _ = handle.join();
            }
            Bug::LateTimer | Bug::NoHelloBackstop | Bug::ShortDirectRead | Bug::LockAcrossJoin => {
                unreachable!("not a teardown bug")
            }
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

    /// True while the receiver thread sleeps inside `recv` (read from /proc, Linux only): it is
    /// really blocked in a receive, not merely about to start one. For tests and harnesses that
    /// must tear down a connection whose receiver is blocked.
    pub fn receiver_blocked_in_recv(&self) -> bool {
        let tid = self.receiver_tid();
        if tid == 0 {
            return false;
        }
        let task = format!("/proc/self/task/{tid}");
        let Ok(syscall) = std::fs::read_to_string(format!("{task}/syscall")) else {
            return false;
        };
        let nr: i64 = syscall
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1);
        let stat = std::fs::read_to_string(format!("{task}/stat")).unwrap_or_default();
        // The state is the first field after the parenthesised thread name.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("");
        state == "S" && (nr == libc::SYS_recvfrom || nr == libc::SYS_read)
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

/// The receiver thread's state.
struct Receiving {
    socket: Arc<Socket>,
    stop: Arc<AtomicBool>,
    frames: Sender<Frame>,
    woken: Receiver<()>,
    reusable: Receiver<Vec<u8>>,
    terminal: Arc<OnceLock<Terminal>>,
    tid: Arc<AtomicI32>,
    max_payload: u32,
}

impl Receiving {
    fn run(self) {
        // SAFETY: gettid has no preconditions.
        self.tid.store(unsafe { libc::gettid() }, Ordering::Release);
        let end = self.receive_until_end();
        // The only writer: published exactly once.
        let _ = self.terminal.set(end);
        // Dropping `self.frames` here tells `recv` that no more frames will come.
    }

    fn receive_until_end(&self) -> Terminal {
        let mut reader = FrameReader::new(self.max_payload);
        let mut expected = 0u64;
        loop {
            if let Ok(buf) = self.reusable.try_recv() {
                reader.give_buffer(buf);
            }
            let frame = match reader.read_frame(&mut &*self.socket, &self.stop) {
                Ok(ReadOutcome::Frame(frame)) => frame,
                Ok(ReadOutcome::CleanEof) => return Terminal::PeerClosed,
                Ok(ReadOutcome::LocalShutdown) => {
                    #[cfg(feature = "bug-injection")]
                    if let Some(e) =
                        crate::injected::read_again_after_close(self.socket.as_raw_fd())
                    {
                        return Terminal::Failed(ReceiverError::io(&e));
                    }
                    return Terminal::LocalShutdown;
                }
                Ok(ReadOutcome::Truncated {
                    section,
                    expected,
                    got,
                }) => {
                    return Terminal::Failed(ReceiverError::Truncated {
                        section,
                        expected,
                        got,
                    })
                }
                Err(ReadError::Frame(e)) => return Terminal::Failed(e.into()),
                Err(ReadError::Io(e)) => return Terminal::Failed(ReceiverError::io(&e)),
            };
            if frame.header.kind != Kind::Data {
                return Terminal::Failed(ReceiverError::UnexpectedKind(frame.header.kind));
            }
            if frame.header.sequence != expected {
                return Terminal::Failed(ReceiverError::OutOfSequence {
                    expected,
                    got: frame.header.sequence,
                });
            }
            expected += 1;
            select! {
                send(self.frames, frame) -> sent => if sent.is_err() {
                    // Cannot happen while the Connection lives (it owns the other end).
                    return Terminal::LocalShutdown;
                },
                recv(self.woken) -> _ => return Terminal::LocalShutdown,
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks leaves no broken invariant worth propagating.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn not_inet() -> Error {
    Error::InvalidArgument("only TCP/IP sockets are supported".into())
}

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
