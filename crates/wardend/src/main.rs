//! wardend's entry point.
fn main() {}
