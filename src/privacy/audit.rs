//! The empirical audit a curious member can run (spec `privacy.md` §4): membership inference by
//! loss threshold on a pulled model, its AUC, and the ε lower bound it implies.
//!
//! Owns: scoring the attack from two lists of per-row losses — the silo's training rows (members)
//! and its held-out rows (non-members) — as an AUC, and the largest ε that any loss threshold's
//! true- and false-positive rates prove at 95 % confidence (Clopper–Pearson intervals,
//! Bonferroni over the thresholds tried; Jagielski et al., NeurIPS 2020: a test with rates TPR
//! and FPR against an (ε, δ)-DP mechanism has TPR ≤ e^ε · FPR + δ).
//! Must not: compute losses or know which model or rows they came from (the simulator does).
//!
//! The bound is heuristic in one respect, said in `docs/privacy.md`: every row is scored on the
//! same model, where a formal audit trains one model per guess. The member/non-member split is
//! the scenario's random train/test split, which is what makes the guesses comparable.

use serde::{Deserialize, Serialize};

/// One audit's result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Audit {
    /// Area under the ROC curve of "lower loss means member": 0.5 is a coin, 1.0 a perfect attack.
    pub auc: f64,
    /// The largest ε any threshold proves at 95 % confidence (0 when none proves anything).
    pub epsilon_lower_bound: f64,
    /// Rows scored: members (training rows) and non-members (held-out rows).
    pub members: usize,
    /// See [`Self::members`].
    pub non_members: usize,
}

/// Confidence of the ε lower bound (over all thresholds together).
pub const CONFIDENCE: f64 = 0.95;

