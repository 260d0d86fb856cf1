//! Talking to wardend: connect, hello, start a unit with the caller's cwd and stdio, forward
//! signals to it, and wait for its end.
//!
//! The flow of one `run` (protocol v1):
//! 1. connect to the socket and send `hello`; expect `welcome` (an `error` means refused);
//! 2. start catching SIGINT/SIGTERM/SIGHUP/SIGQUIT (if asked to forward them);
//! 3. send `start` with the cwd (`O_PATH` directory fd) and fds 0, 1, 2 attached, in that
//!    order, leaving out any of 0, 1, 2 that is closed;
//! 4. expect `started`, then wait for `exited` or `error`, sending each caught signal as
//!    `signal`. A signal caught before `started` is held and sent once the unit runs; a second
//!    one before `started` gives up (the daemon stops a unit whose client disconnects).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use tokio::net::UnixStream;
use warden_proto::{
    Conn, ConnError, ErrorCode, ExitReport, FdRole, Overrides, PtySize, Request, Response,
    StartRequest, PROTOCOL_VERSION,
};

use crate::exit::{error_exit_code, EXIT_WARDEN_FAILED, SIGNAL_BASE};
use crate::signals::{self, Forwarder};

/// The socket of a daemon configured before sockets were per account.
pub const DEFAULT_SOCKET: &str = "/run/warden/warden.sock";
/// The environment variable that names the socket.
pub const SOCKET_ENV: &str = "WARDEN_SOCKET";

/// What the client says in `hello`.
pub fn client_name() -> String {
    format!("warden {}", env!("CARGO_PKG_VERSION"))
}

/// Why a run failed before an `exited` arrived.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be connected.
    #[error("cannot connect to {}: {source}", path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The daemon answered with an error frame; `message` is shown verbatim.
    #[error("{message}")]
    Daemon {
        /// Stable code (decides the exit status).
        code: ErrorCode,
        /// The daemon's message.
        message: String,
    },
    /// The connection failed or carried a bad frame.
    #[error("connection to wardend: {0}")]
    Conn(#[from] ConnError),
    /// The daemon closed the connection too early.
    #[error("wardend closed the connection {0}")]
    Closed(&'static str),
    /// The daemon sent a message that does not fit the protocol at this point.
    #[error("unexpected message from wardend {phase}: {message}")]
    Unexpected {
        /// What the client was waiting for.
        phase: &'static str,
        /// The message, for the log.
        message: String,
    },
    /// The working directory could not be opened.
    #[error("cannot open the working directory: {0}")]
    Cwd(io::Error),
    /// The signal handlers could not be installed.
    #[error("cannot catch signals: {0}")]
    Signals(io::Error),
    /// Signals arrived before the unit started; the client gave up.
    #[error("interrupted by signal {0} before the unit started")]
    Interrupted(i32),
    /// The request cannot be made by this client.
    #[error("{0}")]
    Unsupported(String),
}

impl ClientError {
    /// The exit status `warden run` uses for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            ClientError::Daemon { code, .. } => error_exit_code(*code),
            ClientError::Interrupted(signal) => SIGNAL_BASE + signal,
            _ => EXIT_WARDEN_FAILED,
        }
    }

    /// Whether the daemon was only busy, before anything started: refused at admission (its
    /// pool of connections not yet authenticated was full; a refused account reads the
    /// same and is retried the same, which costs it the retry budget and tells it
    /// nothing), every session slot taken, or its listen queue full. Trying again later
    /// may succeed.
    pub fn is_busy(&self) -> bool {
        match self {
            ClientError::Daemon { code, .. } => {
                matches!(code, ErrorCode::Admission | ErrorCode::SessionLimit)
            }
            ClientError::Connect { source, .. } => source.raw_os_error() == Some(libc::EAGAIN),
            _ => false,
        }
    }

    /// The line to print on stderr: the daemon's message verbatim (one line, nothing before
    /// it), or `warden: <what failed>` for failures of the client itself.
    pub fn user_message(&self) -> String {
        match self {
            ClientError::Daemon { message, .. } => {
                message.trim_end_matches(['\n', '\r']).replace('\n', " ")
            }
            other => format!("warden: {other}"),
        }
    }
}

