//! Units: the one seam between the server and the backends.
//!
//! The server hands a fully validated [`UnitSpec`] to a [`UnitManager`] and gets back a
//! [`RunningUnit`] it can wait for, signal and stop. It never knows which backend it has:
//! [`Backend`] is the enum of implementations, chosen once at start-up by [`Backend::open`].
//! Each backend lives in its own module (`systemd`, `native`).

pub mod cleanup;
pub mod init;
pub mod name;
pub mod native;
pub mod systemd;

use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use warden_proto::{ExitReport, Network};

pub use name::UnitName;

/// Which backend to use, as the command line and config say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// systemd when PID 1 is systemd and reachable, else native.
    Auto,
    /// Transient systemd services over D-Bus.
    Systemd,
    /// wardend's own namespaces and cgroups.
    Native,
}

/// Resource limits of a unit. `None` means no limit beyond the host's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Memory limit in bytes.
    pub memory_max: Option<u64>,
    /// Most tasks.
    pub tasks_max: Option<u64>,
    /// CPU quota in percent of one CPU (e.g. 200 = two CPUs).
    pub cpu_quota_percent: Option<u32>,
    /// CPU weight against other units and the daemon (cgroup v2 scale, 1–10000).
    pub cpu_weight: Option<u32>,
    /// Wall-time limit.
    pub timeout: Option<Duration>,
}

/// The filesystem view of a unit, beyond the baseline every unit gets (the system
/// read-only, the home read-only, private `/tmp`, `/var/tmp`, `/run`, `/dev`, `/proc`,
/// `/sys`). Every path is canonical (see `policy::view`): a backend mounts by descriptor and
/// fails a start where one has become a symlink since.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsView {
    /// Whether the working directory is writable. It is not when it is `/`, the home, or
    /// an ancestor of the home, of a hidden path or of a private directory, or inside a
    /// protected path: the command then runs there read-only.
    pub cwd_writable: bool,
    /// Extra paths that stay writable.
    pub writable: Vec<PathBuf>,
    /// Paths the unit cannot see at all (includes wardend's socket directory and every
    /// bind-mount alias of each).
    pub hidden: Vec<PathBuf>,
    /// Paths that stay read-only inside the writable ones (git hooks and config, editor and
    /// agent settings, shell start-up files); may be symlinks themselves.
    pub protected: Vec<PathBuf>,
    /// Directories mounted on themselves inside the writable ones, so that a protected path
    /// below cannot be renamed away with them (a repository's `.git`).
    pub pinned: Vec<PathBuf>,
    /// The host's bound Unix sockets a unit could otherwise reach by path: covered.
    pub sockets: Vec<PathBuf>,
    /// Kernel filesystems mounted outside the private directories, and other mounts of the
    /// host's private directories: covered.
    pub kernel_mounts: Vec<PathBuf>,
    /// Host files under `/run` that the private `/run` gets read-only (the resolver
    /// configuration).
    pub run_files: Vec<PathBuf>,
}

/// A fully validated description of one unit: every check done, every path resolved.
/// A backend takes it by value and only acts on it.
#[derive(Debug)]
pub struct UnitSpec {
    /// The unit's name.
    pub name: UnitName,
    /// The command as requested (`argv[0]` as the command will see it).
    pub argv: Vec<String>,
    /// The `PATH` `argv[0]` is looked up in (like execvp), inside the unit, with the
    /// client's credentials: no answer depends on what only root can see.
    pub path: String,
    /// The command's environment, already filtered by policy.
    pub env: Vec<(String, String)>,
    /// The working directory: a directory fd, and its path, checked to be the same inode.
    pub cwd: OwnedFd,
    /// The path of `cwd` (device and inode re-checked).
    pub cwd_path: PathBuf,
    /// Standard input, output and error; `None` means `/dev/null`.
    pub stdio: [Option<OwnedFd>; 3],
    /// The client account's name.
    pub user: String,
    /// The client's uid.
    pub uid: u32,
    /// The client's primary gid.
    pub gid: u32,
    /// The client's supplementary groups.
    pub groups: Vec<u32>,
    /// The client's home directory (read-only in the unit).
    pub home: Option<PathBuf>,
    /// Filesystem view.
    pub fs: FsView,
    /// Network access.
    pub network: Network,
    /// Resource limits.
    pub limits: Limits,
}

