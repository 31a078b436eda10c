//! Cost of choosing a replica for one read, and of dating a replay position.
//!
//! `select::pick` is the whole decision behind `Balancer::select_replica` once the
//! candidate list is built from the current view (one lock-free view load, one atomic
//! load per eligible node, one atomic increment for the returned selection).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use pgfresh_balancer::lag::PositionHistory;
use pgfresh_balancer::select::{pick, Candidate};
use pgfresh_balancer::LoadBalance;
use pgfresh_lsn::Lsn;

/// `n` eligible replicas with mixed weights, load and lag.
fn candidates(n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            node: i + 1,
            weight: 1 + (i as u32 % 3),
            outstanding: (i as u64 * 7) % 5,
            lag_bytes: Some((i as u64 % 2) * 4096),
            lag_ms: Some(i as u64 % 2),
        })
        .collect()
}

fn select_replica(c: &mut Criterion) {
    let mut group = c.benchmark_group("select_replica");
    for n in [2usize, 8] {
        let cands = candidates(n);
        for (name, policy) in [
            ("random", LoadBalance::Random),
            ("least_outstanding", LoadBalance::LeastOutstanding),
        ] {
            for prefer in [false, true] {
                let id = if prefer {
                    format!("{name}+prefer_lower_delay")
                } else {
                    name.to_string()
                };
                group.bench_with_input(BenchmarkId::new(id, n), &cands, |b, cands| {
                    let mut rng = rand::rng();
                    b.iter(|| pick(black_box(cands), policy, prefer, &mut rng))
                });
            }
        }
    }
    group.finish();
}

fn time_behind(c: &mut Criterion) {
    // A full history: 60 s of a primary polled every 10 ms while it writes.
    let t0 = Instant::now();
    let mut h = PositionHistory::default();
    for i in 0..6_000u32 {
        h.observe(
            Lsn(0x100_0000 + u64::from(i) * 512),
            t0 + Duration::from_millis(10) * i,
        );
    }
    let now = t0 + Duration::from_secs(60);
    let replay = Lsn(0x100_0000 + 3_000 * 512 + 100);
    c.bench_function("lag/time_behind/6000_entries", |b| {
        b.iter(|| h.time_behind(black_box(replay), now))
    });
}

criterion_group!(benches, select_replica, time_behind);
criterion_main!(benches);
