//! Table-driven checks of every edge kind, chains, cycles, overloads and name matching.

mod common;

use common::{func, plpgsql_def, rel, rels, Schema};
use pgfresh_deps::{DepGraph, EdgeKind, Expansion, ManualRule};
use pgfresh_sql::{FuncName, RelName};

/// A schema exercising every kind of dependency.
fn schema() -> Schema {
    let mut s = Schema::default();
    let orders = s.table("app.orders");
    let items = s.table("app.order_items");
    s.table("app.audit_log");
    s.table("app.order_totals");
    s.table("public.orders");
    let ledger = s.table("app.ledger");
    let loose = s.table("app.loose_refs");
    s.fk(items, orders, 'c', 'a'); // ON DELETE CASCADE
    s.fk(loose, orders, 'a', 'r'); // NO ACTION / RESTRICT: no cascade
    let audit = s.trigger_fn(
        "app.audit",
        "  INSERT INTO audit_log(op) VALUES (TG_OP);\n  RETURN NEW;",
    );
    s.trigger(orders, audit, "orders_audit");
    let recalc = s.trigger_fn(
        "app.recalc",
        "  UPDATE app.order_totals SET n = n + 1;\n  PERFORM app.post(1);\n  RETURN NEW;",
    );
    s.trigger(items, recalc, "items_recalc");
    let post = plpgsql_def(
        "app.post",
        "void",
        "",
        "  INSERT INTO app.ledger VALUES (1);",
    );
    s.func("app.post", "plpgsql", 'v', Some(post));

    // views over views, and a materialized view
    let v_orders = s.view("app.v_orders", 'v', &[orders, items]);
    s.view("app.v_top", 'v', &[v_orders]);
    s.view("app.mv_orders", 'm', &[orders]);

    // partitions two levels deep, and plain inheritance
    let events = s.rel("app.events", 'p');
    let e24 = s.table("app.events_2024");
    let e25 = s.rel("app.events_2025", 'p');
    let e25q1 = s.table("app.events_2025_q1");
    s.inherit(e24, events);
    s.inherit(e25, events);
    s.inherit(e25q1, e25);
    let base = s.table("app.base_t");
    let child = s.table("app.child_t");
    s.inherit(child, base);

    // a trigger cycle and a self-referencing foreign key
    let a = s.table("app.cyc_a");
    let b = s.table("app.cyc_b");
    let fa = s.trigger_fn(
        "app.touch_b",
        "  UPDATE app.cyc_b SET n = n + 1;\n  RETURN NEW;",
    );
    let fb = s.trigger_fn(
        "app.touch_a",
        "  UPDATE app.cyc_a SET n = n + 1;\n  RETURN NEW;",
    );
    s.trigger(a, fa, "a_touch");
    s.trigger(b, fb, "b_touch");
    let tree = s.table("app.tree");
    s.fk(tree, tree, 'c', 'c');

    // dynamic SQL behind a trigger
    let dyn_t = s.table("app.dyn_target");
    let dynf = s.trigger_fn(
        "app.dyn",
        "  EXECUTE format('DELETE FROM %I', TG_ARGV[0]);\n  RETURN NEW;",
    );
    s.trigger(dyn_t, dynf, "dyn_trg");

    // overloads: one PL/pgSQL, one SQL
    let p1 = plpgsql_def(
        "app.place_order",
        "void",
        "",
        "  INSERT INTO app.orders DEFAULT VALUES;",
    );
    s.func("app.place_order", "plpgsql", 'v', Some(p1));
    let p2 = "CREATE OR REPLACE FUNCTION app.place_order(a integer, b integer)\n RETURNS void\n LANGUAGE sql\nAS $function$ UPDATE app.ledger SET n = n + a $function$\n";
    s.func("app.place_order", "sql", 'v', Some(p2.to_owned()));

    // functions read through views; a STABLE one with dynamic SQL; another language
    let stats = "CREATE OR REPLACE FUNCTION app.stats()\n RETURNS bigint\n LANGUAGE sql\n STABLE\nAS $function$ SELECT count(*) FROM app.v_orders $function$\n";
    s.func("app.stats", "sql", 's', Some(stats.to_owned()));
    let sdyn = plpgsql_def(
        "app.stable_dyn",
        "bigint",
        " STABLE\n",
        "  EXECUTE 'SELECT 1';\n  RETURN 1;",
    );
    s.func("app.stable_dyn", "plpgsql", 's', Some(sdyn));
    s.func("app.py", "plpython3u", 'v', None);
    let _ = ledger;
    s
}

