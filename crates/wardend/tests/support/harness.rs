//! The conformance harness: a real wardend on a real backend, and the real `warden` client
//! run as `nobody`, the same way for both backends.
//!
//! - native: wardend runs on this host (PID 1 is not systemd here);
//! - systemd: wardend runs inside a throwaway container with a real systemd booted on an
//!   overlay of the host's root (see `container.rs`); commands enter it with nsenter.
//!
//! Every daemon, container and unit a test makes is removed by `Drop`, even when it fails.

#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::container::SystemdContainer;

pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Which backend a harness runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Native,
    Systemd,
}

impl Kind {
    pub fn flag(self) -> &'static str {
        match self {
            Kind::Native => "native",
            Kind::Systemd => "systemd",
        }
    }
}

/// Whether tests that need root and real parts must run: always under `CI=true`.
pub fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Skip (outside CI) or fail (in CI) when the test cannot run here.
pub fn can_run(what: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    if root {
        return true;
    }
    assert!(
        !required(),
        "CI=true: {what} needs root, and this run is not root"
    );
    eprintln!("skipping {what}: needs root (set CI=true to make this a failure)");
    false
}

/// Where cargo put the binaries under test.
pub fn bin(name: &str) -> PathBuf {
    let wardend = PathBuf::from(env!("CARGO_BIN_EXE_wardend"));
    wardend.with_file_name(name)
}

pub fn probe_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/probe.py")
}

/// A random suffix for names that must not collide between parallel tests.
pub fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A wardend (and, for systemd, its container), with a scratch directory owned by nobody.
pub struct Harness {
    pub kind: Kind,
    pub prefix: String,
    /// The socket path as the daemon and clients see it.
    pub socket: PathBuf,
    /// A working directory owned by nobody, as clients see it.
    pub workdir: PathBuf,
    /// The daemon's stderr log, on the host.
    pub log: PathBuf,
    scratch: tempfile::TempDir,
    daemon: Option<Child>,
    container: Option<SystemdContainer>,
}

