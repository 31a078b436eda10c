//! Client frames → units → routed and sent.

use std::sync::Arc;

use bytes::Bytes;
use pgfresh_sql::{Analysis, DiscardKind, MustPrimary, SessionEffect, Statement, TxEffect};
use pgfresh_wire::{build, parse_frontend, FrontendMessage, TxStatus};

use super::settings::{event_of, StmtEvent};
use super::state::{text_hash, PinReason, Prepared};
use super::unit::{ClientUnit, InFlight};
use super::{DeferredBegin, Session};
use crate::context::FallbackSlot;
use crate::error::ProxyError;
use crate::io::{try_frame, Side};
use crate::router::{decide, Decision, Reason, RouteCtx, SessionView, Target, TokenNeed};

/// An extended batch larger than this is sent before its Sync arrives.
const MAX_BATCH_BYTES: usize = 1 << 20;

/// Whether pgfresh answers a unit itself.
enum Local {
    Answered,
    /// It will, once the replies to the units ahead of it have been relayed.
    Wait,
    No,
}

/// What executing the statement prepared as `p` means for the session's settings.
fn portal_event(p: &Prepared) -> StmtEvent {
    let [stmt] = p.analysis.statements.as_slice() else {
        return StmtEvent::Other;
    };
    if stmt.session.is_none() && stmt.tx.is_none() {
        return StmtEvent::Other;
    }
    let frame = pgfresh_wire::Frame {
        tag: b'P',
        raw: p.parse.clone(),
    };
    let text = match parse_frontend(&frame) {
        Ok(FrontendMessage::Parse { sql, .. }) => sql.get(stmt.text_range.0..stmt.text_range.1),
        _ => None,
    };
    event_of(stmt, text)
}

/// An Analysis for a single statement (the inner statement of SQL PREPARE).
fn analysis_of(stmt: &Statement) -> Analysis {
    Analysis {
        statements: vec![stmt.clone()],
        kind: stmt.kind,
        reads: stmt.reads.clone(),
        writes: stmt.writes.clone(),
        must_primary: stmt.must_primary.clone(),
        functions: stmt.functions.clone(),
        touches_catalog: stmt.touches_catalog,
        hint: None,
        min_lsn_hint: None,
        min_lsn_malformed: false,
        comments: Vec::new(),
        error: None,
    }
}

impl Session {
    /// The analysis of `sql`, or a stand-in when the parser is off (everything then goes
    /// to the primary and nothing needs parsing).
    fn analyze(&self, sql: &str) -> Arc<Analysis> {
        if self.parser_enabled {
            self.shared.analyzer.analyze(sql)
        } else {
            self.shared.not_analyzed.clone()
        }
    }

