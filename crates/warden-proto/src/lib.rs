//! warden's wire protocol, version 1 (see docs/PROTOCOL.md).
//!
//! - [`message`]: what a client sends and what the daemon answers;
//! - [`frame`]: length-prefixed JSON frames with a hard size limit (pure, fuzzed);
//! - [`conn`]: a framed connection over a Unix socket that passes file descriptors with
//!   SCM_RIGHTS on the frame that declares them;
//! - [`parse`]: the human units both sides read (sizes like `512M`, durations like `5s`);
//! - [`socket`]: where a daemon listens by default.

pub mod conn;
pub mod frame;
pub mod message;
pub mod parse;
pub mod socket;

pub use conn::{Conn, ConnError};
pub use frame::{Decoder, FrameError, MAX_FRAME_LEN};
pub use message::*;
