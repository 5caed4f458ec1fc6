//! A connected stream socket for model tests (`--cfg wringer_model`): two ends of bytes, each
//! direction with its end (FIN), shutdown of either side, and close. The point is the threads
//! around it, so it keeps what they depend on: a read blocks until bytes, an end or a shutdown
//! of its side; `poll` waits the same way; a close ends the number, and any use of a closed
//! number fails the model ("use after close"), as a reused descriptor would fail a real program.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};

use shuttle::sync::{Arc, Condvar, Mutex};

#[derive(Default)]
struct Link {
    /// Bytes on their way to each side, and whether their writer has ended them (FIN).
    to: [VecDeque<u8>; 2],
    fin: [bool; 2],
    /// Each side's own `shutdown(Read)`: its reads end at once.
    read_shut: [bool; 2],
    write_shut: [bool; 2],
    closed: [bool; 2],
    /// A reset on its way to each side: read once, as ECONNRESET, then the stream has ended.
    reset: [bool; 2],
}

struct Shared {
    link: Mutex<Link>,
    changed: Condvar,
}

/// One end of a model stream.
pub struct Socket {
    shared: Arc<Shared>,
    side: usize,
    fd: RawFd,
}

/// Model descriptor numbers, for messages (they stand for no kernel descriptor).
static NEXT_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1000);

/// A connected pair, as `socketpair(2)` makes.
pub fn pair() -> (Socket, Socket) {
    let shared = Arc::new(Shared {
        link: Mutex::new(Link::default()),
        changed: Condvar::new(),
    });
    let a = NEXT_FD.fetch_add(2, std::sync::atomic::Ordering::SeqCst);
    (
        Socket {
            shared: Arc::clone(&shared),
            side: 0,
            fd: a,
        },
        Socket {
            shared,
            side: 1,
            fd: a + 1,
        },
    )
}

impl Socket {
    fn link(&self) -> shuttle::sync::MutexGuard<'_, Link> {
        let l = self.shared.link.lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            !l.closed[self.side],
            "use after close: descriptor {} used after it was closed",
            self.fd
        );
        l
    }

    /// Wait for a change; a close of this side meanwhile fails the model (the waiting thread
    /// `doing` something with it would use a closed number next).
    fn wait<'a>(
        &self,
        l: shuttle::sync::MutexGuard<'a, Link>,
        doing: &str,
    ) -> shuttle::sync::MutexGuard<'a, Link> {
        let l = self
            .shared
            .changed
            .wait(l)
            .unwrap_or_else(|p| p.into_inner());
        assert!(
            !l.closed[self.side],
            "use after close: descriptor {} closed while a thread {doing}",
            self.fd
        );
        l
    }

    fn peer(&self) -> usize {
        1 - self.side
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let mut l = self.link();
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            l.read_shut[self.side] = true;
        }
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            l.write_shut[self.side] = true;
            l.fin[self.peer()] = true;
        }
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Whether a read would not block: bytes, an end, a reset, or a shutdown of this side.
    fn readable(&self, l: &Link) -> bool {
        !l.to[self.side].is_empty()
            || l.fin[self.side]
            || l.read_shut[self.side]
            || l.reset[self.side]
    }

    /// Take up to the buffers' length; `None` when it would block.
    fn take_bytes(&self, l: &mut Link, bufs: &mut [IoSliceMut<'_>]) -> Option<io::Result<usize>> {
        if !self.readable(l) {
            return None;
        }
        if l.to[self.side].is_empty() && l.reset[self.side] && !l.read_shut[self.side] {
            // A pending error is read once; after it the stream has ended.
            l.reset[self.side] = false;
            l.fin[self.side] = true;
            return Some(Err(io::ErrorKind::ConnectionReset.into()));
        }
        let mut n = 0;
        for b in bufs.iter_mut() {
            for slot in b.iter_mut() {
                match l.to[self.side].pop_front() {
                    Some(byte) => {
                        *slot = byte;
                        n += 1;
                    }
                    None => return Some(Ok(n)),
                }
            }
        }
        Some(Ok(n))
    }

    /// `recv` with `MSG_DONTWAIT`: `WouldBlock` when nothing is there.
    pub fn recv_now(&self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let mut l = self.link();
        self.take_bytes(&mut l, bufs)
            .unwrap_or_else(|| Err(io::ErrorKind::WouldBlock.into()))
    }

    /// One `poll`: `timeout_ms` below 0 waits for ever, 0 looks once, above 0 may end at any
    /// moment (the model's timeouts fire whenever the scheduler lets them).
    pub fn poll(&self, write: bool, timeout_ms: i32) -> io::Result<bool> {
        let mut l = self.link();
        loop {
            let ready = write || self.readable(&l);
            if ready || timeout_ms == 0 {
                return Ok(ready);
            }
            if timeout_ms > 0 {
                drop(l);
                shuttle::thread::yield_now();
                let l = self.link();
                return Ok(self.readable(&l));
            }
            l = self.wait(l, "waited in poll on it");
        }
    }

    pub fn send_with_flags(&self, buf: &[u8], _flags: i32) -> io::Result<usize> {
        self.send_vectored_with_flags(&[IoSlice::new(buf)], _flags)
    }

    pub fn send_vectored_with_flags(&self, bufs: &[IoSlice<'_>], _flags: i32) -> io::Result<usize> {
        let mut l = self.link();
        if l.write_shut[self.side] {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let peer = self.peer();
        let mut n = 0;
        for b in bufs {
            l.to[peer].extend(b.iter().copied());
            n += b.len();
        }
        self.shared.changed.notify_all();
        Ok(n)
    }

    /// The peer aborts (RST): what it sent is still read, then one ECONNRESET, then nothing.
    pub fn abort(&self) {
        let mut l = self.link();
        let peer = self.peer();
        l.reset[peer] = true;
        self.shared.changed.notify_all();
    }

    /// Bytes sent and not yet read by the peer (the model's SIOCOUTQ).
    pub fn unsent(&self) -> usize {
        self.link().to[self.peer()].len()
    }

    /// The test's writer: bytes into the stream, as a peer's sends.
    pub fn write_all(&self, bytes: &[u8]) {
        self.send_with_flags(bytes, 0).expect("model peer write");
    }
}

impl Read for &Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_vectored(&mut [IoSliceMut::new(buf)])
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let mut l = self.link();
        loop {
            if let Some(read) = self.take_bytes(&mut l, bufs) {
                return read;
            }
            l = self.wait(l, "was reading it");
        }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let mut l = self.shared.link.lock().unwrap_or_else(|p| p.into_inner());
        if !l.closed[self.side] {
            l.closed[self.side] = true;
            l.fin[1 - self.side] = true;
        }
        self.shared.changed.notify_all();
    }
}

/// Close a model descriptor by its number (the test-only bugs' `close(2)`).
pub(crate) fn close_number(socket: &Socket) {
    let mut l = socket.shared.link.lock().unwrap_or_else(|p| p.into_inner());
    l.closed[socket.side] = true;
    l.fin[1 - socket.side] = true;
    socket.shared.changed.notify_all();
}
