//! The unit's filesystem view as a plan (bubblewrap style): [`plan`] turns the spec into a
//! list of [`MountOp`]s without touching the system (unit-tested), [`compile`] turns them
//! into C strings before the clone, and [`apply`] performs one in the child with raw
//! syscalls.
//!
//! Every destination is resolved inside the new root by descriptor: `openat2` beneath the
//! root's descriptor, refusing every symlink on the way (the plan's paths are canonical, so
//! a symlink found now was swapped in since, and fails the start), and every mount goes
//! onto that descriptor with `move_mount` — never onto a path the kernel would resolve
//! again. A writable bind is checked after it is made: the destination must now show the
//! very directory that was bound.
//!
//! The order, as [`plan`] makes it:
//! 1. private propagation; the host's root bound on the new root and made read-only;
//! 2. fresh `/tmp` and `/var/tmp` (a working directory below them is bound into them);
//! 3. the writable binds — the working directory and the profile's writable paths, parents
//!    first — then the pins: a repository's `.git` on itself (it cannot be renamed away),
//!    the protected paths on themselves, read-only;
//! 4. the kernel's and the private filesystems — `/run`, `/dev`, `/proc`, `/sys` — and the
//!    covers (hidden paths, host sockets, kernel filesystems mounted elsewhere): after
//!    every bind, so that no bind can hide them;
//! 5. pivot_root into the new root, the old one detached.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::units::FsView;

/// Looks at the host's filesystem for the planner; tests pass a fake.
pub trait Probe {
    /// Whether `path` is a directory and not a symlink.
    fn real_dir(&self, path: &Path) -> bool;
    /// Whether `path` exists (following symlinks).
    fn exists(&self, path: &Path) -> bool;
}

/// The real filesystem.
pub struct HostProbe;

impl Probe for HostProbe {
    fn real_dir(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
}

/// A filesystem made fresh for the unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreshFs {
    /// A tmpfs with this root mode and, if given, size in bytes.
    Tmpfs {
        /// Mode of its root.
        mode: u32,
        /// Its size.
        size: Option<u64>,
    },
    /// proc of the unit's own pid namespace.
    Proc,
    /// sysfs of the unit's own network namespace (read-only).
    Sysfs,
    /// A private devpts instance.
    Devpts,
}

/// One step of building the view. Paths are as the unit will see them (absolute).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOp {
    /// Make every mount of the new namespace private: nothing propagates back to the host.
    MakePrivate,
    /// Bind the host's `/` recursively onto `new_root` (a directory of wardend's own), and
    /// open it: every later destination is resolved beneath that descriptor.
    BindHostRoot {
        /// The new root, on the host.
        new_root: PathBuf,
    },
    /// Make the whole new root read-only, every submount included (mount_setattr).
    ReadOnlyRoot,
    /// A fresh filesystem (nosuid, nodev).
    Fresh {
        /// Where.
        target: PathBuf,
        /// What.
        fs: FreshFs,
        /// Read-only.
        read_only: bool,
    },
    /// Create a directory inside a fresh filesystem (an existing one is fine).
    Mkdir {
        /// The directory.
        path: PathBuf,
    },
    /// Create an empty file inside a fresh filesystem, to bind something onto.
    Touch {
        /// The file.
        path: PathBuf,
    },
    /// Create a symlink `link` → `contents` inside a fresh filesystem.
    Symlink {
        /// What the link points to.
        contents: PathBuf,
        /// The link.
        link: PathBuf,
    },
    /// Bind a host file (a device node, a resolver file) onto `target`.
    BindHost {
        /// The host path (root's own: `/dev/null`, `/run/systemd/resolve/...`).
        source: PathBuf,
        /// Where in the view.
        target: PathBuf,
        /// Read-only.
        read_only: bool,
    },
    /// Attach the detached mount tree `tree` (an open_tree clone made by wardend before
    /// the clone, from the very descriptor the client passed or from a writable path opened
    /// and checked by wardend) onto `target`, then check `target` shows it.
    Attach {
        /// The open_tree fd.
        tree: RawFd,
        /// Where.
        target: PathBuf,
        /// Made read-only (every submount too) before it is attached.
        read_only: bool,
    },
    /// Mount `target` on itself (read-only, or writable to pin a directory in place): a
    /// mount point cannot be renamed, removed or replaced. `target` may be a symlink.
    Pin {
        /// The path.
        target: PathBuf,
        /// Read-only.
        read_only: bool,
    },
    /// Cover `target`: an empty read-only tmpfs over a directory, `/dev/null` read-only
    /// over anything else (a socket then refuses connections). Skipped if `target` is gone.
    Cover {
        /// The path.
        target: PathBuf,
    },
    /// pivot_root into the new root and detach the old one.
    PivotRoot,
}

/// Directories that get fresh filesystems before the writable binds (binds may go into
/// them).
const FRESH_TEMP: [&str; 2] = ["/tmp", "/var/tmp"];

/// Directories whose host content never reaches a unit (what is bound into a fresh
/// `/tmp` or `/var/tmp` does).
const FRESH: [&str; 6] = ["/tmp", "/var/tmp", "/run", "/dev", "/proc", "/sys"];

