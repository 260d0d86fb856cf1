//! Policy: a start request, its descriptors, the client account and the daemon's settings
//! become one fully validated [`UnitSpec`] — every check done and every path resolved
//! before a backend touches the system. Nothing here changes the system.
//!
//! [`profile`] holds the profiles and the admin's ceiling; [`env`] filters the environment.

pub mod env;
pub mod profile;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use warden_proto::{ErrorCode, FdRole, Response, StartRequest};

use crate::account::Account;
use crate::units::{FsView, Limits, UnitName, UnitSpec};

use self::profile::{Profile, ProfileError, Profiles, BUILTIN_HIDDEN};

/// PATH used to resolve the command when the request has none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Why a request cannot become a unit. The message is what the client prints.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Empty argv or an empty command name.
    #[error("protocol error: empty command")]
    EmptyCommand,
    /// A string holds a NUL byte.
    #[error("protocol error: {0} contains a NUL byte")]
    Nul(&'static str),
    /// An environment name is not valid.
    #[error("protocol error: invalid environment variable name {0:?}")]
    EnvName(String),
    /// The descriptors do not match their roles.
    #[error("protocol error: {0}")]
    Fds(String),
    /// The cwd descriptor is not a directory.
    #[error("protocol error: cwd descriptor is not a directory")]
    CwdNotDir,
    /// The cwd's path does not lead back to the same directory.
    #[error("working directory {0} cannot be reached by path")]
    CwdUnreachable(PathBuf),
    /// The cwd is inside a path every unit has hidden.
    #[error("refused: working directory {0} is inside a hidden path")]
    CwdHidden(PathBuf),
    /// The command does not exist.
    #[error("{0}: command not found")]
    NotFound(String),
    /// The command exists but the client cannot execute it.
    #[error("{0}: permission denied")]
    NotExecutable(String),
    /// A pty was asked for.
    #[error("refused: pty is not supported yet")]
    Pty,
    /// The profile is unknown or the request would loosen it.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// Something on the host failed while checking.
    #[error("checking the request: {0}")]
    Io(#[from] std::io::Error),
}

impl PolicyError {
    /// The error frame for this refusal.
    pub fn response(&self) -> Response {
        let code = match self {
            PolicyError::NotFound(_) => ErrorCode::NotFound,
            PolicyError::NotExecutable(_) => ErrorCode::NotExecutable,
            PolicyError::Pty | PolicyError::Profile(_) | PolicyError::CwdHidden(_) => {
                ErrorCode::Refused
            }
            PolicyError::Io(_) | PolicyError::CwdUnreachable(_) => ErrorCode::Internal,
            _ => ErrorCode::Protocol,
        };
        Response::error(code, self.to_string())
    }
}

/// What the daemon contributes to every unit.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The directory holding wardend's socket: hidden in every unit.
    pub socket_dir: PathBuf,
    /// The profiles and their ceiling.
    pub profiles: Profiles,
}

/// Build the spec of unit `name` from a start request and the descriptors of its frame.
pub fn build(
    name: UnitName,
    req: StartRequest,
    fds: Vec<OwnedFd>,
    account: &Account,
    settings: &Settings,
) -> Result<UnitSpec, PolicyError> {
    if req.pty.is_some() {
        return Err(PolicyError::Pty);
    }
    check_argv(&req.argv)?;
    check_env(&req.env)?;
    let (_, profile) = settings
        .profiles
        .resolve(req.profile.as_deref(), &req.overrides)?;
    let (cwd, stdio) = assign_fds(&req.fds, fds)?;
    let cwd_path = cwd_path(&cwd)?;
    let path_var = req
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    let exe = resolve_exe(&req.argv[0], path_var, &cwd_path, account)?;
    let ceiling = &settings.profiles.ceiling;
    let env = env::filter(
        req.env,
        &profile.env_pass,
        &[&ceiling.env_deny, &profile.env_deny],
    );
    let fs = fs_view(&profile, settings, account);
    if fs.hidden.iter().any(|h| cwd_path.starts_with(h)) {
        return Err(PolicyError::CwdHidden(cwd_path));
    }
    Ok(UnitSpec {
        name,
        argv: req.argv,
        exe,
        env,
        cwd,
        cwd_path,
        stdio,
        user: account.name.clone(),
        uid: account.uid,
        gid: account.gid,
        groups: account.groups.clone(),
        home: Some(account.home.clone()),
        fs,
        network: profile.network,
        limits: Limits {
            memory_max: profile.memory_max,
            tasks_max: profile.tasks_max,
            cpu_quota_percent: profile.cpu_quota_percent,
            timeout: profile.timeout,
        },
    })
}

