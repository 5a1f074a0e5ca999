//! Unit tests of `coord::fedcollab` (moved unchanged from its inline `mod tests`).
//! Owns: the module's unit tests and their fixtures.
//! Must not: hold code the module itself uses.

#[test]
fn the_coalition_average_renormalises_over_the_models_that_arrived() {
    let (a, b) = ([1.0f32, 2.0], [3.0f32, 6.0]);
    assert_eq!(
        coalition_average(&[Some(&a[..]), Some(&b[..])], &[1, 3]),
        vec![2.5, 5.0]
    );
    assert_eq!(
        coalition_average(&[Some(&a[..]), None], &[1, 3]),
        vec![1.0, 2.0]
    );
    assert!(coalition_average(&[None, None], &[1, 3]).is_empty());
}
use super::solver::improves;
use super::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

fn toy_a() -> Problem {
    // Spec §2 "Toy A" (the unit test in the official `evaluate.py`).
    let d = vec![
        vec![0.0, 0.5, 1.0, 1.0],
        vec![0.5, 0.0, 1.0, 1.0],
        vec![1.0, 1.0, 0.0, 0.5],
        vec![1.0, 1.0, 0.5, 0.0],
    ];
    Problem::new(&[4, 6, 3, 7], &d, 1.0).unwrap()
}

fn toy_b(c: f64) -> Problem {
    // Spec §2 "Toy B": two types, mixed sizes.
    let d = vec![
        vec![0.0, 0.02, 0.03, 0.60, 0.62, 0.65],
        vec![0.02, 0.0, 0.01, 0.61, 0.60, 0.64],
        vec![0.03, 0.01, 0.0, 0.63, 0.66, 0.60],
        vec![0.60, 0.61, 0.63, 0.0, 0.05, 0.20],
        vec![0.62, 0.60, 0.66, 0.05, 0.0, 0.15],
        vec![0.65, 0.64, 0.60, 0.20, 0.15, 0.0],
    ];
    Problem::new(&[1000, 800, 50, 900, 40, 30], &d, c).unwrap()
}

