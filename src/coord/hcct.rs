//! HCCT, hierarchical clustering-based collaborative training (Sun, Kountouris & Zhang, "How to
//! Collaborate", IEEE TMC 2024; spec `../shared/specs/hcct.md`), as pure, transport-free code.
//!
//! Owns: the client utility (spec §1.4, eq. 9) and the merge benefit (§2.2, eqs. 13–16) on the
//! Gram matrix of the pseudo-gradients (§2.4, accumulated in f64); ClientPartition (Algorithm 2,
//! §2.3), greedy agglomerative merging from singletons with deterministic tie-breaking; the
//! per-round schedule of partitions a coordinator hands out ([`Coordinator`]: round 0, every
//! round from scratch or one-shot, stale reports, §3 and §5); the size-weighted group average
//! (§3 steps 2 and 4), the pseudo-gradient and learning-rate schedule (§1.3, §3); HCCT-E's layer
//! choice (§2.5); and the `[hcct]` hyperparameters with the spec's defaults.
//! Must not: touch tensors, sockets, clocks or threads (std, rand and serde only). Local
//! training is the driver's (`sim::hcct`); this module sees flat `f32` slices and sample counts.
//!
//! Privacy note (spec §5): the coordinator sees each client's pseudo-gradient, the same exposure
//! to gradient inversion as a FedAvg server; it never sees data.

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Errors of the HCCT core. Each names the value at fault and what was allowed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum HcctError {
    /// α must be a finite number ≥ 0 (spec §1.3).
    #[error("alpha must be a finite number >= 0 or \"client_size\", got {0}")]
    Alpha(f64),
    /// The forced group count of the `fix_D` ablation (§2.3) must be at least 1.
    #[error("groups must be at least 1, got {0}")]
    Groups(usize),
    /// The SGD learning rate η₀ (§3) must be finite and > 0.
    #[error("lr must be a finite number > 0, got {0}")]
    Lr(f64),
    /// The per-round decay of η (§3) must be in (0, 1].
    #[error("lr_decay must be in (0, 1], got {0}")]
    LrDecay(f64),
    /// E, local epochs per round (§3), must be at least 1.
    #[error("epochs must be at least 1, got {0}")]
    Epochs(usize),
    /// Every client needs at least one training sample (D_i ≥ 1, §1.3).
    #[error("client {client} has {size} training samples; D_i must be at least 1")]
    Size {
        /// The client.
        client: usize,
        /// Its reported sample count.
        size: usize,
    },
    /// One value per client was expected.
    #[error("{what}: expected one per client ({expected}), got {got}")]
    Count {
        /// What was counted.
        what: &'static str,
        /// Clients.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// All pseudo-gradients (and models) must have the same length (one parameter layout, §5).
    #[error("client {client}: expected {expected} values, got {got}")]
    Length {
        /// The client.
        client: usize,
        /// The length of the first vector.
        expected: usize,
        /// This vector's length.
        got: usize,
    },
    /// A NaN or infinite value in a pseudo-gradient or Gram matrix.
    #[error("client {client}: non-finite value in its pseudo-gradient or Gram row")]
    NonFinite {
        /// The client.
        client: usize,
    },
    /// A Gram matrix whose entries (i, j) and (j, i) differ.
    #[error("Gram matrix is not symmetric: entry ({i}, {j}) is {ij}, entry ({j}, {i}) is {ji}")]
    Asymmetric {
        /// Row.
        i: usize,
        /// Column.
        j: usize,
        /// Γ_ij.
        ij: f64,
        /// Γ_ji.
        ji: f64,
    },
    /// A parameter block of HCCT-E lies outside the gradient.
    #[error("layer block {start}..{end} is outside a pseudo-gradient of {len} values")]
    Block {
        /// Block start.
        start: usize,
        /// Block end.
        end: usize,
        /// Gradient length.
        len: usize,
    },
}

// ------------------------------------------------------------------------------------------------
// Hyperparameters
// ------------------------------------------------------------------------------------------------

/// The trade-off constant α of the utility (spec §1.3–1.4). Written as a number or
/// `"client_size"` in files.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "AlphaRepr", into = "AlphaRepr")]
pub enum Alpha {
    /// One α for every client: size term −α / D̂_G.
    Constant(f64),
    /// α_i = D_i (code `--alpha -1`): size term −D_i / D̂_G, so every merge gains exactly +1 in
    /// the size term (spec §1.4, §4 item 5).
    ClientSize,
}

impl Default for Alpha {
    /// α = 1: the code's default (`utils/options.py`) and the paper's value for Digit and
    /// CIFAR-10 (spec §6.1).
    fn default() -> Self {
        Alpha::Constant(1.0)
    }
}

impl Alpha {
    /// α_i of a client with `size` training samples.
    pub fn of(self, size: usize) -> f64 {
        match self {
            Alpha::Constant(a) => a,
            Alpha::ClientSize => size as f64,
        }
    }

    /// Checks a constant α is finite and ≥ 0.
    pub fn validate(self) -> Result<(), HcctError> {
        match self {
            Alpha::Constant(a) if !(a.is_finite() && a >= 0.0) => Err(HcctError::Alpha(a)),
            _ => Ok(()),
        }
    }
}

/// How an [`Alpha`] is written: a number or a name.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum AlphaRepr {
    Number(f64),
    Name(String),
}

