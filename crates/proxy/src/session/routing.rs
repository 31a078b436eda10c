//! Where a unit runs: units pgfresh answers itself, the router's decision for the others,
//! and the concrete node (a replica that has replayed what the unit needs, a counted
//! fallback to the primary, or an error such as `on_stale = "error"`).

use std::sync::Arc;

use pgfresh_sql::{Analysis, SessionEffect, TxEffect};
use pgfresh_wire::{build, TxStatus};

use super::cold_read;
use super::state::PinReason;
use super::unit::ClientUnit;
use super::{DeferredBegin, Session, TxPhase};
use crate::context::{FallbackSlot, Shared};
use crate::error::ProxyError;
use crate::router::{decide, Decision, Reason, RouteCtx, SessionView, Target, TokenNeed};

/// How pgfresh answers a transaction statement itself (`Session::transaction_answer`).
#[derive(Clone, Copy)]
enum TxAnswer {
    /// Once the replies to the units ahead of it have been relayed.
    Wait,
    /// A BEGIN, deferred to the transaction's first statement.
    Begin,
    /// The COMMIT or ROLLBACK (`tag`) of a transaction no server has seen.
    End { tag: &'static str, chain: bool },
}

/// Whether pgfresh answers a unit itself.
pub(super) enum Local {
    Answered,
    /// It will, once the replies to the units ahead of it have been relayed.
    Wait,
    No,
}

/// The prepared statement a SQL-level PREPARE, EXECUTE or DEALLOCATE names.
fn statement_name(s: &pgfresh_sql::Statement) -> Option<&str> {
    match &s.session {
        Some(
            SessionEffect::Prepare { name, .. }
            | SessionEffect::Execute { name }
            | SessionEffect::Deallocate(Some(name)),
        ) => Some(name),
        _ => None,
    }
}

impl Session {
    /// Answer an error for a unit that could not be sent anywhere.
    pub(super) fn fail_unit(&mut self, unit: &ClientUnit, e: &ProxyError) {
        tracing::warn!(error = %e, "cannot route statement");
        if unit.synced {
            self.send_error(e, true);
        } else {
            // The client waits for Sync before ReadyForQuery; skip to it.
            self.send_error(e, false);
        }
    }

    /// BEGIN, an empty transaction's COMMIT, and `SET pgfresh.route` are answered by
    /// pgfresh itself. Returns true when the unit was answered.
    pub(super) fn answer_locally(&mut self, unit: &ClientUnit) -> Local {
        if !unit.simple {
            return match self.answer_extended_transaction(unit) {
                Local::No => self.answer_extended_deallocate(unit),
                other => other,
            };
        }
        let [analysis] = unit.parts.as_slice() else {
            return Local::No;
        };
        let [stmt] = analysis.statements.as_slice() else {
            return Local::No;
        };
        let busy = self.client_busy();
        if let Some(SessionEffect::Show(name)) = &stmt.session {
            if name == super::tokens::COMMIT_LSN {
                if busy {
                    return Local::Wait;
                }
                self.show_commit_lsn();
                return Local::Answered;
            }
        }
        if let Some(SessionEffect::Set { name, value, .. }) = &stmt.session {
            if name == "pgfresh.route" {
                if busy {
                    return Local::Wait;
                }
                let v = value
                    .as_deref()
                    .unwrap_or("auto")
                    .trim_matches('\'')
                    .to_ascii_lowercase();
                self.state.route_primary = v == "primary";
                if self.state.route_primary {
                    self.state.pins.insert(PinReason::RouteSetting);
                } else {
                    self.state.pins.remove(&PinReason::RouteSetting);
                }
                self.out.push(build::command_complete("SET"));
                self.out.push(build::ready_for_query(self.tx.status()));
                return Local::Answered;
            }
        }
        if let Some(SessionEffect::Deallocate(Some(name))) = &stmt.session {
            if self.deallocates_protocol_statement(name) {
                if busy {
                    return Local::Wait;
                }
                // Transaction mode: the statement lives on server connections under
                // pgfresh's name, shared by content; the client's name is simply gone.
                self.state.prepared.remove(name);
                self.out.push(build::command_complete("DEALLOCATE"));
                self.out.push(build::ready_for_query(self.tx.status()));
                return Local::Answered;
            }
        }
        match self.transaction_answer(stmt) {
            Some(answer) => {
                let local = self.answer_transaction(
                    answer,
                    analysis,
                    || unit.simple_sql().unwrap_or_default(),
                    [],
                );
                if unit.ready_hidden && matches!(local, Local::Answered) {
                    // The first part of a Query sent as two (`Session::take_split_query`):
                    // the client's ReadyForQuery is the second part's.
                    self.out.pop_ready_for_query();
                }
                local
            }
            None => Local::No,
        }
    }

