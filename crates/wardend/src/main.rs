//! wardend's entry point: parse flags, load the config, open the backend, serve until
//! SIGTERM or SIGINT. Errors are printed once, as `wardend: <error>`, with exit status 1.
//! `wardend exec-shim ...` is the exec shim of systemd units instead (see `wardend::shim`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use wardend::account::Account;
use wardend::config::{Config, Flags};
use wardend::server::{Server, ServerError};
use wardend::units::{Backend, UnitError};

/// The warden daemon: runs the client account's commands as isolated, bounded units.
#[derive(Debug, Parser)]
#[command(name = "wardend", version)]
struct Cli {
    /// Config file (default /etc/warden/warden.toml, if it exists).
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    flags: Flags,
}

fn main() -> ExitCode {
    // `wardend exec-shim ...` inside a systemd unit: no runtime, no logging, no clap.
    if let Some(code) = wardend::shim::main_if_invoked() {
        return code;
    }
    // `wardend lifeline` as the systemd backend's lifeline service: reads stdin to its end.
    if let Some(code) = wardend::units::systemd::lifeline::main_if_invoked() {
        return code;
    }
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WARDEN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("starting the runtime: {e}")),
    };
    let result = runtime.block_on(run(cli));
    // Every handler has ended by now. A blocking thread still stuck on a stalled mount
    // (see `blocking`) must not keep the daemon from exiting.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// How long, after the server stopped, leftover blocking threads are waited for.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

fn fail(message: &str) -> ExitCode {
    eprintln!("wardend: {message}");
    ExitCode::FAILURE
}

async fn run(cli: Cli) -> Result<(), String> {
    let config = Config::load(cli.config.as_deref(), cli.flags).map_err(|e| e.to_string())?;
    // C3 before anything touches the system.
    if !rustix::process::geteuid().is_root() {
        return Err(ServerError::NotRoot.to_string());
    }
    wardend::kernel::check()?;
    match wardend::fd_limit::raise() {
        Ok(limit) => tracing::debug!(?limit, "descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the descriptor limit"),
    }
    // C2: the client account, by name, before the backend is touched.
    let account = Account::lookup(&config.client_user).map_err(|e| e.to_string())?;
    // One daemon per socket and prefix, before orphan cleanup touches a unit of the prefix
    // or the listener replaces a socket; held until this daemon exits.
    let _locks = wardend::instance::InstanceLocks::take(&config.socket, &config.unit_prefix)
        .map_err(|e| e.to_string())?;
    let backend = Backend::open(config.backend, &config.unit_prefix)
        .await
        .map_err(|e| match e {
            e @ UnitError::Unsupported(_) => e.to_string(),
            e => ServerError::OrphanCleanup(e).to_string(),
        })?;
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone())
        .map_err(|e| format!("installing signal handlers: {e}"))?;
    let server = Server::new(config, account, backend, shutdown);
    server.serve().await.map_err(|e| e.to_string())
}

/// SIGTERM and SIGINT cancel `shutdown` (installed once, not in a loop).
fn spawn_signal_handler(shutdown: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        shutdown.cancel();
    });
    Ok(())
}
