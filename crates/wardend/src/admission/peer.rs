//! The peer of a connection: its credentials (SO_PEERCRED), a pidfd that pins it against
//! PID reuse, and what /proc says about it.
//!
//! The pidfd comes from SO_PEERPIDFD (Linux 6.5+): the very process that connected. Before
//! 6.5, from `pidfd_open` on the SO_PEERCRED pid — which, if the peer has exited, may name
//! a newer process that reused the pid. That one started after the connection was made:
//! a process whose start time (in clock ticks since boot) is later than the moment the
//! connection was taken up is refused, so identity holds on either kernel.

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
    /// A pidfd for it: keeps the identity of `pid` honest.
    pub pidfd: OwnedFd,
    /// Its identity and session.
    pub stat: ProcStat,
}

impl Peer {
    /// Read the peer of `socket`: credentials, pidfd, /proc data — then check the pidfd still
    /// names a live process, so the /proc data read by PID was the peer's own.
    pub fn of(socket: &impl AsFd) -> io::Result<Self> {
        // The peer connected before this instant (the connection was just accepted).
        Self::read(socket, PidfdSource::Kernel, boot_ticks()?)
    }

    /// [`Peer::of`], pinning the peer with `pidfd_open` as on a kernel without
    /// SO_PEERPIDFD (tests use it to drive that path on any kernel).
    pub fn of_without_peerpidfd(socket: &impl AsFd) -> io::Result<Self> {
        Self::of_without_peerpidfd_since(socket, boot_ticks()?)
    }

    /// [`Peer::of_without_peerpidfd`] for a connection taken up at `taken_up` (clock ticks
    /// since boot): a process started later is not the peer.
    pub fn of_without_peerpidfd_since(socket: &impl AsFd, taken_up: u64) -> io::Result<Self> {
        Self::read(socket, PidfdSource::Open, taken_up)
    }

    fn read(socket: &impl AsFd, source: PidfdSource, taken_up: u64) -> io::Result<Self> {
        let cred = rustix::net::sockopt::socket_peercred(socket).map_err(io::Error::from)?;
        let pid = u32::try_from(cred.pid.as_raw_nonzero().get())
            .map_err(|_| io::Error::other("peer pid out of range"))?;
        let pidfd = match source {
            PidfdSource::Kernel => match peer_pidfd(socket) {
                // Before Linux 6.5.
                Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => pidfd_open(pid)?,
                r => r?,
            },
            PidfdSource::Open => pidfd_open(pid)?,
        };
        let stat = proc_stat(pid)?;
        if !is_alive(&pidfd) {
            return Err(io::Error::other("peer exited during authentication"));
        }
        if stat.id.start > taken_up {
            return Err(io::Error::other(
                "peer exited and its pid was reused before authentication",
            ));
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

/// Where the pidfd comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PidfdSource {
    /// SO_PEERPIDFD when the kernel has it, else `pidfd_open`.
    Kernel,
    /// `pidfd_open` on the SO_PEERCRED pid.
    Open,
}

/// Now, in clock ticks since boot (the unit of a process's start time in /proc).
pub fn boot_ticks() -> io::Result<u64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec on our stack.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: sysconf with a plain name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|h| *h > 0).unwrap_or(100);
    let secs = u64::try_from(now.tv_sec).map_err(|_| io::Error::other("bad boot time"))?;
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    // Rounded up: a process started within the current tick may be the peer.
    Ok(secs * hz + (nanos * hz).div_ceil(1_000_000_000))
}

/// `pidfd_open(2)` (Linux 5.3+).
fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open with a plain pid and flags 0.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("bad pidfd"))?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
    fn peer_of_a_socketpair_is_us_on_either_kernel_path() -> io::Result<()> {
        let (a, _b) = std::os::unix::net::UnixStream::pair()?;
        for peer in [Peer::of(&a)?, Peer::of_without_peerpidfd(&a)?] {
            assert_eq!(peer.pid, std::process::id());
            assert_eq!(peer.uid, rustix::process::geteuid().as_raw());
            assert!(peer.alive());
            assert_eq!(peer.stat, proc_stat(std::process::id())?);
        }
        Ok(())
    }

    #[test]
    fn a_peer_that_exited_is_refused_on_either_kernel_path() -> io::Result<()> {
        // A child connects and exits: the socket's peer is gone (and reaped).
        let listener_dir = tempfile::tempdir()?;
        let path = listener_dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&path)?;
        let mut child = std::process::Command::new("python3")
            .arg("-c")
            .arg("import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])")
            .arg(&path)
            .spawn()?;
        let (conn, _) = listener.accept()?;
        child.wait()?;
        for read in [Peer::of, Peer::of_without_peerpidfd] {
            assert!(read(&conn).is_err());
        }
        Ok(())
    }

    #[test]
    fn boot_ticks_are_after_our_own_start() -> io::Result<()> {
        assert!(proc_stat(std::process::id())?.id.start <= boot_ticks()?);
        Ok(())
    }
}