    /// Whether pgfresh answers `stmt` itself now, and how: a BEGIN it defers, and the
    /// COMMIT or ROLLBACK of a transaction whose BEGIN it deferred.
    fn transaction_answer(&self, stmt: &pgfresh_sql::Statement) -> Option<TxAnswer> {
        let deferred = self.tx.deferred().is_some();
        match &stmt.tx {
            // pgfresh's own work (a position probe after the last commit) may still
            // run: the transaction's node is chosen with its first statement anyway.
            Some(TxEffect::Begin(_))
                if self.config.routing.enable_query_parser
                    && self.tx.is_idle()
                    && !self.client_busy() =>
            {
                Some(TxAnswer::Begin)
            }
            Some(TxEffect::Commit { .. } | TxEffect::Rollback { .. })
                if deferred && self.client_busy() =>
            {
                Some(TxAnswer::Wait)
            }
            Some(TxEffect::Commit { chain }) if deferred => Some(TxAnswer::End {
                tag: "COMMIT",
                chain: *chain,
            }),
            Some(TxEffect::Rollback { chain }) if deferred => Some(TxAnswer::End {
                tag: "ROLLBACK",
                chain: *chain,
            }),
            _ => None,
        }
    }

    /// Answers a unit as `answer` says: `prefix` gives the replies its messages get
    /// ahead of the CommandComplete (none for a Query), `sql` is the statement's text.
    fn answer_transaction<'a>(
        &mut self,
        answer: TxAnswer,
        analysis: &Arc<Analysis>,
        sql: impl FnOnce() -> &'a str,
        prefix: impl IntoIterator<Item = bytes::Bytes>,
    ) -> Local {
        let (tag, status) = match answer {
            TxAnswer::Wait => return Local::Wait,
            TxAnswer::Begin => {
                self.tx = TxPhase::Deferred(DeferredBegin {
                    // Read back from the frame only here: most units need no text.
                    sql: sql().to_string(),
                    analysis: analysis.clone(),
                });
                ("BEGIN", TxStatus::InTransaction)
            }
            // AND CHAIN: a new transaction with the same modes, which no server has seen
            // either; the deferred BEGIN stands for it.
            TxAnswer::End { tag, chain: true } => (tag, TxStatus::InTransaction),
            TxAnswer::End { tag, chain: false } => {
                self.tx = TxPhase::Idle;
                (tag, TxStatus::Idle)
            }
        };
        self.out.extend(prefix);
        self.out.push(build::command_complete(tag));
        self.out.push(build::ready_for_query(status));
        Local::Answered
    }

    /// The extended protocol's BEGIN and COMMIT or ROLLBACK, answered as the simple
    /// protocol's are (see `transaction_answer`), when the unit is the shape drivers send
    /// for one statement: the unnamed statement's Parse (no parameter types), a Bind of
    /// it to the unnamed portal with no parameters, an optional Describe of that portal or
    /// statement (tokio-postgres' `query_typed` describes the statement), its Execute,
    /// Sync. Each message gets what the server would answer: ParseComplete, BindComplete,
    /// NoData (a transaction statement returns no rows; a statement's description starts
    /// with a ParameterDescription of none), then the CommandComplete and ReadyForQuery.
    /// Any other shape goes to the server.
    fn answer_extended_transaction(&mut self, unit: &ClientUnit) -> Local {
        let [analysis] = unit.parts.as_slice() else {
            return Local::No;
        };
        let [stmt] = analysis.statements.as_slice() else {
            return Local::No;
        };
        if stmt.session.is_some() || !unit.synced {
            return Local::No;
        }
        // Asked before the frames are read: a COMMIT of a transaction open on a server
        // (the usual one) costs nothing here.
        let Some(answer) = self.transaction_answer(stmt) else {
            return Local::No;
        };
        let Some((sql, described)) = pgfresh_wire::lone_statement(&unit.frames) else {
            return Local::No;
        };
        // ParseComplete and BindComplete; a Describe gets NoData, after a
        // ParameterDescription of no parameters when it describes the statement.
        let prefix = [build::parse_complete(), build::bind_complete()]
            .into_iter()
            .chain((described == Some(b'S')).then(build::no_parameters))
            .chain(described.is_some().then(build::no_data));
        self.answer_transaction(answer, analysis, || sql, prefix)
    }

