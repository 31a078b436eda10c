//! Building the graph: catalog rows and manual rules to nodes and edges.
//!
//! Nodes are relations and functions. Relations are the catalog's, named exactly as stored
//! (always schema-qualified), plus *virtual* relations: names a function body or a manual rule
//! uses that the catalog does not have (a table created later, a temp table), kept as written.
//! Names inside bodies resolve conservatively: a qualified name to that relation, an
//! unqualified one to every relation of that name in any schema (the body's search path is not
//! known). System catalogs are ignored. Called functions resolve the same way to every overload;
//! a call of a function the rows do not have (a built-in, extension code) adds nothing.

mod casts;

use std::collections::HashMap;
use std::sync::Arc;

use pgfresh_sql::{FuncName, RelName};

use crate::body::{analyze_body, analyze_rule};
use crate::catalog::{CatalogRows, Oid};
use crate::report::{fk_action, DependencyReport, Edge, EdgeKind, UnanalysableBody};
use crate::rules::{ManualRule, RuleSource};

/// Index of a relation node.
pub(crate) type RelId = u32;
/// Index of a function node.
pub(crate) type FuncId = u32;

/// The adjacency lists the closures are computed from.
#[derive(Default)]
pub(crate) struct Builder {
    pub rels: Vec<RelName>,
    /// Relkind per relation (`?` for virtual ones).
    pub relkind: Vec<char>,
    /// Unlogged tables (virtual relations are not).
    pub unlogged: Vec<bool>,
    pub funcs: Vec<FuncName>,
    /// Volatility per function (`v` for virtual ones).
    pub volatility: Vec<char>,
    /// Why a function cannot be analysed; `None` when it can or a manual rule describes it.
    pub unanalysable: Vec<Option<String>>,
    /// Relation → functions a write to it runs: its triggers' functions, those its rewrite
    /// rules call, and those its defaults, check constraints and index expressions call.
    pub triggers: Vec<Vec<FuncId>>,
    /// Relation → relations a write to it writes (FK cascades, writes through a view, manual).
    pub cascades: Vec<Vec<RelId>>,
    /// Parent → partitions / inheritance children.
    pub children: Vec<Vec<RelId>>,
    /// Child → parents.
    pub parents: Vec<Vec<RelId>>,
    /// Relation → relations a read of it reads: a view's query (not for materialized
    /// views), a row-security policy's expression.
    pub rel_reads: Vec<Vec<RelId>>,
    /// Relation → functions a read of it runs: those a view's query calls, those a
    /// row-security policy's expression calls.
    pub read_calls: Vec<Vec<FuncId>>,
    /// Function → relations it writes.
    pub func_writes: Vec<Vec<RelId>>,
    /// Function → relations it reads.
    pub func_reads: Vec<Vec<RelId>>,
    /// Function → functions it calls.
    pub calls: Vec<Vec<FuncId>>,
    /// Functions DDL runs: those of enabled event triggers.
    pub ddl_calls: Vec<FuncId>,
    /// Some body may write another database: it calls `dblink`, or cannot be analysed
    /// (dynamic SQL, another language) and so may do anything.
    pub elsewhere: bool,
    /// Functions of user casts between two built-in types, applied implicitly or on
    /// assignment: any statement may run them.
    pub everywhere: Vec<FuncId>,
    by_oid: HashMap<Oid, RelId>,
    func_by_oid: HashMap<Oid, FuncId>,
    by_name: HashMap<Arc<str>, Vec<RelId>>,
    func_by_name: HashMap<Arc<str>, Vec<FuncId>>,
    /// The aggregate, operator and cast nodes, by (kind, schema, name).
    implicit_by_name: HashMap<(char, String, String), FuncId>,
    pub report: DependencyReport,
}

fn func_label(f: &FuncName) -> String {
    format!("{f}()")
}

