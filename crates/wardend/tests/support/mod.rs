//! Shared test support: the systemd container and the conformance harness.
pub mod container;
pub mod harness;
