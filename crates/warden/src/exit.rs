//! How the end of a unit, or a failure, becomes `warden run`'s exit status (SPEC §10):
//!
//! | outcome | status |
//! |---|---|
//! | the command exited with code N | N |
//! | signal N ended it (reason `signal`, or `stopped` with a signal) | 128 + N |
//! | the wall-time limit ended it (reason `timeout`) | 124 |
//! | the memory limit ended it (reason `oom`) | its code if one is given, else 137 (128 + SIGKILL) |
//! | it failed to start | its code if one is given, else 125 |
//! | stopped with neither code nor signal | 125 |
//! | warden itself failed (daemon error, cannot connect, protocol error) | 125 |
//! | daemon error `not_executable` | 126 |
//! | daemon error `not_found` | 127 |
//!
//! A code outside 0..=255 or a signal outside 1..=127 cannot be an exit status; both are taken
//! as warden failing (125) rather than being truncated into something misleading.

use warden_proto::{ErrorCode, ExitReason, ExitReport};

/// The wall-time limit ended the command (as timeout(1)).
pub const EXIT_TIMEOUT: i32 = 124;
/// warden itself failed.
pub const EXIT_WARDEN_FAILED: i32 = 125;
/// The command was found but cannot be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;
/// The command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;
/// Added to a signal number when a signal ended the command.
pub const SIGNAL_BASE: i32 = 128;
/// SIGKILL, what the kernel's OOM killer sends.
const SIGKILL: i32 = 9;

/// A valid exit code, or `None`.
fn valid_code(code: Option<i32>) -> Option<i32> {
    code.filter(|c| (0..=255).contains(c))
}

/// `128 + signal` for a valid signal number, or `None`.
fn signal_status(signal: Option<i32>) -> Option<i32> {
    signal
        .filter(|s| (1..=127).contains(s))
        .map(|s| SIGNAL_BASE + s)
}

/// The exit status for a unit that ended as `report` says.
pub fn report_exit_code(report: &ExitReport) -> i32 {
    let code = valid_code(report.code);
    let signal = signal_status(report.signal);
    let status = match report.reason {
        ExitReason::Exited => code.or(signal),
        ExitReason::Signal => signal.or(code),
        ExitReason::Timeout => Some(EXIT_TIMEOUT),
        ExitReason::Oom => code.or(Some(SIGNAL_BASE + SIGKILL)),
        ExitReason::Stopped => signal.or(code),
        ExitReason::FailedToStart => code,
    };
    status.unwrap_or(EXIT_WARDEN_FAILED)
}

/// The exit status for an error frame from the daemon.
pub fn error_exit_code(code: ErrorCode) -> i32 {
    match code {
        ErrorCode::NotFound => EXIT_NOT_FOUND,
        ErrorCode::NotExecutable => EXIT_NOT_EXECUTABLE,
        ErrorCode::Admission
        | ErrorCode::SessionLimit
        | ErrorCode::Protocol
        | ErrorCode::Refused
        | ErrorCode::Internal
        | ErrorCode::Timeout => EXIT_WARDEN_FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(reason: ExitReason, code: Option<i32>, signal: Option<i32>) -> ExitReport {
        ExitReport {
            reason,
            code,
            signal,
            cpu_usec: None,
            peak_memory_bytes: None,
            wall_usec: 0,
        }
    }

    const REASONS: [ExitReason; 6] = [
        ExitReason::Exited,
        ExitReason::Signal,
        ExitReason::Timeout,
        ExitReason::Oom,
        ExitReason::Stopped,
        ExitReason::FailedToStart,
    ];

    /// The expected status, written out independently of the implementation.
    fn expected(reason: ExitReason, code: Option<i32>, signal: Option<i32>) -> i32 {
        let code_ok = code.filter(|c| *c >= 0 && *c <= 255);
        let sig_ok = signal.filter(|s| *s >= 1 && *s <= 127).map(|s| 128 + s);
        match (reason, code_ok, sig_ok) {
            (ExitReason::Timeout, _, _) => 124,
            (ExitReason::Exited, Some(c), _) => c,
            (ExitReason::Exited, None, Some(s)) => s,
            (ExitReason::Signal | ExitReason::Stopped, _, Some(s)) => s,
            (ExitReason::Signal | ExitReason::Stopped, Some(c), None) => c,
            (ExitReason::Oom, Some(c), _) => c,
            (ExitReason::Oom, None, _) => 137,
            (ExitReason::FailedToStart, Some(c), _) => c,
            _ => 125,
        }
    }

    #[test]
    fn every_reason_code_and_signal_combination() {
        let codes = [
            None,
            Some(0),
            Some(1),
            Some(7),
            Some(126),
            Some(255),
            Some(256),
            Some(-1),
        ];
        let signals = [
            None,
            Some(0),
            Some(1),
            Some(9),
            Some(15),
            Some(64),
            Some(128),
            Some(-3),
        ];
        for reason in REASONS {
            for code in codes {
                for signal in signals {
                    assert_eq!(
                        report_exit_code(&report(reason, code, signal)),
                        expected(reason, code, signal),
                        "{reason:?} code={code:?} signal={signal:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_cases_the_spec_names() {
        assert_eq!(
            report_exit_code(&report(ExitReason::Exited, Some(0), None)),
            0
        );
        assert_eq!(
            report_exit_code(&report(ExitReason::Exited, Some(7), None)),
            7
        );
        assert_eq!(
            report_exit_code(&report(ExitReason::Signal, None, Some(9))),
            137
        );
        assert_eq!(
            report_exit_code(&report(ExitReason::Signal, None, Some(15))),
            143
        );
        assert_eq!(
            report_exit_code(&report(ExitReason::Stopped, None, Some(15))),
            143
        );
        assert_eq!(
            report_exit_code(&report(ExitReason::Stopped, None, None)),
            125
        );
        assert_eq!(
            report_exit_code(&report(ExitReason::Timeout, None, Some(9))),
            124
        );
        assert_eq!(
            report_exit_code(&report(ExitReason::Timeout, Some(0), None)),
            124
        );
        assert_eq!(
            report_exit_code(&report(ExitReason::Oom, None, Some(9))),
            137
        );
        assert_eq!(report_exit_code(&report(ExitReason::Oom, None, None)), 137);
        assert_eq!(report_exit_code(&report(ExitReason::Oom, Some(3), None)), 3);
        assert_eq!(
            report_exit_code(&report(ExitReason::FailedToStart, None, None)),
            125
        );
        assert_eq!(
            report_exit_code(&report(ExitReason::FailedToStart, Some(127), None)),
            127
        );
    }

    #[test]
    fn error_codes() {
        assert_eq!(error_exit_code(ErrorCode::NotFound), 127);
        assert_eq!(error_exit_code(ErrorCode::NotExecutable), 126);
        for code in [
            ErrorCode::Admission,
            ErrorCode::SessionLimit,
            ErrorCode::Protocol,
            ErrorCode::Refused,
            ErrorCode::Internal,
            ErrorCode::Timeout,
        ] {
            assert_eq!(error_exit_code(code), 125, "{code:?}");
        }
    }
}
