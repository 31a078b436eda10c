//! Dependency graph: build time and hot-path expansion on a synthetic schema of 1,000 tables,
//! 500 triggers (PL/pgSQL bodies writing 1–3 other tables, with chains and cycles), 2,000
//! foreign keys (a quarter of them cascading) and 200 views (some over views).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use pgfresh_deps::DepGraph;
use pgfresh_sql::{FuncName, RelName};

#[path = "support/schema.rs"]
mod schema;
use schema::{schema, Lcg, TABLES};

/// 256 statements touching 1–3 relations each (unqualified names, as applications write).
fn statements(prefix: &str, count: u32) -> Vec<Vec<RelName>> {
    let mut rng = Lcg(7);
    (0..256)
        .map(|_| {
            (0..=rng.next(3))
                .map(|_| RelName::new(None, &format!("{prefix}{}", rng.next(count))))
                .collect()
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rows = schema();
    let mut group = c.benchmark_group("deps");
    group.sample_size(10);
    group.bench_function(
        "build 1000 tables, 500 triggers, 2000 fks, 200 views",
        |b| b.iter(|| DepGraph::build(black_box(&rows), &[])),
    );
    group.finish();

    let graph = DepGraph::build(&rows, &[]);
    let (rels, funcs, entries) = graph.size();
    eprintln!(
        "graph: {rels} relations, {funcs} functions, {entries} closure entries, {} edges",
        graph.report().edges.len()
    );
    let writes = statements("t", TABLES);
    let reads = statements("v", 200);
    let mut out = Vec::new();
    let total: usize = writes
        .iter()
        .map(|w| {
            out.clear();
            graph.expand_writes(w, &[], &mut out);
            out.len()
        })
        .sum();
    eprintln!(
        "mean relations added per write statement: {}",
        total / writes.len()
    );

    let no_calls: [FuncName; 0] = [];
    let mut i = 0;
    c.bench_function("expand_writes per statement (1-3 tables)", |b| {
        b.iter(|| {
            i = (i + 1) % writes.len();
            out.clear();
            black_box(graph.expand_writes(&writes[i], &no_calls, &mut out))
        })
    });
    let mut borrowed = Vec::new();
    c.bench_function("expand_writes_borrowed per statement (1-3 tables)", |b| {
        b.iter(|| {
            i = (i + 1) % writes.len();
            borrowed.clear();
            black_box(graph.expand_writes_borrowed(&writes[i], &no_calls, &mut borrowed))
        })
    });
    c.bench_function("expand_reads per statement (1-3 views)", |b| {
        b.iter(|| {
            i = (i + 1) % reads.len();
            out.clear();
            black_box(graph.expand_reads(&reads[i], &no_calls, &mut out))
        })
    });
    let plain = statements("nothing_", 50);
    c.bench_function("expand_writes, names without dependencies", |b| {
        b.iter(|| {
            i = (i + 1) % plain.len();
            out.clear();
            black_box(graph.expand_writes(&plain[i], &no_calls, &mut out))
        })
    });
    let empty = DepGraph::empty();
    c.bench_function("expand_writes + expand_reads, empty graph", |b| {
        b.iter(|| {
            i = (i + 1) % writes.len();
            out.clear();
            black_box(empty.expand_writes(&writes[i], &no_calls, &mut out));
            black_box(empty.expand_reads(&writes[i], &no_calls, &mut out))
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
