//! systemd's private socket (`/run/systemd/private`) as a zbus socket.
//!
//! Two things keep zbus's own Unix transport from talking to it:
//! - systemd stamps every message it sends on a private connection with the sender
//!   `org.freedesktop.systemd1` (`sd_bus_set_sender`), a well-known name, and zbus 6 rejects
//!   any message whose sender is not a unique name. [`Reader`] rewrites that one header value,
//!   in place and at the same length, to the unique name [`PATCHED_SENDER`].
//! - So the bytes are ours to read, the SASL handshake is done here too ([`authenticate`]),
//!   and the connection is built with `Builder::authenticated_socket`. zbus's own handshake
//!   would also send `BEGIN` and the first message back to back, which systemd 252 can leave
//!   unanswered (see [`authenticate`]).
//!
//! File descriptors (the units' stdio) are sent with `SCM_RIGHTS` on the first byte of the
//! message that carries them; systemd sends none back, and any it did would be handed to zbus
//! with the next bytes read.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;
use zbus::connection::socket::{ReadHalf, Socket, Split, WriteHalf};
use zbus::export::async_trait::async_trait;

/// The sender systemd puts on messages sent over its private socket.
const SYSTEMD_SENDER: &[u8] = b"org.freedesktop.systemd1";
/// What it is rewritten to: a valid unique name of the same length.
pub(super) const PATCHED_SENDER: &[u8] = b":org.freedesktop.systemd";
/// The `SENDER` header field code.
const FIELD_SENDER: u8 = 7;
/// Length of the fixed part of a message header, up to and including the fields' length.
const FIXED_HEADER: usize = 16;
/// The largest message D-Bus allows.
const MAX_MESSAGE: usize = 128 << 20;
/// Most descriptors taken in one `recvmsg` or attached to one `sendmsg`.
const MAX_FDS: usize = 16;
/// Size of one read.
const READ_CHUNK: usize = 16 * 1024;
/// Longest SASL line accepted from systemd.
const MAX_SASL_LINE: usize = 512;

/// Authenticate on a freshly connected `stream` (EXTERNAL with our uid, `NEGOTIATE_UNIX_FD`,
/// `BEGIN`); return the server's GUID.
///
/// The three commands go out in one write, as sd-bus's own clients send them, and the first
/// message only after both answers are in. systemd must not receive `BEGIN` and a message in
/// the same read: it then leaves the message in its buffer and does not answer it until more
/// bytes arrive (seen with systemd 252: a `Subscribe()` that never returned).
pub(super) async fn authenticate(stream: &UnixStream) -> io::Result<String> {
    let uid: String = rustix::process::geteuid()
        .as_raw()
        .to_string()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    write_all(
        stream,
        format!("\0AUTH EXTERNAL {uid}\r\nNEGOTIATE_UNIX_FD\r\nBEGIN\r\n").as_bytes(),
    )
    .await?;
    let ok = read_line(stream).await?;
    let guid = ok
        .strip_prefix("OK ")
        .ok_or_else(|| io::Error::other(format!("systemd refused authentication: {ok:?}")))?
        .to_string();
    let agreed = read_line(stream).await?;
    if agreed != "AGREE_UNIX_FD" {
        return Err(io::Error::other(format!(
            "systemd refused file descriptor passing: {agreed:?}"
        )));
    }
    Ok(guid)
}

