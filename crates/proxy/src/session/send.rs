//! Sending a routed unit: what must precede it on its node (replayed settings, a deferred
//! BEGIN, statements to prepare again, the lost-commit id probe), the unit itself in one
//! write, the position probe after a commit, and what the unit means for the session's
//! state (writes to mark, pins, prepared statements).

use std::collections::VecDeque;
use std::sync::LazyLock;

use bytes::Bytes;
use pgfresh_config::PoolMode;
use pgfresh_sql::{Analysis, DiscardKind, MustPrimary, SessionEffect, Statement, TxEffect};
use pgfresh_wire::build;

use super::phase::TxPhase;
use super::settings::{StatementChange, StmtEvent};
use super::state::{text_hash, PinReason, Prepared};
use super::unit::{ClientUnit, ConnRecord, Expect, InFlight, Injected, NamedStatement};
use super::Session;
use crate::error::ProxyError;
use crate::router::Decision;

/// An Analysis for a single statement (the inner statement of SQL PREPARE).
pub(super) fn analysis_of(stmt: &Statement) -> Analysis {
    Analysis {
        statements: vec![stmt.clone()],
        kind: stmt.kind,
        reads: stmt.reads.clone(),
        writes: stmt.writes.clone(),
        must_primary: stmt.must_primary.clone(),
        functions: stmt.functions.clone(),
        implicit_calls: stmt.implicit_calls.clone(),
        calls_user_functions: pgfresh_sql::calls_user_functions(&stmt.functions),
        touches_catalog: stmt.touches_catalog,
        hint: None,
        min_lsn_hint: None,
        min_lsn_malformed: false,
        comments: Vec::new(),
        error: None,
    }
}

/// What a unit writes, as [`Session::unit_writes`] found.
struct UnitWrites {
    writes: Vec<pgfresh_sql::RelName>,
    whole_db: bool,
    /// Any database of the instance may be written (see `InFlight::elsewhere`).
    elsewhere: bool,
    /// The unit runs DDL (the dependency graph is reloaded once it commits).
    ddl: bool,
    /// The schema window's stamp the analysis was made under.
    schema_stamp: Option<crate::schema_window::Stamp>,
    /// The unit holds an effect-changing schema change: begun before it is sent, so a
    /// write analysed from then on sees the window open.
    schema_change: Option<crate::schema_window::SchemaChange>,
}

/// Adds to `writes` what the unit's writes and calls write behind them (triggers,
/// cascades, partitions, function bodies, and for DDL the event triggers it fires); true
/// when that may be anything.
fn expand(
    graph: &pgfresh_deps::DepGraph,
    unit: &ClientUnit,
    fires_event_triggers: bool,
    writes: &mut Vec<pgfresh_sql::RelName>,
) -> bool {
    // Operators and casts count as calls: a user-defined one runs its function.
    // So do the casts between built-in types any statement may apply.
    let functions: Vec<pgfresh_sql::FuncName> = unit
        .parts
        .iter()
        .flat_map(|a| a.functions.iter().chain(&a.implicit_calls).cloned())
        .chain(graph.everywhere_calls().iter().cloned())
        .collect();
    let mut behind = Vec::new();
    let mut whole = graph
        .expand_writes(writes, &functions, &mut behind)
        .is_whole_database();
    // What the unit's reads write through the functions they run (views, policies).
    for a in &unit.parts {
        graph.expand_read_writes(&a.reads, &mut behind);
    }
    if fires_event_triggers {
        whole |= graph.expand_ddl(&mut behind).is_whole_database();
    }
    writes.extend(behind);
    writes.sort();
    writes.dedup();
    whole
}

/// Whether `effect` sets a session value with a `set_config` whose name, value or
/// flag is not a literal: pgfresh cannot replay what it set.
fn sets_unreadable(effect: &SessionEffect) -> bool {
    match effect {
        SessionEffect::SetConfig { name, value, local } => {
            *local != Some(true) && (name.is_none() || value.is_none() || local.is_none())
        }
        SessionEffect::SetConfigs(calls) => calls.iter().any(sets_unreadable),
        _ => false,
    }
}

/// What [`Session::write_unit`] wrote, for [`Session::track_unit`].
struct Written {
    /// The unit runs outside a transaction.
    autocommit: bool,
    /// The unit ends a transaction with COMMIT.
    commit_sent: bool,
    /// What the unit writes (behind the text too), or the whole database.
    writes: Vec<pgfresh_sql::RelName>,
    whole_db: bool,
    elsewhere: bool,
    ddl: bool,
    schema_stamp: Option<crate::schema_window::Stamp>,
    schema_change: Option<crate::schema_window::SchemaChange>,
    /// A position probe follows the unit.
    probe: bool,
    /// A replay sample follows the unit.
    sample: bool,
    /// The replies the unit's messages, and what pgfresh put in front of them, get, in
    /// order (see [`Expect`]).
    expect: VecDeque<Expect>,
}

/// Whether the server has no unnamed statement once it has run `frames`: a simple Query
/// destroys it (the client's own, and pgfresh's injected ones alike: a replayed setting,
/// a deferred BEGIN, the position probe, a replay sample), a Parse of the unnamed
/// statement after the last Query makes it again.
fn destroys_unnamed(frames: &[Bytes]) -> bool {
    super::unit::messages(frames).fold(false, |gone, f| match f.first() {
        Some(b'Q') => true,
        Some(b'P') if f.get(5) == Some(&0) => false,
        _ => gone,
    })
}

/// The first message of a batch that a failed transaction refuses, by its place among
/// the batch's messages, and the statement it binds or describes if that is what it
/// does. Leading Closes (never refused), Flushes and Parses of a text that ends
/// transactions (`exits`: the server parses a COMMIT or ROLLBACK there) are passed over.
/// In a failed transaction the server refuses that message (25P02) if it has the
/// statement, and answers 26000 if not; it refuses every other Parse there (25P02, unless
/// the text does not parse: 42601), and so skips everything after it. `None` for a
/// statement one of the leading Closes closed (PostgreSQL answers 26000 too) or one of
/// those Parses made (it ends transactions: not refused).
fn first_use(frames: &[Bytes], mut exits: impl FnMut(&[u8]) -> bool) -> Option<(usize, &[u8])> {
    let mut gone: Vec<&[u8]> = Vec::new();
    for (i, m) in super::unit::messages(frames).enumerate() {
        let name = match m.first() {
            Some(b'H') => continue,
            Some(b'C') => {
                if m.get(5) == Some(&b'S') {
                    gone.extend(m.get(6..).and_then(|n| n.split(|b| *b == 0).next()));
                }
                continue;
            }
            Some(b'P') => {
                let mut parts = m.get(5..)?.splitn(3, |b| *b == 0);
                let (name, text) = (parts.next()?, parts.next()?);
                if !exits(text) {
                    return None;
                }
                gone.push(name);
                continue;
            }
            Some(b'B') => crate::statements::bind_names(m).map(|(_, s)| s),
            Some(b'D') if m.get(5) == Some(&b'S') => {
                m.get(6..).and_then(|n| n.split(|b| *b == 0).next())
            }
            _ => None,
        }?;
        return (!gone.contains(&name)).then_some((i, name));
    }
    None
}

