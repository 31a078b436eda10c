//! Server replies → client. Complete frames are scanned in place; the ones the
//! session must act on are inspected, replies to injected work are cut out, and the
//! rest is queued for the client in contiguous runs (`out::ClientOut`).
//!
//! Recency marks are made here, while scanning, so a write's relations are marked
//! before its CommandComplete or ReadyForQuery reaches the client.

use std::sync::Arc;

use bytes::Buf;

use pgfresh_recency::RelKey;
use pgfresh_wire::{frame_at, ErrorFields, TxStatus};

use super::settings::{self, SettingChange, StmtEvent};
use super::unit::{InFlight, Injected, Refusal, Refused};
use super::Session;
use crate::error::ProxyError;
use crate::server::server_limits;

/// What to do with one server frame.
enum Action {
    Forward,
    Swallow,
}

/// The replies the relay only counts for the front unit, without inspecting them: its
/// rows and its acknowledgements (ParseComplete, BindComplete, descriptions, NoData),
/// when that unit is the client's, has no reply to swallow or make here in between (no
/// expected replies queued, see `unit::Expect`),
/// and skips no acknowledgement (a retried read). Every other frame goes through
/// `on_server_message`, after what was counted is applied.
/// A plain read's CommandComplete is counted too (`InFlight::plain`: it completes no
/// event, commits nothing and writes nothing to mark).
#[derive(Default)]
struct PlainReplies {
    enabled: bool,
    plain: bool,
    rows: bool,
    acks: u32,
}

impl PlainReplies {
    fn of(front: Option<&InFlight>) -> Self {
        let enabled =
            front.is_some_and(|u| !u.is_injected() && u.expect.is_empty() && u.skip_acks == 0);
        Self {
            enabled,
            plain: enabled && front.is_some_and(|u| u.plain),
            ..Self::default()
        }
    }

    /// Counts a frame with `tag` when it is one of those; says whether it was.
    fn take(&mut self, tag: u8) -> bool {
        if !self.enabled {
            return false;
        }
        match tag {
            b'D' => self.rows = true,
            b'C' if self.plain => self.rows = true,
            b'1' | b'2' | b't' | b'T' | b'n' => self.acks += 1,
            _ => return false,
        }
        true
    }

    /// What was counted, into the unit (as `on_server_message` would have recorded it).
    fn apply(&mut self, front: Option<&mut InFlight>) {
        if let Some(u) = front.filter(|_| self.rows || self.acks > 0) {
            u.replied |= self.rows;
            u.acks += self.acks;
        }
        self.rows = false;
        self.acks = 0;
    }
}

impl Session {
    /// Process the complete frames buffered from `node`'s connection.
    pub(super) fn relay(&mut self, node: usize) -> Result<(), ProxyError> {
        let max = server_limits().max_message;
        loop {
            // Find the longest run of complete frames to forward, stopping at a frame
            // that must be swallowed.
            let mut pos = 0;
            let mut swallow_at = None;
            // Rows and acknowledgements of a client unit that needs nothing of them but
            // counting (see `PlainReplies`) are counted here, applied before any other
            // frame is inspected.
            let mut plain = PlainReplies::of(self.inflight.front());
            loop {
                let Some(leased) = self.backends[node].as_ref() else {
                    return Ok(());
                };
                let buf = &leased.conn.rbuf[..];
                // The next frame to inspect: those only counted are passed over here.
                let next = loop {
                    match frame_at(buf, pos, max) {
                        Err(len) => {
                            let name = leased.conn.target.node_name.to_string();
                            return Err(ProxyError::ServerProtocol {
                                node: name,
                                reason: format!("invalid message length {len}"),
                            });
                        }
                        Ok(Some((tag, end))) if plain.take(tag) => pos = end,
                        Ok(next) => break next,
                    }
                };
                let Some((tag, body_end)) = next else {
                    break;
                };
                let len = body_end - pos - 1;
                let body_start = pos + 5;
                plain.apply(self.inflight.front_mut());
                let action = self.on_server_message(node, tag, body_start, body_end);
                plain = PlainReplies::of(self.inflight.front());
                if let Action::Swallow = action {
                    swallow_at = Some((pos, 1 + len));
                    break;
                }
                pos = body_end;
                if !self.due.is_empty() {
                    // Replies pgfresh makes itself follow this one.
                    break;
                }
            }
            plain.apply(self.inflight.front_mut());
            let Some(leased) = self.backends[node].as_mut() else {
                return Ok(());
            };
            if pos > 0 {
                self.out.push(&leased.conn.rbuf[..pos]);
                leased.conn.rbuf.advance(pos);
            }
            if let Some((_, len)) = swallow_at {
                leased.conn.rbuf.advance(len);
            }
            let due = !self.due.is_empty();
            self.out.append(&mut self.due);
            if swallow_at.is_none() && !due {
                return Ok(());
            }
        }
    }

