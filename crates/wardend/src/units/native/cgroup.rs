//! The unit's cgroups: one small interface over cgroup v2 and v1 hierarchies (youki style).
//!
//! The manager knows a list of [`Hierarchy`]s (found in `/proc/self/mountinfo`, or given by
//! a test). Each unit gets a directory `<hierarchy root>/<prefix>.slice/<unit name>` in every
//! one of them: in the v2 hierarchy (pure v2, or a hybrid's `unified`) the unit is born there
//! through `CLONE_INTO_CGROUP`; in v1 hierarchies the child writes itself into `cgroup.procs`
//! before anything else. Limits, usage, the kill path and removal go through [`UnitCgroup`].

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::super::{name, Limits, UnitError};

/// How long the kill path waits for a cgroup to become empty.
const EMPTY_TIMEOUT: Duration = Duration::from_secs(5);
/// The CPU weight of `<prefix>.slice`, all units together (cgroup v2 scale; the daemon
/// beside it has the default 100): a host busy with units still schedules wardend.
pub const SLICE_CPU_WEIGHT: u32 = 50;
/// Poll interval while waiting for a cgroup to empty or a freezer to settle.
const POLL: Duration = Duration::from_millis(1);

/// A cgroup v1 controller the backend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V1Controller {
    /// Task limit (`pids.max`).
    Pids,
    /// Memory limit, peak and OOM counter.
    Memory,
    /// The freeze-kill path.
    Freezer,
    /// CPU usage.
    Cpuacct,
    /// CPU quota.
    Cpu,
}

impl V1Controller {
    fn from_option(opt: &str) -> Option<Self> {
        match opt {
            "pids" => Some(Self::Pids),
            "memory" => Some(Self::Memory),
            "freezer" => Some(Self::Freezer),
            "cpuacct" => Some(Self::Cpuacct),
            "cpu" => Some(Self::Cpu),
            _ => None,
        }
    }
}

/// A cgroup hierarchy the backend places units in: its mount point (or the directory to
/// treat as its root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// A cgroup v2 hierarchy (pure v2, or a hybrid host's `unified`).
    V2(PathBuf),
    /// A cgroup v1 hierarchy holding these controllers.
    V1(Vec<V1Controller>, PathBuf),
}

impl Hierarchy {
    fn root(&self) -> &Path {
        match self {
            Hierarchy::V2(p) | Hierarchy::V1(_, p) => p,
        }
    }

    fn has(&self, c: V1Controller) -> bool {
        matches!(self, Hierarchy::V1(cs, _) if cs.contains(&c))
    }
}

/// The hierarchies of this host the backend uses, read from `/proc/self/mountinfo`: the
/// first cgroup2 mount, and every v1 mount that holds a controller of [`V1Controller`].
pub fn detect() -> Result<Vec<Hierarchy>, UnitError> {
    let mounts = crate::mountinfo::read().map_err(|source| UnitError::Io {
        step: "reading",
        path: "/proc/self/mountinfo".into(),
        source,
    })?;
    Ok(hierarchies(&mounts))
}

fn hierarchies(mounts: &[crate::mountinfo::Mount]) -> Vec<Hierarchy> {
    let mut v2 = None;
    let mut v1 = Vec::new();
    for m in mounts {
        match m.fstype.as_str() {
            "cgroup2" if v2.is_none() && m.point.join("cgroup.procs").exists() => {
                v2 = Some(Hierarchy::V2(m.point.clone()));
            }
            "cgroup" => {
                let controllers: Vec<V1Controller> = m
                    .super_options
                    .split(',')
                    .filter_map(V1Controller::from_option)
                    .collect();
                if !controllers.is_empty() {
                    v1.push(Hierarchy::V1(controllers, m.point.clone()));
                }
            }
            _ => {}
        }
    }
    v2.into_iter().chain(v1).collect()
}

/// The manager's side: the hierarchies and the slice every unit goes under.
#[derive(Debug, Clone)]
pub struct Cgroups {
    hierarchies: Vec<Hierarchy>,
    slice: String,
}