/// The paths a profile makes writable or hidden, resolved against the client's home and
/// kept only where they exist (a missing path has nothing to hide or to write to).
fn fs_view(profile: &Profile, settings: &Settings, account: &Account) -> FsView {
    let resolve = |p: &String| -> Option<PathBuf> {
        let path = match p.strip_prefix("~/") {
            Some(rel) => account.home.join(rel),
            None => PathBuf::from(p),
        };
        (path.is_absolute() && std::fs::symlink_metadata(&path).is_ok()).then_some(path)
    };
    let hidden_names = BUILTIN_HIDDEN
        .iter()
        .map(|s| s.to_string())
        .chain(settings.profiles.ceiling.hidden.iter().cloned())
        .chain(profile.hidden.iter().cloned())
        .collect::<Vec<_>>();
    let mut hidden: Vec<PathBuf> = hidden_names.iter().filter_map(resolve).collect();
    // The client's runtime directory: its session bus and `systemd --user`'s socket (either
    // one runs commands outside any sandbox), the gpg and ssh agents. A read-only mount
    // does not stop connect(2), so it is hidden, not just read-only.
    hidden.extend(resolve(&format!("/run/user/{}", account.uid)));
    hidden.push(settings.socket_dir.clone());
    FsView {
        writable: profile.writable.iter().filter_map(resolve).collect(),
        hidden,
    }
}

fn check_argv(argv: &[String]) -> Result<(), PolicyError> {
    match argv.first() {
        None => return Err(PolicyError::EmptyCommand),
        Some(a) if a.is_empty() => return Err(PolicyError::EmptyCommand),
        Some(_) => {}
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(PolicyError::Nul("argv"));
    }
    Ok(())
}

fn check_env(env: &[(String, String)]) -> Result<(), PolicyError> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(PolicyError::EnvName(k.clone()));
        }
        if v.contains('\0') {
            return Err(PolicyError::Nul("environment"));
        }
    }
    Ok(())
}

/// Pair descriptors with their declared roles: exactly one cwd, each role at most once.
fn assign_fds(
    roles: &[FdRole],
    fds: Vec<OwnedFd>,
) -> Result<(OwnedFd, [Option<OwnedFd>; 3]), PolicyError> {
    if roles.len() != fds.len() {
        return Err(PolicyError::Fds(format!(
            "{} roles declared for {} descriptors",
            roles.len(),
            fds.len()
        )));
    }
    let mut cwd = None;
    let mut stdio: [Option<OwnedFd>; 3] = [None, None, None];
    for (role, fd) in roles.iter().zip(fds) {
        let slot = match role {
            FdRole::Cwd => &mut cwd,
            FdRole::Stdin => &mut stdio[0],
            FdRole::Stdout => &mut stdio[1],
            FdRole::Stderr => &mut stdio[2],
        };
        if slot.replace(fd).is_some() {
            return Err(PolicyError::Fds(format!(
                "descriptor role {role:?} given twice"
            )));
        }
    }
    let cwd = cwd.ok_or_else(|| PolicyError::Fds("start carries no cwd descriptor".into()))?;
    Ok((cwd, stdio))
}

/// The path of a directory descriptor, re-checked: the path must lead to the same device
/// and inode (systemd takes a working directory by path only).
fn cwd_path(cwd: &OwnedFd) -> Result<PathBuf, PolicyError> {
    let st = rustix::fs::fstat(cwd.as_fd()).map_err(std::io::Error::from)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory {
        return Err(PolicyError::CwdNotDir);
    }
    let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(cwd));
    let path = std::fs::read_link(&link)?;
    let same = std::fs::metadata(&path)
        .map(|m| m.dev() == st.st_dev && m.ino() == st.st_ino)
        .unwrap_or(false);
    if !path.is_absolute() || !same {
        return Err(PolicyError::CwdUnreachable(path));
    }
    Ok(path)
}

