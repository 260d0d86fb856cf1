//! Arbitrary bytes, in arbitrary chunks, decoded as `Response`s: never a panic, and every
//! decoded response re-encodes to a frame that decodes to an equal response.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_proto::message::Response;
use warden_proto_fuzz::{decode_stream, split_input};

fuzz_target!(|data: &[u8]| {
    let (lens, stream) = split_input(data);
    let _ = decode_stream::<Response>(&lens, stream);
});
