//! The code that runs after clone3, in the unit's new namespaces.
//!
//! The clone was made from a multi-threaded tokio process: here only async-signal-safe code
//! runs — raw syscalls on data prepared before the clone ([`ChildArgs`]), no allocation, no
//! locks, no glibc wrappers that talk to other threads (setuid and friends go through
//! `syscall` directly). Every path ends in `execve` or `_exit`.
//!
//! The clone child is PID 1 of the unit's pid namespace: it closes every descriptor it
//! does not need (the clone copied wardend's whole table: the listener, other clients'
//! sockets), builds the view, drops its privileges, forks the command and stays as a tiny
//! init that forwards signals, reaps zombies and reports the command's wait status. It
//! also watches wardend's lifeline, a pipe whose write end only wardend holds: when
//! wardend dies, for any reason, the init exits and the kernel kills every process of its
//! pid namespace. Failures before exec are reported as [`StartFailure`]s on the
//! close-on-exec start pipe.

use std::ffi::{c_char, CStr};
use std::os::fd::RawFd;

use super::mounts::{self, errno, ApplyState, CompiledOp};
use super::report::{StartFailure, Step};
use super::seccomp::{self, Program};
use crate::units::init::{
    close_all_except, close_range, empty_sigset, exec_search, set_signal_mask, supervise,
    write_all, CLOSE_RANGE_CLOEXEC,
};

/// Everything the child needs, prepared before the clone.
pub struct ChildArgs<'a> {
    /// Every descriptor below that the child keeps, sorted; it closes all others first.
    pub keep: &'a [RawFd],
    /// The read end of wardend's lifeline: it hangs up when wardend is gone.
    pub lifeline: RawFd,
    /// `cgroup.procs` of the unit's v1 cgroups, open for writing.
    pub v1_procs: &'a [RawFd],
    /// The mount plan.
    pub mounts: &'a [CompiledOp],
    /// The hostname in the new uts namespace.
    pub hostname: &'a CStr,
    /// Bring `lo` up (a new network namespace with loopback).
    pub loopback: bool,
    /// The cwd the client passed.
    pub cwd_fd: RawFd,
    /// Its path, as seen in the new root.
    pub cwd_path: &'a CStr,
    /// Supplementary groups.
    pub groups: &'a [libc::gid_t],
    /// The uid to run as.
    pub uid: libc::uid_t,
    /// The gid to run as.
    pub gid: libc::gid_t,
    /// stdin, stdout, stderr; -1 for /dev/null.
    pub stdio: [RawFd; 3],
    /// `/dev/null` (in the new root).
    pub dev_null: &'a CStr,
    /// Where to look for the program, in order (execvp's PATH search, made here: inside
    /// the unit's view, as the client).
    pub candidates: &'a [*const c_char],
    /// NULL-terminated argv.
    pub argv: &'a [*const c_char],
    /// NULL-terminated environment.
    pub envp: &'a [*const c_char],
    /// Write end of the start pipe (close-on-exec).
    pub start_fd: RawFd,
    /// Write end of the status pipe.
    pub status_fd: RawFd,
    /// The command's seccomp program.
    pub seccomp: &'a Program<'a>,
}

/// The child's entry point, right after clone3. Signals arrive blocked (the parent blocked
/// them around the clone) so that nothing is lost or run by an inherited handler.
pub fn run(a: &ChildArgs<'_>) -> ! {
    match start_sequence(a) {
        Ok(command) => supervise(a.status_fd, a.lifeline, command),
        Err(failure) => fail(a.start_fd, failure),
    }
}

