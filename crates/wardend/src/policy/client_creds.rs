//! Filesystem checks made with the client account's credentials, so that no answer a
//! client gets depends on what only root can see (an existence oracle for root's files).
//!
//! The check runs on a short-lived thread of its own whose filesystem uid, gid and groups
//! are the client's (`setfsuid(2)` and friends are per thread in the kernel, and the
//! kernel drops the thread's filesystem capabilities with them); the daemon's other
//! threads keep root's. The thread ends with the check, so nothing can leak its
//! credentials into later work.

use std::io;

use crate::account::Account;

/// Run `check` with `account`'s filesystem credentials.
pub fn as_client<T: Send>(account: &Account, check: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("as-client".into())
            .spawn_scoped(scope, || -> io::Result<T> {
                become_client(account)?;
                Ok(check())
            })?;
        worker
            .join()
            .map_err(|_| io::Error::other("the check as the client account panicked"))?
    })
}

/// Take the client's groups, filesystem gid and filesystem uid, on this thread only.
fn become_client(account: &Account) -> io::Result<()> {
    let groups: Vec<libc::gid_t> = account.groups.clone();
    // Raw syscall: glibc's setgroups() would change every thread of the daemon.
    // SAFETY: `groups` is a valid array of gid_t of the length passed.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // setfsgid/setfsuid return the previous id and cannot fail loudly: read back with an
    // invalid id (which changes nothing) to check that they took.
    // SAFETY: plain integer arguments.
    unsafe { libc::setfsgid(account.gid) };
    // SAFETY: as above; u32::MAX is not a valid id, so this only reads.
    let gid = unsafe { libc::setfsgid(u32::MAX) };
    // SAFETY: plain integer arguments.
    unsafe { libc::setfsuid(account.uid) };
    // SAFETY: as above.
    let uid = unsafe { libc::setfsuid(u32::MAX) };
    if gid as u32 != account.gid || uid as u32 != account.uid {
        return Err(io::Error::other(format!(
            "could not take the filesystem ids of {} (uid {uid}, gid {gid})",
            account.name
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_see_what_the_client_sees() -> io::Result<()> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipping: needs root to change filesystem ids");
            return Ok(());
        }
        let dir = tempfile::tempdir()?;
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let secret = dir.path().join("private");
        std::fs::create_dir(&secret)?;
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        std::fs::write(secret.join("file"), "x")?;
        let nobody = Account {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
            home: "/nonexistent".into(),
        };
        let inside = secret.join("file");
        // Root sees it; the client does not, and this thread stays root.
        assert!(inside.exists());
        let seen = as_client(&nobody, || std::fs::metadata(&inside).map_err(|e| e.kind()))?;
        assert_eq!(seen.map(|_| ()), Err(io::ErrorKind::PermissionDenied));
        assert!(inside.exists(), "the calling thread kept root's view");
        Ok(())
    }
}
