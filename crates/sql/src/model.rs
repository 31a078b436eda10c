//! The analysis result: what a SQL string does, statement by statement.

use pgfresh_lsn::Lsn;

use crate::names::{FuncName, RelName};

/// What kind of statement this is, for routing.
///
/// The variants are ordered by how much they constrain routing; the combined kind of a
/// multi-statement string is the maximum over its statements (see [`Kind::combine`]):
/// `Read < Transaction < Session < Utility < Ddl < Write < Unclassified`.
/// A string containing any write is therefore a write as a whole, and a string that failed to
/// parse is unclassified as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A query a hot standby can run (it may still carry must-primary reasons, e.g. `FOR UPDATE`).
    Read,
    /// Transaction control: BEGIN, COMMIT, ROLLBACK, SAVEPOINT, SET TRANSACTION, two-phase commit.
    Transaction,
    /// Session state: SET/RESET/DISCARD, PREPARE/EXECUTE/DEALLOCATE, LISTEN/UNLISTEN/NOTIFY,
    /// FETCH/CLOSE of cursors. `EXECUTE` takes the classification of the prepared statement,
    /// which only the caller can look up (see [`SessionEffect::Execute`]).
    Session,
    /// Maintenance and other utility commands (VACUUM, ANALYZE, CHECKPOINT, CLUSTER, REINDEX,
    /// LOCK, LOAD). A standby refuses most of them: route to the primary.
    Utility,
    /// Schema changes (CREATE/ALTER/DROP/GRANT/COMMENT ...). Primary only.
    Ddl,
    /// Changes data: INSERT, UPDATE, DELETE, MERGE, TRUNCATE, COPY FROM, SELECT INTO,
    /// CREATE TABLE AS, REFRESH MATERIALIZED VIEW, data-modifying CTEs, `EXPLAIN ANALYZE` of a
    /// write, CALL, DO, CREATE TEMP TABLE.
    Write,
    /// The text could not be classified with certainty (parse failure, empty text, invalid
    /// encoding). Never a read: route to the primary.
    Unclassified,
}

impl Kind {
    /// Combined verdict of two statements run together: the more constraining kind.
    pub fn combine(self, other: Kind) -> Kind {
        self.max(other)
    }

    /// Lower-case name used in logs and explain output.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Transaction => "transaction",
            Kind::Session => "session",
            Kind::Utility => "utility",
            Kind::Ddl => "ddl",
            Kind::Write => "write",
            Kind::Unclassified => "unclassified",
        }
    }
}

/// Transaction isolation level named in BEGIN / SET TRANSACTION.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isolation {
    /// READ UNCOMMITTED (behaves as READ COMMITTED in PostgreSQL).
    ReadUncommitted,
    /// READ COMMITTED.
    ReadCommitted,
    /// REPEATABLE READ.
    RepeatableRead,
    /// SERIALIZABLE: a hot standby refuses it, so such transactions run on the primary.
    Serializable,
}

/// Transaction modes given in BEGIN / START TRANSACTION / SET TRANSACTION; `None` = not stated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxModes {
    /// `READ ONLY` (true) or `READ WRITE` (false).
    pub read_only: Option<bool>,
    /// `ISOLATION LEVEL ...`.
    pub isolation: Option<Isolation>,
    /// `DEFERRABLE` (true) or `NOT DEFERRABLE` (false).
    pub deferrable: Option<bool>,
}

/// What a transaction-control statement does.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TxEffect {
    /// BEGIN or START TRANSACTION, with its modes.
    Begin(TxModes),
    /// SET TRANSACTION (modes of the current transaction).
    SetTransaction(TxModes),
    /// SET SESSION CHARACTERISTICS AS TRANSACTION (defaults for later transactions).
    SetSessionCharacteristics(TxModes),
    /// COMMIT or END (`chain`: AND CHAIN starts a new transaction with the same modes).
    Commit {
        /// `AND CHAIN` was given.
        chain: bool,
    },
    /// ROLLBACK or ABORT.
    Rollback {
        /// `AND CHAIN` was given.
        chain: bool,
    },
    /// SAVEPOINT name.
    Savepoint(String),
    /// RELEASE [SAVEPOINT] name.
    Release(String),
    /// ROLLBACK TO [SAVEPOINT] name.
    RollbackTo(String),
    /// PREPARE TRANSACTION 'gid'.
    PrepareTransaction(String),
    /// COMMIT PREPARED 'gid'.
    CommitPrepared(String),
    /// ROLLBACK PREPARED 'gid'.
    RollbackPrepared(String),
}