/// The start sequence, a step a line, in order. Runs as root, PID 1 of the new pid namespace.
fn start_sequence(a: &ChildArgs<'_>) -> Result<libc::pid_t, StartFailure> {
    // First: nothing of wardend's descriptor table but what the unit needs (and never the
    // lifeline's write end, which would keep the unit alive after wardend).
    close_all_except(a.keep).map_err(|e| StartFailure::setup_failed(Step::CloseFds, e))?;
    // Handlers inherited from wardend (tokio's) must never run here.
    reset_signal_dispositions();
    // Cgroups first: every process forked from here on is born in them. (v2: already there
    // through CLONE_INTO_CGROUP.)
    join_v1_cgroups(a.v1_procs)?;
    // The filesystem view, ending with pivot_root: host paths are unreachable after it, so
    // everything that needs one (cgroup files, device nodes) came before.
    let mut view = ApplyState::new();
    for (i, op) in a.mounts.iter().enumerate() {
        mounts::apply(op, &mut view).map_err(|e| StartFailure::mount_failed(i, e))?;
    }
    set_hostname(a.hostname)?;
    if a.loopback {
        loopback_up()?;
    }
    // Enter the cwd by its path in the new root, checked to be the directory the client
    // passed. Not fchdir: the fd points into the old, detached, writable host tree, where
    // `..` would walk out of the view.
    enter_cwd(a.cwd_fd, a.cwd_path)?;
    // Credentials: groups, then gid, then uid (after setuid the others cannot change).
    drop_privileges(a.groups, a.gid, a.uid)?;
    // After the drop: no exec may give privileges back (setuid binaries, file caps).
    set_no_new_privs()?;
    // The init, as the command's uid, must not be ptrace-able by the command.
    set_not_dumpable();
    // rlimits would go here (the spec has none yet); seccomp right before exec, in the
    // command (the init stays unfiltered: it only waits, reaps and forwards signals).
    fork_command(a)
}

/// The command: stdio, close the rest, signals back to normal, exec.
fn command(a: &ChildArgs<'_>) -> ! {
    // A session of its own: the unit's init is not its session leader.
    // SAFETY: setsid has no memory arguments.
    unsafe { libc::setsid() };
    if let Err(e) = setup_stdio(a.stdio, a.dev_null) {
        fail(a.start_fd, StartFailure::setup_failed(Step::Stdio, e));
    }
    // Every other descriptor closes at exec; the start pipe must survive until then to
    // report an exec failure, so mark close-on-exec rather than close.
    if let Err(e) = close_range(3, u32::MAX, CLOSE_RANGE_CLOEXEC) {
        fail(a.start_fd, StartFailure::setup_failed(Step::CloseFds, e));
    }
    // Dispositions are default already: unblock everything.
    set_signal_mask(&empty_sigset());
    // Last before exec, so that no step of the start sequence depends on what the filter
    // allows (it is inherited by everything the command starts).
    if let Err(e) = seccomp::apply(a.seccomp) {
        fail(a.start_fd, StartFailure::setup_failed(Step::Seccomp, e));
    }
    fail(
        a.start_fd,
        StartFailure::exec_failed(exec_search(a.candidates, a.argv, a.envp)),
    )
}

/// Report `failure` on the start pipe and exit.
fn fail(start_fd: RawFd, failure: StartFailure) -> ! {
    write_all(start_fd, &failure.encode());
    // SAFETY: _exit ends the process; nothing to unwind.
    unsafe { libc::_exit(127) }
}

fn reset_signal_dispositions() {
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: setting SIG_DFL involves no handler code; invalid numbers (glibc's
            // reserved ones) just fail with EINVAL.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
}

fn join_v1_cgroups(procs: &[RawFd]) -> Result<(), StartFailure> {
    for &fd in procs {
        // "0" is the writer itself.
        // SAFETY: a two-byte literal.
        if unsafe { libc::write(fd, c"0".as_ptr().cast(), 1) } != 1 {
            return Err(StartFailure::setup_failed(Step::JoinCgroup, errno()));
        }
    }
    Ok(())
}

fn set_hostname(name: &CStr) -> Result<(), StartFailure> {
    // SAFETY: a valid C string and its length.
    let r = unsafe { libc::sethostname(name.as_ptr(), name.to_bytes().len()) };
    ok(r, Step::Hostname)
}

/// `struct ifreq` with the flags member of its union (40 bytes on 64-bit).
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    pad: [u8; 22],
}