/// Every set partition of `0..n` as label vectors (restricted growth strings).
fn all_partitions(n: usize) -> Vec<Vec<usize>> {
    fn rec(i: usize, n: usize, cur: &mut Vec<usize>, max: usize, out: &mut Vec<Vec<usize>>) {
        if i == n {
            out.push(cur.clone());
            return;
        }
        for l in 0..=max + 1 {
            if i == 0 && l > 0 {
                break;
            }
            cur.push(l);
            rec(i + 1, n, cur, if i == 0 { 0 } else { max.max(l) }, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    rec(0, n, &mut Vec::new(), 0, &mut out);
    out
}

fn brute_force(p: &Problem) -> (Vec<Vec<usize>>, f64) {
    let mut best: Option<(Vec<usize>, f64)> = None;
    for labels in all_partitions(p.len()) {
        let v = p.objective(&labels).unwrap();
        if best.as_ref().is_none_or(|(_, b)| v < *b) {
            best = Some((labels, v));
        }
    }
    let (labels, v) = best.unwrap();
    (coalitions_of(&labels), v)
}

#[test]
fn partitions_enumerator_counts_bell_numbers() {
    let counts: Vec<usize> = (1..=6).map(|n| all_partitions(n).len()).collect();
    assert_eq!(counts, vec![1, 2, 5, 15, 52, 203]);
}

#[test]
fn toy_a_costs_match_the_official_unit_test() {
    let p = toy_a();
    let costs = p.client_costs(&[0, 0, 1, 1]).unwrap();
    for (c, want) in costs
        .iter()
        .zip([0.616227766, 0.516227766, 0.666227766, 0.466227766])
    {
        assert!(close(*c, want, 1e-9), "{costs:?}");
    }
    let local = p.client_costs(&[0, 1, 2, 3]).unwrap();
    for (c, want) in local
        .iter()
        .zip([0.5, 0.408248290, 0.577350269, 0.377964473])
    {
        assert!(close(*c, want, 1e-9), "{local:?}");
    }
    for (labels, want) in [
        (vec![0, 0, 1, 1], 0.566227766),
        (vec![0, 1, 2, 3], 0.465890758),
        (vec![0, 0, 0, 0], 0.848606798),
        (vec![0, 1, 0, 1], 0.827657286),
        (vec![0, 0, 1, 2], 0.521942569),
    ] {
        let v = p.objective(&labels).unwrap();
        assert!(close(v, want, 1e-9), "{labels:?}: {v} vs {want}");
    }
}

#[test]
fn hand_checked_two_client_objective() {
    // m = [1, 3], d = 0.4, C = 2. Together: M = 4, C/√M = 1; client 0 pays 3/4·0.4 = 0.3,
    // client 1 pays 1/4·0.4 = 0.1, so L = (1.3 + 1.1)/2 = 1.2. Alone: (2/1 + 2/√3)/2.
    let p = Problem::new(&[1, 3], &[vec![0.0, 0.4], vec![0.4, 0.0]], 2.0).unwrap();
    assert!(close(p.objective(&[7, 7]).unwrap(), 1.2, 1e-15));
    let alone = (2.0 + 2.0 / 3f64.sqrt()) / 2.0;
    assert!(close(p.objective(&[0, 1]).unwrap(), alone, 1e-15));
    // The big client loses little by admitting the small one; the small one pays a lot.
    let c = p.client_costs(&[0, 0]).unwrap();
    assert!(c[0] > c[1]);
    // Algorithm 2 joins them (1.2 < 1.577).
    assert_eq!(p.greedy_identity(100).coalitions, vec![vec![0, 1]]);
}

#[test]
fn labels_are_ids_not_positions_and_empty_labels_cost_nothing() {
    let p = toy_a();
    let a = p.objective(&[0, 0, 1, 1]).unwrap();
    let b = p.objective(&[42, 42, 9, 9]).unwrap();
    assert_eq!(a, b);
    assert!(matches!(
        p.objective(&[0, 0]),
        Err(FedCollabError::Labels {
            expected: 4,
            got: 2
        })
    ));
}

#[test]
fn preparation_clamps_symmetrises_and_flags() {
    let d = vec![
        vec![0.3, -0.2, 1.4],
        vec![-0.2, 0.0, 0.5],
        vec![1.4, 0.7, 0.0],
    ];
    let p = Problem::new(&[1, 1, 1], &d, 1.0).unwrap();
    assert_eq!(
        p.distances(),
        &[
            vec![0.0, 0.0, 1.0],
            vec![0.0, 0.0, 0.6],
            vec![1.0, 0.6, 0.0]
        ]
    );
    assert_eq!(p.asymmetric_pairs(), &[(1, 2)]);
}

#[test]
fn invalid_inputs_name_the_value() {
    let d2 = vec![vec![0.0, 0.1], vec![0.1, 0.0]];
    let e = Problem::new(&[], &[], 1.0).unwrap_err();
    assert_eq!(e, FedCollabError::NoClients);
    let e = Problem::new(&[3, 0], &d2, 1.0).unwrap_err();
    assert!(e.to_string().contains("client 1 has size 0"), "{e}");
    let e = Problem::new(&[3, 2], &d2, -1.0).unwrap_err();
    assert!(e.to_string().contains(">= 0, got -1"), "{e}");
    let e = Problem::new(&[3, 2], &[vec![0.0, 0.1], vec![0.1]], 1.0).unwrap_err();
    assert!(e.to_string().contains("row 1 has 1 entries"), "{e}");
    let e = Problem::new(&[3, 2], &[vec![0.0, f64::NAN], vec![0.1, 0.0]], 1.0).unwrap_err();
    assert!(e.to_string().contains("d[0][1] = NaN"), "{e}");
    let p = Problem::new(&[3, 2], &d2, 1.0).unwrap();
    let cfg = SolverConfig {
        restarts: 0,
        max_passes: 1,
    };
    let e = p.solve(&cfg, &mut StdRng::seed_from_u64(0)).unwrap_err();
    assert!(e.to_string().contains("restarts must be at least 1"), "{e}");
    let e = labels_of(3, &[vec![0, 1], vec![1]]).unwrap_err();
    assert!(e.to_string().contains("client 1 is listed twice"), "{e}");
    let e = labels_of(3, &[vec![0, 1]]).unwrap_err();
    assert!(e.to_string().contains("client 2 is in no coalition"), "{e}");
}

#[test]
fn toy_a_optimum_is_local_found_in_one_pass() {
    let p = toy_a();
    let (best, v) = brute_force(&p);
    assert_eq!(best, vec![vec![0], vec![1], vec![2], vec![3]]);
    assert!(close(v, 0.465890758, 1e-9));
    let s = p.greedy_identity(100);
    assert_eq!(s.coalitions, best);
    assert_eq!(s.passes, 1);
    assert!(s.converged);
}

#[test]
fn toy_b_matches_the_specs_table() {
    let singletons: Vec<Vec<usize>> = (0..6).map(|i| vec![i]).collect();
    let two = vec![vec![0, 1, 2], vec![3, 4, 5]];
    // (C, brute-force optimum, L*, passes of the identity-order run when the spec gives them)
    type Case = (f64, Vec<Vec<usize>>, f64, Option<usize>);
    let cases: [Case; 4] = [
        (0.0, singletons, 0.0, None),
        (
            1.0,
            vec![vec![0], vec![1, 2], vec![3, 4], vec![5]],
            0.068004867,
            None,
        ),
        (1.5, two.clone(), 0.090203529, None),
        (2.0, two.clone(), 0.104042928, Some(2)),
    ];
    for (c, want, value, passes) in cases {
        let p = toy_b(c);
        let (bf, bv) = brute_force(&p);
        assert_eq!(bf, want, "brute force at C = {c}");
        assert!(close(bv, value, 1e-9), "C = {c}: {bv}");
        let s = p.greedy_identity(100);
        assert_eq!(s.coalitions, want, "Algorithm 2 at C = {c}");
        assert!(close(s.objective, value, 1e-9));
        if let Some(k) = passes {
            assert_eq!(s.passes, k, "passes at C = {c}");
        }
    }
    let s = toy_b(10.0).greedy_identity(100);
    assert_eq!(s.coalitions, two);
    assert!(close(s.objective, 0.325473298, 1e-9));
    assert_eq!(s.passes, 3);
}

#[test]
fn toy_b_at_c40_single_moves_miss_the_global_optimum() {
    let p = toy_b(40.0);
    let (bf, bv) = brute_force(&p);
    assert_eq!(bf, vec![(0..6).collect::<Vec<_>>()]);
    assert!(close(bv, 1.081370055, 1e-9));
    let s = p.greedy_identity(100);
    assert_eq!(s.coalitions, vec![vec![0, 1, 2], vec![3, 4, 5]]);
    assert!(close(s.objective, 1.155837189, 1e-9));
    // Restarts do not help: no single-client move leaves this local optimum.
    let cfg = SolverConfig {
        restarts: 20,
        max_passes: 100,
    };
    let sol = p.solve(&cfg, &mut StdRng::seed_from_u64(3)).unwrap();
    assert!(close(sol.best.objective, 1.155837189, 1e-9));
}

/// Algorithm 2 exactly as the spec's pseudocode writes it, with the full O(N²) objective:
/// the oracle for the incremental solver.
fn naive_greedy(p: &Problem, max_passes: usize, rng: &mut StdRng) -> (Vec<usize>, usize) {
    let n = p.len();
    let mut labels: Vec<usize> = (0..n).collect();
    let mut passes = 0;
    while passes < max_passes {
        passes += 1;
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(rng);
        let mut moved = false;
        for q in order {
            let mut best_label = labels[q];
            let mut best_val = p.objective(&labels).unwrap();
            for c in 0..n {
                labels[q] = c;
                let v = p.objective(&labels).unwrap();
                if improves(v, best_val) {
                    best_label = c;
                    best_val = v;
                    moved = true;
                }
            }
            labels[q] = best_label;
        }
        if !moved {
            break;
        }
    }
    (labels, passes)
}

fn random_problem(rng: &mut StdRng, n: usize) -> Problem {
    use rand::RngExt;
    let sizes: Vec<u64> = (0..n).map(|_| rng.random_range(1..500)).collect();
    let mut d = vec![vec![0.0; n]; n];
    let types: Vec<usize> = (0..n).map(|_| rng.random_range(0..3)).collect();
    for i in 0..n {
        for j in i + 1..n {
            let base = if types[i] == types[j] { 0.02 } else { 0.5 };
            let v = base + rng.random::<f64>() * 0.2 - 0.05;
            d[i][j] = v;
            d[j][i] = v;
        }
    }
    Problem::new(&sizes, &d, rng.random_range(0.0..15.0)).unwrap()
}

#[test]
fn incremental_solver_agrees_with_the_naive_oracle() {
    let mut maker = StdRng::seed_from_u64(11);
    for case in 0..40 {
        let n = 2 + case % 11;
        let p = random_problem(&mut maker, n);
        let mut r1 = StdRng::seed_from_u64(case as u64);
        let mut r2 = StdRng::seed_from_u64(case as u64);
        for _ in 0..3 {
            let fast = p.greedy(100, &mut r1);
            let (labels, passes) = naive_greedy(&p, 100, &mut r2);
            assert_eq!(fast.coalitions, coalitions_of(&labels), "case {case}");
            assert_eq!(fast.passes, passes, "case {case}");
            assert!(close(fast.objective, p.objective(&labels).unwrap(), 1e-12));
        }
    }
}

#[test]
fn zero_capacity_keeps_everyone_alone_and_zero_distances_go_global() {
    let mut maker = StdRng::seed_from_u64(5);
    for n in [1, 3, 8] {
        let p = random_problem(&mut maker, n).with_capacity(0.0).unwrap();
        let s = p.solve(&SolverConfig::default(), &mut maker).unwrap();
        assert_eq!(s.best.coalitions.len(), n);
        // Corollary 3.4(1): with every D = 0, global FL is each client's best.
        let zero = Problem::new(p.sizes(), &vec![vec![0.0; n]; n], 3.0).unwrap();
        let s = zero.solve(&SolverConfig::default(), &mut maker).unwrap();
        assert_eq!(s.best.coalitions, vec![(0..n).collect::<Vec<_>>()]);
    }
}

#[test]
fn own_best_coalition_has_no_client_beyond_the_corollary_threshold() {
    // Corollary 3.5 in objective units (spec §1): the coalition S ∋ i that minimises
    // client i's own cost contains no j with d_ij > C·√m / (2·m_i).
    let mut maker = StdRng::seed_from_u64(21);
    for _ in 0..60 {
        use rand::RngExt;
        let n = maker.random_range(2..=7);
        let p = random_problem(&mut maker, n)
            .with_capacity(maker.random_range(0.5..40.0))
            .unwrap();
        let m_total: u64 = p.sizes().iter().sum();
        for i in 0..n {
            let mut best: Option<(u32, f64)> = None;
            for mask in 0u32..(1 << n) {
                if mask & (1 << i) == 0 {
                    continue;
                }
                let labels: Vec<usize> =
                    (0..n).map(|j| usize::from(mask & (1 << j) == 0)).collect();
                let cost = p.client_costs(&labels).unwrap()[i];
                if best.is_none_or(|(_, b)| cost < b) {
                    best = Some((mask, cost));
                }
            }
            let (mask, _) = best.unwrap();
            let thr = p.capacity() * (m_total as f64).sqrt() / (2.0 * p.sizes()[i] as f64);
            for j in (0..n).filter(|&j| mask & (1 << j) != 0) {
                assert!(
                    p.distances()[i][j] <= thr,
                    "client {i}'s best coalition holds {j} at d = {} > {thr}",
                    p.distances()[i][j]
                );
            }
        }
    }
}

#[test]
fn solve_is_deterministic_for_a_seed_and_canonical() {
    let mut maker = StdRng::seed_from_u64(8);
    let p = random_problem(&mut maker, 12);
    let a = p
        .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(1))
        .unwrap();
    let b = p
        .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(1))
        .unwrap();
    assert_eq!(a, b);
    let firsts: Vec<usize> = a.best.coalitions.iter().map(|c| c[0]).collect();
    assert!(firsts.windows(2).all(|w| w[0] < w[1]));
    assert!(
        a.best
            .coalitions
            .iter()
            .all(|c| c.windows(2).all(|w| w[0] < w[1]))
    );
    assert!(a.hits >= 1 && a.hits <= a.restarts);
}

#[test]
fn restarts_never_do_worse_than_their_first_run() {
    let mut maker = StdRng::seed_from_u64(9);
    for _ in 0..10 {
        let p = random_problem(&mut maker, 10);
        let first = p.greedy(100, &mut StdRng::seed_from_u64(4));
        let all = p
            .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(4))
            .unwrap();
        assert!(all.best.objective <= first.objective);
    }
}

