//! Statement-level classification: maps each top-level parse node to a [`Statement`].

use pg_query::protobuf::{self, Node, ObjectType, TransactionStmtKind, VariableSetKind};
use pg_query::NodeEnum;

use crate::model::{
    DiscardKind, Isolation, Kind, MustPrimary, SessionEffect, Statement, TxEffect, TxModes,
};
use crate::names::RelName;
use crate::visit::{const_text, rel_name, Walker};

/// `CURSOR_OPT_HOLD` from PostgreSQL's `parsenodes.h`.
const CURSOR_OPT_HOLD: i32 = 0x0020;

/// Classifies one top-level statement node.
pub(crate) fn classify(node: &NodeEnum, range: (usize, usize)) -> Statement {
    let mut w = Walker::default();
    let mut tx = None;
    let kind = match node {
        NodeEnum::SelectStmt(_)
        | NodeEnum::InsertStmt(_)
        | NodeEnum::UpdateStmt(_)
        | NodeEnum::DeleteStmt(_)
        | NodeEnum::MergeStmt(_) => query_kind(&mut w, node),
        NodeEnum::TransactionStmt(t) => {
            let effect = transaction(t);
            if let TxEffect::Begin(m) = &effect {
                serializable_reason(&mut w, m);
            }
            if matches!(
                effect,
                TxEffect::PrepareTransaction(_)
                    | TxEffect::CommitPrepared(_)
                    | TxEffect::RollbackPrepared(_)
            ) {
                w.reasons.push(MustPrimary::TwoPhaseCommit);
            }
            // A prepared transaction's writes become visible here, and pgfresh may not
            // have seen them (another session or service prepared it): the whole database
            // counts as written.
            w.writes_unnamed = matches!(effect, TxEffect::CommitPrepared(_));
            tx = Some(effect);
            Kind::Transaction
        }
        NodeEnum::VariableSetStmt(v) => variable_set(&mut w, &mut tx, v),
        NodeEnum::VariableShowStmt(v) => {
            if matches!(
                v.name.as_str(),
                "transaction_read_only" | "in_hot_standby" | "default_transaction_read_only"
            ) {
                w.reasons.push(MustPrimary::ServerState(v.name.clone()));
            }
            w.session = Some(SessionEffect::Show(v.name.clone()));
            Kind::Read
        }
        NodeEnum::DiscardStmt(d) => {
            let k = match protobuf::DiscardMode::try_from(d.target) {
                Ok(protobuf::DiscardMode::DiscardPlans) => DiscardKind::Plans,
                Ok(protobuf::DiscardMode::DiscardSequences) => DiscardKind::Sequences,
                Ok(protobuf::DiscardMode::DiscardTemp) => DiscardKind::Temp,
                _ => DiscardKind::All,
            };
            w.session = Some(SessionEffect::Discard(k));
            Kind::Session
        }
        NodeEnum::PrepareStmt(p) => {
            let inner = match p.query.as_deref().and_then(|q| q.node.as_ref()) {
                Some(q) => classify(q, range),
                None => Statement::new(Kind::Unclassified, range),
            };
            w.session = Some(SessionEffect::Prepare {
                name: p.name.clone(),
                inner: Box::new(inner),
            });
            Kind::Session
        }
        NodeEnum::ExecuteStmt(e) => {
            for p in &e.params {
                w.expr(p);
            }
            w.session = Some(SessionEffect::Execute {
                name: e.name.clone(),
            });
            Kind::Session
        }
        NodeEnum::DeallocateStmt(d) => {
            let name = (!d.isall && !d.name.is_empty()).then(|| d.name.clone());
            w.session = Some(SessionEffect::Deallocate(name));
            Kind::Session
        }
        NodeEnum::ListenStmt(l) => {
            w.reasons.push(MustPrimary::Listen);
            w.session = Some(SessionEffect::Listen(l.conditionname.clone()));
            Kind::Session
        }
        NodeEnum::UnlistenStmt(u) => {
            let name = (!u.conditionname.is_empty()).then(|| u.conditionname.clone());
            w.session = Some(SessionEffect::Unlisten(name));
            Kind::Session
        }
        NodeEnum::NotifyStmt(n) => {
            w.reasons.push(MustPrimary::Notify);
            w.session = Some(SessionEffect::Notify(n.conditionname.clone()));
            Kind::Session
        }
        NodeEnum::DeclareCursorStmt(d) => {
            let kind = match d.query.as_deref().and_then(|q| q.node.as_ref()) {
                Some(q) => query_kind(&mut w, q),
                None => Kind::Unclassified,
            };
            w.session = Some(SessionEffect::DeclareCursor {
                name: d.portalname.clone(),
                with_hold: d.options & CURSOR_OPT_HOLD != 0,
            });
            kind
        }
        NodeEnum::FetchStmt(f) => {
            w.session = Some(SessionEffect::Fetch(f.portalname.clone()));
            Kind::Session
        }
        NodeEnum::ClosePortalStmt(c) => {
            let name = (!c.portalname.is_empty()).then(|| c.portalname.clone());
            w.session = Some(SessionEffect::CloseCursor(name));
            Kind::Session
        }
        NodeEnum::LockStmt(l) => {
            w.reasons.push(MustPrimary::Lock);
            w.read_rels(&l.relations);
            Kind::Utility
        }
        NodeEnum::CopyStmt(c) => copy(&mut w, c),
        NodeEnum::ExplainStmt(e) => return explain(e, range),
        NodeEnum::CreateTableAsStmt(c) => {
            match c
                .query
                .as_deref()
                .and_then(|q| q.node.as_ref().map(|n| (q, n)))
            {
                // `CREATE TABLE … AS EXECUTE p`: what it reads and writes is what `p` does,
                // which the caller looks up as for `EXECUTE p` alone.
                Some((_, NodeEnum::ExecuteStmt(e))) => {
                    for p in &e.params {
                        w.expr(p);
                    }
                    w.session = Some(SessionEffect::Execute {
                        name: e.name.clone(),
                    });
                }
                Some((q, _)) => w.query(q, false),
                None => {}
            }
            if c.is_select_into {
                w.reasons.push(MustPrimary::SelectInto);
            }
            w.ddl_events = true;
            if let Some(rel) = c.into.as_ref().and_then(|i| i.rel.as_ref()) {
                created(&mut w, rel);
            }
            Kind::Write
        }
        NodeEnum::RefreshMatViewStmt(r) => {
            w.ddl_events = true;
            if let Some(rel) = &r.relation {
                w.write_rel(rel);
            }
            Kind::Write
        }
        NodeEnum::TruncateStmt(t) => {
            w.write_rels(&t.relations);
            // CASCADE also empties every table with a foreign key to these, whatever
            // the key's actions, and RESTART IDENTITY resets the sequences their
            // columns own: pgfresh cannot name them from the text.
            w.writes_unnamed =
                t.behavior == protobuf::DropBehavior::DropCascade as i32 || t.restart_seqs;
            Kind::Write
        }
        NodeEnum::CallStmt(c) => {
            w.reasons.push(MustPrimary::CallProcedure);
            if let Some(f) = &c.funccall {
                w.func_call(f);
            }
            Kind::Write
        }
        NodeEnum::DoStmt(_) => {
            w.reasons.push(MustPrimary::DoBlock);
            // The block's code may write any relation (pgfresh does not read it): the
            // whole database counts as written, and through dblink any other.
            w.writes_unnamed = true;
            w.writes_elsewhere = true;
            Kind::Write
        }
        NodeEnum::VacuumStmt(v) => {
            for r in &v.rels {
                if let Some(NodeEnum::VacuumRelation(vr)) = &r.node {
                    if let Some(rel) = &vr.relation {
                        w.read_rel(rel);
                    }
                }
            }
            Kind::Utility
        }
        NodeEnum::ClusterStmt(c) => {
            if let Some(rel) = &c.relation {
                w.read_rel(rel);
            }
            Kind::Utility
        }
        NodeEnum::ReindexStmt(r) => {
            if let Some(rel) = &r.relation {
                w.read_rel(rel);
            }
            Kind::Utility
        }
        NodeEnum::CheckPointStmt(_) | NodeEnum::LoadStmt(_) => Kind::Utility,
        NodeEnum::ConstraintsSetStmt(_) => Kind::Transaction,
        other => {
            w.changes_effects = crate::effects::changes_effects(other);
            ddl(&mut w, other)
        }
    };
    finish(w, kind, tx, range)
}

