//! The router: a pure function from a unit's analysis, the session's state, the
//! recency map and the config snapshot to a target with a machine-readable reason.
//!
//! A "unit" is what must run on one node: a simple-query string, or an extended-query
//! batch up to Sync. The cluster view is consulted afterwards by the session, which
//! turns [`Target::Replica`] into a concrete replica (or a counted fallback).

use pgfresh_config::RoutingSection;
use pgfresh_lsn::Lsn;
use pgfresh_recency::{Hotness, RecencyMap, RelKey};
use pgfresh_sql::{
    Analysis, FunctionPolicy, Kind, MustPrimary, RouteHint, TxEffect, VolatilityOracle,
};

/// Where a unit should run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Primary,
    /// Any eligible replica that has replayed `required` (when set).
    Replica {
        required: Option<Lsn>,
    },
    /// The node the session is already using (open transaction, session-only statements).
    Current,
    /// The node that holds what the unit uses (a WITH HOLD cursor), chosen by the session:
    /// `decide` never answers it.
    Node(usize),
}

/// Why. Used as the `reason` label of `pgfresh_routed_total`, in debug logs and in
/// `pgfresh explain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The parser is off: everything goes to the primary.
    ParserDisabled,
    Write,
    Ddl,
    /// Could not be classified with certainty (parse failure).
    Unclassified,
    /// A read a standby cannot or must not run (locking clause, nextval, ...).
    MustPrimary(&'static str),
    /// A user or listed function that may write.
    WriteFunction,
    /// Transaction control or a utility statement outside a read-only transaction.
    TransactionControl,
    Utility,
    /// A read of a relation written within the recency window.
    HotRelation,
    /// A read touching a relation whose write position a replica must reach.
    HotRelationLsn,
    /// The session is pinned to the primary (temp table, LISTEN, ...).
    SessionPinned(&'static str),
    /// A `/* pgfresh:primary */` comment or `pgfresh.route = primary`.
    Hint,
    /// Inside an open transaction: stays on its node.
    InTransaction,
    /// A write-capable transaction starts: primary.
    WriteCapableTxn,
    /// A read-only transaction starts on a replica.
    ReadOnlyTxn,
    /// A read-only transaction starts on the primary: a write acknowledged before it, in
    /// its database, has no known position yet.
    ReadOnlySnapshot,
    /// A read that may run on a replica.
    Replica,
    /// `/* pgfresh:replica */`: the application accepts a replica for this read even if
    /// a relation it reads was written recently.
    ReplicaHint,
    /// Session-state statement: runs where the session is.
    SessionState,
    /// A replica was wanted but none is eligible (counted as a fallback).
    NoEligibleReplica,
    /// Reading the system catalogs: primary, where DDL is current.
    Catalog,
    /// A position token (`pgfresh.min_lsn`): a node that has replayed it.
    Token,
    /// A position token no replica can be checked against (a diverged or unknown
    /// timeline): primary.
    TokenPrimary(&'static str),
    /// A standby refused the read with an error the primary would not give (a write
    /// behind a view, serializable mode, an unlogged table): it runs again there.
    StandbyRefused,
    /// `wal_feed = "strict"`: the feed could not tell that every commit made before the
    /// read is known (not streaming, or not caught up within `wal_feed_wait_ms`).
    WalFeed,
}

impl Reason {
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::ParserDisabled => "parser_disabled",
            Reason::Write => "write",
            Reason::Ddl => "ddl",
            Reason::Unclassified => "unclassified",
            Reason::MustPrimary(_) => "must_primary",
            Reason::WriteFunction => "write_function",
            Reason::TransactionControl => "transaction_control",
            Reason::Utility => "utility",
            Reason::HotRelation => "hot_relation",
            Reason::HotRelationLsn => "hot_relation_lsn",
            Reason::SessionPinned(_) => "session_pinned",
            Reason::Hint => "hint",
            Reason::InTransaction => "in_transaction",
            Reason::WriteCapableTxn => "write_capable_txn",
            Reason::ReadOnlyTxn => "read_only_txn",
            Reason::ReadOnlySnapshot => "read_only_snapshot",
            Reason::Replica => "replica",
            Reason::ReplicaHint => "replica_hint",
            Reason::SessionState => "session_state",
            Reason::NoEligibleReplica => "no_eligible_replica",
            Reason::Catalog => "catalog",
            Reason::Token => "token",
            Reason::TokenPrimary(_) => "token_primary",
            Reason::StandbyRefused => "standby_refused",
            Reason::WalFeed => "wal_feed",
        }
    }

    /// Detail for logs and `explain` (the must-primary cause, the pin reason).
    pub fn detail(&self) -> Option<&'static str> {
        match self {
            Reason::MustPrimary(d) | Reason::SessionPinned(d) | Reason::TokenPrimary(d) => Some(d),
            _ => None,
        }
    }
}