#[test]
fn newcomer_joins_its_own_type_or_stays_alone() {
    // Toy B at C = 10 with client 2 arriving last: it belongs with {0, 1}.
    let p = toy_b(10.0);
    let k = p.place_newcomer(&[vec![0, 1], vec![3, 4, 5]], 2).unwrap();
    assert_eq!(k, Some(0));
    let k = p.place_newcomer(&[vec![0, 1, 2], vec![3, 4]], 5).unwrap();
    assert_eq!(k, Some(1));
    // With C = 0 nobody gains by company.
    let p0 = toy_b(0.0);
    assert_eq!(
        p0.place_newcomer(&[vec![0, 1], vec![3, 4, 5]], 2).unwrap(),
        None
    );
    assert!(p.place_newcomer(&[vec![0, 1], vec![3, 4]], 2).is_err());
}

#[test]
fn disc_split_is_stratified_with_the_codes_rounding() {
    // 10 rows of class 0, 4 of class 1, 1 of class 2; target 3 of 15 → rate 0.2:
    // class 0 → ⌊2.0 + .49⌋ = 2, class 1 → ⌊0.8 + .49⌋ = 1, class 2 → ⌊0.2 + .49⌋ = 0.
    let labels: Vec<u32> = [vec![0; 10], vec![1; 4], vec![2; 1]].concat();
    let mut rng = StdRng::seed_from_u64(0);
    let (train, valid) = disc_split(&labels, 3, 3.0, &mut rng);
    let count = |rows: &[usize], c: u32| rows.iter().filter(|&&r| labels[r] == c).count();
    assert_eq!(
        [count(&train, 0), count(&train, 1), count(&train, 2)],
        [2, 1, 0]
    );
    assert_eq!(train.len() + valid.len(), 15);
    let mut all: Vec<usize> = train.iter().chain(&valid).copied().collect();
    all.sort();
    assert_eq!(all, (0..15).collect::<Vec<_>>());
    assert_eq!(disc_train_target(&[2100, 14, 30]), 7.0);
    assert_eq!(disc_train_target(&[15, 40]), 7.5);
}