/// What a backend can fail at. Each variant says which step failed on what.
#[derive(Debug, thiserror::Error)]
pub enum UnitError {
    /// The unit manager cannot be reached (systemd down, cgroup hierarchy missing).
    #[error("cannot reach the unit manager: {0}")]
    Unreachable(String),
    /// Starting the unit failed.
    #[error("starting unit {unit}: {cause}")]
    Start {
        /// The unit.
        unit: String,
        /// What failed.
        cause: String,
    },
    /// Controlling a unit (signal, stop, wait) failed.
    #[error("{op} unit {unit}: {cause}")]
    Control {
        /// What was being done: "stop", "signal", "wait", ...
        op: &'static str,
        /// The unit.
        unit: String,
        /// What failed.
        cause: String,
    },
    /// The command was not found (looked up inside the unit, as the client).
    #[error("{0}: command not found")]
    NotFound(String),
    /// The command was found but cannot be executed.
    #[error("{command}: {why}")]
    NotExecutable {
        /// `argv[0]`.
        command: String,
        /// Why (`permission denied`, `exec format error`).
        why: String,
    },
    /// The host lacks what the backend needs to keep its promises.
    #[error("{0}")]
    Unsupported(String),
    /// A privileged step on the host failed.
    #[error("{step} {path}: {source}")]
    Io {
        /// The step.
        step: &'static str,
        /// On what.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// An errno as people read it: "permission denied", "exec format error".
pub fn errno_text(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| c.to_lowercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Where execvp would look for `cmd`: `cmd` itself if it has a slash, else each entry of
/// `path` (an empty entry is the working directory).
pub fn exec_candidates(cmd: &str, path: &str) -> Vec<String> {
    if cmd.contains('/') {
        return vec![cmd.to_string()];
    }
    path.split(':')
        .map(|dir| {
            if dir.is_empty() {
                cmd.to_string()
            } else {
                format!("{}/{cmd}", dir.trim_end_matches('/'))
            }
        })
        .collect()
}

/// A started unit. Dropping it without [`RunningUnit::stop`] is a bug the session guards
/// against; backends should still not leak on drop where they can help it.
pub trait RunningUnit: Send + 'static {
    /// The unit's name.
    fn name(&self) -> &UnitName;

    /// Wait until the unit's main process has ended and report how. Cancel-safe: the
    /// future may be dropped and `wait` called again.
    fn wait(&mut self) -> impl Future<Output = Result<ExitReport, UnitError>> + Send;

    /// Deliver `signal` to the unit's main process.
    fn signal(&self, signal: i32) -> impl Future<Output = Result<(), UnitError>> + Send;

    /// Stop the whole unit (every process in it) and release it. Idempotent: a second call,
    /// or a call after the unit ended by itself, only releases what is left.
    fn stop(&mut self) -> impl Future<Output = Result<(), UnitError>> + Send;
}

/// A unit manager: one per daemon. Its methods take `&self` and may run concurrently.
pub trait UnitManager: Send + Sync + 'static {
    /// The handle of a started unit.
    type Unit: RunningUnit;

    /// `systemd` or `native`.
    fn backend(&self) -> &'static str;

    /// Start a unit from a validated spec.
    fn start(&self, spec: UnitSpec) -> impl Future<Output = Result<Self::Unit, UnitError>> + Send;

    /// Stop and remove every unit of this daemon's prefix; return their names. Runs before
    /// the socket listens.
    fn cleanup_orphans(&self) -> impl Future<Output = Result<Vec<String>, UnitError>> + Send;

    /// The main PID of the unit `pid` runs in, when the manager can tell.
    fn main_pid_of(&self, pid: u32) -> impl Future<Output = Option<u32>> + Send;

    /// The cleanups of units dropped without `stop`: shutdown drains them.
    fn cleanups(&self) -> &cleanup::Cleanups;
}

/// The backends, chosen once at start-up.
pub enum Backend {
    /// Transient systemd services.
    Systemd(systemd::SystemdManager),
    /// wardend's own namespaces and cgroups.
    Native(native::NativeManager),
}

/// A unit of either backend.
pub enum AnyUnit {
    /// A systemd unit.
    Systemd(<systemd::SystemdManager as UnitManager>::Unit),
    /// A native unit.
    Native(<native::NativeManager as UnitManager>::Unit),
}

impl Backend {
    /// Open the backend `kind` asks for (`auto`: systemd when PID 1 is systemd, reachable,
    /// and the kernel has Landlock for the exec shim; else native).
    pub async fn open(kind: BackendKind, prefix: &str) -> Result<Self, UnitError> {
        match kind {
            BackendKind::Systemd => Ok(Self::Systemd(Self::open_systemd(prefix).await?)),
            BackendKind::Native => Ok(Self::Native(native::NativeManager::new(prefix)?)),
            BackendKind::Auto => {
                if systemd::pid1_is_systemd() {
                    match Self::open_systemd(prefix).await {
                        Ok(m) => return Ok(Self::Systemd(m)),
                        Err(e) => tracing::warn!(error = %e, "not using the systemd backend"),
                    }
                }
                Ok(Self::Native(native::NativeManager::new(prefix)?))
            }
        }
    }

