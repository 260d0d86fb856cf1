//! Shared harness of the warden-proto fuzz targets.
//!
//! Input layout of the decode targets: byte 0 says how many of the following bytes (`0..=7`)
//! are chunk lengths; the rest of the input is the byte stream, fed to the [`Decoder`] in
//! chunks of those lengths, cyclically (a length of 0 is an empty `extend`), so that the
//! fuzzer also explores how frames are split across reads.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use warden_proto::frame::{self, Decoder, FrameError, HEADER_LEN, MAX_FRAME_LEN};

/// Most bytes re-encoding can add to a decoded body: fields left out that serialize anyway
/// (`"client":""`, `"env":[]`, `"overrides":{}`). Re-encoding never grows anything else
/// (whitespace, escapes such as `\u00e9` and `\/`, `"pty":null` all shrink or stay).
pub const REENCODE_SLACK: usize = 64;

/// Split `data` into chunk lengths and the stream.
pub fn split_input(data: &[u8]) -> (Vec<usize>, &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return (Vec::new(), data);
    };
    let n = usize::from(first % 8).min(rest.len());
    let (lens, stream) = rest.split_at(n);
    let mut lens: Vec<usize> = lens.iter().map(|&b| usize::from(b)).collect();
    // All-empty chunks would never get anywhere.
    if lens.iter().all(|&l| l == 0) {
        lens.clear();
    }
    (lens, stream)
}

/// Feed `stream` to a decoder in chunks of `lens` (cyclically; everything left in one go when
/// `lens` is empty), pulling messages of type `T` after each chunk until `None` or `Err`.
/// Checks the invariants; returns the messages decoded before the first error, if any.
pub fn decode_stream<T>(lens: &[usize], stream: &[u8]) -> Vec<T>
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let mut d = Decoder::new();
    let mut out = Vec::new();
    let mut fed = 0usize;
    let mut consumed = 0usize;
    let mut i = 0usize;
    while fed < stream.len() {
        let len = if lens.is_empty() {
            stream.len() - fed
        } else {
            lens[i % lens.len()]
        };
        i += 1;
        let end = (fed + len).min(stream.len());
        d.extend(&stream[fed..end]);
        fed = end;
        // The buffer never holds more than was given and not consumed.
        assert_eq!(d.buffered(), fed - consumed);
        loop {
            let before = d.buffered();
            let header = d.check_header();
            match d.next_message::<T>() {
                Ok(Some(msg)) => {
                    assert_eq!(header, Ok(()));
                    let body_len = before - d.buffered() - HEADER_LEN;
                    assert!((1..=MAX_FRAME_LEN).contains(&body_len));
                    consumed += HEADER_LEN + body_len;
                    check_round_trip(&msg, body_len);
                    out.push(msg);
                }
                Ok(None) => {
                    assert_eq!(header, Ok(()));
                    assert_eq!(d.buffered(), before, "None must not consume");
                    // Either the header is incomplete or the body is.
                    break;
                }
                Err(e) => {
                    // An oversized or empty header is reported by check_header too, and
                    // before the body is there; a malformed body only by next_message.
                    match &e {
                        FrameError::TooLarge(n) => {
                            assert!(*n > MAX_FRAME_LEN);
                            assert_eq!(header, Err(e.clone_error()));
                        }
                        FrameError::Empty => assert_eq!(header, Err(FrameError::Empty)),
                        FrameError::Malformed(_) => assert_eq!(header, Ok(())),
                    }
                    return out;
                }
            }
        }
    }
    out
}

/// A decoded message re-encodes, and the frame decodes to an equal value.
pub fn check_round_trip<T>(msg: &T, body_len: usize)
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let again = match frame::encode(msg) {
        Ok(bytes) => bytes,
        Err(FrameError::TooLarge(n)) => {
            // Only possible for a body at the limit whose left-out defaults re-encode.
            assert!(
                body_len + REENCODE_SLACK > MAX_FRAME_LEN && n <= body_len + REENCODE_SLACK,
                "a {body_len}-byte body re-encodes to {n} bytes"
            );
            return;
        }
        Err(e) => panic!("decoded message does not re-encode: {e}: {msg:?}"),
    };
    let mut d = Decoder::new();
    d.extend(&again);
    match d.next_message::<T>() {
        Ok(Some(back)) => assert_eq!(&back, msg, "re-encoded message differs"),
        other => panic!("re-encoded frame does not decode: {other:?} for {msg:?}"),
    }
    assert_eq!(d.buffered(), 0);
}

/// `FrameError` is not `Clone`; rebuild one for comparisons.
trait CloneError {
    fn clone_error(&self) -> FrameError;
}

impl CloneError for FrameError {
    fn clone_error(&self) -> FrameError {
        match self {
            FrameError::TooLarge(n) => FrameError::TooLarge(*n),
            FrameError::Empty => FrameError::Empty,
            FrameError::Malformed(m) => FrameError::Malformed(m.clone()),
        }
    }
}