fn graph() -> DepGraph {
    DepGraph::build(&schema().rows, &[])
}

fn writes(g: &DepGraph, w: &[&str], c: &[&str]) -> (Vec<RelName>, Expansion) {
    let w: Vec<RelName> = w.iter().map(|n| rel(n)).collect();
    let c: Vec<FuncName> = c.iter().map(|n| func(n)).collect();
    let mut out = Vec::new();
    let e = g.expand_writes(&w, &c, &mut out);
    let mut borrowed = Vec::new();
    assert_eq!(g.expand_writes_borrowed(&w, &c, &mut borrowed), e);
    assert!(out.iter().eq(borrowed.iter().copied()));
    out.sort();
    (out, e)
}

fn reads(g: &DepGraph, r: &[&str], c: &[&str]) -> (Vec<RelName>, Expansion) {
    let r: Vec<RelName> = r.iter().map(|n| rel(n)).collect();
    let c: Vec<FuncName> = c.iter().map(|n| func(n)).collect();
    let mut out = Vec::new();
    let e = g.expand_reads(&r, &c, &mut out);
    let mut borrowed = Vec::new();
    assert_eq!(g.expand_reads_borrowed(&r, &c, &mut borrowed), e);
    assert!(out.iter().eq(borrowed.iter().copied()));
    out.sort();
    (out, e)
}

/// Inputs (relations, called functions), expected relations, expected verdict.
type Case = (
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
    Expansion,
);

const P: Expansion = Expansion::Precise;
const W: Expansion = Expansion::WholeDatabase;

const ORDERS_CLOSURE: &[&str] = &[
    "app.audit_log",
    "app.ledger",
    "app.order_items",
    "app.order_totals",
];

#[test]
fn write_expansions() {
    let g = graph();
    let cases: &[Case] = &[
        // FK cascade → referencing table → its trigger → function → called function
        (&["orders"], &[], ORDERS_CLOSURE, P),
        (&["app.orders"], &[], ORDERS_CLOSURE, P),
        (&["APP.ORDERS"], &[], ORDERS_CLOSURE, P),
        (&["public.orders"], &[], &[], P),
        (&["other.orders"], &[], &[], P),
        (&["\"Orders\""], &[], &[], P),
        (
            &["app.order_items"],
            &[],
            &["app.ledger", "app.order_totals"],
            P,
        ),
        (&["app.loose_refs"], &[], &[], P),
        // partitions: down to every descendant, up to every ancestor, never siblings
        (
            &["app.events"],
            &[],
            &["app.events_2024", "app.events_2025", "app.events_2025_q1"],
            P,
        ),
        (
            &["events_2025_q1"],
            &[],
            &["app.events", "app.events_2025"],
            P,
        ),
        (&["events_2024"], &[], &["app.events"], P),
        (&["app.base_t"], &[], &["app.child_t"], P),
        (&["app.child_t"], &[], &["app.base_t"], P),
        // cycles end
        (&["app.cyc_a"], &[], &["app.cyc_b"], P),
        (&["app.cyc_b"], &[], &["app.cyc_a"], P),
        (&["app.tree"], &[], &[], P),
        // a write through a view writes its base relations (and their cascades)
        (
            &["app.v_orders"],
            &[],
            &[
                "app.audit_log",
                "app.ledger",
                "app.order_items",
                "app.order_totals",
                "app.orders",
            ],
            P,
        ),
        (&["app.mv_orders"], &[], &[], P),
        // dynamic SQL behind a trigger
        (&["dyn_target"], &[], &[], W),
        // called functions, all overloads
        (
            &[],
            &["place_order"],
            &[
                "app.audit_log",
                "app.ledger",
                "app.order_items",
                "app.order_totals",
                "app.orders",
            ],
            P,
        ),
        (&[], &["other.place_order"], &[], P),
        (&[], &["app.post"], &["app.ledger"], P),
        (&[], &["app.stats"], &[], P),
        // STABLE bodies run read-only: their dynamic SQL cannot write
        (&[], &["stable_dyn"], &[], P),
        (&[], &["app.py"], &[], W),
        (&[], &["now", "count"], &[], P),
        // several inputs: union, deduplicated
        (
            &["app.order_items", "app.cyc_a", "app.orders"],
            &["app.post"],
            &[
                "app.audit_log",
                "app.cyc_b",
                "app.ledger",
                "app.order_items",
                "app.order_totals",
            ],
            P,
        ),
    ];
    for (w, c, want, e) in cases {
        assert_eq!(
            writes(&g, w, c),
            (rels(want), *e),
            "writes {w:?} calls {c:?}"
        );
    }
}

