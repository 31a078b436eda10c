//! What sessions tell the balancer between polls, per node and without a lock: the reads
//! outstanding on it (for `least_outstanding`), and replay positions *sampled* on a client
//! connection that just served a read.
//!
//! While reads wait on replay positions ([`crate::demand`]), a session that sends a read to
//! a standby may ask that standby for `pg_last_wal_replay_lsn()` in the same write, right
//! after the read ([`crate::Balancer::claim_replay_sample`], at most once per
//! `replay_check_period` per standby, across all sessions). The answer costs no round trip
//! of its own and is as fresh as the read; it is kept here
//! ([`crate::Balancer::learn_replay`]) and replica selection takes the newer of it and the
//! published view's position. A standby's fast poll ([`crate::monitor`]) is skipped while
//! samples are fresher than its period; the tick then publishes the sampled position
//! instead, so the view, the status page and waiters on a position keep up.
//!
//! A full poll of the node clears its sample: the poll's own answer then stands, and
//! whatever a restarted or re-pointed standby answered before cannot outlive it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgfresh_lsn::Lsn;

/// One node's lock-free live facts.
#[derive(Debug)]
pub(crate) struct NodeLive {
    /// Selections alive on the node.
    pub(crate) outstanding: AtomicU64,
    /// The latest sampled replay position (its raw value); 0: none since the last full
    /// poll.
    replay: AtomicU64,
    /// When it was sampled: microseconds since the balancer's epoch, plus one (0: never).
    replay_at: AtomicU64,
    /// When a session last claimed a sample (same clock).
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
            replay_at: AtomicU64::new(0),
            claimed_at: AtomicU64::new(0),
            name: name.to_string(),
            samples: std::sync::OnceLock::new(),
        }
    }

    /// The sampled replay position, if any since the last full poll.
    pub(crate) fn replay(&self) -> Option<Lsn> {
        match self.replay.load(Ordering::Acquire) {
            0 => None,
            raw => Some(Lsn(raw)),
        }
    }

    /// The sampled position if it was taken within `fresh` before `now`.
    pub(crate) fn replay_within(&self, clock: &Clock, fresh: Duration) -> Option<Lsn> {
        let at = self.replay_at.load(Ordering::Acquire);
        let age = clock.now().saturating_sub(at);
        (at != 0 && age < micros(fresh))
            .then(|| self.replay())
            .flatten()
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

    /// A sample answered `lsn` (positions only move forward).
    pub(crate) fn learn(&self, clock: &Clock, lsn: Lsn) {
        self.samples
            .get_or_init(
                || metrics::counter!("pgfresh_replay_samples_total", "node" => self.name.clone()),
            )
            .increment(1);
        self.replay.fetch_max(lsn.0, Ordering::AcqRel);
        self.replay_at.fetch_max(clock.now(), Ordering::AcqRel);
    }

    /// A full poll answered (or failed): its answer stands.
    pub(crate) fn clear_replay(&self) {
        self.replay.store(0, Ordering::Release);
        self.replay_at.store(0, Ordering::Release);
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
    fn samples_only_move_forward_and_a_full_poll_clears_them() {
        let clock = Clock::new();
        let live = NodeLive::new("n");
        assert_eq!(live.replay(), None);
        live.learn(&clock, Lsn(200));
        live.learn(&clock, Lsn(100));
        assert_eq!(live.replay(), Some(Lsn(200)));
        assert_eq!(
            live.replay_within(&clock, Duration::from_secs(3600)),
            Some(Lsn(200))
        );
        assert_eq!(live.replay_within(&clock, Duration::ZERO), None);
        live.clear_replay();
        assert_eq!(live.replay(), None);
        assert_eq!(live.replay_within(&clock, Duration::from_secs(3600)), None);
    }
}