/// Write all of `bytes` (no descriptors).
async fn write_all(stream: &UnixStream, bytes: &[u8]) -> io::Result<()> {
    let mut sent = 0;
    while sent < bytes.len() {
        stream.writable().await?;
        match stream.try_write(&bytes[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read one `\r\n`-terminated SASL line, a byte at a time so as not to read past it (systemd
/// sends nothing after its last handshake line until asked, but be exact anyway).
async fn read_line(stream: &UnixStream) -> io::Result<String> {
    let mut line = Vec::new();
    while !line.ends_with(b"\r\n") {
        if line.len() > MAX_SASL_LINE {
            return Err(io::Error::other("SASL line too long"));
        }
        let mut byte = [0u8; 1];
        stream.readable().await?;
        match stream.try_read(&mut byte) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| io::Error::other("SASL line is not UTF-8"))
}

/// An authenticated connection to systemd's private socket.
#[derive(Debug)]
pub(super) struct PrivateSocket(pub(super) Arc<UnixStream>);

impl Socket for PrivateSocket {
    type ReadHalf = Reader;
    type WriteHalf = Writer;

    fn split(self) -> Split<Reader, Writer> {
        Split::new(
            Reader {
                stream: self.0.clone(),
                pending: Vec::new(),
                ready: 0,
                fds: Vec::new(),
            },
            Writer(self.0),
        )
    }
}

/// The read half: hands zbus whole messages, each with its sender rewritten.
#[derive(Debug)]
pub(super) struct Reader {
    stream: Arc<UnixStream>,
    /// Bytes read from the socket and not yet handed to zbus.
    pending: Vec<u8>,
    /// How many bytes at the front of `pending` belong to a message already rewritten.
    ready: usize,
    /// Descriptors received and not yet handed to zbus.
    fds: Vec<OwnedFd>,
}

impl Reader {
    /// One `recvmsg` into `pending`; returns the number of bytes (0 at end of stream).
    async fn read_more(&mut self) -> io::Result<usize> {
        let mut data = vec![0u8; READ_CHUNK];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let stream = &self.stream;
        let (n, fds) = stream
            .async_io(Interest::READABLE, || {
                let mut control = RecvAncillaryBuffer::new(&mut space);
                let mut iov = [io::IoSliceMut::new(&mut data)];
                let got = rustix::net::recvmsg(
                    &**stream,
                    &mut iov,
                    &mut control,
                    RecvFlags::CMSG_CLOEXEC,
                )
                .map_err(io::Error::from)?;
                // Own the descriptors first, so that they are closed whatever happens next.
                let mut fds = Vec::new();
                for msg in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(rights) = msg {
                        fds.extend(rights);
                    }
                }
                if got.flags.contains(ReturnFlags::CTRUNC) {
                    return Err(io::Error::other("file descriptors truncated"));
                }
                Ok((got.bytes, fds))
            })
            .await?;
        self.pending.extend_from_slice(&data[..n]);
        self.fds.extend(fds);
        Ok(n)
    }
}

#[async_trait]
impl ReadHalf for Reader {
    async fn recvmsg(&mut self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        while self.ready == 0 {
            if let Some(len) = message_len(&self.pending)? {
                if self.pending.len() >= len {
                    patch_sender(&mut self.pending[..len]);
                    self.ready = len;
                    break;
                }
            }
            if self.read_more().await? == 0 {
                if self.pending.is_empty() {
                    return Ok((0, Vec::new()));
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "systemd closed the connection mid-message",
                ));
            }
        }
        let n = buf.len().min(self.ready);
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        self.ready -= n;
        Ok((n, std::mem::take(&mut self.fds)))
    }

    fn can_pass_unix_fd(&self) -> bool {
        true
    }
}

/// The write half: plain `sendmsg`, descriptors on the first byte.
#[derive(Debug)]
pub(super) struct Writer(Arc<UnixStream>);

#[async_trait]
impl WriteHalf for Writer {
    async fn sendmsg(&mut self, buffer: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
        if fds.len() > MAX_FDS {
            return Err(io::Error::other(format!(
                "{} file descriptors in one message",
                fds.len()
            )));
        }
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let stream = &self.0;
        stream
            .async_io(Interest::WRITABLE, || {
                let mut control = SendAncillaryBuffer::new(&mut space);
                if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                    return Err(io::Error::other("control buffer too small"));
                }
                let iov = [io::IoSlice::new(buffer)];
                rustix::net::sendmsg(&**stream, &iov, &mut control, SendFlags::NOSIGNAL)
                    .map_err(io::Error::from)
            })
            .await
    }

    async fn close(&mut self) -> io::Result<()> {
        rustix::net::shutdown(&*self.0, rustix::net::Shutdown::Write).map_err(io::Error::from)
    }

    fn can_pass_unix_fd(&self) -> bool {
        true
    }
}

/// Read a `u32` at `at` in the message's byte order.
fn u32_at(msg: &[u8], at: usize, little: bool) -> Option<u32> {
    let bytes: [u8; 4] = msg.get(at..at + 4)?.try_into().ok()?;
    Some(if little {
        u32::from_le_bytes(bytes)
    } else {
        u32::from_be_bytes(bytes)
    })
}

/// Round `n` up to a multiple of `to`.
fn align(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// The length of the message `bytes` starts with, once its fixed header is in.
fn message_len(bytes: &[u8]) -> io::Result<Option<usize>> {
    if bytes.len() < FIXED_HEADER {
        return Ok(None);
    }
    let little = match bytes[0] {
        b'l' => true,
        b'B' => false,
        other => {
            return Err(io::Error::other(format!(
                "bad endianness byte {other:#x} from systemd"
            )))
        }
    };
    let body = u32_at(bytes, 4, little).unwrap_or(0) as usize;
    let fields = u32_at(bytes, 12, little).unwrap_or(0) as usize;
    let len = align(FIXED_HEADER + fields, 8) + body;
    if len > MAX_MESSAGE {
        return Err(io::Error::other(format!(
            "message of {len} bytes from systemd"
        )));
    }
    Ok(Some(len))
}

/// Rewrite a `SENDER` field whose value is [`SYSTEMD_SENDER`] to [`PATCHED_SENDER`]. Walks
/// the header fields; stops (leaving the message as it is, for zbus to judge) at anything it
/// does not expect.
pub(super) fn patch_sender(msg: &mut [u8]) {
    let Some(little) = msg.first().map(|&b| b == b'l') else {
        return;
    };
    let Some(fields_len) = u32_at(msg, 12, little) else {
        return;
    };
    let end = FIXED_HEADER + fields_len as usize;
    let mut at = FIXED_HEADER;
    while at < end {
        at = align(at, 8);
        // code, signature length (1), type, NUL
        let (Some(&code), Some(&1), Some(&ty), Some(&0)) = (
            msg.get(at),
            msg.get(at + 1),
            msg.get(at + 2),
            msg.get(at + 3),
        ) else {
            return;
        };
        at += 4;
        match ty {
            b's' | b'o' => {
                at = align(at, 4);
                let Some(len) = u32_at(msg, at, little) else {
                    return;
                };
                let start = at + 4;
                let stop = start + len as usize;
                if code == FIELD_SENDER && msg.get(start..stop) == Some(SYSTEMD_SENDER) {
                    msg[start..stop].copy_from_slice(PATCHED_SENDER);
                    return;
                }
                at = stop + 1;
            }
            b'g' => {
                let Some(&len) = msg.get(at) else { return };
                at += 1 + usize::from(len) + 1;
            }
            b'u' => at = align(at, 4) + 4,
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zbus::message::Message;

    #[test]
    fn the_systemd_sender_becomes_a_unique_name() -> Result<(), Box<dyn std::error::Error>> {
        // Build a message whose sender is a 24-byte unique name, then write systemd's
        // well-known name over it: that is what systemd's messages look like.
        let msg = Message::signal(
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "UnitRemoved",
        )
        .sender(std::str::from_utf8(PATCHED_SENDER)?)
        .build(&("warden-0123456789abcdef.service",))?;
        let mut bytes = msg.data().to_vec();
        let at = bytes
            .windows(PATCHED_SENDER.len())
            .position(|w| w == PATCHED_SENDER)
            .ok_or("no sender")?;
        bytes[at..at + SYSTEMD_SENDER.len()].copy_from_slice(SYSTEMD_SENDER);
        assert_eq!(message_len(&bytes)?, Some(bytes.len()));

        patch_sender(&mut bytes);
        assert_eq!(bytes, msg.data().to_vec());
        Ok(())
    }

    #[test]
    fn other_senders_are_left_alone() -> Result<(), Box<dyn std::error::Error>> {
        let msg = Message::signal("/a", "a.b", "C")
            .sender(":1.5")
            .build(&(1u32,))?;
        let mut bytes = msg.data().to_vec();
        patch_sender(&mut bytes);
        assert_eq!(bytes, msg.data().to_vec());
        Ok(())
    }
}
