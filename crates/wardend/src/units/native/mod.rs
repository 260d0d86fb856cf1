//! The native backend, for hosts whose PID 1 is not systemd: wardend itself clones each unit
//! into new mount, pid, ipc, uts (and, per policy, net) namespaces and a cgroup of its own,
//! builds its filesystem view, drops to the client's credentials and execs.
//!
//! - [`cgroup`]: the unit's cgroups over v2 and v1 hierarchies (limits, usage, kill, removal).
//! - [`mounts`]: the filesystem view as a plan of mount operations.
//! - [`seccomp`]: the command's seccomp filter, built here and applied right before exec.
//! - `clone`: the clone3 wrapper; `child`: what runs after it; `report`: what the child tells
//!   us (start failures, the command's wait status).
//!
//! Everything the child needs is prepared here, before the clone ([`Prepared`]); the child
//! only makes raw syscalls on it.

pub mod cgroup;
mod child;
mod clone;
pub mod mounts;
pub(crate) mod report;
pub mod seccomp;

use std::ffi::{c_char, CString};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use warden_proto::{ExitReason, ExitReport, Network};

use self::cgroup::{Cgroups, Hierarchy, UnitCgroup};
use self::child::ChildArgs;
use self::clone::Forked;
use self::mounts::{CompiledOp, HostProbe, MountOp, ViewSpec};
use self::report::{CommandStatus, StartFailure, Step};
use self::seccomp::Filter;
use super::cleanup::Cleanups;
use super::{
    errno_text, exec_candidates, init, name, RunningUnit, UnitError, UnitManager, UnitName,
    UnitSpec,
};

/// The empty host directory every unit's new root is built on (each unit mounts on it in its
/// own mount namespace; the host never sees those mounts).
const NEW_ROOT: &str = "/run/wardend/native-root";

/// The hostname units see.
/// How long a unit may take from clone to exec before its start counts as failed.
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
const HOSTNAME: &std::ffi::CStr = c"warden";

/// The native backend.
pub struct NativeManager {
    prefix: String,
    cgroups: Cgroups,
    new_root: PathBuf,
    /// wardend's lifeline: every unit's init holds the read end and exits when it hangs
    /// up, which it does when this process (the only holder of the write end) is gone.
    lifeline: OwnedFd,
    _lifeline_writer: OwnedFd,
    /// Removals of units dropped without `stop`.
    cleanups: Cleanups,
}

impl NativeManager {
    /// Set up the native backend on this host's cgroup hierarchies.
    pub fn new(prefix: &str) -> Result<Self, UnitError> {
        Self::with_hierarchies(prefix, cgroup::detect()?)
    }

    /// Set up the native backend on the given cgroup hierarchies (tests use it to force the
    /// v2 or the v1 path).
    pub fn with_hierarchies(prefix: &str, hierarchies: Vec<Hierarchy>) -> Result<Self, UnitError> {
        let cgroups = Cgroups::new(prefix, hierarchies)?;
        let new_root = PathBuf::from(NEW_ROOT);
        std::fs::create_dir_all(&new_root).map_err(|source| UnitError::Io {
            step: "creating the new-root directory",
            path: NEW_ROOT.into(),
            source,
        })?;
        // Both ends close-on-exec; a unit's child closes every descriptor but the read end.
        let (lifeline, writer) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| UnitError::Io {
                step: "creating the lifeline pipe",
                path: String::new(),
                source: e.into(),
            })?;
        Ok(Self {
            prefix: prefix.to_string(),
            cgroups,
            new_root,
            lifeline,
            _lifeline_writer: writer,
            cleanups: Cleanups::default(),
        })
    }

    /// The `<prefix>.slice` directories, one per cgroup hierarchy.
    pub fn slices(&self) -> Vec<PathBuf> {
        self.cgroups.slices()
    }
}

