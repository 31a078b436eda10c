//! Client frames → units → routed and sent.

use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use pgfresh_config::PoolMode;
use pgfresh_sql::Analysis;
use pgfresh_wire::{parse_frontend, FrontendMessage};

use super::routing::Local;
use super::settings::{event_of, StmtEvent};
use super::state::Prepared;
use super::unit::{ClientUnit, Expect, InFlight, NamedStatement, Undo};
use super::Session;
use crate::error::ProxyError;
use crate::io::{try_frame, Side};
use crate::router::{Decision, Reason, Target, TokenNeed};

/// Whether the ready units behind one just dispatched may go now.
pub(super) enum Flow {
    /// Yes (the unit went, was answered, or is back at the front to go again now).
    Next,
    /// No: the unit is back at the front, waiting for the replies ahead of it.
    Stop,
}

/// An extended batch larger than this is sent before its Sync arrives.
const MAX_BATCH_BYTES: usize = 1 << 20;
/// A finished unit whose vectors hold more items than this is not kept for reuse.
const MAX_SPARE_ITEMS: usize = 64;

/// What executing the statement prepared as `p` means for the session's settings.
fn portal_event(p: &Prepared) -> StmtEvent {
    let Some(stmt) = state_statement(&p.analysis) else {
        return StmtEvent::Other;
    };
    let frame = pgfresh_wire::Frame {
        tag: b'P',
        raw: p.parse.clone(),
    };
    let sql = match parse_frontend(&frame) {
        Ok(FrontendMessage::Parse { sql, .. }) => Some(sql),
        _ => None,
    };
    statement_event(stmt, sql)
}

/// The one statement of `analysis`, when it changes the session's settings or the
/// transaction (only such a statement has an event).
fn state_statement(analysis: &Analysis) -> Option<&pgfresh_sql::Statement> {
    let [stmt] = analysis.statements.as_slice() else {
        return None;
    };
    (stmt.session.is_some() || stmt.tx.is_some()).then_some(stmt)
}

/// The event of `stmt` (see [`state_statement`]), `sql` the text it was parsed from when
/// that is readable.
fn statement_event(stmt: &pgfresh_sql::Statement, sql: Option<&str>) -> StmtEvent {
    event_of(
        stmt,
        sql.and_then(|t| t.get(stmt.text_range.0..stmt.text_range.1)),
    )
}

/// The analysis of what a SQL `EXECUTE` of a statement pgfresh never saw prepared runs,
/// and of a text pgfresh cannot read (not UTF-8): it may write anything.
static UNKNOWN_PREPARED: LazyLock<Arc<Analysis>> =
    LazyLock::new(|| Arc::new(pgfresh_sql::unknown_prepared_statement()));

/// The statements the SQL `EXECUTE`s in `analysis` run become parts of `unit` (over the
/// simple protocol and the extended one alike), and are prepared where it runs. One
/// pgfresh never saw prepared (by a function) may write anything. One the client made
/// with a protocol Parse (one namespace for both) is prepared where the unit runs, under
/// the client's name (`send::put_protocol_statement`): in session mode too, the Parse
/// may have run on another node.
fn add_sql_executes(
    state: &super::state::SessionState,
    analysis: &Analysis,
    unit: &mut ClientUnit,
) {
    for name in analysis.executes() {
        match state.prepared.get(name) {
            Some(p) if !state.sql_prepared.contains_key(name) => {
                unit.parts.push(p.analysis.clone());
                unit.sql_executes.push(NamedStatement::of(state, name));
            }
            _ => add_bound_sql_statement(&state.sql_prepared, name, unit),
        }
    }
}

/// `unit` runs the SQL-level prepared statement `name` (by `EXECUTE`, or by a Bind of a
/// name no Parse of the client's made: the server has one namespace for both): its
/// analysis is a part of the unit and it is prepared where the unit runs; one pgfresh
/// never saw prepared may write anything (and goes where no copy of one of that name is
/// left, see `ClientUnit::unknown_statements`).
fn add_bound_sql_statement(
    sql_prepared: &foldhash::HashMap<String, (String, Arc<Analysis>)>,
    name: &str,
    unit: &mut ClientUnit,
) {
    match sql_prepared.get(name) {
        Some((_, inner)) => {
            unit.parts.push(inner.clone());
            unit.sql_executes.push(NamedStatement::sql(name));
        }
        None => {
            unit.parts.push(UNKNOWN_PREPARED.clone());
            if !name.is_empty() {
                unit.unknown_statements.push(name.to_string());
            }
        }
    }
}

