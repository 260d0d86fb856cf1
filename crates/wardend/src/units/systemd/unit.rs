//! A running transient service: waiting for its end, signalling it, stopping and releasing
//! it, and reading its exit report from its properties.

use std::collections::HashMap;
use std::time::Duration;

use warden_proto::{ExitReason, ExitReport};
use zbus::{Connection, OwnedVariant};

use super::bus::{self, SERVICE_IFACE, UNIT_IFACE};
use super::properties::Retention;
use crate::units::cleanup::Cleanups;
use crate::units::{RunningUnit, UnitError, UnitName};

/// `si_code` of a child that exited.
const CLD_EXITED: i32 = 1;
/// `si_code` of a child killed by a signal.
const CLD_KILLED: i32 = 2;
/// `si_code` of a child killed by a signal that dumped core.
const CLD_DUMPED: i32 = 3;

/// How long a stopped unit may take to disappear once released.
const GONE_TIMEOUT: Duration = Duration::from_secs(5);

/// A transient service started by this manager.
pub struct SystemdUnit {
    /// The unit's name.
    pub(super) name: UnitName,
    /// Its object path.
    pub(super) path: String,
    /// The connection that started it (and, on the system bus, holds its reference).
    pub(super) conn: Connection,
    /// How it stays loaded once ended.
    pub(super) retention: Retention,
    /// Whether stop() finished: the reference is released and the unit gone.
    pub(super) released: bool,
    /// The wall-time limit it was started with (RuntimeMaxUSec), if any.
    pub(super) timeout: Option<Duration>,
    /// Where its stop runs if it is dropped without `stop`.
    pub(super) cleanups: Cleanups,
}

impl SystemdUnit {
    /// A `Control` error for `op` on this unit.
    fn control(&self, op: &'static str, cause: impl std::fmt::Display) -> UnitError {
        UnitError::Control {
            op,
            unit: self.name.to_string(),
            cause: cause.to_string(),
        }
    }

    /// Whether the unit's main process has ended: the unit is inactive or failed or, when it
    /// remains after exit, `active (exited)`.
    async fn has_ended(&self) -> zbus::Result<bool> {
        let props = bus::properties_of(&self.conn, &self.path).await?;
        let state = String::try_from(props.get(UNIT_IFACE, "ActiveState").await?)?;
        if is_ended(&state) {
            return Ok(true);
        }
        if self.retention == Retention::RemainAfterExit && state == "active" {
            return Ok(String::try_from(props.get(UNIT_IFACE, "SubState").await?)? == "exited");
        }
        Ok(false)
    }

    /// The path to `Unref()` on release, when this connection holds a reference.
    fn unref_path(&self) -> Option<&str> {
        (self.retention == Retention::AddRef).then_some(self.path.as_str())
    }
}

impl RunningUnit for SystemdUnit {
    fn name(&self) -> &UnitName {
        &self.name
    }

    /// Cancel-safe: all state lives in this call (a fresh signal stream, then a re-read).
    async fn wait(&mut self) -> Result<ExitReport, UnitError> {
        if self.released {
            return Err(self.control("wait", "the unit was stopped and released"));
        }
        // Subscribe before reading the state, so that no change falls between the two.
        let mut changes = bus::properties_changed_stream(&self.conn, &self.path)
            .await
            .map_err(|e| self.control("wait", e))?;
        loop {
            if self
                .has_ended()
                .await
                .map_err(|e| self.control("wait", e))?
            {
                break;
            }
            // Any change of the unit's properties: read the state again.
            match bus::next_message(&mut changes).await {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(self.control("wait", e)),
                None => return Err(self.control("wait", bus::closed())),
            }
        }
        let props = bus::properties_of(&self.conn, &self.path)
            .await
            .map_err(|e| self.control("wait", e))?;
        let service = props
            .get_all(SERVICE_IFACE)
            .await
            .map_err(|e| self.control("wait", e))?;
        Ok(exit_report(&service, self.timeout))
    }

    async fn signal(&self, signal: i32) -> Result<(), UnitError> {
        let manager = bus::ManagerProxy::new(&self.conn)
            .await
            .map_err(|e| self.control("signal", e))?;
        manager
            .kill_unit(self.name.as_str(), "main", signal)
            .await
            .map_err(|e| self.control("signal", e))
    }

    async fn stop(&mut self) -> Result<(), UnitError> {
        if self.released {
            return Ok(());
        }
        stop_and_release(&self.conn, self.name.as_str(), self.unref_path())
            .await
            .map_err(|e| self.control("stop", e))?;
        self.released = true;
        Ok(())
    }
}