/// What the child needs, as C data, prepared before the clone.
struct Prepared {
    mounts: Vec<CompiledOp>,
    /// The mount trees of the cwd and the writable paths, cloned for the child to attach
    /// (the plan holds their numbers).
    trees: Vec<OwnedFd>,
    /// Where execvp would look for `argv[0]`, in order.
    candidates: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd_path: CString,
    groups: Vec<libc::gid_t>,
    /// The command's seccomp filter (its `sock_fprog` is made in `spawn`, right before the
    /// clone: it holds a raw pointer).
    seccomp: Filter,
}

impl Prepared {
    fn new(spec: &UnitSpec, new_root: &Path) -> Result<Self, UnitError> {
        let io_err = |step: &'static str, path: &Path| {
            let path = path.display().to_string();
            move |source: io::Error| UnitError::Io { step, path, source }
        };
        let mut trees = Vec::new();
        // A read-only cwd needs a bind of its own only under a fresh /tmp or /var/tmp (the
        // host's root, read-only, shows it anywhere else).
        let in_fresh_temp = ["/tmp", "/var/tmp"]
            .iter()
            .any(|t| spec.cwd_path.starts_with(t));
        let cwd_tree = if spec.fs.cwd_writable || in_fresh_temp {
            let tree = mounts::clone_tree(spec.cwd.as_fd()).map_err(io_err(
                "cloning the mount of the working directory",
                &spec.cwd_path,
            ))?;
            let raw = tree.as_raw_fd();
            trees.push(tree);
            Some(raw)
        } else {
            None
        };
        let mut writable = Vec::new();
        for path in &spec.fs.writable {
            let Some(fd) = open_canonical(path).map_err(io_err("opening writable path", path))?
            else {
                continue;
            };
            let tree = mounts::clone_tree(fd.as_fd())
                .map_err(io_err("cloning the mount of writable path", path))?;
            writable.push((tree.as_raw_fd(), path.clone()));
            trees.push(tree);
        }
        let view = ViewSpec {
            new_root,
            cwd_tree,
            cwd_writable: spec.fs.cwd_writable,
            cwd_path: &spec.cwd_path,
            writable: &writable,
            fs: &spec.fs,
            tmpfs_size: spec.limits.memory_max,
        };
        let strings = |e: io::Error| UnitError::Start {
            unit: spec.name.to_string(),
            cause: e.to_string(),
        };
        let mounts = mounts::compile(mounts::plan(&view, &HostProbe)).map_err(strings)?;
        let seccomp = Filter::new(spec.network).map_err(|e| UnitError::Start {
            unit: spec.name.to_string(),
            cause: e.to_string(),
        })?;
        let argv0 = spec.argv.first().map_or("", String::as_str);
        Ok(Self {
            trees,
            mounts,
            candidates: exec_candidates(argv0, &spec.path)
                .iter()
                .map(|c| cstring(c.as_bytes()))
                .collect::<io::Result<_>>()
                .map_err(strings)?,
            argv: spec
                .argv
                .iter()
                .map(|a| cstring(a.as_bytes()))
                .collect::<io::Result<_>>()
                .map_err(strings)?,
            env: spec
                .env
                .iter()
                .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
                .collect::<io::Result<_>>()
                .map_err(strings)?,
            cwd_path: cstring(spec.cwd_path.as_os_str().as_bytes()).map_err(strings)?,
            groups: spec.groups.clone(),
            seccomp,
        })
    }

    /// The error for a start failure reported by the child: not found (127) and not
    /// executable (126) are the command's; anything else is the unit's.
    fn failure(&self, unit: &str, f: &StartFailure) -> UnitError {
        let command = self
            .argv
            .first()
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default();
        match (f.step, f.errno) {
            (Step::Exec, libc::ENOENT | libc::ENOTDIR) => UnitError::NotFound(command),
            (Step::Exec, e) => UnitError::NotExecutable {
                command,
                why: errno_text(e),
            },
            _ => UnitError::Start {
                unit: unit.to_string(),
                cause: self.describe(f),
            },
        }
    }

    /// Say what a start failure reported by the child was about.
    fn describe(&self, f: &StartFailure) -> String {
        match f.step {
            Step::Mount => match self.mounts.get(f.index as usize).map(CompiledOp::op) {
                Some(op) => format!("{} ({}): {}", f.step.describe(), describe_op(op), f.error()),
                None => f.to_string(),
            },
            _ => f.to_string(),
        }
    }
}