impl TxEffect {
    /// The statement ends the transaction it runs in (COMMIT, ROLLBACK, ROLLBACK TO,
    /// PREPARE TRANSACTION): PostgreSQL parses, binds and runs it in a failed transaction
    /// too, where it refuses any other statement (its `IsTransactionExitStmt`).
    pub fn exits_transaction(&self) -> bool {
        matches!(
            self,
            TxEffect::Commit { .. }
                | TxEffect::Rollback { .. }
                | TxEffect::RollbackTo(_)
                | TxEffect::PrepareTransaction(_)
        )
    }
}

/// DISCARD target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DiscardKind {
    /// DISCARD ALL: resets everything, including temp tables, LISTEN and session advisory locks.
    All,
    /// DISCARD PLANS.
    Plans,
    /// DISCARD SEQUENCES.
    Sequences,
    /// DISCARD TEMP / TEMPORARY.
    Temp,
}

/// What a statement does to the session's state, which the proxy must follow.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SessionEffect {
    /// `SET [LOCAL] name = value` / `SET name TO DEFAULT` (value `None`). `value` is the
    /// comma-joined list of literals as PostgreSQL would store it (without quotes).
    Set {
        /// Parameter name (lower-cased by the parser, e.g. `timezone` for `SET TIME ZONE`).
        name: String,
        /// New value; `None` for DEFAULT or FROM CURRENT.
        value: Option<String>,
        /// `SET LOCAL`: lasts until the end of the transaction.
        local: bool,
    },
    /// `RESET name`.
    Reset(String),
    /// `RESET ALL`.
    ResetAll,
    /// `DISCARD ...`.
    Discard(DiscardKind),
    /// `SET ROLE` / `RESET ROLE` (value `None` for NONE/RESET).
    SetRole(Option<String>),
    /// `SET SESSION AUTHORIZATION` (value `None` for DEFAULT/RESET).
    SetSessionAuthorization(Option<String>),
    /// `set_config(name, value, is_local)` called from a query; parts that are not literals are
    /// `None`.
    SetConfig {
        /// Parameter name when given as a literal.
        name: Option<String>,
        /// Value when given as a literal.
        value: Option<String>,
        /// `is_local` when given as a literal.
        local: Option<bool>,
    },
    /// Several `set_config` calls in one statement, each a [`SessionEffect::SetConfig`], in
    /// the order PostgreSQL makes them (a select list left to right).
    SetConfigs(Vec<SessionEffect>),
    /// SQL `PREPARE name AS statement`; `inner` is the analysis of the prepared statement.
    Prepare {
        /// Statement name.
        name: String,
        /// Classification that `EXECUTE name` will inherit.
        inner: Box<crate::Statement>,
    },
    /// SQL `EXECUTE name`: the caller looks up the prepared statement and uses its analysis.
    Execute {
        /// Statement name.
        name: String,
    },
    /// `DEALLOCATE name`, or `DEALLOCATE ALL` (`None`).
    Deallocate(Option<String>),
    /// `SHOW name` (pgfresh answers its own `pgfresh.*` parameters).
    Show(String),
    /// `LISTEN channel`: pins the session to the primary.
    Listen(String),
    /// `UNLISTEN channel`, or `UNLISTEN *` (`None`).
    Unlisten(Option<String>),
    /// `NOTIFY channel`.
    Notify(String),
    /// `DECLARE name CURSOR ...`; `with_hold` cursors outlive the transaction and pin the session.
    DeclareCursor {
        /// Cursor name.
        name: String,
        /// `WITH HOLD` was given.
        with_hold: bool,
    },
    /// `FETCH` / `MOVE` on a cursor.
    Fetch(String),
    /// `CLOSE name`, or `CLOSE ALL` (`None`).
    CloseCursor(Option<String>),
    /// A temporary relation was created (table, view, sequence, CREATE TEMP TABLE AS,
    /// SELECT INTO TEMP): the session is pinned to the primary until it is dropped/discarded.
    CreateTemp(RelName),
}

