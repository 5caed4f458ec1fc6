//! Property: any sequence of frames, encoded into one stream and chopped at random points,
//! decodes to the same frames, and the end of the stream is classified correctly.

use proptest::prelude::*;
use wringer_transport::frame::{Decoder, Frame, Kind, ReadOutcome};

fn frame_strategy() -> impl Strategy<Value = Frame> {
    (
        prop_oneof![
            Just(Kind::Data),
            Just(Kind::Hello),
            Just(Kind::HelloAck),
            Just(Kind::HelloReject)
        ],
        any::<u16>(),
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 0..2048),
    )
        .prop_map(|(kind, flags, seq, payload)| {
            let mut f = Frame::new(kind, seq, payload).unwrap();
            f.header.flags = flags;
            f
        })
}

proptest! {
    #[test]
    fn chopped_streams_decode_to_the_same_frames(
        frames in prop::collection::vec(frame_strategy(), 0..12),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
        drop_tail in 0usize..64,
    ) {
        let stream: Vec<u8> = frames.iter().flat_map(|f| f.encode()).collect();
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
        points.extend([0, stream.len()]);
        points.sort_unstable();
        points.dedup();

        let mut decoder = Decoder::new(4096);
        let mut decoded = Vec::new();
        for w in points.windows(2) {
            let mut chunk = &stream[w[0]..w[1]];
            while !chunk.is_empty() {
                let (used, frame) = decoder.feed(chunk).unwrap();
                prop_assert!(used > 0 || frame.is_some());
                decoded.extend(frame);
                chunk = &chunk[used..];
            }
        }
        prop_assert_eq!(&decoded, &frames);
        prop_assert_eq!(decoder.end_of_stream(false), ReadOutcome::CleanEof);

        // Dropping the tail of the stream is always truncation, never a frame or a clean EOF.
        if let Some(last) = frames.last() {
            // Cut 1..len-1 bytes off the last frame: never all of it, which would be a clean end.
            let cut = drop_tail % (last.encode().len() - 1) + 1;
            let mut d = Decoder::new(4096);
            let mut rest = &stream[..stream.len() - cut];
            let mut n = 0;
            while !rest.is_empty() {
                let (used, frame) = d.feed(rest).unwrap();
                n += usize::from(frame.is_some());
                rest = &rest[used..];
            }
            prop_assert_eq!(n, frames.len() - 1);
            let truncated = matches!(d.end_of_stream(false), ReadOutcome::Truncated { .. });
            prop_assert!(truncated);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        let mut d = Decoder::new(1024);
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            match d.feed(rest) {
                Ok((used, _)) => rest = &rest[used..],
                Err(_) => break,
            }
        }
        let _ = d.end_of_stream(false);
    }
}

/// Serves `stream` in reads that end at the given cut points, filling every slot of a vectored
/// read in turn, as `recvmsg` does.
struct Chopped<'a> {
    stream: &'a [u8],
    at: usize,
    cuts: std::collections::VecDeque<usize>,
}

impl Chopped<'_> {
    fn limit(&mut self) -> usize {
        while self.cuts.front().is_some_and(|&c| c <= self.at) {
            self.cuts.pop_front();
        }
        self.cuts.front().copied().unwrap_or(self.stream.len()) - self.at
    }
}

impl std::io::Read for Chopped<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.read_vectored(&mut [std::io::IoSliceMut::new(buf)])
    }

    fn read_vectored(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
        let mut left = self.limit();
        let mut n = 0;
        for b in bufs.iter_mut() {
            let k = b.len().min(left);
            b[..k].copy_from_slice(&self.stream[self.at..self.at + k]);
            (self.at, left, n) = (self.at + k, left - k, n + k);
        }
        Ok(n)
    }
}

proptest! {
    /// The buffered reader, handed back payload buffers of any size (so that a header and the
    /// start of its payload are read together into one), still returns exactly the frames sent,
    /// wherever the reads end, and then a clean end of stream.
    #[test]
    fn reused_payload_buffers_decode_to_the_same_frames(
        frames in prop::collection::vec(frame_strategy(), 0..12),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
        spares in prop::collection::vec(0usize..12_000, 1..12),
    ) {
        use wringer_transport::stream::FrameReader;
        let stream: Vec<u8> = frames.iter().flat_map(|f| f.encode()).collect();
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
        points.sort_unstable();
        let mut src = Chopped { stream: &stream, at: 0, cuts: points.into() };
        let mut reader = FrameReader::new(4096);
        let stop = std::sync::atomic::AtomicBool::new(false);
        for (i, want) in frames.iter().enumerate() {
            // Old bytes in the buffer must never show through.
            reader.give_buffer(vec![0xee; spares[i % spares.len()]]);
            let got = reader.read_frame(&mut src, &stop).unwrap();
            prop_assert_eq!(got, ReadOutcome::Frame(want.clone()));
        }
        prop_assert_eq!(reader.read_frame(&mut src, &stop).unwrap(), ReadOutcome::CleanEof);
    }
}
