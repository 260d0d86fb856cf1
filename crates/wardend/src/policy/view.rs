//! The unit's filesystem view, resolved on the host before a backend acts: which paths are
//! hidden (at their canonical targets and wherever a bind mount shows them again), whether
//! the working directory may be written, what stays read-only inside it, which host
//! sockets and kernel filesystems must be covered.
//!
//! Every path handed on is canonical (no symlink in it) at the time it was resolved; the
//! backends mount by descriptor and refuse a path that has become a symlink since, so a
//! race swaps nothing in. Reads the host; changes nothing but one thing, with the
//! client's own credentials: a repository's missing `.git/hooks` is created, so that it
//! can be kept read-only like every other hook directory.
//!
//! The working directory is attacker-chosen. It is refused when it is on a kernel
//! filesystem, under a directory every unit gets a private one of (`/proc`, `/sys`,
//! `/dev`, `/run`), or one of the shared temporary directories themselves. It is mounted
//! read-only (the command runs, but writes nothing there) when it is `/`, the home, or an
//! ancestor of the home, of a hidden path, of wardend's socket or of a private directory.

use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::account::Account;
use crate::mountinfo::{self, Mount, KERNEL_FILESYSTEMS};
use crate::units::FsView;

use super::client_creds::as_client;
use super::profile::{Ceiling, Profile, BUILTIN_HIDDEN, BUILTIN_PROTECTED};
use super::sockets::{self, BoundSocket};
use super::PolicyError;

/// Directories every unit gets a fresh, private one of: nothing of the host's below them
/// is ever in a unit (but the working directory or a writable path under `/tmp` or
/// `/var/tmp`, bound into the private one).
pub const PRIVATE_DIRS: &[&str] = &["/tmp", "/var/tmp", "/run", "/dev", "/proc", "/sys"];

/// Private directories no working directory may be under.
const NO_CWD_BELOW: &[&str] = &["/proc", "/sys", "/dev", "/run"];

/// Shared temporary directories: every user's and service's sockets and files are there.
const SHARED_TEMP: &[&str] = &["/tmp", "/var/tmp"];

/// Most entries of a writable directory looked at for nested repositories.
const NESTED_SCAN_LIMIT: usize = 512;

/// Directories not looked into for nested repositories (large, and never a repository).
const NOT_REPOSITORIES: &[&str] = &["node_modules", "target", ".git", "vendor", ".venv"];

/// Where every filesystem type a working directory is refused on comes from: `statfs`'
/// magic numbers, for the kernel filesystems that have their own.
const KERNEL_MAGIC: &[(i64, &str)] = &[
    (0x9fa0, "proc"),
    (0x6265_6572, "sysfs"),
    (0x1cd1, "devpts"),
    (0x0027_e0eb, "cgroup"),
    (0x6367_7270, "cgroup2"),
    (0xcafe_4a11, "bpf"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0x7363_6673, "securityfs"),
    (0x6265_6570, "configfs"),
    (0x6165_676c, "pstore"),
    (0xde5e_81e4, "efivarfs"),
    (0x1980_0202, "mqueue"),
    (0x6e73_6673, "nsfs"),
    (0x4249_4e4d, "binfmt_misc"),
    (0x6573_5543, "fusectl"),
];

/// What view resolution needs from the request and the daemon.
pub struct Inputs<'a> {
    /// The working directory the client passed.
    pub cwd: BorrowedFd<'a>,
    /// Its canonical path.
    pub cwd_path: &'a Path,
    /// The request's profile.
    pub profile: &'a Profile,
    /// The admin's ceiling.
    pub ceiling: &'a Ceiling,
    /// wardend's socket directory.
    pub socket_dir: &'a Path,
    /// The client account.
    pub account: &'a Account,
}

