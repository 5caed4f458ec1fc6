//! A raw peer that writes a scripted stream on command, for the read-path steps: rank 0 drives
//! it in-band (commands are frames on the connection under test), so rank 0 decides when each
//! byte arrives, to the byte, on any host profile. Rank 1 ([`serve`]) connects to rank 0's raw
//! listener, obeys one connection's commands, and connects again, until told to stop.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use wringer_transport::frame::{Frame, Kind, ReadOutcome, HEADER_LEN};
use wringer_transport::stream::FrameReader;
use wringer_transport::{Connection, Error, ReceiverError};

use super::raw_peer::{accept_conn, data};
use super::{pattern, raw_connect};
use crate::rank::context::RankContext;

/// How a scripted stream ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    /// An RST (`SO_LINGER` 0, then close).
    Reset,
    /// Part of a frame, then the peer's FIN.
    Truncate,
    /// A header that is not one.
    Garbage,
}

impl End {
    pub const ALL: [End; 3] = [End::Reset, End::Truncate, End::Garbage];

    pub fn name(self) -> &'static str {
        match self {
            End::Reset => "reset",
            End::Truncate => "truncation",
            End::Garbage => "garbage",
        }
    }

    /// Whether `e` (from `recv`, `send` or `flush`) reports this end, classified right.
    pub fn is_reported_by(self, e: &Error) -> bool {
        let Error::Receiver(r) = e else {
            return false;
        };
        match (self, r) {
            (End::Reset, ReceiverError::Io { kind, .. }) => {
                *kind == std::io::ErrorKind::ConnectionReset
            }
            (End::Truncate, ReceiverError::Truncated { expected, got, .. }) => {
                *expected == TRUNCATED_PAYLOAD && *got == TRUNCATED_GOT
            }
            (End::Garbage, ReceiverError::Frame(_)) => true,
            _ => false,
        }
    }
}

/// The truncated frame: a payload of this many bytes, of which this many arrive.
const TRUNCATED_PAYLOAD: usize = 100;
const TRUNCATED_GOT: usize = 33;
const GARBAGE: &[u8] = b"GARBAGE!GARBAGE!GARBAGE!";

/// One command to the peer, as a frame's payload: an opcode, then little-endian u64s.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Command {
    /// Not a command: a payload the step sent for its own reasons (the peer ignores it).
    Ignore,
    /// This connection's stream: data frames with these payload lengths, from tag `tag`.
    Load { tag: u64, lens: Vec<u64> },
    /// Write the stream up to this offset (from where it stands), in one write.
    WriteTo(u64),
    /// End the stream so.
    End(End),
    /// Leave: the step is over.
    Stop,
}

impl Command {
    fn encode(&self) -> Vec<u8> {
        let (op, args): (u8, Vec<u64>) = match self {
            Command::Ignore => (0, vec![]),
            Command::Load { tag, lens } => (1, [*tag].into_iter().chain(lens.clone()).collect()),
            Command::WriteTo(offset) => (2, vec![*offset]),
            Command::End(end) => (
                3,
                vec![End::ALL.iter().position(|e| e == end).unwrap() as u64],
            ),
            Command::Stop => (4, vec![]),
        };
        let mut out = vec![op];
        for a in args {
            out.extend_from_slice(&a.to_le_bytes());
        }
        out
    }

    fn decode(payload: &[u8]) -> Command {
        let Some((&op, rest)) = payload.split_first() else {
            return Command::Ignore;
        };
        let args: Vec<u64> = rest
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        match (op, args.as_slice()) {
            (1, [tag, lens @ ..]) => Command::Load {
                tag: *tag,
                lens: lens.to_vec(),
            },
            (2, [offset]) => Command::WriteTo(*offset),
            (3, [i]) => End::ALL
                .get(*i as usize)
                .map_or(Command::Ignore, |e| Command::End(*e)),
            (4, []) => Command::Stop,
            _ => Command::Ignore,
        }
    }
}

/// A stream of data frames both ranks derive from the seed: frame `i` carries sequence `i`
/// and `pattern(seed, tag + i, lens[i])`.
pub(super) struct Script {
    seed: u64,
    tag: u64,
    lens: Vec<u64>,
    /// Where frame `i` ends in the stream (its last byte's offset + 1).
    ends: Vec<u64>,
}

impl Script {
    pub fn new(seed: u64, tag: u64, lens: Vec<u64>) -> Script {
        let ends = lens
            .iter()
            .scan(0u64, |at, len| {
                *at += HEADER_LEN as u64 + len;
                Some(*at)
            })
            .collect();
        Script {
            seed,
            tag,
            lens,
            ends,
        }
    }

    pub fn frames(&self) -> usize {
        self.lens.len()
    }

    /// Where frame `i` starts in the stream.
    pub fn start(&self, i: usize) -> u64 {
        if i == 0 {
            0
        } else {
            self.ends[i - 1]
        }
    }

    pub fn end(&self, i: usize) -> u64 {
        self.ends[i]
    }

