//! Many threads marking and looking up at once: no mark is ever lost.
//!
//! A mark that returned before a lookup began (ordered through an atomic that the
//! writer publishes after `mark` and the reader loads before `lookup`) must be seen.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use pgfresh_recency::{Lsn, ManualClock, RecencyConfig, RecencyMap, RelKey};

const WRITERS: usize = 6;
const READERS: usize = 6;
const PER_WRITER: u64 = 1_000;

fn map(max_entries: usize) -> RecencyMap {
    RecencyMap::new(
        RecencyConfig {
            ttl_ms: 10_000,
            cold_start_ms: 0,
            max_entries,
            ..RecencyConfig::default()
        },
        Arc::new(ManualClock::new(0)),
    )
}

fn rel_name(writer: usize, i: u64) -> String {
    format!("t{writer}_{i}")
}

/// Writers publish how many relations they have marked; readers check the latest
/// published one (and a random earlier one) is hot, while a sweeper runs.
fn run_distinct(map: &RecencyMap, allow_overflow: bool) {
    let published: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
    let writers_done = AtomicBool::new(false);
    thread::scope(|s| {
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let published = &published;
            writers.push(s.spawn(move || {
                for i in 0..PER_WRITER {
                    let name = rel_name(w, i);
                    let schema = if i % 2 == 0 { Some("app") } else { None };
                    map.mark(
                        "db",
                        &[
                            RelKey {
                                schema,
                                name: &name,
                            },
                            RelKey::unqualified("shared"),
                        ],
                        Some(Lsn(i + 1)),
                    );
                    // The writer's own next lookup must see it.
                    assert!(map.lookup("db", &[RelKey::unqualified(&name)]).is_hot());
                    published[w].store(i + 1, Ordering::Release);
                }
            }));
        }
        for r in 0..READERS {
            let published = &published;
            let writers_done = &writers_done;
            s.spawn(move || {
                let mut seen = 0u64;
                let mut round = r as u64;
                loop {
                    let done = writers_done.load(Ordering::Acquire);
                    for (w, p) in published.iter().enumerate() {
                        let n = p.load(Ordering::Acquire);
                        if n == 0 {
                            continue;
                        }
                        for i in [n - 1, round % n] {
                            let name = rel_name(w, i);
                            let read = if i % 2 == 0 {
                                RelKey::qualified("app", &name)
                            } else {
                                RelKey::qualified("other", &name)
                            };
                            let answer = map.lookup("db", &[read]);
                            assert!(answer.is_hot(), "lost mark {name}: {answer:?}");
                            if !allow_overflow {
                                assert_eq!(answer.required_lsn(), Some(Lsn(i + 1)));
                            }
                            seen += 1;
                        }
                        round = round.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    if done {
                        break;
                    }
                }
                assert!(seen > 0);
            });
        }
        s.spawn(|| {
            while !writers_done.load(Ordering::Acquire) {
                map.sweep(64);
            }
        });
        for h in writers {
            h.join().unwrap();
        }
        writers_done.store(true, Ordering::Release);
    });
}

#[test]
fn concurrent_marks_and_lookups_lose_nothing() {
    let map = map(1_000_000);
    run_distinct(&map, false);
    let total = WRITERS as u64 * PER_WRITER;
    assert_eq!(map.len() as u64, total + 1, "every relation plus `shared`");
    let stats = map.stats();
    assert_eq!(stats.marks, total * 2);
    assert_eq!(stats.overflows, 0);
    assert_eq!(
        stats.expirations, 0,
        "nothing expires while the clock stands still"
    );
    let shared = map.hot_relations(None, usize::MAX);
    let shared = shared.iter().find(|e| e.relation == "shared").unwrap();
    assert_eq!(shared.writes, total);
    assert_eq!(shared.lsn, Some(Lsn(PER_WRITER)));
}

#[test]
fn concurrent_marks_past_the_cap_still_read_hot() {
    let map = map(500);
    run_distinct(&map, true);
    assert!(map.len() <= 500);
    assert!(map.stats().overflows > 0);
}

/// Many writers raise the LSN of one relation; a reader never sees a required
/// position below one a writer had already recorded.
#[test]
fn shared_relation_lsn_never_goes_backwards() {
    let map = map(1_000);
    let next = AtomicU64::new(1);
    let latest: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicBool::new(false);
    thread::scope(|s| {
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (map, next, latest) = (&map, &next, &latest);
            writers.push(s.spawn(move || {
                for _ in 0..PER_WRITER {
                    let lsn = next.fetch_add(1, Ordering::AcqRel);
                    map.mark("db", &[RelKey::qualified("app", "orders")], Some(Lsn(lsn)));
                    latest[w].store(lsn, Ordering::Release);
                }
            }));
        }
        for _ in 0..READERS {
            let (map, latest, done) = (&map, &latest, &done);
            s.spawn(move || loop {
                let finished = done.load(Ordering::Acquire);
                let floor = latest
                    .iter()
                    .map(|l| l.load(Ordering::Acquire))
                    .max()
                    .unwrap();
                let answer = map.lookup("db", &[RelKey::unqualified("orders")]);
                if floor > 0 {
                    let got = answer.required_lsn().expect("hot with a known LSN");
                    assert!(got.0 >= floor, "required {got} below recorded {floor}");
                }
                if finished {
                    break;
                }
            });
        }
        for h in writers {
            h.join().unwrap();
        }
        done.store(true, Ordering::Release);
    });
    assert_eq!(
        map.lookup("db", &[RelKey::unqualified("orders")])
            .required_lsn(),
        Some(Lsn(WRITERS as u64 * PER_WRITER))
    );
}
