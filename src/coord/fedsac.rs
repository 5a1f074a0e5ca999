//! FedSaC: personalised collaboration graphs that balance model similarity and feature
//! complementarity (Yan et al., ICML 2024; spec `../shared/specs/fedsac.md`).
//!
//! Owns, as pure functions on numbers:
//! * silo side: [`feature_subspace`], the top-k principal directions of a silo's own centred
//!   features (spec §2.1, §7.1), and [`add_regulariser_grad`], the local cosine regulariser
//!   (spec §4 step 1, §4.3, §7.4);
//! * coordinator side: the model-similarity matrix [`similarity_matrix`] (spec §2.2, the code's
//!   cosine of updates with the 0.9 clip), the feature-complementarity matrix
//!   [`complementarity_matrix`] (spec §2.3), the per-client weights
//!   `W_i = Π_Δ(p + (β S_i − α C_i)/2)` of [`collaboration_graph`] by exact projection onto the
//!   simplex ([`project_to_simplex`], spec §3), the α schedule [`scheduled_alpha`] (spec §4),
//!   and the personalised aggregation [`mix`] / [`direction`] (spec §4 step 4).
//!
//! With α = 0 the graph is exactly pFedGraph's with λ = 1/β (spec §3); α = β = 0 gives FedAvg.
//!
//! Must not: touch tensors, sockets, clocks or threads (std, rand and serde only), run a model
//! (features arrive as numbers), or keep state between rounds: the graph is recomputed from
//! scratch every round (spec §4 step 3).

use serde::{Deserialize, Serialize};

/// Paper defaults (spec §4, §7.5): α (complementarity weight) for Homo and Dirichlet splits.
pub const DEFAULT_ALPHA: f64 = 0.9;
/// β (similarity weight) for Homo and Dirichlet splits.
pub const DEFAULT_BETA: f64 = 1.4;
/// k: dimension of each silo's feature subspace.
pub const DEFAULT_K: usize = 3;
/// λ: weight of the local regulariser.
pub const DEFAULT_LAMBDA: f64 = 0.01;
/// α is set to 0 once `t / T` exceeds this (paper B.1).
pub const DEFAULT_ALPHA_CUTOFF: f64 = 0.7;
/// Similarities above this become 1 (spec §2.2, the official code).
pub const SIMILARITY_CLIP: f64 = 0.9;
/// Zero-norm guard of the cosines (spec §2.2).
const NORM_EPS: f64 = 1e-8;

/// Errors of FedSaC's computations; each names the value and the allowed range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FedsacError {
    /// Features that do not form rows of the stated width.
    #[error("features: {len} values do not make whole rows of dim = {dim} (dim must be >= 1)")]
    FeatureShape {
        /// Values given.
        len: usize,
        /// The stated row width.
        dim: usize,
    },
    /// A subspace dimension outside `1..=dim`.
    #[error("k = {k} is outside the allowed range 1..={dim} (the feature dimension)")]
    BadK {
        /// The requested k.
        k: usize,
        /// The feature dimension.
        dim: usize,
    },
    /// Subspaces of different feature spaces.
    #[error("subspaces in R^{a} and R^{b} cannot be compared; both must be in the same space")]
    DimMismatch {
        /// One dimension.
        a: usize,
        /// The other.
        b: usize,
    },
    /// Basis rows that are not orthonormal.
    #[error("basis rows {i} and {j} have inner product {value}, expected {expected} (within 1e-6)")]
    NotOrthonormal {
        /// First row.
        i: usize,
        /// Second row.
        j: usize,
        /// Their inner product.
        value: f64,
        /// 1 on the diagonal, else 0.
        expected: f64,
    },
    /// Vectors of the wrong length.
    #[error("{what} {index} has length {got}, expected {expected}")]
    Shape {
        /// What was measured.
        what: &'static str,
        /// Its position.
        index: usize,
        /// Its length.
        got: usize,
        /// The length required.
        expected: usize,
    },
    /// A hyperparameter outside its range.
    #[error("{name} must be finite and >= 0, got {value}")]
    BadParameter {
        /// Its name.
        name: &'static str,
        /// The value.
        value: f64,
    },
    /// A prior that is not a distribution.
    #[error("p must be a distribution: entries >= 0 summing to 1 (within 1e-9), got {0:?}")]
    BadPrior(Vec<f64>),
    /// No clients, or no value to project.
    #[error("no clients: at least 1 is needed")]
    Empty,
}