/// A reason the statement must run on the primary even though it is (or looks like) a read,
/// or a marker the router needs for pinning.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MustPrimary {
    /// `SELECT ... FOR UPDATE / NO KEY UPDATE / SHARE / KEY SHARE`.
    LockingClause,
    /// A sequence function (nextval, setval, currval, lastval); holds the function name.
    Sequence(String),
    /// An advisory lock function; `session_level` locks outlive the transaction and pin the
    /// session.
    AdvisoryLock {
        /// Session-level (not `_xact_`) lock or unlock.
        session_level: bool,
    },
    /// `NOTIFY` or `pg_notify(...)`.
    Notify,
    /// A function that needs a real transaction id (`txid_current`, `pg_current_xact_id`, ...).
    TxidFunction(String),
    /// `SELECT ... INTO`.
    SelectInto,
    /// A data-modifying statement inside a WITH clause (at any depth).
    WritableCte,
    /// `LOCK TABLE`.
    Lock,
    /// `LISTEN`.
    Listen,
    /// `COPY ... FROM`.
    CopyFrom,
    /// `COPY ... TO` a server file or program: runs on whichever server executes it.
    CopyServerFile,
    /// `CALL procedure(...)`.
    CallProcedure,
    /// `DO $$ ... $$`.
    DoBlock,
    /// `PREPARE TRANSACTION`, `COMMIT PREPARED`, `ROLLBACK PREPARED`.
    TwoPhaseCommit,
    /// A transaction at SERIALIZABLE isolation (a standby refuses it even when read-only).
    SerializableTxn,
    /// A temporary relation is created or named via `pg_temp`.
    TempRelation(RelName),
    /// `set_config(...)`: changes session state on the node that runs it.
    SetConfig,
    /// `EXPLAIN ANALYZE` executes the statement, and it writes.
    ExplainAnalyzeWrite,
    /// A built-in that writes or needs the primary (large-object writers, WAL control,
    /// replication slots, backend signalling, `pg_current_wal_lsn`, ...).
    BuiltinWriter(String),
    /// A question about the server itself whose answer must describe the primary
    /// (`pg_is_in_recovery()`, `SHOW transaction_read_only`, ...).
    ServerState(String),
    /// A function in the configured write-function list (added by
    /// [`Analysis::function_reasons`](crate::Analysis::function_reasons)).
    ListedWriteFunction(FuncName),
    /// A user function that is volatile or of unknown volatility (added by
    /// [`Analysis::function_reasons`](crate::Analysis::function_reasons)).
    UserFunction(FuncName),
}

/// A routing hint from a comment anywhere in the text: `/* pgfresh:primary */`,
/// `-- pgfresh:replica`, or sqlcommenter's `/*pgfresh='primary'*/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteHint {
    /// Send to the primary regardless of the classification.
    Primary,
    /// Prefer a replica. The router only honours this for statements classified as reads
    /// without must-primary reasons.
    Replica,
}

/// A `/* pgfresh:min_lsn=TLI/X/Y */` hint: the application asks for a node that has replayed
/// at least this position (the timeline is optional: `X/Y` also parses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HintLsn {
    /// The timeline the position was taken on, when given.
    pub timeline: Option<u32>,
    /// The WAL position.
    pub lsn: Lsn,
}

