//! Precomputing closures: for every relation and function, everything a write to it (or a
//! call of it) marks, and everything a read of it (or a call of it) reads.
//!
//! Write closures walk two kinds of relation state, because partitions go both ways but not
//! transitively: a write to a parent may write any descendant (and those writes are visible
//! through every ancestor of the descendant, and fire their triggers), while a write to a
//! partition marks its ancestors without writing its siblings. A relation reached *fully*
//! follows triggers, cascades, children and parents; one reached *upwards* (as an ancestor of
//! a written relation) follows triggers, cascades and parents only. Row triggers defined on a
//! partitioned table fire for writes to its partitions, so an ancestor's triggers count.
//! Functions follow their writes and calls. Cycles end at already-visited states. A foreign
//! table written makes the closure the whole database: its server may be this one.

use crate::expand::{DepGraph, FastMap, Span};
use crate::graph::{Builder, FuncId, RelId};
use crate::unlogged::Unlogged;
use crate::{CatalogRows, ManualRule};

/// Visited-state stamps, reused across walks without clearing.
struct Walk {
    stamp: u32,
    full: Vec<u32>,
    up: Vec<u32>,
    func: Vec<u32>,
    rel_seen: Vec<u32>,
    queue: Vec<Item>,
    out: Vec<RelId>,
    /// The functions the last read walk ran.
    funcs_out: Vec<FuncId>,
}

#[derive(Clone, Copy)]
enum Item {
    Full(RelId),
    Up(RelId),
    Func(FuncId),
}

impl Walk {
    fn new(b: &Builder) -> Walk {
        Walk {
            stamp: 0,
            full: vec![0; b.rels.len()],
            up: vec![0; b.rels.len()],
            func: vec![0; b.funcs.len()],
            rel_seen: vec![0; b.rels.len()],
            queue: Vec::new(),
            out: Vec::new(),
            funcs_out: Vec::new(),
        }
    }

    fn begin(&mut self) {
        self.stamp += 1;
        self.queue.clear();
        self.out.clear();
        self.funcs_out.clear();
    }

    fn collect(&mut self, r: RelId) {
        if self.rel_seen[r as usize] != self.stamp {
            self.rel_seen[r as usize] = self.stamp;
            self.out.push(r);
        }
    }

    /// Everything `start` writes; true when an unanalysable volatile function may run.
    fn writes(&mut self, b: &Builder, start: Item) -> bool {
        self.writes_from(b, &[start])
    }

    /// Everything the items of `starts` write together.
    fn writes_from(&mut self, b: &Builder, starts: &[Item]) -> bool {
        self.begin();
        let mut whole = false;
        self.queue.extend_from_slice(starts);
        while let Some(item) = self.queue.pop() {
            match item {
                Item::Full(r) => {
                    let i = r as usize;
                    if self.full[i] == self.stamp {
                        continue;
                    }
                    self.full[i] = self.stamp;
                    self.collect(r);
                    // A foreign table's rows live on another server, which may be this
                    // database (`postgres_fdw` pointed back at it): what a write there
                    // changes is not known.
                    whole |= b.relkind[i] == 'f';
                    self.queue
                        .extend(b.children[i].iter().map(|&c| Item::Full(c)));
                    self.relation_common(b, i);
                }
                Item::Up(r) => {
                    let i = r as usize;
                    if self.full[i] == self.stamp || self.up[i] == self.stamp {
                        continue;
                    }
                    self.up[i] = self.stamp;
                    self.collect(r);
                    self.relation_common(b, i);
                }
                Item::Func(f) => {
                    let i = f as usize;
                    if self.func[i] == self.stamp {
                        continue;
                    }
                    self.func[i] = self.stamp;
                    // PostgreSQL runs the body of a STABLE or IMMUTABLE function read-only,
                    // so only a volatile body can write through dynamic SQL.
                    whole |= b.unanalysable[i].is_some() && b.volatility[i] == 'v';
                    self.queue
                        .extend(b.func_writes[i].iter().map(|&r| Item::Full(r)));
                    self.queue.extend(b.calls[i].iter().map(|&g| Item::Func(g)));
                }
            }
        }
        whole
    }

    fn relation_common(&mut self, b: &Builder, i: usize) {
        self.queue
            .extend(b.triggers[i].iter().map(|&f| Item::Func(f)));
        self.queue
            .extend(b.cascades[i].iter().map(|&c| Item::Full(c)));
        self.queue.extend(b.parents[i].iter().map(|&p| Item::Up(p)));
    }

    /// Everything a read of relation `start` (`Item::Full`) or a call of function `start`
    /// (`Item::Func`) reads: a view's base relations and the functions its query calls, what
    /// a row-security policy's expression reads and calls, what function bodies read and
    /// call; transitively. True when an unanalysable function may run.
    fn reads(&mut self, b: &Builder, start: Item) -> bool {
        self.begin();
        let mut whole = false;
        self.queue.push(start);
        while let Some(item) = self.queue.pop() {
            match item {
                Item::Full(r) | Item::Up(r) => {
                    let i = r as usize;
                    if self.full[i] == self.stamp {
                        continue;
                    }
                    self.full[i] = self.stamp;
                    self.collect(r);
                    self.queue
                        .extend(b.rel_reads[i].iter().map(|&c| Item::Full(c)));
                    self.queue
                        .extend(b.read_calls[i].iter().map(|&f| Item::Func(f)));
                }
                Item::Func(f) => {
                    let i = f as usize;
                    if self.func[i] == self.stamp {
                        continue;
                    }
                    self.func[i] = self.stamp;
                    self.funcs_out.push(f);
                    whole |= b.unanalysable[i].is_some();
                    self.queue
                        .extend(b.func_reads[i].iter().map(|&r| Item::Full(r)));
                    self.queue.extend(b.calls[i].iter().map(|&g| Item::Func(g)));
                }
            }
        }
        whole
    }
}

