//! Relation extraction: folding, quoting, subqueries, CTEs, joins, set operations, lateral,
//! and the functions a statement calls.

#[macro_use]
mod common;

use pgfresh_sql::{analyze_uncached, RelName};

#[test]
fn relations() {
    let n = common::run(&[
        case!("SELECT * FROM \"Orders\"", Read, ["\"Orders\""], [], []),
        case!("SELECT * FROM ORDERS", Read, ["orders"], [], []),
        case!("SELECT * FROM App.Orders", Read, ["app.orders"], [], []),
        case!("SELECT * FROM \"App\".\"Orders\"", Read, ["\"App\".\"Orders\""], [], []),
        case!("SELECT * FROM mydb.app.orders", Read, ["app.orders"], [], []),
        case!("SELECT * FROM \"we\"\"ird\"", Read, ["\"we\"\"ird\""], [], []),
        case!("SELECT * FROM ONLY parent", Read, ["parent"], [], []),
        case!("SELECT * FROM a JOIN b ON a.id = b.id LEFT JOIN c USING (id) CROSS JOIN d", Read, ["a", "b", "c", "d"], [], []),
        case!("SELECT * FROM a, b, c NATURAL FULL JOIN e", Read, ["a", "b", "c", "e"], [], []),
        case!("SELECT * FROM (SELECT * FROM inner_t) s", Read, ["inner_t"], [], []),
        case!("SELECT * FROM a WHERE x IN (SELECT x FROM b WHERE y = ANY (SELECT y FROM c))", Read, ["a", "b", "c"], [], []),
        case!("SELECT (SELECT max(v) FROM b) AS m FROM a", Read, ["a", "b"], [], []),
        case!("SELECT * FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.id = a.id)", Read, ["a", "b"], [], []),
        case!("SELECT * FROM a, LATERAL (SELECT * FROM b WHERE b.aid = a.id) l", Read, ["a", "b"], [], []),
        case!("SELECT * FROM a CROSS JOIN LATERAL unnest(a.arr) u", Read, ["a"], [], []),
        case!("SELECT * FROM a UNION SELECT * FROM b INTERSECT SELECT * FROM c", Read, ["a", "b", "c"], [], []),
        case!("(SELECT * FROM a) UNION (SELECT * FROM b ORDER BY 1 LIMIT 1)", Read, ["a", "b"], [], []),
        case!("WITH x AS (SELECT * FROM base) SELECT * FROM x", Read, ["base"], [], []),
        case!("WITH x AS (SELECT 1), y AS (SELECT * FROM x) SELECT * FROM y, real_t", Read, ["real_t"], [], []),
        case!("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10) SELECT * FROM r", Read, [], [], []),
        case!("WITH orders AS (SELECT 1) SELECT * FROM orders, app.orders", Read, ["app.orders"], [], []),
        // A non-recursive CTE cannot see itself: the inner name is the real table.
        case!("WITH t AS (SELECT * FROM t) SELECT * FROM t", Read, ["t"], [], []),
        // CTE names do not leak out of their statement.
        case!("SELECT * FROM (WITH x AS (SELECT 1) SELECT * FROM x) s, x", Read, ["x"], [], []),
        case!("SELECT * FROM v_orders_summary", Read, ["v_orders_summary"], [], []),
        case!("SELECT * FROM t TABLESAMPLE SYSTEM (10)", Read, ["t"], [], []),
        case!("SELECT * FROM XMLTABLE('/r' PASSING (SELECT doc FROM docs) COLUMNS a int)", Read, ["docs"], [], []),
        case!("SELECT ARRAY(SELECT id FROM a)", Read, ["a"], [], []),
        case!("SELECT row_number() OVER (PARTITION BY x ORDER BY y) FROM t WINDOW w AS (ORDER BY z)", Read, ["t"], [], []),
        case!("SELECT CASE WHEN EXISTS (SELECT 1 FROM a) THEN 1 ELSE (SELECT 2 FROM b) END", Read, ["a", "b"], [], []),
        case!("SELECT json_agg(x) FILTER (WHERE x IN (SELECT y FROM f)) FROM t", Read, ["f", "t"], [], []),
        case!("SELECT JSON_OBJECT('a': (SELECT 1 FROM j))", Read, ["j"], [], []),
        case!("UPDATE t SET (a, b) = (SELECT a, b FROM src WHERE src.id = t.id)", Write, ["src"], ["t"], []),
        case!("INSERT INTO t SELECT * FROM (VALUES (1)) v(x) WHERE x NOT IN (SELECT x FROM ex)", Write, ["ex"], ["t"], []),
        case!("INSERT INTO t AS dst VALUES (1) ON CONFLICT (id) DO UPDATE SET v = (SELECT v FROM src) WHERE dst.v <> 0", Write, ["src"], ["t"], []),
        case!("DELETE FROM t WHERE id = 1 RETURNING (SELECT name FROM names WHERE names.id = t.id)", Write, ["names"], ["t"], []),
        case!("UPDATE \"Mixed\".\"Case\" SET a = 1", Write, [], ["\"Mixed\".\"Case\""], []),
        case!("WITH src AS (SELECT * FROM staging) INSERT INTO t SELECT * FROM src", Write, ["staging"], ["t"], []),
        // A CTE cannot be a write target: the name refers to the table.
        case!("WITH t AS (SELECT 1) DELETE FROM t", Write, [], ["t"], []),
    ]);
    assert_eq!(n, 38);
}

