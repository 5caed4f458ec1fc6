//! Typed errors of the transport's public API.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use thiserror::Error;

use crate::frame::{FrameError, Kind, Section};

/// Why a connection's receiver stopped with a failure. Published once per connection and
/// returned, as a clone, by every later operation on it.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ReceiverError {
    #[error("stream truncated inside a {section:?}: got {got} of {expected} bytes")]
    Truncated {
        section: Section,
        expected: usize,
        got: usize,
    },
    #[error("corrupt frame: {0}")]
    Frame(#[from] FrameError),
    #[error("unexpected {0:?} frame after the handshake")]
    UnexpectedKind(Kind),
    #[error("frame sequence {got} where {expected} was expected (lost or duplicated frame)")]
    OutOfSequence { expected: u64, got: u64 },
    #[error("receive failed: {kind:?}: {message}")]
    Io {
        kind: io::ErrorKind,
        errno: Option<i32>,
        message: String,
    },
}

impl ReceiverError {
    pub(crate) fn io(e: &io::Error) -> ReceiverError {
        ReceiverError::Io {
            kind: e.kind(),
            errno: e.raw_os_error(),
            message: e.to_string(),
        }
    }

    /// True when the receiver saw EBADF: its descriptor was closed under it (the race this
    /// crate exists to rule out).
    pub fn is_ebadf(&self) -> bool {
        matches!(
            self,
            ReceiverError::Io {
                errno: Some(libc::EBADF),
                ..
            }
        )
    }
}

/// How a connection's receiver ended. Set exactly once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Terminal {
    /// The peer closed at a frame boundary.
    PeerClosed,
    /// We tore the connection down ourselves.
    LocalShutdown,
    Failed(ReceiverError),
}

/// Why a listener refused a connecting peer (sent to the peer in a HelloReject frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RejectReason {
    BadToken = 1,
    /// The (sequence, generation) it asked for already timed out or was served.
    StaleGeneration = 2,
    /// Too many early connections are parked already.
    Overloaded = 3,
    ListenerClosed = 4,
    Duplicate = 5,
    Malformed = 6,
}

impl RejectReason {
    #[cfg_attr(wringer_model, allow(dead_code))] // (the handshake, not in model builds)
    pub(crate) fn from_u8(b: u8) -> RejectReason {
        match b {
            1 => RejectReason::BadToken,
            2 => RejectReason::StaleGeneration,
            3 => RejectReason::Overloaded,
            4 => RejectReason::ListenerClosed,
            5 => RejectReason::Duplicate,
            _ => RejectReason::Malformed,
        }
    }
}

#[derive(Debug, Error)]
pub enum Error {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("timed out after {after:?} while {during}")]
    Timeout {
        during: &'static str,
        after: Duration,
    },
    #[error("connection is closed locally")]
    Closed,
    #[error("the peer closed the connection")]
    PeerClosed,
    #[error("the receiver failed: {0}")]
    Receiver(ReceiverError),
    #[error("a send timed out part-way through a frame; the stream is unusable and was shut down")]
    SendBroken,
    #[error("connect to {addr} gave up after {attempts} attempts in {after:?}: {last}")]
    ConnectTimeout {
        addr: SocketAddr,
        attempts: u32,
        after: Duration,
        last: io::Error,
    },
    #[error("handshake with {addr} failed: {reason}")]
    Handshake { addr: SocketAddr, reason: String },
    #[error("the listener rejected the connection: {0:?}")]
    Rejected(RejectReason),
    #[error("the listener was shut down")]
    ListenerClosed,
    #[error("a wait for sequence {sequence} is already pending on this listener")]
    DuplicateWait { sequence: u64 },
    #[error("the listener already has {max} pending waits (its limit)")]
    PendingLimit { max: usize },
    #[error(transparent)]
    Io(#[from] io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
