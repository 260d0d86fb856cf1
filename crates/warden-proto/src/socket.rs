//! Where a daemon listens by default (docs/PROTOCOL.md, Transport): one socket per account,
//! `/run/warden/<account>.sock`, so that daemons for several accounts run side by side and
//! each client finds its own.

use std::path::{Path, PathBuf};

/// The directory of the default sockets.
pub const DEFAULT_SOCKET_DIR: &str = "/run/warden";

/// The default socket of the daemon serving `account`.
pub fn default_socket(account: &str) -> PathBuf {
    Path::new(DEFAULT_SOCKET_DIR).join(format!("{account}.sock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_socket_per_account() {
        assert_eq!(
            default_socket("alice"),
            PathBuf::from("/run/warden/alice.sock")
        );
    }
}