impl TryFrom<AlphaRepr> for Alpha {
    type Error = String;
    fn try_from(r: AlphaRepr) -> Result<Self, String> {
        match r {
            AlphaRepr::Number(a) => {
                let alpha = Alpha::Constant(a);
                alpha.validate().map_err(|e| e.to_string())?;
                Ok(alpha)
            }
            AlphaRepr::Name(n) if n == "client_size" => Ok(Alpha::ClientSize),
            AlphaRepr::Name(n) => Err(format!(
                "alpha must be a finite number >= 0 or \"client_size\", got \"{n}\""
            )),
        }
    }
}

impl From<Alpha> for AlphaRepr {
    fn from(a: Alpha) -> Self {
        match a {
            Alpha::Constant(a) => AlphaRepr::Number(a),
            Alpha::ClientSize => AlphaRepr::Name("client_size".into()),
        }
    }
}

/// When ClientPartition stops merging (spec §2.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stop {
    /// Merge while the best benefit is strictly positive (Algorithm 2 and the code; A3).
    #[default]
    PositiveBenefit,
    /// Always merge the best pair, even at B ≤ 0, until this many groups remain (the code's
    /// `--fix_D` ablation, Figs. 5–6).
    Groups(usize),
}

/// The local optimizer of a silo's round (spec §3 step 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// Plain mini-batch SGD at η_t = `lr` · `lr_decay`^t, momentum 0, no weight decay (the
    /// paper and the code's `torch.optim.SGD`).
    #[default]
    Sgd,
    /// The crate's shared local routine (the `local` and `fedavg` baselines'): one persistent
    /// Adam per silo at `train.lr`, so HCCT compares with them on the same routine (spec §5, last
    /// point). `lr` and `lr_decay` are then unused; pseudo-gradients are divided by `train.lr`.
    Adam,
}

/// `[hcct]`: HCCT's hyperparameters. Defaults are the spec's (§3, §6.1, §7).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HcctConfig {
    /// α, the weight of the data-size term of the utility (§1.3). Default 1 (the code's; the
    /// paper uses 1 for Digit and CIFAR-10, 100 for FMNIST). Recalibrate it for other sizes
    /// (§6.4): two equal-size singletons of D samples merge iff α / D > 2 − cos₁ − cos₂.
    pub alpha: Alpha,
    /// E: local epochs per round (Table 3: 1 for FMNIST and CIFAR-10, 5 for Digit).
    pub epochs: usize,
    /// η₀ of SGD (code default 0.1).
    pub lr: f64,
    /// Per-round decay of η: η_t = η₀ · decay^t with t the 0-based round (code default 0.995).
    pub lr_decay: f64,
    /// The local optimizer.
    pub optimizer: Optimizer,
    /// Round 0 as one FedAvg group instead of singletons (the code's behaviour, A1). Default
    /// off: the paper's singletons from a common initial model.
    pub round0_global: bool,
    /// Partition once, after round 0, and keep it (the code's `--one_shot`, A4). Default off:
    /// a fresh partition from singletons every round.
    pub one_shot: bool,
    /// Force this many groups, merging even at B ≤ 0 (the code's `--fix_D` ablation). Default
    /// unset: stop at the first non-positive best benefit.
    pub groups: Option<usize>,
    /// HCCT-E (§2.5): similarities use one layer's block of the pseudo-gradients, the layer
    /// chosen once before training by [`select_layer`]. Default off (full HCCT). It needs its
    /// own α (the paper: 100 for FMNIST and Digit, 10 for CIFAR-10).
    pub efficient: bool,
    /// HCCT-P (§2.6, A12): group members share the body but keep their own classifier (the
    /// last linear layer): a member starts each round from its group's average body and its
    /// own head, and keeps its own trained head after aggregation. Similarities still use the
    /// full pseudo-gradients. Default off.
    pub personal: bool,
}

