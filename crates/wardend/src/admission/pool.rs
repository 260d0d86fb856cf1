//! The pool of unauthenticated slots (C6), fair between origins: a flood from one process
//! tree cannot lock the agent out.
//!
//! - At most `max` connections are unauthenticated at once, and any one origin holds at
//!   most half of them (at least one).
//! - When the pool is full, a newcomer whose origin holds fewer slots than the origin
//!   holding the most takes the place of that origin's oldest half-open connection, which
//!   is told to close (its [`Slot::evicted`] token fires); otherwise the newcomer is
//!   refused. A flood that spreads itself over many origins thus evicts its own oldest
//!   connections, while a legitimate client, whose handshake takes milliseconds, is never
//!   the oldest — in the spirit of OpenSSH's MaxStartups and per-source penalties.
//!
//! A [`Slot`] travels with its connection and leaves the pool when dropped (authenticated,
//! refused, closed or evicted).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

use super::peer::ProcId;

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The origin already holds its share of the pool.
    OriginShare(usize),
    /// The pool is full and the origin holds as many slots as any other.
    Full(usize),
}

/// The slots and who holds them.
#[derive(Debug)]
pub struct Pool {
    max: usize,
    inner: Arc<Mutex<Held>>,
}

#[derive(Debug, Default)]
struct Held {
    /// Per origin, its half-open connections, oldest first: (sequence number, eviction).
    by_origin: HashMap<ProcId, VecDeque<(u64, CancellationToken)>>,
    total: usize,
    next: u64,
}

impl Held {
    fn count(&self, origin: &ProcId) -> usize {
        self.by_origin.get(origin).map_or(0, VecDeque::len)
    }

    /// The origin holding the most slots (ties: the one with the oldest connection).
    fn largest(&self) -> Option<(ProcId, usize)> {
        self.by_origin
            .iter()
            .filter_map(|(o, q)| q.front().map(|(seq, _)| (*o, q.len(), *seq)))
            .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)))
            .map(|(o, n, _)| (o, n))
    }

    fn remove(&mut self, origin: &ProcId, seq: u64) {
        let Some(q) = self.by_origin.get_mut(origin) else {
            return;
        };
        if let Some(i) = q.iter().position(|(s, _)| *s == seq) {
            q.remove(i);
            self.total -= 1;
        }
        if q.is_empty() {
            self.by_origin.remove(origin);
        }
    }
}

/// An unauthenticated slot; dropping it gives it back.
#[derive(Debug)]
pub struct Slot {
    inner: Arc<Mutex<Held>>,
    origin: ProcId,
    seq: u64,
    evicted: CancellationToken,
}

impl Slot {
    /// Fires when a newcomer from a smaller origin took this slot's place: the connection
    /// is to be refused and closed.
    pub fn evicted(&self) -> &CancellationToken {
        &self.evicted
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        held.remove(&self.origin, self.seq);
    }
}

