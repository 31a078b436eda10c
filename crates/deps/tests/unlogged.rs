//! Reads a standby cannot serve: those that reach an unlogged table, by name, through a
//! partitioned or inheritance parent, through views, or in what a called function reads.

mod common;

use common::{func, plpgsql_def, rel, Schema};
use pgfresh_deps::DepGraph;
use pgfresh_sql::{FuncName, RelName};

fn schema() -> Schema {
    let mut s = Schema::default();
    let cache = s.unlogged_table("app.cache");
    s.table("app.orders");
    s.table("other.cache");
    // An unlogged partition two levels down, beside logged ones.
    let events = s.rel("app.events", 'p');
    let e24 = s.table("app.events_2024");
    let e25 = s.rel("app.events_2025", 'p');
    let e25q1 = s.unlogged_table("app.events_2025_q1");
    s.inherit(e24, events);
    s.inherit(e25, events);
    s.inherit(e25q1, e25);
    // Views over views.
    let v_cache = s.view("app.v_cache", 'v', &[cache]);
    s.view("app.v_top", 'v', &[v_cache]);
    // A function reading the unlogged table, and one reading a logged one.
    let def = plpgsql_def(
        "app.cached",
        "int",
        " STABLE\n",
        "  RETURN (SELECT count(*) FROM cache);",
    );
    s.func("app.cached", "plpgsql", 's', Some(def));
    let def = plpgsql_def(
        "app.counted",
        "int",
        " STABLE\n",
        "  RETURN (SELECT count(*) FROM app.orders);",
    );
    s.func("app.counted", "plpgsql", 's', Some(def));
    // A body pgfresh cannot read may read the unlogged table too.
    s.func("app.opaque", "plpython3u", 's', Some("opaque".into()));
    s
}

fn reads(g: &DepGraph, names: &[&str], called: &[&str]) -> bool {
    let names: Vec<RelName> = names.iter().map(|n| rel(n)).collect();
    let called: Vec<FuncName> = called.iter().map(|n| func(n)).collect();
    g.reads_unlogged(&names, &called)
}

#[test]
fn reads_that_reach_an_unlogged_table_and_reads_that_do_not() {
    let g = DepGraph::build(&schema().rows, &[]);
    for (names, called, reaches) in [
        (&["app.cache"][..], &[][..], true),
        // Unqualified: any schema's relation of that name may be meant.
        (&["cache"], &[], true),
        (&["app.events_2025_q1"], &[], true),
        (&["app.events_2025"], &[], true),
        (&["events"], &[], true),
        (&["app.v_cache"], &[], true),
        (&["v_top"], &[], true),
        (&["app.orders", "app.v_top"], &[], true),
        (&[], &["app.cached"], true),
        (&[], &["cached"], true),
        (&[], &["app.opaque"], true),
        (&["app.orders"], &[], false),
        // Another schema's table of the same name, named with its schema.
        (&["other.cache"], &[], false),
        (&["app.events_2024"], &[], false),
        (&["not_in_the_catalog"], &[], false),
        (&[], &["app.counted"], false),
        (&[], &["lower"], false),
    ] {
        assert_eq!(reads(&g, names, called), reaches, "{names:?} {called:?}");
    }
}

#[test]
fn an_unlogged_table_alone_makes_the_graph_worth_asking() {
    let mut s = Schema::default();
    s.table("app.orders");
    assert!(DepGraph::build(&s.rows, &[]).is_empty());
    s.unlogged_table("app.cache");
    let g = DepGraph::build(&s.rows, &[]);
    assert!(!g.is_empty());
    assert!(reads(&g, &["cache"], &[]));
    assert!(!reads(&g, &["orders"], &[]));
}