    /// Split every complete client frame off the buffer into units (up to the first
    /// unit that must be routed). Returns whether any frame was taken.
    pub(super) fn process_client(&mut self) -> Result<bool, ProxyError> {
        self.parser_enabled = self.shared.config.snapshot().routing.enable_query_parser;
        let mut consumed = false;
        while !self.terminating && self.ready.back().is_none_or(|u| u.passthrough) {
            let Some(frame) = try_frame(&mut self.cbuf, &self.limits, Side::Frontend)? else {
                return Ok(consumed);
            };
            consumed = true;
            let msg = parse_frontend(&frame)?;
            match msg {
                FrontendMessage::Query { sql } => {
                    self.close_batch_early();
                    let mut unit = ClientUnit::new();
                    let analysis = self.analyze(sql);
                    for name in analysis.executes() {
                        if let Some((_, inner)) = self.state.sql_prepared.get(name) {
                            unit.parts.push(inner.clone());
                            unit.sql_executes.push(name.to_string());
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
                    unit.parts.insert(0, analysis);
                    unit.simple_sql = Some(sql.to_string());
                    unit.synced = true;
                    unit.frames.push(frame.raw);
                    self.ready.push_back(unit);
                }
                FrontendMessage::Parse { name, sql, .. } => {
                    let analysis = self.analyze(sql);
                    self.state.prepared.insert(
                        name.to_string(),
                        Prepared {
                            parse: frame.raw.clone(),
                            analysis: analysis.clone(),
                            hash: text_hash(&frame.raw),
                        },
                    );
                    self.batch.parts.push(analysis);
                    self.batch.parses.push(name.to_string());
                    self.push_batch(frame.raw);
                }
                FrontendMessage::Bind {
                    portal, statement, ..
                } => {
                    let mut event = StmtEvent::Other;
                    if let Some(p) = self.state.prepared.get(statement) {
                        self.batch.parts.push(p.analysis.clone());
                        event = portal_event(p);
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
                FrontendMessage::Describe { kind, name } => {
                    if kind == b'S' && !self.batch.parses.iter().any(|n| n == name) {
                        self.batch.uses_statements.push(name.to_string());
                    }
                    self.push_batch(frame.raw);
                }
                FrontendMessage::Close { kind, name } => {
                    if kind == b'S' {
                        self.state.prepared.remove(name);
                        self.batch.parses.retain(|n| n != name);
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
                    let unit = std::mem::take(&mut self.batch);
                    self.ready.push_back(unit);
                }
                FrontendMessage::Flush => {
                    self.batch.frames.push(frame.raw);
                    let unit = std::mem::take(&mut self.batch);
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
                    let mut unit = ClientUnit::new();
                    unit.passthrough = true;
                    unit.frames.push(frame.raw);
                    self.ready.push_back(unit);
                }
                FrontendMessage::FunctionCall => {
                    let mut unit = ClientUnit::new();
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

    /// Send the extended messages collected so far as a unit of their own, before a
    /// message that does not belong to the batch.
    fn close_batch_early(&mut self) {
        if !self.batch.frames.is_empty() {
            let unit = std::mem::take(&mut self.batch);
            self.ready.push_back(unit);
        }
    }

    fn push_batch(&mut self, raw: Bytes) {
        self.batch.frames.push(raw);
        if self.batch.bytes() > MAX_BATCH_BYTES {
            let unit = std::mem::take(&mut self.batch);
            self.ready.push_back(unit);
        }
    }

    /// Route and send ready units in order, stopping at one that must wait for the
    /// active backend to drain.
    pub(super) async fn dispatch_ready(&mut self) -> Result<(), ProxyError> {
        while let Some(unit) = self.ready.pop_front() {
            if unit.passthrough {
                let Some(node) = self.active else { continue };
                if unit
                    .frames
                    .iter()
                    .any(|f| matches!(f.first(), Some(b'c' | b'f')))
                {
                    self.copy_in = false;
                }
                self.send_frames(node, &unit.frames).await?;
                continue;
            }
            if let Some(node) = self.open_unit_node {
                self.send_unit(node, unit, None, Reason::InTransaction)
                    .await?;
                continue;
            }
            match self.answer_locally(&unit) {
                Local::Answered => continue,
                Local::Wait => {
                    // Replies to units ahead of it must reach the client first.
                    self.ready.push_front(unit);
                    return Ok(());
                }
                Local::No => {}
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
            if decision.reason == Reason::HotRelation {
                self.count_forced(&unit);
            }
            if let Target::Replica {
                required: Some(lsn),
            } = decision.target
            {
                self.wait_for_replica(lsn).await;
            }
            let node = match self.resolve(decision, unit.avoid, token) {
                Ok(n) => n,
                Err(_) if self.client_busy() => {
                    // The error must follow the replies to the units ahead of it.
                    self.ready.push_front(unit);
                    return Ok(());
                }
                Err(e) => {
                    // Nothing was sent: answer this unit with the error and go on.
                    self.fail_unit(&unit, &e);
                    continue;
                }
            };
            if Some(node) != self.active && !self.inflight.is_empty() {
                // Pipelined units ahead are still running on another node.
                self.ready.push_front(unit);
                return Ok(());
            }
            if let Err(e) = self.attach(node).await {
                self.fail_unit(&unit, &e);
                continue;
            }
            self.send_unit(node, unit, Some(decision), decision.reason)
                .await?;
        }
        Ok(())
    }

    /// Answer an error for a unit that could not be sent anywhere.
    fn fail_unit(&mut self, unit: &ClientUnit, e: &ProxyError) {
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
    fn answer_locally(&mut self, unit: &ClientUnit) -> Local {
        let Some(sql) = &unit.simple_sql else {
            return Local::No;
        };
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
                self.out.push(build::ready_for_query(self.tx));
                return Local::Answered;
            }
        }
        let enabled = self.shared.config.snapshot().routing.enable_query_parser;
        match &stmt.tx {
            Some(TxEffect::Begin(_))
                if enabled && self.tx == TxStatus::Idle && self.inflight.is_empty() =>
            {
                self.deferred_begin = Some(DeferredBegin {
                    sql: sql.clone(),
                    analysis: analysis.clone(),
                });
                self.tx = TxStatus::InTransaction;
                self.out.push(build::command_complete("BEGIN"));
                self.out
                    .push(build::ready_for_query(TxStatus::InTransaction));
                Local::Answered
            }
            Some(TxEffect::Commit { .. }) | Some(TxEffect::Rollback { .. })
                if self.deferred_begin.is_some() && busy =>
            {
                Local::Wait
            }
            Some(TxEffect::Commit { .. }) | Some(TxEffect::Rollback { .. })
                if self.deferred_begin.is_some() =>
            {
                self.deferred_begin = None;
                self.tx = TxStatus::Idle;
                let tag = if matches!(stmt.tx, Some(TxEffect::Commit { .. })) {
                    "COMMIT"
                } else {
                    "ROLLBACK"
                };
                self.out.push(build::command_complete(tag));
                self.out.push(build::ready_for_query(TxStatus::Idle));
                Local::Answered
            }
            _ => Local::No,
        }
    }

    /// Units of the client's are running: anything pgfresh answers itself must wait.
    fn client_busy(&self) -> bool {
        self.inflight.iter().any(|u| !u.injected)
    }

    fn route(&self, unit: &ClientUnit, token: TokenNeed) -> Decision {
        if unit.force_primary {
            return Decision {
                target: Target::Primary,
                reason: Reason::MustPrimary("function_call"),
            };
        }
        let config = self.shared.config.snapshot();
        let policy = self.shared.policy.load();
        let deps = self.dep_graph();
        // Only units that call functions need the catalog.
        let functions = if unit.parts.iter().any(|a| !a.functions.is_empty()) {
            self.shared
                .catalog
                .functions(&self.shared, &self.login.database)
        } else {
            None
        };
        let ctx = RouteCtx {
            routing: &config.routing,
            policy: &policy,
            oracle: functions
                .as_deref()
                .map(|f| f as &dyn pgfresh_sql::VolatilityOracle),
            recency: &self.shared.recency,
            database: &self.login.database,
            deps: deps.as_deref(),
        };
        let mut parts: Vec<&Analysis> = Vec::with_capacity(unit.parts.len() + 1);
        if let Some(d) = &self.deferred_begin {
            parts.push(&d.analysis);
        }
        parts.extend(unit.parts.iter().map(|a| &**a));
        let view = SessionView {
            in_transaction: self.tx != TxStatus::Idle && self.deferred_begin.is_none(),
            read_only_txn: self.state.default_read_only,
            pinned: self.state.pinned().map(PinReason::as_str),
            route_primary: self.state.route_primary,
            token,
        };
        decide(&parts, &view, &ctx)
    }

    /// The PF001 error of `on_stale = "error"`, naming the position a read required and the
    /// most advanced replay position among the replicas in the pool.
    fn stale_error(&self, required: Option<pgfresh_lsn::Lsn>) -> ProxyError {
        let view = self.shared.balancer.view();
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

    /// The dependency graph of the session's database, when learned (or configured).
    pub(super) fn dep_graph(&self) -> Option<Arc<pgfresh_deps::DepGraph>> {
        self.shared.deps.graph(&self.shared, &self.login.database)
    }

    /// DDL committed: the database's dependencies may have changed.
    pub(super) fn ddl_done(&self) {
        self.shared.deps.invalidate(&self.login.database);
    }

    /// `replica_wait_ms`: when no replica has replayed `lsn` yet, wait (bounded) for one
    /// to, so the read can still leave the primary. The wait is recorded in
    /// `pgfresh_replica_wait_seconds` with its outcome.
    async fn wait_for_replica(&self, lsn: pgfresh_lsn::Lsn) {
        let wait = self.shared.config.snapshot().routing.replica_wait_ms;
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
    fn count_forced(&self, unit: &ClientUnit) {
        let db = &self.login.database;
        for name in unit.parts.iter().flat_map(|a| &a.reads) {
            let key = [pgfresh_recency::RelKey {
                schema: name.schema.as_deref(),
                name: &name.name,
            }];
            if let pgfresh_recency::Hotness::Hot { relation, .. } =
                self.shared.recency.lookup(db, &key)
            {
                self.shared
                    .count_forced(relation.as_deref().unwrap_or(&name.to_string()));
                return;
            }
        }
    }

    /// Turn a decision into a node.
    fn resolve(
        &mut self,
        d: Decision,
        avoid: Option<usize>,
        token: TokenNeed,
    ) -> Result<usize, ProxyError> {
        let primary = || {
            self.shared
                .balancer
                .primary()
                .ok_or_else(|| self.shared.no_primary())
        };
        let (node, reason) = match d.target {
            Target::Primary => (primary()?, d.reason),
            Target::Current => (self.active.map_or_else(primary, Ok)?, d.reason),
            Target::Replica { required } => match (0..4)
                .filter_map(|_| self.shared.balancer.select_replica(required))
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
                    let cfg = self.shared.config.snapshot();
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
                    (primary()?, Reason::HotRelation)
                }
                None => {
                    let max = self.shared.config.snapshot().routing.max_primary_fallbacks;
                    let Some(slot) = FallbackSlot::try_take(&self.shared, max) else {
                        metrics::counter!("pgfresh_consistency_rejections_total", "reason" => "fallback_limit")
                            .increment(1);
                        return Err(ProxyError::FallbackLimit);
                    };
                    self.fallback_slot = Some(slot);
                    metrics::counter!("pgfresh_primary_fallbacks_total", "reason" => "no_eligible_replica").increment(1);
                    (primary()?, Reason::NoEligibleReplica)
                }
            },
        };
        let is_primary = self.shared.balancer.primary() == Some(node);
        metrics::counter!(
            "pgfresh_routed_total",
            "target" => if is_primary { "primary" } else { "replica" },
            "reason" => reason.as_str()
        )
        .increment(1);
        tracing::debug!(
            node,
            reason = reason.as_str(),
            detail = reason.detail(),
            "routed"
        );
        Ok(node)
    }

    /// Queue frames for `node` without waiting for the server to take them (see
    /// [`crate::server::ServerConn::queue`]).
    async fn send_frames(&mut self, node: usize, frames: &[Bytes]) -> Result<(), ProxyError> {
        let Some(leased) = self.backends[node].as_mut() else {
            return Err(ProxyError::NoPrimary(None));
        };
        let result = match frames {
            [one] => leased.conn.queue(one),
            many => {
                // One write for the whole unit.
                let total: usize = many.iter().map(Bytes::len).sum();
                leased.conn.wbuf.reserve(total);
                for f in many {
                    leased.conn.wbuf.extend_from_slice(f);
                }
                leased.conn.flush_some()
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
    async fn replay_settings(&mut self, node: usize) -> Result<(), ProxyError> {
        let frames: Vec<Bytes> = self.state.replay_statements().map(build::query).collect();
        self.send_frames(node, &frames).await?;
        for _ in &frames {
            let mut f = InFlight::injected();
            f.replay = true;
            self.inflight.push_back(f);
        }
        Ok(())
    }

    /// Queue an injected simple query (its replies are swallowed).
    async fn inject_query(&mut self, node: usize, sql: &str) -> Result<(), ProxyError> {
        self.send_frames(node, &[build::query(sql)]).await?;
        self.inflight.push_back(InFlight::injected());
        Ok(())
    }

    /// Send a routed unit to `node`, after whatever must precede it there: replayed
    /// settings, a deferred BEGIN, statements to prepare again.
    async fn send_unit(
        &mut self,
        node: usize,
        unit: ClientUnit,
        decision: Option<Decision>,
        reason: Reason,
    ) -> Result<(), ProxyError> {
        let continuing = decision.is_none();
        // An autocommit read bound for a replica may be sent again elsewhere if the
        // replica fails before answering.
        let retryable = matches!(
            decision,
            Some(Decision {
                target: Target::Replica { .. },
                ..
            })
        ) && unit.synced
            && self.tx == TxStatus::Idle
            && Some(node) != self.shared.balancer.primary();
        let synced = unit.synced;
        if !continuing {
            let conn_version = self.backends[node].as_ref().map(|l| l.conn.state_version);
            if conn_version != Some(self.state.version) {
                self.replay_settings(node).await?;
            }
            if let Some(begin) = self.deferred_begin.take() {
                self.inject_query(node, &begin.sql).await?;
            }
            for name in &unit.sql_executes {
                let key = format!("sql:{name}");
                let Some((text, _)) = self.state.sql_prepared.get(name).cloned() else {
                    continue;
                };
                let hash = text_hash(text.as_bytes());
                let has = self.backends[node]
                    .as_ref()
                    .and_then(|l| l.conn.prepared.get(&key).copied());
                if has != Some(hash) {
                    let mut sql = String::new();
                    if has.is_some() {
                        sql.push_str(&format!("DEALLOCATE {};", super::state::quote_ident(name)));
                    }
                    sql.push_str(&text);
                    self.inject_query(node, &sql).await?;
                    if let Some(l) = self.backends[node].as_mut() {
                        l.conn.prepared.insert(key, hash);
                    }
                }
            }
        }
        // Protocol-level statements this unit uses that the node does not have (or has
        // in another version), and client Parses of names the node still holds stale.
        let mut pre: Vec<Bytes> = Vec::new();
        let (mut swallow_parse, mut swallow_close) = (0u32, 0u32);
        if let Some(l) = self.backends[node].as_mut() {
            for name in &unit.uses_statements {
                let Some(p) = self.state.prepared.get(name) else {
                    continue;
                };
                match l.conn.prepared.get(name) {
                    Some(h) if *h == p.hash => {}
                    other => {
                        if other.is_some() && !name.is_empty() {
                            pre.push(build::close(b'S', name));
                            swallow_close += 1;
                        }
                        pre.push(p.parse.clone());
                        swallow_parse += 1;
                        l.conn.prepared.insert(name.clone(), p.hash);
                    }
                }
            }
            for name in &unit.parses {
                if !name.is_empty() && l.conn.prepared.contains_key(name) {
                    pre.push(build::close(b'S', name));
                    swallow_close += 1;
                }
                if let Some(p) = self.state.prepared.get(name) {
                    l.conn.prepared.insert(name.clone(), p.hash);
                }
            }
            if unit.simple_sql.is_some() {
                // A simple query destroys the unnamed statement.
                l.conn.prepared.remove("");
            }
        }
        // Session effects of this unit, applied optimistically; the node that runs the
        // unit is then up to date with the session's settings.
        self.apply_session_effects(&unit);
        for s in unit.parts.iter().flat_map(|a| &a.statements) {
            let key_hash = match &s.session {
                Some(SessionEffect::Prepare { name, .. }) => self
                    .state
                    .sql_prepared
                    .get(name)
                    .map(|(t, _)| (format!("sql:{name}"), Some(text_hash(t.as_bytes())))),
                Some(SessionEffect::Deallocate(Some(name))) => Some((format!("sql:{name}"), None)),
                _ => None,
            };
            if let (Some((key, hash)), Some(l)) = (key_hash, self.backends[node].as_mut()) {
                match hash {
                    Some(h) => l.conn.prepared.insert(key, h),
                    None => l.conn.prepared.remove(&key),
                };
            }
        }
        let autocommit = self.tx == TxStatus::Idle
            && !unit
                .parts
                .iter()
                .flat_map(|a| &a.statements)
                .any(|s| matches!(s.tx, Some(TxEffect::Begin(_))));
        let commit_sent = unit
            .parts
            .iter()
            .flat_map(|a| &a.statements)
            .any(|s| matches!(s.tx, Some(TxEffect::Commit { .. })));
        if let Some(l) = self.backends[node].as_mut() {
            l.conn.state_version = self.state.version;
        }
        if commit_sent {
            // resolve_lost_commits: the transaction-id probe goes first.
            self.watch_commit(node, &unit, continuing, &mut pre);
        }
        if pre.is_empty() {
            self.send_frames(node, &unit.frames).await?;
        } else {
            // One write: what must precede the unit, then the unit.
            pre.extend(unit.frames.iter().cloned());
            self.send_frames(node, &pre).await?;
        }
        let (writes, whole_db) = self.unit_writes(&unit);
        let ddl = unit.parts.iter().any(|a| a.kind == pgfresh_sql::Kind::Ddl);
        // LSN routing: a committing unit on the primary is followed by a probe of the
        // primary's WAL position, which resolves the unit's recency marks. Not after a
        // COPY FROM (the server would read the probe as COPY data): those writes stay
        // primary-only for the TTL.
        let copy_from = unit
            .parts
            .iter()
            .any(|a| a.must_primary.contains(&MustPrimary::CopyFrom));
        let probe = synced
            && !copy_from
            && (self.shared.config.snapshot().routing.lsn_routing || self.tokens.track)
            && Some(node) == self.shared.balancer.primary()
            && ((autocommit && (!writes.is_empty() || whole_db)) || commit_sent);
        let owed = if self.copy_in {
            0
        } else {
            unit.frames
                .iter()
                .filter(|f| matches!(f.first(), Some(b'Q' | b'S' | b'F')))
                .count() as u32
        };
        let events = unit.events.clone();
        if continuing {
            if let Some(last) = self.inflight.back_mut() {
                last.events.extend(events);
                last.writes.extend(writes);
                last.whole_db |= whole_db;
                last.ddl |= ddl;
                last.closed = unit.synced;
                last.commit_sent |= commit_sent;
                last.owed += owed;
            }
        } else {
            let mut f = InFlight::client(writes, autocommit, reason, unit.synced);
            f.events = events.into();
            f.whole_db = whole_db;
            f.ddl = ddl;
            f.swallow_parse = swallow_parse;
            f.swallow_close = swallow_close;
            f.commit_sent = commit_sent;
            f.owed = owed;
            f.simple = unit.simple_sql.is_some() || unit.force_primary;
            f.skip_acks = unit.skip_acks;
            // Kept (moved, not copied) so it can be sent again elsewhere.
            f.retry = retryable.then(|| Box::new(unit));
            self.inflight.push_back(f);
        }
        if continuing {
            if let Some(last) = self.inflight.back_mut() {
                last.swallow_parse += swallow_parse;
                last.swallow_close += swallow_close;
            }
        }
        if probe {
            self.send_frames(node, &[build::query("SELECT pg_current_wal_lsn()")])
                .await?;
            let mut f = InFlight::injected();
            f.probe = Some(super::unit::Probe::default());
            self.inflight.push_back(f);
        }
        self.open_unit_node = if synced { None } else { Some(node) };
        if commit_sent {
            self.after_commit_queued(node).await?;
        }
        Ok(())
    }

    /// The relations a unit writes: those its statements name, and what the catalog
    /// says those writes and the functions it calls write behind them (triggers,
    /// cascades, partitions, function bodies). `true` when something unanalysable may
    /// write anything in the database.
    fn unit_writes(&self, unit: &ClientUnit) -> (Vec<pgfresh_sql::RelName>, bool) {
        let mut writes = unit.writes();
        let Some(graph) = self.dep_graph().filter(|g| !g.is_empty()) else {
            return (writes, false);
        };
        let functions: Vec<pgfresh_sql::FuncName> = unit
            .parts
            .iter()
            .flat_map(|a| a.functions.iter().cloned())
            .collect();
        if writes.is_empty() && functions.is_empty() {
            return (writes, false);
        }
        let mut behind = Vec::new();
        let whole = graph
            .expand_writes(&writes, &functions, &mut behind)
            .is_whole_database();
        writes.extend(behind);
        writes.sort();
        writes.dedup();
        (writes, whole)
    }

    fn apply_session_effects(&mut self, unit: &ClientUnit) {
        for (i, a) in unit.parts.iter().enumerate() {
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
                let text = || {
                    let sql = if i == 0 {
                        unit.simple_sql.as_deref()
                    } else {
                        None
                    };
                    sql.and_then(|t| t.get(s.text_range.0..s.text_range.1))
                        .map(str::to_string)
                };
                match effect {
                    SessionEffect::Discard(kind) => match kind {
                        DiscardKind::All => {
                            // Settings are reset when the server confirms (settings.rs).
                            self.state.prepared.clear();
                            self.state.sql_prepared.clear();
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
                    SessionEffect::SetConfig { name, value, local }
                        if *local != Some(true)
                            && (name.is_none() || value.is_none() || local.is_none()) =>
                    {
                        // set_config with a value pgfresh cannot see: the setting cannot be
                        // replayed elsewhere, so the session stays where it is confirmed.
                        self.state.pins.insert(PinReason::UnknownSetting);
                    }
                    SessionEffect::Prepare { name, inner } => {
                        if let Some(t) = text() {
                            self.state
                                .sql_prepared
                                .insert(name.clone(), (t, Arc::new(analysis_of(inner))));
                        }
                    }
                    SessionEffect::Deallocate(Some(name)) => {
                        self.state.sql_prepared.remove(name);
                    }
                    SessionEffect::Deallocate(None) => self.state.sql_prepared.clear(),
                    SessionEffect::Listen(_) => {
                        self.state.pins.insert(PinReason::Listen);
                    }
                    SessionEffect::Unlisten(None) => {
                        self.state.pins.remove(&PinReason::Listen);
                    }
                    SessionEffect::DeclareCursor {
                        with_hold: true, ..
                    } => {
                        self.state.pins.insert(PinReason::HoldCursor);
                    }
                    SessionEffect::CloseCursor(None) => {
                        self.state.pins.remove(&PinReason::HoldCursor);
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
