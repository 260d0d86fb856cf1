//! The exec shim: the first program of every systemd unit, `wardend exec-shim [--scope LIST]
//! [--path PATH] -- ARGV0 ARGS...`. It puts itself in a Landlock domain of its own, looks
//! ARGV0 up in PATH like execvp — inside the unit's view and as the client, so no answer
//! depends on what only root can see — and executes the command with exactly that argv and
//! the environment systemd gave it.
//!
//! Why: on systemd 252 (no `PrivatePIDs`) a unit shares the host's PID namespace and runs
//! with the client's uid, so without a domain it could signal the client and the agent, read
//! their `/proc/PID/environ`, open their `/proc/PID/mem`, and walk `/proc/PID/root` past
//! `InaccessiblePaths` and `ProtectSystem`. A Landlock domain confines ptrace — and with it
//! every `/proc/PID/...` access that goes through `ptrace_may_access` — to the domain and the
//! domains nested in it (Landlock ABI 1); `LANDLOCK_SCOPE_SIGNAL` and
//! `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET` (ABI 6) confine signals and connections to abstract
//! Unix sockets the same way. The command still signals and traces its own children, and
//! systemd (outside the domain) still signals the command. The filesystem is not restricted
//! here: systemd's properties do that.
//!
//! This module owns both sides of the contract: what wardend asks for ([`ExecShim`], decided
//! once at start-up from the kernel's Landlock ABI) and the shim itself ([`main_if_invoked`],
//! called at the very top of `main`, before any runtime, logging or argument parsing).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The subcommand that runs the shim.
pub const SUBCOMMAND: &str = "exec-shim";

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask `landlock_create_ruleset` for the ABI version.
const CREATE_RULESET_VERSION: u32 = 1 << 0;
/// `LANDLOCK_ACCESS_FS_MAKE_BLOCK`: creating block devices (needs `CAP_MKNOD`, which a unit
/// never has): the one filesystem right handled when no scope is, because the kernel refuses
/// a ruleset that handles nothing. Denying it changes nothing a unit can do.
const ACCESS_FS_MAKE_BLOCK: u64 = 1 << 11;
/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET` (ABI 6).
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
/// `LANDLOCK_SCOPE_SIGNAL` (ABI 6).
const SCOPE_SIGNAL: u64 = 1 << 1;
/// The first ABI with scopes.
const ABI_SCOPES: u32 = 6;

/// `struct landlock_ruleset_attr` as of ABI 6. Older kernels accept the larger struct as
/// long as the fields they do not know are zero.
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// What a domain scopes beyond ptrace (which every Landlock domain confines).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scopes {
    /// Signals only to processes in the domain (`LANDLOCK_SCOPE_SIGNAL`).
    pub signal: bool,
    /// Abstract Unix sockets only of the domain (`LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`).
    pub abstract_unix: bool,
}

impl Scopes {
    /// Everything the kernel with Landlock ABI `abi` can scope.
    pub fn supported_by(abi: u32) -> Self {
        let scoped = abi >= ABI_SCOPES;
        Self {
            signal: scoped,
            abstract_unix: scoped,
        }
    }

    /// As the `--scope` argument says it: `signal,abstract-unix`, or `none`.
    pub fn to_arg(self) -> String {
        let mut names = Vec::new();
        if self.signal {
            names.push("signal");
        }
        if self.abstract_unix {
            names.push("abstract-unix");
        }
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(",")
        }
    }

    /// Parse a `--scope` argument.
    fn from_arg(arg: &str) -> Result<Self, String> {
        let mut scopes = Self::default();
        if arg == "none" {
            return Ok(scopes);
        }
        for name in arg.split(',') {
            match name {
                "signal" => scopes.signal = true,
                "abstract-unix" => scopes.abstract_unix = true,
                _ => return Err(format!("unknown scope {name:?}")),
            }
        }
        Ok(scopes)
    }

    /// The `scoped` bits of the ruleset.
    fn bits(self) -> u64 {
        let mut bits = 0;
        if self.signal {
            bits |= SCOPE_SIGNAL;
        }
        if self.abstract_unix {
            bits |= SCOPE_ABSTRACT_UNIX_SOCKET;
        }
        bits
    }
}

/// The Landlock ABI version of the running kernel; an error when Landlock is not built in
/// or not enabled (ENOSYS, EOPNOTSUPP).
pub fn landlock_abi() -> std::io::Result<u32> {
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the syscall only
    // returns a number; it reads and writes no memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    u32::try_from(rc).map_err(|_| std::io::Error::other("bad Landlock ABI version"))
}

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
        let abi = landlock_abi().map_err(|e| {
            format!(
                "the systemd backend needs Landlock to keep units away from the client's \
                 other processes, and this kernel has none ({e}; enable it with lsm=...,landlock)"
            )
        })?;
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

    /// The `ExecStartEx` argv that runs `argv` through the shim, `argv[0]` looked up in
    /// `path`, in a working directory that must be the inode `cwd` (device, inode).
    pub fn argv(&self, path: &str, cwd: (u64, u64), argv: &[String]) -> Vec<String> {
        let mut out = vec![
            "wardend".to_string(),
            SUBCOMMAND.to_string(),
            "--scope".to_string(),
            self.scopes.to_arg(),
            "--path".to_string(),
            path.to_string(),
            "--cwd".to_string(),
            format!("{}:{}", cwd.0, cwd.1),
            "--".to_string(),
        ];
        out.extend_from_slice(argv);
        out
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

/// A parsed shim command line.
#[derive(Debug, PartialEq, Eq)]
struct Invocation {
    scopes: Scopes,
    /// Where ARGV0 is looked up.
    path: String,
    /// The working directory the client passed, as (device, inode).
    cwd: Option<(u64, u64)>,
    argv: Vec<CString>,
}

/// Parse what follows `exec-shim`: `[--scope LIST] [--path PATH] [--cwd DEV:INO] -- ARGV0
/// ARGS...`.
fn parse(args: Vec<OsString>) -> Result<Invocation, String> {
    let mut args = args.into_iter();
    let mut scopes = Scopes::default();
    let mut path = crate::policy::DEFAULT_PATH.to_string();
    let mut cwd = None;
    loop {
        let arg = args.next().ok_or("missing `-- ARGV0`")?;
        match arg.as_bytes() {
            b"--" => break,
            b"--scope" => {
                let list = args.next().ok_or("--scope needs a value")?;
                scopes = Scopes::from_arg(&list.to_string_lossy())?;
            }
            b"--path" => {
                let value = args.next().ok_or("--path needs a value")?;
                path = value
                    .into_string()
                    .map_err(|_| "--path is not UTF-8".to_string())?;
            }
            b"--cwd" => {
                let value = args.next().ok_or("--cwd needs a value")?;
                let value = value.to_string_lossy();
                let (dev, ino) = value
                    .split_once(':')
                    .and_then(|(d, i)| Some((d.parse().ok()?, i.parse().ok()?)))
                    .ok_or_else(|| format!("--cwd {value:?} is not DEV:INO"))?;
                cwd = Some((dev, ino));
            }
            other => {
                return Err(format!(
                    "unexpected argument {:?}",
                    String::from_utf8_lossy(other)
                ))
            }
        }
    }
    let cstring = |s: OsString| {
        CString::new(s.into_vec()).map_err(|_| "an argument contains a NUL byte".to_string())
    };
    let argv = args.map(cstring).collect::<Result<Vec<_>, _>>()?;
    if argv.first().is_none_or(|a| a.is_empty()) {
        return Err("missing ARGV0".into());
    }
    Ok(Invocation {
        scopes,
        path,
        cwd,
        argv,
    })
}

