//! The map itself: construction, settings, and recording writes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use dashmap::mapref::entry::Entry as MapEntry;
use dashmap::DashMap;
use pgfresh_lsn::Lsn;

use crate::clock::Clock;
use crate::config::{RecencyConfig, RelKey, RelPattern};
use crate::counters::Counters;
use crate::hotness::RecencyStats;
use crate::key::{BorrowedKey, KeyView, SlotKey};

/// `max_staleness_ms` value meaning "no cap".
pub(crate) const NO_STALENESS_CAP: u64 = u64::MAX;

/// Queue items a full map sweeps before it gives up on storing a write.
const RECLAIM_BATCH: usize = 64;

/// Number of sweep-queue stripes (independent mutexes).
const QUEUE_STRIPES: usize = 32;

/// One written relation: a schema (or none, for an unqualified write) under a
/// (database, name) slot.
pub(crate) struct Entry {
    pub(crate) schema: Option<Box<str>>,
    pub(crate) last_write_ms: u64,
    /// First write of the current unbroken hot streak.
    pub(crate) streak_start_ms: u64,
    /// Highest commit LSN of the streak; 0 when any write of it had none;
    /// [`PENDING`] while every write of it is still waiting for its position.
    pub(crate) lsn: u64,
    /// Writes of the streak marked with [`RecencyMap::mark_pending`] whose position has
    /// not arrived yet; while any is outstanding the entry's position is unknown.
    pub(crate) pending: u32,
    /// Mark sequence number that began the current streak: a position resolved for a
    /// mark older than this belongs to an earlier streak and is ignored.
    pub(crate) streak_seq: u64,
    pub(crate) writes: u64,
    pub(crate) hits: AtomicU64,
}

impl Entry {
    fn new(schema: Option<&str>, now: u64, lsn: u64, seq: u64) -> Self {
        Entry {
            schema: schema.map(Into::into),
            last_write_ms: now,
            streak_start_ms: now,
            lsn,
            pending: u32::from(lsn == PENDING),
            streak_seq: seq,
            writes: 1,
            hits: AtomicU64::new(0),
        }
    }

    fn record(&mut self, now: u64, ttl: u64, lsn: u64, seq: u64) {
        if now.saturating_sub(self.last_write_ms) >= ttl {
            // The previous write has expired: a new streak begins and the old
            // position no longer matters.
            self.streak_start_ms = now;
            self.streak_seq = seq;
            self.lsn = lsn;
            self.pending = u32::from(lsn == PENDING);
        } else if lsn == PENDING {
            self.pending += 1;
        } else if self.lsn == PENDING {
            self.lsn = lsn;
        } else {
            self.lsn = combine_lsn(self.lsn, lsn);
        }
        self.last_write_ms = self.last_write_ms.max(now);
        self.writes += 1;
    }

    /// The position a replica must have replayed, 0 when unknown.
    pub(crate) fn known_lsn(&self) -> u64 {
        if self.pending > 0 || self.lsn == PENDING {
            0
        } else {
            self.lsn
        }
    }

    /// A pending mark's position arrived.
    fn resolve(&mut self, lsn: u64, seq: u64) {
        if seq < self.streak_seq || self.pending == 0 {
            return; // an earlier streak's write, or already settled
        }
        self.pending -= 1;
        self.lsn = if self.lsn == PENDING {
            lsn
        } else {
            combine_lsn(self.lsn, lsn)
        };
    }
}

/// One mark being applied: when, under which TTL, with which position, in which order.
#[derive(Clone, Copy)]
struct Mark {
    now: u64,
    ttl: u64,
    lsn: u64,
    seq: u64,
}

/// Internal marker: "this write's position is not known yet, but will be".
pub(crate) const PENDING: u64 = u64::MAX;

