//! What wardend hands the exec shim about the command: argv, environment, PATH, the working
//! directory's identity, the client's ids, the network and the Landlock scopes.
//!
//! It travels as a systemd credential (`LoadCredential=` of a root-only file wardend writes
//! and removes once the unit started): not on the bus (unit properties are world-readable),
//! not in the unit file, not in the shim's environment or argv — nothing of the request can
//! reach the dynamic loader or any code that runs before the shim's restrictions.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use warden_proto::Network;

use super::landlock::Scopes;

/// The credential's name (`$CREDENTIALS_DIRECTORY/<name>` in the unit).
pub const CREDENTIAL: &str = "warden-spec";

/// Where wardend writes the specs systemd loads (root only).
pub const SPEC_DIR: &str = "/run/wardend/specs";

/// The largest spec the shim reads (argv and environment are bounded by the frame size).
pub const MAX_SPEC: u64 = 4 << 20;

/// The command of one unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// The command and its arguments, verbatim.
    pub argv: Vec<String>,
    /// Its environment, exactly.
    pub env: Vec<(String, String)>,
    /// Where `argv[0]` is looked up.
    pub path: String,
    /// The working directory's path...
    pub cwd: PathBuf,
    /// ...and the device and inode it must lead to.
    pub cwd_id: (u64, u64),
    /// The client's uid.
    pub uid: u32,
    /// The client's gid.
    pub gid: u32,
    /// The client's supplementary groups.
    pub groups: Vec<u32>,
    /// The network the seccomp filter allows for.
    pub network: Network,
    /// Whether to enter a Landlock domain at all (the kernel has Landlock).
    pub landlock: bool,
    /// What the Landlock domain scopes.
    pub scopes: Scopes,
}

/// A spec written for one unit; the file is removed when this is dropped (systemd has
/// copied it into the unit's credentials by then, or the unit never started).
#[derive(Debug)]
pub struct SpecFile {
    path: PathBuf,
}

impl SpecFile {
    /// Write `spec` for `unit` into [`SPEC_DIR`] (directory 0700, file 0600, root's).
    pub fn write(unit: &str, spec: &Spec) -> std::io::Result<Self> {
        Self::write_in(Path::new(SPEC_DIR), unit, spec)
    }

    /// [`SpecFile::write`] into `dir`.
    pub fn write_in(dir: &Path, unit: &str, spec: &Spec) -> std::io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let path = dir.join(unit);
        let text = serde_json::to_vec(spec)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        let this = Self { path };
        f.write_all(&text)?;
        Ok(this)
    }

    /// The file, for `LoadCredential=`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SpecFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Read the spec the unit was given (in the shim: `$CREDENTIALS_DIRECTORY/warden-spec`).
pub fn read(path: &Path) -> Result<Spec, String> {
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .take(MAX_SPEC + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > MAX_SPEC {
        return Err(format!("{}: larger than {MAX_SPEC} bytes", path.display()));
    }
    serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            argv: vec!["sh".into(), "-c".into(), "echo $HOME\n%h \"'\\".into()],
            env: vec![("LD_PRELOAD".into(), "/x.so".into())],
            path: "/usr/bin:/bin".into(),
            cwd: PathBuf::from("/srv/a\nb"),
            cwd_id: (2049, 12),
            uid: 1000,
            gid: 1000,
            groups: vec![1000, 27],
            network: Network::Loopback,
            landlock: true,
            scopes: Scopes {
                signal: true,
                abstract_unix: false,
            },
        }
    }

    #[test]
    fn a_spec_round_trips_through_a_root_only_file_removed_on_drop() -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let specs = dir.path().join("specs");
        let file = SpecFile::write_in(&specs, "w-0.service", &spec())?;
        let mode = std::fs::metadata(file.path())?.permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(&specs)?.permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(read(file.path()), Ok(spec()));
        // Never overwrites (nor follows a link planted in its place).
        assert!(SpecFile::write_in(&specs, "w-0.service", &spec()).is_err());
        let path = file.path().to_path_buf();
        drop(file);
        assert!(!path.exists());
        Ok(())
    }

    #[test]
    fn garbage_and_oversized_specs_are_errors() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let bad = dir.path().join("bad");
        std::fs::write(&bad, "{\"argv\": 3}")?;
        assert!(read(&bad).is_err());
        std::fs::write(&bad, vec![b' '; (MAX_SPEC + 2) as usize])?;
        assert!(read(&bad).is_err_and(|e| e.contains("larger than")));
        assert!(read(&dir.path().join("missing")).is_err());
        Ok(())
    }
}