/// Most closure entries stored for one database (32 MiB of ids). Closures can grow with the
/// square of the schema (every table reaching every other); past the bound a closure is not
/// stored and expands to the whole database instead, which is conservative.
pub const MAX_CLOSURE_ENTRIES: usize = 8 << 20;

/// Appends `ids` (without `exclude`) to the pool, sorted.
fn push_span(pool: &mut Vec<RelId>, ids: &[RelId], exclude: Option<RelId>, whole: bool) -> Span {
    let start = pool.len();
    if start + ids.len() > MAX_CLOSURE_ENTRIES {
        return Span {
            start: 0,
            len: 0,
            whole: true,
        };
    }
    pool.extend(ids.iter().copied().filter(|&r| Some(r) != exclude));
    pool[start..].sort_unstable();
    Span {
        start: u32::try_from(start).unwrap_or(u32::MAX),
        len: u32::try_from(pool.len() - start).unwrap_or(u32::MAX),
        whole,
    }
}

impl DepGraph {
    /// Builds the graph of one database from its catalog rows and the manual rules. Parses
    /// every function body, so it takes milliseconds to seconds on a large schema: build it
    /// off the request path and swap it in.
    pub fn build(rows: &CatalogRows, rules: &[ManualRule]) -> DepGraph {
        let b = Builder::new(rows, rules);
        let mut walk = Walk::new(&b);
        let mut pool = Vec::new();

        let mut rel_read = vec![Span::default(); b.rels.len()];
        let mut rel_write = vec![Span::default(); b.rels.len()];
        let mut rel_read_write = vec![Span::default(); b.rels.len()];
        for r in 0..b.rels.len() {
            let id = r as RelId;
            if !b.rel_reads[r].is_empty() || !b.read_calls[r].is_empty() {
                let whole = walk.reads(&b, Item::Full(id));
                rel_read[r] = push_span(&mut pool, &walk.out, Some(id), whole);
                // What the functions the read runs (a view's, a policy's) write. Only
                // what their bodies name: a read running a volatile body pgfresh cannot
                // read is left to the standby, which refuses a write.
                let run: Vec<Item> = walk.funcs_out.iter().map(|&f| Item::Func(f)).collect();
                if !run.is_empty() {
                    walk.writes_from(&b, &run);
                    rel_read_write[r] = push_span(&mut pool, &walk.out, None, false);
                }
            }
            let trivial = b.triggers[r].is_empty()
                && b.cascades[r].is_empty()
                && b.children[r].is_empty()
                && b.parents[r].is_empty()
                && b.relkind[r] != 'f';
            if !trivial {
                let whole = walk.writes(&b, Item::Full(id));
                rel_write[r] = push_span(&mut pool, &walk.out, Some(id), whole);
            }
        }
        let mut func_write = vec![Span::default(); b.funcs.len()];
        let mut func_read = vec![Span::default(); b.funcs.len()];
        for f in 0..b.funcs.len() {
            let whole = walk.reads(&b, Item::Func(f as FuncId));
            func_read[f] = push_span(&mut pool, &walk.out, None, whole);
            // What the call writes: what its body and callees write, and what the
            // functions run by what they read (views, policies) write. Those are among
            // the functions the read walk ran, the called one first.
            let ran: Vec<Item> = walk.funcs_out.iter().map(|&g| Item::Func(g)).collect();
            let whole = walk.writes(&b, Item::Func(f as FuncId));
            if ran.len() > 1 {
                walk.writes_from(&b, &ran);
            }
            func_write[f] = push_span(&mut pool, &walk.out, None, whole);
        }

        let ddl_write = if b.ddl_calls.is_empty() {
            Span::default()
        } else {
            let starts: Vec<Item> = b.ddl_calls.iter().map(|&f| Item::Func(f)).collect();
            let whole = walk.writes_from(&b, &starts);
            push_span(&mut pool, &walk.out, None, whole)
        };
        let mut rel_index: FastMap<_, Vec<RelId>> = FastMap::default();
        for (r, name) in b.rels.iter().enumerate() {
            if !rel_write[r].is_trivial()
                || !rel_read[r].is_trivial()
                || !rel_read_write[r].is_trivial()
            {
                rel_index
                    .entry(name.name.clone())
                    .or_default()
                    .push(r as RelId);
            }
        }
        let mut func_index: FastMap<_, Vec<FuncId>> = FastMap::default();
        for (f, name) in b.funcs.iter().enumerate() {
            if !func_write[f].is_trivial() || !func_read[f].is_trivial() {
                func_index
                    .entry(name.name.clone())
                    .or_default()
                    .push(f as FuncId);
            }
        }
        pool.shrink_to_fit();
        let unlogged = Unlogged::build(&b, &pool, &rel_read, &func_read);
        let reads_write = rel_read_write.iter().any(|s| !s.is_trivial());
        let everywhere = b
            .everywhere
            .iter()
            .map(|&f| b.funcs[f as usize].clone())
            .collect();
        DepGraph {
            elsewhere: b.elsewhere,
            everywhere,
            rels: b.rels,
            funcs: b.funcs,
            pool,
            rel_write,
            rel_read,
            rel_read_write,
            reads_write,
            func_write,
            func_read,
            ddl_write,
            rel_index,
            func_index,
            unlogged,
            report: b.report,
        }
    }
}