    /// Whether `frame` is frame `i` of the script, whole, byte for byte.
    pub fn is_frame(&self, i: usize, frame: &Frame) -> bool {
        frame.header.kind == Kind::Data
            && frame.header.sequence == i as u64
            && frame.payload == pattern(self.seed, self.tag + i as u64, self.lens[i] as usize)
    }

    /// Which frame of the script `frame` is (by its sequence), if its bytes are that frame's.
    pub fn index_of(&self, frame: &Frame) -> Option<usize> {
        let i = usize::try_from(frame.header.sequence).ok()?;
        (i < self.frames() && self.is_frame(i, frame)).then_some(i)
    }

    fn bytes(&self) -> Vec<u8> {
        (0..self.frames()).flat_map(|i| self.encode(i)).collect()
    }

    fn encode(&self, i: usize) -> Vec<u8> {
        let payload = pattern(self.seed, self.tag + i as u64, self.lens[i] as usize);
        Frame::new(Kind::Data, i as u64, payload)
            .expect("scripted payloads are under the frame limit")
            .encode()
    }
}

/// Rank 0's side: the connection under test, and the commands that steer the peer's writes.
pub(super) struct Driver<'a> {
    pub conn: &'a Connection,
    pub script: Script,
    timeout: Duration,
}

impl<'a> Driver<'a> {
    /// Load `script` into the peer at the other end of `conn`.
    pub fn new(conn: &'a Connection, script: Script, timeout: Duration) -> Result<Driver<'a>> {
        let driver = Driver {
            conn,
            script,
            timeout,
        };
        driver.command(&Command::Load {
            tag: driver.script.tag,
            lens: driver.script.lens.clone(),
        })?;
        Ok(driver)
    }

    /// Have the peer write its stream up to `offset`.
    pub fn write_to(&self, offset: u64) -> Result<()> {
        self.command(&Command::WriteTo(offset))
    }

    /// Have the peer end the stream with `end`. The command may be answered by the end itself
    /// before `send` returns: a receiver error it reports is that end, not a failure.
    pub fn end(&self, end: End) -> Result<()> {
        match self.conn.send(&Command::End(end).encode(), self.timeout) {
            Ok(()) | Err(Error::Receiver(_)) => Ok(()),
            Err(e) => Err(e).context(format!("telling the scripted peer to end with {end:?}")),
        }
    }

    fn command(&self, c: &Command) -> Result<()> {
        self.conn
            .send(&c.encode(), self.timeout)
            .with_context(|| format!("telling the scripted peer {c:?}"))
    }
}

/// A payload the peer ignores, for steps that send on the connection under test.
pub(super) fn ignored_payload() -> Vec<u8> {
    Command::Ignore.encode()
}

/// Rank 0: tell the peer the step is over (on a connection of its own).
pub(super) fn stop_peer(ctx: &RankContext, timeout: Duration) -> Result<()> {
    let conn = accept_conn(ctx, timeout)?;
    conn.send(&Command::Stop.encode(), timeout)?;
    conn.flush(timeout)?;
    // The peer closes once it has read the stop.
    let _ = conn.recv(timeout);
    conn.close()?;
    Ok(())
}

/// Run a step between a reader and a scripted peer: rank 0 runs `read` (given the step's
/// deadline as an instant), rank 1 serves as the peer, closing a connection that stays idle for
/// `peer_patience`, and any other rank sits the step out.
pub(super) fn pair(
    ctx: &RankContext,
    step_deadline: Duration,
    peer_patience: Duration,
    read: impl FnOnce(Instant) -> Result<()>,
) -> Result<()> {
    let deadline = Instant::now() + step_deadline;
    match ctx.rank {
        0 => read(deadline),
        1 => serve(ctx, peer_patience, deadline),
        _ => Ok(()),
    }
}

/// Rank 1: connect to rank 0's raw listener and obey each connection's commands until told to
/// stop. A connection whose commands stop coming for `idle` is closed by us (the test then
/// waited for its peer: evidence for rank 0, never a hang), and the next one begins.
fn serve(ctx: &RankContext, idle: Duration, deadline: Instant) -> Result<()> {
    let mut served = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("the step's deadline passed before rank 0 said stop");
        }
        let stream = match raw_connect(ctx.peers[0].raw, left) {
            Ok(s) => s,
            // Rank 0's raw listener lives as long as its process, so a refusal after a served
            // connection means rank 0 has left the step, and its own evidence says how. (Its
            // stop can go to a connection this peer had already closed as idle, queued unaccepted
            // in rank 0's backlog: seen once in CI, on a busy machine, as this rank's step error
            // in a run rank 0 passed.)
            Err(e) if served > 0 && refused(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        served += 1;
        if obey(ctx.seed, stream, idle)? == Obeyed::Stop {
            return Ok(());
        }
    }
}

fn refused(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
}

#[derive(PartialEq, Eq)]
enum Obeyed {
    /// The connection ended (rank 0 closed it, or it went idle); the next one may come.
    Ended,
    Stop,
}

fn obey(seed: u64, mut stream: TcpStream, idle: Duration) -> Result<Obeyed> {
    stream.set_read_timeout(Some(idle))?;
    stream.set_write_timeout(Some(idle))?;
    let mut reader = FrameReader::new(1 << 20);
    let never = AtomicBool::new(false);
    let mut bytes = vec![];
    let mut written = 0usize;
    loop {
        let frame = match reader.read_frame(&mut stream, &never) {
            Ok(ReadOutcome::Frame(f)) => f,
            // Closed, reset, idle for too long, or not frames: this connection is over.
            Ok(_) | Err(_) => return Ok(Obeyed::Ended),
        };
        match Command::decode(&frame.payload) {
            Command::Ignore => {}
            Command::Load { tag, lens } => {
                bytes = Script::new(seed, tag, lens).bytes();
                written = 0;
            }
            Command::WriteTo(offset) => {
                let to = (offset as usize).min(bytes.len());
                if to > written {
                    stream.write_all(&bytes[written..to])?;
                    written = to;
                }
            }
            Command::End(End::Reset) => {
                // Closing with a zero linger time sends an RST instead of a FIN.
                let zero = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &zero)?;
                return Ok(Obeyed::Ended);
            }
            Command::End(End::Truncate) => {
                // A whole header, then part of its payload: the payload is what is cut short.
                let cut = data(seed, u64::MAX, TRUNCATED_PAYLOAD);
                stream.write_all(&cut[..HEADER_LEN + TRUNCATED_GOT])?;
                stream.shutdown(Shutdown::Write)?;
            }
            Command::End(End::Garbage) => stream.write_all(GARBAGE)?,
            Command::Stop => return Ok(Obeyed::Stop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refused_connect_means_rank_0_has_left() {
        use std::io::{Error as IoError, ErrorKind};
        assert!(refused(&IoError::from(ErrorKind::ConnectionRefused).into()));
        assert!(!refused(&IoError::from(ErrorKind::TimedOut).into()));
        assert!(!refused(&anyhow::anyhow!("connection refused, in words")));
    }

    #[test]
    fn commands_survive_their_encoding_and_strangers_are_ignored() {
        for c in [
            Command::Load {
                tag: 7,
                lens: vec![1, 2, 300_000],
            },
            Command::WriteTo(12_345),
            Command::End(End::Reset),
            Command::End(End::Truncate),
            Command::End(End::Garbage),
            Command::Stop,
            Command::Ignore,
        ] {
            assert_eq!(Command::decode(&c.encode()), c);
        }
        assert_eq!(Command::decode(b""), Command::Ignore);
        assert_eq!(
            Command::decode(&[3, 9, 0, 0, 0, 0, 0, 0, 0]),
            Command::Ignore
        );
        assert_eq!(Command::decode(&[2, 1, 2]), Command::Ignore);
    }

    #[test]
    fn a_script_knows_where_each_frame_lies_and_what_it_holds() {
        let s = Script::new(5, 100, vec![10, 0, 3]);
        let bytes = s.bytes();
        assert_eq!(s.start(0), 0);
        assert_eq!(s.end(0), (HEADER_LEN + 10) as u64);
        assert_eq!(s.start(2), s.end(1));
        assert_eq!(s.end(2) as usize, bytes.len());
        let mut reader = FrameReader::new(1 << 20);
        let never = AtomicBool::new(false);
        let mut src = &bytes[..];
        for i in 0..3 {
            let Ok(ReadOutcome::Frame(f)) = reader.read_frame(&mut src, &never) else {
                panic!("frame {i} does not decode");
            };
            assert!(s.is_frame(i, &f));
            assert_eq!(s.index_of(&f), Some(i));
            assert!(!s.is_frame((i + 1) % 3, &f));
        }
        let other = Script::new(6, 100, vec![10]);
        let mut src = &other.bytes()[..];
        let Ok(ReadOutcome::Frame(f)) = reader.read_frame(&mut src, &never) else {
            panic!("no frame");
        };
        assert_eq!(s.index_of(&f), None, "another seed's bytes are not frame 0");
    }

    #[test]
    fn an_end_is_reported_only_by_its_own_kind() {
        let reset = Error::Receiver(ReceiverError::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            errno: Some(104),
            message: "reset".into(),
        });
        let cut = Error::Receiver(ReceiverError::Truncated {
            section: wringer_transport::frame::Section::Payload,
            expected: TRUNCATED_PAYLOAD,
            got: TRUNCATED_GOT,
        });
        assert!(End::Reset.is_reported_by(&reset));
        assert!(
            !End::Reset.is_reported_by(&Error::PeerClosed),
            "a clean close"
        );
        assert!(!End::Reset.is_reported_by(&cut));
        assert!(End::Truncate.is_reported_by(&cut));
        assert!(!End::Truncate.is_reported_by(&Error::Closed));
        assert!(!End::Garbage.is_reported_by(&reset));
    }
}