#[test]
fn label_scale_and_pair_average() {
    assert!(close(label_branch_scale(10), 10.0 / 3.0, 1e-15));
    assert!(close(label_branch_scale(1), 2.0, 1e-15));
    let a = [1.0f32, -3.0, 0.1];
    let b = [0.5f32, 2.0, 0.2];
    assert_eq!(average_pair(&a, &b), average_pair(&b, &a));
    assert_eq!(average_pair(&a, &b)[..2], [0.75, -0.5]);
}

#[test]
fn early_stop_earliest_stop_is_after_round_100() {
    // A metric that never improves after the first evaluation: evaluations at rounds
    // 0, 10, …, 100, the 10th stale one stops the pair after round 100 (101 rounds).
    let mut es = EarlyStop::new(10, 10, 2000);
    let mut stopped_after = None;
    for r in 0..es.max_rounds() {
        if es.evaluates_after(r) && es.record(if r == 0 { 1.4 } else { 1.2 }) {
            stopped_after = Some(r);
            break;
        }
    }
    assert_eq!(stopped_after, Some(100));
    assert!(close(es.estimate().unwrap(), 0.4, 1e-12));
    // An equal value is not an improvement; a better one resets the count.
    let mut es = EarlyStop::new(1, 2, 100);
    assert!(!es.record(1.0));
    assert!(!es.record(1.0));
    assert!(!es.record(1.5));
    assert!(!es.record(1.5));
    assert!(es.record(1.1));
    assert!(close(es.estimate().unwrap(), 0.5, 1e-12));
    assert_eq!(EarlyStop::new(10, 0, 5).estimate(), None);
    let mut never = EarlyStop::new(1, 0, 100);
    assert!((0..50).all(|_| !never.record(0.0)));
}

