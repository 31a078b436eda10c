//! The clients waiting for a slot in one pool, with their deadlines kept together, so
//! that a wait needs no timer of its own.
//!
//! In transaction mode with many clients nearly every unit of work waits for a slot.
//! A timer per wait (`tokio::time::timeout`) is entered into the runtime's timer wheel
//! and taken out again when the slot comes first, which nearly always happens: at 500
//! clients that cost about 600 instructions and 70 instruction-cache misses a statement
//! (docs/benchmarks.md). Instead each waiter is listed here with its deadline, and one
//! sweeper task per pool, running only while someone waits, sleeps until the earliest
//! deadline and wakes the waiters whose time is up. Times are the runtime's
//! ([`tokio::time::Instant`]), the clock its timers run on.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::{AcquireError, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// A deadline for timeouts too long to add to an instant (about 30 years).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// One waiting client.
struct Waiter {
    since: Instant,
    deadline: Instant,
    /// Woken by the sweeper when the deadline passes.
    waker: Waker,
    expired: bool,
}

/// The waiters in slots: a slot freed is the next one taken, so with hundreds of
/// clients taking turns the few slots in use stay in the cache (a hash map spreads
/// them over all of its lines).
#[derive(Default)]
struct Inner {
    slots: Vec<Option<Waiter>>,
    free: Vec<usize>,
    /// When the sweeper looks next; `None` while no sweeper runs.
    sweep_at: Option<Instant>,
}

impl Inner {
    fn waiters(&mut self) -> impl Iterator<Item = &mut Waiter> {
        self.slots.iter_mut().flatten()
    }
}

/// A pool's waiters (see the module comment).
#[derive(Default)]
pub(super) struct Waits {
    inner: Mutex<Inner>,
    /// Tells a sleeping sweeper that a deadline earlier than its own came in (a
    /// reload shortened the timeout).
    earlier: Notify,
}

/// How a wait for a slot ended.
pub(super) enum Waited {
    Got(OwnedSemaphorePermit),
    /// The semaphore was closed.
    Closed,
    TimedOut,
}

/// A wait's slot in [`Waits`] (from its first poll), freed however the wait ends.
struct Listed<'a> {
    waits: &'a Waits,
    slot: Option<usize>,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let mut inner = self.waits.lock();
            inner.slots[i] = None;
            inner.free.push(i);
        }
    }
}