impl Default for HcctConfig {
    fn default() -> Self {
        Self {
            alpha: Alpha::default(),
            epochs: 1,
            lr: 0.1,
            lr_decay: 0.995,
            optimizer: Optimizer::Sgd,
            round0_global: false,
            one_shot: false,
            groups: None,
            efficient: false,
            personal: false,
        }
    }
}

impl HcctConfig {
    /// Checks every field; the error names the field, the allowed range and the value.
    pub fn validate(&self) -> Result<(), HcctError> {
        self.alpha.validate()?;
        if self.epochs < 1 {
            return Err(HcctError::Epochs(self.epochs));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(HcctError::Lr(self.lr));
        }
        if !(self.lr_decay > 0.0 && self.lr_decay <= 1.0) {
            return Err(HcctError::LrDecay(self.lr_decay));
        }
        if let Some(k) = self.groups.filter(|&k| k < 1) {
            return Err(HcctError::Groups(k));
        }
        Ok(())
    }

    /// The partition rule these settings ask for.
    pub fn partition_config(&self) -> PartitionConfig {
        PartitionConfig {
            alpha: self.alpha,
            stop: self.groups.map_or(Stop::PositiveBenefit, Stop::Groups),
        }
    }

    /// The coordinator schedule these settings ask for.
    pub fn coordinator_config(&self) -> CoordinatorConfig {
        CoordinatorConfig {
            partition: self.partition_config(),
            round0_global: self.round0_global,
            one_shot: self.one_shot,
        }
    }

    /// η_t for SGD (§3): `lr · lr_decay^t`, t the 0-based round.
    pub fn sgd_lr(&self, round: usize) -> f64 {
        learning_rate(self.lr, self.lr_decay, round)
    }
}

/// η_t = η₀ · decay^t (spec §3; the paper's 0.995^{t−1} with t from 1).
pub fn learning_rate(lr0: f64, decay: f64, round: usize) -> f64 {
    lr0 * decay.powf(round as f64)
}

// ------------------------------------------------------------------------------------------------
// Gram matrix, utility, benefit
// ------------------------------------------------------------------------------------------------

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

fn sorted_union(a: &[usize], b: &[usize]) -> Vec<usize> {
    let mut u: Vec<usize> = a.iter().chain(b).copied().collect();
    u.sort_unstable();
    u
}

// ------------------------------------------------------------------------------------------------
// ClientPartition (Algorithm 2)
// ------------------------------------------------------------------------------------------------

/// What ClientPartition needs besides the gradients and sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PartitionConfig {
    /// α.
    pub alpha: Alpha,
    /// When to stop merging.
    pub stop: Stop,
}

/// One merge of ClientPartition.
#[derive(Clone, Debug, PartialEq)]
pub struct Merge {
    /// Key (smallest member) of the group that absorbed the other; the smaller of the two.
    pub kept: usize,
    /// Key of the absorbed group.
    pub absorbed: usize,
    /// B of the merge (eq. 15); > 0 unless [`Stop::Groups`] forced it.
    pub benefit: f64,
    /// Σ_i U_i (β dropped) after the merge.
    pub total_utility: f64,
}

/// A partition of the clients and how it was reached.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    /// Disjoint groups covering every client, each sorted by client index, ordered by their
    /// smallest member (the group key).
    pub groups: Vec<Vec<usize>>,
    /// The merges in the order they were made (empty for singletons).
    pub merges: Vec<Merge>,
    /// U_i − β of every client in its final group.
    pub utilities: Vec<f64>,
}

impl Partition {
    /// N singletons (the paper's round 0, §3).
    pub fn singletons(clients: usize) -> Self {
        Self {
            groups: (0..clients).map(|i| vec![i]).collect(),
            merges: Vec::new(),
            utilities: Vec::new(),
        }
    }

