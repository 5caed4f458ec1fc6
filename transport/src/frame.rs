//! Sans-IO framing: a fixed header followed by a payload.
//!
//! Nothing here touches a socket. The [`Decoder`] is a state machine that is fed bytes (or hands
//! out a slot to read into) and yields frames; when the byte stream ends it classifies the end as
//! a clean EOF at a frame boundary, a truncation inside a header or payload, or a local shutdown.
//! A partial frame is never reported as a frame or as a clean close.
//!
//! Wire layout (big-endian), [`HEADER_LEN`] bytes:
//!
//! | bytes | field    |
//! |-------|----------|
//! | 0..4  | magic `WRNG` |
//! | 4     | version  |
//! | 5     | kind     |
//! | 6..8  | flags    |
//! | 8..16 | sequence |
//! | 16..20| payload length |

use thiserror::Error;

pub const MAGIC: [u8; 4] = *b"WRNG";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 20;
/// Default largest payload a decoder accepts (16 MiB).
pub const DEFAULT_MAX_PAYLOAD: u32 = 16 << 20;
/// A payload buffer grows by at most this much per read slot, so a peer that claims a large
/// (but legal) length and then sends little makes us allocate only what it actually sent.
const PAYLOAD_GROWTH: usize = 1 << 20;

/// What a frame carries. Unknown kinds are rejected by the decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Data = 1,
    Hello = 2,
    HelloAck = 3,
    HelloReject = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Data,
            2 => Kind::Hello,
            3 => Kind::HelloAck,
            4 => Kind::HelloReject,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub flags: u16,
    pub sequence: u64,
    pub len: u32,
}

/// A header that cannot be accepted. Raised before any payload buffer is allocated.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error(
        "bad magic {found:02x?} (expected {MAGIC:02x?}): the peer does not speak this protocol"
    )]
    BadMagic { found: [u8; 4] },
    #[error("unsupported frame version {found} (this build speaks version {VERSION})")]
    UnsupportedVersion { found: u8 },
    #[error("unknown frame kind {found}")]
    UnknownKind { found: u8 },
    #[error("frame payload of {len} bytes exceeds the limit of {max} bytes")]
    TooLong { len: u32, max: u32 },
    #[error("payload of {len} bytes does not fit the 32-bit length field")]
    PayloadTooLarge { len: usize },
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.kind as u8;
        out[6..8].copy_from_slice(&self.flags.to_be_bytes());
        out[8..16].copy_from_slice(&self.sequence.to_be_bytes());
        out[16..20].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// Parse and validate a header. The checks run in wire order, and the length check runs
    /// before the caller can allocate anything for the payload.
    pub fn decode(bytes: &[u8; HEADER_LEN], max_payload: u32) -> Result<Header, FrameError> {
        let magic: [u8; 4] = bytes[0..4].try_into().expect("4-byte slice");
        if magic != MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        if bytes[4] != VERSION {
            return Err(FrameError::UnsupportedVersion { found: bytes[4] });
        }
        let kind = Kind::from_u8(bytes[5]).ok_or(FrameError::UnknownKind { found: bytes[5] })?;
        let flags = u16::from_be_bytes([bytes[6], bytes[7]]);
        let sequence = u64::from_be_bytes(bytes[8..16].try_into().expect("8-byte slice"));
        let len = u32::from_be_bytes(bytes[16..20].try_into().expect("4-byte slice"));
        if len > max_payload {
            return Err(FrameError::TooLong {
                len,
                max: max_payload,
            });
        }
        Ok(Header {
            kind,
            flags,
            sequence,
            len,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub header: Header,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn new(kind: Kind, sequence: u64, payload: Vec<u8>) -> Result<Frame, FrameError> {
        let len = u32::try_from(payload.len())
            .map_err(|_| FrameError::PayloadTooLarge { len: payload.len() })?;
        Ok(Frame {
            header: Header {
                kind,
                flags: 0,
                sequence,
                len,
            },
            payload,
        })
    }

    /// Header and payload as one buffer (for tests and small frames; the TCP path uses
    /// vectored writes instead of copying).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&self.header.encode());
        out.extend_from_slice(&self.payload);
        out
    }
}

/// Which part of a frame the stream ended inside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Header,
    Payload,
}

/// The four outcomes of reading one frame from a byte stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    Frame(Frame),
    /// The peer closed the stream exactly at a frame boundary.
    CleanEof,
    /// The stream ended inside a header or payload: `got` of `expected` bytes arrived.
    Truncated {
        section: Section,
        expected: usize,
        got: usize,
    },
    /// We stopped the receiver ourselves; whatever was partially read does not matter.
    LocalShutdown,
}

