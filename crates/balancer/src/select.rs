//! Choosing a replica among eligible candidates, free of I/O.

use rand::Rng;

use crate::settings::{LoadBalance, NodeId};

/// An eligible replica as selection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The node.
    pub node: NodeId,
    /// Its configured weight; 0 is never chosen.
    pub weight: u32,
    /// Requests currently holding a selection of it.
    pub outstanding: u64,
    /// Bytes behind the primary, when known.
    pub lag_bytes: Option<u64>,
    /// Milliseconds behind, when known.
    pub lag_ms: Option<u64>,
}

/// Picks one candidate.
///
/// With `prefer_lower_delay`, only the candidates with the lowest lag (bytes, then time;
/// unknown counts as highest) compete. `Random` then draws with probability proportional
/// to weight; `LeastOutstanding` takes the lowest `outstanding / weight`, drawing at random
/// among ties.
pub fn pick<R: Rng + ?Sized>(
    candidates: &[Candidate],
    policy: LoadBalance,
    prefer_lower_delay: bool,
    rng: &mut R,
) -> Option<NodeId> {
    let lag_key = |c: &Candidate| {
        (
            c.lag_bytes.unwrap_or(u64::MAX),
            c.lag_ms.unwrap_or(u64::MAX),
        )
    };
    let best_lag = if prefer_lower_delay {
        candidates
            .iter()
            .filter(|c| c.weight > 0)
            .map(lag_key)
            .min()
    } else {
        None
    };
    let pool = candidates
        .iter()
        .filter(|c| c.weight > 0)
        .filter(|c| best_lag.is_none_or(|best| lag_key(c) == best));
    match policy {
        LoadBalance::Random => weighted(pool, rng),
        LoadBalance::LeastOutstanding => {
            let mut best: Vec<&Candidate> = Vec::new();
            for c in pool {
                match best.first() {
                    None => best.push(c),
                    Some(b) => {
                        // c.out / c.w compared with b.out / b.w without division.
                        let lhs = u128::from(c.outstanding) * u128::from(b.weight);
                        let rhs = u128::from(b.outstanding) * u128::from(c.weight);
                        if lhs < rhs {
                            best.clear();
                            best.push(c);
                        } else if lhs == rhs {
                            best.push(c);
                        }
                    }
                }
            }
            weighted(best.into_iter(), rng)
        }
    }
}

fn weighted<'a, R: Rng + ?Sized>(
    pool: impl Iterator<Item = &'a Candidate> + Clone,
    rng: &mut R,
) -> Option<NodeId> {
    let total: u64 = pool.clone().map(|c| u64::from(c.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut r = rng.random_range(0..total);
    for c in pool {
        let w = u64::from(c.weight);
        if r < w {
            return Some(c.node);
        }
        r -= w;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn cand(node: NodeId, weight: u32) -> Candidate {
        Candidate {
            node,
            weight,
            outstanding: 0,
            lag_bytes: Some(0),
            lag_ms: Some(0),
        }
    }

    fn counts(cands: &[Candidate], policy: LoadBalance, prefer: bool, draws: usize) -> Vec<usize> {
        let mut rng = StdRng::seed_from_u64(0x5eed);
        let n = cands.iter().map(|c| c.node).max().map_or(0, |m| m + 1);
        let mut counts = vec![0; n];
        for _ in 0..draws {
            counts[pick(cands, policy, prefer, &mut rng).unwrap()] += 1;
        }
        counts
    }

    #[test]
    fn weighted_random_follows_weights() {
        // Weights 1:3:6 over 100 000 draws: expected 10k/30k/60k. A ±5% (of the total)
        // band is dozens of standard deviations wide, so it cannot flake.
        let c = counts(
            &[cand(0, 1), cand(1, 3), cand(2, 6)],
            LoadBalance::Random,
            false,
            100_000,
        );
        for (got, want) in c.iter().zip([10_000, 30_000, 60_000]) {
            assert!((*got as i64 - want).abs() < 5_000, "{c:?}");
        }
    }

    #[test]
    fn zero_weight_never_chosen() {
        let c = counts(
            &[cand(0, 0), cand(1, 1), cand(2, 1)],
            LoadBalance::Random,
            false,
            10_000,
        );
        assert_eq!(c[0], 0);
        assert!(c[1] > 4_000 && c[2] > 4_000, "{c:?}");
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            pick(&[cand(0, 0)], LoadBalance::Random, false, &mut rng),
            None
        );
        assert_eq!(
            pick(&[], LoadBalance::LeastOutstanding, true, &mut rng),
            None
        );
    }

    #[test]
    fn least_outstanding_relative_to_weight() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut a = cand(0, 1);
        let mut b = cand(1, 2);
        a.outstanding = 2;
        b.outstanding = 3; // 3/2 < 2/1
        assert_eq!(
            pick(&[a, b], LoadBalance::LeastOutstanding, false, &mut rng),
            Some(1)
        );
        b.outstanding = 5; // 5/2 > 2/1
        assert_eq!(
            pick(&[a, b], LoadBalance::LeastOutstanding, false, &mut rng),
            Some(0)
        );
        // Ties are spread at random, by weight.
        a.outstanding = 0;
        b.outstanding = 0;
        let c = counts(&[a, b], LoadBalance::LeastOutstanding, false, 30_000);
        assert!((c[0] as i64 - 10_000).abs() < 2_000, "{c:?}");
    }

    #[test]
    fn prefer_lower_delay_restricts_to_least_lagged() {
        let mut lagged = cand(0, 100);
        lagged.lag_bytes = Some(4096);
        let mut unknown = cand(1, 100);
        unknown.lag_bytes = None;
        let fresh = cand(2, 1);
        let c = counts(&[lagged, unknown, fresh], LoadBalance::Random, true, 1_000);
        assert_eq!(c, vec![0, 0, 1_000]);
        // Without the preference the heavy, lagged nodes take most reads.
        let c = counts(&[lagged, unknown, fresh], LoadBalance::Random, false, 1_000);
        assert!(c[2] < 100, "{c:?}");
        // Equal byte lag: time lag decides.
        let mut slow = cand(0, 1);
        slow.lag_ms = Some(50);
        let c = counts(
            &[slow, cand(1, 1)],
            LoadBalance::LeastOutstanding,
            true,
            100,
        );
        assert_eq!(c, vec![0, 100]);
    }
}
