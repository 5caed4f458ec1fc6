//! A fixed number of TCP ping-pong round trips over loopback, for profiles that count work
//! per round trip (instructions under callgrind, syscalls under `strace -c`) rather than time
//! it: run it with two counts and divide the difference, so that start-up cancels out.
//!
//! `cargo run --release --example pingpong_count -- SIZE ROUND_TRIPS MODE`, MODE one of
//! `connection` (our connection, blocking), `busy` (our connection, busy-polling),
//! `frames` (our frames straight on the socket, no connection), `raw` (plain reads and
//! writes of SIZE bytes, as sockperf does), and busy-polling floors without frames:
//! `raw-busy` (`send` and non-blocking `recv` spins of SIZE bytes, as `sockperf --nonblocked`
//! does), `raw-busy-vectored` (a 24-byte header and SIZE bytes in two pieces, through
//! `sendmsg` and `recvmsg` spins, as our connection sends and receives them), and
//! `raw-busy-vsend` / `raw-busy-vrecv` (only the send, or only the receive, in two pieces),
//! `raw-busy-shift` (one piece each way, the body moved after each receive).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use wringer_transport::frame::{Frame, Kind, ReadOutcome, DEFAULT_MAX_PAYLOAD};
use wringer_transport::stream::FrameReader;
use wringer_transport::{Connection, ConnectionOptions};

const T: Duration = Duration::from_secs(10);

const MODES: &[&str] = &[
    "connection",
    "busy",
    "frames",
    "raw",
    "raw-busy",
    "raw-busy-vsend",
    "raw-busy-vrecv",
    "raw-busy-vectored",
    "raw-busy-shift",
];

fn streams() -> std::io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    Ok((a, b))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [size, count, mode] = args.as_slice() else {
        return Err(format!("usage: pingpong_count SIZE ROUND_TRIPS {}", MODES.join("|")).into());
    };
    let (size, count): (usize, u64) = (size.parse()?, count.parse()?);
    let (mut a, mut b) = streams()?;
    // The client on one CPU, the echo on another (their connections' receiver threads with
    // them), as the bench places both sides: unpinned, two spinning threads on one CPU of a
    // two-CPU machine take turns and the time doubles.
    pin(1);
    let started = Instant::now();
    match mode.as_str() {
        "connection" | "busy" => {
            let opts = ConnectionOptions {
                busy_poll: (mode == "busy").then_some(Duration::from_millis(1)),
                ..ConnectionOptions::default()
            };
            let echo = std::thread::spawn(move || -> Result<(), String> {
                pin(0);
                let b = Connection::from_stream(b, opts).map_err(|e| e.to_string())?;
                while let Ok(f) = b.recv(T) {
                    b.send(&f.payload, T).map_err(|e| e.to_string())?;
                    b.recycle(f.payload);
                }
                Ok(())
            });
            let a = Connection::from_stream(a, opts)?;
            let msg = vec![0x5a; size];
            for _ in 0..count {
                a.send(&msg, T)?;
                let back = a.recv(T)?;
                assert_eq!(back.payload.len(), size);
                a.recycle(back.payload);
            }
            a.close()?;
            echo.join().map_err(|_| "echo panicked")??;
        }
        "frames" => {
            let echo = std::thread::spawn(move || {
                pin(0);
                let never = AtomicBool::new(false);
                let mut reader = FrameReader::new(DEFAULT_MAX_PAYLOAD);
                while let Ok(ReadOutcome::Frame(f)) = reader.read_frame(&mut b, &never) {
                    if b.write_all(&f.encode()).is_err() {
                        break;
                    }
                    reader.give_buffer(f.payload);
                }
            });
            let never = AtomicBool::new(false);
            let mut reader = FrameReader::new(DEFAULT_MAX_PAYLOAD);
            for sequence in 0..count {
                let frame = Frame::new(Kind::Data, sequence, vec![0x5a; size])?;
                a.write_all(&frame.encode())?;
                match reader.read_frame(&mut a, &never)? {
                    ReadOutcome::Frame(f) => assert_eq!(f.payload.len(), size),
                    other => return Err(format!("the echo ended: {other:?}").into()),
                }
            }
            drop(a);
            echo.join().map_err(|_| "echo panicked")?;
        }
        "raw" => {
            let echo = std::thread::spawn(move || {
                pin(0);
                let mut buf = vec![0u8; size];
                while b.read_exact(&mut buf).is_ok() {
                    if b.write_all(&buf).is_err() {
                        break;
                    }
                }
            });
            let msg = vec![0x5a; size];
            let mut buf = vec![0u8; size];
            for _ in 0..count {
                a.write_all(&msg)?;
                a.read_exact(&mut buf)?;
            }
            drop(a);
            echo.join().map_err(|_| "echo panicked")?;
        }
        "raw-busy" | "raw-busy-vectored" | "raw-busy-vsend" | "raw-busy-vrecv"
        | "raw-busy-shift" => {
            // Which of the two calls gathers or scatters (header, body); the other moves the
            // same bytes as one piece. `raw-busy` has no header at all.
            let (head_len, vsend, vrecv) = match mode.as_str() {
                "raw-busy-vectored" => (24, true, true),
                "raw-busy-vsend" => (24, true, false),
                "raw-busy-vrecv" | "raw-busy-shift" => (24, false, mode == "raw-busy-vrecv"),
                _ => (0, false, false),
            };
            // `raw-busy-shift`: received as one piece, then the body moved to the buffer's start
            // (what a receive of header and payload into one buffer costs a frame's payload).
            let shift = mode == "raw-busy-shift";
            let echo = std::thread::spawn(move || {
                pin(0);
                let mut m = Message::new(head_len, size);
                while m.spin_in(&b, vrecv) {
                    if shift {
                        m.shift();
                    }
                    m.send(&b, vsend);
                }
            });
            let mut m = Message::new(head_len, size);
            for _ in 0..count {
                m.send(&a, vsend);
                assert!(m.spin_in(&a, vrecv));
                if shift {
                    m.shift();
                }
            }
            drop(a);
            echo.join().map_err(|_| "echo panicked")?;
        }
        other => return Err(format!("unknown mode {other}").into()),
    }
    println!(
        "{count} round trips of {size} B ({mode}) in {:?}",
        started.elapsed()
    );
    Ok(())
}

