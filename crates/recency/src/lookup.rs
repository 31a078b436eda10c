//! Answering reads: is any relation of this statement hot?

use std::sync::atomic::Ordering;

use pgfresh_lsn::Lsn;

use crate::clock::Clock;
use crate::config::RelKey;
use crate::counters::Counters;
use crate::hotness::{HotReason, Hotness};
use crate::key::{BorrowedKey, KeyView};
use crate::map::{combine_lsn, RecencyMap};

/// Reads the clock at most once per lookup, and only when an answer depends on it.
struct LazyNow<'a> {
    clock: &'a dyn Clock,
    now: Option<u64>,
}

impl LazyNow<'_> {
    fn get(&mut self) -> u64 {
        *self.now.get_or_insert_with(|| self.clock.now_ms())
    }
}

/// Accumulates the hot matches of one lookup.
#[derive(Default)]
struct Verdict {
    reason: Option<HotReason>,
    relation: Option<String>,
    /// Highest known LSN, 0 once any match had none.
    lsn: u64,
}

impl Verdict {
    fn add(&mut self, reason: HotReason, lsn: u64) {
        self.lsn = match self.reason {
            None => lsn,
            Some(_) => combine_lsn(self.lsn, lsn),
        };
        // Overflow and whole-database marks cover the whole database, so they are
        // the reason reported.
        if !matches!(
            self.reason,
            Some(HotReason::Overflow | HotReason::WholeDatabase)
        ) {
            self.reason = Some(reason);
        }
    }

    fn finish(self, counters: &Counters) -> Hotness {
        let Some(reason) = self.reason else {
            return Hotness::Cold;
        };
        match reason {
            HotReason::Overflow => counters.hits_overflow.add(1),
            _ => counters.hits_recent_write.add(1),
        }
        Hotness::Hot {
            reason,
            relation: self.relation,
            required_lsn: (self.lsn != 0).then_some(Lsn(self.lsn)),
        }
    }
}

/// The conservative schema rule: names that are not both qualified may be the same
/// relation.
fn schemas_may_match(read: Option<&str>, written: Option<&str>) -> bool {
    match (read, written) {
        (Some(r), Some(w)) => r == w,
        _ => true,
    }
}

impl RecencyMap {
    /// Whether a read of `rels` in database `db` must see recent writes.
    ///
    /// In order:
    /// 1. A relation matching the always-hot list: `Hot(AlwaysHot)`, no LSN. This
    ///    holds even when the TTL is 0.
    /// 2. TTL 0: `Cold` (recency forcing is off).
    /// 3. Inside a cold-start window: `Hot(ColdStart)`, no LSN.
    /// 4. Otherwise every entry written within the TTL that may be the same relation
    ///    as one of `rels` (DESIGN §1.8: a read of `orders` matches writes to any
    ///    `*.orders`; a read of `a.orders` matches writes to `a.orders` and to
    ///    unqualified `orders`) makes the answer `Hot(RecentWrite)`, unless the
    ///    entry's hot streak is older than `max_staleness_ms`. If the database
    ///    overflowed within the TTL, the answer is `Hot(Overflow)` whatever `rels`.
    ///    `required_lsn` is the highest commit LSN among the matches, or `None` if
    ///    any of them has none (then only the primary can serve the read).
    ///
    /// Never allocates when the answer is `Cold`.
    pub fn lookup(&self, db: &str, rels: &[RelKey<'_>]) -> Hotness {
        self.answer(db, rels, true)
    }

    /// [`Self::lookup`] without naming the relation that made the answer hot
    /// (`relation` is `None` for a recent write): for the router, which needs only the
    /// required position, so a hot read under constant writes allocates nothing.
    pub fn requirement(&self, db: &str, rels: &[RelKey<'_>]) -> Hotness {
        self.answer(db, rels, false)
    }

    fn answer(&self, db: &str, rels: &[RelKey<'_>], name: bool) -> Hotness {
        self.counters.lookups.add(1);
        if let Some(hot) = self.always_hot(rels) {
            return hot;
        }
        let ttl = self.window_ms();
        if ttl == 0 {
            return Hotness::Cold;
        }
        let mut now = LazyNow {
            clock: &*self.clock,
            now: None,
        };
        if self.in_cold_start(&mut now) {
            self.counters.hits_cold_start.add(1);
            return Hotness::Hot {
                reason: HotReason::ColdStart,
                relation: None,
                required_lsn: None,
            };
        }
        let mut verdict = Verdict::default();
        if self.overflow_dbs.load(Ordering::Acquire) > 0 {
            for key in [db, crate::database::INSTANCE] {
                if let Some(st) = self.overflow.get(key) {
                    if now.get().saturating_sub(st.last_drop_ms) < ttl {
                        verdict.add(st.reason, st.lsn);
                    }
                }
            }
        }
        let staleness = self.max_staleness_ms.load(Ordering::Acquire);
        for rel in rels {
            let probe = BorrowedKey { db, name: rel.name };
            let Some(slot) = self.slots.get(&probe as &dyn KeyView) else {
                continue;
            };
            let now = now.get();
            for entry in &slot.entries {
                if !schemas_may_match(rel.schema, entry.schema.as_deref())
                    || now.saturating_sub(entry.last_write_ms) >= ttl
                {
                    continue;
                }
                if now.saturating_sub(entry.streak_start_ms) >= staleness {
                    self.counters.stale_releases.add(1);
                    continue;
                }
                entry.hits.fetch_add(1, Ordering::Relaxed);
                verdict.add(HotReason::RecentWrite, entry.known_lsn());
                if name && verdict.relation.is_none() {
                    let written = RelKey {
                        schema: entry.schema.as_deref(),
                        name: rel.name,
                    };
                    verdict.relation = Some(written.to_string());
                }
            }
        }
        verdict.finish(&self.counters)
    }

    fn always_hot(&self, rels: &[RelKey<'_>]) -> Option<Hotness> {
        if !self.any_always_hot.load(Ordering::Acquire) {
            return None;
        }
        let lists = self.lists.load();
        if lists.always_hot.is_empty() {
            return None;
        }
        let rel = rels
            .iter()
            .find(|r| lists.always_hot.iter().any(|p| p.may_match(r)))?;
        self.counters.hits_always_hot.add(1);
        Some(Hotness::Hot {
            reason: HotReason::AlwaysHot,
            relation: Some(rel.to_string()),
            required_lsn: None,
        })
    }

    fn in_cold_start(&self, now: &mut LazyNow<'_>) -> bool {
        let until = self.cold_start_until.load(Ordering::Acquire);
        if until == 0 {
            return false;
        }
        if now.get() < until {
            return true;
        }
        // The window is over: clear it so later lookups skip the clock read. A
        // window begun meanwhile changed the value, and the exchange then fails.
        let _ =
            self.cold_start_until
                .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Acquire);
        false
    }

    /// True while a cold-start window is running.
    pub fn in_cold_start_window(&self) -> bool {
        let mut now = LazyNow {
            clock: &*self.clock,
            now: None,
        };
        self.in_cold_start(&mut now)
    }
}
