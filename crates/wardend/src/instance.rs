//! One daemon per socket and per unit prefix. Before it touches a unit (orphan cleanup
//! removes every unit of its prefix) or a socket (a stale one is replaced), wardend takes
//! two locks — `flock` on `/run/wardend/locks/socket-<hash of the path>.lock` and on
//! `/run/wardend/locks/prefix-<prefix>.lock` — and holds them until it exits. A second
//! daemon for the same socket or prefix refuses to start and names the PID holding it;
//! two daemons for two accounts (their own sockets and prefixes) run side by side.
//!
//! The lock files live in a directory only root can write, are opened without following
//! symlinks, and say which daemon holds them (`<pid>\n<what>\n`). A daemon removes its
//! lock files when it exits, while still holding them; a daemon that locked a file that
//! was meanwhile removed sees that the path no longer leads to the inode it locked and
//! takes the lock again.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation, Mode, OFlags};

/// Where the lock files live (root's own; a unit gets a private /run anyway).
pub const LOCK_DIR: &str = "/run/wardend/locks";

/// Why this daemon may not start.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// Another live daemon holds the socket or the prefix.
    #[error("another wardend (pid {pid}) holds {what}: stop it, or give this one its own --socket and --unit-prefix")]
    Held {
        /// What it holds: `the socket PATH` or `the unit prefix PREFIX`.
        what: String,
        /// Its PID, as it wrote it (or `unknown`).
        pid: String,
    },
    /// The lock could not be taken for another reason.
    #[error("locking {}: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// The locks this daemon holds; dropping them removes the files and releases the locks.
#[derive(Debug)]
pub struct InstanceLocks {
    held: Vec<(PathBuf, File)>,
}

impl InstanceLocks {
    /// Take the locks of `socket` and `prefix` in [`LOCK_DIR`].
    pub fn take(socket: &Path, prefix: &str) -> Result<Self, InstanceError> {
        Self::take_in(Path::new(LOCK_DIR), socket, prefix)
    }

    /// [`InstanceLocks::take`] with the lock files in `dir` (tests).
    pub fn take_in(dir: &Path, socket: &Path, prefix: &str) -> Result<Self, InstanceError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| InstanceError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        let mut locks = Self { held: Vec::new() };
        let socket_what = format!("the socket {}", socket.display());
        let socket_file = dir.join(format!(
            "socket-{:016x}.lock",
            fnv1a(socket.as_os_str().as_encoded_bytes())
        ));
        locks.lock(socket_file, &socket_what)?;
        let prefix_what = format!("the unit prefix {prefix}");
        locks.lock(dir.join(format!("prefix-{prefix}.lock")), &prefix_what)?;
        Ok(locks)
    }

    fn lock(&mut self, path: PathBuf, what: &str) -> Result<(), InstanceError> {
        let io_err = |source| InstanceError::Io {
            path: path.clone(),
            source,
        };
        // A file removed between open and flock by the daemon that held it: try again.
        for _ in 0..16 {
            let fd = rustix::fs::open(
                &path,
                OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| io_err(e.into()))?;
            let mut file = File::from(fd);
            match flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    let pid = text
                        .lines()
                        .next()
                        .filter(|l| !l.is_empty())
                        .unwrap_or("unknown")
                        .to_string();
                    return Err(InstanceError::Held {
                        what: what.to_string(),
                        pid,
                    });
                }
                Err(e) => return Err(io_err(e.into())),
            }
            if !same_file(&file, &path) {
                continue;
            }
            file.set_len(0)
                .and_then(|()| file.rewind())
                .and_then(|()| writeln!(file, "{}\n{what}", std::process::id()))
                .map_err(io_err)?;
            self.held.push((path, file));
            return Ok(());
        }
        Err(io_err(io::Error::other(
            "the lock file keeps being replaced",
        )))
    }
}

impl Drop for InstanceLocks {
    fn drop(&mut self) {
        // Removed while still locked: a daemon waiting on the old inode notices and retries.
        for (path, _file) in &self.held {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Whether `path` still names the inode `file` is open on.
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// FNV-1a, 64 bits: a stable name for a socket path of any length and bytes.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn a_second_holder_of_the_socket_or_the_prefix_is_refused_with_the_pid() -> Result {
        let dir = tempfile::tempdir()?;
        let locks = dir.path().join("locks");
        let first = InstanceLocks::take_in(&locks, Path::new("/run/warden/a.sock"), "warden-a")?;
        let me = std::process::id().to_string();
        for (socket, prefix, held) in [
            (
                "/run/warden/a.sock",
                "warden-b",
                "the socket /run/warden/a.sock",
            ),
            ("/run/warden/b.sock", "warden-a", "the unit prefix warden-a"),
        ] {
            match InstanceLocks::take_in(&locks, Path::new(socket), prefix) {
                Err(InstanceError::Held { what, pid }) => {
                    assert_eq!(what, held);
                    assert_eq!(pid, me);
                }
                other => return Err(format!("{socket} {prefix}: {other:?}").into()),
            }
        }
        // Another account's daemon runs beside it.
        let other = InstanceLocks::take_in(&locks, Path::new("/run/warden/b.sock"), "warden-b")?;
        drop(first);
        // Gone with the daemon, and free again.
        assert_eq!(std::fs::read_dir(&locks)?.count(), 2);
        let again = InstanceLocks::take_in(&locks, Path::new("/run/warden/a.sock"), "warden-a")?;
        drop((other, again));
        assert_eq!(std::fs::read_dir(&locks)?.count(), 0);
        Ok(())
    }

    #[test]
    fn a_planted_symlink_is_not_followed() -> Result {
        let dir = tempfile::tempdir()?;
        let target = dir.path().join("target");
        std::fs::write(&target, "keep")?;
        let socket = Path::new("/run/warden/s.sock");
        std::os::unix::fs::symlink(&target, dir.path().join("prefix-p.lock"))?;
        let r = InstanceLocks::take_in(dir.path(), socket, "p");
        assert!(matches!(r, Err(InstanceError::Io { .. })), "{r:?}");
        assert_eq!(std::fs::read_to_string(&target)?, "keep");
        Ok(())
    }

    #[test]
    fn the_hash_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
