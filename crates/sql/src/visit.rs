//! One recursive pass over a statement's parse tree, collecting relations, functions and
//! must-primary reasons with their context (write target, CTE scope, locking clause).

use pg_query::protobuf::{self, a_const, Node};
use pg_query::{NodeEnum, NodeRef};

use crate::functions::{
    classify_builtin, is_catalog_type, large_objects, reads_catalog, Builtin, LargeObjects,
};
use crate::model::{MustPrimary, SessionEffect};
use crate::names::{FuncName, RelName};

/// Accumulates what one statement touches.
#[derive(Default)]
pub(crate) struct Walker {
    pub reads: Vec<RelName>,
    pub writes: Vec<RelName>,
    pub reasons: Vec<MustPrimary>,
    pub functions: Vec<FuncName>,
    /// Operators applied and types cast to (see `Statement::implicit_calls`).
    pub implicit_calls: Vec<FuncName>,
    pub session: Option<SessionEffect>,
    pub touches_catalog: bool,
    /// A data-modifying statement (INSERT/UPDATE/DELETE/MERGE/SELECT INTO) was seen.
    pub writes_data: bool,
    /// The statement may write relations it does not name (`TRUNCATE … CASCADE`, `nextval`
    /// of a computed name).
    pub writes_unnamed: bool,
    /// The statement may write another database (see `Statement::writes_elsewhere`).
    pub writes_elsewhere: bool,
    /// Schema change that may change what other statements touch behind their text.
    pub changes_effects: bool,
    /// A statement PostgreSQL fires event triggers for though it is not `Kind::Ddl`.
    pub ddl_events: bool,
    /// CTE names visible at the current point, innermost last.
    ctes: Vec<String>,
}

/// The string items of a name list (`[schema, ]name`), in order; other items are left out.
pub(crate) fn string_parts(nodes: &[Node]) -> Vec<&str> {
    nodes
        .iter()
        .filter_map(|n| match &n.node {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        })
        .collect()
}

/// Whether `t` is an object-identifier type that looks names up (`regclass` ...).
fn names_catalog_type(t: &protobuf::TypeName) -> bool {
    is_catalog_type(&string_parts(&t.names))
}

/// Folded relation name of a RangeVar.
pub(crate) fn rel_name(rv: &protobuf::RangeVar) -> RelName {
    RelName::new(Some(rv.schemaname.as_str()), &rv.relname)
}

/// Folded function name from a `funcname` list (`[catalog.]schema.name` keeps the last two).
pub(crate) fn func_name(parts: &[Node]) -> Option<FuncName> {
    let mut strings = parts.iter().filter_map(|n| match &n.node {
        Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
        _ => None,
    });
    let count = parts.len();
    let strings: Vec<&str> = strings.by_ref().collect();
    if strings.len() != count || strings.is_empty() {
        return None;
    }
    let name = strings[strings.len() - 1];
    let schema = (strings.len() >= 2).then(|| strings[strings.len() - 2]);
    Some(FuncName::new(schema, name))
}

/// The string value of a literal (`'x'`, `42`, `1.5`, `true`), as PostgreSQL would print it.
pub(crate) fn const_text(node: &Node) -> Option<String> {
    match &node.node {
        Some(NodeEnum::AConst(c)) => match &c.val {
            Some(a_const::Val::Sval(s)) => Some(s.sval.clone()),
            Some(a_const::Val::Ival(i)) => Some(i.ival.to_string()),
            Some(a_const::Val::Fval(f)) => Some(f.fval.clone()),
            Some(a_const::Val::Boolval(b)) => Some(if b.boolval { "on" } else { "off" }.into()),
            Some(a_const::Val::Bsval(b)) => Some(b.bsval.clone()),
            None => None,
        },
        Some(NodeEnum::TypeCast(t)) => t.arg.as_deref().and_then(const_text),
        Some(NodeEnum::String(s)) => Some(s.sval.clone()),
        Some(NodeEnum::Integer(i)) => Some(i.ival.to_string()),
        Some(NodeEnum::Boolean(b)) => Some(if b.boolval { "on" } else { "off" }.into()),
        _ => None,
    }
}

