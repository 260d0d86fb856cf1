//! warden's client library: run a command as an isolated, bounded, disposable unit of
//! `wardend`, with the caller's working directory and stdio, and get its exit report.
//!
//! ```no_run
//! # async fn example() -> Result<(), warden::ClientError> {
//! let opts = warden::RunOptions::new(warden::socket_path(None), vec!["cargo".into(), "test".into()]);
//! let outcome = warden::run(&opts).await?;
//! std::process::exit(warden::exit::report_exit_code(&outcome.report));
//! # }
//! ```
//!
//! - [`client`]: connect, hello, start, signal forwarding, wait;
//! - [`exit`]: exit report (or failure) → exit status;
//! - [`parse`]: sizes and durations of the command line;
//! - [`retry`]: retrying a busy daemon with jittered backoff;
//! - [`signals`]: catching the signals that are forwarded;
//! - [`sh`]: the `warden-sh` shell shim's argument grammar;
//! - [`cli`]: the `warden` and `warden-sh` command lines, shared by the two binaries.

pub mod cli;
pub mod client;
pub mod exit;
pub use warden_proto::parse;
pub mod retry;
pub mod sh;
pub mod signals;

pub use client::{
    current_env, run, socket_path, Client, ClientError, Outcome, RunOptions, Welcome,
    DEFAULT_SOCKET, SOCKET_ENV,
};
pub use warden_proto::{ExitReason, ExitReport, Network, Overrides, PtySize};