impl Builder {
    fn add_rel(&mut self, name: RelName, relkind: char) -> RelId {
        let id = RelId::try_from(self.rels.len()).unwrap_or(RelId::MAX);
        self.by_name.entry(name.name.clone()).or_default().push(id);
        self.rels.push(name);
        self.relkind.push(relkind);
        self.unlogged.push(false);
        for v in [
            &mut self.cascades,
            &mut self.children,
            &mut self.parents,
            &mut self.rel_reads,
        ] {
            v.push(Vec::new());
        }
        self.triggers.push(Vec::new());
        self.read_calls.push(Vec::new());
        id
    }

    fn add_func(&mut self, name: FuncName, volatility: char) -> FuncId {
        let id = FuncId::try_from(self.funcs.len()).unwrap_or(FuncId::MAX);
        self.func_by_name
            .entry(name.name.clone())
            .or_default()
            .push(id);
        self.funcs.push(name);
        self.volatility.push(volatility);
        self.unanalysable.push(None);
        self.func_writes.push(Vec::new());
        self.func_reads.push(Vec::new());
        self.calls.push(Vec::new());
        id
    }

    /// Every relation `name` may denote; a virtual node when the catalog has none.
    fn resolve_rel(&mut self, name: &RelName) -> Vec<RelId> {
        let found: Vec<RelId> = self
            .by_name
            .get(&name.name)
            .map(|ids| {
                ids.iter()
                    .copied()
                    .filter(|&id| name.may_match(&self.rels[id as usize]))
                    .collect()
            })
            .unwrap_or_default();
        if !found.is_empty() {
            return found;
        }
        vec![self.add_rel(name.clone(), '?')]
    }