fn loopback_up() -> Result<(), StartFailure> {
    // SAFETY: socket with plain integers.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    ok(sock, Step::Loopback)?;
    let mut req = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        pad: [0; 22],
    };
    req.name[0] = b'l';
    req.name[1] = b'o';
    // SAFETY: `req` is an ifreq-sized struct on our stack, read and written by the kernel.
    let r = unsafe { libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req as *mut IfReqFlags) };
    let r = if r < 0 {
        r
    } else {
        req.flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        // SAFETY: as above.
        unsafe { libc::ioctl(sock, libc::SIOCSIFFLAGS, &req as *const IfReqFlags) }
    };
    let e = errno();
    // SAFETY: our socket, closed once.
    unsafe { libc::close(sock) };
    if r < 0 {
        return Err(StartFailure::setup_failed(Step::Loopback, e));
    }
    Ok(())
}

fn enter_cwd(cwd_fd: RawFd, cwd_path: &CStr) -> Result<(), StartFailure> {
    // SAFETY: a valid C string.
    ok(unsafe { libc::chdir(cwd_path.as_ptr()) }, Step::Chdir)?;
    // SAFETY: zeroed stat structs are valid; fstat/stat fill them.
    let (mut passed, mut here): (libc::stat, libc::stat) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: valid fd number (or EBADF) and a stat struct on our stack.
    ok(unsafe { libc::fstat(cwd_fd, &mut passed) }, Step::Chdir)?;
    // SAFETY: a C string literal and a stat struct on our stack.
    ok(unsafe { libc::stat(c".".as_ptr(), &mut here) }, Step::Chdir)?;
    if (passed.st_dev, passed.st_ino) != (here.st_dev, here.st_ino) {
        return Err(StartFailure::setup_failed(Step::CwdMismatch, libc::ESTALE));
    }
    Ok(())
}

fn drop_privileges(
    groups: &[libc::gid_t],
    gid: libc::gid_t,
    uid: libc::uid_t,
) -> Result<(), StartFailure> {
    // Raw syscalls: glibc's wrappers would try to change every thread of the parent's.
    // SAFETY: `groups` is a valid slice of gid_t for its length.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    ok(r as i32, Step::Setgroups)?;
    // SAFETY: plain integers.
    let r = unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) };
    ok(r as i32, Step::Setgid)?;
    // SAFETY: plain integers.
    let r = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
    ok(r as i32, Step::Setuid)
}

fn set_no_new_privs() -> Result<(), StartFailure> {
    // SAFETY: prctl with plain integers.
    ok(
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) },
        Step::NoNewPrivs,
    )
}

fn set_not_dumpable() {
    // SAFETY: prctl with plain integers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
}

fn fork_command(a: &ChildArgs<'_>) -> Result<libc::pid_t, StartFailure> {
    // A raw fork: glibc's fork() would run atfork handlers and take locks of the parent's
    // threads.
    // SAFETY: clone with SIGCHLD and no stack is fork; the child only runs `command`, which
    // keeps to async-signal-safe calls and ends in execve or _exit.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) };
    match pid {
        -1 => Err(StartFailure::setup_failed(Step::Fork, errno())),
        0 => command(a),
        pid => Ok(pid as libc::pid_t),
    }
}

fn setup_stdio(stdio: [RawFd; 3], dev_null: &CStr) -> Result<(), i32> {
    // First every source to a fresh fd >= 3 (a source may itself be 0, 1 or 2), then dup2 into
    // place (dup2 clears close-on-exec on the target; the copies go at exec).
    let mut null = -1;
    let mut copies = [-1; 3];
    for (copy, &fd) in copies.iter_mut().zip(stdio.iter()) {
        let src = if fd >= 0 {
            fd
        } else {
            if null < 0 {
                // SAFETY: a valid C string.
                null = unsafe { libc::open(dev_null.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
                if null < 0 {
                    return Err(errno());
                }
            }
            null
        };
        // SAFETY: fcntl on an fd number; failure is reported.
        *copy = unsafe { libc::fcntl(src, libc::F_DUPFD_CLOEXEC, 3) };
        if *copy < 0 {
            return Err(errno());
        }
    }
    for (target, &copy) in copies.iter().enumerate() {
        // SAFETY: dup2 on fd numbers.
        if unsafe { libc::dup2(copy, target as RawFd) } < 0 {
            return Err(errno());
        }
    }
    Ok(())
}

fn ok(ret: i32, step: Step) -> Result<(), StartFailure> {
    if ret < 0 {
        Err(StartFailure::setup_failed(step, errno()))
    } else {
        Ok(())
    }
}