impl Pool {
    /// A pool of `max` slots.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            inner: Arc::new(Mutex::new(Held::default())),
        }
    }

    /// How many slots one origin may hold.
    pub fn origin_share(&self) -> usize {
        (self.max / 2).max(1)
    }

    /// Slots free now.
    pub fn free(&self) -> usize {
        let held = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        self.max.saturating_sub(held.total)
    }

    /// A slot for a connection of `origin`, possibly in place of the oldest connection of
    /// the origin holding the most.
    pub fn take(&self, origin: ProcId) -> Result<Slot, Refusal> {
        let mut held = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = held.count(&origin);
        if mine >= self.origin_share() {
            return Err(Refusal::OriginShare(self.origin_share()));
        }
        if held.total >= self.max {
            match held.largest() {
                // (An origin holding more than the newcomer's is another origin.)
                Some((victim, most)) if most > mine => {
                    let oldest = held
                        .by_origin
                        .get(&victim)
                        .and_then(|q| q.front().map(|(seq, token)| (*seq, token.clone())));
                    if let Some((seq, token)) = oldest {
                        token.cancel();
                        held.remove(&victim, seq);
                    }
                }
                _ => return Err(Refusal::Full(self.max)),
            }
        }
        let seq = held.next;
        held.next += 1;
        let evicted = CancellationToken::new();
        held.by_origin
            .entry(origin)
            .or_default()
            .push_back((seq, evicted.clone()));
        held.total += 1;
        Ok(Slot {
            inner: Arc::clone(&self.inner),
            origin,
            seq,
            evicted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(pid: u32) -> ProcId {
        ProcId { pid, start: 1 }
    }

    #[test]
    fn bounded_overall_and_given_back_on_drop() -> Result<(), Refusal> {
        let pool = Pool::new(4);
        let a = pool.take(origin(1))?;
        let b = pool.take(origin(2))?;
        let c = pool.take(origin(3))?;
        let d = pool.take(origin(4))?;
        assert_eq!(pool.free(), 0);
        // Full, and origin 1 holds as many as any other: its second connection is refused.
        assert_eq!(pool.take(origin(1)).err(), Some(Refusal::Full(4)));
        drop(b);
        assert_eq!(pool.free(), 1);
        drop((a, c, d));
        assert_eq!(pool.free(), 4);
        Ok(())
    }

    #[test]
    fn one_origin_holds_at_most_half() -> Result<(), Refusal> {
        let pool = Pool::new(16);
        let flood: Vec<Slot> = (0..8)
            .map(|_| pool.take(origin(7)))
            .collect::<Result<_, _>>()?;
        assert_eq!(pool.take(origin(7)).err(), Some(Refusal::OriginShare(8)));
        // The rest of the pool is the others'.
        let agent = pool.take(origin(1))?;
        assert_eq!(pool.free(), 7);
        drop((flood, agent));
        Ok(())
    }

    #[test]
    fn a_full_pool_evicts_the_oldest_connection_of_the_largest_origin() -> Result<(), Refusal> {
        let pool = Pool::new(4);
        // Two flooding origins fill the pool, two slots each.
        let a1 = pool.take(origin(10))?;
        let b1 = pool.take(origin(20))?;
        let a2 = pool.take(origin(10))?;
        let b2 = pool.take(origin(20))?;
        // The agent gets in: the oldest connection of a largest origin (a1) makes room.
        let agent = pool.take(origin(1))?;
        assert!(a1.evicted().is_cancelled());
        assert!(![&b1, &a2, &b2].iter().any(|s| s.evicted().is_cancelled()));
        assert_eq!(pool.free(), 0);
        // The evicted slot's drop gives back nothing twice.
        drop(a1);
        assert_eq!(pool.free(), 0);
        // Now b holds the most: its oldest goes for the next newcomer.
        let other = pool.take(origin(2))?;
        assert!(b1.evicted().is_cancelled());
        // A newcomer of an origin that holds as many as any other is refused.
        assert_eq!(pool.take(origin(1)).err(), Some(Refusal::Full(4)));
        assert!(!agent.evicted().is_cancelled());
        drop((b1, a2, b2, agent, other));
        assert_eq!(pool.free(), 4);
        Ok(())
    }

    #[test]
    fn a_flood_spread_over_many_origins_evicts_its_oldest_not_the_newest() -> Result<(), Refusal> {
        let pool = Pool::new(3);
        let old = pool.take(origin(1))?;
        let mid = pool.take(origin(2))?;
        let agent = pool.take(origin(3))?;
        // Every origin holds one; a new origin takes the place of the oldest connection.
        let newer = pool.take(origin(4))?;
        assert!(old.evicted().is_cancelled());
        assert!(!mid.evicted().is_cancelled() && !agent.evicted().is_cancelled());
        drop((old, mid, agent, newer));
        assert_eq!(pool.free(), 3);
        Ok(())
    }
}