/// Where a connection records a statement of the client's that an EXECUTE had parsed
/// there under the client's name (`Session::put_protocol_statement`): with its
/// SQL-level statements in transaction mode (dropped at check-in like one), with its
/// statements made by Parse in session mode.
fn executed_copies(
    conn: &mut crate::server::ServerConn,
    mode: PoolMode,
) -> &mut crate::name_map::NameMap<u64> {
    match mode {
        PoolMode::Transaction => &mut conn.sql_prepared,
        PoolMode::Session => &mut conn.prepared,
    }
}

/// `frames` with `insert` put in front of the message at `at` (counted as
/// [`super::unit::messages`] counts): a frame that holds several messages is cut there.
fn insert_before(frames: &[Bytes], at: usize, insert: &Bytes) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(frames.len() + 2);
    let mut seen = 0;
    let mut inserted = false;
    for f in frames {
        let count = super::unit::messages(std::slice::from_ref(f)).count();
        if inserted || seen + count <= at {
            out.push(f.clone());
        } else {
            let offset: usize = super::unit::messages(std::slice::from_ref(f))
                .take(at - seen)
                .map(<[u8]>::len)
                .sum();
            if offset > 0 {
                out.push(f.slice(..offset));
            }
            out.push(insert.clone());
            out.push(f.slice(offset..));
            inserted = true;
        }
        seen += count;
    }
    if !inserted {
        out.push(insert.clone());
    }
    out
}

/// The statement the client PREPAREd under `name` that `unit` closes (a protocol Close:
/// one namespace for both), as it was before.
fn closed_prepared<'a>(
    unit: &'a ClientUnit,
    name: &str,
) -> Option<&'a (String, std::sync::Arc<Analysis>)> {
    unit.statement_undo
        .iter()
        .find_map(|u| u.sql.as_ref().filter(|_| u.name == name))
}

/// Appends `frames` to a connection's write buffer, room made once.
pub(super) fn append(wbuf: &mut bytes::BytesMut, frames: &[Bytes]) {
    wbuf.reserve(frames.iter().map(Bytes::len).sum());
    for f in frames {
        wbuf.extend_from_slice(f);
    }
}

/// The position probe that follows a committing unit on the primary (`pg_catalog`
/// named: a session's search path must not be able to shadow it), as a Query frame built
/// once (each use shares it). The WAL *insert* position: the commit record lies before
/// it once the commit returned, written to the WAL or not. The write position
/// (`pg_current_wal_lsn()`) stays behind an asynchronous commit (`synchronous_commit =
/// off`) until the WAL writer runs, and a standby that had replayed all that was written
/// would pass for one that has the commit.
static POSITION_PROBE: LazyLock<Bytes> =
    LazyLock::new(|| build::query("SELECT pg_catalog.pg_current_wal_insert_lsn()"));

/// The client's statement `name` made by Parse as `unit` began: before the unit's first
/// Parse or Close of the name, if any (the client's statements follow each message as it
/// is read).
fn at_start<'a>(
    unit: &'a ClientUnit,
    state: &'a super::state::SessionState,
    name: &str,
) -> Option<&'a super::state::Prepared> {
    match unit.statement_undo.iter().find(|u| u.name == name) {
        Some(u) => u.previous.as_ref(),
        None => state.prepared.get(name),
    }
}

/// A Parse that the server refuses in a failed transaction (25P02) as it refuses any
/// there, and outside one too (no such relation): it makes no statement either way. Put
/// just in front of the first message of a batch that PostgreSQL would refuse there
/// where the connection lacks the statement that message uses (see
/// `Session::refuses_first_use`).
pub(super) static REFUSED_PARSE: LazyLock<Bytes> = LazyLock::new(|| {
    build::parse(
        crate::statements::PREFIX,
        "SELECT FROM pg_catalog.__pgfresh_none",
        &[],
    )
});

/// The replay sample that may follow an autocommit read on a standby (see
/// `pgfresh_balancer::live`), as a Query frame built once.
pub(super) static REPLAY_SAMPLE: LazyLock<Bytes> =
    LazyLock::new(|| build::query("SELECT pg_catalog.pg_last_wal_replay_lsn()"));

impl Session {
    /// Queue frames for `node` without waiting for the server to take them (see
    /// [`crate::server::ServerConn::queue`]), after what was staged for it.
    pub(super) fn send_frames(&mut self, node: usize, frames: &[Bytes]) -> Result<(), ProxyError> {
        let conn = self.connection_for(node, frames)?;
        let result = match frames {
            [one] => conn.queue(one),
            many => {
                // One write for the whole unit.
                append(&mut conn.wbuf, many);
                conn.flush_some()
            }
        };
        result.map_err(|e| {
            let reason = e.to_string();
            self.backend_lost(node, &reason)
        })
    }

    /// Bring `node`'s connection to the session's settings: RESET ALL, then each
    /// setting as a query of its own (one the server refuses cannot undo the others;
    /// a refusal leaves the connection marked as not up to date, see `relay`).
    fn replay_settings(&mut self, node: usize) -> Result<(), ProxyError> {
        let frames: Vec<Bytes> = self.state.replay_statements().map(build::query).collect();
        self.stage_frames(node, &frames)?;
        for _ in &frames {
            self.inflight
                .push_back(InFlight::injected(Injected::Setting));
        }
        Ok(())
    }

    /// Stage an injected simple query (its replies are swallowed) ahead of the unit.
    pub(super) fn inject_query(&mut self, node: usize, sql: &str) -> Result<(), ProxyError> {
        self.stage_query(node, sql)?;
        self.inflight.push_back(InFlight::injected(Injected::Plain));
        Ok(())
    }

    /// Closes prepared statement `name` on `node`'s connection, SQL-level or not, with a
    /// protocol Close: unlike `DEALLOCATE` it never fails (a name the connection lacks,
    /// after its record counted a Parse an error skipped, is no error; nor is a failed
    /// transaction), so it cannot fail the client's transaction.
    fn inject_close(&mut self, node: usize, name: &str) -> Result<(), ProxyError> {
        self.stage_frames(node, &[build::close(b'S', name), build::sync()])?;
        self.inflight.push_back(InFlight::injected(Injected::Plain));
        Ok(())
    }

