//! The hot path: what a statement's writes and reads touch behind its text.
//!
//! Names match as DESIGN §1 rule 8 says: an unqualified name matches that name in every
//! schema, a qualified one only its own schema (or an unqualified virtual node). Functions
//! called by name match every overload. Only relations and functions whose closures are not
//! trivial are indexed, so names the graph has nothing to say about cost one hash lookup, and
//! an empty graph returns at once.

use std::sync::Arc;

use pgfresh_sql::{FuncName, RelName};

use crate::graph::{FuncId, RelId};
use crate::unlogged::Unlogged;

/// The hash map of the hot-path indexes.
pub(crate) type FastMap<K, V> = foldhash::HashMap<K, V>;
use crate::report::DependencyReport;

/// What an expansion found beyond the relations it appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Expansion {
    /// The appended relations are everything the statement touches behind its text.
    Precise,
    /// Something unanalysable (dynamic SQL, another language) may run: treat the whole
    /// database as touched.
    WholeDatabase,
}

impl Expansion {
    /// True for [`Expansion::WholeDatabase`].
    pub fn is_whole_database(self) -> bool {
        self == Expansion::WholeDatabase
    }
}

/// A closure: a sorted run of relation ids in the pool, plus the whole-database flag.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Span {
    pub start: u32,
    pub len: u32,
    pub whole: bool,
}

impl Span {
    pub fn is_trivial(&self) -> bool {
        self.len == 0 && !self.whole
    }
}

/// The dependency graph of one database, with every closure precomputed. Immutable and
/// `Send + Sync`: share it behind an `Arc` and replace it whole on refresh.
#[derive(Debug, Default)]
pub struct DepGraph {
    pub(crate) rels: Vec<RelName>,
    pub(crate) funcs: Vec<FuncName>,
    pub(crate) pool: Vec<RelId>,
    pub(crate) rel_write: Vec<Span>,
    pub(crate) rel_read: Vec<Span>,
    /// What a read of each relation writes through the functions it runs (a view's query,
    /// a row-security policy's expression).
    pub(crate) rel_read_write: Vec<Span>,
    /// Some read writes (a `rel_read_write` is not empty).
    pub(crate) reads_write: bool,
    /// A body that may write another database exists (see [`DepGraph::may_write_elsewhere`]).
    pub(crate) elsewhere: bool,
    /// What every statement may call (see [`DepGraph::everywhere_calls`]).
    pub(crate) everywhere: Vec<FuncName>,
    pub(crate) func_write: Vec<Span>,
    pub(crate) func_read: Vec<Span>,
    /// What DDL writes through the event triggers it fires.
    pub(crate) ddl_write: Span,
    /// Name → ids, probed for every routed statement: a fast non-cryptographic hash
    /// (names come from the catalog and from parsed SQL, not from an adversary's choice
    /// of hash inputs alone; measured in crates/proxy/benches/route.rs).
    pub(crate) rel_index: FastMap<Arc<str>, Vec<RelId>>,
    pub(crate) func_index: FastMap<Arc<str>, Vec<FuncId>>,
    /// What reaches an unlogged table (see `unlogged`).
    pub(crate) unlogged: Unlogged,
    pub(crate) report: DependencyReport,
}

impl DepGraph {
    /// A graph with no dependencies: every expansion adds nothing.
    pub fn empty() -> DepGraph {
        DepGraph::default()
    }

    /// True when no expansion can add anything.
    pub fn is_empty(&self) -> bool {
        self.rel_index.is_empty()
            && self.func_index.is_empty()
            && self.ddl_write.is_trivial()
            && self.unlogged.is_empty()
    }