/// A PREPARE in `analysis` of a name the client already has, which the connection may
/// not hold under that name (transaction mode keeps a protocol-level statement under
/// pgfresh's name; a SQL-level one, and in session mode a Parse, may have run on another
/// connection): the client's statement is put on the connection under its name first
/// (`send::put_protocol_statement`, or PREPAREd as an `EXECUTE`'s is), so that the server
/// refuses the PREPARE as PostgreSQL does (42P05). A PREPARE of a name the client does
/// not have drops a copy the connection may still hold under it (one the client closed
/// or deallocated on another connection), which would refuse it.
fn add_name_collisions(
    state: &super::state::SessionState,
    analysis: &Analysis,
    unit: &mut ClientUnit,
) {
    for s in &analysis.statements {
        if let Some(pgfresh_sql::SessionEffect::Prepare { name, .. }) = &s.session {
            if state.sql_prepared.contains_key(name) {
                unit.sql_executes.push(NamedStatement::sql(name));
            } else if state.prepared.contains_key(name) {
                unit.sql_executes.push(NamedStatement::of(state, name));
            } else {
                unit.unknown_statements.push(name.clone());
            }
        }
    }
}

impl Session {
    /// The analysis of `sql`, or a stand-in when the parser is off (everything then goes
    /// to the primary and nothing needs parsing).
    fn analyze(&mut self, sql: &str) -> Arc<Analysis> {
        if !self.parser_enabled {
            return self.shared.not_analyzed.clone();
        }
        self.texts.analyze(&self.shared.analyzer, sql)
    }