/// Run the shim when this process was started as `wardend exec-shim ...`; `None` otherwise.
/// Returns only on failure (the exit code to leave with); on success the process is the
/// command.
pub fn main_if_invoked() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(std::ffi::OsStr::new(SUBCOMMAND)) {
        return None;
    }
    let inv = match parse(args.collect()) {
        Ok(inv) => inv,
        Err(e) => {
            eprintln!("warden: exec-shim: {e}");
            return Some(ExitCode::from(125));
        }
    };
    if let Err(e) = restrict_self(inv.scopes) {
        eprintln!("warden: landlock: {e}");
        return Some(ExitCode::from(125));
    }
    // systemd set the unit's view up by path: if a path changed in between (a symlink
    // swapped in by another unit), the working directory is not the one the client passed,
    // and nothing of this unit's view can be trusted. Run nothing.
    if let Some(expected) = inv.cwd {
        use std::os::unix::fs::MetadataExt;
        let here = std::fs::metadata(".").map(|m| (m.dev(), m.ino()));
        if here.as_ref().ok() != Some(&expected) {
            eprintln!("warden: the working directory changed while the unit was set up");
            return Some(ExitCode::from(125));
        }
    }
    let errno = exec(&inv);
    let command = inv
        .argv
        .first()
        .map(|a| a.to_string_lossy())
        .unwrap_or_default();
    // The same words and codes as the native backend's (the client prints them alike).
    if errno == libc::ENOENT || errno == libc::ENOTDIR {
        eprintln!("{command}: command not found");
        Some(ExitCode::from(127))
    } else {
        eprintln!("{command}: {}", crate::units::errno_text(errno));
        Some(ExitCode::from(126))
    }
}

