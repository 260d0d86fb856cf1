//! The transient unit's properties: a [`UnitSpec`] mapped to systemd's own sandboxing and
//! resource-control settings, as the `a(sv)` list `StartTransientUnit` takes.
//!
//! Pure: builds the list without touching the system, so it is tested without systemd.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use warden_proto::Network;
use zbus::{Fd, Variant};

use crate::shim::ExecShim;
use crate::units::UnitSpec;

/// System calls a unit may not make (they would reach same-uid processes outside it).
pub(super) const DENIED_SYSCALLS: [&str; 4] = [
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
];

/// How long a stopped unit (wall-time limit, client gone, shutdown) has between SIGTERM and
/// SIGKILL.
pub(super) const STOP_GRACE_USEC: u64 = 500_000;

/// One property: name and value.
pub(super) type Property<'a> = (&'static str, Variant<'a>);

/// How an ended unit is kept loaded until wardend has read its exit status and stopped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retention {
    /// `AddRef=yes` + `CollectMode=inactive-or-failed`: the unit is referenced by this bus
    /// client until `Unref()`. Only on the system bus: systemd tracks the reference by the
    /// client's unique name, and refuses `AddRef` (EINVAL) on its private socket, where
    /// clients have none.
    AddRef,
    /// `RemainAfterExit=yes` + `CollectMode=inactive`: after its main process ended, the unit
    /// stays `active (exited)` or `failed` until stopped or reset. For the private socket.
    RemainAfterExit,
}

/// A path that systemd can take, and keep: UTF-8 (D-Bus strings are); no control
/// character, double quote or backslash — properties end up in the unit file on the next
/// `daemon-reload`, where systemd 252 writes them unescaped, so a newline would add a
/// directive of the caller's choosing, and a quote or backslash would read back as another
/// path. (`%` and spaces survive: systemd escapes those.)
fn utf8<'p>(what: &str, path: &'p Path) -> Result<&'p str, String> {
    checked(what, path, &['"', '\\'])
}

/// [`utf8`], for `BindPaths=`-style values (`SOURCE:DEST`): no colon either.
fn bind_path<'p>(what: &str, path: &'p Path) -> Result<&'p str, String> {
    checked(what, path, &['"', '\\', ':'])
}

fn checked<'p>(what: &str, path: &'p Path, forbidden: &[char]) -> Result<&'p str, String> {
    let text = path
        .to_str()
        .ok_or_else(|| format!("refused: {what} {} is not UTF-8", path.display()))?;
    let bad = text
        .chars()
        .find(|c| c.is_control() || forbidden.contains(c));
    match bad {
        Some(c) => Err(format!(
            "refused: {what} {text:?} contains {}, which systemd cannot keep in a unit \
             file: rename it, or use the native backend",
            if c.is_control() {
                "a control character".to_string()
            } else {
                format!("{c:?}")
            }
        )),
        None => Ok(text),
    }
}

/// How the unit's command starts.
#[derive(Debug, Clone, Copy)]
pub(super) enum Exec<'s> {
    /// Through the exec shim, the command handed over in the spec file at the path given
    /// (the daemon always does this).
    Shim(&'s ExecShim, &'s Path),
    /// The command itself as the client account (a bare manager, as the backend's own
    /// tests build it).
    Direct,
}

/// Capabilities the exec shim keeps (it starts as root): entering and mounting in its own
/// namespaces, dropping to the client's ids, signalling its init.
const SHIM_CAPABILITIES: u64 = (1 << 21) // CAP_SYS_ADMIN
    | (1 << 7) // CAP_SETUID
    | (1 << 6) // CAP_SETGID
    | (1 << 5); // CAP_KILL

