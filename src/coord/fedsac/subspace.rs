//! FedSaC's feature subspaces and their complementarity (spec `docs/specs/fedsac.md`
//! §2.1, §2.3, §7.1, §7.2): the silo side's top-k principal directions of its own centred
//! features, and the coordinator side's complementarity of two subspaces and of a cohort.
//! Owns: [`Subspace`], [`feature_subspace`] (with its deterministic eigen-solvers),
//! [`complementarity`], [`complementarity_matrix`] and [`PrincipalAngles`].
//! Must not: run a model (features arrive as numbers) or build the graph (`graph.rs`).

use super::FedsacError;
use serde::{Deserialize, Serialize};
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
                // A NaN fails here too (a member's NaN basis would fail every round's graph).
                if !value.is_finite() || (value - expected).abs() > 1e-6 {
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

pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub(super) fn norm(a: &[f64]) -> f64 {
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