/// What the router needs to know about the session.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionView {
    /// A transaction is open (or about to be, for a deferred BEGIN) on some node.
    pub in_transaction: bool,
    /// The open transaction was declared read-only (or the session defaults to it).
    pub read_only_txn: bool,
    /// A reason pinning the session to the primary.
    pub pinned: Option<&'static str>,
    /// The session asked for the primary (`SET pgfresh.route = 'primary'`).
    pub route_primary: bool,
    /// What the unit's position token requires.
    pub token: TokenNeed,
}

/// What a position token (`pgfresh.min_lsn`, `/* pgfresh:min_lsn=… */`) requires of the
/// node serving a read, once translated to the primary's timeline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenNeed {
    #[default]
    None,
    /// A node whose replay position has reached this.
    Position(Lsn),
    /// Only the primary can be known to have it (why).
    Primary(&'static str),
}

/// Everything else the decision reads.
pub struct RouteCtx<'a> {
    pub routing: &'a RoutingSection,
    pub policy: &'a FunctionPolicy,
    pub oracle: Option<&'a dyn VolatilityOracle>,
    pub recency: &'a RecencyMap,
    pub database: &'a str,
    /// What the database's catalog says statements touch behind their text.
    pub deps: Option<&'a pgfresh_deps::DepGraph>,
}

/// The decision for one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub target: Target,
    pub reason: Reason,
}

fn must_primary_name(m: &MustPrimary) -> &'static str {
    match m {
        MustPrimary::LockingClause => "locking_clause",
        MustPrimary::Sequence(_) => "sequence",
        MustPrimary::AdvisoryLock { .. } => "advisory_lock",
        MustPrimary::Notify => "notify",
        MustPrimary::TxidFunction(_) => "txid_function",
        MustPrimary::SelectInto => "select_into",
        MustPrimary::WritableCte => "writable_cte",
        MustPrimary::Lock => "lock",
        MustPrimary::Listen => "listen",
        MustPrimary::CopyFrom => "copy_from",
        MustPrimary::CopyServerFile => "copy_server_file",
        MustPrimary::CallProcedure => "call",
        MustPrimary::DoBlock => "do",
        MustPrimary::TwoPhaseCommit => "two_phase_commit",
        MustPrimary::SerializableTxn => "serializable",
        MustPrimary::TempRelation(_) => "temp_relation",
        MustPrimary::SetConfig => "set_config",
        MustPrimary::ExplainAnalyzeWrite => "explain_analyze_write",
        MustPrimary::BuiltinWriter(_) => "builtin_writer",
        MustPrimary::ServerState(_) => "server_state",
        MustPrimary::ListedWriteFunction(_) => "write_function_list",
        MustPrimary::UserFunction(_) => "user_function",
    }
}

const fn decision(target: Target, reason: Reason) -> Decision {
    Decision { target, reason }
}

