//! The `warden` binary against a fake daemon written here with `warden_proto::Conn` on a
//! temporary socket: the client's side of the protocol, the fds it passes, its exit statuses,
//! what it prints, and signal forwarding.

use std::error::Error;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tokio::net::UnixListener;
use warden_proto::{
    Conn, ErrorCode, ExitReason, ExitReport, FdRole, Request, Response, StartRequest,
    PROTOCOL_VERSION,
};

type TestResult<T = ()> = Result<T, Box<dyn Error + Send + Sync>>;

/// What the fake daemon does after it has checked `hello` and `start`.
#[derive(Debug, Clone)]
enum Script {
    /// Answer `hello` with this error.
    RefuseHello(ErrorCode, &'static str),
    /// `started`, then this report.
    Exit(ExitReport),
    /// This error instead of `started`.
    ErrorOnStart(ErrorCode, &'static str),
    /// `started`, send SIGTERM to the client, expect `signal 15`, end with signal 15.
    ForwardSigterm,
    /// SIGTERM to the client before `started`: it must arrive as `signal 15` after it.
    SigtermBeforeStarted,
    /// `started`, then close without `exited`.
    CloseEarly,
    /// Refuse this many connections at admission, then run the command and exit 0.
    Busy(u32),
}

/// What the fake daemon saw.
#[derive(Debug, Default)]
struct Seen {
    start: Option<StartRequest>,
    signals: Vec<i32>,
    /// Connections refused at admission before the one served.
    refused: u32,
}

fn report(reason: ExitReason, code: Option<i32>, signal: Option<i32>) -> ExitReport {
    ExitReport {
        reason,
        code,
        signal,
        cpu_usec: Some(1234),
        peak_memory_bytes: Some(4096),
        wall_usec: 5678,
    }
}

/// A directory that is not the test's own cwd, for the client to run in.
struct Env {
    dir: tempfile::TempDir,
    workdir: PathBuf,
    socket: PathBuf,
}

fn env() -> TestResult<Env> {
    let dir = tempfile::tempdir()?;
    let workdir = dir.path().join("work");
    std::fs::create_dir(&workdir)?;
    let socket = dir.path().join("warden.sock");
    Ok(Env {
        dir,
        workdir,
        socket,
    })
}

/// Check `hello` and `start`, then play `script`. Returns what was seen.
async fn serve(
    listener: UnixListener,
    workdir: PathBuf,
    client_pid: u32,
    script: Script,
) -> TestResult<Seen> {
    let mut seen = Seen::default();
    let mut conn = loop {
        // After a refusal, a client that stays away has given up.
        let next = tokio::time::timeout(std::time::Duration::from_secs(3), listener.accept());
        let (stream, _) = match next.await {
            Ok(accepted) => accepted?,
            Err(_) if seen.refused > 0 => return Ok(seen),
            Err(_) => return Err("no client connected".into()),
        };
        let mut conn = Conn::new(stream);
        let (hello, fds) = conn.recv::<Request>().await?.ok_or("closed before hello")?;
        match hello {
            Request::Hello { version, client } => {
                assert_eq!(version, PROTOCOL_VERSION);
                assert!(client.starts_with("warden "), "client name {client:?}");
            }
            other => return Err(format!("expected hello, got {other:?}").into()),
        }
        assert!(fds.is_empty());
        match script {
            Script::Busy(n) if seen.refused < n => {
                let refusal = Response::error(
                    ErrorCode::Admission,
                    "authentication admission limit reached",
                );
                conn.send(&refusal, &[]).await?;
                seen.refused += 1;
            }
            _ => break conn,
        }
    };
    if let Script::RefuseHello(code, message) = script {
        conn.send(&Response::error(code, message), &[]).await?;
        return Ok(seen);
    }
    conn.send(
        &Response::Welcome {
            version: PROTOCOL_VERSION,
            backend: "fake".into(),
        },
        &[],
    )
    .await?;

    let (start, fds) = conn.recv::<Request>().await?.ok_or("closed before start")?;
    let Request::Start(start) = start else {
        return Err(format!("expected start, got {start:?}").into());
    };
    check_start_fds(&start, &fds, &workdir)?;
    // The unit's stdout is the client's: write there as a unit would.
    let mut out = std::fs::File::from(fds[2].try_clone()?);
    out.write_all(b"output of the unit\n")?;
    drop(fds);
    seen.start = Some(start);

    match script {
        Script::RefuseHello(..) => {}
        Script::ErrorOnStart(code, message) => {
            conn.send(&Response::error(code, message), &[]).await?;
        }
        Script::Busy(_) => {
            send_started(&conn).await?;
            conn.send(
                &Response::Exited(report(ExitReason::Exited, Some(0), None)),
                &[],
            )
            .await?;
        }
        Script::Exit(report) => {
            send_started(&conn).await?;
            conn.send(&Response::Exited(report), &[]).await?;
        }
        Script::CloseEarly => {
            send_started(&conn).await?;
        }
        Script::ForwardSigterm | Script::SigtermBeforeStarted => {
            let early = matches!(script, Script::SigtermBeforeStarted);
            if !early {
                send_started(&conn).await?;
            }
            let pid = rustix::process::Pid::from_raw(i32::try_from(client_pid)?)
                .ok_or("bad client pid")?;
            rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
            if early {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                send_started(&conn).await?;
            }
            let (msg, _) =
                tokio::time::timeout(std::time::Duration::from_secs(10), conn.recv::<Request>())
                    .await??
                    .ok_or("closed before the signal arrived")?;
            match msg {
                Request::Signal { signal } => seen.signals.push(signal),
                other => return Err(format!("expected signal, got {other:?}").into()),
            }
            conn.send(
                &Response::Exited(report(ExitReason::Signal, None, Some(15))),
                &[],
            )
            .await?;
        }
    }
    Ok(seen)
}

async fn send_started(conn: &Conn) -> TestResult {
    conn.send(
        &Response::Started {
            unit: "warden-0123456789abcdef.service".into(),
        },
        &[],
    )
    .await?;
    Ok(())
}

/// Exactly four fds, in the documented order, the first a directory that is the client's cwd.
fn check_start_fds(start: &StartRequest, fds: &[OwnedFd], workdir: &Path) -> TestResult {
    assert_eq!(
        start.fds,
        vec![FdRole::Cwd, FdRole::Stdin, FdRole::Stdout, FdRole::Stderr]
    );
    assert_eq!(fds.len(), 4);
    let st = rustix::fs::fstat(fds[0].as_fd())?;
    assert_eq!(
        rustix::fs::FileType::from_raw_mode(st.st_mode),
        rustix::fs::FileType::Directory
    );
    let want = std::fs::metadata(workdir)?;
    assert_eq!((st.st_dev, st.st_ino), (want.dev(), want.ino()));
    Ok(())
}

/// Run `warden ARGS` in `env.workdir` against a fake daemon playing `script`.
async fn run_client(env: &Env, args: &[&str], script: Script) -> TestResult<(Output, Seen)> {
    run_bin(env!("CARGO_BIN_EXE_warden"), env, args, script).await
}

/// Run `BIN ARGS` in `env.workdir` against a fake daemon playing `script`.
async fn run_bin(
    bin: &str,
    env: &Env,
    args: &[&str],
    script: Script,
) -> TestResult<(Output, Seen)> {
    let listener = UnixListener::bind(&env.socket)?;
    let child = Command::new(bin)
        .args(args)
        .current_dir(&env.workdir)
        .env("WARDEN_SOCKET", &env.socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let daemon = tokio::spawn(serve(listener, env.workdir.clone(), child.id(), script));
    let output = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    let seen = daemon.await??;
    Ok((output, seen))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test]
async fn exit_code_is_the_commands() -> TestResult {
    let env = env()?;
    let (out, seen) = run_client(
        &env,
        &[
            "run",
            "--env",
            "EXTRA=1",
            "--memory-max",
            "512M",
            "--timeout",
            "5s",
            "--",
            "cmd",
            "-x",
            "arg",
        ],
        Script::Exit(report(ExitReason::Exited, Some(7), None)),
    )
    .await?;
    assert_eq!(out.status.code(), Some(7), "stderr: {}", stderr(&out));
    assert_eq!(stderr(&out), "");
    assert_eq!(stdout(&out), "output of the unit\n");
    let start = seen.start.ok_or("no start")?;
    assert_eq!(start.argv, vec!["cmd", "-x", "arg"]);
    assert!(start.env.contains(&("EXTRA".to_owned(), "1".to_owned())));
    assert!(start.env.iter().any(|(k, _)| k == "WARDEN_SOCKET"));
    assert_eq!(start.overrides.memory_max, Some(512 << 20));
    assert_eq!(start.overrides.timeout_ms, Some(5000));
    assert_eq!(start.overrides.network, None);
    assert_eq!(start.profile, None);
    assert_eq!(start.pty, None);
    Ok(())
}

#[tokio::test]
async fn session_limit_is_125_with_the_message_verbatim() -> TestResult {
    let env = env()?;
    let (out, _) = run_client(
        &env,
        &["--retry", "0", "run", "--", "true"],
        Script::ErrorOnStart(ErrorCode::SessionLimit, "session limit reached"),
    )
    .await?;
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(stderr(&out), "session limit reached\n");
    Ok(())
}

#[tokio::test]
async fn refusal_at_hello_is_125_with_the_message_verbatim() -> TestResult {
    let env = env()?;
    let (out, seen) = run_client(
        &env,
        &["--retry", "0", "run", "--", "true"],
        Script::RefuseHello(
            ErrorCode::Admission,
            "authentication admission limit reached",
        ),
    )
    .await?;
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(stderr(&out), "authentication admission limit reached\n");
    assert!(seen.start.is_none());
    Ok(())
}

#[tokio::test]
async fn a_busy_daemon_is_retried_until_it_admits() -> TestResult {
    let sh_env = env()?;
    let env = env()?;
    let (out, seen) = run_client(&env, &["-v", "run", "--", "true"], Script::Busy(5)).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(seen.refused, 5);
    assert!(seen.start.is_some());
    // -v says so, once.
    assert_eq!(
        stderr(&out).matches("warden: wardend is busy (authentication admission limit reached); retrying for up to").count(),
        1,
        "{}",
        stderr(&out)
    );
    // warden-sh retries too (its budget from $WARDEN_RETRY, the default here), silently.
    let (out, seen) = run_bin(
        env!("CARGO_BIN_EXE_warden-sh"),
        &sh_env,
        &["-c", "true"],
        Script::Busy(3),
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(seen.refused, 3);
    assert_eq!(stderr(&out), "");
    Ok(())
}

#[tokio::test]
async fn a_refusal_that_outlasts_the_retry_budget_is_reported() -> TestResult {
    let env = env()?;
    let t0 = std::time::Instant::now();
    let (out, seen) = run_client(
        &env,
        &["--retry", "300ms", "run", "--", "true"],
        Script::Busy(u32::MAX),
    )
    .await?;
    let took = t0.elapsed();
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(stderr(&out), "authentication admission limit reached\n");
    assert!(seen.refused >= 3, "only {} attempts", seen.refused);
    assert!(
        took >= std::time::Duration::from_millis(300),
        "gave up after {took:?}"
    );
    Ok(())
}

#[tokio::test]
async fn not_found_is_127_and_not_executable_126() -> TestResult {
    let env = env()?;
    let (out, _) = run_client(
        &env,
        &["run", "--", "no-such-command"],
        Script::ErrorOnStart(ErrorCode::NotFound, "no-such-command: command not found"),
    )
    .await?;
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(stderr(&out), "no-such-command: command not found\n");

    let env = self::env()?;
    let (out, _) = run_client(
        &env,
        &["run", "--", "./notes.txt"],
        Script::ErrorOnStart(ErrorCode::NotExecutable, "./notes.txt: permission denied"),
    )
    .await?;
    assert_eq!(out.status.code(), Some(126));
    Ok(())
}

#[tokio::test]
async fn signal_9_is_137() -> TestResult {
    let env = env()?;
    let (out, _) = run_client(
        &env,
        &["run", "--", "sleep", "100"],
        Script::Exit(report(ExitReason::Signal, None, Some(9))),
    )
    .await?;
    assert_eq!(out.status.code(), Some(137));
    Ok(())
}

#[tokio::test]
async fn timeout_is_124_and_the_report_is_json_on_stderr() -> TestResult {
    let env = env()?;
    let (out, _) = run_client(
        &env,
        &["run", "--report", "json", "--", "sleep", "100"],
        Script::Exit(report(ExitReason::Timeout, None, Some(9))),
    )
    .await?;
    assert_eq!(out.status.code(), Some(124));
    let line = stderr(&out);
    let parsed: ExitReport = serde_json::from_str(line.trim_end())?;
    assert_eq!(parsed, report(ExitReason::Timeout, None, Some(9)));
    assert_eq!(line.lines().count(), 1);
    Ok(())
}

#[tokio::test]
async fn sigterm_is_forwarded_as_signal_15() -> TestResult {
    let env = env()?;
    let (out, seen) =
        run_client(&env, &["run", "--", "sleep", "100"], Script::ForwardSigterm).await?;
    assert_eq!(seen.signals, vec![15]);
    assert_eq!(out.status.code(), Some(143), "stderr: {}", stderr(&out));
    Ok(())
}

#[tokio::test]
async fn sigterm_before_started_is_held_and_forwarded() -> TestResult {
    let env = env()?;
    let (out, seen) = run_client(
        &env,
        &["run", "--", "sleep", "100"],
        Script::SigtermBeforeStarted,
    )
    .await?;
    assert_eq!(seen.signals, vec![15]);
    assert_eq!(out.status.code(), Some(143), "stderr: {}", stderr(&out));
    Ok(())
}

#[tokio::test]
async fn a_daemon_that_closes_early_is_125() -> TestResult {
    let env = env()?;
    let (out, _) = run_client(&env, &["run", "--", "true"], Script::CloseEarly).await?;
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(
        stderr(&out),
        "warden: wardend closed the connection before the unit ended\n"
    );
    Ok(())
}

#[test]
fn no_daemon_is_125_cannot_connect() -> TestResult {
    let env = env()?;
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["--socket"])
        .arg(&env.socket)
        .args(["run", "--", "true"])
        .stdin(Stdio::null())
        .output()?;
    assert_eq!(out.status.code(), Some(125));
    let want = format!("warden: cannot connect to {}: ", env.socket.display());
    assert!(stderr(&out).starts_with(&want), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1);
    drop(env.dir);
    Ok(())
}

#[test]
fn usage_errors_ps_stop_and_pty_are_125() -> TestResult {
    let warden = env!("CARGO_BIN_EXE_warden");
    let sock = "/nonexistent/warden.sock";
    for (args, message) in [
        (&["run", "--memory-max", "12X", "--", "true"][..], "12X"),
        (&["run", "--timeout", "soon", "--", "true"][..], "soon"),
        (
            &["run", "--env", "NOEQUALS", "--", "true"][..],
            "NAME=VALUE",
        ),
        (&["run"][..], "CMD"),
        (
            &["ps"][..],
            "warden: ps is not supported by this daemon yet",
        ),
        (
            &["stop", "warden-1.service"][..],
            "warden: stop is not supported by this daemon yet",
        ),
        (
            &["run", "--pty", "--", "true"][..],
            "--pty is not supported",
        ),
    ] {
        let out = Command::new(warden)
            .args(["--socket", sock])
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        assert_eq!(out.status.code(), Some(125), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{args:?}: {}", stderr(&out));
    }
    Ok(())
}

#[tokio::test]
async fn status_prints_protocol_and_backend() -> TestResult {
    let env = env()?;
    let listener = UnixListener::bind(&env.socket)?;
    let daemon = tokio::spawn(async move {
        let (stream, _) = listener.accept().await?;
        let mut conn = Conn::new(stream);
        let (hello, _) = conn.recv::<Request>().await?.ok_or("closed")?;
        assert!(matches!(hello, Request::Hello { .. }));
        conn.send(
            &Response::Welcome {
                version: 1,
                backend: "native".into(),
            },
            &[],
        )
        .await?;
        // The client closes without starting anything.
        assert!(conn.recv::<Request>().await?.is_none());
        TestResult::Ok(())
    });
    let socket = env.socket.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_warden"))
            .arg("--socket")
            .arg(socket)
            .arg("status")
            .output()
    })
    .await??;
    daemon.await??;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "wardend: protocol 1, backend native\n");
    Ok(())
}

#[tokio::test]
async fn warden_sh_runs_bin_sh_through_the_daemon() -> TestResult {
    let env = env()?;
    let (out, seen) = run_bin(
        env!("CARGO_BIN_EXE_warden-sh"),
        &env,
        &["-lc", "echo $0 $1", "name", "one"],
        Script::Exit(report(ExitReason::Exited, Some(3), None)),
    )
    .await?;
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    let start = seen.start.ok_or("no start")?;
    assert_eq!(
        start.argv,
        vec!["/bin/sh", "-l", "-c", "echo $0 $1", "name", "one"]
    );
    assert!(start
        .env
        .contains(&("SHELL".to_owned(), "/bin/sh".to_owned())));
    assert_eq!(start.env.iter().filter(|(k, _)| k == "SHELL").count(), 1);

    // No command and stdin not a terminal: commands are read from stdin, in the unit.
    let env = self::env()?;
    let (out, seen) = run_bin(
        env!("CARGO_BIN_EXE_warden-sh"),
        &env,
        &[],
        Script::Exit(report(ExitReason::Exited, Some(0), None)),
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(seen.start.ok_or("no start")?.argv, vec!["/bin/sh", "-s"]);
    Ok(())
}

#[test]
fn warden_sh_refuses_what_it_cannot_do() -> TestResult {
    for args in [&["-i"][..], &["-c"][..], &["--rcfile", "x", "-c", "y"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_warden-sh"))
            .args(args)
            .env("WARDEN_SOCKET", "/nonexistent/warden.sock")
            .stdin(Stdio::null())
            .output()?;
        assert_eq!(out.status.code(), Some(125), "{args:?}");
        assert!(
            stderr(&out).starts_with("warden-sh: "),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    Ok(())
}