    /// The systemd backend, every unit started through this daemon's exec shim (see
    /// [`crate::shim`]): its own pid namespace on every kernel; a Landlock domain where the
    /// kernel has one.
    async fn open_systemd(prefix: &str) -> Result<systemd::SystemdManager, UnitError> {
        let shim = crate::shim::ExecShim::for_this_daemon().map_err(UnitError::Unsupported)?;
        if shim.scopes.abstract_unix {
            tracing::info!("systemd units: {}", shim.describe());
        } else {
            tracing::warn!(
                "systemd units: {}; abstract Unix sockets of the host's network namespace \
                 are reachable from units with the host's network (Landlock ABI 6, Linux \
                 6.12, scopes them)",
                shim.describe()
            );
        }
        systemd::SystemdManager::connect(prefix)
            .await?
            .with_exec_shim(shim)
            .with_lifeline()
            .await
    }
}

impl RunningUnit for AnyUnit {
    fn name(&self) -> &UnitName {
        match self {
            AnyUnit::Systemd(u) => u.name(),
            AnyUnit::Native(u) => u.name(),
        }
    }

    async fn wait(&mut self) -> Result<ExitReport, UnitError> {
        match self {
            AnyUnit::Systemd(u) => u.wait().await,
            AnyUnit::Native(u) => u.wait().await,
        }
    }

    async fn signal(&self, signal: i32) -> Result<(), UnitError> {
        match self {
            AnyUnit::Systemd(u) => u.signal(signal).await,
            AnyUnit::Native(u) => u.signal(signal).await,
        }
    }

    async fn stop(&mut self) -> Result<(), UnitError> {
        match self {
            AnyUnit::Systemd(u) => u.stop().await,
            AnyUnit::Native(u) => u.stop().await,
        }
    }
}

impl UnitManager for Backend {
    type Unit = AnyUnit;

    fn backend(&self) -> &'static str {
        match self {
            Backend::Systemd(m) => m.backend(),
            Backend::Native(m) => m.backend(),
        }
    }

    async fn start(&self, spec: UnitSpec) -> Result<AnyUnit, UnitError> {
        match self {
            Backend::Systemd(m) => m.start(spec).await.map(AnyUnit::Systemd),
            Backend::Native(m) => m.start(spec).await.map(AnyUnit::Native),
        }
    }

    async fn cleanup_orphans(&self) -> Result<Vec<String>, UnitError> {
        match self {
            Backend::Systemd(m) => m.cleanup_orphans().await,
            Backend::Native(m) => m.cleanup_orphans().await,
        }
    }

    async fn main_pid_of(&self, pid: u32) -> Option<u32> {
        match self {
            Backend::Systemd(m) => m.main_pid_of(pid).await,
            Backend::Native(m) => m.main_pid_of(pid).await,
        }
    }

    fn cleanups(&self) -> &cleanup::Cleanups {
        match self {
            Backend::Systemd(m) => m.cleanups(),
            Backend::Native(m) => m.cleanups(),
        }
    }
}