    /// Inspect one server frame (bytes `[start, end)` of the node's buffer are its body).
    fn on_server_message(&mut self, node: usize, tag: u8, start: usize, end: usize) -> Action {
        let injected = self.inflight.front().is_some_and(InFlight::is_injected);
        if !injected && self.expect_reply(node, tag) {
            return Action::Swallow;
        }
        match tag {
            b'Z' => {
                let at = self.due.len();
                let action = self.on_ready_for_query(node, start);
                if injected || !self.reports.waiting() {
                    action
                } else {
                    self.reports_before_ready(node, start, at, action)
                }
            }
            b'C' => self.on_command_complete(node, start, end, injected),
            b'D' if injected => {
                self.injected_row(node, start, end);
                Action::Swallow
            }
            b'E' => self.on_error(node, start, end, injected),
            b'1' | b'2' | b't' | b'T' | b'n' if !injected => self.ack(),
            b'3' if !injected => Action::Forward,
            b'S' => {
                let body = self.body(node, start, end).to_vec();
                let mut parts = body.split(|b| *b == 0);
                let (Some(Ok(k)), Some(Ok(v))) = (
                    parts.next().map(std::str::from_utf8),
                    parts.next().map(std::str::from_utf8),
                ) else {
                    return if injected {
                        Action::Swallow
                    } else {
                        Action::Forward
                    };
                };
                if let Some(l) = self.backends[node].as_mut() {
                    l.conn.params.insert(k.to_string(), v.to_string());
                }
                if injected {
                    Action::Swallow
                } else {
                    self.parameter_status(k, v)
                }
            }
            b'G' => {
                // COPY FROM STDIN started. In extended mode the server ignores Syncs
                // until CopyDone/CopyFail, and the client sends a fresh Sync after them.
                let mut extended_on = None;
                if let Some(u) = self.inflight.front_mut() {
                    u.replied = true;
                    if !u.simple {
                        u.owed = 0;
                        u.closed = false;
                        extended_on = Some(node);
                    }
                }
                self.wire.copy_started(extended_on);
                Action::Forward
            }
            b's' | b'I' if !injected => {
                if let Some(u) = self.inflight.front_mut() {
                    u.replied = true;
                    u.ended_tx = false;
                    u.events.pop_front();
                }
                if tag == b's' {
                    // An Execute stopped at its row limit (asyncpg's fetchval of
                    // `INSERT … RETURNING`): the write is done, and the implicit
                    // transaction commits at Sync without a CommandComplete.
                    self.mark_autocommit_write();
                }
                Action::Forward
            }
            b'V' if !injected => {
                // FunctionCallResponse: the FunctionCall ran, and outside a transaction
                // it has committed (no CommandComplete comes for it).
                if let Some(u) = self.inflight.front_mut() {
                    u.replied = true;
                }
                self.mark_autocommit_write();
                Action::Forward
            }
            // Notifications and notices are the client's whoever caused them.
            b'A' | b'N' => Action::Forward,
            _ if injected => Action::Swallow,
            _ => {
                if let Some(u) = self.inflight.front_mut() {
                    u.replied = true;
                }
                Action::Forward
            }
        }
    }

