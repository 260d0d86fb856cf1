//! The host's mount table, as `/proc/self/mountinfo` says it: which filesystem is mounted
//! where, and from which directory of it. Policy uses it to find every path at which a
//! hidden directory can also be reached (bind mounts) and the kernel filesystems mounted
//! outside the places every unit gets its own of; the native backend finds its cgroup
//! hierarchies in it. Read-only: nothing here changes the system.

use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// `major:minor` of the filesystem.
    pub dev: (u32, u32),
    /// The directory of the filesystem that is mounted (`/` for a whole filesystem).
    pub root: PathBuf,
    /// Where it is mounted.
    pub point: PathBuf,
    /// The filesystem type (`ext4`, `proc`, `cgroup2`, ...).
    pub fstype: String,
    /// The superblock options (`rw,memory` for a v1 memory hierarchy).
    pub super_options: String,
}

impl Mount {
    /// `dev` as `stat(2)`'s `st_dev`.
    pub fn st_dev(&self) -> u64 {
        libc::makedev(self.dev.0, self.dev.1)
    }
}

/// Kernel filesystems whose contents describe the host rather than hold files: a unit may
/// see none of them but the fresh instances it gets of its own (`/proc`, `/sys`, `/dev`).
pub const KERNEL_FILESYSTEMS: &[&str] = &[
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "cgroup",
    "cgroup2",
    "bpf",
    "debugfs",
    "tracefs",
    "securityfs",
    "configfs",
    "pstore",
    "efivarfs",
    "fusectl",
    "binfmt_misc",
    "selinuxfs",
    "mqueue",
    "nsfs",
    "rpc_pipefs",
    "nfsd",
    "autofs",
];

/// The mount table of this process's mount namespace.
pub fn read() -> std::io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// Parse mountinfo text; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let fields: Vec<&str> = line.split(' ').collect();
    let dash = fields.iter().position(|f| *f == "-")?;
    let (major, minor) = fields.get(2)?.split_once(':')?;
    Some(Mount {
        dev: (major.parse().ok()?, minor.parse().ok()?),
        root: PathBuf::from(unescape(fields.get(3)?)),
        point: PathBuf::from(unescape(fields.get(4)?)),
        fstype: (*fields.get(dash + 1)?).to_string(),
        super_options: (*fields.get(dash + 3)?).to_string(),
    })
}

/// mountinfo writes space, tab, newline and backslash as `\NNN` (octal).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount `path` lies on: the one with the longest mount point that is a prefix of it
/// (the last such line, the topmost, when several mounts share the point).
pub fn containing<'m>(mounts: &'m [Mount], path: &Path) -> Option<&'m Mount> {
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.point))
        .max_by_key(|m| m.point.components().count())
        .and_then(|best| {
            mounts
                .iter()
                .rev()
                .find(|m| m.point == best.point && path.starts_with(&m.point))
        })
}

/// Every other path at which the file at `path` (canonical) is mounted: the same directory
/// of the same filesystem bound somewhere else. Candidates only; the caller checks each one
/// is the same inode (a later mount may cover it).
pub fn aliases(mounts: &[Mount], path: &Path) -> Vec<PathBuf> {
    let Some(home) = containing(mounts, path) else {
        return Vec::new();
    };
    let Ok(rel) = path.strip_prefix(&home.point) else {
        return Vec::new();
    };
    let in_fs = home.root.join(rel);
    let mut out: Vec<PathBuf> = mounts
        .iter()
        .filter(|m| m.dev == home.dev && m.point != home.point)
        .filter_map(|m| Some(m.point.join(in_fs.strip_prefix(&m.root).ok()?)))
        .filter(|p| p != path)
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:21 / /proc rw,nosuid - proc proc rw
24 22 0:22 / /sys rw - sysfs sysfs rw
25 24 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
40 22 254:0 /srv/real\\040home /home/u rw - ext4 /dev/vda rw
41 22 254:0 /srv /mnt/srv rw - ext4 /dev/vda rw
42 22 0:30 / /srv/chroot/proc rw - proc proc rw
43 22 0:31 / /data rw - xfs /dev/vdb rw
";

    #[test]
    fn parses_lines_and_escapes() {
        let m = parse(TABLE);
        assert_eq!(m.len(), 8);
        assert_eq!(m[4].root, PathBuf::from("/srv/real home"));
        assert_eq!(m[4].point, PathBuf::from("/home/u"));
        assert_eq!(m[3].fstype, "cgroup");
        assert_eq!(m[3].super_options, "rw,memory");
        assert_eq!(m[0].dev, (254, 0));
        assert!(parse("garbage\n1 2 3\n").is_empty());
    }

    #[test]
    fn finds_the_mount_a_path_is_on() {
        let m = parse(TABLE);
        let on = |p: &str| containing(&m, Path::new(p)).map(|m| m.point.clone());
        assert_eq!(on("/home/u/.ssh"), Some("/home/u".into()));
        assert_eq!(on("/home/other"), Some("/".into()));
        assert_eq!(on("/srv/chroot/proc/1"), Some("/srv/chroot/proc".into()));
    }

    #[test]
    fn a_directory_bound_elsewhere_has_aliases() {
        let m = parse(TABLE);
        // ~/.ssh lives in /srv/real home/.ssh on the root filesystem, which is also under
        // /mnt/srv (a bind of /srv).
        assert_eq!(
            aliases(&m, Path::new("/home/u/.ssh")),
            vec![
                PathBuf::from("/mnt/srv/real home/.ssh"),
                PathBuf::from("/srv/real home/.ssh")
            ]
        );
        // From the other side: the original path has the home and /mnt/srv as aliases.
        assert_eq!(
            aliases(&m, Path::new("/srv/real home/.ssh")),
            vec![
                PathBuf::from("/home/u/.ssh"),
                PathBuf::from("/mnt/srv/real home/.ssh")
            ]
        );
        // Another filesystem has none.
        assert!(aliases(&m, Path::new("/data/x")).is_empty());
    }
}
