//! The kernels wardend supports: Linux 5.14 or later, checked at start-up.
//!
//! What it needs of the kernel, and since when: `clone3` with `CLONE_INTO_CGROUP` (5.7),
//! `openat2` (5.6), `close_range` (5.9), the new mount API with `mount_setattr` (5.12),
//! `cgroup.kill` (5.14). What it uses when the kernel has it, with a fallback otherwise:
//! SO_PEERPIDFD (6.5; before, `pidfd_open` plus the peer's start time, see
//! `admission::peer`), Landlock (5.13; the systemd backend needs some ABI, and scopes
//! signals and abstract sockets from ABI 6, Linux 6.12).

/// The lowest kernel wardend starts on.
pub const LOWEST: (u32, u32) = (5, 14);

/// Refuse a kernel below [`LOWEST`], saying what is missing.
pub fn check() -> Result<(), String> {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy().into_owned();
    check_release(&release)
}

fn check_release(release: &str) -> Result<(), String> {
    let version =
        parse(release).ok_or_else(|| format!("cannot read the kernel version from {release:?}"))?;
    if version < LOWEST {
        return Err(format!(
            "this kernel is Linux {release}; wardend needs Linux {}.{} or later \
             (mount_setattr, openat2, close_range, cgroup.kill)",
            LOWEST.0, LOWEST.1
        ));
    }
    Ok(())
}

/// `6.1.0-50-amd64` → (6, 1).
fn parse(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_are_read_and_old_ones_refused() {
        assert_eq!(parse("6.1.0-50-amd64"), Some((6, 1)));
        assert_eq!(parse("5.14.0-427.el9.x86_64"), Some((5, 14)));
        assert_eq!(parse("6.18.44-fc-v782"), Some((6, 18)));
        assert_eq!(parse("garbage"), None);
        assert!(check_release("5.14.0").is_ok());
        assert!(check_release("6.1.0-50-amd64").is_ok());
        let old = check_release("5.10.0-28-amd64");
        assert!(old.is_err_and(|e| e.contains("needs Linux 5.14 or later")));
        assert!(check().is_ok(), "this machine's kernel is supported");
    }
}
