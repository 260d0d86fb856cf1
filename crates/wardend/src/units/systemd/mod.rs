//! The systemd backend: each unit is a transient `.service` in `<prefix>.slice`, started over
//! D-Bus — the system bus when it runs, else systemd's private socket (peer-to-peer).
//!
//! - [`bus`]: the proxies of the few systemd1 methods used, connection, signal streams.
//! - [`private`]: systemd's private socket as a zbus socket (SASL, sender rewriting).
//! - [`properties`]: a [`UnitSpec`] as transient-unit properties.
//! - [`unit`]: the running unit (wait, signal, stop) and its exit report.
//! - [`lifeline`]: the service every unit is bound to, which ends when wardend does.

mod bus;
pub mod lifeline;
mod private;
mod properties;
mod unit;

use std::path::Path;

use zbus::Connection;

use properties::Retention;

use crate::shim::spec::{Spec, SpecFile};
use crate::shim::ExecShim;

use super::cleanup::Cleanups;
use super::{name, UnitError, UnitManager, UnitSpec};

pub use bus::Transport;
pub use unit::SystemdUnit;

/// How long a start job may take (a unit with `Type=exec` is started once its command has
/// been executed).
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether PID 1 is systemd (its runtime directory exists).
pub fn pid1_is_systemd() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Connection to systemd, for one unit prefix.
pub struct SystemdManager {
    /// The connection; every unit started holds a clone (on the system bus, systemd ties the
    /// units' `AddRef` references to it).
    conn: Connection,
    /// The unit prefix.
    prefix: String,
    /// `<prefix>.slice`.
    slice: String,
    /// How ended units stay loaded until released: depends on the connection.
    retention: Retention,
    /// The exec shim every command starts through; `None`: the command is started directly
    /// (only a manager built without [`SystemdManager::with_exec_shim`], as in tests).
    shim: Option<ExecShim>,
    /// The service every unit is bound to, which stops when wardend is gone; `None` only
    /// for a manager built without [`SystemdManager::with_lifeline`] (tests).
    lifeline: Option<lifeline::Lifeline>,
    /// Stops of units dropped without `stop`.
    cleanups: Cleanups,
}

impl SystemdManager {
    /// Connect to systemd: the system bus when its socket exists and answers, else systemd's
    /// private socket.
    pub async fn connect(prefix: &str) -> Result<Self, UnitError> {
        let system_bus = Path::new(bus::SYSTEM_BUS_SOCKET);
        if system_bus.exists() {
            match Self::connect_at(prefix, system_bus, Transport::SystemBus).await {
                Ok(manager) => return Ok(manager),
                Err(e) => {
                    tracing::info!(error = %e, "no system bus, trying systemd's private socket")
                }
            }
        }
        Self::connect_at(prefix, Path::new(bus::PRIVATE_SOCKET), Transport::Private).await
    }