#[test]
fn label_tv_of_the_papers_partner_types_is_one_seventh() {
    // cluster4 with k = 0.25: type 0 holds labels 0 (half share), 1, 2, 3; type 1 holds
    // 1, 2, 3, 4 (half share): TV = 1/7 (spec §3.1).
    let t0 = [50, 100, 100, 100, 0];
    let t1 = [0, 100, 100, 100, 50];
    assert!(close(label_tv(&t0, &t1), 1.0 / 7.0, 1e-12));
    assert!(close(label_tv(&t0, &[0, 0, 0, 0, 0, 7]), 1.0, 1e-12));
    assert_eq!(label_tv(&t0, &t0), 0.0);
    assert_eq!(label_tv(&[], &[]), 0.0);
}

#[test]
fn distance_matrix_fills_missing_pairs_with_one() {
    let (d, missing) = distance_matrix(3, &[((0, 1), Some(0.2)), ((1, 2), None)]);
    assert_eq!(
        d,
        vec![
            vec![0.0, 0.2, 1.0],
            vec![0.2, 0.0, 1.0],
            vec![1.0, 1.0, 0.0]
        ]
    );
    assert_eq!(missing, vec![(0, 2), (1, 2)]);
}

#[test]
fn config_defaults_are_the_specs_and_validation_names_fields() {
    let c = FedCollabConfig::default();
    assert_eq!(c.capacity, 10.0);
    assert_eq!((c.restarts, c.max_passes), (100, 100));
    assert_eq!(c.distance, Distance::Discriminator);
    assert_eq!(
        (c.disc_hidden, c.disc_batch_size, c.disc_local_steps),
        (200, 32, 1)
    );
    assert_eq!(
        (c.disc_eval_every, c.disc_patience, c.disc_max_rounds),
        (10, 10, 2000)
    );
    assert_eq!(c.disc_lr, 0.01);
    assert!(c.validate().is_ok());
    let e = FedCollabConfig {
        capacity: -1.0,
        ..c.clone()
    }
    .validate()
    .unwrap_err();
    assert!(e.starts_with("capacity") && e.contains("-1"), "{e}");
    let e = FedCollabConfig {
        disc_eval_every: 0,
        ..c
    }
    .validate()
    .unwrap_err();
    assert!(e.starts_with("disc_eval_every"), "{e}");
}