fn describe_op(op: &MountOp) -> String {
    format!("{op:?}")
}

/// Open an extra writable path (`None` if it does not exist) and check that it is canonical:
/// the path the descriptor ended up at is the path asked for, so no symlink (swapped in by
/// the agent, say) redirects the bind to somewhere else — a hidden path, for one.
fn open_canonical(path: &Path) -> io::Result<Option<OwnedFd>> {
    use rustix::fs::{Mode, OFlags};
    let fd = match rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let resolved = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if resolved != path {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not a canonical path: it resolves to {}",
                resolved.display()
            ),
        ));
    }
    Ok(Some(fd))
}

fn cstring(b: &[u8]) -> io::Result<CString> {
    CString::new(b)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a string contains a NUL byte"))
}

fn null_terminated(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The parent's side of a freshly cloned unit.
struct Spawned {
    pid: i32,
    pidfd: OwnedFd,
    start: OwnedFd,
    status: OwnedFd,
}

/// Clone the unit's init. Synchronous: the raw pointers handed to the child never cross an
/// await.
fn spawn(
    spec: &UnitSpec,
    p: &Prepared,
    cg: &UnitCgroup,
    lifeline: BorrowedFd<'_>,
) -> Result<Spawned, UnitError> {
    let unit = spec.name.to_string();
    let io_err = |step: &'static str| {
        let unit = unit.clone();
        move |e: rustix::io::Errno| UnitError::Io {
            step,
            path: unit,
            source: e.into(),
        }
    };
    let v2 = cg.open_v2()?;
    let v1 = cg.open_v1_procs()?;
    let v1_raw: Vec<RawFd> = v1.iter().map(AsRawFd::as_raw_fd).collect();
    // Our ends are close-on-exec (units never inherit them); the status pipe's read end is
    // non-blocking, read once the init has exited.
    let (start_r, start_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(io_err("creating the start pipe for"))?;
    let (status_r, status_w) = rustix::pipe::pipe_with(
        rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
    )
    .map_err(io_err("creating the status pipe for"))?;
    let argv = null_terminated(&p.argv);
    let envp = null_terminated(&p.env);
    let candidates: Vec<*const c_char> = p.candidates.iter().map(|c| c.as_ptr()).collect();
    let raw = |fd: &Option<OwnedFd>| fd.as_ref().map_or(-1, AsRawFd::as_raw_fd);
    let seccomp = p.seccomp.program();
    let mut keep: Vec<RawFd> = v1_raw
        .iter()
        .copied()
        .chain(p.trees.iter().map(AsRawFd::as_raw_fd))
        .chain(spec.stdio.iter().map(raw))
        .chain([
            spec.cwd.as_raw_fd(),
            start_w.as_raw_fd(),
            status_w.as_raw_fd(),
            lifeline.as_raw_fd(),
        ])
        .filter(|fd| *fd >= 0)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let args = ChildArgs {
        keep: &keep,
        lifeline: lifeline.as_raw_fd(),
        v1_procs: &v1_raw,
        mounts: &p.mounts,
        hostname: HOSTNAME,
        loopback: spec.network == Network::Loopback,
        cwd_fd: spec.cwd.as_raw_fd(),
        cwd_path: &p.cwd_path,
        groups: &p.groups,
        uid: spec.uid,
        gid: spec.gid,
        stdio: [
            raw(&spec.stdio[0]),
            raw(&spec.stdio[1]),
            raw(&spec.stdio[2]),
        ],
        dev_null: c"/dev/null",
        candidates: &candidates,
        argv: &argv,
        envp: &envp,
        start_fd: start_w.as_raw_fd(),
        status_fd: status_w.as_raw_fd(),
        seccomp: &seccomp,
    };
    let mut namespaces =
        (libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS) as u64;
    if spec.network != Network::Host {
        namespaces |= libc::CLONE_NEWNET as u64;
    }
    // Signals blocked across the clone: the child must not run an inherited handler, nor lose
    // a signal sent before its init is ready to forward it.
    let old_mask = init::set_signal_mask(&init::full_sigset());
    // SAFETY: in the child only `child::run` runs: raw syscalls on `args`, prepared above,
    // ending in execve or _exit.
    let forked = unsafe { clone::clone3(namespaces, v2.as_ref().map(AsFd::as_fd)) };
    let (pid, pidfd) = match forked {
        // Signals stay blocked in the child: its init never unblocks them (it waits for them
        // with sigwaitinfo), the command unblocks all right before exec.
        Ok(Forked::Child) => child::run(&args),
        Ok(Forked::Parent { pid, pidfd }) => {
            init::set_signal_mask(&old_mask);
            (pid, pidfd)
        }
        Err(source) => {
            init::set_signal_mask(&old_mask);
            return Err(UnitError::Io {
                step: "clone3",
                path: unit,
                source,
            });
        }
    };
    Ok(Spawned {
        pid,
        pidfd,
        start: start_r,
        status: status_r,
    })
    // The write ends, the cgroup fds (and, in the caller, the spec's fds) close here: the
    // child has its copies.
}

/// Read the start pipe to its end: nothing means exec succeeded. A child that has not
/// closed it within [`START_TIMEOUT`] (its mounts stalled on a hung filesystem) is a failure.
fn read_start_report(start: OwnedFd) -> io::Result<Option<StartFailure>> {
    let mut fds = [rustix::event::PollFd::new(
        &start,
        rustix::event::PollFlags::IN,
    )];
    let timeout = rustix::event::Timespec::try_from(START_TIMEOUT).map_err(io::Error::other)?;
    loop {
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => {
                return Err(io::Error::other(format!(
                    "the unit did not start within {START_TIMEOUT:?} (a stalled mount?)"
                )))
            }
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let mut buf = Vec::with_capacity(StartFailure::LEN);
    std::fs::File::from(start).read_to_end(&mut buf)?;
    if buf.is_empty() {
        return Ok(None);
    }
    StartFailure::decode(&buf)
        .map(Some)
        .ok_or_else(|| io::Error::other(format!("garbled start report ({} bytes)", buf.len())))
}

impl Drop for NativeManager {
    /// The daemon is done: its `<prefix>.slice` directories go too, where they are empty
    /// (`rmdir` only: a unit still there keeps them, for the next start's orphan cleanup).
    fn drop(&mut self) {
        for slice in self.cgroups.slices() {
            let _ = std::fs::remove_dir(slice);
        }
    }
}

impl UnitManager for NativeManager {
    type Unit = NativeUnit;

    fn backend(&self) -> &'static str {
        "native"
    }

    async fn start(&self, spec: UnitSpec) -> Result<NativeUnit, UnitError> {
        let unit = spec.name.to_string();
        let start_err = |cause: String| UnitError::Start {
            unit: unit.clone(),
            cause,
        };
        let prepared = Prepared::new(&spec, &self.new_root)?;
        let cgroup = self.cgroups.create(&unit, &spec.limits)?;
        let started = Instant::now();
        let spawned = match spawn(&spec, &prepared, &cgroup, self.lifeline.as_fd()) {
            Ok(s) => s,
            Err(e) => {
                let _ = cgroup.remove();
                return Err(e);
            }
        };
        let deadline = spec
            .limits
            .timeout
            .map(|t| tokio::time::Instant::from_std(started) + t);
        let name = spec.name.clone();
        // Our copies of the client's stdio and cwd go now: the unit has its own.
        drop(spec);
        // SAFETY: an OwnedFd always returns the same open descriptor, which the AsyncFd owns.
        let pidfd =
            match unsafe { AsyncFd::register_with_interest(spawned.pidfd, Interest::READABLE) } {
                Ok(fd) => fd,
                Err(e) => {
                    let (pidfd, source) = e.into_parts();
                    let _ = pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
                    reap_pidfd_blocking(pidfd.as_fd());
                    let _ = cgroup.kill_all().and_then(|()| cgroup.remove());
                    return Err(UnitError::Io {
                        step: "registering the pidfd of",
                        path: unit,
                        source,
                    });
                }
            };
        let mut handle = NativeUnit {
            name,
            init_pid: spawned.pid,
            pidfd: Some(pidfd),
            status: spawned.status,
            cgroup,
            deadline,
            init_exit: None,
            report: None,
            timed_out: false,
            stop_requested: false,
            stopped: false,
            cleanups: self.cleanups.clone(),
        };
        let start = spawned.start;
        let report = tokio::task::spawn_blocking(move || read_start_report(start)).await;
        let failure = match report {
            Ok(Ok(None)) => return Ok(handle),
            Ok(Ok(Some(f))) => prepared.failure(&unit, &f),
            Ok(Err(e)) => start_err(format!("reading the start report: {e}")),
            Err(e) => start_err(format!("reading the start report: {e}")),
        };
        let _ = handle.stop().await;
        Err(failure)
    }

    async fn cleanup_orphans(&self) -> Result<Vec<String>, UnitError> {
        let cgroups = self.cgroups.clone();
        let prefix = self.prefix.clone();
        tokio::task::spawn_blocking(move || {
            let names = cgroups.children(|n| name::is_unit_of(&prefix, n))?;
            for n in &names {
                let cg = cgroups.unit(n);
                // Inits that are our own children (a manager dropped in this process) must be
                // reaped once dead; a dead wardend's were reparented and get reaped there.
                let ours: Vec<i32> = cg.pids().into_iter().filter(|&p| is_our_child(p)).collect();
                cg.kill_all()?;
                ours.into_iter().for_each(reap_blocking);
                cg.remove()?;
            }
            Ok(names)
        })
        .await
        .map_err(|e| UnitError::Unreachable(format!("orphan cleanup task: {e}")))?
    }

    /// The init of the unit `pid` runs in (PID 1 of the unit's pid namespace), if `pid` is in
    /// one of this manager's units.
    async fn main_pid_of(&self, pid: u32) -> Option<u32> {
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let slice = name::slice_of(&self.prefix);
        let unit = cgroups.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':').nth(2)?.rsplit('/');
            let (unit, parent) = (parts.next()?, parts.next()?);
            (parent == slice && name::is_unit_of(&self.prefix, unit)).then(|| unit.to_string())
        })?;
        let init = self
            .cgroups
            .unit(&unit)
            .pids()
            .into_iter()
            .find(|&p| is_namespace_init(p))?;
        u32::try_from(init).ok()
    }

    fn cleanups(&self) -> &Cleanups {
        &self.cleanups
    }
}

