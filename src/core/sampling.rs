//! ε-greedy neighbour sampling (FedeRiCo spec §4).
//! Owns: picking M distinct peers from the previous round's weights.
//! Must not: change losses or weights (that is `table.rs`), or do I/O.

use crate::ids::NodeId;
use rand::Rng;
use rand::RngExt;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

/// How the ε coin is read (spec §4 and §9 item 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplingMode {
    /// One coin per slot, FedFomo style (the recommended reading).
    #[default]
    PerSlot,
    /// One coin for the whole round: all M slots explore, or all are greedy.
    PerRound,
}

/// Chooses `min(m, candidates.len())` distinct peers.
///
/// `candidates` are the peers that may be picked (the caller has already removed itself and
/// suspects) with their current weight. Greedy slots take the highest weight not yet chosen,
/// ties broken by a fresh random key; exploring slots take the next peer of a uniform random
/// permutation not yet chosen. Every call draws the tie keys, the permutation and one coin per
/// slot (or per round) from `rng`, in that order, whatever `epsilon` is, so the stream's use does
/// not depend on the values.
pub fn epsilon_greedy(
    candidates: &[(NodeId, f64)],
    m: usize,
    epsilon: f64,
    mode: SamplingMode,
    rng: &mut (impl Rng + ?Sized),
) -> Vec<NodeId> {
    let take = m.min(candidates.len());
    if take == 0 {
        return Vec::new();
    }
    let mut ranked: Vec<(NodeId, f64, u64)> = candidates
        .iter()
        .map(|&(id, w)| (id, w, rng.random::<u64>()))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
    let mut shuffled: Vec<NodeId> = candidates.iter().map(|c| c.0).collect();
    shuffled.shuffle(rng);

    let round_coin = rng.random::<f64>();
    let mut chosen = Vec::with_capacity(take);
    for _ in 0..take {
        let explore = match mode {
            SamplingMode::PerSlot => rng.random::<f64>() < epsilon,
            SamplingMode::PerRound => round_coin < epsilon,
        };
        let next = if explore {
            shuffled.iter().copied().find(|id| !chosen.contains(id))
        } else {
            ranked.iter().map(|r| r.0).find(|id| !chosen.contains(id))
        };
        chosen.push(next.expect("take <= candidates, so an unchosen candidate remains"));
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn cands(ws: &[f64]) -> Vec<(NodeId, f64)> {
        ws.iter()
            .enumerate()
            .map(|(i, &w)| (NodeId(i as u32 + 1), w))
            .collect()
    }

    #[test]
    fn epsilon_zero_is_pure_greedy() {
        let c = cands(&[0.1, 0.5, 0.05, 0.3, 0.05]);
        for seed in 0..50 {
            let mut rng = StdRng::seed_from_u64(seed);
            let got = epsilon_greedy(&c, 3, 0.0, SamplingMode::PerSlot, &mut rng);
            assert_eq!(got, vec![NodeId(2), NodeId(4), NodeId(1)]);
        }
    }

    #[test]
    fn greedy_ties_are_broken_at_random() {
        let c = cands(&[0.25; 4]);
        let mut firsts = std::collections::BTreeSet::new();
        for seed in 0..100 {
            let mut rng = StdRng::seed_from_u64(seed);
            firsts.insert(epsilon_greedy(&c, 1, 0.0, SamplingMode::PerSlot, &mut rng)[0]);
        }
        assert_eq!(firsts.len(), 4);
    }

    #[test]
    fn epsilon_one_is_uniform() {
        // One peer holds all the weight, but with ε = 1 it must be picked only ~1/5 of the time.
        let c = cands(&[1.0, 0.0, 0.0, 0.0, 0.0]);
        let mut counts = [0usize; 5];
        let trials = 20_000;
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..trials {
            let got = epsilon_greedy(&c, 1, 1.0, SamplingMode::PerSlot, &mut rng);
            counts[got[0].0 as usize - 1] += 1;
        }
        for &n in &counts {
            let p = n as f64 / trials as f64;
            assert!((p - 0.2).abs() < 0.015, "{counts:?}");
        }
    }

    #[test]
    fn never_duplicates_and_never_more_than_available() {
        let c = cands(&[0.4, 0.3, 0.2, 0.1]);
        let mut rng = StdRng::seed_from_u64(3);
        for mode in [SamplingMode::PerSlot, SamplingMode::PerRound] {
            for eps in [0.0, 0.3, 1.0] {
                for m in 0..7 {
                    let got = epsilon_greedy(&c, m, eps, mode, &mut rng);
                    assert_eq!(got.len(), m.min(4));
                    let mut d = got.clone();
                    d.sort();
                    d.dedup();
                    assert_eq!(d.len(), got.len(), "duplicate in {got:?}");
                    assert!(got.iter().all(|id| c.iter().any(|x| x.0 == *id)));
                }
            }
        }
    }

    #[test]
    fn per_slot_mixes_greedy_and_exploring_slots() {
        // With ε = 0.5 per slot, some rounds have the top peer plus a non-top random pick.
        let c = cands(&[0.9, 0.025, 0.025, 0.025, 0.025]);
        let mut rng = StdRng::seed_from_u64(11);
        let mut top_count = 0;
        for _ in 0..2000 {
            let got = epsilon_greedy(&c, 2, 0.5, SamplingMode::PerSlot, &mut rng);
            top_count += got.contains(&NodeId(1)) as usize;
        }
        // P(top in 2 slots) = 1 - P(both explore and miss top) ≈ 1 - 0.25 * (4/5 * 3/4) = 0.85
        let p = top_count as f64 / 2000.0;
        assert!((p - 0.85).abs() < 0.04, "{p}");
    }

    #[test]
    fn per_round_explores_all_slots_together() {
        let c = cands(&[0.9, 0.05, 0.03, 0.01, 0.01]);
        let mut rng = StdRng::seed_from_u64(5);
        let mut all_greedy = 0;
        for _ in 0..2000 {
            let got = epsilon_greedy(&c, 2, 0.3, SamplingMode::PerRound, &mut rng);
            all_greedy += (got == vec![NodeId(1), NodeId(2)]) as usize;
        }
        // greedy rounds (p = 0.7) always give [1, 2]; exploring rounds give it with p = 1/20
        let p = all_greedy as f64 / 2000.0;
        assert!((p - (0.7 + 0.3 / 20.0)).abs() < 0.04, "{p}");
    }

    #[test]
    fn same_seed_same_choice() {
        let c = cands(&[0.2, 0.2, 0.2, 0.2, 0.2]);
        let a = epsilon_greedy(
            &c,
            3,
            0.3,
            SamplingMode::PerSlot,
            &mut StdRng::seed_from_u64(9),
        );
        let b = epsilon_greedy(
            &c,
            3,
            0.3,
            SamplingMode::PerSlot,
            &mut StdRng::seed_from_u64(9),
        );
        assert_eq!(a, b);
    }
}