// -----------------------------------------------------------------------------------------
// Golden: the official distance matrices.
// -----------------------------------------------------------------------------------------

/// `tests/data/fedcollab_golden.json` (provenance in `tests/data/README.md`): the three official 20×20 distance matrices from
/// github.com/baowenxuan/FedCollab @ 4c8ac1d (`divergence/*.pkl`, rounded to 4 decimals), the
/// client sizes from the same files, and objective values recomputed independently in f64;
/// the expected structures match the official `collab/*.pkl`.
fn golden() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fedcollab_golden.json"
    );
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading the golden file {path}: {e}"));
    serde_json::from_str(&text).expect("the golden file is JSON")
}

const SETTINGS: [&str; 3] = [
    "label_shift_fmnist",
    "feature_shift_rotated_cifar10",
    "concept_shift_coarse_cifar100",
];

fn structure(v: &serde_json::Value) -> Vec<Vec<usize>> {
    serde_json::from_value(v.clone()).expect("a list of coalitions")
}

fn golden_problem(g: &serde_json::Value) -> Problem {
    let m: Vec<u64> = serde_json::from_value(g["m"].clone()).unwrap();
    let d: Vec<Vec<f64>> = serde_json::from_value(g["D_raw_rounded4"].clone()).unwrap();
    Problem::new(&m, &d, g["C"].as_f64().unwrap()).unwrap()
}

fn range(a: usize, b: usize) -> Vec<usize> {
    (a..b).collect()
}

#[test]
fn golden_objective_values_of_named_structures() {
    let all = golden();
    for name in SETTINGS {
        let g = &all[name];
        let p = golden_problem(g);
        let want = &g["objective_mean_over_clients_after_clamp"];
        let named: [(&str, Vec<Vec<usize>>); 5] = [
            ("local", (0..20).map(|i| vec![i]).collect()),
            ("global", vec![range(0, 20)]),
            (
                "four_types",
                vec![range(0, 5), range(5, 10), range(10, 15), range(15, 20)],
            ),
            ("large_vs_small", vec![range(0, 10), range(10, 20)]),
            (
                "fedcollab_expected",
                structure(&g["expected_best_structure_100_restarts"]),
            ),
        ];
        for (key, s) in named {
            let v = p.objective_of(&s).unwrap();
            let w = want[key].as_f64().unwrap();
            assert!(close(v, w, 5e-7), "{name} {key}: {v} vs golden {w}");
        }
    }
}

