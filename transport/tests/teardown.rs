//! Teardown: ordered, bounded, idempotent, and the descriptor is really gone afterwards
//! (seed 000, MSCCL++).

mod common;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::*;
use rstest::rstest;
use wringer_transport::{
    connect, ConnectOptions, Error, Hello, Listener, ListenerOptions, Terminal,
};

/// One test of this file at a time: the cycles test compares the process's descriptor and
/// thread counts, which a sibling's connections would change under it.
fn alone() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn blocked_receiver_is_woken_by_teardown_within_bound() {
    let _alone = alone();
    let (conn, _peer) = conn_and_raw_peer();
    wait_blocked_in_recv(&conn);
    let started = Instant::now();
    conn.close().unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "teardown took {took:?}");
    assert_eq!(conn.terminal(), Some(&Terminal::LocalShutdown));
    assert!(matches!(
        conn.recv(Duration::from_millis(10)),
        Err(Error::Closed)
    ));
}

#[test]
fn descriptor_is_closed_after_teardown() {
    let _alone = alone();
    let (conn, _peer) = conn_and_raw_peer();
    let fd = conn.raw_fd();
    wait_blocked_in_recv(&conn);
    assert!(!fd_is_closed(fd), "fd {fd} should be open before teardown");
    conn.close().unwrap();
    assert!(fd_is_closed(fd), "fd {fd} is still open after teardown");
}

#[rstest]
#[case::twice_in_a_row(false)]
#[case::from_two_threads(true)]
fn teardown_is_idempotent(#[case] concurrent: bool) {
    let _alone = alone();
    let (conn, _peer) = conn_and_raw_peer();
    let conn = Arc::new(conn);
    wait_blocked_in_recv(&conn);
    if concurrent {
        let other = Arc::clone(&conn);
        let t = std::thread::spawn(move || other.close());
        conn.close().unwrap();
        t.join().unwrap().unwrap();
    } else {
        conn.close().unwrap();
        conn.close().unwrap();
    }
    assert!(fd_is_closed(conn.raw_fd()));
    assert_eq!(conn.terminal(), Some(&Terminal::LocalShutdown));
    assert!(matches!(
        conn.send(b"x", Duration::from_millis(10)),
        Err(Error::Closed)
    ));
}

/// The MSCCL++ validation: 2,500 connect -> blocked receive -> teardown cycles, with descriptor
/// and thread counts unchanged and not one EBADF.
#[test]
fn teardown_cycles_leak_nothing_and_never_see_ebadf() {
    let _alone = alone();
    const CYCLES: u64 = 2_500;
    let fds_before = open_fds();
    let threads_before = transport_threads();
    let token = 0x5eed_u128;
    let listener = Listener::bind(local(0), ListenerOptions::new(token)).unwrap();
    let opts = ConnectOptions::default();
    let mut ebadf = 0;
    let mut slowest = Duration::ZERO;
    for seq in 0..CYCLES {
        let addr = listener.local_addr();
        let initiator = std::thread::spawn(move || {
            connect(
                addr,
                &Hello {
                    rank: 1,
                    sequence: seq,
                    generation: 0,
                    token,
                },
                &opts,
            )
        });
        let accepted = listener.wait_for(seq, GENEROUS).unwrap();
        let initiated = initiator.join().unwrap().unwrap();
        for conn in [&accepted, &initiated] {
            wait_blocked_in_recv(conn);
        }
        let started = Instant::now();
        initiated.close().unwrap();
        accepted.close().unwrap();
        slowest = slowest.max(started.elapsed());
        for conn in [&accepted, &initiated] {
            assert!(
                fd_is_closed(conn.raw_fd()),
                "cycle {seq}: fd {} still open",
                conn.raw_fd()
            );
            match conn.terminal() {
                Some(Terminal::LocalShutdown | Terminal::PeerClosed) => {}
                Some(Terminal::Failed(e)) if e.is_ebadf() => ebadf += 1,
                other => panic!("cycle {seq}: unexpected receiver end {other:?}"),
            }
        }
    }
    listener.shutdown();
    drop(listener);
    assert_eq!(ebadf, 0, "receivers saw EBADF");
    assert!(
        slowest < Duration::from_secs(2),
        "slowest teardown took {slowest:?}"
    );
    // Threads that just finished (handshakes, receivers) need a moment to leave /proc; wait
    // for the counts, bounded, then compare.
    let deadline = Instant::now() + Duration::from_secs(5);
    while (open_fds(), transport_threads()) != (fds_before, threads_before)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(open_fds(), fds_before, "descriptor count changed");
    assert_eq!(
        transport_threads(),
        threads_before,
        "transport thread count changed"
    );
}
