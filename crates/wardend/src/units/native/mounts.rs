//! The unit's filesystem view as a plan (bubblewrap style): [`plan`] turns the spec into a
//! list of [`MountOp`]s without touching the system (unit-tested), [`compile`] turns them into
//! C strings before the clone, and [`apply`] performs one in the child with raw syscalls.
//!
//! The view: the host's root bound recursively onto a new root and made read-only
//! recursively; a private /tmp, a fresh /proc, a minimal /dev; the cwd and the extra writable
//! paths bound writable; hidden paths covered; then pivot_root into it.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// What kind of file a path is on the host, as far as the plan cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// Anything else (file, device, socket...).
    File,
}

/// Looks at the host's filesystem for the planner; tests pass a fake.
pub trait Probe {
    /// The kind of `path` (following symlinks), or `None` if it does not exist.
    fn kind(&self, path: &Path) -> Option<Kind>;
}

/// The real filesystem.
pub struct HostProbe;

impl Probe for HostProbe {
    fn kind(&self, path: &Path) -> Option<Kind> {
        std::fs::metadata(path)
            .ok()
            .map(|m| if m.is_dir() { Kind::Dir } else { Kind::File })
    }
}

/// One step of building the view. Paths under the new root are absolute host paths already
/// joined onto it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOp {
    /// Make every mount of the new namespace private: nothing propagates back to the host.
    MakePrivate,
    /// Bind the host's `/` recursively onto `new_root`.
    BindHostRoot {
        /// The new root.
        new_root: PathBuf,
    },
    /// Make the tree at `target` read-only, every submount included (mount_setattr).
    ReadOnlyTree {
        /// The tree.
        target: PathBuf,
    },
    /// A fresh tmpfs (nosuid, nodev).
    Tmpfs {
        /// Where.
        target: PathBuf,
        /// Mode of its root.
        mode: u32,
        /// Read-only (used to hide a directory).
        read_only: bool,
    },
    /// A fresh proc for the new pid namespace.
    Proc {
        /// Where.
        target: PathBuf,
    },
    /// A private devpts instance.
    Devpts {
        /// Where.
        target: PathBuf,
    },
    /// Create a directory (an existing one is fine).
    Mkdir {
        /// The directory.
        path: PathBuf,
    },
    /// Create an empty file to bind a device onto.
    Touch {
        /// The file.
        path: PathBuf,
    },
    /// Create a symlink `link` → `contents`.
    Symlink {
        /// What the link points to.
        contents: PathBuf,
        /// The link.
        link: PathBuf,
    },
    /// Bind a host device node onto a file of the new /dev.
    BindDevice {
        /// The host node.
        source: PathBuf,
        /// The file in the new /dev.
        target: PathBuf,
    },
    /// Attach the detached mount tree `tree` onto `target`: a clone (open_tree, made before the
    /// clone) of the cwd from the very fd the client passed, or of an extra writable path
    /// opened and checked by wardend, so that no path is looked up again in the child.
    AttachTree {
        /// The open_tree fd.
        tree: RawFd,
        /// Where in the new root.
        target: PathBuf,
    },
    /// Cover a file with a read-only bind of /dev/null.
    HideFile {
        /// The file.
        target: PathBuf,
    },
    /// pivot_root into `new_root` and detach the old root.
    PivotRoot {
        /// The new root.
        new_root: PathBuf,
    },
}

/// Directories of the new root that get fresh filesystems: the host's content below them is
/// not visible anyway.
const FRESH: [&str; 3] = ["/tmp", "/dev", "/proc"];

