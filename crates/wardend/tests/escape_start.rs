//! The escape suite of issue 8: what a command can do through the way its unit is started —
//! loader variables, strings that end up in unit files, the host's bus and logging
//! sockets, its neighbours, namespaces and exotic syscalls, a child left behind — against
//! both backends (the native one on this host, systemd in a throwaway container), plus the
//! systemd-only unit-file checks.
//!
//! Needs root (and, for systemd, systemd-nspawn), gcc for the hostile library. Under
//! `CI=true` a missing piece fails.

#[macro_use]
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::attack::*;
use support::harness::{can_run, scaled, Harness, Kind, Options, Result};

per_backend!(
    loader_variables_run_nothing_outside_the_restrictions,
    no_bus_journal_notify_socket_neighbour_or_foreign_pid,
    namespaces_io_uring_and_personality_are_refused,
    a_child_left_behind_does_not_change_the_exit,
);

/// A library whose constructor tries, against the process `WARDEN_TEST_TARGET` (the
/// client of another unit), the five escapes issue 8 saw through `LD_PRELOAD`, and appends
/// one line of results to `WARDEN_TEST_RESULT`.
const HOSTILE_C: &str = r##"
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
unsigned int la_version(unsigned int v) { return v; }
static const char *try_open(const char *path, int flags, const char *needle) {
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0) return "denied";
    if (needle) {
        static char buf[65536];
        ssize_t n = read(fd, buf, sizeof buf);
        close(fd);
        if (n > 0 && memmem(buf, n, needle, strlen(needle))) return "LEAKED";
        return "read";
    }
    close(fd);
    return "OPENED";
}
__attribute__((constructor)) static void hostile(void) {
    const char *t = getenv("WARDEN_TEST_TARGET"), *home = getenv("WARDEN_TEST_HOME");
    const char *out = getenv("WARDEN_TEST_RESULT");
    if (!t || !home || !out) return;
    char p[4096];
    const char *env_r, *key_r, *rc_r, *mem_r, *kill_r;
    snprintf(p, sizeof p, "/proc/%s/environ", t);
    env_r = try_open(p, O_RDONLY, "s3cr3t-target");
    snprintf(p, sizeof p, "/proc/%s/root%s/.ssh/id_ed25519", t, home);
    key_r = try_open(p, O_RDONLY, "fake-key");
    snprintf(p, sizeof p, "/proc/%s/root%s/.bashrc", t, home);
    int fd = open(p, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd >= 0) { rc_r = write(fd, "# pwned\n", 8) == 8 ? "APPENDED" : "opened"; close(fd); }
    else rc_r = "denied";
    snprintf(p, sizeof p, "/proc/%s/mem", t);
    mem_r = try_open(p, O_RDWR, NULL);
    kill_r = kill(atoi(t), SIGKILL) == 0 ? "KILLED" : "denied";
    FILE *f = fopen(out, "a");
    if (f) {
        fprintf(f, "pid=%d uid=%d environ=%s key=%s bashrc=%s mem=%s kill=%s\n", getpid(),
                getuid(), env_r, key_r, rc_r, mem_r, kill_r);
        fclose(f);
    }
}
"##;

/// Which Unix socket paths of the host's bus, journal and service manager a command can
/// connect to: `PATH: connected` or `PATH: refused ERROR`.
const CONNECT_ALL_PY: &str = r#"
import socket, sys
for path in sys.argv[1:]:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        s = socket.socket(socket.AF_UNIX, kind)
        try:
            s.connect(path)
            print(path + ": connected")
            break
        except OSError as e:
            err = type(e).__name__
        finally:
            s.close()
    else:
        print(path + ": refused " + err)
"#;

/// Looks for a neighbouring unit's environment value and argv (markers built at run time,
/// so that this probe's own command line does not hold them) in every process's environ
/// and cmdline, under /run and the cgroup tree, and through systemd's bus; and counts what
/// the cgroup tree shows.
const NEIGHBOUR_PY: &str = r#"
import glob, os, subprocess, sys
marks = ["zz-" + "env-77", "zz-" + "argv-88"]
hits = []
def look(path, data):
    if any(m in data for m in marks):
        hits.append(path)
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        look(path, open(path, "rb").read().decode(errors="replace"))
    except OSError:
        pass