/// Resolve the view of a unit.
pub fn resolve(i: &Inputs<'_>) -> Result<FsView, PolicyError> {
    let mounts = mountinfo::read()?;
    let home = canonical(&i.account.home).unwrap_or_else(|| i.account.home.clone());
    let expand = |name: &str| -> PathBuf {
        match name.strip_prefix("~/") {
            Some(rel) => home.join(rel),
            None => PathBuf::from(name),
        }
    };

    let hidden_names = BUILTIN_HIDDEN
        .iter()
        .filter(|h| !i.ceiling.hidden_except.iter().any(|e| e == *h))
        .map(|s| s.to_string())
        .chain(i.ceiling.hidden.iter().cloned())
        .chain(i.profile.hidden.iter().cloned())
        .chain([format!("/run/user/{}", i.account.uid)]);
    let mut hidden = Vec::new();
    for name in hidden_names {
        let lexical = expand(&name);
        let Some(path) = canonical(&lexical) else {
            continue; // nothing there to hide
        };
        if path != Path::new("/") {
            with_aliases(&mounts, path, &mut hidden);
        }
        // A symlink (`~/.aws -> dotfiles/aws`) is covered itself too, not only its target.
        if let Some(link) = canonical_link(&lexical) {
            hidden.push(link);
        }
    }
    let socket_dir = canonical(i.socket_dir).unwrap_or_else(|| i.socket_dir.to_path_buf());
    with_aliases(&mounts, socket_dir.clone(), &mut hidden);
    dedup(&mut hidden);

    let cwd = i.cwd_path;
    if let Some(h) = hidden.iter().find(|h| cwd.starts_with(h)) {
        tracing::debug!(cwd = %cwd.display(), hidden = %h.display(), "cwd is hidden");
        return Err(PolicyError::CwdHidden(cwd.to_path_buf()));
    }
    refuse_cwd(i.cwd, cwd, &mounts)?;
    let protected_names: Vec<String> = BUILTIN_PROTECTED
        .iter()
        .filter(|p| !i.ceiling.protected_except.iter().any(|e| e == *p))
        .map(|s| s.to_string())
        .chain(i.ceiling.protected.iter().cloned())
        .chain(i.profile.protected.iter().cloned())
        .collect();
    let mut guarded = Vec::new();
    with_aliases(&mounts, home.clone(), &mut guarded);
    guarded.extend(hidden.iter().cloned());
    guarded.extend(PRIVATE_DIRS.iter().map(PathBuf::from));
    let cwd_writable = !guarded.iter().any(|g| g.starts_with(cwd))
        && inside_protected(cwd, &protected_names).is_none();

    let writable: Vec<PathBuf> = i
        .profile
        .writable
        .iter()
        .filter_map(|w| canonical(&expand(w)))
        .filter(|w| may_be_writable(w, &hidden))
        .filter(|w| inside_protected(w, &protected_names).is_none())
        .collect();
    let roots: Vec<&Path> = cwd_writable
        .then_some(cwd)
        .into_iter()
        .chain(writable.iter().map(PathBuf::as_path))
        .collect();
    let mut guard = scan_protected(&roots, &protected_names, i.account)?;
    // A hidden or protected path inside a writable tree cannot itself be renamed (it is a
    // mount point in the unit), but a directory above it could be, taking it somewhere no
    // later unit would look: pin those too.
    let mut above = ancestors_inside(&roots, hidden.iter().chain(&guard.protected));
    guard.pinned.append(&mut above);
    dedup(&mut guard.pinned);

    let mut sockets = Vec::new();
    match sockets::bound() {
        Ok(bound) => {
            for s in bound {
                if let Some(path) = visible_socket(&s, &hidden) {
                    with_aliases(&mounts, path, &mut sockets);
                }
            }
        }
        // Without the kernel's list a unit could reach a host socket: no unit then.
        Err(e) => return Err(PolicyError::Io(e)),
    }
    // (Under /tmp and /var/tmp only what a writable bind brings in is visible: the backend
    // knows, and covers those.)
    sockets.retain(|s| !under_any(s, NO_CWD_BELOW) && !hidden.iter().any(|h| s.starts_with(h)));
    dedup(&mut sockets);

    Ok(FsView {
        cwd_writable,
        writable,
        hidden,
        protected: guard.protected,
        pinned: guard.pinned,
        sockets,
        kernel_mounts: kernel_mounts(&mounts),
        run_files: run_files(),
    })
}

