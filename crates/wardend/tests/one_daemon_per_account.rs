//! One daemon per account, side by side, with the defaults (SPEC §10): each daemon's socket
//! is `/run/warden/<account>.sock` and its unit prefix `warden_<account>`; a client finds
//! its own account's socket; a second daemon for a socket or prefix already held refuses
//! to start, names the holder, and touches none of its units.
//!
//! Native backend on this host, with two throwaway accounts (so the default socket and
//! prefix are unique to this test) and an explicit empty config file (never the host's).
//! Needs root; under `CI=true` a missing piece fails.

#[macro_use]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use support::harness::{
    bin, can_run, cleanup_native_leftovers, kill, native_unit_cgroups, random_hex, Harness, Result,
};

/// A throwaway account with a work directory; removed (with its daemon's leftovers) on drop.
struct Account {
    name: String,
    uid: u32,
    gid: u32,
    work: tempfile::TempDir,
}

impl Account {
    fn create() -> Result<Self> {
        let name = format!("wsa{}", random_hex(4));
        let ok = Command::new("useradd")
            .args(["-M", "-d", "/nonexistent", "-s", "/bin/sh", &name])
            .status()?
            .success();
        if !ok {
            return Err(format!("useradd {name} failed").into());
        }
        let id = |flag: &str| -> Result<u32> {
            let out = Command::new("id").args([flag, &name]).output()?;
            Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
        };
        let (uid, gid) = (id("-u")?, id("-g")?);
        let work = tempfile::Builder::new().prefix("wside").tempdir()?;
        std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755))?;
        std::os::unix::fs::chown(work.path(), Some(uid), Some(gid))?;
        Ok(Self {
            name,
            uid,
            gid,
            work,
        })
    }

    fn socket(&self) -> PathBuf {
        PathBuf::from(format!("/run/warden/{}.sock", self.name))
    }

    fn prefix(&self) -> String {
        format!("warden_{}", self.name)
    }

    /// `warden ARGS` as this account, with no WARDEN_SOCKET: it finds its own socket.
    fn warden(&self, args: &[&str]) -> Command {
        let (reuid, regid) = (
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
        );
        let mut c = Command::new("setpriv");
        c.args([
            reuid.as_str(),
            regid.as_str(),
            "--clear-groups",
            "--",
            "env",
            "-i",
            "PATH=/usr/local/bin:/usr/bin:/bin",
        ])
        .arg(bin("warden"))
        .args(args)
        .current_dir(self.work.path())
        .stdin(Stdio::null());
        c
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        cleanup_native_leftovers(&self.prefix());
        let _ = Command::new("userdel")
            .arg(&self.name)
            .stderr(Stdio::null())
            .status();
    }
}

/// A wardend with the defaults for `account` (`extra` flags added), killed on drop.
struct Daemon(Child);

impl Daemon {
    fn start(config: &Path, account: &Account, extra: &[&str]) -> Result<Self> {
        let child = wardend(config, account, extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let d = Daemon(child);
        let socket = account.socket();
        if Harness::wait_for(Duration::from_secs(20), || socket.exists()).is_none() {
            return Err(format!("wardend for {} did not listen", account.name).into());
        }
        Ok(d)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = kill(self.0.id(), libc::SIGTERM);
        if Harness::wait_for(Duration::from_secs(10), || {
            self.0.try_wait().ok().flatten().is_some()
        })
        .is_none()
        {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

fn wardend(config: &Path, account: &Account, extra: &[&str]) -> Command {
    let mut c = Command::new(bin("wardend"));
    c.arg("--config")
        .arg(config)
        .args(["--client-user", &account.name, "--backend", "native"])
        .args(extra)
        .stdin(Stdio::null());
    c
}

/// Run a daemon that should refuse to start; its output (killed after 20 s if it serves).
fn refused(config: &Path, account: &Account, extra: &[&str]) -> Result<Output> {
    let mut child = wardend(config, account, extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if Harness::wait_for(Duration::from_secs(20), || {
        child.try_wait().ok().flatten().is_some()
    })
    .is_none()
    {
        let _ = child.kill();
    }
    Ok(child.wait_with_output()?)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn daemons_of_two_accounts_run_side_by_side_and_a_second_one_is_refused() -> Result<()> {
    if !can_run("one daemon per account") {
        return Ok(());
    }
    let scratch = tempfile::tempdir()?;
    let config = scratch.path().join("warden.toml");
    std::fs::write(&config, "")?;
    let (a, b) = (Account::create()?, Account::create()?);
    let run_dir_existed = Path::new("/run/warden").exists();
    let da = Daemon::start(&config, &a, &[])?;
    // A unit of a's, running while everything else happens.
    let mut long = a.warden(&["run", "--", "sleep", "1000"]).spawn()?;
    let unit_up = Harness::wait_for(Duration::from_secs(10), || {
        !native_unit_cgroups(&a.prefix()).is_empty()
    });
    assert!(
        unit_up.is_some(),
        "a's unit did not start under {}",
        a.prefix()
    );
    let a_units = native_unit_cgroups(&a.prefix());

    // b's daemon starts beside it with its own defaults, and cleans no unit of a's.
    let _db = Daemon::start(&config, &b, &[])?;
    for (who, acct) in [("a", &a), ("b", &b)] {
        let out = acct.warden(&["run", "--", "id", "-un"]).output()?;
        assert_eq!(out.status.code(), Some(0), "{who}: {}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout).trim(),
            acct.name,
            "{who} reached another daemon"
        );
    }

    // A second daemon for a: refused, naming the holder — on the socket, and (with a
    // socket of its own) on the prefix.
    let other_socket = scratch.path().join("other.sock");
    let other = other_socket.display().to_string();
    for (extra, held) in [
        (vec![], format!("the socket {}", a.socket().display())),
        (
            vec!["--socket", other.as_str()],
            format!("the unit prefix {}", a.prefix()),
        ),
    ] {
        let out = refused(&config, &a, &extra)?;
        assert_eq!(
            out.status.code(),
            Some(1),
            "{extra:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(
            text(&out.stderr).trim_end(),
            format!(
                "wardend: another wardend (pid {}) holds {held}: stop it, or give this one its own --socket and --unit-prefix",
                da.pid()
            )
        );
    }
    assert!(!other_socket.exists(), "the refused daemon listened");
    // a's daemon still serves, and its unit was never touched.
    assert_eq!(native_unit_cgroups(&a.prefix()), a_units);
    assert!(long.try_wait()?.is_none(), "a's long unit ended");
    let out = a.warden(&["run", "--", "true"]).output()?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let _ = kill(long.id(), libc::SIGTERM);
    let _ = long.wait();
    drop((da, _db));
    // With the daemons gone, their sockets and locks are too.
    for acct in [&a, &b] {
        assert!(
            !acct.socket().exists(),
            "{} left behind",
            acct.socket().display()
        );
    }
    let locks: Vec<String> = std::fs::read_dir("/run/wardend/locks")?
        .flatten()
        .map(|e| text(e.file_name().as_encoded_bytes()))
        .filter(|n| n.contains(&a.prefix()) || n.contains(&b.prefix()))
        .collect();
    assert!(locks.is_empty(), "{locks:?}");
    if !run_dir_existed {
        let _ = std::fs::remove_dir("/run/warden");
    }
    Ok(())
}
