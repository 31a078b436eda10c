//! Shared helpers for the table-driven tests.
#![allow(dead_code)]

use pgfresh_sql::{analyze_uncached, FuncName, Kind, MustPrimary, RelName};

/// One table row: SQL text and the expected combined verdict, relations and reasons.
pub struct Case {
    pub sql: &'static str,
    pub kind: Kind,
    pub reads: Vec<&'static str>,
    pub writes: Vec<&'static str>,
    pub must: Vec<MustPrimary>,
}

/// `case!(sql, Kind, [reads], [writes], [reasons])`; names are written as SQL (`app."Orders"`).
#[macro_export]
macro_rules! case {
    ($sql:expr, $kind:ident, [$($r:expr),*], [$($w:expr),*], [$($m:expr),*]) => {
        $crate::common::Case {
            sql: $sql,
            kind: pgfresh_sql::Kind::$kind,
            reads: vec![$($r),*],
            writes: vec![$($w),*],
            must: vec![$($m),*],
        }
    };
}

pub fn rels(names: &[&str]) -> Vec<RelName> {
    let mut v: Vec<RelName> = names.iter().map(|n| RelName::parse(n).unwrap()).collect();
    v.sort();
    v.dedup();
    v
}

pub fn funcs(names: &[&str]) -> Vec<FuncName> {
    let mut v: Vec<FuncName> = names.iter().map(|n| FuncName::parse(n).unwrap()).collect();
    v.sort();
    v.dedup();
    v
}

/// Runs every case and fails once with the full list of mismatches.
pub fn run(cases: &[Case]) -> usize {
    let mut failures = Vec::new();
    for c in cases {
        let a = analyze_uncached(c.sql);
        let mut must = c.must.clone();
        must.sort();
        must.dedup();
        let reads = rels(&c.reads);
        let writes = rels(&c.writes);
        if a.kind != c.kind || a.reads != reads || a.writes != writes || a.must_primary != must {
            failures.push(format!(
                "{:?}\n   expected {:?} reads={:?} writes={:?} must={:?}\n   got      {:?} reads={:?} writes={:?} must={:?} err={:?}",
                c.sql, c.kind, reads, writes, must, a.kind, a.reads, a.writes, a.must_primary, a.error
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    cases.len()
}

pub fn unclassified(sql: &str) {
    let a = analyze_uncached(sql);
    assert_eq!(a.kind, Kind::Unclassified, "{sql:?} -> {a:?}");
    assert!(
        a.error.as_deref().is_some_and(|e| !e.is_empty()),
        "{sql:?} has no error message"
    );
    assert!(!a.is_standby_safe());
}