    /// ReadyForQuery: the front unit's end (or one of its Syncs), the transaction's
    /// status, and what the finished unit leaves to do.
    fn on_ready_for_query(&mut self, node: usize, start: usize) -> Action {
        let status = self.backends[node]
            .as_ref()
            .and_then(|l| l.conn.rbuf.get(start).copied())
            .and_then(TxStatus::from_byte)
            .unwrap_or(TxStatus::Failed);
        if let Some(l) = self.backends[node].as_mut() {
            l.conn.tx = status;
        }
        if self.plain_read_ready(status) {
            return Action::Forward;
        }
        self.mark_elsewhere();
        if self.inflight.front().is_some_and(|u| u.refused.is_some()) {
            return self.on_refused_ready(node, status);
        }
        let done = self.inflight.front_mut().is_none_or(|u| {
            u.owed = u.owed.saturating_sub(1);
            u.owed == 0 && u.closed
        });
        if done && self.inflight.front().is_some_and(|u| u.mark_at_ready) {
            // A write marked before its batch's Sync commits here: marked again, before
            // the client hears of it (with the position probe that follows, see
            // `needs_position_probe`).
            self.mark_autocommit_write();
        }
        let unit = if done {
            self.inflight.pop_front()
        } else {
            None
        };
        if self.inflight.is_empty() {
            self.replica_guard = None;
            self.fallback_slot = None;
        } else if done {
            // The next unit's replies made here may be due after this one.
            self.collect_due();
        }
        match unit {
            Some(InFlight {
                injected: Some(what),
                error,
                ..
            }) => {
                self.injected_done(node, what, error);
                Action::Swallow
            }
            Some(mut u) => {
                let hidden = u.ready_hidden;
                self.recycle_finished(&mut u);
                let settled = self.pending_settings.on_ready(status, u.error);
                self.apply_settings(node, settled);
                if status == TxStatus::Idle {
                    // Effect-changing DDL ends with its guards, whose drop (the
                    // reset below, or `u`'s) schedules the reload that closes the
                    // window; other DDL asks for it here. One request only: a
                    // request made after the load started (worker threads) costs
                    // one more load.
                    let guarded =
                        !u.schema_changes.is_empty() || !self.tx_writes.schema_changes.is_empty();
                    if (u.ddl || self.tx_writes.ddl) && !guarded {
                        self.ddl_done();
                    }
                    self.tx_writes = super::TxWrites::default();
                } else {
                    // A unit that failed counts too: what it wrote before its error
                    // stays once a ROLLBACK TO SAVEPOINT undoes the error, and commits
                    // with the transaction. (Once nothing is kept, nothing commits and
                    // nothing is marked: a rolled-back transaction marks nothing.)
                    let wrote = !u.autocommit;
                    self.tx_writes.absorb(&mut u, wrote);
                }
                self.tx = super::TxPhase::from_server(status);
                if status == TxStatus::InTransaction
                    && u.ended_tx
                    && !u.error
                    && self.balancer.primary() != Some(node)
                {
                    self.chain_anew(node);
                }
                let hold = self
                    .inflight
                    .front()
                    .and_then(InFlight::probe)
                    .is_some_and(|p| p.report || !p.marks.is_empty());
                if hold {
                    // The commit's position comes first: its marks are resolved
                    // (a replica that replayed it may serve the next read, from
                    // any session) and a tracking session has its token, by the
                    // time the client sees its COMMIT return.
                    self.tokens.held_ready = Some(status);
                    return Action::Swallow;
                }
                if hidden {
                    // The first part of a Query sent as two: the client's
                    // ReadyForQuery is the second part's.
                    return Action::Swallow;
                }
                Action::Forward
            }
            None => {
                self.tx = super::TxPhase::from_server(status);
                Action::Forward
            }
        }
    }

    /// The ReadyForQuery that ends a plain read (`InFlight::plain`) that went as planned:
    /// no error, no refusal, no transaction after it, no parameter report held, nothing
    /// written elsewhere to mark. The read ends as `on_ready_for_query` ends it, with none
    /// of the steps that have nothing to do for it (settings, DDL, a transaction's writes,
    /// a held commit). Says whether it was one.
    fn plain_read_ready(&mut self, status: TxStatus) -> bool {
        let plain = status == TxStatus::Idle
            && !self.writes_elsewhere
            && !self.reports.waiting()
            && self
                .inflight
                .front()
                .is_some_and(|u| u.plain && !u.error && u.refused.is_none() && u.owed == 1);
        if !plain {
            return false;
        }
        let Some(mut u) = self.inflight.pop_front() else {
            return false;
        };
        if self.inflight.is_empty() {
            self.replica_guard = None;
            self.fallback_slot = None;
        } else {
            self.collect_due();
        }
        self.recycle_finished(&mut u);
        self.tx = super::TxPhase::Idle;
        true
    }

    /// A unit in flight may have written another database of the instance (`dblink`),
    /// which commits on its own while the statement runs, whatever becomes of this
    /// transaction: every database is marked before the client hears a statement ended.
    fn mark_elsewhere(&self) {
        if self.writes_elsewhere {
            self.shared.recency.mark_instance();
        }
    }

