//! Relations a standby cannot read. An unlogged table's rows are not written to the WAL, so
//! a standby has none of them and refuses to scan it ("cannot access temporary or unlogged
//! relations during recovery"): a read that reaches one must run on the primary, whether it
//! names the table, a partitioned or inheritance parent with an unlogged descendant, a view
//! over one, or a function that reads one.

use std::sync::Arc;

use pgfresh_sql::{FuncName, RelName};

use crate::expand::{FastMap, Span};
use crate::graph::{Builder, FuncId, RelId};

/// The relations and functions whose reads reach an unlogged table, by name.
#[derive(Debug, Default)]
pub(crate) struct Unlogged {
    rels: FastMap<Arc<str>, Vec<RelId>>,
    funcs: FastMap<Arc<str>, Vec<FuncId>>,
}

impl Unlogged {
    /// From the built closures: `rel_read` and `func_read` are the read closures' spans
    /// into `pool`.
    pub(crate) fn build(
        b: &Builder,
        pool: &[RelId],
        rel_read: &[Span],
        func_read: &[Span],
    ) -> Self {
        let mut out = Unlogged::default();
        if !b.unlogged.iter().any(|&u| u) {
            return out;
        }
        let touched = touched(b);
        // A closure that may read anything (an unanalysable body) may read them too.
        let reaches = |span: &Span| {
            let start = span.start as usize;
            span.whole
                || pool[start..start + span.len as usize]
                    .iter()
                    .any(|&r| touched[r as usize])
        };
        for (r, name) in b.rels.iter().enumerate() {
            if touched[r] || reaches(&rel_read[r]) {
                out.rels
                    .entry(name.name.clone())
                    .or_default()
                    .push(r as RelId);
            }
        }
        for (f, name) in b.funcs.iter().enumerate() {
            if reaches(&func_read[f]) {
                out.funcs
                    .entry(name.name.clone())
                    .or_default()
                    .push(f as FuncId);
            }
        }
        out
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rels.is_empty() && self.funcs.is_empty()
    }

    /// Whether reading `reads` and calling `called` may reach an unlogged table
    /// (`rels` and `funcs` name the graph's nodes; names match as the expansions' do).
    pub(crate) fn reached(
        &self,
        rels: &[RelName],
        funcs: &[FuncName],
        reads: &[RelName],
        called: &[FuncName],
    ) -> bool {
        if self.is_empty() {
            return false;
        }
        reads.iter().any(|n| {
            self.rels
                .get(&*n.name)
                .is_some_and(|ids| ids.iter().any(|&r| n.may_match(&rels[r as usize])))
        }) || called.iter().any(|n| {
            self.funcs
                .get(&*n.name)
                .is_some_and(|ids| ids.iter().any(|&f| n.may_match(&funcs[f as usize])))
        })
    }
}

/// Per relation: it is unlogged, or one of its partitions or inheritance children is, at
/// any depth (a scan of a parent scans them).
fn touched(b: &Builder) -> Vec<bool> {
    let mut touched = b.unlogged.clone();
    // Children first: from each unlogged relation up through its parents.
    let mut stack: Vec<RelId> = (0..b.rels.len())
        .filter(|&r| b.unlogged[r])
        .map(|r| r as RelId)
        .collect();
    while let Some(r) = stack.pop() {
        for &p in &b.parents[r as usize] {
            if !touched[p as usize] {
                touched[p as usize] = true;
                stack.push(p);
            }
        }
    }
    touched
}
