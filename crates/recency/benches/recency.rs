//! Recency map benchmarks: 3-relation mark and lookup at 10, 10k and 1M live
//! entries, contended from 2, 8 and 32 threads, and sweeping 1M expired entries.
//! Also prints the resident memory per entry, measured on 1M entries.
//!
//! Run: `cargo bench -p pgfresh-recency --bench recency -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode};
use pgfresh_recency::{Clock, Lsn, ManualClock, RecencyConfig, RecencyMap, RelKey, SystemClock};

const SIZES: [usize; 3] = [10, 10_000, 1_000_000];

fn config() -> RecencyConfig {
    RecencyConfig {
        ttl_ms: 60_000,
        max_ttl_ms: 60_000,
        cold_start_ms: 0,
        max_entries: 2_000_000,
        ..RecencyConfig::default()
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("relation_{i}")).collect()
}

/// A map holding `live` entries named `relation_0..live` in database `app`.
fn populated(live: usize, clock: Arc<dyn Clock>, names: &[String]) -> RecencyMap {
    let map = RecencyMap::new(config(), clock);
    for (i, name) in names[..live].iter().enumerate() {
        map.mark(
            "app",
            &[RelKey::qualified("public", name)],
            Some(Lsn(i as u64 + 1)),
        );
    }
    map
}

fn three<'a>(names: &'a [String], i: usize) -> [RelKey<'a>; 3] {
    let n = names.len();
    [
        RelKey::unqualified(&names[i % n]),
        RelKey::qualified("public", &names[(i + 7) % n]),
        RelKey::unqualified(&names[(i + 13) % n]),
    ]
}

fn single_thread(c: &mut Criterion) {
    let all = names(2 * SIZES[2]);
    let mut group = c.benchmark_group("uncontended");
    for live in SIZES {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let map = populated(live, clock, &all);
        let hot = &all[..live];
        let cold = &all[SIZES[2]..];
        let mut i = 0usize;
        group.bench_with_input(BenchmarkId::new("lookup3_cold", live), &live, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(1);
                black_box(map.lookup("app", &three(cold, i)))
            })
        });
        group.bench_with_input(BenchmarkId::new("lookup3_hot", live), &live, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(1);
                black_box(map.lookup("app", &three(hot, i)))
            })
        });
        group.bench_with_input(BenchmarkId::new("mark3_existing", live), &live, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(1);
                map.mark("app", &three(hot, i), Some(Lsn(i as u64)));
            })
        });
    }
    group.finish();
}

/// Each iteration is one operation on every thread at once; the reported time is
/// the wall time per operation as each thread sees it.
fn contended(c: &mut Criterion) {
    let all = names(20_000);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let map = Arc::new(populated(10_000, clock, &all));
    let all = Arc::new(all);
    let mut group = c.benchmark_group("contended_10k_live");
    for threads in [2usize, 8, 32] {
        for (label, mark_every) in [("lookup3", 0usize), ("mixed_1mark_7lookups", 8)] {
            group.bench_with_input(BenchmarkId::new(label, threads), &threads, |b, &threads| {
                b.iter_custom(|iters| {
                    let barrier = Arc::new(Barrier::new(threads + 1));
                    let handles: Vec<_> = (0..threads)
                        .map(|t| {
                            let (map, all, barrier) = (map.clone(), all.clone(), barrier.clone());
                            thread::spawn(move || {
                                barrier.wait();
                                let start = Instant::now();
                                for k in 0..iters as usize {
                                    let i = k.wrapping_mul(31).wrapping_add(t * 1_013);
                                    let rels = three(&all, i);
                                    if mark_every != 0 && k % mark_every == 0 {
                                        map.mark("app", &rels[..], Some(Lsn(k as u64 + 1)));
                                    } else {
                                        black_box(map.lookup("app", &rels));
                                    }
                                }
                                start.elapsed()
                            })
                        })
                        .collect();
                    barrier.wait();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap())
                        .max()
                        .unwrap_or_default()
                });
            });
        }
    }
    group.finish();
}

fn sweep(c: &mut Criterion) {
    const N: usize = 1_000_000;
    let all = names(N);
    let mut group = c.benchmark_group("sweep");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.bench_function("sweep_1M_expired_batches_of_4096", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let clock = Arc::new(ManualClock::new(0));
                let map = populated(N, clock.clone(), &all);
                clock.advance(60_000);
                let start = Instant::now();
                while !map.sweep(4096).done {}
                total += start.elapsed();
                assert!(map.is_empty());
            }
            total
        })
    });
    group.finish();
}

/// Resident memory of the process, in bytes (Linux); `None` elsewhere.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn memory_per_entry(_c: &mut Criterion) {
    const N: usize = 1_000_000;
    let all = names(N);
    let before = rss_bytes();
    let map = populated(N, Arc::new(ManualClock::new(0)), &all);
    let after = rss_bytes();
    if let (Some(before), Some(after)) = (before, after) {
        eprintln!(
            "memory: {} entries, resident +{} bytes, {:.0} bytes/entry (names of ~14 bytes)",
            map.len(),
            after.saturating_sub(before),
            after.saturating_sub(before) as f64 / N as f64
        );
    }
}

criterion_group!(benches, memory_per_entry, single_thread, contended, sweep);
criterion_main!(benches);
