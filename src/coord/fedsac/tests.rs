//! Unit tests of `coord::fedsac` (moved unchanged from its inline `mod tests`).
//! Owns: the module's unit tests and their fixtures.
//! Must not: hold code the module itself uses.

use super::*;

/// Appendix G's toy (spec §3): S and C reverse-engineered by the spec's author; all 64
/// printed entries of the four W matrices follow with p = 0.25.
fn fixture() -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let s = vec![
        vec![1.000, 0.218, 0.039, 0.263],
        vec![0.218, 1.000, 0.491, 0.316],
        vec![0.039, 0.491, 1.000, -0.030],
        vec![0.263, 0.316, -0.030, 1.000],
    ];
    let c = vec![
        vec![1.000, 0.332, 0.462, 0.367],
        vec![0.332, 1.000, 0.312, 0.309],
        vec![0.462, 0.312, 1.000, 0.162],
        vec![0.367, 0.309, 0.162, 1.000],
    ];
    (s, c)
}

fn close(got: &[Vec<f64>], want: &[[f64; 4]], tol: f64) {
    for (g, w) in got.iter().zip(want) {
        for (x, y) in g.iter().zip(w) {
            assert!((x - y).abs() <= tol, "{got:?}\nvs {want:?}");
        }
    }
}

#[test]
#[allow(clippy::approx_constant)] // 0.318 is a printed weight, not 1/π
fn appendix_g_weights() {
    let (s, c) = fixture();
    let p = [0.25; 4];
    let cases: [(f64, f64, [[f64; 4]; 4]); 4] = [
        (
            0.9,
            1.4,
            [
                [0.478, 0.230, 0.047, 0.246],
                [0.118, 0.365, 0.319, 0.197],
                [0.024, 0.409, 0.455, 0.111],
                [0.204, 0.268, 0.092, 0.436],
            ],
        ),
        (
            0.5,
            1.6,
            [
                [0.630, 0.172, 0.000, 0.198],
                [0.058, 0.517, 0.282, 0.142],
                [0.000, 0.382, 0.616, 0.002],
                [0.171, 0.228, 0.000, 0.602],
            ],
        ),
        (
            0.0,
            1.4,
            [
                [0.684, 0.137, 0.011, 0.168],
                [0.048, 0.596, 0.240, 0.117],
                [0.003, 0.320, 0.676, 0.000],
                [0.149, 0.186, 0.000, 0.665],
            ],
        ),
        (
            0.9,
            0.0,
            [
                [0.043, 0.344, 0.285, 0.328],
                [0.320, 0.020, 0.329, 0.331],
                [0.260, 0.328, 0.018, 0.395],
                [0.292, 0.318, 0.384, 0.007],
            ],
        ),
    ];
    for (alpha, beta, want) in cases {
        let w = collaboration_graph(&p, &s, &c, alpha, beta).unwrap();
        close(&w, &want, 2e-3);
        for row in &w {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
            assert!(row.iter().all(|&x| x >= 0.0));
        }
    }
}

/// pFedGraph's row problem solved independently: projected gradient descent on
/// `λ‖w‖² − (S_i + 2λp)ᵀw` over the simplex (its code's objective, spec §3).
fn pfedgraph_row(p: &[f64], s_row: &[f64], lambda: f64) -> Vec<f64> {
    let mut w = vec![1.0 / p.len() as f64; p.len()];
    let step = 1.0 / (2.0 * lambda);
    for _ in 0..20_000 {
        let g: Vec<f64> = (0..p.len())
            .map(|j| 2.0 * lambda * w[j] - s_row[j] - 2.0 * lambda * p[j])
            .collect();
        let v: Vec<f64> = w.iter().zip(&g).map(|(x, d)| x - 0.1 * step * d).collect();
        w = project_to_simplex(&v).unwrap();
    }
    w
}

#[test]
fn alpha_zero_is_pfedgraph_with_lambda_one_over_beta() {
    let (s, c) = fixture();
    let p = [0.1, 0.2, 0.3, 0.4];
    for beta in [1.25, 1.4, 3.0] {
        let w = collaboration_graph(&p, &s, &c, 0.0, beta).unwrap();
        for (i, row) in w.iter().enumerate() {
            let want = pfedgraph_row(&p, &s[i], 1.0 / beta);
            for (x, y) in row.iter().zip(&want) {
                assert!(
                    (x - y).abs() < 1e-6,
                    "beta {beta} row {i}: {row:?} vs {want:?}"
                );
            }
        }
    }
}

#[test]
fn alpha_and_beta_zero_give_fedavg_weights() {
    let (s, c) = fixture();
    let p = [0.1, 0.2, 0.3, 0.4];
    for row in collaboration_graph(&p, &s, &c, 0.0, 0.0).unwrap() {
        for (x, y) in row.iter().zip(&p) {
            assert!((x - y).abs() < 1e-15);
        }
    }
}