    /// Split every complete client frame off the buffer into units (up to the first
    /// unit that must be routed). Returns whether any frame was taken.
    pub(super) fn process_client(&mut self) -> Result<bool, ProxyError> {
        self.parser_enabled = self.config.routing.enable_query_parser;
        let mut consumed = false;
        while !self.terminating && self.ready.back().is_none_or(|u| u.passthrough) {
            if self.statements_unsettled() {
                return Ok(consumed);
            }
            if let Some(unit) = self
                .take_unnamed_batch()
                .or_else(|| self.take_named_batch())
            {
                consumed = true;
                self.ready.push_back(unit);
                continue;
            }
            let Some(frame) = try_frame(&mut self.cbuf, &self.limits, Side::Frontend)? else {
                return Ok(consumed);
            };
            consumed = true;
            let msg = match parse_frontend(&frame) {
                Ok(msg) => msg,
                Err(e) => match pgfresh_wire::non_utf8_text(&frame) {
                    Some(t) => {
                        let name = t.name.to_string();
                        self.take_non_utf8(frame.raw, &name);
                        continue;
                    }
                    None => return Err(e.into()),
                },
            };
            match msg {
                FrontendMessage::Query { sql } => {
                    self.close_batch_early();
                    self.query_drops_unnamed();
                    let mut unit = self.query_unit(sql);
                    match self.split_query(sql, &unit) {
                        None => {
                            unit.frames.push(frame.raw);
                            self.ready.push_back(unit);
                        }
                        Some(at) => self.take_split_query(unit, sql, at),
                    }
                }
                FrontendMessage::Parse { name, sql, .. } => {
                    let analysis = self.analyze(sql);
                    self.record_parse(&frame.raw, name, analysis);
                }
                FrontendMessage::Bind {
                    portal, statement, ..
                } => {
                    let mut event = StmtEvent::Other;
                    let p = self.state.prepared.get(statement);
                    if let Some(p) = p {
                        // Parse then Bind of the same statement (every unnamed one): its
                        // analysis is there once, so routing looks its relations up once.
                        if !self
                            .batch
                            .parts
                            .last()
                            .is_some_and(|a| Arc::ptr_eq(a, &p.analysis))
                        {
                            self.batch.parts.push(p.analysis.clone());
                        }
                        event = portal_event(p);
                        add_sql_executes(&self.state, &p.analysis, &mut self.batch);
                    } else if self
                        .batch
                        .statement_undo
                        .iter()
                        .any(|u| u.name == statement)
                    {
                        // Closed earlier in this batch: the server refuses the Bind (26000)
                        // whatever the connection held under the name, which that Close
                        // closed, so no copy is dropped ahead of the batch (in a transaction
                        // a batch ahead may fail, and what pgfresh puts there would be
                        // refused in the client's name).
                        self.batch.parts.push(UNKNOWN_PREPARED.clone());
                    } else {
                        // The server has one namespace for protocol-level and SQL-level
                        // prepared statements: a Bind may run one made by SQL PREPARE. It is
                        // then what the unit runs; one pgfresh never saw may write anything.
                        add_bound_sql_statement(
                            &self.state.sql_prepared,
                            statement,
                            &mut self.batch,
                        );
                    }
                    if self.refers_to_statement(statement) {
                        // The statement as it is now: a later Close or Parse in the same
                        // batch must not change what this Bind runs.
                        self.batch.statement_refs.push(p.map(|p| p.content.clone()));
                    }
                    if event != StmtEvent::Other {
                        self.portal_events.insert(portal.to_string(), event);
                    } else if !self.portal_events.is_empty() {
                        self.portal_events.remove(portal);
                    }
                    if !self.batch.parses.iter().any(|n| n == statement) {
                        self.batch.uses_statements.push(statement.to_string());
                    }
                    self.push_batch(frame.raw);
                }
                FrontendMessage::Describe { kind: b'S', name } => {
                    self.describe_statement(name);
                    self.push_batch(frame.raw);
                }
                FrontendMessage::Describe { .. } => self.push_batch(frame.raw),
                FrontendMessage::Close { kind, name } => {
                    if kind == b'S' {
                        let previous = self.state.prepared.remove(name);
                        // One the client PREPAREd goes too (one namespace): the Close
                        // goes to the server, which drops it (`rewrite`).
                        let sql = self.state.sql_prepared.remove(name);
                        self.batch.parses.retain(|n| n != name);
                        self.batch.statement_undo.push(Undo {
                            name: name.to_string(),
                            previous,
                            sql,
                        });
                    }
                    self.push_batch(frame.raw);
                }
                FrontendMessage::Execute { portal, .. } => {
                    let event = self
                        .portal_events
                        .get(portal)
                        .cloned()
                        .unwrap_or(StmtEvent::Other);
                    self.batch.events.push(event);
                    self.push_batch(frame.raw);
                }
                FrontendMessage::Sync => {
                    self.batch.frames.push(frame.raw);
                    self.batch.synced = true;
                    let unit = self.take_batch();
                    self.ready.push_back(unit);
                }
                FrontendMessage::Flush => {
                    self.batch.frames.push(frame.raw);
                    let unit = self.take_batch();
                    self.ready.push_back(unit);
                }
                FrontendMessage::CopyData(_)
                | FrontendMessage::CopyDone
                | FrontendMessage::CopyFail { .. } => {
                    // COPY started by an extended batch (Bind/Execute without Sync yet):
                    // that batch goes first.
                    self.close_batch_early();
                    if let Some(last) = self.ready.back_mut().filter(|u| u.passthrough) {
                        last.frames.push(frame.raw);
                        continue;
                    }
                    let mut unit = self.fresh_unit();
                    unit.passthrough = true;
                    unit.frames.push(frame.raw);
                    self.ready.push_back(unit);
                }
                FrontendMessage::FunctionCall => {
                    let mut unit = self.fresh_unit();
                    unit.force_primary = true;
                    unit.synced = true;
                    unit.frames.push(frame.raw);
                    self.ready.push_back(unit);
                }
                FrontendMessage::Terminate => {
                    self.terminating = true;
                }
                FrontendMessage::Password(_) => {
                    return Err(ProxyError::Startup("unexpected password message".into()));
                }
            }
        }
        Ok(consumed)
    }

    /// A Describe of statement `name` joins the batch: the statement as it is now, one
    /// lookup.
    fn describe_statement(&mut self, name: &str) {
        if !self.batch.parses.iter().any(|n| n == name) {
            self.batch.uses_statements.push(name.to_string());
        }
        let refers = self.refers_to_statement(name);
        match self.state.prepared.get(name) {
            Some(p) => {
                // A statement whose text is `EXECUTE x` is described as `x`: that must be
                // on the connection under its name, as for a Bind of it.
                add_sql_executes(&self.state, &p.analysis, &mut self.batch);
                if refers {
                    self.batch.statement_refs.push(Some(p.content.clone()));
                }
            }
            None => {
                if self.state.sql_prepared.contains_key(name) {
                    // One the client PREPAREd (one namespace for both), as a Bind of it:
                    // the statement goes where the Describe runs.
                    add_bound_sql_statement(&self.state.sql_prepared, name, &mut self.batch);
                }
                if refers {
                    self.batch.statement_refs.push(None);
                }
            }
        }
    }