/// Merges two commit positions where 0 means "unknown": unknown wins, since a reader
/// cannot wait for a position nobody knows.
pub(crate) fn combine_lsn(a: u64, b: u64) -> u64 {
    if a == 0 || b == 0 {
        0
    } else {
        a.max(b)
    }
}

/// All entries sharing a (database, name).
pub(crate) struct Slot {
    /// Distinguishes this slot from an earlier one with the same key, so a stale
    /// sweep-queue item never touches a re-created slot.
    pub(crate) generation: u64,
    pub(crate) entries: Vec<Entry>,
}

/// Dropped writes of one database while the map was full.
pub(crate) struct OverflowState {
    pub(crate) last_drop_ms: u64,
    pub(crate) lsn: u64,
    /// Overflow, or a whole-database mark ([`RecencyMap::mark_database`]).
    pub(crate) reason: crate::hotness::HotReason,
}

/// A reminder to look at a slot once `since_ms + ttl` has passed.
pub(crate) struct QueueItem {
    pub(crate) key: SlotKey,
    pub(crate) generation: u64,
    pub(crate) since_ms: u64,
}

pub(crate) struct Lists {
    pub(crate) never_track: Vec<RelPattern>,
    pub(crate) always_hot: Vec<RelPattern>,
}

/// The recency map: which relations of which database were written recently.
///
/// The proxy calls [`RecencyMap::mark`] when a writing transaction commits (before
/// the client sees the commit) and [`RecencyMap::lookup`] to route each read. A
/// background task calls [`RecencyMap::sweep`] periodically to free expired entries.
/// All methods take `&self`; share the map with an `Arc`.
///
/// Storage is a [`DashMap`] keyed by (database, relation name); each slot holds one
/// entry per schema the name was written under (or none, for an unqualified write),
/// which is what the conservative schema matching needs. Lookups take only the
/// shard read locks of the slots they probe; there is no global lock on the read
/// path, and a lookup of relations that are not in the map allocates nothing.
///
/// Settings (TTL, caps, lists) live in atomics and are read at each call, so changes
/// apply to existing entries at once.
pub struct RecencyMap {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) ttl_ms: AtomicU64,
    /// The shortest window a write stays recent, whatever the TTL (see
    /// [`RecencyMap::set_window_floor_ms`]).
    pub(crate) window_floor_ms: AtomicU64,
    pub(crate) max_ttl_ms: AtomicU64,
    pub(crate) max_staleness_ms: AtomicU64,
    pub(crate) cold_start_ms: AtomicU64,
    /// End of the cold-start window; 0 when none is pending.
    pub(crate) cold_start_until: AtomicU64,
    pub(crate) max_entries: AtomicUsize,
    pub(crate) entries: AtomicUsize,
    pub(crate) lists: ArcSwap<Lists>,
    /// The always-hot list is not empty: lookups load `lists` only then (most
    /// configurations have none, and every read looks).
    pub(crate) any_always_hot: AtomicBool,
    pub(crate) slots: DashMap<SlotKey, Slot, Hasher>,
    pub(crate) overflow: DashMap<Box<str>, OverflowState, Hasher>,
    pub(crate) overflow_dbs: AtomicUsize,
    /// Per-database summaries of recent writes (see `database.rs`).
    pub(crate) db_writes: DashMap<Box<str>, crate::database::DbWrites, Hasher>,
    pub(crate) queue: Box<[Mutex<VecDeque<QueueItem>>]>,
    pub(crate) sweep_cursor: AtomicUsize,
    next_generation: AtomicU64,
    /// Sequence number of the last mark (see [`Entry::streak_seq`]).
    mark_seq: AtomicU64,
    /// Moves after anything that may turn a cold answer hot (see [`RecencyMap::changes`]).
    changes: AtomicU64,
    pub(crate) counters: Counters,
}

/// The maps' hasher: foldhash's quality variant, seeded per process (SipHash cost a
/// measurable share of every statement's lookups).
pub(crate) type Hasher = foldhash::quality::RandomState;

