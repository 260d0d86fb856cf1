//! A framed connection over a Unix stream socket, with file descriptors passed as SCM_RIGHTS
//! on the frame that declares them.
//!
//! Reading is done **only** with `recvmsg` (a plain `read` would swallow the byte that
//! carries SCM_RIGHTS, and the kernel would close those descriptors silently). Received
//! descriptors are close-on-exec, and truncated control data is a protocol error.

use std::collections::VecDeque;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::Interest;
use tokio::net::UnixStream;

use crate::frame::{self, Decoder, FrameError};
use crate::message::{DeclaresFds, MAX_FDS_PER_FRAME};

/// Size of one `recvmsg` read.
const READ_CHUNK: usize = 16 * 1024;

/// What can go wrong on a connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The socket failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// A frame was bad.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The peer closed in the middle of a frame.
    #[error("connection closed in the middle of a frame")]
    Truncated,
    /// The kernel truncated the control data: too many descriptors were attached.
    #[error("too many file descriptors attached (control data truncated)")]
    ControlTruncated,
    /// A frame declared more descriptors than were attached to it.
    #[error("frame declares {declared} file descriptors but {attached} were attached")]
    MissingFds {
        /// Declared by the message.
        declared: usize,
        /// Actually received.
        attached: usize,
    },
    /// Descriptors arrived that no frame declared.
    #[error("{0} file descriptors attached to a frame that declares none")]
    UnexpectedFds(usize),
    /// A message declared more descriptors than a frame may carry.
    #[error("a frame may carry at most {MAX_FDS_PER_FRAME} file descriptors, not {0}")]
    TooManyFds(usize),
}

/// A framed, fd-passing connection. `recv` is cancel-safe: dropping its future loses nothing.
#[derive(Debug)]
pub struct Conn {
    stream: UnixStream,
    decoder: Decoder,
    fds: VecDeque<OwnedFd>,
}

impl Conn {
    /// Wrap a connected stream.
    pub fn new(stream: UnixStream) -> Self {
        Self {
            stream,
            decoder: Decoder::new(),
            fds: VecDeque::new(),
        }
    }

    /// The underlying stream (for socket options and peer credentials).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Receive the next message with the descriptors its frame carries. `Ok(None)` is a clean
    /// end of stream between frames.
    pub async fn recv<T: DeserializeOwned + DeclaresFds>(
        &mut self,
    ) -> Result<Option<(T, Vec<OwnedFd>)>, ConnError> {
        loop {
            if let Some(msg) = self.decoder.next_message::<T>()? {
                let fds = self.take_fds(msg.fd_count())?;
                return Ok(Some((msg, fds)));
            }
            self.decoder.check_header()?;
            let (bytes, fds) = self.recv_chunk().await?;
            if bytes.is_empty() {
                if self.decoder.buffered() > 0 {
                    return Err(ConnError::Truncated);
                }
                if !self.fds.is_empty() {
                    return Err(ConnError::UnexpectedFds(self.fds.len()));
                }
                return Ok(None);
            }
            self.decoder.extend(&bytes);
            self.fds.extend(fds);
            if self.fds.len() > 2 * MAX_FDS_PER_FRAME {
                return Err(ConnError::UnexpectedFds(self.fds.len()));
            }
        }
    }

    /// Take the descriptors of a frame that declares `declared` of them.
    fn take_fds(&mut self, declared: usize) -> Result<Vec<OwnedFd>, ConnError> {
        if declared > MAX_FDS_PER_FRAME {
            return Err(ConnError::TooManyFds(declared));
        }
        if self.fds.len() < declared {
            return Err(ConnError::MissingFds {
                declared,
                attached: self.fds.len(),
            });
        }
        let taken: Vec<OwnedFd> = self.fds.drain(..declared).collect();
        // Descriptors left over with no further frame bytes buffered belong to no frame; and
        // since one read ends right after the descriptors that came with it, at most one
        // frame's worth can be waiting for a frame not yet complete. More is a peer hoarding
        // descriptors in the daemon.
        if (self.decoder.buffered() == 0 && !self.fds.is_empty())
            || self.fds.len() > MAX_FDS_PER_FRAME
        {
            return Err(ConnError::UnexpectedFds(self.fds.len()));
        }
        Ok(taken)
    }