/// Map `spec` to the properties of its transient service in `slice`. The stdio descriptors
/// are borrowed from `spec`; they must stay open until the call returns.
pub(super) fn transient_properties<'a>(
    spec: &'a UnitSpec,
    slice: &str,
    retention: Retention,
    exec: Exec<'_>,
    lifeline: Option<&str>,
) -> Result<Vec<Property<'a>>, String> {
    let cwd = utf8("working directory", &spec.cwd_path)?;
    let fs = &spec.fs;

    let mut props: Vec<Property<'a>> = vec![
        (
            "Description",
            Variant::from(format!("warden unit for uid {}", spec.uid)),
        ),
        ("Slice", Variant::from(slice.to_string())),
        // Type=exec: the start job fails when the command cannot be executed.
        ("Type", Variant::from("exec")),
        // SIGPIPE at its default in the command, as in a shell (systemd ignores it by
        // default; the shim resets it too).
        ("IgnoreSIGPIPE", Variant::from(false)),
        ("KillMode", Variant::from("control-group")),
        // SIGTERM, then SIGKILL for whatever is left after this grace period. systemd's
        // default is 90 s, so a command that ignores SIGTERM outlived its wall-time limit
        // (and a stop) by up to 90 s.
        ("TimeoutStopUSec", Variant::from(STOP_GRACE_USEC)),
        // So that the exit report has the unit's CPU time (and peak memory where systemd
        // reports it).
        ("CPUAccounting", Variant::from(true)),
        ("MemoryAccounting", Variant::from(true)),
        ("NoNewPrivileges", Variant::from(true)),
        // /tmp and /var/tmp of its own.
        ("PrivateTmp", Variant::from(true)),
        // A /dev/shm of its own: the host's is world-writable and outside ProtectSystem's
        // reach (and PrivateDevices bind-mounts the host's), so a command could otherwise
        // leave files there that outlive its unit. POSIX shared memory still works inside.
        // And a /run of its own: the host's holds its daemons' sockets (the bus, docker,
        // systemd's own), reachable by connect(2) through any read-only view.
        (
            "TemporaryFileSystem",
            Variant::from(private_filesystems(spec.limits.memory_max)),
        ),
        ("BindReadOnlyPaths", Variant::from(run_files(fs)?)),
        // An IPC namespace of its own: SysV shared memory, semaphores and message queues
        // made by the command go with the unit instead of staying on the host.
        ("PrivateIPC", Variant::from(true)),
        // Processes of other users (wardend, root's) are not even listed in /proc.
        ("ProtectProc", Variant::from("invisible")),
        // No ptrace, process_vm_readv/writev or pidfd_getfd: a unit runs with the client's
        // uid, and without this it could attach to the client or the agent (same uid,
        // outside the unit) and run code there, unsandboxed. They fail with EPERM.
        (
            "SystemCallFilter",
            Variant::from((false, DENIED_SYSCALLS.map(str::to_string).to_vec())),
        ),
        ("SystemCallErrorNumber", Variant::from(libc::EPERM)),
        ("ProtectSystem", Variant::from("strict")),
        ("ProtectHome", Variant::from("read-only")),
        (
            "ReadWritePaths",
            Variant::from(writable_paths(
                fs.cwd_writable.then_some(cwd),
                &fs.writable,
            )?),
        ),
        // A repository's .git on itself, so that it cannot be renamed away (taking its
        // read-only hooks with it) and replaced.
        ("BindPaths", Variant::from(self_binds(&fs.pinned)?)),
        // Protected paths inside the writable ones.
        (
            "ReadOnlyPaths",
            Variant::from(optional_paths("protected path", &fs.protected)?),
        ),
        // Hidden paths, host sockets, kernel filesystems mounted elsewhere.
        (
            "InaccessiblePaths",
            Variant::from(optional_paths(
                "hidden path",
                &[fs.hidden.as_slice(), &fs.sockets, &fs.kernel_mounts].concat(),
            )?),
        ),
    ];
    props.extend(exec_properties(spec, exec, cwd)?);
    props.extend(hardening_properties());
    if let Some(l) = lifeline {
        // Stopped by systemd when the lifeline (and so wardend) is gone.
        props.push(("BindsTo", Variant::from(vec![l.to_string()])));
        props.push(("After", Variant::from(vec![l.to_string()])));
    }
    props.extend(retention_properties(retention));
    props.extend(stdio_properties(&spec.stdio));
    props.extend(limit_properties(spec));
    props.extend(network_properties(spec.network));
    Ok(props)
}