enum MarkOutcome {
    Stored,
    Full,
}

impl RecencyMap {
    /// A map with `cfg`, reading time from `clock`. The TTL is clamped to
    /// `max_ttl_ms`. The cold-start window (if `cold_start_ms > 0`) begins now.
    pub fn new(cfg: RecencyConfig, clock: Arc<dyn Clock>) -> Self {
        let map = RecencyMap {
            clock,
            ttl_ms: AtomicU64::new(cfg.ttl_ms.min(cfg.max_ttl_ms)),
            window_floor_ms: AtomicU64::new(cfg.window_floor_ms),
            max_ttl_ms: AtomicU64::new(cfg.max_ttl_ms),
            max_staleness_ms: AtomicU64::new(cfg.max_staleness_ms.unwrap_or(NO_STALENESS_CAP)),
            cold_start_ms: AtomicU64::new(cfg.cold_start_ms),
            cold_start_until: AtomicU64::new(0),
            max_entries: AtomicUsize::new(cfg.max_entries),
            entries: AtomicUsize::new(0),
            any_always_hot: AtomicBool::new(!cfg.always_hot.is_empty()),
            lists: ArcSwap::from_pointee(Lists {
                never_track: cfg.never_track,
                always_hot: cfg.always_hot,
            }),
            slots: DashMap::default(),
            overflow: DashMap::default(),
            overflow_dbs: AtomicUsize::new(0),
            db_writes: DashMap::default(),
            queue: (0..QUEUE_STRIPES).map(|_| Mutex::default()).collect(),
            sweep_cursor: AtomicUsize::new(0),
            next_generation: AtomicU64::new(1),
            mark_seq: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            counters: Counters::default(),
        };
        map.begin_cold_start();
        map
    }

    /// Sets the TTL, clamped to the max TTL, and returns the value in effect. Applies
    /// to existing entries at once: shortening it cools entries older than the new
    /// value, lengthening it re-heats entries that are unswept and within it.
    pub fn set_ttl_ms(&self, ms: u64) -> u64 {
        let effective = ms.min(self.max_ttl_ms.load(Ordering::Acquire));
        if self.ttl_ms.swap(effective, Ordering::AcqRel) != effective {
            self.changed();
        }
        effective
    }

