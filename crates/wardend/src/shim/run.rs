//! The exec shim's process: the first program of every systemd unit.
//!
//! systemd starts it as root (bounded to the few capabilities it needs), inside the unit's
//! sandbox properties, with systemd's own environment and no argument but `exec-shim`:
//! nothing of the request reaches the dynamic loader or runs before the restrictions. The
//! command arrives as a credential ([`super::spec`]). Then, a step a line:
//!
//! 1. read the spec;
//! 2. enter a new pid and mount namespace (the command sees and signals only its own
//!    processes, on every kernel, Landlock or not);
//! 3. fork the unit's init (PID 1 there): a fresh `/proc`, `/sys/fs/cgroup` covered, then
//!    groups, gid, uid dropped to the client's, the working directory entered and checked
//!    by device and inode (systemd set the view up by path: a symlink swapped in meanwhile
//!    would have been followed), the Landlock domain entered; it forks the command —
//!    a session of its own, descriptors above 2 closed at exec, the native backend's seccomp
//!    filter, execvp's search with exactly the request's environment — and supervises it
//!    as the native init does;
//! 4. stay as the unit's main process: relay signals to the init, and end as the command
//!    ended (its exit code, or killed by its signal), so that systemd reports the truth.

use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitCode;

use super::landlock;
use super::spec::{self, Spec, CREDENTIAL};
use crate::units::init;
use crate::units::native::report::CommandStatus;
use crate::units::native::seccomp::{self, Filter};

/// Exit status when the shim itself fails (as `warden run` does for its own failures).
const FAILED: u8 = 125;

/// Run the shim with the arguments after `exec-shim`.
pub fn main(args: Vec<OsString>) -> ExitCode {
    if !args.is_empty() {
        return fail("takes no arguments");
    }
    // Set by systemd (not by the request) when the unit has credentials.
    let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") else {
        return fail("no credentials directory: not started by wardend");
    };
    let spec = match spec::read(&Path::new(&dir).join(CREDENTIAL)) {
        Ok(spec) => spec,
        Err(e) => return fail(&e),
    };
    match start(&spec) {
        Ok(code) => code,
        Err(e) => fail(&e),
    }
}

fn fail(why: &str) -> ExitCode {
    eprintln!("warden: exec-shim: {why}");
    ExitCode::from(FAILED)
}

/// What the init and the command need, made before the fork.
struct Prepared {
    candidates: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
    filter: Filter,
}

impl Prepared {
    fn new(spec: &Spec) -> Result<Self, String> {
        let c = |s: &[u8]| CString::new(s).map_err(|_| "a string contains a NUL byte".to_string());
        let command = spec.argv.first().map_or("", String::as_str);
        Ok(Self {
            candidates: crate::units::exec_candidates(command, &spec.path)
                .iter()
                .map(|s| c(s.as_bytes()))
                .collect::<Result<_, _>>()?,
            argv: spec
                .argv
                .iter()
                .map(|s| c(s.as_bytes()))
                .collect::<Result<_, _>>()?,
            env: spec
                .env
                .iter()
                .map(|(k, v)| c(format!("{k}={v}").as_bytes()))
                .collect::<Result<_, _>>()?,
            cwd: c(spec.cwd.as_os_str().as_bytes())?,
            filter: Filter::new(spec.network).map_err(|e| e.to_string())?,
        })
    }
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Steps 2–4.
fn start(spec: &Spec) -> Result<ExitCode, String> {
    let p = Prepared::new(spec)?;
    // SAFETY: unshare with plain flags; this process is single-threaded.
    if unsafe { libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) } != 0 {
        return Err(os_err("entering a pid and mount namespace"));
    }
    let (status_r, status_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| format!("creating the status pipe: {e}"))?;
    // Every signal blocked across the fork: none is lost before the signalfds read them.
    init::set_signal_mask(&init::full_sigset());
    // SAFETY: fork in a single-threaded process; the child runs `unit_init`, which ends in
    // _exit or in the supervise loop.
    match unsafe { libc::fork() } {
        -1 => Err(os_err("forking the unit's init")),
        0 => {
            drop(status_r);
            unit_init(spec, &p, status_w.as_raw_fd())
        }
        pid => {
            drop(status_w);
            Ok(relay(pid, status_r))
        }
    }
}

