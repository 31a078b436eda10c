//! Dependency graph: build time and hot-path expansion on a synthetic schema of 1,000 tables,
//! 500 triggers (PL/pgSQL bodies writing 1–3 other tables, with chains and cycles), 2,000
//! foreign keys (a quarter of them cascading) and 200 views (some over views).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use pgfresh_deps::{
    CatalogRows, DepGraph, ForeignKeyRow, FunctionRow, RelationRow, TriggerRow, ViewDepRow,
};
use pgfresh_sql::{FuncName, RelName};

const TABLES: u32 = 1000;
const VIEW_BASE: u32 = 10_000;
const FUNC_BASE: u32 = 20_000;

/// A small deterministic generator (no extra dependency).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % u64::from(n)) as u32
    }
}

fn schema() -> CatalogRows {
    let mut rng = Lcg(42);
    let mut rows = CatalogRows::default();
    for i in 0..TABLES {
        rows.relations.push(RelationRow {
            oid: i,
            schema: "app".into(),
            name: format!("t{i}"),
            relkind: 'r',
        });
    }
    // 500 triggers: on every other table; bodies write 1–3 tables a little further on
    // (chains), and every 25th writes back (cycles).
    for k in 0..500u32 {
        let table = k * 2;
        let mut body = String::new();
        for _ in 0..=rng.next(3) {
            let target = if k % 25 == 0 {
                table.saturating_sub(1 + rng.next(20))
            } else {
                (table + 1 + rng.next(30)) % TABLES
            };
            body.push_str(&format!(
                "  INSERT INTO app.t{target}(ref, at) VALUES (NEW.id, now());\n"
            ));
        }
        let name = format!("trg_fn{k}");
        let definition = format!(
            "CREATE OR REPLACE FUNCTION app.{name}()\n RETURNS trigger\n LANGUAGE plpgsql\nAS $function$\nBEGIN\n  IF TG_OP = 'DELETE' THEN\n    RETURN OLD;\n  END IF;\n{body}  RETURN NEW;\nEND\n$function$\n"
        );
        rows.functions.push(FunctionRow {
            oid: FUNC_BASE + k,
            schema: "app".into(),
            name,
            language: "plpgsql".into(),
            definition: Some(definition),
            volatility: 'v',
        });
        rows.triggers.push(TriggerRow {
            table_oid: table,
            function_oid: FUNC_BASE + k,
            name: format!("trg{k}"),
        });
    }
    // 2,000 foreign keys: children reference tables shortly before them; a quarter cascade.
    for k in 0..2000u32 {
        let referencing = 1 + rng.next(TABLES - 1);
        let referenced = referencing.saturating_sub(1 + rng.next(50));
        let action = ['c', 'a', 'a', 'r'][(k % 4) as usize];
        rows.foreign_keys.push(ForeignKeyRow {
            name: format!("fk{k}"),
            referencing_oid: referencing,
            referenced_oid: referenced,
            on_delete: action,
            on_update: 'a',
        });
    }
    // 200 views over 2–3 tables; every 5th also over an earlier view.
    for v in 0..200u32 {
        rows.relations.push(RelationRow {
            oid: VIEW_BASE + v,
            schema: "app".into(),
            name: format!("v{v}"),
            relkind: 'v',
        });
        for _ in 0..2 + rng.next(2) {
            rows.view_deps.push(ViewDepRow {
                view_oid: VIEW_BASE + v,
                base_oid: rng.next(TABLES),
            });
        }
        if v % 5 == 4 {
            rows.view_deps.push(ViewDepRow {
                view_oid: VIEW_BASE + v,
                base_oid: VIEW_BASE + rng.next(v),
            });
        }
    }
    rows
}

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
