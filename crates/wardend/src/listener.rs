//! The listening socket: created so that only root and the client account can reach it
//! (directory 0755 root, socket 0600 owned by the client), with a stale socket from a
//! previous run replaced, and removed again when the daemon ends.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// Setting up the socket failed.
#[derive(Debug, thiserror::Error)]
#[error("listening on {path}: {step}: {source}")]
pub struct ListenError {
    /// The socket path.
    pub path: PathBuf,
    /// The step that failed.
    pub step: &'static str,
    /// Why.
    pub source: io::Error,
}

/// A bound socket that removes its file when dropped.
#[derive(Debug)]
pub struct Listener {
    /// The listener.
    pub listener: UnixListener,
    path: PathBuf,
}

impl Listener {
    /// Bind `path` for the client account `uid`/`gid`.
    pub fn bind(path: &Path, uid: u32, gid: u32) -> Result<Self, ListenError> {
        let err = |step| {
            move |source| ListenError {
                path: path.to_path_buf(),
                step,
                source,
            }
        };
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(err("creating the directory"))?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => {
                std::fs::remove_file(path).map_err(err("removing the stale socket"))?
            }
            Ok(_) => {
                return Err(ListenError {
                    path: path.to_path_buf(),
                    step: "refusing to replace",
                    source: io::Error::other("a file that is not a socket is in the way"),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(err("inspecting the path")(e)),
        }
        // Bound under a name of its own, given its mode and owner, then moved into place:
        // the socket never exists at `path` with any other mode or owner.
        let staging = path.with_file_name(format!(
            ".{}.{}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&staging);
        let listener = UnixListener::bind(&staging).map_err(err("binding"))?;
        let placed = std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
            .map_err(err("setting the socket mode"))
            .and_then(|()| {
                std::os::unix::fs::chown(&staging, Some(uid), Some(gid))
                    .map_err(err("giving the socket to the client account"))
            })
            .and_then(|()| std::fs::rename(&staging, path).map_err(err("moving it into place")));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&staging);
            return Err(e);
        }
        Ok(Self {
            listener,
            path: path.to_path_buf(),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
