//! The initiator side of a connection: retry with backoff up to a deadline, then the hello
//! under its own deadline.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::conn::{Connection, ConnectionOptions};
use crate::error::{Error, Result};
use crate::handshake::{self, Hello};
use crate::sockopt::SocketOptions;

#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions {
    /// Give up connecting (all retries included) after this long.
    pub deadline: Duration,
    /// Backstop for the hello exchange after the TCP connect succeeded.
    pub hello_timeout: Duration,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub socket: SocketOptions,
    pub connection: ConnectionOptions,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            deadline: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(5),
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(250),
            socket: SocketOptions::default(),
            connection: ConnectionOptions::default(),
        }
    }
}

/// Connect to a [`Listener`](crate::Listener) and introduce ourselves with `hello`.
pub fn connect(addr: SocketAddr, hello: &Hello, opts: &ConnectOptions) -> Result<Connection> {
    if opts.deadline.is_zero() || opts.hello_timeout.is_zero() {
        return Err(Error::InvalidArgument(
            "connect deadline and hello timeout must be above zero".into(),
        ));
    }
    let socket = connect_with_retries(addr, opts)?;
    opts.socket.apply(&socket)?;
    handshake::initiate(&socket, addr, hello, opts.hello_timeout)?;
    Connection::from_socket(socket, opts.connection)
}

fn connect_with_retries(addr: SocketAddr, opts: &ConnectOptions) -> Result<Socket> {
    let start = Instant::now();
    let deadline = start + opts.deadline;
    let mut backoff = opts.initial_backoff;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let error = match try_connect(addr, remaining.max(Duration::from_millis(1))) {
            Ok(socket) => return Ok(socket),
            Err(e) if retryable(&e) => e,
            Err(e) => return Err(Error::Io(e)),
        };
        let now = Instant::now();
        if now + backoff >= deadline {
            return Err(Error::ConnectTimeout {
                addr,
                attempts,
                after: now - start,
                last: error,
            });
        }
        // A backoff, not a synchronisation: there is no event for "the peer is listening now".
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(opts.max_backoff);
    }
}

fn try_connect(addr: SocketAddr, timeout: Duration) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.connect_timeout(&addr.into(), timeout)?;
    Ok(socket)
}

fn retryable(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | TimedOut
            | WouldBlock
            | Interrupted
    ) || e.raw_os_error() == Some(libc::EHOSTUNREACH)
        || e.raw_os_error() == Some(libc::ENETUNREACH)
        || e.raw_os_error() == Some(libc::EAGAIN)
}

#[cfg(test)]
mod tests {
    use super::retryable;
    use std::io::{Error, ErrorKind};

    #[test]
    fn only_errors_a_later_attempt_can_cure_are_retried() {
        for kind in [
            ErrorKind::ConnectionRefused,
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::TimedOut,
            ErrorKind::WouldBlock,
            ErrorKind::Interrupted,
        ] {
            assert!(retryable(&Error::from(kind)), "{kind:?}");
        }
        for errno in [libc::EHOSTUNREACH, libc::ENETUNREACH, libc::EAGAIN] {
            assert!(retryable(&Error::from_raw_os_error(errno)), "errno {errno}");
        }
        for errno in [
            libc::EACCES,
            libc::EADDRNOTAVAIL,
            libc::EINVAL,
            libc::EAFNOSUPPORT,
        ] {
            assert!(
                !retryable(&Error::from_raw_os_error(errno)),
                "errno {errno}"
            );
        }
        assert!(!retryable(&Error::from(ErrorKind::PermissionDenied)));
    }
}
