//! The peer of a connection: its credentials (SO_PEERCRED), a pidfd that pins it against
//! PID reuse (SO_PEERPIDFD), and what /proc says about it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// A process named so that a recycled PID is a different process: (pid, start time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcId {
    /// The PID.
    pub pid: u32,
    /// Start time in clock ticks since boot (field 22 of /proc/PID/stat).
    pub start: u64,
}

/// The fields of /proc/PID/stat that admission uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The process, identified.
    pub id: ProcId,
    /// Its session id (the PID of its session leader).
    pub session: u32,
}

/// Parse the text of /proc/PID/stat. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(pid: u32, text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ")": state(3) ppid(4) pgrp(5) session(6) ... starttime(22).
    let session = fields.get(3)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some(ProcStat {
        id: ProcId { pid, start },
        session,
    })
}

/// Read /proc/PID/stat.
pub fn proc_stat(pid: u32) -> io::Result<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(pid, &text).ok_or_else(|| io::Error::other(format!("unreadable /proc/{pid}/stat")))
}

/// A connected peer.
#[derive(Debug)]
pub struct Peer {
    /// Its PID as the kernel reported it at connect time.
    pub pid: u32,
    /// Its uid.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// A pidfd for it (SO_PEERPIDFD): keeps the identity of `pid` honest.
    pub pidfd: OwnedFd,
    /// Its identity and session.
    pub stat: ProcStat,
}

impl Peer {
    /// Read the peer of `socket`: credentials, pidfd, /proc data — then check the pidfd still
    /// names a live process, so the /proc data read by PID was the peer's own.
    pub fn of(socket: &impl AsFd) -> io::Result<Self> {
        let cred = rustix::net::sockopt::socket_peercred(socket).map_err(io::Error::from)?;
        let pid = u32::try_from(cred.pid.as_raw_nonzero().get())
            .map_err(|_| io::Error::other("peer pid out of range"))?;
        let pidfd = peer_pidfd(socket)?;
        let stat = proc_stat(pid)?;
        if !is_alive(&pidfd) {
            return Err(io::Error::other("peer exited during authentication"));
        }
        Ok(Self {
            pid,
            uid: cred.uid.as_raw(),
            gid: cred.gid.as_raw(),
            pidfd,
            stat,
        })
    }

    /// Whether the peer process still exists (and so `pid` still names it).
    pub fn alive(&self) -> bool {
        is_alive(&self.pidfd)
    }
}

/// Whether the process behind a pidfd is still running (signal 0 through the pidfd).
fn is_alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: pidfd_send_signal with signal 0 only checks for existence; the fd is a valid,
    // owned pidfd for the duration of the call and the siginfo pointer may be null.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0
}

/// SO_PEERPIDFD (Linux 6.5+): a pidfd for the peer as it was at connect time.
fn peer_pidfd(socket: &impl AsFd) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`, a c_int that lives for the
    // call; the socket fd is borrowed and valid.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if fd < 0 {
        return Err(io::Error::other("SO_PEERPIDFD returned no descriptor"));
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let text = "1234 (a) b (c) S 1 1234 1200 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 98765 0 0";
        let s = parse_stat(1234, text);
        assert_eq!(
            s,
            Some(ProcStat {
                id: ProcId {
                    pid: 1234,
                    start: 98765
                },
                session: 1200
            })
        );
        assert_eq!(parse_stat(1, "garbage"), None);
    }

    #[test]
    fn peer_of_a_socketpair_is_us() -> io::Result<()> {
        let (a, _b) = std::os::unix::net::UnixStream::pair()?;
        let peer = Peer::of(&a)?;
        assert_eq!(peer.pid, std::process::id());
        assert_eq!(peer.uid, rustix::process::geteuid().as_raw());
        assert!(peer.alive());
        assert_eq!(peer.stat, proc_stat(std::process::id())?);
        Ok(())
    }
}