impl Cgroups {
    /// Use `hierarchies` for the units of `prefix`; creates `<prefix>.slice` in each and, on
    /// v2, enables the memory, pids and cpu controllers for the units where the host allows.
    pub fn new(prefix: &str, hierarchies: Vec<Hierarchy>) -> Result<Self, UnitError> {
        if hierarchies.is_empty() {
            return Err(UnitError::Unreachable(
                "no usable cgroup hierarchy (neither v2 nor v1 controllers)".into(),
            ));
        }
        let this = Self {
            hierarchies,
            slice: name::slice_of(prefix),
        };
        for h in &this.hierarchies {
            let slice = h.root().join(&this.slice);
            fs::create_dir_all(&slice)
                .map_err(|source| io_err("creating cgroup", &slice, source))?;
            if let Hierarchy::V2(root) = h {
                // Best effort: fails on a v2 root that is not delegated to us; limits then
                // fail at start, with the file named.
                enable_controllers(root);
                enable_controllers(&slice);
            }
            // All units together weigh less than the daemon beside them (best effort: a
            // host without a cpu controller for us has no weights).
            let weight = match h {
                Hierarchy::V2(_) => Some(("cpu.weight", SLICE_CPU_WEIGHT.to_string())),
                Hierarchy::V1(..) if h.has(V1Controller::Cpu) => Some((
                    "cpu.shares",
                    (u64::from(SLICE_CPU_WEIGHT) * 1024 / 100).to_string(),
                )),
                Hierarchy::V1(..) => None,
            };
            if let Some((file, value)) = weight {
                if slice.join(file).exists() {
                    let _ = fs::write(slice.join(file), value);
                }
            }
        }
        Ok(this)
    }

    /// The slice directories, one per hierarchy.
    pub fn slices(&self) -> Vec<PathBuf> {
        self.hierarchies
            .iter()
            .map(|h| h.root().join(&self.slice))
            .collect()
    }

    /// Create the unit's cgroups and write its limits.
    pub fn create(&self, unit: &str, limits: &Limits) -> Result<UnitCgroup, UnitError> {
        let cg = self.unit(unit);
        for (made, dir) in cg.dirs.iter().enumerate() {
            if let Err(source) = fs::create_dir(&dir.1) {
                // A partial create leaves nothing: the directories made so far go.
                for (_, earlier) in &cg.dirs[..made] {
                    let _ = fs::remove_dir(earlier);
                }
                return Err(io_err("creating cgroup", &dir.1, source));
            }
        }
        if let Err(e) = cg.write_limits(limits) {
            // Nothing runs in it yet: removal cannot block.
            let _ = cg.remove();
            return Err(e);
        }
        Ok(cg)
    }

    /// The handle of unit `unit`'s cgroups, whether or not they exist.
    pub fn unit(&self, unit: &str) -> UnitCgroup {
        UnitCgroup {
            dirs: self
                .hierarchies
                .iter()
                .map(|h| (h.clone(), h.root().join(&self.slice).join(unit)))
                .collect(),
        }
    }

    /// Names of the directories under the slice in any hierarchy that `keep` accepts.
    pub fn children(&self, keep: impl Fn(&str) -> bool) -> Result<Vec<String>, UnitError> {
        let mut names = Vec::new();
        for slice in self.slices() {
            let entries = match fs::read_dir(&slice) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => return Err(io_err("listing cgroup", &slice, source)),
            };
            for entry in entries.flatten() {
                let Ok(n) = entry.file_name().into_string() else {
                    continue;
                };
                if entry.path().is_dir() && keep(&n) && !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        names.sort();
        Ok(names)
    }
}

fn enable_controllers(dir: &Path) {
    let Ok(available) = fs::read_to_string(dir.join("cgroup.controllers")) else {
        return;
    };
    for c in ["memory", "pids", "cpu"] {
        if available.split_whitespace().any(|a| a == c) {
            let _ = fs::write(dir.join("cgroup.subtree_control"), format!("+{c}"));
        }
    }
}

fn io_err(step: &'static str, path: &Path, source: io::Error) -> UnitError {
    UnitError::Io {
        step,
        path: path.display().to_string(),
        source,
    }
}

/// Resource usage of a unit, read from its cgroups after it ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of the whole unit.
    pub cpu_usec: Option<u64>,
    /// Peak memory of the whole unit.
    pub peak_memory_bytes: Option<u64>,
    /// How many times the kernel's OOM killer killed a process of the unit.
    pub oom_kills: u64,
}

/// One unit's cgroups: a directory in each hierarchy.
#[derive(Debug, Clone)]
pub struct UnitCgroup {
    dirs: Vec<(Hierarchy, PathBuf)>,
}

