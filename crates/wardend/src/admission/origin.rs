//! The "likely main PID" of a peer: the process that leads its origin, so that one runaway
//! agent cannot take every unauthenticated slot by opening connections from many children.
//!
//! Resolved as: the main PID of the peer's systemd unit when the unit manager can tell, else
//! the peer's session leader, else the peer itself — each identified by (pid, start time) so
//! that a recycled PID is a new origin. Answers are cached and refreshed after a while.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::peer::{proc_stat, ProcId, ProcStat};

/// How long a cached answer is trusted before it is looked up again.
const CACHE_TTL: Duration = Duration::from_secs(10);
/// How many cached answers before stale ones are swept.
const CACHE_SWEEP_AT: usize = 4096;

/// The cache of peer → origin answers.
#[derive(Debug, Default)]
pub struct OriginCache {
    entries: HashMap<ProcId, (ProcId, Instant)>,
}

impl OriginCache {
    /// The cached origin of `peer`, if fresh.
    pub fn get(&self, peer: ProcId, now: Instant) -> Option<ProcId> {
        self.entries
            .get(&peer)
            .filter(|(_, at)| now.duration_since(*at) < CACHE_TTL)
            .map(|(origin, _)| *origin)
    }

    /// Remember `origin` for `peer`.
    pub fn put(&mut self, peer: ProcId, origin: ProcId, now: Instant) {
        if self.entries.len() >= CACHE_SWEEP_AT {
            self.entries
                .retain(|_, (_, at)| now.duration_since(*at) < CACHE_TTL);
        }
        self.entries.insert(peer, (origin, now));
    }
}

/// Resolve the origin of `peer` given what the unit manager says its unit's main PID is.
pub fn resolve(peer: &ProcStat, unit_main_pid: Option<u32>) -> ProcId {
    let identified = |pid: u32| proc_stat(pid).ok().map(|s| s.id);
    unit_main_pid
        .filter(|&p| p > 1)
        .and_then(identified)
        .or_else(|| Some(peer.session).filter(|&s| s > 1).and_then(identified))
        .unwrap_or(peer.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_back_to_the_session_leader_then_the_peer() -> std::io::Result<()> {
        let me = proc_stat(std::process::id())?;
        let origin = resolve(&me, None);
        if me.session > 1 {
            assert_eq!(origin.pid, me.session);
        } else {
            assert_eq!(origin, me.id);
        }
        // A main PID that names ourselves wins over the session leader.
        assert_eq!(resolve(&me, Some(std::process::id())), me.id);
        // A main PID that does not exist falls through.
        let ghost = ProcStat {
            id: me.id,
            session: 0,
        };
        assert_eq!(resolve(&ghost, Some(u32::MAX - 1)), me.id);
        Ok(())
    }

    #[test]
    fn cache_answers_while_fresh() {
        let mut c = OriginCache::default();
        let t0 = Instant::now();
        let p = ProcId { pid: 10, start: 1 };
        let o = ProcId { pid: 2, start: 1 };
        c.put(p, o, t0);
        assert_eq!(c.get(p, t0), Some(o));
        assert_eq!(
            c.get(ProcId { pid: 10, start: 2 }, t0),
            None,
            "recycled pid is new"
        );
        assert_eq!(c.get(p, t0 + CACHE_TTL), None);
    }
}