/// How the command starts. Through the shim, nothing of the request is in a property but
/// paths: not the argv, not the environment (world-readable over the bus, and the
/// environment systemd starts the shim with, where a loader variable would run code before
/// any restriction) — they travel in the spec credential.
fn exec_properties<'a>(
    spec: &UnitSpec,
    exec: Exec<'_>,
    cwd: &str,
) -> Result<Vec<Property<'a>>, String> {
    match exec {
        Exec::Shim(shim, spec_file) => Ok(vec![
            (
                "ExecStart",
                Variant::from(vec![(
                    utf8("exec shim", &shim.path)?.to_string(),
                    shim.argv(),
                    false,
                )]),
            ),
            (
                "LoadCredential",
                Variant::from(vec![(
                    crate::shim::spec::CREDENTIAL.to_string(),
                    utf8("spec file", spec_file)?.to_string(),
                )]),
            ),
            // Root, but only what the shim needs; it drops to the client itself.
            ("CapabilityBoundingSet", Variant::from(SHIM_CAPABILITIES)),
            // The shim's own pid and mount namespaces; nothing else (its seccomp filter
            // then refuses every namespace to the command).
            (
                "RestrictNamespaces",
                Variant::from((libc::CLONE_NEWNS | libc::CLONE_NEWPID) as u64),
            ),
        ]),
        // ExecStartEx with `no-env-expand`: systemd would otherwise expand `$VAR` (and turn
        // `$$` into `$`) in the arguments; the command must get its argv verbatim.
        Exec::Direct => Ok(vec![
            (
                "ExecStartEx",
                Variant::from(vec![(
                    spec.argv.first().cloned().unwrap_or_default(),
                    spec.argv.clone(),
                    vec!["no-env-expand".to_string()],
                )]),
            ),
            // systemd 252 takes a path only; the server re-checked its device and inode.
            ("WorkingDirectory", Variant::from(cwd.to_string())),
            ("User", Variant::from(spec.user.clone())),
            ("Group", Variant::from(spec.gid.to_string())),
            (
                "SupplementaryGroups",
                Variant::from(spec.groups.iter().map(u32::to_string).collect::<Vec<_>>()),
            ),
            (
                "Environment",
                Variant::from(
                    spec.env
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>(),
                ),
            ),
            ("RestrictNamespaces", Variant::from(0u64)),
        ]),
    }
}

/// systemd's own hardening, the native baseline where systemd has one: a private /dev
/// (with a pty instance), the kernel's tunables, modules, logs, clock and cgroups out of
/// reach, the hostname its own, no realtime, no setuid/setgid files. (Not
/// MemoryDenyWriteExecute: JITs need writable executable memory. Not LockPersonality: it
/// also refuses the query `personality(0xffffffff)` that tools make; the shim's seccomp
/// filter refuses every other persona, as the native backend's does.)
fn hardening_properties() -> Vec<Property<'static>> {
    [
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictRealtime",
        "RestrictSUIDSGID",
    ]
    .into_iter()
    .map(|name| (name, Variant::from(true)))
    .collect()
}

/// Keep the ended unit loaded until it is released (see [`Retention`]).
fn retention_properties(retention: Retention) -> Vec<Property<'static>> {
    match retention {
        Retention::AddRef => {
            vec![
                ("CollectMode", Variant::from("inactive-or-failed")),
                ("AddRef", Variant::from(true)),
            ]
        }
        Retention::RemainAfterExit => {
            vec![
                ("CollectMode", Variant::from("inactive")),
                ("RemainAfterExit", Variant::from(true)),
            ]
        }
    }
}

/// The cwd when writable (must exist) and the extra writable paths (`-`: ignored when
/// missing).
fn writable_paths(cwd: Option<&str>, extra: &[PathBuf]) -> Result<Vec<String>, String> {
    let mut paths: Vec<String> = cwd.map(str::to_string).into_iter().collect();
    paths.extend(optional_paths("writable path", extra)?);
    Ok(paths)
}

/// `BindPaths` of each path onto itself, recursive, skipped when missing.
fn self_binds(paths: &[PathBuf]) -> Result<Vec<(String, String, bool, u64)>, String> {
    paths
        .iter()
        .map(|p| {
            let p = bind_path("pinned path", p)?.to_string();
            Ok((p.clone(), p, true, libc::MS_REC))
        })
        .collect()
}

