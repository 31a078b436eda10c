//! Analysis cost: cached lookup, uncached analysis, and the raw `pg_query::parse` baseline,
//! measured side by side in one run.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use pgfresh_sql::{analyze_uncached, Analyzer, AnalyzerOptions};

const QUERIES: &[(&str, &str)] = &[
    (
        "oltp_select",
        "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
    ),
    (
        "join_5way",
        "SELECT o.id, c.name, p.title, s.name, w.city \
         FROM orders o \
         JOIN customers c ON c.id = o.customer_id \
         JOIN order_items i ON i.order_id = o.id \
         JOIN products p ON p.id = i.product_id \
         JOIN suppliers s ON s.id = p.supplier_id \
         LEFT JOIN warehouses w ON w.id = s.warehouse_id \
         WHERE o.created_at > now() - interval '1 day' AND c.region = $1 \
         ORDER BY o.id DESC LIMIT 50",
    ),
    (
        "writable_cte",
        "WITH moved AS (DELETE FROM queue WHERE id IN \
         (SELECT id FROM queue WHERE state = 'ready' ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) \
         RETURNING *) \
         INSERT INTO queue_archive SELECT m.*, now() FROM moved m",
    ),
];

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("analyze");
    for (name, sql) in QUERIES {
        group.bench_with_input(
            BenchmarkId::new("raw_pg_query_parse", name),
            sql,
            |b, sql| b.iter(|| pg_query::parse(black_box(sql)).map(|r| r.protobuf.stmts.len())),
        );
        group.bench_with_input(BenchmarkId::new("uncached", name), sql, |b, sql| {
            b.iter(|| analyze_uncached(black_box(sql)))
        });
        let analyzer = Analyzer::new(AnalyzerOptions::default());
        analyzer.analyze(sql);
        group.bench_with_input(BenchmarkId::new("cached", name), sql, |b, sql| {
            b.iter(|| analyzer.analyze(black_box(sql)))
        });
    }
    // A simple-protocol text with an inlined value: each call carries a new literal and
    // is answered through its literal shape.
    let analyzer = Analyzer::new(AnalyzerOptions::default());
    analyzer.analyze("SELECT abalance FROM pgbench_accounts WHERE aid = 1");
    let texts: Vec<String> = (0..1024)
        .map(|i| {
            format!(
                "SELECT abalance FROM pgbench_accounts WHERE aid = {}",
                4217 + i
            )
        })
        .collect();
    let mut next = 0;
    group.bench_function("cached_literal/oltp_select", |b| {
        b.iter(|| {
            next = (next + 1) % texts.len();
            analyzer.analyze(black_box(&texts[next]))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
