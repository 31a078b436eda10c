//! Timers: the loop waits in the ring no longer than the earliest deadline.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::executor;

thread_local! {
    /// The time [`turn_now`] read in this turn of the thread's ring, once it has.
    static TURN_NOW: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The time, read at most once a turn of this thread's ring: the first call in a turn
/// reads the clock, the others that turn are given the same instant. For stamps taken
/// many times a turn where being a turn late does not matter (when a pooled connection
/// was returned or lent; a turn runs for microseconds, at worst for as long as the
/// slowest task it runs), not for measuring. Off a ring's thread, `Instant::now()`.
pub fn turn_now() -> Instant {
    if !executor::in_runtime() {
        return Instant::now();
    }
    TURN_NOW.with(|t| {
        t.get().unwrap_or_else(|| {
            let now = Instant::now();
            t.set(Some(now));
            now
        })
    })
}

/// A new turn (or the runtime left): the next [`turn_now`] reads the clock.
pub(crate) fn new_turn() {
    let _ = TURN_NOW.try_with(|t| t.set(None));
}

/// The deadlines tasks wait for, earliest first.
#[derive(Default)]
pub(crate) struct Timers {
    waiting: BTreeMap<(Instant, u64), Waker>,
    next_id: u64,
}

impl Timers {
    /// The earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.waiting.keys().next().map(|(at, _)| *at)
    }

    /// Wakes every task whose deadline has passed (`now` is read only if there are any).
    pub(crate) fn fire(&mut self, now: impl FnOnce() -> Instant) {
        if self.waiting.is_empty() {
            return;
        }
        let now = now();
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > now {
                break;
            }
            entry.remove().wake();
        }
    }

    pub(crate) fn take_all(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.waiting).into_values().collect()
    }

    fn register(&mut self, at: Instant, id: Option<u64>, waker: &Waker) -> u64 {
        let id = id.unwrap_or_else(|| {
            self.next_id += 1;
            self.next_id
        });
        match self.waiting.get_mut(&(at, id)) {
            Some(w) if w.will_wake(waker) => {}
            Some(w) => w.clone_from(waker),
            None => {
                self.waiting.insert((at, id), waker.clone());
            }
        }
        id
    }

    fn remove(&mut self, at: Instant, id: u64) {
        self.waiting.remove(&(at, id));
    }
}

/// Waits until `duration` has passed.
pub fn sleep(duration: Duration) -> Sleep {
    let now = Instant::now();
    // A duration past what an `Instant` holds waits as good as forever.
    sleep_until(
        now.checked_add(duration)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600)),
    )
}

/// Waits until `at`.
pub fn sleep_until(at: Instant) -> Sleep {
    Sleep { at, id: None }
}

/// The future of [`sleep`] and [`sleep_until`].
#[derive(Debug)]
pub struct Sleep {
    at: Instant,
    id: Option<u64>,
}

impl Sleep {
    /// When it ends.
    pub fn deadline(&self) -> Instant {
        self.at
    }

    /// Makes it end at `at` instead.
    pub fn reset(&mut self, at: Instant) {
        if let Some(id) = self.id.take() {
            executor::with(|cx| cx.timers.borrow_mut().remove(self.at, id));
        }
        self.at = at;
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            if let Some(id) = self.id.take() {
                executor::with(|rt| rt.timers.borrow_mut().remove(self.at, id));
            }
            return Poll::Ready(());
        }
        let (at, id) = (self.at, self.id);
        self.id = Some(executor::with(|rt| {
            rt.timers.borrow_mut().register(at, id, cx.waker())
        }));
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            // A runtime torn down before its tasks leaves nothing to remove from.
            let _ = executor::try_with(|cx| cx.timers.borrow_mut().remove(self.at, id));
        }
    }
}
