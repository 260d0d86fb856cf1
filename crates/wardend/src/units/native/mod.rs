//! The native backend: namespaces and a cgroup of its own. (Being written.)

use warden_proto::ExitReport;

use super::{RunningUnit, UnitError, UnitManager, UnitName, UnitSpec};

/// The native backend.
pub struct NativeManager {}

/// A native unit.
pub struct NativeUnit {
    name: UnitName,
}

impl NativeManager {
    /// Set up the native backend.
    pub fn new(_prefix: &str) -> Result<Self, UnitError> {
        Err(UnitError::Unreachable(
            "native backend not written yet".into(),
        ))
    }
}

impl UnitManager for NativeManager {
    type Unit = NativeUnit;
    fn backend(&self) -> &'static str {
        "native"
    }
    async fn start(&self, spec: UnitSpec) -> Result<NativeUnit, UnitError> {
        Err(UnitError::Start {
            unit: spec.name.to_string(),
            cause: "todo".into(),
        })
    }
    async fn cleanup_orphans(&self) -> Result<Vec<String>, UnitError> {
        Ok(vec![])
    }
    async fn main_pid_of(&self, _pid: u32) -> Option<u32> {
        None
    }
}

impl RunningUnit for NativeUnit {
    fn name(&self) -> &UnitName {
        &self.name
    }
    async fn wait(&mut self) -> Result<ExitReport, UnitError> {
        Err(UnitError::Control {
            op: "wait",
            unit: self.name.to_string(),
            cause: "todo".into(),
        })
    }
    async fn signal(&self, _signal: i32) -> Result<(), UnitError> {
        Ok(())
    }
    async fn stop(&mut self) -> Result<(), UnitError> {
        Ok(())
    }
}
