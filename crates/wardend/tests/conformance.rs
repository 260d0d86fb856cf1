//! The conformance suite: the same end-to-end tests against both backends — the native
//! backend on this host, the systemd backend against a real systemd booted in a throwaway
//! container. wardend serves `nobody`; the client runs as `nobody`.
//!
//! Needs root (and, for systemd, systemd-nspawn). Under `CI=true` a missing piece fails.

#[macro_use]
mod support;

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::harness::{bin, can_run, kill, native_unit_cgroups, scaled, Harness, Kind, Result};

per_backend!(
    stdio_and_exit_code,
    cwd_is_the_callers,
    stdin_is_passed,
    argv_is_passed_verbatim,
    the_unit_is_the_baseline_sandbox,
    signals_to_the_client_reach_the_command,
    socket_is_reachable_only_by_root_and_the_client,
    sigkill_gives_137,
    missing_command_gives_127,
    unexecutable_command_gives_126,
    killing_the_client_removes_the_unit,
    sigterm_stops_every_unit_and_exits_0,
    kill9_then_restart_leaves_no_orphans,
    nested_request_is_refused,
    non_root_daemon_refuses_to_serve,
    wrong_uid_is_refused_at_admission,
    session_limit_is_enforced,
    a_start_waits_for_a_session_slot_when_the_admin_allows,
    a_flood_from_another_process_tree_does_not_lock_the_agent_out,
    silent_connection_is_closed_at_the_handshake_timeout,
    bad_input_gets_an_error_frame_and_a_close,
    a_unit_dropped_mid_session_is_removed_before_shutdown_ends,
);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Start a harness, or `None` when this run may skip.
fn harness(kind: Kind, extra: &[&str]) -> Result<Option<Harness>> {
    if !can_run(&format!("{kind:?} conformance")) {
        return Ok(None);
    }
    Harness::start(kind, extra).map(Some)
}

/// Spawn `warden run -- CMD` as nobody in the background; wait until its unit exists.
fn spawn_unit(h: &Harness, cmd: &[&str]) -> Result<(std::process::Child, String)> {
    let before = h.units()?;
    let mut args = vec!["run", "--"];
    args.extend_from_slice(cmd);
    let child = h
        .warden(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let unit = h.wait_new_unit(&before)?;
    Ok((child, unit))
}

/// The PID of the `warden` client process started by `child` (nsenter forks on systemd).
fn client_pid(child: &std::process::Child) -> Option<u32> {
    let warden = bin("warden");
    std::iter::once(child.id())
        .chain(support::harness::descendants(child.id()))
        .find(|p| std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == warden))
}

/// A harness whose wardend has the failure points `points` armed.
fn harness_failing(kind: Kind, points: &str) -> Result<Option<Harness>> {
    if !can_run(&format!("{kind:?} failure injection")) {
        return Ok(None);
    }
    let opts = support::harness::Options {
        daemon_env: vec![("WARDEN_FAILPOINTS".into(), points.into())],
        ..Default::default()
    };
    Harness::start_with(kind, &[], opts).map(Some)
}

mod checks {
    use super::*;

    /// A session torn down with its unit running as the daemon stops (failure point
    /// `session-drop-unit`): the unit handle's drop removes it on a tracked task, and the
    /// shutdown waits for that removal — nothing is left once wardend has exited.
    pub fn a_unit_dropped_mid_session_is_removed_before_shutdown_ends(kind: Kind) -> Result<()> {
        let Some(mut h) = harness_failing(kind, "session-drop-unit")? else {
            return Ok(());
        };
        let (mut client, _) = spawn_unit(&h, &["sleep", "1000"])?;
        let status = h.signal_daemon(libc::SIGTERM)?;
        assert!(status.success(), "{status:?}");
        let _ = client.wait();
        assert!(
            h.log_text().contains("failpoint session-drop-unit"),
            "{}",
            h.log_text()
        );
        assert_eq!(h.units()?, Vec::<String>::new(), "{}", h.log_text());
        if kind == Kind::Native {
            assert!(native_unit_cgroups(&h.prefix).is_empty());
            assert!(
                support::harness::slice_dirs(&h.prefix).is_empty(),
                "{:?}",
                support::harness::slice_dirs(&h.prefix)
            );
        }
        Ok(())
    }

    pub fn stdio_and_exit_code(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let out = h.run(&["sh", "-c", "echo out; echo err >&2; exit 7"])?;
        assert_eq!(text(&out.stdout), "out\n");
        assert_eq!(text(&out.stderr), "err\n");
        assert_eq!(out.status.code(), Some(7), "log:\n{}", h.log_text());
        Ok(())
    }

    pub fn cwd_is_the_callers(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let out = h.run(&["pwd"])?;
        assert_eq!(
            text(&out.stdout).trim_end(),
            h.workdir.display().to_string()
        );
        assert_eq!(out.status.code(), Some(0));
        // And it is writable there.
        let out = h.run(&["sh", "-c", "echo x > written && cat written"])?;
        assert_eq!(text(&out.stdout), "x\n", "{}", text(&out.stderr));
        Ok(())
    }

