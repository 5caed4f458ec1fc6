//! Framing over a real socket: exact reads, the four read outcomes, garbage, and receiver
//! failures reported to send and flush (seed 000).

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::*;
use rstest::rstest;
use wringer_transport::frame::{Frame, FrameError, Kind, Section, MAGIC};
use wringer_transport::{Error, ReceiverError, Terminal};

fn data(seq: u64, payload: Vec<u8>) -> Frame {
    Frame::new(Kind::Data, seq, payload).unwrap()
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// Wait (bounded) until the receiver has published how it ended.
fn wait_terminal(conn: &wringer_transport::Connection) -> Terminal {
    let deadline = Instant::now() + GENEROUS;
    loop {
        if let Some(t) = conn.terminal() {
            return t.clone();
        }
        assert!(Instant::now() < deadline, "receiver never ended");
        std::thread::yield_now();
    }
}

#[test]
fn frame_written_one_byte_at_a_time_arrives_intact() {
    let (conn, mut peer) = conn_and_raw_peer();
    peer.set_nodelay(true).unwrap();
    let frames = [
        data(0, pattern(300, 1)),
        data(1, vec![]),
        data(2, pattern(5, 9)),
    ];
    for f in &frames {
        for byte in f.encode() {
            peer.write_all(&[byte]).unwrap();
        }
    }
    for f in &frames {
        assert_eq!(&conn.recv(GENEROUS).unwrap(), f);
    }
}

#[test]
fn frame_split_at_every_offset_arrives_intact() {
    let (conn, mut peer) = conn_and_raw_peer();
    peer.set_nodelay(true).unwrap();
    let len = 64;
    let total = wringer_transport::frame::HEADER_LEN + len;
    for split in 1..total {
        let f = data(split as u64 - 1, pattern(len, split as u8));
        let bytes = f.encode();
        peer.write_all(&bytes[..split]).unwrap();
        peer.write_all(&bytes[split..]).unwrap();
        assert_eq!(conn.recv(GENEROUS).unwrap(), f, "split at {split}");
    }
}

#[test]
fn clean_eof_at_a_frame_boundary() {
    let (conn, mut peer) = conn_and_raw_peer();
    let f = data(0, pattern(100, 3));
    peer.write_all(&f.encode()).unwrap();
    close_raw(&peer);
    assert_eq!(conn.recv(GENEROUS).unwrap(), f);
    assert!(matches!(conn.recv(GENEROUS), Err(Error::PeerClosed)));
    assert_eq!(conn.terminal(), Some(&Terminal::PeerClosed));
    // A clean close by the peer is not a receiver failure: our side may still send.
    assert!(conn.send(b"bye", GENEROUS).is_ok());
}

#[rstest]
#[case::inside_the_header(7, Section::Header, 20, 7)]
#[case::after_the_header(20, Section::Payload, 100, 0)]
#[case::inside_the_payload(20 + 33, Section::Payload, 100, 33)]
fn eof_inside_a_frame_is_truncation(
    #[case] cut: usize,
    #[case] section: Section,
    #[case] expected: usize,
    #[case] got: usize,
) {
    let (conn, mut peer) = conn_and_raw_peer();
    let whole = data(0, pattern(10, 0));
    let cut_frame = data(1, pattern(100, 1));
    peer.write_all(&whole.encode()).unwrap();
    peer.write_all(&cut_frame.encode()[..cut]).unwrap();
    close_raw(&peer);
    // The whole frame before the cut is still delivered; the partial one never is.
    assert_eq!(conn.recv(GENEROUS).unwrap(), whole);
    let want = ReceiverError::Truncated {
        section,
        expected,
        got,
    };
    match conn.recv(GENEROUS) {
        Err(Error::Receiver(e)) => assert_eq!(e, want),
        other => panic!("expected truncation, got {other:?}"),
    }
}

#[test]
fn local_shutdown_mid_frame_is_local_shutdown_not_an_error() {
    let (conn, mut peer) = conn_and_raw_peer();
    peer.write_all(&data(0, pattern(100, 1)).encode()[..30])
        .unwrap();
    // Stop only once the receiver has consumed the partial frame and blocks for the rest.
    let deadline = Instant::now() + GENEROUS;
    while unread_bytes(conn.raw_fd()) > 0 {
        assert!(
            Instant::now() < deadline,
            "receiver never read the partial frame"
        );
        std::thread::yield_now();
    }
    wait_blocked_in_recv(&conn);
    conn.close().unwrap();
    assert_eq!(conn.terminal(), Some(&Terminal::LocalShutdown));
    assert!(matches!(
        conn.recv(Duration::from_millis(10)),
        Err(Error::Closed)
    ));
}

#[rstest]
#[case::bad_magic({ let mut h = data(0, vec![1]).encode(); h[0..4].copy_from_slice(b"HTTP"); h },
    FrameError::BadMagic { found: *b"HTTP" })]
#[case::huge_length({ let mut h = data(0, vec![]).encode(); h[16..20].copy_from_slice(&u32::MAX.to_be_bytes()); h },
    FrameError::TooLong { len: u32::MAX, max: wringer_transport::frame::DEFAULT_MAX_PAYLOAD })]