/// A message of `head` and `body` bytes, in one buffer: moved as one piece (`send`, `recv`)
/// or as two (`sendmsg`, `recvmsg` with an iovec each for the header and the body).
struct Message {
    buf: Vec<u8>,
    head: usize,
}

impl Message {
    fn new(head: usize, body: usize) -> Message {
        Message {
            buf: vec![0x5a; head + body],
            head,
        }
    }

    /// The iovecs of the bytes from `from` on: the rest of the header, then the body.
    fn pieces(&mut self, from: usize) -> ([libc::iovec; 2], usize) {
        let (head, body) = self.buf.split_at_mut(self.head);
        let iov = |s: &mut [u8]| libc::iovec {
            iov_base: s.as_mut_ptr().cast(),
            iov_len: s.len(),
        };
        if from < head.len() {
            ([iov(&mut head[from..]), iov(body)], 2)
        } else {
            ([iov(&mut body[from - head.len()..]), iov(&mut [])], 1)
        }
    }

    fn send(&mut self, s: &TcpStream, gather: bool) {
        use std::os::fd::AsRawFd;
        let n = if gather {
            let (mut iov, len) = self.pieces(0);
            // SAFETY: an all-zero msghdr is valid; its iovecs point into `self.buf`.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = len as _;
            // SAFETY: `msg` and the buffer it points at live across the call; the fd is open.
            unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) }
        } else {
            // SAFETY: `buf` is valid for reads of its length; the fd is open.
            unsafe {
                libc::send(
                    s.as_raw_fd(),
                    self.buf.as_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_NOSIGNAL,
                )
            }
        };
        assert_eq!(n, self.buf.len() as isize, "a short send on loopback");
    }

    /// Move the body to the buffer's start and back (a payload taken out of a buffer that
    /// also held its header).
    fn shift(&mut self) {
        let (head, len) = (self.head, self.buf.len());
        self.buf.copy_within(head..len, 0);
        self.buf.copy_within(0..len - head, head);
    }

    /// Spin on non-blocking receives until the message is whole; false at the peer's end.
    fn spin_in(&mut self, s: &TcpStream, scatter: bool) -> bool {
        use std::os::fd::AsRawFd;
        let mut got = 0;
        while got < self.buf.len() {
            let n = if scatter {
                let (mut iov, len) = self.pieces(got);
                // SAFETY: as in `send`, for writable pieces of `self.buf`.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = iov.as_mut_ptr();
                msg.msg_iovlen = len as _;
                // SAFETY: `msg` and the buffer it points at live across the call.
                unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) }
            } else {
                let rest = &mut self.buf[got..];
                // SAFETY: `rest` is valid for writes of its length; the fd is open.
                unsafe {
                    libc::recv(
                        s.as_raw_fd(),
                        rest.as_mut_ptr().cast(),
                        rest.len(),
                        libc::MSG_DONTWAIT,
                    )
                }
            };
            match n {
                0 => return false,
                n if n > 0 => got += n as usize,
                _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock => {
                    std::hint::spin_loop()
                }
                _ => return false,
            }
        }
        true
    }
}

/// Pin the calling thread to `cpu` (the threads it starts inherit it); nothing on a machine
/// with one CPU.
fn pin(cpu: usize) {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return;
    }
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE for any machine this runs on.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size given; 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    assert_eq!(
        rc,
        0,
        "pinning to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
}
