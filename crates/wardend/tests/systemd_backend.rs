//! The systemd backend against a real systemd (SPEC §7).
//!
//! Each test boots its own throwaway container ([`support::container`]) and drives
//! [`SystemdManager`] from the host process. The connection is made to the container's
//! `/run/systemd/private` (peer-to-peer, as wardend does on a host without a system bus) or,
//! in one test, to its system bus (`dbus.socket` started inside). systemd refuses a private
//! connection from a peer outside its PID namespace, so the harness makes the `connect()` from
//! a child forked into that namespace and hands the stream over
//! ([`SystemdContainer::connect_unix`]). The units run inside the container, which sees the
//! host's root as an overlay, so host paths (this crate's directory as the cwd) are valid
//! there. Unit state is checked with `systemctl` inside the container.
//!
//! Needs root and systemd-nspawn: run as root with
//! `cargo test -p wardend --test systemd_backend` (or `cargo nextest run -p wardend
//! --test systemd_backend`). Without them the tests skip with a message, except under
//! `CI=true`, where they fail.

mod support;

use std::error::Error;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use support::container::{should_skip, SystemdContainer};
use warden_proto::{ExitReason, Network};
use wardend::units::systemd::{SystemdManager, Transport};
use wardend::units::{FsView, Limits, RunningUnit, UnitError, UnitManager, UnitName, UnitSpec};

type TestResult = Result<(), Box<dyn Error>>;

/// The uid and gid of `nobody` / `nogroup`, which exist everywhere.
const NOBODY: u32 = 65534;

/// The cwd every test unit runs in: a directory that exists on the host and in the
/// container, and is not under /tmp (private in every unit), wherever the checkout is.
fn cwd() -> PathBuf {
    PathBuf::from("/srv")
}