/// `path` with every symlink resolved, or `None` if it does not exist.
fn canonical(path: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path).ok()
}

/// `path` with its directory canonical, if its last component is a symlink.
fn canonical_link(path: &Path) -> Option<PathBuf> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.file_type().is_symlink() {
        return None;
    }
    Some(canonical(path.parent()?)?.join(path.file_name()?))
}

fn under_any(path: &Path, dirs: &[&str]) -> bool {
    dirs.iter().any(|d| path.starts_with(d))
}

fn dedup(paths: &mut Vec<PathBuf>) {
    paths.sort();
    paths.dedup();
}

/// Add `path` and every other path the same inode is mounted at.
fn with_aliases(mounts: &[Mount], path: PathBuf, out: &mut Vec<PathBuf>) {
    let Ok(meta) = std::fs::symlink_metadata(&path) else {
        return;
    };
    for alias in mountinfo::aliases(mounts, &path) {
        let same = std::fs::symlink_metadata(&alias)
            .is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino());
        if same {
            out.push(alias);
        }
    }
    out.push(path);
}

/// Refuse a working directory on a kernel filesystem, under a private directory, or that
/// is a shared temporary directory itself.
fn refuse_cwd(fd: BorrowedFd<'_>, cwd: &Path, mounts: &[Mount]) -> Result<(), PolicyError> {
    let refuse = |why: String, fix: &'static str| {
        Err(PolicyError::CwdRefused {
            path: cwd.to_path_buf(),
            why,
            fix,
        })
    };
    let project = "run the command from a project directory";
    let magic = rustix::fs::fstatfs(fd)
        .map_err(std::io::Error::from)?
        .f_type as i64;
    let by_magic = KERNEL_MAGIC
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, n)| *n);
    let by_table = mountinfo::containing(mounts, cwd)
        .map(|m| m.fstype.as_str())
        .filter(|t| KERNEL_FILESYSTEMS.contains(t));
    if let Some(fstype) = by_magic.or(by_table) {
        return refuse(format!("is on a kernel filesystem ({fstype})"), project);
    }
    if let Some(dir) = NO_CWD_BELOW.iter().find(|d| cwd.starts_with(d)) {
        return refuse(
            format!("is in {dir}, which every unit gets a private one of"),
            project,
        );
    }
    if SHARED_TEMP.iter().any(|t| cwd == Path::new(t)) {
        return refuse(
            "is shared by every user of this host (their sockets are there)".into(),
            "use a directory of your own below it",
        );
    }
    Ok(())
}

/// An extra writable path is bound only where nothing private or hidden would be covered
/// by it: not at or above a private directory, not under `/proc`, `/sys`, `/dev` or
/// `/run`, not inside a hidden path.
fn may_be_writable(path: &Path, hidden: &[PathBuf]) -> bool {
    let covers_private = PRIVATE_DIRS.iter().any(|d| Path::new(d).starts_with(path));
    !covers_private && !under_any(path, NO_CWD_BELOW) && !hidden.iter().any(|h| path.starts_with(h))
}

/// The path at which a bound socket can be reached now, if it can: its name, canonical,
/// if a socket is there. (Not its inode number: on overlayfs, `stat` and the kernel's list
/// disagree about it; whatever socket the name leads to now is the host's and is covered.)
fn visible_socket(s: &BoundSocket, hidden: &[PathBuf]) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let parent = canonical(s.path.parent()?)?;
    let path = parent.join(s.path.file_name()?);
    if under_any(&path, NO_CWD_BELOW) || hidden.iter().any(|h| path.starts_with(h)) {
        return None;
    }
    let meta = std::fs::symlink_metadata(&path).ok()?;
    meta.file_type().is_socket().then_some(path)
}