    /// Connect to systemd through the socket at `socket` (e.g.
    /// `/proc/<pid>/root/run/systemd/private` of a container's systemd).
    pub async fn connect_at(
        prefix: &str,
        socket: &Path,
        transport: Transport,
    ) -> Result<Self, UnitError> {
        let unreachable = |e: &dyn std::fmt::Display| {
            UnitError::Unreachable(format!(
                "connecting to systemd at {}: {e}",
                socket.display()
            ))
        };
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| unreachable(&e))?;
        let conn = bus::connect_stream(stream, transport)
            .await
            .map_err(|e| unreachable(&e))?;
        Ok(Self::new(conn, prefix, transport))
    }

    /// Use `stream`, already connected to `transport`'s socket. systemd accepts a private
    /// connection only from a root process in its own PID namespace, so a caller outside it
    /// (a test on the host of a container) connects from a helper inside and passes the
    /// stream.
    pub async fn connect_stream(
        prefix: &str,
        stream: std::os::unix::net::UnixStream,
        transport: Transport,
    ) -> Result<Self, UnitError> {
        let unreachable = |e: &dyn std::fmt::Display| {
            UnitError::Unreachable(format!("connecting to systemd over a passed socket: {e}"))
        };
        stream.set_nonblocking(true).map_err(|e| unreachable(&e))?;
        let stream = tokio::net::UnixStream::from_std(stream).map_err(|e| unreachable(&e))?;
        let conn = bus::connect_stream(stream, transport)
            .await
            .map_err(|e| unreachable(&e))?;
        Ok(Self::new(conn, prefix, transport))
    }

    /// A manager over `conn`. On the bus, units are kept by `AddRef`; systemd refuses that on
    /// its private socket, so there they remain after exit instead.
    fn new(conn: Connection, prefix: &str, transport: Transport) -> Self {
        let retention = match transport {
            Transport::SystemBus => Retention::AddRef,
            Transport::Private => Retention::RemainAfterExit,
        };
        Self {
            conn,
            prefix: prefix.to_string(),
            slice: name::slice_of(prefix),
            retention,
            shim: None,
            lifeline: None,
            cleanups: Cleanups::default(),
        }
    }

    /// Start the lifeline (with the exec shim's executable) and bind every unit to it: units
    /// then stop when wardend does, `kill -9` included. What the daemon always does.
    pub async fn with_lifeline(mut self) -> Result<Self, UnitError> {
        let exe = match &self.shim {
            Some(shim) => shim.path.clone(),
            None => std::fs::read_link("/proc/self/exe").map_err(|e| UnitError::Io {
                step: "reading",
                path: "/proc/self/exe".into(),
                source: e,
            })?,
        };
        let exe = exe.to_str().ok_or_else(|| {
            UnitError::Unsupported(format!("wardend's path {} is not UTF-8", exe.display()))
        })?;
        self.lifeline = Some(lifeline::Lifeline::start(&self.conn, &self.prefix, exe).await?);
        Ok(self)
    }

    /// Start every command through `shim` (wardend's own executable in a Landlock domain):
    /// what the daemon always does.
    pub fn with_exec_shim(mut self, shim: ExecShim) -> Self {
        self.shim = Some(shim);
        self
    }

    /// The unit path to `Unref()` on release: only units this connection holds a reference to.
    fn unref_path<'p>(&self, path: &'p str) -> Option<&'p str> {
        (self.retention == Retention::AddRef).then_some(path)
    }

    /// Stop and release a unit whose start failed, so that no error leaves it behind.
    async fn release_failed(&self, unit: &str, path: &str) {
        if let Err(e) = unit::stop_and_release(&self.conn, unit, self.unref_path(path)).await {
            tracing::warn!(unit, error = %e, "releasing a unit that failed to start");
        }
    }

    /// A `Start` error for `unit`.
    fn start_error(unit: &str, cause: impl std::fmt::Display) -> UnitError {
        UnitError::Start {
            unit: unit.to_string(),
            cause: cause.to_string(),
        }
    }

    /// The `Service` properties of the unit at `path`, if they can be read.
    async fn service_properties(
        &self,
        path: &str,
    ) -> Option<std::collections::HashMap<String, zbus::OwnedVariant>> {
        let props = bus::properties_of(&self.conn, path).await.ok()?;
        props.get_all(bus::SERVICE_IFACE).await.ok()
    }
}

/// What the exec shim needs to run `spec`'s command.
fn shim_spec(spec: &UnitSpec, shim: &ExecShim) -> Result<Spec, String> {
    let st = rustix::fs::fstat(std::os::fd::AsFd::as_fd(&spec.cwd))
        .map_err(|e| format!("reading the working directory: {e}"))?;
    Ok(Spec {
        argv: spec.argv.clone(),
        env: spec.env.clone(),
        path: spec.path.clone(),
        cwd: spec.cwd_path.clone(),
        cwd_id: (st.st_dev, st.st_ino),
        uid: spec.uid,
        gid: spec.gid,
        groups: spec.groups.clone(),
        network: spec.network,
        landlock: shim.abi > 0,
        scopes: shim.scopes,
    })
}

impl UnitManager for SystemdManager {
    type Unit = SystemdUnit;