    /// Stage a simple query of pgfresh's own; the caller records what it is for.
    pub(super) fn stage_query(&mut self, node: usize, sql: &str) -> Result<(), ProxyError> {
        self.stage_frames(node, &[build::query(sql)])
    }

    /// Put frames that must precede a unit in `node`'s queue without writing them: the
    /// unit's own send writes them with it, one write (and one server wake-up) for both.
    fn stage_frames(&mut self, node: usize, frames: &[Bytes]) -> Result<(), ProxyError> {
        let conn = self.connection_for(node, frames)?;
        append(&mut conn.wbuf, frames);
        Ok(())
    }

    /// `node`'s connection, its record of statements brought to what it holds once it has
    /// run `frames`.
    fn connection_for(
        &mut self,
        node: usize,
        frames: &[Bytes],
    ) -> Result<&mut crate::server::ServerConn, ProxyError> {
        let Some(leased) = self.backends[node].as_mut() else {
            return Err(ProxyError::NoPrimary(None));
        };
        if !leased.conn.prepared.is_empty() && destroys_unnamed(frames) {
            // The next unit that binds the unnamed statement prepares it here again.
            leased.conn.prepared.remove("");
        }
        Ok(&mut leased.conn)
    }

    /// Send a routed unit to `node` (`decision` is `None` for the rest of a unit already
    /// running there), after whatever must precede it there: replayed settings, a
    /// deferred BEGIN, statements to prepare again.
    pub(super) async fn send_unit(
        &mut self,
        node: usize,
        mut unit: Box<ClientUnit>,
        decision: Option<Decision>,
    ) -> Result<(), ProxyError> {
        let continuing = decision.is_none();
        // An autocommit read bound for a replica may be sent again elsewhere if the
        // replica fails before answering.
        let retryable = decision.is_some_and(|d| self.retryable_read(&d.target, &unit, node));
        match self
            .write_unit(node, &mut unit, continuing, retryable)
            .await
        {
            Ok(written) => {
                let commit_sent = written.commit_sent;
                self.track_unit(node, unit, written, continuing, retryable);
                if commit_sent {
                    // Boxed: a test fault's hook, whose state (several KiB) would otherwise
                    // sit in every session's future.
                    Box::pin(self.after_commit_queued(node)).await?;
                }
                Ok(())
            }
            Err(e) => self.unsent(node, unit, retryable, e),
        }
    }

    /// Writing `unit` to `node` failed with `e`. The replica's connection failed before
    /// the read went out (its server closed it just after its last reply, say): as for a
    /// replica that fails before answering, a `retryable` read goes to another node
    /// (within the retry budget). What pgfresh had of its own in flight there is gone
    /// with the connection. Anything else is the session's error.
    pub(super) fn unsent(
        &mut self,
        node: usize,
        unit: Box<ClientUnit>,
        retryable: bool,
        e: ProxyError,
    ) -> Result<(), ProxyError> {
        if !(retryable
            && unit.retries < self.config.routing.read_retry_budget
            && self.inflight.iter().all(InFlight::is_injected))
        {
            return Err(e);
        }
        self.inflight.clear();
        self.wire.set_batch(None);
        self.replica_guard = None;
        self.retry_read(unit, node, &e.to_string());
        Ok(())
    }

    /// Write `unit` to `node`, with what must precede it and the probe or sample that
    /// follows it, and update what the connection holds.
    async fn write_unit(
        &mut self,
        node: usize,
        unit: &mut ClientUnit,
        continuing: bool,
        retryable: bool,
    ) -> Result<Written, ProxyError> {
        if !continuing && self.behind(node, unit) {
            self.bring_up_to_date(node, unit).await?;
        }
        // What must precede the unit on the wire.
        let mut pre: Vec<Bytes> = Vec::new();
        let commit_sent = unit
            .parts
            .iter()
            .flat_map(|a| &a.statements)
            .any(|s| matches!(s.tx, Some(TxEffect::Commit { .. })));
        if commit_sent {
            // resolve_lost_commits: the transaction-id probe goes first.
            self.watch_commit(node, unit, continuing, &mut pre);
        }
        let session_mode = self.mode == PoolMode::Session;
        let mut expect = VecDeque::new();
        let refused = if continuing {
            None
        } else {
            self.refuses_first_use(node, unit)
        };
        if session_mode {
            self.prepare_statements(node, unit, &mut pre, &mut expect);
            if continuing || refused.is_some() || !unit.synced || !unit.statement_undo.is_empty() {
                // A batch left open by a Flush: the replies still owed for its first part
                // come before those of what is put in front of this one. A Parse or
                // Close of a named statement: what it changed in the client's statements
                // is taken back if the server skips it. A refused first use: the refused
                // Parse's reply comes after those of the Closes ahead of it.
                let at = expect.len();
                expect.extend(super::unit::client_replies(
                    &unit.frames,
                    &unit.statement_undo,
                    unit.unnamed_first,
                ));
                if let Some(k) = refused {
                    let ahead = super::unit::messages(&unit.frames)
                        .take(k)
                        .filter(|m| m.first() != Some(&b'H'))
                        .count();
                    expect.insert(at + ahead, Expect::Hidden { record: None });
                }
            }
        }
        // Session effects of this unit, applied optimistically; the node that runs the
        // unit is then up to date with the session's settings.
        self.apply_session_effects(unit);
        for s in unit.parts.iter().flat_map(|a| &a.statements) {
            super::phase::follow_modes(&mut self.tx_modes, s);
        }
        self.track_sql_statements(node, unit);
        let autocommit = self.tx.is_idle()
            && !unit
                .parts
                .iter()
                .flat_map(|a| &a.statements)
                .any(|s| matches!(s.tx, Some(TxEffect::Begin(_))));
        if let Some(l) = self.backends[node].as_mut() {
            l.conn.settings = Some(self.state.settings().clone());
        }
        // Transaction mode: the unit's statements under the connection's names.
        // (A complete batch that names no statement goes as it is.)
        let rewritten = (!session_mode
            && !unit.simple
            && !unit.force_primary
            && (continuing || refused.is_some() || !super::rewrite::plain_unit(unit)))
        .then(|| self.rewrite_unit(node, unit, refused));
        let UnitWrites {
            writes,
            whole_db,
            elsewhere,
            ddl,
            schema_stamp,
            schema_change,
        } = self.unit_writes(unit, retryable);
        let probe = self.needs_position_probe(
            node,
            unit,
            continuing,
            autocommit,
            commit_sent,
            &writes,
            whole_db,
        );
        // A read on a standby while reads wait on replay positions: the standby's position
        // is asked for right after it (at most once per replay_check_period per standby).
        let sample = retryable
            && autocommit
            && self
                .replica_guard
                .as_ref()
                .is_some_and(|s| s.node() == node && s.take_replay_sample());
        // The rewritten messages as one frame (the buffer's own allocation, shared until
        // sent, then reused by the next unit's rewrite).
        let (one, rewrite_expect) = match rewritten {
            Some(mut r) => {
                let one = r.frames.split().freeze();
                self.rewrite_buf = r.frames;
                (Some([one]), Some(r.expect))
            }
            None => (None, None),
        };
        // Session mode: the refused Parse in front of the message it stands for (the
        // rewrite puts it there in transaction mode).
        let in_place = refused
            .filter(|_| session_mode)
            .map(|k| insert_before(&unit.frames, k, &REFUSED_PARSE));
        let frames = match (&one, &in_place) {
            (Some(o), _) => &o[..],
            (None, Some(f)) => &f[..],
            (None, None) => &unit.frames[..],
        };
        if pre.is_empty() && !probe && !sample {
            self.send_frames(node, frames)?;
        } else {
            // One write: what must precede the unit, the unit, the position probe or
            // replay sample that follows it.
            pre.extend(frames.iter().cloned());
            if probe {
                pre.push(POSITION_PROBE.clone());
            }
            if sample {
                pre.push(REPLAY_SAMPLE.clone());
            }
            self.send_frames(node, &pre)?;
        }
        // Session mode fills `expect`, transaction mode rewrites the unit: never both, so
        // the rewrite's queue is moved, not copied.
        drop(one);
        drop(in_place);
        let expect = rewrite_expect.unwrap_or(expect);
        Ok(Written {
            autocommit,
            commit_sent,
            writes,
            whole_db,
            elsewhere,
            ddl,
            schema_stamp,
            schema_change,
            probe,
            sample,
            expect,
        })
    }

