//! The transient unit's properties: a [`UnitSpec`] mapped to systemd's own sandboxing and
//! resource-control settings, as the `a(sv)` list `StartTransientUnit` takes.
//!
//! Pure: builds the list without touching the system, so it is tested without systemd.

use std::os::fd::AsFd;
use std::path::Path;

use warden_proto::Network;
use zbus::{Fd, Variant};

use crate::units::UnitSpec;

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

/// A path that systemd can take (D-Bus strings are UTF-8).
fn utf8<'p>(what: &str, path: &'p Path) -> Result<&'p str, String> {
    path.to_str()
        .ok_or_else(|| format!("{what} {} is not UTF-8", path.display()))
}

/// Map `spec` to the properties of its transient service in `slice`. The stdio descriptors
/// are borrowed from `spec`; they must stay open until the call returns.
pub(super) fn transient_properties<'a>(
    spec: &'a UnitSpec,
    slice: &str,
    retention: Retention,
) -> Result<Vec<Property<'a>>, String> {
    let exe = utf8("executable", &spec.exe)?;
    let cwd = utf8("working directory", &spec.cwd_path)?;

    let mut props: Vec<Property<'a>> = vec![
        (
            "Description",
            Variant::from(format!("warden unit for uid {}", spec.uid)),
        ),
        ("Slice", Variant::from(slice.to_string())),
        // Type=exec: the start job fails when the command cannot be executed.
        ("Type", Variant::from("exec")),
        // ExecStartEx with `no-env-expand`: systemd would otherwise expand `$VAR` (and turn
        // `$$` into `$`) in the arguments; the command must get its argv verbatim.
        (
            "ExecStartEx",
            Variant::from(vec![(
                exe.to_string(),
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
        ("KillMode", Variant::from("control-group")),
        ("NoNewPrivileges", Variant::from(true)),
        ("PrivateTmp", Variant::from(true)),
        ("ProtectSystem", Variant::from("strict")),
        ("ProtectHome", Variant::from("read-only")),
        (
            "ReadWritePaths",
            Variant::from(writable_paths(cwd, &spec.fs.writable)?),
        ),
        (
            "InaccessiblePaths",
            Variant::from(optional_paths("hidden path", &spec.fs.hidden)?),
        ),
    ];
    props.extend(retention_properties(retention));
    props.extend(stdio_properties(&spec.stdio));
    props.extend(limit_properties(spec));
    props.extend(network_properties(spec.network));
    Ok(props)
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

/// The cwd (must exist) and the extra writable paths (`-`: ignored when missing).
fn writable_paths(cwd: &str, extra: &[std::path::PathBuf]) -> Result<Vec<String>, String> {
    let mut paths = vec![cwd.to_string()];
    paths.extend(optional_paths("writable path", extra)?);
    Ok(paths)
}

/// Paths prefixed with `-` so that a missing one (say `~/.aws`) does not fail the unit.
fn optional_paths(what: &str, paths: &[std::path::PathBuf]) -> Result<Vec<String>, String> {
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