/// A boolean literal's text as PostgreSQL's `boolin` reads it: any case, spaces around,
/// and any prefix of `true`, `false`, `yes`, `no` long enough to tell (`on` and `off`
/// need two letters), or `1`, `0`. `None`: not a boolean (the call fails).
fn parse_bool(text: &str) -> Option<bool> {
    let v = text.trim().to_ascii_lowercase();
    let prefix_of = |word: &str, least: usize| v.len() >= least && word.starts_with(v.as_str());
    if prefix_of("true", 1) || prefix_of("yes", 1) || prefix_of("on", 2) || v == "1" {
        Some(true)
    } else if prefix_of("false", 1) || prefix_of("no", 1) || prefix_of("off", 2) || v == "0" {
        Some(false)
    } else {
        None
    }
}

impl Walker {
    fn opt(&mut self, node: &Option<Box<Node>>) {
        if let Some(n) = node {
            self.expr(n);
        }
    }

    fn list(&mut self, nodes: &[Node]) {
        for n in nodes {
            self.expr(n);
        }
    }

    fn reason(&mut self, r: MustPrimary) {
        self.reasons.push(r);
    }

    fn note_special(&mut self, rv: &protobuf::RangeVar, name: &RelName) {
        if rv.relpersistence == "t" || name.schema().is_some_and(|s| s.starts_with("pg_temp")) {
            self.reason(MustPrimary::TempRelation(name.clone()));
        }
    }

    /// A relation in a reading position; CTE names in scope are not relations.
    pub fn read_rel(&mut self, rv: &protobuf::RangeVar) {
        if rv.schemaname.is_empty() && self.ctes.contains(&rv.relname) {
            return;
        }
        let name = rel_name(rv);
        self.note_special(rv, &name);
        if name.is_system_catalog() {
            self.touches_catalog = true;
        }
        self.reads.push(name);
    }

    /// A relation that the statement writes (never a CTE name).
    pub fn write_rel(&mut self, rv: &protobuf::RangeVar) {
        let name = rel_name(rv);
        self.note_special(rv, &name);
        self.writes.push(name);
    }

    /// A list of RangeVar nodes that are written (TRUNCATE, DDL targets).
    pub fn write_rels(&mut self, nodes: &[Node]) {
        for n in nodes {
            if let Some(NodeEnum::RangeVar(rv)) = &n.node {
                self.write_rel(rv);
            }
        }
    }

    /// A list of RangeVar nodes that are only read or locked.
    pub fn read_rels(&mut self, nodes: &[Node]) {
        for n in nodes {
            if let Some(NodeEnum::RangeVar(rv)) = &n.node {
                self.read_rel(rv);
            }
        }
    }

    /// Enters a WITH clause; returns the scope mark to restore with [`Walker::leave_with`].
    fn enter_with(&mut self, with: &Option<protobuf::WithClause>) -> usize {
        let mark = self.ctes.len();
        if let Some(w) = with {
            for cte in &w.ctes {
                if let Some(NodeEnum::CommonTableExpr(c)) = &cte.node {
                    if w.recursive {
                        self.ctes.push(c.ctename.clone());
                    }
                    if let Some(q) = &c.ctequery {
                        self.query(q, true);
                    }
                    if !w.recursive {
                        self.ctes.push(c.ctename.clone());
                    }
                }
            }
        }
        mark
    }

    fn leave_with(&mut self, mark: usize) {
        self.ctes.truncate(mark);
    }

    /// A statement in query position. `nested` is true inside a CTE or subquery, where a
    /// data-modifying statement makes a writable CTE.
    pub fn query(&mut self, node: &Node, nested: bool) {
        match &node.node {
            Some(NodeEnum::SelectStmt(s)) => self.select(s),
            Some(NodeEnum::InsertStmt(s)) => self.insert(s, nested),
            Some(NodeEnum::UpdateStmt(s)) => self.update(s, nested),
            Some(NodeEnum::DeleteStmt(s)) => self.delete(s, nested),
            Some(NodeEnum::MergeStmt(s)) => self.merge(s, nested),
            Some(other) => self.fallback(other),
            None => {}
        }
    }

