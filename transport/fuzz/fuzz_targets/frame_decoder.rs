//! Arbitrary bytes, fed in arbitrary chunks, must never panic the decoder, never allocate past
//! the limit, and decoded frames must re-encode to exactly the bytes they came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wringer_transport::frame::{Decoder, ReadOutcome};

fuzz_target!(|input: &[u8]| {
    let Some((&chunk, bytes)) = input.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut decoder = Decoder::new(64 * 1024);
    let mut consumed = 0;
    for piece in bytes.chunks(chunk) {
        let mut rest = piece;
        while !rest.is_empty() {
            match decoder.feed(rest) {
                Ok((used, frame)) => {
                    if let Some(frame) = frame {
                        let encoded = frame.encode();
                        let start = consumed + (piece.len() - rest.len()) + used - encoded.len();
                        assert_eq!(&bytes[start..start + encoded.len()], &encoded[..]);
                    }
                    rest = &rest[used..];
                }
                Err(_) => return,
            }
        }
        consumed += piece.len();
    }
    assert!(!matches!(
        decoder.end_of_stream(false),
        ReadOutcome::Frame(_)
    ));
});