/// How the angles between two subspaces are measured (spec §2.3, §7.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrincipalAngles {
    /// The standard principal angles: `cos φ_l` are the singular values of `Q_i Q_jᵀ`
    /// (basis-sign independent; the recommended default).
    #[default]
    Standard,
    /// The official code's greedy matching of signed basis-vector cosines (sign-sensitive;
    /// for fidelity experiments).
    GreedySigned,
}

/// The sign of the local regulariser `sign · λ ⟨c, θ⟩ / ‖θ‖` (spec §7.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegSign {
    /// The paper's `−λ cos`: pulls θ towards the aggregate direction (default).
    #[default]
    Attract,
    /// The official code's (and pFedGraph's) `+λ`: pushes θ away.
    Repel,
}

/// `k` orthonormal directions in `R^dim`: a silo's representative feature subspace `Q^i`
/// (spec §2.1). This, `n^i` and the model are all a silo sends.
#[derive(Clone, Debug, PartialEq)]
pub struct Subspace {
    dim: usize,
    rows: Vec<Vec<f64>>,
}

impl Subspace {
    /// A subspace from basis rows (e.g. received over the wire as `k × d` floats); checks that
    /// they have one length and are orthonormal within 1e-6.
    pub fn from_rows(rows: Vec<Vec<f64>>) -> Result<Self, FedsacError> {
        let dim = rows.first().map_or(0, Vec::len);
        if rows.is_empty() || dim == 0 {
            return Err(FedsacError::BadK { k: rows.len(), dim });
        }
        for (i, r) in rows.iter().enumerate() {
            if r.len() != dim {
                return Err(FedsacError::Shape {
                    what: "basis row",
                    index: i,
                    got: r.len(),
                    expected: dim,
                });
            }
            for (j, s) in rows.iter().enumerate().take(i + 1) {
                let value = dot(r, s);
                let expected = if i == j { 1.0 } else { 0.0 };
                if (value - expected).abs() > 1e-6 {
                    return Err(FedsacError::NotOrthonormal {
                        i,
                        j,
                        value,
                        expected,
                    });
                }
            }
        }
        Ok(Self { dim, rows })
    }

    /// `k`: number of directions.
    pub fn rank(&self) -> usize {
        self.rows.len()
    }

