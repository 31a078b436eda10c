//! Questions about a whole database rather than some of its relations.
//!
//! - [`RecencyMap::lookup_database`]: what a replica must have replayed to serve *any*
//!   read of the database — the snapshot a read-only transaction takes at its first
//!   statement must not be older than any write acknowledged before it, whatever the
//!   transaction reads later.
//! - [`RecencyMap::mark_database`]: a committed write whose relations are not known
//!   (a function body pgfresh cannot analyse) makes every read of the database hot
//!   for one TTL.
//!
//! Each database keeps a small summary, updated by every mark: when it was last
//! written, the highest known commit position, and the marks whose position is still
//! pending (or was never learned). Commit positions only grow, so a replica that has
//! replayed the highest one has replayed every earlier write.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use pgfresh_lsn::Lsn;

use crate::hotness::{HotReason, Hotness};
use crate::map::{RecencyMap, PENDING};

/// Pending marks remembered per database; past it, the oldest is treated as unknown.
const MAX_PENDING: usize = 4096;

/// The recent-write summary of one database.
#[derive(Debug, Default)]
pub(crate) struct DbWrites {
    /// Time of the last mark.
    last_write_ms: u64,
    /// Time of the last mark whose position will never be known.
    unknown_ms: u64,
    /// The highest known commit position (0: none).
    max_lsn: u64,
    /// Marks waiting for their position: (token, time).
    pending: VecDeque<(u64, u64)>,
}

impl RecencyMap {
    /// Record a mark of `db` in its summary (`lsn`: a position, 0 for unknown, or
    /// [`PENDING`] with the mark's token `seq`).
    pub(crate) fn summarise_mark(&self, db: &str, now: u64, lsn: u64, seq: u64) {
        let update = |w: &mut DbWrites| {
            w.last_write_ms = w.last_write_ms.max(now);
            match lsn {
                0 => w.unknown_ms = w.unknown_ms.max(now),
                PENDING => {
                    if w.pending.len() >= MAX_PENDING {
                        if let Some((_, t)) = w.pending.pop_front() {
                            w.unknown_ms = w.unknown_ms.max(t);
                        }
                    }
                    w.pending.push_back((seq, now));
                }
                l => w.max_lsn = w.max_lsn.max(l),
            }
        };
        if let Some(mut w) = self.db_writes.get_mut(db) {
            update(&mut w);
            return;
        }
        update(&mut self.db_writes.entry(db.into()).or_default());
    }

    /// The position of a pending mark arrived.
    pub(crate) fn summarise_resolve(&self, db: &str, token: u64, lsn: u64) {
        if let Some(mut w) = self.db_writes.get_mut(db) {
            if let Some(i) = w.pending.iter().position(|(s, _)| *s == token) {
                w.pending.remove(i);
            }
            w.max_lsn = w.max_lsn.max(lsn);
        }
    }

    /// Whether some read of `db`, any relation, must see writes made within the TTL,
    /// and how far a replica must have replayed to serve it: `Hot` with the highest
    /// commit position written within the TTL, or `Hot` without a position (only the
    /// primary will do) while a recent write's position is unknown, in a cold-start
    /// window, or after a whole-database mark or an overflow. The always-hot list is
    /// not consulted (it names relations; check the statements that read them).
    pub fn lookup_database(&self, db: &str) -> Hotness {
        let ttl = self.window_ms();
        if ttl == 0 {
            return Hotness::Cold;
        }
        let unknown = |reason| Hotness::Hot {
            reason,
            relation: None,
            required_lsn: None,
        };
        if self.in_cold_start_window() {
            return unknown(HotReason::ColdStart);
        }
        let now = self.clock.now_ms();
        // An overflow or whole-database (or whole-instance) mark within the TTL: its
        // position (0: unknown).
        let mut floor: Option<(HotReason, u64)> = None;
        if self.overflow_dbs.load(Ordering::Acquire) > 0 {
            for key in [db, INSTANCE] {
                if let Some(st) = self.overflow.get(key) {
                    if now.saturating_sub(st.last_drop_ms) < ttl {
                        if st.lsn == 0 {
                            return unknown(st.reason);
                        }
                        floor = Some((st.reason, floor.map_or(st.lsn, |f| f.1.max(st.lsn))));
                    }
                }
            }
        }
        let floor_only = || match floor {
            Some((reason, lsn)) => Hotness::Hot {
                reason,
                relation: None,
                required_lsn: Some(Lsn(lsn)),
            },
            None => Hotness::Cold,
        };
        let Some(mut w) = self.db_writes.get_mut(db) else {
            return floor_only();
        };
        if now.saturating_sub(w.last_write_ms) >= ttl {
            return floor_only();
        }
        // Pending marks older than the TTL are cold whatever their position.
        while w
            .pending
            .front()
            .is_some_and(|(_, t)| now.saturating_sub(*t) >= ttl)
        {
            w.pending.pop_front();
        }
        let reason = floor.map_or(HotReason::RecentWrite, |f| f.0);
        if !w.pending.is_empty() || now.saturating_sub(w.unknown_ms) < ttl || w.max_lsn == 0 {
            return unknown(reason);
        }
        Hotness::Hot {
            reason,
            relation: None,
            required_lsn: Some(Lsn(w.max_lsn.max(floor.map_or(0, |f| f.1)))),
        }
    }

