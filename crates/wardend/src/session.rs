//! A session (C11, C12): one authenticated connection runs one unit. It reads the start
//! request and its descriptors, clears the deadline, names the unit, has policy build the
//! spec, starts the unit, then relays signal/stop requests until the unit ends, the client
//! asks to stop or goes away, or the daemon shuts down. Whatever ends it, the unit is
//! stopped exactly once ([`UnitGuard`]) and the client is told how it ended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use warden_proto::{Conn, ErrorCode, ExitReason, ExitReport, Request, Response};

use crate::account::Account;
use crate::blocking::{BlockingError, BlockingPool};
use crate::policy::{self, Settings};
use crate::units::{RunningUnit, UnitError, UnitManager, UnitName};

/// How long the daemon waits to tell a client something before giving up on it.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);
/// What a client reads when resolving its unit's paths outlasted the deadline.
pub const VIEW_TIMED_OUT: &str =
    "handshake timed out: resolving the unit's paths took too long (is a mount under the \
     working directory or the home stalled?)";
/// What a client whose unit the daemon's shutdown stopped reads (code `internal`, exit 125).
pub const SHUTTING_DOWN: &str = "wardend is shutting down";
/// How long, after stopping a unit, to wait for its exit status.
const STATUS_AFTER_STOP: Duration = Duration::from_secs(1);

/// Why a session ended (for the log; the client reads an `exited` or `error` frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The unit's command ended by itself.
    UnitEnded,
    /// C12.
    ClientRequestedStop,
    /// The connection closed.
    ClientDisconnected,
    /// The daemon is shutting down.
    Shutdown,
    /// The session failed before or while running the unit.
    Failed(String),
}

impl std::fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionEnd::UnitEnded => f.write_str("unit ended"),
            SessionEnd::ClientRequestedStop => f.write_str("client requested stop"),
            SessionEnd::ClientDisconnected => f.write_str("client disconnected"),
            SessionEnd::Shutdown => f.write_str("daemon shutting down"),
            SessionEnd::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

/// What every session needs from the server.
pub struct SessionContext<M: UnitManager> {
    /// The unit manager.
    pub manager: Arc<M>,
    /// The client account.
    pub account: Arc<Account>,
    /// Daemon-wide policy settings.
    pub settings: Arc<Settings>,
    /// Where work on client-chosen paths runs (policy's view resolution).
    pub blocking: BlockingPool,
    /// Unit name prefix.
    pub prefix: String,
    /// Cancelled when the daemon shuts down.
    pub shutdown: CancellationToken,
}

/// Stops its unit exactly once: explicitly with [`UnitGuard::stop`], or on drop — the unit
/// handle's own drop then stops and removes it on a task the manager tracks, so a handler
/// torn down mid-way leaves no unit behind and shutdown waits for that removal.
pub struct UnitGuard<U: RunningUnit> {
    unit: Option<U>,
}

impl<U: RunningUnit> UnitGuard<U> {
    fn new(unit: U) -> Self {
        Self { unit: Some(unit) }
    }

    fn unit(&mut self) -> Option<&mut U> {
        self.unit.as_mut()
    }

    /// Stop the unit (first call only) and return the handle for a last status read.
    async fn stop(&mut self) -> Option<U> {
        let mut unit = self.unit.take()?;
        if let Err(e) = unit.stop().await {
            tracing::error!(unit = %unit.name(), error = %e, "stopping unit failed");
        }
        Some(unit)
    }
}

/// Send a frame, bounded in time; a client that does not read is not waited for.
async fn send(conn: &Conn, msg: &Response) {
    match tokio::time::timeout(SEND_TIMEOUT, conn.send(msg, &[])).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "sending to client failed"),
        Err(_) => tracing::debug!("sending to client timed out"),
    }
}