impl Harness {
    /// Boot what `kind` needs and start wardend with `extra` flags.
    pub fn start(kind: Kind, extra: &[&str]) -> Result<Self> {
        let scratch = tempfile::Builder::new().prefix("wtest").tempdir()?;
        std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))?;
        let prefix = format!("wt{}", random_hex(4));
        let container = match kind {
            Kind::Native => None,
            Kind::Systemd => Some(SystemdContainer::boot()?),
        };
        // The systemd units run with PrivateTmp, which would hide a cwd under /tmp; the
        // container's /srv is on its overlay and is a fine home for the workdir.
        let workdir = match kind {
            Kind::Native => scratch.path().join("work"),
            Kind::Systemd => PathBuf::from(format!("/srv/{prefix}")),
        };
        let socket = match kind {
            Kind::Native => scratch.path().join("run/warden.sock"),
            Kind::Systemd => PathBuf::from("/run/warden/warden.sock"),
        };
        let mut h = Self {
            kind,
            prefix,
            socket,
            workdir,
            log: scratch.path().join("wardend.log"),
            scratch,
            daemon: None,
            container,
        };
        let wd = h.workdir.display().to_string();
        h.exec_root(&["mkdir", "-p", &wd])?;
        h.exec_root(&["chown", "nobody:nogroup", &wd])?;
        h.start_daemon(extra)?;
        Ok(h)
    }

    /// Prefix a command so that it runs where the daemon runs.
    pub fn command(&self, argv: &[&str]) -> Command {
        match &self.container {
            None => {
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]);
                c
            }
            Some(ct) => {
                let mut c = Command::new("nsenter");
                c.args(["-t", &ct.leader_pid().to_string(), "-a", "--"]);
                c.args(argv);
                c
            }
        }
    }

    /// Run as root where the daemon runs; fail on a non-zero exit.
    pub fn exec_root(&self, argv: &[&str]) -> Result<Output> {
        let out = self.command(argv).stdin(Stdio::null()).output()?;
        if !out.status.success() {
            return Err(format!(
                "{argv:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(out)
    }

    /// A command run as nobody, in the workdir, where the daemon runs.
    pub fn as_nobody(&self, argv: &[&str]) -> Command {
        let mut full = vec![
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "env",
            "-C",
        ];
        let wd = self.workdir.display().to_string();
        full.push(&wd);
        full.push("-i");
        let sock = format!("WARDEN_SOCKET={}", self.socket.display());
        full.extend([
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "HOME=/nonexistent",
            &sock,
        ]);
        full.extend_from_slice(argv);
        self.command(&full)
    }

    /// `warden ARGS...` as nobody.
    pub fn warden(&self, args: &[&str]) -> Command {
        let w = bin("warden").display().to_string();
        let mut argv = vec![w.as_str()];
        argv.extend_from_slice(args);
        let mut c = self.as_nobody(&argv);
        c.stdin(Stdio::null());
        c
    }

    /// `warden run -- CMD...` as nobody, to completion.
    pub fn run(&self, cmd: &[&str]) -> Result<Output> {
        let mut args = vec!["run", "--"];
        args.extend_from_slice(cmd);
        Ok(self.warden(&args).output()?)
    }

    /// The raw protocol probe as nobody.
    pub fn probe(&self, steps: &[&str]) -> Result<Output> {
        let script = probe_script().display().to_string();
        let sock = self.socket.display().to_string();
        let mut argv = vec!["python3", script.as_str(), sock.as_str()];
        argv.extend_from_slice(steps);
        Ok(self.as_nobody(&argv).stdin(Stdio::null()).output()?)
    }

    /// The raw protocol probe as nobody, in the background with its stdout piped.
    pub fn probe_spawn(&self, steps: &[&str]) -> Result<Child> {
        let script = probe_script().display().to_string();
        let sock = self.socket.display().to_string();
        let mut argv = vec!["python3", script.as_str(), sock.as_str()];
        argv.extend_from_slice(steps);
        Ok(self
            .as_nobody(&argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?)
    }

    /// The socket as the host sees it.
    pub fn host_path(&self, p: &Path) -> PathBuf {
        match &self.container {
            None => p.to_path_buf(),
            Some(ct) => PathBuf::from(format!("/proc/{}/root", ct.leader_pid()))
                .join(p.strip_prefix("/").unwrap_or(p)),
        }
    }

    /// Start wardend with the harness's socket and prefix plus `extra`, and wait until its
    /// socket exists.
    pub fn start_daemon(&mut self, extra: &[&str]) -> Result<()> {
        let wardend = bin("wardend").display().to_string();
        let sock = self.socket.display().to_string();
        let mut argv = vec![
            wardend.as_str(),
            "--client-user",
            "nobody",
            "--backend",
            self.kind.flag(),
            "--socket",
            sock.as_str(),
            "--unit-prefix",
            self.prefix.as_str(),
        ];
        argv.extend_from_slice(extra);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = self
            .command(&argv)
            .env("WARDEN_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.daemon = Some(child);
        let host_sock = self.host_path(&self.socket);
        let t0 = Instant::now();
        while !host_sock.exists() {
            if let Some(status) = self
                .daemon
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(
                    format!("wardend exited early with {status}: {}", self.log_text()).into(),
                );
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(format!("wardend did not listen in 20 s: {}", self.log_text()).into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// The PID (on the host) of the wardend process itself (not nsenter's).
    pub fn daemon_pid(&self) -> Option<u32> {
        let top = self.daemon.as_ref()?.id();
        let wardend = bin("wardend");
        std::iter::once(top)
            .chain(descendants(top))
            .find(|p| std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == wardend))
    }

    /// Send `sig` to wardend and wait for it to exit; its exit status.
    pub fn signal_daemon(&mut self, sig: i32) -> Result<std::process::ExitStatus> {
        let pid = self.daemon_pid().ok_or("wardend is not running")?;
        kill(pid, sig)?;
        let mut child = self.daemon.take().ok_or("no daemon")?;
        let t0 = Instant::now();
        loop {
            if let Some(s) = child.try_wait()? {
                return Ok(s);
            }
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                return Err("wardend did not exit within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The units of this harness's prefix that exist now (running or not yet collected).
    pub fn units(&self) -> Result<Vec<String>> {
        match self.kind {
            Kind::Systemd => {
                let pattern = format!("{}-*", self.prefix);
                let out = self.exec_root(&[
                    "systemctl",
                    "list-units",
                    "--all",
                    "--plain",
                    "--no-legend",
                    &pattern,
                ])?;
                Ok(String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .map(str::to_string)
                    .collect())
            }
            Kind::Native => Ok(native_unit_cgroups(&self.prefix)),
        }
    }

    /// Processes (host PIDs) that live in one of this harness's units.
    pub fn unit_processes(&self) -> Vec<u32> {
        let slice = format!("/{}.slice/", self.prefix);
        all_pids()
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/cgroup"))
                    .is_ok_and(|c| c.contains(&slice))
            })
            .filter(|p| is_live(*p))
            .collect()
    }

    /// Wait until `cond` holds, up to `limit`; how long it took.
    pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
        let t0 = Instant::now();
        loop {
            if cond() {
                return Some(t0.elapsed());
            }
            if t0.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Write a file in the workdir (as root, then give it to nobody).
    pub fn write_work_file(&self, name: &str, text: &str) -> Result<PathBuf> {
        let p = self.host_path(&self.workdir).join(name);
        std::fs::File::create(&p)?.write_all(text.as_bytes())?;
        std::os::unix::fs::chown(&p, Some(65534), Some(65534))?;
        Ok(self.workdir.join(name))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(pid) = self.daemon_pid() {
            let _ = kill(pid, libc::SIGKILL);
        }
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.kind == Kind::Native {
            // Remove whatever a failed test left: run a fresh daemon's orphan cleanup.
            cleanup_native_leftovers(&self.prefix);
        }
        // The container (systemd) takes its units with it when it is dropped.
    }
}

/// Every PID on the host.
pub fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` is a live process. Zombies are dead and not counted: on these machines
/// PID 1 does not reap the orphans of a `kill -9`ed daemon.
pub fn is_live(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().next().map(str::to_string)
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Every descendant of `pid` (children first found by scanning /proc).
pub fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = all_pids()
        .into_iter()
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 1..];
            let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((p, ppid))
        })
        .collect();
    let mut out = vec![];
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for (c, pp) in &parents {
            if *pp == p {
                out.push(*c);
                frontier.push(*c);
            }
        }
    }
    out
}

pub fn kill(pid: u32, sig: i32) -> Result<()> {
    // SAFETY: kill(2) on a PID this test started (or found below one it started).
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// Cgroup directories named like units of `prefix`, in any hierarchy.
pub fn native_unit_cgroups(prefix: &str) -> Vec<String> {
    let slice = format!("{prefix}.slice");
    let mut found = vec![];
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if name == slice {
                if let Ok(units) = std::fs::read_dir(&p) {
                    for u in units.flatten() {
                        if u.file_type().is_ok_and(|t| t.is_dir()) {
                            found.push(u.file_name().to_string_lossy().to_string());
                        }
                    }
                }
            } else if p.components().count() < 8 {
                stack.push(p);
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// Kill and remove what a native test left behind under `prefix`, by running wardend's own
/// orphan cleanup once (it exits after failing to look up a nonexistent client account is
/// not an option: it must clean before listening, so start it and stop it).
pub fn cleanup_native_leftovers(prefix: &str) {
    if native_unit_cgroups(prefix).is_empty() {
        return;
    }
    let Ok(dir) = tempfile::tempdir() else { return };
    let sock = dir.path().join("s.sock");
    let Ok(mut child) = Command::new(bin("wardend"))
        .args([
            "--client-user",
            "nobody",
            "--backend",
            "native",
            "--unit-prefix",
            prefix,
            "--socket",
        ])
        .arg(&sock)
        .stderr(Stdio::null())
        .spawn()
    else {
        return;
    };
    let _ = Harness::wait_for(Duration::from_secs(10), || sock.exists());
    let _ = kill(child.id(), libc::SIGTERM);
    let _ = child.wait();
}