impl Drop for SystemdUnit {
    /// A unit dropped without stop() is stopped by a task the manager's cleanups track
    /// (shutdown waits for it) when a runtime is there to run it; otherwise it is left to
    /// the next orphan cleanup.
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let (conn, name) = (self.conn.clone(), self.name.to_string());
        let path = self.unref_path().map(str::to_string);
        self.cleanups.spawn(async move {
            if let Err(e) = stop_and_release(&conn, &name, path.as_deref()).await {
                tracing::warn!(unit = %name, error = %e, "stopping a dropped unit");
            }
        });
    }
}

/// Whether an ActiveState means the unit has ended.
pub(super) fn is_ended(state: &str) -> bool {
    state == "inactive" || state == "failed"
}

/// Stop `name` if it is still active (running, or remaining after exit), wait until it is
/// inactive, release this connection's reference (when `unref_path` is given: the unit was
/// started with `AddRef=yes` on this connection), forget a failure, and wait until systemd
/// has collected it. A unit that is already gone is a success.
pub(super) async fn stop_and_release(
    conn: &Connection,
    name: &str,
    unref_path: Option<&str>,
) -> zbus::Result<()> {
    let manager = bus::ManagerProxy::new(conn).await?;
    // Both streams before the calls whose signals they catch.
    let mut jobs = bus::job_removed_stream(conn).await?;
    let mut removed = bus::unit_removed_stream(conn).await?;

    let Some(state) = loaded_state(&manager, name).await? else {
        return Ok(());
    };
    if !is_ended(&state) {
        match manager.stop_unit(name, "replace").await {
            Ok(job) => {
                // Whatever the job's result, the unit is inactive or failed when it is removed.
                bus::job_result(&mut jobs, job.as_str()).await?;
            }
            Err(e) if bus::is_no_such_unit(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    if let Some(path) = unref_path {
        match bus::unit_at(conn, path).await?.unref().await {
            Ok(()) => {}
            // Not referenced (any more), or gone: nothing to release.
            Err(e) => tracing::debug!(unit = name, error = %e, "unref"),
        }
    }
    reset_if_failed(&manager, name).await?;
    if wait_gone(&manager, &mut removed, name).await.is_ok() {
        return Ok(());
    }
    // Still running after its stop job (seen under heavy load): kill every process in it
    // and give it one more period before reporting failure.
    tracing::warn!(
        unit = name,
        "unit still active after stop; sending SIGKILL to all of it"
    );
    match manager.kill_unit(name, "all", libc::SIGKILL).await {
        Ok(()) => {}
        Err(e) if bus::is_no_such_unit(&e) => return Ok(()),
        Err(e) => return Err(e),
    }
    // Killed, it ends as failed, which CollectMode=inactive does not collect: wait for the
    // end, forget the failure, then wait for the collection.
    let deadline = tokio::time::Instant::now() + GONE_TIMEOUT;
    while let Some(state) = loaded_state(&manager, name).await? {
        if is_ended(&state) || tokio::time::Instant::now() >= deadline {
            break;
        }
        let _ =
            tokio::time::timeout(Duration::from_millis(50), bus::next_message(&mut removed)).await;
    }
    reset_if_failed(&manager, name).await?;
    wait_gone(&manager, &mut removed, name).await
}

/// Forget a unit's failure so that systemd collects it.
async fn reset_if_failed(manager: &bus::ManagerProxy<'_>, name: &str) -> zbus::Result<()> {
    if loaded_state(manager, name).await?.as_deref() == Some("failed") {
        match manager.reset_failed_unit(name).await {
            Ok(()) => {}
            Err(e) if bus::is_no_such_unit(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The ActiveState of `name` if it is loaded (listing does not load it, unlike a property
/// read on its object path).
pub(super) async fn loaded_state(
    manager: &bus::ManagerProxy<'_>,
    name: &str,
) -> zbus::Result<Option<String>> {
    let units = manager.list_units_by_patterns(&[], &[name]).await?;
    Ok(units.into_iter().find(|u| u.0 == name).map(|u| u.3))
}

/// Wait until `name` is no longer loaded: on each `UnitRemoved`, and every 100 ms in case
/// the signal was for a previous incarnation, list it again.
async fn wait_gone(
    manager: &bus::ManagerProxy<'_>,
    removed: &mut zbus::MessageStream,
    name: &str,
) -> zbus::Result<()> {
    let deadline = tokio::time::Instant::now() + GONE_TIMEOUT;
    loop {
        let Some(state) = loaded_state(manager, name).await? else {
            return Ok(());
        };
        if tokio::time::Instant::now() >= deadline {
            // Stopped but not yet collected (a loaded systemd may take its time): nothing
            // of it runs, which is what matters; a later orphan cleanup collects it.
            if is_ended(&state) {
                tracing::warn!(
                    unit = name,
                    state,
                    "stopped unit not collected after {GONE_TIMEOUT:?}"
                );
                return Ok(());
            }
            return Err(zbus::Error::Failure(format!(
                "still {state} {GONE_TIMEOUT:?} after stop"
            )));
        }
        // A timeout here only means: list again.
        let _ = tokio::time::timeout(Duration::from_millis(100), bus::next_message(removed)).await;
    }
}

/// Whether the unit's main process was started (forked), from its `Service` properties.
pub(super) fn main_process_ran(service: &HashMap<String, OwnedVariant>) -> bool {
    service
        .get("ExecMainPID")
        .and_then(|v| u32::try_from(v).ok())
        .is_some_and(|pid| pid != 0)
}

/// systemd's exit statuses for a failure while it set up the command (200 CHDIR, 203 EXEC,
/// 217 USER, 226 NAMESPACE, ...): the command itself never ran.
const SETUP_FAILURES: std::ops::RangeInclusive<i32> = 200..=243;

/// Why the command never ran, when the `Service` properties say systemd failed to set it up
/// (e.g. `exit status 203 (systemd could not set up the command; see EXIT_EXEC...)`).
pub(super) fn setup_failure(service: &HashMap<String, OwnedVariant>) -> Option<String> {
    let int = |key: &str| service.get(key).and_then(|v| i32::try_from(v).ok());
    let result = service
        .get("Result")
        .and_then(|v| <&str>::try_from(v).ok())
        .unwrap_or("unknown");
    match (int("ExecMainCode"), int("ExecMainStatus")) {
        (Some(CLD_EXITED), Some(status)) if SETUP_FAILURES.contains(&status) => Some(format!(
            "systemd could not set up the command: exit status {status} (unit result: {result})"
        )),
        _ => None,
    }
}

/// How early before its wall-time limit a unit may end and still have been ended by it
/// (systemd counts from the unit's activation, the timestamps from the main process's).
const TIMEOUT_SLACK_USEC: u64 = 200_000;

/// The exit report from the `org.freedesktop.systemd1.Service` properties of an ended unit
/// started with wall-time limit `timeout`. The wall time comes from the main process's start
/// and exit timestamps.
///
/// systemd's `Result=timeout` also means that killing what was left of the unit after its
/// main process ended took longer than the stop grace period (a child that ignores
/// SIGTERM): that is not the command's time limit, and the command's own exit is reported.
pub(super) fn exit_report(
    service: &HashMap<String, OwnedVariant>,
    timeout: Option<Duration>,
) -> ExitReport {
    let int = |key: &str| service.get(key).and_then(|v| i32::try_from(v).ok());
    let uint = |key: &str| service.get(key).and_then(|v| u64::try_from(v).ok());
    let result = service
        .get("Result")
        .and_then(|v| <&str>::try_from(v).ok())
        .unwrap_or("");

    let (code, signal) = match (int("ExecMainCode"), int("ExecMainStatus")) {
        (Some(CLD_EXITED), status) => (status, None),
        (Some(CLD_KILLED | CLD_DUMPED), status) => (None, status),
        _ => (None, None),
    };
    // systemd reports "not known" as u64::MAX.
    let known = |v: Option<u64>| v.filter(|&v| v != u64::MAX);
    let wall_usec = match (
        uint("ExecMainStartTimestampMonotonic"),
        uint("ExecMainExitTimestampMonotonic"),
    ) {
        (Some(start), Some(exit)) => exit.saturating_sub(start),
        _ => 0,
    };
    let limit_reached = timeout.is_some_and(|t| {
        let limit = u64::try_from(t.as_micros()).unwrap_or(u64::MAX);
        wall_usec.saturating_add(TIMEOUT_SLACK_USEC) >= limit
    });
    let reason = match result {
        "timeout" if limit_reached => ExitReason::Timeout,
        "oom-kill" => ExitReason::Oom,
        _ if signal.is_some() => ExitReason::Signal,
        _ => ExitReason::Exited,
    };
    ExitReport {
        reason,
        code,
        signal,
        cpu_usec: known(uint("CPUUsageNSec")).map(|ns| ns / 1000),
        peak_memory_bytes: known(uint("MemoryPeak")),
        wall_usec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, OwnedVariant)]) -> HashMap<String, OwnedVariant> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn exit_code_and_cpu_time() {
        let r = exit_report(
            &props(&[
                ("ExecMainCode", OwnedVariant::from(1i32)),
                ("ExecMainStatus", OwnedVariant::from(7i32)),
                ("Result", OwnedVariant::from(zbus::Str::from("exit-code"))),
                ("CPUUsageNSec", OwnedVariant::from(2_500_000u64)),
                (
                    "ExecMainStartTimestampMonotonic",
                    OwnedVariant::from(1_000u64),
                ),
                (
                    "ExecMainExitTimestampMonotonic",
                    OwnedVariant::from(4_000u64),
                ),
            ]),
            None,
        );
        assert_eq!(r.reason, ExitReason::Exited);
        assert_eq!((r.code, r.signal), (Some(7), None));
        assert_eq!(r.cpu_usec, Some(2_500));
        assert_eq!(r.peak_memory_bytes, None);
        assert_eq!(r.wall_usec, 3_000);
    }

    #[test]
    fn an_early_exit_is_not_a_setup_failure() {
        let early = props(&[
            ("ExecMainPID", OwnedVariant::from(42u32)),
            ("ExecMainCode", OwnedVariant::from(1i32)),
            ("ExecMainStatus", OwnedVariant::from(1i32)),
        ]);
        assert!(main_process_ran(&early));
        assert_eq!(setup_failure(&early), None);
        let exec_failed = props(&[
            ("ExecMainPID", OwnedVariant::from(42u32)),
            ("ExecMainCode", OwnedVariant::from(1i32)),
            ("ExecMainStatus", OwnedVariant::from(203i32)),
            ("Result", OwnedVariant::from(zbus::Str::from("exit-code"))),
        ]);
        assert!(setup_failure(&exec_failed).is_some_and(|why| why.contains("203")));
        assert!(!main_process_ran(&props(&[(
            "ExecMainPID",
            OwnedVariant::from(0u32)
        )])));
    }

    #[test]
    fn signal_timeout_and_oom() {
        let killed = |result: &str, limit: Option<u64>| {
            exit_report(
                &props(&[
                    ("ExecMainCode", OwnedVariant::from(2i32)),
                    ("ExecMainStatus", OwnedVariant::from(9i32)),
                    (
                        "Result",
                        OwnedVariant::from(zbus::Str::from(result.to_string())),
                    ),
                    ("CPUUsageNSec", OwnedVariant::from(u64::MAX)),
                    ("MemoryPeak", OwnedVariant::from(4096u64)),
                    ("ExecMainStartTimestampMonotonic", OwnedVariant::from(0u64)),
                    (
                        "ExecMainExitTimestampMonotonic",
                        OwnedVariant::from(1_000_000u64),
                    ),
                ]),
                limit.map(Duration::from_millis),
            )
        };
        let r = killed("signal", None);
        assert_eq!(
            (r.reason, r.code, r.signal),
            (ExitReason::Signal, None, Some(9))
        );
        assert_eq!(r.cpu_usec, None);
        assert_eq!(r.peak_memory_bytes, Some(4096));
        assert_eq!(killed("timeout", Some(1000)).reason, ExitReason::Timeout);
        assert_eq!(killed("oom-kill", None).reason, ExitReason::Oom);
        // Result=timeout without a limit, or long before it: the stop of leftovers timed
        // out, not the command.
        assert_eq!(killed("timeout", None).reason, ExitReason::Signal);
        assert_eq!(killed("timeout", Some(60_000)).reason, ExitReason::Signal);
    }

    #[test]
    fn a_leftover_killed_after_the_command_exited_is_not_a_timeout() {
        let r = exit_report(
            &props(&[
                ("ExecMainCode", OwnedVariant::from(1i32)),
                ("ExecMainStatus", OwnedVariant::from(0i32)),
                ("Result", OwnedVariant::from(zbus::Str::from("timeout"))),
                ("ExecMainStartTimestampMonotonic", OwnedVariant::from(0u64)),
                (
                    "ExecMainExitTimestampMonotonic",
                    OwnedVariant::from(5_000u64),
                ),
            ]),
            None,
        );
        assert_eq!((r.reason, r.code), (ExitReason::Exited, Some(0)));
    }
}