    /// The unit of a simple Query (its frame not yet in it).
    #[inline(always)]
    fn query_unit(&mut self, sql: &str) -> Box<ClientUnit> {
        let mut unit = self.fresh_unit();
        let analysis = self.analyze(sql);
        add_sql_executes(&self.state, &analysis, &mut unit);
        add_name_collisions(&self.state, &analysis, &mut unit);
        // DEALLOCATE needs the statement where it runs, as EXECUTE does: one
        // the client PREPAREd, or made with a protocol Parse (in transaction
        // mode it lives under pgfresh's name, in session mode the Parse may
        // have run on another node; a lone DEALLOCATE of one is answered
        // here in transaction mode, see `answer_locally`).
        for s in &analysis.statements {
            if let Some(pgfresh_sql::SessionEffect::Deallocate(Some(name))) = &s.session {
                if self.state.sql_prepared.contains_key(name) {
                    unit.sql_executes.push(NamedStatement::sql(name));
                } else if self.state.prepared.contains_key(name) {
                    unit.sql_executes
                        .push(NamedStatement::of(&self.state, name));
                } else {
                    // None of the client's: a copy left on the connection
                    // goes first, so the server answers 26000.
                    unit.unknown_statements.push(name.clone());
                }
            }
        }
        if analysis
            .statements
            .iter()
            .any(|s| s.session.is_some() || s.tx.is_some())
        {
            unit.events = analysis
                .statements
                .iter()
                .map(|s| event_of(s, sql.get(s.text_range.0..s.text_range.1)))
                .collect();
        }
        unit.plain_read = super::fast::plain_read(&analysis);
        unit.parts.insert(0, analysis);
        unit.simple = true;
        unit.synced = true;
        unit
    }

    /// A Query whose first statement ends a transaction and whose others need the
    /// client's statements on the connection (an `EXECUTE` of one made by Parse, say),
    /// while a transaction is open or may be (`split_query`), goes as two Queries cut at
    /// `at`: in a failed transaction no statement can be put there ahead of them, and
    /// once the first has ended the transaction one can be. The first part's
    /// ReadyForQuery is not the client's (`ClientUnit::ready_hidden`).
    #[cold]
    #[inline(never)]
    fn take_split_query(&mut self, whole: Box<ClientUnit>, sql: &str, at: usize) {
        self.recycle_unit(whole);
        let (first, rest) = sql.split_at(at);
        for (part, hidden) in [(first, true), (rest, false)] {
            let mut unit = self.query_unit(part);
            unit.frames.push(pgfresh_wire::build::query(part));
            unit.ready_hidden = hidden;
            self.ready.push_back(unit);
        }
    }

    /// Where a Query is cut in two (`take_split_query`): after its first statement and its
    /// semicolon, when that statement ends a transaction (COMMIT, ROLLBACK), another
    /// follows that needs a statement of the client's put on the connection or dropped
    /// there, and a transaction is open, failed, or not yet known to be neither.
    fn split_query(&self, sql: &str, unit: &ClientUnit) -> Option<usize> {
        if unit.sql_executes.is_empty() && unit.unknown_statements.is_empty() {
            return None;
        }
        if self.tx.is_idle() && self.inflight.is_empty() {
            return None;
        }
        let statements = &unit.parts.first()?.statements;
        let ends = matches!(
            statements.first()?.tx,
            Some(pgfresh_sql::TxEffect::Commit { .. } | pgfresh_sql::TxEffect::Rollback { .. })
        );
        if !ends || statements.len() < 2 {
            return None;
        }
        // Parsed again (rare): the analysis pgfresh keeps may stand for texts alike.
        pgfresh_sql::after_first_statement(sql)
    }

    /// A Parse joins the batch: the client's statement `name` is its text now.
    fn record_parse(&mut self, raw: &Bytes, name: &str, analysis: Arc<Analysis>) {
        let previous = self.state.prepared.insert(
            name.to_string(),
            Prepared::new(raw.clone(), name, analysis.clone()),
        );
        if name.is_empty() && self.batch_starts_here() && self.parse_stands() {
            self.batch.unnamed_first = true;
        } else {
            self.batch.statement_undo.push(Undo {
                name: name.to_string(),
                previous,
                sql: None,
            });
        }
        if !name.is_empty() && self.state.sql_prepared.contains_key(name) {
            // A name the client PREPAREd: the statement goes where the Parse runs (in
            // session mode too, the PREPARE may have run on another node), and the
            // server refuses the Parse (42P05, one namespace for both; see `rewrite`).
            self.batch.sql_executes.push(NamedStatement::sql(name));
        }
        add_name_collisions(&self.state, &analysis, &mut self.batch);
        // DEALLOCATE of a protocol-level statement needs it where it runs.
        for s in &analysis.statements {
            if let Some(pgfresh_sql::SessionEffect::Deallocate(Some(n))) = &s.session {
                if self.state.prepared.contains_key(n) {
                    self.batch.uses_statements.push(n.clone());
                }
            }
        }
        self.batch.parts.push(analysis);
        self.batch.parses.push(name.to_string());
        self.push_batch(raw.clone());
    }

