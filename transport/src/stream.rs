//! Blocking frame IO over a byte stream: the thin IO layer on top of the sans-IO [`frame`] core.
//!
//! [`frame`]: crate::frame

use std::io::{self, IoSlice, IoSliceMut, Read};
#[cfg(not(wringer_model))]
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[cfg(not(wringer_model))]
use socket2::Socket;
use thiserror::Error;

use crate::deadline::Deadline;
#[cfg(wringer_model)]
use crate::model_socket::Socket;
use crate::sync::{AtomicBool, Instant};

use crate::frame::{Decoder, FrameError, Header, ReadOutcome, HEADER_LEN};

/// The buffered read's size. Small frames arrive many to a read; a payload larger than this is
/// read straight into the frame, so a large frame is copied through the buffer for at most this
/// much (at 64 KiB, a 64 KiB ping-pong spent 3 µs a message copying).
const READ_BUF: usize = 8 * 1024;

#[derive(Debug, Error)]
pub enum ReadError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Reads frames one at a time from any [`Read`].
pub struct FrameReader {
    decoder: Decoder,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    exact: bool,
}

impl FrameReader {
    /// Buffered: reads up to [`READ_BUF`] at a time, may hold bytes of the next frame.
    pub fn new(max_payload: u32) -> FrameReader {
        FrameReader {
            decoder: Decoder::new(max_payload),
            buf: vec![0; READ_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            exact: false,
        }
    }

    /// Never reads past the frame it returns, so the rest of the stream can go to a new owner
    /// (used for handshakes).
    pub fn exact(max_payload: u32) -> FrameReader {
        FrameReader {
            decoder: Decoder::new(max_payload),
            buf: Box::new([]),
            start: 0,
            end: 0,
            exact: true,
        }
    }

    /// Bytes already read from the stream and not yet decoded (part of a frame, or frames).
    pub(crate) fn has_buffered(&self) -> bool {
        self.start < self.end
    }

    /// Offer a used payload buffer for the next frame (see [`Decoder::give_buffer`]).
    pub fn give_buffer(&mut self, buf: Vec<u8>) {
        self.decoder.give_buffer(buf);
    }

    /// Read one frame. `stopped` is our own stop flag: once it is set, an end of stream is
    /// [`ReadOutcome::LocalShutdown`], whatever was partially read. A failing read is an error
    /// even then: after a stop, an error (EBADF above all) is evidence, not a normal close.
    pub fn read_frame<R: Read>(
        &mut self,
        reader: &mut R,
        stopped: &AtomicBool,
    ) -> Result<ReadOutcome, ReadError> {
        loop {
            if self.start < self.end {
                let (n, frame) = self.decoder.feed(&self.buf[self.start..self.end])?;
                self.start += n;
                if let Some(frame) = frame {
                    return Ok(ReadOutcome::Frame(frame));
                }
            }
            // The buffer is drained. At a frame boundary with a payload buffer to reuse, one read
            // takes the header and the start of the payload straight into that buffer.
            if !self.exact {
                let limit = self.buf.len();
                if let Some((head, spare)) = self.decoder.header_and_spare(limit) {
                    let mut slots = [IoSliceMut::new(head), IoSliceMut::new(spare)];
                    match reader.read_vectored(&mut slots) {
                        Ok(0) => {
                            return Ok(self.decoder.end_of_stream(stopped.load(Ordering::Acquire)))
                        }
                        Ok(n) => {
                            let (frame, rest) =
                                self.decoder.commit_header_and_spare(n, &mut self.buf)?;
                            (self.start, self.end) = (0, rest);
                            if let Some(frame) = frame {
                                return Ok(ReadOutcome::Frame(frame));
                            }
                            continue;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            // Large payloads are read straight into the frame.
            let direct = self.exact || self.decoder.wanted() >= self.buf.len();
            #[cfg(feature = "bug-injection")]
            let mut slot_len = 0;
            let result = if direct {
                let slot = self.decoder.read_slot();
                if slot.is_empty() {
                    // Only a failed decoder hands out an empty slot; surface its error.
                    self.decoder.commit(0)?;
                    unreachable!("an empty read slot means the decoder has failed");
                }
                #[cfg(feature = "bug-injection")]
                {
                    slot_len = slot.len();
                }
                reader.read(slot)
            } else {
                reader.read(&mut self.buf)
            };
            match result {
                Ok(0) => return Ok(self.decoder.end_of_stream(stopped.load(Ordering::Acquire))),
                Ok(n) if direct => {
                    #[cfg(feature = "bug-injection")]
                    let n = crate::injected::direct_read(n, slot_len);
                    if let Some(frame) = self.decoder.commit(n)? {
                        return Ok(ReadOutcome::Frame(frame));
                    }
                }
                Ok(n) => {
                    self.start = 0;
                    self.end = n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A socket read with a deadline, for a caller that reads its own frames: each read waits for
/// bytes in `poll` (spinning first for `spin`, when busy polling), then takes them without
/// blocking, so the socket stays in blocking mode for the receiver thread. A read that finds
/// the deadline passed is [`io::ErrorKind::TimedOut`]; the frame reader keeps what it had.
/// Neither the deadline nor the spin reads the clock before the first try has found nothing.
pub(crate) struct ReadUntil<'a> {
    socket: &'a Socket,
    deadline: Deadline,
    /// How long to spin on non-blocking receives; `None` once the spin is over.
    spin: Option<Duration>,
    /// When the spin ends, from the end of its first batch of tries.
    spin_until: Option<Instant>,
    /// A read of this `recv` has brought bytes already.
    read_before: bool,
}

impl<'a> ReadUntil<'a> {
    pub(crate) fn new(socket: &'a Socket, deadline: Deadline, spin: Option<Duration>) -> Self {
        ReadUntil {
            socket,
            deadline,
            spin,
            spin_until: None,
            read_before: false,
        }
    }
}

impl Read for ReadUntil<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_vectored(&mut [IoSliceMut::new(buf)])
    }

    fn read_vectored(&mut self, buf: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        // Busy polling: the clock is read once per batch of tries, not on every one.
        while let Some(spin) = self.spin {
            for _ in 0..SPIN_BATCH {
                match recv_now(self.socket, buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                    other => return other,
                }
            }
            let now = Instant::now();
            if now >= *self.spin_until.get_or_insert(now + spin) {
                self.spin = None;
            }
        }
        if self.read_before {
            // The rest of a frame that has begun to arrive is most likely here already: take
            // it without asking `poll` first.
            match recv_now(self.socket, buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return other,
            }
        }
        loop {
            let Some(left) = self.deadline.left(Instant::now()) else {
                return Err(io::ErrorKind::TimedOut.into());
            };
            // Asleep until the kernel wakes us: the one wake-up per message sockperf pays.
            wait_for(self.socket, libc::POLLIN, left)?;
            match recv_now(self.socket, buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => {
                    self.read_before = true;
                    return other;
                }
            }
        }
    }
}

/// Non-blocking receives tried between two looks at the clock while busy polling.
const SPIN_BATCH: usize = 32;

/// Take what the socket holds without waiting (`WouldBlock` when it holds nothing): one
/// `recv(2)` into one buffer, one `recvmsg(2)` into several.
#[cfg(wringer_model)]
fn recv_now(socket: &Socket, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
    socket.recv_now(bufs)
}

#[cfg(not(wringer_model))]
fn recv_now(socket: &Socket, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
    if let [one] = bufs {
        return recv_with(socket, one, libc::MSG_DONTWAIT);
    }
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSliceMut is ABI-compatible with `struct iovec` on Unix (std guarantees it), and each
    // slice is valid for writes of its length while `bufs` is borrowed, for the whole call.
    msg.msg_iov = bufs.as_mut_ptr().cast();
    msg.msg_iovlen = bufs.len() as _;
    // SAFETY: `msg` points at `bufs` only (see above); the fd is kept open by the `&Socket`.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Block until the socket has bytes to read, or its end or an error is there to be read,
/// without taking any. In `poll`, not a `MSG_PEEK` receive: a receive, even a peek, takes a
/// pending error such as a reset, which can be read only once, and a caller reading at the
/// same time would then find a clean end of stream instead. `shutdown` wakes it all the same.
pub(crate) fn wait_for_bytes(socket: &Socket) -> io::Result<()> {
    poll_once(socket, libc::POLLIN, -1).map(drop)
}

/// One `recv(2)` into `buf` with `flags`.
#[cfg(not(wringer_model))]
fn recv_with(socket: &Socket, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length for the duration of the call; the fd is
    // kept open by the `&Socket` borrow.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            flags,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// True when a read would not block now (bytes, the end of the stream, or an error).
pub(crate) fn readable_now(socket: &Socket) -> bool {
    poll_once(socket, libc::POLLIN, 0).is_ok_and(|ready| ready)
}

/// Frames up to this size (header included) go out as one copied buffer.
const SMALL_FRAME: usize = 1024;

/// Why a deadline-bounded write stopped.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// Deadline passed; `written` bytes of the frame are already on the wire.
    Timeout {
        written: usize,
    },
    Io {
        written: usize,
        error: io::Error,
    },
}

/// Write a header and payload with one vectored send per attempt, never blocking past
/// `deadline` (fixed from the clock only once the socket has no room). Sends are non-blocking
/// (`MSG_DONTWAIT`) and wait in `poll(POLLOUT)`, so the socket itself stays in blocking mode for
/// its receiver thread. `MSG_NOSIGNAL`: a dead peer is an
/// error, not a SIGPIPE.
pub(crate) fn write_frame(
    socket: &Socket,
    header: &Header,
    payload: &[u8],
    deadline: &mut Deadline,
) -> Result<(), WriteError> {
    let head = header.encode();
    let total = HEADER_LEN + payload.len();
    let mut written = 0;
    if total <= SMALL_FRAME {
        // One contiguous buffer and a plain `send`: for a small frame, copying it is cheaper
        // than `sendmsg`'s gathering of two pieces.
        let mut whole = [0u8; SMALL_FRAME];
        whole[..HEADER_LEN].copy_from_slice(&head);
        whole[HEADER_LEN..total].copy_from_slice(payload);
        match socket.send_with_flags(&whole[..total], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
            Ok(n) => written = n,
            Err(e)
                if e.kind() == io::ErrorKind::Interrupted
                    || e.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(WriteError::Io { written, error }),
        }
    }
    while written < total {
        let bufs: [IoSlice; 2] = if written < HEADER_LEN {
            [IoSlice::new(&head[written..]), IoSlice::new(payload)]
        } else {
            [
                IoSlice::new(&payload[written - HEADER_LEN..]),
                IoSlice::new(&[]),
            ]
        };
        match socket.send_vectored_with_flags(&bufs, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let Some(left) = deadline.left(Instant::now()) else {
                    return Err(WriteError::Timeout { written });
                };
                if let Err(error) = wait_for(socket, libc::POLLOUT, left) {
                    return Err(WriteError::Io { written, error });
                }
            }
            Err(error) => return Err(WriteError::Io { written, error }),
        }
    }
    Ok(())
}

/// Wait in `poll` for `events` on the socket, at most `timeout`.
fn wait_for(socket: &Socket, events: libc::c_short, timeout: Duration) -> io::Result<()> {
    // Round up so a sub-millisecond remainder still waits instead of spinning.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    match poll_once(socket, events, ms) {
        Err(e) if e.kind() != io::ErrorKind::Interrupted => Err(e),
        // Timeout or readiness (including POLLERR/POLLHUP): the next call reports which.
        _ => Ok(()),
    }
}

/// One `poll` on the model socket.
#[cfg(wringer_model)]
fn poll_once(socket: &Socket, events: libc::c_short, timeout_ms: i32) -> io::Result<bool> {
    socket.poll(events & libc::POLLOUT != 0, timeout_ms)
}

/// One `poll(2)` on the socket: whether any of `events` (or an error or hang-up) is there.
#[cfg(not(wringer_model))]
fn poll_once(socket: &Socket, events: libc::c_short, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd for the duration of the call and nfds is 1. The fd is
    // kept open by the `&Socket` borrow.
    match unsafe { libc::poll(&mut pfd, 1, timeout_ms) } {
        rc if rc < 0 => Err(io::Error::last_os_error()),
        rc => Ok(rc > 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Frame, Kind};

    /// Hands out its data `chunk` bytes per read.
    struct Dribble<'a> {
        data: &'a [u8],
        chunk: usize,
    }

    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.chunk.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn exact_reader_leaves_the_next_frame_unread() {
        let a = Frame::new(Kind::Hello, 0, vec![1, 2, 3]).unwrap();
        let b = Frame::new(Kind::Data, 0, vec![4]).unwrap();
        let mut bytes = a.encode();
        bytes.extend(b.encode());
        let mut src = Dribble {
            data: &bytes,
            chunk: 1000,
        };
        let stop = AtomicBool::new(false);
        let got = FrameReader::exact(64).read_frame(&mut src, &stop).unwrap();
        assert_eq!(got, ReadOutcome::Frame(a));
        assert_eq!(src.data, &b.encode()[..]);
    }

    #[test]
    fn large_payload_bypasses_the_buffer_intact() {
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let f = Frame::new(Kind::Data, 9, payload).unwrap();
        let bytes = f.encode();
        let stop = AtomicBool::new(false);
        let mut r = FrameReader::new(1 << 20);
        let mut src = Dribble {
            data: &bytes,
            chunk: 4096,
        };
        assert_eq!(
            r.read_frame(&mut src, &stop).unwrap(),
            ReadOutcome::Frame(f)
        );
        assert_eq!(
            r.read_frame(&mut src, &stop).unwrap(),
            ReadOutcome::CleanEof
        );
    }

    /// Counts the reads it serves; hands out everything it has to each, or fails the first
    /// `interrupts` of them with EINTR.
    struct Counting<'a> {
        data: &'a [u8],
        reads: usize,
        interrupts: usize,
    }

    impl Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            if self.interrupts > 0 {
                self.interrupts -= 1;
                return Err(io::Error::from(io::ErrorKind::Interrupted));
            }
            let n = buf.len().min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn frames(count: u64, len: usize) -> (Vec<Frame>, Vec<u8>) {
        let frames: Vec<Frame> = (0..count)
            .map(|i| Frame::new(Kind::Data, i, vec![i as u8; len]).unwrap())
            .collect();
        let bytes = frames.iter().flat_map(|f| f.encode()).collect();
        (frames, bytes)
    }

    #[test]
    fn an_interrupted_read_is_retried() {
        let (want, bytes) = frames(1, 10);
        let mut src = Counting {
            data: &bytes,
            reads: 0,
            interrupts: 2,
        };
        let stop = AtomicBool::new(false);
        let got = FrameReader::new(64).read_frame(&mut src, &stop).unwrap();
        assert_eq!(got, ReadOutcome::Frame(want[0].clone()));
        assert_eq!(src.reads, 3);
    }

    #[test]
    fn small_frames_that_arrive_together_come_from_one_read() {
        let (want, bytes) = frames(100, 10);
        let mut src = Counting {
            data: &bytes,
            reads: 0,
            interrupts: 0,
        };
        let stop = AtomicBool::new(false);
        let mut r = FrameReader::new(64);
        for f in want {
            assert_eq!(
                r.read_frame(&mut src, &stop).unwrap(),
                ReadOutcome::Frame(f)
            );
        }
        assert_eq!(
            src.reads, 1,
            "3,000 bytes of frames took {} reads",
            src.reads
        );
    }

    #[test]
    fn a_large_payload_is_read_straight_into_its_frame_in_few_reads() {
        let (want, bytes) = frames(1, 3 << 20);
        let mut src = Counting {
            data: &bytes,
            reads: 0,
            interrupts: 0,
        };
        let stop = AtomicBool::new(false);
        let got = FrameReader::new(4 << 20)
            .read_frame(&mut src, &stop)
            .unwrap();
        assert_eq!(got, ReadOutcome::Frame(want[0].clone()));
        // The header and the first 64 KiB through the buffer, then 1 MiB slots: 1 + 3.
        assert!(src.reads <= 4, "3 MiB took {} reads", src.reads);
    }

    #[test]
    fn a_given_buffer_carries_the_next_large_payload() {
        let (want, bytes) = frames(1, 300_000);
        let mut src = Counting {
            data: &bytes,
            reads: 0,
            interrupts: 0,
        };
        let stop = AtomicBool::new(false);
        let mut r = FrameReader::new(1 << 20);
        let spare = Vec::with_capacity(1 << 20);
        let spare_at = spare.as_ptr();
        r.give_buffer(spare);
        match r.read_frame(&mut src, &stop).unwrap() {
            ReadOutcome::Frame(f) => {
                assert_eq!(f, want[0]);
                assert_eq!(
                    f.payload.as_ptr(),
                    spare_at,
                    "the given buffer was not used"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
