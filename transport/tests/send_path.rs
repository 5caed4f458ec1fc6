//! The send path against a peer that reads slowly, never reads, or resets; flush; and the
//! connection's housekeeping (drop, recycling, the receiver's state, Debug). Written for what
//! the mutation run showed no test would notice (docs/mutants.md).

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use common::*;
use wringer_transport::frame::ReadOutcome;
use wringer_transport::stream::FrameReader;
use wringer_transport::{Connection, ConnectionOptions, Error};

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn a_slow_reader_gets_every_byte_of_a_large_frame() {
    // The frame is far larger than the socket buffers, so it goes out in many partial sends,
    // each resuming where the last one stopped (inside the header only for the first).
    let (conn, mut peer) = conn_and_raw_peer();
    let payload = pattern(6 << 20, 3);
    let reader = std::thread::spawn(move || {
        let mut slow = SlowReader(&mut peer);
        let stop = AtomicBool::new(false);
        FrameReader::new(8 << 20).read_frame(&mut slow, &stop)
    });
    conn.send(&payload, GENEROUS).unwrap();
    match reader.join().unwrap().unwrap() {
        ReadOutcome::Frame(f) => assert!(f.payload == payload, "the frame arrived altered"),
        other => panic!("{other:?}"),
    }
}

/// Reads at most 16 KiB at a time, pausing between reads.
struct SlowReader<'a>(&'a mut TcpStream);

impl Read for SlowReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        std::thread::sleep(Duration::from_micros(200));
        let n = buf.len().min(16 << 10);
        self.0.read(&mut buf[..n])
    }
}

#[test]
fn a_send_that_cannot_finish_waits_out_its_deadline_asleep() {
    let (conn, _peer) = conn_and_raw_peer();
    let chunk = vec![0u8; 1 << 20];
    let timeout = Duration::from_millis(300);
    for _ in 0..256 {
        let (wall, cpu) = (Instant::now(), thread_cpu());
        match conn.send(&chunk, timeout) {
            Ok(()) => continue,
            Err(Error::Timeout { .. } | Error::SendBroken) => {
                let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
                // Not before the deadline (no early give-up, no deadline in the past)...
                assert!(
                    wall >= timeout - Duration::from_millis(5),
                    "gave up after {wall:?}"
                );
                assert!(wall < Duration::from_secs(5), "took {wall:?}");
                // ...and asleep in poll while it waited, not spinning on sends.
                assert!(cpu < wall / 2, "{cpu:?} of CPU in {wall:?} of waiting");
                return;
            }
            Err(other) => panic!("expected the deadline to end the send, got {other:?}"),
        }
    }
    panic!("256 MiB went to a peer that never reads");
}

#[test]
fn a_send_to_a_peer_that_reset_fails_at_once() {
    let (conn, peer) = conn_and_raw_peer();
    // SO_LINGER 0: the close sends RST.
    socket2::SockRef::from(&peer)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(peer);
    let started = Instant::now();
    let chunk = vec![0u8; 1 << 20];
    let mut outcome = Ok(());
    for _ in 0..64 {
        outcome = conn.send(&chunk, GENEROUS);
        if outcome.is_err() {
            break;
        }
    }
    assert!(outcome.is_err(), "64 MiB went to a reset peer");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "a reset took {:?} to surface (an error waited on as if the buffer were full?)",
        started.elapsed()
    );
}

