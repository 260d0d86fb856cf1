//! What the escape suites share: the real `warden` client run as the client account, in
//! the foreground or the background, raw-protocol-free helpers to read its output, and
//! guards that undo what a test set up (every one of them runs on drop, test failed or not).

#![allow(dead_code)]

use std::process::{Child, Output, Stdio};

use super::harness::{bin, can_run, descendants, kill, Harness, Kind, Options, Result};

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Start a harness, or `None` when this run may skip.
pub fn harness(kind: Kind, opts: Options) -> Result<Option<Harness>> {
    if !can_run(&format!("{kind:?} escape suite")) {
        return Ok(None);
    }
    Harness::start_with(kind, &[], opts).map(Some)
}

pub fn with_home() -> Options {
    Options {
        client_home: true,
        ..Options::default()
    }
}

/// `warden run ARGS` as the client, to completion.
pub fn run(h: &Harness, args: &[&str]) -> Result<Output> {
    let mut a = vec!["run"];
    a.extend_from_slice(args);
    Ok(h.warden_client(&a, &[]).output()?)
}

/// `warden run ARGS -- sh -c SCRIPT` as the client, to completion.
pub fn sh(h: &Harness, flags: &[&str], script: &str) -> Result<Output> {
    let mut a = flags.to_vec();
    a.extend(["--", "sh", "-c", script]);
    run(h, &a)
}

/// `warden run ARGS -- python3 -c SCRIPT ARGV...` as the client, to completion.
pub fn py(h: &Harness, flags: &[&str], script: &str, argv: &[&str]) -> Result<Output> {
    let mut a = flags.to_vec();
    a.extend(["--", "python3", "-c", script]);
    a.extend_from_slice(argv);
    run(h, &a)
}

pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// A `warden` client in the background; on drop its `warden` process is killed (by PID,
/// ours) and reaped.
pub struct Background {
    pub child: Option<Child>,
}

impl Background {
    pub fn child(&mut self) -> Result<&mut Child> {
        Ok(self.child.as_mut().ok_or("already waited for")?)
    }

    /// The PID (on the host) of the `warden` process (nsenter/setpriv/env come first).
    pub fn client_pid(&self) -> Option<u32> {
        let warden = bin("warden");
        let top = self.child.as_ref()?.id();
        std::iter::once(top)
            .chain(descendants(top))
            .find(|p| std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == warden))
    }

    pub fn wait(mut self) -> Result<Output> {
        let child = self.child.take().ok_or("already waited for")?;
        Ok(child.wait_with_output()?)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let pid = self.client_pid();
        if let Some(child) = self.child.as_mut() {
            if let Ok(None) = child.try_wait() {
                if let Some(pid) = pid {
                    let _ = kill(pid, libc::SIGKILL);
                }
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// Root commands (where the daemon runs) that undo what a test set up, run on drop.
pub struct Undo<'h> {
    pub h: &'h Harness,
    pub steps: Vec<Vec<String>>,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        for step in &self.steps {
            let argv: Vec<&str> = step.iter().map(String::as_str).collect();
            let _ = self.h.exec_root(&argv);
        }
    }
}

/// `warden run ARGS` as the client in the background, stdin, stdout and stderr piped (stdin
/// stays open until `wait`); and the name of the unit that appeared for it.
pub fn spawn_unit(h: &Harness, args: &[&str], env: &[&str]) -> Result<(Background, String)> {
    let before = h.units()?;
    let mut a = vec!["run"];
    a.extend_from_slice(args);
    let bg = Background {
        child: Some(
            h.warden_client(&a, env)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?,
        ),
    };
    let unit = h.wait_new_unit(&before)?;
    Ok((bg, unit))
}

/// A systemd unit's property, as `systemctl show -P` prints it.
pub fn unit_property(h: &Harness, unit: &str, prop: &str) -> Result<String> {
    let out = h.exec_root(&["systemctl", "show", "-P", prop, unit])?;
    Ok(text(&out.stdout).trim().to_string())
}

/// The PID of host process `pid` in the innermost PID namespace it belongs to (for the
/// systemd backend: the container's, where units and wardend live).
pub fn inner_pid(pid: u32) -> Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .ok_or("no NSpid line")?;
    Ok(line
        .split_whitespace()
        .last()
        .ok_or("empty NSpid line")?
        .parse()?)
}

/// A helper process the test started (with whatever nsenter/setpriv put before it);
/// on drop it and every descendant is killed, by PID, and reaped.
pub struct Listener(pub Child);

impl Drop for Listener {
    fn drop(&mut self) {
        for pid in descendants(self.0.id()) {
            let _ = kill(pid, libc::SIGKILL);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