/// Walks a query-position statement and returns Write if it modifies data, else Read.
fn query_kind(w: &mut Walker, node: &NodeEnum) -> Kind {
    match node {
        NodeEnum::SelectStmt(s) => w.select(s),
        NodeEnum::InsertStmt(s) => w.insert(s, false),
        NodeEnum::UpdateStmt(s) => w.update(s, false),
        NodeEnum::DeleteStmt(s) => w.delete(s, false),
        NodeEnum::MergeStmt(s) => w.merge(s, false),
        other => return classify_into(w, other),
    }
    if w.writes_data {
        Kind::Write
    } else {
        Kind::Read
    }
}

/// A statement that is not a plain query in a query position (e.g. EXPLAIN's CREATE TABLE AS):
/// classify it on its own and merge its findings.
fn classify_into(w: &mut Walker, node: &NodeEnum) -> Kind {
    let s = classify(node, (0, 0));
    w.reads.extend(s.reads);
    w.writes.extend(s.writes);
    w.reasons.extend(s.must_primary);
    w.functions.extend(s.functions);
    w.implicit_calls.extend(s.implicit_calls);
    w.touches_catalog |= s.touches_catalog;
    w.writes_elsewhere |= s.writes_elsewhere;
    w.ddl_events |= s.fires_event_triggers;
    if w.session.is_none() {
        w.session = s.session;
    }
    s.kind
}