#[test]
fn read_expansions() {
    let g = graph();
    let cases: &[Case] = &[
        (
            &["app.v_orders"],
            &[],
            &["app.order_items", "app.orders"],
            P,
        ),
        (
            &["v_top"],
            &[],
            &["app.order_items", "app.orders", "app.v_orders"],
            P,
        ),
        (&["other.v_top"], &[], &[], P),
        (&["app.mv_orders"], &[], &[], P),
        (&["orders", "app.events"], &[], &[], P),
        (
            &[],
            &["stats"],
            &["app.order_items", "app.orders", "app.v_orders"],
            P,
        ),
        (&[], &["stable_dyn"], &[], W),
        (&[], &["app.py"], &[], W),
        (&[], &["place_order"], &[], P),
    ];
    for (r, c, want, e) in cases {
        assert_eq!(reads(&g, r, c), (rels(want), *e), "reads {r:?} calls {c:?}");
    }
}

#[test]
fn manual_rules_join_the_closures() {
    let rules: Vec<ManualRule> = [
        "app.order_totals -> app.cyc_a",
        "shipments -> shipment_log",
        "app.dyn() -> app.ledger",
        "ledger_sync() -> \"App\".\"Ledger\"",
    ]
    .iter()
    .map(|r| ManualRule::parse(r).unwrap())
    .collect();
    let g = DepGraph::build(&schema().rows, &rules);
    // order_totals now writes cyc_a, which cycles with cyc_b
    let mut want = ORDERS_CLOSURE.to_vec();
    want.extend(["app.cyc_a", "app.cyc_b"]);
    assert_eq!(writes(&g, &["app.orders"], &[]), (rels(&want), P));
    // relations the catalog does not have are kept as written
    assert_eq!(
        writes(&g, &["app.shipments"], &[]),
        (rels(&["shipment_log"]), P)
    );
    // a rule describes an unanalysable function: no longer the whole database
    assert_eq!(writes(&g, &["dyn_target"], &[]), (rels(&["app.ledger"]), P));
    let u = &g.report().unanalysable;
    assert!(u
        .iter()
        .any(|u| u.function == "app.dyn()" && u.overridden_by_rule));
    // a function rule writes and reads its targets
    let ledger = rels(&["\"App\".\"Ledger\""]);
    assert_eq!(writes(&g, &[], &["ledger_sync"]), (ledger.clone(), P));
    assert_eq!(reads(&g, &[], &["public.ledger_sync"]), (ledger, P));
}

