//! The seccomp filter of a native unit's command: built by wardend before clone3 as a
//! classic-BPF program ([`Filter`]), applied by the command's process as the very last step
//! before execve ([`apply`], allocation-free). Everything a filter forbids would also be
//! forbidden to the start sequence, so it has to come last (STYLE: "seccomp last").
//!
//! The policy denies, with a polite errno (never a SIGSYS kill), what no agent command needs
//! and what widens the kernel's attack surface:
//!
//! - **foreign ABIs**: any other audit arch (i386 through `int 0x80`) and x32 syscalls fail
//!   with ENOSYS — the deny list below is indexed by native syscall numbers, and a foreign
//!   ABI's numbers would walk around it;
//! - **other processes' memory**: `ptrace`, `process_vm_readv/writev`, `pidfd_getfd`;
//! - **the kernel itself**: `kexec_load/kexec_file_load`, `init_module/finit_module/
//!   delete_module`, `bpf`, `perf_event_open`, `userfaultfd` (a classic exploit primitive),
//!   `io_uring_setup/enter/register` (a large surface of its own whose operations — socket
//!   creation among them — bypass this filter), the keyring (`keyctl/add_key/request_key`),
//!   `swapon/swapoff`, `reboot`, `acct`, `quotactl`, the clock (`settimeofday`,
//!   `clock_settime`, `adjtimex`, `clock_adjtime`);
//! - **the filesystem view and namespaces**: the mount API (`mount`, `umount2`, `pivot_root`,
//!   `move_mount`, `open_tree`, `fsopen`, `fsmount`, `fsconfig`, `fspick`, `mount_setattr`),
//!   `unshare`, `setns`, and `clone` with any `CLONE_NEW*` flag (a user namespace would hand
//!   the command the capabilities to use all of those inside it). `clone3` fails with ENOSYS:
//!   its flags sit in memory a filter cannot read, and on ENOSYS libc falls back to `clone`,
//!   whose flags it can. Tools such as `unshare` and `bwrap` therefore fail in a unit;
//! - **terminal injection**: `ioctl(TIOCSTI)` (push input into a terminal another process
//!   reads) and `ioctl(TIOCLINUX)`;
//! - **execution domains**: `personality` other than querying or setting the default;
//! - with network **`none`**: `socket(AF_INET | AF_INET6)` fails with EAFNOSUPPORT, so a
//!   program learns at once that there is no IP networking (the unit's network namespace has
//!   no interface either); Unix and netlink sockets keep working.
//!
//! Arguments are compared on their low 32 bits only: `ioctl`'s command, `socket`'s domain,
//! `clone`'s flags and `personality`'s persona are 32-bit in the kernel, which ignores the
//! upper half a caller might set to slip past a 64-bit comparison.

use warden_proto::Network;

/// The audit arch of the native ABI.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
/// The audit arch of the native ABI.
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// Syscall numbers with this bit set are the x32 ABI's (which shares the x86_64 audit arch).
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

// Offsets into `struct seccomp_data { int nr; u32 arch; u64 ip; u64 args[6]; }`.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// The low 32 bits of argument `i` (both supported arches are little-endian).
const fn offset_arg_low(i: u32) -> u32 {
    16 + 8 * i
}

/// The longest program the kernel accepts (BPF_MAXINSNS).
const MAX_INSNS: usize = 4096;

/// Every `CLONE_NEW*` flag `clone` accepts (CLONE_NEWTIME is clone3/unshare only: in
/// `clone`'s flags that bit belongs to the exit signal).
const CLONE_NEW_ANY: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;

/// `personality` arguments that are allowed: PER_LINUX (the default) and 0xffffffff (query).
const PERSONALITY_ALLOWED: [u32; 2] = [0, 0xffff_ffff];

/// Denied outright with EPERM.
const DENIED: &[libc::c_long] = &[
    // Other processes' memory.
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    // The kernel itself.
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_adjtimex,
    // The filesystem view and namespaces.
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
];

/// Building a filter failed.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// The program has more instructions than the kernel accepts.
    #[error("the seccomp program has {0} instructions, more than the kernel's {MAX_INSNS}")]
    TooLong(usize),
    /// A conditional jump would reach further than classic BPF's 8-bit offsets.
    #[error("a seccomp jump over {0} instructions does not fit in 8 bits")]
    JumpTooFar(usize),
}