    /// `bring_up_to_date` has something to send before `unit` on `node` (asked first, so
    /// the usual unit makes no future for it).
    fn behind(&self, node: usize, unit: &ClientUnit) -> bool {
        self.settings_stale(node)
            || self.tx.deferred().is_some()
            || !unit.sql_executes.is_empty()
            || !unit.unknown_statements.is_empty()
    }

    /// In a failed transaction PostgreSQL refuses (25P02) the first message of a batch
    /// that binds or describes a statement the client has (after any leading Closes,
    /// which complete: see [`first_use`]). Where `node`'s connection lacks that statement
    /// the server would answer 26000 instead: a Parse it refuses goes just ahead of that
    /// message ([`REFUSED_PARSE`], its error the client's). Returns that message's place
    /// in the batch. The statement is one the client PREPAREd (its PREPARE is refused
    /// there too, see `bring_up_to_date`), or in session mode one it made by Parse
    /// (transaction mode's rewrite prepares those in place, and the server refuses that
    /// Parse alike).
    fn refuses_first_use(&mut self, node: usize, unit: &ClientUnit) -> Option<usize> {
        if !matches!(self.tx, TxPhase::Failed) {
            return None;
        }
        let (texts, analyzer) = (&mut self.texts, &self.shared.analyzer);
        let (at, name) = first_use(&unit.frames, |sql| texts.exits_transaction(analyzer, sql))?;
        let name = std::str::from_utf8(name).ok()?;
        let start = at_start(unit, &self.state, name);
        if start.is_some_and(Prepared::exits_transaction) {
            // A ROLLBACK or COMMIT the client prepared runs (`prepare_statements` and
            // transaction mode's rewrite put it where the connection lacks it: the server
            // parses one in a failed transaction).
            return None;
        }
        let conn = &self.backends[node].as_ref()?.conn;
        let sql = self
            .state
            .sql_prepared
            .get(name)
            .or_else(|| closed_prepared(unit, name));
        let prepared = sql.is_some();
        // (A copy of another text, which `bring_up_to_date` closes, counts as lacking.)
        let lacks_prepared = sql.is_some_and(|(text, _)| {
            conn.sql_prepared.get(name).copied() != Some(text_hash(text.as_bytes()))
        });
        // Session mode: as the unit began (before its first Parse or Close of the name).
        let start = start.filter(|_| !prepared);
        let parsed = self.mode == PoolMode::Session && start.is_some();
        // (A name whose state there is unknown, or a copy that is not the client's
        // statement, which `prepare_statements` closes, counts as lacking: the server
        // refuses the message behind the refused Parse as it would refuse the message.)
        let lacks_parsed = parsed && conn.prepared.get(name).copied() != start.map(|p| p.hash);
        (lacks_prepared || lacks_parsed).then_some(at)
    }

    /// `node`'s connection lacks the session's settings (or there is none yet).
    pub(super) fn settings_stale(&self, node: usize) -> bool {
        self.backends[node].as_ref().is_none_or(|l| {
            super::state::needs_replay(l.conn.settings.as_ref(), self.state.settings())
        })
    }

    /// Before a unit's first message on `node`: the session's settings replayed where
    /// the connection lacks them, the deferred BEGIN, and the SQL-level prepared
    /// statements the unit executes (as PREPARE, after a DEALLOCATE of an older version).
    async fn bring_up_to_date(&mut self, node: usize, unit: &ClientUnit) -> Result<(), ProxyError> {
        if self.settings_stale(node) {
            self.replay_settings(node)?;
        }
        if let Some(begin) = self.tx.take_deferred() {
            for s in &begin.analysis.statements {
                super::phase::follow_modes(&mut self.tx_modes, s);
            }
            self.inject_query(node, &begin.sql)?;
        }
        for name in &unit.unknown_statements {
            self.drop_copy(node, name)?;
        }
        if matches!(self.tx, TxPhase::Failed) {
            // A PREPARE or Parse put here would be refused (25P02), and the connection's
            // record would count it; the client's EXECUTE is refused all the same. The
            // record catches up with the client's statements after the ROLLBACK. A copy
            // under the name that is not the client's statement is closed all the same (a
            // Close is not refused): a ROLLBACK the batch runs first would let the
            // EXECUTE run it.
            for s in &unit.sql_executes {
                if self.stale_copy(node, unit, s) {
                    self.drop_copy(node, &s.name)?;
                }
            }
            return Ok(());
        }
        for (i, NamedStatement { name, parsed }) in unit.sql_executes.iter().enumerate() {
            // (One the unit closes is the client's until then.)
            let Some((text, _)) = self
                .state
                .sql_prepared
                .get(name)
                .or_else(|| closed_prepared(unit, name))
                .cloned()
            else {
                // Parsed by the unit itself: transaction mode's rewrite puts it under the
                // client's name right after that Parse, and in session mode that Parse
                // makes it so (ahead of the batch it would be early, and its text may
                // not even parse).
                let in_place = super::unit::parsed_in(unit, &unit.sql_executes[i]);
                if let Some((parse, hash)) = parsed.as_ref().filter(|_| !in_place) {
                    self.put_protocol_statement(node, name, parse, *hash)?;
                }
                continue;
            };
            let hash = text_hash(text.as_bytes());
            let has = self.backends[node]
                .as_ref()
                .and_then(|l| l.conn.sql_prepared.get(name).copied());
            if has != Some(hash) {
                // Session mode: a statement made by Parse under the name may be there
                // too (one the client has since deallocated on another node): the
                // PREPARE would be refused, and the unit run that one.
                let parsed = self.backends[node]
                    .as_mut()
                    .is_some_and(|l| l.conn.prepared.remove(name).is_some());
                if has.is_some() || parsed {
                    self.inject_close(node, name)?;
                }
                self.stage_query(node, &text)?;
                self.inflight
                    .push_back(InFlight::injected(Injected::Statement(name.clone())));
                if let Some(l) = self.backends[node].as_mut() {
                    l.conn.sql_prepared.insert(name.clone(), hash);
                }
            }
        }
        Ok(())
    }

