//! Time sources for the recency map.
//!
//! The map never reads the wall clock directly: every timestamp comes from a [`Clock`]
//! handed to [`crate::RecencyMap::new`]. Production code uses [`SystemClock`]; tests use
//! [`ManualClock`] and move time forward explicitly instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A monotonic millisecond clock.
///
/// Values only need to be comparable with each other; they do not have to be tied to
/// the Unix epoch. Implementations must never go backwards.
pub trait Clock: Send + Sync {
    /// Milliseconds since an arbitrary, fixed origin.
    fn now_ms(&self) -> u64;
}

/// The real clock: milliseconds elapsed since the clock was created, from
/// [`Instant`] (monotonic, unaffected by wall-clock changes).
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin (`0`) is now.
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to. Shared between threads through an
/// `Arc`; all operations are atomic.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            now: AtomicU64::new(start_ms),
        }
    }

    /// Moves the clock forward by `ms` and returns the new reading.
    pub fn advance(&self, ms: u64) -> u64 {
        self.now.fetch_add(ms, Ordering::SeqCst) + ms
    }

    /// Sets the reading to `ms`. Never moves backwards: a value below the current
    /// reading is ignored, so the clock stays monotonic.
    pub fn set(&self, ms: u64) {
        self.now.fetch_max(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward() {
        let c = ManualClock::new(10);
        assert_eq!(c.now_ms(), 10);
        assert_eq!(c.advance(5), 15);
        c.set(12);
        assert_eq!(c.now_ms(), 15);
        c.set(100);
        assert_eq!(c.now_ms(), 100);
    }

    #[test]
    fn system_clock_is_monotonic() {
        let c = SystemClock::new();
        let a = c.now_ms();
        let b = c.now_ms();
        assert!(b >= a);
    }
}
