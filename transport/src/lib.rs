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
pub mod procfs;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod stream;

mod conn;
#[cfg(not(wringer_model))]
mod connect;
mod deadline;
#[cfg(not(wringer_model))]
mod handshake;
#[cfg(feature = "bug-injection")]
mod injected;
#[cfg(not(wringer_model))]
mod listener;
#[cfg(wringer_model)]
mod model_socket;
#[cfg(not(wringer_model))]
mod sockopt;
mod sync;
#[cfg(feature = "rdma")]
mod sync_marks;
mod waits;

pub use conn::{Connection, ConnectionOptions, ReadStats, Reader};
#[cfg(not(wringer_model))]
pub use connect::{connect, ConnectOptions};
pub use error::{Error, ReceiverError, RejectReason, Result, Terminal};
#[cfg(not(wringer_model))]
pub use handshake::Hello;
#[cfg(not(wringer_model))]
pub use listener::{Listener, ListenerOptions, ListenerStats};
#[cfg(not(wringer_model))]
pub use sockopt::{Keepalive, SocketOptions};

/// What the model tests (`--cfg wringer_model`, `just model-check`) drive the connection with:
/// a model stream, the model's clock, and the test-only bug switches.
#[cfg(wringer_model)]
pub mod model {
    #[cfg(feature = "bug-injection")]
    pub use crate::injected::set_model_bug;
    pub use crate::model_socket::{pair, Socket};
    pub use crate::sync::{pass_time, reset_clock};
    pub use crate::waits::{wait_for, Outcome, Placement, Table, Waits};
}
