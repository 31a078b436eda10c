//! What the balancer learns between full polls, per node and without a lock: the reads
//! outstanding on it (for `least_outstanding`), and replay positions newer than the
//! published view's.
//!
//! While reads wait on replay positions ([`crate::demand`]), two sources report a
//! standby's `pg_last_wal_replay_lsn()`:
//! - its fast polls ([`crate::monitor`]), every `replay_check_period`;
//! - *samples*: a session that sends a read to a standby asks for it in the same write,
//!   right after the read ([`crate::Balancer::claim_replay_sample`], at most once per
//!   `replay_check_period` per standby across all sessions), and reports the answer
//!   ([`crate::Balancer::learn_replay`]). A sample costs no round trip of its own and is
//!   as fresh as the read it follows.
//!
//! Either lands here, not in a new view: replica selection takes the newer of this and
//! the view's position, and waiters on a position are woken. A full poll of the node
//! clears it: the poll's own answer then stands, and whatever a restarted or re-pointed
//! standby answered before cannot outlive it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgfresh_lsn::Lsn;

/// One node's lock-free live facts.
#[derive(Debug)]
pub(crate) struct NodeLive {
    /// Selections alive on the node.
    pub(crate) outstanding: AtomicU64,
    /// The newest replay position learned since the last full poll (its raw value; 0:
    /// none).
    replay: AtomicU64,
    /// When a session last claimed a sample: microseconds since the balancer's epoch,
    /// plus one (0: never).
    claimed_at: AtomicU64,
    /// The node's name, for `pgfresh_replay_samples_total{node}`.
    name: String,
    /// That counter, registered at the first sample (the metrics recorder is installed
    /// after the balancer starts).
    samples: std::sync::OnceLock<metrics::Counter>,
}

impl NodeLive {
    pub(crate) fn new(name: &str) -> NodeLive {
        NodeLive {
            outstanding: AtomicU64::new(0),
            replay: AtomicU64::new(0),
            claimed_at: AtomicU64::new(0),
            name: name.to_string(),
            samples: std::sync::OnceLock::new(),
        }
    }

    /// The replay position learned since the last full poll, if any.
    pub(crate) fn replay(&self) -> Option<Lsn> {
        match self.replay.load(Ordering::Acquire) {
            0 => None,
            raw => Some(Lsn(raw)),
        }
    }

    /// Claims the next sample if none was claimed within `period`; true for exactly one
    /// of the callers racing for it.
    pub(crate) fn claim(&self, clock: &Clock, period: Duration) -> bool {
        let now = clock.now();
        let last = self.claimed_at.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < micros(period) {
            return false;
        }
        self.claimed_at
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// A sample answered `lsn`: [`NodeLive::advance`], counted.
    pub(crate) fn learn(&self, lsn: Lsn) -> bool {
        self.samples
            .get_or_init(
                || metrics::counter!("pgfresh_replay_samples_total", "node" => self.name.clone()),
            )
            .increment(1);
        self.advance(lsn)
    }

    /// The node replayed `lsn` (positions only move forward); true when it moved.
    pub(crate) fn advance(&self, lsn: Lsn) -> bool {
        self.replay.fetch_max(lsn.0, Ordering::AcqRel) < lsn.0
    }

    /// A full poll answered (or failed): its answer stands.
    pub(crate) fn clear_replay(&self) {
        self.replay.store(0, Ordering::Release);
    }
}

/// A monotonic clock in microseconds since the balancer started, plus one (so that 0 can
/// mean "never").
pub(crate) struct Clock {
    epoch: Instant,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        Clock {
            epoch: Instant::now(),
        }
    }

    pub(crate) fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1) + 1
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_claim_per_period() {
        let clock = Clock::new();
        let live = NodeLive::new("n");
        let hour = Duration::from_secs(3600);
        assert!(live.claim(&clock, hour));
        assert!(!live.claim(&clock, hour));
        assert!(!live.claim(&clock, hour));
        // A zero period never holds a claim back.
        assert!(live.claim(&clock, Duration::ZERO));
        assert!(live.claim(&clock, Duration::ZERO));
    }

    #[test]
    fn positions_only_move_forward_and_a_full_poll_clears_them() {
        let live = NodeLive::new("n");
        assert_eq!(live.replay(), None);
        assert!(live.learn(Lsn(200)));
        assert!(!live.advance(Lsn(100)));
        assert!(!live.learn(Lsn(200)));
        assert_eq!(live.replay(), Some(Lsn(200)));
        assert!(live.advance(Lsn(300)));
        assert_eq!(live.replay(), Some(Lsn(300)));
        live.clear_replay();
        assert_eq!(live.replay(), None);
    }
}