fn finish(w: Walker, kind: Kind, tx: Option<TxEffect>, range: (usize, usize)) -> Statement {
    let Walker {
        mut reads,
        mut writes,
        reasons: mut must_primary,
        mut functions,
        mut implicit_calls,
        session,
        touches_catalog,
        writes_unnamed,
        writes_elsewhere,
        changes_effects,
        ddl_events,
        ..
    } = w;
    sort_dedup(&mut reads);
    sort_dedup(&mut writes);
    sort_dedup(&mut must_primary);
    sort_dedup(&mut functions);
    sort_dedup(&mut implicit_calls);
    Statement {
        kind,
        reads,
        writes,
        must_primary,
        functions,
        implicit_calls,
        tx,
        session,
        touches_catalog,
        writes_unnamed,
        writes_elsewhere,
        changes_effects,
        fires_event_triggers: kind == Kind::Ddl || ddl_events,
        text_range: range,
    }
}

pub(crate) fn sort_dedup<T: Ord>(v: &mut Vec<T>) {
    if v.len() > 1 {
        v.sort_unstable();
        v.dedup();
    }
}

/// A relation created by CREATE TABLE AS / SELECT INTO / CREATE TEMP ...
fn created(w: &mut Walker, rel: &protobuf::RangeVar) {
    w.write_rel(rel);
    if rel.relpersistence == "t" && w.session.is_none() {
        w.session = Some(SessionEffect::CreateTemp(rel_name(rel)));
    }
}

fn serializable_reason(w: &mut Walker, modes: &TxModes) {
    if modes.isolation == Some(Isolation::Serializable) {
        w.reasons.push(MustPrimary::SerializableTxn);
    }
}

fn transaction(t: &protobuf::TransactionStmt) -> TxEffect {
    use TransactionStmtKind as K;
    match TransactionStmtKind::try_from(t.kind) {
        Ok(K::TransStmtBegin | K::TransStmtStart) => TxEffect::Begin(tx_modes(&t.options)),
        Ok(K::TransStmtCommit) => TxEffect::Commit { chain: t.chain },
        Ok(K::TransStmtSavepoint) => TxEffect::Savepoint(t.savepoint_name.clone()),
        Ok(K::TransStmtRelease) => TxEffect::Release(t.savepoint_name.clone()),
        Ok(K::TransStmtRollbackTo) => TxEffect::RollbackTo(t.savepoint_name.clone()),
        Ok(K::TransStmtPrepare) => TxEffect::PrepareTransaction(t.gid.clone()),
        Ok(K::TransStmtCommitPrepared) => TxEffect::CommitPrepared(t.gid.clone()),
        Ok(K::TransStmtRollbackPrepared) => TxEffect::RollbackPrepared(t.gid.clone()),
        Ok(K::TransStmtRollback | K::Undefined) | Err(_) => TxEffect::Rollback { chain: t.chain },
    }
}

/// Reads `transaction_isolation` / `transaction_read_only` / `transaction_deferrable` options.
fn tx_modes(options: &[Node]) -> TxModes {
    let mut m = TxModes::default();
    for o in options {
        let Some(NodeEnum::DefElem(d)) = &o.node else {
            continue;
        };
        let value = d.arg.as_deref().and_then(const_text);
        let flag = value.as_deref().map(|v| v != "0" && v != "off");
        match d.defname.as_str() {
            "transaction_isolation" => {
                m.isolation = match value.as_deref() {
                    Some("serializable") => Some(Isolation::Serializable),
                    Some("repeatable read") => Some(Isolation::RepeatableRead),
                    Some("read committed") => Some(Isolation::ReadCommitted),
                    Some("read uncommitted") => Some(Isolation::ReadUncommitted),
                    _ => None,
                }
            }
            "transaction_read_only" => m.read_only = flag,
            "transaction_deferrable" => m.deferrable = flag,
            _ => {}
        }
    }
    m
}