/// The analysis of one statement of a (possibly multi-statement) string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Statement {
    /// What the statement is.
    pub kind: Kind,
    /// Relations read (sorted, deduplicated); CTE names are not relations.
    pub reads: Vec<RelName>,
    /// Relations written, created, altered or dropped (sorted, deduplicated).
    pub writes: Vec<RelName>,
    /// Reasons the statement must run on the primary (sorted, deduplicated).
    pub must_primary: Vec<MustPrimary>,
    /// Functions the statement calls (sorted, deduplicated).
    pub functions: Vec<FuncName>,
    /// Operators the statement applies and types it casts to, under the names the
    /// dependency graph knows the user functions behind them by ([`FuncName::operator`],
    /// [`FuncName::cast_to`]; sorted, deduplicated). Built-in operators and casts run no
    /// user function; a user-defined one runs a function the text does not name.
    pub implicit_calls: Vec<FuncName>,
    /// Effect on the transaction, for transaction-control statements.
    pub tx: Option<TxEffect>,
    /// Effect on the session state.
    pub session: Option<SessionEffect>,
    /// True when the statement reads a system catalog (`pg_catalog`, `information_schema`, or an
    /// unqualified `pg_*` relation): the router may pin such reads to one node.
    pub touches_catalog: bool,
    /// The statement may write relations it does not name (`TRUNCATE … CASCADE`, a `DO`
    /// block, `COMMIT PREPARED`): the caller marks the whole database.
    pub writes_unnamed: bool,
    /// The statement may write another database of the instance, committed by itself
    /// while the statement runs (SQL sent over `dblink`, a `DO` block): the caller marks
    /// every database once the statement has run, whatever becomes of its transaction.
    pub writes_elsewhere: bool,
    /// A schema change that may change what other statements touch behind their text
    /// (a trigger, rule, function, view, policy, partition, inheritance or foreign key; see
    /// `effects.rs`): the dependency graph learned from the catalog is out of date
    /// until it is reloaded after the change.
    pub changes_effects: bool,
    /// PostgreSQL fires event triggers (`ddl_command_start`/`end`) for it: DDL, and the
    /// statements that create or refresh a relation while pgfresh counts them as writes
    /// (`CREATE TEMP TABLE`, `CREATE TABLE AS`, `SELECT INTO`, `REFRESH MATERIALIZED VIEW`).
    pub fires_event_triggers: bool,
    /// Byte range of the statement in the analysed text.
    pub text_range: (usize, usize),
}

impl Statement {
    /// An empty statement of the given kind over the given byte range.
    pub(crate) fn new(kind: Kind, text_range: (usize, usize)) -> Self {
        Self {
            kind,
            reads: Vec::new(),
            writes: Vec::new(),
            must_primary: Vec::new(),
            functions: Vec::new(),
            implicit_calls: Vec::new(),
            tx: None,
            session: None,
            touches_catalog: false,
            writes_unnamed: false,
            writes_elsewhere: false,
            changes_effects: false,
            fires_event_triggers: kind == Kind::Ddl,
            text_range,
        }
    }

    /// True when a hot standby may run this statement as far as the cached analysis can tell
    /// (a read without must-primary reasons). Function policy is applied separately, see
    /// [`Statement::function_reasons`].
    pub fn is_standby_safe(&self) -> bool {
        self.kind == Kind::Read && self.must_primary.is_empty()
    }
}

/// The analysis of a SQL string: one [`Statement`] per statement plus the combined verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Analysis {
    /// One entry per statement, in order.
    pub statements: Vec<Statement>,
    /// Combined verdict for the whole string (see [`Kind`] for the ordering).
    pub kind: Kind,
    /// Union of the statements' reads (sorted, deduplicated).
    pub reads: Vec<RelName>,
    /// Union of the statements' writes (sorted, deduplicated).
    pub writes: Vec<RelName>,
    /// Union of the statements' must-primary reasons (sorted, deduplicated).
    pub must_primary: Vec<MustPrimary>,
    /// Union of the functions called (sorted, deduplicated).
    pub functions: Vec<FuncName>,
    /// Union of the operators applied and types cast to (see
    /// [`Statement::implicit_calls`]).
    pub implicit_calls: Vec<FuncName>,
    /// Some function called is not a known built-in ([`crate::is_known_builtin`]): what it
    /// may write or fire only the dependency graph tells (decided once, with the analysis).
    pub calls_user_functions: bool,
    /// Any statement reads a system catalog.
    pub touches_catalog: bool,
    /// Routing hint from any comment of the text (primary wins over replica).
    pub hint: Option<RouteHint>,
    /// The highest `pgfresh:min_lsn=` position named in any comment of the text.
    pub min_lsn_hint: Option<HintLsn>,
    /// A `pgfresh:min_lsn=` hint named a position that does not parse: the statement is
    /// refused rather than run without the guarantee it asked for.
    pub min_lsn_malformed: bool,
    /// Every comment in the text, verbatim (with `/* */` or `--`).
    pub comments: Vec<String>,
    /// The parser's message when `kind` is [`Kind::Unclassified`].
    pub error: Option<String>,
}

impl Analysis {
    /// The analysis of text nobody analysed (the query parser is off): unclassified, so
    /// it can only ever go to the primary.
    pub fn not_analyzed() -> Self {
        Self::unclassified("not analysed: the query parser is off")
    }