/// The private tmpfs filesystems of a unit (beyond PrivateTmp's), each as large as the
/// unit's memory limit (tmpfs pages are charged to it).
fn private_filesystems(memory_max: Option<u64>) -> Vec<(String, String)> {
    let size = memory_max.map(|b| format!(",size={b}")).unwrap_or_default();
    vec![
        (
            "/dev/shm".to_string(),
            format!("mode=1777,nosuid,nodev{size}"),
        ),
        ("/run".to_string(), format!("mode=755,nosuid,nodev{size}")),
    ]
}

/// What the private /run shows of the host's, read-only: the resolver configuration.
fn run_files(fs: &crate::units::FsView) -> Result<Vec<(String, String, bool, u64)>, String> {
    fs.run_files
        .iter()
        .map(|p| {
            let p = bind_path("run file", p)?.to_string();
            Ok((p.clone(), p, true, 0))
        })
        .collect()
}

/// Paths prefixed with `-` so that a missing one (say `~/.aws`) does not fail the unit.
fn optional_paths(what: &str, paths: &[PathBuf]) -> Result<Vec<String>, String> {
    paths
        .iter()
        .map(|p| utf8(what, p).map(|p| format!("-{p}")))
        .collect()
}

/// Standard input, output and error: the passed descriptor, or `null`.
fn stdio_properties(stdio: &[Option<std::os::fd::OwnedFd>; 3]) -> Vec<Property<'_>> {
    const NAMES: [(&str, &str); 3] = [
        ("StandardInputFileDescriptor", "StandardInput"),
        ("StandardOutputFileDescriptor", "StandardOutput"),
        ("StandardErrorFileDescriptor", "StandardError"),
    ];
    NAMES
        .iter()
        .zip(stdio)
        .map(|(&(fd_prop, null_prop), fd)| match fd {
            Some(fd) => (fd_prop, Variant::from(Fd::from(fd.as_fd()))),
            None => (null_prop, Variant::from("null")),
        })
        .collect()
}

/// The resource limits that are set.
fn limit_properties(spec: &UnitSpec) -> Vec<Property<'static>> {
    let limits = &spec.limits;
    let mut props = Vec::new();
    if let Some(bytes) = limits.memory_max {
        props.push(("MemoryMax", Variant::from(bytes)));
    }
    if let Some(tasks) = limits.tasks_max {
        props.push(("TasksMax", Variant::from(tasks)));
    }
    if let Some(weight) = limits.cpu_weight {
        props.push(("CPUWeight", Variant::from(u64::from(weight))));
    }
    if let Some(percent) = limits.cpu_quota_percent {
        // 100 % of one CPU is one second of CPU time per second.
        props.push((
            "CPUQuotaPerSecUSec",
            Variant::from(u64::from(percent) * 10_000),
        ));
    }
    if let Some(timeout) = limits.timeout {
        let usec = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
        props.push(("RuntimeMaxUSec", Variant::from(usec)));
    }
    props
}

