//! Property tests: determinism, and the combined verdict of multi-statement strings.

use pgfresh_sql::{analyze_uncached, Analyzer, AnalyzerOptions, Kind};
use proptest::prelude::*;

/// Known statements with whether they write data.
const POOL: &[(&str, bool)] = &[
    ("SELECT 1", false),
    ("SELECT * FROM orders WHERE id = 7", false),
    ("SELECT a.*, b.x FROM a JOIN app.b b ON a.id = b.id", false),
    ("SELECT * FROM t FOR UPDATE", false),
    ("SELECT nextval('s')", false),
    ("WITH x AS (SELECT * FROM base) SELECT * FROM x", false),
    ("SET search_path = app", false),
    ("BEGIN READ ONLY", false),
    ("COMMIT", false),
    ("SHOW work_mem", false),
    ("LISTEN ch", false),
    ("VACUUM t", false),
    ("CREATE INDEX i ON t (a)", false),
    ("INSERT INTO orders (id) VALUES (1)", true),
    ("UPDATE \"Orders\" SET x = 1", true),
    ("DELETE FROM app.items WHERE id = 3", true),
    (
        "WITH d AS (DELETE FROM q RETURNING *) SELECT * FROM d",
        true,
    ),
    ("TRUNCATE logs", true),
    ("COPY t FROM STDIN", true),
    (
        "MERGE INTO s USING d ON s.k = d.k WHEN MATCHED THEN DELETE",
        true,
    ),
    ("CREATE TEMP TABLE tmp (i int)", true),
];

fn composition() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..POOL.len(), 1..6)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn analysis_is_deterministic(parts in composition(), sep in prop_oneof![Just(";"), Just("; "), Just(" ;\n")]) {
        let sql = parts.iter().map(|&i| POOL[i].0).collect::<Vec<_>>().join(sep);
        let first = analyze_uncached(&sql);
        let second = analyze_uncached(&sql);
        prop_assert_eq!(&first, &second);
        let analyzer = Analyzer::new(AnalyzerOptions::default());
        prop_assert_eq!(&*analyzer.analyze(&sql), &first);
        prop_assert_eq!(&*analyzer.analyze(&sql), &first);
    }

    #[test]
    fn combined_verdict_is_a_write_whenever_any_part_is(parts in composition()) {
        let sql = parts.iter().map(|&i| POOL[i].0).collect::<Vec<_>>().join("; ");
        let a = analyze_uncached(&sql);
        prop_assert_eq!(a.statements.len(), parts.len());
        let any_write = parts.iter().any(|&i| POOL[i].1);
        prop_assert_eq!(a.kind == Kind::Write, any_write, "{} -> {:?}", sql, a.kind);
        // The combined verdict is the most constraining per-part verdict, and every part's
        // relations and reasons appear in the union.
        let max = a.statements.iter().map(|s| s.kind).max().unwrap();
        prop_assert_eq!(a.kind, max);
        for (s, &i) in a.statements.iter().zip(&parts) {
            prop_assert_eq!(s.kind, analyze_uncached(POOL[i].0).kind);
            prop_assert!(s.reads.iter().all(|r| a.reads.contains(r)));
            prop_assert!(s.writes.iter().all(|w| a.writes.contains(w)));
            prop_assert!(s.must_primary.iter().all(|m| a.must_primary.contains(m)));
        }
    }

    #[test]
    fn a_broken_part_makes_the_whole_string_unclassified(parts in composition(), at in 0usize..6) {
        let mut texts: Vec<&str> = parts.iter().map(|&i| POOL[i].0).collect();
        let at = at.min(texts.len());
        texts.insert(at, "SELEC broken");
        let a = analyze_uncached(&texts.join("; "));
        prop_assert_eq!(a.kind, Kind::Unclassified);
        prop_assert!(a.error.is_some());
    }

    #[test]
    fn arbitrary_text_never_panics_and_reads_are_parsed(s in "\\PC{0,200}") {
        let a = analyze_uncached(&s);
        if a.kind == Kind::Read {
            prop_assert!(a.error.is_none());
            prop_assert!(!a.statements.is_empty());
        }
        if a.kind == Kind::Unclassified {
            prop_assert!(a.error.is_some());
        }
    }

    #[test]
    fn arbitrary_sqlish_text_never_panics(
        words in prop::collection::vec(prop_oneof![
            Just("SELECT"), Just("FROM"), Just("t"), Just("WITH"), Just("x"), Just("AS"), Just("("),
            Just(")"), Just("UPDATE"), Just("SET"), Just("a"), Just("="), Just("1"), Just(","),
            Just(";"), Just("RETURNING"), Just("*"), Just("FOR"), Just("INSERT"), Just("INTO"),
            Just("VALUES"), Just("DELETE"), Just("WHERE"), Just("JOIN"), Just("ON"), Just("nextval('s')"),
        ], 0..40)
    ) {
        let sql = words.join(" ");
        let a = analyze_uncached(&sql);
        prop_assert_eq!(&a, &analyze_uncached(&sql));
        // Whatever parses with a written relation is never a read a replica may serve
        // (a call that writes in a SELECT, `nextval('s')`, stays a read on the primary).
        if !a.writes.is_empty() {
            prop_assert!(a.kind != Kind::Read || !a.must_primary.is_empty(), "{} -> {:?}", sql, a);
        }
    }
}
