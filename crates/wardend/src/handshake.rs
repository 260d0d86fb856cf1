//! The handshake (C9): `hello` → `welcome`, under the handshake deadline. This is where a
//! peer is authenticated beyond its credentials: the protocol version must match, and a
//! peer that runs inside one of this daemon's units is refused, so that a sandboxed command
//! can never ask for another unit.

use warden_proto::{Conn, ErrorCode, Request, Response, PROTOCOL_VERSION};

use crate::admission::peer::Peer;
use crate::units::name::{is_unit_of, slice_of};

/// The handshake failed; the message is what the peer reads.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The peer closed before saying hello.
    #[error("connection closed before hello")]
    Closed,
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The first message was not hello.
    #[error("protocol error: expected hello")]
    NotHello,
    /// Another protocol version.
    #[error("unsupported protocol version {0} (this daemon speaks {PROTOCOL_VERSION})")]
    Version(u32),
    /// The peer is a process inside one of our units.
    #[error("refused: requests from inside a warden unit are not allowed")]
    Nested,
    /// The peer went away while being authenticated.
    #[error("peer exited during authentication")]
    PeerGone,
}

impl HandshakeError {
    /// The error frame for this failure.
    pub fn response(&self) -> Response {
        let code = match self {
            HandshakeError::Nested => ErrorCode::Refused,
            _ => ErrorCode::Protocol,
        };
        Response::error(code, self.to_string())
    }
}

/// Read `hello`, authenticate, answer `welcome`.
pub async fn run(
    conn: &mut Conn,
    peer: &Peer,
    prefix: &str,
    backend: &str,
) -> Result<(), HandshakeError> {
    let hello = conn
        .recv::<Request>()
        .await
        .map_err(|e| HandshakeError::Protocol(e.to_string()))?;
    match hello {
        None => return Err(HandshakeError::Closed),
        Some((Request::Hello { version, .. }, _)) if version != PROTOCOL_VERSION => {
            return Err(HandshakeError::Version(version))
        }
        Some((Request::Hello { .. }, _)) => {}
        Some(_) => return Err(HandshakeError::NotHello),
    }
    let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", peer.pid))
        .map_err(|_| HandshakeError::PeerGone)?;
    if !peer.alive() {
        return Err(HandshakeError::PeerGone);
    }
    if in_unit(&cgroups, prefix) {
        return Err(HandshakeError::Nested);
    }
    let welcome = Response::Welcome {
        version: PROTOCOL_VERSION,
        backend: backend.to_string(),
    };
    conn.send(&welcome, &[])
        .await
        .map_err(|e| HandshakeError::Protocol(e.to_string()))
}

/// Whether a /proc/PID/cgroup text places the process inside one of `prefix`'s units, on
/// either backend: a path component `<prefix>.slice` followed by a unit name.
pub fn in_unit(proc_cgroup: &str, prefix: &str) -> bool {
    let slice = slice_of(prefix);
    proc_cgroup.lines().any(|line| {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        let parts: Vec<&str> = path.split('/').collect();
        parts
            .windows(2)
            .any(|w| w[0] == slice && is_unit_of(prefix, w[1]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_cgroups_are_recognised_on_both_backends() {
        let systemd = "0::/warden.slice/warden-0123456789abcdef.service\n";
        let native_v1 =
            "12:pids:/warden.slice/warden-0123456789abcdef.service/init\n1:name=systemd:/\n";
        let host = "0::/user.slice/user-1000.slice/session-2.scope\n";
        let lookalike = "0::/warden.slice/other.service\n";
        assert!(in_unit(systemd, "warden"));
        assert!(in_unit(native_v1, "warden"));
        assert!(!in_unit(host, "warden"));
        assert!(!in_unit(lookalike, "warden"));
        assert!(!in_unit(systemd, "other"));
    }
}
