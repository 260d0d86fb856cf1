//! The unit's init — PID 1 of a unit's own pid namespace, on both backends (the native
//! child after its start sequence; the systemd backend's exec shim after it entered its
//! namespaces) — and the pieces of exec they share: execvp's search, descriptor hygiene,
//! signal masks.
//!
//! Everything here is async-signal-safe (raw syscalls on memory prepared beforehand, no
//! allocation, no locks): the native child runs it right after a clone from a
//! multi-threaded process.

use std::ffi::c_char;
use std::os::fd::RawFd;

use super::native::mounts::errno;
use super::native::report::CommandStatus;

/// execvp's search: try each candidate; go on past one that is missing or not executable,
/// stop at any other error. Returns the errno to report (only if nothing could be run):
/// EACCES if a candidate existed but could not be executed, else the last error.
pub fn exec_search(
    candidates: &[*const c_char],
    argv: &[*const c_char],
    envp: &[*const c_char],
) -> i32 {
    let mut result = libc::ENOENT;
    for &path in candidates {
        // SAFETY: `path` is a C string; argv and envp are NULL-terminated arrays of C
        // strings, prepared by the caller and alive for the call.
        unsafe { libc::execve(path, argv.as_ptr(), envp.as_ptr()) };
        match errno() {
            libc::EACCES => result = libc::EACCES,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            other => return other,
        }
    }
    result
}

/// The unit's init after the command was forked: forward every signal to the command,
/// reap every child, and when the command ended report its wait status on `status_fd` and
/// exit (which kills whatever is left in the pid namespace). When `lifeline` (if not -1)
/// hangs up, exit at once: the kernel then kills every process of the unit.
pub fn supervise(status_fd: RawFd, lifeline: RawFd, command: libc::pid_t) -> ! {
    // Init holds nothing but the status pipe and the lifeline (the start pipe closes here:
    // once the command has exec'd too, wardend reads EOF).
    let mut keep = [status_fd, lifeline];
    keep.sort_unstable();
    let _ = close_all_except(&keep);
    let all = full_sigset();
    // Signals stay blocked; they are read from a signalfd, polled with the lifeline.
    // SAFETY: `all` is an initialised sigset; 8 is the kernel's sigset size.
    let sfd = unsafe { libc::syscall(libc::SYS_signalfd4, -1, &all, 8usize, libc::SFD_CLOEXEC) };
    if sfd < 0 {
        // Without a signalfd, nothing can be forwarded: end the unit rather than run it
        // unsupervised.
        // SAFETY: _exit ends the process; nothing to unwind.
        unsafe { libc::_exit(125) };
    }
    let sfd = sfd as RawFd;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: lifeline,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is an array of two pollfds on our stack.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            continue; // EINTR
        }
        if fds[1].revents != 0 {
            // wardend is gone (its end of the pipe closed): take the unit with us.
            // SAFETY: _exit ends the process; the kernel kills the pid namespace.
            unsafe { libc::_exit(137) };
        }
        if fds[0].revents & libc::POLLIN != 0 {
            forward_signals(sfd, status_fd, command);
        }
    }
}

/// Read what the signalfd holds: reap on SIGCHLD, forward everything else to the command.
fn forward_signals(sfd: RawFd, status_fd: RawFd, command: libc::pid_t) {
    // SAFETY: a zeroed signalfd_siginfo array is valid for read(2) to fill.
    let mut infos: [libc::signalfd_siginfo; 8] = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of_val(&infos);
    // SAFETY: `infos` is a writable buffer of `size` bytes.
    let n = unsafe { libc::read(sfd, infos.as_mut_ptr().cast(), size) };
    if n <= 0 {
        return;
    }
    let count = n as usize / std::mem::size_of::<libc::signalfd_siginfo>();
    for info in infos.iter().take(count) {
        let sig = info.ssi_signo as i32;
        if sig == libc::SIGCHLD {
            reap(status_fd, command);
        } else {
            // SAFETY: kill with plain integers.
            unsafe { libc::kill(command, sig) };
        }
    }
}

/// Close every descriptor but those in `keep` (sorted, no duplicates needed).
pub fn close_all_except(keep: &[RawFd]) -> Result<(), i32> {
    let mut next: u32 = 0;
    for &fd in keep {
        let Ok(fd) = u32::try_from(fd) else { continue };
        if fd > next {
            close_range(next, fd - 1, 0)?;
        }
        next = next.max(fd.saturating_add(1));
    }
    close_range(next, u32::MAX, 0)
}

fn reap(status_fd: RawFd, command: libc::pid_t) {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid int on our stack.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        if pid == command {
            write_all(status_fd, &CommandStatus(status).encode());
            // SAFETY: _exit ends the process; nothing to unwind.
            unsafe { libc::_exit(0) };
        }
    }
}

pub fn write_all(fd: RawFd, mut buf: &[u8]) {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid slice for its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            return;
        }
        buf = buf.get(n as usize..).unwrap_or_default();
    }
}

pub const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;

pub fn close_range(first: u32, last: u32, flags: u32) -> Result<(), i32> {
    // SAFETY: close_range with plain integers; closing fds we own in this process only.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// A set of every signal.
pub fn full_sigset() -> libc::sigset_t {
    // SAFETY: sigfillset initialises the zeroed set on our stack.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        set
    }
}

pub fn empty_sigset() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the zeroed set on our stack.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        set
    }
}

/// Set the calling thread's signal mask; returns the old one.
pub fn set_signal_mask(set: &libc::sigset_t) -> libc::sigset_t {
    let mut old = empty_sigset();
    // SAFETY: both sets are valid sigsets on our stack / borrowed.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, set, &mut old) };
    old
}