    /// Every function `name` may denote (all overloads); empty for unknown ones.
    fn resolve_func(&self, name: &FuncName) -> Vec<FuncId> {
        self.func_by_name
            .get(&name.name)
            .map(|ids| {
                ids.iter()
                    .copied()
                    .filter(|&id| name.may_match(&self.funcs[id as usize]))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn edge(&mut self, kind: EdgeKind, from: String, to: String, via: Option<&str>, action: &str) {
        self.report.edges.push(Edge {
            kind,
            from,
            to,
            via: via.map(str::to_owned),
            action: action.to_owned(),
        });
    }

    fn rel_label(&self, id: RelId) -> String {
        self.rels[id as usize].to_string()
    }

    /// Builds every node and edge from the rows and rules.
    pub fn new(rows: &CatalogRows, rules: &[ManualRule]) -> Builder {
        let mut b = Builder::default();
        for r in &rows.relations {
            let id = b.add_rel(RelName::new(Some(&r.schema), &r.name), r.relkind);
            b.unlogged[id as usize] = r.unlogged;
            if r.unlogged {
                b.report.unlogged.push(format!("{}.{}", r.schema, r.name));
            }
            b.by_oid.insert(r.oid, id);
        }
        for f in &rows.functions {
            let id = b.add_func(FuncName::new(Some(&f.schema), &f.name), f.volatility);
            b.func_by_oid.insert(f.oid, id);
        }
        b.report.relations = rows.relations.len();
        b.report.functions = rows.functions.len();
        b.add_catalog_edges(rows);
        for (f, row) in rows.functions.iter().enumerate() {
            b.add_body(f as FuncId, &row.language, row.definition.as_deref());
        }
        for rule in &rows.rules {
            b.add_rewrite_rule(rule);
        }
        for rule in rules {
            b.add_rule(rule);
        }
        for v in [
            &mut b.cascades,
            &mut b.children,
            &mut b.parents,
            &mut b.rel_reads,
            &mut b.func_writes,
            &mut b.func_reads,
        ] {
            v.iter_mut().for_each(|l| {
                l.sort_unstable();
                l.dedup();
            });
        }
        for l in b
            .triggers
            .iter_mut()
            .chain(b.calls.iter_mut())
            .chain(b.read_calls.iter_mut())
        {
            l.sort_unstable();
            l.dedup();
        }
        b.report.edges.sort();
        b.report.edges.dedup();
        b.report.unanalysable.sort();
        b.report.unlogged.sort();
        b
    }

    fn add_catalog_edges(&mut self, rows: &CatalogRows) {
        // First: views and defaults name aggregates by their oids.
        self.add_implicit_calls(rows);
        self.add_implicit_casts(rows);
        for t in &rows.triggers {
            let (Some(&rel), Some(&f)) = (
                self.by_oid.get(&t.table_oid),
                self.func_by_oid.get(&t.function_oid),
            ) else {
                continue; // a built-in or extension trigger function: writes nothing of ours
            };
            self.triggers[rel as usize].push(f);
            let (from, to) = (self.rel_label(rel), func_label(&self.funcs[f as usize]));
            self.edge(EdgeKind::Trigger, from, to, Some(&t.name), "fires");
        }
        for k in &rows.foreign_keys {
            let Some(action) = fk_action(k.on_delete, k.on_update) else {
                continue;
            };
            let (Some(&referenced), Some(&referencing)) = (
                self.by_oid.get(&k.referenced_oid),
                self.by_oid.get(&k.referencing_oid),
            ) else {
                continue;
            };
            self.cascades[referenced as usize].push(referencing);
            let (from, to) = (self.rel_label(referenced), self.rel_label(referencing));
            self.edge(EdgeKind::ForeignKey, from, to, Some(&k.name), &action);
        }
        for d in &rows.view_deps {
            let (Some(&view), Some(&base)) =
                (self.by_oid.get(&d.view_oid), self.by_oid.get(&d.base_oid))
            else {
                continue;
            };
            if view == base {
                continue;
            }
            let (from, to) = (self.rel_label(view), self.rel_label(base));
            if self.relkind[view as usize] == 'm' {
                // A materialized view's rows change only when it is refreshed, which is a
                // write of the view itself: reading it reads no base relation.
                let action = "materialized: read only at refresh";
                self.edge(EdgeKind::View, from, to, None, action);
                continue;
            }
            self.rel_reads[view as usize].push(base);
            // A write through an updatable view writes its base relation.
            self.cascades[view as usize].push(base);
            self.edge(EdgeKind::View, from, to, None, "reads");
        }
        for c in &rows.write_calls {
            let (Some(&rel), Some(&f)) = (
                self.by_oid.get(&c.table_oid),
                self.func_by_oid.get(&c.function_oid),
            ) else {
                continue; // a built-in (nextval, now ...): writes nothing of ours
            };
            self.triggers[rel as usize].push(f);
            let (from, to) = (self.rel_label(rel), func_label(&self.funcs[f as usize]));
            self.edge(EdgeKind::Expression, from, to, Some(&c.via), "calls");
        }
        for e in &rows.event_triggers {
            let Some(&f) = self.func_by_oid.get(&e.function_oid) else {
                continue;
            };
            self.ddl_calls.push(f);
            let to = func_label(&self.funcs[f as usize]);
            let action = format!("fires on {}", e.event);
            self.edge(
                EdgeKind::EventTrigger,
                "ddl".into(),
                to,
                Some(&e.name),
                &action,
            );
        }
        self.add_read_deps(rows);
        for i in &rows.inherits {
            let (Some(&child), Some(&parent)) = (
                self.by_oid.get(&i.child_oid),
                self.by_oid.get(&i.parent_oid),
            ) else {
                continue;
            };
            self.children[parent as usize].push(child);
            self.parents[child as usize].push(parent);
            let (kind, action) = if self.relkind[parent as usize] == 'p' {
                (EdgeKind::Partition, "partition")
            } else {
                (EdgeKind::Inheritance, "inherits")
            };
            let (from, to) = (self.rel_label(parent), self.rel_label(child));
            self.edge(kind, from, to, None, action);
        }
    }

    /// The functions that run behind syntax naming none: a call of an aggregate calls its
    /// support functions; an operator and a cast are function nodes of their own, named as
    /// the analysis names them ([`FuncName::operator`], [`FuncName::cast_to`]), calling
    /// their functions.
    fn add_implicit_calls(&mut self, rows: &CatalogRows) {
        for c in &rows.implicit_calls {
            let Some(&f) = self.func_by_oid.get(&c.function_oid) else {
                continue; // a built-in or extension function: writes nothing of ours
            };
            let (name, via) = match c.kind {
                'a' => (FuncName::new(Some(&c.schema), &c.name), "aggregate"),
                'o' => (FuncName::operator(Some(&c.schema), &c.name), "operator"),
                'c' => (FuncName::cast_to(Some(&c.schema), &c.name), "cast"),
                _ => continue,
            };
            let node = if c.kind == 'c' {
                self.cast_node(&c.schema, &c.name)
            } else {
                let key = (c.kind, c.schema.clone(), c.name.clone());
                match self.implicit_by_name.get(&key) {
                    Some(&node) => node,
                    None => {
                        let node = self.add_func(name, 'v');
                        self.implicit_by_name.insert(key, node);
                        node
                    }
                }
            };
            if c.kind == 'a' {
                // A view's query or a default naming the aggregate names it by this oid.
                self.func_by_oid.entry(c.owner_oid).or_insert(node);
            }
            self.calls[node as usize].push(f);
            let (from, to) = (
                func_label(&self.funcs[node as usize]),
                func_label(&self.funcs[f as usize]),
            );
            self.edge(EdgeKind::Function, from, to, Some(via), "calls");
        }
    }

    /// What a read runs behind a relation's name: the functions a view's query calls, and
    /// what the row-security policies filtering its reads read and call.
    fn add_read_deps(&mut self, rows: &CatalogRows) {
        for c in &rows.view_calls {
            let (Some(&view), Some(&f)) = (
                self.by_oid.get(&c.view_oid),
                self.func_by_oid.get(&c.function_oid),
            ) else {
                continue; // a built-in or extension function: reads nothing of ours
            };
            let (from, to) = (self.rel_label(view), func_label(&self.funcs[f as usize]));
            if self.relkind[view as usize] == 'm' {
                // Its refresh, a write of the materialized view, runs the function (as a
                // write to a table runs its triggers' functions); a read of it runs none.
                self.triggers[view as usize].push(f);
                let action = "materialized: called at refresh";
                self.edge(EdgeKind::View, from, to, None, action);
                continue;
            }
            self.read_calls[view as usize].push(f);
            self.edge(EdgeKind::View, from, to, None, "calls");
        }
        for p in &rows.policy_deps {
            let Some(&table) = self.by_oid.get(&p.table_oid) else {
                continue;
            };
            let from = self.rel_label(table);
            if p.ref_kind == 'f' {
                let Some(&f) = self.func_by_oid.get(&p.ref_oid) else {
                    continue;
                };
                self.read_calls[table as usize].push(f);
                let to = func_label(&self.funcs[f as usize]);
                self.edge(EdgeKind::Policy, from, to, Some(&p.name), "calls");
            } else {
                let Some(&base) = self.by_oid.get(&p.ref_oid) else {
                    continue;
                };
                if base == table {
                    continue;
                }
                self.rel_reads[table as usize].push(base);
                let to = self.rel_label(base);
                self.edge(EdgeKind::Policy, from, to, Some(&p.name), "reads");
            }
        }
    }

    fn add_body(&mut self, f: FuncId, language: &str, definition: Option<&str>) {
        let fx = analyze_body(language, definition);
        let label = func_label(&self.funcs[f as usize]);
        self.elsewhere |= fx.writes_elsewhere || fx.unanalysable.is_some();
        if let Some(reason) = fx.unanalysable {
            self.report.unanalysable.push(UnanalysableBody {
                function: label.clone(),
                language: language.to_owned(),
                reason: reason.clone(),
                overridden_by_rule: false,
            });
            self.unanalysable[f as usize] = Some(reason);
        }
        for (names, action) in [(&fx.writes, "writes"), (&fx.reads, "reads")] {
            for name in names
                .iter()
                .filter(|n| !n.is_system_catalog() || n.is_large_objects())
            {
                for rel in self.resolve_rel(name) {
                    let list = if action == "writes" {
                        &mut self.func_writes
                    } else {
                        &mut self.func_reads
                    };
                    list[f as usize].push(rel);
                    let to = self.rel_label(rel);
                    self.edge(EdgeKind::Function, label.clone(), to, None, action);
                }
            }
        }
        for name in fx.calls.iter().chain(&fx.implicit_calls) {
            for callee in self.resolve_func(name) {
                self.calls[f as usize].push(callee);
                let to = func_label(&self.funcs[callee as usize]);
                self.edge(EdgeKind::Function, label.clone(), to, None, "calls");
            }
        }
    }

    /// A rewrite rule: a write to its relation writes what the rule's actions write (as a
    /// cascade) and calls what they call (as a trigger's function would run). A rule whose
    /// text cannot be analysed runs as an unanalysable volatile function: a write to its
    /// relation may write anything.
    fn add_rewrite_rule(&mut self, rule: &crate::catalog::RuleRow) {
        let Some(&rel) = self.by_oid.get(&rule.table_oid) else {
            return;
        };
        let fx = analyze_rule(&rule.definition);
        let from = self.rel_label(rel);
        if let Some(reason) = fx.unanalysable {
            let stand_in = FuncName::new(None, &format!("rule {} on {from}", rule.name));
            let f = self.add_func(stand_in, 'v');
            self.unanalysable[f as usize] = Some(reason.clone());
            self.triggers[rel as usize].push(f);
            self.report.unanalysable.push(UnanalysableBody {
                function: format!("rule {} on {from}", rule.name),
                language: "rule".to_owned(),
                reason,
                overridden_by_rule: false,
            });
            let to = func_label(&self.funcs[f as usize]);
            self.edge(EdgeKind::Rule, from, to, Some(&rule.name), "runs");
            return;
        }
        for name in fx
            .writes
            .iter()
            .filter(|n| !n.is_system_catalog() || n.is_large_objects())
        {
            for target in self.resolve_rel(name) {
                if target != rel {
                    self.cascades[rel as usize].push(target);
                }
                let to = self.rel_label(target);
                self.edge(EdgeKind::Rule, from.clone(), to, Some(&rule.name), "writes");
            }
        }
        for name in fx.calls.iter().chain(&fx.implicit_calls) {
            for f in self.resolve_func(name) {
                self.triggers[rel as usize].push(f);
                let to = func_label(&self.funcs[f as usize]);
                self.edge(EdgeKind::Rule, from.clone(), to, Some(&rule.name), "calls");
            }
        }
    }

    fn add_rule(&mut self, rule: &ManualRule) {
        let targets: Vec<RelId> = rule
            .targets
            .iter()
            .flat_map(|t| self.resolve_rel(t))
            .collect();
        match &rule.source {
            RuleSource::Relation(src) => {
                for s in self.resolve_rel(src) {
                    for &t in targets.iter().filter(|&&t| t != s) {
                        self.cascades[s as usize].push(t);
                        let (from, to) = (self.rel_label(s), self.rel_label(t));
                        self.edge(EdgeKind::Manual, from, to, Some(&rule.text), "writes");
                    }
                }
            }
            RuleSource::Function(src) => {
                let mut funcs = self.resolve_func(src);
                if funcs.is_empty() {
                    funcs.push(self.add_func(src.clone(), 'v'));
                }
                for f in funcs {
                    // The rule says what the function does: its body no longer counts as
                    // unanalysable.
                    if self.unanalysable[f as usize].take().is_some() {
                        let label = func_label(&self.funcs[f as usize]);
                        for u in &mut self.report.unanalysable {
                            if u.function == label {
                                u.overridden_by_rule = true;
                            }
                        }
                    }
                    for &t in &targets {
                        self.func_writes[f as usize].push(t);
                        self.func_reads[f as usize].push(t);
                        let (from, to) = (func_label(&self.funcs[f as usize]), self.rel_label(t));
                        self.edge(
                            EdgeKind::Manual,
                            from,
                            to,
                            Some(&rule.text),
                            "writes, reads",
                        );
                    }
                }
            }
        }
    }
}