    /// Transaction mode: `DEALLOCATE name` of a protocol-level statement sent with the
    /// extended protocol (psycopg's maintenance commands: unnamed Parse, Bind, Execute,
    /// Sync), answered message by message as the server would.
    fn answer_extended_deallocate(&mut self, unit: &ClientUnit) -> Local {
        // The Parse and the Bind of the unnamed statement bring its analysis (once:
        // a Bind of the statement its batch parsed adds none).
        let deallocated = |a: &Analysis| match a.statements.as_slice() {
            [stmt] => match &stmt.session {
                Some(SessionEffect::Deallocate(Some(name))) => Some(name.clone()),
                _ => None,
            },
            _ => None,
        };
        let Some(name) = unit.parts.first().and_then(|a| deallocated(a)) else {
            return Local::No;
        };
        if !unit
            .parts
            .iter()
            .all(|a| deallocated(a).as_deref() == Some(name.as_str()))
        {
            return Local::No;
        }
        let name = &name;
        // Only the shape drivers send: an unnamed Parse, Bind, Describe of the portal,
        // Execute, Sync (Flush anywhere).
        let shape = unit.synced
            && unit.frames.iter().all(|f| match f.first() {
                Some(b'P') => f.get(5) == Some(&0),
                Some(b'D') => f.get(5) == Some(&b'P'),
                Some(b'B' | b'E' | b'S' | b'H') => true,
                _ => false,
            });
        if !shape || !self.deallocates_protocol_statement(name) {
            return Local::No;
        }
        if self.client_busy() {
            return Local::Wait;
        }
        self.state.prepared.remove(name);
        for f in &unit.frames {
            match f.first() {
                Some(b'P') => self.out.push(build::parse_complete()),
                Some(b'B') => self.out.push(build::bind_complete()),
                Some(b'D') => self.out.push(build::no_data()),
                Some(b'E') => self.out.push(build::command_complete("DEALLOCATE")),
                Some(b'S') => self.out.push(build::ready_for_query(self.tx.status())),
                _ => {}
            }
        }
        Local::Answered
    }

    /// `DEALLOCATE name` of one of the client's protocol-level statements, in transaction
    /// mode, outside a failed transaction (where the server would refuse it).
    fn deallocates_protocol_statement(&self, name: &str) -> bool {
        self.mode == pgfresh_config::PoolMode::Transaction
            && !matches!(self.tx, TxPhase::Failed)
            && self.state.prepared.contains_key(name)
            && !self.state.sql_prepared.contains_key(name)
            && !self.holds_under_client_name(name)
    }

    /// A connection the session holds has the client's statement `name` under that name
    /// (an EXECUTE ran it there, see `send::put_protocol_statement`): a DEALLOCATE of it
    /// goes to that connection, so that it is gone there too.
    fn holds_under_client_name(&self, name: &str) -> bool {
        self.backends
            .iter()
            .flatten()
            .any(|l| l.conn.sql_prepared.contains_key(name))
    }

    /// Transaction mode: a SQL-level PREPARE, EXECUTE or DEALLOCATE in `unit` of a name
    /// in pgfresh's own space ([`crate::statements::PREFIX`]). On a shared connection it
    /// would reach a statement pgfresh prepared there for any client: refused.
    pub(super) fn reserved_statement_name(&self, unit: &ClientUnit) -> Option<ProxyError> {
        if self.mode != pgfresh_config::PoolMode::Transaction {
            return None;
        }
        unit.parts
            .iter()
            .flat_map(|a| a.statements.iter().filter_map(statement_name))
            .find(|n| n.starts_with(crate::statements::PREFIX))
            .map(|n| ProxyError::ReservedStatementName(n.to_string()))
    }

    /// The modes of a transaction an AND CHAIN began on a standby are still being asked
    /// there (see `chain_anew`): the client's next units wait for them.
    pub(super) fn chain_modes_pending(&self) -> bool {
        self.tx.deferred().is_some()
            && self
                .inflight
                .iter()
                .any(|u| matches!(u.injected, Some(super::unit::Injected::ChainModes(_))))
    }

