//! Routing cost with and without a dependency graph: `router::decide` for a one-table read
//! and a one-table write with `deps: None`, with an empty graph, and with the 1,000-table
//! synthetic graph of `crates/deps/benches` (500 triggers, 2,000 FKs, 200 views) whose
//! relations are unrelated to the statement's; then a read of a view in that graph (the
//! expansion path). For writes `decide` answers before it looks at the graph (the graph is
//! used when the write is marked), so the write-marking expansion the session runs for each
//! write (`expand_writes` on the unit's relations) is measured next to it.
//!
//! The recency map holds 10 live entries of other relations (TTL 60 s, no cold start), so
//! the lookups below find the statement's relations cold, as for a typical read.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use pgfresh_config::RoutingSection;
use pgfresh_deps::DepGraph;
use pgfresh_proxy::router::{decide, Reason, RouteCtx, SessionView, Target};
use pgfresh_recency::{RecencyConfig, RecencyMap, RelKey, SystemClock};
use pgfresh_sql::{analyze_uncached, Analysis, FuncName, FunctionPolicy};

#[path = "../../deps/benches/support/schema.rs"]
mod schema;

const READ: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = $1";
const WRITE: &str = "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2";
/// `app.v14` is a view over a view (every 5th is) and 2–3 tables of the synthetic schema.
const VIEW_READ: &str = "SELECT * FROM v14 WHERE id = $1";

fn analysis(sql: &str) -> Analysis {
    analyze_uncached(sql)
}

fn recency() -> RecencyMap {
    let map = RecencyMap::new(
        RecencyConfig {
            ttl_ms: 60_000,
            max_ttl_ms: 60_000,
            cold_start_ms: 0,
            ..RecencyConfig::default()
        },
        Arc::new(SystemClock::new()),
    );
    let names: Vec<String> = (0..10).map(|i| format!("other_{i}")).collect();
    let keys: Vec<RelKey<'_>> = names
        .iter()
        .map(|n| RelKey {
            schema: None,
            name: n,
        })
        .collect();
    map.mark("app", &keys, Some(pgfresh_recency::Lsn(0x1000)));
    map
}

fn bench(c: &mut Criterion) {
    let routing = RoutingSection::default();
    let policy = FunctionPolicy::default();
    let recency = recency();
    let empty = DepGraph::empty();
    let big = DepGraph::build(&schema::schema(), &[]);
    assert!(!big.is_empty());
    let read = analysis(READ);
    let write = analysis(WRITE);
    let view_read = analysis(VIEW_READ);
    let session = SessionView::default();

    let ctx = |deps: Option<&'static DepGraph>| RouteCtx {
        routing: &routing,
        policy: &policy,
        oracle: None,
        recency: &recency,
        database: "app",
        deps,
    };
    // The graphs live for the whole bench; leaking them keeps the closure simple.
    let empty: &'static DepGraph = Box::leak(Box::new(empty));
    let big: &'static DepGraph = Box::leak(Box::new(big));
    let variants: [(&str, Option<&'static DepGraph>); 3] = [
        ("deps None", None),
        ("deps empty graph", Some(empty)),
        ("deps 1000-table graph, unrelated", Some(big)),
    ];

    // Sanity: the decisions are the ones the rows claim to measure.
    let no_calls: [FuncName; 0] = [];
    for (_, deps) in &variants {
        let d = decide(&[&read], &session, &ctx(*deps));
        assert_eq!(
            (d.target, d.reason),
            (Target::Replica { required: None }, Reason::Replica)
        );
        let d = decide(&[&write], &session, &ctx(*deps));
        assert_eq!((d.target, d.reason), (Target::Primary, Reason::Write));
    }
    let mut behind = Vec::new();
    big.expand_reads_borrowed(&view_read.reads, &no_calls, &mut behind);
    eprintln!(
        "view read {VIEW_READ:?} expands to {} relations behind the view",
        behind.len()
    );
    assert!(!behind.is_empty());
    let mut out = Vec::new();
    big.expand_writes(&write.writes, &no_calls, &mut out);
    assert!(
        out.is_empty(),
        "the write's relation is unrelated to the graph"
    );

    let mut group = c.benchmark_group("decide");
    for (name, deps) in &variants {
        let cx = ctx(*deps);
        group.bench_function(format!("read one table, {name}"), |b| {
            b.iter(|| decide(black_box(&[&read]), &session, &cx))
        });
    }
    for (name, deps) in &variants {
        let cx = ctx(*deps);
        group.bench_function(format!("write one table, {name}"), |b| {
            b.iter(|| decide(black_box(&[&write]), &session, &cx))
        });
    }
    let cx = ctx(Some(big));
    group.bench_function("read a view, deps 1000-table graph", |b| {
        b.iter(|| decide(black_box(&[&view_read]), &session, &cx))
    });
    group.finish();

    // What the session adds for a write before marking it (client_side.rs `unit_writes`):
    // nothing without a graph or with an empty one, one expansion otherwise.
    let mut group = c.benchmark_group("write marking expansion");
    for (name, deps) in &variants {
        group.bench_function(format!("one table, {name}"), |b| {
            b.iter(|| {
                out.clear();
                match deps.filter(|g| !g.is_empty()) {
                    None => false,
                    Some(g) => g
                        .expand_writes(black_box(&write.writes), &no_calls, &mut out)
                        .is_whole_database(),
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