/// Mount points of kernel filesystems outside `/proc`, `/sys`, `/dev` and `/run` (those in
/// `/tmp` or `/var/tmp` matter where a writable bind brings them in), and every other place
/// a private directory's host content is mounted (a bind of `/` shows the host's `/run`
/// and `/tmp` again).
fn kernel_mounts(mounts: &[Mount]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = mounts
        .iter()
        .filter(|m| KERNEL_FILESYSTEMS.contains(&m.fstype.as_str()))
        .map(|m| m.point.clone())
        .filter(|p| !under_any(p, NO_CWD_BELOW))
        .collect();
    for dir in PRIVATE_DIRS {
        out.extend(
            mountinfo::aliases(mounts, Path::new(dir))
                .into_iter()
                .filter(|p| !under_any(p, PRIVATE_DIRS)),
        );
    }
    dedup(&mut out);
    out
}

/// Host files under `/run` that a unit needs in its private `/run`: the resolver
/// configuration `/etc/resolv.conf` points to there on hosts with systemd-resolved.
fn run_files() -> Vec<PathBuf> {
    canonical(Path::new("/etc/resolv.conf"))
        .filter(|p| p.starts_with("/run") && p.is_file())
        .into_iter()
        .collect()
}

/// The directories strictly between a writable root and each of `paths` inside it.
fn ancestors_inside<'p>(roots: &[&Path], paths: impl Iterator<Item = &'p PathBuf>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        let Some(root) = roots.iter().find(|r| p.starts_with(r) && p != *r) else {
            continue;
        };
        out.extend(
            p.ancestors()
                .skip(1)
                .take_while(|a| a != root)
                .filter(|a| std::fs::symlink_metadata(a).is_ok_and(|m| m.is_dir()))
                .map(Path::to_path_buf),
        );
    }
    out
}

/// The protected path `path` is at or inside, judged by its components alone (the path is
/// canonical): a working directory of `repo/.git/hooks` or `proj/.vscode` is itself
/// protected, whether or not `repo` is a repository today.
fn inside_protected(path: &Path, names: &[String]) -> Option<PathBuf> {
    path.ancestors().skip(1).find_map(|a| {
        names
            .iter()
            .map(|n| a.join(n))
            .find(|p| path.starts_with(p))
    })
}

/// What stays read-only inside the writable roots, and the directories pinned in place.
#[derive(Debug, Default)]
struct Guard {
    protected: Vec<PathBuf>,
    pinned: Vec<PathBuf>,
}

/// Find the protected paths of each writable root and of the repositories directly below
/// it. A repository's `.git` directory is pinned (mounted on itself) so that it cannot be
/// renamed away and replaced by one whose hooks are not protected; a `.git` file (a
/// worktree's pointer to its git directory) is protected itself.
fn scan_protected(
    roots: &[&Path],
    names: &[String],
    account: &Account,
) -> Result<Guard, PolicyError> {
    let mut g = Guard::default();
    let mut repos = Vec::new();
    for root in roots {
        repos.push(root.to_path_buf());
        // A root inside a git directory: that repository's hooks and config are in it.
        if let Some(repo) = root
            .ancestors()
            .find(|a| a.file_name() == Some(OsStr::new(".git")))
            .and_then(Path::parent)
        {
            repos.push(repo.to_path_buf());
        }
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for entry in entries.flatten().take(NESTED_SCAN_LIMIT) {
            let name = entry.file_name();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && !NOT_REPOSITORIES.iter().any(|n| OsStr::new(n) == name) {
                let sub = entry.path();
                if std::fs::symlink_metadata(sub.join(".git")).is_ok() {
                    repos.push(sub);
                }
            }
        }
    }
    let mut missing_hooks = Vec::new();
    for repo in &repos {
        let git = repo.join(".git");
        match std::fs::symlink_metadata(&git) {
            Ok(m) if m.is_dir() => {
                g.pinned.push(git.clone());
                if std::fs::symlink_metadata(git.join("hooks")).is_err() {
                    missing_hooks.push(git.join("hooks"));
                }
                if let Some(p) = hooks_path(repo) {
                    g.protected.push(p);
                }
            }
            Ok(_) => g.protected.push(git.clone()),
            Err(_) => {}
        }
        for name in names {
            let p = repo.join(name);
            if std::fs::symlink_metadata(&p).is_ok() {
                g.protected.push(p);
            }
        }
    }
    if !missing_hooks.is_empty() {
        // As the client, so that the directory is the client's, made where it may make one.
        as_client(account, || {
            for h in &missing_hooks {
                let _ = std::fs::create_dir(h);
            }
        })?;
        for h in missing_hooks {
            if std::fs::symlink_metadata(&h).is_ok_and(|m| m.is_dir()) {
                g.protected.push(h);
            }
        }
    }
    let inside = |p: &PathBuf| roots.iter().any(|r| p.starts_with(r) && p != r);
    g.protected.retain(inside);
    g.pinned.retain(inside);
    dedup(&mut g.protected);
    dedup(&mut g.pinned);
    Ok(g)
}