/// What the daemon said in `welcome`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    /// The protocol version the daemon speaks.
    pub version: u32,
    /// Its backend: `systemd` or `native`.
    pub backend: String,
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// The command and its arguments.
    pub argv: Vec<String>,
    /// The environment sent to the command.
    pub env: Vec<(String, String)>,
    /// Names the user set explicitly ([`RunOptions::set_env`]): the daemon refuses the
    /// request rather than drop one of them.
    pub explicit_env: Vec<String>,
    /// The profile, or the daemon's default.
    pub profile: Option<String>,
    /// Tightenings of the profile.
    pub overrides: Overrides,
    /// A pty of this size (not supported by protocol v1: refused before connecting).
    pub pty: Option<PtySize>,
    /// Catch SIGINT/SIGTERM/SIGHUP/SIGQUIT and forward them to the unit.
    pub forward_signals: bool,
    /// How long a busy daemon (refused at admission or for the session limit, listen queue
    /// full) is retried
    /// ([`crate::retry`]); zero: not at all.
    pub retry: Duration,
    /// Say on stderr when retrying a busy daemon.
    pub verbose: bool,
}

impl RunOptions {
    /// Run `argv` with the caller's environment, the default profile and signal forwarding.
    pub fn new(socket: impl Into<PathBuf>, argv: Vec<String>) -> Self {
        Self {
            socket: socket.into(),
            argv,
            env: current_env(),
            explicit_env: Vec::new(),
            profile: None,
            overrides: Overrides::default(),
            pty: None,
            forward_signals: true,
            retry: crate::retry::budget_from_env(),
            verbose: false,
        }
    }

    /// Set `name=value` in the environment sent, replacing an earlier value; the name is
    /// sent as explicit (a daemon refuses, rather than drops, a secret set this way).
    pub fn set_env(&mut self, name: &str, value: &str) {
        self.env.retain(|(k, _)| k != name);
        self.env.push((name.to_owned(), value.to_owned()));
        if !self.explicit_env.iter().any(|k| k == name) {
            self.explicit_env.push(name.to_owned());
        }
    }
}

/// The socket to use: `flag` if given, else `$WARDEN_SOCKET` if set and not empty, else
/// this account's daemon's, `/run/warden/<account>.sock` — or `/run/warden/warden.sock`
/// when only that one exists (a daemon configured with the old default).
pub fn socket_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| {
        std::env::var_os(SOCKET_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(default_socket)
}

/// This account's default socket (see [`socket_path`]).
fn default_socket() -> PathBuf {
    let shared = PathBuf::from(DEFAULT_SOCKET);
    let Some(own) = own_account_name().map(|n| warden_proto::socket::default_socket(&n)) else {
        return shared;
    };
    if !own.exists() && shared.exists() {
        return shared;
    }
    own
}

/// The name of the account this process runs as, from the user database.
fn own_account_name() -> Option<String> {
    let uid = nix::unistd::Uid::effective();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
}

/// The process's environment as UTF-8 pairs. Variables whose name or value is not UTF-8
/// cannot be carried by protocol v1 (JSON strings) and are left out.
pub fn current_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// How a unit ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The unit's name, when it started.
    pub unit: Option<String>,
    /// The daemon's report.
    pub report: ExitReport,
}

/// A connection to wardend that has been welcomed.
#[derive(Debug)]
pub struct Client {
    conn: Conn,
    welcome: Welcome,
}

impl Client {
    /// Connect to `socket` and say hello.
    pub async fn connect(socket: &Path) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|source| ClientError::Connect {
                path: socket.to_owned(),
                source,
            })?;
        let mut conn = Conn::new(stream);
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            client: client_name(),
        };
        if let Err(e) = conn.send(&hello, &[]).await {
            return Err(pending_error(&mut conn, e).await);
        }
        match conn.recv::<Response>().await? {
            Some((Response::Welcome { version, backend }, _)) => Ok(Self {
                conn,
                welcome: Welcome { version, backend },
            }),
            Some((Response::Error { code, message }, _)) => {
                Err(ClientError::Daemon { code, message })
            }
            Some((other, _)) => Err(ClientError::Unexpected {
                phase: "instead of welcome",
                message: format!("{other:?}"),
            }),
            None => Err(ClientError::Closed("before answering hello")),
        }
    }

    /// What the daemon said in `welcome`.
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// Start `opts.argv` in the current directory with fds 0, 1, 2 and wait for its end.
    pub async fn run(mut self, opts: &RunOptions) -> Result<Outcome, ClientError> {
        if opts.pty.is_some() {
            return Err(pty_unsupported());
        }
        let mut forwarder = if opts.forward_signals {
            Some(Forwarder::install().map_err(ClientError::Signals)?)
        } else {
            None
        };
        let (roles, cwd, stdio) = start_fds()?;
        let start = Request::Start(StartRequest {
            argv: opts.argv.clone(),
            env: opts.env.clone(),
            explicit_env: opts.explicit_env.clone(),
            profile: opts.profile.clone(),
            overrides: opts.overrides.clone(),
            fds: roles,
            pty: opts.pty,
        });
        let mut fds: Vec<BorrowedFd<'_>> = vec![cwd.as_fd()];
        fds.extend(stdio);
        let sent = self.conn.send(&start, &fds).await;
        drop(fds);
        drop(cwd);
        if let Err(e) = sent {
            return Err(pending_error(&mut self.conn, e).await);
        }

        let mut unit: Option<String> = None;
        let mut held: Option<i32> = None;
        loop {
            tokio::select! {
                biased;
                msg = self.conn.recv::<Response>() => match msg? {
                    Some((Response::Started { unit: name }, _)) if unit.is_none() => {
                        unit = Some(name);
                        if let Some(signal) = held.take() {
                            // A failed send means the daemon is gone: the next recv says so.
                            let _ = self.conn.send(&Request::Signal { signal }, &[]).await;
                        }
                    }
                    Some((Response::Exited(report), _)) => return Ok(Outcome { unit, report }),
                    Some((Response::Error { code, message }, _)) => {
                        return Err(ClientError::Daemon { code, message })
                    }
                    Some((other, _)) => {
                        return Err(ClientError::Unexpected {
                            phase: if unit.is_some() { "while the unit runs" } else { "instead of started" },
                            message: format!("{other:?}"),
                        })
                    }
                    None => {
                        return Err(ClientError::Closed(if unit.is_some() {
                            "before the unit ended"
                        } else {
                            "before the unit started"
                        }))
                    }
                },
                signal = signals::next(&mut forwarder) => {
                    if unit.is_some() {
                        let _ = self.conn.send(&Request::Signal { signal }, &[]).await;
                    } else if held.is_some() {
                        return Err(ClientError::Interrupted(signal));
                    } else {
                        held = Some(signal);
                    }
                }
            }
        }
    }
}