    /// `node`'s connection holds a statement under the name `s` runs that is not the
    /// client's statement of that name (one it has since closed, deallocated or parsed
    /// again, elsewhere).
    fn stale_copy(&self, node: usize, unit: &ClientUnit, s: &NamedStatement) -> bool {
        let Some(conn) = self.backends[node].as_ref().map(|l| &l.conn) else {
            return false;
        };
        let session = self.mode == PoolMode::Session;
        let name = s.name.as_str();
        let sql = self
            .state
            .sql_prepared
            .get(name)
            .or_else(|| closed_prepared(unit, name));
        match (sql, &s.parsed) {
            (Some((text, _)), _) => {
                let hash = text_hash(text.as_bytes());
                match conn.sql_prepared.get(name) {
                    Some(h) => *h != hash,
                    None => session && conn.prepared.contains_key(name),
                }
            }
            (None, Some((_, hash))) if session => {
                conn.sql_prepared.contains_key(name)
                    || conn
                        .prepared
                        .get(name)
                        .is_some_and(|h| h != hash && *h != super::state::UNKNOWN_STATEMENT)
            }
            (None, Some((_, hash))) => conn.sql_prepared.get(name).is_some_and(|h| h != hash),
            (None, None) => false,
        }
    }

    /// The unit EXECUTEs or PREPAREs `name`, one of the client's protocol-level
    /// statements, which the connection may lack under that name: in transaction mode it
    /// lives there under pgfresh's name, in session mode its Parse may have run on
    /// another node. It is parsed there under the client's own name first (the client's
    /// Parse, its replies swallowed), so that the EXECUTE runs it and the PREPARE is
    /// refused (42P05), as on the client's own connection. Transaction mode records it
    /// with the connection's SQL-level statements (dropped at check-in like one), session
    /// mode with its statements made by Parse, as a Bind's re-prepared statement. `parse`
    /// is the client's Parse of it as of the message that named it
    /// (`NamedStatement::parsed`).
    fn put_protocol_statement(
        &mut self,
        node: usize,
        name: &str,
        parse: &Bytes,
        hash: u64,
    ) -> Result<(), ProxyError> {
        let mode = self.mode;
        let has = self.backends[node]
            .as_mut()
            .and_then(|l| executed_copies(&mut l.conn, mode).get(name).copied());
        if has == Some(hash) {
            return Ok(());
        }
        // Session mode: a statement the client PREPAREd under the name and has since
        // closed or deallocated on another node may still be here (the Parse would be
        // refused, and the EXECUTE run it).
        let stale = self.mode == PoolMode::Session
            && !self.state.sql_prepared.contains_key(name)
            && self.backends[node]
                .as_mut()
                .is_some_and(|l| l.conn.sql_prepared.remove(name).is_some());
        if has.is_some() || stale {
            self.inject_close(node, name)?;
        }
        self.stage_frames(node, &[parse.clone(), build::sync()])?;
        self.inflight
            .push_back(InFlight::injected(Injected::Statement(name.to_string())));
        if let Some(l) = self.backends[node].as_mut() {
            executed_copies(&mut l.conn, mode).insert(name.to_string(), hash);
        }
        Ok(())
    }

    /// The client has no statement `name` (it was deallocated or closed on another
    /// connection, or closed after an EXECUTE parsed it under the client's name, see
    /// `put_protocol_statement`), so a copy `node`'s connection still holds under that
    /// name is deallocated before the unit runs it, and the server answers 26000 as
    /// PostgreSQL does.
    fn drop_copy(&mut self, node: usize, name: &str) -> Result<(), ProxyError> {
        // PREPAREd, or a copy the client's EXECUTE put here; session mode: or made by
        // Parse.
        let session = self.mode == PoolMode::Session;
        let held = self.backends[node].as_ref().is_some_and(|l| {
            l.conn.sql_prepared.contains_key(name)
                || (session && l.conn.prepared.contains_key(name))
        });
        if held {
            self.inject_close(node, name)?;
            if let Some(l) = self.backends[node].as_mut() {
                l.conn.sql_prepared.remove(name);
                if session {
                    l.conn.prepared.remove(name);
                }
            }
        }
        Ok(())
    }

    /// What `node`'s connection will hold once the unit's DISCARD ALL has run there
    /// (PREPARE and DEALLOCATE are followed when the server completes them, see
    /// `statements_completed`).
    fn track_sql_statements(&mut self, node: usize, unit: &ClientUnit) {
        let discards = unit
            .parts
            .iter()
            .flat_map(|a| &a.statements)
            .any(|s| matches!(s.session, Some(SessionEffect::Discard(DiscardKind::All))));
        if let Some(l) = self.backends[node].as_mut().filter(|_| discards) {
            // Every prepared statement on the connection goes, other clients'
            // (transaction mode) included.
            l.conn.statements.clear();
            l.conn.forget_prepared();
        }
    }

    /// The server completed a SQL PREPARE or DEALLOCATE on `node`: the client's
    /// statements and the connection's record follow it (see `StatementChange`).
    pub(super) fn statements_completed(&mut self, node: usize, change: StatementChange) {
        let conn = self.backends[node].as_mut().map(|l| &mut l.conn);
        match change {
            StatementChange::Prepare {
                name,
                text,
                analysis,
            } => {
                if let Some(c) = conn {
                    c.sql_prepared
                        .insert(name.clone(), text_hash(text.as_bytes()));
                }
                self.state.sql_prepared.insert(name, (text, analysis));
                self.state.sql_prepared_ever = true;
            }
            StatementChange::Deallocate(Some(name)) => {
                if let Some(c) = conn {
                    // A protocol-level statement of that name goes too (one namespace).
                    c.prepared.remove(name.as_str());
                    c.sql_prepared.remove(name.as_str());
                }
                self.state.sql_prepared.remove(&name);
                self.state.prepared.remove(&name);
            }
            StatementChange::Deallocate(None) => {
                if let Some(c) = conn {
                    // Every prepared statement on the connection goes, other clients'
                    // (transaction mode) included.
                    c.statements.clear();
                    c.forget_prepared();
                }
                // Protocol-level statements go too.
                self.state.sql_prepared.clear();
                self.state.prepared.clear();
            }
        }
    }

