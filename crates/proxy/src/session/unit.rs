//! Units of work and the replies a backend still owes for them.
//!
//! A unit is a simple-query string, an extended-query batch up to Sync, or a query
//! pgfresh injects itself (replaying settings, re-preparing a statement). Every unit
//! sent to a backend is queued here until its ReadyForQuery arrives, so the session
//! always knows whether a backend is idle, and which replies belong to whom.

use std::sync::Arc;

use bytes::Bytes;
use pgfresh_sql::{Analysis, RelName};

use super::settings::StmtEvent;

/// A statement a unit runs by its name (`ClientUnit::sql_executes`).
#[derive(Clone, Debug)]
pub struct NamedStatement {
    pub name: String,
    /// The Parse that made the client's protocol-level statement of that name, and its
    /// hash, as of the message that names it: a Close or Parse later in the same batch
    /// is read before the batch is sent, and must not change what this one runs.
    pub parsed: Option<(Bytes, u64)>,
}

impl NamedStatement {
    /// A SQL-level statement `name` (the client's PREPARE of it is what runs).
    pub fn sql(name: &str) -> Self {
        Self {
            name: name.to_string(),
            parsed: None,
        }
    }

    /// `name`, with the client's protocol-level statement of that name now, if any.
    pub fn of(state: &super::state::SessionState, name: &str) -> Self {
        Self {
            name: name.to_string(),
            parsed: state.prepared.get(name).map(|p| (p.parse.clone(), p.hash)),
        }
    }

    /// The hash of the statement this one runs if `parse`, a Parse of `frames`, made
    /// it (the very message, not one alike: a batch that parses the name and then
    /// EXECUTEs it).
    pub fn made_by(&self, parse: &Bytes) -> Option<u64> {
        self.parsed
            .as_ref()
            .filter(|(p, _)| p.as_ptr() == parse.as_ptr() && p.len() == parse.len())
            .map(|(_, hash)| *hash)
    }
}

/// Whether `unit` itself parses the statement `e` runs: transaction mode prepares it
/// under the client's name right after that Parse (`Session::rewrite_unit`), not ahead
/// of the batch, where messages in front of the Parse would find it.
pub fn parsed_in(unit: &ClientUnit, e: &NamedStatement) -> bool {
    unit.frames.iter().any(|f| e.made_by(f).is_some())
}

/// A unit read from the client and waiting to be routed.
#[derive(Clone, Debug)]
pub struct ClientUnit {
    /// The client's frames, in order. A frame is one message, or the whole of a usual
    /// one-statement batch taken as one chunk (see [`messages`]).
    pub frames: Vec<Bytes>,
    /// The analyses that decide where it runs.
    pub parts: Vec<Arc<Analysis>>,
    /// Ends with Sync or is a simple Query/FunctionCall: a ReadyForQuery will answer it.
    pub synced: bool,
    /// Bind/Describe of named statements, which must exist on the target node.
    pub uses_statements: Vec<String>,
    /// Parse messages in this unit (statement names).
    pub parses: Vec<String>,
    /// Statements the unit runs by name, which must exist on the connection under that
    /// name (SQL `EXECUTE`, DEALLOCATE or a Bind of a SQL-level statement, a PREPARE of
    /// a protocol-level statement's name), with the client's protocol-level statement of
    /// that name as it was when the unit was read.
    pub sql_executes: Vec<NamedStatement>,
    /// Names the unit EXECUTEs or binds of which the client had no statement when it was
    /// read: a copy a connection still holds under that name (session mode: the client
    /// dropped it on another connection; either mode: an EXECUTE parsed it there before
    /// the client closed it) is dropped there first, so that the server answers 26000.
    pub unknown_statements: Vec<String>,
    /// A simple Query unit (its one frame is the Query; see `simple_sql`).
    pub simple: bool,
    /// CopyData/CopyDone/CopyFail: forwarded to the active backend as they come.
    pub passthrough: bool,
    /// Must run on the primary whatever its analysis says (FunctionCall).
    pub force_primary: bool,
    /// A standby refused this read with an error the primary would not give (see
    /// [`Refusal`]): it runs on the primary.
    pub refused_by_standby: bool,
    /// Times this unit was sent again after the replica running it failed.
    pub retries: u32,
    /// A node that failed while running this unit: not chosen again for it.
    pub avoid: Option<usize>,
    /// Waiting for a failover to name a primary that takes connections: until when.
    pub failover_deadline: Option<std::time::Instant>,
    /// Acknowledgements the client already received from an earlier attempt.
    pub skip_acks: u32,
    /// One event per statement the server will complete, in order (settings).
    pub events: Vec<StmtEvent>,
    /// Transaction mode: for each Bind and each Describe of a statement, in order, the
    /// content of the client's statement it names as of that message (`None` when the
    /// client has no statement by that name); of the unnamed statement only where the
    /// batch has not parsed it.
    pub statement_refs: Vec<Option<Bytes>>,
    /// For each Parse and Close of a named statement, in order, what it changed in the
    /// client's statements (taken back if the server skips or refuses the message).
    pub statement_undo: Vec<Undo>,
    /// The unit's first message parses the unnamed statement and continues no batch: it
    /// is never skipped, so it has no entry in `statement_undo`; refused, it leaves no
    /// unnamed statement (see `InFlight::unnamed_first`).
    pub unnamed_first: bool,
    /// The first part of a Query pgfresh sent as two (`Session::take_split_query`): its
    /// ReadyForQuery is not the client's, the second part's is.
    pub ready_hidden: bool,
    /// A simple Query of one plain read ([`super::fast::plain_read`]): outside a
    /// transaction, with nothing else in flight, it goes out without the general send's
    /// bookkeeping (`Session::send_read`).
    pub plain_read: bool,
}