#[test]
fn golden_identity_order_greedy() {
    let all = golden();
    for name in SETTINGS {
        let g = &all[name];
        let want = &g["deterministic_identity_order_greedy"];
        let s = golden_problem(g).greedy_identity(100);
        assert_eq!(s.coalitions, structure(&want["structure"]), "{name}");
        let w = want["objective"].as_f64().unwrap();
        assert!(
            close(s.objective, w, 5e-7),
            "{name}: {} vs {w}",
            s.objective
        );
        assert_eq!(s.passes as u64, want["passes"].as_u64().unwrap(), "{name}");
    }
}

#[test]
fn golden_capacity_sweep_coarsens_the_structure() {
    // Spec §7.2 "C sensitivity", at the grid points where the best structure is reached by
    // many restarts (at C = 15 on CIFAR-10 and C = 12 on CIFAR-100 only 1-2 % of runs reach
    // the best structure, so 100 restarts find it or not depending on the RNG stream).
    let all = golden();
    let target = vec![range(0, 5), range(5, 10), range(10, 20)];
    let types = vec![range(0, 5), range(5, 10), range(10, 15), range(15, 20)];
    let global = vec![range(0, 20)];
    let cases: [(&str, f64, Vec<Vec<usize>>); 11] = [
        ("label_shift_fmnist", 6.0, target.clone()),
        ("label_shift_fmnist", 8.0, target.clone()),
        ("label_shift_fmnist", 12.0, vec![range(0, 5), range(5, 20)]),
        ("label_shift_fmnist", 15.0, global.clone()),
        ("label_shift_fmnist", 20.0, global.clone()),
        ("feature_shift_rotated_cifar10", 4.0, types.clone()),
        ("feature_shift_rotated_cifar10", 6.0, types),
        ("feature_shift_rotated_cifar10", 8.0, target.clone()),
        ("feature_shift_rotated_cifar10", 12.0, target.clone()),
        ("concept_shift_coarse_cifar100", 6.0, target),
        ("concept_shift_coarse_cifar100", 20.0, global),
    ];
    for (name, c, want) in cases {
        let p = golden_problem(&all[name]).with_capacity(c).unwrap();
        let sol = p
            .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(0))
            .unwrap();
        assert_eq!(sol.best.coalitions, want, "{name} at C = {c}");
    }
    // Over the spec's logging grid: all singletons at C = 0, one coalition at C = 20 on
    // every matrix, and never more coalitions at a larger C.
    for name in SETTINGS {
        let base = golden_problem(&all[name]);
        let counts: Vec<usize> = [0.0, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0]
            .iter()
            .map(|&c| {
                let p = base.with_capacity(c).unwrap();
                let sol = p
                    .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(0))
                    .unwrap();
                sol.best.coalitions.len()
            })
            .collect();
        assert_eq!(counts[0], 20, "{name}: {counts:?}");
        assert_eq!(counts[counts.len() - 1], 1, "{name}: {counts:?}");
        assert!(
            counts.windows(2).all(|w| w[0] >= w[1]),
            "{name}: {counts:?}"
        );
    }
}

#[test]
fn golden_restarts_recover_the_official_structures() {
    let all = golden();
    for name in SETTINGS {
        let g = &all[name];
        let p = golden_problem(g);
        let want = structure(&g["expected_best_structure_100_restarts"]);
        let w = g["objective_mean_over_clients_after_clamp"]["fedcollab_expected"]
            .as_f64()
            .unwrap();
        for seed in 0..3 {
            let sol = p
                .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(seed))
                .unwrap();
            assert_eq!(sol.best.coalitions, want, "{name}, seed {seed}");
            assert!(
                close(sol.best.objective, w, 5e-7),
                "{name}: {}",
                sol.best.objective
            );
            assert!(sol.best.converged);
        }
    }
}
