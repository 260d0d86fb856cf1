//! Arbitrary bytes, in arbitrary chunks, decoded as `Request`s: never a panic, and every
//! decoded request re-encodes to a frame that decodes to an equal request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_proto::message::Request;
use warden_proto_fuzz::{decode_stream, split_input};

fuzz_target!(|data: &[u8]| {
    let (lens, stream) = split_input(data);
    for req in decode_stream::<Request>(&lens, stream) {
        // What a reader does next with a request; must not panic whatever `fds` holds.
        std::hint::black_box(req.fd_count());
    }
});