impl Default for ClientUnit {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientUnit {
    pub fn new() -> Self {
        // An extended-protocol batch is usually five frames (Parse, Bind, Describe,
        // Execute, Sync): one allocation instead of a first one and a regrowth.
        Self {
            frames: Vec::with_capacity(8),
            parts: Vec::new(),
            synced: false,
            uses_statements: Vec::new(),
            parses: Vec::new(),
            sql_executes: Vec::new(),
            unknown_statements: Vec::new(),
            simple: false,
            passthrough: false,
            force_primary: false,
            refused_by_standby: false,
            retries: 0,
            avoid: None,
            failover_deadline: None,
            skip_acks: 0,
            events: Vec::new(),
            statement_refs: Vec::new(),
            statement_undo: Vec::new(),
            unnamed_first: false,
            ready_hidden: false,
            plain_read: false,
        }
    }

    /// A statement of the unit begins, ends or sets up a transaction (BEGIN, COMMIT,
    /// ROLLBACK, SAVEPOINT, SET TRANSACTION, ...).
    pub fn controls_transaction(&self) -> bool {
        self.parts
            .iter()
            .flat_map(|a| &a.statements)
            .any(|s| s.tx.is_some())
    }

    /// The SQL of a simple Query unit, read back from its frame (checked as UTF-8 when
    /// it arrived; kept as the frame only, so a statement costs no copy of its text).
    pub fn simple_sql(&self) -> Option<&str> {
        if !self.simple {
            return None;
        }
        let body = self.frames.first()?.get(5..)?;
        let end = memchr::memchr(0, body)?;
        std::str::from_utf8(&body[..end]).ok()
    }

    /// Clears the unit for the next batch, keeping its vectors' capacity (a session
    /// reuses its units instead of allocating a few vectors a statement).
    pub fn recycle(&mut self) {
        // Every field named: a new one cannot be forgotten here.
        let Self {
            frames,
            parts,
            synced,
            uses_statements,
            parses,
            sql_executes,
            unknown_statements,
            simple,
            passthrough,
            force_primary,
            refused_by_standby,
            retries,
            avoid,
            failover_deadline,
            skip_acks,
            events,
            statement_refs,
            statement_undo,
            unnamed_first,
            ready_hidden,
            plain_read,
        } = self;
        frames.clear();
        parts.clear();
        *synced = false;
        uses_statements.clear();
        parses.clear();
        sql_executes.clear();
        unknown_statements.clear();
        *simple = false;
        *passthrough = false;
        *force_primary = false;
        *refused_by_standby = false;
        *retries = 0;
        *avoid = None;
        *failover_deadline = None;
        *skip_acks = 0;
        events.clear();
        statement_refs.clear();
        statement_undo.clear();
        *unnamed_first = false;
        *ready_hidden = false;
        *plain_read = false;
    }

