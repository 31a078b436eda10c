//! Plain reads: a simple-protocol Query of one statement that only reads, an
//! extended-protocol batch of one such unnamed statement (Parse, Bind, Describe, Execute,
//! Sync), or, in session mode, the batch of such a statement the client prepared under a
//! name (Bind, Describe, Execute, Sync: drivers' prepared statements), sent while nothing
//! else of the session runs. Most statements of a read-heavy application are
//! these. The general path does for them all it does for any unit (split the client's
//! messages, ask each check whether pgfresh answers, waits or rewrites, work out what the
//! unit writes, prepares and sets); the code of all that does not fit the instruction
//! cache, and a statement then costs a miss for most of the code it runs
//! (docs/benchmarks.md). A plain read is taken from the client's buffer and routed
//! without the message reader's per-message work, and sent without the bookkeeping units
//! that write, prepare, set or pipeline need. Routing, the node's choice and the relay of
//! the replies are the general ones: a plain read is routed, counted, retried on a
//! failing replica and relayed exactly as any other read.

use pgfresh_config::PoolMode;
use pgfresh_sql::{Analysis, Kind};

use super::client_side::Flow;
use super::phase::WirePhase;
use super::unit::{ClientUnit, InFlight, Injected};
use super::Session;
use crate::error::ProxyError;
use crate::router::{Decision, Reason, Target, TokenNeed};

/// A text pgfresh sends as a plain read: one statement that reads, with no reason to
/// run on the primary, no effect on the transaction or the session, no routing hint or
/// position token, and no function but built-ins (which write nothing). What it may
/// write behind its text (a view's or policy's function) is asked of the dependency
/// graph when it is sent, as for any read (`Session::reads_plainly`).
pub(super) fn plain_read(a: &Analysis) -> bool {
    let [s] = a.statements.as_slice() else {
        return false;
    };
    a.kind == Kind::Read
        && s.kind == Kind::Read
        && a.must_primary.is_empty()
        && a.writes.is_empty()
        && !a.calls_user_functions
        && a.hint.is_none()
        && a.min_lsn_hint.is_none()
        && !a.min_lsn_malformed
        && s.tx.is_none()
        && s.session.is_none()
        && !s.writes_unnamed
        && !s.writes_elsewhere
        && !s.changes_effects
        && !s.fires_event_triggers
}

impl Session {
    /// The client's buffer begins with a plain read, and the session can take it now:
    /// routed and sent here (see the module's documentation). Returns whether it took
    /// bytes; when it did not, the general reader takes them as usual. (A Query must be
    /// the whole buffer; a batch is taken whole by `take_unnamed_batch` or
    /// `take_named_batch`, what follows it is read as usual once it is answered.)
    pub(super) async fn take_plain_read(&mut self) -> Result<bool, ProxyError> {
        if !self.plain_lane_open() {
            return Ok(false);
        }
        self.parser_enabled = true;
        let unit = match self.cbuf.first() {
            Some(b'Q') => self.plain_query(),
            Some(b'P') => match self.take_unnamed_batch() {
                Some(unit) => self.plain_or_ready(unit),
                None => None,
            },
            // (Transaction mode maps the client's statement names to its own: the
            // general path's rewrite.)
            Some(b'B') if self.mode == PoolMode::Session => match self.take_named_batch() {
                Some(unit) => self.plain_or_ready(unit),
                None => None,
            },
            _ => None,
        };
        let Some(unit) = unit else {
            // (Nothing waited before (`plain_lane_open`): a unit there is a batch taken.)
            return Ok(!self.ready.is_empty());
        };
        // No token: the session has none (`plain_lane_open`) and the text names none.
        // (A unit that must wait, Flow::Stop, is back in `ready`, where the general
        // dispatch takes it when it can go.)
        let token = TokenNeed::None;
        let decision = self.route(&unit, token);
        if self.waits_for_wal_feed(&decision)
            || matches!(decision.target, Target::Replica { required: Some(_) })
        {
            let _: Flow = self.dispatch_decided(unit, decision, token).await?;
            return Ok(true);
        }
        // As `dispatch_decided` does, without waits to make.
        if decision.reason == Reason::HotRelation {
            self.count_forced(&unit);
        }
        let node = match self.resolve(decision, None, token) {
            Ok(node) => node,
            Err(e) => {
                let _: Flow = self.unresolved(unit, e).await;
                return Ok(true);
            }
        };
        // (Outside a transaction the connection's reuse fails with no error: one it
        // drops, `dispatch_to` replaces. Transaction mode takes an idle pooled one.)
        let reused = matches!(self.reuse_connection(node), Ok(true)) || self.check_out_now(node);
        match reused
            .then(|| self.reads_plainly(node, &unit, &decision))
            .flatten()
        {
            Some(retryable) => self.send_read(node, unit, retryable)?,
            None => {
                let _: Flow = self.dispatch_to(node, unit, decision).await?;
            }
        }
        Ok(true)
    }

