//! The systemd backend: transient `.service` units over D-Bus. (Being written.)

use warden_proto::ExitReport;

use super::{RunningUnit, UnitError, UnitManager, UnitName, UnitSpec};

/// Whether PID 1 is systemd (its runtime directory exists).
pub fn pid1_is_systemd() -> bool {
    std::path::Path::new("/run/systemd/system").is_dir()
}

/// Connection to systemd.
pub struct SystemdManager {}

/// A transient service.
pub struct SystemdUnit {
    name: UnitName,
}

impl SystemdManager {
    /// Connect to systemd.
    pub async fn connect(_prefix: &str) -> Result<Self, UnitError> {
        Err(UnitError::Unreachable("systemd backend not written yet".into()))
    }
}

impl UnitManager for SystemdManager {
    type Unit = SystemdUnit;
    fn backend(&self) -> &'static str {
        "systemd"
    }
    async fn start(&self, spec: UnitSpec) -> Result<SystemdUnit, UnitError> {
        Err(UnitError::Start { unit: spec.name.to_string(), cause: "todo".into() })
    }
    async fn cleanup_orphans(&self) -> Result<Vec<String>, UnitError> {
        Ok(vec![])
    }
    async fn main_pid_of(&self, _pid: u32) -> Option<u32> {
        None
    }
}

impl RunningUnit for SystemdUnit {
    fn name(&self) -> &UnitName {
        &self.name
    }
    async fn wait(&mut self) -> Result<ExitReport, UnitError> {
        Err(UnitError::Control { op: "wait", unit: self.name.to_string(), cause: "todo".into() })
    }
    async fn signal(&self, _signal: i32) -> Result<(), UnitError> {
        Ok(())
    }
    async fn stop(&mut self) -> Result<(), UnitError> {
        Ok(())
    }
}