    /// The most items any of the unit's vectors has room for.
    pub fn capacity(&self) -> usize {
        [
            self.frames.capacity(),
            self.parts.capacity(),
            self.uses_statements.capacity(),
            self.parses.capacity(),
            self.sql_executes.capacity(),
            self.events.capacity(),
            self.statement_refs.capacity(),
            self.statement_undo.capacity(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }

    pub fn bytes(&self) -> usize {
        self.frames.iter().map(Bytes::len).sum()
    }

    /// What the unit's statements say about writes beyond their text, in one pass (each
    /// statement counts: a string mixing DDL and writes is a write as a whole).
    pub fn flags(&self) -> UnitFlags {
        let mut f = UnitFlags::default();
        for s in self.parts.iter().flat_map(|a| &a.statements) {
            f.ddl |= s.kind == pgfresh_sql::Kind::Ddl || s.changes_effects;
            f.effect_ddl |= s.changes_effects;
            f.writes_unnamed |= s.writes_unnamed;
            f.writes_elsewhere |= s.writes_elsewhere;
            f.event_ddl |= s.fires_event_triggers;
        }
        f
    }

    pub fn writes(&self) -> Vec<RelName> {
        let mut w: Vec<RelName> = self
            .parts
            .iter()
            .flat_map(|a| a.writes.iter().cloned())
            .collect();
        w.sort();
        w.dedup();
        w
    }
}

/// The messages in `frames`, in order. A frame is one message, or a whole batch taken
/// as one chunk (see `client_side::take_unnamed_batch`); its lengths were checked when it
/// was read.
pub fn messages(frames: &[Bytes]) -> impl Iterator<Item = &[u8]> {
    frames.iter().flat_map(|f| {
        let mut rest: &[u8] = f;
        std::iter::from_fn(move || {
            let len = u32::from_be_bytes(rest.get(1..5)?.try_into().ok()?) as usize;
            let (msg, tail) = rest.split_at_checked(1 + len)?;
            rest = tail;
            Some(msg)
        })
    })
}

/// ReadyForQuery replies the server owes for `frames`: one per Query, Sync and
/// FunctionCall.
pub fn ready_replies(frames: &[Bytes]) -> u32 {
    messages(frames)
        .filter(|m| matches!(m.first(), Some(b'Q' | b'S' | b'F')))
        .count() as u32
}

/// The replies the client's own messages in `frames` get, one entry each, in order
/// (none for a Flush). Each Parse and Close of a statement carries the next of `undo`,
/// what it changed in the client's statements (`ClientUnit::statement_undo`, in the same
/// order), taken back if the server skips or refuses it; but a leading Parse of the
/// unnamed statement (`unnamed_first`) has none.
pub fn client_replies<'a>(
    frames: &'a [Bytes],
    undo: &'a [Undo],
    unnamed_first: bool,
) -> impl Iterator<Item = Expect> + 'a {
    let mut undo = undo.iter().cloned().map(Box::new);
    messages(frames).enumerate().filter_map(move |(i, m)| {
        // The name's first byte: Parse has the name first, Close its kind then the name.
        let named = |at: usize| m.get(at).is_some_and(|b| *b != 0);
        match m.first() {
            Some(b'P') if !(named(5) || (i == 0 && unnamed_first)) => Some(Expect::Client {
                parse: None,
                sync: false,
                undo: undo.next(),
            }),
            Some(b'H') => None,
            Some(b'S') => Some(Expect::Client {
                parse: None,
                sync: true,
                undo: None,
            }),
            Some(b'P') if named(5) => Some(Expect::Client {
                parse: None,
                sync: false,
                undo: undo.next(),
            }),
            Some(b'C') if m.get(5) == Some(&b'S') => Some(Expect::Client {
                parse: None,
                sync: false,
                undo: undo.next(),
            }),
            _ => Some(Expect::client()),
        }
    })
}

/// A unit on its way through a backend: what to do with its replies.
#[derive(Debug)]
pub struct InFlight {
    /// Injected by pgfresh (its replies are not the client's and are swallowed), and
    /// what for; `None` for the client's own unit.
    pub injected: Option<Injected>,
    /// Relations the unit writes.
    pub writes: Vec<RelName>,
    /// Ran outside an explicit transaction: its writes are committed when its
    /// statement completes.
    pub autocommit: bool,
    /// Saw an ErrorResponse.
    pub error: bool,
    /// Saw CommandComplete "COMMIT".
    pub committed: bool,
    /// The last statement the unit completed ended a transaction (COMMIT, ROLLBACK and
    /// their AND CHAIN forms): a ReadyForQuery still in a transaction after it means AND
    /// CHAIN began the next one.
    pub ended_tx: bool,
    /// A statement of the unit begins, ends or sets up a transaction: the units behind
    /// it wait for its ReadyForQuery (see `Session::waits_for_transaction_state`).
    pub tx_control: bool,
    /// An autocommit write marked before the Sync that commits it was sent (a batch left
    /// open by a Flush): marked again at its ReadyForQuery, with the commit's position.
    pub mark_at_ready: bool,
    /// Rows or other replies already reached the client (retry is no longer possible).
    pub replied: bool,
    /// The Sync for this unit has been sent (extended batches can stay open over Flush).
    pub closed: bool,
    /// The unit ends a transaction with COMMIT: a lost connection leaves its outcome unknown.
    pub commit_sent: bool,
    /// ReadyForQuery messages the server still owes for this unit (one per Query,
    /// Sync or FunctionCall sent, except Syncs the server ignores during COPY IN).
    pub owed: u16,
    /// A simple Query unit (COPY in simple mode needs no Sync).
    pub simple: bool,
    /// For an autocommit read sent to a replica: the unit itself, so it can be sent
    /// to another node if the replica fails before any reply reached the client.
    pub retry: Option<Box<ClientUnit>>,
    /// The replica refused the read before any reply reached the client; the error was
    /// kept from the client (its frame is here, for the client after all should the
    /// read turn out not to be sendable again), and the read goes elsewhere at the
    /// unit's ReadyForQuery. (Boxed: rare, and the entry stays small, see the test
    /// `a_unit_in_flight_stays_small`.)
    pub refused: Option<Box<Refused>>,
    /// The unit's first message parses the unnamed statement (`ClientUnit::unnamed_first`)
    /// and no earlier attempt answered it: an error before any acknowledgement is that
    /// Parse's, and PostgreSQL then has no unnamed statement.
    pub unnamed_first: bool,
    /// Its ReadyForQuery is swallowed (`ClientUnit::ready_hidden`).
    pub ready_hidden: bool,
    /// The client's plain read (`Session::send_read`): its CommandComplete is only
    /// counted, and its ReadyForQuery, when nothing went otherwise, ends it without the
    /// general bookkeeping (`Session::plain_read_ready`).
    pub plain: bool,
    /// Acknowledgements forwarded to the client for this unit, and how many of the
    /// next ones to swallow (already forwarded by an earlier attempt).
    pub acks: u32,
    pub skip_acks: u32,
    /// Settings events still to be matched with the server's CommandCompletes.
    pub events: std::collections::VecDeque<StmtEvent>,
    /// Something the unit runs may write anything in the database (an unanalysable
    /// function body): the whole database is marked when it commits.
    pub whole_db: bool,
    /// The unit runs DDL: the database's dependency graph is reloaded once it commits.
    pub ddl: bool,
    /// The schema window's stamp taken when the unit's writes were analysed (None: no
    /// window, or it was open and the unit marks the whole database already).
    pub schema_stamp: Option<crate::schema_window::Stamp>,
    /// Effect-changing schema changes the unit sent, ended when its transaction ends.
    pub schema_changes: crate::schema_window::SchemaChanges,
    /// The replies expected for an extended unit, in order; past the last entry every
    /// reply is forwarded (see [`Expect`]).
    pub expect: std::collections::VecDeque<Expect>,
}

/// What one expected server reply of an extended unit is for, in the order the replies
/// come (one per Parse, Bind, Describe, Execute, Close and Sync): forwarded, swallowed or
/// made here. A unit's queue may stop short of its last replies: past its last entry
/// every reply is forwarded. A complete batch with nothing added has no entries (its
/// replies are only counted, `relay::PlainReplies`); one with statements prepared again
/// in front of it has just theirs; a batch left open by a Flush, and its continuations,
/// have one for every message, so that what pgfresh adds to a continuation is matched
/// after the replies still owed for the part before it; transaction mode describes every
/// unit it rewrites.
#[derive(Debug)]
pub enum Expect {
    /// A reply to the client's message: forwarded. `parse` is the cache key of a Parse
    /// sent under pgfresh's name, dropped from the connection's cache if the server
    /// does not prepare it; `sync` marks a Sync (errors skip to it).
    Client {
        parse: Option<Bytes>,
        sync: bool,
        undo: Option<Box<Undo>>,
    },
    /// A reply to a message pgfresh added (a statement prepared again on this
    /// connection, a least recently used one closed, a statement closed before the
    /// client parses its name again): swallowed. `record` is what the message changed in
    /// the connection's record of its statements, taken back if the server skips or
    /// refuses it.
    Hidden { record: Option<ConnRecord> },
    /// A client message pgfresh answered itself (Parse of a statement the connection
    /// already has, Close of a statement): this reply reaches the client in its turn.
    Synth {
        reply: Bytes,
        undo: Option<Box<Undo>>,
    },
}

/// A standby's error that another node would not give, for a read that can still be
/// sent again (nothing of it reached the client): by its SQLSTATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// What no standby runs: `25006` (a write, `nextval()`, in the read-only transaction
    /// of a standby), `0A000` (serializable mode, unlogged or temporary tables during
    /// recovery), `55000` (WAL control functions during recovery). The primary runs it.
    Recovery,
    /// A recovery conflict cancelled it (`40001`, or `40P01` for a buffer-pin deadlock
    /// with the startup process): another node runs it, as after a replica failure.
    Conflict,
}

