//! Answers and reports of the recency map.

use pgfresh_lsn::Lsn;

/// Whether a read must avoid replicas that may not have seen recent writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hotness {
    /// No tracked write within the window: any replica inside the lag budget will do.
    Cold,
    /// The read touches (or may touch) recently written data.
    Hot {
        /// Why the read is hot.
        reason: HotReason,
        /// The relation that made it hot (`schema.name` or `name`), when one did.
        relation: Option<String>,
        /// The WAL position a replica must have replayed to serve the read: the
        /// highest commit LSN among the hot entries that matched. `None` means the
        /// position is not known (a matched write was recorded without an LSN, or
        /// the reason is cold start or an always-hot relation) and only the primary
        /// can serve the read.
        required_lsn: Option<Lsn>,
    },
}

impl Hotness {
    /// True for [`Hotness::Hot`].
    pub fn is_hot(&self) -> bool {
        matches!(self, Hotness::Hot { .. })
    }

    /// The reason of a hot answer.
    pub fn reason(&self) -> Option<HotReason> {
        match self {
            Hotness::Cold => None,
            Hotness::Hot { reason, .. } => Some(*reason),
        }
    }

    /// The required replay position of a hot answer (see [`Hotness::Hot`]).
    pub fn required_lsn(&self) -> Option<Lsn> {
        match self {
            Hotness::Cold => None,
            Hotness::Hot { required_lsn, .. } => *required_lsn,
        }
    }
}

/// Why a lookup answered hot. Reported in routing reasons and metrics labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HotReason {
    /// A matched relation was written within the TTL.
    RecentWrite,
    /// A matched relation is on the always-hot list.
    AlwaysHot,
    /// The map is inside its cold-start window and cannot know earlier writes.
    ColdStart,
    /// Writes to this database were dropped because the map was full.
    Overflow,
    /// A committed write whose relations are not known (a function body pgfresh
    /// cannot analyse) made the whole database hot.
    WholeDatabase,
}

impl HotReason {
    /// A stable lower-case name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            HotReason::RecentWrite => "recent_write",
            HotReason::AlwaysHot => "always_hot",
            HotReason::ColdStart => "cold_start",
            HotReason::Overflow => "overflow",
            HotReason::WholeDatabase => "whole_database",
        }
    }
}

/// One live entry, as listed by [`crate::RecencyMap::hot_relations`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotEntry {
    /// Database name.
    pub db: String,
    /// `schema.name`, or `name` when the write was unqualified.
    pub relation: String,
    /// Milliseconds since the last recorded write.
    pub age_ms: u64,
    /// Writes recorded since the entry was created.
    pub writes: u64,
    /// Lookups this entry forced to the primary (or to a caught-up replica).
    pub hits: u64,
    /// Commit LSN that reads must wait for; `None` when unknown.
    pub lsn: Option<Lsn>,
    /// False when the entry is past `max_staleness_ms` and no longer forces reads.
    pub forcing: bool,
}

/// Counter snapshot for the metrics layer. All counters only grow, except `entries`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecencyStats {
    /// Relation writes recorded (one per relation per `mark`).
    pub marks: u64,
    /// Relation writes skipped because of the `never_track` list.
    pub never_tracked: u64,
    /// Lookups made.
    pub lookups: u64,
    /// Lookups answered hot, all reasons.
    pub hits: u64,
    /// Hot answers because of a recent write.
    pub hits_recent_write: u64,
    /// Hot answers because of the always-hot list.
    pub hits_always_hot: u64,
    /// Hot answers during a cold-start window.
    pub hits_cold_start: u64,
    /// Hot answers because the database overflowed.
    pub hits_overflow: u64,
    /// Times a live entry was not forced because it passed `max_staleness_ms`.
    pub stale_releases: u64,
    /// Entries removed by the sweeper.
    pub expirations: u64,
    /// Relation writes dropped because the map was full.
    pub overflows: u64,
    /// Entries now held (including expired ones the sweeper has not removed yet).
    pub entries: u64,
}

/// What one [`crate::RecencyMap::sweep`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Sweep-queue items examined (at most the batch size).
    pub examined: usize,
    /// Expired entries removed.
    pub removed: usize,
    /// Entries left in the map.
    pub remaining: usize,
    /// True when no further item was due: calling again now would do nothing.
    pub done: bool,
}