/// Host devices every unit gets in its /dev.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// What the planner needs from the spec.
#[derive(Debug, Clone)]
pub struct ViewSpec<'a> {
    /// An empty host directory the new root is built on.
    pub new_root: &'a Path,
    /// A detached clone of the cwd's mount tree ([`clone_tree`]), attached in the child.
    pub cwd_tree: RawFd,
    /// The cwd's path (where it appears in the view).
    pub cwd_path: &'a Path,
    /// Extra writable paths that exist: a [`clone_tree`] of each, and where it goes.
    pub writable: &'a [(RawFd, PathBuf)],
    /// Hidden paths.
    pub hidden: &'a [PathBuf],
}

/// The plan: a pure function of the spec and what `probe` says about the host.
pub fn plan(spec: &ViewSpec<'_>, probe: &dyn Probe) -> Vec<MountOp> {
    let root = |p: &Path| under(spec.new_root, p);
    let mut ops = vec![
        MountOp::MakePrivate,
        MountOp::BindHostRoot {
            new_root: spec.new_root.to_path_buf(),
        },
        // Read-only before anything writable is bound in: binds made later keep their own flags.
        MountOp::ReadOnlyTree {
            target: spec.new_root.to_path_buf(),
        },
        MountOp::Tmpfs {
            target: root(Path::new("/tmp")),
            mode: 0o1777,
            read_only: false,
        },
        MountOp::Proc {
            target: root(Path::new("/proc")),
        },
    ];
    dev(&mut ops, &root(Path::new("/dev")), probe);

    // Writable binds, parents before children (a parent bound later would cover a child).
    let mut writable: Vec<(RawFd, &Path)> = vec![(spec.cwd_tree, spec.cwd_path)];
    for (tree, path) in spec.writable {
        if path.is_absolute() && !in_fresh(path, &["/proc", "/dev"]) {
            writable.push((*tree, path));
        }
    }
    writable.sort_by_key(|(_, p)| p.components().count());
    writable.dedup_by(|a, b| a.1 == b.1);
    for &(tree, path) in &writable {
        // Inside a fresh tmpfs the mount point does not exist yet.
        mkdir_parents_in_fresh(&mut ops, spec.new_root, path);
        ops.push(MountOp::AttachTree {
            tree,
            target: root(path),
        });
    }

    // Hidden paths last, so that they stay hidden inside writable binds too.
    for h in spec.hidden {
        let visible = !in_fresh(h, &FRESH) || writable.iter().any(|(_, w)| h.starts_with(w));
        match probe.kind(h) {
            _ if !h.is_absolute() || !visible => {}
            Some(Kind::Dir) => ops.push(MountOp::Tmpfs {
                target: root(h),
                mode: 0o755,
                read_only: true,
            }),
            Some(Kind::File) => ops.push(MountOp::HideFile { target: root(h) }),
            None => {}
        }
    }
    ops.push(MountOp::PivotRoot {
        new_root: spec.new_root.to_path_buf(),
    });
    ops
}