    /// One group of every client (the code's round 0, A1).
    pub fn one_group(clients: usize) -> Self {
        Self {
            groups: if clients == 0 {
                Vec::new()
            } else {
                vec![(0..clients).collect()]
            },
            merges: Vec::new(),
            utilities: Vec::new(),
        }
    }

    /// K, the number of groups.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// True when there are no clients.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The index in [`Self::groups`] of each client's group.
    pub fn group_of(&self) -> Vec<usize> {
        let n = self.groups.iter().map(Vec::len).sum();
        let mut of = vec![0; n];
        for (k, g) in self.groups.iter().enumerate() {
            for &i in g {
                of[i] = k;
            }
        }
        of
    }

    /// Σ_i (U_i − β) in the final groups.
    pub fn total_utility(&self) -> f64 {
        self.utilities.iter().sum()
    }
}

/// ClientPartition (Algorithm 2, spec §2.3) on the Gram matrix of the pseudo-gradients.
///
/// From N singletons (u_i = −α_i/D_i + 1), repeatedly: compute B for every pair of current
/// groups, scanning groups in ascending key order (outer c_i, inner c_j < c_i) and keeping the
/// first strict maximum, so ties go to the smallest c_i, then the smallest c_j; stop when the
/// best B ≤ 0 ([`Stop::PositiveBenefit`]; the best starts at 0.0 and must be beaten strictly,
/// A3) or when the forced group count is reached ([`Stop::Groups`]); otherwise the smaller key
/// absorbs the other and its members' utilities are updated. At most N − 1 merges.
///
/// `sizes[i]` is D_i, client i's raw training-sample count (A5), at least 1.
pub fn partition(
    gram: &Gram,
    sizes: &[usize],
    cfg: &PartitionConfig,
) -> Result<Partition, HcctError> {
    let n = gram.len();
    if sizes.len() != n {
        return Err(HcctError::Count {
            what: "sample counts",
            expected: n,
            got: sizes.len(),
        });
    }
    if let Some(client) = sizes.iter().position(|&d| d == 0) {
        return Err(HcctError::Size { client, size: 0 });
    }
    cfg.alpha.validate()?;
    let floor = match cfg.stop {
        Stop::PositiveBenefit => 1,
        Stop::Groups(0) => return Err(HcctError::Groups(0)),
        Stop::Groups(k) => k,
    };
    let mut groups: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    let mut u: Vec<f64> = (0..n)
        .map(|i| client_utilities(gram, sizes, cfg.alpha, &[i])[0])
        .collect();
    let mut merges = Vec::new();
    while groups.len() > floor {
        // (benefit, c_i, c_j) of the best pair, c_j < c_i in key order.
        let mut best: Option<(f64, usize, usize)> = None;
        let threshold = match cfg.stop {
            Stop::PositiveBenefit => 0.0,
            Stop::Groups(_) => f64::NEG_INFINITY,
        };
        for ci in 0..groups.len() {
            for cj in 0..ci {
                let b = merge_benefit(gram, sizes, cfg.alpha, &u, &groups[cj], &groups[ci]);
                if b > best.map_or(threshold, |x| x.0) {
                    best = Some((b, ci, cj));
                }
            }
        }
        let Some((benefit, ci, cj)) = best else {
            break;
        };
        let absorbed = groups.remove(ci);
        let merged = sorted_union(&groups[cj], &absorbed);
        for (&i, v) in merged
            .iter()
            .zip(client_utilities(gram, sizes, cfg.alpha, &merged))
        {
            u[i] = v;
        }
        groups[cj] = merged;
        merges.push(Merge {
            kept: groups[cj][0],
            absorbed: absorbed[0],
            benefit,
            total_utility: u.iter().sum(),
        });
    }
    Ok(Partition {
        groups,
        merges,
        utilities: u,
    })
}

/// ClientPartition straight from the pseudo-gradients: [`Gram::from_gradients`], then
/// [`partition`].
pub fn partition_gradients(
    grads: &[&[f32]],
    sizes: &[usize],
    cfg: &PartitionConfig,
) -> Result<Partition, HcctError> {
    partition(&Gram::from_gradients(grads)?, sizes, cfg)
}