    /// The next message begins a batch that continues none: nothing of it was read yet,
    /// nothing is open on a node and no unit waits (an error before its first message
    /// cannot skip that message).
    fn batch_starts_here(&self) -> bool {
        self.batch.frames.is_empty()
            && self.ready.is_empty()
            && self.wire == super::WirePhase::Units
    }

    /// A batch's leading Parse of the unnamed statement may go without an undo
    /// (`ClientUnit::unnamed_first`): the server does not refuse it for the state of the
    /// transaction. In a failed one it does (25P02), after dropping the old unnamed
    /// statement, so the client has none: its undo says so (and a later Parse the error
    /// skips takes the client back to none, not to the refused one).
    fn parse_stands(&self) -> bool {
        !matches!(self.tx, super::TxPhase::Failed)
    }

    /// A simple Query destroys the unnamed statement before it runs, whatever it runs and
    /// whether it fails (PostgreSQL's `exec_simple_query`), pgfresh's own answers included:
    /// a later Bind or Describe of it fails with 26000 until it is parsed again.
    pub(super) fn query_drops_unnamed(&mut self) {
        if !self.state.prepared.is_empty() {
            self.state.prepared.remove("");
        }
    }

    /// A Query or Parse whose text is not UTF-8 (see `pgfresh_wire::non_utf8_text`):
    /// a client whose `client_encoding` is another, which the server converts, or bytes
    /// the server refuses with 22021 and goes on. pgfresh cannot read the text, so it
    /// sends it on as a statement that may write anything: to the primary, marking the
    /// whole database when it commits.
    fn take_non_utf8(&mut self, raw: Bytes, name: &str) {
        let analysis = UNKNOWN_PREPARED.clone();
        if raw[0] == b'P' {
            self.record_parse(&raw, name, analysis);
            return;
        }
        self.close_batch_early();
        self.query_drops_unnamed();
        let mut unit = self.fresh_unit();
        unit.parts.push(analysis);
        unit.simple = true;
        unit.synced = true;
        unit.frames.push(raw);
        self.ready.push_back(unit);
    }

    /// The usual one-statement batch of the unnamed statement and portal (Parse, Bind,
    /// Describe, Execute, Sync: see `pgfresh_wire::batch`), taken whole as one chunk
    /// when the client has sent all of it, and nothing is open that it would continue.
    /// The unit is the one its frames would make one by one; a batch whose statement
    /// changes the session's settings goes frame by frame. One of the transaction's
    /// statements (BEGIN, COMMIT, SAVEPOINT ...) keeps its messages as frames of their
    /// own, as the frame-by-frame reader leaves them (pgfresh may answer it message by
    /// message: a deferred BEGIN), with its event recorded for the portal.
    pub(super) fn take_unnamed_batch(&mut self) -> Option<Box<ClientUnit>> {
        if !self.batch_starts_here() || !self.parse_stands() {
            return None;
        }
        let found = pgfresh_wire::unnamed_batch(&self.cbuf, &self.limits)?;
        if found.len > MAX_BATCH_BYTES {
            return None;
        }
        let sql = &self.cbuf[found.sql];
        let analysis = if self.parser_enabled {
            self.texts.analyze_bytes(&self.shared.analyzer, sql)?
        } else {
            std::str::from_utf8(sql).ok()?;
            self.shared.not_analyzed.clone()
        };
        if analysis.statements.iter().any(|s| s.session.is_some()) {
            return None;
        }
        let tx = analysis.statements.iter().any(|s| s.tx.is_some());
        let event = match state_statement(&analysis) {
            Some(stmt) => statement_event(stmt, std::str::from_utf8(sql).ok()),
            None => StmtEvent::Other,
        };
        let chunk = self.cbuf.split_to(found.len).freeze();
        let parse = chunk.slice(..found.parse_len);
        match self.state.prepared.get_mut("") {
            // The same statement again (a client running one text over and over).
            Some(p) if p.parse == parse => {
                if !Arc::ptr_eq(&p.analysis, &analysis) {
                    p.analysis = analysis.clone();
                }
            }
            _ => {
                let p = Prepared::new(parse, "", analysis.clone());
                self.state.prepared.insert(String::new(), p);
            }
        }
        if event != StmtEvent::Other {
            self.portal_events.insert(String::new(), event.clone());
        } else if !self.portal_events.is_empty() {
            self.portal_events.remove("");
        }
        let mut unit = self.fresh_unit();
        if tx {
            let mut start = 0;
            for &end in &found.ends[..found.messages] {
                unit.frames.push(chunk.slice(start..end));
                start = end;
            }
        } else {
            unit.frames.push(chunk);
        }
        unit.parts.push(analysis);
        unit.parses.push(String::new());
        unit.unnamed_first = true;
        unit.events.push(event);
        unit.synced = true;
        Some(unit)
    }

