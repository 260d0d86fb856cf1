//! The exec shim: the first program of every systemd unit, `wardend exec-shim`. It is
//! wardend's own executable, started by systemd as root inside the unit's sandbox with a
//! fixed command line and systemd's own environment; the command arrives as a credential.
//! It enters a pid and mount namespace of its own, mounts a fresh `/proc`, drops to the
//! client account, enters a Landlock domain, and runs the command under the native backend's
//! seccomp filter (see [`run`] for the sequence).
//!
//! Why: on systemd 252 (no `PrivatePIDs`) a unit shares the host's PID namespace; without
//! the shim it could signal the client and the agent, read their `/proc/PID/environ`, open
//! their `/proc/PID/mem`, and walk `/proc/PID/root` past `InaccessiblePaths`. And whatever
//! the request carries must never reach code that runs before those restrictions: an
//! `LD_PRELOAD` in the environment systemd starts the shim with would run before `main`.
//!
//! This module owns both sides of the contract: what wardend asks for ([`ExecShim`],
//! decided once at start-up; the [`spec`] it writes for each unit) and the shim itself
//! ([`main_if_invoked`], called at the very top of `main`, before any runtime, logging or
//! argument parsing). [`landlock`] holds the Landlock bits.

pub mod landlock;
mod run;
pub mod spec;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use self::landlock::{landlock_abi, Scopes};

/// The subcommand that runs the shim.
pub const SUBCOMMAND: &str = "exec-shim";

/// How the systemd backend starts a command: through this daemon's own executable, asking for
/// the scopes the kernel supports. Decided once at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecShim {
    /// wardend's own executable, as the unit sees it.
    pub path: PathBuf,
    /// The kernel's Landlock ABI.
    pub abi: u32,
    /// What the domain scopes beyond ptrace.
    pub scopes: Scopes,
}

impl ExecShim {
    /// The shim of this daemon: its executable (`/proc/self/exe`) and the kernel's Landlock
    /// ABI. Fails when the kernel has no Landlock (a unit could then signal and trace the
    /// client's other processes and read through their `/proc/PID/root`: no unit runs
    /// weaker than that silently) or when the executable would not be visible in a unit.
    pub fn for_this_daemon() -> Result<Self, String> {
        // 0: no Landlock (the unit's own pid namespace still keeps the client's processes
        // out of reach; abstract sockets of the host's network namespace are not scoped).
        let abi = landlock_abi().unwrap_or(0);
        let path = std::fs::read_link("/proc/self/exe")
            .map_err(|e| format!("reading /proc/self/exe: {e}"))?;
        let path = if PRIVATE_IN_UNITS.iter().any(|p| path.starts_with(p)) {
            copy_where_units_see_it(&path)?
        } else {
            path
        };
        Self::new(path, abi)
    }

    /// The shim at `path` (wardend's executable) for a kernel with Landlock ABI `abi`.
    pub fn new(path: PathBuf, abi: u32) -> Result<Self, String> {
        check_visible_in_units(&path)?;
        Ok(Self {
            path,
            abi,
            scopes: Scopes::supported_by(abi),
        })
    }

    /// What holds in a unit, for the start-up log.
    pub fn describe(&self) -> String {
        if self.abi == 0 {
            return "no Landlock: the unit's pid namespace keeps other processes out of \
                    reach; abstract Unix sockets are not scoped"
                .to_string();
        }
        let mut held = vec!["ptrace and /proc/PID access"];
        if self.scopes.signal {
            held.push("signals");
        }
        if self.scopes.abstract_unix {
            held.push("abstract Unix sockets");
        }
        format!(
            "Landlock ABI {}: {} confined to the unit",
            self.abi,
            held.join(", ")
        )
    }

    /// The `ExecStart` argv of every unit: fixed, nothing of the request in it (the command
    /// arrives as a credential, see [`spec`]).
    pub fn argv(&self) -> Vec<String> {
        vec!["wardend".to_string(), SUBCOMMAND.to_string()]
    }
}

/// Directories every systemd unit gets a private one of (/tmp, /var/tmp, /dev/shm, /run): a
/// shim there would not be found.
const PRIVATE_IN_UNITS: [&str; 4] = ["/tmp", "/var/tmp", "/dev/shm", "/run"];

/// Where a wardend started from a directory that units cannot see keeps a copy of itself.
/// (Not under `/run`: every unit has a private one of that too.)
const SHIM_COPY: &str = "/var/lib/wardend/exec-shim";

/// Copy wardend's executable to [`SHIM_COPY`] (root-owned, read-only, replaced atomically),
/// for a wardend run from a build or checkout under /tmp.
fn copy_where_units_see_it(exe: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let target = PathBuf::from(SHIM_COPY);
    let dir = target.parent().unwrap_or(Path::new("/run"));
    let step = |what: &str, e: std::io::Error| {
        format!("copying wardend to {}: {what}: {e}", target.display())
    };
    std::fs::create_dir_all(dir).map_err(|e| step("creating the directory", e))?;
    let tmp = dir.join(format!(".exec-shim.{}", std::process::id()));
    std::fs::copy(exe, &tmp).map_err(|e| step("copying", e))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| step("setting its mode", e))?;
    std::fs::rename(&tmp, &target).map_err(|e| step("renaming", e))?;
    Ok(target)
}

fn check_visible_in_units(path: &Path) -> Result<(), String> {
    let shown = path.display();
    if path.to_str().is_none() {
        return Err(format!("wardend's executable path {shown} is not UTF-8"));
    }
    if !path.is_absolute() || path.as_os_str().as_bytes().ends_with(b" (deleted)") {
        return Err(format!(
            "wardend's executable {shown} is gone (replaced while starting?)"
        ));
    }
    for private in PRIVATE_IN_UNITS {
        if path.starts_with(private) {
            return Err(format!(
                "wardend's executable {shown} is under {private}, which every systemd unit \
                 has a private one of, so the exec shim would not be found there: install \
                 wardend elsewhere (e.g. /usr/local/sbin)"
            ));
        }
    }
    Ok(())
}

/// Run the shim when this process was started as `wardend exec-shim`; `None` otherwise.
/// Returns only when the command ended (with its status) or could not be run.
pub fn main_if_invoked() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(std::ffi::OsStr::new(SUBCOMMAND)) {
        return None;
    }
    Some(run::main(args.collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_follow_the_abi() {
        assert_eq!(Scopes::supported_by(5).to_arg(), "none");
        assert_eq!(Scopes::supported_by(6).to_arg(), "signal,abstract-unix");
        assert!(ExecShim::new(PathBuf::from("/usr/sbin/wardend"), 5)
            .is_ok_and(|s| !s.describe().contains("signals")));
    }

    #[test]
    fn a_shim_under_a_private_directory_is_refused() {
        for path in [
            "/tmp/x/wardend",
            "/var/tmp/wardend",
            "/dev/shm/wardend",
            "/run/wardend",
        ] {
            assert!(ExecShim::new(PathBuf::from(path), 7).is_err(), "{path}");
        }
        assert!(ExecShim::new(PathBuf::from("/usr/sbin/wardend (deleted)"), 7).is_err());
    }

    #[test]
    fn the_command_line_is_fixed() -> Result<(), String> {
        let shim = ExecShim::new(PathBuf::from("/usr/sbin/wardend"), 7)?;
        assert_eq!(shim.argv(), ["wardend", "exec-shim"]);
        Ok(())
    }
}