    /// The TTL in effect.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms.load(Ordering::Acquire)
    }

    /// Sets the shortest window a write stays recent, whatever the TTL: how far behind
    /// a replica in the read pool may be. A write older than the TTL but younger than
    /// that may be missing on a replica the pool takes for any read; kept recent, its
    /// reads go where it has been replayed (its position known) or to the primary. A
    /// TTL of 0 (recency routing off for reads) stays 0.
    pub fn set_window_floor_ms(&self, ms: u64) {
        if self.window_floor_ms.swap(ms, Ordering::AcqRel) != ms {
            self.changed();
        }
    }

    /// How long a write stays recent: the TTL, at least the window floor (0 when the TTL
    /// is 0).
    pub fn window_ms(&self) -> u64 {
        match self.ttl_ms.load(Ordering::Acquire) {
            0 => 0,
            ttl => ttl.max(self.window_floor_ms.load(Ordering::Acquire)),
        }
    }

    /// Sets the cap on the TTL; a TTL above the new cap is lowered to it. Returns
    /// the TTL in effect afterwards.
    pub fn set_max_ttl_ms(&self, ms: u64) -> u64 {
        self.max_ttl_ms.store(ms, Ordering::Release);
        let previous = self.ttl_ms.fetch_min(ms, Ordering::AcqRel);
        previous.min(ms)
    }

    /// The cap on the TTL.
    pub fn max_ttl_ms(&self) -> u64 {
        self.max_ttl_ms.load(Ordering::Acquire)
    }

    /// Sets or clears the staleness cap (see [`RecencyConfig::max_staleness_ms`]).
    /// `Some(0)` means writes never force reads.
    pub fn set_max_staleness_ms(&self, ms: Option<u64>) {
        let ms = ms.unwrap_or(NO_STALENESS_CAP);
        if self.max_staleness_ms.swap(ms, Ordering::AcqRel) != ms {
            self.changed();
        }
    }

    /// The staleness cap.
    pub fn max_staleness_ms(&self) -> Option<u64> {
        match self.max_staleness_ms.load(Ordering::Acquire) {
            NO_STALENESS_CAP => None,
            ms => Some(ms),
        }
    }

    /// Sets the length of future cold-start windows (a running window keeps its end).
    pub fn set_cold_start_ms(&self, ms: u64) {
        self.cold_start_ms.store(ms, Ordering::Release);
    }

    /// Sets the entry cap. Lowering it below the current count drops no entry; new
    /// writes overflow until enough entries expire.
    pub fn set_max_entries(&self, max: usize) {
        self.max_entries.store(max, Ordering::Release);
    }

    /// Replaces the never-track and always-hot lists. Entries already recorded for a
    /// relation that becomes never-tracked stay until they expire.
    pub fn set_lists(&self, never_track: Vec<RelPattern>, always_hot: Vec<RelPattern>) {
        let any = !always_hot.is_empty();
        self.lists.store(Arc::new(Lists {
            never_track,
            always_hot,
        }));
        self.any_always_hot.store(any, Ordering::Release);
        self.changed();
    }

    /// Starts a cold-start window of `cold_start_ms` from now: every lookup answers
    /// hot until it ends. Call it on failover or when the node set changes. A window
    /// already running is extended, never shortened. While the TTL is 0 lookups
    /// ignore the window (recency forcing is off altogether).
    pub fn begin_cold_start(&self) {
        let ms = self.cold_start_ms.load(Ordering::Acquire);
        if ms == 0 {
            return;
        }
        let until = self.clock.now_ms().saturating_add(ms);
        self.cold_start_until.fetch_max(until, Ordering::AcqRel);
        self.changed();
    }

    /// A count that moves after anything that may turn an answer from cold to hot: a
    /// write marked (after its entries are stored), a whole-database mark, an overflow,
    /// a cold-start window begun, a change of the TTL, the window floor, the staleness
    /// cap or the lists. Read before a lookup that answered [`Hotness::Cold`]: while the
    /// count stays what it was, the same lookup still answers `Cold` (entries only age,
    /// and an aged entry is colder), so a caller may keep that answer instead of asking
    /// again. Any other answer may change with time alone (a write ages out, a replica
    /// catches up): only a cold one may be kept.
    ///
    /// [`Hotness::Cold`]: crate::Hotness::Cold
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// After a change [`RecencyMap::changes`] counts: released after what it stored.
    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// Number of entries held, including expired ones not yet swept.
    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Acquire)
    }

    /// True when no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> RecencyStats {
        let c = &self.counters;
        let hits_recent_write = c.hits_recent_write.get();
        let hits_always_hot = c.hits_always_hot.get();
        let hits_cold_start = c.hits_cold_start.get();
        let hits_overflow = c.hits_overflow.get();
        RecencyStats {
            marks: c.marks.get(),
            never_tracked: c.never_tracked.get(),
            lookups: c.lookups.get(),
            hits: hits_recent_write + hits_always_hot + hits_cold_start + hits_overflow,
            hits_recent_write,
            hits_always_hot,
            hits_cold_start,
            hits_overflow,
            stale_releases: c.stale_releases.get(),
            expirations: c.expirations.get(),
            overflows: c.overflows.get(),
            entries: self.len() as u64,
        }
    }

    /// Records that a transaction which wrote `rels` in database `db` committed at
    /// `commit_lsn` (when known). Call it before the commit's result is forwarded to
    /// the client; once it returns, every lookup sees the write.
    ///
    /// Does nothing while the TTL is 0. Relations covered by the never-track list
    /// are skipped. A relation that would need a new entry while the map holds
    /// `max_entries` is dropped after a small reclaiming sweep; the database is then
    /// reported hot ([`crate::HotReason::Overflow`]) for one TTL after the last drop.
    /// `Lsn(0)` counts as unknown.
    pub fn mark(&self, db: &str, rels: &[RelKey<'_>], commit_lsn: Option<Lsn>) {
        // A caller-supplied position equal to the internal pending marker is not one.
        let lsn = commit_lsn.map_or(0, |l| l.0).min(PENDING - 1);
        self.mark_with(db, rels, lsn);
    }

    /// Mark relations as written by a commit whose WAL position is not known yet (the
    /// caller learns it right after, e.g. with `pg_current_wal_insert_lsn()`). Until
    /// [`RecencyMap::resolve_pending`] brings it, reads of the relations need the
    /// primary, exactly as after [`RecencyMap::mark`] without an LSN; afterwards a
    /// replica that has replayed the position may serve them. Returns the mark's token
    /// for `resolve_pending`.
    pub fn mark_pending(&self, db: &str, rels: &[RelKey<'_>]) -> u64 {
        self.mark_with(db, rels, PENDING)
    }

    /// The position of a write marked with [`RecencyMap::mark_pending`] (`token` is what
    /// that call returned). `lsn` must be at or past the commit's end, e.g. the primary's
    /// `pg_current_wal_insert_lsn()` read after the commit (not the write position, which
    /// an asynchronous commit is ahead of). Marks of earlier streaks are ignored.
    pub fn resolve_pending(&self, db: &str, rels: &[RelKey<'_>], token: u64, lsn: Lsn) {
        if lsn.0 == 0 || lsn.0 == PENDING {
            return;
        }
        self.summarise_resolve(db, token, lsn.0);
        for rel in rels {
            let probe = BorrowedKey { db, name: rel.name };
            if let Some(mut slot) = self.slots.get_mut(&probe as &dyn KeyView) {
                if let Some(entry) = slot
                    .entries
                    .iter_mut()
                    .find(|e| e.schema.as_deref() == rel.schema)
                {
                    entry.resolve(lsn.0, token);
                }
            }
        }
    }

    fn mark_with(&self, db: &str, rels: &[RelKey<'_>], lsn: u64) -> u64 {
        let seq = self.mark_seq.fetch_add(1, Ordering::AcqRel) + 1;
        let ttl = self.window_ms();
        if ttl == 0 || rels.is_empty() {
            return seq;
        }
        let lists = self.lists.load_full();
        let now = self.clock.now_ms();
        let (mut stored, mut skipped) = (0, 0);
        for rel in rels {
            if lists.never_track.iter().any(|p| p.covers(rel)) {
                skipped += 1;
            } else if self.mark_one(db, rel, Mark { now, ttl, lsn, seq }) {
                stored += 1;
            }
        }
        if stored > 0 {
            self.counters.marks.add(stored);
            self.summarise_mark(db, now, lsn, seq);
        }
        if skipped > 0 {
            self.counters.never_tracked.add(skipped);
        }
        // (After the entries: whoever sees the count move finds them.)
        self.changed();
        seq
    }

    fn mark_one(&self, db: &str, rel: &RelKey<'_>, m: Mark) -> bool {
        if let MarkOutcome::Stored = self.try_mark(db, rel, m) {
            return true;
        }
        self.sweep(RECLAIM_BATCH);
        if let MarkOutcome::Stored = self.try_mark(db, rel, m) {
            return true;
        }
        // An overflowing database answers hot with no position: pending counts as unknown.
        self.record_overflow(db, m.now, if m.lsn == PENDING { 0 } else { m.lsn });
        false
    }

    fn try_mark(&self, db: &str, rel: &RelKey<'_>, m: Mark) -> MarkOutcome {
        let probe = BorrowedKey { db, name: rel.name };
        if let Some(mut slot) = self.slots.get_mut(&probe as &dyn KeyView) {
            return self.update_slot(&mut slot, rel.schema, m, false);
        }
        if !self.reserve() {
            return MarkOutcome::Full;
        }
        let key = SlotKey::new(db, rel.name);
        match self.slots.entry(key.clone()) {
            MapEntry::Occupied(mut slot) => self.update_slot(slot.get_mut(), rel.schema, m, true),
            MapEntry::Vacant(vacant) => {
                let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
                vacant.insert(Slot {
                    generation,
                    entries: vec![Entry::new(rel.schema, m.now, m.lsn, m.seq)],
                });
                self.enqueue(QueueItem {
                    key,
                    generation,
                    since_ms: m.now,
                });
                MarkOutcome::Stored
            }
        }
    }

    fn update_slot(
        &self,
        slot: &mut Slot,
        schema: Option<&str>,
        m: Mark,
        reserved: bool,
    ) -> MarkOutcome {
        if let Some(entry) = slot
            .entries
            .iter_mut()
            .find(|e| e.schema.as_deref() == schema)
        {
            entry.record(m.now, m.ttl, m.lsn, m.seq);
            if reserved {
                self.entries.fetch_sub(1, Ordering::AcqRel);
            }
            return MarkOutcome::Stored;
        }
        if !reserved && !self.reserve() {
            return MarkOutcome::Full;
        }
        slot.entries.push(Entry::new(schema, m.now, m.lsn, m.seq));
        MarkOutcome::Stored
    }

    /// Claims room for one new entry; false when the map is full.
    fn reserve(&self) -> bool {
        let max = self.max_entries.load(Ordering::Acquire);
        self.entries
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    fn record_overflow(&self, db: &str, now: u64, lsn: u64) {
        self.counters.overflows.add(1);
        self.record_database_hot(db, now, lsn, crate::hotness::HotReason::Overflow);
    }

    /// Every read of `db` is hot for one TTL from `now` (overflow, whole-database mark).
    pub(crate) fn record_database_hot(
        &self,
        db: &str,
        now: u64,
        lsn: u64,
        reason: crate::hotness::HotReason,
    ) {
        let ttl = self.window_ms();
        let update = |st: &mut OverflowState| {
            if now.saturating_sub(st.last_drop_ms) >= ttl {
                st.lsn = lsn;
            } else {
                st.lsn = combine_lsn(st.lsn, lsn);
            }
            st.last_drop_ms = st.last_drop_ms.max(now);
            st.reason = reason;
        };
        let updated = match self.overflow.get_mut(db) {
            Some(mut st) => {
                update(&mut st);
                true
            }
            None => false,
        };
        // (The shard's lock is released: the insert takes it again.)
        if !updated {
            self.insert_database_hot(db, update, now, lsn, reason);
        }
        self.changed();
    }

    fn insert_database_hot(
        &self,
        db: &str,
        update: impl Fn(&mut OverflowState),
        now: u64,
        lsn: u64,
        reason: crate::hotness::HotReason,
    ) {
        match self.overflow.entry(db.into()) {
            MapEntry::Occupied(mut st) => update(st.get_mut()),
            MapEntry::Vacant(vacant) => {
                vacant.insert(OverflowState {
                    last_drop_ms: now,
                    lsn,
                    reason,
                });
                self.overflow_dbs.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    pub(crate) fn queue_stripe(&self, key: &SlotKey) -> MutexGuard<'_, VecDeque<QueueItem>> {
        let i = self.slots.hash_usize(key) % self.queue.len();
        lock(&self.queue[i])
    }

    pub(crate) fn enqueue(&self, item: QueueItem) {
        self.queue_stripe(&item.key).push_back(item);
    }
}

/// Locks a queue stripe. The queues hold no invariant a panic could break, so a
/// poisoned lock is simply taken over.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
