//! The conformance harness: a real wardend on a real backend, and the real `warden` client
//! run as `nobody`, the same way for both backends.
//!
//! - native: wardend runs on this host (PID 1 is not systemd here);
//! - systemd: on a host whose PID 1 is systemd (the Debian VM), wardend runs on the host
//!   against that systemd, over the system bus; elsewhere (this machine) inside a throwaway
//!   container with a real systemd booted on an overlay of the host's root (see
//!   `container.rs`), commands entering it with nsenter.
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

/// `d` stretched by `WARDEN_TEST_TIME_SCALE` (a whole number, default 1): the Debian VM
/// runs under emulation, several times slower than this machine. Latency targets proper
/// are checked by the benchmark on real hardware; the VM checks behaviour.
pub fn scaled(d: Duration) -> Duration {
    let scale = std::env::var("WARDEN_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(1);
    d * scale
}

/// Whether PID 1 of this host is systemd: then the systemd backend is tested against it
/// (no container).
pub fn systemd_is_pid1() -> bool {
    Path::new("/run/systemd/system").is_dir()
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
    /// The client account wardend serves and clients run as (`nobody` unless a test made
    /// a throwaway account with [`Options::client_home`]).
    pub client: ClientAccount,
    /// Paths (where the daemon runs) removed when the harness is dropped.
    pub remove_on_drop: Vec<PathBuf>,
    /// The config file passed with `--config`, as the daemon sees it.
    pub config: PathBuf,
    /// Extra environment of the daemon (failure points).
    pub daemon_env: Vec<(String, String)>,
}

/// The account that plays the agent.
#[derive(Debug, Clone)]
pub struct ClientAccount {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Its home as the daemon sees it.
    pub home: PathBuf,
    /// Whether the harness created it (and so removes it on the host in Drop).
    created: bool,
}

impl ClientAccount {
    fn nobody() -> Self {
        Self {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
            home: PathBuf::from("/nonexistent"),
            created: false,
        }
    }
}

/// What [`Harness::start_with`] sets up besides what [`Harness::start`] does.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A config file for wardend (`--config`).
    pub config_toml: Option<String>,
    /// Serve a throwaway account with a home (`/srv/<prefix>-home`, not under /tmp, which
    /// units get privately) holding `~/.ssh/id_ed25519` (mode 600) and `~/.cache/`,
    /// instead of `nobody`.
    pub client_home: bool,
    /// systemd only: give the container's systemd CAP_NET_ADMIN, which systemd-nspawn drops
    /// by default when the container shares the host's network. Without it the container's
    /// systemd cannot bring `lo` up in a unit's PrivateNetwork namespace (a systemd on a
    /// real host can), so a loopback unit would have no working loopback at all. The
    /// container boots only an empty target: nothing in it configures the network.
    pub container_net_admin: bool,
    /// With `client_home`: the account's home as the user database has it is a symlink,
    /// `/srv/<prefix>-home` → `/srv/<prefix>-realhome`, where the files are.
    pub home_via_symlink: bool,
    /// Give wardend the socket `/srv/<prefix>-sock/link/warden.sock`, where `link` is a
    /// symlink to the directory `real` beside it.
    pub socket_via_symlink: bool,
    /// Extra environment for wardend: `WARDEN_FAILPOINTS` (debug builds) arms failures.
    pub daemon_env: Vec<(String, String)>,
}

/// The config of a daemon under test that asks for nothing but its flags: an empty file, so
/// the host's /etc/warden/warden.toml is never read.
pub const NO_CONFIG: &str = "/dev/null";

/// The fake private key written into a throwaway client's `~/.ssh/id_ed25519`.
pub const FAKE_KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nwarden-escape-suite-fake-key-5f3a9c\n-----END OPENSSH PRIVATE KEY-----\n";

impl Harness {
    /// Boot what `kind` needs and start wardend with `extra` flags.
    pub fn start(kind: Kind, extra: &[&str]) -> Result<Self> {
        Self::start_with(kind, extra, Options::default())
    }

