//! What the balancer learns between full polls, per node and without a lock: the reads
//! outstanding on it (for `least_outstanding`), and replay positions newer than the
//! published view's.
//!
//! While reads wait on replay positions ([`crate::demand`]), three sources report a
//! standby's replay position:
//! - its fast polls ([`crate::monitor`]), every `replay_check_period`;
//! - the primary's monitor, which reads every standby's last report to the primary in one
//!   query each `replay_check_period` ([`crate::reports`]);
//! - *samples*: a session that sends a read to a standby asks for it in the same write,
//!   right after the read, and reports the answer ([`crate::Balancer::learn_replay`]). A
//!   sample costs no round trip of its own and is as fresh as the read it follows. The
//!   standby's fast-poll task grants one sample a period; the first read to that standby
//!   takes it ([`crate::Selection::take_replay_sample`]: an atomic load, and a swap when
//!   granted — no clock, no lock on the read path).
//!
//! Either lands here, not in a new view: replica selection takes the newer of this and
//! the view's position, and waiters on a position are woken. A full poll of the node
//! clears it: the poll's own answer then stands, and whatever a restarted or re-pointed
//! standby answered before cannot outlive it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use pgfresh_lsn::Lsn;
use std::time::Instant;

/// What [`NodeLive::sampled_at`] counts from.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Where a replay position learned between full polls came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The standby's fast poll.
    Poll,
    /// A sample after a read the standby served.
    Sample,
    /// The standby's last report to the primary ([`crate::reports`]).
    Report,
}

/// One node's lock-free live facts.
#[derive(Debug)]
pub(crate) struct NodeLive {
    /// Selections alive on the node.
    pub(crate) outstanding: AtomicU64,
    /// The newest replay position learned since the last full poll (its raw value; 0:
    /// none).
    replay: AtomicU64,
    /// A sample may be taken (granted by the node's fast-poll task, once a period while
    /// reads wait on replay positions).
    sample_granted: AtomicBool,
    /// When a sample last answered: microseconds since [`EPOCH`] (0: never). The node's
    /// fast polls wait a period from then (a fresh answer needs no poll).
    sampled_at: AtomicU64,
    /// When a report to the primary last moved the position, alike: while they move,
    /// the next one is due within a period of the primary's report polls.
    reported_at: AtomicU64,
    /// The node's name, for `pgfresh_replay_samples_total{node}` and
    /// `pgfresh_replay_reports_total{node}`.
    name: String,
    /// Those counters, registered at the first sample or report.
    samples: std::sync::OnceLock<metrics::Counter>,
    reports: std::sync::OnceLock<metrics::Counter>,
}

impl NodeLive {
    pub(crate) fn new(name: &str) -> NodeLive {
        NodeLive {
            outstanding: AtomicU64::new(0),
            replay: AtomicU64::new(0),
            sample_granted: AtomicBool::new(false),
            sampled_at: AtomicU64::new(0),
            reported_at: AtomicU64::new(0),
            name: name.to_string(),
            samples: std::sync::OnceLock::new(),
            reports: std::sync::OnceLock::new(),
        }
    }

    /// The replay position learned since the last full poll, if any.
    pub(crate) fn replay(&self) -> Option<Lsn> {
        match self.replay.load(Ordering::Acquire) {
            0 => None,
            raw => Some(Lsn(raw)),
        }
    }

    /// Grants the next read to this node a sample (or, with `false`, takes the grant
    /// back).
    pub(crate) fn grant_sample(&self, granted: bool) {
        self.sample_granted.store(granted, Ordering::Relaxed);
    }

    /// Takes the granted sample; true for exactly one of the callers racing for it.
    pub(crate) fn take_sample(&self) -> bool {
        self.sample_granted.load(Ordering::Relaxed)
            && self.sample_granted.swap(false, Ordering::Relaxed)
    }

    /// When a sample last answered, if one has.
    pub(crate) fn sampled_at(&self) -> Option<Instant> {
        since_epoch(&self.sampled_at)
    }

    /// When a report to the primary last moved the position, if one has.
    pub(crate) fn reported_at(&self) -> Option<Instant> {
        since_epoch(&self.reported_at)
    }

    /// `from` said the node replayed `lsn`: [`NodeLive::advance`]. A sample is a fresh
    /// answer from the node; a report to the primary is one when it moved the position
    /// (one that did not may be a standby that replayed more since, and reports only
    /// with the next WAL it receives). Either is counted, and its time kept.
    pub(crate) fn learn(&self, lsn: Lsn, from: Source) -> bool {
        let advanced = self.advance(lsn);
        let (at, counter, name) = match from {
            Source::Poll => return advanced,
            Source::Report if !advanced => return advanced,
            Source::Sample => (
                &self.sampled_at,
                &self.samples,
                "pgfresh_replay_samples_total",
            ),
            Source::Report => (
                &self.reported_at,
                &self.reports,
                "pgfresh_replay_reports_total",
            ),
        };
        let us = EPOCH.elapsed().as_micros().max(1);
        at.fetch_max(u64::try_from(us).unwrap_or(u64::MAX), Ordering::Relaxed);
        counter
            .get_or_init(|| metrics::counter!(name, "node" => self.name.clone()))
            .increment(1);
        advanced
    }

    /// The node replayed `lsn` (positions only move forward); true when it moved.
    fn advance(&self, lsn: Lsn) -> bool {
        self.replay.fetch_max(lsn.0, Ordering::AcqRel) < lsn.0
    }

    /// A full poll answered (or failed): its answer stands.
    pub(crate) fn clear_replay(&self) {
        self.replay.store(0, Ordering::Release);
    }
}

/// An instant kept as microseconds since [`EPOCH`] (0: none).
fn since_epoch(us: &AtomicU64) -> Option<Instant> {
    match us.load(Ordering::Relaxed) {
        0 => None,
        us => Some(*EPOCH + Duration::from_micros(us)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sample_per_grant() {
        let live = NodeLive::new("n");
        assert!(!live.take_sample());
        live.grant_sample(true);
        assert!(live.take_sample());
        assert!(!live.take_sample());
        live.grant_sample(true);
        live.grant_sample(false);
        assert!(!live.take_sample());
    }

    #[test]
    fn positions_only_move_forward_and_a_full_poll_clears_them() {
        let live = NodeLive::new("n");
        assert_eq!(live.replay(), None);
        assert!(live.learn(Lsn(200), Source::Sample));
        assert!(!live.advance(Lsn(100)));
        assert!(!live.learn(Lsn(200), Source::Poll));
        assert_eq!(live.replay(), Some(Lsn(200)));
        assert!(live.advance(Lsn(300)));
        assert_eq!(live.replay(), Some(Lsn(300)));
        live.clear_replay();
        assert_eq!(live.replay(), None);
    }

    #[test]
    fn a_report_counts_as_fresh_only_when_it_moves_the_position() {
        let live = NodeLive::new("n");
        assert_eq!(live.reported_at(), None);
        assert!(live.learn(Lsn(100), Source::Poll));
        assert_eq!(live.reported_at(), None, "a poll is no report");
        assert!(!live.learn(Lsn(100), Source::Report));
        assert_eq!(live.reported_at(), None, "a report that moved nothing");
        assert!(live.learn(Lsn(200), Source::Report));
        assert!(live.reported_at().is_some());
        assert_eq!(live.sampled_at(), None, "a report is no sample");
    }
}
