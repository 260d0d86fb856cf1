//! The escape suite of issue 7: a hostile command against the filesystem view, the secret
//! lists, the host's sockets, the default bounds and the daemon's death — each case a real
//! attack run as the client account, against both backends (native on this host, systemd
//! in a throwaway container).
//!
//! Needs root (and, for systemd, systemd-nspawn); git for the repository case. Under
//! `CI=true` a missing piece fails.

#[macro_use]
mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::attack::*;
use support::harness::{
    is_live, native_unit_cgroups, scaled, Harness, Kind, Options, Result, FAKE_KEY,
};

per_backend!(
    host_and_kernel_directories_as_cwd_expose_nothing,
    kernel_filesystems_mounted_in_the_project_are_covered,
    hidden_paths_behind_symlinks_and_bind_mounts_stay_hidden,
    protected_paths_stay_read_only_and_git_still_works,
    secret_files_and_variables_are_absent,
    host_unix_sockets_are_unreachable,
    the_default_profile_is_bounded,
    a_fork_bomb_leaves_other_clients_fast,
    killing_wardend_ends_every_unit_within_a_second,
    no_answer_depends_on_what_only_root_can_see,
);

/// The secret line of the fake key in the client's `~/.ssh/id_ed25519`.
fn key_secret() -> Result<&'static str> {
    Ok(FAKE_KEY.lines().nth(1).ok_or("fake key")?)
}

/// Write `text` to `path` (as the daemon sees it), owned by the client, mode 600.
fn client_file(h: &Harness, path: &Path, text: &str) -> Result<()> {
    let host = h.host_path(path);
    if let Some(dir) = host.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&host, text)?;
    std::os::unix::fs::chown(&host, Some(h.client.uid), Some(h.client.gid))?;
    std::fs::set_permissions(&host, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(())
}

/// Run `argv` as the client where the daemon runs, outside any unit; fail if it fails.
fn client_sh(h: &Harness, script: &str) -> Result<String> {
    let out = h.as_client(&["sh", "-c", script], &[]).output()?;
    if !out.status.success() {
        return Err(format!("{script}: {}", describe(&out)).into());
    }
    Ok(text(&out.stdout))
}

/// What a command sees from its working directory: processes outside its unit, the
/// client's and wardend's /proc entries, the hidden key, and where it could write.
const CWD_PROBE: &str = r#"
import json, os, sys
client, wardend, home, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
own = open("/proc/self/cgroup").read()
r = {"foreign": []}
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if open(f"/proc/{p}/cgroup").read() != own:
                r["foreign"].append(int(p))
        except OSError:
            pass
for who, pid in (("client", client), ("wardend", wardend)):
    for what in ("environ", "mem"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                data = f.read(65536) if what == "environ" else b"opened"
            r[f"{who}_{what}"] = "secret" if b"s3cr3t-77" in data else "read"
        except OSError:
            r[f"{who}_{what}"] = "denied"
    try:
        key = open(f"/proc/{pid}/root{home}/.ssh/id_ed25519").read()
        r[f"{who}_root_key"] = "read" if "fake-key" in key else "other"
    except OSError:
        r[f"{who}_root_key"] = "denied"
for name, path in (("key", home + "/.ssh/id_ed25519"), ("key_here", ".ssh/id_ed25519")):
    try:
        r[name] = "read" if "fake-key" in open(path).read() else "other"
    except OSError:
        r[name] = "denied"
r["wrote"] = []
for d in (".", home):
    try:
        with open(os.path.join(d, tag), "w") as f:
            f.write("x")
        r["wrote"].append(d)
    except OSError:
        pass
print(json.dumps(r))
"#;

/// Connect to each Unix socket path in argv; print `PATH: got ...` or `PATH: refused`.
const CONNECT_UNIX_PY: &str = r#"
import socket, sys
for path in sys.argv[1:]:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(3)
        s.connect(path)
        print(path + ": got " + s.recv(100).decode())
    except OSError as e:
        print(path + ": refused " + type(e).__name__)
"#;

/// Listen on each path in argv, answer every connection with "host-socket"; print
/// "listening" once all are bound.
const LISTEN_UNIX_PY: &str = r#"
import os, select, socket, sys, time
socks = []
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    os.chmod(path, 0o777)
    s.listen(16)
    socks.append(s)
print("listening", flush=True)
end = time.time() + 60
while time.time() < end:
    ready, _, _ = select.select(socks, [], [], 0.2)
    for s in ready:
        c, _ = s.accept()
        c.sendall(b"host-socket")
        c.close()
"#;

/// The documented default memory limit: half of RAM, rounded down to MiB.
fn documented_default_memory() -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or("no MemTotal")?
        .parse()?;
    Ok((kib * 1024 / 2) & !((1 << 20) - 1))
}