/// The unit's init: PID 1 of the new pid namespace.
fn unit_init(spec: &Spec, p: &Prepared, status_fd: RawFd) -> ! {
    if let Err(e) = enter(spec, p) {
        eprintln!("warden: exec-shim: {e}");
        // SAFETY: _exit ends the process; nothing to unwind. No status record: the shim
        // reports the failure.
        unsafe { libc::_exit(i32::from(FAILED)) };
    }
    // SAFETY: fork in a single-threaded process; the child only runs `command`.
    match unsafe { libc::fork() } {
        -1 => {
            eprintln!("warden: exec-shim: {}", os_err("forking the command"));
            // SAFETY: as above.
            unsafe { libc::_exit(i32::from(FAILED)) }
        }
        0 => command(p),
        pid => init::supervise(status_fd, -1, pid),
    }
}

/// The init's start sequence, a step a line, in order.
fn enter(spec: &Spec, p: &Prepared) -> Result<(), String> {
    // Nothing mounted here propagates back to the unit's (or the host's) namespace.
    mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| format!("making mounts private: {e}"))?;
    // A /proc of this pid namespace: the command lists only its own processes.
    mount(
        Some(c"proc"),
        c"/proc",
        Some(c"proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(|e| format!("mounting /proc: {e}"))?;
    // The cgroup tree lists every process of the host: an empty cover over it.
    if Path::new("/sys/fs/cgroup").is_dir() {
        mount(
            Some(c"tmpfs"),
            c"/sys/fs/cgroup",
            Some(c"tmpfs"),
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some(c"mode=755,size=4k"),
        )
        .map_err(|e| format!("covering /sys/fs/cgroup: {e}"))?;
    }
    // Credentials: groups, then gid, then uid (after setuid the others cannot change).
    drop_privileges(spec).map_err(|e| format!("dropping to uid {}: {e}", spec.uid))?;
    // The init, as the command's uid, must not be ptrace-able by it.
    // SAFETY: prctl with plain integers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // The working directory, as the client, by path — and the very inode it passed.
    enter_cwd(spec, &p.cwd)?;
    // Signals, ptrace, /proc/PID and abstract sockets confined to this domain (where the
    // kernel has Landlock; the pid namespace already keeps every other process out).
    if spec.landlock {
        landlock::restrict_self(spec.scopes).map_err(|e| format!("landlock: {e}"))?;
    }
    Ok(())
}

fn mount(
    source: Option<&std::ffi::CStr>,
    target: &std::ffi::CStr,
    fstype: Option<&std::ffi::CStr>,
    flags: libc::c_ulong,
    data: Option<&std::ffi::CStr>,
) -> std::io::Result<()> {
    let ptr = |s: Option<&std::ffi::CStr>| s.map_or(std::ptr::null(), std::ffi::CStr::as_ptr);
    // SAFETY: every pointer is null or a NUL-terminated string alive for the call.
    let r = unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn drop_privileges(spec: &Spec) -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: `groups` is a valid array of gid_t of the length passed.
    check(unsafe { libc::setgroups(spec.groups.len(), spec.groups.as_ptr()) })?;
    // SAFETY: plain integers.
    check(unsafe { libc::setresgid(spec.gid, spec.gid, spec.gid) })?;
    // SAFETY: plain integers.
    check(unsafe { libc::setresuid(spec.uid, spec.uid, spec.uid) })
}

fn enter_cwd(spec: &Spec, cwd: &std::ffi::CStr) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: a valid C string.
    let entered = unsafe { libc::chdir(cwd.as_ptr()) } == 0;
    let here = std::fs::metadata(".").map(|m| (m.dev(), m.ino()));
    if !entered || here.ok() != Some(spec.cwd_id) {
        return Err("the working directory changed while the unit was set up".into());
    }
    Ok(())
}

