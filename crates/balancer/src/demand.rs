//! Demand for fresher replay positions.
//!
//! The full poll runs every `sr_check_period` (100 ms by default): between two polls a
//! replica's known replay position ages, and a read of a relation written a moment ago goes
//! to the primary although a replica replayed the write long since. Polling every replica
//! every few milliseconds all the time would cost the servers for nothing while no read
//! waits on a position. So a read that found no replica at the position it needs records a
//! *demand*; while there was one within [`DEMAND_WINDOW`], each standby's monitor also asks
//! its node for `pg_last_wal_replay_lsn()` every `replay_check_period` (see
//! [`crate::monitor`]). Recording reads the clock and one atomic; it stores at most every
//! 10 ms, and wakes the monitors only when demand starts.
//!
//! The fast polls also pause while there is nothing new to learn: a standby known to have
//! replayed the newest position a read asked for and the newest commit position pgfresh
//! saw (*wanted*) waits until one of them is newer ([`ReplayDemand::wait_raised`]). With
//! a write every 50 ms that is a poll or two a write instead of twenty-five; under
//! constant writes the wanted position rises with every commit, so the polls run every
//! period as before, and a standby's position is learned whether or not a read has asked
//! for that commit yet. Raising it is a load and a compare; the store, and the wake-up of
//! the paused polls, happen once per newer position.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgfresh_lsn::Lsn;
use tokio::sync::Notify;

/// How long the fast replay polls go on after the last read that needed them.
pub(crate) const DEMAND_WINDOW: Duration = Duration::from_secs(1);

/// A demand is re-recorded at most this often (a read storm does not write the shared
/// timestamp on every read).
const RECORD_GRANULARITY_MS: u64 = 10;

/// When a read last needed a replay position no replica was known to have.
pub(crate) struct ReplayDemand {
    epoch: Instant,
    /// Milliseconds since `epoch` of the last demand, plus one (0: never).
    last: AtomicU64,
    /// Wakes the monitors when demand starts.
    started: Notify,
    /// The newest position a read asked for or a commit reported (raw; 0: none yet).
    wanted: AtomicU64,
    /// Wakes paused fast polls when `wanted` rises.
    raised: Notify,
}

impl ReplayDemand {
    pub(crate) fn new() -> ReplayDemand {
        ReplayDemand {
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            started: Notify::new(),
            wanted: AtomicU64::new(0),
            raised: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    /// A read may soon need `lsn` (a commit's position): wanted from now on, without
    /// starting a demand.
    pub(crate) fn raise(&self, lsn: Lsn) {
        if lsn.0 > self.wanted.load(Ordering::Relaxed)
            && self.wanted.fetch_max(lsn.0, Ordering::AcqRel) < lsn.0
        {
            self.raised.notify_waiters();
        }
    }

    /// A read needed `required`, which no replica is known to have replayed.
    pub(crate) fn record(&self, required: Lsn) {
        // Before the demand starts: the monitors it wakes look at the wanted position.
        self.raise(required);
        let now = self.now_ms();
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < RECORD_GRANULARITY_MS {
            return;
        }
        self.last.store(now, Ordering::Relaxed);
        if last == 0 || now - last >= window_ms() {
            self.started.notify_waiters();
        }
    }

    /// A read recorded a demand within the window.
    pub(crate) fn active(&self) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        last != 0 && self.now_ms().saturating_sub(last) < window_ms()
    }

    /// The newest position a read asked for or a commit reported, if any.
    pub(crate) fn wanted(&self) -> Option<Lsn> {
        match self.wanted.load(Ordering::Acquire) {
            0 => None,
            raw => Some(Lsn(raw)),
        }
    }

    /// Resolves once a position newer than `known` is wanted (at once if one already
    /// is).
    pub(crate) async fn wait_raised(&self, known: Option<Lsn>) {
        loop {
            let raised = self.raised.notified();
            tokio::pin!(raised);
            raised.as_mut().enable();
            if self.wanted() > known {
                return;
            }
            raised.await;
        }
    }

    /// Resolves when demand starts (or at once, if it is active).
    pub(crate) async fn wait_active(&self) {
        loop {
            let started = self.started.notified();
            tokio::pin!(started);
            started.as_mut().enable();
            if self.active() {
                return;
            }
            started.await;
        }
    }
}

fn window_ms() -> u64 {
    u64::try_from(DEMAND_WINDOW.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn demand_wakes_a_waiter_and_lasts_the_window() {
        let d = std::sync::Arc::new(ReplayDemand::new());
        assert!(!d.active());
        let waiter = tokio::spawn({
            let d = d.clone();
            async move { d.wait_active().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        // Recorded even in the first milliseconds of the balancer's life.
        d.record(Lsn(100));
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("the demand wakes the waiter")
            .unwrap();
        assert!(d.active());
        // Already active: no wait.
        d.wait_active().await;
    }

    #[test]
    fn demand_expires() {
        // A demand recorded a window ago.
        let d = ReplayDemand {
            epoch: Instant::now() - DEMAND_WINDOW - Duration::from_millis(5),
            last: AtomicU64::new(1),
            started: Notify::new(),
            wanted: AtomicU64::new(0),
            raised: Notify::new(),
        };
        assert!(!d.active());
        d.record(Lsn(100));
        assert!(d.active());
    }

    #[tokio::test]
    async fn a_newer_wanted_position_wakes_a_paused_poll() {
        let d = std::sync::Arc::new(ReplayDemand::new());
        assert_eq!(d.wanted(), None);
        d.record(Lsn(200));
        assert_eq!(d.wanted(), Some(Lsn(200)));
        // Positions only rise.
        d.record(Lsn(100));
        assert_eq!(d.wanted(), Some(Lsn(200)));
        // Already wanted beyond what is known: no wait.
        d.wait_raised(Some(Lsn(150))).await;
        // Known to have it: the wait lasts until a read asks for more.
        let waiter = tokio::spawn({
            let d = d.clone();
            async move { d.wait_raised(Some(Lsn(200))).await }
        });
        tokio::task::yield_now().await;
        d.record(Lsn(200));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "the same position raises nothing");
        d.record(Lsn(300));
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("a newer position wakes the wait")
            .unwrap();
    }
}