    /// The one-statement batch of a statement the client prepared under a name (Bind,
    /// Describe of the portal, Execute, Sync: see `pgfresh_wire::batch`), taken whole
    /// when the client has sent all of it and nothing is open that it would continue.
    /// The unit is the one its frames would make one by one, each message a frame of
    /// its own; a statement pgfresh does not hold, or one that changes the session's
    /// settings or transaction state (an SQL `EXECUTE` among them), goes frame by frame.
    pub(super) fn take_named_batch(&mut self) -> Option<Box<ClientUnit>> {
        if !self.batch_starts_here() {
            return None;
        }
        let found = pgfresh_wire::named_batch(&self.cbuf, &self.limits)?;
        if found.len > MAX_BATCH_BYTES {
            return None;
        }
        let name = std::str::from_utf8(&self.cbuf[found.statement.clone()]).ok()?;
        let p = self.state.prepared.get(name)?;
        if p.analysis
            .statements
            .iter()
            .any(|s| s.session.is_some() || s.tx.is_some())
        {
            return None;
        }
        let (analysis, content) = (p.analysis.clone(), p.content.clone());
        let name = name.to_string();
        let mut unit = self.fresh_unit();
        if self.mode == PoolMode::Transaction {
            unit.statement_refs.push(Some(content));
        }
        unit.uses_statements.push(name);
        if !self.portal_events.is_empty() {
            self.portal_events.remove("");
        }
        let chunk = self.cbuf.split_to(found.len).freeze();
        let mut start = 0;
        for &end in &found.ends[..found.messages] {
            unit.frames.push(chunk.slice(start..end));
            start = end;
        }
        unit.parts.push(analysis);
        unit.events.push(StmtEvent::Other);
        unit.synced = true;
        Some(unit)
    }

    /// Send the extended messages collected so far as a unit of their own, before a
    /// message that does not belong to the batch.
    fn close_batch_early(&mut self) {
        if !self.batch.frames.is_empty() {
            let unit = self.take_batch();
            self.ready.push_back(unit);
        }
    }

    /// The batch collected so far, replaced by a fresh one (the spare unit when there
    /// is one).
    fn take_batch(&mut self) -> Box<ClientUnit> {
        let next = self.fresh_unit();
        std::mem::replace(&mut self.batch, next)
    }

    /// An empty unit: the spare one when there is one.
    pub(super) fn fresh_unit(&mut self) -> Box<ClientUnit> {
        self.spare
            .take()
            .unwrap_or_else(|| Box::new(ClientUnit::new()))
    }

    /// Keeps a finished unit (its box and vectors) for a later batch, unless it grew
    /// large (a COPY's stream of frames, a long pipeline): an idle session keeps no
    /// more than a usual batch needs.
    pub(super) fn recycle_unit(&mut self, mut unit: Box<ClientUnit>) {
        if self.spare.is_none() && unit.capacity() <= MAX_SPARE_ITEMS {
            unit.recycle();
            self.spare = Some(unit);
        }
    }

    /// Takes back what a finished unit kept: the unit held for a retry, and the buffer
    /// of its settings events.
    pub(super) fn recycle_finished(&mut self, f: &mut InFlight) {
        if let Some(kept) = f.retry.take() {
            self.recycle_unit(kept);
        }
        if let Some(spare) = self.spare.as_mut().filter(|s| s.events.capacity() == 0) {
            let mut events = std::mem::take(&mut f.events);
            events.clear();
            spare.events = events.into();
        }
    }

    /// Transaction control is not pipelined. Whether a unit runs inside a transaction
    /// (and so when its writes are marked), which node a transaction starts on and what
    /// that node must have replayed are decided from the transaction state, which only
    /// the ReadyForQuery of the units ahead settles. So a unit that begins or ends a
    /// transaction waits for the client's units ahead of it (a BEGIN is then deferred to
    /// its first statement, as usual), and a unit behind one that does waits for it.
    fn waits_for_transaction_state(&self, unit: &ClientUnit) -> bool {
        unit.controls_transaction() || self.inflight.iter().any(|u| u.tx_control)
    }