    /// A batch taken whole, as a plain read; one that is none waits for the general
    /// dispatch, as if the general reader had taken it (`None`, with it in `ready`).
    fn plain_or_ready(&mut self, mut unit: Box<ClientUnit>) -> Option<Box<ClientUnit>> {
        if !plain_read(&unit.parts[0]) {
            self.ready.push_back(unit);
            return None;
        }
        unit.plain_read = true;
        Some(unit)
    }

    /// The client's buffer as the unit of a plain read, when it is one Query of one.
    fn plain_query(&mut self) -> Option<Box<ClientUnit>> {
        let text = pgfresh_wire::lone_query(&self.cbuf, &self.limits)?;
        let sql = std::str::from_utf8(&self.cbuf[text]).ok()?;
        let analysis = self.texts.analyze(&self.shared.analyzer, sql);
        if !plain_read(&analysis) {
            return None;
        }
        let frame = self.cbuf.split().freeze();
        self.query_drops_unnamed();
        let mut unit = self.fresh_unit();
        unit.frames.push(frame);
        unit.parts.push(analysis);
        unit.simple = true;
        unit.synced = true;
        unit.plain_read = true;
        Some(unit)
    }

    /// Nothing of the client's runs, waits or is half read, no transaction is open or
    /// deferred, and no position token applies: a Query read now is the only unit there
    /// is, as the general reader would find it.
    fn plain_lane_open(&self) -> bool {
        self.inflight.is_empty()
            && self.ready.is_empty()
            && self.tx.is_idle()
            && matches!(self.wire, WirePhase::Units)
            && self.batch.frames.is_empty()
            && !self.terminating
            && self.tokens.min.is_none()
            && self.tokens.held_ready.is_none()
            && self.config.routing.enable_query_parser
    }

    /// `unit`, routed by `decision` to `node` (attached), can go by `send_read`: it is a
    /// plain read (one frame) whose replies the client has none of yet, the session runs
    /// nothing else and is in no transaction, the connection has the session's settings,
    /// and nothing the read runs writes behind its text (on a standby the router has
    /// asked that already). Then says whether the read may be sent again elsewhere should
    /// its standby fail (`retryable_read`).
    pub(super) fn reads_plainly(
        &mut self,
        node: usize,
        unit: &ClientUnit,
        decision: &Decision,
    ) -> Option<bool> {
        // (A read sent again after a replica failed or refused it skips the replies the
        // client already has, `skip_acks`: the general relay does that.)
        if !(unit.plain_read
            && unit.skip_acks == 0
            && (unit.frames.len() == 1 || self.holds_named_read(node, unit))
            && !unit.ready_hidden
            && self.inflight.is_empty()
            && self.tx.is_idle()
            && matches!(self.wire, WirePhase::Units)
            && !self.settings_stale(node))
        {
            return None;
        }
        // (What the analysis sees it write is nothing: `plain_read`.)
        let retryable = self.retryable_read(&decision.target, unit, node);
        (retryable || !self.read_writes_behind(unit)).then_some(retryable)
    }

