//! The command lines of `warden` and `warden-sh` (SPEC §10), shared by the two binaries so
//! that both run commands the same way. Each entry point returns the process's exit status.
//!
//! Usage errors exit with 125 (warden failed, as docker run does), `--help` and `--version`
//! with 0.
//!
//! `--pty` is refused client-side with a clear message (exit 125): protocol v1 has no way to
//! carry a pty's data or resizes, so sending `pty` to the daemon could only be refused there.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use warden_proto::{Network, Overrides};

use crate::client::{self, Client, ClientError, RunOptions};
use crate::exit::{report_exit_code, EXIT_WARDEN_FAILED};
use crate::parse::{parse_duration_ms, parse_size};

/// Run commands as isolated, bounded, disposable units of wardend.
#[derive(Debug, Parser)]
#[command(name = "warden", version)]
pub struct Cli {
    /// The daemon's socket [default: $WARDEN_SOCKET, else /run/warden/<your account>.sock].
    #[arg(long, global = true, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// How long to retry a busy daemon (refused at admission, or no session slot free),
    /// e.g. 10s; 0: not at all [default: $WARDEN_RETRY, else 30s].
    #[arg(long, global = true, value_name = "DURATION", value_parser = duration_ms)]
    pub retry: Option<u64>,
    /// Say on stderr what warden is doing when it waits (retrying a busy daemon).
    #[arg(short, long, global = true)]
    pub verbose: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command as a unit, with this directory and stdio; exit with its status.
    Run(RunArgs),
    /// List running units (not supported by protocol v1 daemons yet).
    Ps,
    /// Stop a unit (not supported by protocol v1 daemons yet).
    Stop {
        /// The unit's name.
        unit: String,
    },
    /// Show the daemon's protocol version and backend.
    Status,
    /// Check that the daemon answers and runs /bin/true.
    Selftest,
}

/// Network access, as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkArg {
    /// No network at all.
    None,
    /// Loopback only.
    Loopback,
    /// The host's network.
    Host,
}

impl From<NetworkArg> for Network {
    fn from(n: NetworkArg) -> Self {
        match n {
            NetworkArg::None => Network::None,
            NetworkArg::Loopback => Network::Loopback,
            NetworkArg::Host => Network::Host,
        }
    }
}

/// Formats of `--report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// The exit report as one JSON line on stderr.
    Json,
}

/// Options of `warden run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The daemon profile to use [default: the daemon's `default`].
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Network access (may only tighten the profile).
    #[arg(long, value_enum)]
    pub network: Option<NetworkArg>,
    /// Memory limit, e.g. 512M, 4G.
    #[arg(long, value_name = "SIZE", value_parser = nonzero_size)]
    pub memory_max: Option<u64>,
    /// Most processes and threads.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub tasks_max: Option<u64>,
    /// Wall-time limit, e.g. 30s, 10m, 1h; the command then exits with 124.
    #[arg(long, value_name = "DURATION", value_parser = nonzero_duration_ms)]
    pub timeout: Option<u64>,
    /// Run in a pty (not supported by protocol v1 daemons yet: refused).
    #[arg(long)]
    pub pty: bool,
    /// Set a variable in the command's environment (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = env_pair)]
    pub env: Vec<(String, String)>,
    /// After the command ends, write its exit report to stderr in this format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub report: Option<ReportFormat>,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