/// Route one unit made of `parts` (a simple-query string is one part; an extended
/// batch has one part per statement it parses or executes).
pub fn decide(parts: &[&Analysis], session: &SessionView, ctx: &RouteCtx<'_>) -> Decision {
    let r = ctx.routing;
    if session.in_transaction {
        return decision(Target::Current, Reason::InTransaction);
    }
    if !r.enable_query_parser {
        return decision(Target::Primary, Reason::ParserDisabled);
    }
    // The unit's kind: what its statements do, session-state statements (SET, PREPARE,
    // EXECUTE, DISCARD, ...) left out when others come with them. A transaction whose
    // first statement is a `SET LOCAL` is a transaction; an `EXECUTE` is the statement it
    // runs (whose analysis is a part of the unit too); a `SET` sent with a read is that
    // read. Only a unit of session-state statements alone runs where the session is: any
    // other would skip the checks below, recency's included.
    let mut kind = Kind::Read;
    let mut any_statement = false;
    let mut session_state = false;
    let mut other = false;
    for a in parts {
        if a.statements.is_empty() {
            // Nothing parsed: an unparseable text (unclassified) or an empty query.
            kind = kind.combine(a.kind);
            any_statement |= a.kind == Kind::Unclassified;
            other |= a.kind == Kind::Unclassified;
            continue;
        }
        any_statement = true;
        if a.kind < Kind::Session {
            // No session-state statement in it: its kind is its most constraining one.
            kind = kind.combine(a.kind);
            other = true;
            continue;
        }
        for st in &a.statements {
            if st.kind == Kind::Session {
                session_state = true;
            } else {
                kind = kind.combine(st.kind);
                other = true;
            }
        }
    }
    if session_state && !other {
        return decision(Target::Current, Reason::SessionState);
    }
    match kind {
        Kind::Unclassified => return decision(Target::Primary, Reason::Unclassified),
        Kind::Write => return decision(Target::Primary, Reason::Write),
        Kind::Ddl => return decision(Target::Primary, Reason::Ddl),
        Kind::Utility => return decision(Target::Primary, Reason::Utility),
        Kind::Transaction => {
            // A transaction starting here (BEGIN sent with or without statements).
            // The mode the transaction names (the last one named), else the session's
            // default: `BEGIN READ WRITE` is write-capable in a read-only session.
            let named = parts
                .iter()
                .rev()
                .flat_map(|a| a.statements.iter().rev())
                .find_map(|s| match &s.tx {
                    Some(TxEffect::Begin(m)) | Some(TxEffect::SetTransaction(m)) => m.read_only,
                    _ => None,
                });
            let read_only = named.unwrap_or(session.read_only_txn);
            let serializable = parts
                .iter()
                .any(|a| a.must_primary.contains(&MustPrimary::SerializableTxn));
            if !read_only || serializable {
                return decision(Target::Primary, Reason::WriteCapableTxn);
            }
            // A read-only transaction: its reads decide below, like any read.
        }
        // (Left out above: a unit of session-state statements alone has returned.)
        Kind::Session | Kind::Read => {}
    }
    if !any_statement {
        // Empty query: answer from wherever the session is.
        return decision(Target::Current, Reason::SessionState);
    }
    for a in parts {
        if let Some(m) = a.must_primary.first() {
            return decision(Target::Primary, Reason::MustPrimary(must_primary_name(m)));
        }
        if !a.function_reasons(ctx.policy, ctx.oracle).is_empty() {
            return decision(Target::Primary, Reason::WriteFunction);
        }
        // A STABLE or IMMUTABLE function whose body writes after all (through `nextval`,
        // or a volatile function it calls), as its body's analysis shows.
        // So is a read of a view or a table whose policy calls a function that writes.
        if ctx.deps.is_some_and(|g| {
            g.calls_writer(&a.functions)
                || (!a.implicit_calls.is_empty() && g.calls_writer(&a.implicit_calls))
                || g.reads_write(&a.reads)
                || (!g.everywhere_calls().is_empty() && g.calls_writer(g.everywhere_calls()))
        }) {
            return decision(Target::Primary, Reason::WriteFunction);
        }
    }
    if let Some(pin) = session.pinned {
        return decision(Target::Primary, Reason::SessionPinned(pin));
    }
    if session.route_primary || parts.iter().any(|a| a.hint == Some(RouteHint::Primary)) {
        return decision(Target::Primary, Reason::Hint);
    }
    if parts.iter().any(|a| a.touches_catalog) {
        return decision(Target::Primary, Reason::Catalog);
    }
    // A standby has no rows of an unlogged table and refuses to read one.
    if let Some(g) = ctx.deps {
        if parts
            .iter()
            .any(|a| g.reads_unlogged(&a.reads, &a.functions))
        {
            return decision(Target::Primary, Reason::MustPrimary("unlogged_table"));
        }
    }
    let mut required: Option<Lsn> = None;
    match session.token {
        TokenNeed::None => {}
        TokenNeed::Primary(why) => return decision(Target::Primary, Reason::TokenPrimary(why)),
        TokenNeed::Position(l) => required = Some(l),
    }
    let replica_hint = parts.iter().any(|a| a.hint == Some(RouteHint::Replica));
    if replica_hint && kind == Kind::Read {
        // The application accepts a replica even right after a write, but not one
        // behind the position it carries.
        let reason = if required.is_some() {
            Reason::Token
        } else {
            Reason::ReplicaHint
        };
        return decision(Target::Replica { required }, reason);
    }
    if r.enable_recent_access_routing {
        // A read-only transaction may read anything later: its node must have
        // replayed every write acknowledged before its first statement.
        if kind == Kind::Transaction {
            if let Some(d) = need(ctx.recency.lookup_database(ctx.database), &mut required) {
                // A write acknowledged in the database whose position is not known yet.
                return decision(d.target, Reason::ReadOnlySnapshot);
            }
        }
        for a in parts {
            if let Some(d) = read_requirement(a, ctx, &mut required) {
                return d;
            }
        }
    }
    let reason = if kind == Kind::Transaction {
        Reason::ReadOnlyTxn
    } else if matches!(session.token, TokenNeed::Position(_)) {
        Reason::Token
    } else if required.is_some() {
        Reason::HotRelationLsn
    } else {
        Reason::Replica
    };
    decision(Target::Replica { required }, reason)
}