    /// Whether calling `called` may write: a function whose body, or a function it calls,
    /// writes a relation (`nextval` writes its sequence) or may run a volatile body pgfresh
    /// cannot read. A function the catalog marks STABLE or IMMUTABLE can still do so —
    /// PostgreSQL refuses data-modifying statements in its own body, not the functions it
    /// calls — and a standby refuses the write.
    pub fn calls_writer(&self, called: &[FuncName]) -> bool {
        called.iter().any(|n| {
            self.func_index.get(&*n.name).is_some_and(|ids| {
                ids.iter().any(|&f| {
                    n.may_match(&self.funcs[f as usize])
                        && !self.func_write[f as usize].is_trivial()
                })
            })
        })
    }

    /// Functions any statement may run without naming them: those of user casts between
    /// two built-in types that PostgreSQL applies implicitly or on assignment. Count them
    /// among every statement's calls.
    pub fn everywhere_calls(&self) -> &[FuncName] {
        &self.everywhere
    }

    /// Whether an expansion that answered [`Expansion::WholeDatabase`] may have written
    /// another database of the instance too: some function body calls `dblink` or
    /// cannot be analysed at all (the one that may run is not told apart).
    pub fn may_write_elsewhere(&self) -> bool {
        self.elsewhere
    }

    /// Whether reading `reads` runs a function that writes: a view's query or a
    /// row-security policy calls one (an audit of reads). Such a read runs on the primary
    /// and marks what it writes ([`DepGraph::expand_read_writes`]).
    pub fn reads_write(&self, reads: &[RelName]) -> bool {
        self.reads_write
            && reads.iter().any(|n| {
                self.rel_index.get(&*n.name).is_some_and(|ids| {
                    ids.iter().any(|&r| {
                        n.may_match(&self.rels[r as usize])
                            && !self.rel_read_write[r as usize].is_trivial()
                    })
                })
            })
    }

    /// Appends to `out` what reading `reads` writes through the functions the reads run
    /// (see [`DepGraph::reads_write`]).
    pub fn expand_read_writes(&self, reads: &[RelName], out: &mut Vec<RelName>) {
        if !self.reads_write {
            return;
        }
        let spans = (&self.rel_read_write[..], &self.func_write[..]);
        self.expand(reads, &[], spans, &mut |r| out.push(r.clone()));
    }

    /// Whether reading `reads` and calling `called` reaches an unlogged table, which only
    /// the primary can read: named, through a partitioned or inheritance parent (at any
    /// depth), through a view, or in what a called function reads.
    pub fn reads_unlogged(&self, reads: &[RelName], called: &[FuncName]) -> bool {
        self.unlogged
            .reached(&self.rels, &self.funcs, reads, called)
    }

    /// Appends to `out` what a DDL statement writes through the event triggers it fires
    /// (their functions' writes, transitively); `WholeDatabase` when one may write anything.
    /// Every DDL statement counts: the event a trigger listens for is not checked.
    pub fn expand_ddl(&self, out: &mut Vec<RelName>) -> Expansion {
        let span = self.ddl_write;
        self.slice(span)
            .iter()
            .for_each(|&r| out.push(self.rels[r as usize].clone()));
        if span.whole {
            Expansion::WholeDatabase
        } else {
            Expansion::Precise
        }
    }

    /// Appends to `out` the relations that committing writes to `writes`, and calls of
    /// `called`, also write: trigger effects, foreign-key cascades, partitions and ancestors,
    /// base relations of written views, bodies of called functions, manual rules;
    /// transitively. The inputs themselves are not appended (the caller marks them already);
    /// the appended names are catalog names (schema-qualified) or names as written in a body
    /// or rule, deduplicated. Nothing unrelated is appended.
    pub fn expand_writes(
        &self,
        writes: &[RelName],
        called: &[FuncName],
        out: &mut Vec<RelName>,
    ) -> Expansion {
        if self.is_empty() {
            return Expansion::Precise;
        }
        let spans = (&self.rel_write[..], &self.func_write[..]);
        self.expand(writes, called, spans, &mut |r| out.push(r.clone()))
    }

