//! Unparseable input, multi-statement strings, comments and hints, the cache, function policy.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::sync::Arc;

use pgfresh_sql::{
    analyze_bytes, analyze_uncached, Analyzer, AnalyzerOptions, FuncName, FunctionPolicy, Kind,
    MustPrimary, RelName, RouteHint, Volatility, VolatilityOracle,
};

#[test]
fn unparseable_input_is_unclassified() {
    let inputs = [
        "",
        "   ",
        ";",
        "-- only a comment",
        "/* nothing */ ;",
        "SELEC 1",
        "SELECT * FROM",
        "SELECT 'unterminated",
        "SELECT \"unterminated",
        "/* unterminated comment SELECT 1",
        "SELECT 1; garbage here; SELECT 2",
        "SELECT 1\0",
        "\0",
        "INSERT INTO t VALUES (",
        // Syntax only newer servers accept (a made-up clause stands for any future grammar).
        "SELECT * FROM t WITH FUTURE SYNTAX",
        "UPDATE t SET a = 1 RETURNING OLD.*, NEW.* WITH PERIOD",
        "SELECT $$unterminated",
        "))))",
        "SELECT 1 +",
    ];
    for sql in inputs {
        common::unclassified(sql);
    }
    let a = analyze_uncached("SELEC 1");
    assert!(
        a.error.as_deref().unwrap().contains("syntax error"),
        "{:?}",
        a.error
    );
    let a = analyze_uncached("SELECT 1\0");
    assert!(a.error.as_deref().unwrap().contains("NUL"), "{:?}", a.error);
}

#[test]
fn invalid_utf8_is_unclassified() {
    for bytes in [&b"SELECT '\xff'"[..], b"\xc3", b"SELECT 1 \xe2\x82"] {
        let a = analyze_bytes(bytes);
        assert_eq!(a.kind, Kind::Unclassified);
        assert!(a.error.as_deref().unwrap().contains("UTF-8"));
    }
    assert_eq!(analyze_bytes(b"SELECT 1").kind, Kind::Read);
    let analyzer = Analyzer::new(AnalyzerOptions::default());
    assert_eq!(
        analyzer.analyze_bytes(b"SELECT '\xff'").kind,
        Kind::Unclassified
    );
}

#[test]
fn deep_nesting_does_not_panic() {
    // Redundant parentheses produce no nodes at all.
    let parens = format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000));
    assert_eq!(analyze_uncached(&parens).kind, Kind::Read);
    // Deeply nested calls exceed the parser's or the tree decoder's depth limit.
    let deep = format!("SELECT {}'x'{}", "lower(".repeat(5000), ")".repeat(5000));
    let a = analyze_uncached(&deep);
    assert_eq!(a.kind, Kind::Unclassified);
    assert!(a.error.is_some());
    let nested_subqueries = format!(
        "SELECT * FROM {}t{}",
        "(SELECT * FROM ".repeat(300),
        ") s".repeat(300)
    );
    let a = analyze_uncached(&nested_subqueries);
    assert_ne!(
        a.kind,
        Kind::Read,
        "too deep to be sure must not become a read without relations"
    );
    let long_in = format!(
        "SELECT * FROM t WHERE id IN ({})",
        vec!["1"; 20000].join(",")
    );
    assert_eq!(analyze_uncached(&long_in).kind, Kind::Read);
}