// ------------------------------------------------------------------------------------------------
// The round schedule of a coordinator (§3, §5)
// ------------------------------------------------------------------------------------------------

/// How a [`Coordinator`] schedules partitions.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CoordinatorConfig {
    /// ClientPartition's rule.
    pub partition: PartitionConfig,
    /// Round 0 as one group (code) instead of singletons (paper), A1.
    pub round0_global: bool,
    /// Partition once after round 0 and keep it, A4.
    pub one_shot: bool,
}

/// The coordinator's side of HCCT (spec §5): which groups train together in each round.
///
/// Round t's groups are [`Coordinator::groups`]. After every client reported its round-t
/// pseudo-gradient, [`Coordinator::handle_reports`] computes round t+1's partition from them
/// (A2: the newest gradients, g^t, feed Π_{t+1}), from singletons every round (A4) unless
/// `one_shot`. It holds sample counts and the latest gradients, never models or data.
#[derive(Clone, Debug)]
pub struct Coordinator {
    cfg: CoordinatorConfig,
    sizes: Vec<usize>,
    round: usize,
    current: Partition,
    /// The latest pseudo-gradient of each client (reused, flagged stale, when a report is
    /// missing; §5 "missing or late report").
    latest: Vec<Option<Vec<f32>>>,
    /// Clients whose gradient in the last partition was a stale one.
    stale: Vec<bool>,
    /// The Gram matrix the last partition used (clients with a gradient only).
    last_gram: Option<Gram>,
}

impl Coordinator {
    /// A coordinator for clients with `sizes[i]` training samples; round 0's groups are
    /// singletons, or one group with `round0_global`. Invalid sizes (0) or settings are
    /// reported by the first [`Self::handle_reports`].
    pub fn new(sizes: Vec<usize>, cfg: CoordinatorConfig) -> Self {
        let n = sizes.len();
        Self {
            current: if cfg.round0_global {
                Partition::one_group(n)
            } else {
                Partition::singletons(n)
            },
            cfg,
            sizes,
            round: 0,
            latest: vec![None; n],
            stale: vec![false; n],
            last_gram: None,
        }
    }

    /// The round whose groups [`Self::groups`] gives (0-based).
    pub fn round(&self) -> usize {
        self.round
    }

    /// The groups of the current round, sorted members, ordered by smallest member.
    pub fn groups(&self) -> &[Vec<usize>] {
        &self.current.groups
    }

    /// The current round's partition with its merge trace.
    pub fn partition(&self) -> &Partition {
        &self.current
    }

    /// The Gram matrix behind the current partition (clients that had a gradient, in index
    /// order), for logging cosines; `None` before the first partition.
    pub fn last_gram(&self) -> Option<&Gram> {
        self.last_gram.as_ref()
    }

    /// Which clients' gradients in the current partition were stale (reused from an earlier
    /// round because the report was missing).
    pub fn stale(&self) -> &[bool] {
        &self.stale
    }

    /// What a restarted coordinator needs to carry on exactly: the round, its groups and every
    /// client's latest pseudo-gradient (the merge trace and Gram matrix are for logs only).
    pub fn snapshot(&self) -> CoordinatorSnapshot {
        CoordinatorSnapshot {
            round: self.round,
            groups: self.current.groups.clone(),
            latest: self.latest.clone(),
        }
    }

    /// A coordinator carrying on from `snap`. Refused when the snapshot does not fit `sizes`
    /// (another client count, or groups that are not a partition of the clients).
    pub fn restore(
        sizes: Vec<usize>,
        cfg: CoordinatorConfig,
        snap: CoordinatorSnapshot,
    ) -> Result<Self, HcctError> {
        let n = sizes.len();
        if snap.latest.len() != n {
            return Err(HcctError::Count {
                what: "saved gradients",
                expected: n,
                got: snap.latest.len(),
            });
        }
        let mut seen = vec![false; n];
        for &i in snap.groups.iter().flatten() {
            if i >= n || std::mem::replace(&mut seen[i], true) {
                return Err(HcctError::Count {
                    what: "clients in the saved groups",
                    expected: n,
                    got: i + 1,
                });
            }
        }
        if seen.iter().any(|s| !s) {
            return Err(HcctError::Count {
                what: "clients in the saved groups",
                expected: n,
                got: seen.iter().filter(|s| **s).count(),
            });
        }
        Ok(Self {
            cfg,
            sizes,
            round: snap.round,
            current: Partition {
                groups: snap.groups,
                merges: Vec::new(),
                utilities: Vec::new(),
            },
            latest: snap.latest,
            stale: vec![false; n],
            last_gram: None,
        })
    }

