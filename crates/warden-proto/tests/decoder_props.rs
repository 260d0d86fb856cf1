//! Property tests of the frame decoder: what the encoder writes, the decoder reads back
//! whatever the chunking; arbitrary bytes never panic it; an oversized header is refused
//! before its body arrives. The case count is kept modest so that this runs in seconds in CI
//! (override with `PROPTEST_CASES=N`). The long-running counterpart is `scripts/fuzz`.

#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed case

use proptest::collection::vec;
use proptest::prelude::*;
use warden_proto::frame::{self, Decoder, FrameError, HEADER_LEN, MAX_FRAME_LEN};
use warden_proto::message::{
    ErrorCode, ExitReason, ExitReport, FdRole, Network, Overrides, PtySize, Request, Response,
    StartRequest,
};

/// Strings with the characters JSON must escape (quotes, backslashes, controls), non-ASCII
/// and astral-plane characters, as well as plain text.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 ./_-]{0,16}",
        any::<String>().prop_map(|s| s.chars().take(24).collect()),
        "[\"\\\\\u{0}-\u{1f}\u{7f}\u{2028}\u{fffd}\u{1f600}]{0,8}",
    ]
}

fn fd_role() -> impl Strategy<Value = FdRole> {
    prop_oneof![
        Just(FdRole::Cwd),
        Just(FdRole::Stdin),
        Just(FdRole::Stdout),
        Just(FdRole::Stderr),
    ]
}

fn network() -> impl Strategy<Value = Network> {
    prop_oneof![
        Just(Network::None),
        Just(Network::Loopback),
        Just(Network::Host)
    ]
}

fn overrides() -> impl Strategy<Value = Overrides> {
    (
        proptest::option::of(network()),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(network, memory_max, tasks_max, timeout_ms)| Overrides {
            network,
            memory_max,
            tasks_max,
            timeout_ms,
        })
}

fn start_request() -> impl Strategy<Value = StartRequest> {
    (
        vec(text(), 0..6),
        vec((text(), text()), 0..6),
        proptest::option::of(text()),
        overrides(),
        vec(fd_role(), 0..10),
        proptest::option::of((any::<u16>(), any::<u16>())),
        vec(text(), 0..3),
    )
        .prop_map(
            |(argv, env, profile, overrides, fds, pty, explicit_env)| StartRequest {
                argv,
                env,
                explicit_env,
                profile,
                overrides,
                fds,
                pty: pty.map(|(rows, cols)| PtySize { rows, cols }),
            },
        )
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (any::<u32>(), text()).prop_map(|(version, client)| Request::Hello { version, client }),
        start_request().prop_map(Request::Start),
        any::<i32>().prop_map(|signal| Request::Signal { signal }),
        Just(Request::Stop),
    ]
}

fn exit_reason() -> impl Strategy<Value = ExitReason> {
    prop_oneof![
        Just(ExitReason::Exited),
        Just(ExitReason::Signal),
        Just(ExitReason::Timeout),
        Just(ExitReason::Oom),
        Just(ExitReason::Stopped),
        Just(ExitReason::FailedToStart),
    ]
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    prop_oneof![
        Just(ErrorCode::Admission),
        Just(ErrorCode::SessionLimit),
        Just(ErrorCode::Protocol),
        Just(ErrorCode::Refused),
        Just(ErrorCode::NotFound),
        Just(ErrorCode::NotExecutable),
        Just(ErrorCode::Internal),
        Just(ErrorCode::Timeout),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        (any::<u32>(), text())
            .prop_map(|(version, backend)| Response::Welcome { version, backend }),
        text().prop_map(|unit| Response::Started { unit }),
        (
            exit_reason(),
            proptest::option::of(any::<i32>()),
            proptest::option::of(any::<i32>()),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
            any::<u64>(),
        )
            .prop_map(
                |(reason, code, signal, cpu_usec, peak_memory_bytes, wall_usec)| {
                    Response::Exited(ExitReport {
                        reason,
                        code,
                        signal,
                        cpu_usec,
                        peak_memory_bytes,
                        wall_usec,
                    })
                }
            ),
        (error_code(), text()).prop_map(|(code, message)| Response::Error { code, message }),
    ]
}

/// Feed `bytes` to a decoder cut at `cuts` (positions taken modulo the length, in any order)
/// and pull messages after every chunk, as a reader does.
fn decode_in_chunks<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    cuts: &[usize],
) -> Result<Vec<T>, FrameError> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| if bytes.is_empty() { 0 } else { c % bytes.len() })
        .collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    points.dedup();
    let mut d = Decoder::new();
    let mut out = Vec::new();
    for w in points.windows(2) {
        d.extend(&bytes[w[0]..w[1]]);
        while let Some(msg) = d.next_message::<T>()? {
            out.push(msg);
        }
    }
    assert_eq!(d.buffered(), 0, "bytes left over after whole frames");
    Ok(out)
}