    /// Session mode: `prepare_statements` would put one of the client's statements on
    /// `node`'s connection ahead of `unit` (a Parse that the server refuses, in the
    /// client's name, where a batch ahead fails the transaction).
    pub(super) fn puts_statements(&self, node: usize, unit: &ClientUnit) -> bool {
        let Some(l) = self.backends[node].as_ref() else {
            return false;
        };
        let undone = unit.statement_undo.iter().map(|u| u.name.as_str());
        let mut touched = unit
            .uses_statements
            .iter()
            .map(String::as_str)
            .chain(undone);
        touched.any(|name| {
            let sql_held = self.state.sql_prepared_ever && l.conn.sql_prepared.contains_key(name);
            let prepared =
                self.state.sql_prepared.contains_key(name) || closed_prepared(unit, name).is_some();
            if prepared && sql_held {
                return false;
            }
            at_start(unit, &self.state, name)
                .is_some_and(|p| l.conn.prepared.get(name) != Some(&p.hash))
        })
    }

    /// Session mode: before `unit`, `node`'s connection is made to hold, for every
    /// statement name the unit binds, describes, parses or closes, exactly the client's
    /// statement of that name as it was when the unit began (a copy left from an older
    /// version or one the client closed is closed, a missing one parsed), so that the
    /// unit runs there as on the client's own connection: a Parse of a name the client
    /// has is refused (42P05), a Bind after the batch's own Close fails (26000). The
    /// messages go into `pre`, each reply swallowed (`expect`); the connection's record
    /// then follows the unit's own Parses and Closes.
    fn prepare_statements(
        &mut self,
        node: usize,
        unit: &ClientUnit,
        pre: &mut Vec<Bytes>,
        expect: &mut VecDeque<Expect>,
    ) {
        // In a failed transaction a Parse put here would be refused ahead of the client's
        // own messages: none is. Where the connection lacks the statement the first
        // refused message uses, a Parse the server refuses goes in front of that message
        // instead (`refuses_first_use`); any other stays as the connection holds it (the
        // first refusal skips what uses it) until the transaction ends.
        let failed = matches!(self.tx, TxPhase::Failed);
        let Some(l) = self.backends[node].as_mut() else {
            return;
        };
        if destroys_unnamed(pre) {
            // The probe, a simple Query, destroys the unnamed statement ahead of the
            // unit: a unit that binds it prepares it again after the probe.
            l.conn.prepared.remove("");
        }
        let undone = unit.statement_undo.iter().map(|u| u.name.as_str());
        let touched = unit
            .uses_statements
            .iter()
            .map(String::as_str)
            .chain(undone);
        for (i, name) in touched.clone().enumerate() {
            if touched.clone().take(i).any(|n| n == name) {
                continue;
            }
            // Only a client that has PREPAREd can have a SQL-level statement here.
            let sql_held = self.state.sql_prepared_ever && l.conn.sql_prepared.contains_key(name);
            let prepared =
                self.state.sql_prepared.contains_key(name) || closed_prepared(unit, name).is_some();
            if sql_held && !prepared {
                // A statement the client PREPAREd and has since deallocated (on another
                // connection) is still here under the name: closed first, a stale copy.
                l.conn.sql_prepared.remove(name);
                pre.push(build::close(b'S', name));
                expect.push_back(Expect::Hidden { record: None });
            }
            if prepared && sql_held {
                // What the connection holds under the name is the statement the client
                // PREPAREd: a record of one made by Parse there is stale (a Parse an
                // error skipped), and a Close of it would close the PREPAREd one (one
                // namespace for both).
                l.conn.prepared.remove(name);
                continue;
            }
            let start = at_start(unit, &self.state, name);
            let has = l.conn.prepared.get(name).copied();
            if has == start.map(|p| p.hash) {
                continue;
            }
            if failed && start.is_some_and(|p| !p.exits_transaction()) {
                // (A Close of a statement the client lacks is put here still: a Close is
                // never refused; and a ROLLBACK or COMMIT, whose Parse is not either.) A
                // copy that is not the client's statement is closed all the same: a
                // ROLLBACK the batch runs first would let a Bind run it. (One whose state
                // is unknown is the client's or none: an error skipped the Parse or Close
                // there as for the client.)
                if has.is_some_and(|h| h != super::state::UNKNOWN_STATEMENT) {
                    pre.push(build::close(b'S', name));
                    expect.push_back(Expect::Hidden { record: None });
                    l.conn.prepared.remove(name);
                }
                continue;
            }
            if !name.is_empty() || (start.is_none() && has.is_some()) {
                // (A Close of a statement the connection lacks does nothing: its record
                // may be behind after an error skipped the client's own Close.)
                pre.push(build::close(b'S', name));
                expect.push_back(Expect::Hidden { record: None });
            }
            match start {
                Some(p) => {
                    pre.push(p.parse.clone());
                    expect.push_back(Expect::Hidden {
                        record: Some(ConnRecord::Named {
                            name: name.to_string(),
                            previous: has,
                        }),
                    });
                    l.conn.prepared.insert(name.to_string(), p.hash);
                }
                None => {
                    l.conn.prepared.remove(name);
                }
            }
        }
        self.record_unit_statements(node, unit);
    }

    /// Session mode: `node`'s record of its statements after `unit`, as the client's
    /// statements are now (an error that skips its Parse or Close leaves the record
    /// behind; the next unit compares and mends it).
    pub(super) fn record_unit_statements(&mut self, node: usize, unit: &ClientUnit) {
        let Some(l) = self.backends[node].as_mut() else {
            return;
        };
        let parsed = unit.parses.iter().map(String::as_str);
        for name in parsed.chain(unit.statement_undo.iter().map(|u| u.name.as_str())) {
            if self.state.sql_prepared.contains_key(name) {
                // A name the client PREPAREd: the server refuses the Parse, and what the
                // connection holds under that name is the PREPAREd statement (under its
                // own record), which no later unit must close as a stale copy.
                continue;
            }
            match self.state.prepared.get(name) {
                // Most often the same statement again: one lookup, no new key.
                Some(p) => match l.conn.prepared.get_mut(name) {
                    Some(h) => *h = p.hash,
                    None => {
                        l.conn.prepared.insert(name.to_string(), p.hash);
                    }
                },
                None => {
                    l.conn.prepared.remove(name);
                }
            }
        }
    }

