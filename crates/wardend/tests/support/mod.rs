//! Helpers shared by wardend's integration tests: the systemd container and the
//! conformance harness.

#![allow(dead_code)]

/// One test per backend for each named check: `checks::NAME(Kind)` becomes the tests
/// `native::NAME` and `systemd::NAME`.
#[allow(unused_macros)]
macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {
        mod native {
            $(#[test] fn $name() -> super::Result<()> { super::checks::$name(super::Kind::Native) })*
        }
        mod systemd {
            $(#[test] fn $name() -> super::Result<()> { super::checks::$name(super::Kind::Systemd) })*
        }
    };
}

pub mod attack;
pub mod container;
pub mod harness;
pub mod stalled_fuse;