    /// `d`: the feature dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The basis rows, strongest direction first.
    pub fn rows(&self) -> &[Vec<f64>] {
        &self.rows
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}

/// Silo side: the top-`k` principal directions of the silo's features (spec §2.1, §7.1).
///
/// `features` holds `m` rows of `dim` values (the penultimate activations of the silo's own
/// freshly trained model on its own samples). Each column is centred; the result spans the top-k
/// eigenvectors of `X_cᵀ X_c` (sklearn's `PCA(k).components_`), each row signed so that its
/// largest-magnitude entry is positive. `Ok(None)` when there are at most `k` rows or the
/// centred features have rank below `k` (e.g. dead ReLU units): the spec's fall-back is then
/// `C = 1` for every pair with this silo (no complementarity bonus).
///
/// Method: block subspace iteration on the `dim × dim` covariance with `k + 8` vectors and a
/// Rayleigh–Ritz step (Jacobi on the small block), from a fixed start, until the top-k residuals
/// fall below 1e-9 of the largest eigenvalue (at most 3000 iterations), so it is deterministic.
pub fn feature_subspace(
    features: &[f32],
    dim: usize,
    k: usize,
) -> Result<Option<Subspace>, FedsacError> {
    if dim == 0 || features.len() % dim != 0 {
        return Err(FedsacError::FeatureShape {
            len: features.len(),
            dim,
        });
    }
    if k == 0 || k > dim {
        return Err(FedsacError::BadK { k, dim });
    }
    let m = features.len() / dim;
    if m <= k {
        return Ok(None);
    }
    // Centred covariance (unnormalised), f64, upper triangle then mirrored.
    let mut mean = vec![0f64; dim];
    for row in features.chunks_exact(dim) {
        for (s, &x) in mean.iter_mut().zip(row) {
            *s += f64::from(x);
        }
    }
    mean.iter_mut().for_each(|s| *s /= m as f64);
    let mut cov = vec![0f64; dim * dim];
    let mut centred = vec![0f64; dim];
    for row in features.chunks_exact(dim) {
        for ((c, &x), mu) in centred.iter_mut().zip(row).zip(&mean) {
            *c = f64::from(x) - mu;
        }
        for i in 0..dim {
            let ci = centred[i];
            if ci != 0.0 {
                let out = &mut cov[i * dim + i..(i + 1) * dim];
                for (o, &cj) in out.iter_mut().zip(&centred[i..]) {
                    *o += ci * cj;
                }
            }
        }
    }
    for i in 0..dim {
        for j in 0..i {
            cov[i * dim + j] = cov[j * dim + i];
        }
    }
    let (values, vectors) = top_eigen(&cov, dim, k);
    let top = values.first().copied().unwrap_or(0.0);
    if top.is_nan() || top <= 0.0 || values[k - 1] <= 1e-10 * top {
        return Ok(None);
    }
    let rows = vectors
        .into_iter()
        .map(|mut v| {
            let big = v
                .iter()
                .copied()
                .fold(0f64, |a, x| if x.abs() > a.abs() { x } else { a });
            if big < 0.0 {
                v.iter_mut().for_each(|x| *x = -*x);
            }
            v
        })
        .collect();
    Ok(Some(Subspace { dim, rows }))
}

/// The `k` largest eigenpairs of a symmetric positive semi-definite `n × n` matrix (row-major),
/// by block subspace iteration with Rayleigh–Ritz. Eigenvalues descending.
fn top_eigen(a: &[f64], n: usize, k: usize) -> (Vec<f64>, Vec<Vec<f64>>) {
    let b = (k + 8).min(n);
    let mut seed = 0x5EED_F00D_u64;
    let mut next = move || {
        // SplitMix64: a fixed start, so the result does not depend on any RNG stream.
        seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let mut v: Vec<Vec<f64>> = (0..b).map(|_| (0..n).map(|_| next()).collect()).collect();
    orthonormalise(&mut v, &mut next);
    let matvec = |x: &[f64]| -> Vec<f64> { a.chunks_exact(n).map(|row| dot(row, x)).collect() };
    let mut values = vec![0f64; b];
    for _ in 0..3000 {
        let z: Vec<Vec<f64>> = v.iter().map(|x| matvec(x)).collect();
        // Rayleigh–Ritz on the block.
        let mut h = vec![0f64; b * b];
        for i in 0..b {
            for j in i..b {
                let x = dot(&v[i], &z[j]);
                h[i * b + j] = x;
                h[j * b + i] = x;
            }
        }
        let (vals, rot) = sym_eigen(&h, b);
        let rotate = |basis: &[Vec<f64>]| -> Vec<Vec<f64>> {
            (0..b)
                .map(|l| {
                    let mut out = vec![0f64; n];
                    for (j, col) in basis.iter().enumerate() {
                        let r = rot[j * b + l];
                        out.iter_mut().zip(col).for_each(|(o, c)| *o += r * c);
                    }
                    out
                })
                .collect()
        };
        let ritz = rotate(&v);
        let images = rotate(&z);
        values = vals;
        let scale = values[0].abs().max(f64::MIN_POSITIVE);
        let converged = (0..k).all(|l| {
            let r: f64 = images[l]
                .iter()
                .zip(&ritz[l])
                .map(|(y, x)| (y - values[l] * x).powi(2))
                .sum::<f64>()
                .sqrt();
            r <= 1e-9 * scale
        });
        if converged || values[0] <= 0.0 {
            v = ritz;
            break;
        }
        v = images;
        orthonormalise(&mut v, &mut next);
    }
    v.truncate(k);
    values.truncate(k);
    (values, v)
}

/// Modified Gram–Schmidt, twice; a vector that collapses (the matrix has lower rank than the
/// block) is replaced by a fresh one from `next` and orthogonalised again.
fn orthonormalise(v: &mut [Vec<f64>], next: &mut impl FnMut() -> f64) {
    for i in 0..v.len() {
        for attempt in 0..8 {
            let original = norm(&v[i]);
            for _ in 0..2 {
                for j in 0..i {
                    let (done, rest) = v.split_at_mut(i);
                    let d = dot(&done[j], &rest[0]);
                    rest[0]
                        .iter_mut()
                        .zip(&done[j])
                        .for_each(|(x, q)| *x -= d * q);
                }
            }
            let nv = norm(&v[i]);
            if nv > 1e-10 * original.max(f64::MIN_POSITIVE) && nv > 0.0 {
                v[i].iter_mut().for_each(|x| *x /= nv);
                break;
            }
            let len = v[i].len();
            v[i] = (0..len).map(|_| next()).collect();
            if attempt == 7 {
                v[i].iter_mut().for_each(|x| *x = 0.0);
            }
        }
    }
}

/// Eigen-decomposition of a symmetric `n × n` matrix (row-major) by cyclic Jacobi rotations.
/// Returns the eigenvalues in descending order and the eigenvectors as the columns of a
/// row-major `n × n` matrix, in the same order.
fn sym_eigen(a: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut a = a.to_vec();
    let mut v = vec![0f64; n * n];
    (0..n).for_each(|i| v[i * n + i] = 1.0);
    let total: f64 = a.iter().map(|x| x * x).sum();
    for _ in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * n + j].powi(2))
            .sum();
        if off <= 1e-30 * total || off == 0.0 {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| a[j * n + j].total_cmp(&a[i * n + i]));
    let values = order.iter().map(|&i| a[i * n + i]).collect();
    let mut vecs = vec![0f64; n * n];
    for (new, &old) in order.iter().enumerate() {
        for r in 0..n {
            vecs[r * n + new] = v[r * n + old];
        }
    }
    (values, vecs)
}