    /// One `recvmsg`: the bytes read (empty at end of stream) and the descriptors with them.
    async fn recv_chunk(&self) -> Result<(Vec<u8>, Vec<OwnedFd>), ConnError> {
        let mut data = vec![0u8; READ_CHUNK];
        let mut space =
            [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_FRAME))];
        let (n, fds) = self
            .stream
            .async_io(Interest::READABLE, || {
                let mut control = RecvAncillaryBuffer::new(&mut space);
                let mut iov = [io::IoSliceMut::new(&mut data)];
                let got = rustix::net::recvmsg(
                    &self.stream,
                    &mut iov,
                    &mut control,
                    RecvFlags::CMSG_CLOEXEC,
                )
                .map_err(io::Error::from)?;
                // Collect the descriptors before anything else so that they are owned (and
                // closed on drop) whatever happens next.
                let mut fds = Vec::new();
                for msg in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(rights) = msg {
                        fds.extend(rights);
                    }
                }
                if got.flags.contains(ReturnFlags::CTRUNC) {
                    return Ok(Err(ConnError::ControlTruncated));
                }
                Ok(Ok((got.bytes, fds)))
            })
            .await??;
        data.truncate(n);
        Ok((data, fds))
    }

    /// Send one message, attaching `fds` to its frame.
    pub async fn send<T: Serialize>(
        &self,
        msg: &T,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), ConnError> {
        if fds.len() > MAX_FDS_PER_FRAME {
            return Err(ConnError::TooManyFds(fds.len()));
        }
        let bytes = frame::encode(msg)?;
        let mut sent = 0usize;
        let mut space =
            [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_FRAME))];
        while sent < bytes.len() {
            let n = self
                .stream
                .async_io(Interest::WRITABLE, || {
                    let mut control = SendAncillaryBuffer::new(&mut space);
                    // The descriptors ride on the first byte of the frame, and only there.
                    if sent == 0
                        && !fds.is_empty()
                        && !control.push(SendAncillaryMessage::ScmRights(fds))
                    {
                        return Err(io::Error::other("control buffer too small"));
                    }
                    let iov = [io::IoSlice::new(&bytes[sent..])];
                    rustix::net::sendmsg(&self.stream, &iov, &mut control, SendFlags::NOSIGNAL)
                        .map_err(io::Error::from)
                })
                .await?;
            if n == 0 {
                return Err(ConnError::Io(io::ErrorKind::WriteZero.into()));
            }
            sent += n;
        }
        Ok(())
    }

    /// Send raw bytes (tests use this to send broken frames).
    pub async fn send_raw(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), ConnError> {
        let mut space =
            [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_FRAME))];
        self.stream
            .async_io(Interest::WRITABLE, || {
                let mut control = SendAncillaryBuffer::new(&mut space);
                if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                    return Err(io::Error::other("control buffer too small"));
                }
                let iov = [io::IoSlice::new(bytes)];
                rustix::net::sendmsg(&self.stream, &iov, &mut control, SendFlags::NOSIGNAL)
                    .map_err(io::Error::from)
            })
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{FdRole, Overrides, Request, StartRequest};
    use std::os::fd::AsFd;

    fn start(fds: Vec<FdRole>) -> Request {
        Request::Start(StartRequest {
            argv: vec!["true".into()],
            env: vec![],
            explicit_env: vec![],
            profile: None,
            overrides: Overrides::default(),
            fds,
            pty: None,
        })
    }

    #[tokio::test]
    async fn fds_travel_with_their_frame() -> Result<(), ConnError> {
        let (a, b) = UnixStream::pair()?;
        let (a, mut b) = (Conn::new(a), Conn::new(b));
        let dir = std::fs::File::open("/")?;
        let msg = start(vec![FdRole::Cwd]);
        a.send(&msg, &[dir.as_fd()]).await?;
        a.send(&Request::Stop, &[]).await?;
        let (got, fds) = b.recv::<Request>().await?.ok_or(ConnError::Truncated)?;
        assert_eq!(got, msg);
        assert_eq!(fds.len(), 1);
        let flags = rustix::io::fcntl_getfd(&fds[0]).map_err(io::Error::from)?;
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        let (got, fds) = b.recv::<Request>().await?.ok_or(ConnError::Truncated)?;
        assert_eq!(got, Request::Stop);
        assert!(fds.is_empty());
        drop(a);
        assert!(b.recv::<Request>().await?.is_none());
        Ok(())
    }

    #[tokio::test]
    async fn missing_and_unexpected_fds_are_errors() -> Result<(), ConnError> {
        let (a, b) = UnixStream::pair()?;
        let (a, mut b) = (Conn::new(a), Conn::new(b));
        a.send(&start(vec![FdRole::Cwd]), &[]).await?;
        assert!(matches!(
            b.recv::<Request>().await,
            Err(ConnError::MissingFds {
                declared: 1,
                attached: 0
            })
        ));

        let (a, b) = UnixStream::pair()?;
        let (a, mut b) = (Conn::new(a), Conn::new(b));
        let f = std::fs::File::open("/")?;
        a.send(&Request::Stop, &[f.as_fd()]).await?;
        assert!(matches!(
            b.recv::<Request>().await,
            Err(ConnError::UnexpectedFds(1))
        ));
        Ok(())
    }

    #[tokio::test]
    async fn descriptors_cannot_be_hoarded_across_frames() -> Result<(), ConnError> {
        // Each write carries the end of one frame and the start of the next, with
        // descriptors that no frame declares: the fuzzer's find.
        let (a, b) = UnixStream::pair()?;
        let (a, mut b) = (Conn::new(a), Conn::new(b));
        let stop = frame::encode(&Request::Stop)?;
        let files: Vec<std::fs::File> = (0..8)
            .map(|_| std::fs::File::open("/"))
            .collect::<Result<_, _>>()?;
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        let (head, tail) = stop.split_at(2);
        a.send_raw(head, &[]).await?;
        let mut outcome = Ok(());
        for _ in 0..4 {
            let mut chunk = tail.to_vec();
            chunk.extend_from_slice(head);
            a.send_raw(&chunk, &fds).await?;
            match b.recv::<Request>().await {
                Ok(_) => {}
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        assert!(
            matches!(outcome, Err(ConnError::UnexpectedFds(_))),
            "{outcome:?}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn truncated_frame_is_an_error() -> Result<(), ConnError> {
        let (a, b) = UnixStream::pair()?;
        let (a, mut b) = (Conn::new(a), Conn::new(b));
        a.send_raw(&[0, 0, 0, 10, b'{'], &[]).await?;
        drop(a);
        assert!(matches!(
            b.recv::<Request>().await,
            Err(ConnError::Truncated)
        ));
        Ok(())
    }
}