/// A unit's seccomp program, built before the clone.
#[derive(Clone)]
pub struct Filter {
    insns: Vec<libc::sock_filter>,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Filter({} instructions)", self.insns.len())
    }
}

/// The program as the kernel takes it, borrowing a [`Filter`]'s instructions. Made right
/// before the clone (it holds a raw pointer, so it stays out of anything held across an
/// await) and passed to the child, which hands it to [`apply`].
pub struct Program<'a> {
    fprog: libc::sock_fprog,
    _insns: std::marker::PhantomData<&'a [libc::sock_filter]>,
}

fn ret(action: u32) -> libc::sock_filter {
    stmt(BPF_RET_K, action)
}

fn errno_action(errno: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (errno as u32 & libc::SECCOMP_RET_DATA)
}

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: usize, jf: usize) -> Result<libc::sock_filter, FilterError> {
    let offset = |n: usize| u8::try_from(n).map_err(|_| FilterError::JumpTooFar(n));
    Ok(libc::sock_filter {
        code,
        jt: offset(jt)?,
        jf: offset(jf)?,
        k,
    })
}

/// What an argument check does when one of its values matches.
#[derive(Clone, Copy)]
enum OnMatch {
    /// Fail with this errno (any other value is allowed).
    Deny(i32),
    /// Allow (any other value fails with EPERM).
    Allow,
}

impl Filter {
    /// The filter for a unit with this network policy.
    pub fn new(network: Network) -> Result<Self, FilterError> {
        let mut p = Vec::with_capacity(128);
        let enosys = ret(errno_action(libc::ENOSYS));
        let eperm = ret(errno_action(libc::EPERM));
        // A foreign audit arch: its syscall numbers mean other calls than ours.
        p.push(stmt(BPF_LD_W_ABS, OFFSET_ARCH));
        p.push(jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0)?);
        p.push(enosys);
        p.push(stmt(BPF_LD_W_ABS, OFFSET_NR));
        // x32 shares x86_64's audit arch; it is told apart by the number.
        #[cfg(target_arch = "x86_64")]
        {
            p.push(jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1)?);
            p.push(enosys);
        }
        // The accumulator holds the syscall number from here on, except inside an argument
        // check, which always ends in a return.
        for &nr in DENIED {
            p.push(jump(BPF_JEQ_K, nr as u32, 0, 1)?);
            p.push(eperm);
        }
        // clone3: ENOSYS so that libc falls back to clone, whose flags are checked next.
        p.push(jump(BPF_JEQ_K, libc::SYS_clone3 as u32, 0, 1)?);
        p.push(enosys);
        // clone(flags, ...): arg 0 on both arches.
        p.push(jump(BPF_JEQ_K, libc::SYS_clone as u32, 0, 4)?);
        p.push(stmt(BPF_LD_W_ABS, offset_arg_low(0)));
        p.push(jump(BPF_JSET_K, CLONE_NEW_ANY, 1, 0)?);
        p.push(ret(libc::SECCOMP_RET_ALLOW));
        p.push(eperm);
        arg_check(
            &mut p,
            libc::SYS_ioctl,
            1,
            &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32],
            OnMatch::Deny(libc::EPERM),
        )?;
        arg_check(
            &mut p,
            libc::SYS_personality,
            0,
            &PERSONALITY_ALLOWED,
            OnMatch::Allow,
        )?;
        if network == Network::None {
            arg_check(
                &mut p,
                libc::SYS_socket,
                0,
                &[libc::AF_INET as u32, libc::AF_INET6 as u32],
                OnMatch::Deny(libc::EAFNOSUPPORT),
            )?;
        }
        p.push(ret(libc::SECCOMP_RET_ALLOW));
        if p.len() > MAX_INSNS {
            return Err(FilterError::TooLong(p.len()));
        }
        Ok(Self { insns: p })
    }

    /// The instructions.
    pub fn instructions(&self) -> &[libc::sock_filter] {
        &self.insns
    }

    /// The program, for [`apply`].
    pub fn program(&self) -> Program<'_> {
        Program {
            fprog: libc::sock_fprog {
                // At most MAX_INSNS, checked in `new`.
                len: self.insns.len() as libc::c_ushort,
                filter: self.insns.as_ptr().cast_mut(),
            },
            _insns: std::marker::PhantomData,
        }
    }
}