/// Resolve `cmd` like execvp: a name with a slash is taken as a path (relative to the cwd),
/// else each PATH entry is tried in order. The file must be a regular file the client
/// account may execute.
pub fn resolve_exe(
    cmd: &str,
    path_var: &str,
    cwd: &Path,
    account: &Account,
) -> Result<PathBuf, PolicyError> {
    let candidates: Vec<PathBuf> = if cmd.contains('/') {
        vec![cwd.join(cmd)]
    } else {
        path_var
            .split(':')
            .map(|dir| {
                if dir.is_empty() {
                    Path::new(".")
                } else {
                    Path::new(dir)
                }
            })
            .map(|dir| cwd.join(dir).join(cmd))
            .collect()
    };
    let mut denied = false;
    for c in candidates {
        match std::fs::metadata(&c) {
            Ok(m) if m.is_file() && may_execute(&m, account) => return Ok(c),
            Ok(_) => denied = true,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => denied = true,
            Err(_) => {}
        }
    }
    if denied {
        Err(PolicyError::NotExecutable(cmd.to_string()))
    } else {
        Err(PolicyError::NotFound(cmd.to_string()))
    }
}

/// Whether the account's uid or groups have the execute bit on a file.
fn may_execute(m: &std::fs::Metadata, account: &Account) -> bool {
    let mode = m.mode();
    if m.uid() == account.uid {
        mode & 0o100 != 0
    } else if account.groups.contains(&m.gid()) || m.gid() == account.gid {
        mode & 0o010 != 0
    } else {
        mode & 0o001 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nobody() -> Account {
        Account {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
            home: "/nonexistent".into(),
        }
    }

    fn dir_fd(p: &Path) -> std::io::Result<OwnedFd> {
        Ok(std::fs::File::open(p)?.into())
    }

    #[test]
    fn resolves_like_execvp() -> Result<(), PolicyError> {
        let a = nobody();
        let sh = resolve_exe("sh", "/nonexistent:/bin", Path::new("/"), &a)?;
        assert_eq!(sh, PathBuf::from("/bin/sh"));
        assert!(matches!(
            resolve_exe("no-such-cmd-warden", DEFAULT_PATH, Path::new("/"), &a),
            Err(PolicyError::NotFound(_))
        ));
        // /etc/passwd exists but is not executable.
        assert!(matches!(
            resolve_exe("/etc/passwd", DEFAULT_PATH, Path::new("/"), &a),
            Err(PolicyError::NotExecutable(_))
        ));
        assert!(matches!(
            resolve_exe("etc", "/", Path::new("/"), &a),
            Err(PolicyError::NotExecutable(_))
        ));
        Ok(())
    }

    #[test]
    fn fds_must_match_roles() -> std::io::Result<()> {
        let one = || dir_fd(Path::new("/"));
        assert!(
            assign_fds(&[FdRole::Stdin], vec![one()?]).is_err(),
            "no cwd"
        );
        assert!(assign_fds(&[FdRole::Cwd, FdRole::Cwd], vec![one()?, one()?]).is_err());
        assert!(assign_fds(&[FdRole::Cwd], vec![]).is_err());
        let (_, stdio) = assign_fds(&[FdRole::Cwd, FdRole::Stderr], vec![one()?, one()?])
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        assert!(stdio[0].is_none() && stdio[1].is_none() && stdio[2].is_some());
        Ok(())
    }

    #[test]
    fn cwd_must_be_a_reachable_directory() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let fd = dir_fd(dir.path())?;
        let p = cwd_path(&fd).map_err(|e| std::io::Error::other(e.to_string()))?;
        assert_eq!(p, dir.path().canonicalize()?);
        let file: OwnedFd = std::fs::File::open("/etc/passwd")?.into();
        assert!(matches!(cwd_path(&file), Err(PolicyError::CwdNotDir)));
        Ok(())
    }

    #[test]
    fn bad_argv_and_env_are_refused() {
        assert!(check_argv(&[]).is_err());
        assert!(check_argv(&["".into()]).is_err());
        assert!(check_argv(&["a\0b".into()]).is_err());
        assert!(check_env(&[("A=B".into(), "x".into())]).is_err());
        assert!(check_env(&[("A".into(), "x\0".into())]).is_err());
        assert!(check_env(&[("A".into(), "x".into())]).is_ok());
    }
}