    pub fn stdin_is_passed(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let mut child = h
            .warden(&["run", "--", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .ok_or("no stdin")?
            .write_all(b"hello\n")?;
        let out = child.wait_with_output()?;
        assert_eq!(text(&out.stdout), "hello\n");
        assert_eq!(out.status.code(), Some(0));
        Ok(())
    }

    pub fn argv_is_passed_verbatim(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let args = ["$HOME", "$$", "${PATH}", "%n %i", "a b", "", "\\;"];
        let mut cmd = vec!["printf", "[%s]\\n"];
        cmd.extend_from_slice(&args);
        let out = h.run(&cmd)?;
        let expected: String = args.iter().map(|a| format!("[{a}]\n")).collect();
        assert_eq!(text(&out.stdout), expected, "{}", text(&out.stderr));
        Ok(())
    }

    pub fn signals_to_the_client_reach_the_command(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        for (sig, name) in [
            (libc::SIGTERM, "TERM"),
            (libc::SIGINT, "INT"),
            (libc::SIGHUP, "HUP"),
            (libc::SIGQUIT, "QUIT"),
        ] {
            let script = format!(
                "trap 'echo got {name}; exit 3' {name}; echo ready; while :; do sleep 0.05; done"
            );
            let mut child = h
                .warden(&["run", "--", "sh", "-c", &script])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            let mut stdout = child.stdout.take().ok_or("no stdout")?;
            let mut first = [0u8; 6];
            std::io::Read::read_exact(&mut stdout, &mut first)?;
            assert_eq!(&first, b"ready\n");
            let pid = client_pid(&child).ok_or("client process not found")?;
            kill(pid, sig)?;
            let mut rest = String::new();
            std::io::Read::read_to_string(&mut stdout, &mut rest)?;
            let status = child.wait()?;
            assert_eq!(rest, format!("got {name}\n"), "signal {name}");
            assert_eq!(status.code(), Some(3), "signal {name}");
        }
        Ok(())
    }

    pub fn socket_is_reachable_only_by_root_and_the_client(kind: Kind) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let meta = std::fs::metadata(h.host_path(&h.socket))?;
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
        // Another unprivileged account cannot even connect.
        let warden = bin("warden").display().to_string();
        let sock = format!("WARDEN_SOCKET={}", h.socket.display());
        let out = h
            .command(&[
                "setpriv",
                "--reuid=1",
                "--regid=1",
                "--clear-groups",
                "env",
                &sock,
                &warden,
                "--retry",
                "0",
                "run",
                "--",
                "true",
            ])
            .stdin(Stdio::null())
            .output()?;
        assert_eq!(out.status.code(), Some(125));
        assert!(
            text(&out.stderr).contains("Permission denied"),
            "{}",
            text(&out.stderr)
        );
        Ok(())
    }

    pub fn the_unit_is_the_baseline_sandbox(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let run = |script: &str| -> Result<(Option<i32>, String)> {
            let out = h.run(&["sh", "-c", script])?;
            Ok((out.status.code(), text(&out.stdout) + &text(&out.stderr)))
        };
        assert_eq!(run("id -u; id -g")?, (Some(0), "65534\n65534\n".into()));
        assert_eq!(
            run("grep NoNewPrivs /proc/self/status")?,
            (Some(0), "NoNewPrivs:\t1\n".into())
        );
        // Writes: the system fails, /tmp is private and writable, the cwd is writable.
        let (code, _) = run("echo x > /etc/warden-escape")?;
        assert_ne!(code, Some(0));
        assert!(!h
            .host_path(std::path::Path::new("/etc/warden-escape"))
            .exists());
        let (code, _) = run("echo x > /usr/warden-escape")?;
        assert_ne!(code, Some(0));
        assert_eq!(
            run("echo x > /tmp/t && cat /tmp/t && echo y > here && cat here")?,
            (Some(0), "x\ny\n".into())
        );
        // wardend's socket is not visible; no descriptor beyond 0, 1, 2 is open
        // (3 is the directory `ls` itself reads).
        let sock = h.socket.display().to_string();
        let (code, said) = run(&format!("ls -la {sock}"))?;
        assert_ne!(code, Some(0), "socket visible: {said}");
        assert_eq!(
            run("ls /proc/self/fd | tr '\\n' ' '")?,
            (Some(0), "0 1 2 3 ".into())
        );
        if kind == Kind::Native {
            // Its own pid namespace: only the unit's processes (init, sh, ps).
            let (code, said) = run("ps -e -o pid= | wc -l")?;
            assert_eq!(
                (code, said.trim()),
                (Some(0), "4"),
                "ps sees more than the unit"
            );
        }
        Ok(())
    }

    pub fn sigkill_gives_137(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let out = h.run(&["sh", "-c", "kill -9 $$"])?;
        assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
        Ok(())
    }

    pub fn missing_command_gives_127(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let out = h.run(&["no-such-command-warden"])?;
        assert_eq!(out.status.code(), Some(127));
        assert_eq!(
            text(&out.stderr),
            "no-such-command-warden: command not found\n"
        );
        Ok(())
    }

    pub fn unexecutable_command_gives_126(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        h.write_work_file("script", "#!/bin/sh\necho hi\n")?;
        let out = h.run(&["./script"])?;
        assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
        Ok(())
    }

    pub fn killing_the_client_removes_the_unit(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let (mut child, unit) =
            spawn_unit(&h, &["sh", "-c", "setsid sh -c 'sleep 1000' & sleep 1000"])?;
        assert!(
            Harness::wait_for(Duration::from_secs(5), || h.unit_processes().len() >= 2).is_some()
        );
        // Every process of the unit, taken before the kill; a cheap check of just these
        // PIDs times their end (a full /proc and cgroup scan costs tens of milliseconds a
        // round on a loaded machine and would be measured instead).
        let procs = h.unit_processes();
        let pid = client_pid(&child).ok_or("client process not found")?;
        kill(pid, libc::SIGKILL)?;
        let took = Harness::wait_for(Duration::from_secs(5), || {
            !procs.iter().any(|p| support::harness::is_live(*p))
        });
        let _ = child.wait();
        let took =
            took.ok_or_else(|| format!("unit {unit} survived its client; log:\n{}", h.log_text()))?;
        let limit = match kind {
            Kind::Native => scaled(Duration::from_millis(100)),
            Kind::Systemd => scaled(Duration::from_secs(1)),
        };
        assert!(
            took <= limit,
            "unit's processes gone after {took:?}, limit {limit:?}"
        );
        // And then nothing of it is left: no process in its cgroup, no unit.
        let gone = Harness::wait_for(Duration::from_secs(2), || {
            h.unit_processes().is_empty() && h.units().is_ok_and(|u| !u.contains(&unit))
        });
        assert!(
            gone.is_some(),
            "unit {unit} left behind; log:\n{}",
            h.log_text()
        );
        Ok(())
    }

    pub fn sigterm_stops_every_unit_and_exits_0(kind: Kind) -> Result<()> {
        let Some(mut h) = harness(kind, &[])? else {
            return Ok(());
        };
        let (mut a, _) = spawn_unit(&h, &["sleep", "1000"])?;
        let (mut b, _) = spawn_unit(&h, &["sleep", "1000"])?;
        let status = h.signal_daemon(libc::SIGTERM)?;
        assert_eq!(status.code(), Some(0), "log:\n{}", h.log_text());
        assert_eq!(h.units()?, Vec::<String>::new());
        assert!(h.unit_processes().is_empty());
        // The clients were told why and ended with 125 (warden failed, not the command).
        for c in [&mut a, &mut b] {
            let mut said = String::new();
            std::io::Read::read_to_string(&mut c.stderr.take().ok_or("no stderr")?, &mut said)?;
            assert_eq!(c.wait()?.code(), Some(125), "{said}");
            assert_eq!(said, "wardend is shutting down\n");
        }
        assert!(!h.host_path(&h.socket).exists(), "socket left behind");
        if kind == Kind::Native {
            let slices = support::harness::slice_dirs(&h.prefix);
            assert!(
                slices.is_empty(),
                "slice directories left behind: {slices:?}"
            );
        }
        Ok(())
    }

    pub fn kill9_then_restart_leaves_no_orphans(kind: Kind) -> Result<()> {
        let Some(mut h) = harness(kind, &[])? else {
            return Ok(());
        };
        let n = match kind {
            Kind::Native => 20,
            Kind::Systemd => 3,
        };
        let mut clients = vec![];
        for _ in 0..n {
            clients.push(spawn_unit(&h, &["sleep", "1000"])?.0);
        }
        // A unit is listed as soon as systemd has it; its processes follow.
        let mut procs = Vec::new();
        Harness::wait_for(Duration::from_secs(10), || {
            procs = h.unit_processes();
            procs.len() >= n
        });
        assert!(procs.len() >= n, "{procs:?}");
        h.signal_daemon(libc::SIGKILL)?;
        // Every unit's processes die with the daemon (its lifeline), before any restart.
        let gone = Harness::wait_for(Duration::from_secs(1), || {
            !procs.iter().any(|p| support::harness::is_live(*p))
        });
        assert!(gone.is_some(), "unit processes outlived wardend by 1 s");
        for mut c in clients {
            let _ = c.wait();
        }
        std::fs::remove_file(h.host_path(&h.socket)).ok();
        let restart = std::time::Instant::now();
        h.start_daemon(&[])?;
        eprintln!("restart with {n} orphans took {:?}", restart.elapsed());
        // The socket exists only after the cleanup: nothing may be left now.
        assert_eq!(h.units()?, Vec::<String>::new(), "log:\n{}", h.log_text());
        let left: Vec<String> = h
            .unit_processes()
            .iter()
            .map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default())
            .collect();
        assert!(left.is_empty(), "processes left: {left:?}");
        // Native units leave their (empty) cgroups for the next start to remove; systemd
        // stopped and collected its units when the lifeline ended.
        if kind == Kind::Native {
            assert!(h.log_text().contains("removed orphaned units"));
        }
        Ok(())
    }