#[case::bad_version({ let mut h = data(0, vec![]).encode(); h[4] = 99; h },
    FrameError::UnsupportedVersion { found: 99 })]
fn garbage_header_is_a_typed_receiver_error(#[case] bytes: Vec<u8>, #[case] want: FrameError) {
    assert_eq!(
        bytes[0..4] == MAGIC,
        !matches!(want, FrameError::BadMagic { .. })
    );
    let (conn, mut peer) = conn_and_raw_peer();
    peer.write_all(&bytes).unwrap();
    match conn.recv(GENEROUS) {
        Err(Error::Receiver(ReceiverError::Frame(e))) => assert_eq!(e, want),
        other => panic!("expected {want:?}, got {other:?}"),
    }
}

#[test]
fn out_of_sequence_frame_is_detected() {
    let (conn, mut peer) = conn_and_raw_peer();
    peer.write_all(&data(0, vec![1]).encode()).unwrap();
    peer.write_all(&data(2, vec![2]).encode()).unwrap();
    assert!(conn.recv(GENEROUS).is_ok());
    assert!(matches!(
        conn.recv(GENEROUS),
        Err(Error::Receiver(ReceiverError::OutOfSequence {
            expected: 1,
            got: 2
        }))
    ));
}

#[rstest]
#[case::after_recv_saw_it(true)]
#[case::without_any_recv(false)]
fn receiver_failure_surfaces_on_send_and_flush(#[case] recv_first: bool) {
    let (conn, mut peer) = conn_and_raw_peer();
    peer.write_all(b"GARBAGE GARBAGE GARBAGE").unwrap();
    if recv_first {
        assert!(matches!(conn.recv(GENEROUS), Err(Error::Receiver(_))));
    } else {
        assert!(matches!(wait_terminal(&conn), Terminal::Failed(_)));
    }
    let want = ReceiverError::Frame(FrameError::BadMagic { found: *b"GARB" });
    for attempt in 0..2 {
        match conn.send(b"payload", GENEROUS) {
            Err(Error::Receiver(e)) => assert_eq!(e, want, "send #{attempt}"),
            other => panic!("send #{attempt}: expected the receiver error, got {other:?}"),
        }
        match conn.flush(GENEROUS) {
            Err(Error::Receiver(e)) => assert_eq!(e, want, "flush #{attempt}"),
            other => panic!("flush #{attempt}: expected the receiver error, got {other:?}"),
        }
    }
}

#[test]
fn send_and_flush_round_trip_between_connections() {
    let (a, b) = conn_pair();
    let big = pattern(3 << 20, 5);
    a.send(&big, GENEROUS).unwrap();
    a.send(b"small", GENEROUS).unwrap();
    a.flush(GENEROUS).unwrap();
    assert_eq!(b.recv(GENEROUS).unwrap().payload, big);
    assert_eq!(b.recv(GENEROUS).unwrap().payload, b"small");
    b.send(b"back", GENEROUS).unwrap();
    assert_eq!(a.recv(GENEROUS).unwrap().header.sequence, 0);
}

#[test]
fn send_to_a_peer_that_never_reads_times_out() {
    let (conn, _peer) = conn_and_raw_peer();
    let chunk = vec![0u8; 1 << 20];
    let started = Instant::now();
    let mut outcome = Ok(());
    // Socket buffers absorb a few MiB; the peer never reads, so a send must hit its deadline.
    for _ in 0..256 {
        outcome = conn.send(&chunk, Duration::from_millis(200));
        if outcome.is_err() {
            break;
        }
    }
    assert!(
        matches!(outcome, Err(Error::Timeout { .. } | Error::SendBroken)),
        "expected a send timeout, got {outcome:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    // A frame cut by the deadline poisons the stream: later sends say so instead of corrupting it.
    if matches!(outcome, Err(Error::SendBroken)) {
        assert!(matches!(conn.send(b"x", GENEROUS), Err(Error::SendBroken)));
    }
}

#[test]
fn busy_poll_receives_and_still_honours_the_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (ours, _) = listener.accept().unwrap();
    let opts = wringer_transport::ConnectionOptions {
        busy_poll: Some(Duration::from_millis(5)),
        ..Default::default()
    };
    let conn = wringer_transport::Connection::from_stream(ours, opts).unwrap();
    let started = Instant::now();
    assert!(matches!(
        conn.recv(Duration::from_millis(50)),
        Err(Error::Timeout { .. })
    ));
    assert!(started.elapsed() >= Duration::from_millis(50) && started.elapsed() < GENEROUS);
    let f = data(0, pattern(64, 2));
    peer.write_all(&f.encode()).unwrap();
    assert_eq!(conn.recv(GENEROUS).unwrap(), f);
}

#[test]
fn recycled_buffers_carry_later_frames_intact() {
    let (a, b) = conn_pair();
    for (i, len) in [200_000usize, 10, 150_000, 300_000].into_iter().enumerate() {
        let payload = pattern(len, i as u8);
        a.send(&payload, GENEROUS).unwrap();
        let f = b.recv(GENEROUS).unwrap();
        assert_eq!(f.payload, payload, "frame {i}");
        b.recycle(f.payload);
    }
}
