//! Helpers shared by the transport's integration tests.
#![allow(dead_code)]

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use wringer_transport::{Connection, ConnectionOptions};

pub const GENEROUS: Duration = Duration::from_secs(10);

/// A `Connection` under test and the raw stream of its peer, on loopback.
pub fn conn_and_raw_peer() -> (Connection, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (ours, _) = listener.accept().unwrap();
    let conn = Connection::from_stream(ours, ConnectionOptions::default()).unwrap();
    (conn, peer)
}

/// Two connections talking to each other on loopback.
pub fn conn_pair() -> (Connection, Connection) {
    let (a, peer) = conn_and_raw_peer();
    let b = Connection::from_stream(peer, ConnectionOptions::default()).unwrap();
    (a, b)
}

pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// The transport's own threads (receivers, accept and hello threads, all named `wringer-…`):
/// unlike [`threads`], not changed by the test runner starting a thread for the next test.
pub fn transport_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("wringer-"))
        .count()
}

/// Wait (bounded) until the connection's receiver is really blocked in a receive.
pub fn wait_blocked_in_recv(conn: &Connection) {
    let deadline = Instant::now() + GENEROUS;
    while !conn.receiver_blocked_in_recv() {
        assert!(
            Instant::now() < deadline,
            "the receiver thread never blocked in recv"
        );
        std::thread::yield_now();
    }
}

pub fn fd_is_closed(fd: i32) -> bool {
    // SAFETY: F_GETFD only queries the descriptor table; an invalid fd yields EBADF.
    let rc = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
}

pub fn close_raw(peer: &TcpStream) {
    peer.shutdown(Shutdown::Write).unwrap();
}

pub fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Bytes waiting in a socket's receive queue.
pub fn unread_bytes(fd: i32) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through a pointer to `n`; `fd` is a live socket.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    assert_eq!(rc, 0, "FIONREAD failed");
    n
}
