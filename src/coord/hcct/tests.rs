//! Unit tests of `coord::hcct` (moved unchanged from its inline `mod tests`).
//! Owns: the module's unit tests and their fixtures.
//! Must not: hold code the module itself uses.

use super::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

fn gram(grads: &[Vec<f32>]) -> Gram {
    let v: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
    Gram::from_gradients(&v).unwrap()
}

fn run(grads: &[Vec<f32>], sizes: &[usize], alpha: f64) -> Partition {
    partition(
        &gram(grads),
        sizes,
        &PartitionConfig {
            alpha: Alpha::Constant(alpha),
            stop: Stop::PositiveBenefit,
        },
    )
    .unwrap()
}

fn e(i: usize, dim: usize) -> Vec<f32> {
    let mut v = vec![0.0; dim];
    v[i] = 1.0;
    v
}

fn random_grads(n: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..dim).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect())
        .collect()
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

/// B of two current groups from singleton utilities (the first pass).
fn first_pass_benefit(grads: &[Vec<f32>], sizes: &[usize], alpha: f64, a: usize, b: usize) -> f64 {
    let g = gram(grads);
    let al = Alpha::Constant(alpha);
    let u: Vec<f64> = (0..sizes.len())
        .map(|i| client_utilities(&g, sizes, al, &[i])[0])
        .collect();
    merge_benefit(&g, sizes, al, &u, &[a], &[b])
}

// ---- spec §4 hand-checked test vectors ---------------------------------------------------

#[test]
fn orthogonal_pair_merges_only_above_alpha_star() {
    let g = [e(0, 2), e(1, 2)];
    // Benefit = α/100 + (√2 − 2); threshold α* = 58.58.
    let b = first_pass_benefit(&g, &[100, 100], 50.0, 0, 1);
    assert!(close(b, 0.5 + (2f64.sqrt() - 2.0), 1e-12), "{b}");
    assert_eq!(run(&g, &[100, 100], 50.0).groups, vec![vec![0], vec![1]]);
    assert_eq!(run(&g, &[100, 100], 58.5).groups, vec![vec![0], vec![1]]);
    assert_eq!(run(&g, &[100, 100], 58.6).groups, vec![vec![0, 1]]);
    assert_eq!(run(&g, &[100, 100], 60.0).groups, vec![vec![0, 1]]);
}

#[test]
fn opposite_pair_has_a_zero_mean_and_cosine_zero() {
    let g = [e(0, 2), e(0, 2).iter().map(|x| -x).collect()];
    // ĝ = 0 so cos = 0; benefit = α/100 − 2.
    let b = first_pass_benefit(&g, &[100, 100], 150.0, 0, 1);
    assert!(close(b, 1.5 - 2.0, 1e-12), "{b}");
    assert_eq!(run(&g, &[100, 100], 150.0).groups, vec![vec![0], vec![1]]);
    let b = first_pass_benefit(&g, &[100, 100], 250.0, 0, 1);
    assert!(close(b, 0.5, 1e-12), "{b}");
    assert_eq!(run(&g, &[100, 100], 250.0).groups, vec![vec![0, 1]]);
}

#[test]
fn motivating_example_alpha_10_groups_the_first_two_clients() {
    // Table 2: clients 1 and 2 share five classes (20% / 80%), client 3 has the rest.
    let g = [e(0, 2), e(0, 2), e(1, 2)];
    let d = [20, 80, 100];
    assert!(close(first_pass_benefit(&g, &d, 10.0, 0, 1), 0.425, 1e-12));
    assert!(close(first_pass_benefit(&g, &d, 10.0, 0, 2), -0.390, 5e-4));
    assert!(close(first_pass_benefit(&g, &d, 10.0, 1, 2), -0.4805, 5e-5));
    let p = run(&g, &d, 10.0);
    assert_eq!(p.groups, vec![vec![0, 1], vec![2]]);
    assert_eq!(p.merges.len(), 1);
    assert_eq!((p.merges[0].kept, p.merges[0].absorbed), (0, 1));
    assert!(close(p.merges[0].benefit, 0.425, 1e-12));
    // Then B({0,1}, 2) = −0.7287: stop.
    let gm = gram(&g);
    let b = merge_benefit(&gm, &d, Alpha::Constant(10.0), &p.utilities, &[0, 1], &[2]);
    assert!(close(b, -0.7287, 5e-5), "{b}");
}

