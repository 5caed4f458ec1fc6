//! What can go wrong on an RC connection: rdma_cm, verbs, deadlines, the peer.

use super::*;

#[derive(Debug, Error)]
pub enum RdmaError {
    /// An rdma_cm call or the out-of-band exchange failed; `errno` when the OS gave one.
    #[error("rdma_cm: {context}{}", errno.map(|e| format!(" (errno {e})")).unwrap_or_default())]
    Cm { context: String, errno: Option<i32> },
    #[error("verbs: {0}")]
    Verbs(String),
    #[error("timed out after {after:?} while {during}")]
    Timeout {
        during: &'static str,
        after: Duration,
    },
    #[error("expected the rdma_cm event {expected}, got {got} (status {status})")]
    UnexpectedEvent {
        expected: &'static str,
        got: String,
        status: i32,
    },
    #[error("the peer disconnected")]
    Disconnected,
    #[error("work completion failed: {status} (wr {wr_id})")]
    Completion { status: WcStatus, wr_id: u64 },
    #[error("message of {len} bytes exceeds the {max}-byte slots")]
    TooLong { len: usize, max: usize },
    #[error("the peer has not advertised a write target")]
    NoWriteTarget,
    #[error("immediate data {0:#x} uses bit 31, which marks writes into registered regions")]
    ImmReserved(u32),
    #[error(
        "send completion {got} arrived before {expected}: an RC send queue completes in order"
    )]
    OutOfOrder { expected: u64, got: u64 },
    #[error("{len} bytes at offset {offset} exceed the {capacity}-byte {which} region")]
    OutOfRegion {
        which: &'static str,
        offset: u64,
        len: usize,
        capacity: usize,
    },
}

/// An rdma_cm failure with the errno found in its cause chain.
pub(crate) fn cm<E: std::error::Error + 'static>(e: E) -> RdmaError {
    RdmaError::Cm {
        context: e.to_string(),
        errno: errno_of(&e),
    }
}

/// An rdma_cm failure described in words (no OS error behind it).
pub(crate) fn cm_msg(context: impl Into<String>) -> RdmaError {
    RdmaError::Cm {
        context: context.into(),
        errno: None,
    }
}

/// An out-of-band exchange failure on a socket, with its errno.
pub(crate) fn cm_io(context: String, e: &std::io::Error) -> RdmaError {
    RdmaError::Cm {
        context: format!("{context}: {e}"),
        errno: e.raw_os_error(),
    }
}

pub(super) fn errno_of(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if let Some(io) = x.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        cur = x.source();
    }
    None
}

impl RdmaError {
    /// The OS error number behind an rdma_cm failure, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            RdmaError::Cm { errno, .. } => *errno,
            _ => None,
        }
    }

    pub fn is_timeout(&self) -> bool {
        matches!(self, RdmaError::Timeout { .. })
    }
}

pub(super) fn verbs(e: impl std::fmt::Display) -> RdmaError {
    RdmaError::Verbs(e.to_string())
}