    pub fn select(&mut self, s: &protobuf::SelectStmt) {
        let mark = self.enter_with(&s.with_clause);
        if let Some(l) = &s.larg {
            self.select(l);
        }
        if let Some(r) = &s.rarg {
            self.select(r);
        }
        for item in &s.from_clause {
            self.range_item(item);
        }
        self.list(&s.distinct_clause);
        self.list(&s.target_list);
        self.opt(&s.where_clause);
        self.list(&s.group_clause);
        self.opt(&s.having_clause);
        self.list(&s.window_clause);
        for row in &s.values_lists {
            self.expr(row);
        }
        self.list(&s.sort_clause);
        self.opt(&s.limit_offset);
        self.opt(&s.limit_count);
        if !s.locking_clause.is_empty() {
            self.reason(MustPrimary::LockingClause);
        }
        if let Some(into) = &s.into_clause {
            self.writes_data = true;
            self.ddl_events = true;
            self.reason(MustPrimary::SelectInto);
            if let Some(rel) = &into.rel {
                self.write_rel(rel);
                if rel.relpersistence == "t" && self.session.is_none() {
                    self.session = Some(SessionEffect::CreateTemp(rel_name(rel)));
                }
            }
        }
        self.leave_with(mark);
    }

    fn dml_common(&mut self, nested: bool) {
        self.writes_data = true;
        if nested {
            self.reason(MustPrimary::WritableCte);
        }
    }

    pub fn insert(&mut self, s: &protobuf::InsertStmt, nested: bool) {
        self.dml_common(nested);
        let mark = self.enter_with(&s.with_clause);
        if let Some(rel) = &s.relation {
            self.write_rel(rel);
        }
        if let Some(src) = &s.select_stmt {
            self.query(src, true);
        }
        if let Some(oc) = &s.on_conflict_clause {
            if let Some(infer) = &oc.infer {
                self.list(&infer.index_elems);
                self.opt(&infer.where_clause);
            }
            self.list(&oc.target_list);
            self.opt(&oc.where_clause);
        }
        self.list(&s.returning_list);
        self.leave_with(mark);
    }

    pub fn update(&mut self, s: &protobuf::UpdateStmt, nested: bool) {
        self.dml_common(nested);
        let mark = self.enter_with(&s.with_clause);
        if let Some(rel) = &s.relation {
            self.write_rel(rel);
        }
        for item in &s.from_clause {
            self.range_item(item);
        }
        self.list(&s.target_list);
        self.opt(&s.where_clause);
        self.list(&s.returning_list);
        self.leave_with(mark);
    }

    pub fn delete(&mut self, s: &protobuf::DeleteStmt, nested: bool) {
        self.dml_common(nested);
        let mark = self.enter_with(&s.with_clause);
        if let Some(rel) = &s.relation {
            self.write_rel(rel);
        }
        for item in &s.using_clause {
            self.range_item(item);
        }
        self.opt(&s.where_clause);
        self.list(&s.returning_list);
        self.leave_with(mark);
    }

    pub fn merge(&mut self, s: &protobuf::MergeStmt, nested: bool) {
        self.dml_common(nested);
        let mark = self.enter_with(&s.with_clause);
        if let Some(rel) = &s.relation {
            self.write_rel(rel);
        }
        if let Some(src) = &s.source_relation {
            self.range_item(src);
        }
        self.opt(&s.join_condition);
        for w in &s.merge_when_clauses {
            if let Some(NodeEnum::MergeWhenClause(c)) = &w.node {
                self.opt(&c.condition);
                self.list(&c.target_list);
                self.list(&c.values);
            }
        }
        self.list(&s.returning_list);
        self.leave_with(mark);
    }

    /// An item of a FROM / USING list.
    fn range_item(&mut self, node: &Node) {
        match &node.node {
            Some(NodeEnum::RangeVar(rv)) => self.read_rel(rv),
            Some(NodeEnum::JoinExpr(j)) => {
                if let Some(l) = &j.larg {
                    self.range_item(l);
                }
                if let Some(r) = &j.rarg {
                    self.range_item(r);
                }
                self.opt(&j.quals);
            }
            Some(NodeEnum::RangeSubselect(r)) => {
                if let Some(q) = &r.subquery {
                    self.query(q, true);
                }
            }
            Some(NodeEnum::RangeFunction(r)) => {
                // `functions` holds lists of (FuncCall, column definitions).
                for f in &r.functions {
                    self.expr(f);
                }
            }
            Some(NodeEnum::RangeTableSample(r)) => {
                if let Some(rel) = &r.relation {
                    self.range_item(rel);
                }
                self.list(&r.args);
                self.opt(&r.repeatable);
            }
            Some(NodeEnum::RangeTableFunc(r)) => {
                self.opt(&r.docexpr);
                self.opt(&r.rowexpr);
                self.list(&r.namespaces);
                for c in &r.columns {
                    if let Some(NodeEnum::RangeTableFuncCol(col)) = &c.node {
                        self.opt(&col.colexpr);
                        self.opt(&col.coldefexpr);
                    }
                }
            }
            Some(_) => self.expr(node),
            None => {}
        }
    }

