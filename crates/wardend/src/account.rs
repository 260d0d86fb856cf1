//! The client account: the one user whose processes may ask for units (C2). Looked up by
//! name once at start-up; its uid and gid are what every peer must match.

use std::path::PathBuf;

use nix::unistd::User;

/// Looking the account up failed.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    /// No such user.
    #[error("client account {0:?} does not exist")]
    NoSuchUser(String),
    /// Units run as the client account, so it must not be root.
    #[error("client account {0:?} is root: units run as the client account, so it must be an unprivileged user")]
    Root(String),
    /// The user database could not be read.
    #[error("looking up client account {name:?}: {source}")]
    Lookup {
        /// The account.
        name: String,
        /// Why.
        source: nix::Error,
    },
}

/// The client account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its supplementary groups (the primary one included).
    pub groups: Vec<u32>,
    /// Its home directory.
    pub home: PathBuf,
}

impl Account {
    /// Look the account up by name.
    pub fn lookup(name: &str) -> Result<Self, AccountError> {
        let lookup_err = |source| AccountError::Lookup {
            name: name.to_string(),
            source,
        };
        let user = User::from_name(name)
            .map_err(lookup_err)?
            .ok_or_else(|| AccountError::NoSuchUser(name.to_string()))?;
        if user.uid.is_root() {
            return Err(AccountError::Root(name.to_string()));
        }
        let cname =
            std::ffi::CString::new(name).map_err(|_| AccountError::NoSuchUser(name.into()))?;
        let mut groups: Vec<u32> = nix::unistd::getgrouplist(&cname, user.gid)
            .map_err(lookup_err)?
            .into_iter()
            .map(|g| g.as_raw())
            .collect();
        groups.sort_unstable();
        groups.dedup();
        Ok(Self {
            name: name.to_string(),
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            groups,
            home: user.dir,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nobody_exists_and_unknown_does_not() -> Result<(), AccountError> {
        let a = Account::lookup("nobody")?;
        assert_eq!(a.uid, 65534);
        assert!(a.groups.contains(&a.gid));
        assert!(matches!(
            Account::lookup("no-such-user-warden"),
            Err(AccountError::NoSuchUser(_))
        ));
        assert!(matches!(
            Account::lookup("root"),
            Err(AccountError::Root(_))
        ));
        Ok(())
    }
}