fn nonzero_size(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Ok(0) => Err("must be more than 0".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn nonzero_duration_ms(s: &str) -> Result<u64, String> {
    match parse_duration_ms(s) {
        Ok(0) => Err("must be at least 1ms".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn duration_ms(s: &str) -> Result<u64, String> {
    parse_duration_ms(s).map_err(|e| e.to_string())
}

fn env_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !k.contains('\0') && !v.contains('\0') => {
            Ok((k.to_owned(), v.to_owned()))
        }
        _ => Err(format!("expected NAME=VALUE, not {s:?}")),
    }
}

/// Print one line on stderr, ignoring failures (there is nowhere else to report them).
fn eprint_line(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A current-thread runtime, or the message why not.
fn runtime() -> Result<tokio::runtime::Runtime, std::io::Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Run a unit and turn its outcome into an exit status, printing errors (and the report if
/// asked) on stderr.
pub fn execute_run(opts: &RunOptions, report: Option<ReportFormat>) -> i32 {
    if opts.pty.is_some() {
        eprint_line(&client::pty_unsupported().user_message());
        return EXIT_WARDEN_FAILED;
    }
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprint_line(&format!("warden: cannot start the runtime: {e}"));
            return EXIT_WARDEN_FAILED;
        }
    };
    match rt.block_on(client::run(opts)) {
        Ok(outcome) => {
            if report == Some(ReportFormat::Json) {
                match serde_json::to_string(&outcome.report) {
                    Ok(line) => eprint_line(&line),
                    Err(e) => eprint_line(&format!("warden: cannot encode the report: {e}")),
                }
            }
            report_exit_code(&outcome.report)
        }
        Err(e) => {
            eprint_line(&e.user_message());
            e.exit_code()
        }
    }
}

/// `warden run`'s options → what the library runs.
fn run_options(socket: PathBuf, args: RunArgs) -> RunOptions {
    let mut opts = RunOptions::new(socket, args.command);
    for (k, v) in &args.env {
        opts.set_env(k, v);
    }
    opts.profile = args.profile;
    opts.overrides = Overrides {
        network: args.network.map(Network::from),
        memory_max: args.memory_max,
        tasks_max: args.tasks_max,
        timeout_ms: args.timeout,
    };
    if args.pty {
        opts.pty = Some(terminal_size());
    }
    opts
}

/// The size of the terminal on stdin/stdout, or 24×80.
fn terminal_size() -> warden_proto::PtySize {
    for fd in [rustix::stdio::stdin(), rustix::stdio::stdout()] {
        if let Ok(ws) = rustix::termios::tcgetwinsize(fd) {
            if ws.ws_row > 0 && ws.ws_col > 0 {
                return warden_proto::PtySize {
                    rows: ws.ws_row,
                    cols: ws.ws_col,
                };
            }
        }
    }
    warden_proto::PtySize { rows: 24, cols: 80 }
}

/// Connect and print `wardend: protocol N, backend B`.
async fn status(socket: &std::path::Path) -> Result<(), ClientError> {
    let client = Client::connect(socket).await?;
    let w = client.welcome();
    println!("wardend: protocol {}, backend {}", w.version, w.backend);
    Ok(())
}

/// `status`, then run `/bin/true` and check that it exits 0.
fn selftest(socket: PathBuf) -> i32 {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprint_line(&format!("warden: cannot start the runtime: {e}"));
            return EXIT_WARDEN_FAILED;
        }
    };
    if let Err(e) = rt.block_on(status(&socket)) {
        eprint_line(&e.user_message());
        return e.exit_code();
    }
    let opts = RunOptions::new(socket, vec!["/bin/true".to_owned()]);
    match rt.block_on(client::run(&opts)) {
        Ok(outcome) if report_exit_code(&outcome.report) == 0 => {
            println!(
                "selftest: ok, /bin/true ran as {} in {} ms",
                outcome.unit.as_deref().unwrap_or("a unit"),
                outcome.report.wall_usec / 1000
            );
            0
        }
        Ok(outcome) => {
            eprint_line(&format!(
                "warden: selftest failed: /bin/true ended with status {} ({:?})",
                report_exit_code(&outcome.report),
                outcome.report.reason
            ));
            EXIT_WARDEN_FAILED
        }
        Err(e) => {
            eprint_line(&e.user_message());
            EXIT_WARDEN_FAILED
        }
    }
}

/// Parse a command line, printing clap's message on failure; `Err` holds the exit status.
fn parse_args<P: Parser>(args: impl IntoIterator<Item = OsString>) -> Result<P, i32> {
    P::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            EXIT_WARDEN_FAILED
        } else {
            0
        }
    })
}

/// The `warden` program.
pub fn warden_main(args: impl IntoIterator<Item = OsString>) -> i32 {
    let cli: Cli = match parse_args(args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let socket = client::socket_path(cli.socket);
    match cli.command {
        Command::Run(args) => {
            let report = args.report;
            let mut opts = run_options(socket, args);
            if let Some(ms) = cli.retry {
                opts.retry = std::time::Duration::from_millis(ms);
            }
            opts.verbose = cli.verbose;
            execute_run(&opts, report)
        }
        Command::Ps => unsupported("ps"),
        Command::Stop { .. } => unsupported("stop"),
        Command::Status => match runtime() {
            Ok(rt) => match rt.block_on(status(&socket)) {
                Ok(()) => 0,
                Err(e) => {
                    eprint_line(&e.user_message());
                    e.exit_code()
                }
            },
            Err(e) => {
                eprint_line(&format!("warden: cannot start the runtime: {e}"));
                EXIT_WARDEN_FAILED
            }
        },
        Command::Selftest => selftest(socket),
    }
}

fn unsupported(cmd: &str) -> i32 {
    eprint_line(&format!(
        "warden: {cmd} is not supported by this daemon yet"
    ));
    EXIT_WARDEN_FAILED
}

pub use crate::sh::sh_main;