#[derive(Debug)]
enum State {
    Header {
        buf: [u8; HEADER_LEN],
        filled: usize,
    },
    Payload {
        header: Header,
        buf: Vec<u8>,
        filled: usize,
    },
    Failed(FrameError),
}

/// Incremental frame decoder. Feed it bytes with [`Decoder::feed`], or read straight into
/// [`Decoder::read_slot`] and [`Decoder::commit`]; either way it never consumes bytes past the
/// frame it is decoding, so the caller can hand the rest of a stream to someone else.
#[derive(Debug)]
pub struct Decoder {
    max_payload: u32,
    state: State,
    /// A payload buffer handed back by the application, reused for the next payload so a
    /// stream of large frames does not allocate (and page-fault) per frame.
    spare: Option<Vec<u8>>,
}

impl Decoder {
    pub fn new(max_payload: u32) -> Decoder {
        Decoder {
            max_payload,
            state: State::Header {
                buf: [0; HEADER_LEN],
                filled: 0,
            },
            spare: None,
        }
    }

    /// Offer a used payload buffer for reuse (the larger of two offers is kept). Its old bytes
    /// are never visible: a payload is returned only once every byte of it has been read.
    pub fn give_buffer(&mut self, buf: Vec<u8>) {
        if self
            .spare
            .as_ref()
            .is_none_or(|s| s.capacity() < buf.capacity())
        {
            self.spare = Some(buf);
        }
    }

    pub fn max_payload(&self) -> u32 {
        self.max_payload
    }

    /// True when no byte of a next frame has arrived yet.
    pub fn at_boundary(&self) -> bool {
        matches!(self.state, State::Header { filled: 0, .. })
    }

    /// Bytes still missing from the current header or payload.
    pub fn wanted(&self) -> usize {
        match &self.state {
            State::Header { filled, .. } => HEADER_LEN - filled,
            State::Payload { header, filled, .. } => header.len as usize - filled,
            State::Failed(_) => 0,
        }
    }