    pub fn nested_request_is_refused(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        // The client binary, copied where units can see it (the checkout may be under /tmp,
        // which is private in units).
        let copy = h.host_path(&h.workdir).join("warden");
        std::fs::copy(bin("warden"), &copy)?;
        let warden = h.workdir.join("warden").display().to_string();
        // From inside a unit the socket is not even visible.
        let out = h.run(&[&warden, "run", "--", "true"])?;
        assert_eq!(out.status.code(), Some(125));
        assert!(
            text(&out.stderr).contains("cannot connect"),
            "{}",
            text(&out.stderr)
        );
        // And a process placed in a unit's cgroup that can reach the socket is refused
        // by the daemon itself.
        let fake = format!("{}-0123456789abcdef.service", h.prefix);
        let sock = format!("WARDEN_SOCKET={}", h.socket.display());
        let wd = h.workdir.display().to_string();
        let out = match kind {
            Kind::Systemd => {
                h.exec_root(&["systemctl", "start", "dbus.socket"])?;
                h.command(&[
                    "systemd-run",
                    "--quiet",
                    "--wait",
                    "--pipe",
                    "--uid=nobody",
                    "--gid=nogroup",
                    &format!("--unit={fake}"),
                    &format!("--slice={}.slice", h.prefix),
                    &format!("--working-directory={wd}"),
                    "env",
                    &sock,
                    &warden,
                    "run",
                    "--",
                    "true",
                ])
                .stdin(Stdio::null())
                .output()?
            }
            Kind::Native => {
                let cg = format!("/sys/fs/cgroup/pids/{}.slice/{fake}", h.prefix);
                std::fs::create_dir_all(&cg)?;
                let script = format!("echo $$ > {cg}/cgroup.procs && exec setpriv --reuid=65534 --regid=65534 --clear-groups env -C {wd} {sock} {warden} run -- true");
                let out = h
                    .command(&["sh", "-c", &script])
                    .stdin(Stdio::null())
                    .output()?;
                let _ = std::fs::remove_dir(&cg);
                out
            }
        };
        assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr)
                .contains("refused: requests from inside a warden unit are not allowed"),
            "{}",
            text(&out.stderr)
        );
        Ok(())
    }

    pub fn non_root_daemon_refuses_to_serve(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let wardend = bin("wardend").display().to_string();
        let config = h.config.display().to_string();
        let out = h
            .as_nobody(&[
                &wardend,
                "--config",
                &config,
                "--client-user",
                "nobody",
                "--backend",
                kind.flag(),
                "--socket",
                "/nonexistent/w.sock",
            ])
            .stdin(Stdio::null())
            .output()?;
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("supervisor must run as root"),
            "{}",
            text(&out.stderr)
        );
        Ok(())
    }

    pub fn wrong_uid_is_refused_at_admission(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let warden = bin("warden").display().to_string();
        let sock = format!("WARDEN_SOCKET={}", h.socket.display());
        // (A refused account is retried like a busy daemon — the refusal reads the same —
        // so each attempt here says not to retry.)
        let out = h
            .command(&["env", &sock, &warden, "--retry", "0", "run", "--", "true"])
            .stdin(Stdio::null())
            .output()?;
        assert_eq!(out.status.code(), Some(125));
        assert_eq!(
            text(&out.stderr),
            "authentication admission limit reached\n"
        );
        // Right uid, wrong gid: refused too.
        let out = h
            .command(&[
                "setpriv",
                "--reuid=65534",
                "--regid=0",
                "--clear-groups",
                "env",
                &sock,
                &warden,
                "run",
                "--",
                "true",
            ])
            .stdin(Stdio::null())
            .output()?;
        assert_eq!(
            text(&out.stderr),
            "authentication admission limit reached\n"
        );
        Ok(())
    }

    pub fn session_limit_is_enforced(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &["--max-sessions", "1"])? else {
            return Ok(());
        };
        let (mut held, _) = spawn_unit(&h, &["sleep", "1000"])?;
        // (Told not to retry: the client retries a full daemon by default.)
        let out = h.warden(&["--retry", "0", "run", "--", "true"]).output()?;
        assert_eq!(out.status.code(), Some(125));
        assert_eq!(text(&out.stderr), "session limit reached\n");
        // By default it retries, and gives the same answer once its budget is spent.
        let t0 = Instant::now();
        let out = h.warden(&["--retry", "1s", "run", "--", "true"]).output()?;
        assert_eq!(text(&out.stderr), "session limit reached\n");
        assert!(t0.elapsed() >= Duration::from_secs(1), "{:?}", t0.elapsed());
        if let Some(pid) = client_pid(&held) {
            kill(pid, libc::SIGKILL)?;
        }
        let _ = held.wait();
        // The slot comes back.
        let freed = Harness::wait_for(Duration::from_secs(5), || {
            h.run(&["true"]).is_ok_and(|o| o.status.success())
        });
        assert!(
            freed.is_some(),
            "session slot not released; log:\n{}",
            h.log_text()
        );
        Ok(())
    }

    /// With `--session-wait`, a start that finds every session slot taken waits for one
    /// (bounded) instead of failing, and runs when a slot frees.
    pub fn a_start_waits_for_a_session_slot_when_the_admin_allows(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &["--max-sessions", "1", "--session-wait", "60s"])? else {
            return Ok(());
        };
        let (mut held, _) = spawn_unit(&h, &["sleep", "1000"])?;
        let mut waiting = h
            .warden(&["run", "--", "echo", "ran"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        std::thread::sleep(scaled(Duration::from_millis(700)));
        assert!(
            waiting.try_wait()?.is_none(),
            "the second start did not wait for a slot"
        );
        if let Some(pid) = client_pid(&held) {
            kill(pid, libc::SIGKILL)?;
        }
        let _ = held.wait();
        let out = waiting.wait_with_output()?;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "ran\n");
        Ok(())
    }

    /// Silent connections held open by another process tree of the client account — one
    /// origin, or many (each child its own session) — never take the agent's place: the
    /// agent is admitted at once, without retrying.
    pub fn a_flood_from_another_process_tree_does_not_lock_the_agent_out(kind: Kind) -> Result<()> {
        use std::io::BufRead;
        const FLOOD: &str = r#"
import os, socket, sys, time
path, n, spread = os.environ["WARDEN_SOCKET"], int(sys.argv[1]), sys.argv[2] == "spread"
held = []
for i in range(n):
    if spread:
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            os.write(w, b"x")
            time.sleep(60)
            os._exit(0)
        os.read(r, 1)
    else:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        held.append(s)
    time.sleep(0.02)
# One origin: the connections beyond its share were refused (a frame, then EOF); the
# others are still open and silent.
refused = 0
for s in held:
    s.settimeout(0.3)
    try:
        s.recv(1)
        refused += 1
    except socket.timeout:
        s.settimeout(None)
print("flooding", refused if held else "-", flush=True)
time.sleep(60)
"#;
        let Some(h) = harness(
            kind,
            &["--max-unauthenticated", "4", "--handshake-timeout", "60s"],
        )?
        else {
            return Ok(());
        };
        for mode in ["one-origin", "spread"] {
            let mut flood = h
                .as_client_elsewhere(&["python3", "-c", FLOOD, "12", mode], &[])
                .stdout(Stdio::piped())
                .spawn()?;
            let mut line = String::new();
            std::io::BufReader::new(flood.stdout.take().ok_or("no stdout")?)
                .read_line(&mut line)?;
            // One origin holds two of the four slots; its ten other connections were refused.
            let want = if mode == "spread" {
                "flooding -\n"
            } else {
                "flooding 10\n"
            };
            assert_eq!(line, want, "{mode}");
            // Told not to retry: it must get in at once.
            let out = h
                .warden(&["--retry", "0", "run", "--", "echo", "in"])
                .output()?;
            let flooders =
                std::iter::once(flood.id()).chain(support::harness::descendants(flood.id()));
            for pid in flooders.collect::<Vec<_>>() {
                let _ = kill(pid, libc::SIGKILL);
            }
            let _ = flood.wait();
            assert_eq!(out.status.code(), Some(0), "{mode}: {}", text(&out.stderr));
            assert_eq!(text(&out.stdout), "in\n", "{mode}");
        }
        Ok(())
    }

    pub fn silent_connection_is_closed_at_the_handshake_timeout(kind: Kind) -> Result<()> {
        // (Stretched in the emulated VM, where starting a client takes long.)
        let timeout = scaled(Duration::from_millis(500));
        let timeout_arg = format!("{}ms", timeout.as_millis());
        let Some(h) = harness(
            kind,
            &[
                "--handshake-timeout",
                &timeout_arg,
                "--max-unauthenticated",
                "1",
            ],
        )?
        else {
            return Ok(());
        };
        // One origin (a session of its own: `setsid sh`, and on a systemd host a scope of
        // its own, so that no unit's main PID names its processes differently, whether the
        // bus answers the daemon in time or not) holds the only unauthenticated slot with a
        // silent connection; its next connection is refused at once when told not
        // to retry, and admitted (retrying) once the silent one is closed at the timeout.
        let linger = format!("{:.1}", timeout.as_secs_f64() * 3.0);
        let script = format!(
            "python3 {probe} \"$WARDEN_SOCKET\" say connected sleep {linger} drain > probe.out & \
             until grep -q connected probe.out 2>/dev/null; do sleep 0.01; done; \
             {warden} --retry 0 run -- true; echo \"refused-rc=$?\"; \
             {warden} -v run -- true; echo \"admitted-rc=$?\"; wait; cat probe.out; rm -f probe.out",
            probe = support::harness::probe_script().display(),
            warden = bin("warden").display(),
        );
        let out = h
            .as_client_elsewhere(&["sh", "-c", &script], &[])
            .output()?;
        let (said, err) = (text(&out.stdout), text(&out.stderr));
        assert!(said.contains("refused-rc=125\n"), "{said}{err}");
        assert!(
            err.starts_with("authentication admission limit reached\n"),
            "{said}{err}"
        );
        assert!(said.contains("admitted-rc=0\n"), "{said}{err}");
        assert!(err.contains("warden: wardend is busy"), "{said}{err}");
        assert!(said.contains("handshake timed out"), "{said}{err}");
        assert!(said.trim_end().ends_with("EOF"), "{said}{err}");
        // The slot is free again.
        let out = h.run(&["true"])?;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        Ok(())
    }

    pub fn bad_input_gets_an_error_frame_and_a_close(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, &[])? else {
            return Ok(());
        };
        let wd = h.workdir.display().to_string();
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (vec!["huge", "drain"], "exceeds the limit"),
            (vec!["half", "drain"], "closed in the middle of a frame"),
            (vec!["frame", "{not json", "drain"], "malformed message"),
            (
                vec!["frame", r#"{"type":"stop"}"#, "drain"],
                "expected hello",
            ),
            (
                vec!["frame", r#"{"type":"hello","version":99}"#, "drain"],
                "unsupported protocol version 99",
            ),
            (
                vec!["hello", "read", "start-nofd", "drain"],
                "declares 1 file descriptors but 0 were attached",
            ),
            (
                vec!["hello", "read", "start-fds", "cwd", "/etc/passwd", "drain"],
                "cwd descriptor is not a directory",
            ),
            (
                vec!["hello", "read", "start-empty", &wd, "drain"],
                "empty command",
            ),
            (vec!["hello", "read", "hello", "drain"], "expected start"),
        ];
        for (steps, expected) in cases {
            let out = h.probe(&steps)?;
            let said = text(&out.stdout);
            let last_two: Vec<&str> = said.lines().rev().take(2).collect();
            assert_eq!(last_two.first(), Some(&"EOF"), "{steps:?}: {said}");
            assert!(
                last_two
                    .get(1)
                    .is_some_and(|l| l.contains(r#""type": "error""#) && l.contains(expected)),
                "{steps:?}: expected an error frame with {expected:?}, got {said}"
            );
        }
        // The daemon keeps serving.
        let out = h.run(&["true"])?;
        assert_eq!(out.status.code(), Some(0));
        assert!(h.units()?.is_empty());
        Ok(())
    }
}

/// The exec shim (run here by hand, as systemd would: root, the spec as a credential)
/// runs the command in the directory passed, and nothing when its working directory is not
/// that inode (systemd set the unit up by path: a symlink swapped in meanwhile would have
/// been followed).
#[test]
fn exec_shim_refuses_a_working_directory_that_changed() -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !can_run("exec shim") {
        return Ok(());
    }
    let creds = tempfile::tempdir()?;
    let work = tempfile::tempdir()?;
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o777))?;
    let st = std::fs::metadata(work.path())?;
    let shim = |cwd_id: (u64, u64)| -> Result<std::process::Output> {
        let spec = wardend::shim::spec::Spec {
            argv: vec!["sh".into(), "-c".into(), "touch ran".into()],
            env: vec![],
            path: "/usr/bin:/bin".into(),
            cwd: work.path().to_path_buf(),
            cwd_id,
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
            network: warden_proto::Network::None,
            landlock: true,
            scopes: Default::default(),
        };
        std::fs::write(
            creds.path().join(wardend::shim::spec::CREDENTIAL),
            serde_json::to_vec(&spec)?,
        )?;
        Ok(std::process::Command::new(bin("wardend"))
            .arg("exec-shim")
            .env("CREDENTIALS_DIRECTORY", creds.path())
            .output()?)
    };
    let ok = shim((st.dev(), st.ino()))?;
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    assert!(work.path().join("ran").exists());
    std::fs::remove_file(work.path().join("ran"))?;
    let moved = shim((1, 1))?;
    assert_eq!(moved.status.code(), Some(125));
    assert_eq!(
        text(&moved.stderr),
        "warden: exec-shim: the working directory changed while the unit was set up\n"
    );
    assert!(!work.path().join("ran").exists());
    Ok(())
}

