//! Freeing expired entries, and listing live ones.
//!
//! Every slot has exactly one item in the sweep queue, pushed when the slot is
//! created and carrying the time from which it should be looked at again. The queue
//! is split into stripes, each a FIFO behind its own mutex. A sweep pops items whose
//! time plus the current TTL has passed; for each it drops the slot's expired
//! entries under the slot's shard lock, removes the slot when nothing is left, and
//! otherwise pushes the item back with the oldest remaining write time. Work per
//! call is bounded by the batch size, whatever the map's size, and lookups of other
//! shards are never blocked.
//!
//! Items pushed back can sit behind newer ones in their stripe, so an expired slot
//! may wait up to one more TTL before it is freed; lookups ignore expired entries
//! regardless, so this only delays the release of memory.

use std::sync::atomic::Ordering;

use pgfresh_lsn::Lsn;

use crate::config::RelKey;
use crate::hotness::{HotEntry, SweepStats};
use crate::map::{lock, QueueItem, RecencyMap};

impl RecencyMap {
    /// Removes expired entries, examining at most `max_batch` queue items. Call it
    /// periodically (for instance every TTL/2, looping while the result is not
    /// `done`). Also forgets overflow records older than one TTL.
    pub fn sweep(&self, max_batch: usize) -> SweepStats {
        let now = self.clock.now_ms();
        let ttl = self.window_ms();
        let mut stats = SweepStats::default();
        let stripes = self.queue.len();
        let mut i = self.sweep_cursor.fetch_add(1, Ordering::Relaxed) % stripes;
        let mut idle = 0;
        while stats.examined < max_batch && idle < stripes {
            let item = {
                let mut q = lock(&self.queue[i]);
                match q.front() {
                    Some(front) if now.saturating_sub(front.since_ms) >= ttl => q.pop_front(),
                    _ => None,
                }
            };
            match item {
                Some(item) => {
                    idle = 0;
                    stats.examined += 1;
                    stats.removed += self.sweep_item(item, now, ttl);
                }
                None => idle += 1,
            }
            i = (i + 1) % stripes;
        }
        stats.done = idle >= stripes;
        if stats.removed > 0 {
            self.entries.fetch_sub(stats.removed, Ordering::AcqRel);
            self.counters.expirations.add(stats.removed as u64);
        }
        self.forget_overflows(now, ttl);
        stats.remaining = self.len();
        stats
    }

    /// Drops the expired entries of one slot; returns how many.
    fn sweep_item(&self, item: QueueItem, now: u64, ttl: u64) -> usize {
        let mut removed = 0;
        let mut requeue_since = None;
        let removed_slot = self.slots.remove_if_mut(&item.key, |_, slot| {
            if slot.generation != item.generation {
                // A stale reminder of a slot removed and created again; the new
                // slot has its own.
                return false;
            }
            let before = slot.entries.len();
            slot.entries
                .retain(|e| now.saturating_sub(e.last_write_ms) < ttl);
            removed = before - slot.entries.len();
            requeue_since = slot.entries.iter().map(|e| e.last_write_ms).min();
            requeue_since.is_none()
        });
        drop(removed_slot);
        if let Some(since_ms) = requeue_since {
            self.enqueue(QueueItem { since_ms, ..item });
        }
        removed
    }

    fn forget_overflows(&self, now: u64, ttl: u64) {
        self.forget_database_summaries(now, ttl);
        if self.overflow_dbs.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut forgotten = 0;
        self.overflow.retain(|_, st| {
            let keep = now.saturating_sub(st.last_drop_ms) < ttl;
            forgotten += usize::from(!keep);
            keep
        });
        if forgotten > 0 {
            self.overflow_dbs.fetch_sub(forgotten, Ordering::AcqRel);
        }
    }

    /// Entries written within the TTL, most recent first, at most `limit`, for one
    /// database or all. For status pages and `SHOW`-style commands; it walks the
    /// whole map, so keep it off the request path.
    pub fn hot_relations(&self, db: Option<&str>, limit: usize) -> Vec<HotEntry> {
        let now = self.clock.now_ms();
        let ttl = self.window_ms();
        let staleness = self.max_staleness_ms.load(Ordering::Acquire);
        let mut out = Vec::new();
        for slot in self.slots.iter() {
            let key = slot.key();
            let slot_db = &key.db_str();
            if db.is_some_and(|d| d != *slot_db) {
                continue;
            }
            for e in &slot.entries {
                let age_ms = now.saturating_sub(e.last_write_ms);
                if age_ms >= ttl {
                    continue;
                }
                let relation = RelKey {
                    schema: e.schema.as_deref(),
                    name: key.name_str(),
                };
                out.push(HotEntry {
                    db: slot_db.to_string(),
                    relation: relation.to_string(),
                    age_ms,
                    writes: e.writes,
                    hits: e.hits.load(Ordering::Relaxed),
                    lsn: (e.known_lsn() != 0).then_some(Lsn(e.known_lsn())),
                    forcing: now.saturating_sub(e.streak_start_ms) < staleness,
                });
            }
        }
        out.sort_by(|a, b| (a.age_ms, &a.db, &a.relation).cmp(&(b.age_ms, &b.db, &b.relation)));
        out.truncate(limit);
        out
    }
}
