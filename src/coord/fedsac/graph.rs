//! FedSaC's collaboration graph (spec `docs/specs/fedsac.md` §2.2, §3, §4 steps 2-3):
//! model similarity, exact projection onto the simplex, the per-client weights
//! `W_i = Π_Δ(p + (β S_i − α C_i)/2)`, the size prior, the α schedule, and the one
//! composition of a round's graph both drivers use.
//! Owns: [`similarity_matrix`], [`project_to_simplex`], [`collaboration_graph`],
//! [`size_prior`], [`scheduled_alpha`], [`round_graph`] with [`GraphSettings`] and
//! [`RoundGraph`].
//! Must not: compute subspaces (`subspace.rs`), mix models (`personalise.rs`), or keep state
//! between rounds.

use super::subspace::{dot, norm};
use super::{FedsacError, PrincipalAngles, Subspace, complementarity_matrix};

/// Similarities above this become 1 (spec §2.2, the official code).
pub const SIMILARITY_CLIP: f64 = 0.9;
/// Zero-norm guard of the cosines (spec §2.2).
const NORM_EPS: f64 = 1e-8;

/// The `N × N` model-similarity matrix (spec §2.2, §7.3; the official code's form): the cosine
/// of the updates from the common initialisation, `Δ^i = θ^i − θ^0`, over all parameters, with
/// zero norms guarded by 1e-8; values above 0.9 become 1, and `S_ii = 1`.
pub fn similarity_matrix(models: &[&[f32]], init: &[f32]) -> Result<Vec<Vec<f64>>, FedsacError> {
    for (index, m) in models.iter().enumerate() {
        if m.len() != init.len() {
            return Err(FedsacError::Shape {
                what: "model",
                index,
                got: m.len(),
                expected: init.len(),
            });
        }
    }
    let deltas: Vec<Vec<f64>> = models
        .iter()
        .map(|m| {
            m.iter()
                .zip(init)
                .map(|(&x, &x0)| f64::from(x) - f64::from(x0))
                .collect()
        })
        .collect();
    let norms: Vec<f64> = deltas.iter().map(|d| norm(d)).collect();
    let n = models.len();
    let mut s = vec![vec![1.0; n]; n];
    for i in 0..n {
        for j in i + 1..n {
            let cos = dot(&deltas[i], &deltas[j]) / (norms[i] * norms[j]).max(NORM_EPS);
            let x = if cos > SIMILARITY_CLIP { 1.0 } else { cos };
            s[i][j] = x;
            s[j][i] = x;
        }
    }
    Ok(s)
}

/// Euclidean projection of `v` onto the probability simplex `{w ≥ 0, Σ w = 1}` (spec §3):
/// sort descending into `u`, take the largest `ρ` with `u_ρ − (Σ_{s≤ρ} u_s − 1)/ρ > 0`, and
/// return `max(v − τ, 0)` with `τ = (Σ_{s≤ρ} u_s − 1)/ρ`. Exact, O(N log N).
pub fn project_to_simplex(v: &[f64]) -> Result<Vec<f64>, FedsacError> {
    if v.is_empty() {
        return Err(FedsacError::Empty);
    }
    if let Some(&bad) = v.iter().find(|x| !x.is_finite()) {
        return Err(FedsacError::BadParameter {
            name: "projected value",
            value: bad,
        });
    }
    let mut u = v.to_vec();
    u.sort_by(|a, b| b.total_cmp(a));
    let (mut sum, mut tau) = (0f64, 0f64);
    for (r, &x) in u.iter().enumerate() {
        sum += x;
        let t = (sum - 1.0) / (r + 1) as f64;
        if x - t > 0.0 {
            tau = t;
        }
    }
    Ok(v.iter().map(|x| (x - tau).max(0.0)).collect())
}