impl Refusal {
    /// The refusal an ErrorResponse with SQLSTATE `code` from a standby stands for.
    pub fn of(code: &str) -> Option<Self> {
        use pgfresh_wire::sqlstate as s;
        match code {
            s::READ_ONLY_SQL_TRANSACTION
            | s::FEATURE_NOT_SUPPORTED
            | s::OBJECT_NOT_IN_PREREQUISITE_STATE => Some(Refusal::Recovery),
            s::SERIALIZATION_FAILURE | s::DEADLOCK_DETECTED => Some(Refusal::Conflict),
            _ => None,
        }
    }
}

/// A read a standby refused, kept from the client until it is sent again.
#[derive(Debug)]
pub struct Refused {
    pub refusal: Refusal,
    /// The standby's ErrorResponse, for the client should the read not go again.
    pub error: Bytes,
    /// What the refusal skipped of the client's Parses and Closes: taken back only if the
    /// read is not sent again (sent again, they run there).
    pub undo: Vec<Undo>,
}

/// What a message pgfresh adds to a unit changed in the connection's record of its
/// statements.
#[derive(Debug)]
pub enum ConnRecord {
    /// Transaction mode: a statement prepared under pgfresh's name, by its cache key.
    Prepared(Bytes),
    /// Transaction mode: a least recently used statement closed, by its id and content
    /// (still on the connection if the Close is skipped).
    Evicted { id: u64, content: Bytes },
    /// Session mode: a statement prepared under the client's name
    /// (`ServerConn::prepared`), with the version the connection held before (`None`: it
    /// had none), which it still holds if the Parse is skipped.
    Named { name: String, previous: Option<u64> },
    /// Transaction mode: a statement the batch parses and EXECUTEs, parsed under the
    /// client's name too (`ServerConn::sql_prepared`), with the version held before.
    Sql { name: String, previous: Option<u64> },
}