/// The directory `core.hooksPath` names in `repo/.git/config`, if any (git runs its hooks
/// from there instead of `.git/hooks`).
fn hooks_path(repo: &Path) -> Option<PathBuf> {
    let config = std::fs::read_to_string(repo.join(".git/config")).ok()?;
    let mut in_core = false;
    for line in config.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_core = line
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim()
                .eq_ignore_ascii_case("core");
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if in_core && key.trim().eq_ignore_ascii_case("hookspath") {
            let value = value.trim().trim_matches('"');
            let path = repo.join(value);
            return Some(canonical(&path).unwrap_or(path));
        }
    }
    None
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

    #[test]
    fn protected_paths_and_pinned_git_directories_are_found() -> Result<(), PolicyError> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().canonicalize()?;
        for d in [
            ".git/hooks",
            ".vscode",
            "sub/.git/hooks",
            "node_modules/x/.git",
            "husky",
        ] {
            std::fs::create_dir_all(root.join(d))?;
        }
        std::fs::write(root.join(".git/config"), "[core]\n\thooksPath = husky\n")?;
        std::fs::write(root.join(".envrc"), "")?;
        std::fs::write(root.join("wt-link"), "")?;
        std::fs::create_dir_all(root.join("wt"))?;
        std::fs::write(root.join("wt/.git"), "gitdir: /elsewhere\n")?;
        let names: Vec<String> = BUILTIN_PROTECTED.iter().map(|s| s.to_string()).collect();
        let g = scan_protected(&[&root], &names, &nobody())?;
        let rel = |v: &[PathBuf]| -> Vec<String> {
            v.iter()
                .filter_map(|p| p.strip_prefix(&root).ok())
                .map(|p| p.display().to_string())
                .collect()
        };
        assert_eq!(rel(&g.pinned), [".git", "sub/.git"]);
        assert_eq!(
            rel(&g.protected),
            [
                ".envrc",
                ".git/config",
                ".git/hooks",
                ".vscode",
                "husky",
                "sub/.git/hooks",
                "wt/.git"
            ]
        );
        Ok(())
    }

    #[test]
    fn a_missing_hooks_directory_is_made_and_protected() -> Result<(), PolicyError> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipping: needs root to act as the client");
            return Ok(());
        }
        let dir = tempfile::tempdir()?;
        let root = dir.path().canonicalize()?;
        std::fs::create_dir_all(root.join(".git"))?;
        std::os::unix::fs::chown(&root, Some(65534), Some(65534))?;
        std::os::unix::fs::chown(root.join(".git"), Some(65534), Some(65534))?;
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let g = scan_protected(&[&root], &[".git/hooks".into()], &nobody())?;
        assert!(g.protected.contains(&root.join(".git/hooks")), "{g:?}");
        let made = std::fs::metadata(root.join(".git/hooks"))?;
        assert_eq!(made.uid(), 65534, "made as the client");
        Ok(())
    }

    #[test]
    fn a_directory_inside_a_protected_one_is_protected() {
        let names: Vec<String> = BUILTIN_PROTECTED.iter().map(|s| s.to_string()).collect();
        let at = |p: &str| inside_protected(Path::new(p), &names).map(|p| p.display().to_string());
        assert_eq!(at("/r/.git/hooks"), Some("/r/.git/hooks".into()));
        assert_eq!(at("/r/.git/hooks/sub"), Some("/r/.git/hooks".into()));
        assert_eq!(at("/r/p/.vscode"), Some("/r/p/.vscode".into()));
        assert_eq!(at("/r/.git"), None);
        assert_eq!(at("/r/src"), None);
        assert_eq!(at("/"), None);
    }

    #[test]
    fn directories_above_hidden_paths_in_writable_trees_are_pinned() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().canonicalize()?;
        std::fs::create_dir_all(root.join("cache/hf/deep"))?;
        let hidden = [
            root.join("cache/hf/deep/token"),
            PathBuf::from("/elsewhere/x"),
        ];
        let pinned = ancestors_inside(&[&root], hidden.iter());
        assert_eq!(
            pinned,
            [
                root.join("cache/hf/deep"),
                root.join("cache/hf"),
                root.join("cache")
            ]
        );
        Ok(())
    }

    #[test]
    fn writable_paths_never_cover_private_or_hidden_ones() {
        let hidden = vec![PathBuf::from("/home/u/.ssh")];
        assert!(may_be_writable(Path::new("/home/u/.cache"), &hidden));
        assert!(may_be_writable(Path::new("/tmp/cache"), &hidden));
        assert!(!may_be_writable(Path::new("/"), &hidden));
        assert!(!may_be_writable(Path::new("/var"), &hidden));
        assert!(!may_be_writable(Path::new("/run/x"), &hidden));
        assert!(!may_be_writable(Path::new("/proc/sys"), &hidden));
        assert!(!may_be_writable(Path::new("/home/u/.ssh/keys"), &hidden));
    }

    #[test]
    fn kernel_mounts_outside_private_dirs_and_aliases_of_private_dirs() {
        let table = mountinfo::parse(
            "1 0 254:0 / / rw - ext4 /dev/vda rw\n\
             2 1 0:21 / /proc rw - proc proc rw\n\
             3 1 0:30 / /srv/chroot/proc rw - proc proc rw\n\
             6 1 0:31 / /tmp/w/chroot/proc rw - proc proc rw\n\
             4 1 254:0 / /mnt/host rw - ext4 /dev/vda rw\n\
             5 1 0:40 / /sys/fs/bpf rw - bpf bpf rw\n",
        );
        assert_eq!(
            kernel_mounts(&table),
            // (/mnt/host/proc is the root filesystem's empty directory, not the proc mount.)
            [
                "/mnt/host/dev",
                "/mnt/host/run",
                "/mnt/host/sys",
                "/mnt/host/tmp",
                "/mnt/host/var/tmp",
                "/srv/chroot/proc",
                "/tmp/w/chroot/proc"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn the_core_hooks_path_is_read_from_the_repository_config() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join(".git"))?;
        std::fs::write(
            dir.path().join(".git/config"),
            "[remote \"o\"]\n\thooksPath = no\n[Core]\n\tbare = false\n\tHooksPath = \"tools/hooks\"\n",
        )?;
        assert_eq!(hooks_path(dir.path()), Some(dir.path().join("tools/hooks")));
        std::fs::write(dir.path().join(".git/config"), "[core]\n")?;
        assert_eq!(hooks_path(dir.path()), None);
        Ok(())
    }
}