impl Waits {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for a permit of `slots`, at most `timeout` from `since`. The wait is
    /// listed (for [`Waits::count`] and the sweeper) from its first poll to its end.
    pub(super) async fn wait(
        self: &Arc<Self>,
        slots: &Arc<Semaphore>,
        since: Instant,
        timeout: Duration,
    ) -> Waited {
        // Any timeout the config allows (a `u64` of milliseconds) must not overflow. On
        // Linux an instant has room for all of them; where it is 64-bit nanoseconds it
        // would not.
        let deadline = since
            .checked_add(timeout)
            .unwrap_or_else(|| since + FAR_FUTURE);
        let mut listed = Listed {
            waits: self,
            slot: None,
        };
        let mut acquire = std::pin::pin!(slots.clone().acquire_owned());
        std::future::poll_fn(|cx| {
            match acquire.as_mut().poll(cx) {
                Poll::Ready(Ok(p)) => return Poll::Ready(Waited::Got(p)),
                Poll::Ready(Err(AcquireError { .. })) => return Poll::Ready(Waited::Closed),
                Poll::Pending => {}
            }
            if self.expired(&mut listed.slot, since, deadline, cx) {
                Poll::Ready(Waited::TimedOut)
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// List the wait in `slot` (or refresh its waker); true once its deadline passed.
    fn expired(
        self: &Arc<Self>,
        slot: &mut Option<usize>,
        since: Instant,
        deadline: Instant,
        cx: &mut Context<'_>,
    ) -> bool {
        let mut inner = self.lock();
        if let Some(w) = slot.and_then(|i| inner.slots[i].as_mut()) {
            if !w.waker.will_wake(cx.waker()) {
                w.waker = cx.waker().clone();
            }
            return w.expired;
        }
        let waiter = Waiter {
            since,
            deadline,
            waker: cx.waker().clone(),
            expired: false,
        };
        let i = match inner.free.pop() {
            Some(i) => {
                inner.slots[i] = Some(waiter);
                i
            }
            None => {
                inner.slots.push(Some(waiter));
                inner.slots.len() - 1
            }
        };
        *slot = Some(i);
        match inner.sweep_at {
            None => {
                inner.sweep_at = Some(deadline);
                tokio::spawn(self.clone().sweep());
            }
            Some(at) if deadline < at => {
                inner.sweep_at = Some(deadline);
                self.earlier.notify_one();
            }
            Some(_) => {}
        }
        false
    }

    /// How many wait now, and how long the oldest has waited.
    pub(super) fn count(&self) -> (usize, Duration) {
        let mut inner = self.lock();
        let (n, oldest) = inner.waiters().fold((0, None::<Instant>), |(n, o), w| {
            (n + 1, Some(o.map_or(w.since, |o| o.min(w.since))))
        });
        (n, oldest.map(|o| o.elapsed()).unwrap_or_default())
    }

    /// The sweeper: until no one waits, sleep until the earliest deadline, then wake
    /// the waiters whose time is up.
    async fn sweep(self: Arc<Self>) {
        loop {
            let Some(at) = self.lock().sweep_at else {
                return;
            };
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                () = self.earlier.notified() => continue,
            }
            let mut due = Vec::new();
            {
                let mut inner = self.lock();
                let now = Instant::now();
                let mut next: Option<Instant> = None;
                for w in inner.waiters().filter(|w| !w.expired) {
                    if w.deadline <= now {
                        w.expired = true;
                        due.push(w.waker.clone());
                    } else {
                        next = Some(next.map_or(w.deadline, |n| n.min(w.deadline)));
                    }
                }
                inner.sweep_at = next;
            }
            due.into_iter().for_each(Waker::wake);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits() -> (Arc<Waits>, Arc<Semaphore>) {
        (Arc::new(Waits::default()), Arc::new(Semaphore::new(0)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_its_deadline() {
        let (w, slots) = waits();
        let since = Instant::now();
        let got = w.wait(&slots, since, Duration::from_millis(300)).await;
        assert!(matches!(got, Waited::TimedOut));
        assert!(since.elapsed() >= Duration::from_millis(300));
        assert_eq!(w.count().0, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_ends_the_wait_and_the_sweeper_stops_with_the_last_waiter() {
        let (w, slots) = waits();
        let waiter = {
            let (w, slots) = (w.clone(), slots.clone());
            tokio::spawn(async move {
                let r = w
                    .wait(&slots, Instant::now(), Duration::from_secs(60))
                    .await;
                matches!(r, Waited::Got(_))
            })
        };
        while w.count().0 == 0 {
            tokio::task::yield_now().await;
        }
        slots.add_permits(1);
        assert!(waiter.await.unwrap());
        assert_eq!(w.count().0, 0);
        // The sweeper wakes at the deadline, finds no one and stops.
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert!(w.lock().sweep_at.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_timeout_after_a_longer_one_is_kept() {
        let (w, slots) = waits();
        let long = {
            let (w, slots) = (w.clone(), slots.clone());
            tokio::spawn(async move {
                matches!(
                    w.wait(&slots, Instant::now(), Duration::from_secs(100))
                        .await,
                    Waited::TimedOut
                )
            })
        };
        while w.count().0 == 0 {
            tokio::task::yield_now().await;
        }
        let since = Instant::now();
        let short = w.wait(&slots, since, Duration::from_secs(1)).await;
        assert!(matches!(short, Waited::TimedOut));
        let waited = since.elapsed();
        assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(100));
        assert!(!long.is_finished());
        assert!(long.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_counted_with_the_oldest_wait_and_their_slots_reused() {
        let (w, slots) = waits();
        // Each waiter keeps the permit it gets, so the next one goes on waiting.
        let spawn_waiter = || {
            let (w, slots) = (w.clone(), slots.clone());
            tokio::spawn(async move {
                match w
                    .wait(&slots, Instant::now(), Duration::from_secs(60))
                    .await
                {
                    Waited::Got(p) => Some(p),
                    _ => None,
                }
            })
        };
        let listed = |n: usize| {
            let w = w.clone();
            async move {
                while w.count().0 != n {
                    tokio::task::yield_now().await;
                }
            }
        };
        let first = spawn_waiter();
        listed(1).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let second = spawn_waiter();
        listed(2).await;
        let (n, oldest) = w.count();
        assert_eq!(n, 2);
        assert!(oldest >= Duration::from_secs(5), "{oldest:?}");
        // First come, first served; the slot the first wait freed is the next one taken.
        slots.add_permits(1);
        let first = first
            .await
            .unwrap()
            .expect("the first waiter got the permit");
        listed(1).await;
        let third = spawn_waiter();
        listed(2).await;
        assert_eq!(w.lock().slots.len(), 2);
        slots.add_permits(2);
        assert!(second.await.unwrap().is_some() && third.await.unwrap().is_some());
        assert_eq!(w.count(), (0, Duration::ZERO));
        drop(first);
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_timeout_the_config_allows_waits_for_the_permit() {
        let (w, slots) = waits();
        let giver = slots.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            giver.add_permits(1);
        });
        let longest = Duration::from_millis(u64::MAX);
        let got = w.wait(&slots, Instant::now(), longest).await;
        assert!(matches!(got, Waited::Got(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_semaphore_ends_the_wait() {
        let (w, slots) = waits();
        let closer = slots.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            closer.close();
        });
        let got = w
            .wait(&slots, Instant::now(), Duration::from_secs(60))
            .await;
        assert!(matches!(got, Waited::Closed));
    }
}