    /// AND CHAIN ended a transaction on a standby (a read-only one) and began the next
    /// there, at the chain. That one is a new transaction: like any read-only transaction
    /// it must start where every write acknowledged before its first statement has been
    /// replayed, which this standby may not have. Nothing has run in it yet: it is rolled
    /// back on the standby, and the client's transaction becomes a deferred BEGIN with the
    /// modes of the one before, placed with its first statement. Those are asked of the
    /// standby first (`CHAIN_MODES_SQL`: a level the session's defaults gave it stays,
    /// even where the ending transaction changed the defaults); until the answer is in,
    /// the client's next units wait (`chain_modes_pending`), and without one the BEGIN
    /// names the modes the transaction named (`Session::tx_modes`).
    fn chain_anew(&mut self, node: usize) {
        let sql = super::phase::chained_begin(&self.tx_modes);
        let asked = self
            .stage_query(node, super::phase::CHAIN_MODES_SQL)
            .map(|()| {
                self.inflight
                    .push_back(InFlight::injected(Injected::ChainModes(None)))
            });
        if asked.is_err() || self.inject_query(node, "ROLLBACK").is_err() {
            // No connection to roll back on: the chained transaction stays where it is.
            return;
        }
        let analysis = Arc::new(pgfresh_sql::analyze_uncached(&sql));
        self.tx = super::TxPhase::Deferred(super::DeferredBegin { sql, analysis });
    }

    /// CommandComplete: a client statement finished; a write or a COMMIT marks what it
    /// wrote before the client hears of it.
    fn on_command_complete(
        &mut self,
        node: usize,
        start: usize,
        end: usize,
        injected: bool,
    ) -> Action {
        if injected {
            return Action::Swallow;
        }
        self.mark_elsewhere();
        let is_commit = self.body(node, start, end).starts_with(b"COMMIT");
        let Some(u) = self.inflight.front_mut() else {
            return Action::Forward;
        };
        u.replied = true;
        let event = u.events.pop_front();
        u.ended_tx = matches!(event, Some(StmtEvent::Commit | StmtEvent::Rollback));
        if let Some(StmtEvent::Statements(change)) = event {
            self.statements_completed(node, *change);
        } else if let Some(event) = event.filter(|e| *e != StmtEvent::Other) {
            let tag = self.body(node, start, end).to_vec();
            let committed = self.pending_settings.on_complete(event, &tag);
            self.apply_settings(node, committed);
        }
        let Some(u) = self.inflight.front_mut() else {
            return Action::Forward;
        };
        if u.autocommit && (!u.writes.is_empty() || u.whole_db) {
            self.mark_autocommit_write();
        } else if is_commit {
            u.committed = true;
            let stamp = super::oldest(u.schema_stamp, self.tx_writes.schema_stamp);
            let whole = u.whole_db || self.tx_writes.whole_db;
            let mut w = std::mem::take(&mut self.tx_writes.writes);
            w.extend(u.writes.iter().cloned());
            let whole = whole || self.schema_changed_since(stamp);
            self.mark(w, whole);
        }
        Action::Forward
    }

