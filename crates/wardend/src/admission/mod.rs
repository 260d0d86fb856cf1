//! Admission (C6): who may open a connection at all, before any byte is read.
//!
//! A connection is admitted only if its peer credentials can be read, its uid **and** gid
//! are the client account's, and its origin (see [`origin`]) is admitted: at most
//! `max_unauthenticated` connections are unauthenticated at once overall, shared fairly
//! between origins ([`pool`]: one origin holds at most half; a full pool makes room for a
//! smaller origin by evicting the oldest half-open connection of the largest), and each
//! origin may be admitted at most `origin_max_per_window` times within a sliding
//! `origin_window`. The slot travels with the connection and is released when
//! authentication completes or the connection ends (C8, C10).

pub mod origin;
pub mod peer;
pub mod pool;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use self::origin::{Lookup, Origins};
use self::peer::{Peer, ProcId};
use self::pool::{Pool, Refusal, Slot};

/// The message every refused peer reads (C6): deliberately the same for every cause.
pub const ADMISSION_REFUSED: &str = "authentication admission limit reached";

/// Why a connection was refused. The peer only ever reads [`ADMISSION_REFUSED`]; the log
/// says which of these it was.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// SO_PEERCRED, SO_PEERPIDFD or /proc could not be read.
    #[error("peer credentials unreadable: {0}")]
    Credentials(std::io::Error),
    /// Not the client account.
    #[error("peer uid {uid} gid {gid} is not the client account")]
    WrongAccount {
        /// Peer uid.
        uid: u32,
        /// Peer gid.
        gid: u32,
    },
    /// No unauthenticated slot free, and none to take from a larger origin.
    #[error("all {0} unauthenticated slots are taken")]
    NoSlot(usize),
    /// The origin already holds its share of the unauthenticated slots.
    #[error("origin pid {} already holds {} unauthenticated slots", .0.pid, .1)]
    OriginShare(ProcId, usize),
    /// The origin was admitted too often in the window.
    #[error("origin pid {} admitted too often", .0.pid)]
    Rate(ProcId),
}

/// A connection that passed admission: its peer, origin and unauthenticated slot.
#[derive(Debug)]
pub struct Admitted {
    /// The peer.
    pub peer: Peer,
    /// Its origin.
    pub origin: ProcId,
    /// Its unauthenticated slot; dropping it releases the slot. Its eviction token fires
    /// when a smaller origin took its place: the connection is then refused.
    pub slot: Slot,
    /// The origin lookup to run off the accept loop, if the peer's unit is not known yet.
    pub lookup: Option<Lookup>,
}

/// Admission limits and state. Owned by the accept loop; slots are released by handlers.
#[derive(Debug)]
pub struct Admission {
    uid: u32,
    gid: u32,
    pool: Pool,
    window: Duration,
    per_window: usize,
    admitted: HashMap<ProcId, VecDeque<Instant>>,
    origins: Origins,
}

impl Admission {
    /// Limits for the client account `uid`/`gid`.
    pub fn new(
        uid: u32,
        gid: u32,
        max_unauthenticated: usize,
        window: Duration,
        per_window: usize,
    ) -> Self {
        Self {
            uid,
            gid,
            pool: Pool::new(max_unauthenticated),
            window,
            per_window,
            admitted: HashMap::new(),
            origins: Origins::default(),
        }
    }

    /// Unauthenticated slots free now.
    pub fn free_slots(&self) -> usize {
        self.pool.free()
    }

    /// The cache of origins, for the tasks that run its lookups.
    pub fn origins(&self) -> Origins {
        self.origins.clone()
    }

    /// Admit the peer of `socket`, or say why not. Cheap checks only, nothing that waits:
    /// credentials, the origin as cached (see [`origin`]), a slot, the origin's window.
    pub fn admit(&mut self, socket: &impl std::os::fd::AsFd) -> Result<Admitted, AdmissionError> {
        let peer = Peer::of(socket).map_err(AdmissionError::Credentials)?;
        if peer.uid != self.uid || peer.gid != self.gid {
            return Err(AdmissionError::WrongAccount {
                uid: peer.uid,
                gid: peer.gid,
            });
        }
        let now = Instant::now();
        let (origin, lookup) = self.origins.of(&peer.stat, now);
        // The slot first: a connection refused for want of one is not counted against its
        // origin's window (dropping the slot on a rate refusal gives it back).
        let refused = |r| match r {
            Refusal::Full(max) => AdmissionError::NoSlot(max),
            Refusal::OriginShare(n) => AdmissionError::OriginShare(origin, n),
        };
        let admitted = self
            .pool
            .take(origin)
            .map_err(refused)
            .and_then(|slot| self.admit_origin(origin, now).map(|()| slot));
        match admitted {
            Ok(slot) => Ok(Admitted {
                peer,
                origin,
                slot,
                lookup,
            }),
            Err(e) => {
                // A refused connection starts no lookup; the next of its unit will.
                if let Some(l) = lookup {
                    self.origins.abandon(&l);
                }
                Err(e)
            }
        }
    }