/// Run one session on an authenticated connection. `deadline` is the handshake deadline,
/// which still applies to the start request.
pub async fn run<M: UnitManager>(
    conn: &mut Conn,
    deadline: tokio::time::Instant,
    ctx: &SessionContext<M>,
) -> SessionEnd {
    let received = tokio::select! {
        r = tokio::time::timeout_at(deadline, conn.recv::<Request>()) => r,
        _ = ctx.shutdown.cancelled() => return SessionEnd::Shutdown,
    };
    let (start, fds) = match received {
        Err(_) => {
            send(
                conn,
                &Response::error(ErrorCode::Timeout, "handshake timed out"),
            )
            .await;
            return SessionEnd::Failed("handshake timed out".into());
        }
        Ok(Ok(None)) => return SessionEnd::ClientDisconnected,
        Ok(Err(e)) => return fail(conn, ErrorCode::Protocol, format!("protocol error: {e}")).await,
        Ok(Ok(Some((Request::Start(start), fds)))) => (start, fds),
        Ok(Ok(Some(_))) => {
            return fail(
                conn,
                ErrorCode::Protocol,
                "protocol error: expected start".into(),
            )
            .await
        }
    };
    let name = match UnitName::random(&ctx.prefix) {
        Ok(n) => n,
        Err(e) => return fail(conn, ErrorCode::Internal, format!("naming unit: {e}")).await,
    };
    let argv0 = start.argv.first().cloned().unwrap_or_default();
    // The client's stdio stays here: a job stuck on a stalled mount must not hold it open.
    let (cwd, stdio) = match policy::assign_fds(&start.fds, fds) {
        Ok(d) => d,
        Err(e) => {
            let why = e.to_string();
            send(conn, &e.response()).await;
            return SessionEnd::Failed(why);
        }
    };
    // Policy stats and reads client-chosen paths: off the runtime, within the deadline.
    let job = {
        let (name, account, settings) = (
            name.clone(),
            Arc::clone(&ctx.account),
            Arc::clone(&ctx.settings),
        );
        move || policy::build(name, start, cwd, &account, &settings)
    };
    let built = tokio::select! {
        r = ctx.blocking.run(deadline, job) => r,
        _ = ctx.shutdown.cancelled() => return SessionEnd::Shutdown,
    };
    let mut spec = match built {
        Ok(Ok(spec)) => spec,
        Ok(Err(e)) => {
            let why = e.to_string();
            send(conn, &e.response()).await;
            return SessionEnd::Failed(why);
        }
        Err(BlockingError::Timeout) => {
            tracing::warn!(unit = %name, "resolving the unit's paths outlasted the deadline");
            return fail(conn, ErrorCode::Timeout, VIEW_TIMED_OUT.into()).await;
        }
        Err(e) => return fail(conn, ErrorCode::Internal, format!("policy: {e}")).await,
    };
    spec.stdio = stdio;
    // From here on no deadline applies: the unit may run as long as its policy allows.
    let started_at = Instant::now();
    let unit = match ctx.manager.start(spec).await {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(target: "audit", unit = %name, error = %e, "unit failed to start");
            let code = match e {
                UnitError::NotFound(_) => ErrorCode::NotFound,
                UnitError::NotExecutable { .. } => ErrorCode::NotExecutable,
                _ => ErrorCode::Internal,
            };
            return fail(conn, code, e.to_string()).await;
        }
    };
    tracing::info!(target: "audit", unit = %name, command = %argv0, uid = ctx.account.uid, "unit started");
    let mut guard = UnitGuard::new(unit);
    if crate::failpoint::hit("session-drop-unit") {
        // As if the handler were torn down as the daemon stops: the unit goes with the guard,
        // and its removal races the daemon's exit.
        ctx.shutdown.cancelled().await;
        drop(guard);
        return SessionEnd::Failed("failpoint session-drop-unit".into());
    }
    send(
        conn,
        &Response::Started {
            unit: name.to_string(),
        },
    )
    .await;

    let (end, exit) = relay(conn, &mut guard, ctx).await;
    // The daemon ended the unit, not the command or the client: say so instead of a report.
    let shut_down = matches!(end, SessionEnd::Shutdown) && exit.is_none();
    let unit = guard.stop().await;
    let mut report = match (exit, unit) {
        (Some(report), _) => report,
        (None, Some(mut unit)) => {
            let status = tokio::time::timeout(STATUS_AFTER_STOP, unit.wait()).await;
            let mut r = status
                .ok()
                .and_then(Result::ok)
                .unwrap_or_else(stopped_report);
            r.reason = ExitReason::Stopped;
            r
        }
        (None, None) => stopped_report(),
    };
    report.wall_usec = u64::try_from(started_at.elapsed().as_micros()).unwrap_or(u64::MAX);
    tracing::info!(
        target: "audit",
        unit = %name,
        reason = ?report.reason,
        code = ?report.code,
        signal = ?report.signal,
        wall_usec = report.wall_usec,
        session_end = %end,
        "unit ended"
    );
    if shut_down {
        send(conn, &Response::error(ErrorCode::Internal, SHUTTING_DOWN)).await;
    } else {
        send(conn, &Response::Exited(report)).await;
    }
    end
}

/// Relay client requests to the unit until something ends the session. Returns why, and
/// the unit's report if it ended by itself.
async fn relay<M: UnitManager>(
    conn: &mut Conn,
    guard: &mut UnitGuard<M::Unit>,
    ctx: &SessionContext<M>,
) -> (SessionEnd, Option<ExitReport>) {
    loop {
        let Some(unit) = guard.unit() else {
            return (SessionEnd::Failed("unit handle lost".into()), None);
        };
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return (SessionEnd::Shutdown, None),
            exit = unit.wait() => {
                return match exit {
                    Ok(report) => (SessionEnd::UnitEnded, Some(report)),
                    Err(e) => (SessionEnd::Failed(e.to_string()), None),
                };
            }
            msg = conn.recv::<Request>() => match msg {
                Ok(Some((Request::Signal { signal }, _))) => {
                    if let Err(e) = unit.signal(signal).await {
                        tracing::warn!(unit = %unit.name(), signal, error = %e, "signal failed");
                    }
                }
                Ok(Some((Request::Stop, _))) => return (SessionEnd::ClientRequestedStop, None),
                Ok(None) => return (SessionEnd::ClientDisconnected, None),
                Ok(Some(_)) => {
                    send(conn, &Response::error(ErrorCode::Protocol, "protocol error: unexpected message during a session")).await;
                    return (SessionEnd::Failed("unexpected message".into()), None);
                }
                Err(e) => {
                    send(conn, &Response::error(ErrorCode::Protocol, format!("protocol error: {e}"))).await;
                    return (SessionEnd::Failed(e.to_string()), None);
                }
            },
        }
    }
}

fn stopped_report() -> ExitReport {
    ExitReport {
        reason: ExitReason::Stopped,
        code: None,
        signal: None,
        cpu_usec: None,
        peak_memory_bytes: None,
        wall_usec: 0,
    }
}

async fn fail(conn: &Conn, code: ErrorCode, message: String) -> SessionEnd {
    send(conn, &Response::error(code, message.clone())).await;
    SessionEnd::Failed(message)
}
