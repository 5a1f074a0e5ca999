//! The transport-free parts of FedCollab's pairwise discriminator protocol (spec
//! `docs/specs/fedcollab.md` §3.2): the discriminator-train split, the label-branch
//! scale, equal pair averaging, the evaluate/early-stop schedule ([`EarlyStop`]), turning the
//! best balanced accuracy into a distance, the label-TV debug distance, and assembling the
//! distance matrix.
//! Owns: what a pair computes from numbers, not the tensor work.
//! Must not: train the discriminator (`silo::fedcollab`), talk to the partner, or solve for
//! coalitions (`solver.rs`).

use rand::Rng;
use rand::seq::SliceRandom;
/// The discriminator-train size every client aims at: half the smallest client's training set,
/// `min_i m_i / 2` (spec §3.2 step 1; one global minimum over all clients, so every pair's
/// estimate sees the same amount of training data). As in the official code the target is not
/// floored (the spec's §8 item 4 writes ⌊·⌋; the two differ only for an odd minimum).
pub fn disc_train_target(sizes: &[u64]) -> f64 {
    sizes.iter().copied().min().unwrap_or(0) as f64 / 2.0
}

/// Splits one client's training rows (given by their class ids) into a discriminator-train and
/// a validation part, stratified by label (spec §3.2 step 1): each label's rows are shuffled
/// with `rng` and the first `⌊rate·n_l + 0.49⌋` go to training, the rest to validation, where
/// `rate = target / m_i` (see [`disc_train_target`]). Labels are visited in ascending order;
/// the row indices returned are grouped by label. The realised size can differ from the target
/// by a few rows.
pub fn disc_split<R: Rng + ?Sized>(
    labels: &[u32],
    num_classes: usize,
    target: f64,
    rng: &mut R,
) -> (Vec<usize>, Vec<usize>) {
    let rate = if labels.is_empty() {
        0.0
    } else {
        (target / labels.len() as f64).clamp(0.0, 1.0)
    };
    let mut train = Vec::new();
    let mut valid = Vec::new();
    for class in 0..num_classes {
        let mut rows: Vec<usize> = (0..labels.len())
            .filter(|&i| labels[i] as usize == class)
            .collect();
        rows.shuffle(rng);
        let k = ((rate * rows.len() as f64 + 0.49) as usize).min(rows.len());
        train.extend_from_slice(&rows[..k]);
        valid.extend_from_slice(&rows[k..]);
    }
    (train, valid)
}

/// ν = L/√(L−1): the scale of the discriminator's one-hot label input for L ≥ 2 classes
/// (spec §3.2, "label branch"; the code uses `max(2, classes)`).
pub fn label_branch_scale(classes: usize) -> f64 {
    let l = classes.max(2) as f64;
    l / (l - 1.0).sqrt()
}

/// The equal pair average `(a + b)/2` of two discriminator weight vectors (spec §3.2 step 4,
/// whatever the sample counts). IEEE addition commutes, so both peers of a pair computing it
/// from their own and the received vector hold bit-identical results (spec §6 phase 2).
///
/// # Panics
/// If the lengths differ (both sides train the same architecture).
pub fn average_pair(a: &[f32], b: &[f32]) -> Vec<f32> {
    assert_eq!(
        a.len(),
        b.len(),
        "a pair averages two weight vectors of one architecture"
    );
    a.iter().zip(b).map(|(x, y)| (x + y) / 2.0).collect()
}

/// The evaluate/early-stop schedule of one pair (spec §3.2 step 4): evaluate after rounds
/// 0, k, 2k, …; keep the best metric `acc_i + acc_j` (= 2·BalAcc); stop once `patience`
/// evaluations in a row fail to strictly beat it, or after `max_rounds` rounds.
///
/// Drive it as: for each round r from 0, train and average, then if
/// [`evaluates_after(r)`](Self::evaluates_after) evaluate and [`record`](Self::record) the metric;
/// stop when `record` returns true or r + 1 reaches [`max_rounds`](Self::max_rounds).
#[derive(Clone, Debug, PartialEq)]
pub struct EarlyStop {
    eval_every: usize,
    patience: usize,
    max_rounds: usize,
    best: f64,
    stale: usize,
    evaluations: usize,
}

