//! Striped event counters.
//!
//! A single shared `AtomicU64` bumped by every lookup would bounce one cache line
//! between all cores. Each counter here is split into cache-line-sized cells; a
//! thread always adds to the same cell and a snapshot sums them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const STRIPES: usize = 16;

#[repr(align(128))]
#[derive(Default)]
struct Cell(AtomicU64);

/// A counter that many threads can increment without contending.
#[derive(Default)]
pub(crate) struct Striped {
    cells: [Cell; STRIPES],
}

fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

impl Striped {
    pub(crate) fn add(&self, n: u64) {
        self.cells[stripe()].0.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.cells
            .iter()
            .fold(0u64, |acc, c| acc.wrapping_add(c.0.load(Ordering::Relaxed)))
    }
}

/// All counters of one map.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) marks: Striped,
    pub(crate) never_tracked: Striped,
    pub(crate) lookups: Striped,
    pub(crate) hits_recent_write: Striped,
    pub(crate) hits_always_hot: Striped,
    pub(crate) hits_cold_start: Striped,
    pub(crate) hits_overflow: Striped,
    pub(crate) stale_releases: Striped,
    pub(crate) expirations: Striped,
    pub(crate) overflows: Striped,
    pub(crate) whole_database_marks: Striped,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_across_threads() {
        let c = std::sync::Arc::new(Striped::default());
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.add(1);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(c.get(), 8000);
    }
}
