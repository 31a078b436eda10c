//! Taking a server connection (both modes; held while the console's PAUSE is in
//! force), and in transaction mode when a session gives its connections back to the
//! pools, and the accounting of sessions that cannot (`pgfresh_pinned_sessions`).
//!
//! A session checks its connections in when nothing of the client's is running or
//! queued on them and no state lives on them that pgfresh cannot replay elsewhere:
//! no transaction of the client's is open on a server (none, or one whose BEGIN
//! pgfresh still defers), the connections' last ReadyForQuery said Idle, no COPY is
//! running, no extended batch was left open by a Flush, no commit position is still
//! being probed, and no pin (temp table, LISTEN, session advisory lock, WITH HOLD
//! cursor, a setting pgfresh cannot see) holds it.

use std::collections::BTreeSet;
use std::time::Duration;

use pgfresh_config::PoolMode;
use pgfresh_wire::TxStatus;

use super::state::PinReason;
use super::Session;
use crate::error::ProxyError;

/// The pin reasons a session is counted under in `pgfresh_pinned_sessions`.
#[derive(Default)]
pub(super) struct PinGauge {
    counted: BTreeSet<PinReason>,
}

impl PinGauge {
    /// Move the gauges from the reasons counted so far to `now`; true if they changed.
    #[inline]
    pub(super) fn sync(&mut self, now: &BTreeSet<PinReason>) -> bool {
        // Checked at every turn of the session loop: nearly always both are empty.
        if self.counted.is_empty() && now.is_empty() {
            return false;
        }
        self.move_to(now)
    }

    #[cold]
    fn move_to(&mut self, now: &BTreeSet<PinReason>) -> bool {
        if self.counted == *now {
            return false;
        }
        for r in self.counted.difference(now) {
            metrics::gauge!("pgfresh_pinned_sessions", "reason" => r.as_str()).decrement(1.0);
        }
        for r in now.difference(&self.counted) {
            metrics::gauge!("pgfresh_pinned_sessions", "reason" => r.as_str()).increment(1.0);
        }
        self.counted = now.clone();
        true
    }

    pub(super) fn clear(&mut self) {
        self.sync(&BTreeSet::new());
    }
}

impl Session {
    /// A slot first, in the pool's fair queue (bounded by its own timeout; the node is not
    /// involved yet). Then a pooled connection, taken at once; or a new one, where a node
    /// that stops answering mid-login is given up on like one that stops mid-statement
    /// (polled second). Neither taking a pooled connection nor waiting for a slot costs
    /// a timer.
    pub(super) async fn take_connection(
        &self,
        node: usize,
        target: &crate::server::Target,
        pool: &crate::pool::PoolRef,
        settings: &crate::pool::PoolSettings,
    ) -> Result<crate::pool::Leased, ProxyError> {
        let permit = self.shared.pools.permit(pool, target, settings).await?;
        let permit = match self.shared.pools.take_idle(pool, target, permit) {
            Ok(leased) => return Ok(leased),
            Err(permit) => permit,
        };
        let generation = pool.generation();
        let interval = self.watch_interval();
        tokio::select! {
            biased;
            r = self.shared.pools.connect(pool, target, &[], settings, permit) => r,
            reason = super::watchdog::until_given_up(&self.shared, node, generation, interval) => {
                Err(ProxyError::ServerConnect {
                    node: target.node_name.to_string(),
                    reason,
                })
            }
        }
    }

    /// Transaction mode, holding no connection, PAUSE not in force: a pooled connection
    /// to `node` taken now when a slot is free and one is idle, as `attach` takes it
    /// then, without its futures. False when the session must wait for a slot or a
    /// connection must be opened (`attach` does that).
    pub(super) fn check_out_now(&mut self, node: usize) -> bool {
        if self.mode != PoolMode::Transaction
            || node >= self.backends.len()
            || self.shared.pause.is_paused()
            || !self.holds_no_connection()
        {
            return false;
        }
        let Some((target, pool)) = self.target(node) else {
            return false;
        };
        let Some(permit) = self.shared.pools.try_permit(&pool) else {
            return false;
        };
        // (No idle connection: the slot goes back, and `attach` opens one.)
        let Ok(leased) = self.shared.pools.take_idle(&pool, &target, permit) else {
            return false;
        };
        self.listed
            .info
            .set_state(crate::clients::ClientState::Active);
        self.backends[node] = Some(leased);
        self.set_active(node);
        true
    }