/// A native unit's cgroup file `name`, from whichever hierarchy has it.
fn native_cgroup_file(h: &Harness, unit: &str, names: &[&str]) -> Option<String> {
    let slice = format!("{}.slice", h.prefix);
    let roots = std::fs::read_dir("/sys/fs/cgroup").ok()?;
    let mut dirs: Vec<PathBuf> = roots
        .flatten()
        .map(|e| e.path().join(&slice).join(unit))
        .collect();
    dirs.push(PathBuf::from("/sys/fs/cgroup").join(&slice).join(unit));
    dirs.iter().find_map(|d| {
        names
            .iter()
            .find_map(|n| std::fs::read_to_string(d.join(n)).ok())
            .map(|s| s.trim().to_string())
    })
}

mod checks {
    use super::*;

    /// cwd `/`, `/proc`, `/sys`, `/dev`, `/run`, the home and its parent, each also reached
    /// through a symlink an earlier unit planted in the project.
    pub fn host_and_kernel_directories_as_cwd_expose_nothing(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, with_home())? else {
            return Ok(());
        };
        // Another client (same uid), a secret in its environment.
        let (target, _unit) = spawn_unit(
            &h,
            &["--", "sleep", "120"],
            &["PROBE_SECRET_VALUE=s3cr3t-77"],
        )?;
        let client = inner_pid(target.client_pid().ok_or("client not found")?)?.to_string();
        let wardend = inner_pid(h.daemon_pid().ok_or("wardend not found")?)?.to_string();
        let home = h.client.home.clone();
        let parent = home.parent().ok_or("home has no parent")?.to_path_buf();
        let targets: Vec<(PathBuf, bool)> = [
            ("/", false),
            ("/proc", true),
            ("/sys", true),
            ("/dev", true),
            ("/run", true),
        ]
        .into_iter()
        .map(|(p, refused)| (PathBuf::from(p), refused))
        .chain([(home.clone(), false), (parent, false)])
        .collect();
        // An earlier unit plants a symlink to each in the project.
        let plant: String = targets
            .iter()
            .enumerate()
            .map(|(i, (t, _))| format!("ln -s '{}' link{i} && ", t.display()))
            .collect::<String>()
            + "true";
        let out = sh(&h, &[], &plant)?;
        assert_eq!(out.status.code(), Some(0), "planting: {}", describe(&out));
        let tag = format!("warden-probe-{}", h.prefix);
        let home_s = home.display().to_string();
        for (i, (t, refused)) in targets.iter().enumerate() {
            for cwd in [t.clone(), h.workdir.join(format!("link{i}"))] {
                let out = h
                    .warden_client_in(
                        &cwd,
                        &[
                            "run", "--", "python3", "-c", CWD_PROBE, &client, &wardend, &home_s,
                            &tag,
                        ],
                        &[],
                    )
                    .output()?;
                let what = format!("cwd {} ({})", cwd.display(), t.display());
                if *refused {
                    assert_eq!(out.status.code(), Some(125), "{what}: {}", describe(&out));
                    let err = text(&out.stderr);
                    assert!(
                        err.starts_with(&format!("refused: working directory {}", t.display()))
                            && err.contains("project directory"),
                        "{what}: {err}"
                    );
                    continue;
                }
                assert_eq!(out.status.code(), Some(0), "{what}: {}", describe(&out));
                let r: serde_json::Value = serde_json::from_slice(&out.stdout)?;
                let get = |k: &str| r[k].as_str().unwrap_or("?").to_string();
                assert_eq!(r["foreign"], serde_json::json!([]), "{what}: {r}");
                for who in ["client", "wardend"] {
                    assert_eq!(get(&format!("{who}_environ")), "denied", "{what}: {r}");
                    assert_eq!(get(&format!("{who}_mem")), "denied", "{what}: {r}");
                    assert_eq!(get(&format!("{who}_root_key")), "denied", "{what}: {r}");
                }
                assert_ne!(get("key"), "read", "{what}: {r}");
                assert_ne!(get("key_here"), "read", "{what}: {r}");
                assert_eq!(r["wrote"], serde_json::json!([]), "{what}: {r}");
                for d in [t.as_path(), home.as_path()] {
                    let landed = h.host_path(&d.join(&tag));
                    assert!(!landed.exists(), "{what}: {} was written", landed.display());
                }
            }
        }
        drop(target);
        Ok(())
    }

    /// A proc mounted inside the working directory (a chroot in the project, say) does not
    /// come into the unit with the directory: the unit sees its mount point empty.
    pub fn kernel_filesystems_mounted_in_the_project_are_covered(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, Options::default())? else {
            return Ok(());
        };
        let proc_dir = h.workdir.join("chroot/proc");
        let p = proc_dir.display().to_string();
        let _undo = Undo {
            h: &h,
            steps: vec![vec!["umount".into(), "-l".into(), p.clone()]],
        };
        h.exec_root(&["mkdir", "-p", &p])?;
        h.exec_root(&["mount", "-t", "proc", "proc", &p])?;
        let control = client_sh(&h, "ls chroot/proc | grep -c '^[0-9]'")?;
        assert!(control.trim().parse::<u32>()? > 0, "control: {control}");
        let out = sh(
            &h,
            &[],
            "ls -A chroot/proc | wc -l; cat chroot/proc/1/cmdline; true",
        )?;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert_eq!(text(&out.stdout).trim(), "0", "{}", describe(&out));
        Ok(())
    }

    /// `~/.aws` an absolute symlink (dotfiles), `~/.kube` a relative one, the home itself a
    /// symlink, the key directory bound elsewhere, wardend's socket directory behind a
    /// symlink: still hidden.
    pub fn hidden_paths_behind_symlinks_and_bind_mounts_stay_hidden(kind: Kind) -> Result<()> {
        let opts = Options {
            client_home: true,
            home_via_symlink: true,
            socket_via_symlink: true,
            ..Options::default()
        };
        let Some(h) = harness(kind, opts)? else {
            return Ok(());
        };
        let home = h.client.home.clone();
        let real = PathBuf::from(format!("/srv/{}-realhome", h.prefix));
        client_file(
            &h,
            &real.join("dotfiles/aws/credentials"),
            "aws-secret-1f2e",
        )?;
        client_file(&h, &real.join("dotfiles/kube/config"), "kube-secret-3a4b")?;
        std::os::unix::fs::symlink(home.join("dotfiles/aws"), h.host_path(&real.join(".aws")))?;
        std::os::unix::fs::symlink("dotfiles/kube", h.host_path(&real.join(".kube")))?;
        // The key directory, bound at a second place.
        let alias = PathBuf::from(format!("/srv/{}-alias", h.prefix));
        let (alias_s, ssh_s) = (
            alias.display().to_string(),
            real.join(".ssh").display().to_string(),
        );
        let _undo = Undo {
            h: &h,
            steps: vec![
                vec!["umount".into(), "-l".into(), alias_s.clone()],
                vec!["rmdir".into(), alias_s.clone()],
            ],
        };
        h.exec_root(&["mkdir", "-p", &alias_s])?;
        h.exec_root(&["mount", "--bind", &ssh_s, &alias_s])?;
        // Outside a unit, every secret is readable by the client.
        let secrets = [
            (
                format!("{}/.aws/credentials", home.display()),
                "aws-secret-1f2e",
            ),
            (
                format!("{}/.kube/config", home.display()),
                "kube-secret-3a4b",
            ),
            (format!("{}/.ssh/id_ed25519", home.display()), key_secret()?),
            (format!("{}/.ssh/id_ed25519", real.display()), key_secret()?),
            (format!("{alias_s}/id_ed25519"), key_secret()?),
        ];
        for (path, secret) in &secrets {
            let seen = client_sh(&h, &format!("cat '{path}'"))?;
            assert!(seen.contains(secret), "control {path}: {seen}");
        }
        // Inside one, from the project and from the home (through its symlink), none.
        for cwd in [h.workdir.clone(), home.clone()] {
            for (path, secret) in &secrets {
                let out = h
                    .warden_client_in(&cwd, &["run", "--", "cat", path], &[])
                    .output()?;
                assert!(
                    !text(&out.stdout).contains(secret) && !text(&out.stderr).contains(secret),
                    "cwd {}: {path} leaked: {}",
                    cwd.display(),
                    describe(&out)
                );
            }
        }
        // On native the dotfiles symlinks themselves are covered too: they do not even say
        // where the credentials are (systemd's InaccessiblePaths follows a symlink, and
        // covers its target only).
        if kind == Kind::Native {
            let out = sh(&h, &[], "readlink \"$HOME/.aws\" \"$HOME/.kube\"; true")?;
            assert!(
                !text(&out.stdout).contains("dotfiles"),
                "{}",
                describe(&out)
            );
        }
        // A hidden file inside a writable directory (the cache): its directory cannot be
        // renamed away to a name no later unit would hide.
        let token = real.join(".cache/huggingface/token");
        client_file(&h, &token, "hf-secret-5d6c")?;
        let out = sh(
            &h,
            &[],
            "mv \"$HOME/.cache/huggingface\" \"$HOME/.cache/hf2\"",
        )?;
        assert_ne!(out.status.code(), Some(0), "{}", describe(&out));
        let out = sh(
            &h,
            &[],
            "cat \"$HOME/.cache/huggingface/token\" \"$HOME/.cache/hf2/token\"",
        )?;
        assert!(
            !text(&out.stdout).contains("hf-secret"),
            "{}",
            describe(&out)
        );
        assert!(h.host_path(&token).exists(), "the token was moved");
        // The home, reached through its symlink, is read-only.
        let out = h
            .warden_client_in(&home, &["run", "--", "sh", "-c", "echo x > written"], &[])
            .output()?;
        assert_ne!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(!h.host_path(&real.join("written")).exists());
        // wardend's socket directory: empty and unconnectable by either path.
        let dir = format!("/srv/{}-sock", h.prefix);
        let out = sh(&h, &[], &format!("ls -A {dir}/real {dir}/link/; echo end"))?;
        assert!(
            !text(&out.stdout).contains("warden.sock"),
            "{}",
            describe(&out)
        );
        let out = py(
            &h,
            &[],
            CONNECT_UNIX_PY,
            &[
                &format!("{dir}/link/warden.sock"),
                &format!("{dir}/real/warden.sock"),
            ],
        )?;
        assert!(!text(&out.stdout).contains(": got"), "{}", describe(&out));
        assert_eq!(
            text(&out.stdout).matches(": refused").count(),
            2,
            "{}",
            describe(&out)
        );
        Ok(())
    }

    /// A unit cannot write a repository's hooks, config or other protected paths (nor
    /// rename `.git` away to replace it), so the client's next `git commit` outside warden
    /// runs nothing a unit wrote; git itself still works inside a unit.
    pub fn protected_paths_stay_read_only_and_git_still_works(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, with_home())? else {
            return Ok(());
        };
        let marker = h.workdir.join("PWNED");
        let m = marker.display().to_string();
        // The project is a shared mount (as every mount is where systemd is PID 1): nothing
        // a unit mounts inside its copy (pins, covers) may propagate back here.
        let wd = h.workdir.display().to_string();
        let _undo = Undo {
            h: &h,
            steps: vec![vec!["umount".into(), "-l".into(), wd.clone()]],
        };
        h.exec_root(&["mount", "--bind", &wd, &wd])?;
        h.exec_root(&["mount", "--make-shared", &wd])?;
        let gitconfig = h.client.home.join(".gitconfig");
        client_file(
            &h,
            &gitconfig,
            "[user]\n\tname = t\n\temail = t@example.com\n",
        )?;
        client_sh(
            &h,
            "git init -q -b main . && echo a > f && git add f && git commit -qm one && \
             git clone -q --bare . remote.git && \
             mkdir .vscode && echo '{}' > .vscode/settings.json && echo 'export A=1' > .envrc && \
             echo '# rc' > .bashrc && rm -rf .git/hooks && \
             mkdir sub && cd sub && git init -q -b main . && mkdir -p .git/hooks",
        )?;
        let attacks = [
            format!("printf '#!/bin/sh\\ntouch {m}\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit"),
            format!("git config core.fsmonitor 'touch {m}'"),
            "git config core.hooksPath evil".to_string(),
            format!("printf '[core]\\n\\tfsmonitor = touch {m}\\n' >> .git/config"),
            "rm -rf .git/hooks".to_string(),
            "mv .git/hooks .git/hooks-old".to_string(),
            "mv .git .git-old".to_string(),
            "echo 'touch x' >> .envrc".to_string(),
            "echo '{}' > .vscode/tasks.json".to_string(),
            "rm -rf .vscode".to_string(),
            "echo 'touch x' >> .bashrc".to_string(),
            format!("printf '#!/bin/sh\\ntouch {m}\\n' > sub/.git/hooks/pre-commit"),
        ];
        for attack in &attacks {
            let out = sh(&h, &[], attack)?;
            assert_ne!(out.status.code(), Some(0), "{attack}: {}", describe(&out));
        }
        // Git works inside a unit: status, branch, commit, fetch from a local remote.
        let out = sh(
            &h,
            &[],
            "git status --short && git checkout -q -b feature && echo b > g && git add g && \
             git commit -qm two && git branch --list && git fetch -q ./remote.git main && \
             git log --oneline | wc -l",
        )?;
        assert_eq!(
            out.status.code(),
            Some(0),
            "git in a unit: {}",
            describe(&out)
        );
        let said = text(&out.stdout);
        assert!(
            said.contains("* feature") && said.trim_end().ends_with('2'),
            "{said}"
        );
        // The client's own git, outside any unit, runs nothing a unit wrote.
        client_sh(
            &h,
            "git commit -q --allow-empty -m three && git status --short >/dev/null",
        )?;
        client_sh(&h, "cd sub && git commit -q --allow-empty -m one")?;
        assert!(!h.host_path(&marker).exists(), "a hook or fsmonitor ran");
        let hooks = h.host_path(&h.workdir.join(".git/hooks"));
        assert!(hooks.is_dir(), "the missing hooks directory was made");
        assert_eq!(std::fs::read_dir(&hooks)?.count(), 0, "hooks were written");
        let config = std::fs::read_to_string(h.host_path(&h.workdir.join(".git/config")))?;
        assert!(
            !config.contains("fsmonitor") && !config.contains("hooksPath"),
            "{config}"
        );
        assert_eq!(
            std::fs::read_to_string(h.host_path(&h.workdir.join(".envrc")))?,
            "export A=1\n"
        );
        assert!(!h.host_path(&h.workdir.join(".vscode/tasks.json")).exists());
        let table = text(&h.exec_root(&["cat", "/proc/self/mountinfo"])?.stdout);
        let here: Vec<&str> = table
            .lines()
            .filter(|l| {
                l.split(' ')
                    .nth(4)
                    .is_some_and(|p| p.starts_with(wd.as_str()))
            })
            .collect();
        assert_eq!(
            here.len(),
            1,
            "mounts leaked out of units:\n{}",
            here.join("\n")
        );
        Ok(())
    }

    /// Every listed secret file and variable class is absent; `--env` of a denied name is
    /// refused with the name.
    pub fn secret_files_and_variables_are_absent(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, with_home())? else {
            return Ok(());
        };
        let files = [
            ".npmrc",
            ".pypirc",
            ".pgpass",
            ".cargo/credentials.toml",
            ".vault-token",
            ".bash_history",
            ".zsh_history",
            ".config/gcloud/credentials.db",
            ".azure/accessTokens.json",
            ".config/rclone/rclone.conf",
            ".claude/.credentials.json",
            ".codex/auth.json",
            ".aws/credentials",
            ".docker/config.json",
            ".kube/config",
            ".netrc",
            ".git-credentials",
            ".config/gh/hosts.yml",
            ".my.cnf",
            ".gnupg/private-keys-v1.d/key",
        ];
        let home = h.client.home.clone();
        for (i, f) in files.iter().enumerate() {
            client_file(&h, &home.join(f), &format!("file-secret-{i}-c0ffee"))?;
        }
        let cat: Vec<String> = files
            .iter()
            .map(|f| format!("cat \"$HOME/{f}\" 2>/dev/null; "))
            .collect();
        let script = cat.concat() + "true";
        let control = client_sh(&h, &script)?;
        assert_eq!(
            control.matches("c0ffee").count(),
            files.len(),
            "control: {control}"
        );
        let out = sh(&h, &[], &script)?;
        assert!(!text(&out.stdout).contains("c0ffee"), "{}", describe(&out));
        // Variables, by class and by value.
        let secret_vars = [
            "PGPASSWORD=v",
            "MYSQL_PWD=v",
            "GITHUB_PAT=v",
            "DATABASE_URL=postgres://app:hunter2@db/app",
            "github_token=v",
            "OPENAI_KEY=v",
            "STRIPE_KEY=v",
            "SECRET_KEY_BASE=v",
            "SLACK_WEBHOOK_URL=https://hooks.example/x",
            "SENTRY_DSN=https://k@sentry.example/1",
            "DOCKER_AUTH_CONFIG={}",
            "AWS_SECRET_ACCESS_KEY=v",
            "NPM_TOKEN=v",
            "MY_PASSWORD=v",
            "ANTHROPIC_API_KEY=v",
        ];
        let harmless = [
            "KEEP=1",
            "TOKENIZERS_PARALLELISM=false",
            "AWS_REGION=eu-west-1",
        ];
        let env: Vec<&str> = secret_vars.iter().chain(&harmless).copied().collect();
        let out = h.warden_client(&["run", "--", "env"], &env).output()?;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let seen = text(&out.stdout);
        let names: Vec<&str> = seen.lines().filter_map(|l| l.split('=').next()).collect();
        for var in secret_vars {
            let name = var.split('=').next().unwrap_or_default();
            assert!(!names.contains(&name), "{name} passed:\n{seen}");
        }
        for var in harmless {
            assert!(seen.lines().any(|l| l == var), "{var} was removed:\n{seen}");
        }
        // Asked for by name: refused, with the name; nothing runs.
        for var in [
            "PGPASSWORD=x",
            "github_token=x",
            "DATABASE_URL=mysql://u:p@h/d",
        ] {
            let name = var.split('=').next().unwrap_or_default();
            let out = run(&h, &["--env", var, "--", "touch", "ran"])?;
            assert_eq!(out.status.code(), Some(125), "{var}: {}", describe(&out));
            assert!(
                text(&out.stderr).starts_with(&format!("refused: environment variable {name}:")),
                "{var}: {}",
                describe(&out)
            );
            assert!(!h.host_path(&h.workdir.join("ran")).exists());
        }
        Ok(())
    }

    /// 0777 sockets of the host under /var/tmp, /run and the home: unreachable under
    /// `none` and `loopback`.
    pub fn host_unix_sockets_are_unreachable(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, with_home())? else {
            return Ok(());
        };
        let name = format!("{}.sock", h.prefix);
        let var_tmp = format!("/var/tmp/{name}");
        let run_dir = format!("/run/{name}");
        let home = format!("{}/{name}", h.client.home.display());
        let _undo = Undo {
            h: &h,
            steps: vec![vec![
                "rm".into(),
                "-f".into(),
                var_tmp.clone(),
                run_dir.clone(),
                home.clone(),
            ]],
        };
        // Root's socket in /run, the client's own in /var/tmp and in its home.
        let mut root_listener = Listener(
            h.command(&["python3", "-c", LISTEN_UNIX_PY, &run_dir])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()?,
        );
        let mut client_listener = Listener(
            h.as_client(&["python3", "-c", LISTEN_UNIX_PY, &var_tmp, &home], &[])
                .stdout(Stdio::piped())
                .spawn()?,
        );
        for l in [&mut root_listener, &mut client_listener] {
            let mut line = String::new();
            BufReader::new(l.0.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
            assert_eq!(line, "listening\n");
        }
        let paths = [var_tmp.as_str(), run_dir.as_str(), home.as_str()];
        let mut args = vec!["python3", "-c", CONNECT_UNIX_PY];
        args.extend(paths);
        let control = text(&h.as_client(&args, &[]).output()?.stdout);
        assert_eq!(
            control.matches(": got host-socket").count(),
            3,
            "control: {control}"
        );
        for flags in [&["--network", "none"][..], &[][..]] {
            let out = py(&h, flags, CONNECT_UNIX_PY, &paths)?;
            let said = text(&out.stdout);
            assert!(
                !said.contains("host-socket"),
                "{flags:?}: {}",
                describe(&out)
            );
            assert_eq!(
                said.matches(": refused").count(),
                3,
                "{flags:?}: {}",
                describe(&out)
            );
        }
        Ok(())
    }

    /// The default profile has a memory limit (half of RAM, as documented) and its tmpfs
    /// filesystems are sized within it; a unit filling one stops at its limit.
    pub fn the_default_profile_is_bounded(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, Options::default())? else {
            return Ok(());
        };
        let limit = documented_default_memory()?;
        let (bg, unit) = spawn_unit(&h, &["--", "sleep", "30"], &[])?;
        let (memory, weight) = match kind {
            Kind::Native => (
                native_cgroup_file(&h, &unit, &["memory.max", "memory.limit_in_bytes"]),
                native_cgroup_file(&h, &unit, &["cpu.weight", "cpu.shares"]),
            ),
            Kind::Systemd => (
                Some(unit_property(&h, &unit, "MemoryMax")?),
                Some(unit_property(&h, &unit, "CPUWeight")?),
            ),
        };
        assert_eq!(memory, Some(limit.to_string()), "memory limit of {unit}");
        // CPU weight 50: half the daemon's (v2 weight 50, v1 shares 512).
        assert!(
            matches!(weight.as_deref(), Some("50") | Some("512")),
            "cpu weight of {unit}: {weight:?}"
        );
        drop(bg);
        // The unit's memory filesystems are no larger than its limit (systemd's private /tmp
        // is on the host's /tmp filesystem, not memory: /dev/shm and /run there).
        let dirs = match kind {
            Kind::Native => vec!["/tmp", "/var/tmp", "/dev/shm", "/run"],
            Kind::Systemd => vec!["/dev/shm", "/run"],
        };
        let mut args = vec![
            "import os, sys\nfor d in sys.argv[1:]:\n    s = os.statvfs(d)\n    print(d, s.f_blocks * s.f_frsize)",
        ];
        args.extend(dirs.iter().copied());
        let out = py(&h, &[], args[0], &args[1..])?;
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let said = text(&out.stdout);
        assert_eq!(said.lines().count(), dirs.len(), "{said}");
        for line in said.lines() {
            let size: u64 = line.rsplit(' ').next().unwrap_or("0").parse()?;
            assert!(size > 0 && size <= limit, "{line} exceeds {limit}");
        }
        // Filling /dev/shm stops at a tighter limit (enforced where memory is delegated:
        // the test container's is not, so there the size is what is checked).
        let out = sh(
            &h,
            &["--memory-max", "64M"],
            "dd if=/dev/zero of=/dev/shm/fill bs=1M count=128 2>/dev/null; stat -c %s /dev/shm/fill",
        )?;
        if h.enforces_limits() || out.status.code() == Some(0) {
            let written: u64 = text(&out.stdout).trim().parse().unwrap_or(0);
            assert!(
                written <= 64 << 20,
                "{written} bytes in /dev/shm: {}",
                describe(&out)
            );
        }
        Ok(())
    }

    /// A fork bomb in one unit (the default profile: tasks and CPU weight bounded) leaves
    /// another client's `warden run -- true` fast.
    pub fn a_fork_bomb_leaves_other_clients_fast(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, Options::default())? else {
            return Ok(());
        };
        // Every child spins forking (CPU and task pressure at once). On systemd the test
        // container does not enforce TasksMax (its pids controller is not delegated), so
        // the bomb bounds itself there.
        let cap = if h.enforces_limits() { "1000000" } else { "48" };
        let bomb = r#"