#[test]
fn multi_statement_strings() {
    let n = common::run(&[
        case!("SELECT 1; SELECT * FROM t", Read, ["t"], [], []),
        case!(
            "SELECT * FROM a; UPDATE b SET x = 1",
            Write,
            ["a"],
            ["b"],
            []
        ),
        case!(
            "UPDATE b SET x = 1; SELECT * FROM a",
            Write,
            ["a"],
            ["b"],
            []
        ),
        case!("BEGIN; SELECT 1; COMMIT", Transaction, [], [], []),
        case!(
            "BEGIN; INSERT INTO t VALUES (1); COMMIT",
            Write,
            [],
            ["t"],
            []
        ),
        case!(
            "SET search_path = app; SELECT * FROM t",
            Session,
            ["t"],
            [],
            []
        ),
        case!("CREATE TABLE x (i int); SELECT 1", Ddl, [], ["x"], []),
        case!(
            "SELECT * FROM t FOR UPDATE; SELECT 1",
            Read,
            ["t"],
            [],
            [MustPrimary::LockingClause]
        ),
        case!(
            "SELECT 1; SELECT nextval('s')",
            Read,
            [],
            ["s"],
            [MustPrimary::Sequence("nextval".into())]
        ),
        case!("select 1;;; select 2;", Read, [], [], []),
    ]);
    assert_eq!(n, 10);
    let sql = "SELECT 1; UPDATE t SET a = 2 ;  DELETE FROM u";
    let a = analyze_uncached(sql);
    assert_eq!(a.statements.len(), 3);
    let texts: Vec<&str> = a
        .statements
        .iter()
        .map(|s| &sql[s.text_range.0..s.text_range.1])
        .collect();
    assert_eq!(
        texts,
        ["SELECT 1", " UPDATE t SET a = 2 ", "  DELETE FROM u"]
    );
    assert_eq!(
        a.statements.iter().map(|s| s.kind).collect::<Vec<_>>(),
        [Kind::Read, Kind::Write, Kind::Write]
    );
}

#[test]
fn comments_and_hints() {
    let a = analyze_uncached("/* pgfresh:primary */ SELECT * FROM t -- trailing");
    assert_eq!(a.hint, Some(RouteHint::Primary));
    assert_eq!(a.comments, ["/* pgfresh:primary */", "-- trailing"]);
    assert_eq!(a.kind, Kind::Read);
    assert_eq!(a.reads, vec![RelName::new(None, "t")]);

    let a = analyze_uncached("-- pgfresh:replica\nSELECT 1");
    assert_eq!(a.hint, Some(RouteHint::Replica));
    assert_eq!(a.comments, ["-- pgfresh:replica"]);

    // A hint counts in any comment, not only a leading one.
    let a = analyze_uncached("SELECT 1 /* pgfresh:replica */");
    assert_eq!(a.hint, Some(RouteHint::Replica));
    assert_eq!(a.comments.len(), 1);

    // Comments do not change the classification.
    let plain = analyze_uncached("UPDATE t SET a = 1");
    let commented = analyze_uncached("/* pgfresh:replica */ UPDATE /* x */ t SET a = 1 -- y");
    assert_eq!(plain.kind, commented.kind);
    assert_eq!(plain.writes, commented.writes);
    assert_eq!(commented.hint, Some(RouteHint::Replica));

    // Comment markers inside literals are not comments.
    let a = analyze_uncached("SELECT '/* not a comment */', '-- nor this'");
    assert!(a.comments.is_empty());
    assert_eq!(a.kind, Kind::Read);

    // Comments survive a parse failure.
    let a = analyze_uncached("/* pgfresh:primary */ SELEC 1");
    assert_eq!(a.kind, Kind::Unclassified);
    assert_eq!(a.comments, ["/* pgfresh:primary */"]);
}

