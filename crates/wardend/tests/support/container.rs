//! A throwaway systemd to test the systemd backend against (SPEC §7).
//!
//! [`SystemdContainer::boot`] boots the host's own OS with `systemd-nspawn`: in a private
//! mount namespace it bind-mounts `/` onto an empty directory and boots that with
//! `--volatile=overlay`, so every write lands in a tmpfs and the host's root is never touched
//! (never boot systemd against the real root: it cleans `/tmp` and more). The only unit
//! directory is one with an empty target, so no host service starts. Host paths (such as
//! `target/debug/wardend`) are visible at the same path inside.
//!
//! The container is reached from the host through `/proc/<leader>/root`, e.g. its
//! `/run/systemd/private`, and commands run inside with `nsenter`. Drop powers it off and, if
//! that takes too long, kills it — by PID only. Every container has its own directories and
//! machine name, so tests may boot several at once. The mounts live only in the private mount
//! namespace, which disappears with the container's processes.
//!
//! `nspawn` is started with `PR_SET_PDEATHSIG = SIGTERM` so that a test process that dies
//! without running Drop still powers its container off. The signal fires when the *thread*
//! that booted it exits: keep a container owned by the test function that booted it.

use std::fmt;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The one unit the container boots into.
const TARGET: &str = "warden-test.target";
/// How long boot may take.
const BOOT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a clean power-off may take before the container is killed.
const POWEROFF_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a container could not be booted.
pub struct BootError(String);

/// As Display: a test that returns the error prints it with Debug.
impl fmt::Debug for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "booting a systemd container: {}", self.0)
    }
}

impl std::error::Error for BootError {}

/// What a test may need that a machine may lack.
pub fn missing_requirement() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not root".into());
    }
    if find_in_path("systemd-nspawn").is_none() {
        return Some("systemd-nspawn not found (Debian package systemd-container)".into());
    }
    None
}

/// Whether a test that needs a systemd container should skip: only outside CI, and only
/// when a requirement is missing (the reason is printed). Under `CI=true` it never skips:
/// the test then fails at boot, naming what is missing.
pub fn should_skip(test: &str) -> bool {
    let Some(missing) = missing_requirement() else {
        return false;
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        return false;
    }
    eprintln!("SKIPPED {test}: {missing} (set CI=true to make this a failure)");
    true
}

/// The first `name` in `$PATH`.
fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A booted systemd in a throwaway container.
pub struct SystemdContainer {
    /// `unshare`, which became `systemd-nspawn` (it execs; no fork).
    nspawn: Child,
    /// systemd, the container's PID 1, as the host sees it.
    leader: u32,
    /// Our directory: `root/` (the mount point) and `units/` (the unit directory).
    dir: PathBuf,
    /// The machine name.
    machine: String,
    /// The cgroups of its own that nspawn was started in (see [`own_cgroups`]).
    cgroups: Vec<PathBuf>,
}

impl SystemdContainer {
    /// Boot a container and wait until its systemd answers on its private socket.
    pub fn boot() -> Result<Self, BootError> {
        Self::boot_with(&[])
    }