    /// ErrorResponse: the front unit failed; a FATAL may end the connection under a read
    /// pgfresh retries elsewhere or a COMMIT whose outcome is unknown.
    fn on_error(&mut self, node: usize, start: usize, end: usize, injected: bool) -> Action {
        if !injected {
            self.mark_elsewhere();
        }
        let fatal = is_fatal(self.body(node, start, end));
        if fatal && self.inflight.is_empty() {
            // A server closing an idle connection (shutdown, failover,
            // pg_terminate_backend): the client has nothing running there and
            // its session goes on elsewhere.
            tracing::info!(node, "server closed an idle connection");
            return Action::Swallow;
        }
        let renamed = if injected {
            None
        } else {
            self.error_for_client(self.body(node, start, end))
        };
        // What the refused and skipped messages changed in the client's statements,
        // taken back below unless the unit runs again elsewhere (where they run).
        let undo = if injected {
            Vec::new()
        } else {
            self.skip_to_sync(node)
        };
        if fatal && !injected {
            let budget = self.config.routing.read_retry_budget;
            if let Some(u) = self
                .inflight
                .front()
                .filter(|u| u.retry.is_some() && !u.replied)
            {
                // The replica is closing this connection before answering: the
                // read will be sent elsewhere, so the client must not see this.
                tracing::debug!(
                    node,
                    closed = u.retry.is_some(),
                    "replica closed the connection; retrying the read"
                );
                if u.retry.as_ref().is_none_or(|r| r.retries >= budget) {
                    self.undo_client(undo);
                }
                return Action::Swallow;
            }
        }
        if fatal && !injected && self.inflight.iter().any(|u| u.commit_sent && !u.committed) {
            // The server is closing the connection while a COMMIT's outcome is
            // unknown (terminated during a synchronous-replication wait, when it
            // has committed locally; a shutdown): the client must be told 08007,
            // or the outcome `resolve_lost_commits` finds, when the connection
            // ends, not this FATAL, which most clients would report instead.
            tracing::info!(node, "server closed the connection with a COMMIT in flight");
            self.undo_client(undo);
            return Action::Swallow;
        }
        if !fatal && !injected {
            if let Some(refusal) = self.refusal(node, start, end) {
                // Kept from the client: the read runs again elsewhere once this
                // attempt's ReadyForQuery arrives (see `on_refused_ready`).
                let error = self.frame(node, start, end);
                if let Some(u) = self.inflight.front_mut() {
                    u.refused = Some(Box::new(Refused {
                        refusal,
                        error,
                        undo,
                    }));
                }
                return Action::Swallow;
            }
        }
        // (After the undo: a later Parse of the unnamed statement that the error skipped
        // would bring back the refused one.)
        let refused_unnamed = self.refused_unnamed_parse();
        self.undo_client(undo);
        if refused_unnamed {
            self.state.prepared.remove("");
        }
        if !injected {
            // Errors by SQLSTATE class, for the metrics.
            let body = self.body(node, start, end);
            let class = body
                .split(|b| *b == 0)
                .find_map(|f| f.strip_prefix(b"C"))
                .and_then(|c| std::str::from_utf8(c.get(..2)?).ok())
                .unwrap_or("??")
                .to_string();
            metrics::counter!("pgfresh_errors_total", "class" => class).increment(1);
        }
        if let Some(u) = self.inflight.front_mut() {
            u.error = true;
        }
        if injected {
            if let Ok(f) = ErrorFields::parse(b'E', self.body(node, start, end)) {
                tracing::warn!(
                    code = f.code.unwrap_or(""),
                    message = f.message.unwrap_or(""),
                    "a statement pgfresh replayed on a backend failed"
                );
            }
            return Action::Swallow;
        }
        if let Some(error) = renamed {
            self.due.push(error);
            return Action::Swallow;
        }
        Action::Forward
    }

    /// An error before any acknowledgement of a unit that begins with a Parse of the
    /// unnamed statement is that Parse's: PostgreSQL dropped the client's unnamed
    /// statement before parsing, so the client has none now, unless a batch read after
    /// it parses the unnamed statement again (one pipelined behind it that begins so,
    /// see `statements_unsettled`): the client's is then that one's.
    fn refused_unnamed_parse(&self) -> bool {
        let refused = self
            .inflight
            .front()
            .is_some_and(|u| u.unnamed_first && u.acks == 0 && !u.error && !u.is_injected());
        refused
            && !self.inflight.iter().skip(1).any(|u| u.unnamed_first)
            && !self
                .ready
                .iter()
                .chain(std::iter::once(&self.batch))
                .any(|u| u.parses.iter().any(String::is_empty))
    }

    /// A standby's refusal of the front unit that another node would not give (see
    /// [`Refusal`]), when the unit can still be sent again: an autocommit read on a
    /// replica of which nothing reached the client, the only unit of the client's in
    /// flight, within `read_retry_budget`.
    fn refusal(&self, node: usize, start: usize, end: usize) -> Option<Refusal> {
        let budget = self.config.routing.read_retry_budget;
        let (front, mut behind) = (self.inflight.front()?, self.inflight.iter().skip(1));
        let again = front.retry.as_ref().is_some_and(|r| r.retries < budget);
        if !again || front.replied || !behind.all(InFlight::is_injected) {
            return None;
        }
        let fields = ErrorFields::parse(b'E', self.body(node, start, end)).ok()?;
        let refusal = Refusal::of(fields.code?)?;
        tracing::debug!(
            node,
            code = fields.code.unwrap_or(""),
            message = fields.message.unwrap_or(""),
            "a standby refused a read; it runs again elsewhere"
        );
        Some(refusal)
    }

