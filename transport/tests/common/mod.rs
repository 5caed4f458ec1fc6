//! Helpers shared by the transport's integration tests.
#![allow(dead_code)]

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use transport::{Connection, ConnectionOptions};

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

/// Wait (bounded) until thread `tid` of this process sleeps inside recvfrom/read: then it is
/// really blocked in a receive, not merely about to start one.
pub fn wait_blocked_in_recv(conn: &Connection) {
    let deadline = Instant::now() + GENEROUS;
    loop {
        let tid = conn.receiver_tid();
        if tid != 0 && blocked_in_recv(tid) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "receiver thread {tid} never blocked in recv"
        );
        std::thread::yield_now();
    }
}

fn blocked_in_recv(tid: i32) -> bool {
    let Ok(syscall) = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) else {
        return false;
    };
    let nr: i64 = syscall
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1);
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    // State is the field after the parenthesised command name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("");
    state == "S" && (nr == libc::SYS_recvfrom || nr == libc::SYS_read)
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