    /// [`Self::boot`] with extra `systemd-nspawn` arguments (e.g. `--capability=...`).
    pub fn boot_with(extra_args: &[&str]) -> Result<Self, BootError> {
        // The checkout and the binaries under test, read-only at the same paths: nspawn
        // mounts an empty tmpfs on /tmp, so a checkout under /tmp would be invisible.
        let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let workspace = crate_dir
            .ancestors()
            .nth(2)
            .unwrap_or(&crate_dir)
            .to_path_buf();
        let binaries = PathBuf::from(env!("CARGO_BIN_EXE_wardend"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| workspace.clone());
        let binds: Vec<String> = [workspace, binaries]
            .iter()
            .map(|p| format!("--bind-ro={}", p.display()))
            .collect();
        let mut nspawn_args: Vec<&str> = binds.iter().map(String::as_str).collect();
        nspawn_args.extend_from_slice(extra_args);
        let nspawn_args = nspawn_args.as_slice();
        if let Some(missing) = missing_requirement() {
            return Err(BootError(missing));
        }
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let machine = format!(
            "warden-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let dir = tempfile::Builder::new()
            .prefix("warden-nspawn-")
            .tempdir()
            .map_err(|e| BootError(format!("creating a temporary directory: {e}")))?
            // Removed by Drop, file by file and never recursively: `root/` is a mount point.
            .keep();
        let root = dir.join("root");
        let units = dir.join("units");
        let prepared = fs::create_dir(&root)
            .and_then(|()| fs::create_dir(&units))
            .and_then(|()| {
                fs::write(
                    units.join(TARGET),
                    "[Unit]\nDescription=warden test target\n",
                )
            });
        if let Err(e) = prepared {
            remove_dirs(&dir);
            return Err(BootError(format!("preparing {}: {e}", dir.display())));
        }
        let log = match fs::File::create(dir.join("console.log")) {
            Ok(log) => log,
            Err(e) => {
                remove_dirs(&dir);
                return Err(BootError(format!("creating the console log: {e}")));
            }
        };
        let cgroups = match own_cgroups(&machine) {
            Ok(c) => c,
            Err(e) => {
                remove_dirs(&dir);
                return Err(BootError(format!("creating the container's cgroups: {e}")));
            }
        };
        let nspawn = match spawn_nspawn(&root, &units, &machine, &cgroups, log, nspawn_args) {
            Ok(child) => child,
            Err(e) => {
                remove_cgroups(&cgroups);
                remove_dirs(&dir);
                return Err(BootError(format!("starting unshare/systemd-nspawn: {e}")));
            }
        };
        // From here on Drop cleans up; leader 0 means "not known yet".
        let mut container = Self {
            nspawn,
            leader: 0,
            dir,
            machine,
            cgroups,
        };
        container.wait_for_boot()?;
        Ok(container)
    }

    /// systemd's PID as the host sees it.
    pub fn leader_pid(&self) -> u32 {
        self.leader
    }

    /// The machine name.
    pub fn machine(&self) -> &str {
        &self.machine
    }

    /// The host path of a path inside the container.
    pub fn host_path(&self, inside: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{inside}", self.leader))
    }

    /// The host path of the container's `/run/systemd/private`.
    pub fn private_socket(&self) -> PathBuf {
        self.host_path("/run/systemd/private")
    }

    /// A stream connected to the container's `/run/systemd/private` (see [`Self::connect_unix`]).
    pub fn connect_private(&self) -> io::Result<UnixStream> {
        self.connect_unix("/run/systemd/private")
    }

    /// A stream connected to the Unix socket at `inside` (a path inside the container).
    /// systemd refuses a private connection whose peer has no PID in its namespace, so the
    /// `connect()` is made by a short-lived child forked into the container's PID namespace,
    /// on a socket this process created and keeps.
    pub fn connect_unix(&self, inside: &str) -> io::Result<UnixStream> {
        let pidns = fs::File::open(format!("/proc/{}/ns/pid", self.leader))?;
        let addr = sockaddr_un(&self.host_path(inside))?;
        // SAFETY: socket(2) with constant arguments; the result is checked and owned below.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd == -1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // setns changes the PID namespace of this thread's future children only: do it on a
        // thread of its own that ends right after.
        let raw = fd.as_raw_fd();
        std::thread::scope(|s| s.spawn(|| connect_from_pidns(&pidns, raw, &addr)).join())
            .map_err(|_| io::Error::other("connect thread panicked"))??;
        Ok(UnixStream::from(fd))
    }

    /// Run `argv` inside the container (all its namespaces).
    pub fn exec(&self, argv: &[&str]) -> io::Result<Output> {
        Command::new("nsenter")
            .arg("-t")
            .arg(self.leader.to_string())
            .arg("-a")
            .arg("--")
            .args(argv)
            .stdin(Stdio::null())
            .output()
    }

    /// Run `systemctl` inside the container.
    pub fn systemctl(&self, args: &[&str]) -> io::Result<Output> {
        let mut argv = vec!["systemctl", "--no-pager"];
        argv.extend_from_slice(args);
        self.exec(&argv)
    }

    /// One property of a unit, as `systemctl show -P` prints it.
    pub fn unit_property(&self, unit: &str, property: &str) -> io::Result<String> {
        let out = self.systemctl(&["show", "-P", property, unit])?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The loaded units matching `pattern` (any state).
    pub fn units_matching(&self, pattern: &str) -> io::Result<Vec<String>> {
        let out = self.systemctl(&["list-units", "--all", "--plain", "--no-legend", pattern])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect())
    }

    /// The console output so far.
    pub fn console(&self) -> String {
        fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// Wait until systemd runs inside and has reached its target.
    fn wait_for_boot(&mut self) -> Result<(), BootError> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.nspawn.try_wait() {
                return Err(BootError(format!(
                    "systemd-nspawn exited ({status}):\n{}",
                    self.console()
                )));
            }
            if self.leader == 0 {
                self.leader = systemd_child(self.nspawn.id()).unwrap_or(0);
            }
            if self.leader != 0 && self.private_socket().exists() {
                if let Ok(out) = self.systemctl(&["is-active", TARGET]) {
                    if String::from_utf8_lossy(&out.stdout).trim() == "active" {
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(BootError(format!(
                    "not booted after {BOOT_TIMEOUT:?}:\n{}",
                    self.console()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `unshare --mount --propagation private` → bind `/` onto `root` → exec `systemd-nspawn`.
///
/// nspawn's own seccomp allow-list (systemd 252) leaves out the Landlock system calls, so
/// inside the container they fail with EPERM; a systemd on a host has no such filter, and
/// wardend's exec shim needs them: they are added to the list.
fn spawn_nspawn(
    root: &Path,
    units: &Path,
    machine: &str,
    cgroups: &[PathBuf],
    log: fs::File,
    extra: &[&str],
) -> io::Result<Child> {
    // $1..$4 as named below; "$@" after `shift 4`: the extra nspawn arguments. The shell
    // first moves itself into the container's own cgroups ($WARDEN_CGROUPS).
    let script = r#"r=$1 m=$2 u=$3 t=$4; shift 4
        for g in $WARDEN_CGROUPS; do echo $$ > "$g/cgroup.procs" || exit 1; done
        mount --bind / "$r" && exec systemd-nspawn \
        -D "$r" -M "$m" --volatile=overlay --register=no --keep-unit -q \
        --bind-ro="$u":/etc/systemd/system \
        --system-call-filter='landlock_create_ruleset landlock_add_rule landlock_restrict_self' \
        "$@" -b -- --unit="$t""#;
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        script,
        "sh",
    ])
    .arg(root)
    .arg(machine)
    .arg(units)
    .arg(TARGET)
    .args(extra)
    .env(
        "WARDEN_CGROUPS",
        cgroups
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
    )
    .stdin(Stdio::null())
    .stdout(log.try_clone()?)
    .stderr(log);
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the
    // parent; it is all the closure does between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// A cgroup of the container's own, `<machine>`, in each hierarchy systemd uses (the
/// unified one and the named `systemd` one of a hybrid host, or the one of a pure v2
/// host). nspawn started without a unit (`--keep-unit`) puts the container's systemd in a
/// `payload` child of its own cgroup: without these, every concurrent container shared one
/// tree, and one systemd powering off removed the empty cgroup another had just made for a
/// unit it was starting (the unit failed with status 219, EXIT_CGROUP).
fn own_cgroups(machine: &str) -> io::Result<Vec<PathBuf>> {
    let mut made = vec![];
    for hierarchy in [
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup/systemd",
        "/sys/fs/cgroup",
    ] {
        let hierarchy = Path::new(hierarchy);
        if !hierarchy.join("cgroup.procs").exists() {
            continue;
        }
        let dir = hierarchy.join(machine);
        if let Err(e) = fs::create_dir(&dir) {
            remove_cgroups(&made);
            return Err(e);
        }
        made.push(dir);
    }
    Ok(made)
}

/// Remove the container's cgroups and whatever its systemd left in them, deepest first and
/// with `rmdir` only (a cgroup that still has processes stays, and says so).
fn remove_cgroups(cgroups: &[PathBuf]) {
    fn remove_tree(dir: &Path) -> io::Result<()> {
        for e in fs::read_dir(dir)?.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = remove_tree(&e.path());
            }
        }
        fs::remove_dir(dir)
    }
    // The container's last processes may still be on their way out when nspawn has exited.
    let deadline = Instant::now() + Duration::from_secs(5);
    for dir in cgroups {
        while let Err(e) = remove_tree(dir) {
            if e.kind() == io::ErrorKind::NotFound {
                break;
            }
            if Instant::now() > deadline {
                eprintln!("leaving cgroup {}: {e}", dir.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `path` as a `sockaddr_un`.
fn sockaddr_un(path: &Path) -> io::Result<libc::sockaddr_un> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_encoded_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::other(format!(
            "socket path too long: {}",
            path.display()
        )));
    }
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    Ok(addr)
}

/// Enter the PID namespace `pidns` for children, fork, and connect `fd` to `addr` in the
/// child, which exits with 0 or the errno. Runs on a thread of its own.
fn connect_from_pidns(pidns: &fs::File, fd: RawFd, addr: &libc::sockaddr_un) -> io::Result<()> {
    // SAFETY: setns(2) on a namespace descriptor we opened; it changes only this thread's
    // PID namespace for children.
    if unsafe { libc::setns(pidns.as_raw_fd(), libc::CLONE_NEWPID) } == -1 {
        return Err(io::Error::last_os_error());
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: fork(2) in a multi-threaded process: the child only calls connect(2) and
    // _exit(2), async-signal-safe, on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid == -1 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: in the child: connect the inherited socket, exit with the errno.
        unsafe {
            let rc = libc::connect(fd, std::ptr::from_ref(addr).cast(), len);
            libc::_exit(if rc == 0 {
                0
            } else {
                *libc::__errno_location()
            });
        }
    }
    let mut status = 0;
    // SAFETY: waitpid(2) on the child we just forked.
    if unsafe { libc::waitpid(pid, &mut status, 0) } == -1 {
        return Err(io::Error::last_os_error());
    }
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, errno) => Err(io::Error::from_raw_os_error(errno)),
        _ => Err(io::Error::other(format!(
            "connect helper ended with status {status}"
        ))),
    }
}

/// The child of `parent` that runs systemd (nspawn's child, the container's PID 1).
fn systemd_child(parent: u32) -> Option<u32> {
    let tasks = fs::read_dir(format!("/proc/{parent}/task")).ok()?;
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .find(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "systemd")
        })
}

/// Send `signal` to `pid` (ours: nspawn or the systemd it started).
fn kill(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid > 0 {
        // SAFETY: kill(2) with a PID this harness started; no memory is involved.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// Remove our directory without ever recursing: `remove_dir` refuses a directory that is not
/// empty, so even if the bind mount of `/` were visible here, nothing of the host's root could
/// be removed through it. (The device check only spares a pointless attempt.)
fn remove_dirs(dir: &Path) {
    let root = dir.join("root");
    let parent_dev = fs::metadata(dir).map(|m| m.dev()).ok();
    match (fs::metadata(&root), parent_dev) {
        (Ok(meta), Some(dev)) if meta.dev() == dev => {
            if let Err(e) = fs::remove_dir(&root) {
                eprintln!("leaving {}: {e}", root.display());
            }
        }
        (Ok(_), _) => eprintln!("leaving {}: still a mount point", root.display()),
        (Err(_), _) => {}
    }
    let units = dir.join("units");
    let _ = fs::remove_file(units.join(TARGET));
    let _ = fs::remove_dir(&units);
    let _ = fs::remove_file(dir.join("console.log"));
    // systemd-nspawn's lock file for the image directory, which it may leave behind.
    let _ = fs::remove_file(dir.join(".#root.lck"));
    let _ = fs::remove_dir(dir);
}

impl Drop for SystemdContainer {
    fn drop(&mut self) {
        // nspawn turns SIGTERM into a clean power-off of the container.
        kill(self.nspawn.id(), libc::SIGTERM);
        let deadline = Instant::now() + POWEROFF_TIMEOUT;
        loop {
            match self.nspawn.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    if self.leader != 0 {
                        kill(self.leader, libc::SIGKILL);
                    }
                    kill(self.nspawn.id(), libc::SIGKILL);
                    let _ = self.nspawn.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        // nspawn's per-machine directory on the host, when it is left behind (empty).
        let _ = fs::remove_dir(Path::new("/run/systemd/nspawn/propagate").join(&self.machine));
        remove_cgroups(&self.cgroups);
        remove_dirs(&self.dir);
    }
}
