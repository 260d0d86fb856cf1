//! What the child tells wardend, typed: a failed start step (on the CLOEXEC start pipe, which
//! closes without data when exec succeeded) and the command's wait status (on the status
//! pipe, written by the unit's init when the command ended).
//!
//! Both are fixed-size records encoded on the stack, so the child can send them without
//! allocating.

use std::fmt;

/// The step of the child's start sequence that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Step {
    /// Writing itself into a v1 `cgroup.procs`.
    JoinCgroup = 1,
    /// One operation of the mount plan (its index is in the report).
    Mount = 2,
    /// Setting the hostname in the new uts namespace.
    Hostname = 3,
    /// Bringing `lo` up in the new network namespace.
    Loopback = 4,
    /// Entering the working directory inside the new root.
    Chdir = 5,
    /// The working directory in the new root is not the one the client passed.
    CwdMismatch = 6,
    /// setgroups(2).
    Setgroups = 7,
    /// setresgid(2).
    Setgid = 8,
    /// setresuid(2).
    Setuid = 9,
    /// prctl(PR_SET_NO_NEW_PRIVS).
    NoNewPrivs = 10,
    /// Forking the command from the unit's init.
    Fork = 11,
    /// Setting up stdin, stdout and stderr.
    Stdio = 12,
    /// Closing inherited descriptors.
    CloseFds = 13,
    /// execve(2) itself.
    Exec = 14,
    /// Installing the seccomp filter.
    Seccomp = 15,
}

impl Step {
    fn from_u32(v: u32) -> Option<Self> {
        use Step::*;
        [
            JoinCgroup,
            Mount,
            Hostname,
            Loopback,
            Chdir,
            CwdMismatch,
            Setgroups,
            Setgid,
            Setuid,
            NoNewPrivs,
            Fork,
            Stdio,
            CloseFds,
            Exec,
            Seccomp,
        ]
        .into_iter()
        .find(|s| *s as u32 == v)
    }

    /// What the step does, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Step::JoinCgroup => "joining the unit's v1 cgroups",
            Step::Mount => "building the filesystem view",
            Step::Hostname => "setting the hostname",
            Step::Loopback => "bringing up loopback",
            Step::Chdir => "entering the working directory",
            Step::CwdMismatch => "checking the working directory",
            Step::Setgroups => "setting supplementary groups",
            Step::Setgid => "setting the gid",
            Step::Setuid => "setting the uid",
            Step::NoNewPrivs => "setting no-new-privileges",
            Step::Fork => "forking the command",
            Step::Stdio => "setting up stdio",
            Step::CloseFds => "closing inherited descriptors",
            Step::Exec => "executing",
            Step::Seccomp => "installing the seccomp filter",
        }
    }
}

/// A start step that failed in the child, with its errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartFailure {
    /// The step.
    pub step: Step,
    /// For [`Step::Mount`], the index of the operation in the plan.
    pub index: u32,
    /// The errno.
    pub errno: i32,
}

impl StartFailure {
    /// The encoded size.
    pub const LEN: usize = 12;

    /// A failed setup step.
    pub fn setup_failed(step: Step, errno: i32) -> Self {
        Self {
            step,
            index: 0,
            errno,
        }
    }

    /// Operation `index` of the mount plan failed.
    pub fn mount_failed(index: usize, errno: i32) -> Self {
        Self {
            step: Step::Mount,
            index: u32::try_from(index).unwrap_or(u32::MAX),
            errno,
        }
    }

    /// execve failed.
    pub fn exec_failed(errno: i32) -> Self {
        Self::setup_failed(Step::Exec, errno)
    }

    /// The record, as the child writes it.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        let (step, rest) = b.split_at_mut(4);
        let (index, errno) = rest.split_at_mut(4);
        step.copy_from_slice(&(self.step as u32).to_ne_bytes());
        index.copy_from_slice(&self.index.to_ne_bytes());
        errno.copy_from_slice(&self.errno.to_ne_bytes());
        b
    }

    /// Decode a record; `None` if it is not one.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let word = |i: usize| -> Option<[u8; 4]> { b.get(i..i + 4)?.try_into().ok() };
        if b.len() != Self::LEN {
            return None;
        }
        Some(Self {
            step: Step::from_u32(u32::from_ne_bytes(word(0)?))?,
            index: u32::from_ne_bytes(word(4)?),
            errno: i32::from_ne_bytes(word(8)?),
        })
    }

    /// The OS error.
    pub fn error(&self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.errno)
    }
}

impl fmt::Display for StartFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.step.describe(), self.error())
    }
}

/// The command's wait status as its init saw it (waitpid's `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandStatus(pub i32);

impl CommandStatus {
    /// The encoded size.
    pub const LEN: usize = 4;

    /// The record, as the init writes it.
    pub fn encode(&self) -> [u8; Self::LEN] {
        self.0.to_ne_bytes()
    }

    /// Decode a record; `None` if it is not one.
    pub fn decode(b: &[u8]) -> Option<Self> {
        Some(Self(i32::from_ne_bytes(b.try_into().ok()?)))
    }

    /// The exit code, if the command exited.
    pub fn code(&self) -> Option<i32> {
        libc::WIFEXITED(self.0).then(|| libc::WEXITSTATUS(self.0))
    }

    /// The signal, if one ended the command.
    pub fn signal(&self) -> Option<i32> {
        libc::WIFSIGNALED(self.0).then(|| libc::WTERMSIG(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_failure_round_trips() {
        let f = StartFailure::mount_failed(7, libc::ENOENT);
        assert_eq!(StartFailure::decode(&f.encode()), Some(f));
        let e = StartFailure::exec_failed(libc::EACCES);
        assert_eq!(StartFailure::decode(&e.encode()), Some(e));
        assert!(e.to_string().starts_with("executing: "), "{e}");
        assert_eq!(StartFailure::decode(&[0; 12]), None);
        assert_eq!(StartFailure::decode(&[1; 5]), None);
    }

    #[test]
    fn status_decodes() {
        assert_eq!(CommandStatus(7 << 8).code(), Some(7));
        assert_eq!(CommandStatus(9).signal(), Some(9));
        assert_eq!(
            CommandStatus::decode(&CommandStatus(9).encode()),
            Some(CommandStatus(9))
        );
    }
}