    /// Record what the replies to `unit`, just written to `node`, are for.
    fn track_unit(
        &mut self,
        node: usize,
        mut unit: Box<ClientUnit>,
        written: Written,
        continuing: bool,
        retryable: bool,
    ) {
        let Written {
            autocommit,
            commit_sent,
            writes,
            whole_db,
            elsewhere,
            ddl,
            schema_stamp,
            schema_change,
            probe,
            sample,
            expect,
        } = written;
        // (Kept by the session, not each unit in flight, which stays small: see
        // `Session::writes_elsewhere`.)
        if self.inflight.iter().all(InFlight::is_injected) {
            self.writes_elsewhere = false;
        }
        self.writes_elsewhere |= elsewhere;
        let synced = unit.synced;
        let owed = if self.wire.copy_in() {
            0
        } else {
            // A unit ends at its Sync or Query: it owes one or two (a continuation).
            u16::try_from(super::unit::ready_replies(&unit.frames)).unwrap_or(u16::MAX)
        };
        // Moved, not copied: a unit kept for a retry is a replica read, whose statements
        // change no settings; but a PREPARE among them changes the client's statements
        // when it completes, on whichever attempt that is.
        let events = if retryable && unit.events.iter().any(StmtEvent::changes_statements) {
            unit.events.clone()
        } else {
            std::mem::take(&mut unit.events)
        };
        let tx_control = unit.controls_transaction();
        let leftover = if continuing {
            if let Some(last) = self.inflight.back_mut() {
                last.tx_control |= tx_control;
                last.events.extend(events);
                last.writes.extend(writes);
                last.whole_db |= whole_db;
                last.ddl |= ddl;
                last.schema_stamp = super::oldest(last.schema_stamp, schema_stamp);
                if let Some(c) = schema_change {
                    last.schema_changes.push(c);
                }
                last.closed = unit.synced;
                last.commit_sent |= commit_sent;
                last.owed = last.owed.saturating_add(owed);
                last.expect.extend(expect);
            }
            Some(unit)
        } else {
            let simple = unit.simple || unit.force_primary;
            let skip_acks = unit.skip_acks;
            // An earlier attempt answered the Parse (the client has its ParseComplete).
            let unnamed_first = unit.unnamed_first && skip_acks == 0;
            let ready_hidden = unit.ready_hidden;
            // Kept (moved, not copied) so it can be sent again elsewhere.
            let (retry, leftover) = if retryable {
                (Some(unit), None)
            } else {
                (None, Some(unit))
            };
            // Every field given here (not a default then overwritten: each overwrite
            // dropped what it replaced).
            self.inflight.push_back(InFlight {
                injected: None,
                writes,
                autocommit,
                error: false,
                committed: false,
                ended_tx: false,
                tx_control,
                mark_at_ready: false,
                replied: false,
                closed: synced,
                commit_sent,
                owed,
                simple,
                retry,
                refused: None,
                unnamed_first,
                ready_hidden,
                plain: false,
                acks: 0,
                skip_acks,
                events: events.into(),
                whole_db,
                ddl,
                schema_stamp,
                schema_changes: schema_change.into(),
                expect,
            });
            leftover
        };
        // Replies made here that nothing ahead of them waits for go out now.
        if self
            .inflight
            .front()
            .is_some_and(|u| matches!(u.expect.front(), Some(Expect::Synth { .. })))
        {
            self.collect_due();
        }
        self.out.append(&mut self.due);
        if probe {
            // Sent with the unit, just after it.
            let probe = Injected::Position(Box::default());
            self.inflight.push_back(InFlight::injected(probe));
        }
        if sample {
            self.inflight
                .push_back(InFlight::injected(Injected::ReplaySample(None)));
        }
        self.wire.set_batch((!synced).then_some(node));
        if let Some(unit) = leftover {
            self.recycle_unit(unit);
        }
    }

    /// LSN routing: a committing unit on the primary is followed by a probe of the
    /// primary's WAL position, which resolves the unit's recency marks. Not after a COPY
    /// FROM (the server would read the probe as COPY data): those writes stay
    /// primary-only for the TTL.
    #[allow(clippy::too_many_arguments)]
    fn needs_position_probe(
        &mut self,
        node: usize,
        unit: &ClientUnit,
        continuing: bool,
        autocommit: bool,
        commit_sent: bool,
        writes: &[pgfresh_sql::RelName],
        whole_db: bool,
    ) -> bool {
        let copy_from = unit
            .parts
            .iter()
            .any(|a| a.must_primary.contains(&MustPrimary::CopyFrom));
        unit.synced
            && !copy_from
            && (self.config.routing.lsn_routing || self.tokens.track)
            && Some(node) == self.balancer.primary()
            && ((autocommit && (!writes.is_empty() || whole_db))
                || (commit_sent
                    && (!writes.is_empty()
                        || whole_db
                        || !self.tx_writes.writes.is_empty()
                        || self.tx_writes.whole_db
                        || self
                            .inflight
                            .iter()
                            .any(|u| !u.writes.is_empty() || u.whole_db)))
                // The Sync that closes a batch left open by a Flush commits the
                // autocommit write the batch ran.
                || (continuing
                    && self.inflight.back().is_some_and(|u| {
                        !u.is_injected() && u.autocommit && (!u.writes.is_empty() || u.whole_db)
                    })))
    }

    /// The relations a unit writes: those its statements name, and what the catalog
    /// says those writes and the functions it calls write behind them (triggers,
    /// cascades, partitions, function bodies). `whole_db` when something unanalysable
    /// may write anything in the database, or the graph may be out of date (see
    /// [`crate::schema_window`]). `replica_read`: an autocommit read the router sent to
    /// a standby, having found that nothing it runs or reads writes (`router::decide`
    /// asks the graph as below, and a standby writes nothing in any case).
    fn unit_writes(&mut self, unit: &ClientUnit, replica_read: bool) -> UnitWrites {
        let writes = unit.writes();
        // Built-ins fire nothing and write only what the analysis names: a read that calls
        // only those (`count(*)`, `now()`) needs no graph, learned or not.
        let calls = unit.parts.iter().any(|a| a.calls_user_functions);
        let flags = unit.flags();
        let (ddl, effect_ddl) = (flags.ddl, flags.effect_ddl);
        let mut out = UnitWrites {
            writes,
            // TRUNCATE … CASCADE empties every table with a foreign key to these; a DO
            // block or COMMIT PREPARED may write anything, and so may a FunctionCall
            // message (libpq's `lo_write`, `lo_creat` ..., or any function by its oid).
            whole_db: flags.writes_unnamed || unit.force_primary,
            elsewhere: flags.writes_elsewhere,
            ddl,
            schema_stamp: None,
            schema_change: None,
        };
        if out.writes.is_empty() && !calls && !ddl && !flags.event_ddl {
            let writes_behind = !replica_read && self.read_writes_behind(unit);
            if !writes_behind {
                return out;
            }
        }
        self.refresh_graph();
        let graph = &self.graph;
        if let Some(window) = self.shared.deps.window(&self.deps_entry) {
            // A schema change that moves effects makes what was written before it reach
            // further; while one is open or not yet learned, the graph may miss what this
            // write fires.
            out.schema_stamp = window.stamp();
            out.whole_db |= out.schema_stamp.is_none() || effect_ddl;
            if effect_ddl {
                out.schema_change = self.shared.deps.begin_change(&self.deps_entry);
            }
        }
        if let Some(g) = graph.as_ref().filter(|g| !g.is_empty()) {
            let whole = expand(g, unit, flags.event_ddl, &mut out.writes);
            out.whole_db |= whole;
            out.elsewhere |= whole && g.may_write_elsewhere();
        }
        out
    }