    /// Call after round t's local training with each client's pseudo-gradient (`None` for a
    /// missing report): computes round t+1's partition and advances the round. A client with
    /// no gradient yet stays a singleton; a missing report reuses the previous gradient (§5).
    pub fn handle_reports(&mut self, grads: &[Option<&[f32]>]) -> Result<&Partition, HcctError> {
        let n = self.sizes.len();
        if grads.len() != n {
            return Err(HcctError::Count {
                what: "reports",
                expected: n,
                got: grads.len(),
            });
        }
        if let Some(client) = self.sizes.iter().position(|&d| d == 0) {
            return Err(HcctError::Size { client, size: 0 });
        }
        self.cfg.partition.alpha.validate()?;
        if self.cfg.partition.stop == Stop::Groups(0) {
            return Err(HcctError::Groups(0));
        }
        for (i, g) in grads.iter().enumerate() {
            self.stale[i] = g.is_none() && self.latest[i].is_some();
            if let Some(g) = g {
                self.latest[i] = Some(g.to_vec());
            }
        }
        self.round += 1;
        if self.cfg.one_shot && self.round > 1 {
            return Ok(&self.current);
        }
        let have: Vec<usize> = (0..n).filter(|&i| self.latest[i].is_some()).collect();
        let vecs: Vec<&[f32]> = have
            .iter()
            .filter_map(|&i| self.latest[i].as_deref())
            .collect();
        let gram = Gram::from_gradients(&vecs)?;
        let sizes: Vec<usize> = have.iter().map(|&i| self.sizes[i]).collect();
        let sub = partition(&gram, &sizes, &self.cfg.partition)?;
        self.current = lift(&sub, &have, n);
        self.last_gram = Some(gram);
        Ok(&self.current)
    }
}

/// A [`Coordinator`]'s state for a checkpoint ([`Coordinator::snapshot`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoordinatorSnapshot {
    /// The round whose groups `groups` are.
    pub round: usize,
    /// That round's groups.
    pub groups: Vec<Vec<usize>>,
    /// Each client's latest pseudo-gradient.
    pub latest: Vec<Option<Vec<f32>>>,
}

/// A partition of the clients `have` (sub-indices) as one of all `n` clients: the others are
/// singletons; groups re-keyed and re-ordered by smallest member.
fn lift(sub: &Partition, have: &[usize], n: usize) -> Partition {
    if have.len() == n {
        return sub.clone();
    }
    let mut groups: Vec<Vec<usize>> = sub
        .groups
        .iter()
        .map(|g| g.iter().map(|&j| have[j]).collect())
        .collect();
    groups.extend((0..n).filter(|i| !have.contains(i)).map(|i| vec![i]));
    groups.sort();
    let mut utilities = vec![f64::NAN; n];
    for (j, &i) in have.iter().enumerate() {
        utilities[i] = sub.utilities[j];
    }
    Partition {
        groups,
        merges: sub
            .merges
            .iter()
            .map(|m| Merge {
                kept: have[m.kept],
                absorbed: have[m.absorbed],
                ..m.clone()
            })
            .collect(),
        utilities,
    }
}

// ------------------------------------------------------------------------------------------------
// Models and pseudo-gradients (§1.3, §3)
// ------------------------------------------------------------------------------------------------