    pub fn func_call(&mut self, f: &protobuf::FuncCall) {
        if let Some(name) = func_name(&f.funcname) {
            match classify_builtin(&name) {
                Builtin::Primary(r) => self.reason(r),
                Builtin::SetConfig => {
                    self.reason(MustPrimary::SetConfig);
                    let arg = |i: usize| f.args.get(i).and_then(const_text);
                    let call = SessionEffect::SetConfig {
                        name: arg(0),
                        value: arg(1),
                        // A literal that is no boolean fails the call, which is then
                        // never confirmed: not a flag pgfresh cannot read.
                        local: arg(2).map(|v| parse_bool(&v).unwrap_or(false)),
                    };
                    // Each call sets its parameter, in the order they are met (a select
                    // list left to right): none may be left out.
                    self.session = match self.session.take() {
                        None => Some(call),
                        Some(first @ SessionEffect::SetConfig { .. }) => {
                            Some(SessionEffect::SetConfigs(vec![first, call]))
                        }
                        Some(SessionEffect::SetConfigs(mut calls)) => {
                            calls.push(call);
                            Some(SessionEffect::SetConfigs(calls))
                        }
                        other => other,
                    };
                }
                Builtin::StandbySafe | Builtin::Unknown => {}
            }
            if reads_catalog(&name) {
                self.touches_catalog = true;
            }
            match large_objects(&name) {
                Some(LargeObjects::Read) => self.reads.push(RelName::large_objects()),
                Some(LargeObjects::Write) => self.writes.push(RelName::large_objects()),
                None => {}
            }
            if remote_sql_may_write(&name, &f.args) {
                // The connection may be to this database or to any other.
                self.writes_unnamed = true;
                self.writes_elsewhere = true;
            }
            match advanced_sequence(&name, &f.args) {
                // A read of the sequence relation (`SELECT last_value FROM s`) sees it.
                Some(Some(seq)) => self.writes.push(seq),
                // Some sequence, which pgfresh cannot name: any relation may be it.
                Some(None) => self.writes_unnamed = true,
                None => {}
            }
            self.functions.push(name);
        }
        self.list(&f.args);
        self.list(&f.agg_order);
        self.opt(&f.agg_filter);
        if let Some(w) = &f.over {
            self.window(w);
        }
    }

    /// An operator applied (`a <+> b`, `x = ANY (...)`): its name, `[schema, ]symbol`.
    fn operator(&mut self, name: &[Node]) {
        match string_parts(name)[..] {
            [symbol] => self.implicit_calls.push(FuncName::operator(None, symbol)),
            [schema, symbol] => self
                .implicit_calls
                .push(FuncName::operator(Some(schema), symbol)),
            _ => {}
        }
    }

    /// A cast to type `t` (`x::t`, `CAST(x AS t)`, an array of `t` too: each element is
    /// cast).
    fn cast(&mut self, t: &protobuf::TypeName) {
        let parts = string_parts(&t.names);
        if let Some((name, rest)) = parts.split_last() {
            self.implicit_calls
                .push(FuncName::cast_to(rest.last().copied(), name));
        }
    }

    fn window(&mut self, w: &protobuf::WindowDef) {
        self.list(&w.partition_clause);
        self.list(&w.order_clause);
        self.opt(&w.start_offset);
        self.opt(&w.end_offset);
    }

    fn json_value(&mut self, v: &Option<Box<protobuf::JsonValueExpr>>) {
        if let Some(v) = v {
            self.opt(&v.raw_expr);
            self.opt(&v.formatted_expr);
        }
    }