/// The minimal /dev: a tmpfs with the host's harmless devices bound in, /dev/shm, /dev/pts
/// and the usual symlinks.
fn dev(ops: &mut Vec<MountOp>, dev: &Path, probe: &dyn Probe) {
    ops.push(MountOp::Tmpfs {
        target: dev.to_path_buf(),
        mode: 0o755,
        read_only: false,
    });
    for name in DEVICES {
        let source = Path::new("/dev").join(name);
        if probe.kind(&source).is_some() {
            ops.push(MountOp::Touch {
                path: dev.join(name),
            });
            ops.push(MountOp::BindDevice {
                source,
                target: dev.join(name),
            });
        }
    }
    ops.push(MountOp::Mkdir {
        path: dev.join("shm"),
    });
    ops.push(MountOp::Tmpfs {
        target: dev.join("shm"),
        mode: 0o1777,
        read_only: false,
    });
    ops.push(MountOp::Mkdir {
        path: dev.join("pts"),
    });
    ops.push(MountOp::Devpts {
        target: dev.join("pts"),
    });
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

fn in_fresh(path: &Path, fresh: &[&str]) -> bool {
    fresh.iter().any(|f| path.starts_with(f))
}

fn mkdir_parents_in_fresh(ops: &mut Vec<MountOp>, new_root: &Path, path: &Path) {
    let Some(fresh) = FRESH.iter().find(|f| path.starts_with(f)) else {
        return;
    };
    let mut dir = PathBuf::from(fresh);
    for c in path
        .strip_prefix(fresh)
        .into_iter()
        .flat_map(|p| p.components())
    {
        if let Component::Normal(c) = c {
            dir.push(c);
            ops.push(MountOp::Mkdir {
                path: under(new_root, &dir),
            });
        }
    }
}

/// `p` (absolute, on the host) as seen under `new_root`.
fn under(new_root: &Path, p: &Path) -> PathBuf {
    new_root.join(p.strip_prefix("/").unwrap_or(p))
}

/// A [`MountOp`] with its strings ready for the child.
#[derive(Debug)]
pub struct CompiledOp {
    op: MountOp,
    first: CString,
    second: CString,
    data: CString,
}

impl CompiledOp {
    /// The operation.
    pub fn op(&self) -> &MountOp {
        &self.op
    }
}

/// Turn the plan into C strings (before the clone: the child cannot allocate).
pub fn compile(ops: Vec<MountOp>) -> std::io::Result<Vec<CompiledOp>> {
    ops.into_iter()
        .map(|op| {
            let (first, second, data): (&Path, &Path, String) = match &op {
                MountOp::MakePrivate => (Path::new("/"), Path::new(""), String::new()),
                MountOp::BindHostRoot { new_root } | MountOp::PivotRoot { new_root } => {
                    (new_root, Path::new(""), String::new())
                }
                MountOp::ReadOnlyTree { target }
                | MountOp::Proc { target }
                | MountOp::HideFile { target } => (target, Path::new(""), String::new()),
                MountOp::Tmpfs { target, mode, .. } => {
                    (target, Path::new(""), format!("mode={mode:o}"))
                }
                MountOp::Devpts { target } => (
                    target,
                    Path::new(""),
                    "newinstance,ptmxmode=0666,mode=620".into(),
                ),
                MountOp::Mkdir { path } | MountOp::Touch { path } => {
                    (path, Path::new(""), String::new())
                }
                MountOp::Symlink { contents, link } => (contents, link, String::new()),
                MountOp::BindDevice { source, target } => (source, target, String::new()),
                MountOp::AttachTree { target, .. } => (target, Path::new(""), String::new()),
            };
            Ok(CompiledOp {
                first: cstr(first.as_os_str().as_bytes())?,
                second: cstr(second.as_os_str().as_bytes())?,
                data: cstr(data.as_bytes())?,
                op,
            })
        })
        .collect()
}

fn cstr(b: &[u8]) -> std::io::Result<CString> {
    CString::new(b).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains a NUL byte")
    })
}

/// `struct mount_attr` of linux/mount.h.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const OPEN_TREE_CLONE: libc::c_uint = 1;