/// A write to a relation with rewrite rules writes what their actions write and runs what
/// they call; a rule that cannot be read makes the write reach anything.
#[test]
fn rewrite_rules_join_the_closures() {
    let mut s = Schema::default();
    let src = s.table("app.src");
    s.table("app.log");
    s.table("app.counts");
    let weird = s.table("app.weird");
    let bump = plpgsql_def("app.bump", "void", "", "  UPDATE app.counts SET n = n + 1;");
    s.func("app.bump", "plpgsql", 'v', Some(bump));
    s.rule(
        src,
        "src_log",
        "CREATE RULE src_log AS ON INSERT TO app.src DO ALSO (INSERT INTO app.log (id) \
         VALUES (new.id); SELECT app.bump());",
    );
    s.rule(weird, "weird_rule", "not a rule at all");
    let g = DepGraph::build(&s.rows, &[]);
    assert_eq!(
        writes(&g, &["app.src"], &[]),
        (rels(&["app.counts", "app.log"]), P)
    );
    assert_eq!(writes(&g, &["app.log"], &[]), (vec![], P));
    assert_eq!(writes(&g, &["app.weird"], &[]).1, W);
    let r = g.report();
    let rule_edges: Vec<(&str, &str, &str)> = r
        .edges
        .iter()
        .filter(|e| e.kind == EdgeKind::Rule && e.via.as_deref() == Some("src_log"))
        .map(|e| (e.from.as_str(), e.to.as_str(), e.action.as_str()))
        .collect();
    assert_eq!(
        rule_edges,
        [
            ("app.src", "app.bump()", "calls"),
            ("app.src", "app.log", "writes"),
        ]
    );
    assert!(r
        .unanalysable
        .iter()
        .any(|u| u.function == "rule weird_rule on app.weird" && u.language == "rule"));
}

/// A read of a view runs the functions its query calls, and a read of a table with row
/// security reads what its policies' expressions read and call.
#[test]
fn view_calls_and_policies_join_the_read_closures() {
    let mut s = Schema::default();
    let accounts = s.table("app.accounts");
    s.table("app.ledger");
    let docs = s.table("app.docs");
    let members = s.table("app.memberships");
    s.table("app.grants");
    let sql_def = |name: &str, body: &str| {
        format!(
            "CREATE OR REPLACE FUNCTION {name}(a integer)\n RETURNS bigint\n LANGUAGE sql\n STABLE\nAS $function$ {body} $function$\n"
        )
    };
    let bal = s.func(
        "app.bal",
        "sql",
        's',
        Some(sql_def(
            "app.bal",
            "SELECT sum(amount) FROM app.ledger WHERE account = a",
        )),
    );
    let allowed = s.func(
        "app.allowed",
        "sql",
        's',
        Some(sql_def(
            "app.allowed",
            "SELECT count(*) FROM app.grants WHERE g = a",
        )),
    );
    let opaque = s.func("app.opaque", "plpython3u", 's', None);
    let balances = s.view("app.balances", 'v', &[accounts]);
    s.view_call(balances, bal);
    s.view("app.balance_report", 'v', &[balances]);
    let mv = s.view("app.mv_balances", 'm', &[accounts]);
    s.view_call(mv, bal);
    s.policy(docs, "docs_members", members, 'r');
    s.policy(docs, "docs_members", allowed, 'f');
    s.policy(docs, "docs_members", docs, 'r');
    let secret = s.table("app.secret");
    s.policy(secret, "secret_opaque", opaque, 'f');
    let g = DepGraph::build(&s.rows, &[]);
    assert_eq!(
        reads(&g, &["app.balances"], &[]),
        (rels(&["app.accounts", "app.ledger"]), P)
    );
    assert_eq!(
        reads(&g, &["balance_report"], &[]),
        (rels(&["app.accounts", "app.balances", "app.ledger"]), P)
    );
    // A materialized view's calls run only at refresh, a write of it: there they write
    // what the functions write (the stable `bal` nothing).
    assert_eq!(reads(&g, &["app.mv_balances"], &[]), (vec![], P));
    assert_eq!(writes(&g, &["app.mv_balances"], &[]), (vec![], P));
    assert_eq!(
        reads(&g, &["docs"], &[]),
        (rels(&["app.grants", "app.memberships"]), P)
    );
    assert_eq!(reads(&g, &["app.secret"], &[]).1, W);
    // Writes are unchanged: a policy filters reads.
    assert_eq!(writes(&g, &["app.docs"], &[]), (vec![], P));
    let r = g.report();
    let kinds = |kind: EdgeKind| -> Vec<(&str, &str, &str)> {
        r.edges
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| (e.from.as_str(), e.to.as_str(), e.action.as_str()))
            .collect()
    };
    assert_eq!(
        kinds(EdgeKind::Policy),
        [
            ("app.docs", "app.allowed()", "calls"),
            ("app.docs", "app.memberships", "reads"),
            ("app.secret", "app.opaque()", "calls"),
        ]
    );
    assert!(kinds(EdgeKind::View).contains(&("app.balances", "app.bal()", "calls")));
}