/// What a client's Parse or Close changed in its statements, taken back if the server
/// skips the message (an earlier error in the batch) or fails it.
#[derive(Debug, Clone)]
pub struct Undo {
    pub name: String,
    pub previous: Option<super::state::Prepared>,
    /// A Close of a statement the client PREPAREd (one namespace for both): its text and
    /// analysis, as `SessionState::sql_prepared` held them.
    pub sql: Option<(String, std::sync::Arc<pgfresh_sql::Analysis>)>,
}

impl Expect {
    pub fn is_sync(&self) -> bool {
        matches!(self, Expect::Client { sync: true, .. })
    }

    /// A Parse or Close of the client's whose change to the client's statements an error
    /// before it would take back.
    pub fn may_undo(&self) -> bool {
        matches!(
            self,
            Expect::Client { undo: Some(_), .. } | Expect::Synth { undo: Some(_), .. }
        )
    }

    /// Transaction mode: the message prepares or closes a statement under pgfresh's
    /// name, and the connection's record already counts it done (an error before it
    /// would undo that).
    pub fn changes_server_statements(&self) -> bool {
        matches!(
            self,
            Expect::Client { parse: Some(_), .. }
                | Expect::Hidden {
                    record: Some(
                        ConnRecord::Prepared(_)
                            | ConnRecord::Evicted { .. }
                            | ConnRecord::Named { .. }
                            | ConnRecord::Sql { .. }
                    )
                }
        )
    }

    pub fn client() -> Self {
        Expect::Client {
            parse: None,
            sync: false,
            undo: None,
        }
    }
}

/// The marks waiting for a position probe, and the position once read.
#[derive(Debug, Default)]
pub struct Probe {
    /// What the commit before the probe wrote, marked once the probe answers.
    pub marks: DeferredMarks,
    pub lsn: Option<pgfresh_lsn::Lsn>,
    /// Report the position to the client (`pgfresh.track_commit_lsn`).
    pub report: bool,
}

/// What pgfresh injected a unit for.
#[derive(Debug)]
pub enum Injected {
    /// A query whose answer nothing needs (a deferred BEGIN, a statement prepared again).
    Plain,
    /// A replay of one of the session's settings: if it fails, the connection is not up
    /// to date.
    Setting,
    /// A statement of the client's put on the connection under its name (its PREPARE
    /// again, or its Parse for an EXECUTE): if the server refuses it (a transaction a
    /// unit ahead failed), the connection holds nothing under that name.
    Statement(String),
    /// `SELECT txid_current_if_assigned()` ahead of a COMMIT (`resolve_lost_commits`, see
    /// `lost_commit`).
    XidProbe,
    /// `SELECT pg_catalog.pg_current_wal_insert_lsn()` right after a committing unit: the position
    /// it returns is at or past that commit, and resolves the unit's marks. (Boxed: every
    /// entry in flight would otherwise carry the marks' room, and be moved with it.)
    Position(Box<Probe>),
    /// `SELECT pg_catalog.pg_last_wal_replay_lsn()` right after a read on a standby: the
    /// standby's replay position, for the balancer (see `pgfresh_balancer::live`).
    ReplaySample(Option<pgfresh_lsn::Lsn>),
    /// `CHAIN_MODES_SQL` in the transaction an AND CHAIN began on a standby, before it is
    /// rolled back there: the characteristics it has, which the client's chained
    /// transaction keeps wherever it starts (see `Session::chain_anew`).
    ChainModes(Option<pgfresh_sql::TxModes>),
}