#[test]
fn self_weight_falls_with_alpha_and_rises_with_beta() {
    let (s, c) = fixture();
    let p = [0.25; 4];
    let diag = |a, b| -> Vec<f64> {
        let w = collaboration_graph(&p, &s, &c, a, b).unwrap();
        (0..4).map(|i| w[i][i]).collect()
    };
    let (lo_a, hi_a) = (diag(0.3, 1.4), diag(1.2, 1.4));
    let (lo_b, hi_b) = (diag(0.9, 0.5), diag(0.9, 1.6));
    for i in 0..4 {
        assert!(hi_a[i] < lo_a[i] && hi_b[i] > lo_b[i], "client {i}");
    }
}

#[test]
fn simplex_projection_known_cases_and_optimality() {
    let pr = |v: &[f64]| project_to_simplex(v).unwrap();
    assert_eq!(pr(&[0.2, 0.3, 0.5]), vec![0.2, 0.3, 0.5]);
    let w = pr(&[0.5, 0.5, 0.5]);
    assert!(w.iter().all(|x| (x - 1.0 / 3.0).abs() < 1e-15));
    assert_eq!(pr(&[2.0, 0.0]), vec![1.0, 0.0]);
    let w = pr(&[0.6, 0.6, -1.0]);
    assert!((w[0] - 0.5).abs() < 1e-15 && (w[1] - 0.5).abs() < 1e-15 && w[2] == 0.0);
    assert_eq!(pr(&[-3.0]), vec![1.0]);
    assert!(project_to_simplex(&[]).is_err());
    assert!(project_to_simplex(&[f64::NAN, 1.0]).is_err());
    // Optimality: no feasible point (random mixtures of vertices) is closer to v.
    let mut x = 0.123_f64;
    let mut rnd = || {
        x = (x * 9301.0 + 49297.0) % 233280.0;
        x / 233280.0
    };
    for _ in 0..50 {
        let v: Vec<f64> = (0..5).map(|_| 3.0 * rnd() - 1.5).collect();
        let w = pr(&v);
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12 && w.iter().all(|&z| z >= 0.0));
        let dist = |u: &[f64]| u.iter().zip(&v).map(|(a, b)| (a - b).powi(2)).sum::<f64>();
        for _ in 0..200 {
            let mut u: Vec<f64> = (0..5).map(|_| rnd()).collect();
            let t: f64 = u.iter().sum();
            u.iter_mut().for_each(|z| *z /= t);
            assert!(dist(&w) <= dist(&u) + 1e-12);
        }
    }
}

#[test]
fn similarity_is_the_clipped_cosine_of_updates() {
    let init = [1.0f32, 1.0, 1.0];
    let a = [2.0f32, 1.0, 1.0]; // Δ = e1
    let b = [2.0f32, 1.1, 1.0]; // Δ ≈ e1: cosine 0.995 > 0.9, clipped to 1
    let c = [1.0f32, 2.0, 1.0]; // Δ = e2: orthogonal
    let d = [0.0f32, 1.0, 1.0]; // Δ = −e1
    let s = similarity_matrix(&[&a, &b, &c, &d], &init).unwrap();
    assert_eq!(s[0][1], 1.0);
    assert!(s[0][2].abs() < 1e-12);
    assert!((s[0][3] + 1.0).abs() < 1e-12);
    assert!((0..4).all(|i| s[i][i] == 1.0));
    assert!((s[1][2] - s[2][1]).abs() == 0.0);
    // A model equal to the initialisation has no direction: cosine 0, not NaN.
    assert_eq!(similarity_matrix(&[&init, &a], &init).unwrap()[0][1], 0.0);
    assert!(similarity_matrix(&[&a, &[1.0]], &init).is_err());
}

/// Rows of `dim` features: strong variance along `dirs`, plus a little everywhere.
fn features(dirs: &[usize], dim: usize, m: usize) -> Vec<f32> {
    let mut x = 0.77_f64;
    let mut rnd = || {
        x = (x * 9301.0 + 49297.0) % 233280.0;
        x / 233280.0 - 0.5
    };
    let mut out = Vec::with_capacity(m * dim);
    for _ in 0..m {
        let mut row: Vec<f64> = (0..dim).map(|_| 0.01 * rnd()).collect();
        for (s, &d) in dirs.iter().enumerate() {
            row[d] += (10.0 / (s + 1) as f64) * rnd() + 3.0;
        }
        out.extend(row.into_iter().map(|v| v as f32));
    }
    out
}