#[test]
fn motivating_example_alpha_100_ends_in_one_group() {
    let g = [e(0, 2), e(0, 2), e(1, 2)];
    let d = [20, 80, 100];
    assert!(close(first_pass_benefit(&g, &d, 100.0, 0, 1), 4.25, 1e-12));
    assert!(close(first_pass_benefit(&g, &d, 100.0, 0, 2), 3.51, 5e-3));
    assert!(close(first_pass_benefit(&g, &d, 100.0, 1, 2), 0.5445, 5e-5));
    let p = run(&g, &d, 100.0);
    assert_eq!(p.groups, vec![vec![0, 1, 2]]);
    assert_eq!((p.merges[0].kept, p.merges[0].absorbed), (0, 1));
    assert!(close(p.merges[1].benefit, 0.6213, 5e-5), "{:?}", p.merges);
}

#[test]
fn alpha_zero_keeps_every_client_alone() {
    for seed in 0..5 {
        let g = random_grads(6, 8, seed);
        assert_eq!(run(&g, &[50; 6], 0.0).len(), 6);
    }
    // Even exactly parallel gradients: B = 0 is not a strict gain (§4 item 1).
    let g = vec![e(0, 3); 4];
    assert_eq!(run(&g, &[10, 20, 30, 40], 0.0).len(), 4);
}

#[test]
fn identical_gradients_give_one_group_for_any_positive_alpha() {
    let g = vec![e(0, 2); 5];
    let p = run(&g, &[10, 20, 30, 40, 50], 1e-6);
    assert_eq!(p.groups, vec![vec![0, 1, 2, 3, 4]]);
    // Same direction, different lengths (identical up to positive scale, §4 item 3).
    let g: Vec<Vec<f32>> = (1..=4)
        .map(|k| vec![k as f32, 2.0 * k as f32, -(k as f32)])
        .collect();
    assert_eq!(run(&g, &[7, 3, 11, 5], 1e-3).len(), 1);
}

#[test]
fn alpha_above_the_bound_forces_one_group() {
    // α > 2·D_tot²/D_min (§4 item 4): D = 10..50, D_tot = 150, D_min = 10.
    let alpha = 2.0 * 150.0 * 150.0 / 10.0 + 1.0;
    for seed in 0..5 {
        let g = random_grads(5, 6, seed);
        assert_eq!(
            run(&g, &[10, 20, 30, 40, 50], alpha).len(),
            1,
            "seed {seed}"
        );
    }
}

#[test]
fn independent_training_iff_no_first_pass_pair_gains() {
    // §4 item 2: K = N exactly when every first-pass benefit is ≤ 0.
    for seed in 0..20 {
        let g = random_grads(5, 4, 100 + seed);
        let d = [30, 60, 90, 45, 75];
        let alpha = 10.0 + 5.0 * seed as f64;
        let any = (0..5).any(|i| (0..i).any(|j| first_pass_benefit(&g, &d, alpha, j, i) > 0.0));
        assert_eq!(run(&g, &d, alpha).len() == 5, !any, "seed {seed}");
    }
}