import os, sys, time
cap, made = int(sys.argv[1]), 0
print("armed", flush=True)
while True:
    if made < cap:
        try:
            if os.fork() == 0:
                made = cap
                continue
            made += 1
        except OSError:
            pass
    else:
        sum(range(10000))
"#;
        let (mut bg, _unit) = spawn_unit(&h, &["--", "python3", "-c", bomb, cap], &[])?;
        let mut line = String::new();
        BufReader::new(bg.child()?.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
        assert_eq!(line, "armed\n");
        std::thread::sleep(Duration::from_secs(3));
        let mut times = Vec::new();
        for _ in 0..7 {
            let t0 = Instant::now();
            let out = run(&h, &["--", "true"])?;
            times.push(t0.elapsed());
            assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        }
        times.sort();
        let median = times[times.len() / 2];
        eprintln!("{kind:?}: warden run -- true beside a fork bomb: {times:?}");
        let bound = match kind {
            Kind::Native => scaled(Duration::from_millis(100)),
            // A transient systemd unit costs tens of milliseconds even when idle (more under
            // the VM's emulation); the bound there is that the bomb does not multiply it.
            Kind::Systemd => scaled(Duration::from_millis(400)),
        };
        assert!(
            median < bound,
            "median {median:?} beside a fork bomb: {times:?}"
        );
        assert!(bg.child()?.try_wait()?.is_none(), "the bomb ended early");
        drop(bg);
        Ok(())
    }

    /// `kill -9` of wardend: every unit's processes (one ignoring SIGTERM, one
    /// double-forked) are gone within a second, before any restart.
    pub fn killing_wardend_ends_every_unit_within_a_second(kind: Kind) -> Result<()> {
        let Some(mut h) = harness(kind, Options::default())? else {
            return Ok(());
        };
        let (a, _) = spawn_unit(&h, &["--", "sh", "-c", "trap '' TERM; sleep 100"], &[])?;
        let (b, _) = spawn_unit(
            &h,
            &[
                "--",
                "sh",
                "-c",
                "setsid sh -c 'sleep 100 & sleep 100' & sleep 100",
            ],
            &[],
        )?;
        assert!(
            Harness::wait_for(Duration::from_secs(5), || h.unit_processes().len() >= 5).is_some(),
            "units did not start"
        );
        let procs = h.unit_processes();
        h.signal_daemon(libc::SIGKILL)?;
        let t0 = Instant::now();
        let gone = Harness::wait_for(Duration::from_secs(3), || {
            !procs.iter().any(|p| is_live(*p))
        });
        let left: Vec<u32> = procs.iter().copied().filter(|p| is_live(*p)).collect();
        assert!(
            gone.is_some_and(|d| d < scaled(Duration::from_secs(1))),
            "after {:?}, still alive: {left:?}",
            t0.elapsed()
        );
        drop((a, b));
        if kind == Kind::Native {
            // Their cgroups wait for the next start's orphan cleanup.
            assert!(!native_unit_cgroups(&h.prefix).is_empty());
        }
        Ok(())
    }

    /// Whether a path exists where only root can look is not told: running a file in a
    /// directory the client cannot search fails the same way whether the file is there or
    /// not (the command is looked up inside the unit, as the client).
    pub fn no_answer_depends_on_what_only_root_can_see(kind: Kind) -> Result<()> {
        let Some(h) = harness(kind, Options::default())? else {
            return Ok(());
        };
        let dir = format!("/srv/{}-private", h.prefix);
        let _undo = Undo {
            h: &h,
            steps: vec![vec!["rm".into(), "-rf".into(), dir.clone()]],
        };
        h.exec_root(&["mkdir", "-m", "700", &dir])?;
        h.exec_root(&["cp", "/bin/true", &format!("{dir}/tool")])?;
        h.exec_root(&["chmod", "755", &format!("{dir}/tool")])?;
        let exists = run(&h, &["--", &format!("{dir}/tool")])?;
        let missing = run(&h, &["--", &format!("{dir}/nothing")])?;
        assert_eq!(exists.status.code(), missing.status.code());
        assert_eq!(exists.status.code(), Some(126), "{}", describe(&exists));
        assert_eq!(
            text(&exists.stderr).replace("tool", "X"),
            text(&missing.stderr).replace("nothing", "X")
        );
        Ok(())
    }
}
