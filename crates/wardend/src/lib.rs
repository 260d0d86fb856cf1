//! wardend: the root daemon that runs an unprivileged agent's commands as isolated,
//! bounded, disposable units. Modules follow the path of a connection:
//! [`listener`] → [`admission`] → [`handshake`] → [`session`] → [`policy`] → [`units`].
//! [`server`] holds them together; [`config`] and [`account`] are read once at start-up;
//! [`instance`] keeps a second daemon off the same socket and unit prefix.
//! [`kernel`] names the lowest kernel wardend starts on; [`fd_limit`] raises its own
//! descriptor limit.
//! [`mountinfo`] is the host's mount table, read by policy and the native backend.
//! [`shim`] is the exec shim every systemd unit starts through (`wardend exec-shim`).

pub mod account;
pub mod admission;
pub mod blocking;
pub mod config;
pub mod failpoint;
pub mod fd_limit;
pub mod handshake;
pub mod instance;
pub mod kernel;
pub mod listener;
pub mod mountinfo;
pub mod policy;
pub mod server;
pub mod session;
pub mod shim;
pub mod units;