    /// Units of the client's are running: anything pgfresh answers itself must wait.
    pub(super) fn client_busy(&self) -> bool {
        self.inflight.iter().any(|u| !u.is_injected()) || self.tokens.held_ready.is_some()
    }

    pub(super) fn route(&mut self, unit: &ClientUnit, token: TokenNeed) -> Decision {
        if unit.force_primary {
            return Decision {
                target: Target::Primary,
                reason: Reason::MustPrimary("function_call"),
            };
        }
        if unit.refused_by_standby {
            return Decision {
                target: Target::Primary,
                reason: Reason::StandbyRefused,
            };
        }
        self.refresh_graph();
        let deps = &self.graph;
        // Only units that call functions need the catalog.
        let functions = if unit.parts.iter().any(|a| !a.functions.is_empty()) {
            self.shared
                .catalog
                .functions(&self.shared, &self.login.database)
        } else {
            None
        };
        // A one-statement read outside any transaction, pin, hint or token: its route may
        // be kept (see `cold_read`). The recency map's count is read before its lookup.
        let changes = self
            .route_keepable(unit, token)
            .then(|| self.shared.recency.changes());
        // (Fields borrowed apart, not cloned: each Arc clone is a locked increment and
        // decrement a statement.)
        let (config, policy) = (&self.config, self.policy.load());
        let inputs = changes.map(|changes| cold_read::RouteInputs {
            analysis: &unit.parts[0],
            graph: deps,
            config,
            policy,
            functions: &functions,
            changes,
        });
        if let Some(i) = &inputs {
            if self.cold_read.as_ref().is_some_and(|c| c.holds_for(i)) {
                return self.unless_refused(unit, cold_read::COLD);
            }
        }
        let ctx = RouteCtx {
            routing: &config.routing,
            policy,
            oracle: functions
                .as_deref()
                .map(|f| f as &dyn pgfresh_sql::VolatilityOracle),
            recency: &self.shared.recency,
            database: &self.login.database,
            deps: deps.as_deref(),
        };
        let mut parts: smallvec::SmallVec<[&Analysis; 8]> = smallvec::SmallVec::new();
        if let Some(d) = self.tx.deferred() {
            parts.push(&d.analysis);
        }
        parts.extend(unit.parts.iter().map(|a| &**a));
        let view = SessionView {
            in_transaction: self.tx.on_server(),
            read_only_txn: self.state.default_read_only,
            pinned: self.state.pinned().map(PinReason::as_str).or(self
                .state
                .default_serializable
                .then_some("serializable_default")),
            route_primary: self.state.route_primary,
            token,
        };
        let d = decide(&parts, &view, &ctx);
        // (A cold read has no cursor to follow: `cursor_node` places only units of
        // session-state statements, or a transaction a pin sent to the primary.)
        if let Some(i) = inputs.filter(|_| d == cold_read::COLD) {
            cold_read::ColdRead::keep(&mut self.cold_read, &i);
            return self.unless_refused(unit, d);
        }
        if let Some(node) = self.cursor_node(unit, &d, token) {
            return Decision {
                target: Target::Node(node),
                reason: Reason::SessionPinned(PinReason::HoldCursor.as_str()),
            };
        }
        if matches!(d.target, Target::Replica { .. }) {
            return self.unless_refused(unit, d);
        }
        d
    }

    /// `d`, which sends `unit` to a replica, unless a standby refused this statement of
    /// this login lately (see `refused`): then the primary.
    fn unless_refused(&self, unit: &ClientUnit, d: Decision) -> Decision {
        if self.refused_lately(unit) {
            return Decision {
                target: Target::Primary,
                reason: Reason::StandbyRefused,
            };
        }
        d
    }

    /// `unit`'s route may be kept for the next time (`cold_read`): it is one statement's
    /// read, outside any transaction (none open or deferred), pin, routing hint of the
    /// session's, or position token; all of which the router reads besides its inputs.
    fn route_keepable(&self, unit: &ClientUnit, token: TokenNeed) -> bool {
        unit.parts.len() == 1
            && token == TokenNeed::None
            && self.tx.is_idle()
            && self.state.pinned().is_none()
            && !self.state.default_serializable
            && !self.state.route_primary
    }