/// Host devices every unit gets in its /dev.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// What the planner needs from the spec.
#[derive(Debug, Clone)]
pub struct ViewSpec<'a> {
    /// An empty host directory the new root is built on.
    pub new_root: &'a Path,
    /// A detached clone of the cwd's mount tree, when the cwd is writable — or read-only
    /// but under a fresh `/tmp` or `/var/tmp`, where it must be bound to be there at all.
    pub cwd_tree: Option<RawFd>,
    /// Whether the cwd is writable (else its bind, if any, is read-only).
    pub cwd_writable: bool,
    /// The cwd's path.
    pub cwd_path: &'a Path,
    /// Extra writable paths: a clone of each, and where it goes.
    pub writable: &'a [(RawFd, PathBuf)],
    /// What policy resolved.
    pub fs: &'a FsView,
    /// The size of each private tmpfs (the unit's memory limit: tmpfs pages are memory).
    pub tmpfs_size: Option<u64>,
}

/// The plan: a pure function of the spec and what `probe` says about the host.
pub fn plan(spec: &ViewSpec<'_>, probe: &dyn Probe) -> Vec<MountOp> {
    let tmpfs = |mode| FreshFs::Tmpfs {
        mode,
        size: spec.tmpfs_size,
    };
    let mut ops = vec![
        MountOp::MakePrivate,
        MountOp::BindHostRoot {
            new_root: spec.new_root.to_path_buf(),
        },
        // Read-only before anything writable is bound in: binds made later keep their own
        // flags.
        MountOp::ReadOnlyRoot,
    ];
    for dir in FRESH_TEMP {
        if probe.real_dir(Path::new(dir)) {
            ops.push(fresh(dir, tmpfs(0o1777), false));
        }
    }

    // The binds, parents before children (a parent bound later would cover a child).
    let mut binds: Vec<(RawFd, &Path, bool)> = spec
        .cwd_tree
        .map(|t| (t, spec.cwd_path, !spec.cwd_writable))
        .into_iter()
        .collect();
    for (tree, path) in spec.writable {
        if path.is_absolute() {
            binds.push((*tree, path, false));
        }
    }
    binds.sort_by_key(|(_, p, _)| p.components().count());
    binds.dedup_by(|a, b| a.1 == b.1);
    for &(tree, path, read_only) in &binds {
        // Inside a fresh tmpfs the mount point does not exist yet.
        mkdir_parents_in_fresh(&mut ops, path);
        ops.push(MountOp::Attach {
            tree,
            target: path.to_path_buf(),
            read_only,
        });
    }
    let bound = |p: &Path| binds.iter().any(|(_, b, _)| p.starts_with(b));
    let mut pins: Vec<(&Path, bool)> = spec
        .fs
        .pinned
        .iter()
        .map(|p| (p.as_path(), false))
        .chain(spec.fs.protected.iter().map(|p| (p.as_path(), true)))
        .filter(|(p, _)| bound(p))
        .collect();
    pins.sort_by_key(|(p, _)| p.components().count());
    for (target, read_only) in pins {
        ops.push(MountOp::Pin {
            target: target.to_path_buf(),
            read_only,
        });
    }

    // The private and kernel filesystems, after every bind.
    if probe.real_dir(Path::new("/run")) {
        ops.push(fresh("/run", tmpfs(0o755), false));
        for file in &spec.fs.run_files {
            mkdir_parents_in_fresh(&mut ops, file.parent().unwrap_or(file));
            ops.push(MountOp::Touch { path: file.clone() });
            ops.push(MountOp::BindHost {
                source: file.clone(),
                target: file.clone(),
                read_only: true,
            });
        }
    }
    dev(&mut ops, spec.tmpfs_size, probe);
    ops.push(fresh("/proc", FreshFs::Proc, false));
    if probe.real_dir(Path::new("/sys")) {
        ops.push(fresh("/sys", FreshFs::Sysfs, true));
    }

    // Covers last: hidden paths, host sockets, kernel filesystems elsewhere.
    let visible = |p: &Path| !FRESH.iter().any(|f| p.starts_with(f)) || bound(p);
    let covers = spec
        .fs
        .hidden
        .iter()
        .chain(&spec.fs.sockets)
        .chain(&spec.fs.kernel_mounts)
        .filter(|p| p.is_absolute() && p != &Path::new("/") && visible(p));
    for target in covers {
        ops.push(MountOp::Cover {
            target: target.clone(),
        });
    }
    ops.push(MountOp::PivotRoot);
    ops
}

fn fresh(target: &str, fs: FreshFs, read_only: bool) -> MountOp {
    MountOp::Fresh {
        target: target.into(),
        fs,
        read_only,
    }
}

