//! The lifeline: units must not outlive wardend, whatever ends it (`kill -9` included).
//!
//! At start-up wardend starts one transient service, `<prefix>-lifeline-<hex>.service`,
//! whose only process (`wardend lifeline`, root, without capabilities, no network) reads
//! its standard input — the read end of a pipe whose write end only wardend holds — until
//! end-of-file. Every unit is started with `BindsTo=` and `After=` that service. When
//! wardend is gone, its end of the pipe closes, the lifeline exits, and systemd stops every
//! unit bound to it (SIGTERM, then SIGKILL after the stop grace period). Orphan cleanup at
//! the next start remains the second net.
//!
//! The units run as the client account, so they cannot signal the lifeline (root) to end
//! it early; ending it early would only stop them anyway.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitCode;

use zbus::{Connection, Fd, Variant};

use super::bus;
use super::properties::Property;
use crate::units::UnitError;

/// The subcommand the lifeline service runs.
pub const SUBCOMMAND: &str = "lifeline";

/// How long systemd may take to start the lifeline.
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A running lifeline: its unit's name, and the write end of its pipe (dropped with this
/// daemon).
#[derive(Debug)]
pub struct Lifeline {
    unit: String,
    _writer: OwnedFd,
}

impl Lifeline {
    /// The lifeline service's name, for `BindsTo=`.
    pub fn unit(&self) -> &str {
        &self.unit
    }

    /// Start the lifeline of `prefix`'s units, running `exe` (wardend's own executable,
    /// as units see it).
    pub async fn start(conn: &Connection, prefix: &str, exe: &str) -> Result<Self, UnitError> {
        let failed = |cause: String| UnitError::Start {
            unit: format!("{prefix}-lifeline"),
            cause,
        };
        let mut hex = [0u8; 8];
        rustix::rand::getrandom(&mut hex, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| failed(e.to_string()))?;
        let hex: String = hex.iter().map(|b| format!("{b:02x}")).collect();
        let unit = format!("{prefix}-lifeline-{hex}.service");
        let (reader, writer) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| failed(format!("creating its pipe: {e}")))?;
        let props = properties(prefix, exe, &reader);
        let manager = bus::ManagerProxy::new(conn)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut jobs = bus::job_removed_stream(conn)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let job = manager
            .start_transient_unit(&unit, "fail", &props, &[])
            .await
            .map_err(|e| failed(format!("StartTransientUnit: {e}")))?;
        drop(props);
        drop(reader);
        let result = tokio::time::timeout(START_TIMEOUT, bus::job_result(&mut jobs, job.as_str()))
            .await
            .map_err(|_| failed(format!("not started after {START_TIMEOUT:?}")))?
            .map_err(|e| failed(e.to_string()))?;
        if result != "done" {
            return Err(failed(format!("start job {result}")));
        }
        tracing::info!(
            unit,
            "units stop when wardend does: each is bound to {unit}"
        );
        Ok(Self {
            unit,
            _writer: writer,
        })
    }
}

/// The lifeline service: reads `stdin` until it ends, with nothing else it could do.
fn properties<'a>(prefix: &str, exe: &str, stdin: &'a OwnedFd) -> Vec<Property<'a>> {
    vec![
        (
            "Description",
            Variant::from(format!(
                "warden lifeline: the units of {prefix} stop when wardend does"
            )),
        ),
        ("Type", Variant::from("exec")),
        // ExecStart, not ExecStartEx: systemd 252 cannot load ExecStartEx back from the
        // unit file, so after a daemon-reload the lifeline (and every unit bound to it, and
        // every new one) would be a "bad setting".
        (
            "ExecStart",
            Variant::from(vec![(
                exe.to_string(),
                vec!["wardend".to_string(), SUBCOMMAND.to_string()],
                false,
            )]),
        ),
        (
            "StandardInputFileDescriptor",
            Variant::from(Fd::from(stdin.as_fd())),
        ),
        ("StandardOutput", Variant::from("null")),
        ("StandardError", Variant::from("null")),
        ("CollectMode", Variant::from("inactive-or-failed")),
        ("NoNewPrivileges", Variant::from(true)),
        ("CapabilityBoundingSet", Variant::from(0u64)),
        ("PrivateNetwork", Variant::from(true)),
        ("PrivateTmp", Variant::from(true)),
        ("ProtectSystem", Variant::from("strict")),
        ("ProtectHome", Variant::from("yes")),
    ]
}

/// Run the lifeline when this process was started as `wardend lifeline`; `None` otherwise.
/// Returns when standard input ends.
pub fn main_if_invoked() -> Option<ExitCode> {
    if std::env::args_os().nth(1).as_deref() != Some(OsStr::new(SUBCOMMAND)) {
        return None;
    }
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => return Some(ExitCode::SUCCESS),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Some(ExitCode::SUCCESS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lifeline_can_do_nothing_but_read() -> std::io::Result<()> {
        let (r, _w) = rustix::pipe::pipe()?;
        let props = properties("wt", "/usr/sbin/wardend", &r);
        let get = |n: &str| props.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
        assert_eq!(get("CapabilityBoundingSet"), Some(Variant::from(0u64)));
        assert_eq!(get("PrivateNetwork"), Some(Variant::from(true)));
        assert_eq!(get("NoNewPrivileges"), Some(Variant::from(true)));
        assert!(matches!(
            get("StandardInputFileDescriptor"),
            Some(Variant::Fd(_))
        ));
        assert_eq!(
            get("ExecStart"),
            Some(Variant::from(vec![(
                "/usr/sbin/wardend".to_string(),
                vec!["wardend".to_string(), SUBCOMMAND.to_string()],
                false
            )]))
        );
        assert_eq!(
            get("ExecStartEx"),
            None,
            "not loadable from a unit file by systemd 252"
        );
        Ok(())
    }
}