    /// [`Harness::start`], plus what `opts` asks for: a config file, a client with a home.
    pub fn start_with(kind: Kind, extra: &[&str], opts: Options) -> Result<Self> {
        let scratch = tempfile::Builder::new().prefix("wtest").tempdir()?;
        std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))?;
        let prefix = format!("wt{}", random_hex(4));
        let container = match kind {
            Kind::Native => None,
            Kind::Systemd if systemd_is_pid1() => None,
            Kind::Systemd if opts.container_net_admin => Some(SystemdContainer::boot_with(&[
                "--capability=CAP_NET_ADMIN",
            ])?),
            Kind::Systemd => Some(SystemdContainer::boot()?),
        };
        // The systemd units run with PrivateTmp, which would hide a cwd under /tmp; the
        // container's /srv is on its overlay and is a fine home for the workdir.
        let workdir = match kind {
            Kind::Native if !opts.client_home => scratch.path().join("work"),
            _ => PathBuf::from(format!("/srv/{prefix}")),
        };
        let socket = match (opts.socket_via_symlink, kind) {
            (true, _) => PathBuf::from(format!("/srv/{prefix}-sock/link/warden.sock")),
            (false, Kind::Native) => scratch.path().join("run/warden.sock"),
            (false, Kind::Systemd) if systemd_is_pid1() => {
                PathBuf::from(format!("/run/warden-{prefix}/warden.sock"))
            }
            (false, Kind::Systemd) => PathBuf::from("/run/warden/warden.sock"),
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
            client: ClientAccount::nobody(),
            config: PathBuf::from(NO_CONFIG),
            daemon_env: opts.daemon_env.clone(),
            remove_on_drop: Vec::new(),
        };
        let wd = h.workdir.display().to_string();
        h.exec_root(&["mkdir", "-p", &wd])?;
        if opts.socket_via_symlink {
            let dir = PathBuf::from(format!("/srv/{}-sock", h.prefix));
            h.remove_on_drop.push(dir.clone());
            std::fs::create_dir_all(h.host_path(&dir.join("real")))?;
            std::os::unix::fs::symlink("real", h.host_path(&dir.join("link")))?;
        }
        if opts.client_home {
            // From here on Drop removes the account, its home and the workdir.
            h.client.created = true;
            h.make_client_account(opts.home_via_symlink)?;
        }
        let owner = format!("{}:{}", h.client.uid, h.client.gid);
        h.exec_root(&["chown", &owner, &wd])?;
        if let Some(text) = &opts.config_toml {
            let inside = match kind {
                Kind::Native => h.scratch.path().join("warden.toml"),
                Kind::Systemd => PathBuf::from(format!("/srv/{}-warden.toml", h.prefix)),
            };
            std::fs::write(h.host_path(&inside), text)?;
            if kind == Kind::Systemd {
                h.remove_on_drop.push(inside.clone());
            }
            h.config = inside;
        }
        h.start_daemon(extra)?;
        Ok(h)
    }

    /// Create `w<prefix>` with home `/srv/<prefix>-home`: `~/.ssh/id_ed25519` (600, a fake
    /// key), `~/.cache/`, all owned by it.
    fn make_client_account(&mut self, home_via_symlink: bool) -> Result<()> {
        let name = format!("w{}", self.prefix);
        let home = PathBuf::from(format!("/srv/{}-home", self.prefix));
        let home_s = home.display().to_string();
        self.exec_root(&["useradd", "-M", "-d", &home_s, "-s", "/bin/sh", &name])?;
        if home_via_symlink {
            let real = PathBuf::from(format!("/srv/{}-realhome", self.prefix));
            self.remove_on_drop.push(real.clone());
            std::fs::create_dir_all(self.host_path(&real))?;
            // Relative: the host follows it through /proc/PID/root as the container does.
            let rel = real.file_name().ok_or("no file name")?;
            std::os::unix::fs::symlink(rel, self.host_path(&home))?;
        }
        let id = |flag: &str| -> Result<u32> {
            let out = self.exec_root(&["id", flag, &name])?;
            Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
        };
        let (uid, gid) = (id("-u")?, id("-g")?);
        self.client = ClientAccount {
            name,
            uid,
            gid,
            home: home.clone(),
            created: true,
        };
        let host_home = self.host_path(&home);
        std::fs::create_dir_all(host_home.join(".ssh"))?;
        std::fs::create_dir_all(host_home.join(".cache"))?;
        let key = host_home.join(".ssh/id_ed25519");
        std::fs::write(&key, FAKE_KEY)?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        std::fs::set_permissions(
            host_home.join(".ssh"),
            std::fs::Permissions::from_mode(0o700),
        )?;
        std::fs::set_permissions(&host_home, std::fs::Permissions::from_mode(0o755))?;
        for p in [
            host_home.clone(),
            host_home.join(".ssh"),
            key,
            host_home.join(".cache"),
        ] {
            std::os::unix::fs::chown(&p, Some(uid), Some(gid))?;
        }
        Ok(())
    }

    /// A command run as the client account (nobody or the throwaway one), in the workdir,
    /// where the daemon runs, with only PATH, HOME, WARDEN_SOCKET and `env` (`K=V`) set.
    pub fn as_client(&self, argv: &[&str], env: &[&str]) -> Command {
        self.as_client_in(&self.workdir, argv, env)
    }

    /// [`Harness::as_client`] in directory `cwd` (as the daemon sees it).
    pub fn as_client_in(&self, cwd: &Path, argv: &[&str], env: &[&str]) -> Command {
        self.as_client_wrapped(&[], cwd, argv, env)
    }

    /// [`Harness::as_client_in`], the account switch run by `wrapper` (as root).
    fn as_client_wrapped(
        &self,
        wrapper: &[&str],
        cwd: &Path,
        argv: &[&str],
        env: &[&str],
    ) -> Command {
        let reuid = format!("--reuid={}", self.client.uid);
        let regid = format!("--regid={}", self.client.gid);
        let wd = cwd.display().to_string();
        let home = format!("HOME={}", self.client.home.display());
        let sock = format!("WARDEN_SOCKET={}", self.socket.display());
        let mut full = wrapper.to_vec();
        full.extend_from_slice(&[
            "setpriv",
            reuid.as_str(),
            regid.as_str(),
            "--clear-groups",
            "--",
            "env",
            "-C",
            wd.as_str(),
            "-i",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            home.as_str(),
            sock.as_str(),
        ]);
        full.extend_from_slice(env);
        full.extend_from_slice(argv);
        let mut c = self.command(&full);
        c.stdin(Stdio::null());
        c
    }

    /// [`Harness::as_client`] in another process tree than the agent's: a session of its
    /// own, and on a systemd host a scope unit of its own (the daemon takes the main
    /// process of a peer's unit for its origin, and the tests run in one unit there).
    pub fn as_client_elsewhere(&self, argv: &[&str], env: &[&str]) -> Command {
        let scope: &[&str] = if systemd_is_pid1() && self.container.is_none() {
            &["systemd-run", "--scope", "--quiet", "--collect", "--"]
        } else {
            &[]
        };
        let mut own = vec!["setsid"];
        own.extend_from_slice(argv);
        self.as_client_wrapped(scope, &self.workdir, &own, env)
    }

    /// `warden ARGS...` as the client account, with `env` (`K=V`) in its environment.
    pub fn warden_client(&self, args: &[&str], env: &[&str]) -> Command {
        self.warden_client_in(&self.workdir, args, env)
    }

    /// [`Harness::warden_client`] in directory `cwd` (as the daemon sees it).
    pub fn warden_client_in(&self, cwd: &Path, args: &[&str], env: &[&str]) -> Command {
        let w = bin("warden").display().to_string();
        let mut argv = vec![w.as_str()];
        argv.extend_from_slice(args);
        self.as_client_in(cwd, &argv, env)
    }

    /// Run wardend once more, where the daemon runs, with `--config` text `config_toml` and
    /// a socket of its own; wait up to 20 s for it to exit (it is killed if it does not).
    /// Its output, and whether its socket appeared.
    pub fn run_daemon_with_config(&self, config_toml: &str) -> Result<(Output, bool)> {
        let tag = random_hex(4);
        let (config, socket) = match self.kind {
            Kind::Native => (
                self.scratch.path().join(format!("bad-{tag}.toml")),
                self.scratch.path().join(format!("bad-{tag}/warden.sock")),
            ),
            Kind::Systemd => (
                PathBuf::from(format!("/srv/{}-bad-{tag}.toml", self.prefix)),
                PathBuf::from(format!("/run/{}-bad-{tag}/warden.sock", self.prefix)),
            ),
        };
        std::fs::write(self.host_path(&config), config_toml)?;
        let wardend = bin("wardend").display().to_string();
        let (config_s, socket_s) = (config.display().to_string(), socket.display().to_string());
        let prefix = format!("{}bad", self.prefix);
        let mut child = self
            .command(&[
                &wardend,
                "--config",
                &config_s,
                "--client-user",
                &self.client.name,
                "--backend",
                self.kind.flag(),
                "--socket",
                &socket_s,
                "--unit-prefix",
                &prefix,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let exited = Self::wait_for(Duration::from_secs(20), || {
            child.try_wait().ok().flatten().is_some()
        });
        if exited.is_none() {
            let _ = child.kill();
        }
        let out = child.wait_with_output()?;
        let listened = self.host_path(&socket).exists();
        Ok((out, listened))
    }

    /// Whether memory, tasks and CPU limits are enforced where units run: on this host's
    /// kernel (native) and under a systemd that is PID 1, not in the test container (its
    /// cgroup-v1 controllers are read-only there).
    pub fn enforces_limits(&self) -> bool {
        self.container.is_none()
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
            self.client.name.as_str(),
            "--backend",
            self.kind.flag(),
            "--socket",
            sock.as_str(),
            "--unit-prefix",
            self.prefix.as_str(),
        ];
        let config = self.config.display().to_string();
        argv.extend(["--config", config.as_str()]);
        argv.extend_from_slice(extra);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = self
            .command(&argv)
            .env("WARDEN_LOG", "debug")
            .envs(self.daemon_env.iter().map(|(k, v)| (k, v)))
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
        self.wait_daemon()
    }

    /// Wait (up to 20 s) for wardend to exit; its exit status.
    pub fn wait_daemon(&mut self) -> Result<std::process::ExitStatus> {
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
                // Units only (not the lifeline service every unit is bound to).
                Ok(String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .filter(|u| wardend::units::name::is_unit_of(&self.prefix, u))
                    .map(str::to_string)
                    .collect())
            }
            Kind::Native => Ok(native_unit_cgroups(&self.prefix)),
        }
    }

    /// Wait (up to 10 s) for a unit that is not in `before` to appear; its name.
    pub fn wait_new_unit(&self, before: &[String]) -> Result<String> {
        let mut unit = None;
        Harness::wait_for(Duration::from_secs(10), || {
            unit = self
                .units()
                .ok()
                .and_then(|u| u.into_iter().find(|n| !before.contains(n)));
            unit.is_some()
        });
        unit.ok_or_else(|| format!("no unit appeared; daemon log:\n{}", self.log_text()).into())
    }

    /// Processes (host PIDs) alive in one of this harness's units.
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
        let limit = scaled(limit);
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
        if std::thread::panicking() && self.kind == Kind::Systemd {
            // A failed test: what systemd said (a unit's setup failure names its cause only
            // in the journal), printed with the test's output.
            if let Ok(out) = self
                .command(&["journalctl", "--no-pager", "-q", "-n", "60"])
                .output()
            {
                eprintln!(
                    "--- systemd journal (last 60 lines) ---\n{}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
        }
        if let Some(pid) = self.daemon_pid() {
            let _ = kill(pid, libc::SIGKILL);
        }
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.container.is_none() {
            // Remove whatever a failed test left: a fresh daemon's orphan cleanup (native),
            // or systemd's units of the prefix, the lifeline and the slice (systemd host).
            match self.kind {
                Kind::Native => cleanup_native_leftovers(&self.prefix),
                Kind::Systemd => {
                    let units = format!("{}-*", self.prefix);
                    let slice = format!("{}.slice", self.prefix);
                    for args in [
                        vec!["stop", units.as_str(), slice.as_str()],
                        vec!["reset-failed", units.as_str()],
                    ] {
                        let _ = Command::new("systemctl")
                            .args(args)
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .status();
                    }
                    let _ = std::fs::remove_dir_all(format!("/srv/{}", self.prefix));
                    if let Some(dir) = self.socket.parent() {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                }
            }
            // A throwaway client account lives on the host: remove it, its home and the
            // workdir made for it (all named by this harness's random prefix). In a
            // container they live in its overlay and go with it.
            if self.client.created {
                let _ = Command::new("userdel")
                    .arg(format!("w{}", self.prefix))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                let _ = std::fs::remove_dir_all(format!("/srv/{}-home", self.prefix));
                let _ = std::fs::remove_dir_all(format!("/srv/{}", self.prefix));
            }
            for p in &self.remove_on_drop {
                let _ = std::fs::remove_dir_all(p).or_else(|_| std::fs::remove_file(p));
            }
        }
        // A container takes its units with it when it is dropped.
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

/// The `<prefix>.slice` cgroup directories of `prefix`, in every hierarchy.
pub fn slice_dirs(prefix: &str) -> Vec<PathBuf> {
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
            if e.file_name().to_string_lossy() == slice {
                found.push(p);
            } else if p.components().count() < 8 {
                stack.push(p);
            }
        }
    }
    found
}

/// The directories in a cgroup directory.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Cgroup directories named like units of `prefix`, in any hierarchy.
pub fn native_unit_cgroups(prefix: &str) -> Vec<String> {
    let mut found: Vec<String> = slice_dirs(prefix)
        .iter()
        .flat_map(|s| subdirs(s))
        .filter_map(|u| u.file_name().map(|n| n.to_string_lossy().to_string()))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Remove the `<prefix>.slice` cgroup directories in every hierarchy, with any unit
/// directories still in them (deepest first, `rmdir` only: a directory with processes stays).
fn remove_slice_dirs(prefix: &str) {
    for slice in slice_dirs(prefix) {
        for unit in subdirs(&slice) {
            let _ = std::fs::remove_dir(unit);
        }
        let _ = std::fs::remove_dir(slice);
    }
}

/// Kill and remove what a native test left behind under `prefix`, by running wardend's own
/// orphan cleanup once (it exits after failing to look up a nonexistent client account is
/// not an option: it must clean before listening, so start it and stop it).
pub fn cleanup_native_leftovers(prefix: &str) {
    if !native_unit_cgroups(prefix).is_empty() {
        run_orphan_cleanup(prefix);
    }
    // wardend leaves its (empty) slice directories behind: the test's, removed here.
    remove_slice_dirs(prefix);
}

/// Start a native wardend of `prefix` until it listens (its orphan cleanup runs before),
/// then stop it.
fn run_orphan_cleanup(prefix: &str) {
    let Ok(dir) = tempfile::tempdir() else { return };
    let sock = dir.path().join("s.sock");
    let Ok(mut child) = Command::new(bin("wardend"))
        .args([
            "--config",
            NO_CONFIG,
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