/// The minimal /dev: a tmpfs with the host's harmless devices bound in, /dev/shm, /dev/pts
/// and the usual symlinks.
fn dev(ops: &mut Vec<MountOp>, shm_size: Option<u64>, probe: &dyn Probe) {
    let dev = Path::new("/dev");
    ops.push(fresh(
        "/dev",
        FreshFs::Tmpfs {
            mode: 0o755,
            size: Some(1 << 20),
        },
        false,
    ));
    for name in DEVICES {
        let source = dev.join(name);
        if probe.exists(&source) {
            ops.push(MountOp::Touch {
                path: dev.join(name),
            });
            ops.push(MountOp::BindHost {
                source: source.clone(),
                target: source,
                read_only: false,
            });
        }
    }
    ops.push(MountOp::Mkdir {
        path: dev.join("shm"),
    });
    ops.push(fresh(
        "/dev/shm",
        FreshFs::Tmpfs {
            mode: 0o1777,
            size: shm_size,
        },
        false,
    ));
    ops.push(MountOp::Mkdir {
        path: dev.join("pts"),
    });
    ops.push(fresh("/dev/pts", FreshFs::Devpts, false));
    ops.push(MountOp::Symlink {
        contents: "pts/ptmx".into(),
        link: dev.join("ptmx"),
    });
    ops.push(MountOp::Symlink {
        contents: "/proc/self/fd".into(),
        link: dev.join("fd"),
    });
    for (i, name) in ["stdin", "stdout", "stderr"].into_iter().enumerate() {
        ops.push(MountOp::Symlink {
            contents: format!("/proc/self/fd/{i}").into(),
            link: dev.join(name),
        });
    }
}

fn mkdir_parents_in_fresh(ops: &mut Vec<MountOp>, path: &Path) {
    let Some(fresh) = FRESH.iter().find(|f| path.starts_with(f)) else {
        return;
    };
    let mut dir = PathBuf::from(fresh);
    for c in path
        .strip_prefix(fresh)
        .into_iter()
        .flat_map(|p| p.components())
    {
        dir.push(c);
        ops.push(MountOp::Mkdir { path: dir.clone() });
    }
}

/// A [`MountOp`] with its strings ready for the child.
#[derive(Debug)]
pub struct CompiledOp {
    op: MountOp,
    /// The destination relative to the new root (`.` for the root itself).
    target: CString,
    /// The destination's parent, relative to the new root, and its last component (for the
    /// operations that create something).
    parent: CString,
    name: CString,
    /// The host path of a new root, a bind source, or a symlink's contents.
    source: CString,
    /// A fresh filesystem's type and its options.
    fstype: CString,
    options: Vec<(CString, CString)>,
}

impl CompiledOp {
    /// The operation.
    pub fn op(&self) -> &MountOp {
        &self.op
    }
}

/// Turn the plan into C strings (before the clone: the child does not allocate).
pub fn compile(ops: Vec<MountOp>) -> std::io::Result<Vec<CompiledOp>> {
    ops.into_iter().map(compile_one).collect()
}

fn compile_one(op: MountOp) -> std::io::Result<CompiledOp> {
    let empty = Path::new("");
    let (target, source): (&Path, &Path) = match &op {
        MountOp::MakePrivate | MountOp::ReadOnlyRoot | MountOp::PivotRoot => (empty, empty),
        MountOp::BindHostRoot { new_root } => (empty, new_root),
        MountOp::Fresh { target, .. }
        | MountOp::Attach { target, .. }
        | MountOp::Pin { target, .. }
        | MountOp::Cover { target } => (target, empty),
        MountOp::Mkdir { path } | MountOp::Touch { path } => (path, empty),
        MountOp::Symlink { contents, link } => (link, contents),
        MountOp::BindHost { source, target, .. } => (target, source),
    };
    let (fstype, options): (&str, Vec<(String, String)>) = match &op {
        MountOp::Fresh { fs, .. } => match fs {
            FreshFs::Tmpfs { mode, size } => (
                "tmpfs",
                std::iter::once(("mode".to_string(), format!("{mode:o}")))
                    .chain(size.map(|s| ("size".to_string(), s.to_string())))
                    .collect(),
            ),
            FreshFs::Proc => ("proc", vec![]),
            FreshFs::Sysfs => ("sysfs", vec![]),
            FreshFs::Devpts => (
                "devpts",
                vec![
                    ("ptmxmode".into(), "0666".into()),
                    ("mode".into(), "0620".into()),
                ],
            ),
        },
        _ => ("", vec![]),
    };
    let rel = relative(target);
    let parent = target.parent().map_or_else(|| PathBuf::from("."), relative);
    let name = target.file_name().map(|n| n.as_bytes()).unwrap_or(b".");
    Ok(CompiledOp {
        target: cstr(rel.as_os_str().as_bytes())?,
        parent: cstr(parent.as_os_str().as_bytes())?,
        name: cstr(name)?,
        source: cstr(source.as_os_str().as_bytes())?,
        fstype: cstr(fstype.as_bytes())?,
        options: options
            .into_iter()
            .map(|(k, v)| Ok((cstr(k.as_bytes())?, cstr(v.as_bytes())?)))
            .collect::<std::io::Result<_>>()?,
        op,
    })
}

