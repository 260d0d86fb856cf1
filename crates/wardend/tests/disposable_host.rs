//! Tests that change the host they run on, for a throwaway host only (the Debian VM, see
//! `scripts/vm`, which runs them with `--include-ignored`; elsewhere they are ignored, the
//! reason printed by the test runner):
//!
//! - `packaging/wardend.service` driven by a real systemd that is PID 1 — started (ready only
//!   once orphans are gone and the socket listens), a client served over the default socket
//!   and the system bus, logs in the journal, a stop that ends every unit, a restart with
//!   units running that leaves none, a crash (`kill -9`) that `Restart=on-failure` comes back
//!   from with nothing left. It installs into `/usr/local/bin`, `/etc/warden` and
//!   `/etc/systemd/system`.
//! - a recycled PID: the kernel's `ns_last_pid` is written to hand a connected peer's PID to
//!   another process, and the peer's identity must hold without SO_PEERPIDFD.

#[macro_use]
mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::harness::{bin, descendants, kill, Harness, Result};

fn sh(script: &str) -> Result<Output> {
    Ok(Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .output()?)
}

/// Run `script` as root; fail with its output if it fails.
fn root(script: &str) -> Result<String> {
    let out = sh(script)?;
    if !out.status.success() {
        return Err(format!(
            "{script}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The default unit prefix of the daemon serving nobody.
const PREFIX: &str = "warden_nobody";

/// Our units (the default prefix of nobody's daemon), running or not yet collected.
fn units() -> Result<Vec<String>> {
    let out = root(&format!(
        "systemctl list-units --all --plain --no-legend '{PREFIX}-*.service'"
    ))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|u| wardend::units::name::is_unit_of(PREFIX, u))
        .map(str::to_string)
        .collect())
}

fn main_pid() -> Result<u32> {
    main_pid_of("wardend.service")
}

fn main_pid_of(service: &str) -> Result<u32> {
    Ok(
        root(&format!("systemctl show -p MainPID --value {service}"))?
            .trim()
            .parse()?,
    )
}

/// `warden run ARGS` as nobody on the default socket, in the background.
fn client(args: &str) -> Result<std::process::Child> {
    Ok(Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "env",
            "-C",
            "/srv/warden-packaging",
            "-i",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "sh",
            "-c",
        ])
        .arg(format!("exec warden run {args}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?)
}

/// A client running `sleep 1000`, and its unit once it exists.
fn long_unit() -> Result<(std::process::Child, String)> {
    let before = units()?;
    let child = client("-- sleep 1000")?;
    let mut unit = None;
    Harness::wait_for(Duration::from_secs(20), || {
        unit = units()
            .ok()
            .and_then(|u| u.into_iter().find(|n| !before.contains(n)));
        unit.is_some()
    });
    Ok((child, unit.ok_or("no unit appeared")?))
}

fn end(mut child: std::process::Child) {
    for pid in descendants(child.id()) {
        let _ = kill(pid, libc::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Removes what the test installed, whatever happened.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = sh(
            "systemctl stop wardend.service; systemctl reset-failed wardend.service; \
             systemctl stop wardend@nobody.service; systemctl reset-failed wardend@nobody.service; \
             rm -f /etc/systemd/system/wardend.service /etc/systemd/system/wardend@.service \
             /usr/local/bin/wardend \
             /usr/local/bin/warden; rm -rf /etc/warden /srv/warden-packaging; \
             systemctl daemon-reload",
        );
    }
}

#[test]
#[ignore = "needs systemd as PID 1 and a throwaway host: runs in the Debian VM (scripts/vm)"]
fn the_service_starts_serves_stops_restarts_and_recovers() -> Result<()> {
    assert!(
        Path::new("/run/systemd/system").is_dir(),
        "PID 1 is not systemd here"
    );
    let _installed = Installed;
    let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging");
    let service = packaging.join("wardend.service");
    let template = packaging.join("wardend@.service");
    root(&format!(
        "install -m 755 {} {} /usr/local/bin/ && install -m 644 {} {} /etc/systemd/system/ && \
         mkdir -p /etc/warden /srv/warden-packaging && chown nobody /srv/warden-packaging && \
         echo 'client_user = \"nobody\"' > /etc/warden/warden.toml && systemctl daemon-reload",
        bin("wardend").display(),
        bin("warden").display(),
        service.display(),
        template.display()
    ))?;
    // An orphan of a previous daemon (the default prefix): gone before the service is
    // ready (Type=notify: `systemctl start` returns once wardend said READY=1).
    let orphan = format!("{PREFIX}-00000000000000aa.service");
    root(&format!("systemd-run --quiet --unit={orphan} sleep 1000"))?;
    assert_eq!(units()?, [orphan]);
    root("systemctl start wardend.service")?;
    assert_eq!(
        root("systemctl is-active wardend.service")?.trim(),
        "active"
    );
    assert!(
        Path::new("/run/warden/nobody.sock").exists(),
        "ready before listening"
    );
    assert!(units()?.is_empty(), "ready before the orphan was removed");
    // Its descriptor limit: the service's LimitNOFILE=1024:65536, the soft one raised to
    // the hard one by wardend.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", main_pid()?))?;
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .ok_or("no Max open files line")?
        .split_whitespace()
        .filter(|w| w.parse::<u64>().is_ok())
        .collect::<Vec<_>>();
    assert_eq!(nofile, ["65536", "65536"], "{limits}");
    // A client is served, over the system bus.
    let out = client("-- sh -c 'echo served; id -u'")?.wait_with_output()?;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "served\n65534\n");
    let journal = root("journalctl -u wardend.service --no-pager -o cat")?;
    for line in [
        "wardend listening",
        "removed orphaned units",
        "unit started",
        "unit ended",
    ] {
        assert!(
            journal.contains(line),
            "no {line:?} in the journal:\n{journal}"
        );
    }
    // Stop ends every unit.
    let (c, _unit) = long_unit()?;
    root("systemctl stop wardend.service")?;
    assert!(units()?.is_empty(), "{:?} left after stop", units()?);
    end(c);
    // A restart with units running leaves none of the old ones.
    root("systemctl start wardend.service")?;
    let (c, old) = long_unit()?;
    root("systemctl restart wardend.service")?;
    assert!(!units()?.contains(&old), "{old} survived a restart");
    end(c);
    // A crash: systemd restarts it (Restart=on-failure), and nothing of before is left.
    let (c, old) = long_unit()?;
    let pid = main_pid()?;
    kill(pid, libc::SIGKILL)?;
    let back = Harness::wait_for(Duration::from_secs(30), || {
        main_pid().is_ok_and(|p| p != 0 && p != pid)
            && root("systemctl is-active wardend.service").is_ok_and(|s| s.trim() == "active")
    });
    assert!(back.is_some(), "wardend did not come back after kill -9");
    assert!(
        Harness::wait_for(Duration::from_secs(10), || units()
            .is_ok_and(|u| !u.contains(&old)))
        .is_some(),
        "{old} survived the crash"
    );
    end(c);
    // And the new one serves.
    let out = client("-- true")?.wait_with_output()?;
    assert_eq!(out.status.code(), Some(0));
    // The per-account template for the same account: refused while wardend.service holds
    // nobody's socket and prefix (the journal names its PID), serving once it is stopped.
    let holder = main_pid()?;
    let _ = sh("systemctl start wardend@nobody.service");
    assert_ne!(
        root("systemctl is-active wardend@nobody.service || true")?.trim(),
        "active"
    );
    let said = root("journalctl -u wardend@nobody.service --no-pager -o cat")?;
    assert!(
        said.contains(&format!(
            "another wardend (pid {holder}) holds the socket /run/warden/nobody.sock"
        )),
        "{said}"
    );
    root("systemctl stop wardend.service && systemctl reset-failed wardend@nobody.service && systemctl start wardend@nobody.service")?;
    let out = client("-- sh -c 'echo via-template'")?.wait_with_output()?;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "via-template\n");
    assert_ne!(main_pid_of("wardend@nobody.service")?, 0);
    Ok(())
}

#[test]
#[ignore = "writes the kernel's ns_last_pid to recycle a PID: a throwaway host only (the Debian VM)"]
fn a_recycled_pid_is_not_taken_for_the_peer() -> Result<()> {
    use wardend::admission::peer::{boot_ticks, Peer};
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s");
    let listener = std::os::unix::net::UnixListener::bind(&path)?;
    // The peer connects and exits.
    let mut peer = Command::new("python3")
        .args([
            "-c",
            "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])",
        ])
        .arg(&path)
        .spawn()?;
    let peer_pid = peer.id();
    let (conn, _) = listener.accept()?;
    let taken_up = boot_ticks()?;
    peer.wait()?;
    // A tick later, another process gets its PID.
    std::thread::sleep(Duration::from_millis(50));
    let mut recycled = None;
    for _ in 0..100 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (peer_pid - 1).to_string())?;
        let child = Command::new("sleep").arg("30").spawn()?;
        if child.id() == peer_pid {
            recycled = Some(child);
            break;
        }
        end(child);
    }
    let recycled = recycled.ok_or("could not recycle the pid")?;
    // Without its start time the pid would name the newcomer...
    let fooled = Peer::of_without_peerpidfd_since(&conn, boot_ticks()?);
    assert!(
        fooled.is_ok_and(|p| p.pid == peer_pid),
        "the recycle did not happen"
    );
    // ...with it, the newcomer is not taken for the peer.
    let checked = Peer::of_without_peerpidfd_since(&conn, taken_up);
    assert!(
        checked
            .as_ref()
            .is_err_and(|e| e.to_string().contains("reused")),
        "{:?}",
        checked.map(|p| p.pid)
    );
    end(recycled);
    Ok(())
}