impl InFlight {
    /// A unit pgfresh injected for `what`.
    pub fn injected(what: Injected) -> Self {
        Self {
            injected: Some(what),
            writes: Vec::new(),
            autocommit: false,
            error: false,
            committed: false,
            ended_tx: false,
            tx_control: false,
            mark_at_ready: false,
            replied: false,
            closed: true,
            commit_sent: false,
            owed: 1,
            simple: true,
            retry: None,
            refused: None,
            unnamed_first: false,
            ready_hidden: false,
            plain: false,
            acks: 0,
            skip_acks: 0,
            events: std::collections::VecDeque::new(),
            whole_db: false,
            ddl: false,
            schema_stamp: None,
            schema_changes: Default::default(),
            expect: std::collections::VecDeque::new(),
        }
    }

    /// The client's plain read (`Session::send_read`), a simple Query or a batch whose
    /// first message parses the unnamed statement (`unnamed_first`), kept for a `retry`
    /// on a standby: what `Session::track_unit` records for such a unit.
    pub fn plain_read(simple: bool, unnamed_first: bool, retry: Option<Box<ClientUnit>>) -> Self {
        Self {
            injected: None,
            autocommit: true,
            simple,
            unnamed_first,
            retry,
            plain: true,
            ..Self::injected(Injected::Plain)
        }
    }

    /// pgfresh's own work, not the client's.
    pub fn is_injected(&self) -> bool {
        self.injected.is_some()
    }

    /// The position probe's state, when this is one.
    pub fn probe(&self) -> Option<&Probe> {
        match &self.injected {
            Some(Injected::Position(p)) => Some(p.as_ref()),
            _ => None,
        }
    }

    pub fn probe_mut(&mut self) -> Option<&mut Probe> {
        match &mut self.injected {
            Some(Injected::Position(p)) => Some(p.as_mut()),
            _ => None,
        }
    }
}

/// What a unit's statements say beyond the relations they name ([`ClientUnit::flags`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnitFlags {
    /// A statement is DDL: the dependency graph is reloaded once it commits.
    pub ddl: bool,
    /// A statement changes what other statements touch behind their text
    /// (`Statement::changes_effects`): the learned graph is out of date until reloaded.
    pub effect_ddl: bool,
    /// A statement may write relations it does not name (`Statement::writes_unnamed`).
    pub writes_unnamed: bool,
    /// A statement may write another database (`Statement::writes_elsewhere`).
    pub writes_elsewhere: bool,
    /// A statement fires event triggers (`Statement::fires_event_triggers`): DDL, and
    /// `CREATE TEMP TABLE`, `CREATE TABLE AS` and the like, which count as writes.
    pub event_ddl: bool,
}

/// Relations a commit wrote, marked in the recency map only once the position probe
/// pipelined after the commit answers, with that position. Until then the client's
/// acknowledgement (its CommandComplete onwards) is held back, so no one can yet depend
/// on the commit and the relations need no mark without a position meanwhile (which would
/// send every read of them to the primary). Dropped unsettled — the probe failed, or its
/// connection was lost — they are marked without a position: primary-only for the
/// recency window.
#[derive(Default)]
pub struct DeferredMarks {
    target: Option<(Arc<pgfresh_recency::RecencyMap>, String)>,
    writes: Vec<Vec<RelName>>,
    /// The commit may have written relations nobody can name: the whole database is
    /// marked with the position.
    whole_database: bool,
}

impl DeferredMarks {
    /// Adds `writes` (relations of database `db`) to the marks.
    pub fn push(
        &mut self,
        recency: &Arc<pgfresh_recency::RecencyMap>,
        db: &str,
        writes: Vec<RelName>,
    ) {
        self.target_of(recency, db);
        self.writes.push(writes);
    }

    /// Adds a mark of the whole database `db`.
    pub fn push_database(&mut self, recency: &Arc<pgfresh_recency::RecencyMap>, db: &str) {
        self.target_of(recency, db);
        self.whole_database = true;
    }