    /// A read that calls no user function writes nonetheless: an operator or cast it
    /// applies runs a user function that writes (only then does the graph know a node of
    /// its name), or what it reads runs one (a view's query, a row-security policy).
    pub(super) fn read_writes_behind(&mut self, unit: &ClientUnit) -> bool {
        self.refresh_graph();
        self.graph.as_ref().is_some_and(|g| {
            (!g.everywhere_calls().is_empty() && g.calls_writer(g.everywhere_calls()))
                || unit.parts.iter().any(|a| {
                    (!a.implicit_calls.is_empty() && g.calls_writer(&a.implicit_calls))
                        || g.reads_write(&a.reads)
                })
        })
    }

    fn apply_session_effects(&mut self, unit: &ClientUnit) {
        for a in &unit.parts {
            for s in &a.statements {
                if s.must_primary.iter().any(|m| {
                    matches!(
                        m,
                        MustPrimary::AdvisoryLock {
                            session_level: true
                        }
                    )
                }) {
                    self.state.pins.insert(PinReason::AdvisoryLock);
                }
                let Some(effect) = &s.session else { continue };
                // (PREPARE and DEALLOCATE count once the server completes them, see
                // `statements_completed`.)
                match effect {
                    SessionEffect::Discard(kind) => match kind {
                        DiscardKind::All => {
                            // Settings are reset when the server confirms (settings.rs).
                            self.state.prepared.clear();
                            self.state.sql_prepared.clear();
                            self.state.close_cursor(None);
                            let route = self.state.pins.contains(&PinReason::RouteSetting);
                            self.state.pins.clear();
                            if route {
                                self.state.pins.insert(PinReason::RouteSetting);
                            }
                        }
                        DiscardKind::Temp => {
                            self.state.pins.remove(&PinReason::TempTable);
                        }
                        DiscardKind::Plans | DiscardKind::Sequences => {}
                    },
                    SessionEffect::SetConfig { .. } | SessionEffect::SetConfigs(_)
                        if sets_unreadable(effect) =>
                    {
                        // set_config with a value pgfresh cannot see: the setting cannot be
                        // replayed elsewhere, so the session stays where it is confirmed.
                        self.state.pins.insert(PinReason::UnknownSetting);
                    }
                    SessionEffect::Listen(_) => {
                        self.state.pins.insert(PinReason::Listen);
                    }
                    SessionEffect::Unlisten(None) => {
                        self.state.pins.remove(&PinReason::Listen);
                    }
                    SessionEffect::CreateTemp(_) => {
                        self.state.pins.insert(PinReason::TempTable);
                    }
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_destroys_the_unnamed_statement_until_it_is_parsed_again() {
        let q = || build::query("SELECT 1");
        let unnamed = || build::parse("", "SELECT $1", &[]);
        let named = || build::parse("s1", "SELECT $1", &[]);
        let bind = || build::bind("", "", &[], &[], &[]);
        let sync = build::sync;
        let cases = [
            (vec![], false),
            (vec![unnamed(), bind(), sync()], false),
            (vec![q()], true),
            (vec![unnamed(), bind(), sync(), q()], true),
            (vec![q(), unnamed(), bind(), sync()], false),
            (vec![q(), named(), sync()], true),
            (vec![bind(), sync(), q(), unnamed(), q()], true),
            // A batch taken whole as one chunk.
            (
                vec![q(), [unnamed(), bind(), sync()].concat().into()],
                false,
            ),
        ];
        for (i, (frames, gone)) in cases.into_iter().enumerate() {
            assert_eq!(destroys_unnamed(&frames), gone, "case {i}");
        }
    }

    #[test]
    fn the_first_use_passes_over_closes_and_flushes() {
        let bind = |s: &str| build::bind("", s, &[], &[], &[]);
        let close = |s: &str| build::close(b'S', s);
        let describe = |s: &str| build::describe(b'S', s);
        type Case = (Vec<Bytes>, Option<(usize, &'static [u8])>);
        let cases: [Case; 9] = [
            (vec![bind("a"), build::sync()], Some((0, b"a"))),
            (vec![close(""), bind("a"), build::sync()], Some((1, b"a"))),
            (
                vec![close("b"), build::flush(), describe("a")],
                Some((2, b"a")),
            ),
            // The Close drops the statement: PostgreSQL answers 26000 as the server does.
            (vec![close("a"), bind("a"), build::sync()], None),
            (vec![close(""), bind(""), build::sync()], None),
            (vec![build::parse("a", "SELECT 1", &[]), bind("a")], None),
            (vec![build::sync()], None),
            // A Parse of a ROLLBACK completes in a failed transaction: what follows is
            // refused, but for a Bind of the statement it made.
            (
                vec![build::parse("", "ROLLBACK TO s", &[]), bind("a")],
                Some((1, b"a")),
            ),
            (vec![build::parse("r", "ROLLBACK", &[]), bind("r")], None),
        ];
        for (i, (frames, want)) in cases.into_iter().enumerate() {
            let exits = |sql: &[u8]| sql.starts_with(b"ROLLBACK");
            assert_eq!(first_use(&frames, exits), want, "case {i}");
        }
    }

    #[test]
    fn a_message_goes_in_front_of_the_one_at_its_place() {
        let mark = build::query("SELECT 'mark'");
        let (c, b, s) = (
            build::close(b'S', ""),
            build::bind("", "a", &[], &[], &[]),
            build::sync(),
        );
        let one = |f: &[Bytes]| f.concat();
        // One message a frame, and the same batch as one chunk: cut where it goes.
        for frames in [
            vec![c.clone(), b.clone(), s.clone()],
            vec![one(&[c.clone(), b.clone(), s.clone()]).into()],
        ] {
            for at in 0..=3 {
                let mut want = vec![c.clone(), b.clone(), s.clone()];
                want.insert(at, mark.clone());
                assert_eq!(
                    insert_before(&frames, at, &mark).concat(),
                    want.concat(),
                    "at {at}"
                );
            }
        }
    }
}