/// Append: if the syscall is `nr`, compare the low 32 bits of argument `arg` with `values`
/// and return; otherwise fall through with the accumulator reloaded with the syscall number.
///
/// ```text
///     jeq nr, 0, skip        ; not this syscall: past the block
///     ld  args[arg].low
///     jeq v0, -> match       ; one per value
///     ...
///     ret no-match
/// match:
///     ret match
///     ld  nr                 ; (where `skip` lands)
/// ```
fn arg_check(
    p: &mut Vec<libc::sock_filter>,
    nr: libc::c_long,
    arg: u32,
    values: &[u32],
    on_match: OnMatch,
) -> Result<(), FilterError> {
    let (matched, unmatched) = match on_match {
        OnMatch::Deny(errno) => (errno_action(errno), libc::SECCOMP_RET_ALLOW),
        OnMatch::Allow => (libc::SECCOMP_RET_ALLOW, errno_action(libc::EPERM)),
    };
    let n = values.len();
    p.push(jump(BPF_JEQ_K, nr as u32, 0, n + 3)?);
    p.push(stmt(BPF_LD_W_ABS, offset_arg_low(arg)));
    for (i, &v) in values.iter().enumerate() {
        // Past the remaining comparisons and the no-match return.
        p.push(jump(BPF_JEQ_K, v, n - i, 0)?);
    }
    p.push(ret(unmatched));
    p.push(ret(matched));
    p.push(stmt(BPF_LD_W_ABS, OFFSET_NR));
    Ok(())
}

