//! The Gram matrix of the clients' pseudo-gradients (spec `docs/specs/hcct.md` §2.4),
//! the client utility (§1.4, eq. 9) and the merge benefit (§2.2, eqs. 13–16) computed on it.
//! Owns: [`Gram`], [`client_utilities`], [`merge_benefit`], and the f64 dot products and
//! cosines they are built from.
//! Must not: choose merges (`partition.rs`) or hold state between rounds (`schedule.rs`).

use super::{Alpha, HcctError};

/// Γ_ij = ⟨g_i, g_j⟩ of the clients' pseudo-gradients, accumulated in f64 (spec §2.4). Every
/// quantity ClientPartition needs is a linear combination of these, so the partition costs
/// nothing more per parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Gram {
    n: usize,
    /// Row-major n × n.
    values: Vec<f64>,
}

impl Gram {
    /// The Gram matrix of `grads` (flat `f32` vectors of one layout), summed in f64 in index
    /// order (bit-reproducible). O(N² M).
    pub fn from_gradients(grads: &[&[f32]]) -> Result<Self, HcctError> {
        let n = grads.len();
        let m = grads.first().map_or(0, |g| g.len());
        for (client, g) in grads.iter().enumerate() {
            if g.len() != m {
                return Err(HcctError::Length {
                    client,
                    expected: m,
                    got: g.len(),
                });
            }
            if g.iter().any(|x| !x.is_finite()) {
                return Err(HcctError::NonFinite { client });
            }
        }
        let mut values = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                let d = dot(grads[i], grads[j]);
                values[i * n + j] = d;
                values[j * n + i] = d;
            }
        }
        Ok(Self { n, values })
    }

    /// A Gram matrix from rows a coordinator received (e.g. computed by the peers); must be
    /// square, finite and symmetric (the mirror entry is taken as given, not averaged).
    pub fn from_rows(rows: &[Vec<f64>]) -> Result<Self, HcctError> {
        let n = rows.len();
        let mut values = Vec::with_capacity(n * n);
        for (client, row) in rows.iter().enumerate() {
            if row.len() != n {
                return Err(HcctError::Length {
                    client,
                    expected: n,
                    got: row.len(),
                });
            }
            if row.iter().any(|x| !x.is_finite()) {
                return Err(HcctError::NonFinite { client });
            }
            values.extend_from_slice(row);
        }
        for i in 0..n {
            for j in 0..i {
                let (ij, ji) = (values[i * n + j], values[j * n + i]);
                if ij != ji {
                    return Err(HcctError::Asymmetric { i, j, ij, ji });
                }
            }
        }
        Ok(Self { n, values })
    }

    /// Number of clients.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True when there are no clients.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// ⟨g_i, g_j⟩.
    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.values[i * self.n + j]
    }

    /// The pairwise cosines cos(g_i, g_j) (0 where a norm is zero, A11): what to log when
    /// calibrating α (spec §6.4).
    pub fn cosines(&self) -> Vec<Vec<f64>> {
        (0..self.n)
            .map(|i| {
                (0..self.n)
                    .map(|j| cosine(self.get(i, j), self.get(i, i), self.get(j, j)))
                    .collect()
            })
            .collect()
    }
}

/// ⟨a, b⟩ in f64, summed in index order.
fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// A squared norm of a group mean below this fraction of its members' mean squared norm is
/// cancellation noise, and the mean counts as zero (spec §1.4, A11: cos = 0 for a zero norm).
const ZERO_MEAN_REL: f64 = 1e-12;

/// cos from a dot product and two squared norms, 0 when either norm is zero (A11), clamped to
/// [−1, 1] against rounding.
fn cosine(dot: f64, a_sq: f64, b_sq: f64) -> f64 {
    if a_sq <= f64::MIN_POSITIVE || b_sq <= f64::MIN_POSITIVE {
        return 0.0;
    }
    (dot / (a_sq.sqrt() * b_sq.sqrt())).clamp(-1.0, 1.0)
}

/// U_i(G) − β for every member i of `group` (eq. 9, β dropped as it cancels, §1.3):
/// −α_i / D̂_G + cos(g_i, ĝ_G), with ĝ_G = Σ_j (D_j / D̂_G) g_j. A singleton's similarity is
/// exactly 1 (the code hard-codes it; A11), whatever its gradient. `group` must be sorted and
/// in range (the summation order is then canonical).
pub fn client_utilities(gram: &Gram, sizes: &[usize], alpha: Alpha, group: &[usize]) -> Vec<f64> {
    let total: f64 = group.iter().map(|&j| sizes[j] as f64).sum();
    if let [i] = group {
        return vec![-alpha.of(sizes[*i]) / total + 1.0];
    }
    let a: Vec<f64> = group.iter().map(|&j| sizes[j] as f64 / total).collect();
    // ⟨g_i, ĝ⟩ = Σ_j a_j Γ_ij ; ‖ĝ‖² = Σ_j a_j ⟨g_j, ĝ⟩ (spec §2.4).
    let to_mean: Vec<f64> = group
        .iter()
        .map(|&i| {
            group
                .iter()
                .zip(&a)
                .map(|(&j, &aj)| aj * gram.get(i, j))
                .sum()
        })
        .collect();
    let mean_sq: f64 = a.iter().zip(&to_mean).map(|(aj, d)| aj * d).sum();
    let spread: f64 = group
        .iter()
        .zip(&a)
        .map(|(&j, aj)| aj * gram.get(j, j))
        .sum();
    let mean_sq = if mean_sq <= ZERO_MEAN_REL * spread {
        0.0
    } else {
        mean_sq
    };
    group
        .iter()
        .zip(&to_mean)
        .map(|(&i, &d)| -alpha.of(sizes[i]) / total + cosine(d, gram.get(i, i), mean_sq))
        .collect()
}

/// B(k₁, k₂) = Û_{k₁∪k₂} − Û_{k₁} − Û_{k₂} (eq. 15): the new utilities of the union's members
/// minus their current ones, `current[i]` (each client's utility in its current group, the
/// code's `u_list`; §2.2). Both groups sorted, disjoint and in range.
pub fn merge_benefit(
    gram: &Gram,
    sizes: &[usize],
    alpha: Alpha,
    current: &[f64],
    first: &[usize],
    second: &[usize],
) -> f64 {
    let union = sorted_union(first, second);
    let new: f64 = client_utilities(gram, sizes, alpha, &union).iter().sum();
    let old: f64 = union.iter().map(|&i| current[i]).sum();
    new - old
}

pub(super) fn sorted_union(a: &[usize], b: &[usize]) -> Vec<usize> {
    let mut u: Vec<usize> = a.iter().chain(b).copied().collect();
    u.sort_unstable();
    u
}