/// A spec running `argv` as nobody, in [`cwd`], with no network and the given stdio.
fn spec(
    prefix: &str,
    argv: &[&str],
    stdio: [Option<OwnedFd>; 3],
) -> Result<UnitSpec, Box<dyn Error>> {
    Ok(UnitSpec {
        name: UnitName::random(prefix)?,
        argv: argv.iter().map(|a| a.to_string()).collect(),
        path: "/usr/bin:/bin".into(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: File::open(cwd())?.into(),
        cwd_path: cwd(),
        stdio,
        user: "nobody".into(),
        uid: NOBODY,
        gid: NOBODY,
        groups: vec![],
        home: None,
        fs: FsView {
            cwd_writable: true,
            ..FsView::default()
        },
        network: Network::None,
        limits: Limits::default(),
    })
}

/// Boot a container and connect a manager for `prefix` to it.
async fn setup(prefix: &str) -> Result<(SystemdContainer, SystemdManager), Box<dyn Error>> {
    let container = SystemdContainer::boot()?;
    let manager =
        SystemdManager::connect_stream(prefix, container.connect_private()?, Transport::Private)
            .await?;
    Ok((container, manager))
}

/// The units of `prefix` that systemd still has loaded.
fn units_of(container: &SystemdContainer, prefix: &str) -> Result<Vec<String>, Box<dyn Error>> {
    Ok(container.units_matching(&format!("{prefix}-*"))?)
}

#[tokio::test]
async fn exit_code_and_stdout_come_back() -> TestResult {
    if should_skip("exit_code_and_stdout_come_back") {
        return Ok(());
    }
    let (container, manager) = setup("wexit").await?;
    let (read, write) = rustix::pipe::pipe()?;
    let spec = spec(
        "wexit",
        &["/bin/sh", "-c", "echo out; exit 7"],
        [None, Some(write), None],
    )?;
    let mut unit = manager.start(spec).await?;
    let report = tokio::time::timeout(Duration::from_secs(20), unit.wait()).await??;
    assert_eq!(report.reason, ExitReason::Exited, "{report:?}");
    assert_eq!((report.code, report.signal), (Some(7), None), "{report:?}");
    // cpu_usec stays None here: in this container (cgroup v1) the cpuacct controller is not
    // delegated, so systemd has no CPU usage to report. Its mapping is unit-tested.
    assert!(report.wall_usec > 0, "{report:?}");
    // start() closed its copy of the write end: reading ends at the unit's end.
    let mut out = String::new();
    File::from(read).read_to_string(&mut out)?;
    assert_eq!(out, "out\n");
    unit.stop().await?;
    assert_eq!(units_of(&container, "wexit")?, Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn sigkill_is_reported_as_signal_9() -> TestResult {
    if should_skip("sigkill_is_reported_as_signal_9") {
        return Ok(());
    }
    let (container, manager) = setup("wkill").await?;
    let mut unit = manager
        .start(spec("wkill", &["/bin/sleep", "1000"], [None, None, None])?)
        .await?;
    // wait() is cancel-safe: a wait that times out leaves the unit waitable.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), unit.wait())
            .await
            .is_err()
    );
    unit.signal(libc::SIGKILL).await?;
    let report = tokio::time::timeout(Duration::from_secs(20), unit.wait()).await??;
    assert_eq!(report.reason, ExitReason::Signal, "{report:?}");
    assert_eq!((report.code, report.signal), (None, Some(9)), "{report:?}");
    unit.stop().await?;
    assert_eq!(units_of(&container, "wkill")?, Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn the_wall_time_limit_is_reported_as_timeout() -> TestResult {
    if should_skip("the_wall_time_limit_is_reported_as_timeout") {
        return Ok(());
    }
    let (container, manager) = setup("wtime").await?;
    let mut spec = spec("wtime", &["/bin/sleep", "1000"], [None, None, None])?;
    spec.limits.timeout = Some(Duration::from_millis(300));
    let mut unit = manager.start(spec).await?;
    let report = tokio::time::timeout(Duration::from_secs(20), unit.wait()).await??;
    assert_eq!(report.reason, ExitReason::Timeout, "{report:?}");
    assert_eq!(report.signal, Some(libc::SIGTERM), "{report:?}");
    unit.stop().await?;
    assert_eq!(units_of(&container, "wtime")?, Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn properties_reach_systemd() -> TestResult {
    if should_skip("properties_reach_systemd") {
        return Ok(());
    }
    let (container, manager) = setup("wprop").await?;
    let mut spec = spec("wprop", &["/bin/sleep", "1000"], [None, None, None])?;
    spec.limits = Limits {
        memory_max: Some(256 << 20),
        tasks_max: Some(64),
        cpu_quota_percent: Some(150),
        cpu_weight: Some(40),
        timeout: Some(Duration::from_secs(600)),
    };
    spec.fs.hidden = vec![
        PathBuf::from("/root/.ssh"),
        PathBuf::from("/nonexistent/hidden"),
    ];
    let mut unit = manager.start(spec).await?;
    let name = unit.name().to_string();
    let prop = |p: &str| container.unit_property(&name, p);

    assert_eq!(prop("ActiveState")?, "active");
    assert_eq!(prop("Slice")?, "wprop.slice");
    assert_eq!(prop("User")?, "nobody");
    assert_eq!(prop("NoNewPrivileges")?, "yes");
    assert_eq!(prop("ProtectSystem")?, "strict");
    assert_eq!(prop("ProtectHome")?, "read-only");
    assert_eq!(prop("PrivateTmp")?, "yes");
    assert_eq!(prop("PrivateNetwork")?, "yes");
    assert_eq!(prop("RestrictAddressFamilies")?, "AF_UNIX");
    assert_eq!(prop("KillMode")?, "control-group");
    // Over the private socket: kept loaded by RemainAfterExit until stop() (AddRef needs a bus).
    assert_eq!(prop("CollectMode")?, "inactive");
    assert_eq!(prop("RemainAfterExit")?, "yes");
    assert_eq!(prop("MemoryMax")?, (256u64 << 20).to_string());
    assert_eq!(prop("TasksMax")?, "64");
    assert_eq!(prop("CPUQuotaPerSecUSec")?, "1.500000s");
    assert_eq!(prop("RuntimeMaxUSec")?, "10min");
    assert_eq!(prop("WorkingDirectory")?, cwd().display().to_string());
    assert!(prop("ReadWritePaths")?.contains(&cwd().display().to_string()));
    assert!(
        prop("InaccessiblePaths")?.contains("-/root/.ssh"),
        "{}",
        prop("InaccessiblePaths")?
    );

    // The process itself runs as nobody, with no-new-privileges.
    let main_pid = prop("MainPID")?;
    let status = container.exec(&["cat", &format!("/proc/{main_pid}/status")])?;
    let status = String::from_utf8_lossy(&status.stdout);
    let line = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .map(str::to_string)
            .unwrap_or_default()
    };
    assert_eq!(
        line("Uid:").split_whitespace().skip(1).collect::<Vec<_>>(),
        ["65534"; 4]
    );
    assert_eq!(line("NoNewPrivs:").split_whitespace().nth(1), Some("1"));

    // main_pid_of: any PID of the unit (in systemd's PID namespace) gives its main PID.
    let pid: u32 = main_pid.parse()?;
    assert_eq!(manager.main_pid_of(pid).await, Some(pid));
    assert_eq!(manager.main_pid_of(1).await, None, "PID 1 is in no service");

    unit.stop().await?;
    assert_eq!(units_of(&container, "wprop")?, Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn stop_removes_a_running_unit_and_is_idempotent() -> TestResult {
    if should_skip("stop_removes_a_running_unit_and_is_idempotent") {
        return Ok(());
    }
    let (container, manager) = setup("wstop").await?;
    // Two processes: stop ends the whole control group, not only the main process.
    let spec = spec(
        "wstop",
        &["/bin/sh", "-c", "sleep 1000 & sleep 1000"],
        [None, None, None],
    )?;
    let mut unit = manager.start(spec).await?;
    let name = unit.name().to_string();
    assert_eq!(units_of(&container, "wstop")?, vec![name.clone()]);
    unit.stop().await?;
    assert_eq!(units_of(&container, "wstop")?, Vec::<String>::new());
    unit.stop().await?;
    let sleepers = container.exec(&["pgrep", "-x", "sleep"])?;
    assert!(
        sleepers.stdout.is_empty(),
        "left running: {}",
        String::from_utf8_lossy(&sleepers.stdout)
    );
    Ok(())
}

#[tokio::test]
async fn an_immediate_failure_is_an_exit_not_a_failed_start() -> TestResult {
    if should_skip("an_immediate_failure_is_an_exit_not_a_failed_start") {
        return Ok(());
    }
    let (container, manager) = setup("wfalse").await?;
    // /bin/false may exit before systemd sees its exec succeed: the start job then fails,
    // but the command ran, and its exit status is what counts.
    let mut ran = 0;
    for _ in 0..8 {
        let mut unit = match manager
            .start(spec("wfalse", &["/bin/false"], [None, None, None])?)
            .await
        {
            Ok(unit) => unit,
            // 219/CGROUP: the test container's systemd could not attach the process to its
            // cgroup (its v1 hierarchies are read-only), seen rarely under parallel load.
            // Not what this test is about: try again.
            Err(UnitError::Start { cause, .. }) if cause.contains("exit status 219") => continue,
            Err(e) => return Err(e.into()),
        };
        ran += 1;
        let report = tokio::time::timeout(Duration::from_secs(20), unit.wait()).await??;
        assert_eq!(
            (report.reason, report.code),
            (ExitReason::Exited, Some(1)),
            "{report:?}"
        );
        unit.stop().await?;
    }
    assert!(ran >= 5, "only {ran} of 8 starts got past systemd's setup");
    assert_eq!(units_of(&container, "wfalse")?, Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn a_failed_start_is_reported_and_leaves_nothing() -> TestResult {
    if should_skip("a_failed_start_is_reported_and_leaves_nothing") {
        return Ok(());
    }
    let (container, manager) = setup("wfail").await?;
    let spec = spec("wfail", &["/nonexistent/command"], [None, None, None])?;
    let name = spec.name.to_string();
    match manager.start(spec).await {
        Err(UnitError::Start { unit, cause }) => {
            assert_eq!(unit, name);
            assert!(cause.contains("failed") && cause.contains("203"), "{cause}");
        }
        Err(e) => return Err(format!("wrong error: {e}").into()),
        Ok(_) => return Err("a missing executable started".into()),
    }
    assert_eq!(units_of(&container, "wfail")?, Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn cleanup_orphans_removes_units_a_dead_daemon_left() -> TestResult {
    if should_skip("cleanup_orphans_removes_units_a_dead_daemon_left") {
        return Ok(());
    }
    let container = SystemdContainer::boot()?;
    // A daemon that dies leaves its units behind: start two and forget them (no stop, no
    // Drop), then drop its manager.
    let dead =
        SystemdManager::connect_stream("worph", container.connect_private()?, Transport::Private)
            .await?;
    let running = dead
        .start(spec("worph", &["/bin/sleep", "1000"], [None, None, None])?)
        .await?;
    let failed = dead
        .start(spec("worph", &["/bin/false"], [None, None, None])?)
        .await?;
    let (running, failed) = (abandon(running), abandon(failed));
    drop(dead);
    // Matches the pattern worph-*.service but does not have the shape of our names: a unit
    // someone else made, left alone.
    let foreign = "worph-foreign.service";
    let unit_file = format!("/run/systemd/system/{foreign}");
    container.exec(&["mkdir", "-p", "/run/systemd/system"])?;
    container.exec(&[
        "sh",
        "-c",
        &format!("printf '[Service]\\nExecStart=/bin/sleep 1000\\n' > {unit_file}"),
    ])?;
    container.systemctl(&["daemon-reload"])?;
    container.systemctl(&["start", foreign])?;
    for _ in 0..100 {
        if container.unit_property(&failed, "ActiveState")? == "failed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(container.unit_property(&failed, "ActiveState")?, "failed");
    let mut expected = vec![running.clone(), failed.clone(), foreign.to_string()];
    expected.sort();
    assert_eq!(units_of(&container, "worph")?, expected);

    let manager =
        SystemdManager::connect_stream("worph", container.connect_private()?, Transport::Private)
            .await?;
    let mut cleaned = manager.cleanup_orphans().await?;
    cleaned.sort();
    let mut ours = vec![running, failed];
    ours.sort();
    assert_eq!(cleaned, ours);
    assert_eq!(units_of(&container, "worph")?, vec![foreign.to_string()]);
    // A second cleanup finds nothing.
    assert_eq!(manager.cleanup_orphans().await?, Vec::<String>::new());
    container.systemctl(&["stop", foreign])?;
    Ok(())
}

/// The name of `unit`, which is then forgotten: neither stopped nor dropped, as a daemon
/// that died would leave it.
fn abandon(unit: impl RunningUnit) -> String {
    let name = unit.name().to_string();
    std::mem::forget(unit);
    name
}

#[tokio::test]
async fn dropped_unit_is_stopped_in_the_background() -> TestResult {
    if should_skip("dropped_unit_is_stopped_in_the_background") {
        return Ok(());
    }
    let (container, manager) = setup("wdrop").await?;
    let unit = manager
        .start(spec("wdrop", &["/bin/sleep", "1000"], [None, None, None])?)
        .await?;
    drop(unit);
    for _ in 0..250 {
        if units_of(&container, "wdrop")?.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("still there: {:?}", units_of(&container, "wdrop")?).into())
}

#[tokio::test]
async fn over_the_system_bus_units_are_referenced_and_released() -> TestResult {
    if should_skip("over_the_system_bus_units_are_referenced_and_released") {
        return Ok(());
    }
    let container = SystemdContainer::boot()?;
    let started = container.systemctl(&["start", "dbus.socket"])?;
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let bus = container.connect_unix("/run/dbus/system_bus_socket")?;
    let manager = SystemdManager::connect_stream("wbus", bus, Transport::SystemBus).await?;
    let (read, write) = rustix::pipe::pipe()?;
    let spec = spec(
        "wbus",
        &["/bin/sh", "-c", "echo bus; exit 3"],
        [None, Some(write), None],
    )?;
    let mut unit = manager.start(spec).await?;
    let name = unit.name().to_string();
    let report = tokio::time::timeout(Duration::from_secs(20), unit.wait()).await??;
    assert_eq!(
        (report.reason, report.code),
        (ExitReason::Exited, Some(3)),
        "{report:?}"
    );
    let mut out = String::new();
    File::from(read).read_to_string(&mut out)?;
    assert_eq!(out, "bus\n");
    // Ended, but kept loaded by this client's reference (AddRef), not by RemainAfterExit.
    assert_eq!(container.unit_property(&name, "ActiveState")?, "failed");
    assert_eq!(
        container.unit_property(&name, "CollectMode")?,
        "inactive-or-failed"
    );
    assert_eq!(container.unit_property(&name, "RemainAfterExit")?, "no");
    assert!(
        container.unit_property(&name, "Refs")?.starts_with(':'),
        "referenced by a bus client"
    );
    unit.stop().await?;
    assert_eq!(units_of(&container, "wbus")?, Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn host_paths_are_visible_inside() -> TestResult {
    if should_skip("host_paths_are_visible_inside") {
        return Ok(());
    }
    let container = SystemdContainer::boot()?;
    // This very test binary (as target/debug/wardend would be), at the same path.
    let exe = std::env::current_exe()?;
    let exe = exe.to_str().ok_or("test binary path is not UTF-8")?;
    assert!(
        container.exec(&["test", "-x", exe])?.status.success(),
        "{exe} not visible inside"
    );
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let manifest = crate_dir.join("Cargo.toml");
    let inside = container.exec(&["cat", manifest.to_str().ok_or("not UTF-8")?])?;
    assert_eq!(inside.stdout, std::fs::read(&manifest)?);
    // Writes inside land in the overlay, never on the host.
    let marker = PathBuf::from(format!(
        "/srv/written-inside-the-container-{}",
        std::process::id()
    ));
    let marker = marker.to_str().ok_or("not UTF-8")?;
    assert!(container.exec(&["touch", marker])?.status.success());
    assert!(container.exec(&["test", "-e", marker])?.status.success());
    assert!(
        !std::path::Path::new(marker).exists(),
        "a write inside reached the host"
    );
    Ok(())
}

#[tokio::test]
async fn nothing_listening_is_unreachable() -> TestResult {
    // No systemd needed for the first half: a socket file nobody listens on.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("private");
    drop(std::os::unix::net::UnixListener::bind(&path)?);
    match SystemdManager::connect_at("wnone", &path, Transport::Private).await {
        Err(UnitError::Unreachable(cause)) => {
            assert!(cause.contains(&path.display().to_string()), "{cause}")
        }
        Err(e) => return Err(format!("wrong error: {e}").into()),
        Ok(_) => return Err("connected to nothing".into()),
    }
    match SystemdManager::connect_at("wnone", &dir.path().join("missing"), Transport::SystemBus)
        .await
    {
        Err(UnitError::Unreachable(_)) => {}
        Err(e) => return Err(format!("wrong error: {e}").into()),
        Ok(_) => return Err("connected to nothing".into()),
    }

    // Then a systemd that goes away under a connected manager.
    if should_skip("nothing_listening_is_unreachable (systemd half)") {
        return Ok(());
    }
    let (container, manager) = setup("wnone").await?;
    assert_eq!(manager.cleanup_orphans().await?, Vec::<String>::new());
    drop(container);
    match manager.cleanup_orphans().await {
        Err(UnitError::Unreachable(_)) => Ok(()),
        Err(e) => Err(format!("wrong error: {e}").into()),
        Ok(units) => Err(format!("cleanup without systemd: {units:?}").into()),
    }
}