/// Whether `pid` is PID 1 of a pid namespace below ours (NSpid: `<our pid> ... 1`).
fn is_namespace_init(pid: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let Some(ids) = status.lines().find_map(|l| l.strip_prefix("NSpid:")) else {
        return false;
    };
    let ids: Vec<&str> = ids.split_whitespace().collect();
    ids.len() > 1 && ids.last() == Some(&"1")
}

fn is_our_child(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let ppid = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse::<u32>().ok());
    ppid == Some(std::process::id())
}

fn reap_blocking(pid: i32) {
    // SAFETY: a zeroed siginfo_t is valid for waitid to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid on a pid with a siginfo on our stack.
    unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::__WALL,
        )
    };
}

/// How the unit's init ended (from waitid).
#[derive(Debug, Clone, Copy)]
struct InitExit {
    code: i32,
    status: i32,
}

impl InitExit {
    fn signal(&self) -> Option<i32> {
        matches!(self.code, libc::CLD_KILLED | libc::CLD_DUMPED).then_some(self.status)
    }

    fn exit_code(&self) -> Option<i32> {
        (self.code == libc::CLD_EXITED).then_some(self.status)
    }
}

/// Reap a process that was SIGKILLed (blocks until it has exited).
fn reap_pidfd_blocking(pidfd: BorrowedFd<'_>) {
    // SAFETY: a zeroed siginfo_t is valid for waitid to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: blocking waitid on a pidfd we own, with a siginfo on our stack.
    unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::__WALL,
        )
    };
}