    /// The node holding a WITH HOLD cursor that `unit` fetches from, moves or closes, when
    /// the unit runs there: its statements are all session-state ones (FETCH, MOVE, CLOSE,
    /// SET, ...) or transaction control, and either no transaction is open (`d` sends it
    /// where the session is) or a read-only transaction starts with it (the pin alone sent
    /// that to the primary) and the node has replayed what such a transaction needs. The
    /// cursor exists on that node only; the primary, where the pin sends the session's
    /// reads, has none.
    fn cursor_node(&self, unit: &ClientUnit, d: &Decision, token: TokenNeed) -> Option<usize> {
        let starts_transaction = match (&self.tx, d.target, d.reason) {
            (TxPhase::Idle, Target::Current, _) => false,
            (TxPhase::Idle | TxPhase::Deferred(_), _, Reason::SessionPinned(_)) => true,
            _ => return None,
        };
        let mut statements = unit.parts.iter().flat_map(|a| &a.statements).peekable();
        statements.peek()?;
        let mut node = None;
        for s in statements {
            if !matches!(
                s.kind,
                pgfresh_sql::Kind::Session | pgfresh_sql::Kind::Transaction
            ) {
                return None;
            }
            let name = match &s.session {
                Some(SessionEffect::Fetch(name) | SessionEffect::CloseCursor(Some(name))) => name,
                _ => continue,
            };
            node = node.or(self.state.cursor_node(name));
        }
        let node = node?;
        (!starts_transaction || self.snapshot_fresh_on(node, token)).then_some(node)
    }

    /// A read-only transaction may start on `node`: it is the primary, or it has replayed
    /// every write acknowledged in the database within the recency window and the
    /// session's position token (as `router::decide` asks of the replica it picks).
    fn snapshot_fresh_on(&self, node: usize, token: TokenNeed) -> bool {
        let view = self.shared.balancer.view();
        if view.primary == Some(node) {
            return true;
        }
        let replayed = view.node(node).and_then(|n| n.replay_lsn);
        let reached = |l: pgfresh_lsn::Lsn| replayed.is_some_and(|r| r >= l);
        let database = if self.config.routing.enable_recent_access_routing {
            self.shared.recency.lookup_database(&self.login.database)
        } else {
            pgfresh_recency::Hotness::Cold
        };
        let database_ok = match database {
            pgfresh_recency::Hotness::Cold => true,
            pgfresh_recency::Hotness::Hot { required_lsn, .. } => required_lsn.is_some_and(reached),
        };
        let token_ok = match token {
            TokenNeed::None => true,
            TokenNeed::Position(l) => reached(l),
            TokenNeed::Primary(_) => false,
        };
        database_ok && token_ok
    }

    /// A standby refused one of `unit`'s statements, run by this session's user in its
    /// database, within `refused::REMEMBER`.
    fn refused_lately(&self, unit: &ClientUnit) -> bool {
        let refused = &self.shared.refused;
        !refused.is_empty()
            && refused.refused(
                crate::refused::login_key(&self.login.database, &self.login.user.name),
                &unit.parts,
                std::time::Instant::now(),
            )
    }

    /// The PF001 error of `on_stale = "error"`, naming the position a read required and the
    /// most advanced replay position among the replicas in the pool.
    fn stale_error(&self, required: Option<pgfresh_lsn::Lsn>) -> ProxyError {
        let view = self.shared.balancer.view_now();
        let best = view
            .eligible()
            .filter_map(|id| view.node(id).and_then(|n| n.replay_lsn.map(|l| (n, l))))
            .max_by_key(|(_, l)| *l)
            .map(|(n, l)| {
                let tli = n.timeline.map(|t| format!("{t}/")).unwrap_or_default();
                format!("{tli}{l} on {}", n.spec.name)
            })
            .unwrap_or_else(|| "nothing (no replica in the read pool)".into());
        let tli = view
            .primary
            .and_then(|p| view.node(p))
            .and_then(|n| n.timeline)
            .map(|t| format!("{t}/"))
            .unwrap_or_default();
        ProxyError::StaleReplica {
            required: required.map_or_else(String::new, |l| format!("{tli}{l}")),
            best,
        }
    }

    /// Brings `graph` up to the dependency graph of the session's database, when learned
    /// (or configured), once per turn of the session loop (routing and marking both read
    /// it).
    pub(super) fn refresh_graph(&mut self) {
        if self.graph_turn {
            return;
        }
        self.graph_turn = true;
        self.shared.deps.refresh_graph(
            &self.shared,
            &self.login.database,
            &mut self.deps_entry,
            &mut self.graph,
        );
    }