#[test]
fn systemd_unit_properties_are_the_baseline_sandbox() -> Result<()> {
    let Some(h) = harness(Kind::Systemd, &[])? else {
        return Ok(());
    };
    let (mut child, unit) = spawn_unit(&h, &["sleep", "1000"])?;
    let names = [
        "User",
        "Environment",
        "WorkingDirectory",
        "NoNewPrivileges",
        "ProtectSystem",
        "Slice",
        "PrivateTmp",
        "ProtectHome",
        "KillMode",
        "ExecStart",
        "LoadCredential",
        "BindsTo",
        "CPUWeight",
        "MemoryMax",
        "TemporaryFileSystem",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "RestrictNamespaces",
        "CapabilityBoundingSet",
    ];
    let mut argv = vec!["systemctl", "show", unit.as_str()];
    for n in &names {
        argv.extend(["-p", n]);
    }
    let props = text(&h.exec_root(&argv)?.stdout);
    for expected in [
        // The shim starts as root with systemd's environment and drops to the client
        // itself; the command and its environment are not in any property.
        "User=",
        "Environment=",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        &format!("Slice={}.slice", h.prefix),
        "PrivateTmp=yes",
        "ProtectHome=read-only",
        "KillMode=control-group",
        // Bounded by default, below the daemon's CPU weight.
        "CPUWeight=50",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "RestrictNamespaces=mnt pid",
        "CapabilityBoundingSet=cap_kill cap_setgid cap_setuid cap_sys_admin",
    ] {
        assert!(
            props.lines().any(|l| l == expected),
            "missing {expected} in\n{props}"
        );
    }
    assert!(
        !props
            .lines()
            .any(|l| l.starts_with("WorkingDirectory=/srv")),
        "{props}"
    );
    // Stopped when wardend's lifeline stops; a memory limit; a private /run.
    let lifeline = format!("BindsTo={}-lifeline-", h.prefix);
    assert!(props.lines().any(|l| l.starts_with(&lifeline)), "{props}");
    assert!(
        props
            .lines()
            .any(|l| l.starts_with("MemoryMax=") && l != "MemoryMax=infinity"),
        "{props}"
    );
    assert!(
        props
            .lines()
            .any(|l| l.starts_with("TemporaryFileSystem=") && l.contains("/run:")),
        "{props}"
    );
    // (systemctl 252 prints a credential as "[unprintable]".)
    assert!(
        props
            .lines()
            .any(|l| l.starts_with("LoadCredential=") && l != "LoadCredential="),
        "{props}"
    );
    // Started through wardend's exec shim with a fixed command line (wardend itself, or its
    // copy when wardend runs from under /tmp).
    let paths = [
        format!("path={} ;", bin("wardend").display()),
        "path=/var/lib/wardend/exec-shim ;".to_string(),
    ];
    assert!(
        props.lines().any(|l| l.starts_with("ExecStart=")
            && paths.iter().any(|p| l.contains(p.as_str()))
            && l.contains("argv[]=wardend exec-shim ;")),
        "not started through the exec shim:\n{props}"
    );
    if let Some(pid) = client_pid(&child) {
        kill(pid, libc::SIGTERM)?;
    }
    let _ = child.wait();
    Ok(())
}