    /// [`DepGraph::expand_writes`] appending borrowed names (no reference-count traffic; the
    /// names live as long as the graph).
    pub fn expand_writes_borrowed<'g>(
        &'g self,
        writes: &[RelName],
        called: &[FuncName],
        out: &mut Vec<&'g RelName>,
    ) -> Expansion {
        if self.is_empty() {
            return Expansion::Precise;
        }
        let spans = (&self.rel_write[..], &self.func_write[..]);
        self.expand(writes, called, spans, &mut |r| out.push(r))
    }

    /// Appends to `out` the relations that reading `reads` and calling `called` reads beyond
    /// the names themselves: the base relations of views (through views over views; a
    /// materialized view reads only itself), and what called functions read, transitively.
    pub fn expand_reads(
        &self,
        reads: &[RelName],
        called: &[FuncName],
        out: &mut Vec<RelName>,
    ) -> Expansion {
        if self.is_empty() {
            return Expansion::Precise;
        }
        let spans = (&self.rel_read[..], &self.func_read[..]);
        self.expand(reads, called, spans, &mut |r| out.push(r.clone()))
    }

    /// [`DepGraph::expand_reads`] appending borrowed names.
    pub fn expand_reads_borrowed<'g>(
        &'g self,
        reads: &[RelName],
        called: &[FuncName],
        out: &mut Vec<&'g RelName>,
    ) -> Expansion {
        if self.is_empty() {
            return Expansion::Precise;
        }
        let spans = (&self.rel_read[..], &self.func_read[..]);
        self.expand(reads, called, spans, &mut |r| out.push(r))
    }

    fn expand<'g>(
        &'g self,
        rels: &[RelName],
        called: &[FuncName],
        (rel_spans, func_spans): (&[Span], &[Span]),
        sink: &mut dyn FnMut(&'g RelName),
    ) -> Expansion {
        let mut whole = false;
        let mut first: Option<Span> = None;
        let mut ids: Vec<RelId> = Vec::new();
        let mut add = |span: Span, whole: &mut bool| {
            *whole |= span.whole;
            if span.len == 0 {
                return;
            }
            match first {
                None => first = Some(span),
                Some(f) => {
                    if ids.is_empty() {
                        ids.extend_from_slice(self.slice(f));
                    }
                    ids.extend_from_slice(self.slice(span));
                }
            }
        };
        for name in rels {
            if let Some(cands) = self.rel_index.get(&*name.name) {
                for &r in cands {
                    if name.may_match(&self.rels[r as usize]) {
                        add(rel_spans[r as usize], &mut whole);
                    }
                }
            }
        }
        for name in called {
            if let Some(cands) = self.func_index.get(&*name.name) {
                for &f in cands {
                    if name.may_match(&self.funcs[f as usize]) {
                        add(func_spans[f as usize], &mut whole);
                    }
                }
            }
        }
        if ids.is_empty() {
            if let Some(span) = first {
                // One closure: already sorted and without duplicates.
                self.slice(span)
                    .iter()
                    .for_each(|&r| sink(&self.rels[r as usize]));
            }
        } else {
            ids.sort_unstable();
            ids.dedup();
            ids.iter().for_each(|&r| sink(&self.rels[r as usize]));
        }
        if whole {
            Expansion::WholeDatabase
        } else {
            Expansion::Precise
        }
    }

    fn slice(&self, span: Span) -> &[RelId] {
        let start = span.start as usize;
        &self.pool[start..start + span.len as usize]
    }

    /// Edges and unanalysable bodies, for `SHOW DEPENDENCIES` and `GET /v1/dependencies`.
    pub fn report(&self) -> &DependencyReport {
        &self.report
    }

    /// Relation nodes, functions, and closure entries stored (for status output).
    pub fn size(&self) -> (usize, usize, usize) {
        (self.rels.len(), self.funcs.len(), self.pool.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graphs_are_shared_across_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<DepGraph>();
    }
}