fn variable_set(w: &mut Walker, tx: &mut Option<TxEffect>, v: &protobuf::VariableSetStmt) -> Kind {
    use VariableSetKind as K;
    let kind = VariableSetKind::try_from(v.kind).unwrap_or(K::Undefined);
    let value = || {
        let parts: Vec<String> = v.args.iter().filter_map(const_text).collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    };
    let effect = match (kind, v.name.as_str()) {
        (K::VarSetMulti, "TRANSACTION") => {
            let m = tx_modes(&v.args);
            serializable_reason(w, &m);
            *tx = Some(TxEffect::SetTransaction(m));
            return Kind::Transaction;
        }
        (K::VarSetMulti, "SESSION CHARACTERISTICS") => {
            let m = tx_modes(&v.args);
            *tx = Some(TxEffect::SetSessionCharacteristics(m));
            return Kind::Session;
        }
        (K::VarSetMulti, _) => {
            // SET TRANSACTION SNAPSHOT: imports a snapshot exported on the primary.
            *tx = Some(TxEffect::SetTransaction(TxModes::default()));
            w.reasons
                .push(MustPrimary::ServerState("transaction snapshot".into()));
            return Kind::Transaction;
        }
        (K::VarResetAll, _) => SessionEffect::ResetAll,
        (K::VarReset, "role") => SessionEffect::SetRole(None),
        (K::VarReset, "session_authorization") => SessionEffect::SetSessionAuthorization(None),
        (K::VarReset, name) => SessionEffect::Reset(name.to_owned()),
        // `SET name TO DEFAULT` is `RESET name` (a startup value comes back); SET LOCAL's
        // lasts until the transaction ends.
        (K::VarSetDefault, name) if !v.is_local => SessionEffect::Reset(name.to_owned()),
        (_, "role") => SessionEffect::SetRole(value().filter(|v| v != "none")),
        (_, "session_authorization") => SessionEffect::SetSessionAuthorization(value()),
        (kind, name) => {
            let value = if kind == K::VarSetValue {
                value()
            } else {
                None
            };
            if matches!(
                name,
                "default_transaction_isolation" | "transaction_isolation"
            ) && value.as_deref() == Some("serializable")
            {
                w.reasons.push(MustPrimary::SerializableTxn);
            }
            SessionEffect::Set {
                name: name.to_owned(),
                value,
                local: v.is_local,
            }
        }
    };
    w.session = Some(effect);
    Kind::Session
}

fn copy(w: &mut Walker, c: &protobuf::CopyStmt) -> Kind {
    if c.is_from {
        w.reasons.push(MustPrimary::CopyFrom);
        if let Some(rel) = &c.relation {
            w.write_rel(rel);
        }
        if let Some(e) = c.where_clause.as_deref() {
            w.expr(e);
        }
        return Kind::Write;
    }
    if !c.filename.is_empty() || c.is_program {
        w.reasons.push(MustPrimary::CopyServerFile);
    }
    if let Some(rel) = &c.relation {
        w.read_rel(rel);
    }
    match c.query.as_deref().and_then(|q| q.node.as_ref()) {
        Some(q) => query_kind(w, q),
        None => Kind::Read,
    }
}

/// EXPLAIN: a read unless ANALYZE executes a statement that writes (or needs the primary).
fn explain(e: &protobuf::ExplainStmt, range: (usize, usize)) -> Statement {
    let analyze = e.options.iter().any(|o| match &o.node {
        Some(NodeEnum::DefElem(d)) if d.defname == "analyze" => match d.arg.as_deref() {
            None => true,
            Some(a) => !matches!(
                const_text(a).as_deref(),
                Some("false" | "off" | "0" | "no" | "f")
            ),
        },
        _ => false,
    });
    let Some(inner) = e.query.as_deref().and_then(|q| q.node.as_ref()) else {
        return Statement::new(Kind::Unclassified, range);
    };
    let mut s = classify(inner, range);
    if analyze {
        if s.kind == Kind::Write {
            s.must_primary.push(MustPrimary::ExplainAnalyzeWrite);
            sort_dedup(&mut s.must_primary);
        }
        return s;
    }
    // Planning only: nothing executes, so nothing is written, locked or called.
    let mut reads = std::mem::take(&mut s.reads);
    reads.append(&mut s.writes);
    sort_dedup(&mut reads);
    let session = match s.session {
        Some(e @ SessionEffect::Execute { .. }) => Some(e),
        _ => None,
    };
    Statement {
        kind: if s.kind == Kind::Unclassified {
            Kind::Unclassified
        } else {
            Kind::Read
        },
        reads,
        writes: Vec::new(),
        must_primary: Vec::new(),
        functions: Vec::new(),
        implicit_calls: Vec::new(),
        tx: None,
        session,
        touches_catalog: s.touches_catalog,
        writes_unnamed: false,
        writes_elsewhere: false,
        changes_effects: false,
        fires_event_triggers: false,
        text_range: range,
    }
}