/// `C_ij = cos((1/k) Σ_l φ_l)` for two silos' subspaces (spec §2.3, Eq. 7): 1 for identical
/// subspaces, 0 for orthogonal ones. Subspaces of different ranks use the `min(k_i, k_j)`
/// angles.
pub fn complementarity(
    a: &Subspace,
    b: &Subspace,
    method: PrincipalAngles,
) -> Result<f64, FedsacError> {
    if a.dim != b.dim {
        return Err(FedsacError::DimMismatch { a: a.dim, b: b.dim });
    }
    let (ka, kb) = (a.rank(), b.rank());
    let k = ka.min(kb);
    // M = Q_a Q_bᵀ: the signed cosines between basis vectors.
    let m: Vec<f64> = a
        .rows
        .iter()
        .flat_map(|x| b.rows.iter().map(move |y| dot(x, y)))
        .collect();
    let cosines: Vec<f64> = match method {
        PrincipalAngles::Standard => {
            // Singular values of M: square roots of the eigenvalues of MᵀM (kb × kb).
            let mut g = vec![0f64; kb * kb];
            for i in 0..kb {
                for j in 0..kb {
                    g[i * kb + j] = (0..ka).map(|r| m[r * kb + i] * m[r * kb + j]).sum();
                }
            }
            let (vals, _) = sym_eigen(&g, kb);
            vals.into_iter()
                .take(k)
                .map(|x| x.max(0.0).sqrt().min(1.0))
                .collect()
        }
        PrincipalAngles::GreedySigned => {
            let mut used_r = vec![false; ka];
            let mut used_c = vec![false; kb];
            (0..k)
                .map(|_| {
                    let mut best = (0, 0, f64::NEG_INFINITY);
                    for r in (0..ka).filter(|&r| !used_r[r]) {
                        for c in (0..kb).filter(|&c| !used_c[c]) {
                            if m[r * kb + c] > best.2 {
                                best = (r, c, m[r * kb + c]);
                            }
                        }
                    }
                    used_r[best.0] = true;
                    used_c[best.1] = true;
                    best.2.clamp(-1.0, 1.0)
                })
                .collect()
        }
    };
    let mean_angle = cosines.iter().map(|c| c.acos()).sum::<f64>() / k as f64;
    Ok(mean_angle.cos())
}