#[test]
fn hints_anywhere_in_the_text() {
    use RouteHint::{Primary, Replica};
    let cases: &[(&str, Option<RouteHint>)] = &[
        // start, middle, end
        ("/* pgfresh:primary */ SELECT inet_server_port()", Some(Primary)),
        ("SELECT /* pgfresh:primary */ inet_server_port()", Some(Primary)),
        ("SELECT inet_server_port() /* pgfresh:primary */", Some(Primary)),
        ("SELECT inet_server_port() -- pgfresh:replica", Some(Replica)),
        ("SELECT a\n-- pgfresh:replica\nFROM t WHERE b = 1", Some(Replica)),
        ("SELECT 1; /* pgfresh:primary */", Some(Primary)),
        ("SELECT 1; SELECT 2 -- pgfresh:replica", Some(Replica)),
        // sqlcommenter, as ORMs and OpenTelemetry append it
        ("SELECT * FROM t /*pgfresh='primary'*/", Some(Primary)),
        (
            "SELECT * FROM t /*action='list',pgfresh='replica',traceparent='00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01'*/",
            Some(Replica),
        ),
        (
            "SELECT * FROM t /*db_driver='psycopg2',framework='django%3A4.2.1',pgfresh='prim%61ry',route='%2Fpolls%2F'*/",
            Some(Primary),
        ),
        // several comments: primary wins over replica, whatever the order
        ("/* pgfresh:replica */ SELECT 1 /* pgfresh:primary */", Some(Primary)),
        ("/* pgfresh:primary */ SELECT 1 -- pgfresh:replica", Some(Primary)),
        ("/* app=web */ SELECT 1 /* pgfresh:replica */ -- done", Some(Replica)),
        // not hints: markers inside literals and identifiers, other words, no comment
        ("SELECT '/* pgfresh:primary */'", None),
        ("SELECT '-- pgfresh:primary', 1", None),
        ("SELECT $$ /* pgfresh:primary */ $$", None),
        ("SELECT 1 AS \"/* pgfresh:primary */\"", None),
        ("SELECT 'pgfresh:primary' /* app=web */", None),
        ("SELECT 1 /* pgfresh:nowhere */", None),
        ("SELECT 1 /*route='pgfresh:primary'*/", None),
        ("SELECT 1", None),
    ];
    for (sql, want) in cases {
        let a = analyze_uncached(sql);
        assert_eq!(a.hint, *want, "{sql}");
        assert_ne!(a.kind, Kind::Unclassified, "{sql}");
    }
}

#[test]
fn min_lsn_hint_is_its_own_kind() {
    let a = analyze_uncached("SELECT * FROM t /* pgfresh:min_lsn=1/0/16B3748 */");
    assert_eq!(a.hint, None);
    let m = a.min_lsn_hint.expect("min_lsn hint");
    assert_eq!(
        (m.timeline, m.lsn.to_string().as_str()),
        (Some(1), "0/16B3748")
    );
    let a = analyze_uncached("SELECT 1 /*pgfresh='min_lsn%3D1%2F0%2F16B3748'*/ -- pgfresh:primary");
    assert_eq!(a.hint, Some(RouteHint::Primary));
    assert_eq!(a.min_lsn_hint.map(|m| m.lsn.0), Some(0x16B_3748));
    assert_eq!(
        analyze_uncached("SELECT '/* pgfresh:min_lsn=1/0/1 */'").min_lsn_hint,
        None
    );
}

#[test]
fn texts_differing_only_in_a_hint_never_share_an_analysis() {
    let analyzer = Analyzer::new(AnalyzerOptions::default());
    let texts = [
        "SELECT v FROM t WHERE id = 1",
        "SELECT v FROM t WHERE id = 2 /* pgfresh:primary */",
        "SELECT v FROM t WHERE id = 3 /* pgfresh:replica */",
        "SELECT v FROM t WHERE id = 4 /*pgfresh='primary'*/",
        "SELECT v FROM t WHERE id = 5 /*pgfresh='replica'*/",
        "SELECT /* pgfresh:primary */ v FROM t WHERE id = 6",
        "SELECT v FROM t WHERE id = 7 /* pgfresh:min_lsn=1/0/10 */",
        "SELECT v FROM t WHERE id = 8 /* pgfresh:min_lsn=1/0/20 */",
    ];
    // Twice round, in both orders, so every text meets every other's cached entry.
    for round in 0..2 {
        let order: Vec<&str> = if round == 0 {
            texts.to_vec()
        } else {
            texts.iter().rev().copied().collect()
        };
        for sql in order {
            let cached = analyzer.analyze(sql);
            let fresh = analyze_uncached(sql);
            assert_eq!(cached.hint, fresh.hint, "{sql}");
            assert_eq!(cached.min_lsn_hint, fresh.min_lsn_hint, "{sql}");
            assert_eq!(cached.comments, fresh.comments, "{sql}");
        }
    }
    // The same hint with other literal values still shares.
    let a = analyzer.analyze("SELECT v FROM t WHERE id = 40 /* pgfresh:primary */");
    let b = analyzer.analyze("SELECT v FROM t WHERE id = 41 /* pgfresh:primary */");
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.hint, Some(RouteHint::Primary));
}