/// A view path relative to the new root (`.` for `/`).
fn relative(p: &Path) -> PathBuf {
    match p.strip_prefix("/") {
        Ok(r) if r.as_os_str().is_empty() => PathBuf::from("."),
        Ok(r) => r.to_path_buf(),
        Err(_) if p.as_os_str().is_empty() => PathBuf::from("."),
        Err(_) => p.to_path_buf(),
    }
}

fn cstr(b: &[u8]) -> std::io::Result<CString> {
    CString::new(b).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains a NUL byte")
    })
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// A detached clone of the mount tree at `dir` (recursive, close-on-exec), for
/// [`MountOp::Attach`]. Made in the parent: a mount of our namespace can only be cloned
/// from inside it, and the clone, being detached, can be attached in the child's namespace.
pub fn clone_tree(dir: std::os::fd::BorrowedFd<'_>) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let flags = OPEN_TREE_CLONE
        | libc::O_CLOEXEC as libc::c_uint
        | libc::AT_EMPTY_PATH as libc::c_uint
        | AT_RECURSIVE;
    // SAFETY: open_tree on a borrowed directory fd with an empty path.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, dir.as_raw_fd(), c"".as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new fd that we own.
    let tree = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as RawFd) };
    // A clone of a shared mount (every mount is, where systemd is PID 1) is a peer of it:
    // every mount later made inside the unit's copy — the pins, the covers — would
    // propagate back to the host's. Private, before it goes anywhere.
    sys::set_private(tree.as_raw_fd()).map_err(std::io::Error::from_raw_os_error)?;
    Ok(tree)
}

/// What the child carries from one operation to the next.
#[derive(Debug)]
pub struct ApplyState {
    /// The new root, once bound (every destination is resolved beneath it).
    root: RawFd,
}

impl ApplyState {
    /// Before the first operation.
    pub const fn new() -> Self {
        Self { root: -1 }
    }
}

impl Default for ApplyState {
    fn default() -> Self {
        Self::new()
    }
}

/// Perform one operation. Runs in the child after clone: raw syscalls only, no
/// allocation. Returns the errno on failure.
pub fn apply(c: &CompiledOp, st: &mut ApplyState) -> Result<(), i32> {
    use sys::{Fd, MOVE_BOTH_EMPTY};
    match &c.op {
        MountOp::MakePrivate => sys::mount_private_rec(),
        MountOp::BindHostRoot { .. } => {
            sys::bind_root_onto(&c.source)?;
            st.root = sys::open_dir(&c.source)?;
            Ok(())
        }
        MountOp::ReadOnlyRoot => sys::set_read_only(st.root, true),
        MountOp::Fresh { fs, read_only, .. } => {
            let target = Fd(sys::resolve(st.root, &c.target, true)?);
            let attrs = match fs {
                FreshFs::Tmpfs { .. } => sys::NOSUID_NODEV,
                // Its nodes are the ptys themselves.
                FreshFs::Devpts => sys::NOSUID_NOEXEC,
                FreshFs::Proc | FreshFs::Sysfs => sys::NOSUID_NODEV_NOEXEC,
            };
            let options = c.options.iter().map(|(k, v)| (k.as_c_str(), v.as_c_str()));
            let mnt = Fd(sys::fresh_mount(&c.fstype, options, attrs, *read_only)?);
            sys::move_mount(mnt.0, target.0, MOVE_BOTH_EMPTY)
        }
        MountOp::Mkdir { .. } => {
            let parent = Fd(sys::resolve(st.root, &c.parent, true)?);
            match sys::mkdirat(parent.0, &c.name) {
                Err(libc::EEXIST) => Ok(()),
                r => r,
            }
        }
        MountOp::Touch { .. } => {
            let parent = Fd(sys::resolve(st.root, &c.parent, true)?);
            sys::touchat(parent.0, &c.name)
        }
        MountOp::Symlink { .. } => {
            let parent = Fd(sys::resolve(st.root, &c.parent, true)?);
            sys::symlinkat(&c.source, parent.0, &c.name)
        }
        MountOp::BindHost { read_only, .. } => {
            let tree = Fd(sys::clone_path(&c.source)?);
            if *read_only {
                sys::set_read_only(tree.0, false)?;
            }
            let target = Fd(sys::resolve(st.root, &c.target, false)?);
            sys::move_mount(tree.0, target.0, MOVE_BOTH_EMPTY)
        }
        MountOp::Attach {
            tree, read_only, ..
        } => {
            if *read_only {
                sys::set_read_only(*tree, true)?;
            }
            let target = Fd(sys::resolve(st.root, &c.target, true)?);
            sys::move_mount(*tree, target.0, MOVE_BOTH_EMPTY)?;
            // Check after: the destination, looked up again, is the directory bound.
            let now = Fd(sys::resolve(st.root, &c.target, true)?);
            if sys::same_inode(now.0, *tree)? {
                Ok(())
            } else {
                Err(libc::ESTALE)
            }
        }
        MountOp::Pin { read_only, .. } => {
            let target = match sys::resolve(st.root, &c.target, false) {
                Err(libc::ENOENT) => return Ok(()),
                r => Fd(r?),
            };
            let tree = Fd(sys::clone_fd(target.0)?);
            if *read_only {
                sys::set_read_only(tree.0, true)?;
            }
            sys::move_mount(tree.0, target.0, MOVE_BOTH_EMPTY)
        }
        MountOp::Cover { .. } => {
            let target = match sys::resolve(st.root, &c.target, false) {
                Err(libc::ENOENT) => return Ok(()),
                r => Fd(r?),
            };
            let cover = if sys::is_dir(target.0)? {
                let options = [(c"mode", c"755"), (c"size", c"4096")].into_iter();
                Fd(sys::fresh_mount(
                    c"tmpfs",
                    options,
                    sys::NOSUID_NODEV_NOEXEC,
                    true,
                )?)
            } else {
                let null = Fd(sys::clone_path(c"/dev/null")?);
                sys::set_read_only(null.0, false)?;
                null
            };
            sys::move_mount(cover.0, target.0, MOVE_BOTH_EMPTY)
        }
        MountOp::PivotRoot => sys::pivot_into(st.root),
    }
}