    /// The ReadyForQuery that ends a read a standby refused: the read goes to the
    /// primary (or, after a recovery conflict, to another node) next, and the client
    /// hears nothing of this attempt but the acknowledgements it already has.
    fn on_refused_ready(&mut self, node: usize, status: TxStatus) -> Action {
        let Some(mut u) = self.inflight.pop_front() else {
            return Action::Forward;
        };
        if self.inflight.is_empty() {
            self.replica_guard = None;
            self.fallback_slot = None;
        }
        self.tx = super::TxPhase::from_server(status);
        let settled = self.pending_settings.on_ready(status, true);
        self.apply_settings(node, settled);
        let Some(refused) = u.refused.take() else {
            return Action::Forward;
        };
        let Refused {
            refusal,
            error,
            undo,
        } = *refused;
        match u.retry.take() {
            Some(mut again) if status == TxStatus::Idle => {
                again.retries += 1;
                again.skip_acks += u.acks;
                match refusal {
                    Refusal::Recovery => {
                        again.refused_by_standby = true;
                        // Its next runs go to the primary at once (see `refused`).
                        self.shared.refused.remember(
                            crate::refused::login_key(&self.login.database, &self.login.user.name),
                            &again.parts,
                            std::time::Instant::now(),
                        );
                    }
                    Refusal::Conflict => again.avoid = Some(node),
                }
                let code = ErrorFields::parse(b'E', error.get(5..).unwrap_or_default())
                    .ok()
                    .and_then(|f| f.code.map(str::to_string))
                    .unwrap_or_default();
                metrics::counter!("pgfresh_standby_refusals_total", "sqlstate" => code)
                    .increment(1);
                self.ready.push_front(again);
                self.recycle_finished(&mut u);
                Action::Swallow
            }
            kept => {
                // Not an autocommit read after all: the client gets the standby's error,
                // then this ReadyForQuery, and what the error skipped did not happen.
                self.undo_client(undo);
                if let Some(k) = kept {
                    self.recycle_unit(k);
                }
                self.due.push(error);
                self.due.push(pgfresh_wire::build::ready_for_query(status));
                Action::Swallow
            }
        }
    }

    /// A ParameterStatus of the client's unit: held until the unit's ReadyForQuery, where
    /// the server sends them anyway (PostgreSQL 14 and later), so that the client hears
    /// what its own connection would report there (`reports_due`). One no unit waits
    /// for goes as it is.
    fn parameter_status(&mut self, name: &str, value: &str) -> Action {
        if self.inflight.is_empty() {
            return Action::Forward;
        }
        self.reports
            .held
            .push((name.to_string(), value.to_string()));
        Action::Swallow
    }

    /// The ReadyForQuery of a client's unit (`action`, what `on_ready_for_query` made of
    /// it; its replies due from `at`), after the parameter values its own connection
    /// would report there (`reports_due`).
    #[cold]
    #[inline(never)]
    fn reports_before_ready(
        &mut self,
        node: usize,
        start: usize,
        at: usize,
        action: Action,
    ) -> Action {
        let reports = self.reports_due();
        if reports.is_empty() {
            return action;
        }
        self.due.splice(at..at, reports);
        let status = self.backends[node]
            .as_ref()
            .and_then(|l| l.conn.rbuf.get(start).copied())
            .and_then(TxStatus::from_byte);
        if let (Action::Forward, Some(s)) = (action, status) {
            self.due.push(pgfresh_wire::build::ready_for_query(s));
        }
        Action::Swallow
    }

    /// The ParameterStatus messages a unit's ReadyForQuery follows: what the server
    /// reported, except that a parameter a reset brought back to its startup value
    /// reports that value (the server connection's reset value is the server's default;
    /// the session keeps the startup value, see `apply_settings`), reported too where
    /// the server reported nothing (its value did not change there); and none of a
    /// value the client was last told (PostgreSQL reports only changes, and the client
    /// may have been told on another connection).
    fn reports_due(&mut self) -> Vec<bytes::Bytes> {
        let mut list = std::mem::take(&mut self.reports.held);
        let restored = std::mem::take(&mut self.reports.restored);
        for name in &restored {
            let Some(startup) = self.state.startup_value(name) else {
                continue;
            };
            match list.iter_mut().find(|(k, _)| k.eq_ignore_ascii_case(name)) {
                Some((_, v)) => *v = startup.to_string(),
                None => {
                    // Only a parameter the server reports (the client was told it).
                    if let Some(k) = self.reports.told_name(name) {
                        list.push((k.to_string(), startup.to_string()));
                    }
                }
            }
        }
        if !restored.is_empty() {
            // In the server's order of reports (by name, PostgreSQL 15).
            list.sort_by_key(|(k, _)| k.to_ascii_lowercase());
        }
        let mut out = Vec::with_capacity(list.len());
        for (k, v) in list {
            if self.reports.get(&k) != Some(v.as_str()) {
                out.push(pgfresh_wire::build::parameter_status(&k, &v));
                self.reports.set(&k, &v);
            }
        }
        out
    }