#[test]
fn client_size_alpha_merges_iff_similarity_loss_is_below_one() {
    // §4 item 5: every merge gains exactly +1 in the size term.
    let al = Alpha::ClientSize;
    let cfg = PartitionConfig {
        alpha: al,
        stop: Stop::PositiveBenefit,
    };
    // Orthogonal, sizes 100 and 300: similarity change = 1/√10 + 3/√10 − 2 = −0.735.
    let g = [e(0, 2), e(1, 2)];
    let gm = gram(&g);
    let u: Vec<f64> = (0..2)
        .map(|i| client_utilities(&gm, &[100, 300], al, &[i])[0])
        .collect();
    let b = merge_benefit(&gm, &[100, 300], al, &u, &[0], &[1]);
    assert!(close(b, 1.0 + 4.0 / 10f64.sqrt() - 2.0, 1e-12), "{b}");
    assert_eq!(partition(&gm, &[100, 300], &cfg).unwrap().len(), 1);
    // Opposite with equal sizes: change −2, no merge.
    let g = [e(0, 2), e(0, 2).iter().map(|x| -x).collect()];
    assert_eq!(partition(&gram(&g), &[100, 100], &cfg).unwrap().len(), 2);
}

// ---- the Gram shortcut equals the direct computation (§2.4) ----------------------------

/// U_i straight from eq. 9: build ĝ explicitly, then the cosines.
fn direct_utilities(grads: &[Vec<f32>], sizes: &[usize], alpha: f64, group: &[usize]) -> Vec<f64> {
    let total: f64 = group.iter().map(|&j| sizes[j] as f64).sum();
    if group.len() == 1 {
        return vec![-alpha / total + 1.0];
    }
    let dim = grads[0].len();
    let mut mean = vec![0f64; dim];
    for &j in group {
        for (m, &x) in mean.iter_mut().zip(&grads[j]) {
            *m += sizes[j] as f64 / total * f64::from(x);
        }
    }
    let nm: f64 = mean.iter().map(|x| x * x).sum::<f64>().sqrt();
    group
        .iter()
        .map(|&i| {
            let gi: Vec<f64> = grads[i].iter().map(|&x| f64::from(x)).collect();
            let ni: f64 = gi.iter().map(|x| x * x).sum::<f64>().sqrt();
            let c = if ni == 0.0 || nm < 1e-9 {
                0.0
            } else {
                gi.iter().zip(&mean).map(|(a, b)| a * b).sum::<f64>() / (ni * nm)
            };
            -alpha / total + c
        })
        .collect()
}

#[test]
fn gram_path_equals_direct_path() {
    let mut rng = StdRng::seed_from_u64(9);
    for seed in 0..10 {
        let n = 7;
        let g = random_grads(n, 300, seed);
        let d: Vec<usize> = (0..n).map(|_| rng.random_range(5..200)).collect();
        let gm = gram(&g);
        for mask in 1u32..(1 << n) {
            let group: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            let a = client_utilities(&gm, &d, Alpha::Constant(3.0), &group);
            let b = direct_utilities(&g, &d, 3.0, &group);
            for (x, y) in a.iter().zip(&b) {
                assert!(close(*x, *y, 1e-9), "{group:?}: {x} vs {y}");
            }
        }
    }
}

#[test]
fn gram_from_rows_round_trips_and_rejects_bad_rows() {
    let g = random_grads(4, 10, 3);
    let gm = gram(&g);
    let rows: Vec<Vec<f64>> = (0..4)
        .map(|i| (0..4).map(|j| gm.get(i, j)).collect())
        .collect();
    assert_eq!(Gram::from_rows(&rows).unwrap(), gm);
    let mut bad = rows.clone();
    bad[1][2] += 1.0;
    assert!(matches!(
        Gram::from_rows(&bad),
        Err(HcctError::Asymmetric { .. })
    ));
    let mut bad = rows.clone();
    bad[2].pop();
    assert!(matches!(
        Gram::from_rows(&bad),
        Err(HcctError::Length { client: 2, .. })
    ));
    let mut bad = rows;
    bad[0][0] = f64::NAN;
    assert!(matches!(
        Gram::from_rows(&bad),
        Err(HcctError::NonFinite { client: 0 })
    ));
}

// ---- properties ---------------------------------------------------------------------------