    /// An unclassified analysis carrying an error message.
    pub(crate) fn unclassified(message: impl Into<String>) -> Self {
        Self {
            statements: Vec::new(),
            kind: Kind::Unclassified,
            reads: Vec::new(),
            writes: Vec::new(),
            must_primary: Vec::new(),
            functions: Vec::new(),
            implicit_calls: Vec::new(),
            calls_user_functions: false,
            touches_catalog: false,
            hint: None,
            min_lsn_hint: None,
            min_lsn_malformed: false,
            comments: Vec::new(),
            error: Some(message.into()),
        }
    }

    /// True when the whole string may run on a hot standby as far as the cached analysis can
    /// tell: every statement is a read and none carries a must-primary reason.
    pub fn is_standby_safe(&self) -> bool {
        self.kind == Kind::Read && self.must_primary.is_empty()
    }

    /// Names of prepared statements run by SQL `EXECUTE` in this string; the caller substitutes
    /// their stored analyses.
    pub fn executes(&self) -> impl Iterator<Item = &str> {
        self.statements.iter().filter_map(|s| match &s.session {
            Some(SessionEffect::Execute { name }) => Some(name.as_str()),
            _ => None,
        })
    }

    /// Rough number of heap and inline bytes this analysis occupies, used to weigh cache entries.
    /// Counts every allocation with the allocator's bookkeeping (about 16 bytes each) and
    /// reference-count headers; calibrated against measured resident-set growth.
    pub fn estimated_bytes(&self) -> usize {
        use std::mem::size_of;
        /// Allocator bookkeeping plus `Arc` counters for one shared string.
        const ARC_STR: usize = 32;
        /// Allocator bookkeeping for one heap block.
        const BLOCK: usize = 16;
        let text = |s: &str| s.len() + ARC_STR;
        let rel = |r: &RelName| {
            size_of::<RelName>() + text(&r.name) + r.schema.as_deref().map_or(0, text)
        };
        let func = |f: &FuncName| {
            size_of::<FuncName>() + text(&f.name) + f.schema.as_deref().map_or(0, text)
        };
        let reason = |m: &MustPrimary| {
            size_of::<MustPrimary>()
                + match m {
                    MustPrimary::Sequence(s)
                    | MustPrimary::TxidFunction(s)
                    | MustPrimary::BuiltinWriter(s)
                    | MustPrimary::ServerState(s) => s.len() + BLOCK,
                    MustPrimary::TempRelation(r) => rel(r),
                    MustPrimary::ListedWriteFunction(f) | MustPrimary::UserFunction(f) => func(f),
                    _ => 0,
                }
        };
        let block = |n: usize| if n == 0 { 0 } else { BLOCK };
        let lists = |reads: &[RelName], writes: &[RelName], mp: &[MustPrimary], fs: &[FuncName]| {
            reads.iter().map(rel).sum::<usize>()
                + writes.iter().map(rel).sum::<usize>()
                + mp.iter().map(reason).sum::<usize>()
                + fs.iter().map(func).sum::<usize>()
                + block(reads.len())
                + block(writes.len())
                + block(mp.len())
                + block(fs.len())
        };
        let session = |s: &Option<SessionEffect>| match s {
            None => 0,
            Some(SessionEffect::Prepare { inner, .. }) => {
                size_of::<Statement>()
                    + lists(
                        &inner.reads,
                        &inner.writes,
                        &inner.must_primary,
                        &inner.functions,
                    )
                    + 64
            }
            Some(_) => 64,
        };
        BLOCK
            + size_of::<Analysis>()
            + lists(
                &self.reads,
                &self.writes,
                &self.must_primary,
                &self.functions,
            )
            + self.implicit_calls.iter().map(func).sum::<usize>()
            + block(self.implicit_calls.len())
            + self
                .statements
                .iter()
                .map(|s| {
                    size_of::<Statement>()
                        + lists(&s.reads, &s.writes, &s.must_primary, &s.functions)
                        + s.implicit_calls.iter().map(func).sum::<usize>()
                        + block(s.implicit_calls.len())
                        + session(&s.session)
                        + if s.tx.is_some() { 32 } else { 0 }
                })
                .sum::<usize>()
            + block(self.statements.len())
            + self
                .comments
                .iter()
                .map(|c| c.len() + 24 + BLOCK)
                .sum::<usize>()
            + self.error.as_ref().map_or(0, |e| e.len() + BLOCK)
    }
}