#[test]
fn feature_subspace_finds_the_principal_directions() {
    let q = feature_subspace(&features(&[4, 1, 7], 12, 400), 12, 3)
        .unwrap()
        .unwrap();
    assert_eq!((q.rank(), q.dim()), (3, 12));
    // Strongest first, each nearly a coordinate axis with a positive largest entry.
    for (row, axis) in q.rows().iter().zip([4, 1, 7]) {
        assert!(row[axis] > 0.99, "{row:?}");
    }
    assert!(Subspace::from_rows(q.rows().to_vec()).is_ok());
    // The mean is removed: the +3 offsets do not show up as a direction.
    let same = feature_subspace(&features(&[1, 4, 7], 12, 300), 12, 3)
        .unwrap()
        .unwrap();
    let c = complementarity(&q, &same, PrincipalAngles::Standard).unwrap();
    assert!(c > 0.999, "{c}");
    let other = feature_subspace(&features(&[0, 2, 9], 12, 300), 12, 3)
        .unwrap()
        .unwrap();
    let c = complementarity(&q, &other, PrincipalAngles::Standard).unwrap();
    assert!(c.abs() < 0.01, "orthogonal subspaces: {c}");
}

#[test]
fn degenerate_features_have_no_subspace() {
    // Too few rows, and rank below k (every row the same).
    assert_eq!(
        feature_subspace(&[1.0; 6], 2, 3).unwrap_err(),
        FedsacError::BadK { k: 3, dim: 2 }
    );
    assert_eq!(feature_subspace(&[1.0; 6], 3, 2).unwrap(), None);
    assert_eq!(feature_subspace(&[0.5; 300], 3, 2).unwrap(), None);
    assert!(feature_subspace(&[1.0; 7], 3, 2).is_err());
    let c = complementarity_matrix(
        &[
            None,
            feature_subspace(&features(&[0, 1, 2], 6, 50), 6, 3).unwrap(),
        ],
        PrincipalAngles::Standard,
    )
    .unwrap();
    assert_eq!(c, vec![vec![1.0, 1.0], vec![1.0, 1.0]]);
}

#[test]
fn standard_angles_ignore_basis_signs_and_greedy_ones_do_not() {
    let e = |i: usize| -> Vec<f64> { (0..4).map(|j| f64::from(u8::from(i == j))).collect() };
    let a = Subspace::from_rows(vec![e(0), e(1)]).unwrap();
    let flipped = Subspace::from_rows(vec![e(0), e(1).iter().map(|x| -x).collect()]).unwrap();
    let s = complementarity(&a, &flipped, PrincipalAngles::Standard).unwrap();
    assert!((s - 1.0).abs() < 1e-12);
    // Greedy: cosines 1 and −1, angles 0 and π, mean π/2: "orthogonal".
    let g = complementarity(&a, &flipped, PrincipalAngles::GreedySigned).unwrap();
    assert!(g.abs() < 1e-12, "{g}");
    // A 45° tilt of one direction: angles 0 and π/4.
    let h = std::f64::consts::FRAC_1_SQRT_2;
    let tilted = Subspace::from_rows(vec![e(0), vec![0.0, h, h, 0.0]]).unwrap();
    let s = complementarity(&a, &tilted, PrincipalAngles::Standard).unwrap();
    assert!(
        (s - (std::f64::consts::PI / 8.0).cos()).abs() < 1e-12,
        "{s}"
    );
    assert!(Subspace::from_rows(vec![e(0), vec![h, h, 0.0, 0.0]]).is_err());
    // A NaN basis (a member's, over the network) is refused: it would fail every round's graph.
    assert!(Subspace::from_rows(vec![vec![f64::NAN, 0.0, 0.0, 0.0]]).is_err());
    assert!(Subspace::from_rows(vec![e(0), vec![f64::NAN, 1.0, 0.0, 0.0]]).is_err());
    let other_space = Subspace::from_rows(vec![vec![1.0, 0.0]]).unwrap();
    assert!(complementarity(&a, &other_space, PrincipalAngles::Standard).is_err());
}

#[test]
fn alpha_schedule_switches_off_after_seventy_percent() {
    // T = 50: α is active for t ≤ 35 (spec §7.5).
    assert_eq!(scheduled_alpha(0.9, 35, 50, 0.7), 0.9);
    assert_eq!(scheduled_alpha(0.9, 36, 50, 0.7), 0.0);
    assert_eq!(scheduled_alpha(0.9, 49, 50, 1.0), 0.9);
}