fn encode_all<T: serde::Serialize>(msgs: &[T]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for m in msgs {
        bytes.extend(frame::encode(m).unwrap());
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn requests_survive_any_chunking(
        msgs in vec(request(), 1..8),
        cuts in vec(any::<usize>(), 0..24),
    ) {
        let bytes = encode_all(&msgs);
        let got = decode_in_chunks::<Request>(&bytes, &cuts).unwrap();
        prop_assert_eq!(got, msgs);
    }

    #[test]
    fn responses_survive_any_chunking(
        msgs in vec(response(), 1..8),
        cuts in vec(any::<usize>(), 0..24),
    ) {
        let bytes = encode_all(&msgs);
        let got = decode_in_chunks::<Response>(&bytes, &cuts).unwrap();
        prop_assert_eq!(got, msgs);
    }

    #[test]
    fn fd_count_survives_the_wire(req in request()) {
        let bytes = frame::encode(&req).unwrap();
        let got = decode_in_chunks::<Request>(&bytes, &[]).unwrap();
        prop_assert_eq!(got.len(), 1);
        prop_assert_eq!(got[0].fd_count(), req.fd_count());
    }

    /// Arbitrary bytes, in arbitrary chunks: only `Ok`/`Err`, and whatever decodes re-encodes
    /// to something that decodes to the same value.
    #[test]
    fn byte_soup_never_panics(
        bytes in vec(any::<u8>(), 0..512),
        cuts in vec(any::<usize>(), 0..8),
    ) {
        soup::<Request>(&bytes, &cuts);
        soup::<Response>(&bytes, &cuts);
    }

    /// Soup that at least has plausible headers: a valid length followed by JSON-ish bytes.
    #[test]
    fn framed_soup_never_panics(
        bodies in vec("[{}\\[\\]\",:a-z0-9 _\\\\]{1,64}", 1..6),
        cuts in vec(any::<usize>(), 0..8),
    ) {
        let mut bytes = Vec::new();
        for b in &bodies {
            bytes.extend_from_slice(&(b.len() as u32).to_be_bytes());
            bytes.extend_from_slice(b.as_bytes());
        }
        soup::<Request>(&bytes, &cuts);
        soup::<Response>(&bytes, &cuts);
    }

    /// A header announcing more than `MAX_FRAME_LEN` is refused as soon as the 4 header bytes
    /// are in, however they arrive and whatever follows, without waiting for the body.
    #[test]
    fn oversized_header_is_refused_before_the_body(
        len in (MAX_FRAME_LEN as u32 + 1)..=u32::MAX,
        split in 0..=HEADER_LEN,
        tail in vec(any::<u8>(), 0..64),
    ) {
        let header = len.to_be_bytes();
        let mut d = Decoder::new();
        d.extend(&header[..split]);
        if split < HEADER_LEN {
            prop_assert_eq!(d.check_header(), Ok(()));
            prop_assert_eq!(d.next_frame(), Ok(None));
            d.extend(&header[split..]);
        }
        let expected = || FrameError::TooLarge(len as usize);
        prop_assert_eq!(d.check_header(), Err(expected()));
        prop_assert_eq!(d.next_frame(), Err(expected()));
        d.extend(&tail);
        prop_assert_eq!(d.check_header(), Err(expected()));
        prop_assert_eq!(d.next_message::<Request>(), Err(expected()));
    }

    /// A header within the limit is accepted, and the frame is held back until it is whole.
    #[test]
    fn frame_is_held_until_whole(
        len in 1..=MAX_FRAME_LEN,
        have in 0usize..1024,
    ) {
        let mut d = Decoder::new();
        d.extend(&(len as u32).to_be_bytes());
        let have = have.min(len - 1);
        d.extend(&vec![b' '; have]);
        prop_assert_eq!(d.check_header(), Ok(()));
        prop_assert_eq!(d.next_frame(), Ok(None));
        prop_assert_eq!(d.buffered(), HEADER_LEN + have);
    }
}

fn soup<T>(bytes: &[u8], cuts: &[usize])
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    points.dedup();
    let mut d = Decoder::new();
    'feed: for w in points.windows(2) {
        d.extend(&bytes[w[0]..w[1]]);
        loop {
            match d.next_message::<T>() {
                Ok(Some(msg)) => {
                    let again = frame::encode(&msg).unwrap();
                    let mut d2 = Decoder::new();
                    d2.extend(&again);
                    assert_eq!(d2.next_message::<T>().unwrap(), Some(msg));
                    assert_eq!(d2.buffered(), 0);
                }
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
    }
}

#[test]
fn documented_examples_decode() {
    let bodies: &[&str] = &[
        r#"{"type": "hello", "version": 1, "client": "warden 0.1.0"}"#,
        r#"{"type": "start",
 "argv": ["cargo", "test"],
 "env": [["PATH", "/usr/bin:/bin"], ["HOME", "/home/alice"]],
 "profile": "default",
 "overrides": {"network": "none", "memory_max": 1073741824, "tasks_max": 64, "timeout_ms": 30000},
 "fds": ["cwd", "stdin", "stdout", "stderr"],
 "pty": null}"#,
        r#"{"type": "signal", "signal": 15}"#,
        r#"{"type": "stop"}"#,
    ];
    let mut d = Decoder::new();
    for b in bodies {
        d.extend(&(b.len() as u32).to_be_bytes());
        d.extend(b.as_bytes());
    }
    let mut n = 0;
    while let Some(req) = d.next_message::<Request>().unwrap() {
        if n == 1 {
            assert_eq!(req.fd_count(), 4);
        }
        n += 1;
    }
    assert_eq!(n, bodies.len());
}
