//! The server (C1–C10): it holds the unit manager, the listener, the session and
//! unauthenticated slot pools, the live connections, a one-entry fatal-error channel, the
//! client account and the admission state, and a tracker of handlers (the wait group).
//!
//! [`Server::serve`] checks it runs as root, cleans orphans, listens, then accepts until
//! shutdown or a fatal error; either way it closes every live connection and waits for all
//! handlers before it returns.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use warden_proto::{Conn, ErrorCode, Response};

use crate::account::Account;
use crate::blocking::BlockingPool;

use crate::admission::origin::{Lookup, Origins, LOOKUP_TIMEOUT};
use crate::admission::{Admission, Admitted, ADMISSION_REFUSED};
use crate::config::Config;
use crate::handshake::{self, HandshakeError};
use crate::listener::{ListenError, Listener};
use crate::policy::Settings;
use crate::session::{self, SessionContext};
use crate::units::{UnitError, UnitManager};

/// The contract's string for a full session pool (C10).
pub const SESSION_LIMIT: &str = "session limit reached";

/// How long a refused peer is given to read its refusal.
const REFUSAL_SEND_TIMEOUT: Duration = Duration::from_millis(100);

/// Why the server could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// C3.
    #[error("supervisor must run as root")]
    NotRoot,
    /// C4.
    #[error("startup orphan cleanup: {0}")]
    OrphanCleanup(UnitError),
    /// The socket could not be set up.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// accept() failed in a way that will not pass.
    #[error("accepting connections: {0}")]
    Accept(std::io::Error),
}

/// What the handlers share.
struct Shared<M: UnitManager> {
    config: Config,
    sessions: Arc<Semaphore>,
    /// Places in the queue for a session slot (`max_sessions` of them), when
    /// `session_wait` lets clients wait.
    session_queue: Arc<Semaphore>,
    connections: Mutex<HashMap<u64, u32>>,
    next_id: AtomicU64,
    tracker: TaskTracker,
    session: SessionContext<M>,
}

/// The daemon's server.
pub struct Server<M: UnitManager> {
    shared: Arc<Shared<M>>,
    admission: Admission,
    fatal_tx: mpsc::Sender<ServerError>,
    fatal_rx: mpsc::Receiver<ServerError>,
}

impl<M: UnitManager> Server<M> {
    /// Set up the pools for `account` (C2: looked up by name with [`Account::lookup`]).
    pub fn new(config: Config, account: Account, manager: M, shutdown: CancellationToken) -> Self {
        let admission = Admission::new(
            account.uid,
            account.gid,
            config.max_unauthenticated,
            config.origin_window,
            config.origin_max_per_window,
        );
        let socket_dir = config
            .socket
            .parent()
            .map_or_else(|| PathBuf::from("/run/warden"), PathBuf::from);
        let (fatal_tx, fatal_rx) = mpsc::channel(1);
        let shared = Arc::new(Shared {
            sessions: Arc::new(Semaphore::new(config.max_sessions)),
            session_queue: Arc::new(Semaphore::new(config.max_sessions)),
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            tracker: TaskTracker::new(),
            session: SessionContext {
                manager: Arc::new(manager),
                account: Arc::new(account),
                settings: Arc::new(Settings {
                    socket_dir,
                    profiles: config.profiles.clone(),
                }),
                blocking: BlockingPool::default(),
                prefix: config.unit_prefix.clone(),
                shutdown,
            },
            config,
        });
        Self {
            shared,
            admission,
            fatal_tx,
            fatal_rx,
        }
    }

    /// C3, C4, then listen and accept until shutdown (C5).
    pub async fn serve(mut self) -> Result<(), ServerError> {
        if !rustix::process::geteuid().is_root() {
            return Err(ServerError::NotRoot);
        }
        let manager = Arc::clone(&self.shared.session.manager);
        let orphans = manager
            .cleanup_orphans()
            .await
            .map_err(ServerError::OrphanCleanup)?;
        if !orphans.is_empty() {
            tracing::warn!(target: "audit", count = orphans.len(), units = ?orphans, "removed orphaned units");
        }
        let account = &self.shared.session.account;
        let listener = Listener::bind(&self.shared.config.socket, account.uid, account.gid)?;
        tracing::info!(
            socket = %listener.path().display(),
            backend = manager.backend(),
            client = %account.name,
            "wardend listening"
        );
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
        let result = self.accept_loop(&listener).await;
        // C5: close every live connection and wait for every handler.
        self.shared.session.shutdown.cancel();
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
        // Units whose handles were dropped without a stop are still being removed.
        manager.cleanups().drain().await;
        drop(listener);
        tracing::info!("wardend stopped");
        result
    }