/// A detached clone of the mount tree at `dir` (recursive, close-on-exec), for
/// [`MountOp::AttachTree`]. Made in the parent: a mount of our namespace can only be cloned
/// from inside it (binding `/proc/self/fd/N` in the child fails with EINVAL), and the clone,
/// being detached, can be attached in the child's namespace.
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
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Perform one operation. Runs in the child after clone: raw syscalls only, no allocation.
/// Returns the errno on failure.
pub fn apply(c: &CompiledOp) -> Result<(), i32> {
    let (a, b, data) = (c.first.as_c_str(), c.second.as_c_str(), c.data.as_c_str());
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    match &c.op {
        MountOp::MakePrivate => sys::mount(None, a, None, libc::MS_REC | libc::MS_PRIVATE, None),
        MountOp::BindHostRoot { .. } => {
            sys::mount(Some(c"/"), a, None, libc::MS_BIND | libc::MS_REC, None)
        }
        MountOp::ReadOnlyTree { .. } => sys::read_only_tree(a),
        MountOp::Tmpfs { read_only, .. } => {
            let ro = if *read_only { libc::MS_RDONLY } else { 0 };
            sys::mount(
                Some(c"tmpfs"),
                a,
                Some(c"tmpfs"),
                nosuid_nodev | ro,
                Some(data),
            )
        }
        MountOp::Proc { .. } => sys::mount(
            Some(c"proc"),
            a,
            Some(c"proc"),
            nosuid_nodev | libc::MS_NOEXEC,
            None,
        ),
        MountOp::Devpts { .. } => sys::mount(
            Some(c"devpts"),
            a,
            Some(c"devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(data),
        ),
        MountOp::Mkdir { .. } => match sys::mkdir(a) {
            Err(libc::EEXIST) => Ok(()),
            r => r,
        },
        MountOp::Touch { .. } => sys::touch(a),
        MountOp::Symlink { .. } => sys::symlink(a, b),
        MountOp::BindDevice { .. } => sys::mount(Some(a), b, None, libc::MS_BIND, None),
        MountOp::AttachTree { tree, .. } => sys::move_mount(*tree, a),
        MountOp::HideFile { .. } => {
            sys::mount(Some(c"/dev/null"), a, None, libc::MS_BIND, None)?;
            sys::mount(
                None,
                a,
                None,
                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | nosuid_nodev,
                None,
            )
        }
        MountOp::PivotRoot { .. } => {
            // pivot_root(".", "."): the old root ends up stacked under the new one and is
            // detached right away; no directory for it is needed in the (read-only) new root.
            sys::chdir(a)?;
            sys::pivot_root_here()?;
            sys::umount_detach(c".")?;
            sys::chdir(c"/")
        }
    }
}

/// Safe wrappers of the syscalls the plan needs: each takes C strings (valid, NUL-ended,
/// alive for the call) and returns the errno on failure. Async-signal-safe.
mod sys {
    use std::ffi::CStr;

    use super::{check, MountAttr, AT_RECURSIVE, MOUNT_ATTR_RDONLY, MOVE_MOUNT_F_EMPTY_PATH};

    fn ptr(s: Option<&CStr>) -> *const libc::c_char {
        s.map_or(std::ptr::null(), CStr::as_ptr)
    }

    pub fn mount(
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: libc::c_ulong,
        data: Option<&CStr>,
    ) -> Result<(), i32> {
        // SAFETY: every pointer is null (accepted by mount(2) for these arguments) or a
        // NUL-terminated string borrowed for the duration of the call.
        check(unsafe {
            libc::mount(
                ptr(source),
                target.as_ptr(),
                ptr(fstype),
                flags,
                ptr(data).cast(),
            )
        })
    }

    pub fn read_only_tree(target: &CStr) -> Result<(), i32> {
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        // SAFETY: `target` is a valid C string and `attr` a mount_attr of the size passed,
        // both alive for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                target.as_ptr(),
                AT_RECURSIVE,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        check(if r == 0 { 0 } else { -1 })
    }

    pub fn mkdir(path: &CStr) -> Result<(), i32> {
        // SAFETY: a valid C string.
        check(unsafe { libc::mkdir(path.as_ptr(), 0o755) })
    }

    pub fn touch(path: &CStr) -> Result<(), i32> {
        // SAFETY: a valid C string; the fd returned is ours and closed right away.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o644,
            )
        };
        check(fd)?;
        // SAFETY: `fd` was just opened by us and is closed once.
        check(unsafe { libc::close(fd) })
    }

    pub fn symlink(contents: &CStr, link: &CStr) -> Result<(), i32> {
        // SAFETY: valid C strings.
        check(unsafe { libc::symlink(contents.as_ptr(), link.as_ptr()) })
    }

    pub fn chdir(path: &CStr) -> Result<(), i32> {
        // SAFETY: a valid C string.
        check(unsafe { libc::chdir(path.as_ptr()) })
    }

    pub fn pivot_root_here() -> Result<(), i32> {
        // SAFETY: two valid C strings.
        let r = unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) };
        check(if r == 0 { 0 } else { -1 })
    }

    pub fn move_mount(tree: libc::c_int, target: &CStr) -> Result<(), i32> {
        // SAFETY: an fd number, an empty C string and a valid C string.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree,
                c"".as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        check(if r == 0 { 0 } else { -1 })
    }

    pub fn umount_detach(path: &CStr) -> Result<(), i32> {
        // SAFETY: a valid C string.
        check(unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) })
    }
}

