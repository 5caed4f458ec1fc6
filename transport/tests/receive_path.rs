//! Who reads the stream: a caller waiting in `recv` reads its own frames (no hand-off from the
//! receiver thread, which stays off the socket), the receiver reads while nobody receives, and
//! between them every frame is delivered once, in order, with nothing lost at a deadline.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{conn_and_raw_peer, conn_pair, unread_bytes, wait_blocked_in_recv, GENEROUS};
use wringer_transport::frame::{Frame, Kind};
use wringer_transport::Error;

/// Voluntary context switches of one of this process's threads so far. The thread must be
/// alive: a receiver that is gone has ended its connection, which is a failure of its own.
fn switches(tid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .unwrap_or_else(|e| panic!("thread {tid} is gone ({e}): the receiver exited"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no voluntary_ctxt_switches in thread {tid}'s status"))
}

/// The receiver's kernel thread id, once it has started (it is 0 until the thread has run).
fn started_receiver(conn: &wringer_transport::Connection) -> i32 {
    let until = Instant::now() + GENEROUS;
    while conn.receiver_tid() == 0 {
        assert!(Instant::now() < until, "the receiver thread never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    conn.receiver_tid()
}

#[test]
fn while_the_application_receives_the_receiver_thread_does_not_wake_per_message() {
    let (a, b) = conn_pair();
    let echo = std::thread::spawn(move || {
        while let Ok(f) = b.recv(GENEROUS) {
            if b.send(&f.payload, GENEROUS).is_err() {
                break;
            }
        }
    });
    // Warm up until our receiver has seen the caller receiving and stepped aside.
    for _ in 0..50 {
        a.send(b"x", GENEROUS).unwrap();
        a.recv(GENEROUS).unwrap();
    }
    let tid = started_receiver(&a);
    let before = switches(tid);
    let started = Instant::now();
    let messages = 3000u64;
    for _ in 0..messages {
        a.send(b"ping", GENEROUS).unwrap();
        assert_eq!(a.recv(GENEROUS).unwrap().payload, b"ping");
    }
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let woke = switches(tid) - before;
    // The receiver looks once per millisecond whether the application still receives. A
    // hand-off would wake it at least once per message.
    let bound = 2 * elapsed_ms + 20;
    assert!(
        bound < messages,
        "too slow to tell ({elapsed_ms} ms for {messages} round trips)"
    );
    assert!(
        woke <= bound,
        "the receiver woke {woke} times in {elapsed_ms} ms for {messages} messages"
    );
    a.close().unwrap();
    echo.join().unwrap();
}

#[test]
fn frames_the_receiver_queued_come_before_frames_the_caller_reads() {
    let (a, b) = conn_pair();
    wait_blocked_in_recv(&a);
    for i in 0..3u8 {
        b.send(&[i], GENEROUS).unwrap();
    }
    // Nobody receives yet: the receiver takes them off the socket into the queue.
    let deadline = Instant::now() + GENEROUS;
    while unread_bytes(a.raw_fd()) > 0 {
        assert!(
            Instant::now() < deadline,
            "the receiver never read the frames"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let later = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        for i in 3..6u8 {
            b.send(&[i], GENEROUS).unwrap();
        }
        b
    });
    for i in 0..6u8 {
        assert_eq!(a.recv(GENEROUS).unwrap().payload, [i], "frame {i}");
    }
    drop(later.join().unwrap());
}

#[test]
fn a_recv_that_times_out_mid_frame_keeps_the_part_it_read() {
    let (conn, mut peer) = conn_and_raw_peer();
    let payload: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let wire = Frame::new(Kind::Data, 0, payload.clone()).unwrap().encode();
    let (first, rest) = wire.split_at(wire.len() / 3);
    let waiting = std::thread::scope(|s| {
        let waiting = s.spawn(|| conn.recv(Duration::from_millis(200)));
        std::thread::sleep(Duration::from_millis(20));
        peer.write_all(first).unwrap();
        waiting.join().unwrap()
    });
    assert!(
        matches!(waiting, Err(Error::Timeout { during: "recv", .. })),
        "{waiting:?}"
    );
    peer.write_all(rest).unwrap();
    let frame = conn.recv(GENEROUS).unwrap();
    assert_eq!(frame.payload, payload);
}

#[test]
fn callers_receiving_at_once_get_every_frame_once_each_in_order() {
    let (a, b) = conn_pair();
    let total = 4000u32;
    let received = std::thread::scope(|s| {
        let readers: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(|| {
                    let mut got = vec![];
                    while let Ok(f) = a.recv(Duration::from_millis(500)) {
                        got.push(u32::from_le_bytes(f.payload[..4].try_into().unwrap()));
                    }
                    got
                })
            })
            .collect();
        for i in 0..total {
            b.send(&i.to_le_bytes(), GENEROUS).unwrap();
            if i % 500 == 0 {
                // Now and then nobody is receiving for a while, so the receiver reads too.
                std::thread::sleep(Duration::from_millis(3));
            }
        }
        readers
            .into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });
    for got in &received {
        assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order: {got:?}");
    }
    let mut all: Vec<u32> = received.concat();
    all.sort_unstable();
    assert_eq!(all, (0..total).collect::<Vec<_>>());
}

#[test]
fn a_peer_that_ends_while_a_caller_reads_is_reported_once_to_everyone() {
    let (conn, peer) = conn_and_raw_peer();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| conn.recv(GENEROUS));
        std::thread::sleep(Duration::from_millis(20));
        drop(peer);
        assert!(matches!(waiting.join().unwrap(), Err(Error::PeerClosed)));
    });
    // The receiver leaves once the caller published the end; teardown finds nothing running.
    assert!(matches!(conn.recv(GENEROUS), Err(Error::PeerClosed)));
    assert_eq!(
        conn.terminal(),
        Some(&wringer_transport::Terminal::PeerClosed)
    );
    let started = Instant::now();
    conn.close().unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn garbage_behind_a_frame_in_one_read_is_found_while_nobody_receives() {
    let (conn, mut peer) = conn_and_raw_peer();
    wait_blocked_in_recv(&conn);
    // A frame and a bad header arrive together: one read brings both into the buffer, and the
    // socket is empty after it. The receiver must decode on, not wait for more bytes.
    let mut bytes = Frame::new(Kind::Data, 0, b"ok".to_vec()).unwrap().encode();
    bytes.extend_from_slice(&[0xde; wringer_transport::frame::HEADER_LEN]);
    peer.write_all(&bytes).unwrap();
    let deadline = Instant::now() + GENEROUS;
    while conn.terminal().is_none() {
        assert!(
            Instant::now() < deadline,
            "the bad header was never reported"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(matches!(
        conn.terminal(),
        Some(wringer_transport::Terminal::Failed(_))
    ));
    assert!(matches!(conn.send(b"x", GENEROUS), Err(Error::Receiver(_))));
    assert_eq!(conn.recv(GENEROUS).unwrap().payload, b"ok");
    assert!(matches!(conn.recv(GENEROUS), Err(Error::Receiver(_))));
}