    /// Transaction mode: a Bind or Describe of statement `name` records what the name
    /// stands for as it is read (`ClientUnit::statement_refs`): a named statement, and the
    /// unnamed one unless the batch parsed it (it is then the batch's own).
    fn refers_to_statement(&self, name: &str) -> bool {
        self.mode == PoolMode::Transaction
            && (!name.is_empty() || !self.batch.parses.iter().any(String::is_empty))
    }

    /// Transaction mode: a unit's Parses, Binds and Closes are read against the client's
    /// statements as they are when it is read. A Parse or Close of the client's still
    /// unanswered in a batch ahead may be skipped (an error before it), and the change it
    /// made taken back: the next batch is read once none is (within an open batch the
    /// server skips the rest too, and what it changed is taken back in order).
    ///
    /// In either mode, a SQL PREPARE or DEALLOCATE ahead changes the client's statements
    /// only once the server completes it (`StatementChange`): the next unit is read once
    /// it has.
    pub(super) fn statements_unsettled(&self) -> bool {
        self.batch.frames.is_empty()
            && self.wire == super::WirePhase::Units
            && self.inflight.iter().any(|u| {
                u.events.iter().any(StmtEvent::changes_statements)
                    || u.expect.iter().any(Expect::may_undo)
                    // Failed, its ReadyForQuery not yet in: the transaction's state (a
                    // failed one refuses what pgfresh would put ahead) is not known.
                    || (u.error && !u.is_injected())
                    || u.refused.is_some()
                    || (u.unnamed_first && u.acks == 0 && !u.error && !self.parses_unnamed_next())
            })
    }

    /// The client's next message parses the unnamed statement: what a batch ahead made
    /// of the unnamed statement does not matter to it.
    fn parses_unnamed_next(&self) -> bool {
        self.cbuf.first() == Some(&b'P') && self.cbuf.get(5) == Some(&0)
    }

    /// Transaction mode: a unit is mapped onto the statements its connection holds when
    /// it is sent. A Parse or Close of pgfresh's still unanswered in a unit ahead may be
    /// skipped (an error before it in that batch), and the statement would then not be
    /// there after all, or still be there: a unit that names statements waits until
    /// they are answered. In a transaction a unit that parses a named statement waits
    /// for the client's units ahead too: one may fail the transaction, where the server
    /// refuses any Parse (25P02), one of a statement the connection already has (which
    /// pgfresh otherwise answers itself) included.
    ///
    /// Session mode: in a transaction, a unit for which the client's statements are put on
    /// the connection first (`prepare_statements`) waits for the client's units ahead: one
    /// may fail the transaction, where the server refuses what is put there (25P02) ahead
    /// of the client's own messages, whose answers PostgreSQL gives (a Parse's syntax
    /// error, a Bind's 26000).
    fn waits_for_statements(&self, unit: &ClientUnit) -> bool {
        match self.mode {
            PoolMode::Transaction => {
                !super::rewrite::plain_unit(unit)
                    && self.inflight.iter().any(|u| {
                        u.expect.iter().any(Expect::changes_server_statements)
                            || (!u.is_injected()
                                && !self.tx.is_idle()
                                && unit.parses.iter().any(|n| !n.is_empty()))
                    })
            }
            PoolMode::Session => {
                matches!(self.tx, super::phase::TxPhase::Open)
                    && self.inflight.iter().any(|u| !u.is_injected())
                    && self.active.is_some_and(|n| self.puts_statements(n, unit))
            }
        }
    }

    fn push_batch(&mut self, raw: Bytes) {
        self.batch.frames.push(raw);
        if self.batch.bytes() > MAX_BATCH_BYTES {
            let unit = self.take_batch();
            self.ready.push_back(unit);
        }
    }

