//! The "likely main PID" of a peer: the process that leads its origin, so that one runaway
//! agent cannot take every unauthenticated slot by opening connections from many children.
//!
//! An origin is the main PID of the peer's systemd unit when the unit manager can tell,
//! else the peer's session leader, else the peer itself — each identified by (pid, start
//! time) so that a recycled PID is a new origin.
//!
//! Asking the unit manager costs a D-Bus round trip, so it never happens on the accept loop:
//! answers are cached per **unit**, keyed by the peer's control group (every process of a
//! unit shares it, so a new child of a known agent is a hit), and a miss is looked up by a
//! task of its own ([`Origins::lookup`]) while the connection is admitted under its session
//! leader. A cached answer older than [`REFRESH_AFTER`] is still used while a fresh lookup
//! runs, so an origin does not flip between the two names of one agent.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::peer::{proc_stat, ProcId, ProcStat};

/// After this long a cached answer is looked up again (and used meanwhile).
pub const REFRESH_AFTER: Duration = Duration::from_secs(10);
/// An answer not refreshed for this long is dropped (its unit is likely gone).
const FORGET_AFTER: Duration = Duration::from_secs(60);
/// How many cached units before old answers are swept.
const SWEEP_AT: usize = 4096;
/// At most this many lookups at once; more misses wait for a later connection.
const MAX_LOOKUPS: usize = 16;
/// How long one lookup may take before it is given up.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// The control group text of a process (/proc/PID/cgroup): one key per unit.
pub type UnitKey = String;

/// A lookup the caller should run off the accept loop: ask the unit manager for the main PID
/// of `pid`'s unit, then [`Origins::put`] the answer under `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The unit, as its control group.
    pub key: UnitKey,
    /// A process in it (the peer).
    pub pid: u32,
}

#[derive(Debug, Default)]
struct State {
    /// Unit → its main process (None: the unit manager named none), and when it was learnt.
    units: HashMap<UnitKey, (Option<ProcId>, Instant)>,
    /// Units being looked up now.
    pending: HashSet<UnitKey>,
}

/// The shared cache of unit → main process answers.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    state: Arc<Mutex<State>>,
}

impl Origins {
    /// The origin of `peer` now, and the lookup to start if its unit's answer is missing or
    /// old. Never waits for the unit manager.
    pub fn of(&self, peer: &ProcStat, now: Instant) -> (ProcId, Option<Lookup>) {
        let fallback = fallback(peer);
        let Ok(key) = std::fs::read_to_string(format!("/proc/{}/cgroup", peer.id.pid)) else {
            return (fallback, None);
        };
        let Ok(mut state) = self.state.lock() else {
            return (fallback, None);
        };
        let cached = state.units.get(&key).copied();
        let origin = cached.and_then(|(main, _)| main).unwrap_or(fallback);
        let stale = cached.is_none_or(|(_, at)| now.duration_since(at) >= REFRESH_AFTER);
        if !stale || state.pending.contains(&key) || state.pending.len() >= MAX_LOOKUPS {
            return (origin, None);
        }
        state.pending.insert(key.clone());
        let pid = peer.id.pid;
        (origin, Some(Lookup { key, pid }))
    }

    /// Record what the unit manager said of `lookup` (`main_pid`: its unit's main PID).
    pub fn put(&self, lookup: &Lookup, main_pid: Option<u32>, now: Instant) {
        let main = main_pid
            .filter(|&p| p > 1)
            .and_then(|p| proc_stat(p).ok())
            .map(|s| s.id);
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        state.pending.remove(&lookup.key);
        if state.units.len() >= SWEEP_AT {
            state
                .units
                .retain(|_, (_, at)| now.duration_since(*at) < FORGET_AFTER);
        }
        state.units.insert(lookup.key.clone(), (main, now));
    }

    /// A lookup that could not finish: the next connection of that unit may try again.
    pub fn abandon(&self, lookup: &Lookup) {
        if let Ok(mut state) = self.state.lock() {
            state.pending.remove(&lookup.key);
        }
    }
}

/// The origin without the unit manager: the session leader, else the peer.
fn fallback(peer: &ProcStat) -> ProcId {
    Some(peer.session)
        .filter(|&s| s > 1)
        .and_then(|s| proc_stat(s).ok().map(|s| s.id))
        .unwrap_or(peer.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> std::io::Result<ProcStat> {
        proc_stat(std::process::id())
    }

    /// A cache in which this process's unit was looked up at `at` and `main` was the answer.
    fn answered(me: &ProcStat, main: Option<u32>, at: Instant) -> std::io::Result<Origins> {
        let origins = Origins::default();
        let lookup = origins
            .of(me, at)
            .1
            .ok_or_else(|| std::io::Error::other("no lookup on a miss"))?;
        origins.put(&lookup, main, at);
        Ok(origins)
    }

    #[test]
    fn a_miss_is_admitted_under_the_session_leader_and_looked_up_once() -> std::io::Result<()> {
        let me = me()?;
        let origins = Origins::default();
        let t0 = Instant::now();
        let (origin, lookup) = origins.of(&me, t0);
        assert_eq!(origin, fallback(&me));
        if me.session > 1 {
            assert_eq!(origin.pid, me.session);
        }
        let lookup = lookup.ok_or_else(|| std::io::Error::other("no lookup on a miss"))?;
        assert_eq!(lookup.pid, me.id.pid);
        // While it runs, no second lookup of the same unit.
        assert_eq!(origins.of(&me, t0).1, None);
        // The answer names ourselves as the unit's main process: from now on that is the
        // origin of every process of the unit.
        origins.put(&lookup, Some(std::process::id()), t0);
        assert_eq!(origins.of(&me, t0), (me.id, None));
        Ok(())
    }

    #[test]
    fn an_old_answer_is_used_while_it_is_refreshed() -> std::io::Result<()> {
        let me = me()?;
        let t0 = Instant::now();
        let origins = answered(&me, Some(std::process::id()), t0)?;
        let later = t0 + REFRESH_AFTER;
        let (origin, refresh) = origins.of(&me, later);
        assert_eq!(
            origin, me.id,
            "the old answer holds: the origin does not flip"
        );
        let refresh = refresh.ok_or_else(|| std::io::Error::other("no refresh"))?;
        // A lookup that failed leaves the old answer and lets a later one try again.
        origins.abandon(&refresh);
        assert_eq!(origins.of(&me, later).0, me.id);
        Ok(())
    }

    #[test]
    fn no_main_pid_or_a_dead_one_falls_back_to_the_session_leader() -> std::io::Result<()> {
        let me = me()?;
        let t0 = Instant::now();
        for main in [None, Some(u32::MAX - 1)] {
            let origins = answered(&me, main, t0)?;
            assert_eq!(origins.of(&me, t0), (fallback(&me), None), "{main:?}");
        }
        Ok(())
    }
}