    /// Settings the server confirmed become the session's. The connection that ran
    /// them stays up to date if it was; every other connection replays them before
    /// its next unit. A reset of a parameter given at startup leaves the session at its
    /// startup value and the connection at the server's default: that connection too
    /// replays them before its next unit.
    fn apply_settings(&mut self, node: usize, mut changes: Vec<SettingChange>) {
        if changes.is_empty() {
            return;
        }
        let restored = self.state.with_startup_values(&mut changes);
        let before = self.state.settings().clone();
        self.tokens.follow(&changes);
        settings::apply(&mut self.state, changes, Some(node));
        let reset_to_login = !restored.is_empty();
        self.reports.restored.extend(restored);
        if let Some(l) = self.backends[node].as_mut() {
            if reset_to_login {
                l.conn.settings = None;
            } else if !super::state::needs_replay(l.conn.settings.as_ref(), &before) {
                l.conn.settings = Some(self.state.settings().clone());
            }
        }
    }

    /// A protocol acknowledgement (ParseComplete, BindComplete, descriptions, NoData).
    /// A unit sent again after a replica failed skips the ones the client already has.
    fn ack(&mut self) -> Action {
        match self.inflight.front_mut() {
            Some(u) if u.skip_acks > 0 => {
                u.skip_acks -= 1;
                Action::Swallow
            }
            Some(u) => {
                u.acks += 1;
                Action::Forward
            }
            None => Action::Forward,
        }
    }

    /// The whole frame whose body is bytes `[start, end)` of `node`'s buffer, copied.
    fn frame(&self, node: usize, start: usize, end: usize) -> bytes::Bytes {
        self.backends[node]
            .as_ref()
            .and_then(|l| l.conn.rbuf.get(start.saturating_sub(5)..end))
            .map(bytes::Bytes::copy_from_slice)
            .unwrap_or_default()
    }

    fn body(&self, node: usize, start: usize, end: usize) -> &[u8] {
        self.backends[node]
            .as_ref()
            .and_then(|l| l.conn.rbuf.get(start..end))
            .unwrap_or(&[])
    }

    /// The front unit, outside a transaction, wrote: its writes are committed with its
    /// statement, so they are marked now.
    fn mark_autocommit_write(&mut self) {
        let Some(u) = self.inflight.front_mut() else {
            return;
        };
        if u.autocommit && (!u.writes.is_empty() || u.whole_db) {
            // Before its Sync the write has not committed: it is marked again when it has.
            u.mark_at_ready |= !u.closed;
            let (whole_db, stamp, w) = (u.whole_db, u.schema_stamp, u.writes.clone());
            let whole = whole_db || self.schema_changed_since(stamp);
            self.mark(w, whole);
        }
    }

    /// Mark relations as written, before the reply that confirms the write is
    /// forwarded to the client. When a position probe follows this unit (LSN routing),
    /// the mark is pending until the probe's answer resolves it.
    fn mark(&mut self, writes: Vec<pgfresh_sql::RelName>, whole_db: bool) {
        let track = self.tokens.track;
        let probe = self.inflight.get_mut(1).and_then(InFlight::probe_mut);
        if let Some(p) = probe {
            // A commit that wrote: a tracking session gets its position.
            p.report |= track;
        }
        if writes.is_empty() && !whole_db {
            return;
        }
        let recency = &self.shared.recency;
        let db = &self.login.database;
        let lsn_routing = self.config.routing.lsn_routing;
        match self
            .inflight
            .get_mut(1)
            .and_then(InFlight::probe_mut)
            .filter(|_| lsn_routing)
        {
            Some(probe) => {
                // Marked with the commit's position when the probe answers; what the
                // client is sent from here on waits for that (see `DeferredMarks`).
                if whole_db {
                    // Something pgfresh cannot name was written: every read of the
                    // database needs a replica that replayed this commit.
                    probe.marks.push_database(recency, db);
                }
                if !writes.is_empty() {
                    probe.marks.push(recency, db, writes);
                }
                self.hold_client_output();
            }
            None => {
                if whole_db {
                    // Without a position: every read of the database is hot, primary
                    // only, for one TTL.
                    recency.mark_database(db);
                }
                if !writes.is_empty() {
                    let keys: Vec<RelKey<'_>> = writes.iter().map(crate::router::rel_key).collect();
                    recency.mark(db, &keys, None);
                }
            }
        }
    }

    /// A probe's position arrived: the relations of the commit before it are marked with
    /// it (a replica that has replayed it may serve their reads).
    fn resolve_probe(&self, mut probe: super::unit::Probe) {
        probe.marks.settle(probe.lsn);
    }