#[test]
fn result_is_a_partition_and_total_utility_rises_with_every_merge() {
    let mut rng = StdRng::seed_from_u64(1);
    for seed in 0..30 {
        let n = rng.random_range(1..12);
        // Four latent directions plus noise, so there is something to find.
        let base = random_grads(4, 20, 1000 + seed);
        let g: Vec<Vec<f32>> = (0..n)
            .map(|i| {
                base[i % 4]
                    .iter()
                    .map(|&x| x + 0.3 * (rng.random::<f32>() - 0.5))
                    .collect()
            })
            .collect();
        let d: Vec<usize> = (0..n).map(|_| rng.random_range(10..300)).collect();
        let alpha = rng.random_range(0.0..200.0);
        let p = run(&g, &d, alpha);
        let mut seen: Vec<usize> = p.groups.concat();
        seen.sort();
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
        assert!(
            p.groups
                .iter()
                .all(|g| !g.is_empty() && g.windows(2).all(|w| w[0] < w[1]))
        );
        assert!(
            p.groups.windows(2).all(|w| w[0][0] < w[1][0]),
            "ordered by key"
        );
        assert!(p.merges.len() < n.max(1));
        assert_eq!(p.len() + p.merges.len(), n);
        let mut total: f64 = (0..n).map(|i| -alpha / d[i] as f64 + 1.0).sum();
        for m in &p.merges {
            assert!(m.benefit > 0.0);
            assert!(m.total_utility > total, "{} !> {total}", m.total_utility);
            assert!(close(m.total_utility - total, m.benefit, 1e-9));
            total = m.total_utility;
        }
        assert!(close(p.total_utility(), total, 1e-12));
        let of = p.group_of();
        for (k, g) in p.groups.iter().enumerate() {
            assert!(g.iter().all(|&i| of[i] == k));
        }
    }
}

#[test]
fn ties_go_to_the_smallest_keys() {
    // Pairs (0, 1) and (2, 3) tie exactly at the first pass (identical Gram entries), and
    // beat the cross pairs: (c_i = 1, c_j = 0) is scanned first and wins. Then {2, 3}.
    let g = [e(0, 2), e(0, 2), e(1, 2), e(1, 2)];
    let p = run(&g, &[10; 4], 1.0);
    let order: Vec<(usize, usize)> = p.merges.iter().map(|m| (m.kept, m.absorbed)).collect();
    assert_eq!(order, vec![(0, 1), (2, 3)]);
    assert_eq!(p.groups, vec![vec![0, 1], vec![2, 3]]);
    // Three orthogonal equal clients with α/D above 2 − √2: all pairs tie, (0, 1) first,
    // and the smaller key absorbs the other.
    let g = [e(0, 3), e(1, 3), e(2, 3)];
    let p = run(&g, &[100; 3], 60.0);
    assert_eq!((p.merges[0].kept, p.merges[0].absorbed), (0, 1));
    assert_eq!(p, run(&g, &[100; 3], 60.0), "deterministic");
    // Identical clients: the first of the tied pairs, then everything.
    let p = run(&vec![e(0, 2); 4], &[10; 4], 1.0);
    assert_eq!((p.merges[0].kept, p.merges[0].absorbed), (0, 1));
    assert_eq!(p.len(), 1);
}

#[test]
fn permuting_clients_relabels_the_partition() {
    let mut rng = StdRng::seed_from_u64(5);
    for seed in 0..10 {
        let n = 8;
        let base = random_grads(3, 16, 50 + seed);
        let g: Vec<Vec<f32>> = (0..n)
            .map(|i| {
                base[i % 3]
                    .iter()
                    .map(|&x| x + 0.2 * rng.random::<f32>())
                    .collect()
            })
            .collect();
        let d: Vec<usize> = (0..n).map(|_| rng.random_range(20..100)).collect();
        let p = run(&g, &d, 20.0);
        let mut perm: Vec<usize> = (0..n).collect();
        perm.reverse();
        perm.swap(1, 5);
        // Client perm[k] of the original is client k of the permuted problem.
        let gp: Vec<Vec<f32>> = perm.iter().map(|&i| g[i].clone()).collect();
        let dp: Vec<usize> = perm.iter().map(|&i| d[i]).collect();
        let q = run(&gp, &dp, 20.0);
        let mut mapped: Vec<Vec<usize>> = q
            .groups
            .iter()
            .map(|grp| {
                let mut v: Vec<usize> = grp.iter().map(|&k| perm[k]).collect();
                v.sort();
                v
            })
            .collect();
        mapped.sort();
        assert_eq!(mapped, p.groups, "seed {seed}");
    }
}

