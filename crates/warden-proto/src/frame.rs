//! Framing: a frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON
//! holding one message. This module is pure (no I/O) so that it can be fuzzed: [`Decoder`]
//! takes bytes as they arrive and yields whole frames; [`encode`] makes one.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Hard limit on a frame's body, in bytes. A header announcing more is a protocol error.
pub const MAX_FRAME_LEN: usize = 256 * 1024;

/// Length of the frame header.
pub const HEADER_LEN: usize = 4;

/// What can be wrong with a frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The header announced a body over [`MAX_FRAME_LEN`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_LEN} bytes")]
    TooLarge(usize),
    /// The header announced an empty body.
    #[error("empty frame")]
    Empty,
    /// The body is not a valid message.
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// Encode one message as a frame.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(msg).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge(body.len()));
    }
    let len = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge(body.len()))?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Incremental decoder: feed bytes with [`Decoder::extend`], take messages with
/// [`Decoder::next_message`]. An error is final: the connection must be closed.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// A decoder with an empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append received bytes.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered and not yet consumed.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Length of the frame body announced by the buffered header, checked against the limit.
    fn announced(&self) -> Result<Option<usize>, FrameError> {
        let Some(header) = self.buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let mut len = [0u8; HEADER_LEN];
        len.copy_from_slice(header);
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME_LEN {
            return Err(FrameError::TooLarge(len));
        }
        if len == 0 {
            return Err(FrameError::Empty);
        }
        Ok(Some(len))
    }

    /// The next whole frame's body, if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let Some(len) = self.announced()? else {
            return Ok(None);
        };
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let body = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(body))
    }

    /// The next whole message, if one is buffered.
    pub fn next_message<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        match self.next_frame()? {
            None => Ok(None),
            Some(body) => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| FrameError::Malformed(e.to_string())),
        }
    }

    /// Fails early when the buffered header already announces an invalid frame, so that a
    /// reader does not wait for bytes of a frame it will refuse anyway.
    pub fn check_header(&self) -> Result<(), FrameError> {
        self.announced().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Request;

    #[test]
    fn round_trip_byte_by_byte() -> Result<(), FrameError> {
        let msg = Request::Hello {
            version: 1,
            client: "t".into(),
        };
        let frame = encode(&msg)?;
        let mut d = Decoder::new();
        for (i, b) in frame.iter().enumerate() {
            assert_eq!(d.next_message::<Request>()?, None, "early at byte {i}");
            d.extend(&[*b]);
        }
        assert_eq!(d.next_message::<Request>()?, Some(msg));
        assert_eq!(d.buffered(), 0);
        Ok(())
    }

    #[test]
    fn oversized_header_is_refused_before_the_body() {
        let mut d = Decoder::new();
        d.extend(&u32::MAX.to_be_bytes());
        assert_eq!(d.check_header(), Err(FrameError::TooLarge(u32::MAX as usize)));
        assert!(d.next_message::<Request>().is_err());
    }

    #[test]
    fn empty_and_malformed_frames_are_errors() {
        let mut d = Decoder::new();
        d.extend(&0u32.to_be_bytes());
        assert_eq!(d.next_frame(), Err(FrameError::Empty));

        let mut d = Decoder::new();
        d.extend(&3u32.to_be_bytes());
        d.extend(b"{x}");
        assert!(matches!(
            d.next_message::<Request>(),
            Err(FrameError::Malformed(_))
        ));
    }
}