    /// Route and send ready units in order, stopping at one that must wait for the
    /// active backend to drain.
    pub(super) async fn dispatch_ready(&mut self) -> Result<(), ProxyError> {
        while let Some(unit) = self.ready.pop_front() {
            if self.inflight.front().is_some_and(|u| u.refused.is_some())
                || self.chain_modes_pending()
            {
                // A read a standby refused goes again first (see `on_refused_ready`); a
                // chained transaction's BEGIN waits for its modes (see `chain_anew`).
                self.ready.push_front(unit);
                return Ok(());
            }
            if unit.passthrough {
                let Some(node) = self.active else { continue };
                if unit
                    .frames
                    .iter()
                    .any(|f| matches!(f.first(), Some(b'c' | b'f')))
                {
                    self.wire.copy_ended();
                }
                self.send_frames(node, &unit.frames)?;
                continue;
            }
            if let Some(node) = self.wire.batch_node() {
                self.send_unit(node, unit, None).await?;
                continue;
            }
            if self.client_busy()
                && (self.waits_for_transaction_state(&unit) || self.waits_for_statements(&unit))
            {
                // The replies to the units ahead settle the transaction state (and the
                // statements on their connection) first.
                self.ready.push_front(unit);
                return Ok(());
            }
            match self.answer_locally(&unit) {
                Local::Answered => {
                    // Its box and vectors serve the next batch (a deferred BEGIN comes
                    // once a transaction).
                    self.recycle_unit(unit);
                    continue;
                }
                Local::Wait => {
                    // Replies to units ahead of it must reach the client first.
                    self.ready.push_front(unit);
                    return Ok(());
                }
                Local::No => {}
            }
            if let Some(e) = self.reserved_statement_name(&unit) {
                self.fail_unit(&unit, &e);
                continue;
            }
            let token = self.token_need(&unit);
            let decision = match self.check_tokens(&unit) {
                Ok(()) => self.route(&unit, token),
                Err(e) => {
                    if self.client_busy() {
                        self.ready.push_front(unit);
                        return Ok(());
                    }
                    self.fail_unit(&unit, &e);
                    continue;
                }
            };
            match self.dispatch_decided(unit, decision, token).await? {
                Flow::Next => {}
                Flow::Stop => return Ok(()),
            }
        }
        Ok(())
    }

    /// A routed unit: waits its decision asks for (the WAL feed, a replica catching up),
    /// then the node, then the send. Says whether the next ready unit may go.
    pub(super) async fn dispatch_decided(
        &mut self,
        unit: Box<ClientUnit>,
        decision: Decision,
        token: TokenNeed,
    ) -> Result<Flow, ProxyError> {
        let decision = if self.waits_for_wal_feed(&decision) {
            self.after_wal_feed(&unit, token).await
        } else {
            decision
        };
        if decision.reason == Reason::HotRelation {
            self.count_forced(&unit);
        }
        if let Target::Replica {
            required: Some(lsn),
        } = decision.target
        {
            self.wait_for_replica(lsn).await;
        }
        match self.resolve(decision, unit.avoid, token) {
            Ok(node) => self.dispatch_to(node, unit, decision).await,
            Err(e) => Ok(self.unresolved(unit, e).await),
        }
    }

    /// No node takes `unit` (`resolve` failed with `e`): the error, once the replies
    /// ahead of it are relayed, or the unit again once a failover has named a primary.
    pub(super) async fn unresolved(&mut self, mut unit: Box<ClientUnit>, e: ProxyError) -> Flow {
        if self.client_busy() {
            // The error must follow the replies to the units ahead of it.
            self.ready.push_front(unit);
            return Flow::Stop;
        }
        if self.wait_out_failover(&mut unit, &e).await {
            self.ready.push_front(unit);
            return Flow::Next;
        }
        // Nothing was sent: answer this unit with the error and go on.
        self.fail_unit(&unit, &e);
        Flow::Next
    }

    /// Send a unit to the node it was routed to, once nothing ahead of it runs
    /// elsewhere, attaching a connection there first.
    pub(super) async fn dispatch_to(
        &mut self,
        node: usize,
        mut unit: Box<ClientUnit>,
        decision: Decision,
    ) -> Result<Flow, ProxyError> {
        if !self.inflight.is_empty() && (Some(node) != self.active || self.backend_stale(node)) {
            // Pipelined units ahead are still running on another node, or on a
            // connection made before its node changed role, which this unit will
            // not use: their replies come first.
            self.ready.push_front(unit);
            return Ok(Flow::Stop);
        }
        if let Err(e) = self.attach(node).await {
            // A replica that refuses a new connection (shutting down, gone) costs an
            // autocommit read nothing: it goes to another node, within the retry
            // budget, as a read whose replica failed before answering does.
            if self.retryable_read(&decision.target, &unit, node)
                && unit.retries < self.config.routing.read_retry_budget
            {
                self.retry_read(unit, node, &e.to_string());
                return Ok(Flow::Next);
            }
            let to_primary = !matches!(decision.target, Target::Replica { .. } | Target::Node(_))
                || Some(node) == self.shared.balancer.primary();
            if to_primary && self.wait_out_failover(&mut unit, &e).await {
                self.ready.push_front(unit);
                return Ok(Flow::Next);
            }
            self.fail_unit(&unit, &e);
            return Ok(Flow::Next);
        }
        if let Some(retryable) = self.reads_plainly(node, &unit, &decision) {
            self.send_read(node, unit, retryable)?;
        } else {
            self.send_unit(node, unit, Some(decision)).await?;
        }
        Ok(Flow::Next)
    }
}