/// Map a libc return value to the errno on failure.
fn check(ret: libc::c_int) -> Result<(), i32> {
    if ret < 0 {
        Err(errno())
    } else {
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
    use std::collections::HashMap;

    struct Fake(HashMap<PathBuf, Kind>);

    impl Probe for Fake {
        fn kind(&self, path: &Path) -> Option<Kind> {
            self.0.get(path).copied()
        }
    }

    fn fake(entries: &[(&str, Kind)]) -> Fake {
        Fake(
            entries
                .iter()
                .map(|(p, k)| (PathBuf::from(p), *k))
                .collect(),
        )
    }

    fn pos(ops: &[MountOp], f: impl Fn(&MountOp) -> bool) -> usize {
        ops.iter().position(f).unwrap_or(usize::MAX)
    }

    #[test]
    fn the_view_is_read_only_with_writable_cwd_and_hidden_paths() {
        let probe = fake(&[
            ("/dev/null", Kind::File),
            ("/dev/zero", Kind::File),
            ("/home/u/.ssh", Kind::Dir),
            ("/home/u/.netrc", Kind::File),
            ("/srv/cache", Kind::Dir),
            ("/tmp/secret", Kind::Dir),
        ]);
        let writable = vec![
            (11, PathBuf::from("/srv/cache")),
            (12, PathBuf::from("/proc/sys")),
        ];
        let hidden = vec![
            PathBuf::from("/home/u/.ssh"),
            PathBuf::from("/home/u/.netrc"),
            PathBuf::from("/home/u/.aws"),
            PathBuf::from("/tmp/secret"),
        ];
        let spec = ViewSpec {
            new_root: Path::new("/run/r"),
            cwd_tree: 9,
            cwd_path: Path::new("/home/u/project"),
            writable: &writable,
            hidden: &hidden,
        };
        let ops = plan(&spec, &probe);

        assert_eq!(ops.first(), Some(&MountOp::MakePrivate));
        assert_eq!(
            ops.get(1),
            Some(&MountOp::BindHostRoot {
                new_root: "/run/r".into()
            })
        );
        assert_eq!(
            ops.get(2),
            Some(&MountOp::ReadOnlyTree {
                target: "/run/r".into()
            })
        );
        assert_eq!(
            ops.last(),
            Some(&MountOp::PivotRoot {
                new_root: "/run/r".into()
            })
        );
        assert!(ops.contains(&MountOp::Tmpfs {
            target: "/run/r/tmp".into(),
            mode: 0o1777,
            read_only: false
        }));
        assert!(ops.contains(&MountOp::Proc {
            target: "/run/r/proc".into()
        }));
        assert!(ops.contains(&MountOp::BindDevice {
            source: "/dev/null".into(),
            target: "/run/r/dev/null".into()
        }));
        // Devices missing on the host are skipped.
        assert!(!ops
            .iter()
            .any(|o| matches!(o, MountOp::BindDevice { source, .. } if source.ends_with("tty"))));
        // The cwd comes from its fd; existing writable paths are bound, missing ones skipped.
        let cwd = pos(&ops, |o| {
            o == &MountOp::AttachTree {
                tree: 9,
                target: "/run/r/home/u/project".into(),
            }
        });
        assert!(cwd < ops.len());
        assert!(ops.contains(&MountOp::AttachTree {
            tree: 11,
            target: "/run/r/srv/cache".into()
        }));
        // Never writable: anything under the fresh /proc or /dev.
        assert!(!ops
            .iter()
            .any(|o| matches!(o, MountOp::AttachTree { tree: 12, .. })));
        // Hidden: directories under a read-only tmpfs, files under /dev/null; missing ones and
        // ones under the private /tmp skipped; all after the writable binds.
        let ssh = pos(&ops, |o| {
            o == &MountOp::Tmpfs {
                target: "/run/r/home/u/.ssh".into(),
                mode: 0o755,
                read_only: true,
            }
        });
        let netrc = pos(&ops, |o| {
            o == &MountOp::HideFile {
                target: "/run/r/home/u/.netrc".into(),
            }
        });
        assert!(cwd < ssh && ssh < ops.len() && netrc < ops.len());
        assert!(!ops.iter().any(|o| matches!(o, MountOp::Tmpfs { target, .. } | MountOp::HideFile { target } if target.ends_with(".aws") || target.ends_with("secret"))));
        // Read-only comes before every writable bind and every fresh mount.
        let ro = pos(&ops, |o| matches!(o, MountOp::ReadOnlyTree { .. }));
        assert!(ops
            .iter()
            .skip(ro + 1)
            .all(|o| !matches!(o, MountOp::BindHostRoot { .. })));
        assert!(compile(ops).is_ok());
    }

    #[test]
    fn a_cwd_under_tmp_gets_its_mount_point_created_in_the_private_tmp() {
        let hidden = vec![PathBuf::from("/tmp/w/proj/.git/secret")];
        let probe = fake(&[("/tmp/w/proj/.git/secret", Kind::File)]);
        let spec = ViewSpec {
            new_root: Path::new("/r"),
            cwd_tree: 3,
            cwd_path: Path::new("/tmp/w/proj"),
            writable: &[],
            hidden: &hidden,
        };
        let ops = plan(&spec, &probe);
        let tmp = pos(
            &ops,
            |o| matches!(o, MountOp::Tmpfs { target, .. } if target == Path::new("/r/tmp")),
        );
        let w = pos(&ops, |o| {
            o == &MountOp::Mkdir {
                path: "/r/tmp/w".into(),
            }
        });
        let proj = pos(&ops, |o| {
            o == &MountOp::Mkdir {
                path: "/r/tmp/w/proj".into(),
            }
        });
        let bind = pos(
            &ops,
            |o| matches!(o, MountOp::AttachTree { target, .. } if target == Path::new("/r/tmp/w/proj")),
        );
        assert!(
            tmp < w && w < proj && proj < bind && bind < ops.len(),
            "{ops:#?}"
        );
        // Inside the writable cwd, a hidden file is still covered.
        assert!(ops.contains(&MountOp::HideFile {
            target: "/r/tmp/w/proj/.git/secret".into()
        }));
    }

    #[test]
    fn parents_are_bound_before_children() {
        let probe = fake(&[("/a/b/c", Kind::Dir), ("/a", Kind::Dir)]);
        let writable = vec![(4, PathBuf::from("/a/b/c")), (5, PathBuf::from("/a"))];
        let spec = ViewSpec {
            new_root: Path::new("/r"),
            cwd_tree: 3,
            cwd_path: Path::new("/a/b"),
            writable: &writable,
            hidden: &[],
        };
        let ops = plan(&spec, &probe);
        let targets: Vec<&PathBuf> = ops
            .iter()
            .filter_map(|o| {
                if let MountOp::AttachTree { target, .. } = o {
                    Some(target)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(
            targets,
            [
                Path::new("/r/a"),
                Path::new("/r/a/b"),
                Path::new("/r/a/b/c")
            ]
        );
    }
}