for root in ("/run", "/sys/fs/cgroup"):
    for d, _, files in os.walk(root):
        for f in files:
            try:
                look(os.path.join(d, f), open(os.path.join(d, f), "rb").read(1 << 20).decode(errors="replace"))
            except OSError:
                pass
try:
    shown = subprocess.run(["systemctl", "show", "-p", "Environment", "-p", "ExecStart", sys.argv[1]],
                           capture_output=True, text=True, timeout=10).stdout
    look("systemctl", shown)
except Exception:
    pass
print("hits", hits)
print("cgroup", len(os.listdir("/sys/fs/cgroup")) if os.path.isdir("/sys/fs/cgroup") else 0)
"#;

/// The host endpoints a unit must not reach.
const HOST_ENDPOINTS: [&str; 7] = [
    "/run/dbus/system_bus_socket",
    "/var/run/dbus/system_bus_socket",
    "/run/systemd/journal/stdout",
    "/run/systemd/journal/socket",
    "/dev/log",
    "/run/systemd/notify",
    "/run/systemd/private",
];

mod checks {
    use super::*;

    /// LD_PRELOAD, LD_AUDIT and LD_LIBRARY_PATH pointing at a hostile library: whatever it
    /// runs, it runs inside every restriction of the unit (nothing before them).
    pub fn loader_variables_run_nothing_outside_the_restrictions(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, with_home())? else {
            return Ok(());
        };
        let home = h.client.home.clone();
        let bashrc = h.host_path(&home.join(".bashrc"));
        std::fs::write(&bashrc, "# rc\n")?;
        std::os::unix::fs::chown(&bashrc, Some(h.client.uid), Some(h.client.gid))?;
        // The hostile library, built where the client can read it.
        let work = h.host_path(&h.workdir);
        std::fs::write(work.join("hostile.c"), HOSTILE_C)?;
        std::fs::create_dir_all(work.join("libs"))?;
        let built = std::process::Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(work.join("hostile.so"))
            .arg(work.join("hostile.c"))
            .output()?;
        assert!(built.status.success(), "gcc: {}", text(&built.stderr));
        // Shadowing a library wardend itself loads (libm), for LD_LIBRARY_PATH.
        std::fs::copy(work.join("hostile.so"), work.join("libs/libm.so.6"))?;
        let (target, _unit) =
            spawn_unit(&h, &["--", "sleep", "120"], &["PROBE_SECRET=s3cr3t-target"])?;
        let target_pid = inner_pid(target.client_pid().ok_or("client not found")?)?;
        let lib = h.workdir.join("hostile.so").display().to_string();
        let libs = h.workdir.join("libs").display().to_string();
        for (var, must_run) in [
            (format!("LD_PRELOAD={lib}"), true),
            (format!("LD_AUDIT={lib}"), true),
            (format!("LD_LIBRARY_PATH={libs}"), false),
        ] {
            let result = h.workdir.join("result");
            let _ = std::fs::remove_file(h.host_path(&result));
            let env = [
                var.clone(),
                format!("WARDEN_TEST_TARGET={target_pid}"),
                format!("WARDEN_TEST_HOME={}", home.display()),
                format!("WARDEN_TEST_RESULT={}", result.display()),
            ];
            let mut args = vec!["run"];
            for e in &env {
                args.extend(["--env", e.as_str()]);
            }
            args.extend(["--", "true"]);
            let out = h.warden_client(&args, &[]).output()?;
            let said = std::fs::read_to_string(h.host_path(&result)).unwrap_or_default();
            for line in said.lines() {
                for field in ["environ", "key", "bashrc", "mem", "kill"] {
                    assert!(
                        line.contains(&format!("{field}=denied")),
                        "{var}: {field} escaped: {line}\n{}",
                        describe(&out)
                    );
                }
            }
            if must_run {
                assert!(
                    !said.is_empty(),
                    "{var}: the library never ran: {}",
                    describe(&out)
                );
            }
        }
        assert_eq!(std::fs::read_to_string(&bashrc)?, "# rc\n");
        let mut target = target;
        assert!(
            target.child()?.try_wait()?.is_none(),
            "the other client was killed"
        );
        Ok(())
    }

    /// From inside a unit: no bus, journal, notify or service-manager socket; nothing of a
    /// neighbouring unit (environment, argv, spec); no process outside its own.
    pub fn no_bus_journal_notify_socket_neighbour_or_foreign_pid(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, Options::default())? else {
            return Ok(());
        };
        if kind == Kind::Systemd {
            // A real host has the bus and the journal listening: so shall the container.
            for socket in ["dbus.socket", "systemd-journald.socket"] {
                h.exec_root(&["systemctl", "start", socket])?;
            }
            let mut args = vec!["python3", "-c", CONNECT_ALL_PY];
            args.extend(["/run/dbus/system_bus_socket", "/run/systemd/journal/stdout"]);
            let control = text(&h.as_client(&args, &[]).output()?.stdout);
            assert_eq!(
                control.matches(": connected").count(),
                2,
                "control: {control}"
            );
        }
        let out = py(&h, &[], CONNECT_ALL_PY, &HOST_ENDPOINTS)?;
        let said = text(&out.stdout);
        assert_eq!(
            said.lines().count(),
            HOST_ENDPOINTS.len(),
            "{}",
            describe(&out)
        );
        assert!(!said.contains(": connected"), "{}", describe(&out));
        // A neighbour with a value in its environment and its argv.
        let (neighbour, unit) = spawn_unit(
            &h,
            &["--", "sh", "-c", "sleep 60", "zz-argv-88"],
            &["NEIGHBOUR_VALUE=zz-env-77"],
        )?;
        let out = py(&h, &[], NEIGHBOUR_PY, &[&unit])?;
        let said = text(&out.stdout);
        assert_eq!(said, "hits []\ncgroup 0\n", "{}", describe(&out));
        // And no process of the host: every process listed is in the unit's own cgroup.
        let out = py(
            &h,
            &[],
            "import os\nown = open('/proc/self/cgroup').read()\n\
             print([p for p in os.listdir('/proc') if p.isdigit() and \
             open(f'/proc/{p}/cgroup').read() != own])",
            &[],
        )?;
        assert_eq!(text(&out.stdout), "[]\n", "{}", describe(&out));
        drop(neighbour);
        Ok(())
    }

    /// User namespaces, io_uring and exotic personalities are refused on both backends.
    pub fn namespaces_io_uring_and_personality_are_refused(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, Options::default())? else {
            return Ok(());
        };
        let out = run(&h, &["--", "unshare", "-Ur", "true"])?;
        assert_ne!(
            out.status.code(),
            Some(0),
            "unshare -Ur: {}",
            describe(&out)
        );
        let probe = r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