/// A column default (or check constraint, or index expression) that calls a function: a write
/// to the table runs it, as a trigger's function would.
#[test]
fn functions_in_defaults_run_with_writes() {
    let mut s = Schema::default();
    let invoices = s.table("app.invoices");
    s.table("app.invoice_counter");
    let next = plpgsql_def(
        "app.next_invoice_no",
        "bigint",
        "",
        "  UPDATE app.invoice_counter SET n = n + 1;\n  RETURN 1;",
    );
    let f = s.func("app.next_invoice_no", "plpgsql", 'v', Some(next));
    s.write_call(invoices, f, "default");
    let g = DepGraph::build(&s.rows, &[]);
    assert_eq!(
        writes(&g, &["invoices"], &[]),
        (rels(&["app.invoice_counter"]), P)
    );
    assert!(g
        .report()
        .edges
        .iter()
        .any(|e| e.kind == EdgeKind::Expression
            && e.from == "app.invoices"
            && e.to == "app.next_invoice_no()"
            && e.via.as_deref() == Some("default")));
}

/// An aggregate runs its support functions, an operator and a cast their functions: a call
/// of the aggregate, and the names the analysis gives an operator applied and a type cast
/// to, write what those functions write. Operators and casts whose functions write nothing
/// (or are built-ins, in no row) add nothing.
#[test]
fn aggregates_operators_and_casts_run_their_functions() {
    let mut s = Schema::default();
    s.table("app.audit");
    let bump = plpgsql_def(
        "app.bump",
        "int",
        "",
        "  UPDATE app.audit SET n = n + 1;\n  RETURN 1;",
    );
    let step = s.func("app.step", "plpgsql", 'v', Some(bump.clone()));
    let plus = s.func("app.plus", "plpgsql", 'v', Some(bump.clone()));
    let wrap = s.func("app.wrap", "plpgsql", 'v', Some(bump));
    let pure = s.func(
        "app.pure",
        "sql",
        'i',
        Some("CREATE FUNCTION app.pure(a int) RETURNS int LANGUAGE sql AS 'SELECT a'".into()),
    );
    let audit_sum = s.implicit_call('a', "app.audit_sum", step);
    // A view's query naming the aggregate (by its oid, as the catalog does).
    let summed = s.view("app.summed", 'v', &[]);
    s.view_call(summed, audit_sum);
    s.implicit_call('o', "app.<+>", plus);
    s.implicit_call('c', "app.wrapped", wrap);
    s.implicit_call('o', "public.=", pure);
    s.implicit_call('o', "public.<->", 12345);
    // A body applying the operator runs its function; so does a materialized view's
    // refresh, a write of it, run what its query calls.
    s.func(
        "app.uses_plus",
        "sql",
        'v',
        Some(
            "CREATE FUNCTION app.uses_plus(v int) RETURNS int LANGUAGE sql AS 'SELECT v <+> 1'"
                .into(),
        ),
    );
    let mv = s.view("app.mv", 'm', &[]);
    s.view_call(mv, step);
    let g = DepGraph::build(&s.rows, &[]);
    let audit = (rels(&["app.audit"]), P);
    assert_eq!(writes(&g, &[], &["audit_sum"]), audit);
    assert_eq!(writes(&g, &[], &["uses_plus"]), audit);
    assert!(g.reads_write(&[rel("summed")]));
    assert_eq!(writes(&g, &["app.mv"], &[]), audit);
    assert_eq!(reads(&g, &["app.mv"], &[]), (vec![], P));
    for implicit in [
        FuncName::operator(None, "<+>"),
        FuncName::operator(Some("app"), "<+>"),
        FuncName::cast_to(None, "wrapped"),
    ] {
        let mut out = Vec::new();
        assert_eq!(
            g.expand_writes(&[], std::slice::from_ref(&implicit), &mut out),
            P
        );
        assert_eq!((out, P), audit, "{implicit}");
        assert!(g.calls_writer(&[implicit]));
    }
    for harmless in [
        FuncName::operator(None, "="),
        FuncName::operator(None, "<->"),
        FuncName::operator(Some("public"), "<+>"),
        FuncName::cast_to(None, "int4"),
    ] {
        assert!(
            !g.calls_writer(std::slice::from_ref(&harmless)),
            "{harmless}"
        );
    }
}