impl EarlyStop {
    /// A fresh schedule; `patience = 0` never stops early. `eval_every` and `max_rounds` are at
    /// least 1 (validated in [`FedCollabConfig::validate`](super::FedCollabConfig::validate); 0 is treated as 1).
    pub fn new(eval_every: usize, patience: usize, max_rounds: usize) -> Self {
        Self {
            eval_every: eval_every.max(1),
            patience,
            max_rounds: max_rounds.max(1),
            best: f64::NEG_INFINITY,
            stale: 0,
            evaluations: 0,
        }
    }

    /// Most rounds the pair may run.
    pub fn max_rounds(&self) -> usize {
        self.max_rounds
    }

    /// True when the averaged model of round `round` (0-based) must be evaluated.
    pub fn evaluates_after(&self, round: usize) -> bool {
        round % self.eval_every == 0
    }

    /// Records one evaluation's metric (`acc_i + acc_j`); returns true when the pair stops.
    pub fn record(&mut self, metric: f64) -> bool {
        self.evaluations += 1;
        if metric > self.best {
            self.best = metric;
            self.stale = 0;
            false
        } else {
            self.stale += 1;
            self.patience > 0 && self.stale >= self.patience
        }
    }

    /// Evaluations recorded.
    pub fn evaluations(&self) -> usize {
        self.evaluations
    }

    /// The distance estimate `best − 1` = 2·BalAcc_best − 1 (spec §3.2 step 5): the best
    /// validation value seen, not the final model's; may be slightly negative (the solver
    /// clamps it). `None` before any evaluation.
    pub fn estimate(&self) -> Option<f64> {
        (self.evaluations > 0).then_some(self.best - 1.0)
    }
}

/// Total variation `½ Σ_l |p_i(l) − p_j(l)|` between two label histograms: the
/// [`Distance::LabelTv`](super::Distance::LabelTv) debug distance (spec §8 item 12). Empty histograms are at distance 1
/// from anything non-empty and 0 from each other.
pub fn label_tv(counts_i: &[usize], counts_j: &[usize]) -> f64 {
    let (si, sj) = (
        counts_i.iter().sum::<usize>() as f64,
        counts_j.iter().sum::<usize>() as f64,
    );
    if si == 0.0 || sj == 0.0 {
        return if si == sj { 0.0 } else { 1.0 };
    }
    let len = counts_i.len().max(counts_j.len());
    let at = |c: &[usize], l: usize| c.get(l).copied().unwrap_or(0) as f64;
    0.5 * (0..len)
        .map(|l| (at(counts_i, l) / si - at(counts_j, l) / sj).abs())
        .sum::<f64>()
}

/// The N×N raw distance matrix from pair results `((i, j), d_ij)`: symmetric, zero diagonal,
/// and 1 for every pair without a result (a failed pair is treated as far apart, which
/// discourages grouping; spec §6 "failure handling"). Returns the matrix and the pairs that
/// had no result, `i < j`, ascending.
pub fn distance_matrix(
    n: usize,
    pairs: &[((usize, usize), Option<f64>)],
) -> (Vec<Vec<f64>>, Vec<(usize, usize)>) {
    let mut d = vec![vec![f64::NAN; n]; n];
    for &((i, j), v) in pairs {
        if i < n && j < n && i != j {
            if let Some(v) = v {
                d[i][j] = v;
                d[j][i] = v;
            }
        }
    }
    let missing: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .filter(|&(i, j)| d[i][j].is_nan())
        .collect();
    for &(i, j) in &missing {
        d[i][j] = 1.0;
        d[j][i] = 1.0;
    }
    for (i, row) in d.iter_mut().enumerate() {
        row[i] = 0.0;
    }
    (d, missing)
}