r = libc.syscall(425, 8, params)  # io_uring_setup
print("io_uring", "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()])
r = libc.personality(ctypes.c_ulong(0x0400000))  # READ_IMPLIES_EXEC
print("personality", "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()])
r = libc.personality(ctypes.c_ulong(0xffffffff))  # query
print("query", "ok" if r >= 0 else "failed")
"#;
        let out = py(&h, &[], probe, &[])?;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let said = text(&out.stdout);
        assert!(
            said.contains("io_uring EPERM") || said.contains("io_uring ENOSYS"),
            "{said}"
        );
        assert!(said.contains("personality EPERM"), "{said}");
        assert!(said.contains("query ok"), "{said}");
        Ok(())
    }

    /// `sh -c '(trap "" TERM; sleep 100) & exit 0'`: the command's own exit (0), at once,
    /// and nothing of the unit left.
    pub fn a_child_left_behind_does_not_change_the_exit(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, Options::default())? else {
            return Ok(());
        };
        let t0 = Instant::now();
        let out = run(
            &h,
            &[
                "--report",
                "json",
                "--",
                "sh",
                "-c",
                "(trap '' TERM; sleep 100) & exit 0",
            ],
        )?;
        let took = t0.elapsed();
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let err = text(&out.stderr);
        assert!(err.contains("\"reason\":\"exited\""), "{err}");
        assert!(took < scaled(Duration::from_secs(5)), "took {took:?}");
        assert!(
            Harness::wait_for(Duration::from_secs(2), || h.unit_processes().is_empty()).is_some(),
            "processes left: {:?}",
            h.unit_processes()
        );
        Ok(())
    }
}