#[test]
fn mixing_direction_and_regulariser() {
    let a = [3.0f32, 4.0];
    let b = [0.0f32, 2.0];
    assert_eq!(mix(&[&a, &b], &[0.5, 0.5]).unwrap(), vec![1.5, 3.0]);
    let c = direction(&[&a, &b], &[0.5, 0.5]).unwrap();
    assert!((c[0] - 0.3).abs() < 1e-7 && (c[1] - 0.9).abs() < 1e-7);
    assert!(mix(&[&a, &b], &[1.0]).is_err());
    // The regulariser's gradient matches finite differences of sign·λ⟨c,θ⟩/‖θ‖.
    let f = |t: &[f64], sgn: f64| {
        sgn * 0.5 * (t[0] * 0.3 + t[1] * 0.9) / (t[0] * t[0] + t[1] * t[1]).sqrt()
    };
    for (sign, sgn) in [(RegSign::Attract, -1.0), (RegSign::Repel, 1.0)] {
        let theta = [1.0f32, -2.0];
        let mut g = [0.0f32; 2];
        add_regulariser_grad(&theta, &c, 0.5, sign, &mut g);
        for i in 0..2 {
            let mut up = [1.0, -2.0];
            let mut dn = [1.0, -2.0];
            up[i] += 1e-6;
            dn[i] -= 1e-6;
            let fd = (f(&up, sgn) - f(&dn, sgn)) / 2e-6;
            assert!(
                (f64::from(g[i]) - fd).abs() < 1e-5,
                "{sign:?} {i}: {} vs {fd}",
                g[i]
            );
        }
    }
    // Attracting moves θ towards c: a step against the gradient raises cos(θ, c).
    let theta = [1.0f32, -2.0];
    let mut g = [0.0f32; 2];
    add_regulariser_grad(&theta, &c, 1.0, RegSign::Attract, &mut g);
    let stepped = [theta[0] - g[0], theta[1] - g[1]];
    let cos = |t: &[f32]| (t[0] * c[0] + t[1] * c[1]) / (t[0].hypot(t[1]));
    assert!(cos(&stepped) > cos(&theta));
}

#[test]
fn round_graph_is_prior_similarity_complementarity_then_the_graph() {
    let init = [0.0f32, 0.0, 0.0];
    let (a, b, c) = ([1.0f32, 0.0, 0.5], [0.5f32, 1.0, 0.0], [0.0f32, 0.5, 1.0]);
    let models: [&[f32]; 3] = [&a, &b, &c];
    let e = |i: usize| {
        (0..3)
            .map(|j| f64::from(u8::from(i == j)))
            .collect::<Vec<f64>>()
    };
    let subspaces = vec![
        Some(Subspace::from_rows(vec![e(0)]).unwrap()),
        Some(Subspace::from_rows(vec![e(1)]).unwrap()),
        None,
    ];
    let counts = [10, 30, 60];
    let settings = GraphSettings {
        alpha: 0.9,
        alpha_cutoff: 0.7,
        beta: 1.4,
        principal_angles: PrincipalAngles::default(),
    };
    for t in [0, 9] {
        let got = round_graph(&models, &init, &counts, &subspaces, &settings, t, 10).unwrap();
        let alpha = scheduled_alpha(0.9, t, 10, 0.7);
        let p = size_prior(&counts).unwrap();
        let sim = similarity_matrix(&models, &init).unwrap();
        let comp = complementarity_matrix(&subspaces, settings.principal_angles).unwrap();
        let want = collaboration_graph(&p, &sim, &comp, alpha, 1.4).unwrap();
        assert_eq!(got, RoundGraph { alpha, graph: want });
        let row = &got.graph[1];
        assert_eq!(
            personalise(&models, row).unwrap(),
            (mix(&models, row).unwrap(), direction(&models, row).unwrap())
        );
    }
    assert_eq!(
        round_graph(&models, &init, &counts, &subspaces, &settings, 9, 10)
            .unwrap()
            .alpha,
        0.0
    );
    // No senders: an empty graph, α still scheduled.
    assert_eq!(
        round_graph(&[], &init, &[], &[], &settings, 0, 10).unwrap(),
        RoundGraph {
            alpha: 0.9,
            graph: Vec::new()
        }
    );
}

#[test]
fn graph_inputs_are_checked() {
    let (s, c) = fixture();
    let p = [0.25; 4];
    assert!(collaboration_graph(&p, &s, &c, -0.1, 1.0).is_err());
    assert!(collaboration_graph(&[0.5, 0.6, 0.0, -0.1], &s, &c, 0.1, 1.0).is_err());
    assert!(collaboration_graph(&p, &s[..3], &c, 0.1, 1.0).is_err());
    assert!(collaboration_graph(&[], &[], &[], 0.1, 1.0).is_err());
    assert_eq!(
        collaboration_graph(&[1.0], &[vec![1.0]], &[vec![1.0]], 0.9, 1.4).unwrap(),
        vec![vec![1.0]]
    );
    assert_eq!(size_prior(&[1, 3]).unwrap(), vec![0.25, 0.75]);
    assert!(size_prior(&[0, 0]).is_err());
}