    async fn accept_loop(&mut self, listener: &Listener) -> Result<(), ServerError> {
        let shutdown = self.shared.session.shutdown.clone();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                fatal = self.fatal_rx.recv() => {
                    if let Some(e) = fatal {
                        return Err(e);
                    }
                }
                accepted = listener.listener.accept() => match accepted {
                    Ok((stream, _)) => self.admit(stream),
                    Err(e) if is_transient(&e) => {
                        tracing::warn!(error = %e, "accept failed; retrying");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => {
                        let _ = self.fatal_tx.try_send(ServerError::Accept(e));
                    }
                },
            }
        }
    }

    /// C6, C7: admit or refuse, then hand the connection to a tracked handler. Nothing here
    /// waits: an origin the cache does not know yet is looked up by a task of its own.
    fn admit(&mut self, stream: UnixStream) {
        let mut admitted = match self.admission.admit(&stream) {
            Ok(a) => a,
            Err(e) => {
                tracing::info!(reason = %e, "connection refused at admission");
                // The refusal is written from a task so that a peer that does not read
                // cannot slow the accept loop down.
                self.shared
                    .tracker
                    .spawn(refuse(stream, ErrorCode::Admission, ADMISSION_REFUSED));
                return;
            }
        };
        if let Some(lookup) = admitted.lookup.take() {
            self.shared.tracker.spawn(look_up_origin(
                self.admission.origins(),
                lookup,
                Arc::clone(&self.shared.session.manager),
                self.shared.session.shutdown.clone(),
            ));
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut live) = self.shared.connections.lock() {
            live.insert(id, admitted.peer.pid);
        }
        let shared = Arc::clone(&self.shared);
        let span = tracing::info_span!(
            "conn",
            id,
            pid = admitted.peer.pid,
            origin = admitted.origin.pid
        );
        self.shared.tracker.spawn(
            async move {
                let _cleanup = ConnectionCleanup {
                    shared: &shared,
                    id,
                };
                handle(&shared, stream, admitted).await;
            }
            .instrument(span),
        );
    }
}

/// Ask the unit manager for the main PID of `lookup`'s unit, bounded in time, and cache it.
async fn look_up_origin<M: UnitManager>(
    origins: Origins,
    lookup: Lookup,
    manager: Arc<M>,
    shutdown: CancellationToken,
) {
    let answer = tokio::select! {
        r = tokio::time::timeout(LOOKUP_TIMEOUT, manager.main_pid_of(lookup.pid)) => r.ok(),
        _ = shutdown.cancelled() => None,
    };
    match answer {
        Some(main) => origins.put(&lookup, main, std::time::Instant::now()),
        None => origins.abandon(&lookup),
    }
}

/// C8: whatever happens, the connection leaves the live set (slots are permits and go
/// back by themselves; the tracker marks the handler done when its task ends).
struct ConnectionCleanup<'a, M: UnitManager> {
    shared: &'a Shared<M>,
    id: u64,
}

impl<M: UnitManager> Drop for ConnectionCleanup<'_, M> {
    fn drop(&mut self) {
        if let Ok(mut live) = self.shared.connections.lock() {
            live.remove(&self.id);
        }
    }
}