    /// Consume up to one frame's worth of `input`. Returns the number of bytes consumed and the
    /// frame if one completed; call again with the rest of the input for further frames.
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, Option<Frame>), FrameError> {
        let mut used = 0;
        loop {
            if let State::Failed(e) = &self.state {
                return Err(e.clone());
            }
            let slot = self.read_slot();
            let n = slot.len().min(input.len() - used);
            slot[..n].copy_from_slice(&input[used..used + n]);
            used += n;
            if let Some(frame) = self.commit(n)? {
                return Ok((used, Some(frame)));
            }
            if used == input.len() {
                return Ok((used, None));
            }
        }
    }

    /// The buffer the next read should fill. Never longer than the current header or payload
    /// (and at most [`PAYLOAD_GROWTH`] past what already arrived). Empty after an error.
    pub fn read_slot(&mut self) -> &mut [u8] {
        match &mut self.state {
            State::Header { buf, filled } => &mut buf[*filled..],
            State::Payload {
                header,
                buf,
                filled,
            } => {
                let want = (*filled + PAYLOAD_GROWTH).min(header.len as usize);
                if buf.len() < want {
                    buf.resize(want, 0);
                }
                &mut buf[*filled..]
            }
            State::Failed(_) => &mut [],
        }
    }

    /// At a frame boundary, with a payload buffer handed back ([`Decoder::give_buffer`]): the
    /// two slots of one vectored read that takes the next header and, past it, up to `limit`
    /// bytes into that buffer, where the payload will live. A payload that comes with its
    /// header is then never copied. `None` elsewhere, or without such a buffer. Nothing is
    /// allocated: the bytes go into memory that already exists, whatever the header will say.
    pub fn header_and_spare(&mut self, limit: usize) -> Option<(&mut [u8], &mut [u8])> {
        let State::Header { buf, filled: 0 } = &mut self.state else {
            return None;
        };
        let spare = self.spare.as_mut().filter(|s| !s.is_empty() && limit > 0)?;
        let n = spare.len().min(limit);
        Some((&mut buf[..], &mut spare[..n]))
    }

    /// Record a read of `n` bytes into the slots of [`Decoder::header_and_spare`]. Bytes read
    /// past the frame's payload belong to the next frame: they are moved to the front of
    /// `rest` (which must hold `limit` bytes), and their count is returned with the frame, if
    /// one completed.
    pub fn commit_header_and_spare(
        &mut self,
        n: usize,
        rest: &mut [u8],
    ) -> Result<(Option<Frame>, usize), FrameError> {
        let State::Header { buf, filled: 0 } = &self.state else {
            panic!("commit_header_and_spare without header_and_spare");
        };
        if n < HEADER_LEN {
            return Ok((self.commit(n)?, 0));
        }
        // An invalid header fails in `commit`, as it would have from any read.
        let len = Header::decode(buf, self.max_payload).map_or(0, |h| h.len as usize);
        let read = n - HEADER_LEN;
        let in_payload = read.min(len);
        let past = read - in_payload;
        if past > 0 {
            let spare = self
                .spare
                .as_ref()
                .expect("the read went into the spare buffer");
            rest[..past].copy_from_slice(&spare[in_payload..read]);
        }
        // The spare buffer becomes the payload's (its first `in_payload` bytes are in place).
        if let Some(frame) = self.commit(HEADER_LEN)? {
            return Ok((Some(frame), past));
        }
        if in_payload == 0 {
            return Ok((None, past));
        }
        Ok((self.commit(in_payload)?, past))
    }

    /// Record that the first `n` bytes of the last [`Decoder::read_slot`] were filled.
    pub fn commit(&mut self, n: usize) -> Result<Option<Frame>, FrameError> {
        match &mut self.state {
            State::Header { buf, filled } => {
                *filled += n;
                debug_assert!(*filled <= HEADER_LEN, "commit past the read slot");
                if *filled < HEADER_LEN {
                    return Ok(None);
                }
                let header = match Header::decode(buf, self.max_payload) {
                    Ok(h) => h,
                    Err(e) => {
                        self.state = State::Failed(e.clone());
                        return Err(e);
                    }
                };
                if header.len == 0 {
                    self.reset();
                    return Ok(Some(Frame {
                        header,
                        payload: Vec::new(),
                    }));
                }
                // Only now, with the length validated, may a payload buffer exist. A reused one
                // keeps at most `len` of its old length, so nothing new is allocated for it.
                let mut buf = self.spare.take().unwrap_or_default();
                buf.truncate(header.len as usize);
                self.state = State::Payload {
                    header,
                    buf,
                    filled: 0,
                };
                Ok(None)
            }
            State::Payload {
                header,
                buf,
                filled,
            } => {
                *filled += n;
                debug_assert!(*filled <= buf.len(), "commit past the read slot");
                if *filled < header.len as usize {
                    return Ok(None);
                }
                let frame = Frame {
                    header: *header,
                    payload: std::mem::take(buf),
                };
                self.reset();
                Ok(Some(frame))
            }
            State::Failed(e) => Err(e.clone()),
        }
    }

    /// Classify the end of the byte stream (a read returned 0, or failed because we shut the
    /// socket down). Never returns [`ReadOutcome::Frame`].
    pub fn end_of_stream(&self, stopped_locally: bool) -> ReadOutcome {
        if stopped_locally {
            return ReadOutcome::LocalShutdown;
        }
        match &self.state {
            State::Header { filled: 0, .. } | State::Failed(_) => ReadOutcome::CleanEof,
            State::Header { filled, .. } => ReadOutcome::Truncated {
                section: Section::Header,
                expected: HEADER_LEN,
                got: *filled,
            },
            State::Payload { header, filled, .. } => ReadOutcome::Truncated {
                section: Section::Payload,
                expected: header.len as usize,
                got: *filled,
            },
        }
    }

    fn reset(&mut self) {
        self.state = State::Header {
            buf: [0; HEADER_LEN],
            filled: 0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(seq: u64, payload: &[u8]) -> Frame {
        Frame::new(Kind::Data, seq, payload.to_vec()).unwrap()
    }

    #[test]
    fn header_round_trips() {
        let h = Header {
            kind: Kind::Hello,
            flags: 0xbeef,
            sequence: u64::MAX - 3,
            len: 77,
        };
        assert_eq!(Header::decode(&h.encode(), 100).unwrap(), h);
    }

    #[test]
    fn rejects_bad_version_and_kind() {
        let mut b = data(1, b"x").header.encode();
        b[4] = 9;
        assert_eq!(
            Header::decode(&b, 10),
            Err(FrameError::UnsupportedVersion { found: 9 })
        );
        let mut b = data(1, b"x").header.encode();
        b[5] = 0;
        assert_eq!(
            Header::decode(&b, 10),
            Err(FrameError::UnknownKind { found: 0 })
        );
    }

    #[test]
    fn length_equal_to_limit_is_accepted_one_over_is_not() {
        let f = data(0, &[7; 64]);
        let mut d = Decoder::new(64);
        assert_eq!(d.feed(&f.encode()).unwrap(), (84, Some(f.clone())));
        let mut d = Decoder::new(63);
        assert_eq!(
            d.feed(&f.encode()),
            Err(FrameError::TooLong { len: 64, max: 63 })
        );
        // The error sticks: a decoder never resynchronises inside a corrupt stream.
        assert_eq!(d.feed(&[0]), Err(FrameError::TooLong { len: 64, max: 63 }));
    }

    #[test]
    fn a_decoder_is_at_a_boundary_only_between_frames() {
        let bytes = data(1, b"abc").encode();
        let mut d = Decoder::new(16);
        assert_eq!(d.max_payload(), 16);
        assert!(d.at_boundary());
        d.feed(&bytes[..3]).unwrap();
        assert!(!d.at_boundary(), "inside a header");
        d.feed(&bytes[3..HEADER_LEN + 1]).unwrap();
        assert!(!d.at_boundary(), "inside a payload");
        assert_eq!(
            d.feed(&bytes[HEADER_LEN + 1..]).unwrap().1,
            Some(data(1, b"abc"))
        );
        assert!(d.at_boundary());
    }

    #[test]
    fn wanted_counts_the_bytes_still_missing() {
        let bytes = data(1, &[9; 10]).encode();
        let mut d = Decoder::new(16);
        assert_eq!(d.wanted(), HEADER_LEN);
        d.feed(&bytes[..3]).unwrap();
        assert_eq!(d.wanted(), HEADER_LEN - 3);
        d.feed(&bytes[3..HEADER_LEN + 4]).unwrap();
        assert_eq!(d.wanted(), 6);
    }

    #[test]
    fn of_two_spare_buffers_the_larger_is_kept() {
        let mut d = Decoder::new(16);
        d.give_buffer(Vec::with_capacity(8));
        d.give_buffer(Vec::with_capacity(64));
        assert!(d.spare.as_ref().unwrap().capacity() >= 64);
        d.give_buffer(Vec::with_capacity(4));
        assert!(
            d.spare.as_ref().unwrap().capacity() >= 64,
            "a smaller one does not replace it"
        );
        let mut e = Decoder::new(16);
        e.give_buffer(Vec::with_capacity(32));
        e.give_buffer(Vec::with_capacity(32));
        assert!(e.spare.is_some());
    }

    #[test]
    fn feed_stops_after_one_frame() {
        let mut bytes = data(1, b"ab").encode();
        bytes.extend(data(2, b"").encode());
        let mut d = Decoder::new(16);
        let (n, f) = d.feed(&bytes).unwrap();
        assert_eq!((n, f), (22, Some(data(1, b"ab"))));
        assert!(d.at_boundary());
        assert_eq!(d.feed(&bytes[n..]).unwrap(), (20, Some(data(2, b""))));
    }

    #[test]
    fn end_of_stream_classification() {
        let f = data(3, b"hello").encode();
        let mut d = Decoder::new(16);
        assert_eq!(d.end_of_stream(false), ReadOutcome::CleanEof);
        d.feed(&f[..7]).unwrap();
        assert_eq!(
            d.end_of_stream(false),
            ReadOutcome::Truncated {
                section: Section::Header,
                expected: 20,
                got: 7
            }
        );
        d.feed(&f[7..22]).unwrap();
        assert_eq!(
            d.end_of_stream(false),
            ReadOutcome::Truncated {
                section: Section::Payload,
                expected: 5,
                got: 2
            }
        );
        assert_eq!(d.end_of_stream(true), ReadOutcome::LocalShutdown);
    }

    #[test]
    fn a_given_buffer_is_reused_and_never_leaks_old_bytes() {
        let mut d = Decoder::new(1024);
        let long = data(0, &[9; 300]);
        let (_, f) = d.feed(&long.encode()).unwrap();
        let old = f.unwrap().payload;
        let ptr = old.as_ptr();
        d.give_buffer(old);
        let short = data(1, b"fresh");
        let (_, f) = d.feed(&short.encode()).unwrap();
        let f = f.unwrap();
        assert_eq!(f.payload, b"fresh");
        assert_eq!(f.payload.as_ptr(), ptr, "the given buffer was not reused");
        // A longer payload after a shorter buffer: intact, whatever the buffer held before.
        d.give_buffer(f.payload);
        let longer = data(2, &[7; 500]);
        assert_eq!(d.feed(&longer.encode()).unwrap().1.unwrap(), longer);
    }

    #[test]
    fn payload_buffer_grows_with_data_not_with_the_claim() {
        let mut d = Decoder::new(u32::MAX);
        let h = Header {
            kind: Kind::Data,
            flags: 0,
            sequence: 0,
            len: u32::MAX,
        };
        d.feed(&h.encode()).unwrap();
        assert!(d.read_slot().len() <= PAYLOAD_GROWTH);
    }
}