/// The `N × N` complementarity matrix over the round's cohort (spec §2.3): `C_ii = 1`, and
/// `C_ij = 1` for any pair with a silo that had no usable subspace (`None`, spec §2.3
/// numerics).
pub fn complementarity_matrix(
    subspaces: &[Option<Subspace>],
    method: PrincipalAngles,
) -> Result<Vec<Vec<f64>>, FedsacError> {
    let n = subspaces.len();
    let mut c = vec![vec![1.0; n]; n];
    for i in 0..n {
        for j in i + 1..n {
            if let (Some(a), Some(b)) = (&subspaces[i], &subspaces[j]) {
                let x = complementarity(a, b, method)?;
                c[i][j] = x;
                c[j][i] = x;
            }
        }
    }
    Ok(c)
}

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
/// `W`. Each sender's personalised model and direction are [`personalise`] of its row. With
/// no senders, the graph is empty (α is still scheduled).
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

/// A sender's personalised model [`mix`] and next round's regulariser [`direction`] from its
/// row of the graph (spec §4 step 4), in that order.
pub fn personalise(models: &[&[f32]], row: &[f64]) -> Result<(Vec<f32>, Vec<f32>), FedsacError> {
    Ok((mix(models, row)?, direction(models, row)?))
}

fn check_row(models: &[&[f32]], row: &[f64]) -> Result<usize, FedsacError> {
    if models.len() != row.len() {
        return Err(FedsacError::Shape {
            what: "weight row",
            index: 0,
            got: row.len(),
            expected: models.len(),
        });
    }
    let len = models.first().map(|m| m.len()).ok_or(FedsacError::Empty)?;
    if let Some((index, m)) = models.iter().enumerate().find(|(_, m)| m.len() != len) {
        return Err(FedsacError::Shape {
            what: "model",
            index,
            got: m.len(),
            expected: len,
        });
    }
    Ok(len)
}

/// Personalised aggregation (spec §4 step 4): `θ̃^i = Σ_j W_ij θ^j`, accumulated in f64.
pub fn mix(models: &[&[f32]], row: &[f64]) -> Result<Vec<f32>, FedsacError> {
    let len = check_row(models, row)?;
    let mut acc = vec![0f64; len];
    for (m, &w) in models.iter().zip(row) {
        if w != 0.0 {
            acc.iter_mut()
                .zip(m.iter())
                .for_each(|(a, &x)| *a += w * f64::from(x));
        }
    }
    Ok(acc.into_iter().map(|x| x as f32).collect())
}

/// The regulariser's direction for next round (spec §4 step 4, §4.3):
/// `c^i = Σ_j W_ij θ^j / ‖θ^j‖` (unit-normalised neighbour models, not `θ̃^i`).
pub fn direction(models: &[&[f32]], row: &[f64]) -> Result<Vec<f32>, FedsacError> {
    let len = check_row(models, row)?;
    let mut acc = vec![0f64; len];
    for (m, &w) in models.iter().zip(row) {
        let nm = m.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        if w != 0.0 && nm > 0.0 {
            let s = w / nm;
            acc.iter_mut()
                .zip(m.iter())
                .for_each(|(a, &x)| *a += s * f64::from(x));
        }
    }
    Ok(acc.into_iter().map(|x| x as f32).collect())
}

/// Adds the gradient of the local regulariser `sign · λ · ⟨c, θ⟩ / ‖θ‖` to `grad` (spec §4
/// step 1, §7.4): `sign · λ · (c / ‖θ‖ − ⟨c, θ⟩ θ / ‖θ‖³)`, with `sign = −1` for
/// [`RegSign::Attract`]. Nothing is added when `θ = 0` or `λ = 0`.
pub fn add_regulariser_grad(
    theta: &[f32],
    c: &[f32],
    lambda: f64,
    sign: RegSign,
    grad: &mut [f32],
) {
    let nt = theta
        .iter()
        .map(|&x| f64::from(x).powi(2))
        .sum::<f64>()
        .sqrt();
    if nt == 0.0 || lambda == 0.0 {
        return;
    }
    let ct: f64 = c
        .iter()
        .zip(theta)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum();
    let s = match sign {
        RegSign::Attract => -lambda,
        RegSign::Repel => lambda,
    };
    let (a, b) = (s / nt, s * ct / nt.powi(3));
    for ((g, &ci), &ti) in grad.iter_mut().zip(c).zip(theta) {
        *g += (a * f64::from(ci) - b * f64::from(ti)) as f32;
    }
}

#[cfg(test)]
mod tests {
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
}