/// Network access: none (no namespace with interfaces, only Unix sockets), loopback (a
/// private namespace), or the host's.
fn network_properties(network: Network) -> Vec<Property<'static>> {
    match network {
        Network::None => vec![
            ("PrivateNetwork", Variant::from(true)),
            // (allow-list?, families): only AF_UNIX is allowed.
            (
                "RestrictAddressFamilies",
                Variant::from((true, vec!["AF_UNIX".to_string()])),
            ),
        ],
        Network::Loopback => vec![("PrivateNetwork", Variant::from(true))],
        Network::Host => vec![],
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::units::{FsView, Limits, UnitName};

    fn spec(
        network: Network,
        limits: Limits,
        stdout: Option<std::os::fd::OwnedFd>,
    ) -> Result<UnitSpec, Box<dyn std::error::Error>> {
        Ok(UnitSpec {
            name: UnitName::random("w")?,
            argv: vec!["sh".into(), "-c".into(), "true".into()],
            path: "/usr/bin:/bin".into(),
            env: vec![("A".into(), "b=c".into())],
            cwd: File::open("/")?.into(),
            cwd_path: PathBuf::from("/srv/work"),
            stdio: [None, stdout, None],
            user: "alice".into(),
            uid: 1000,
            gid: 100,
            groups: vec![27, 44],
            home: None,
            fs: FsView {
                cwd_writable: true,
                writable: vec![PathBuf::from("/srv/cache")],
                hidden: vec![PathBuf::from("/home/u/.ssh")],
                protected: vec![PathBuf::from("/srv/work/.git/hooks")],
                pinned: vec![PathBuf::from("/srv/work/.git")],
                sockets: vec![PathBuf::from("/home/u/agent.sock")],
                kernel_mounts: vec![PathBuf::from("/srv/chroot/proc")],
                run_files: vec![PathBuf::from("/run/systemd/resolve/stub-resolv.conf")],
            },
            network,
            limits,
        })
    }

    fn find<'p>(props: &'p [Property<'_>], name: &str) -> Option<&'p Variant<'p>> {
        props.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    #[test]
    fn the_spec_becomes_sandboxing_properties() -> Result<(), Box<dyn std::error::Error>> {
        let spec = spec(Network::None, Limits::default(), None)?;
        let props = transient_properties(&spec, "w.slice", Retention::AddRef, Exec::Direct, None)?;
        let get = |n: &str| find(&props, n).cloned();
        assert_eq!(get("Slice"), Some(Variant::from("w.slice")));
        assert_eq!(get("User"), Some(Variant::from("alice")));
        assert_eq!(get("Group"), Some(Variant::from("100")));
        assert_eq!(
            get("SupplementaryGroups"),
            Some(Variant::from(vec!["27".to_string(), "44".to_string()]))
        );
        assert_eq!(
            get("Environment"),
            Some(Variant::from(vec!["A=b=c".to_string()]))
        );
        assert_eq!(get("WorkingDirectory"), Some(Variant::from("/srv/work")));
        assert_eq!(
            get("ReadWritePaths"),
            Some(Variant::from(vec![
                "/srv/work".to_string(),
                "-/srv/cache".to_string()
            ]))
        );
        assert_eq!(
            get("InaccessiblePaths"),
            Some(Variant::from(vec![
                "-/home/u/.ssh".to_string(),
                "-/home/u/agent.sock".to_string(),
                "-/srv/chroot/proc".to_string()
            ]))
        );
        assert_eq!(
            get("ReadOnlyPaths"),
            Some(Variant::from(vec!["-/srv/work/.git/hooks".to_string()]))
        );
        assert_eq!(
            get("BindPaths"),
            Some(Variant::from(vec![(
                "/srv/work/.git".to_string(),
                "/srv/work/.git".to_string(),
                true,
                libc::MS_REC
            )]))
        );
        assert_eq!(
            get("BindReadOnlyPaths"),
            Some(Variant::from(vec![(
                "/run/systemd/resolve/stub-resolv.conf".to_string(),
                "/run/systemd/resolve/stub-resolv.conf".to_string(),
                true,
                0u64
            )]))
        );
        assert_eq!(get("NoNewPrivileges"), Some(Variant::from(true)));
        assert_eq!(get("ProtectSystem"), Some(Variant::from("strict")));
        assert_eq!(
            get("TemporaryFileSystem"),
            Some(Variant::from(vec![
                ("/dev/shm".to_string(), "mode=1777,nosuid,nodev".to_string()),
                ("/run".to_string(), "mode=755,nosuid,nodev".to_string())
            ]))
        );
        assert_eq!(get("PrivateIPC"), Some(Variant::from(true)));
        assert_eq!(get("TimeoutStopUSec"), Some(Variant::from(500_000u64)));
        assert_eq!(get("ProtectProc"), Some(Variant::from("invisible")));
        assert_eq!(
            get("SystemCallFilter"),
            Some(Variant::from((
                false,
                vec![
                    "ptrace".to_string(),
                    "process_vm_readv".to_string(),
                    "process_vm_writev".to_string(),
                    "pidfd_getfd".to_string()
                ]
            )))
        );
        assert_eq!(get("SystemCallErrorNumber"), Some(Variant::from(1i32)));
        assert_eq!(get("PrivateNetwork"), Some(Variant::from(true)));
        assert_eq!(
            get("RestrictAddressFamilies"),
            Some(Variant::from((true, vec!["AF_UNIX".to_string()])))
        );
        assert_eq!(get("AddRef"), Some(Variant::from(true)));
        assert_eq!(get("RemainAfterExit"), None);
        // No stdio passed: all three are /dev/null.
        for name in ["StandardInput", "StandardOutput", "StandardError"] {
            assert_eq!(get(name), Some(Variant::from("null")), "{name}");
        }
        // No limits set: none sent.
        for name in [
            "MemoryMax",
            "TasksMax",
            "CPUQuotaPerSecUSec",
            "RuntimeMaxUSec",
        ] {
            assert_eq!(get(name), None, "{name}");
        }
        Ok(())
    }

    #[test]
    fn limits_network_stdio_and_retention() -> Result<(), Box<dyn std::error::Error>> {
        let limits = Limits {
            memory_max: Some(1 << 30),
            tasks_max: Some(100),
            cpu_quota_percent: Some(250),
            cpu_weight: Some(50),
            timeout: Some(Duration::from_millis(1500)),
        };
        let (_read, write) = rustix::pipe::pipe()?;
        let spec = spec(Network::Loopback, limits, Some(write))?;
        let props = transient_properties(
            &spec,
            "w.slice",
            Retention::RemainAfterExit,
            Exec::Direct,
            None,
        )?;
        let get = |n: &str| find(&props, n).cloned();
        assert_eq!(get("MemoryMax"), Some(Variant::from(1u64 << 30)));
        assert_eq!(get("TasksMax"), Some(Variant::from(100u64)));
        assert_eq!(get("CPUQuotaPerSecUSec"), Some(Variant::from(2_500_000u64)));
        assert_eq!(get("CPUWeight"), Some(Variant::from(50u64)));
        // The private tmpfs filesystems are as large as the memory limit.
        assert_eq!(
            get("TemporaryFileSystem"),
            Some(Variant::from(vec![
                (
                    "/dev/shm".to_string(),
                    "mode=1777,nosuid,nodev,size=1073741824".to_string()
                ),
                (
                    "/run".to_string(),
                    "mode=755,nosuid,nodev,size=1073741824".to_string()
                )
            ]))
        );
        assert_eq!(get("RuntimeMaxUSec"), Some(Variant::from(1_500_000u64)));
        assert_eq!(get("PrivateNetwork"), Some(Variant::from(true)));
        assert_eq!(get("RestrictAddressFamilies"), None);
        assert!(matches!(
            get("StandardOutputFileDescriptor"),
            Some(Variant::Fd(_))
        ));
        assert_eq!(get("StandardOutput"), None);
        assert_eq!(get("AddRef"), None);
        assert_eq!(get("RemainAfterExit"), Some(Variant::from(true)));
        assert_eq!(get("CollectMode"), Some(Variant::from("inactive")));

        let host = spec_host()?;
        let props = transient_properties(&host, "w.slice", Retention::AddRef, Exec::Direct, None)?;
        assert!(find(&props, "PrivateNetwork").is_none());
        Ok(())
    }

    #[test]
    fn through_the_exec_shim_no_property_carries_the_request_but_paths(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let mut spec = spec(Network::None, Limits::default(), None)?;
        spec.argv = vec!["sh".into(), "-c".into(), "echo $SECRET_ARG".into()];
        spec.env = vec![("LD_PRELOAD".into(), "/srv/work/evil.so".into())];
        let shim = ExecShim::new(PathBuf::from("/usr/sbin/wardend"), 6)?;
        let spec_file = Path::new("/run/wardend/specs/w-0.service");
        let props = transient_properties(
            &spec,
            "w.slice",
            Retention::AddRef,
            Exec::Shim(&shim, spec_file),
            Some("w-lifeline-00.service"),
        )?;
        let get = |n: &str| find(&props, n).cloned();
        assert_eq!(
            get("ExecStart"),
            Some(Variant::from(vec![(
                "/usr/sbin/wardend".to_string(),
                vec!["wardend".to_string(), "exec-shim".to_string()],
                false,
            )]))
        );
        assert_eq!(
            get("LoadCredential"),
            Some(Variant::from(vec![(
                "warden-spec".to_string(),
                "/run/wardend/specs/w-0.service".to_string()
            )]))
        );
        for absent in [
            "ExecStartEx",
            "Environment",
            "User",
            "Group",
            "SupplementaryGroups",
            "WorkingDirectory",
        ] {
            assert_eq!(get(absent), None, "{absent}");
        }
        // Nothing of argv or environment anywhere in the properties.
        let all = format!("{props:?}");
        assert!(
            !all.contains("SECRET_ARG") && !all.contains("evil.so"),
            "{all}"
        );
        assert_eq!(
            get("CapabilityBoundingSet"),
            Some(Variant::from(SHIM_CAPABILITIES))
        );
        assert_eq!(
            get("RestrictNamespaces"),
            Some(Variant::from(
                (libc::CLONE_NEWNS | libc::CLONE_NEWPID) as u64
            ))
        );
        for on in [
            "PrivateDevices",
            "ProtectKernelTunables",
            "ProtectKernelModules",
            "ProtectKernelLogs",
            "ProtectControlGroups",
            "ProtectClock",
            "ProtectHostname",
            "RestrictRealtime",
            "RestrictSUIDSGID",
            "NoNewPrivileges",
        ] {
            assert_eq!(get(on), Some(Variant::from(true)), "{on}");
        }
        assert_eq!(get("IgnoreSIGPIPE"), Some(Variant::from(false)));
        for dep in ["BindsTo", "After"] {
            assert_eq!(
                get(dep),
                Some(Variant::from(vec!["w-lifeline-00.service".to_string()])),
                "{dep}"
            );
        }
        // Without a shim (a bare manager), the command itself, looked up by systemd.
        let props = transient_properties(&spec, "w.slice", Retention::AddRef, Exec::Direct, None)?;
        assert_eq!(
            find(&props, "ExecStartEx").cloned(),
            Some(Variant::from(vec![(
                "sh".to_string(),
                vec![
                    "sh".to_string(),
                    "-c".to_string(),
                    "echo $SECRET_ARG".to_string()
                ],
                vec!["no-env-expand".to_string()],
            )]))
        );
        Ok(())
    }

    #[test]
    fn a_pinned_path_with_a_colon_is_refused_but_percent_and_spaces_pass(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let mut spec = spec(Network::None, Limits::default(), None)?;
        spec.cwd_path = PathBuf::from("/srv/w %h 'x'");
        assert!(
            transient_properties(&spec, "w.slice", Retention::AddRef, Exec::Direct, None).is_ok()
        );
        spec.fs.pinned = vec![PathBuf::from("/srv/w %h 'x'/a:b/.git")];
        let err = transient_properties(&spec, "w.slice", Retention::AddRef, Exec::Direct, None)
            .map(|_| ());
        assert!(err.is_err_and(|e| e.contains("':'")));
        Ok(())
    }

    #[test]
    fn a_path_with_a_control_character_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let shim = ExecShim::new(PathBuf::from("/usr/sbin/wardend"), 6)?;
        for bad in [
            "/srv/a\n[Service]\nExecStopPost=+/bin/touch /ROOTPWN\nb",
            "/srv/tab\there",
            "/srv/esc\u{1b}",
            "/srv/\"quoted\"",
            "/srv/back\\slash",
        ] {
            let mut spec = spec(Network::None, Limits::default(), None)?;
            spec.cwd_path = PathBuf::from(bad);
            let err = transient_properties(
                &spec,
                "w.slice",
                Retention::AddRef,
                Exec::Shim(&shim, Path::new("/run/wardend/specs/x")),
                None,
            )
            .map(|_| ());
            assert!(
                err.as_ref()
                    .is_err_and(|e| e.starts_with("refused: working directory")),
                "{err:?}"
            );
            let mut spec2 = spec;
            spec2.cwd_path = PathBuf::from("/srv/ok");
            spec2.fs.protected = vec![PathBuf::from(bad)];
            assert!(
                transient_properties(&spec2, "w.slice", Retention::AddRef, Exec::Direct, None)
                    .is_err()
            );
        }
        Ok(())
    }

    fn spec_host() -> Result<UnitSpec, Box<dyn std::error::Error>> {
        spec(Network::Host, Limits::default(), None)
    }
}