/// Σ_j (D_j / D̂) · model_j, accumulated in f64 in the given (canonical, member) order and
/// rounded once to f32 (§3 steps 2 and 4; §5 step 4's one canonical path). Averaging identical
/// models gives them back bit for bit (the f64 error is far below half an f32 ulp), so a group
/// whose membership did not change keeps its model exactly.
pub fn group_average(models: &[&[f32]], sizes: &[usize]) -> Result<Vec<f32>, HcctError> {
    if models.len() != sizes.len() {
        return Err(HcctError::Count {
            what: "sample counts",
            expected: models.len(),
            got: sizes.len(),
        });
    }
    if let Some(client) = sizes.iter().position(|&d| d == 0) {
        return Err(HcctError::Size { client, size: 0 });
    }
    let m = models.first().map_or(0, |p| p.len());
    if let Some(client) = models.iter().position(|p| p.len() != m) {
        return Err(HcctError::Length {
            client,
            expected: m,
            got: models[client].len(),
        });
    }
    let total: f64 = sizes.iter().map(|&d| d as f64).sum();
    let mut acc = vec![0f64; m];
    for (p, &d) in models.iter().zip(sizes) {
        let w = d as f64 / total;
        for (a, &x) in acc.iter_mut().zip(p.iter()) {
            *a += w * f64::from(x);
        }
    }
    Ok(acc.into_iter().map(|x| x as f32).collect())
}

/// g = (w_start − w_end) / η (§1.3, eq. 5): for plain SGD at a constant η this is exactly the
/// sum of the mini-batch-mean gradients of the round, so that ŵ − η Σ a_i g_i is the group
/// update.
pub fn pseudo_gradient(start: &[f32], end: &[f32], lr: f64) -> Vec<f32> {
    let inv = (1.0 / lr) as f32;
    start
        .iter()
        .zip(end)
        .map(|(&s, &e)| (s - e) * inv)
        .collect()
}

// ------------------------------------------------------------------------------------------------
// HCCT-E (§2.5)
// ------------------------------------------------------------------------------------------------

/// HCCT-E's score of each layer (§2.5, the code's formula, A6 "faithful"): for each parameter
/// tensor of the layer, the variance (unbiased, as `torch.var`) over all entries of all clients
/// pooled, divided by their *signed* pooled mean (0 where the mean is exactly 0, the guard A6
/// asks for); a layer's score is the sum over its tensors (weight and bias). `layers[l]` lists
/// the flat ranges of layer l's tensors.
pub fn layer_scores(grads: &[&[f32]], layers: &[Vec<Range<usize>>]) -> Result<Vec<f64>, HcctError> {
    let len = grads.first().map_or(0, |g| g.len());
    if let Some(client) = grads.iter().position(|g| g.len() != len) {
        return Err(HcctError::Length {
            client,
            expected: len,
            got: grads[client].len(),
        });
    }
    layers
        .iter()
        .map(|tensors| {
            let mut score = 0.0;
            for r in tensors {
                if r.start > r.end || r.end > len {
                    return Err(HcctError::Block {
                        start: r.start,
                        end: r.end,
                        len,
                    });
                }
                let count = (r.len() * grads.len()) as f64;
                let mean = grads
                    .iter()
                    .flat_map(|g| &g[r.clone()])
                    .map(|&x| f64::from(x))
                    .sum::<f64>()
                    / count;
                let ss: f64 = grads
                    .iter()
                    .flat_map(|g| &g[r.clone()])
                    .map(|&x| (f64::from(x) - mean).powi(2))
                    .sum();
                let var = if count > 1.0 { ss / (count - 1.0) } else { 0.0 };
                if mean != 0.0 && mean.is_finite() {
                    score += var / mean;
                }
            }
            Ok(score)
        })
        .collect()
}

/// l* = argmax of [`layer_scores`] (the first on ties; `None` without layers). The code chooses
/// it once, from one local pass of every client from the common initial model.
pub fn select_layer(
    grads: &[&[f32]],
    layers: &[Vec<Range<usize>>],
) -> Result<Option<usize>, HcctError> {
    let scores = layer_scores(grads, layers)?;
    Ok(scores
        .iter()
        .enumerate()
        .fold(None, |best: Option<(usize, f64)>, (l, &s)| match best {
            Some((_, b)) if s <= b => best,
            _ => Some((l, s)),
        })
        .map(|(l, _)| l))
}

#[cfg(test)]
mod tests {
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
    fn first_pass_benefit(
        grads: &[Vec<f32>],
        sizes: &[usize],
        alpha: f64,
        a: usize,
        b: usize,
    ) -> f64 {
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
    fn direct_utilities(
        grads: &[Vec<f32>],
        sizes: &[usize],
        alpha: f64,
        group: &[usize],
    ) -> Vec<f64> {
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

    fn coordinator(
        sizes: Vec<usize>,
        alpha: f64,
        round0_global: bool,
        one_shot: bool,
    ) -> Coordinator {
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
}
