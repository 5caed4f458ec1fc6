//! Socket options shared by both ends of a connection.

use std::io;
use std::time::Duration;

use socket2::{Socket, TcpKeepalive};

/// TCP keepalive probing: the peer is declared dead after `idle + interval * retries` of silence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    pub idle: Duration,
    pub interval: Duration,
    pub retries: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketOptions {
    pub nodelay: bool,
    /// Detects a silently dead peer while the connection is idle.
    pub keepalive: Option<Keepalive>,
    /// TCP_USER_TIMEOUT: fail the connection when sent data stays unacknowledged this long.
    pub user_timeout: Option<Duration>,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            nodelay: true,
            keepalive: None,
            user_timeout: None,
        }
    }
}

impl SocketOptions {
    pub fn apply(&self, socket: &Socket) -> io::Result<()> {
        socket.set_tcp_nodelay(self.nodelay)?;
        if let Some(k) = self.keepalive {
            let params = TcpKeepalive::new()
                .with_time(k.idle)
                .with_interval(k.interval)
                .with_retries(k.retries);
            socket.set_tcp_keepalive(&params)?;
        }
        if let Some(t) = self.user_timeout {
            socket.set_tcp_user_timeout(Some(t))?;
        }
        Ok(())
    }
}