/// A read of a view whose query calls a function that writes, or of a table whose policy
/// does, writes what the function writes; a read running only functions that read writes
/// nothing, and one running a volatile body pgfresh cannot read is left to the standby.
#[test]
fn reads_that_run_writing_functions_write() {
    let mut s = Schema::default();
    s.table("app.audit");
    let bump = plpgsql_def(
        "app.bump",
        "int",
        "",
        "  UPDATE app.audit SET n = n + 1;\n  RETURN 1;",
    );
    let bump = s.func("app.bump", "plpgsql", 'v', Some(bump));
    let peek = plpgsql_def(
        "app.peek",
        "int",
        "",
        "  RETURN (SELECT count(*) FROM app.audit);",
    );
    let peek = s.func("app.peek", "plpgsql", 'v', Some(peek));
    let opaque = s.func("app.opaque", "plpython3u", 'v', None);
    let audited = s.view("app.audited", 'v', &[]);
    s.view_call(audited, bump);
    s.view("app.over_audited", 'v', &[audited]);
    let peeking = s.view("app.peeking", 'v', &[]);
    s.view_call(peeking, peek);
    let docs = s.table("app.docs");
    s.policy(docs, "docs_audit", bump, 'f');
    let py = s.view("app.py", 'v', &[]);
    s.view_call(py, opaque);
    // A function reading the view runs what the view's query calls.
    let reader = plpgsql_def(
        "app.reader",
        "int",
        "",
        "  RETURN (SELECT count(*) FROM app.audited);",
    );
    s.func("app.reader", "plpgsql", 'v', Some(reader));
    let g = DepGraph::build(&s.rows, &[]);
    assert_eq!(writes(&g, &[], &["reader"]), (rels(&["app.audit"]), P));
    assert!(g.calls_writer(&[func("reader")]));
    assert!(!g.calls_writer(&[func("peek")]));
    for read in ["audited", "app.over_audited", "docs"] {
        assert!(g.reads_write(&[rel(read)]), "{read}");
        let mut out = Vec::new();
        g.expand_read_writes(&[rel(read)], &mut out);
        assert_eq!(out, rels(&["app.audit"]), "{read}");
    }
    for read in ["peeking", "py", "audit", "unknown"] {
        assert!(!g.reads_write(&[rel(read)]), "{read}");
    }
    let empty = DepGraph::build(&Schema::default().rows, &[]);
    assert!(!empty.reads_write(&[rel("audited")]));
}