#[test]
fn flush_returns_only_once_the_peer_has_taken_the_bytes() {
    let (conn, mut peer) = conn_and_raw_peer();
    let hold = Duration::from_millis(300);
    let reader = std::thread::spawn(move || {
        std::thread::sleep(hold);
        let mut sink = vec![0u8; 1 << 16];
        let mut total = 0;
        while let Ok(n) = peer.read(&mut sink) {
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    });
    let started = Instant::now();
    conn.send(&pattern(1 << 20, 1), GENEROUS).unwrap();
    let cpu = thread_cpu();
    conn.flush(GENEROUS).unwrap();
    let (cpu, wall) = (thread_cpu() - cpu, started.elapsed());
    assert!(
        wall >= hold - Duration::from_millis(20),
        "flush returned after {wall:?}, before the peer read anything"
    );
    // Its pauses grow to milliseconds: waiting costs little CPU.
    assert!(cpu < wall / 4, "{cpu:?} of CPU in {wall:?} of flushing");
    conn.close().unwrap();
    assert_eq!(reader.join().unwrap(), (1 << 20) + 20);
}

#[test]
fn dropping_a_connection_tears_it_down() {
    let (conn, peer) = conn_and_raw_peer();
    wait_blocked_in_recv(&conn);
    let (fd, receiver) = (conn.raw_fd(), conn.receiver_tid());
    let task = format!("/proc/self/task/{receiver}");
    assert!(std::path::Path::new(&task).exists());
    drop(conn);
    assert!(fd_is_closed(fd), "fd {fd} still open after drop");
    drop(peer);
    // The receiver was joined by the drop; its task leaves /proc a moment after it exits.
    // (Counting the process's threads instead would count the runner's other tests.)
    let deadline = Instant::now() + GENEROUS;
    while std::path::Path::new(&task).exists() {
        assert!(
            Instant::now() < deadline,
            "receiver {receiver} outlived the drop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_recycled_buffer_carries_a_later_frame() {
    let (a, b) = conn_pair();
    a.send(&pattern(300_000, 1), GENEROUS).unwrap();
    let first = b.recv(GENEROUS).unwrap().payload;
    let (at, capacity) = (first.as_ptr(), first.capacity());
    b.recycle(first);
    // The receiver picks recycled buffers up between frames. Whether it passes that point
    // before or after the small frame arrives is the scheduler's choice, so the buffer lands
    // in one of the next two frames, and their bytes must be theirs either way.
    a.send(b"tick", GENEROUS).unwrap();
    let tick = b.recv(GENEROUS).unwrap().payload;
    assert_eq!(tick, b"tick");
    let later = pattern(250_000, 2);
    a.send(&later, GENEROUS).unwrap();
    let f = b.recv(GENEROUS).unwrap();
    assert_eq!(f.payload, later);
    // The capacity tells the kept buffer from a fresh one at the same address (the allocator
    // may hand freed memory straight back): a fresh payload buffer is sized to its frame.
    let reused = |p: &Vec<u8>| p.as_ptr() == at && p.capacity() >= capacity;
    assert!(
        reused(&tick) || reused(&f.payload),
        "the recycled buffer ({at:?}, {capacity} bytes) was not reused: got {:?} ({}) and {:?} ({})",
        tick.as_ptr(),
        tick.capacity(),
        f.payload.as_ptr(),
        f.payload.capacity()
    );
}

#[test]
fn a_receiver_handing_frames_over_is_not_blocked_in_recv() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (ours, _) = listener.accept().unwrap();
    let opts = ConnectionOptions {
        queue_depth: 1,
        ..ConnectionOptions::default()
    };
    let conn = Connection::from_stream(ours, opts).unwrap();
    let sender = Connection::from_stream(peer, ConnectionOptions::default()).unwrap();
    wait_blocked_in_recv(&conn);
    // Three frames into a queue of one: the receiver holds the second, waiting to hand it on.
    for i in 0..3u8 {
        sender.send(&[i], GENEROUS).unwrap();
    }
    let deadline = Instant::now() + GENEROUS;
    while conn.receiver_blocked_in_recv() {
        assert!(Instant::now() < deadline, "the receiver never left recv");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !conn.receiver_blocked_in_recv(),
        "reported blocked in recv while waiting to hand a frame over"
    );
    for i in 0..3u8 {
        assert_eq!(conn.recv(GENEROUS).unwrap().payload, [i]);
    }
    wait_blocked_in_recv(&conn);
}

#[test]
fn debug_names_both_ends() {
    let (conn, peer) = conn_and_raw_peer();
    let text = format!("{conn:?}");
    assert!(text.starts_with("Connection"), "{text}");
    assert!(
        text.contains(&peer.local_addr().unwrap().to_string()),
        "{text}"
    );
    assert!(text.contains(&format!("fd: {}", conn.raw_fd())), "{text}");
}