/// Audits one attack: `members` and `non_members` are per-row losses (non-finite losses count as
/// the largest), `delta` the mechanism's δ (0 without DP).
pub fn audit(members: &[f64], non_members: &[f64], delta: f64) -> Audit {
    let m = members.len();
    let n = non_members.len();
    let mut all: Vec<(f64, bool)> = members
        .iter()
        .map(|&l| (finite(l), true))
        .chain(non_members.iter().map(|&l| (finite(l), false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    if m == 0 || n == 0 {
        return Audit {
            auc: 0.5,
            epsilon_lower_bound: 0.0,
            members: m,
            non_members: n,
        };
    }
    // Thresholds between distinct losses: "member" when loss ≤ t. Ties move together.
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let (mut tp, mut fp) = (0usize, 0usize);
    // Mann–Whitney: for each non-member, members strictly below plus half the ties.
    let mut wins = 0.0;
    let mut i = 0;
    while i < all.len() {
        let v = all[i].0;
        let (mut tm, mut tn) = (0usize, 0usize);
        while i < all.len() && all[i].0 == v {
            if all[i].1 {
                tm += 1
            } else {
                tn += 1
            }
            i += 1;
        }
        wins += tn as f64 * (tp as f64 + 0.5 * tm as f64);
        tp += tm;
        fp += tn;
        cuts.push((tp, fp));
    }
    let auc = wins / (m as f64 * n as f64);
    // Four one-sided Clopper–Pearson bounds per threshold, all holding together (Bonferroni).
    let alpha = (1.0 - CONFIDENCE) / (4.0 * cuts.len() as f64);
    let mut best = 0.0f64;
    for &(tp, fp) in &cuts {
        let tpr = (cp_lower(tp, m, alpha), cp_upper(tp, m, alpha));
        let fpr = (cp_lower(fp, n, alpha), cp_upper(fp, n, alpha));
        // TPR ≤ e^ε FPR + δ, and (1 − FPR) ≤ e^ε (1 − TPR) + δ.
        best = best.max(implied(tpr.0, fpr.1, delta));
        best = best.max(implied(1.0 - fpr.1, 1.0 - tpr.0, delta));
        // The same with members and non-members swapped (a model that fits held-out rows better).
        best = best.max(implied(fpr.0, tpr.1, delta));
        best = best.max(implied(1.0 - tpr.1, 1.0 - fpr.0, delta));
    }
    Audit {
        auc,
        epsilon_lower_bound: best,
        members: m,
        non_members: n,
    }
}

fn finite(l: f64) -> f64 {
    if l.is_nan() { f64::INFINITY } else { l }
}

/// The ε that `hit ≤ e^ε · miss + δ` needs (0 when it needs none).
fn implied(hit: f64, miss: f64, delta: f64) -> f64 {
    let num = hit - delta;
    if num <= 0.0 {
        return 0.0;
    }
    if miss <= 0.0 {
        return f64::INFINITY;
    }
    (num / miss).ln().max(0.0)
}

/// Clopper–Pearson one-sided lower bound of a rate from `k` successes in `n` trials, at level `a`.
fn cp_lower(k: usize, n: usize, a: f64) -> f64 {
    if k == 0 {
        return 0.0;
    }
    beta_quantile(a, k as f64, (n - k + 1) as f64)
}

/// Clopper–Pearson one-sided upper bound, at level `a`.
fn cp_upper(k: usize, n: usize, a: f64) -> f64 {
    if k == n {
        return 1.0;
    }
    beta_quantile(1.0 - a, (k + 1) as f64, (n - k) as f64)
}

/// The `p`-quantile of Beta(a, b), by bisection on the regularized incomplete beta function.
fn beta_quantile(p: f64, a: f64, b: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if incomplete_beta(mid, a, b) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The regularized incomplete beta function I_x(a, b), by its continued fraction (modified
/// Lentz), on the side where it converges fast.
fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front =
        libm::lgamma(a + b) - libm::lgamma(a) - libm::lgamma(b) + a * x.ln() + b * (1.0 - x).ln();
    if x < (a + 1.0) / (a + b + 2.0) {
        ln_front.exp() * beta_fraction(x, a, b) / a
    } else {
        1.0 - ln_front.exp() * beta_fraction(1.0 - x, b, a) / b
    }
}

fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut c = 1.0;
    let mut d = 1.0 - (a + b) * x / (a + 1.0);
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..500 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        for num in [
            m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0)),
        ] {
            d = 1.0 + num * d;
            if d.abs() < TINY {
                d = TINY;
            }
            c = 1.0 + num / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            h *= d * c;
        }
        if (d * c - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_incomplete_beta_and_its_quantiles_match_closed_forms() {
        // Beta(2, 3)'s CDF at 1/2 is 11/16; Beta(1, 1) is uniform.
        assert!((incomplete_beta(0.5, 2.0, 3.0) - 0.6875).abs() < 1e-12);
        assert!((incomplete_beta(0.3, 1.0, 1.0) - 0.3).abs() < 1e-12);
        // Clopper–Pearson at the edges: 0 of n gives upper 1 − a^(1/n); n of n gives lower a^(1/n).
        for n in [1usize, 10, 200] {
            let a = 0.05;
            let up = cp_upper(0, n, a);
            assert!(
                (up - (1.0 - a.powf(1.0 / n as f64))).abs() < 1e-9,
                "{n}: {up}"
            );
            let lo = cp_lower(n, n, a);
            assert!((lo - a.powf(1.0 / n as f64)).abs() < 1e-9, "{n}: {lo}");
        }
        // Symmetric: k of n's lower bound is 1 − (n−k of n)'s upper.
        let (l, u) = (cp_lower(7, 20, 0.01), cp_upper(13, 20, 0.01));
        assert!((l - (1.0 - u)).abs() < 1e-9);
    }

    #[test]
    fn a_coin_scores_one_half_and_proves_nothing() {
        // Members and non-members drawn from the same losses.
        let xs: Vec<f64> = (0..400).map(|i| f64::from((i * 37) % 101)).collect();
        let (a, b): (Vec<_>, Vec<_>) = xs.chunks(2).map(|c| (c[0], c[1])).unzip();
        let r = audit(&a, &b, 0.0);
        assert!((r.auc - 0.5).abs() < 0.06, "{r:?}");
        assert_eq!(r.epsilon_lower_bound, 0.0, "{r:?}");
        // All tied: exactly a coin.
        let r = audit(&[1.0; 5], &[1.0; 7], 0.0);
        assert_eq!(r.auc, 0.5);
        assert_eq!((r.members, r.non_members), (5, 7));
        // Nothing to compare.
        assert_eq!(audit(&[], &[1.0], 0.0).auc, 0.5);
    }

    #[test]
    fn a_perfect_separation_scores_one_and_its_bound_grows_with_rows() {
        let members = |n: usize| vec![0.01; n];
        let non = |n: usize| vec![2.0; n];
        let small = audit(&members(20), &non(20), 0.0);
        let large = audit(&members(1000), &non(1000), 0.0);
        assert_eq!(small.auc, 1.0);
        assert_eq!(large.auc, 1.0);
        // 20 rows prove little at 95 %, 1000 rows prove more; neither is infinite.
        assert!(small.epsilon_lower_bound > 1.0, "{small:?}");
        assert!(
            large.epsilon_lower_bound > small.epsilon_lower_bound + 2.0,
            "{small:?} {large:?}"
        );
        assert!(large.epsilon_lower_bound.is_finite());
        // The reverse (held-out rows fit better) is as much a leak, with AUC 0.
        let rev = audit(&non(1000), &members(1000), 0.0);
        assert_eq!(rev.auc, 0.0);
        assert!((rev.epsilon_lower_bound - large.epsilon_lower_bound).abs() < 1e-9);
        // A δ as large as the rates proves nothing.
        assert_eq!(audit(&members(20), &non(20), 1.0).epsilon_lower_bound, 0.0);
    }

    #[test]
    fn ties_count_half_and_a_nan_loss_counts_as_the_worst() {
        // Member losses 1, 2; non-member losses 2, 3: pairs (1<2) (1<3) (2=2 half) (2<3).
        let r = audit(&[1.0, 2.0], &[2.0, 3.0], 0.0);
        assert!((r.auc - 3.5 / 4.0).abs() < 1e-12, "{r:?}");
        let r = audit(&[f64::NAN], &[1.0], 0.0);
        assert_eq!(r.auc, 0.0);
    }
}