// ---- edge cases --------------------------------------------------------------------------

#[test]
fn one_client_and_no_clients() {
    let p = run(&[vec![1.0, 2.0]], &[5], 1e9);
    assert_eq!(p.groups, vec![vec![0]]);
    assert!(p.merges.is_empty());
    assert!(close(p.utilities[0], -1e9 / 5.0 + 1.0, 1e-3));
    let p = partition(&gram(&[]), &[], &PartitionConfig::default()).unwrap();
    assert!(p.is_empty());
}

#[test]
fn zero_gradients_have_cosine_zero_and_singleton_utility_one() {
    let g = [vec![0.0; 3], vec![0.0; 3], e(1, 3)];
    let gm = gram(&g);
    assert_eq!(gm.cosines()[0], vec![0.0, 0.0, 0.0]);
    let al = Alpha::Constant(10.0);
    assert_eq!(client_utilities(&gm, &[10, 10, 10], al, &[0]), vec![0.0]);
    // Two zero gradients: ĝ = 0, both cosines 0: B = α/D − 2.
    let u: Vec<f64> = (0..3)
        .map(|i| client_utilities(&gm, &[10; 3], al, &[i])[0])
        .collect();
    let b = merge_benefit(&gm, &[10; 3], al, &u, &[0], &[1]);
    assert!(close(b, 1.0 - 2.0, 1e-12), "{b}");
    assert_eq!(run(&g, &[10; 3], 10.0).len(), 3);
    assert_eq!(run(&g, &[10; 3], 30.1).len(), 1);
}

#[test]
fn forced_group_count_merges_past_non_positive_benefits() {
    let g = random_grads(6, 5, 77);
    let d = [10, 20, 30, 40, 50, 60];
    for k in 1..=6 {
        let p = partition(
            &gram(&g),
            &d,
            &PartitionConfig {
                alpha: Alpha::Constant(0.0),
                stop: Stop::Groups(k),
            },
        )
        .unwrap();
        assert_eq!(p.len(), k);
    }
    let e = partition(
        &gram(&g),
        &d,
        &PartitionConfig {
            alpha: Alpha::Constant(0.0),
            stop: Stop::Groups(0),
        },
    );
    assert_eq!(e, Err(HcctError::Groups(0)));
}

#[test]
fn bad_inputs_are_errors_naming_the_client() {
    let cfg = PartitionConfig::default();
    assert_eq!(
        partition(&gram(&[e(0, 2), e(1, 2)]), &[3, 0], &cfg),
        Err(HcctError::Size { client: 1, size: 0 })
    );
    assert!(matches!(
        partition(&gram(&[e(0, 2), e(1, 2)]), &[3], &cfg),
        Err(HcctError::Count {
            expected: 2,
            got: 1,
            ..
        })
    ));
    assert_eq!(
        Gram::from_gradients(&[&[1.0, 2.0], &[1.0]]),
        Err(HcctError::Length {
            client: 1,
            expected: 2,
            got: 1
        })
    );
    assert_eq!(
        Gram::from_gradients(&[&[1.0, f32::NAN]]),
        Err(HcctError::NonFinite { client: 0 })
    );
    let cfg = PartitionConfig {
        alpha: Alpha::Constant(-1.0),
        stop: Stop::PositiveBenefit,
    };
    let e = partition(&gram(&[]), &[], &cfg).unwrap_err();
    assert_eq!(e, HcctError::Alpha(-1.0));
    assert!(
        e.to_string().contains("-1") && e.to_string().contains(">= 0"),
        "{e}"
    );
}