/// The system calls of [`apply`]: each takes C strings and descriptors valid for the
/// call, and returns the errno on failure. Async-signal-safe: no allocation, no locks.
mod sys {
    use std::ffi::CStr;
    use std::os::fd::RawFd;

    use super::{AT_RECURSIVE, OPEN_TREE_CLONE};

    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const MOUNT_ATTR_NOEXEC: u64 = 0x8;
    pub const NOSUID_NODEV: u64 = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    pub const NOSUID_NODEV_NOEXEC: u64 = NOSUID_NODEV | MOUNT_ATTR_NOEXEC;
    pub const NOSUID_NOEXEC: u64 = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    pub const MOVE_BOTH_EMPTY: libc::c_uint = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH;
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
    const RESOLVE_BENEATH: u64 = 0x08;

    /// `struct mount_attr` of linux/mount.h.
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }

    /// `struct open_how` of linux/openat2.h.
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }

    /// A descriptor closed when dropped.
    pub struct Fd(pub RawFd);

    impl Drop for Fd {
        fn drop(&mut self) {
            // SAFETY: a descriptor this module opened, closed once.
            unsafe { libc::close(self.0) };
        }
    }

    fn errno() -> i32 {
        super::errno()
    }

    fn ok(r: libc::c_long) -> Result<(), i32> {
        if r < 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    fn fd(r: libc::c_long) -> Result<RawFd, i32> {
        if r < 0 {
            Err(errno())
        } else {
            RawFd::try_from(r).map_err(|_| libc::EBADF)
        }
    }

    pub fn mount_private_rec() -> Result<(), i32> {
        // SAFETY: null source, type and data are accepted for a propagation change; "/" is
        // a valid C string.
        let r = unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        };
        ok(r.into())
    }

    /// Bind the host's `/` recursively onto `new_root` (a path of wardend's own).
    pub fn bind_root_onto(new_root: &CStr) -> Result<(), i32> {
        // SAFETY: valid C strings; null type and data for a bind.
        let r = unsafe {
            libc::mount(
                c"/".as_ptr(),
                new_root.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            )
        };
        ok(r.into())
    }

    pub fn open_dir(path: &CStr) -> Result<RawFd, i32> {
        // SAFETY: a valid C string.
        let r = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        fd(r.into())
    }

    /// `rel` beneath `root`, no symlink followed anywhere (with `dir`, it must be a
    /// directory; else the last component may be a symlink, which is opened itself).
    pub fn resolve(root: RawFd, rel: &CStr, dir: bool) -> Result<RawFd, i32> {
        let extra = if dir {
            libc::O_DIRECTORY
        } else {
            libc::O_NOFOLLOW
        };
        let how = OpenHow {
            flags: (libc::O_PATH | libc::O_CLOEXEC | extra) as u64,
            mode: 0,
            resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        // SAFETY: `rel` is a valid C string and `how` an open_how of the size passed.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root,
                rel.as_ptr(),
                &raw const how,
                std::mem::size_of::<OpenHow>(),
            )
        };
        fd(r)
    }

    /// Make the tree at `mnt` private, every submount too: nothing mounted in it
    /// propagates anywhere else, nothing propagates in.
    pub fn set_private(mnt: RawFd) -> Result<(), i32> {
        let attr = MountAttr {
            attr_set: 0,
            attr_clr: 0,
            propagation: libc::MS_PRIVATE,
            userns_fd: 0,
        };
        // SAFETY: an empty C string and a mount_attr of the size passed, alive for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                mnt,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
                &raw const attr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        ok(r)
    }

    pub fn set_read_only(mnt: RawFd, recursive: bool) -> Result<(), i32> {
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        let flags = libc::AT_EMPTY_PATH as libc::c_uint | if recursive { AT_RECURSIVE } else { 0 };
        // SAFETY: an empty C string and a mount_attr of the size passed, alive for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                mnt,
                c"".as_ptr(),
                flags,
                &raw const attr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        ok(r)
    }

    /// A new, detached filesystem of `fstype` with `options`.
    pub fn fresh_mount<'s>(
        fstype: &CStr,
        options: impl Iterator<Item = (&'s CStr, &'s CStr)>,
        attrs: u64,
        read_only: bool,
    ) -> Result<RawFd, i32> {
        // SAFETY: a valid C string and plain flags.
        let fs = Fd(fd(unsafe {
            libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC)
        })?);
        for (key, value) in options {
            // SAFETY: two valid C strings.
            ok(unsafe {
                libc::syscall(
                    libc::SYS_fsconfig,
                    fs.0,
                    FSCONFIG_SET_STRING,
                    key.as_ptr(),
                    value.as_ptr(),
                    0,
                )
            })?;
        }
        // SAFETY: no pointers are passed for CMD_CREATE.
        ok(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.0,
                FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_void>(),
                0,
            )
        })?;
        let attrs = attrs | if read_only { MOUNT_ATTR_RDONLY } else { 0 };
        // SAFETY: plain integers.
        fd(unsafe { libc::syscall(libc::SYS_fsmount, fs.0, FSMOUNT_CLOEXEC, attrs) })
    }

    pub fn move_mount(from: RawFd, to: RawFd, flags: libc::c_uint) -> Result<(), i32> {
        // SAFETY: descriptors and empty C strings.
        ok(unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                from,
                c"".as_ptr(),
                to,
                c"".as_ptr(),
                flags,
            )
        })
    }

    /// A detached copy of the mount at host path `path` (root's own paths only).
    pub fn clone_path(path: &CStr) -> Result<RawFd, i32> {
        let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
        // SAFETY: a valid C string.
        fd(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) })
    }

    /// A detached copy, recursive, of what `target` (a resolved descriptor) shows.
    pub fn clone_fd(target: RawFd) -> Result<RawFd, i32> {
        let flags = OPEN_TREE_CLONE
            | libc::O_CLOEXEC as libc::c_uint
            | libc::AT_EMPTY_PATH as libc::c_uint
            | AT_RECURSIVE;
        // SAFETY: a descriptor and an empty C string.
        fd(unsafe { libc::syscall(libc::SYS_open_tree, target, c"".as_ptr(), flags) })
    }

    fn stat(fd: RawFd) -> Result<libc::stat, i32> {
        // SAFETY: a zeroed stat is valid for fstat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a descriptor and a stat struct on our stack.
        ok(unsafe { libc::fstat(fd, &mut st) }.into())?;
        Ok(st)
    }

    pub fn is_dir(fd: RawFd) -> Result<bool, i32> {
        Ok(stat(fd)?.st_mode & libc::S_IFMT == libc::S_IFDIR)
    }

    pub fn same_inode(a: RawFd, b: RawFd) -> Result<bool, i32> {
        let (a, b) = (stat(a)?, stat(b)?);
        Ok(a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    }

    pub fn mkdirat(parent: RawFd, name: &CStr) -> Result<(), i32> {
        // SAFETY: a descriptor and a valid C string.
        ok(unsafe { libc::mkdirat(parent, name.as_ptr(), 0o755) }.into())
    }

    pub fn touchat(parent: RawFd, name: &CStr) -> Result<(), i32> {
        // SAFETY: a descriptor and a valid C string; the fd returned is closed right away.
        let r = unsafe {
            libc::openat(
                parent,
                name.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o644,
            )
        };
        let _file = Fd(fd(r.into())?);
        Ok(())
    }

    pub fn symlinkat(contents: &CStr, parent: RawFd, name: &CStr) -> Result<(), i32> {
        // SAFETY: valid C strings and a descriptor.
        ok(unsafe { libc::symlinkat(contents.as_ptr(), parent, name.as_ptr()) }.into())
    }

    /// pivot_root(".", ".") in the new root: the old root ends up stacked under the new one
    /// and is detached right away; no directory for it is needed in the (read-only) root.
    pub fn pivot_into(root: RawFd) -> Result<(), i32> {
        // SAFETY: a descriptor.
        ok(unsafe { libc::fchdir(root) }.into())?;
        // SAFETY: two valid C strings.
        ok(unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) })?;
        // SAFETY: a valid C string.
        ok(unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) }.into())?;
        // SAFETY: a valid C string.
        ok(unsafe { libc::chdir(c"/".as_ptr()) }.into())?;
        // SAFETY: our descriptor, closed once; the root stays ours as `/`.
        unsafe { libc::close(root) };
        Ok(())
    }
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    // SAFETY: __errno_location returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    struct Fake {
        dirs: HashSet<PathBuf>,
        files: HashSet<PathBuf>,
    }

    impl Probe for Fake {
        fn real_dir(&self, path: &Path) -> bool {
            self.dirs.contains(path)
        }
        fn exists(&self, path: &Path) -> bool {
            self.dirs.contains(path) || self.files.contains(path)
        }
    }

    fn host() -> Fake {
        Fake {
            dirs: ["/tmp", "/var/tmp", "/run", "/sys", "/dev"]
                .map(PathBuf::from)
                .into(),
            files: ["/dev/null", "/dev/zero"].map(PathBuf::from).into(),
        }
    }

    fn pos(ops: &[MountOp], f: impl Fn(&MountOp) -> bool) -> usize {
        ops.iter().position(f).unwrap_or(usize::MAX)
    }

    fn paths(v: &[&str]) -> Vec<PathBuf> {
        v.iter().map(PathBuf::from).collect()
    }

    fn view() -> FsView {
        FsView {
            cwd_writable: true,
            writable: paths(&["/srv/cache"]),
            hidden: paths(&[
                "/home/u/.ssh",
                "/home/u/.netrc",
                "/tmp/secret",
                "/home/u/project/.env",
            ]),
            protected: paths(&["/home/u/project/.git/hooks", "/home/u/project/.envrc"]),
            pinned: paths(&["/home/u/project/.git"]),
            sockets: paths(&["/home/u/agent.sock"]),
            kernel_mounts: paths(&["/srv/chroot/proc"]),
            run_files: paths(&["/run/systemd/resolve/stub-resolv.conf"]),
        }
    }

    #[test]
    fn the_view_is_read_only_with_writable_cwd_pins_and_covers_last() {
        let fs = view();
        let writable = vec![(11, PathBuf::from("/srv/cache"))];
        let spec = ViewSpec {
            new_root: Path::new("/run/r"),
            cwd_tree: Some(9),
            cwd_writable: true,
            cwd_path: Path::new("/home/u/project"),
            writable: &writable,
            fs: &fs,
            tmpfs_size: Some(1 << 30),
        };
        let ops = plan(&spec, &host());
        assert_eq!(
            &ops[..3],
            &[
                MountOp::MakePrivate,
                MountOp::BindHostRoot {
                    new_root: "/run/r".into()
                },
                MountOp::ReadOnlyRoot
            ]
        );
        assert_eq!(ops.last(), Some(&MountOp::PivotRoot));
        let cwd = pos(&ops, |o| {
            o == &MountOp::Attach {
                tree: 9,
                target: "/home/u/project".into(),
                read_only: false,
            }
        });
        let git = pos(
            &ops,
            |o| matches!(o, MountOp::Pin { target, read_only: false } if target.ends_with(".git")),
        );
        let hooks = pos(
            &ops,
            |o| matches!(o, MountOp::Pin { target, read_only: true } if target.ends_with("hooks")),
        );
        assert!(cwd < git && git < hooks && hooks < ops.len(), "{ops:#?}");
        // Tmpfs of the unit's size.
        assert!(ops.contains(&MountOp::Fresh {
            target: "/tmp".into(),
            fs: FreshFs::Tmpfs {
                mode: 0o1777,
                size: Some(1 << 30)
            },
            read_only: false
        }));
        // Every kernel and private filesystem and every cover comes after every bind and pin.
        let last_bind = ops
            .iter()
            .rposition(|o| matches!(o, MountOp::Attach { .. } | MountOp::Pin { .. }))
            .unwrap_or(usize::MAX);
        for t in ["/run", "/dev", "/proc", "/sys"] {
            let at = pos(
                &ops,
                |o| matches!(o, MountOp::Fresh { target, .. } if target == Path::new(t)),
            );
            assert!(last_bind < at && at < ops.len(), "{t}: {ops:#?}");
        }
        let first_cover = pos(&ops, |o| matches!(o, MountOp::Cover { .. }));
        assert!(last_bind < first_cover);
        // No bind goes on or above a fresh filesystem.
        for o in &ops {
            if let MountOp::Attach { target, .. } | MountOp::Pin { target, .. } = o {
                assert!(
                    !FRESH.iter().any(|f| Path::new(f).starts_with(target)),
                    "{target:?}"
                );
            }
        }
        // Covers: hidden paths (also inside the writable cwd), sockets, kernel mounts; not
        // what lies under a fresh filesystem.
        let covered: Vec<&Path> = ops
            .iter()
            .filter_map(|o| match o {
                MountOp::Cover { target } => Some(target.as_path()),
                _ => None,
            })
            .collect();
        assert_eq!(
            covered,
            paths(&[
                "/home/u/.ssh",
                "/home/u/.netrc",
                "/home/u/project/.env",
                "/home/u/agent.sock",
                "/srv/chroot/proc"
            ])
        );
        // The resolver file is bound read-only into the fresh /run.
        let run = pos(
            &ops,
            |o| matches!(o, MountOp::Fresh { target, .. } if target == Path::new("/run")),
        );
        let resolv = pos(
            &ops,
            |o| matches!(o, MountOp::BindHost { read_only: true, target, .. } if target.ends_with("stub-resolv.conf")),
        );
        assert!(run < resolv && resolv < ops.len());
        // Sysfs read-only; devices skipped when the host lacks them.
        assert!(ops.contains(&MountOp::Fresh {
            target: "/sys".into(),
            fs: FreshFs::Sysfs,
            read_only: true
        }));
        assert!(!ops
            .iter()
            .any(|o| matches!(o, MountOp::BindHost { source, .. } if source.ends_with("tty"))));
        let compiled = compile(ops);
        assert!(compiled.is_ok());
        let compiled = compiled.unwrap_or_default();
        let t = |i: usize| {
            compiled
                .get(i)
                .map(|c| c.target.to_string_lossy().into_owned())
        };
        assert_eq!(t(cwd).as_deref(), Some("home/u/project"));
    }

    #[test]
    fn a_read_only_cwd_is_not_bound_and_pins_outside_binds_are_dropped() {
        let fs = view();
        let spec = ViewSpec {
            new_root: Path::new("/r"),
            cwd_tree: None,
            cwd_writable: false,
            cwd_path: Path::new("/home/u"),
            writable: &[],
            fs: &fs,
            tmpfs_size: None,
        };
        let ops = plan(&spec, &host());
        assert!(!ops
            .iter()
            .any(|o| matches!(o, MountOp::Attach { .. } | MountOp::Pin { .. })));
        assert!(ops.contains(&MountOp::Cover {
            target: "/home/u/.ssh".into()
        }));
    }

    #[test]
    fn a_read_only_cwd_under_tmp_is_bound_read_only_and_covered_inside() {
        let fs = FsView {
            hidden: paths(&["/tmp/w/run"]),
            ..FsView::default()
        };
        let spec = ViewSpec {
            new_root: Path::new("/r"),
            cwd_tree: Some(7),
            cwd_writable: false,
            cwd_path: Path::new("/tmp/w"),
            writable: &[],
            fs: &fs,
            tmpfs_size: None,
        };
        let ops = plan(&spec, &host());
        let bind = pos(&ops, |o| {
            o == &MountOp::Attach {
                tree: 7,
                target: "/tmp/w".into(),
                read_only: true,
            }
        });
        let cover = pos(&ops, |o| {
            o == &MountOp::Cover {
                target: "/tmp/w/run".into(),
            }
        });
        assert!(bind < cover && cover < ops.len(), "{ops:#?}");
    }

    #[test]
    fn a_cwd_under_tmp_gets_its_mount_point_created_in_the_private_tmp() {
        let fs = FsView {
            hidden: paths(&["/tmp/w/proj/.git/secret"]),
            ..FsView::default()
        };
        let spec = ViewSpec {
            new_root: Path::new("/r"),
            cwd_tree: Some(3),
            cwd_writable: true,
            cwd_path: Path::new("/tmp/w/proj"),
            writable: &[],
            fs: &fs,
            tmpfs_size: None,
        };
        let ops = plan(&spec, &host());
        let tmp = pos(
            &ops,
            |o| matches!(o, MountOp::Fresh { target, .. } if target == Path::new("/tmp")),
        );
        let w = pos(&ops, |o| {
            o == &MountOp::Mkdir {
                path: "/tmp/w".into(),
            }
        });
        let proj = pos(&ops, |o| {
            o == &MountOp::Mkdir {
                path: "/tmp/w/proj".into(),
            }
        });
        let bind = pos(
            &ops,
            |o| matches!(o, MountOp::Attach { target, .. } if target == Path::new("/tmp/w/proj")),
        );
        assert!(
            tmp < w && w < proj && proj < bind && bind < ops.len(),
            "{ops:#?}"
        );
        // Inside the writable cwd, a hidden file is still covered.
        assert!(ops.contains(&MountOp::Cover {
            target: "/tmp/w/proj/.git/secret".into()
        }));
    }

    #[test]
    fn parents_are_bound_before_children() {
        let fs = FsView::default();
        let writable = vec![(4, PathBuf::from("/a/b/c")), (5, PathBuf::from("/a"))];
        let spec = ViewSpec {
            new_root: Path::new("/r"),
            cwd_tree: Some(3),
            cwd_writable: true,
            cwd_path: Path::new("/a/b"),
            writable: &writable,
            fs: &fs,
            tmpfs_size: None,
        };
        let ops = plan(&spec, &host());
        let targets: Vec<&PathBuf> = ops
            .iter()
            .filter_map(|o| match o {
                MountOp::Attach { target, .. } => Some(target),
                _ => None,
            })
            .collect();
        assert_eq!(
            targets,
            [Path::new("/a"), Path::new("/a/b"), Path::new("/a/b/c")]
        );
    }

    #[test]
    fn compiled_strings_are_relative_to_the_new_root() -> std::io::Result<()> {
        let c = compile(vec![
            MountOp::Fresh {
                target: "/".into(),
                fs: FreshFs::Proc,
                read_only: false,
            },
            MountOp::Mkdir {
                path: "/tmp/a/b".into(),
            },
            MountOp::Fresh {
                target: "/tmp".into(),
                fs: FreshFs::Tmpfs {
                    mode: 0o1777,
                    size: Some(4096),
                },
                read_only: false,
            },
        ])?;
        assert_eq!(c[0].target.as_c_str(), c".");
        assert_eq!(c[1].parent.as_c_str(), c"tmp/a");
        assert_eq!(c[1].name.as_c_str(), c"b");
        assert_eq!(c[2].fstype.as_c_str(), c"tmpfs");
        assert_eq!(
            c[2].options,
            vec![
                (CString::from(c"mode"), CString::from(c"1777")),
                (CString::from(c"size"), CString::from(c"4096"))
            ]
        );
        Ok(())
    }
}