#[test]
fn cache_hits_and_shares() {
    let analyzer = Analyzer::new(AnalyzerOptions::default());
    let a = analyzer.analyze("SELECT * FROM t");
    let b = analyzer.analyze("SELECT * FROM t");
    assert!(Arc::ptr_eq(&a, &b));
    let c = analyzer.analyze("SELECT * FROM u");
    assert!(!Arc::ptr_eq(&a, &c));
    let bad = analyzer.analyze("SELEC");
    assert_eq!(bad.kind, Kind::Unclassified);
    let s = analyzer.cache_stats();
    assert_eq!((s.hits, s.misses, s.entries), (1, 3, 3));
    assert!(s.weighted_bytes > 0);
    assert_eq!(*a, analyze_uncached("SELECT * FROM t"));
    analyzer.clear();
    assert_eq!(analyzer.cache_stats().entries, 0);
}

#[test]
fn cache_is_bounded_by_entries_and_bytes() {
    let by_entries = Analyzer::new(AnalyzerOptions {
        cache_max_entries: 50,
        cache_max_bytes: 1 << 30,
    });
    let by_bytes = Analyzer::new(AnalyzerOptions {
        cache_max_entries: 1_000_000,
        cache_max_bytes: 64 * 1024,
    });
    for i in 0..2000 {
        let sql = format!("SELECT * FROM t{i} WHERE id = {i}");
        by_entries.analyze(&sql);
        by_bytes.analyze(&sql);
    }
    let e = by_entries.cache_stats();
    assert!(e.entries <= 50, "{e:?}");
    let b = by_bytes.cache_stats();
    assert!(b.weighted_bytes <= 64 * 1024, "{b:?}");
    assert!(b.entries < 2000 && b.entries > 0, "{b:?}");
}

struct Catalog(HashMap<FuncName, Volatility>);

impl VolatilityOracle for Catalog {
    fn volatility(&self, f: &FuncName) -> Option<Volatility> {
        self.0.get(f).copied()
    }
}

#[test]
fn function_policy() {
    let policy =
        FunctionPolicy::from_lists(["audit_log", "app.touch"], ["app.safe_calc", "fmt_money"])
            .unwrap();
    let oracle = Catalog(HashMap::from([
        (FuncName::parse("stable_fn").unwrap(), Volatility::Stable),
        (FuncName::parse("pure_fn").unwrap(), Volatility::Immutable),
        (
            FuncName::parse("volatile_fn").unwrap(),
            Volatility::Volatile,
        ),
        (FuncName::parse("audit_log").unwrap(), Volatility::Stable),
    ]));
    let user = |n: &str| MustPrimary::UserFunction(FuncName::parse(n).unwrap());
    let listed = |n: &str| MustPrimary::ListedWriteFunction(FuncName::parse(n).unwrap());
    let cases: Vec<(&str, bool, Vec<MustPrimary>)> = vec![
        // (sql, with oracle, expected reasons)
        (
            "SELECT lower(x), now(), random(), count(*) FROM t",
            false,
            vec![],
        ),
        ("SELECT my_fn(1)", false, vec![user("my_fn")]),
        ("SELECT stable_fn(1), pure_fn(2)", true, vec![]),
        ("SELECT stable_fn(1)", false, vec![user("stable_fn")]),
        ("SELECT volatile_fn()", true, vec![user("volatile_fn")]),
        ("SELECT unknown_fn()", true, vec![user("unknown_fn")]),
        ("SELECT audit_log('x')", true, vec![listed("audit_log")]),
        (
            "SELECT other.audit_log('x')",
            true,
            vec![listed("other.audit_log")],
        ),
        ("SELECT touch()", false, vec![listed("touch")]),
        ("SELECT app.touch()", false, vec![listed("app.touch")]),
        ("SELECT other.touch()", false, vec![user("other.touch")]),
        ("SELECT app.safe_calc(1)", false, vec![]),
        ("SELECT safe_calc(1)", false, vec![user("safe_calc")]),
        ("SELECT fmt_money(1), billing.fmt_money(2)", false, vec![]),
        ("SELECT app.lower('X')", false, vec![user("app.lower")]),
        ("SELECT pg_catalog.lower('X')", false, vec![]),
        ("SELECT nextval('s')", false, vec![]),
        ("EXPLAIN SELECT volatile_fn()", true, vec![]),
    ];
    for (sql, with_oracle, expected) in cases {
        let a = analyze_uncached(sql);
        let oracle: Option<&dyn VolatilityOracle> = if with_oracle { Some(&oracle) } else { None };
        assert_eq!(a.function_reasons(&policy, oracle), expected, "{sql}");
    }
    let closure_oracle = |f: &FuncName| (&*f.name == "cl_fn").then_some(Volatility::Immutable);
    let a = analyze_uncached("SELECT cl_fn()");
    assert!(a
        .function_reasons(&FunctionPolicy::default(), Some(&closure_oracle))
        .is_empty());
    assert!(FunctionPolicy::from_lists(["a..b"], Vec::<&str>::new()).is_err());
}

