//! Unit names: `<prefix>-<16 hex>.service`, random, and the test of whether a name is ours.

use std::fmt;

/// A unit's name. The same name is used by both backends (the native backend names its
/// cgroup after it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UnitName(String);

impl UnitName {
    /// A fresh random name under `prefix`.
    pub fn random(prefix: &str) -> std::io::Result<Self> {
        let mut bytes = [0u8; 8];
        let mut filled = 0;
        while filled < bytes.len() {
            filled += rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty())
                .map_err(std::io::Error::from)?;
        }
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self(format!("{prefix}-{hex}.service")))
    }

    /// Parse a name, accepting it only if it has the shape of one of `prefix`'s units.
    pub fn parse(prefix: &str, name: &str) -> Option<Self> {
        is_unit_of(prefix, name).then(|| Self(name.to_string()))
    }

    /// The full name, e.g. `warden-0123456789abcdef.service`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `name` has the shape `<prefix>-<16 lowercase hex>.service`.
pub fn is_unit_of(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|rest| rest.strip_suffix(".service"))
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// The slice (systemd) or parent cgroup directory (native) that holds `prefix`'s units.
pub fn slice_of(prefix: &str) -> String {
    format!("{prefix}.slice")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_names_have_the_shape_and_differ() -> std::io::Result<()> {
        let a = UnitName::random("warden")?;
        let b = UnitName::random("warden")?;
        assert!(is_unit_of("warden", a.as_str()), "{a}");
        assert_ne!(a, b);
        Ok(())
    }

    #[test]
    fn foreign_names_are_not_ours() {
        assert!(!is_unit_of("warden", "warden-0123.service"));
        assert!(!is_unit_of("warden", "wardenx-0123456789abcdef.service"));
        assert!(!is_unit_of("warden", "warden-0123456789ABCDEF.service"));
        assert!(!is_unit_of("warden", "ssh.service"));
        assert!(is_unit_of("w", "w-0123456789abcdef.service"));
    }
}