impl UnitCgroup {
    /// The unit's cgroup directories.
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|d| d.1.as_path())
    }

    fn v2(&self) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|d| matches!(d.0, Hierarchy::V2(_)))
            .map(|d| d.1.as_path())
    }

    fn v1(&self, c: V1Controller) -> Option<&Path> {
        self.dirs.iter().find(|d| d.0.has(c)).map(|d| d.1.as_path())
    }

    /// The v2 directory opened for `CLONE_INTO_CGROUP`, when there is a v2 hierarchy.
    pub fn open_v2(&self) -> Result<Option<OwnedFd>, UnitError> {
        let Some(dir) = self.v2() else {
            return Ok(None);
        };
        let fd = rustix::fs::open(
            dir,
            rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| io_err("opening cgroup", dir, e.into()))?;
        Ok(Some(fd))
    }

    /// The `cgroup.procs` files of the v1 hierarchies, opened for the child to join.
    pub fn open_v1_procs(&self) -> Result<Vec<OwnedFd>, UnitError> {
        let mut fds = Vec::new();
        for (h, dir) in &self.dirs {
            if let Hierarchy::V1(..) = h {
                let procs = dir.join("cgroup.procs");
                let fd = rustix::fs::open(
                    &procs,
                    rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .map_err(|e| io_err("opening", &procs, e.into()))?;
                fds.push(fd);
            }
        }
        Ok(fds)
    }

    fn write_limits(&self, limits: &Limits) -> Result<(), UnitError> {
        if let Some(bytes) = limits.memory_max {
            match (
                self.v2().filter(|d| d.join("memory.max").exists()),
                self.v1(V1Controller::Memory),
            ) {
                (Some(d), _) => write(&d.join("memory.max"), &bytes.to_string())?,
                (None, Some(d)) => write(&d.join("memory.limit_in_bytes"), &bytes.to_string())?,
                (None, None) => return Err(missing("memory")),
            }
        }
        if let Some(n) = limits.tasks_max {
            match (
                self.v2().filter(|d| d.join("pids.max").exists()),
                self.v1(V1Controller::Pids),
            ) {
                (Some(d), _) => write(&d.join("pids.max"), &n.to_string())?,
                (None, Some(d)) => write(&d.join("pids.max"), &n.to_string())?,
                (None, None) => return Err(missing("pids")),
            }
        }
        if let Some(weight) = limits.cpu_weight {
            // Best effort: a host without a cpu controller for us has no weights at all.
            match (
                self.v2().filter(|d| d.join("cpu.weight").exists()),
                self.v1(V1Controller::Cpu),
            ) {
                (Some(d), _) => write(&d.join("cpu.weight"), &weight.to_string())?,
                // v1 shares: 1024 is the default weight 100.
                (None, Some(d)) => write(
                    &d.join("cpu.shares"),
                    &(u64::from(weight) * 1024 / 100).max(2).to_string(),
                )?,
                (None, None) => tracing::debug!("no cpu controller: CPU weight not applied"),
            }
        }
        if let Some(pct) = limits.cpu_quota_percent {
            let period: u64 = 100_000;
            let quota = u64::from(pct) * period / 100;
            match (
                self.v2().filter(|d| d.join("cpu.max").exists()),
                self.v1(V1Controller::Cpu),
            ) {
                (Some(d), _) => write(&d.join("cpu.max"), &format!("{quota} {period}"))?,
                (None, Some(d)) => {
                    write(&d.join("cpu.cfs_period_us"), &period.to_string())?;
                    write(&d.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
                (None, None) => return Err(missing("cpu")),
            }
        }
        Ok(())
    }

    /// Pids (as this process sees them) of every process in the unit, over all hierarchies.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self.dirs.iter().flat_map(|d| read_procs(&d.1)).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Usage counters; read after the unit ended and before [`UnitCgroup::remove`].
    pub fn usage(&self) -> Usage {
        let v2 = self.v2();
        let cpu_usec = v2
            .and_then(|d| keyed(&d.join("cpu.stat"), "usage_usec"))
            .or_else(|| {
                self.v1(V1Controller::Cpuacct)
                    .and_then(|d| number(&d.join("cpuacct.usage")))
                    .map(|ns| ns / 1000)
            });
        let peak_memory_bytes = v2.and_then(|d| number(&d.join("memory.peak"))).or_else(|| {
            self.v1(V1Controller::Memory)
                .and_then(|d| number(&d.join("memory.max_usage_in_bytes")))
        });
        let oom_kills = v2
            .and_then(|d| keyed(&d.join("memory.events"), "oom_kill"))
            .or_else(|| {
                self.v1(V1Controller::Memory)
                    .and_then(|d| keyed(&d.join("memory.oom_control"), "oom_kill"))
            })
            .unwrap_or(0);
        Usage {
            cpu_usec,
            peak_memory_bytes,
            oom_kills,
        }
    }

    /// Kill every process in the unit, descendants that double-forked or called setsid
    /// included, and wait until every hierarchy is empty. Blocking (milliseconds).
    ///
    /// v2: `cgroup.kill`. v1: freeze, SIGKILL every member, thaw, until empty.
    pub fn kill_all(&self) -> Result<(), UnitError> {
        match (self.v2(), self.v1(V1Controller::Freezer)) {
            (Some(d), _) if d.join("cgroup.kill").exists() => {
                write_existing(&d.join("cgroup.kill"), "1")?
            }
            (_, Some(freezer)) => freeze_kill(freezer)?,
            _ => {
                for pid in self.pids() {
                    kill9(pid);
                }
            }
        }
        let deadline = Instant::now() + EMPTY_TIMEOUT;
        loop {
            let left = self.pids();
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let dir = self
                    .dirs
                    .first()
                    .map(|d| d.1.display().to_string())
                    .unwrap_or_default();
                return Err(UnitError::Io {
                    step: "emptying cgroup",
                    path: dir,
                    source: io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("{} processes left", left.len()),
                    ),
                });
            }
            // A process that escaped the first pass (forked while being killed on v1).
            if self.v2().is_none() {
                if let Some(freezer) = self.v1(V1Controller::Freezer) {
                    freeze_kill(freezer)?;
                } else {
                    left.into_iter().for_each(kill9);
                }
            }
            std::thread::sleep(POLL);
        }
    }

    /// Remove the unit's directories (every hierarchy). Missing ones are fine.
    pub fn remove(&self) -> Result<(), UnitError> {
        for (_, dir) in &self.dirs {
            let deadline = Instant::now() + EMPTY_TIMEOUT;
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // v1 may lag a moment behind the last exit.
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        std::thread::sleep(POLL)
                    }
                    Err(source) => return Err(io_err("removing cgroup", dir, source)),
                }
            }
        }
        Ok(())
    }
}