/// Reap the init if it has exited (never blocks).
fn try_reap(pidfd: BorrowedFd<'_>) -> io::Result<Option<InitExit>> {
    // SAFETY: a zeroed siginfo_t is valid for waitid to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid on a pidfd we own, with a siginfo on our stack.
    let r = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::__WALL,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid filled `info` for a child state change (or left it zeroed, pid 0).
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    Ok((pid != 0).then_some(InitExit {
        code: info.si_code,
        status,
    }))
}

fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: i32) -> io::Result<()> {
    // SAFETY: pidfd_send_signal on a pidfd we own, no siginfo.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A native unit.
pub struct NativeUnit {
    name: UnitName,
    init_pid: i32,
    /// `None` only while Drop hands it to the cleanup thread.
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: OwnedFd,
    cgroup: UnitCgroup,
    deadline: Option<tokio::time::Instant>,
    init_exit: Option<InitExit>,
    report: Option<ExitReport>,
    timed_out: bool,
    stop_requested: bool,
    stopped: bool,
    /// Where its removal runs if it is dropped without `stop`.
    cleanups: Cleanups,
}

/// What one round of waiting saw.
enum Event {
    Reaped(InitExit),
    NotYet,
    Deadline,
    Failed(io::Error),
}

impl NativeUnit {
    /// The pid of the unit's init (PID 1 of its pid namespace), as wardend sees it.
    pub fn init_pid(&self) -> i32 {
        self.init_pid
    }

    /// The unit's cgroup directories, one per hierarchy.
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        self.cgroup.dirs().map(Path::to_path_buf).collect()
    }

    fn control(&self, op: &'static str, cause: impl ToString) -> UnitError {
        UnitError::Control {
            op,
            unit: self.name.to_string(),
            cause: cause.to_string(),
        }
    }

    /// SIGKILL the init: the kernel then kills everything in its pid namespace.
    fn kill_init(&self) {
        if self.init_exit.is_none() {
            if let Some(fd) = &self.pidfd {
                let _ = pidfd_send_signal(fd.get_ref().as_fd(), libc::SIGKILL);
            }
        }
    }

    /// Wait until the init has been reaped; with `enforce_deadline`, kill it at the deadline.
    async fn reap(&mut self, enforce_deadline: bool) -> Result<InitExit, UnitError> {
        loop {
            if let Some(exit) = self.init_exit {
                return Ok(exit);
            }
            let Some(pidfd) = &self.pidfd else {
                return Err(self.control("wait", "no pidfd"));
            };
            let deadline = self
                .deadline
                .filter(|_| enforce_deadline && !self.timed_out);
            let event = tokio::select! {
                ready = pidfd.readable() => match ready {
                    Ok(mut guard) => match try_reap(guard.get_inner().as_fd()) {
                        Ok(Some(exit)) => Event::Reaped(exit),
                        Ok(None) => {
                            guard.clear_ready();
                            Event::NotYet
                        }
                        Err(e) => Event::Failed(e),
                    },
                    Err(e) => Event::Failed(e),
                },
                () = sleep_until(deadline), if deadline.is_some() => Event::Deadline,
            };
            match event {
                Event::Reaped(exit) => self.init_exit = Some(exit),
                Event::NotYet => {}
                Event::Deadline => {
                    self.timed_out = true;
                    self.kill_init();
                }
                Event::Failed(e) => return Err(self.control("wait", e)),
            }
        }
    }

    /// The report, once the init is reaped: the init's own status tells apart what it
    /// reported (the command's) from its being killed.
    fn build_report(&self, init: InitExit) -> ExitReport {
        let mut buf = [0u8; CommandStatus::LEN];
        let n = rustix::io::read(&self.status, &mut buf).unwrap_or(0);
        let command = buf.get(..n).and_then(CommandStatus::decode);
        let usage = self.cgroup.usage();
        let (code, signal) = match command {
            Some(st) => (st.code(), st.signal()),
            None => (init.exit_code(), init.signal()),
        };
        let reason = if self.timed_out {
            ExitReason::Timeout
        } else if usage.oom_kills > 0 {
            ExitReason::Oom
        } else if command.is_none() && self.stop_requested {
            ExitReason::Stopped
        } else if signal.is_some() {
            ExitReason::Signal
        } else {
            ExitReason::Exited
        };
        ExitReport {
            reason,
            code,
            signal,
            cpu_usec: usage.cpu_usec,
            peak_memory_bytes: usage.peak_memory_bytes,
            wall_usec: 0,
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl RunningUnit for NativeUnit {
    fn name(&self) -> &UnitName {
        &self.name
    }

    async fn wait(&mut self) -> Result<ExitReport, UnitError> {
        if let Some(report) = &self.report {
            return Ok(report.clone());
        }
        let init = self.reap(true).await?;
        let report = self.build_report(init);
        self.report = Some(report.clone());
        Ok(report)
    }

    async fn signal(&self, signal: i32) -> Result<(), UnitError> {
        if self.init_exit.is_some() {
            return Ok(());
        }
        let Some(pidfd) = &self.pidfd else {
            return Ok(());
        };
        // To the init, which forwards it to the command (SIGKILL ends the whole unit).
        match pidfd_send_signal(pidfd.get_ref().as_fd(), signal) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            Err(e) => Err(self.control("signal", e)),
            Ok(()) => Ok(()),
        }
    }

    async fn stop(&mut self) -> Result<(), UnitError> {
        if self.stopped {
            return Ok(());
        }
        if self.init_exit.is_none() {
            self.stop_requested = true;
        }
        // The init first: its pid namespace dies with it. Then the whole cgroup, for anything
        // that could be in it and not in the namespace.
        self.kill_init();
        let cg = self.cgroup.clone();
        let killed = tokio::task::spawn_blocking(move || cg.kill_all())
            .await
            .map_err(|e| self.control("stop", e))?;
        let init = self.reap(false).await?;
        if self.report.is_none() {
            self.report = Some(self.build_report(init));
        }
        killed?;
        let cg = self.cgroup.clone();
        tokio::task::spawn_blocking(move || cg.remove())
            .await
            .map_err(|e| self.control("stop", e))??;
        self.stopped = true;
        Ok(())
    }
}

impl Drop for NativeUnit {
    /// A unit dropped without `stop` is still killed and removed, on a blocking thread the
    /// manager's cleanups track (shutdown waits for it).
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        self.kill_init();
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        let reaped = self.init_exit.is_some();
        let cg = self.cgroup.clone();
        let pidfd = pidfd.into_inner();
        self.cleanups.spawn_blocking(move || {
            let _ = cg.kill_all();
            if !reaped {
                reap_pidfd_blocking(pidfd.as_fd());
            }
            let _ = cg.remove();
        });
    }
}