    fn target_of(&mut self, recency: &Arc<pgfresh_recency::RecencyMap>, db: &str) {
        if self.target.is_none() {
            self.target = Some((recency.clone(), db.to_string()));
        }
    }

    /// Nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && !self.whole_database
    }

    /// Marks every relation with `lsn` (`None`: position unknown, primary only).
    pub fn settle(&mut self, lsn: Option<pgfresh_lsn::Lsn>) {
        let Some((recency, db)) = &self.target else {
            return;
        };
        if std::mem::take(&mut self.whole_database) {
            recency.mark_database_at(db, lsn);
        }
        for writes in self.writes.drain(..) {
            let keys: Vec<pgfresh_recency::RelKey<'_>> =
                writes.iter().map(crate::router::rel_key).collect();
            recency.mark(db, &keys, lsn);
        }
    }
}

impl Drop for DeferredMarks {
    fn drop(&mut self) {
        self.settle(None);
    }
}

impl std::fmt::Debug for DeferredMarks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredMarks")
            .field("writes", &self.writes)
            .field("whole_database", &self.whole_database)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgfresh_lsn::Lsn;
    use pgfresh_recency::{ManualClock, RecencyConfig, RecencyMap, RelKey};

    #[test]
    fn ddl_counts_per_statement() {
        let mut u = ClientUnit::new();
        u.parts.push(Arc::new(pgfresh_sql::analyze_uncached(
            "CREATE TRIGGER t AFTER INSERT ON a FOR EACH ROW EXECUTE FUNCTION f(); \
             INSERT INTO a VALUES (1)",
        )));
        assert_eq!(
            u.parts[0].kind,
            pgfresh_sql::Kind::Write,
            "a write as a whole"
        );
        assert_eq!(
            u.flags(),
            UnitFlags {
                ddl: true,
                effect_ddl: true,
                writes_unnamed: false,
                writes_elsewhere: false,
                event_ddl: true,
            },
            "but its DDL still reloads the dependency graph"
        );
        let mut t = ClientUnit::new();
        t.parts.push(Arc::new(pgfresh_sql::analyze_uncached(
            "CREATE TEMP TABLE t AS SELECT 1",
        )));
        assert_eq!(
            t.flags(),
            UnitFlags {
                event_ddl: true,
                ..UnitFlags::default()
            },
            "a write that fires event triggers, with nothing to reload"
        );
        let mut w = ClientUnit::new();
        w.parts.push(Arc::new(pgfresh_sql::analyze_uncached(
            "INSERT INTO a VALUES (1)",
        )));
        assert_eq!(w.flags(), UnitFlags::default());
    }

    #[test]
    fn a_standby_s_refusals_are_told_by_their_sqlstate() {
        for (code, refusal) in [
            ("25006", Some(Refusal::Recovery)),
            ("0A000", Some(Refusal::Recovery)),
            ("55000", Some(Refusal::Recovery)),
            ("40001", Some(Refusal::Conflict)),
            ("40P01", Some(Refusal::Conflict)),
            // A cancel or a timeout is the client's; so is any other error.
            ("57014", None),
            ("22012", None),
            ("42P01", None),
        ] {
            assert_eq!(Refusal::of(code), refusal, "{code}");
        }
    }

    #[test]
    fn a_recycled_unit_is_a_new_one_with_room() {
        let mut u = ClientUnit::new();
        u.frames.push(Bytes::from_static(b"S\0\0\0\x04"));
        u.parts.push(Arc::new(Analysis::not_analyzed()));
        u.synced = true;
        u.uses_statements.push("s1".into());
        u.parses.push("s1".into());
        u.sql_executes.push(NamedStatement::sql("p"));
        u.simple = true;
        u.passthrough = true;
        u.force_primary = true;
        u.refused_by_standby = true;
        u.retries = 2;
        u.avoid = Some(1);
        u.failover_deadline = Some(std::time::Instant::now());
        u.skip_acks = 3;
        u.events.push(StmtEvent::Other);
        u.statement_refs.push(None);
        u.statement_undo.push(Undo {
            name: "s1".into(),
            previous: None,
            sql: None,
        });
        u.unnamed_first = true;
        u.recycle();
        // Debug shows every field's value, not the vectors' capacity.
        assert_eq!(format!("{u:?}"), format!("{:?}", ClientUnit::new()));
        assert!(u.parts.capacity() >= 1 && u.events.capacity() >= 1);
    }

    #[test]
    fn a_batch_taken_whole_counts_as_its_messages() {
        use pgfresh_wire::build;
        let chunk: Vec<u8> = [
            build::parse("", "SELECT 1", &[]),
            build::bind("", "", &[], &[], &[]),
            build::execute("", 0),
            build::sync(),
        ]
        .concat();
        let frames = vec![build::query("SELECT 1"), Bytes::from(chunk)];
        let tags: Vec<u8> = messages(&frames).map(|m| m[0]).collect();
        assert_eq!(tags, b"QPBES");
        assert_eq!(ready_replies(&frames), 2);
        assert_eq!(ready_replies(&[build::parse("", "SELECT 1", &[])]), 0);
        // One expected reply a message, none for a Flush, the Sync's marked.
        let open = vec![build::parse("", "SELECT 1", &[]), build::flush()];
        let syncs: Vec<bool> = client_replies(&open, &[], true)
            .map(|e| e.is_sync())
            .collect();
        assert_eq!(syncs, [false]);
        let syncs: Vec<bool> = client_replies(&frames, &[], true)
            .map(|e| e.is_sync())
            .collect();
        assert_eq!(syncs, [false, false, false, false, true]);
        // A named Parse and a Close of a named statement take the undos, in order; the
        // unnamed Parse and a portal's Close none.
        let undo = |name: &str| Undo {
            name: name.into(),
            previous: None,
            sql: None,
        };
        let named = vec![
            build::parse("", "SELECT 1", &[]),
            build::parse("a", "SELECT 1", &[]),
            build::close(b'P', "p"),
            build::close(b'S', "b"),
            build::sync(),
        ];
        let undone: Vec<Option<String>> = client_replies(&named, &[undo("a"), undo("b")], true)
            .map(|e| match e {
                Expect::Client { undo, .. } => undo.map(|u| u.name),
                _ => None,
            })
            .collect();
        let a = Some("a".to_string());
        let b = Some("b".to_string());
        assert_eq!(undone, [None, a, None, b, None]);
    }

    fn map() -> Arc<RecencyMap> {
        let cfg = RecencyConfig {
            ttl_ms: 1_000,
            cold_start_ms: 0,
            ..RecencyConfig::default()
        };
        Arc::new(RecencyMap::new(cfg, Arc::new(ManualClock::new(0))))
    }

    fn orders() -> Vec<RelName> {
        vec![RelName {
            schema: None,
            name: "orders".into(),
        }]
    }

    fn required(m: &RecencyMap) -> Option<Option<Lsn>> {
        let h = m.lookup("db", &[RelKey::unqualified("orders")]);
        h.is_hot().then(|| h.required_lsn())
    }

    #[test]
    fn deferred_marks_wait_for_the_position_then_carry_it() {
        let m = map();
        let mut d = DeferredMarks::default();
        d.push(&m, "db", orders());
        // Not acknowledged yet: nothing is marked.
        assert_eq!(required(&m), None);
        d.settle(Some(Lsn(0x500)));
        assert_eq!(required(&m), Some(Some(Lsn(0x500))));
        // Settled once: dropping it marks nothing more.
        drop(d);
        assert_eq!(required(&m), Some(Some(Lsn(0x500))));
    }

    #[test]
    fn deferred_marks_dropped_unsettled_are_primary_only() {
        let m = map();
        let mut d = DeferredMarks::default();
        d.push(&m, "db", orders());
        drop(d);
        assert_eq!(required(&m), Some(None));
        // A failed probe (no position) settles the same way.
        let m = map();
        let mut d = DeferredMarks::default();
        d.push(&m, "db", orders());
        d.settle(None);
        assert_eq!(required(&m), Some(None));
    }

    #[test]
    fn a_deferred_whole_database_mark_carries_the_position() {
        let m = map();
        let mut d = DeferredMarks::default();
        d.push_database(&m, "db");
        assert!(!d.is_empty());
        assert_eq!(required(&m), None);
        d.settle(Some(Lsn(0x900)));
        assert_eq!(required(&m), Some(Some(Lsn(0x900))));
        assert!(d.is_empty());
        // Dropped unsettled: primary only.
        let m = map();
        let mut d = DeferredMarks::default();
        d.push_database(&m, "db");
        drop(d);
        assert_eq!(required(&m), Some(None));
    }

    /// A unit in flight is moved into the session's queue on every statement: kept within
    /// 256 bytes, the copy stays on memcpy's short path (callgrind: 280 bytes cost about
    /// 100 instructions a statement more).
    #[test]
    fn a_unit_in_flight_stays_small() {
        assert!(std::mem::size_of::<InFlight>() <= 192);
    }

    #[test]
    fn an_expected_reply_stays_small() {
        // Three or four a statement in transaction mode, each moved into and out of the
        // unit's queue: the rare undo is boxed.
        assert!(std::mem::size_of::<Expect>() <= 56);
    }
}
