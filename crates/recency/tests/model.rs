//! Property tests: the map against a plain reference model.

use std::collections::HashMap;
use std::sync::Arc;

use pgfresh_recency::{Lsn, ManualClock, RecencyConfig, RecencyMap, RelKey, RelPattern};
use proptest::prelude::*;

const DBS: [&str; 2] = ["db0", "db1"];
const SCHEMAS: [&str; 2] = ["a", "b"];
const NAMES: [&str; 3] = ["orders", "items", "Orders"];
const MAX_TTL: u64 = 1_200;

type Rel = (Option<usize>, usize);

#[derive(Debug, Clone)]
enum Op {
    Mark {
        db: usize,
        rels: Vec<Rel>,
        lsn: Option<u64>,
    },
    Lookup {
        db: usize,
        rels: Vec<Rel>,
    },
    Advance(u64),
    SetTtl(u64),
    SetStaleness(Option<u64>),
    Sweep(usize),
}

fn rel() -> impl Strategy<Value = Rel> {
    (proptest::option::of(0..SCHEMAS.len()), 0..NAMES.len())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..DBS.len(), prop::collection::vec(rel(), 1..4), proptest::option::of(1u64..1_000))
            .prop_map(|(db, rels, lsn)| Op::Mark { db, rels, lsn }),
        5 => (0..DBS.len(), prop::collection::vec(rel(), 0..4))
            .prop_map(|(db, rels)| Op::Lookup { db, rels }),
        3 => (0u64..700).prop_map(Op::Advance),
        1 => (0u64..1_500).prop_map(Op::SetTtl),
        1 => proptest::option::of(0u64..2_000).prop_map(Op::SetStaleness),
        2 => (1usize..6).prop_map(Op::Sweep),
    ]
}

fn key(rel: &Rel) -> RelKey<'static> {
    RelKey {
        schema: rel.0.map(|s| SCHEMAS[s]),
        name: NAMES[rel.1],
    }
}

#[derive(Debug, Clone)]
struct ModelEntry {
    last: u64,
    streak: u64,
    lsn: u64,
    /// Expired at some sweep: the map may or may not still hold it.
    maybe_removed: bool,
    /// Re-written after `maybe_removed`: the map may have started a fresh streak.
    uncertain_streak: bool,
}

#[derive(Default)]
struct Model {
    now: u64,
    ttl: u64,
    staleness: Option<u64>,
    entries: HashMap<(usize, Option<usize>, usize), ModelEntry>,
}

impl Model {
    fn mark(&mut self, db: usize, rels: &[Rel], lsn: u64) {
        if self.ttl == 0 {
            return;
        }
        for r in rels {
            let now = self.now;
            let ttl = self.ttl;
            let e = self.entries.entry((db, r.0, r.1)).or_insert(ModelEntry {
                last: now,
                streak: now,
                lsn,
                maybe_removed: false,
                uncertain_streak: false,
            });
            if now - e.last >= ttl {
                e.streak = now;
                e.lsn = lsn;
                e.uncertain_streak = false;
            } else {
                e.lsn = if e.lsn == 0 || lsn == 0 {
                    0
                } else {
                    e.lsn.max(lsn)
                };
                if e.maybe_removed {
                    e.uncertain_streak = true;
                }
            }
            e.maybe_removed = false;
            e.last = now;
        }
    }

    fn sweep(&mut self) {
        for e in self.entries.values_mut() {
            if self.now - e.last >= self.ttl {
                e.maybe_removed = true;
            }
        }
    }