#[test]
fn functions_are_listed() {
    for (sql, expected) in [
        (
            "SELECT lower(name), app.score(id) FROM t",
            vec!["lower", "app.score"],
        ),
        ("SELECT count(*) FROM t WHERE f(x) > 0", vec!["count", "f"]),
        (
            "SELECT * FROM generate_series(1, 3) g, LATERAL my_srf(g)",
            vec!["generate_series", "my_srf"],
        ),
        (
            "SELECT \"MyFunc\"(1), MYOTHER(2)",
            vec!["\"MyFunc\"", "myother"],
        ),
        (
            "SELECT 1 WHERE EXISTS (SELECT inner_fn() FROM t)",
            vec!["inner_fn"],
        ),
        ("INSERT INTO t VALUES (mk_id())", vec!["mk_id"]),
        ("CALL app.proc(helper(1))", vec!["app.proc", "helper"]),
        (
            "SELECT extract(year FROM now())",
            vec!["pg_catalog.extract", "now"],
        ),
        ("SELECT 1", vec![]),
    ] {
        let a = analyze_uncached(sql);
        assert_eq!(a.functions, common::funcs(&expected), "{sql}");
    }
}

#[test]
fn names_display_round_trip() {
    let a = analyze_uncached("SELECT * FROM \"App\".\"Order Items\", app.orders, \"select\"");
    let shown: Vec<String> = a.reads.iter().map(|r| r.to_string()).collect();
    assert_eq!(
        shown,
        ["\"select\"", "\"App\".\"Order Items\"", "app.orders"]
    );
    for r in &a.reads {
        assert_eq!(&RelName::parse(&r.to_string()).unwrap(), r);
    }
}

#[test]
fn operators_and_casts_are_implicit_calls() {
    let names = |sql: &str| {
        let a = analyze_uncached(sql);
        assert!(a.error.is_none(), "{sql}: {:?}", a.error);
        a.implicit_calls
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(names("SELECT 1"), Vec::<String>::new());
    assert_eq!(names("SELECT a <+> b FROM t"), ["\"operator <+>\""]);
    assert_eq!(
        names("SELECT 1 OPERATOR(app.<+>) 2"),
        ["app.\"operator <+>\""]
    );
    assert_eq!(
        names("INSERT INTO t VALUES ($1::app.wrapped, CAST(2 AS wrapped[]))"),
        ["\"cast to wrapped\"", "app.\"cast to wrapped\""]
    );
    assert_eq!(
        names("SELECT x FROM t WHERE x = ANY (SELECT y FROM u) AND x::int > 0"),
        [
            "\"operator =\"",
            "\"operator >\"",
            "pg_catalog.\"cast to int4\""
        ]
    );
    assert_eq!(
        names("SELECT x FROM t ORDER BY x USING <+>"),
        ["\"operator <+>\""]
    );
    // In a CTE, a subquery, a DEFAULT-less VALUES list, and across statements.
    assert_eq!(
        names("WITH c AS (SELECT 1 <+> 2) SELECT * FROM c; SELECT '1'::wrapped"),
        ["\"cast to wrapped\"", "\"operator <+>\""]
    );
}
