//! The session's wait for the proxy's shutdown, cheap to poll on every turn.
//!
//! The session loop polls this future on each turn its other branches are pending (twice a
//! statement). Polling tokio's watch wait each time would lock the watch's waiter list
//! each time. Instead the wait is polled once, which puts the session's task on that list,
//! and after that only when the watch's version moved (one atomic load): a session runs
//! in one task, so the waker registered by the first poll stays the one to wake.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::watch;

/// Resolves once shutdown begins (the watch turns `true`) or the proxy is gone.
pub(super) struct ShutdownWait {
    /// A receiver that only looks at the version: changed since the wait began?
    probe: watch::Receiver<bool>,
    wait: Pin<Box<dyn Future<Output = ()> + Send>>,
    registered: bool,
}

impl ShutdownWait {
    pub(super) fn new(shutdown: &watch::Receiver<bool>) -> Self {
        let mut rx = shutdown.clone();
        ShutdownWait {
            probe: shutdown.clone(),
            wait: Box::pin(async move {
                let _ = rx.wait_for(|s| *s).await;
            }),
            registered: false,
        }
    }
}

impl Future for ShutdownWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // `has_changed` fails once the sender is gone: poll, and the wait ends.
        if self.registered && matches!(self.probe.has_changed(), Ok(false)) {
            return Poll::Pending;
        }
        self.registered = true;
        // Marked seen before the wait looks at the value: a change after this point is
        // either seen by the wait now or makes `has_changed` true at a later poll.
        self.probe.mark_unchanged();
        self.wait.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Counting(AtomicUsize);
    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn wakes_and_ends_when_shutdown_begins_not_before() {
        let (tx, rx) = watch::channel(false);
        let mut w = ShutdownWait::new(&rx);
        let waker = Arc::new(Counting(AtomicUsize::new(0)));
        let w_ref = std::task::Waker::from(waker.clone());
        let mut cx = Context::from_waker(&w_ref);
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        // A change that is not shutdown wakes the task but does not end the wait.
        tx.send(false).unwrap();
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        let woken = waker.0.load(Ordering::SeqCst);
        tx.send(true).unwrap();
        assert!(
            waker.0.load(Ordering::SeqCst) > woken,
            "the registered waker fires"
        );
        assert!(Pin::new(&mut w).poll(&mut cx).is_ready());
    }

    #[test]
    fn a_shutdown_begun_before_the_wait_ends_it_at_the_first_poll() {
        let (tx, rx) = watch::channel(false);
        tx.send(true).unwrap();
        let mut w = ShutdownWait::new(&rx);
        let w_ref = std::task::Waker::noop();
        let mut cx = Context::from_waker(w_ref);
        assert!(Pin::new(&mut w).poll(&mut cx).is_ready());
    }

    #[test]
    fn ends_when_the_proxy_is_gone() {
        let (tx, rx) = watch::channel(false);
        let mut w = ShutdownWait::new(&rx);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        drop(tx);
        assert!(Pin::new(&mut w).poll(&mut cx).is_ready());
    }
}