    /// The sliding window: record an admission of `origin` at `now` unless it already has
    /// `per_window` admissions within the window.
    fn admit_origin(&mut self, origin: ProcId, now: Instant) -> Result<(), AdmissionError> {
        let window = self.window;
        if self.admitted.len() >= 4096 {
            self.admitted.retain(|_, times| {
                times
                    .back()
                    .is_some_and(|t| now.duration_since(*t) < window)
            });
        }
        let times = self.admitted.entry(origin).or_default();
        while times
            .front()
            .is_some_and(|t| now.duration_since(*t) >= window)
        {
            times.pop_front();
        }
        if times.len() >= self.per_window {
            return Err(AdmissionError::Rate(origin));
        }
        times.push_back(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn me() -> (u32, u32) {
        (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    }

    #[test]
    fn slots_are_bounded_and_released_on_drop() -> Result<(), AdmissionError> {
        let (uid, gid) = me();
        let mut adm = Admission::new(uid, gid, 4, Duration::from_secs(60), 100);
        let (a, _a) = UnixStream::pair().map_err(AdmissionError::Credentials)?;
        let first = adm.admit(&a)?;
        let second = adm.admit(&a)?;
        // One origin (this process) holds at most half of the pool.
        assert!(matches!(
            adm.admit(&a),
            Err(AdmissionError::OriginShare(_, 2))
        ));
        drop(first);
        assert_eq!(adm.free_slots(), 3);
        drop(second);
        assert_eq!(adm.free_slots(), 4);
        Ok(())
    }

    #[test]
    fn a_refusal_for_want_of_a_slot_does_not_count_against_the_origin() -> Result<(), AdmissionError>
    {
        let (uid, gid) = me();
        let mut adm = Admission::new(uid, gid, 1, Duration::from_secs(60), 2);
        let (a, _a) = UnixStream::pair().map_err(AdmissionError::Credentials)?;
        let held = adm.admit(&a)?;
        for _ in 0..3 {
            assert!(matches!(
                adm.admit(&a),
                Err(AdmissionError::OriginShare(_, 1))
            ));
        }
        drop(held);
        // The window holds one admission, not four: the second one of the window fits.
        let second = adm.admit(&a)?;
        drop(second);
        assert!(matches!(adm.admit(&a), Err(AdmissionError::Rate(_))));
        assert_eq!(adm.free_slots(), 1, "a rate refusal gives its slot back");
        Ok(())
    }

    #[test]
    fn wrong_account_is_refused() -> Result<(), AdmissionError> {
        let (uid, gid) = me();
        let (a, _a) = UnixStream::pair().map_err(AdmissionError::Credentials)?;
        let mut wrong_uid = Admission::new(uid.wrapping_add(1), gid, 2, Duration::from_secs(1), 10);
        assert!(matches!(
            wrong_uid.admit(&a),
            Err(AdmissionError::WrongAccount { .. })
        ));
        let mut wrong_gid = Admission::new(uid, gid.wrapping_add(1), 2, Duration::from_secs(1), 10);
        assert!(matches!(
            wrong_gid.admit(&a),
            Err(AdmissionError::WrongAccount { .. })
        ));
        Ok(())
    }

    #[test]
    fn sliding_window_per_origin() -> Result<(), AdmissionError> {
        let mut adm = Admission::new(0, 0, 10, Duration::from_millis(100), 2);
        let a = ProcId { pid: 5, start: 1 };
        let b = ProcId { pid: 6, start: 1 };
        let t = Instant::now();
        adm.admit_origin(a, t)?;
        adm.admit_origin(a, t + Duration::from_millis(10))?;
        assert!(matches!(
            adm.admit_origin(a, t + Duration::from_millis(20)),
            Err(AdmissionError::Rate(_))
        ));
        adm.admit_origin(b, t + Duration::from_millis(20))?;
        // The first admission leaves the window; one more fits.
        adm.admit_origin(a, t + Duration::from_millis(101))?;
        assert!(adm.admit_origin(a, t + Duration::from_millis(102)).is_err());
        Ok(())
    }
}
