//! Policy: a start request, its descriptors, the client account and the daemon's settings
//! become one fully validated [`UnitSpec`] — every check done and every path resolved
//! before a backend touches the system. Nothing here changes the system, but for one thing
//! made as the client: a repository's missing `.git/hooks` (see [`view`]).
//!
//! [`profile`] holds the profiles and the admin's ceiling; [`env`] filters the environment;
//! [`view`] resolves the filesystem view (hidden, protected, writable, host sockets) on the
//! host, with [`sockets`] (the host's bound Unix sockets) and [`client_creds`] (checks made
//! with the client's own credentials).

pub mod client_creds;
pub mod env;
pub mod profile;
pub mod sockets;
pub mod view;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use warden_proto::{ErrorCode, FdRole, Response, StartRequest};

use crate::account::Account;
use crate::units::{Limits, UnitName, UnitSpec};

use self::profile::{ProfileError, Profiles};

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
    /// The cwd is no place to run a unit from.
    #[error("refused: working directory {} {why}; {fix}", path.display())]
    CwdRefused {
        /// The working directory.
        path: PathBuf,
        /// Why it is refused.
        why: String,
        /// What to do instead.
        fix: &'static str,
    },
    /// A variable given explicitly (`--env`) would be removed by policy.
    #[error("refused: environment variable {name}: {why}; warden does not pass it to units")]
    EnvDenied {
        /// Its name.
        name: String,
        /// Why policy removes it.
        why: String,
    },
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
            PolicyError::Pty
            | PolicyError::Profile(_)
            | PolicyError::CwdHidden(_)
            | PolicyError::CwdRefused { .. }
            | PolicyError::EnvDenied { .. } => ErrorCode::Refused,
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

/// The descriptors of a start frame, by role: the cwd, and stdin, stdout, stderr.
pub type Descriptors = (OwnedFd, [Option<OwnedFd>; 3]);

/// Build the spec of unit `name` from a start request and its working directory. The spec's
/// stdio is left empty for the caller to fill. Reads client-chosen paths: may block (see
/// `blocking`).
pub fn build(
    name: UnitName,
    req: StartRequest,
    cwd: OwnedFd,
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
    // As the client: the path must lead back to the directory for the client too.
    let cwd_path = client_creds::as_client(account, || cwd_path(&cwd))??;
    let ceiling = &settings.profiles.ceiling;
    let deny = [ceiling.env_deny.as_slice(), profile.env_deny.as_slice()];
    let rules = env::Rules {
        pass: &profile.env_pass,
        deny: &deny,
        allow: &ceiling.env_allow,
    };
    for name in &req.explicit_env {
        let value = req
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str());
        if let Some(why) = rules.denies(name, value) {
            return Err(PolicyError::EnvDenied {
                name: name.clone(),
                why,
            });
        }
    }
    let path = req
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or(DEFAULT_PATH, |(_, v)| v.as_str())
        .to_string();
    let env = rules.filter(req.env);
    let fs = view::resolve(&view::Inputs {
        cwd: cwd.as_fd(),
        cwd_path: &cwd_path,
        profile: &profile,
        ceiling,
        socket_dir: &settings.socket_dir,
        account,
    })?;
    Ok(UnitSpec {
        name,
        argv: req.argv,
        path,
        env,
        cwd,
        cwd_path,
        stdio: [None, None, None],
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
            cpu_weight: profile.cpu_weight,
            timeout: profile.timeout,
        },
    })
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

/// Pair the descriptors of a start frame with the roles it declares: exactly one cwd, each
/// role at most once. Cheap (no filesystem access): the session does it on the runtime and
/// keeps the client's stdio out of [`build`], which may block on a stalled mount.
pub fn assign_fds(roles: &[FdRole], fds: Vec<OwnedFd>) -> Result<Descriptors, PolicyError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn dir_fd(p: &Path) -> std::io::Result<OwnedFd> {
        Ok(std::fs::File::open(p)?.into())
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