/// The refusal of `--pty` by this client.
pub fn pty_unsupported() -> ClientError {
    ClientError::Unsupported("--pty is not supported by protocol v1 daemons yet".to_owned())
}

/// After a failed send, the daemon may already have written why it closed: prefer its error
/// frame over the send error.
async fn pending_error(conn: &mut Conn, send_error: ConnError) -> ClientError {
    match conn.recv::<Response>().await {
        Ok(Some((Response::Error { code, message }, _))) => ClientError::Daemon { code, message },
        _ => ClientError::Conn(send_error),
    }
}

/// The descriptors of a `start` frame: the cwd (owned), then whichever of 0, 1, 2 are open.
fn start_fds() -> Result<(Vec<FdRole>, OwnedFd, Vec<BorrowedFd<'static>>), ClientError> {
    // Check stdio before opening anything: a closed 0, 1 or 2 would be reused by the open.
    let stdio: [(FdRole, BorrowedFd<'static>); 3] = [
        (FdRole::Stdin, rustix::stdio::stdin()),
        (FdRole::Stdout, rustix::stdio::stdout()),
        (FdRole::Stderr, rustix::stdio::stderr()),
    ];
    let (roles, open): (Vec<FdRole>, Vec<BorrowedFd<'static>>) = stdio
        .into_iter()
        .filter(|(_, fd)| rustix::io::fcntl_getfd(fd).is_ok())
        .unzip();
    let cwd = rustix::fs::open(
        ".",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ClientError::Cwd(e.into()))?;
    let mut all = vec![FdRole::Cwd];
    all.extend(roles);
    Ok((all, cwd, open))
}

/// Connect, hello, run `opts.argv`, wait for its end.
pub async fn run(opts: &RunOptions) -> Result<Outcome, ClientError> {
    if opts.pty.is_some() {
        return Err(pty_unsupported());
    }
    let mut retry = Retry::new(opts.retry, opts.verbose);
    loop {
        let attempt = match Client::connect(&opts.socket).await {
            Ok(client) => client.run(opts).await,
            Err(e) => Err(e),
        };
        match attempt {
            // Refused before the unit started: nothing ran, so trying again is safe.
            Err(e) if e.is_busy() => retry.wait_or(e).await?,
            other => return other,
        }
    }
}

/// Retrying a busy daemon within a budget.
struct Retry {
    backoff: crate::retry::Backoff,
    budget: Duration,
    verbose: bool,
    said: bool,
}

impl Retry {
    fn new(budget: Duration, verbose: bool) -> Self {
        Self {
            backoff: crate::retry::Backoff::new(budget),
            budget,
            verbose,
            said: false,
        }
    }

    /// Wait before the next attempt, or give `refusal` back when the budget is spent.
    async fn wait_or(&mut self, refusal: ClientError) -> Result<(), ClientError> {
        let Some(wait) = self.backoff.next_wait() else {
            return Err(refusal);
        };
        if self.verbose && !self.said {
            self.said = true;
            eprintln!(
                "warden: wardend is busy ({}); retrying for up to {:?}",
                refusal.user_message(),
                self.budget
            );
        }
        tokio::time::sleep(wait).await;
        Ok(())
    }
}