    /// The session holds no server connection (PAUSE holds such a session).
    pub(super) fn holds_no_connection(&self) -> bool {
        self.backends.iter().all(Option::is_none)
    }

    /// While the console's PAUSE is in force: waits for RESUME, at most `limit` (as long
    /// as a statement or a login waits out a failover), or until pgfresh shuts down.
    pub(super) async fn wait_out_pause(&self, limit: Duration) -> Result<(), ProxyError> {
        if !self.shared.pause.is_paused() {
            return Ok(());
        }
        let mut shutdown = self.shared.shutdown.clone();
        tokio::select! {
            resumed = self.shared.pause.wait_resumed(limit) => {
                if resumed {
                    Ok(())
                } else {
                    Err(ProxyError::PausedTooLong { waited_ms: limit.as_millis() as u64 })
                }
            }
            _ = shutdown.wait_for(|stopping| *stopping) => Err(ProxyError::Shutdown),
        }
    }

    /// Nothing of the client's is on the connections it holds, and nothing it left there
    /// binds it to them. A transaction that no server has yet (a deferred BEGIN: one
    /// chained off a standby, whose chain was rolled back there, see `chain_anew`) holds
    /// none: it is placed with its first statement, like any BEGIN pgfresh answered.
    fn may_check_in(&self) -> bool {
        !self.tx.on_server()
            && self.inflight.is_empty()
            && self.wire == super::WirePhase::Units
            && self.tokens.held_ready.is_none()
            && !self.state.pins.iter().any(PinReason::holds_connection)
            && self
                .backends
                .iter()
                .flatten()
                .all(|l| l.conn.tx == TxStatus::Idle && l.conn.unsent() == 0)
    }

    /// Transaction mode: give every connection the session holds back to its pool
    /// when the session may (see the module comment). A cancel of this client's that is
    /// still being forwarded means its connection is closed instead, so the cancel can
    /// never land on another client's query.
    ///
    /// Asked at every turn of the session loop: what nearly every turn needs is inlined,
    /// the rest kept apart, so the loop's code stays short.
    #[inline]
    pub(super) fn checkin(&mut self) {
        if self.pin_gauge.sync(&self.state.pins) {
            self.pins_changed();
        }
        if self.mode == PoolMode::Transaction && !self.holds_no_connection() {
            self.checkin_held();
        }
    }

    #[cold]
    fn pins_changed(&mut self) {
        let holding = self.state.pins.iter().find(|p| p.holds_connection());
        self.listed.info.set_pinned(holding.map(PinReason::as_str));
    }

    #[inline(never)]
    fn checkin_held(&mut self) {
        if !self.may_check_in() {
            return;
        }
        let cancel_in_flight = {
            let mut slot = self.cancel_slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.target = None;
            slot.forwarding > 0
        };
        self.cancel_shown = 0;
        self.active = None;
        for slot in self.backends.iter_mut() {
            let Some(leased) = slot.take() else { continue };
            if cancel_in_flight {
                leased.conn.close_in_background();
                continue;
            }
            let cleanup = leased.conn.sql_prepared_cleanup();
            self.shared
                .pools
                .checkin(leased, cleanup, &self.pool_settings);
        }
        self.listed
            .info
            .set_state(crate::clients::ClientState::Idle);
    }

    /// Transaction mode: how long the client may stay silent while it holds a server
    /// connection in an open transaction or an extended batch left open by a Flush
    /// (`idle_transaction_timeout_ms`), when that applies now.
    pub(super) fn idle_transaction_limit(&self) -> Option<Duration> {
        // Asked at every turn of the session loop: session mode is answered first.
        if self.mode != PoolMode::Transaction {
            return None;
        }
        // Waiting for the client only: a batch left open by a Flush has had every reply.
        let open_batch_answered = self.wire.batch_node().is_some()
            && self
                .inflight
                .iter()
                .all(|u| !u.closed && u.owed == 0 && u.expect.is_empty());
        let idle_in_transaction = !self.tx.is_idle() && self.inflight.is_empty();
        if !self.ready.is_empty()
            || !(open_batch_answered || idle_in_transaction)
            || !self.backends.iter().any(Option::is_some)
        {
            return None;
        }
        let ms = self
            .shared
            .config
            .snapshot()
            .pool
            .idle_transaction_timeout_ms;
        (ms > 0).then(|| Duration::from_millis(ms))
    }
}