/// Enter a new Landlock domain that scopes `scopes` (and, as every domain does, ptrace).
fn restrict_self(scopes: Scopes) -> std::io::Result<()> {
    let scoped = scopes.bits();
    let attr = RulesetAttr {
        handled_access_fs: if scoped == 0 { ACCESS_FS_MAKE_BLOCK } else { 0 },
        handled_access_net: 0,
        scoped,
    };
    // SAFETY: `attr` is a live, initialised `landlock_ruleset_attr` of the size passed; the
    // kernel only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &raw const attr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::other("bad ruleset descriptor"))?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    let ruleset = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // systemd set it already (NoNewPrivileges=yes); restrict_self needs it.
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes no pointers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a ruleset descriptor and flags 0; no memory is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_restrict_self,
            std::os::fd::AsRawFd::as_raw_fd(&ruleset),
            0u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Execute the command, looked up like execvp; returns only the errno to report: EACCES
/// if a candidate existed but could not be executed, else the last error.
fn exec(inv: &Invocation) -> i32 {
    // Rust's runtime ignored SIGPIPE before main, and an ignored signal stays ignored across
    // exec: give the command the default, as a shell would.
    // SAFETY: setting SIG_DFL installs no handler code.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let mut argv: Vec<*const libc::c_char> = inv.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let command = inv
        .argv
        .first()
        .map(|a| a.to_string_lossy())
        .unwrap_or_default();
    let mut result = libc::ENOENT;
    for candidate in crate::units::exec_candidates(&command, &inv.path) {
        let Ok(candidate) = CString::new(candidate) else {
            continue;
        };
        // SAFETY: `candidate` and every `argv` entry are NUL-terminated strings that outlive
        // the call, and `argv` ends with a null pointer. execv keeps the environment.
        unsafe { libc::execv(candidate.as_ptr(), argv.as_ptr()) };
        match std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
        {
            libc::EACCES => result = libc::EACCES,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            other => return other,
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn c(s: &str) -> Result<CString, std::ffi::NulError> {
        CString::new(s)
    }

    #[test]
    fn parses_scopes_exe_and_verbatim_argv() -> Result<(), Box<dyn std::error::Error>> {
        let inv = parse(os(&[
            "--scope",
            "signal,abstract-unix",
            "--path",
            "/opt/bin:/bin",
            "--cwd",
            "2049:77",
            "--",
            "printf",
            "--",
            "$HOME",
            "",
            "--scope",
        ]))?;
        assert_eq!(
            inv.scopes,
            Scopes {
                signal: true,
                abstract_unix: true
            }
        );
        assert_eq!(inv.path, "/opt/bin:/bin");
        assert_eq!(inv.cwd, Some((2049, 77)));
        assert_eq!(
            inv.argv,
            vec![c("printf")?, c("--")?, c("$HOME")?, c("")?, c("--scope")?]
        );
        let none = parse(os(&["--scope", "none", "--", "true"]))?;
        assert_eq!(none.scopes, Scopes::default());
        assert_eq!(none.path, crate::policy::DEFAULT_PATH);
        let bare = parse(os(&["--", "/bin/true"]))?;
        assert_eq!(bare.scopes, Scopes::default());
        Ok(())
    }

    #[test]
    fn refuses_malformed_command_lines() {
        for bad in [
            &[][..],
            &["/bin/true", "true"][..],
            &["--"][..],
            &["--", ""][..],
            &["--scope"][..],
            &["--path"][..],
            &["--cwd", "12", "--", "true"][..],
            &["--scope", "signal,ptrace", "--", "true"][..],
            &["--bogus", "--", "true"][..],
        ] {
            assert!(parse(os(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn argv_round_trips_through_the_parser() -> Result<(), Box<dyn std::error::Error>> {
        let shim = ExecShim::new(PathBuf::from("/usr/sbin/wardend"), 7)?;
        let argv = vec!["sh".to_string(), "-c".to_string(), "echo $$".to_string()];
        let full = shim.argv("/usr/bin:/bin", (1, 2), &argv);
        assert_eq!(&full[..2], ["wardend", SUBCOMMAND]);
        let inv = parse(full[2..].iter().map(OsString::from).collect())?;
        assert_eq!(inv.scopes, Scopes::supported_by(7));
        assert_eq!(inv.path, "/usr/bin:/bin");
        assert_eq!(inv.cwd, Some((1, 2)));
        assert_eq!(inv.argv, vec![c("sh")?, c("-c")?, c("echo $$")?]);
        Ok(())
    }

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
}
