//! User casts PostgreSQL applies without being asked (`CREATE CAST ... AS IMPLICIT` or `AS
//! ASSIGNMENT`): `INSERT INTO t(x) SELECT v FROM s` casts `v` to the type of `x`, `v > 0`
//! casts `v` to make the comparison resolve. The text names neither the cast nor, often,
//! its types, and the parse tree has no types. Such a cast can only run where a value of
//! one of its types appears, and a value of a type that is not built in comes from a
//! column, a function (its signature or body names the type), an explicit cast or a
//! typed literal (`'x'::t`, which the analysis records as a cast to `t`). So the cast's
//! function counts as run:
//!
//! - by a read or a write of a relation with a column of a type built on the cast's types
//!   (found by `IMPLICIT_CASTS_SQL`);
//! - by an explicit cast to such a type (the graph's `cast to t` node calls it);
//! - by a function whose definition names such a type or relation, or a function already
//!   counted (a function returning such a value), found by a case-insensitive search of
//!   the definitions (signature included) until nothing more is found;
//! - between two built-in types (a superuser's cast): by every statement.
//!
//! Stored expressions (defaults, checks, views, policies, rules, `BEGIN ATOMIC` bodies)
//! record the cast functions they apply in `pg_depend`, which the other catalog queries
//! follow already.

use std::collections::BTreeMap;

use super::{func_label, Builder, FuncId};
use crate::catalog::{CatalogRows, ImplicitCastRow};
use crate::report::EdgeKind;

const VIA: &str = "implicit cast";

impl Builder {
    /// The function node an explicit cast to `schema.name` calls (`FuncName::cast_to`),
    /// made when no user cast to that type made it already.
    pub(super) fn cast_node(&mut self, schema: &str, name: &str) -> FuncId {
        let key = ('c', schema.to_owned(), name.to_owned());
        if let Some(&node) = self.implicit_by_name.get(&key) {
            return node;
        }
        let node = self.add_func(pgfresh_sql::FuncName::cast_to(Some(schema), name), 'v');
        self.implicit_by_name.insert(key, node);
        node
    }

    /// Where each user implicit or assignment cast with a function may run (see the module
    /// documentation).
    pub(super) fn add_implicit_casts(&mut self, rows: &CatalogRows) {
        let mut by_cast: BTreeMap<FuncId, Vec<&ImplicitCastRow>> = BTreeMap::new();
        for c in &rows.implicit_casts {
            // A built-in or extension function writes nothing of ours.
            if let Some(&f) = self.func_by_oid.get(&c.function_oid) {
                by_cast.entry(f).or_default().push(c);
            }
        }
        for (f, cast_rows) in by_cast {
            let names = self.cast_places(f, &cast_rows);
            self.cast_in_bodies(f, names, rows);
        }
    }

    /// Adds the edges of the cast function `f` to the types and relations of `cast_rows`;
    /// returns their names (lowercase), which a function definition may mention.
    fn cast_places(&mut self, f: FuncId, cast_rows: &[&ImplicitCastRow]) -> Vec<String> {
        let to = func_label(&self.funcs[f as usize]);
        let mut names = Vec::new();
        for c in cast_rows {
            match c.kind {
                't' => {
                    let node = self.cast_node(&c.schema, &c.name);
                    self.calls[node as usize].push(f);
                    let from = func_label(&self.funcs[node as usize]);
                    self.edge(EdgeKind::Function, from, to.clone(), Some(VIA), "calls");
                    names.push(c.name.to_lowercase());
                }
                'r' => {
                    let Some(&rel) = self.by_oid.get(&c.oid) else {
                        continue;
                    };
                    self.triggers[rel as usize].push(f);
                    self.read_calls[rel as usize].push(f);
                    let from = self.rel_label(rel);
                    self.edge(EdgeKind::Expression, from, to.clone(), Some(VIA), "calls");
                    names.push(self.rels[rel as usize].name.to_lowercase());
                }
                'b' => {
                    self.everywhere.push(f);
                    let action = "calls (a cast between built-in types: every statement)";
                    self.edge(
                        EdgeKind::Function,
                        "*".into(),
                        to.clone(),
                        Some(VIA),
                        action,
                    );
                }
                _ => {}
            }
        }
        names
    }

    /// Functions whose definitions name one of `names` may hold a value of the cast's
    /// types, and so may apply it: they call `f`. A function counted adds its own name.
    fn cast_in_bodies(&mut self, f: FuncId, mut names: Vec<String>, rows: &CatalogRows) {
        let defs: Vec<Option<String>> = rows
            .functions
            .iter()
            .map(|r| r.definition.as_deref().map(str::to_lowercase))
            .collect();
        let mut counted = vec![false; defs.len()];
        let to = func_label(&self.funcs[f as usize]);
        loop {
            let mut more = false;
            for (i, def) in defs.iter().enumerate() {
                let Some(def) = def.as_deref().filter(|_| !counted[i]) else {
                    continue;
                };
                if !names.iter().any(|n| def.contains(n.as_str())) {
                    continue;
                }
                counted[i] = true;
                more = true;
                names.push(rows.functions[i].name.to_lowercase());
                // Function ids are the rows' indexes (added first, in order).
                let Ok(g) = FuncId::try_from(i) else { continue };
                if g != f {
                    self.calls[g as usize].push(f);
                    let from = func_label(&self.funcs[g as usize]);
                    self.edge(EdgeKind::Function, from, to.clone(), Some(VIA), "calls");
                }
            }
            if !more {
                return;
            }
        }
    }
}
