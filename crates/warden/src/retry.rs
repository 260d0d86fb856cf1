//! Retrying a busy daemon: when wardend refuses a connection at admission (its pool of
//! connections not yet authenticated is full, C6), has no session slot free (C10), or its
//! listen queue is full — all before anything started — the client
//! tries again with jittered exponential backoff for a bounded time, so a burst of
//! commands (a parallel build with `SHELL=warden-sh`) succeeds instead of failing a few.
//!
//! The budget is `--retry DURATION` of `warden`, else `$WARDEN_RETRY`, else
//! [`DEFAULT_BUDGET`]; `0` turns retrying off. A refusal that outlasts it is reported as it
//! came (`authentication admission limit reached`, exit 125).

use std::time::{Duration, Instant};

/// How long a busy daemon is retried when nothing says otherwise: long enough for a burst
/// of 1,000 commands at once on 2 cores (`scripts/bench-load`: all of them are through in
/// about 14 s; with 10 s, about one in eight gave up).
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(30);

/// The variable that sets the budget (a duration: `10s`, `500ms`, `0`).
pub const BUDGET_ENV: &str = "WARDEN_RETRY";

/// The first wait; each next one doubles, up to [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(5);

/// The longest single wait.
const MAX_WAIT: Duration = Duration::from_millis(500);

/// The budget from `$WARDEN_RETRY`, or the default when it is unset, empty or not a
/// duration.
pub fn budget_from_env() -> Duration {
    std::env::var(BUDGET_ENV)
        .ok()
        .and_then(|v| crate::parse::parse_duration_ms(&v).ok())
        .map_or(DEFAULT_BUDGET, Duration::from_millis)
}

/// The waits between attempts: exponential, each drawn uniformly from its upper half (so
/// clients refused together do not come back together), and none past the deadline.
#[derive(Debug)]
pub struct Backoff {
    deadline: Instant,
    next: Duration,
}

impl Backoff {
    /// Backoff that gives up `budget` from now.
    pub fn new(budget: Duration) -> Self {
        Self {
            deadline: Instant::now() + budget,
            next: FIRST_WAIT,
        }
    }

    /// How long to wait before the next attempt, or `None` when the budget is spent.
    pub fn next_wait(&mut self) -> Option<Duration> {
        let left = self.deadline.checked_duration_since(Instant::now())?;
        if left.is_zero() {
            return None;
        }
        let cap = self.next;
        self.next = (self.next * 2).min(MAX_WAIT);
        let half = cap / 2;
        let jitter = half.mul_f64(unit_random());
        Some((half + jitter).min(left))
    }
}

/// A number in [0, 1) from the kernel's random source (0.5 if it cannot be read).
fn unit_random() -> f64 {
    let mut b = [0u8; 4];
    match rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::NONBLOCK) {
        Ok(4) => f64::from(u32::from_ne_bytes(b)) / (f64::from(u32::MAX) + 1.0),
        _ => 0.5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_with_jitter_and_stop_at_the_budget() {
        let mut b = Backoff::new(Duration::from_secs(60));
        let waits: Vec<Duration> = (0..12).filter_map(|_| b.next_wait()).collect();
        assert_eq!(waits.len(), 12);
        // Each wait lies in the upper half of its step: 5 ms, 10 ms, 20 ms, ... 500 ms.
        let mut step = FIRST_WAIT;
        for w in &waits {
            assert!(
                *w >= step / 2 && *w <= step,
                "{w:?} outside ({step:?}/2, {step:?}]"
            );
            step = (step * 2).min(MAX_WAIT);
        }
        assert!(waits.iter().all(|w| *w <= MAX_WAIT));
    }

    #[test]
    fn a_zero_budget_never_waits() {
        assert_eq!(Backoff::new(Duration::ZERO).next_wait(), None);
    }

    #[test]
    fn no_wait_goes_past_the_budget() {
        let budget = Duration::from_millis(30);
        let mut b = Backoff::new(budget);
        let mut total = Duration::ZERO;
        while let Some(w) = b.next_wait() {
            assert!(w <= budget);
            total += w;
            std::thread::sleep(w);
        }
        assert!(total <= budget + Duration::from_millis(20), "{total:?}");
    }
}
