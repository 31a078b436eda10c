//! The console's PAUSE and RESUME, after PgBouncer's: maintenance on a node (a restart, a
//! minor-version upgrade) without an error reaching a client.
//!
//! While paused, a unit that needs a server connection in a session holding none waits
//! for RESUME (transaction mode: every unit between transactions; session mode: a new
//! session's login), as long as it would wait out a failover: a statement at most
//! `query_wait_timeout_ms`, a login within `client_login_timeout_ms`. A session that
//! holds a connection goes on with it: a transaction runs to its end, and a session-mode
//! client keeps its connections until it leaves. PAUSE answers once no server connection
//! is in use, after closing the pooled ones; RESUME lets the waiting units go, on new
//! connections.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::context::Shared;

/// Whether pgfresh is paused, and a way to wait for the end of it.
///
/// `flag` is what every unit taking a connection reads (one load). It and the pools'
/// count of connections lent out are sequentially consistent: a session that took a
/// connection then reads the flag, PAUSE sets the flag then reads the count, so either
/// the session sees the pause (and gives the connection back) or PAUSE sees it lent.
pub struct Pause {
    flag: AtomicBool,
    paused: watch::Sender<bool>,
}

impl Default for Pause {
    fn default() -> Self {
        Self {
            flag: AtomicBool::new(false),
            paused: watch::Sender::new(false),
        }
    }
}

/// How PAUSE ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Paused {
    /// No server connection was in use; this many pooled ones were closed.
    Drained { closed: usize },
    /// RESUME came first.
    Resumed,
}

impl Pause {
    pub fn is_paused(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Starts a pause; false when one is in force already.
    pub fn pause(&self) -> bool {
        self.set(true)
    }

    /// Ends the pause; false when there is none.
    pub fn resume(&self) -> bool {
        self.set(false)
    }

    /// Sets the state to `paused`; false when it was so already. The flag changes under
    /// the channel's lock, so a PAUSE and a RESUME racing each other leave both alike.
    fn set(&self, paused: bool) -> bool {
        let changed = self.paused.send_if_modified(|p| {
            if *p == paused {
                return false;
            }
            *p = paused;
            self.flag.store(paused, Ordering::SeqCst);
            true
        });
        if changed {
            metrics::gauge!("pgfresh_paused").set(if paused { 1.0 } else { 0.0 });
        }
        changed
    }

    /// Waits for RESUME, at most `limit`; false when the limit came first.
    pub async fn wait_resumed(&self, limit: Duration) -> bool {
        let mut rx = self.paused.subscribe();
        let resumed = tokio::time::timeout(limit, rx.wait_for(|p| !*p)).await;
        resumed.is_ok()
    }
}

/// The rest of PAUSE, once started: waits until no server connection is lent (polled:
/// a pause is rare, and nothing on the statement path pays for it), then closes the
/// pooled ones. Ends early when RESUME comes.
pub async fn drain(shared: &Shared) -> Paused {
    const POLL: Duration = Duration::from_millis(20);
    let mut rx = shared.pause.paused.subscribe();
    loop {
        if !*rx.borrow_and_update() {
            return Paused::Resumed;
        }
        if shared.pools.lent_now() == 0 {
            return Paused::Drained {
                closed: shared.pools.close_idle(),
            };
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = rx.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pause_and_resume_toggle_once_and_wake_the_waiters() {
        let p = Pause::default();
        assert!(!p.is_paused());
        assert!(p.wait_resumed(Duration::ZERO).await, "not paused: no wait");
        assert!(!p.resume(), "nothing to resume");
        assert!(p.pause());
        assert!(!p.pause(), "already paused");
        assert!(
            !p.wait_resumed(Duration::from_millis(1)).await,
            "held past the limit"
        );
        let p = std::sync::Arc::new(p);
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.wait_resumed(Duration::from_secs(3600)).await }
        });
        tokio::task::yield_now().await;
        assert!(p.resume());
        assert!(waiter.await.unwrap(), "RESUME wakes the waiter");
        assert!(!p.is_paused());
    }
}