    /// A row of an injected query's answer (bytes `[start, end)` of `node`'s buffer).
    fn injected_row(&mut self, node: usize, start: usize, end: usize) {
        let body = self.body(node, start, end);
        if self
            .inflight
            .front()
            .is_some_and(|u| matches!(u.injected, Some(Injected::XidProbe)))
        {
            let row = super::lost_commit::parse_probe(body);
            self.xid_learned(row);
            return;
        }
        if self
            .inflight
            .front()
            .is_some_and(|u| matches!(u.injected, Some(Injected::ChainModes(_))))
        {
            let col = |i: usize| super::lost_commit::text_column(body, i);
            let answered = super::phase::chain_modes(col(0), col(1));
            if let Some(Injected::ChainModes(modes)) =
                self.inflight.front_mut().and_then(|u| u.injected.as_mut())
            {
                *modes = answered;
            }
            return;
        }
        // The position probe and the replay sample answer one text column, `X/Y`.
        let lsn = super::lost_commit::text_column(body, 0)
            .and_then(|t| t.parse::<pgfresh_lsn::Lsn>().ok());
        match self.inflight.front_mut().and_then(|u| u.injected.as_mut()) {
            Some(Injected::Position(p)) => p.lsn = lsn,
            Some(Injected::ReplaySample(known)) => *known = lsn,
            _ => {}
        }
    }

    /// An injected unit ended (its ReadyForQuery arrived).
    fn injected_done(&mut self, node: usize, what: Injected, error: bool) {
        match what {
            Injected::Setting if error => {
                // A replayed setting was refused: this connection is not up to date, so
                // the next unit replays again.
                if let Some(l) = self.backends[node].as_mut() {
                    l.conn.settings = None;
                }
            }
            Injected::Statement(name) if error => {
                // Refused (a Close of any older one went ahead): nothing under the name.
                if let Some(l) = self.backends[node].as_mut() {
                    l.conn.sql_prepared.remove(&name);
                    l.conn.prepared.remove(&name);
                }
            }
            Injected::Position(probe) => {
                let (lsn, report) = (probe.lsn, probe.report);
                if let Some(lsn) = lsn {
                    self.shared.balancer.note_commit(lsn);
                }
                self.resolve_probe(*probe);
                self.report_commit_position(node, lsn, report);
            }
            Injected::ReplaySample(Some(lsn)) if !error => {
                self.shared.balancer.learn_replay(node, lsn);
            }
            Injected::ChainModes(Some(modes)) if !error => self.tx.defer_with(&modes),
            _ => {}
        }
    }
}

/// Whether the complete backend messages at the start of `buf` include an ErrorResponse
/// of severity FATAL or PANIC (the server is closing the connection).
pub(super) fn has_fatal(buf: &[u8]) -> bool {
    let mut pos = 0;
    while let Ok(Some((tag, end))) = frame_at(buf, pos, usize::MAX) {
        if tag == b'E' && is_fatal(&buf[pos + 5..end]) {
            return true;
        }
        pos = end;
    }
    false
}

/// Whether an ErrorResponse body has severity FATAL or PANIC (the server is closing the
/// connection).
fn is_fatal(body: &[u8]) -> bool {
    body.split(|b| *b == 0)
        .any(|f| matches!(f, b"SFATAL" | b"VFATAL" | b"SPANIC" | b"VPANIC"))
}

/// The parameter values a client was last told (ParameterStatus): those its login
/// reported (one list shared by the sessions whose logins reported alike) and the
/// changes since, which are few; and for the unit in flight, what the server reported and
/// the parameters a reset brought back to their startup values (see
/// `Session::reports_due`).
#[derive(Default)]
pub(super) struct Reports {
    login: std::sync::Arc<Vec<(String, String)>>,
    changed: Vec<(String, String)>,
    held: Vec<(String, String)>,
    restored: Vec<String>,
}

impl Reports {
    pub(super) fn at_login(login: std::sync::Arc<Vec<(String, String)>>) -> Self {
        Reports {
            login,
            ..Default::default()
        }
    }

    /// Something is held for the unit's ReadyForQuery.
    fn waiting(&self) -> bool {
        !self.held.is_empty() || !self.restored.is_empty()
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.changed
            .iter()
            .chain(self.login.iter())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The name of a parameter the client was told, spelt as the server spells it.
    fn told_name(&self, name: &str) -> Option<&str> {
        self.changed
            .iter()
            .chain(self.login.iter())
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(k, _)| k.as_str())
    }

    fn set(&mut self, name: &str, value: &str) {
        match self.changed.iter_mut().find(|(k, _)| k == name) {
            Some((_, v)) => *v = value.to_string(),
            None => self.changed.push((name.to_string(), value.to_string())),
        }
    }
}
