//! Shared by the benches.

use std::net::{TcpListener, TcpStream};

use wringer_transport::{Connection, ConnectionOptions};

/// Two connections talking to each other over loopback (no handshake).
pub fn pair() -> (Connection, Connection) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    let opts = ConnectionOptions::default();
    (
        Connection::from_stream(a, opts).unwrap(),
        Connection::from_stream(b, opts).unwrap(),
    )
}