/// A write to a foreign table (directly, as a partition of a table written, or through a
/// view) may write anything: its server may be this very database.
#[test]
fn writes_to_foreign_tables_may_write_anything() {
    let mut s = Schema::default();
    let remote = s.rel("app.remote_counts", 'f');
    let events = s.rel("app.events", 'p');
    let local = s.table("app.events_local");
    s.inherit(local, events);
    s.inherit(remote, events);
    s.view("app.remote_view", 'v', &[remote]);
    s.table("app.plain");
    let g = DepGraph::build(&s.rows, &[]);
    assert_eq!(writes(&g, &["remote_counts"], &[]).1, W);
    assert_eq!(writes(&g, &["events"], &[]).1, W);
    assert_eq!(writes(&g, &["remote_view"], &[]).1, W);
    assert_eq!(
        writes(&g, &["events_local"], &[]),
        (rels(&["app.events"]), P)
    );
    assert_eq!(writes(&g, &["plain"], &[]), (vec![], P));
}

/// DDL fires event triggers: their functions' writes are the DDL's too.
#[test]
fn event_triggers_write_with_ddl() {
    let mut s = Schema::default();
    s.table("app.ddl_log");
    let g = DepGraph::build(&s.rows, &[]);
    assert_eq!(g.expand_ddl(&mut Vec::new()), P);
    let log = plpgsql_def(
        "app.log_ddl",
        "event_trigger",
        "",
        "  INSERT INTO app.ddl_log VALUES (tg_tag);",
    );
    let f = s.func("app.log_ddl", "plpgsql", 'v', Some(log));
    s.event_trigger("audit_ddl", "ddl_command_end", f);
    let opaque = s.func("app.opaque_ddl", "plpython3u", 'v', None);
    let g = DepGraph::build(&s.rows, &[]);
    assert!(!g.is_empty());
    let mut out = Vec::new();
    assert_eq!(g.expand_ddl(&mut out), P);
    assert_eq!(out, rels(&["app.ddl_log"]));
    assert!(g
        .report()
        .edges
        .iter()
        .any(|e| e.kind == EdgeKind::EventTrigger
            && e.from == "ddl"
            && e.to == "app.log_ddl()"
            && e.action == "fires on ddl_command_end"));
    s.event_trigger("opaque", "sql_drop", opaque);
    let g = DepGraph::build(&s.rows, &[]);
    assert_eq!(g.expand_ddl(&mut Vec::new()), W);
}

/// A function that writes large objects writes `pg_catalog.pg_largeobject`, the one system
/// catalog whose writes count.
#[test]
fn large_object_writes_in_bodies_count() {
    let mut s = Schema::default();
    s.table("app.docs");
    let body = plpgsql_def(
        "app.save_doc",
        "void",
        "",
        "  PERFORM lo_put(42, 0, 'x');\n  PERFORM count(*) FROM pg_class;",
    );
    s.func("app.save_doc", "plpgsql", 'v', Some(body));
    let g = DepGraph::build(&s.rows, &[]);
    assert_eq!(
        writes(&g, &[], &["app.save_doc"]),
        (vec![RelName::large_objects()], P)
    );
}

#[test]
fn empty_graphs_add_nothing() {
    let g = DepGraph::empty();
    assert!(g.is_empty());
    assert_eq!(writes(&g, &["orders"], &["f"]), (vec![], P));
    assert_eq!(reads(&g, &["orders"], &["f"]), (vec![], P));
    let mut s = Schema::default();
    s.table("app.orders");
    let sql = "CREATE OR REPLACE FUNCTION app.two()\n RETURNS integer\n LANGUAGE sql\n IMMUTABLE\nAS $function$ SELECT 2 $function$\n";
    s.func("app.two", "sql", 'i', Some(sql.to_owned()));
    let g = DepGraph::build(&s.rows, &[]);
    assert!(g.is_empty(), "relations and functions without effects");
}

