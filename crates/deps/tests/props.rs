//! Properties of write expansion on random schemas: monotone, idempotent, and exactly the
//! relations a naive reachability walk finds (nothing unrelated).

mod common;

use std::collections::BTreeSet;

use common::{plpgsql_def, Schema};
use pgfresh_deps::{DepGraph, Expansion};
use pgfresh_sql::RelName;
use proptest::prelude::*;

const SCHEMAS: [&str; 2] = ["app", "other"];

#[derive(Debug, Clone)]
struct Spec {
    tables: usize,
    /// (referencing, referenced, cascades)
    fks: Vec<(usize, usize, bool)>,
    /// (table, tables its trigger function writes)
    triggers: Vec<(usize, Vec<usize>)>,
    /// (child, parent) with parent < child: a forest
    inherits: Vec<(usize, usize)>,
}

fn table_name(i: usize) -> RelName {
    RelName::new(Some(SCHEMAS[i % 2]), &format!("t{}", i / 2))
}

fn spec(with_inherits: bool) -> impl Strategy<Value = Spec> {
    (2usize..12).prop_flat_map(move |n| {
        let fks = prop::collection::vec((0..n, 0..n, any::<bool>()), 0..12);
        let triggers = prop::collection::vec((0..n, prop::collection::vec(0..n, 1..4)), 0..8);
        let inherits = if with_inherits {
            prop::collection::vec((1..n, 0..n), 0..6)
                .prop_map(|v| v.into_iter().filter(|(c, p)| p < c).collect())
                .boxed()
        } else {
            Just(Vec::new()).boxed()
        };
        (Just(n), fks, triggers, inherits).prop_map(|(tables, fks, triggers, inherits)| Spec {
            tables,
            fks,
            triggers,
            inherits,
        })
    })
}

fn build(spec: &Spec) -> (DepGraph, Vec<u32>) {
    let mut s = Schema::default();
    let oids: Vec<u32> = (0..spec.tables)
        .map(|i| s.table(&table_name(i).to_string()))
        .collect();
    for &(a, b, cascade) in &spec.fks {
        let act = if cascade { 'c' } else { 'a' };
        s.fk(oids[a], oids[b], act, 'a');
    }
    for (k, (t, targets)) in spec.triggers.iter().enumerate() {
        let body: String = targets
            .iter()
            .map(|&x| format!("  INSERT INTO {} DEFAULT VALUES;\n", table_name(x)))
            .collect();
        let fname = format!("app.trg{k}");
        let def = plpgsql_def(&fname, "trigger", "", &format!("{body}  RETURN NEW;"));
        let f = s.func(&fname, "plpgsql", 'v', Some(def));
        s.trigger(oids[*t], f, &format!("trg{k}"));
    }
    for &(c, p) in &spec.inherits {
        s.inherit(oids[c], oids[p]);
    }
    (DepGraph::build(&s.rows, &[]), oids)
}

fn expand(g: &DepGraph, input: &[RelName]) -> (BTreeSet<RelName>, Expansion) {
    let mut out = Vec::new();
    let e = g.expand_writes(input, &[], &mut out);
    let n = out.len();
    let set: BTreeSet<RelName> = out.into_iter().collect();
    assert_eq!(set.len(), n, "no duplicates");
    (set, e)
}

/// Input names: qualified or not.
fn inputs(spec: &Spec, picks: &[(usize, bool)]) -> Vec<RelName> {
    picks
        .iter()
        .map(|&(i, q)| {
            let n = table_name(i % spec.tables);
            if q {
                n
            } else {
                RelName::new(None, &n.name)
            }
        })
        .collect()
}

/// Catalog relations (by index) an input name matches.
fn matched(spec: &Spec, input: &[RelName]) -> BTreeSet<usize> {
    (0..spec.tables)
        .filter(|&i| input.iter().any(|n| n.may_match(&table_name(i))))
        .collect()
}

/// Naive reachability over cascading FKs and trigger writes (no inheritance).
fn reference(spec: &Spec, start: &BTreeSet<usize>) -> BTreeSet<RelName> {
    let mut seen = start.clone();
    let mut stack: Vec<usize> = start.iter().copied().collect();
    while let Some(t) = stack.pop() {
        let mut next = Vec::new();
        for &(a, b, cascade) in &spec.fks {
            if b == t && cascade {
                next.push(a);
            }
        }
        for (tt, targets) in &spec.triggers {
            if *tt == t {
                for &x in targets {
                    next.push(x); // the body names the qualified table
                }
            }
        }
        for n in next {
            if seen.insert(n) {
                stack.push(n);
            }
        }
    }
    seen.into_iter().map(table_name).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn monotone(spec in spec(true), a in prop::collection::vec((0usize..12, any::<bool>()), 0..4),
                b in prop::collection::vec((0usize..12, any::<bool>()), 0..4)) {
        let (g, _) = build(&spec);
        let a = inputs(&spec, &a);
        let mut ab = a.clone();
        ab.extend(inputs(&spec, &b));
        let (ea, wa) = expand(&g, &a);
        let (eab, wab) = expand(&g, &ab);
        let covered = |x: &RelName| eab.contains(x) || ab.iter().any(|n| n.may_match(x));
        prop_assert!(ea.iter().all(covered), "{ea:?} not within {eab:?}");
        prop_assert!(!wa.is_whole_database() || wab.is_whole_database());
    }

    #[test]
    fn idempotent_and_exact(spec in spec(false), a in prop::collection::vec((0usize..12, any::<bool>()), 1..4)) {
        let (g, _) = build(&spec);
        let a = inputs(&spec, &a);
        let (e, _) = expand(&g, &a);
        // exactly what a naive walk reaches, inputs aside
        let start = matched(&spec, &a);
        let want = reference(&spec, &start);
        let mut got = e.clone();
        got.extend(start.iter().map(|&i| table_name(i)));
        prop_assert_eq!(&got, &want);
        // expanding the expansion adds nothing new
        let mut again_in = a.clone();
        again_in.extend(e.iter().cloned());
        let (again, _) = expand(&g, &again_in);
        prop_assert!(again.iter().all(|x| got.contains(x)), "{again:?} beyond {got:?}");
    }
}

#[test]
fn partitions_mark_ancestors_without_writing_siblings() {
    // Why idempotence is checked without inheritance: a write to a partition marks its
    // parent, but expanding the parent as if written would mark every sibling.
    let spec = Spec {
        tables: 3,
        fks: vec![],
        triggers: vec![],
        inherits: vec![(1, 0), (2, 0)],
    };
    let (g, _) = build(&spec);
    let (e, _) = expand(&g, &[table_name(1)]);
    assert_eq!(e.into_iter().collect::<Vec<_>>(), vec![table_name(0)]);
}