/// One connection, from admission to the end of its session (C9–C11).
async fn handle<M: UnitManager>(shared: &Shared<M>, stream: UnixStream, admitted: Admitted) {
    let Admitted { peer, slot, .. } = admitted;
    set_buffers(&stream, shared.config.socket_buffer_size);
    let mut conn = Conn::new(stream);
    let deadline = tokio::time::Instant::now() + shared.config.handshake_timeout;
    let ctx = &shared.session;
    let hs = tokio::select! {
        r = tokio::time::timeout_at(deadline, handshake::run(&mut conn, &peer, &ctx.prefix, ctx.manager.backend())) => r,
        _ = ctx.shutdown.cancelled() => return,
        // A smaller origin took this half-open connection's place in a full pool.
        _ = slot.evicted().cancelled() => {
            tracing::info!("evicted from a full admission pool");
            send_bounded(&conn, &Response::error(ErrorCode::Admission, ADMISSION_REFUSED)).await;
            return;
        }
    };
    match hs {
        Ok(Ok(())) => {}
        Ok(Err(HandshakeError::Closed)) => return,
        Ok(Err(e)) => {
            tracing::info!(error = %e, "authentication failed");
            send_bounded(&conn, &e.response()).await;
            return;
        }
        Err(_) => {
            tracing::info!("handshake timed out");
            send_bounded(
                &conn,
                &Response::error(ErrorCode::Timeout, "handshake timed out"),
            )
            .await;
            return;
        }
    }
    // C10: authenticated. The peer handle is closed when the handler ends; the
    // unauthenticated slot goes back now; a session slot is taken without waiting, or
    // after a bounded wait when the admin allows one.
    drop(slot);
    let (_session_slot, deadline) = match session_slot(shared).await {
        SlotWait::ShuttingDown => return,
        SlotWait::Slot(slot, waited) => (
            slot,
            if waited {
                tokio::time::Instant::now() + shared.config.handshake_timeout
            } else {
                deadline
            },
        ),
        SlotWait::Full => {
            tracing::info!("session limit reached");
            send_bounded(
                &conn,
                &Response::error(ErrorCode::SessionLimit, SESSION_LIMIT),
            )
            .await;
            return;
        }
    };
    let end = session::run(&mut conn, deadline, ctx).await;
    tracing::info!(end = %end, "session ended");
    drop(peer);
}

/// How the wait for a session slot ended.
enum SlotWait {
    /// A slot, and whether it was waited for (the start request's deadline starts again).
    Slot(OwnedSemaphorePermit, bool),
    /// None free within `session_wait`, or the queue for one was full.
    Full,
    /// The daemon is shutting down.
    ShuttingDown,
}

/// A session slot: at once if one is free; else, when `session_wait` is set and the queue
/// (`max_sessions` places) has room, the first freed within `session_wait`.
async fn session_slot<M: UnitManager>(shared: &Shared<M>) -> SlotWait {
    if let Ok(slot) = Arc::clone(&shared.sessions).try_acquire_owned() {
        return SlotWait::Slot(slot, false);
    }
    let wait = shared.config.session_wait;
    if wait.is_zero() {
        return SlotWait::Full;
    }
    let Ok(_place) = Arc::clone(&shared.session_queue).try_acquire_owned() else {
        return SlotWait::Full;
    };
    tokio::select! {
        r = tokio::time::timeout(wait, Arc::clone(&shared.sessions).acquire_owned()) => match r {
            Ok(Ok(slot)) => SlotWait::Slot(slot, true),
            _ => SlotWait::Full,
        },
        _ = shared.session.shutdown.cancelled() => SlotWait::ShuttingDown,
    }
}

async fn send_bounded(conn: &Conn, msg: &Response) {
    let _ = tokio::time::timeout(REFUSAL_SEND_TIMEOUT, conn.send(msg, &[])).await;
}

async fn refuse(stream: UnixStream, code: ErrorCode, message: &'static str) {
    let conn = Conn::new(stream);
    send_bounded(&conn, &Response::error(code, message)).await;
}

/// C9: the connection's send and receive buffers.
fn set_buffers(stream: &UnixStream, size: usize) {
    use rustix::net::sockopt;
    if let Err(e) = sockopt::set_socket_send_buffer_size(stream, size)
        .and_then(|()| sockopt::set_socket_recv_buffer_size(stream, size))
    {
        tracing::debug!(error = %e, "setting socket buffer sizes failed");
    }
}

/// Errors of accept() that say nothing about the listener itself.
fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::ECONNABORTED
                | libc::EINTR
                | libc::EPROTO
                | libc::EPERM
        )
    )
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