// ---- coordinator schedule ----------------------------------------------------------------

fn coordinator(sizes: Vec<usize>, alpha: f64, round0_global: bool, one_shot: bool) -> Coordinator {
    Coordinator::new(
        sizes,
        CoordinatorConfig {
            partition: PartitionConfig {
                alpha: Alpha::Constant(alpha),
                stop: Stop::PositiveBenefit,
            },
            round0_global,
            one_shot,
        },
    )
}

#[test]
fn round_zero_is_singletons_or_one_group() {
    let c = coordinator(vec![5, 6, 7], 1.0, false, false);
    assert_eq!(c.groups(), &[vec![0], vec![1], vec![2]]);
    assert_eq!(c.round(), 0);
    let c = coordinator(vec![5, 6, 7], 1.0, true, false);
    assert_eq!(c.groups(), &[vec![0, 1, 2]]);
}

#[test]
fn reports_of_round_t_partition_round_t_plus_one_from_scratch() {
    let mut c = coordinator(vec![20, 80, 100], 10.0, false, false);
    let (a, b) = (e(0, 2), e(1, 2));
    c.handle_reports(&[Some(&a), Some(&a), Some(&b)]).unwrap();
    assert_eq!((c.round(), c.groups()), (1, &[vec![0, 1], vec![2]][..]));
    // Next round the gradients disagree: the groups split again (no carry-over, §2.3).
    c.handle_reports(&[Some(&a), Some(&b), Some(&b)]).unwrap();
    assert_eq!(c.groups(), &[vec![0], vec![1, 2]]);
    assert_eq!(c.last_gram().unwrap().len(), 3);
}

#[test]
fn one_shot_keeps_the_first_partition() {
    let mut c = coordinator(vec![20, 80, 100], 10.0, false, true);
    let (a, b) = (e(0, 2), e(1, 2));
    c.handle_reports(&[Some(&a), Some(&a), Some(&b)]).unwrap();
    c.handle_reports(&[Some(&a), Some(&b), Some(&b)]).unwrap();
    assert_eq!(c.groups(), &[vec![0, 1], vec![2]]);
    assert_eq!(c.round(), 2);
}

#[test]
fn missing_reports_reuse_the_last_gradient_or_stay_alone() {
    let mut c = coordinator(vec![20, 80, 100, 50], 100.0, false, false);
    let (a, b) = (e(0, 2), e(1, 2));
    // Client 3 never reported: it stays a singleton however large α is.
    c.handle_reports(&[Some(&a), Some(&a), Some(&b), None])
        .unwrap();
    assert_eq!(c.groups(), &[vec![0, 1, 2], vec![3]]);
    assert_eq!(c.stale(), &[false; 4]);
    // Client 0 misses a report: its last gradient is reused and flagged stale.
    c.handle_reports(&[None, Some(&a), Some(&b), Some(&a)])
        .unwrap();
    assert_eq!(c.stale(), &[true, false, false, false]);
    assert_eq!(c.groups().len(), 1);
    assert!(c.handle_reports(&[None]).is_err());
    let mut c = coordinator(vec![3, 0], 1.0, false, true);
    assert_eq!(
        c.handle_reports(&[None, None]).unwrap_err(),
        HcctError::Size { client: 1, size: 0 }
    );
}

// ---- models, pseudo-gradients, schedule, HCCT-E ----------------------------------------

#[test]
fn group_average_weights_by_size_and_keeps_identical_models() {
    let avg = group_average(&[&[1.0, 0.0], &[0.0, 4.0]], &[1, 3]).unwrap();
    assert_eq!(avg, vec![0.25, 3.0]);
    let m: Vec<f32> = random_grads(1, 1000, 4).remove(0);
    let same = group_average(&[&m, &m, &m], &[7, 13, 101]).unwrap();
    assert_eq!(same, m, "identical members keep their model bit for bit");
    assert_eq!(group_average(&[&m], &[3]).unwrap(), m);
    assert!(group_average(&[&m, &m[1..]], &[1, 1]).is_err());
    assert!(group_average(&[&m], &[0]).is_err());
}