    /// An expression (or any node in expression position).
    pub fn expr(&mut self, node: &Node) {
        let Some(n) = &node.node else { return };
        match n {
            NodeEnum::ColumnRef(_)
            | NodeEnum::ParamRef(_)
            | NodeEnum::AConst(_)
            | NodeEnum::AStar(_)
            | NodeEnum::Integer(_)
            | NodeEnum::Float(_)
            | NodeEnum::String(_)
            | NodeEnum::Boolean(_)
            | NodeEnum::BitString(_)
            | NodeEnum::SqlvalueFunction(_)
            | NodeEnum::CurrentOfExpr(_)
            | NodeEnum::SetToDefault(_)
            | NodeEnum::TypeName(_)
            | NodeEnum::Alias(_)
            | NodeEnum::ColumnDef(_)
            | NodeEnum::RangeTableFuncCol(_)
            | NodeEnum::JsonFormat(_)
            | NodeEnum::JsonOutput(_)
            | NodeEnum::JsonReturning(_) => {}
            NodeEnum::AExpr(e) => {
                self.operator(&e.name);
                self.opt(&e.lexpr);
                self.opt(&e.rexpr);
            }
            NodeEnum::BoolExpr(e) => self.list(&e.args),
            NodeEnum::NullTest(e) => self.opt(&e.arg),
            NodeEnum::BooleanTest(e) => self.opt(&e.arg),
            NodeEnum::TypeCast(e) => {
                if let Some(t) = &e.type_name {
                    if names_catalog_type(t) {
                        // `'orders'::regclass` looks the name up in the catalogs.
                        self.touches_catalog = true;
                    }
                    self.cast(t);
                }
                self.opt(&e.arg)
            }
            NodeEnum::CollateClause(e) => self.opt(&e.arg),
            NodeEnum::NamedArgExpr(e) => self.opt(&e.arg),
            NodeEnum::AIndirection(e) => {
                self.opt(&e.arg);
                self.list(&e.indirection);
            }
            NodeEnum::AIndices(e) => {
                self.opt(&e.lidx);
                self.opt(&e.uidx);
            }
            NodeEnum::AArrayExpr(e) => self.list(&e.elements),
            NodeEnum::RowExpr(e) => self.list(&e.args),
            NodeEnum::CoalesceExpr(e) => self.list(&e.args),
            NodeEnum::MinMaxExpr(e) => self.list(&e.args),
            NodeEnum::CaseExpr(e) => {
                self.opt(&e.arg);
                self.list(&e.args);
                self.opt(&e.defresult);
            }
            NodeEnum::CaseWhen(e) => {
                self.opt(&e.expr);
                self.opt(&e.result);
            }
            NodeEnum::List(l) => self.list(&l.items),
            NodeEnum::ResTarget(t) => {
                self.list(&t.indirection);
                self.opt(&t.val);
            }
            NodeEnum::MultiAssignRef(m) => self.opt(&m.source),
            NodeEnum::SubLink(s) => {
                self.operator(&s.oper_name);
                self.opt(&s.testexpr);
                if let Some(q) = &s.subselect {
                    self.query(q, true);
                }
            }
            NodeEnum::FuncCall(f) => self.func_call(f),
            NodeEnum::SortBy(s) => {
                // `ORDER BY x USING <+>`
                self.operator(&s.use_op);
                self.opt(&s.node)
            }
            NodeEnum::WindowDef(w) => self.window(w),
            NodeEnum::GroupingSet(g) => self.list(&g.content),
            NodeEnum::XmlExpr(x) => {
                self.list(&x.named_args);
                self.list(&x.args);
            }
            NodeEnum::XmlSerialize(x) => self.opt(&x.expr),
            NodeEnum::IndexElem(i) => self.opt(&i.expr),
            NodeEnum::JsonValueExpr(v) => {
                self.opt(&v.raw_expr);
                self.opt(&v.formatted_expr);
            }
            NodeEnum::JsonObjectConstructor(j) => self.list(&j.exprs),
            NodeEnum::JsonArrayConstructor(j) => self.list(&j.exprs),
            NodeEnum::JsonArrayQueryConstructor(j) => {
                if let Some(q) = &j.query {
                    self.query(q, true);
                }
            }
            NodeEnum::JsonKeyValue(kv) => {
                self.opt(&kv.key);
                self.json_value(&kv.value);
            }
            NodeEnum::JsonIsPredicate(j) => self.opt(&j.expr),
            NodeEnum::JsonScalarExpr(j) => self.opt(&j.expr),
            NodeEnum::JsonParseExpr(j) => self.json_value(&j.expr),
            NodeEnum::JsonSerializeExpr(j) => self.json_value(&j.expr),
            NodeEnum::JsonArgument(a) => self.json_value(&a.val),
            NodeEnum::JsonFuncExpr(j) => {
                self.json_value(&j.context_item);
                self.opt(&j.pathspec);
                self.list(&j.passing);
                for b in [&j.on_empty, &j.on_error].into_iter().flatten() {
                    self.opt(&b.expr);
                }
            }
            NodeEnum::SelectStmt(_)
            | NodeEnum::InsertStmt(_)
            | NodeEnum::UpdateStmt(_)
            | NodeEnum::DeleteStmt(_)
            | NodeEnum::MergeStmt(_) => self.query(node, true),
            NodeEnum::RangeVar(rv) => self.read_rel(rv),
            NodeEnum::JoinExpr(_)
            | NodeEnum::RangeSubselect(_)
            | NodeEnum::RangeFunction(_)
            | NodeEnum::RangeTableSample(_)
            | NodeEnum::RangeTableFunc(_) => self.range_item(node),
            other => self.fallback(other),
        }
    }