    /// (certainly hot, possibly hot, exact LSN if determinable)
    fn lookup(&self, db: usize, rels: &[Rel]) -> (bool, bool, Option<Option<u64>>) {
        if self.ttl == 0 {
            return (false, false, Some(None));
        }
        let (mut certain, mut possible, mut exact) = (false, false, true);
        let mut lsn: Option<u64> = None;
        for r in rels {
            for ((edb, eschema, ename), e) in &self.entries {
                let schema_ok = match (r.0, eschema) {
                    (Some(a), Some(b)) => a == *b,
                    _ => true,
                };
                if *edb != db || *ename != r.1 || !schema_ok || self.now - e.last >= self.ttl {
                    continue;
                }
                let fresh = self.staleness.is_none_or(|s| self.now - e.streak < s);
                if e.maybe_removed || e.uncertain_streak {
                    exact = false;
                }
                if e.maybe_removed {
                    possible = true;
                    continue;
                }
                if fresh {
                    certain = true;
                    possible = true;
                    lsn = Some(match lsn {
                        None => e.lsn,
                        Some(prev) if prev == 0 || e.lsn == 0 => 0,
                        Some(prev) => prev.max(e.lsn),
                    });
                } else if e.uncertain_streak {
                    possible = true;
                }
            }
        }
        let exact_lsn = exact.then(|| lsn.filter(|l| *l != 0));
        (certain, possible, exact_lsn)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// The map agrees with the model: TTL changes apply to existing entries, the cap
    /// clamps, schemas match conservatively, expiry follows the fake clock, the
    /// staleness cap and LSN rules hold.
    #[test]
    fn map_matches_model(ops in prop::collection::vec(op(), 1..120)) {
        let clock = Arc::new(ManualClock::new(0));
        let map = RecencyMap::new(
            RecencyConfig {
                ttl_ms: 500,
                max_ttl_ms: MAX_TTL,
                cold_start_ms: 0,
                max_entries: 1_000,
                ..RecencyConfig::default()
            },
            clock.clone(),
        );
        let mut model = Model { ttl: 500, ..Model::default() };
        for op in ops {
            match op {
                Op::Mark { db, rels, lsn } => {
                    let keys: Vec<_> = rels.iter().map(key).collect();
                    map.mark(DBS[db], &keys, lsn.map(Lsn));
                    model.mark(db, &rels, lsn.unwrap_or(0));
                }
                Op::Lookup { db, rels } => {
                    let keys: Vec<_> = rels.iter().map(key).collect();
                    let answer = map.lookup(DBS[db], &keys);
                    let (certain, possible, lsn) = model.lookup(db, &rels);
                    if certain {
                        prop_assert!(answer.is_hot(), "missed a hot write: db {db} {rels:?}");
                    }
                    if !possible {
                        prop_assert!(!answer.is_hot(), "hot without a write: {answer:?}");
                    }
                    if let Some(lsn) = lsn {
                        prop_assert_eq!(answer.required_lsn(), lsn.map(Lsn));
                    }
                }
                Op::Advance(ms) => model.now = clock.advance(ms),
                Op::SetTtl(ms) => {
                    let effective = map.set_ttl_ms(ms);
                    prop_assert_eq!(effective, ms.min(MAX_TTL));
                    model.ttl = effective;
                }
                Op::SetStaleness(s) => {
                    map.set_max_staleness_ms(s);
                    model.staleness = s;
                }
                Op::Sweep(batch) => {
                    map.sweep(batch);
                    model.sweep();
                }
            }
            let kept = model.entries.values().filter(|e| !e.maybe_removed).count();
            prop_assert!(map.len() >= kept, "map lost a live entry");
            prop_assert!(map.len() <= model.entries.len());
        }
    }

    /// With a tiny entry cap the map may drop writes, but never in the unsafe
    /// direction: a relation written within the TTL always reads hot, and the
    /// required LSN is never below a write still inside the TTL (nor known when
    /// such a write had no LSN).
    #[test]
    fn overflow_never_hides_a_write(
        cap in 0usize..4,
        ops in prop::collection::vec(op(), 1..150),
    ) {
        const TTL: u64 = 500;
        let clock = Arc::new(ManualClock::new(0));
        let map = RecencyMap::new(
            RecencyConfig { ttl_ms: TTL, cold_start_ms: 0, max_entries: cap, ..RecencyConfig::default() },
            clock.clone(),
        );
        // Every write: (db, schema, name, time, lsn or 0).
        let mut log: Vec<(usize, Option<usize>, usize, u64, u64)> = Vec::new();
        let mut now = 0;
        for op in ops {
            match op {
                Op::Mark { db, rels, lsn } => {
                    let keys: Vec<_> = rels.iter().map(key).collect();
                    map.mark(DBS[db], &keys, lsn.map(Lsn));
                    log.extend(rels.iter().map(|r| (db, r.0, r.1, now, lsn.unwrap_or(0))));
                }
                Op::Lookup { db, rels } => {
                    let keys: Vec<_> = rels.iter().map(key).collect();
                    let answer = map.lookup(DBS[db], &keys);
                    let live: Vec<u64> = log
                        .iter()
                        .filter(|(wdb, wschema, wname, t, _)| {
                            *wdb == db
                                && now - t < TTL
                                && rels.iter().any(|(rschema, rname)| {
                                    rname == wname
                                        && (rschema.is_none() || wschema.is_none() || rschema == wschema)
                                })
                        })
                        .map(|w| w.4)
                        .collect();
                    if live.is_empty() {
                        continue;
                    }
                    prop_assert!(answer.is_hot(), "overflow hid a write: db {db} {rels:?}");
                    if let Some(got) = answer.required_lsn() {
                        prop_assert!(!live.contains(&0), "known LSN despite an unknown write");
                        prop_assert!(got.0 >= *live.iter().max().unwrap());
                    }
                }
                Op::Advance(ms) => now = clock.advance(ms),
                Op::Sweep(batch) => {
                    map.sweep(batch);
                }
                Op::SetTtl(_) | Op::SetStaleness(_) => {}
            }
            prop_assert!(map.len() <= cap);
        }
    }

    /// Patterns survive a display/parse round trip for any identifiers.
    #[test]
    fn pattern_round_trip(schema in proptest::option::of("[a-zA-Z_ .\"$0-9]{1,8}"),
                          name in proptest::option::of("[a-zA-Z_ .\"$0-9]{1,8}")) {
        let pat = RelPattern::new(schema.as_deref(), name.as_deref());
        let text = pat.to_string();
        let back: RelPattern = text.parse().unwrap();
        // `*.name` prints as `name`: both mean "any schema".
        prop_assert_eq!(back, pat);
    }
}