/// The v1 freeze-kill: a frozen process cannot fork, so one pass sees every member.
fn freeze_kill(freezer: &Path) -> Result<(), UnitError> {
    let state = freezer.join("freezer.state");
    loop {
        let pids = read_procs(freezer);
        if pids.is_empty() {
            return Ok(());
        }
        write_existing(&state, "FROZEN")?;
        let deadline = Instant::now() + Duration::from_millis(200);
        while fs::read_to_string(&state)
            .map(|s| s.trim() != "FROZEN")
            .unwrap_or(false)
            && Instant::now() < deadline
        {
            std::thread::sleep(POLL);
        }
        for pid in read_procs(freezer) {
            kill9(pid);
        }
        write_existing(&state, "THAWED")?;
        std::thread::sleep(POLL);
    }
}

fn kill9(pid: i32) {
    // SAFETY: kill(2) with a plain pid and signal; no memory is involved.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

fn missing(controller: &str) -> UnitError {
    UnitError::Unreachable(format!(
        "a {controller} limit was asked for but no {controller} controller is available"
    ))
}

fn write(path: &Path, value: &str) -> Result<(), UnitError> {
    fs::write(path, value).map_err(|source| io_err("writing", path, source))
}

/// Write to a file that must exist (never create one in a cgroup directory).
fn write_existing(path: &Path, value: &str) -> Result<(), UnitError> {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|source| io_err("opening", path, source))?;
    f.write_all(value.as_bytes())
        .map_err(|source| io_err("writing", path, source))
}

fn read_procs(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn number(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn keyed(path: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The second of two v1 hierarchies refuses the unit's directory: the first one's goes
    /// too (plain directories stand in for the hierarchies; only mkdir/rmdir are involved).
    #[test]
    fn a_partial_create_leaves_no_directory() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let (a, b) = (tmp.path().join("pids"), tmp.path().join("memory"));
        fs::create_dir(&a)?;
        fs::create_dir(&b)?;
        let cgroups = Cgroups::new(
            "wt",
            vec![
                Hierarchy::V1(vec![V1Controller::Pids], a.clone()),
                Hierarchy::V1(vec![V1Controller::Memory], b.clone()),
            ],
        )?;
        fs::remove_dir(b.join("wt.slice"))?;
        let unit = "wt-0123456789abcdef.service";
        assert!(cgroups.create(unit, &Limits::default()).is_err());
        assert!(
            !a.join("wt.slice").join(unit).exists(),
            "a partial create left a cgroup"
        );
        assert_eq!(fs::read_dir(a.join("wt.slice"))?.count(), 0);
        Ok(())
    }

    #[test]
    fn hybrid_mountinfo() {
        let mi = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
";
        assert_eq!(
            hierarchies(&crate::mountinfo::parse(mi)),
            vec![
                Hierarchy::V1(
                    vec![V1Controller::Cpu, V1Controller::Cpuacct],
                    "/sys/fs/cgroup/cpu,cpuacct".into()
                ),
                Hierarchy::V1(vec![V1Controller::Memory], "/sys/fs/cgroup/memory".into()),
            ]
        );
    }
}
