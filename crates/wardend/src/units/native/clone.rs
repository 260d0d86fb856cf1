//! A thin wrapper over clone3(2): new namespaces, a pidfd, and on cgroup v2 birth directly in
//! the unit's cgroup (`CLONE_INTO_CGROUP`), so not one instruction of the child runs outside it.

use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `struct clone_args` of linux/sched.h (version 2, with `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Which side of the clone this is.
pub enum Forked {
    /// The new process.
    Child,
    /// The caller: the child's pid and its pidfd (always close-on-exec).
    Parent {
        /// The child's pid in our pid namespace.
        pid: i32,
        /// The child's pidfd.
        pidfd: OwnedFd,
    },
}

/// clone3 with `namespaces` (CLONE_NEW* flags), `CLONE_PIDFD`, and `CLONE_INTO_CGROUP` when
/// `cgroup` is given. The child gets SIGCHLD as exit signal and runs on a copy of the
/// caller's stack, like after fork.
///
/// # Safety
/// The caller is multi-threaded: on [`Forked::Child`] only async-signal-safe code may run
/// (raw syscalls, no allocation, no locks) and the child must end with `_exit` or `execve`.
pub unsafe fn clone3(namespaces: u64, cgroup: Option<BorrowedFd<'_>>) -> io::Result<Forked> {
    let mut pidfd: RawFd = -1;
    let mut args = CloneArgs {
        flags: namespaces | CLONE_PIDFD,
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    if let Some(cg) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = cg.as_raw_fd() as u64;
    }
    // SAFETY: `args` is a valid clone_args of the size passed and lives across the call;
    // the kernel writes the pidfd into `pidfd`, which outlives the call. Without CLONE_VM
    // the child gets a copy of our memory, so returning into Rust code is sound as long as
    // the caller keeps to the contract above.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent {
            pid: i32::try_from(pid)
                .map_err(|_| io::Error::other("clone3 returned an impossible pid"))?,
            // SAFETY: with CLONE_PIDFD a successful clone3 stored a new pidfd we now own.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}