    /// A write analysed at `stamp` ([`crate::schema_window::SchemaWindow::stamp`])
    /// commits: whether an effect-changing schema change was sent since, which the
    /// write may have run under (it waited for the change's lock, say).
    pub(super) fn schema_changed_since(&self, stamp: Option<crate::schema_window::Stamp>) -> bool {
        match (stamp, self.shared.deps.window(&self.deps_entry)) {
            (Some(s), Some(w)) => w.changed_since(s),
            _ => false,
        }
    }

    /// DDL committed: the database's dependencies may have changed.
    pub(super) fn ddl_done(&self) {
        self.shared.deps.invalidate(&self.login.database);
        self.shared.catalog.invalidate(&self.login.database);
    }

    /// `wal_feed = "strict"` and `d` sends a unit to a replica: it must wait for the feed
    /// (see [`Session::after_wal_feed`]).
    pub(super) fn waits_for_wal_feed(&self, d: &Decision) -> bool {
        self.config.routing.wal_feed == pgfresh_config::WalFeed::Strict
            && matches!(d.target, Target::Replica { .. })
    }

    /// A unit bound for a replica under `wal_feed = "strict"` goes there only once the
    /// database's feed has marked every commit made before now (routed again with what
    /// it marked); otherwise to the primary.
    pub(super) async fn after_wal_feed(&mut self, unit: &ClientUnit, token: TokenNeed) -> Decision {
        let limit = std::time::Duration::from_millis(self.config.routing.wal_feed_wait_ms);
        let feed = self
            .shared
            .wal_feeds
            .feed(&self.shared, &self.login.database);
        let started = std::time::Instant::now();
        // Boxed: the wait's state is not kept in every session's future.
        let caught_up = Box::pin(feed.caught_up(limit)).await;
        let outcome = if caught_up { "caught_up" } else { "primary" };
        metrics::histogram!("pgfresh_wal_feed_wait_seconds", "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        if caught_up {
            self.route(unit, token)
        } else {
            Decision {
                target: Target::Primary,
                reason: Reason::WalFeed,
            }
        }
    }