#[test]
fn texts_differing_only_in_literals_share_an_analysis_but_session_effects_do_not() {
    let a = pgfresh_sql::Analyzer::new(pgfresh_sql::AnalyzerOptions::default());
    let first = a.analyze("SELECT abalance FROM pgbench_accounts WHERE aid = 1");
    let second = a.analyze("SELECT abalance FROM pgbench_accounts WHERE aid = 98765");
    assert!(
        std::sync::Arc::ptr_eq(&first, &second),
        "same shape, one analysis"
    );
    assert_eq!(a.cache_stats().misses, 1);
    // Writes keep their classification across values.
    let w1 = a.analyze("UPDATE t SET v = 'x' WHERE id = 1");
    let w2 = a.analyze("UPDATE t SET v = 'yy' WHERE id = 2");
    assert!(std::sync::Arc::ptr_eq(&w1, &w2));
    assert_eq!(w2.kind, pgfresh_sql::Kind::Write);
    // Different structure, different analysis.
    let r = a.analyze("SELECT v FROM t WHERE id = 2 FOR UPDATE");
    assert!(!r.must_primary.is_empty());
    // SET values are replayed from the exact text: never shared.
    let s1 = a.analyze("SET statement_timeout = 1000");
    let s2 = a.analyze("SET statement_timeout = 2000");
    assert!(!std::sync::Arc::ptr_eq(&s1, &s2));
    // A literal that names the sequence written is not a value: never shared.
    let n1 = a.analyze("SELECT nextval('seq_a')");
    let n2 = a.analyze("SELECT nextval('seq_b')");
    assert_eq!(
        n2.writes,
        pgfresh_sql::analyze_uncached("SELECT nextval('seq_b')").writes
    );
    assert!(!std::sync::Arc::ptr_eq(&n1, &n2));
    let v2 = a.analyze("SELECT setval('seq_b', 5)");
    assert_eq!(v2.writes, n2.writes);
    // A malformed literal is the parser's business: no sharing with a valid one.
    let ok = a.analyze("SELECT 1");
    let bad = a.analyze("SELECT 1e");
    assert_eq!(ok.kind, pgfresh_sql::Kind::Read);
    assert_eq!(bad.kind, pgfresh_sql::Kind::Unclassified);
}

#[test]
fn lookups_say_which_key_answered() {
    use pgfresh_sql::Keyed;
    let analyzer = Analyzer::new(AnalyzerOptions::default());
    let (_, k) = analyzer.analyze_keyed("SELECT v FROM t WHERE id = $1");
    assert_eq!(k, Keyed::Text);
    let (first, k) = analyzer.analyze_keyed("SELECT v FROM t WHERE id = 7");
    assert_eq!(k, Keyed::Shape);
    let (again, k) = analyzer.analyze_keyed("SELECT v FROM t WHERE id = 8");
    assert_eq!(k, Keyed::Shape);
    assert!(Arc::ptr_eq(&first, &again));
    // Session effects replay the exact text: keyed as written, on a miss and on a hit.
    for _ in 0..2 {
        let (_, k) = analyzer.analyze_keyed("SELECT set_config('a.b', '1', false)");
        assert_eq!(k, Keyed::Text);
    }
    assert_eq!(analyzer.cache_stats().misses, 3);
}