#[test]
fn systemd_refuses_a_cwd_under_tmp_with_a_clear_message() -> Result<()> {
    let Some(h) = harness(Kind::Systemd, &[])? else {
        return Ok(());
    };
    let dir = format!("/tmp/{}", h.prefix);
    h.exec_root(&["mkdir", "-p", &dir])?;
    h.exec_root(&["chown", "nobody:nogroup", &dir])?;
    let warden = bin("warden").display().to_string();
    let sock = format!("WARDEN_SOCKET={}", h.socket.display());
    let out = h
        .as_nobody(&["env", "-C", &dir, &sock, &warden, "run", "--", "true"])
        .stdin(Stdio::null())
        .output()?;
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{dir} is under /tmp or /var/tmp")),
        "{err}"
    );
    assert!(h.units()?.is_empty());
    Ok(())
}

#[test]
fn orphan_cleanup_that_cannot_reach_systemd_fails_startup() -> Result<()> {
    if !can_run("orphan cleanup failure") {
        return Ok(());
    }
    // In a mount namespace of its own where neither the system bus nor systemd's private
    // socket exists (on a systemd host they are covered), so on any host.
    let dir = tempfile::tempdir()?;
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(
            "for d in /run/systemd /run/dbus; do [ -d $d ] && mount -t tmpfs tmpfs $d; done; \
             exec \"$0\" \"$@\"",
        )
        .arg(bin("wardend"))
        .args([
            "--config",
            support::harness::NO_CONFIG,
            "--client-user",
            "nobody",
            "--backend",
            "systemd",
            "--socket",
        ])
        .arg(dir.path().join("w.sock"))
        .stdin(Stdio::null())
        .output()?;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("wardend: startup orphan cleanup: "), "{err}");
    assert!(!dir.path().join("w.sock").exists(), "must not listen");
    Ok(())
}