    /// `replica_wait_ms`: when no replica has replayed `lsn` yet, wait (bounded) for one
    /// to, so the read can still leave the primary. The wait is recorded in
    /// `pgfresh_replica_wait_seconds` with its outcome.
    pub(super) async fn wait_for_replica(&self, lsn: pgfresh_lsn::Lsn) {
        let wait = self.config.routing.replica_wait_ms;
        if wait == 0 || self.shared.balancer.select_replica(Some(lsn)).is_some() {
            return;
        }
        let started = std::time::Instant::now();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(wait);
        let outcome = match self.shared.balancer.wait_for(lsn, deadline).await {
            Ok(_) => "replayed",
            Err(_) => "timeout",
        };
        metrics::histogram!("pgfresh_replica_wait_seconds", "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
    }

    /// Which relation forced this read to the primary, for the per-relation counter
    /// (only hot reads pay for this second lookup).
    pub(super) fn count_forced(&self, unit: &ClientUnit) {
        let db = &self.login.database;
        for name in unit.parts.iter().flat_map(|a| &a.reads) {
            let key = [crate::router::rel_key(name)];
            if let pgfresh_recency::Hotness::Hot { relation, .. } =
                self.shared.recency.lookup(db, &key)
            {
                // The name is written out only when the answer does not name the relation
                // (a cold start).
                match relation.as_deref() {
                    Some(r) => self.shared.count_forced(r),
                    None => self.shared.count_forced(&name.to_string()),
                }
                return;
            }
        }
    }

    /// Turn a decision into a node.
    pub(super) fn resolve(
        &mut self,
        d: Decision,
        avoid: Option<usize>,
        token: TokenNeed,
    ) -> Result<usize, ProxyError> {
        // Read once: the session's cached reader of the balancer (see `balancer`).
        let primary_now = self.balancer.primary();
        let primary = || primary_now.ok_or_else(|| self.shared.no_primary());
        let (node, reason) = match d.target {
            Target::Primary => (primary()?, d.reason),
            Target::Current => (self.active.map_or_else(primary, Ok)?, d.reason),
            Target::Node(node) => (node, d.reason),
            // A few tries to draw a replica other than `avoid`; none at all eligible is
            // known at the first (a hot read no replica has caught up with asked four
            // times before).
            Target::Replica { required } => match (0..4)
                .map_while(|_| self.balancer.select_replica(required))
                .find(|s| Some(**s) != avoid)
            {
                Some(sel) => {
                    let node = *sel;
                    self.replica_guard = Some(sel);
                    (node, d.reason)
                }
                // A hot read no replica has caught up with yet: the primary, as for any
                // hot read; after a replica wait that timed out it is a counted fallback.
                None if required.is_some() => {
                    let cfg = self.config.clone();
                    if let (TokenNeed::Position(_), pgfresh_config::OnStale::Error) =
                        (token, cfg.routing.on_stale)
                    {
                        metrics::counter!("pgfresh_consistency_rejections_total", "reason" => "on_stale")
                            .increment(1);
                        return Err(self.stale_error(required));
                    }
                    if cfg.routing.replica_wait_ms > 0 {
                        let Some(slot) =
                            FallbackSlot::try_take(&self.shared, cfg.routing.max_primary_fallbacks)
                        else {
                            metrics::counter!("pgfresh_consistency_rejections_total", "reason" => "fallback_limit")
                                .increment(1);
                            return Err(ProxyError::FallbackLimit);
                        };
                        self.fallback_slot = Some(slot);
                        metrics::counter!("pgfresh_primary_fallbacks_total", "reason" => "replica_wait_timeout")
                            .increment(1);
                    }
                    // Counted apart from a hot read whose position is unknown.
                    (primary()?, Reason::HotRelationLsn)
                }
                None => {
                    let max = self.config.routing.max_primary_fallbacks;
                    let Some(slot) = FallbackSlot::try_take(&self.shared, max) else {
                        metrics::counter!("pgfresh_consistency_rejections_total", "reason" => "fallback_limit")
                            .increment(1);
                        return Err(ProxyError::FallbackLimit);
                    };
                    self.fallback_slot = Some(slot);
                    self.no_replica_fallbacks
                        .get_or_insert_with(|| {
                            metrics::counter!("pgfresh_primary_fallbacks_total", "reason" => "no_eligible_replica")
                        })
                        .increment(1);
                    (primary()?, Reason::NoEligibleReplica)
                }
            },
        };
        let is_primary = primary_now == Some(node);
        self.count_routed(is_primary, reason.as_str());
        tracing::debug!(
            node,
            reason = reason.as_str(),
            detail = reason.detail(),
            "routed"
        );
        Ok(node)
    }

    /// `pgfresh_routed_total{target, reason}`, through the session's own handles (a
    /// labelled lookup in the registry costs more than the rest of the count).
    fn count_routed(&mut self, primary: bool, reason: &'static str) {
        if let Some((_, _, c)) = self
            .routed
            .iter()
            .find(|(p, r, _)| *p == primary && std::ptr::eq(*r, reason))
        {
            c.increment(1);
            return;
        }
        let c = metrics::counter!(
            "pgfresh_routed_total",
            "target" => if primary { "primary" } else { "replica" },
            "reason" => reason
        );
        c.increment(1);
        self.routed.push((primary, reason, c));
    }
}

/// A session's cache of [`Shared::policy`] (see [`PolicyCache::load`]).
pub(super) struct PolicyCache(arc_swap::Cache<PolicyOf, Arc<pgfresh_sql::FunctionPolicy>>);

/// `Shared::policy`, reached through an owned `Shared`, for [`PolicyCache`].
#[derive(Clone)]
struct PolicyOf(Arc<Shared>);

impl std::ops::Deref for PolicyOf {
    type Target = arc_swap::ArcSwap<pgfresh_sql::FunctionPolicy>;
    fn deref(&self) -> &Self::Target {
        &self.0.policy
    }
}

impl PolicyCache {
    pub(super) fn new(shared: &Arc<Shared>) -> Self {
        PolicyCache(arc_swap::Cache::new(PolicyOf(shared.clone())))
    }

    /// The function lists in force: one atomic read while they stay the same (a guarded
    /// load of `Shared::policy` costs about a hundred instructions).
    pub(super) fn load(&mut self) -> &Arc<pgfresh_sql::FunctionPolicy> {
        self.0.load()
    }
}
