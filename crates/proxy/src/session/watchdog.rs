//! Giving up on a node that stopped answering.
//!
//! A node whose processes are frozen (SIGSTOP, a hung host, a stalled disk) keeps its
//! TCP connections open: the kernel still accepts bytes, nothing ever answers, and a
//! statement already sent would wait forever. The monitor notices within
//! `health_timeout_ms` (its polls time out) and routes nothing new there; this module
//! lets the sessions already waiting on such a node stop waiting too.
//!
//! A session gives up on a node when the monitor has marked it down (or its role
//! changed since the connection was made) **while another node is the primary**. So a
//! frozen replica is left at once, and an old primary once a new one is known; but a
//! primary that only looks down, with no other primary to go to, is waited for: failing
//! a write in flight there would turn a slow success into an unknown outcome.
//!
//! Giving up is handled as a lost connection (`Session::on_backend_lost`): an autocommit
//! replica read that had sent the client nothing goes to another node, anything else
//! gets 08006 (08007 for a COMMIT in flight).

use std::time::Duration;

use crate::context::Shared;

use super::Session;

impl Session {
    /// How often a session waiting on a node asks whether to give up on it: half of
    /// `health_timeout_ms`, so a frozen node is left at most 1.5 × that after it froze.
    pub(super) fn watch_interval(&self) -> Duration {
        Duration::from_millis((self.config.monitor.health_timeout_ms / 2).max(10))
    }

    /// The active backend has had something in flight since the last check: give up on
    /// it if its node is given up on (see the module documentation).
    pub(super) fn check_active_node(&mut self) -> Result<(), crate::error::ProxyError> {
        let Some(node) = self.active.filter(|_| !self.inflight.is_empty()) else {
            return Ok(());
        };
        let Some(generation) = self.backends[node].as_ref().map(|l| l.conn.generation) else {
            return Ok(());
        };
        match given_up(&self.shared, node, generation) {
            Some(reason) => self.on_backend_lost(node, &reason),
            None => Ok(()),
        }
    }
}

/// Why a session should stop waiting for `node` (with connections made at pool
/// `generation`), or `None` while it should keep waiting.
pub(super) fn given_up(shared: &Shared, node: usize, generation: u64) -> Option<String> {
    let view = shared.balancer.view();
    if view.primary? == node {
        return None;
    }
    let status = view.nodes.get(node)?;
    let changed = shared.pools.generation(node) != generation;
    if status.healthy && !changed {
        return None;
    }
    Some(match (&status.last_error, status.healthy) {
        (Some(e), false) => format!("the node stopped answering ({e})"),
        (None, false) => "the node stopped answering".to_string(),
        (_, true) => "the node changed role".to_string(),
    })
}

/// Resolves, with the reason, once `node` is given up on; checked every `interval`.
pub(super) async fn until_given_up(
    shared: &Shared,
    node: usize,
    generation: u64,
    interval: Duration,
) -> String {
    loop {
        tokio::time::sleep(interval).await;
        if let Some(reason) = given_up(shared, node, generation) {
            return reason;
        }
    }
}