    fn backend(&self) -> &'static str {
        "systemd"
    }

    async fn start(&self, spec: UnitSpec) -> Result<SystemdUnit, UnitError> {
        let name = spec.name.clone();
        let unit = name.as_str();
        let timeout = spec.limits.timeout;
        // PrivateTmp gives every unit its own /tmp and /var/tmp, and systemd 252 cannot bind a
        // directory from the host's into it (the mount point does not exist there): say so
        // rather than fail with status 200/CHDIR.
        if let Some(p) = std::iter::once(&spec.cwd_path)
            .chain(&spec.fs.writable)
            .find(|p| p.starts_with("/tmp") || p.starts_with("/var/tmp"))
        {
            return Err(Self::start_error(
                unit,
                format!(
                    "{} is under /tmp or /var/tmp, which are private in every unit on the \
                     systemd backend: run from (or make writable) a directory elsewhere",
                    p.display()
                ),
            ));
        }
        // The command for the shim, in a root-only file systemd loads as the unit's
        // credential; removed when this function returns (the unit has its copy by then).
        let spec_file = match &self.shim {
            Some(shim) => Some(
                SpecFile::write(
                    unit,
                    &shim_spec(&spec, shim).map_err(|e| Self::start_error(unit, e))?,
                )
                .map_err(|e| Self::start_error(unit, format!("writing its spec: {e}")))?,
            ),
            None => None,
        };
        let exec = match (&self.shim, &spec_file) {
            (Some(shim), Some(file)) => properties::Exec::Shim(shim, file.path()),
            _ => properties::Exec::Direct,
        };
        let props = properties::transient_properties(
            &spec,
            &self.slice,
            self.retention,
            exec,
            self.lifeline.as_ref().map(lifeline::Lifeline::unit),
        )
        .map_err(|e| Self::start_error(unit, e))?;
        let manager = bus::ManagerProxy::new(&self.conn)
            .await
            .map_err(|e| Self::start_error(unit, e))?;
        // Subscribe to JobRemoved before the job exists: it may end before the call returns.
        let mut jobs = bus::job_removed_stream(&self.conn)
            .await
            .map_err(|e| Self::start_error(unit, e))?;
        let path = bus::unit_path(unit);
        let job = match manager
            .start_transient_unit(unit, "fail", &props, &[])
            .await
        {
            Ok(job) => job,
            Err(e) => {
                // The reply may be what failed: systemd may hold the unit anyway.
                self.release_failed(unit, &path).await;
                return Err(Self::start_error(unit, format!("StartTransientUnit: {e}")));
            }
        };
        // systemd holds its own copies of the stdio descriptors now: close ours, so that the
        // client sees end-of-file when the unit's last process closes them.
        drop(props);
        drop(spec);
        let waited = if crate::failpoint::hit("systemd-start-job") {
            Ok(Err(bus::closed()))
        } else {
            tokio::time::timeout(START_TIMEOUT, bus::job_result(&mut jobs, job.as_str())).await
        };
        let result = match waited {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => {
                // The unit exists and may be running: it goes before the error does.
                self.release_failed(unit, &path).await;
                return Err(Self::start_error(
                    unit,
                    format!("waiting for the start job: {e}"),
                ));
            }
            Err(_) => format!("not finished after {START_TIMEOUT:?}"),
        };
        if result != "done" {
            // A command that ran and ended at once can fail the start job (systemd saw it
            // exit before it saw the exec succeed): that is an exit to report, not a failure
            // to start. The unit stays loaded (retention), so wait() reads it.
            let service = self.service_properties(&path).await.unwrap_or_default();
            match unit::setup_failure(&service) {
                None if unit::main_process_ran(&service) => {}
                failure => {
                    self.release_failed(unit, &path).await;
                    let why = failure.unwrap_or_else(|| "the command did not run".into());
                    return Err(Self::start_error(
                        unit,
                        format!("start job {result}: {why}"),
                    ));
                }
            }
        }
        Ok(SystemdUnit {
            name,
            path,
            conn: self.conn.clone(),
            retention: self.retention,
            released: false,
            timeout,
            cleanups: self.cleanups.clone(),
        })
    }

    async fn cleanup_orphans(&self) -> Result<Vec<String>, UnitError> {
        let unreachable = |e: zbus::Error| UnitError::Unreachable(e.to_string());
        let manager = bus::ManagerProxy::new(&self.conn)
            .await
            .map_err(unreachable)?;
        let pattern = format!("{}-*.service", self.prefix);
        let units = manager
            .list_units_by_patterns(&[], &[pattern.as_str()])
            .await
            .map_err(unreachable)?;
        let mut cleaned = Vec::new();
        for (unit, ..) in units {
            if !name::is_unit_of(&self.prefix, &unit) {
                continue;
            }
            // Not ours to release (the connection that took the reference is gone).
            unit::stop_and_release(&self.conn, &unit, None)
                .await
                .map_err(|e| match e {
                    // systemd went away under us.
                    zbus::Error::InputOutput(_) => UnitError::Unreachable(e.to_string()),
                    e => UnitError::Control {
                        op: "clean up",
                        unit: unit.clone(),
                        cause: e.to_string(),
                    },
                })?;
            cleaned.push(unit);
        }
        Ok(cleaned)
    }

    async fn main_pid_of(&self, pid: u32) -> Option<u32> {
        let manager = bus::ManagerProxy::new(&self.conn).await.ok()?;
        let path = manager.get_unit_by_pid(pid).await.ok()?;
        let props = bus::properties_of(&self.conn, path.as_str()).await.ok()?;
        let main_pid = u32::try_from(props.get(bus::SERVICE_IFACE, "MainPID").await.ok()?).ok()?;
        (main_pid != 0).then_some(main_pid)
    }

    fn cleanups(&self) -> &Cleanups {
        &self.cleanups
    }
}