    /// `unit` is the batch of a statement the client prepared under a name, and `node`'s
    /// connection holds exactly that statement under that name: it goes as the client
    /// sent it, with nothing put ahead (`puts_statements`). (A client that ever PREPAREd
    /// in SQL shares the namespace with it, where `prepare_statements` may close a stale
    /// copy that `puts_statements` does not count: the general way.)
    fn holds_named_read(&self, node: usize, unit: &ClientUnit) -> bool {
        self.mode == PoolMode::Session
            && unit.uses_statements.len() == 1
            && unit.parses.is_empty()
            && unit.statement_undo.is_empty()
            && !self.state.sql_prepared_ever
            && self.backends[node].is_some()
            && !self.puts_statements(node, unit)
    }

    /// Send a plain read that `reads_plainly` to `node` (`retryable` as it said): its
    /// frame, the replay sample a standby may ask for behind it, and its record in
    /// flight, as `send_unit` makes them for such a read (which changes nothing on the
    /// connection or in the session).
    pub(super) fn send_read(
        &mut self,
        node: usize,
        unit: Box<ClientUnit>,
        retryable: bool,
    ) -> Result<(), ProxyError> {
        let sample = retryable
            && self
                .replica_guard
                .as_ref()
                .is_some_and(|s| s.node() == node && s.take_replay_sample());
        // An unnamed Parse: the connection holds the client's unnamed statement now
        // (recorded before the send, which forgets it again behind a sample's Query).
        // (Transaction mode records no client statement on a connection: its own
        // names, not the client's, are those the rewrite maps.)
        if !unit.simple && self.mode == PoolMode::Session {
            self.record_unit_statements(node, &unit);
        }
        let sent = if sample {
            let mut frames: smallvec::SmallVec<[bytes::Bytes; 5]> =
                unit.frames.iter().cloned().collect();
            frames.push(super::send::REPLAY_SAMPLE.clone());
            self.send_frames(node, &frames)
        } else {
            self.send_frames(node, &unit.frames)
        };
        if let Err(e) = sent {
            return self.unsent(node, unit, retryable, e);
        }
        // Nothing was in flight: no unit sent since may write elsewhere.
        self.writes_elsewhere = false;
        let (simple, unnamed_first) = (unit.simple, unit.unnamed_first);
        let (retry, leftover) = if retryable {
            (Some(unit), None)
        } else {
            (None, Some(unit))
        };
        self.inflight
            .push_back(InFlight::plain_read(simple, unnamed_first, retry));
        if sample {
            self.inflight
                .push_back(InFlight::injected(Injected::ReplaySample(None)));
        }
        if let Some(unit) = leftover {
            self.recycle_unit(unit);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lone_read_without_effects_is_plain() {
        let plain = |sql: &str| plain_read(&pgfresh_sql::analyze_uncached(sql));
        assert!(plain("SELECT abalance FROM pgbench_accounts WHERE aid = 7"));
        assert!(plain("SELECT count(*) FROM t"));
        for sql in [
            "SELECT 1; SELECT 2",
            "UPDATE t SET a = 1",
            "SELECT * FROM t FOR UPDATE",
            "SELECT nextval('s')",
            "SELECT my_function()",
            "BEGIN",
            "SET search_path = x",
            "SHOW work_mem",
            "EXECUTE p",
            "/* pgfresh:primary */ SELECT 1",
            "/* pgfresh:replica */ SELECT 1",
            "/* pgfresh:min_lsn=1/0/16B3748 */ SELECT 1",
            "SELECT * INTO t2 FROM t",
            "SELECT pg_advisory_lock(1)",
            "not sql at all",
        ] {
            assert!(!plain(sql), "{sql}");
        }
    }
}