#[test]
fn native_units_live_in_the_prefix_cgroup() -> Result<()> {
    let Some(h) = harness(Kind::Native, &[])? else {
        return Ok(());
    };
    let (mut child, unit) = spawn_unit(&h, &["sleep", "1000"])?;
    assert!(native_unit_cgroups(&h.prefix).contains(&unit));
    if let Some(pid) = client_pid(&child) {
        kill(pid, libc::SIGTERM)?;
    }
    let _ = child.wait();
    Ok(())
}

/// `cmd`'s output, or an error (and the command killed) if it has not finished within `limit`.
fn output_within(cmd: &mut std::process::Command, limit: Duration) -> Result<std::process::Output> {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => Ok(out?),
        Err(_) => {
            let _ = kill(pid, libc::SIGKILL);
            Err(format!("{cmd:?} did not finish within {limit:?}").into())
        }
    }
}

/// A working directory on a mount that stops answering (a FUSE double of a hung NFS
/// server): those requests end at the handshake deadline with a message that says why,
/// every other client's run goes on meanwhile, and the daemon still stops at once.
/// Native backend: the stall is met in policy, before any backend acts (the systemd
/// container would not see a mount made here).
#[test]
fn a_stalled_mount_costs_its_requests_not_the_daemon() -> Result<()> {
    use support::stalled_fuse::StalledFuse;
    let handshake = scaled(Duration::from_secs(5));
    let flag = format!("{}ms", handshake.as_millis());
    let Some(mut h) = harness(Kind::Native, &["--handshake-timeout", &flag])? else {
        return Ok(());
    };
    if !std::path::Path::new("/dev/fuse").exists() {
        if support::harness::required() {
            return Err("/dev/fuse is missing: the stalled-mount test needs FUSE".into());
        }
        eprintln!("skipped: no /dev/fuse");
        return Ok(());
    }
    let place = tempfile::Builder::new().prefix("wstall").tempdir()?;
    std::fs::set_permissions(
        place.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let mnt = place.path().join("stalled");
    std::fs::create_dir(&mnt)?;
    let fuse = StalledFuse::mount(&mnt, h.client.uid, h.client.gid)?;
    // Entered once while it answers (the kernel then no longer asks it for access checks).
    let primed = h.as_client_in(&mnt, &["true"], &[]).output()?;
    assert!(primed.status.success(), "{}", text(&primed.stderr));
    fuse.stall();

    let mut stuck: Vec<std::process::Child> = (0..3)
        .map(|_| {
            h.warden_client_in(&mnt, &["--retry", "0", "run", "--", "true"], &[])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    Harness::wait_for(scaled(Duration::from_secs(10)), || fuse.waiting() >= 3)
        .ok_or("the daemon never reached the stalled mount")?;
    // More requests are stuck than the daemon has runtime workers (2): without the blocking
    // pool these would wait for the mount too.
    for _ in 0..5 {
        let out = output_within(
            &mut h.warden(&["--retry", "0", "run", "--", "echo", "fast"]),
            handshake,
        )?;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "fast\n");
    }
    for child in &mut stuck {
        if let Some(s) = child.try_wait()? {
            return Err(format!("a stalled request ended before the others ran: {s:?}").into());
        }
    }
    assert!(fuse.waiting() >= 3);
    for mut child in stuck {
        let deadline = Instant::now() + handshake + scaled(Duration::from_secs(10));
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err("a request on the stalled mount outlived its deadline".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut err)?;
        }
        assert_eq!(status.code(), Some(125), "{err}");
        assert!(err.contains("handshake timed out"), "{err}");
        assert!(err.contains("stalled"), "{err}");
    }
    assert!(h.units()?.is_empty(), "no unit was started for them");
    // The threads stuck on the mount do not hold the daemon's shutdown up: it closes its
    // socket and its main thread ends. (The kernel reaps the process only once those
    // threads return: a FUSE request already read by its server waits uninterruptibly.)
    let pid = h.daemon_pid().ok_or("wardend is not running")?;
    kill(pid, libc::SIGTERM)?;
    let main_ended = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z'))
        })
    };
    let ended = Harness::wait_for(scaled(Duration::from_secs(10)), || {
        !h.socket.exists() && main_ended()
    });
    drop(fuse);
    let status = h.wait_daemon()?;
    assert!(
        ended.is_some(),
        "wardend's shutdown waited for the stalled mount"
    );
    assert!(status.success(), "{status:?}: {}", h.log_text());
    Ok(())
}

/// The systemd start job's result cannot be read after StartTransientUnit succeeded
/// (failure point `systemd-start-job`): the start fails with the reason, and the unit, which
/// systemd did start, is stopped before the error is returned.
#[test]
fn systemd_a_start_that_fails_after_the_unit_exists_leaves_no_unit() -> Result<()> {
    let Some(h) = harness_failing(Kind::Systemd, "systemd-start-job")? else {
        return Ok(());
    };
    let out = h
        .warden(&["--retry", "0", "run", "--", "sleep", "1000"])
        .output()?;
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("waiting for the start job"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(h.units()?, Vec::<String>::new(), "{}", h.log_text());
    Ok(())
}
