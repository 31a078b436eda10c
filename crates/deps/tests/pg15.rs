//! Rows exactly as the catalog queries return them from a real PostgreSQL 15 (captured with
//! `psql ... SELECT json_agg(q) FROM (<query>) q` into `fixtures/pg15_catalog.json`): a
//! trigger (and its clone on a partition), a cascading and a plain foreign key, views over
//! views, a materialized view, a partitioned table, dynamic SQL, SQL bodies (string and
//! BEGIN ATOMIC); pgcrypto's C functions, an aggregate and a disabled trigger are left out by
//! the queries.

use pgfresh_deps::{CatalogRows, DepGraph, Expansion};
use pgfresh_sql::{FuncName, RelName};

fn graph() -> DepGraph {
    let rows: CatalogRows =
        serde_json::from_str(include_str!("fixtures/pg15_catalog.json")).expect("fixture");
    assert_eq!(
        rows.functions.len(),
        5,
        "no extension C functions, no aggregates"
    );
    DepGraph::build(&rows, &[])
}

fn names(v: Vec<RelName>) -> Vec<String> {
    let mut n: Vec<String> = v.iter().map(ToString::to_string).collect();
    n.sort();
    n
}

fn w(g: &DepGraph, rel: &[&str], calls: &[&str]) -> (Vec<String>, Expansion) {
    let rel: Vec<RelName> = rel.iter().map(|r| RelName::parse(r).unwrap()).collect();
    let calls: Vec<FuncName> = calls.iter().map(|f| FuncName::parse(f).unwrap()).collect();
    let mut out = Vec::new();
    let e = g.expand_writes(&rel, &calls, &mut out);
    (names(out), e)
}

fn r(g: &DepGraph, rel: &[&str], calls: &[&str]) -> (Vec<String>, Expansion) {
    let rel: Vec<RelName> = rel.iter().map(|r| RelName::parse(r).unwrap()).collect();
    let calls: Vec<FuncName> = calls.iter().map(|f| FuncName::parse(f).unwrap()).collect();
    let mut out = Vec::new();
    let e = g.expand_reads(&rel, &calls, &mut out);
    (names(out), e)
}

#[test]
fn real_catalog_rows() {
    let g = graph();
    let p = Expansion::Precise;
    // orders fires audit() (unqualified audit_log resolves to app.audit_log) and cascades to
    // order_items; its disabled trigger and the plain FK to loose add nothing.
    assert_eq!(
        w(&g, &["orders"], &[]),
        (vec!["app.audit_log".into(), "app.order_items".into()], p)
    );
    // a partition: its parent, and the (cloned) row trigger's writes
    assert_eq!(
        w(&g, &["app.events_2024"], &[]),
        (
            vec![
                "app.audit_log".into(),
                "app.events".into(),
                "app.order_items".into(),
                "app.orders".into()
            ],
            p
        )
    );
    assert_eq!(w(&g, &[], &["app.dyn"]), (vec![], Expansion::WholeDatabase));
    assert_eq!(
        w(&g, &[], &["place"]),
        (
            vec![
                "app.audit_log".into(),
                "app.order_items".into(),
                "app.orders".into()
            ],
            p
        )
    );
    let v_orders = vec![
        "app.order_items".to_string(),
        "app.orders".into(),
        "app.v_orders".into(),
    ];
    assert_eq!(r(&g, &["v_top"], &[]), (v_orders.clone(), p));
    assert_eq!(r(&g, &[], &["app.total"]), (v_orders, p));
    assert_eq!(r(&g, &["app.mv"], &["gen_random_uuid"]), (vec![], p));
    let unanalysable: Vec<&str> = g
        .report()
        .unanalysable
        .iter()
        .map(|u| u.function.as_str())
        .collect();
    assert_eq!(unanalysable, ["app.dyn()"]);
}