/// Install `prog` on the calling thread. Async-signal-safe: one syscall on memory prepared
/// before the clone. no_new_privs must be set already (the start sequence does).
pub fn apply(prog: &Program<'_>) -> Result<(), i32> {
    // SAFETY: `fprog` points at `len` instructions that the Program's lifetime keeps alive;
    // the kernel copies them.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &prog.fprog as *const libc::sock_fprog,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r < 0 {
        Err(super::mounts::errno())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    /// A classic-BPF interpreter for the instructions [`Filter`] emits.
    fn eval(f: &Filter, arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = f.instructions()[pc];
            pc += 1;
            let cond = |taken: bool| if taken { i.jt as usize } else { i.jf as usize };
            match i.code {
                BPF_LD_W_ABS => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                BPF_JEQ_K => pc += cond(acc == i.k),
                BPF_JGE_K => pc += cond(acc >= i.k),
                BPF_JSET_K => pc += cond(acc & i.k != 0),
                BPF_RET_K => return i.k,
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

    fn call(f: &Filter, nr: libc::c_long, args: &[u64]) -> u32 {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        eval(f, AUDIT_ARCH, nr as u32, a)
    }

    #[test]
    // libc's `Ioctl` is c_ulong on glibc and c_int on musl: the casts are needed on one.
    #[allow(clippy::unnecessary_cast)]
    fn the_program_decides_as_the_policy_says() {
        let none = Filter::new(Network::None).unwrap();
        let lo = Filter::new(Network::Loopback).unwrap();
        let eperm = errno_action(libc::EPERM);
        let enosys = errno_action(libc::ENOSYS);
        let eafnosupport = errno_action(libc::EAFNOSUPPORT);
        for f in [&none, &lo] {
            assert_eq!(call(f, libc::SYS_getpid, &[]), ALLOW);
            assert_eq!(call(f, libc::SYS_execve, &[]), ALLOW);
            for &nr in DENIED {
                assert_eq!(call(f, nr, &[]), eperm, "syscall {nr}");
            }
            // A foreign arch (i386), and x32 numbers on x86_64.
            assert_eq!(eval(f, 0x4000_0003, 20, [0; 6]), enosys);
            #[cfg(target_arch = "x86_64")]
            assert_eq!(
                eval(
                    f,
                    AUDIT_ARCH,
                    X32_SYSCALL_BIT | libc::SYS_getpid as u32,
                    [0; 6]
                ),
                enosys
            );
            // Terminal injection, also with the upper half of the command set.
            let tiocsti = libc::TIOCSTI as u64;
            assert_eq!(call(f, libc::SYS_ioctl, &[0, tiocsti]), eperm);
            assert_eq!(call(f, libc::SYS_ioctl, &[0, tiocsti | 1 << 32]), eperm);
            assert_eq!(
                call(f, libc::SYS_ioctl, &[0, libc::TIOCLINUX as u64]),
                eperm
            );
            assert_eq!(call(f, libc::SYS_ioctl, &[0, libc::FIONREAD as u64]), ALLOW);
            // Namespaces through clone; clone3 falls back to clone.
            let sigchld = libc::SIGCHLD as u64;
            assert_eq!(call(f, libc::SYS_clone, &[sigchld]), ALLOW);
            let threads = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
            assert_eq!(call(f, libc::SYS_clone, &[threads]), ALLOW);
            for ns in [libc::CLONE_NEWUSER, libc::CLONE_NEWNS, libc::CLONE_NEWNET] {
                assert_eq!(call(f, libc::SYS_clone, &[sigchld | ns as u64]), eperm);
            }
            assert_eq!(call(f, libc::SYS_clone3, &[]), enosys);
            // personality: the default and a query only.
            assert_eq!(call(f, libc::SYS_personality, &[0]), ALLOW);
            assert_eq!(call(f, libc::SYS_personality, &[0xffff_ffff]), ALLOW);
            assert_eq!(call(f, libc::SYS_personality, &[0x0040000]), eperm);
            // Unix and netlink sockets always.
            for domain in [libc::AF_UNIX, libc::AF_NETLINK] {
                assert_eq!(call(f, libc::SYS_socket, &[domain as u64]), ALLOW);
            }
            assert_eq!(
                call(f, libc::SYS_socketpair, &[libc::AF_UNIX as u64]),
                ALLOW
            );
        }
        for domain in [libc::AF_INET, libc::AF_INET6] {
            let d = domain as u64;
            assert_eq!(call(&none, libc::SYS_socket, &[d]), eafnosupport);
            assert_eq!(call(&none, libc::SYS_socket, &[d | 1 << 32]), eafnosupport);
            assert_eq!(call(&lo, libc::SYS_socket, &[d]), ALLOW);
        }
        let host = Filter::new(Network::Host).unwrap();
        assert_eq!(
            call(&host, libc::SYS_socket, &[libc::AF_INET as u64]),
            ALLOW
        );
    }

    /// The errno of a raw syscall, or 0.
    fn errno_of(r: libc::c_long) -> i32 {
        if r < 0 {
            super::super::mounts::errno()
        } else {
            0
        }
    }

    /// The kernel accepts the program and enforces it: in a forked child (no root needed:
    /// no_new_privs suffices), which exits with the number of the first check that failed.
    #[test]
    fn the_kernel_enforces_it_in_a_forked_child() {
        let filter = Filter::new(Network::None).unwrap();
        let prog = filter.program();
        // SAFETY: the child only makes raw syscalls on data prepared before the fork and
        // ends in _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: raw syscalls with integer arguments or pointers to our stack; the
            // socket calls' fds leak into a process that is about to _exit.
            unsafe {
                let checks: [(i32, &dyn Fn() -> libc::c_long); 7] = [
                    (0, &|| {
                        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into()
                    }),
                    (0, &|| match apply(&prog) {
                        Ok(()) => 0,
                        Err(_) => -1,
                    }),
                    (libc::EPERM, &|| {
                        libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0)
                    }),
                    (libc::EAFNOSUPPORT, &|| {
                        libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0)
                    }),
                    (0, &|| {
                        libc::syscall(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM, 0)
                    }),
                    (libc::EPERM, &|| {
                        libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER)
                    }),
                    (libc::ENOSYS, &|| libc::syscall(libc::SYS_clone3, 0, 0)),
                ];
                for (i, (want, check)) in checks.iter().enumerate() {
                    if errno_of(check()) != *want {
                        libc::_exit(10 + i as i32);
                    }
                }
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: our child, a status int on our stack.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "check {} failed (status {status:#x})",
            libc::WEXITSTATUS(status).saturating_sub(10)
        );
    }
}