/// Schema changes and everything not modelled above: primary-only, with the relations they
/// create, alter or drop recorded as writes.
fn ddl(w: &mut Walker, node: &NodeEnum) -> Kind {
    let mut temp = None;
    match node {
        NodeEnum::CreateStmt(c) => {
            if let Some(rel) = &c.relation {
                w.write_rel(rel);
                if rel.relpersistence == "t" {
                    temp = Some(rel);
                }
            }
            w.write_rels(&c.inh_relations);
        }
        NodeEnum::ViewStmt(v) => {
            if let Some(q) = v.query.as_deref() {
                w.query(q, false);
            }
            if let Some(rel) = &v.view {
                w.write_rel(rel);
                if rel.relpersistence == "t" {
                    temp = Some(rel);
                }
            }
        }
        NodeEnum::CreateSeqStmt(c) => {
            if let Some(rel) = &c.sequence {
                w.write_rel(rel);
                if rel.relpersistence == "t" {
                    temp = Some(rel);
                }
            }
        }
        NodeEnum::AlterSeqStmt(a) => {
            if let Some(rel) = &a.sequence {
                w.write_rel(rel);
            }
        }
        NodeEnum::AlterTableStmt(a) => {
            if let Some(rel) = &a.relation {
                w.write_rel(rel);
            }
            // `ALTER COLUMN ... RESTART` (or another identity option) changes the identity
            // column's sequence, which the text does not name.
            w.writes_unnamed |= a.cmds.iter().any(|c| {
                matches!(&c.node, Some(NodeEnum::AlterTableCmd(cmd))
                    if cmd.subtype == protobuf::AlterTableType::AtSetIdentity as i32)
            });
        }
        NodeEnum::IndexStmt(i) => {
            if let Some(rel) = &i.relation {
                w.write_rel(rel);
            }
        }
        NodeEnum::CreateTrigStmt(t) => {
            if let Some(rel) = &t.relation {
                w.write_rel(rel);
            }
        }
        NodeEnum::RuleStmt(r) => {
            if let Some(rel) = &r.relation {
                w.write_rel(rel);
            }
        }
        NodeEnum::RenameStmt(r) => {
            if let Some(rel) = &r.relation {
                w.write_rel(rel);
            }
        }
        NodeEnum::AlterObjectSchemaStmt(a) => {
            if let Some(rel) = &a.relation {
                w.write_rel(rel);
            }
        }
        NodeEnum::AlterOwnerStmt(a) => {
            if let Some(rel) = &a.relation {
                w.write_rel(rel);
            }
        }
        NodeEnum::DropStmt(d) => drop_targets(w, d),
        _ => {}
    }
    if let Some(rel) = temp {
        w.session = Some(SessionEffect::CreateTemp(rel_name(rel)));
        w.ddl_events = true;
        return Kind::Write;
    }
    Kind::Ddl
}

fn drop_targets(w: &mut Walker, d: &protobuf::DropStmt) {
    let relation_kind = matches!(
        ObjectType::try_from(d.remove_type),
        Ok(ObjectType::ObjectTable
            | ObjectType::ObjectView
            | ObjectType::ObjectMatview
            | ObjectType::ObjectSequence
            | ObjectType::ObjectForeignTable
            | ObjectType::ObjectIndex)
    );
    if !relation_kind {
        return;
    }
    for o in &d.objects {
        let Some(NodeEnum::List(l)) = &o.node else {
            continue;
        };
        let parts = crate::visit::string_parts(&l.items);
        if let Some((name, rest)) = parts.split_last() {
            w.writes.push(RelName::new(rest.last().copied(), name));
        }
    }
}
