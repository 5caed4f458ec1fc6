//! The post-connect hello: the initiator names itself (rank, sequence, generation) and proves it
//! belongs to the run (token); the listener answers with an ack or a typed reject.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use socket2::Socket;

use crate::deadline::Deadline;
use crate::error::{Error, RejectReason, Result};
use crate::frame::{Frame, Header, Kind, ReadOutcome};
use crate::stream::{write_frame, FrameReader, ReadError, WriteError};

const HELLO_LEN: usize = 4 + 8 + 8 + 16;
/// Handshake frames are tiny; a peer claiming more is not one of ours.
const HANDSHAKE_MAX_PAYLOAD: u32 = 256;

/// How a handshake exchange failed: out of time (a typed timeout for the caller), or not.
#[derive(Debug)]
pub(crate) enum ControlError {
    TimedOut(&'static str),
    Failed(String),
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlError::TimedOut(during) => write!(f, "timed out {during}"),
            ControlError::Failed(why) => f.write_str(why),
        }
    }
}

type ControlResult<T> = std::result::Result<T, ControlError>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub rank: u32,
    /// Which lazy connect this is (Gloo's sequence number; may be reused across groups).
    pub sequence: u64,
    /// Which use of `sequence` this is; both sides count them.
    pub generation: u64,
    /// Per-run secret; a listener drops connections that do not present it.
    pub token: u128,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0..4].copy_from_slice(&self.rank.to_be_bytes());
        out[4..12].copy_from_slice(&self.sequence.to_be_bytes());
        out[12..20].copy_from_slice(&self.generation.to_be_bytes());
        out[20..36].copy_from_slice(&self.token.to_be_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Option<Hello> {
        if b.len() != HELLO_LEN {
            return None;
        }
        Some(Hello {
            rank: u32::from_be_bytes(b[0..4].try_into().ok()?),
            sequence: u64::from_be_bytes(b[4..12].try_into().ok()?),
            generation: u64::from_be_bytes(b[12..20].try_into().ok()?),
            token: u128::from_be_bytes(b[20..36].try_into().ok()?),
        })
    }
}

/// Initiator side: send the hello and wait for the answer, all within `timeout`. This is the
/// backstop: a listener that accepts and then stalls or dies cannot hang the initiator.
pub(crate) fn initiate(
    socket: &Socket,
    addr: SocketAddr,
    hello: &Hello,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let failed = |e: ControlError| match e {
        ControlError::TimedOut(_) => Error::Timeout {
            during: "handshake",
            after: timeout,
        },
        ControlError::Failed(reason) => Error::Handshake { addr, reason },
    };
    send_control(socket, Kind::Hello, &hello.encode(), deadline).map_err(failed)?;
    #[cfg(feature = "bug-injection")]
    let deadline = match crate::injected::bug() {
        Some(crate::injected::Bug::NoHelloBackstop) => Instant::now() + Duration::from_secs(3600),
        _ => deadline,
    };
    let frame = read_control(socket, deadline).map_err(failed)?;
    match frame.header.kind {
        Kind::HelloAck => Ok(()),
        Kind::HelloReject => Err(Error::Rejected(RejectReason::from_u8(
            frame.payload.first().copied().unwrap_or(0),
        ))),
        other => Err(Error::Handshake {
            addr,
            reason: format!("expected an ack, got a {other:?} frame"),
        }),
    }
}

/// Listener side: read the initiator's hello within `timeout`.
pub(crate) fn read_hello(socket: &Socket, timeout: Duration) -> ControlResult<Hello> {
    let frame = read_control(socket, Instant::now() + timeout)?;
    if frame.header.kind != Kind::Hello {
        return Err(ControlError::Failed(format!(
            "expected a hello, got a {:?} frame",
            frame.header.kind
        )));
    }
    Hello::decode(&frame.payload).ok_or_else(|| {
        ControlError::Failed(format!("hello payload of {} bytes", frame.payload.len()))
    })
}

pub(crate) fn accept(socket: &Socket, timeout: Duration) -> ControlResult<()> {
    send_control(socket, Kind::HelloAck, &[], Instant::now() + timeout)
}

pub(crate) fn reject(socket: &Socket, reason: RejectReason, timeout: Duration) {
    // Best effort: the peer learns why, or sees the close.
    let _ = send_control(
        socket,
        Kind::HelloReject,
        &[reason as u8],
        Instant::now() + timeout,
    );
}

fn send_control(
    socket: &Socket,
    kind: Kind,
    payload: &[u8],
    deadline: Instant,
) -> ControlResult<()> {
    let header = Header {
        kind,
        flags: 0,
        sequence: 0,
        len: payload.len() as u32,
    };
    write_frame(socket, &header, payload, &mut Deadline::At(deadline)).map_err(|e| match e {
        WriteError::Timeout { .. } => ControlError::TimedOut("sending"),
        WriteError::Io { error, .. } => ControlError::Failed(format!("send failed: {error}")),
    })
}

fn read_control(socket: &Socket, deadline: Instant) -> ControlResult<Frame> {
    let failed = |e: std::io::Error| ControlError::Failed(e.to_string());
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    socket.set_read_timeout(Some(remaining)).map_err(failed)?;
    let never_stopped = AtomicBool::new(false);
    // Exact reads: whatever follows the handshake belongs to the connection's receiver.
    let outcome =
        FrameReader::exact(HANDSHAKE_MAX_PAYLOAD).read_frame(&mut &*socket, &never_stopped);
    socket.set_read_timeout(None).map_err(failed)?;
    match outcome {
        Ok(ReadOutcome::Frame(f)) => Ok(f),
        Ok(ReadOutcome::CleanEof) => Err(ControlError::Failed(
            "peer closed the connection during the handshake".into(),
        )),
        Ok(ReadOutcome::Truncated { got, expected, .. }) => Err(ControlError::Failed(format!(
            "handshake frame truncated: {got} of {expected} bytes"
        ))),
        Ok(ReadOutcome::LocalShutdown) => Err(ControlError::Failed(
            "shut down during the handshake".into(),
        )),
        Err(ReadError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(ControlError::TimedOut("waiting for the handshake"))
        }
        Err(e) => Err(ControlError::Failed(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_error_says_what_happened() {
        assert_eq!(
            ControlError::TimedOut("reading the hello").to_string(),
            "timed out reading the hello"
        );
        assert_eq!(
            ControlError::Failed("bad kind".into()).to_string(),
            "bad kind"
        );
    }

    #[test]
    fn a_hello_survives_encoding() {
        let h = Hello {
            rank: 3,
            sequence: 1 << 40,
            generation: 9,
            token: u128::MAX - 5,
        };
        assert_eq!(Hello::decode(&h.encode()), Some(h));
        // The wire format, as another implementation would write it: rank, sequence,
        // generation and token, big-endian, 36 bytes and no more.
        let mut wire = vec![0, 0, 0, 3];
        wire.extend((1u64 << 40).to_be_bytes());
        wire.extend(9u64.to_be_bytes());
        wire.extend((u128::MAX - 5).to_be_bytes());
        assert_eq!(h.encode().to_vec(), wire);
        assert_eq!(Hello::decode(&wire), Some(h));
        assert_eq!(Hello::decode(&wire[..35]), None);
        wire.push(0);
        assert_eq!(Hello::decode(&wire), None);
    }
}