/// Fold one recency answer into the unit's required position; a hot answer without a
/// position means the primary.
fn need(h: Hotness, required: &mut Option<Lsn>) -> Option<Decision> {
    match h {
        Hotness::Cold => None,
        Hotness::Hot {
            required_lsn: None, ..
        } => Some(decision(Target::Primary, Reason::HotRelation)),
        Hotness::Hot {
            required_lsn: Some(l),
            ..
        } => {
            *required = Some(required.map_or(l, |x| x.max(l)));
            None
        }
    }
}

/// What a replica must have replayed to serve the reads of `a`: the relations it
/// names, plus what they read behind the text (the base relations of views, what
/// called functions read), learned from the catalog.
fn read_requirement(
    a: &Analysis,
    ctx: &RouteCtx<'_>,
    required: &mut Option<Lsn>,
) -> Option<Decision> {
    let mut behind: Vec<&pgfresh_sql::RelName> = Vec::new();
    let mut whole = false;
    if let Some(g) = ctx.deps.filter(|g| !g.is_empty()) {
        whole = g
            .expand_reads_borrowed(&a.reads, &a.functions, &mut behind)
            .is_whole_database();
        // What the functions of user-defined operators and casts read (and of the casts
        // any statement may apply).
        for called in [&a.implicit_calls[..], g.everywhere_calls()] {
            if !called.is_empty() {
                whole |= g
                    .expand_reads_borrowed(&[], called, &mut behind)
                    .is_whole_database();
            }
        }
    }
    if whole {
        // An unanalysable function body may read anything.
        if let Some(d) = need(ctx.recency.lookup_database(ctx.database), required) {
            return Some(d);
        }
    }
    if a.reads.is_empty() && behind.is_empty() {
        return None;
    }
    // Filled in place: `collect` would return the whole array by value, a copy a read.
    let mut keys: smallvec::SmallVec<[RelKey<'_>; 8]> = smallvec::SmallVec::new();
    keys.extend(a.reads.iter().chain(behind).map(rel_key));
    need(ctx.recency.requirement(ctx.database, &keys), required)
}

/// The recency map's key for a relation name.
pub(crate) fn rel_key(n: &pgfresh_sql::RelName) -> RelKey<'_> {
    RelKey {
        schema: n.schema.as_deref(),
        name: &n.name,
    }
}