    /// Forget summaries with nothing written or pending within the TTL.
    pub(crate) fn forget_database_summaries(&self, now: u64, ttl: u64) {
        if self.db_writes.is_empty() {
            return;
        }
        self.db_writes.retain(|_, w| {
            now.saturating_sub(w.last_write_ms) < ttl
                || w.pending.iter().any(|(_, t)| now.saturating_sub(*t) < ttl)
        });
    }

    /// A committed write whose relations are not known: every read of `db` is hot,
    /// primary only, for one TTL from now.
    pub fn mark_database(&self, db: &str) {
        self.mark_database_at(db, None);
    }

    /// [`Self::mark_database`] for a commit whose position is known: for one TTL from
    /// now, every read of `db` needs a replica that has replayed `lsn` (`None`: only the
    /// primary will do). Positions of marks within one TTL combine like a relation's:
    /// the highest, or unknown if any is unknown.
    pub fn mark_database_at(&self, db: &str, lsn: Option<Lsn>) {
        if self.ttl_ms.load(Ordering::Acquire) == 0 {
            return;
        }
        let now = self.clock.now_ms();
        let lsn = lsn.map_or(0, |l| l.0);
        self.counters.whole_database_marks.add(1);
        self.record_database_hot(db, now, lsn, HotReason::WholeDatabase);
        self.summarise_mark(db, now, lsn, 0);
    }
}

/// The key of whole-instance marks among the per-database records (no database has an
/// empty name).
pub(crate) const INSTANCE: &str = "";

