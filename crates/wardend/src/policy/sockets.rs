//! The host's bound Unix sockets, from the kernel's own list (sock_diag, as `ss -x` reads
//! it): every pathname socket of the host's network namespace with the inode it is bound
//! to. A unit's view covers each one it could otherwise reach by path — `connect(2)` works
//! on a read-only mount, so a socket is out of reach only where it is covered.
//!
//! Read-only: one netlink dump, no change to the system.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

/// A Unix socket bound to a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundSocket {
    /// The path it was bound to, as the binder gave it (absolute ones only are kept).
    pub path: PathBuf,
    /// `st_dev` of the socket's inode.
    pub dev: u64,
    /// The low 32 bits of the inode number (what the kernel reports).
    pub ino32: u32,
}

impl BoundSocket {
    /// Whether `meta` (of a file found at some path) is this socket's inode.
    pub fn is(&self, meta: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        meta.dev() == self.dev && (meta.ino() & 0xffff_ffff) as u32 == self.ino32
    }
}

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const UDIAG_SHOW_NAME: u32 = 0x1;
const UDIAG_SHOW_VFS: u32 = 0x2;
const UNIX_DIAG_NAME: u16 = 0;
const UNIX_DIAG_VFS: u16 = 1;
/// `struct nlmsghdr`.
const NLMSG_HDRLEN: usize = 16;
/// `struct unix_diag_msg`.
const UNIX_DIAG_MSG_LEN: usize = 16;

/// Every socket bound to an absolute path in this network namespace.
pub fn bound() -> io::Result<Vec<BoundSocket>> {
    // SAFETY: socket(2) with plain integers; the result is checked.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socket(2) just returned this descriptor; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    send_request(&sock)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: `buf` is a writable buffer of the length passed.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let chunk = buf.get(..n as usize).unwrap_or_default();
        if n == 0 || parse_messages(chunk, &mut out)? {
            return Ok(out);
        }
    }
}

fn send_request(sock: &OwnedFd) -> io::Result<()> {
    let mut req = Vec::with_capacity(NLMSG_HDRLEN + 24);
    let len = (NLMSG_HDRLEN + 24) as u32;
    req.extend_from_slice(&len.to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // seq
    req.extend_from_slice(&0u32.to_ne_bytes()); // pid
                                                // struct unix_diag_req
    req.push(libc::AF_UNIX as u8);
    req.push(0); // protocol
    req.extend_from_slice(&0u16.to_ne_bytes()); // pad
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    req.extend_from_slice(&0u32.to_ne_bytes()); // ino
    req.extend_from_slice(&(UDIAG_SHOW_NAME | UDIAG_SHOW_VFS).to_ne_bytes());
    req.extend_from_slice(&[0u8; 8]); // cookie
                                      // SAFETY: a zeroed sockaddr_nl is valid (pid 0: the kernel).
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `req` and `addr` are valid for the lengths passed.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Parse one datagram of netlink messages; `Ok(true)` at the end of the dump.
fn parse_messages(mut b: &[u8], out: &mut Vec<BoundSocket>) -> io::Result<bool> {
    let garbled = || io::Error::other("garbled sock_diag reply");
    while b.len() >= NLMSG_HDRLEN {
        let len = u32_at(b, 0).ok_or_else(garbled)? as usize;
        let kind = u16_at(b, 4).ok_or_else(garbled)?;
        if len < NLMSG_HDRLEN || len > b.len() {
            return Err(garbled());
        }
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = u32_at(b, NLMSG_HDRLEN).ok_or_else(garbled)? as i32;
                return Err(io::Error::from_raw_os_error(-errno));
            }
            _ => {
                if let Some(s) = parse_socket(b.get(NLMSG_HDRLEN..len).ok_or_else(garbled)?) {
                    out.push(s);
                }
            }
        }
        b = b.get(align4(len).min(b.len())..).unwrap_or_default();
    }
    Ok(false)
}

/// A `unix_diag_msg` and its attributes; `None` unless bound to an absolute path.
fn parse_socket(msg: &[u8]) -> Option<BoundSocket> {
    let mut attrs = msg.get(UNIX_DIAG_MSG_LEN..)?;
    let (mut path, mut vfs) = (None, None);
    while attrs.len() >= 4 {
        let len = usize::from(u16_at(attrs, 0)?);
        let kind = u16_at(attrs, 2)?;
        let data = attrs.get(4..len)?;
        match kind {
            UNIX_DIAG_NAME => path = Some(data),
            UNIX_DIAG_VFS => vfs = Some((u32_at(data, 0)?, u32_at(data, 4)?)),
            _ => {}
        }
        attrs = attrs.get(align4(len).min(attrs.len())..)?;
    }
    let path = path?;
    // Abstract sockets start with NUL; relative names cannot be placed.
    let path = path
        .split(|&c| c == 0)
        .next()
        .filter(|p| p.first() == Some(&b'/'))?;
    let (ino32, kdev) = vfs?;
    Some(BoundSocket {
        path: PathBuf::from(std::ffi::OsStr::from_bytes(path)),
        // The kernel's own dev_t: 12 bits of major above 20 bits of minor.
        dev: libc::makedev(kdev >> 20, kdev & 0xf_ffff),
        ino32,
    })
}

use std::os::unix::ffi::OsStrExt;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_bound_here_is_listed_with_its_inode() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("listening.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path)?;
        let dgram_path = dir.path().join("dgram.sock");
        let _dgram = std::os::unix::net::UnixDatagram::bind(&dgram_path)?;
        let all = bound()?;
        for p in [&path, &dgram_path] {
            let meta = std::fs::metadata(p)?;
            let found = all.iter().find(|s| &s.path == p);
            assert!(found.is_some_and(|s| s.is(&meta)), "{p:?} in {all:?}");
        }
        Ok(())
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let mut out = Vec::new();
        assert!(parse_messages(&[0xff; 20], &mut out).is_err());
        assert!(parse_messages(&[1, 0, 0, 0, 3, 0], &mut out).is_ok());
        assert!(parse_socket(&[0; 15]).is_none());
        assert!(parse_socket(&[0; 24]).is_none());
    }
}