#[test]
fn pseudo_gradient_undoes_an_sgd_step() {
    let start = [1.0f32, -2.0, 0.5];
    let grad = [0.5f32, 1.0, -4.0];
    let lr = 0.1f32;
    let end: Vec<f32> = start.iter().zip(&grad).map(|(s, g)| s - lr * g).collect();
    let g = pseudo_gradient(&start, &end, f64::from(lr));
    for (a, b) in g.iter().zip(&grad) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn learning_rate_decays_from_round_zero() {
    let c = HcctConfig::default();
    assert_eq!(c.sgd_lr(0), 0.1);
    assert!(close(c.sgd_lr(2), 0.1 * 0.995 * 0.995, 1e-15));
}

#[test]
fn layer_scores_pool_entries_and_keep_the_sign() {
    // Layer 0: one tensor, entries {1, 3} and {1, 3}: mean 2, unbiased var 4/3, score 2/3.
    // Layer 1: entries {−1, −3}: negative mean, negative score, never chosen.
    // Layer 2: zero mean: guarded to 0.
    let g0 = [1.0f32, 3.0, -1.0, -3.0, 1.0, -1.0];
    let g1 = [1.0f32, 3.0, -1.0, -3.0, -1.0, 1.0];
    let layers = vec![vec![0..2], vec![2..4], vec![4..5, 5..6]];
    let s = layer_scores(&[&g0, &g1], &layers).unwrap();
    assert!(close(s[0], (4.0 / 3.0) / 2.0, 1e-12), "{s:?}");
    assert!(s[1] < 0.0);
    assert_eq!(s[2], 0.0);
    assert_eq!(select_layer(&[&g0, &g1], &layers).unwrap(), Some(0));
    assert_eq!(select_layer(&[&g0, &g1], &[]).unwrap(), None);
    assert!(layer_scores(&[&g0], &[vec![4..6, 4..9]]).is_err());
}

#[test]
fn config_defaults_are_the_specs_and_bad_values_are_named() {
    let c = HcctConfig::default();
    assert_eq!(c.alpha, Alpha::Constant(1.0));
    assert_eq!((c.epochs, c.lr, c.lr_decay), (1, 0.1, 0.995));
    assert_eq!(c.optimizer, Optimizer::Sgd);
    assert!(!c.round0_global && !c.one_shot && c.groups.is_none());
    assert_eq!(c.partition_config().stop, Stop::PositiveBenefit);
    for (bad, needle) in [
        (
            HcctConfig {
                epochs: 0,
                ..c.clone()
            },
            "epochs must be at least 1, got 0",
        ),
        (
            HcctConfig {
                lr: 0.0,
                ..c.clone()
            },
            "lr must be",
        ),
        (
            HcctConfig {
                lr_decay: 1.5,
                ..c.clone()
            },
            "lr_decay must be in (0, 1], got 1.5",
        ),
        (
            HcctConfig {
                groups: Some(0),
                ..c.clone()
            },
            "groups must be at least 1, got 0",
        ),
        (
            HcctConfig {
                alpha: Alpha::Constant(f64::INFINITY),
                ..c.clone()
            },
            "alpha must be",
        ),
    ] {
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
}

#[test]
fn the_size_cap_is_on_by_default_and_below_one_is_refused() {
    let c = HcctConfig::default();
    assert_eq!(c.size_cap, 2.0);
    assert_eq!(c.run_sizes(&[40, 50, 60, 1000]), [40, 50, 60, 100]);
    let off = HcctConfig {
        size_cap: 0.0,
        ..c.clone()
    };
    assert!(off.validate().is_ok());
    assert_eq!(off.run_sizes(&[40, 1000]), [40, 1000]);
    for bad in [0.5, f64::NAN, -1.0] {
        let e = HcctConfig {
            size_cap: bad,
            ..c.clone()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("size_cap must be 0 (off) or at least 1"), "{e}");
    }
}
