//! Landlock, as the exec shim uses it: the kernel's ABI, and a domain that handles no
//! filesystem access (the view is built by mounts) but confines ptrace — and every
//! `/proc/PID` access that goes through `ptrace_may_access` — and, from ABI 6, signals and
//! abstract Unix sockets to the domain and the domains nested in it.

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask `landlock_create_ruleset` for the ABI version.
const CREATE_RULESET_VERSION: u32 = 1 << 0;
/// `LANDLOCK_ACCESS_FS_MAKE_BLOCK`: creating block devices (needs `CAP_MKNOD`, which a unit
/// never has): the one filesystem right handled when no scope is, because the kernel refuses
/// a ruleset that handles nothing. Denying it changes nothing a unit can do.
const ACCESS_FS_MAKE_BLOCK: u64 = 1 << 11;
/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET` (ABI 6).
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
/// `LANDLOCK_SCOPE_SIGNAL` (ABI 6).
const SCOPE_SIGNAL: u64 = 1 << 1;
/// The first ABI with scopes.
const ABI_SCOPES: u32 = 6;

/// `struct landlock_ruleset_attr` as of ABI 6. Older kernels accept the larger struct as
/// long as the fields they do not know are zero.
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// What a domain scopes beyond ptrace (which every Landlock domain confines).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Scopes {
    /// Signals only to processes in the domain (`LANDLOCK_SCOPE_SIGNAL`).
    pub signal: bool,
    /// Abstract Unix sockets only of the domain (`LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`).
    pub abstract_unix: bool,
}

impl Scopes {
    /// Everything the kernel with Landlock ABI `abi` can scope.
    pub fn supported_by(abi: u32) -> Self {
        let scoped = abi >= ABI_SCOPES;
        Self {
            signal: scoped,
            abstract_unix: scoped,
        }
    }

    /// As a log line says it: `signal,abstract-unix`, or `none`.
    pub fn to_arg(self) -> String {
        let mut names = Vec::new();
        if self.signal {
            names.push("signal");
        }
        if self.abstract_unix {
            names.push("abstract-unix");
        }
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(",")
        }
    }

    /// The `scoped` bits of the ruleset.
    pub fn bits(self) -> u64 {
        let mut bits = 0;
        if self.signal {
            bits |= SCOPE_SIGNAL;
        }
        if self.abstract_unix {
            bits |= SCOPE_ABSTRACT_UNIX_SOCKET;
        }
        bits
    }
}

/// The Landlock ABI version of the running kernel; an error when Landlock is not built in
/// or not enabled (ENOSYS, EOPNOTSUPP).
pub fn landlock_abi() -> std::io::Result<u32> {
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the syscall only
    // returns a number; it reads and writes no memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    u32::try_from(rc).map_err(|_| std::io::Error::other("bad Landlock ABI version"))
}

/// Enter a new Landlock domain that scopes `scopes` (and, as every domain does, ptrace).
pub fn restrict_self(scopes: Scopes) -> std::io::Result<()> {
    let scoped = scopes.bits();
    let attr = RulesetAttr {
        handled_access_fs: if scoped == 0 { ACCESS_FS_MAKE_BLOCK } else { 0 },
        handled_access_net: 0,
        scoped,
    };
    // SAFETY: `attr` is a live, initialised `landlock_ruleset_attr` of the size passed; the
    // kernel only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &raw const attr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::other("bad ruleset descriptor"))?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing else owns.
    let ruleset = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // systemd set it already (NoNewPrivileges=yes); restrict_self needs it.
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes no pointers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a ruleset descriptor and flags 0; no memory is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_restrict_self,
            std::os::fd::AsRawFd::as_raw_fd(&ruleset),
            0u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
