//! `transport`: a small TCP transport that gets the connection lifecycle right by construction.
//!
//! - [`frame`]: sans-IO framing with exactly four read outcomes.
//! - [`Connection`]: one receiver thread per connection; ordered, bounded, idempotent teardown;
//!   receiver failures reported on the next `send`/`flush`.
//! - [`connect()`]: initiator with retry/backoff and a hello backstop deadline.
//! - [`Listener`]: lazy connects matched by (sequence, generation), every wait with a deadline.
//! - `rdma` (feature): RC connections over rdma_cm; `gpu` (feature): device buffers over both.

pub mod error;
pub mod frame;
#[cfg(feature = "gpu")]
pub mod gpu;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod stream;

mod conn;
mod connect;
mod handshake;
#[cfg(feature = "bug-injection")]
mod injected;
mod listener;
mod sockopt;
#[cfg(feature = "rdma")]
mod sync_marks;

pub use conn::{Connection, ConnectionOptions, ReadStats, Reader};
pub use connect::{connect, ConnectOptions};
pub use error::{Error, ReceiverError, RejectReason, Result, Terminal};
pub use handshake::Hello;
pub use listener::{Listener, ListenerOptions, ListenerStats};
pub use sockopt::{Keepalive, SocketOptions};