/// The command: a session of its own, descriptors above stdio closed at exec, signals back
/// to normal, the seccomp filter last, then execvp's search with exactly its environment.
fn command(p: &Prepared) -> ! {
    // SAFETY: setsid has no arguments.
    unsafe { libc::setsid() };
    let _ = init::close_range(3, u32::MAX, init::CLOSE_RANGE_CLOEXEC);
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: SIG_DFL installs no handler code (Rust's runtime ignored SIGPIPE).
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    init::set_signal_mask(&init::empty_sigset());
    let command = p
        .argv
        .first()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    let program = p.filter.program();
    if let Err(e) = seccomp::apply(&program) {
        eprintln!(
            "warden: exec-shim: installing the seccomp filter: {}",
            std::io::Error::from_raw_os_error(e)
        );
        // SAFETY: _exit ends the process.
        unsafe { libc::_exit(i32::from(FAILED)) };
    }
    let candidates: Vec<*const libc::c_char> = p.candidates.iter().map(|c| c.as_ptr()).collect();
    let errno = init::exec_search(
        &candidates,
        &null_terminated(&p.argv),
        &null_terminated(&p.env),
    );
    // The same words and codes as the native backend's (the client prints them alike).
    let code = if errno == libc::ENOENT || errno == libc::ENOTDIR {
        eprintln!("{command}: command not found");
        127
    } else {
        eprintln!("{command}: {}", crate::units::errno_text(errno));
        126
    };
    // SAFETY: _exit ends the process.
    unsafe { libc::_exit(code) }
}

/// Step 4: relay every signal to the init until it ends, then end as the command did.
fn relay(init_pid: libc::pid_t, status: OwnedFd) -> ExitCode {
    let all = init::full_sigset();
    // SAFETY: `all` is an initialised sigset; 8 is the kernel's sigset size.
    let sfd = unsafe { libc::syscall(libc::SYS_signalfd4, -1, &all, 8usize, libc::SFD_CLOEXEC) };
    if sfd < 0 {
        return fail(&os_err("creating a signalfd"));
    }
    let sfd = sfd as RawFd;
    loop {
        // SAFETY: a zeroed signalfd_siginfo is valid for read(2) to fill.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of_val(&info);
        // SAFETY: `info` is a writable buffer of `size` bytes.
        let n = unsafe { libc::read(sfd, (&raw mut info).cast(), size) };
        if n != size as isize {
            continue; // EINTR
        }
        let sig = info.ssi_signo as i32;
        if sig != libc::SIGCHLD {
            // SAFETY: kill with plain integers, to our own child.
            unsafe { libc::kill(init_pid, sig) };
            continue;
        }
        let mut wstatus = 0;
        // SAFETY: `wstatus` is a valid int on our stack.
        if unsafe { libc::waitpid(init_pid, &mut wstatus, libc::WNOHANG) } == init_pid {
            break;
        }
    }
    let mut buf = [0u8; CommandStatus::LEN];
    let n = rustix::io::read(&status, &mut buf).unwrap_or(0);
    match buf.get(..n).and_then(CommandStatus::decode) {
        Some(st) => end_as(st),
        // The init failed before the command ran; it said why on stderr.
        None => ExitCode::from(FAILED),
    }
}

/// End as the command ended: its exit code, or death by its signal (no core dump).
fn end_as(st: CommandStatus) -> ExitCode {
    if let Some(code) = st.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(FAILED));
    }
    let sig = st.signal().unwrap_or(libc::SIGKILL);
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain integers and a valid rlimit; the signal is ours to take.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(sig, libc::SIG_DFL);
        init::set_signal_mask(&init::empty_sigset());
        libc::kill(libc::getpid(), sig);
    }
    // A signal that does not kill by default.
    ExitCode::from(128u8.saturating_add(u8::try_from(sig).unwrap_or(0)))
}