impl RecencyMap {
    /// A committed write that may have gone to any database of the instance (SQL sent over
    /// `dblink` to a connection string pgfresh cannot tie to one database): every read of
    /// every database is hot, primary only, for one TTL from now — databases no session
    /// has used yet included.
    pub fn mark_instance(&self) {
        if self.ttl_ms.load(Ordering::Acquire) == 0 {
            return;
        }
        let now = self.clock.now_ms();
        self.counters.whole_database_marks.add(1);
        self.record_database_hot(INSTANCE, now, 0, HotReason::WholeDatabase);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{ManualClock, RecencyConfig, RelKey};

    fn map() -> (RecencyMap, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_000));
        let cfg = RecencyConfig {
            ttl_ms: 1_000,
            cold_start_ms: 0,
            ..RecencyConfig::default()
        };
        (RecencyMap::new(cfg, clock.clone()), clock)
    }

    #[test]
    fn an_instance_mark_makes_every_database_hot() {
        let (m, clock) = map();
        m.mark("db", &[RelKey::unqualified("a")], Some(Lsn(100)));
        m.mark_instance();
        for db in ["db", "never_seen"] {
            assert_eq!(m.lookup_database(db).required_lsn(), None, "{db}");
            assert!(m.lookup_database(db).is_hot(), "{db}");
            assert!(m.lookup(db, &[RelKey::unqualified("x")]).is_hot(), "{db}");
        }
        clock.advance(1_000);
        assert_eq!(m.lookup_database("never_seen"), Hotness::Cold);
        assert_eq!(m.lookup("db", &[RelKey::unqualified("x")]), Hotness::Cold);
    }

    #[test]
    fn database_requirement_is_the_newest_position_within_the_ttl() {
        let (m, clock) = map();
        assert_eq!(m.lookup_database("db"), Hotness::Cold);
        m.mark("db", &[RelKey::unqualified("a")], Some(Lsn(100)));
        m.mark("db", &[RelKey::unqualified("b")], Some(Lsn(300)));
        m.mark("other", &[RelKey::unqualified("c")], Some(Lsn(900)));
        assert_eq!(m.lookup_database("db").required_lsn(), Some(Lsn(300)));
        clock.advance(1_000);
        assert_eq!(m.lookup_database("db"), Hotness::Cold);
    }

    #[test]
    fn pending_and_unknown_positions_need_the_primary_until_resolved_or_expired() {
        let (m, clock) = map();
        let keys = [RelKey::unqualified("a")];
        let token = m.mark_pending("db", &keys);
        let hot = m.lookup_database("db");
        assert!(hot.is_hot() && hot.required_lsn().is_none());
        m.resolve_pending("db", &keys, token, Lsn(500));
        assert_eq!(m.lookup_database("db").required_lsn(), Some(Lsn(500)));
        // A lost probe: the mark stays unknown for one TTL, then expires.
        m.mark_pending("db", &keys);
        assert!(m.lookup_database("db").required_lsn().is_none());
        clock.advance(1_000);
        assert_eq!(m.lookup_database("db"), Hotness::Cold);
        m.mark("db", &keys, None);
        assert!(m.lookup_database("db").required_lsn().is_none());
    }

    #[test]
    fn a_whole_database_mark_makes_every_read_hot_for_one_ttl() {
        let (m, clock) = map();
        m.mark_database("db");
        let hot = m.lookup("db", &[RelKey::unqualified("anything")]);
        assert_eq!(hot.reason(), Some(HotReason::WholeDatabase));
        assert!(hot.required_lsn().is_none());
        assert!(m.lookup_database("db").is_hot());
        assert!(!m
            .lookup("other", &[RelKey::unqualified("anything")])
            .is_hot());
        clock.advance(1_000);
        assert!(!m.lookup("db", &[RelKey::unqualified("anything")]).is_hot());
        assert_eq!(m.lookup_database("db"), Hotness::Cold);
    }

    #[test]
    fn a_whole_database_mark_with_a_position_needs_a_replica_that_replayed_it() {
        let (m, clock) = map();
        let any = [RelKey::unqualified("anything")];
        m.mark_database_at("db", Some(Lsn(700)));
        let hot = m.lookup("db", &any);
        assert_eq!(hot.reason(), Some(HotReason::WholeDatabase));
        assert_eq!(hot.required_lsn(), Some(Lsn(700)));
        assert_eq!(m.lookup_database("db").required_lsn(), Some(Lsn(700)));
        // A relation written later needs its own, higher position.
        m.mark("db", &[RelKey::unqualified("a")], Some(Lsn(900)));
        assert_eq!(
            m.lookup("db", &[RelKey::unqualified("a")]).required_lsn(),
            Some(Lsn(900))
        );
        assert_eq!(m.lookup("db", &any).required_lsn(), Some(Lsn(700)));
        // Within the TTL the highest position counts; an unknown one needs the primary.
        m.mark_database_at("db", Some(Lsn(800)));
        assert_eq!(m.lookup("db", &any).required_lsn(), Some(Lsn(800)));
        m.mark_database_at("db", None);
        let hot = m.lookup("db", &any);
        assert!(hot.is_hot() && hot.required_lsn().is_none());
        clock.advance(1_000);
        assert!(!m.lookup("db", &any).is_hot());
        // A new TTL starts from the new mark's position alone.
        m.mark_database_at("db", Some(Lsn(1_000)));
        assert_eq!(m.lookup("db", &any).required_lsn(), Some(Lsn(1_000)));
    }
}