/// The cooperation graph (spec §3, Eq. 8/10): row `i` is
/// `argmin_{w ∈ Δ} Σ_j (w_j − p_j)² + α Σ_j w_j C_ij − β Σ_j w_j S_ij = Π_Δ(p + (β S_i − α C_i)/2)`.
/// Self-loops included (`S_ii = C_ii = 1`, spec §7.7). `p`: the cohort's sample fractions.
pub fn collaboration_graph(
    p: &[f64],
    similarity: &[Vec<f64>],
    complementarity: &[Vec<f64>],
    alpha: f64,
    beta: f64,
) -> Result<Vec<Vec<f64>>, FedsacError> {
    let n = p.len();
    if n == 0 {
        return Err(FedsacError::Empty);
    }
    for (name, value) in [("alpha", alpha), ("beta", beta)] {
        if !(value.is_finite() && value >= 0.0) {
            return Err(FedsacError::BadParameter { name, value });
        }
    }
    if p.iter().any(|x| x.is_nan() || *x < 0.0) || (p.iter().sum::<f64>() - 1.0).abs() > 1e-9 {
        return Err(FedsacError::BadPrior(p.to_vec()));
    }
    for (what, m) in [
        ("similarity", similarity),
        ("complementarity", complementarity),
    ] {
        if m.len() != n {
            return Err(FedsacError::Shape {
                what,
                index: 0,
                got: m.len(),
                expected: n,
            });
        }
        if let Some((index, row)) = m.iter().enumerate().find(|(_, r)| r.len() != n) {
            return Err(FedsacError::Shape {
                what,
                index,
                got: row.len(),
                expected: n,
            });
        }
    }
    (0..n)
        .map(|i| {
            let v: Vec<f64> = (0..n)
                .map(|j| p[j] + (beta * similarity[i][j] - alpha * complementarity[i][j]) / 2.0)
                .collect();
            project_to_simplex(&v)
        })
        .collect()
}

/// The sample fractions `p^i = n^i / Σ n^j` of the round's cohort (spec §1, §7.8).
pub fn size_prior(counts: &[u64]) -> Result<Vec<f64>, FedsacError> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return Err(FedsacError::Empty);
    }
    Ok(counts.iter().map(|&c| c as f64 / total as f64).collect())
}

/// α in round `t` (0-based) of `rounds`: 0 once `t / rounds > cutoff`, else `alpha` (spec §4,
/// paper B.1). A cutoff ≥ 1 never switches it off.
pub fn scheduled_alpha(alpha: f64, t: usize, rounds: usize, cutoff: f64) -> f64 {
    if rounds > 0 && t as f64 / rounds as f64 > cutoff {
        0.0
    } else {
        alpha
    }
}

/// What FedSaC's graph needs of the run's settings (spec §3, §4).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraphSettings {
    /// α: the weight of complementarity, before [`scheduled_alpha`].
    pub alpha: f64,
    /// The fraction of the rounds after which α is 0.
    pub alpha_cutoff: f64,
    /// β: the weight of similarity.
    pub beta: f64,
    /// How the subspaces' angles are measured.
    pub principal_angles: PrincipalAngles,
}

/// One round's collaboration graph, as [`round_graph`] computes it.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundGraph {
    /// α as scheduled for the round.
    pub alpha: f64,
    /// W: one row per sender, in the order the senders were given; empty when none sent.
    pub graph: Vec<Vec<f64>>,
}

/// FedSaC's coordinator step for round `t` (0-based) of `rounds` over the silos that sent
/// (spec §4 steps 2-3), the one composition both the simulator and the coordinator server
/// use: the size prior `p` of `counts`, the similarity `S` of `models` on `θ − init`, the
/// complementarity `C` of `subspaces`, α scheduled for the round, then the collaboration graph
/// `W`. Each sender's personalised model and direction are
/// [`personalise`](fn@super::personalise) of its row. With no senders, the graph is empty (α is
/// still scheduled).
pub fn round_graph(
    models: &[&[f32]],
    init: &[f32],
    counts: &[u64],
    subspaces: &[Option<Subspace>],
    settings: &GraphSettings,
    t: usize,
    rounds: usize,
) -> Result<RoundGraph, FedsacError> {
    let alpha = scheduled_alpha(settings.alpha, t, rounds, settings.alpha_cutoff);
    if models.is_empty() {
        return Ok(RoundGraph {
            alpha,
            graph: Vec::new(),
        });
    }
    let p = size_prior(counts)?;
    let s = similarity_matrix(models, init)?;
    let c = complementarity_matrix(subspaces, settings.principal_angles)?;
    let graph = collaboration_graph(&p, &s, &c, alpha, settings.beta)?;
    Ok(RoundGraph { alpha, graph })
}