/// systemd only: strings with newlines, `%`, quotes and backslashes in the working
/// directory and the environment survive a `daemon-reload` unchanged in meaning: no extra
/// directive, the unit still loaded and stoppable, the marker command never run; a
/// working directory with a newline is refused with a clear message.
#[test]
fn unit_files_survive_daemon_reload_with_hostile_strings() -> Result<()> {
    if !can_run("unit file injection") {
        return Ok(());
    }
    let h = Harness::start_with(Kind::Systemd, &[], Options::default())?;
    let marker = PathBuf::from(format!("/srv/{}-ROOTPWN", h.prefix));
    let m = marker.display().to_string();
    let injection = format!("\n[Service]\nExecStopPost=+/bin/touch {m}\n");
    // A cwd with a newline: refused (native would run it: it never hands a path to anyone).
    let newline_dir = h.workdir.join(format!("a{injection}b"));
    std::fs::create_dir_all(h.host_path(&newline_dir))?;
    std::os::unix::fs::chown(h.host_path(&newline_dir), Some(65534), Some(65534))?;
    let out = h
        .warden_client_in(&newline_dir, &["run", "--", "true"], &[])
        .output()?;
    assert_eq!(out.status.code(), Some(125), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("control character"),
        "{}",
        describe(&out)
    );
    // Double quotes and backslashes: systemd 252 would read them back as another path.
    for odd in [r#"with "quotes""#, r"with\backslash"] {
        let dir = h.workdir.join(odd);
        std::fs::create_dir_all(h.host_path(&dir))?;
        let out = h
            .warden_client_in(&dir, &["run", "--", "true"], &[])
            .output()?;
        assert_eq!(out.status.code(), Some(125), "{odd}: {}", describe(&out));
        assert!(
            text(&out.stderr).contains("which systemd cannot keep in a unit file"),
            "{odd}: {}",
            describe(&out)
        );
    }
    // A cwd with %, single quotes and spaces, and an environment value carrying the
    // injection, quotes and backslashes: runs, and survives a reload.
    let odd_dir = h.workdir.join("p%h%i 'r' s");
    std::fs::create_dir(h.host_path(&odd_dir))?;
    std::os::unix::fs::chown(h.host_path(&odd_dir), Some(65534), Some(65534))?;
    let before = h.units()?;
    let value = format!("VALUE=v{injection}%h\"'\\");
    let bg = Background {
        child: Some(
            h.warden_client_in(
                &odd_dir,
                &[
                    "run",
                    "--env",
                    &value,
                    "--",
                    "sh",
                    "-c",
                    "echo $VALUE > seen; sleep 60",
                ],
                &[],
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?,
        ),
    };
    let unit = h.wait_new_unit(&before)?;
    let rw_before = unit_property(&h, &unit, "ReadWritePaths")?;
    h.exec_root(&["systemctl", "daemon-reload"])?;
    for (prop, expected) in [("LoadState", "loaded"), ("ActiveState", "active")] {
        assert_eq!(
            unit_property(&h, &unit, prop)?,
            expected,
            "{prop} after reload"
        );
    }
    assert_eq!(unit_property(&h, &unit, "ReadWritePaths")?, rw_before);
    let cat = text(&h.exec_root(&["systemctl", "cat", &unit])?.stdout);
    assert!(
        !cat.contains("ExecStopPost") && !cat.contains("ROOTPWN"),
        "{cat}"
    );
    assert!(
        !cat.contains("VALUE"),
        "the environment is in the unit file:\n{cat}"
    );
    // The lifeline came through the reload too: a new unit (bound to it) still starts.
    let out = h.warden_client(&["run", "--", "true"], &[]).output()?;
    assert_eq!(
        out.status.code(),
        Some(0),
        "after reload: {}",
        describe(&out)
    );
    // It ran where it was asked to, with the value verbatim.
    assert!(Harness::wait_for(Duration::from_secs(5), || h
        .host_path(&odd_dir.join("seen"))
        .exists())
    .is_some());
    // Stoppable: the client goes, the unit goes; the marker never appears.
    drop(bg);
    let gone = Harness::wait_for(Duration::from_secs(10), || {
        h.units().is_ok_and(|u| !u.contains(&unit))
    });
    assert!(gone.is_some(), "{unit} not stopped after reload");
    assert!(!h.host_path(&marker).exists(), "the injected command ran");
    assert!(!h.host_path(Path::new("/ROOTPWN")).exists());
    Ok(())
}
