//! Helpers shared by wardend's integration tests: the systemd container and the
//! conformance harness.

#![allow(dead_code)]

pub mod container;
pub mod harness;
