//! Helpers shared by wardend's integration tests.

#![allow(dead_code)]

pub mod container;
