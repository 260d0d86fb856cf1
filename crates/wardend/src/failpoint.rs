//! Failure injection for the tests that prove no error path leaves a unit behind.
//!
//! In debug builds only, `WARDEN_FAILPOINTS` in wardend's own environment (a comma-separated
//! list of names) makes each named step fail as if the system had failed it. A client cannot
//! reach wardend's environment; release builds compile every point to `false`.

/// Whether the failure point `name` is armed.
pub fn hit(name: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        std::env::var("WARDEN_FAILPOINTS").is_ok_and(|v| v.split(',').any(|n| n == name))
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = name;
        false
    }
}