#[test]
fn report_lists_every_edge_kind_and_unanalysable_body() {
    let g = graph();
    let r = g.report();
    for kind in [
        EdgeKind::Trigger,
        EdgeKind::ForeignKey,
        EdgeKind::View,
        EdgeKind::Partition,
        EdgeKind::Inheritance,
        EdgeKind::Function,
    ] {
        assert!(r.edges.iter().any(|e| e.kind == kind), "{kind:?}");
    }
    let fk = r
        .edges
        .iter()
        .find(|e| e.kind == EdgeKind::ForeignKey)
        .unwrap();
    assert_eq!(
        (fk.from.as_str(), fk.to.as_str(), fk.action.as_str()),
        ("app.orders", "app.order_items", "on delete cascade")
    );
    let trg = r
        .edges
        .iter()
        .find(|e| e.via.as_deref() == Some("orders_audit"))
        .unwrap();
    assert_eq!(
        (trg.from.as_str(), trg.to.as_str()),
        ("app.orders", "app.audit()")
    );
    assert!(!r.edges.iter().any(|e| e.to == "app.loose_refs"));
    let reasons: Vec<(&str, &str)> = r
        .unanalysable
        .iter()
        .map(|u| (u.function.as_str(), u.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("app.dyn()", "dynamic SQL (EXECUTE)"),
            ("app.py()", "language plpython3u"),
            ("app.stable_dyn()", "dynamic SQL (EXECUTE)"),
        ]
    );
    let json = serde_json::to_value(r).unwrap();
    assert!(json["edges"][0]["kind"].as_str().is_some());
    assert_eq!(json["relations"], 20);
}

/// Functions whose calls may write, whatever the catalog says of their volatility: a body
/// that calls `nextval`, or a volatile function that writes; not one that only reads, nor
/// one whose body cannot be read (a STABLE C function writes nothing pgfresh can know of).
#[test]
fn functions_that_write_behind_a_stable_label() {
    let mut s = Schema::default();
    s.table("app.orders");
    let def = plpgsql_def(
        "app.next_id",
        "bigint",
        " STABLE\n",
        "  RETURN nextval('app.ids');",
    );
    s.func("app.next_id", "plpgsql", 's', Some(def));
    let def = plpgsql_def(
        "app.log_it",
        "void",
        "",
        "  INSERT INTO app.orders VALUES (1);",
    );
    s.func("app.log_it", "plpgsql", 'v', Some(def));
    let def = plpgsql_def(
        "app.wrapped",
        "int",
        " STABLE\n",
        "  PERFORM app.log_it();\n  RETURN 1;",
    );
    s.func("app.wrapped", "plpgsql", 's', Some(def));
    let def = plpgsql_def(
        "app.reader",
        "bigint",
        " STABLE\n",
        "  RETURN (SELECT count(*) FROM app.orders);",
    );
    s.func("app.reader", "plpgsql", 's', Some(def));
    s.func("app.st_area", "c", 'i', Some("st_area".into()));
    let g = DepGraph::build(&s.rows, &[]);
    let calls = |names: &[&str]| {
        let f: Vec<FuncName> = names.iter().map(|n| func(n)).collect();
        g.calls_writer(&f)
    };
    assert!(calls(&["app.next_id"]));
    assert!(calls(&["next_id"]));
    assert!(calls(&["app.wrapped"]));
    assert!(calls(&["app.reader", "app.wrapped"]));
    assert!(!calls(&["app.reader"]));
    assert!(!calls(&["app.st_area"]));
    assert!(!calls(&["other.next_id"]));
    assert!(!calls(&["lower"]));
}
