//! The native backend against the real kernel: as root, with `nobody` as the client.
//!
//! Skips (with a message) when not root, unless `CI=true`, where it fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use warden_proto::{ExitReason, ExitReport, Network};
use wardend::units::native::cgroup::{self, Hierarchy};
use wardend::units::native::{NativeManager, NativeUnit};

mod support;
use support::harness::scaled;
use wardend::units::{FsView, Limits, RunningUnit, UnitManager, UnitName, UnitSpec};

const NOBODY: u32 = 65534;

fn root_or_skip(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root (CI=true, so this is a failure, not a skip)");
    }
    eprintln!("SKIP {test}: needs root (set CI=true to make this a failure)");
    false
}

/// The processes of a unit's cgroups once there are at least `n` (up to 10 s: the VM is
/// slow).
async fn procs_at_least(dirs: &[PathBuf], n: usize) -> Vec<i32> {
    let mut pids = Vec::new();
    for _ in 0..2000 {
        pids = dirs.iter().flat_map(|d| procs(d)).collect();
        pids.sort();
        pids.dedup();
        if pids.len() >= n {
            return pids;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("fewer than {n} processes: {pids:?}");
}

fn random_prefix() -> String {
    let mut b = [0u8; 4];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).unwrap();
    format!(
        "wtest{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

/// Removes every cgroup of the prefix, even when the test failed.
struct Guard {
    slices: Vec<PathBuf>,
}

impl Guard {
    fn new(m: &NativeManager) -> Self {
        Self { slices: m.slices() }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for slice in &self.slices {
            for entry in fs::read_dir(slice).into_iter().flatten().flatten() {
                let dir = entry.path();
                if !dir.is_dir() {
                    continue;
                }
                let _ = fs::write(dir.join("cgroup.kill"), "1");
                for pid in procs(&dir) {
                    let _ = rustix::process::kill_process(
                        rustix::process::Pid::from_raw(pid).unwrap(),
                        rustix::process::Signal::KILL,
                    );
                }
                for _ in 0..500 {
                    if fs::remove_dir(&dir).is_ok() || !dir.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            let _ = fs::remove_dir(slice);
        }
    }
}

fn subdirs(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().into_string().unwrap())
        .collect()
}

fn procs(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

/// Alive, and not a zombie.
fn running(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

struct Dirs {
    cwd: tempfile::TempDir,
    home: tempfile::TempDir,
}

fn dirs() -> Dirs {
    let cwd = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    chown(cwd.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    chown(home.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    Dirs { cwd, home }
}

struct Output {
    stdout: fs::File,
    stderr: fs::File,
}

impl Output {
    fn read(self) -> (String, String) {
        let (mut out, mut err) = (String::new(), String::new());
        let (mut o, mut e) = (self.stdout, self.stderr);
        o.read_to_string(&mut out).unwrap();
        e.read_to_string(&mut err).unwrap();
        (out, err)
    }
}

fn spec(prefix: &str, argv: &[&str], d: &Dirs) -> (UnitSpec, Output) {
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let cwd: OwnedFd = fs::File::open(d.cwd.path()).unwrap().into();
    let spec = UnitSpec {
        name: UnitName::random(prefix).unwrap(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        path: "/usr/bin:/bin".into(),
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("HOME".into(), d.home.path().display().to_string()),
        ],
        cwd,
        cwd_path: d.cwd.path().to_path_buf(),
        stdio: [None, Some(out_w), Some(err_w)],
        user: "nobody".into(),
        uid: NOBODY,
        gid: NOBODY,
        groups: vec![NOBODY],
        home: Some(d.home.path().to_path_buf()),
        fs: FsView {
            cwd_writable: true,
            ..FsView::default()
        },
        network: Network::None,
        limits: Limits::default(),
    };
    (
        spec,
        Output {
            stdout: out_r.into(),
            stderr: err_r.into(),
        },
    )
}

async fn run(m: &NativeManager, spec: UnitSpec, out: Output) -> (ExitReport, String, String) {
    let mut unit = m.start(spec).await.unwrap();
    let report = unit.wait().await.unwrap();
    unit.stop().await.unwrap();
    let (o, e) = tokio::task::spawn_blocking(move || out.read())
        .await
        .unwrap();
    (report, o, e)
}

fn manager() -> (NativeManager, Guard, String) {
    let prefix = random_prefix();
    let m = NativeManager::new(&prefix).unwrap();
    let g = Guard::new(&m);
    (m, g, prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_and_output() {
    if !root_or_skip("exit_code_and_output") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (s, out) = spec(&prefix, &["sh", "-c", "echo out; echo err >&2; exit 7"], &d);
    let (report, o, e) = run(&m, s, out).await;
    assert_eq!(
        (report.reason, report.code, report.signal),
        (ExitReason::Exited, Some(7), None),
        "{report:?} {e}"
    );
    assert_eq!(o, "out\n");
    assert_eq!(e, "err\n");
    assert!(report.cpu_usec.is_some(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_by_sigkill_reports_signal_9() {
    if !root_or_skip("killed_by_sigkill_reports_signal_9") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (s, out) = spec(&prefix, &["sh", "-c", "kill -9 $$"], &d);
    let (report, _, e) = run(&m, s, out).await;
    assert_eq!(
        (report.reason, report.code, report.signal),
        (ExitReason::Signal, None, Some(9)),
        "{report:?} {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_as_nobody_with_no_new_privs_alone_in_its_pid_namespace() {
    if !root_or_skip("runs_as_nobody_with_no_new_privs_alone_in_its_pid_namespace") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let script = "id -u; id -g; grep NoNewPrivs /proc/self/status; echo procs $(ls /proc | grep '^[0-9]*$' | tr '\\n' ' '); \
                  ps -e -o pid= | wc -l; echo fds $(ls /proc/self/fd | tr '\\n' ' '); hostname";
    let (s, out) = spec(&prefix, &["sh", "-c", script], &d);
    let (report, o, e) = run(&m, s, out).await;
    assert_eq!(report.code, Some(0), "{report:?} {o} {e}");
    let lines: Vec<&str> = o.lines().collect();
    assert_eq!(lines[0], "65534", "{o}");
    assert_eq!(lines[1], "65534", "{o}");
    assert_eq!(
        lines[2].split_whitespace().collect::<Vec<_>>(),
        ["NoNewPrivs:", "1"],
        "{o}"
    );
    // init (1), sh, and the ls/grep of the pipeline: all small pids of the new namespace.
    let pids: Vec<u32> = lines[3]
        .split_whitespace()
        .skip(1)
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(
        pids.contains(&1) && pids.len() <= 6 && pids.iter().all(|&p| p < 20),
        "{o}"
    );
    let ps: usize = lines[4].trim().parse().unwrap();
    assert!(ps <= 6, "ps sees {ps} processes: {o}");
    // 0 1 2 and the directory ls itself opened.
    let fds: Vec<u32> = lines[5]
        .split_whitespace()
        .skip(1)
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(fds.starts_with(&[0, 1, 2]) && fds.len() <= 4, "{o}");
    assert_eq!(lines[6], "warden");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_is_read_only_except_the_cwd_and_hidden_paths_are_hidden() {
    if !root_or_skip("filesystem_is_read_only_except_the_cwd_and_hidden_paths_are_hidden") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let secret_dir = d.home.path().join(".ssh");
    fs::create_dir(&secret_dir).unwrap();
    fs::write(secret_dir.join("id_rsa"), "SECRET-KEY").unwrap();
    let secret_file = d.home.path().join(".netrc");
    fs::write(&secret_file, "SECRET-NETRC").unwrap();
    for p in [&secret_dir, &secret_file, &secret_dir.join("id_rsa")] {
        chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let script = "touch /etc/wtest 2>/dev/null && echo etc-writable; touch \"$HOME/x\" 2>/dev/null && echo home-writable; \
                  touch ./ok && echo cwd-ok; touch /tmp/t && echo tmp-ok; cat \"$HOME/.ssh/id_rsa\" \"$HOME/.netrc\" 2>/dev/null; \
                  ls -A \"$HOME/.ssh\"; ls /tmp; true";
    let (mut s, out) = spec(&prefix, &["sh", "-c", script], &d);
    s.fs.hidden = vec![
        secret_dir.clone(),
        secret_file.clone(),
        PathBuf::from("/does/not/exist"),
    ];
    let (report, o, e) = run(&m, s, out).await;
    assert_eq!(report.code, Some(0), "{report:?} {o} {e}");
    assert!(
        !o.contains("etc-writable") && !o.contains("home-writable"),
        "{o}"
    );
    assert!(o.contains("cwd-ok") && o.contains("tmp-ok"), "{o} {e}");
    assert!(!o.contains("SECRET"), "{o}");
    assert!(d.cwd.path().join("ok").exists());
    assert!(!Path::new("/etc/wtest").exists() && !d.home.path().join("x").exists());
    // The private /tmp is empty but for the cwd's mount point and what the unit wrote.
    assert!(!Path::new("/tmp/t").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_exe_is_an_error_that_says_so() {
    if !root_or_skip("missing_exe_is_an_error_that_says_so") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (s, _out) = spec(&prefix, &["/nonexistent/prog"], &d);
    let dirs_before: Vec<PathBuf> = m.slices();
    let err = match m.start(s).await {
        Ok(_) => panic!("a missing exe started"),
        Err(e) => e.to_string(),
    };
    assert_eq!(err, "/nonexistent/prog: command not found");
    // Nothing is left behind.
    for slice in dirs_before {
        assert!(subdirs(&slice).is_empty(), "{}", slice.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_are_forwarded_to_the_command() {
    if !root_or_skip("signals_are_forwarded_to_the_command") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (s, out) = spec(
        &prefix,
        &[
            "sh",
            "-c",
            "trap 'echo got-term; exit 3' TERM; while :; do sleep 0.02; done",
        ],
        &d,
    );
    let mut unit = m.start(s).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    unit.signal(libc::SIGTERM).await.unwrap();
    let report = tokio::time::timeout(Duration::from_secs(5), unit.wait())
        .await
        .unwrap()
        .unwrap();
    unit.stop().await.unwrap();
    let (o, _) = tokio::task::spawn_blocking(move || out.read())
        .await
        .unwrap();
    assert_eq!(
        (report.reason, report.code),
        (ExitReason::Exited, Some(3)),
        "{report:?}"
    );
    assert_eq!(o, "got-term\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_time_limit_kills_with_reason_timeout() {
    if !root_or_skip("wall_time_limit_kills_with_reason_timeout") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (mut s, _out) = spec(&prefix, &["sleep", "10"], &d);
    s.limits.timeout = Some(Duration::from_millis(200));
    let t = Instant::now();
    let mut unit = m.start(s).await.unwrap();
    let report = unit.wait().await.unwrap();
    unit.stop().await.unwrap();
    assert_eq!(report.reason, ExitReason::Timeout, "{report:?}");
    assert!(t.elapsed() < scaled(Duration::from_secs(3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_network_sees_only_loopback() {
    if !root_or_skip("no_network_sees_only_loopback") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (s, out) = spec(
        &prefix,
        &[
            "sh",
            "-c",
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
        ],
        &d,
    );
    let (report, o, e) = run(&m, s, out).await;
    assert_eq!(report.code, Some(0), "{e}");
    assert_eq!(o, "lo\n");
}

/// A TCP connection to 127.0.0.1 inside the unit, and whether `lo` has its IPv6 address
/// (the kernel gives it ::1 when it comes up).
const NET_PROBE: &str = r#"
/usr/bin/python3 -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
c = socket.create_connection(s.getsockname(), timeout=2); print("tcp-ok")' 2>/dev/null || echo tcp-failed
flags=$(cat /sys/class/net/lo/flags) && [ $((flags & 1)) = 1 ] && echo lo-up || echo lo-down
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_is_up_and_none_has_no_network() {
    if !root_or_skip("loopback_is_up_and_none_has_no_network") {
        return;
    }
    let (m, _g, prefix) = manager();
    for (network, tcp, lo) in [
        (Network::Loopback, "tcp-ok", "lo-up"),
        (Network::None, "tcp-failed", "lo-down"),
    ] {
        let d = dirs();
        let (mut s, out) = spec(&prefix, &["sh", "-c", NET_PROBE], &d);
        s.network = network;
        let (report, o, e) = run(&m, s, out).await;
        assert_eq!(report.code, Some(0), "{network:?}: {e}");
        // The unit's own sysfs shows its own network namespace's lo.
        assert_eq!(o, format!("{tcp}\n{lo}\n"), "{network:?}: {e}");
    }
}

/// `sh -c 'setsid sh -c "sleep 1000" & sleep 1000'`, then stop: nothing may remain.
async fn stop_kills_the_whole_tree(m: &NativeManager, prefix: &str) {
    let d = dirs();
    let (s, _out) = spec(
        prefix,
        &["sh", "-c", "setsid sh -c 'sleep 1000' & sleep 1000"],
        &d,
    );
    let mut unit: NativeUnit = m.start(s).await.unwrap();
    let dirs = unit.cgroup_dirs();
    let mut pids = Vec::new();
    for _ in 0..200 {
        pids = dirs.iter().flat_map(|d| procs(d)).collect();
        pids.sort();
        pids.dedup();
        if pids.len() >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // init, sh, sleep, setsid'd sh, its sleep.
    assert!(pids.len() >= 5, "{pids:?}");
    let t = Instant::now();
    unit.stop().await.unwrap();
    let took = t.elapsed();
    assert!(
        took < scaled(Duration::from_millis(100)),
        "stop took {took:?}"
    );
    for pid in &pids {
        assert!(!running(*pid), "pid {pid} survived stop");
    }
    for dir in &dirs {
        assert!(!dir.exists(), "{} survived stop", dir.display());
    }
    // A second stop is a no-op.
    unit.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_kills_double_forked_descendants_default_hierarchies() {
    if !root_or_skip("stop_kills_double_forked_descendants_default_hierarchies") {
        return;
    }
    let (m, _g, prefix) = manager();
    stop_kills_the_whole_tree(&m, &prefix).await;
}

fn detected() -> Vec<Hierarchy> {
    cgroup::detect().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_on_cgroup_v2_only_uses_cgroup_kill() {
    if !root_or_skip("stop_on_cgroup_v2_only_uses_cgroup_kill") {
        return;
    }
    let v2: Vec<Hierarchy> = detected()
        .into_iter()
        .filter(|h| matches!(h, Hierarchy::V2(_)))
        .collect();
    if v2.is_empty() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "no cgroup v2 hierarchy on this CI host"
        );
        eprintln!("SKIP: no cgroup v2 hierarchy");
        return;
    }
    let prefix = random_prefix();
    let m = NativeManager::with_hierarchies(&prefix, v2).unwrap();
    let _g = Guard::new(&m);
    stop_kills_the_whole_tree(&m, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_on_cgroup_v1_only_uses_the_freezer() {
    if !root_or_skip("stop_on_cgroup_v1_only_uses_the_freezer") {
        return;
    }
    let v1: Vec<Hierarchy> = detected()
        .into_iter()
        .filter(|h| matches!(h, Hierarchy::V1(..)))
        .collect();
    if v1.is_empty() {
        // Never a silent pass: a host without v1 (the Debian VM) deselects this test by
        // name, with the reason printed (scripts/vm); run anyway under CI, it fails.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and this host has no cgroup v1 hierarchy: deselect this test explicitly"
        );
        eprintln!("SKIP: no cgroup v1 hierarchy (pure v2 host)");
        return;
    }
    let prefix = random_prefix();
    let m = NativeManager::with_hierarchies(&prefix, v1).unwrap();
    let _g = Guard::new(&m);
    stop_kills_the_whole_tree(&m, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_and_memory_limits_are_enforced() {
    if !root_or_skip("tasks_and_memory_limits_are_enforced") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (mut s, out) = spec(
        &prefix,
        &[
            "sh",
            "-c",
            "for i in 1 2 3 4 5 6 7 8; do sleep 1 & done; wait; echo all-forked",
        ],
        &d,
    );
    s.limits.tasks_max = Some(4);
    let t = Instant::now();
    let (report, o, e) = run(&m, s, out).await;
    assert!(t.elapsed() < scaled(Duration::from_secs(5)));
    // init + sh + 2 sleeps: the third fork fails (dash gives up with status 2).
    assert!(
        !o.contains("all-forked") && e.contains("fork"),
        "{report:?} {o} {e}"
    );

    let d = dirs();
    let (mut s, out) = spec(
        &prefix,
        &[
            "sh",
            "-c",
            "head -c 300000000 /dev/zero | tail -c 200000000 > /dev/null; echo survived",
        ],
        &d,
    );
    s.limits.memory_max = Some(32 << 20);
    let (report, o, _) = run(&m, s, out).await;
    // tail holds 200 MB in a 32 MB cgroup: the OOM killer ends it.
    assert_eq!(report.reason, ExitReason::Oom, "{report:?} {o}");
    assert!(
        report.peak_memory_bytes.is_some_and(|p| p <= 40 << 20),
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_of_a_forgotten_manager_are_cleaned_up() {
    if !root_or_skip("orphans_of_a_forgotten_manager_are_cleaned_up") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let mut pids = Vec::new();
    let mut names = Vec::new();
    for _ in 0..20 {
        let (s, _out) = spec(&prefix, &["sh", "-c", "setsid sleep 1000 & sleep 1000"], &d);
        let unit = m.start(s).await.unwrap();
        names.push(unit.name().to_string());
        pids.push(unit.init_pid());
        std::mem::forget(unit);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for slice in m.slices() {
        for entry in fs::read_dir(&slice).unwrap() {
            pids.extend(procs(&entry.unwrap().path()));
        }
        pids.retain(|&p| p > 0);
    }
    drop(m);
    // A foreign directory in the slice is left alone.
    let foreign = NativeManager::new(&prefix).unwrap().slices()[0].join("not-a-unit");
    fs::create_dir(&foreign).unwrap();

    let m2 = NativeManager::new(&prefix).unwrap();
    let mut cleaned = m2.cleanup_orphans().await.unwrap();
    cleaned.sort();
    names.sort();
    assert_eq!(cleaned, names);
    for pid in &pids {
        assert!(!running(*pid), "pid {pid} survived orphan cleanup");
    }
    for slice in m2.slices() {
        let left = subdirs(&slice);
        assert!(left.iter().all(|n| n == "not-a-unit"), "{left:?}");
    }
    fs::remove_dir(&foreign).unwrap();
    assert!(m2.cleanup_orphans().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_removes_its_empty_slices_when_dropped() {
    if !root_or_skip("the_manager_removes_its_empty_slices_when_dropped") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (s, out) = spec(&prefix, &["true"], &d);
    let (report, _, _) = run(&m, s, out).await;
    assert_eq!(report.code, Some(0));
    let slices = m.slices();
    assert!(!slices.is_empty() && slices.iter().all(|s| s.is_dir()));
    drop(m);
    let left: Vec<_> = slices.iter().filter(|s| s.exists()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_unit_is_still_killed_and_removed() {
    if !root_or_skip("a_dropped_unit_is_still_killed_and_removed") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (s, _out) = spec(&prefix, &["sh", "-c", "setsid sleep 1000 & sleep 1000"], &d);
    let unit = m.start(s).await.unwrap();
    let dirs = unit.cgroup_dirs();
    let pids = procs_at_least(&dirs, 3).await;
    drop(unit);
    let deadline = Instant::now() + Duration::from_secs(2);
    while (dirs.iter().any(|d| d.exists()) || pids.iter().any(|&p| running(p)))
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?}");
    assert!(pids.iter().all(|&p| !running(p)), "{pids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn main_pid_of_a_unit_process_is_its_init() {
    if !root_or_skip("main_pid_of_a_unit_process_is_its_init") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (s, _out) = spec(&prefix, &["sh", "-c", "sleep 1000 & sleep 1000"], &d);
    let mut unit = m.start(s).await.unwrap();
    let pids = procs_at_least(&unit.cgroup_dirs(), 3).await;
    for pid in pids {
        assert_eq!(
            m.main_pid_of(pid as u32).await,
            Some(unit.init_pid() as u32),
            "{pid}"
        );
    }
    assert_eq!(m.main_pid_of(std::process::id()).await, None);
    unit.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_writable_paths_are_writable_and_symlinks_are_refused() {
    if !root_or_skip("extra_writable_paths_are_writable_and_symlinks_are_refused") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let cache = d.home.path().join("cache");
    fs::create_dir(&cache).unwrap();
    chown(&cache, Some(NOBODY), Some(NOBODY)).unwrap();
    let (mut s, out) = spec(
        &prefix,
        &["sh", "-c", "touch \"$HOME/cache/x\" && echo cache-ok; touch \"$HOME/y\" 2>/dev/null && echo home-writable; true"],
        &d,
    );
    s.fs.writable = vec![cache.clone(), d.home.path().join("missing")];
    let (report, o, e) = run(&m, s, out).await;
    assert_eq!(report.code, Some(0), "{e}");
    assert!(
        o.contains("cache-ok") && !o.contains("home-writable"),
        "{o} {e}"
    );
    assert!(cache.join("x").exists());

    // A writable path the agent swapped for a symlink (to a hidden directory, say).
    let secret = d.home.path().join(".ssh");
    fs::create_dir(&secret).unwrap();
    let link = d.home.path().join("link");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let (mut s, _out) = spec(&prefix, &["true"], &d);
    s.fs.writable = vec![link.clone()];
    s.fs.hidden = vec![secret];
    let err = match m.start(s).await {
        Ok(_) => panic!("a symlinked writable path was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("not a canonical path") && err.contains(&link.display().to_string()),
        "{err}"
    );
}

/// Not a benchmark, a sanity number: `cargo test -p wardend --release --test native_backend
/// -- --ignored --nocapture start_rate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn start_rate() {
    if !root_or_skip("start_rate") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let n = 200;
    let t = Instant::now();
    for _ in 0..n {
        let (s, _out) = spec(&prefix, &["true"], &d);
        let mut unit = m.start(s).await.unwrap();
        assert_eq!(unit.wait().await.unwrap().code, Some(0));
        unit.stop().await.unwrap();
    }
    let each = t.elapsed() / n;
    eprintln!(
        "start+wait+stop of /bin/true, sequential: {each:?} each, {:.0}/s",
        1.0 / each.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_quota_and_limits_are_written_to_the_cgroup() {
    if !root_or_skip("cpu_quota_and_limits_are_written_to_the_cgroup") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let (mut s, _out) = spec(&prefix, &["sleep", "1000"], &d);
    s.limits = Limits {
        memory_max: Some(64 << 20),
        tasks_max: Some(17),
        cpu_quota_percent: Some(50),
        cpu_weight: Some(50),
        timeout: None,
    };
    let mut unit = m.start(s).await.unwrap();
    let read = |file: &str| -> Option<String> {
        unit.cgroup_dirs()
            .iter()
            .find_map(|d| fs::read_to_string(d.join(file)).ok())
            .map(|s| s.trim().to_string())
    };
    let cpu = read("cpu.max").or_else(|| read("cpu.cfs_quota_us"));
    assert!(
        cpu.as_deref() == Some("50000 100000") || cpu.as_deref() == Some("50000"),
        "{cpu:?}"
    );
    assert_eq!(read("pids.max").as_deref(), Some("17"));
    let mem = read("memory.max").or_else(|| read("memory.limit_in_bytes"));
    assert_eq!(mem.as_deref(), Some("67108864"));
    // Weight 50 (v2), or half of the default 1024 shares (v1).
    let weight = read("cpu.weight").or_else(|| read("cpu.shares"));
    assert!(
        weight.as_deref() == Some("50") || weight.as_deref() == Some("512"),
        "{weight:?}"
    );
    // The slice, all units together, weighs less than the daemon (weight 100 / 1024 shares).
    let slice_weight = m.slices().iter().find_map(|d| {
        ["cpu.weight", "cpu.shares"]
            .iter()
            .find_map(|f| fs::read_to_string(d.join(f)).ok())
    });
    assert!(
        matches!(
            slice_weight.as_deref().map(str::trim),
            Some("50") | Some("512")
        ),
        "{slice_weight:?}"
    );
    unit.stop().await.unwrap();
}

/// Python probes of the seccomp filter, one line of output each.
const SECCOMP_PROBE: &str = r#"
import ctypes, errno, fcntl, os, socket, termios
def probe(name, f):
    try:
        f(); print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
libc = ctypes.CDLL(None, use_errno=True)
def ptrace():
    if libc.ptrace(0, 0, None, None) != 0:  # PTRACE_TRACEME
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
def tiocsti():
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSTI, b"x")
probe("inet", lambda: socket.socket(socket.AF_INET).close())
probe("inet6", lambda: socket.socket(socket.AF_INET6).close())
probe("unix", lambda: socket.socket(socket.AF_UNIX).close())
probe("ptrace", ptrace)
probe("tiocsti", tiocsti)
probe("fork", lambda: os.waitpid(os.fork() or os._exit(0), 0))
"#;

fn probe_lines(o: &str) -> std::collections::HashMap<String, String> {
    o.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_refuses_ip_sockets_without_network_ptrace_and_terminal_injection() {
    if !root_or_skip("seccomp_refuses_ip_sockets_without_network_ptrace_and_terminal_injection") {
        return;
    }
    let (m, _g, prefix) = manager();
    for (network, inet) in [(Network::None, "EAFNOSUPPORT"), (Network::Loopback, "ok")] {
        let d = dirs();
        let (mut s, out) = spec(&prefix, &["/usr/bin/python3", "-c", SECCOMP_PROBE], &d);
        s.network = network;
        let (report, o, e) = run(&m, s, out).await;
        assert_eq!(report.code, Some(0), "{network:?}: {o} {e}");
        let p = probe_lines(&o);
        let get = |k: &str| p.get(k).map(String::as_str);
        assert_eq!(get("inet"), Some(inet), "{network:?}: {o}");
        assert_eq!(get("inet6"), Some(inet), "{network:?}: {o}");
        assert_eq!(get("unix"), Some("ok"), "{network:?}: {o}");
        assert_eq!(get("ptrace"), Some("EPERM"), "{network:?}: {o}");
        assert_eq!(get("tiocsti"), Some("EPERM"), "{network:?}: {o}");
        assert_eq!(get("fork"), Some("ok"), "{network:?}: {o}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_refuses_namespaces_and_mounts_but_ordinary_commands_work() {
    if !root_or_skip("seccomp_refuses_namespaces_and_mounts_but_ordinary_commands_work") {
        return;
    }
    let (m, _g, prefix) = manager();
    let d = dirs();
    let script = "unshare -U true 2>/dev/null && echo unshare-worked; \
                  unshare -r -m true 2>/dev/null && echo unshare-root-worked; \
                  if [ -x /usr/bin/strace ]; then strace -o /dev/null true 2>/dev/null && echo strace-worked; fi; \
                  ls / >/dev/null && cat /etc/os-release >/dev/null && \
                  python3 -c 'import os, sys; pid = os.fork(); pid or os._exit(3); sys.exit(os.waitpid(pid, 0)[1] >> 8)'; \
                  echo fork-exit $?; \
                  python3 -c 'import threading; t = threading.Thread(target=print, args=(\"thread-ok\",)); t.start(); t.join()'";
    let (s, out) = spec(&prefix, &["sh", "-c", script], &d);
    let (report, o, e) = run(&m, s, out).await;
    assert_eq!(report.code, Some(0), "{report:?} {o} {e}");
    assert!(!o.contains("worked"), "{o}");
    assert!(
        o.contains("fork-exit 3") && o.contains("thread-ok"),
        "{o} {e}"
    );
}
