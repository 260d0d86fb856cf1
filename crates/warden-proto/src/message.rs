//! The messages of protocol v1: what a client may send ([`Request`]) and what the daemon
//! answers ([`Response`]). Each message is one frame (see [`crate::frame`]); a message that
//! carries file descriptors says how many in [`Request::fd_count`].

use serde::{Deserialize, Serialize};

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// Most file descriptors a single frame may carry.
pub const MAX_FDS_PER_FRAME: usize = 8;

/// What a file descriptor attached to a `start` frame is for, in the order they are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FdRole {
    /// The working directory of the command (a directory fd, `O_PATH` is fine). Required.
    Cwd,
    /// The command's standard input.
    Stdin,
    /// The command's standard output.
    Stdout,
    /// The command's standard error.
    Stderr,
}

/// Network access a request may ask for (never more than its profile allows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// No network at all.
    None,
    /// A private network namespace with only loopback up.
    Loopback,
    /// The host's network.
    Host,
}

/// Tightenings a request may apply to its profile. Every field is optional; a value looser
/// than the profile's is refused by the daemon with the field named.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overrides {
    /// Network access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// Memory limit in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<u64>,
    /// Most tasks (processes and threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_max: Option<u64>,
    /// Wall-time limit in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// Terminal size for a pty request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// The request to start a unit. The frame that carries it carries `fds.len()` file
/// descriptors, in that order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// The command and its arguments; `argv[0]` is resolved against `PATH` from `env`.
    pub argv: Vec<String>,
    /// Environment for the command, as `(name, value)` pairs.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Names in `env` the user set explicitly (`warden run --env`). Policy silently drops
    /// a secret from the inherited environment, but refuses a request whose explicit
    /// variable it would drop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explicit_env: Vec<String>,
    /// The profile to use; the daemon's `default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Tightenings of the profile.
    #[serde(default)]
    pub overrides: Overrides,
    /// The roles of the attached file descriptors, in order. Must contain `cwd` once.
    pub fds: Vec<FdRole>,
    /// Ask for a pty of this size (not yet supported by protocol v1 daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
}

/// A message from the client to the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// First message of every connection.
    Hello {
        /// Protocol version the client speaks.
        version: u32,
        /// Free-form client name and version, for the log.
        #[serde(default)]
        client: String,
    },
    /// Start a unit (once per connection, after `welcome`).
    Start(StartRequest),
    /// Deliver a signal to the unit's main process.
    Signal {
        /// Signal number (Linux numbering).
        signal: i32,
    },
    /// Stop the unit (its whole process tree).
    Stop,
}

impl Request {
    /// How many file descriptors the frame carrying this message must carry.
    pub fn fd_count(&self) -> usize {
        match self {
            Request::Start(start) => start.fds.len(),
            _ => 0,
        }
    }
}

/// Why a unit ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitReason {
    /// The command exited by itself (see `code`).
    Exited,
    /// A signal ended it (see `signal`).
    Signal,
    /// The wall-time limit ended it.
    Timeout,
    /// The memory limit ended it.
    Oom,
    /// It was stopped: the client asked, disconnected, or the daemon shut down.
    Stopped,
    /// It could not be started.
    FailedToStart,
}

/// The end of a unit, as the daemon reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExitReport {
    /// Why it ended.
    pub reason: ExitReason,
    /// Exit code of the main process, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// Signal that ended the main process, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// CPU time used by the whole unit, in microseconds, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_usec: Option<u64>,
    /// Peak memory of the whole unit, in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// Wall time from start to end, in microseconds.
    pub wall_usec: u64,
}

/// Stable error codes: a client maps them to its exit status; the message is for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Refused at admission (credentials, rate or slot limits).
    Admission,
    /// No session slot free.
    SessionLimit,
    /// The peer broke the protocol (malformed, oversized, out of order, missing fds).
    Protocol,
    /// The request is not allowed (a nested request from inside a unit, policy refusal).
    Refused,
    /// The command was not found.
    NotFound,
    /// The command was found but cannot be executed.
    NotExecutable,
    /// The daemon failed to start or manage the unit.
    Internal,
    /// The handshake did not complete in time.
    Timeout,
}

/// A message from the daemon to the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// Answer to `hello`.
    Welcome {
        /// Protocol version the daemon speaks.
        version: u32,
        /// Which backend runs units: `systemd` or `native`.
        backend: String,
    },
    /// The unit runs.
    Started {
        /// Its name, e.g. `warden-0123456789abcdef.service`.
        unit: String,
    },
    /// The unit ended; the last message of a session.
    Exited(ExitReport),
    /// Something went wrong; the daemon closes the connection after it.
    Error {
        /// Stable code.
        code: ErrorCode,
        /// Human-readable message (contract strings are verbatim here).
        message: String,
    },
}

impl Response {
    /// Shorthand for an error frame.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Response::Error {
            code,
            message: message.into(),
        }
    }
}

/// Messages know how many descriptors their frame carries; responses carry none.
pub trait DeclaresFds {
    /// Number of file descriptors attached to this message's frame.
    fn fd_count(&self) -> usize;
}

impl DeclaresFds for Request {
    fn fd_count(&self) -> usize {
        Request::fd_count(self)
    }
}

impl DeclaresFds for Response {
    fn fd_count(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_round_trips_and_counts_fds() {
        let req = Request::Start(StartRequest {
            argv: vec!["true".into()],
            env: vec![("PATH".into(), "/bin".into())],
            explicit_env: vec![],
            profile: None,
            overrides: Overrides::default(),
            fds: vec![FdRole::Cwd, FdRole::Stdin],
            pty: None,
        });
        let text = serde_json::to_string(&req).unwrap_or_default();
        assert!(text.contains(r#""type":"start""#), "{text}");
        let back: Request = serde_json::from_str(&text).unwrap_or(Request::Stop);
        assert_eq!(back, req);
        assert_eq!(back.fd_count(), 2);
    }

    #[test]
    fn unknown_fields_are_refused() {
        let r: Result<Request, _> = serde_json::from_str(r#"{"type":"signal","signal":1,"x":1}"#);
        assert!(r.is_err());
        let r: Result<Request, _> = serde_json::from_str(r#"{"type":"launch"}"#);
        assert!(r.is_err());
    }
}