    /// Conservative catch-all for node types the walker does not model: every relation found
    /// anywhere below counts as read, every data-modifying statement as a writable CTE.
    fn fallback(&mut self, node: &NodeEnum) {
        for (n, _, _, _) in node.nodes() {
            match n {
                NodeRef::RangeVar(rv) => self.read_rel(rv),
                NodeRef::FuncCall(f) => {
                    if let Some(name) = func_name(&f.funcname) {
                        if let Builtin::Primary(r) = classify_builtin(&name) {
                            self.reason(r);
                        } else if let Builtin::SetConfig = classify_builtin(&name) {
                            self.reason(MustPrimary::SetConfig);
                        }
                        self.functions.push(name);
                    }
                }
                NodeRef::AExpr(e) => self.operator(&e.name),
                NodeRef::SubLink(s) => self.operator(&s.oper_name),
                NodeRef::TypeCast(c) => {
                    if let Some(t) = &c.type_name {
                        self.cast(t);
                    }
                }
                NodeRef::InsertStmt(s) => self.fallback_write(s.relation.as_ref()),
                NodeRef::UpdateStmt(s) => self.fallback_write(s.relation.as_ref()),
                NodeRef::DeleteStmt(s) => self.fallback_write(s.relation.as_ref()),
                NodeRef::MergeStmt(s) => self.fallback_write(s.relation.as_ref()),
                NodeRef::SelectStmt(s) => {
                    if !s.locking_clause.is_empty() {
                        self.reason(MustPrimary::LockingClause);
                    }
                    if s.into_clause.is_some() {
                        self.writes_data = true;
                        self.reason(MustPrimary::SelectInto);
                    }
                }
                _ => {}
            }
        }
    }

    fn fallback_write(&mut self, rel: Option<&protobuf::RangeVar>) {
        self.dml_common(true);
        if let Some(rv) = rel {
            self.write_rel(rv);
        }
    }
}

/// `dblink_exec`, `dblink` and `dblink_send_query` (the dblink extension, in whatever
/// schema it was installed) run SQL over a connection of their own, which may well be to
/// this database (dblink is the usual way to an autonomous audit write): what that SQL
/// writes commits behind the call, named nowhere in the text. Unless one argument is a
/// constant that only reads, the call may write any relation.
fn remote_sql_may_write(f: &FuncName, args: &[Node]) -> bool {
    if !matches!(&*f.name, "dblink_exec" | "dblink" | "dblink_send_query") {
        return false;
    }
    !args.iter().filter_map(const_text).any(|sql| {
        let a = crate::analyze_uncached(&sql);
        a.kind == crate::model::Kind::Read
            && a.writes.is_empty()
            && a.must_primary.is_empty()
            && !a.calls_user_functions
            && a.statements.iter().all(|s| !s.writes_unnamed)
    })
}

/// The sequence `nextval(...)` or `setval(...)` advances: `Some(Some(s))` when named by a
/// constant (`'s'`, `'app.s'::regclass`, `'"S"'`), `Some(None)` when the name is computed
/// at run time (`nextval(pg_get_serial_sequence('t', 'id'))`, a parameter), given as an
/// oid, or does not parse, None for other calls.
fn advanced_sequence(f: &FuncName, args: &[Node]) -> Option<Option<RelName>> {
    if !matches!(f.schema.as_deref(), None | Some("pg_catalog"))
        || !matches!(&*f.name, "nextval" | "setval")
    {
        return None;
    }
    Some(
        args.first()
            .and_then(const_text)
            // An oid (`nextval(16400)`) names no relation pgfresh can match.
            .filter(|t| t.parse::<u64>().is_err())
            .and_then(|t| RelName::parse(&t).ok()),
    )
}
