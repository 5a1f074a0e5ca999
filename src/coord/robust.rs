//! Bounds on what a member says about itself, shared by the coordinator algorithms (insiders'
//! review D3: a FedDisco member that registered `n_train = 10^12` took 0.79 of the weight;
//! HCCT and FedSaC weigh the same self-reported count).
//! Owns: [`lower_median`] and [`cap_sizes`], the size-lie bound: a count is taken as at most
//! `cap` times the lower median of the counts it is weighed with; [`clip_moves`], the bound on
//! how far a member's model may move from where it started (a multiple of the median move);
//! and [`Aggregator`] with [`combine`], the robust ways to combine weighted models
//! (coordinate-wise weighted median, weighted trimmed mean, Multi-Krum's choice of models,
//! [`krum_keep`]) beside the plain weighted mean.
//! Must not: know any algorithm's messages or weights (each algorithm applies the bounds to
//! the counts and models it weighs, with its own weights).

use serde::{Deserialize, Serialize};

/// The lower median of a non-empty list (robust to any minority, and to exactly half).
pub fn lower_median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// `sizes` with each count above `cap` times their lower median cut to it, and how many were;
/// as they are with `cap` off (`None`) or nothing to weigh. A lie can then buy at most `cap`
/// honest silos' worth of weight, and honest counts within `cap` of the median are untouched.
pub fn cap_sizes(sizes: &[u64], cap: Option<f64>) -> (Vec<u64>, usize) {
    let mut out = sizes.to_vec();
    let (Some(cap), false) = (cap, sizes.is_empty()) else {
        return (out, 0);
    };
    let median = lower_median(sizes.iter().map(|&n| n as f64).collect());
    let limit = (cap * median).max(1.0).min(u64::MAX as f64) as u64;
    let mut capped = 0;
    for n in &mut out {
        if *n > limit {
            *n = limit;
            capped += 1;
        }
    }
    (out, capped)
}

/// For each model, its copy moved back towards its `base` when its move from it is longer
/// than `k` times the (lower) median move of all of them, or `None` when it is taken as it is
/// (always with `k` off). A scaled or extreme model then moves no further than `k` honest
/// members; its direction is kept (a direction is [`Aggregator`]'s business).
pub fn clip_moves(models: &[&[f32]], bases: &[&[f32]], k: Option<f64>) -> Vec<Option<Vec<f32>>> {
    let Some(k) = k.filter(|_| !models.is_empty() && models.len() == bases.len()) else {
        return vec![None; models.len()];
    };
    let dist = |m: &[f32], b: &[f32]| -> f64 {
        m.iter()
            .zip(b)
            .map(|(&x, &g)| (f64::from(x) - f64::from(g)).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let d: Vec<f64> = models.iter().zip(bases).map(|(m, b)| dist(m, b)).collect();
    let limit = k * lower_median(d.clone());
    models
        .iter()
        .zip(bases)
        .zip(&d)
        .map(|((m, b), &di)| {
            (di > limit).then(|| {
                let s = if di.is_finite() && di > 0.0 {
                    limit / di
                } else {
                    0.0
                };
                m.iter()
                    .zip(b.iter())
                    .map(|(&x, &g)| (f64::from(g) + s * (f64::from(x) - f64::from(g))) as f32)
                    .collect()
            })
        })
        .collect()
}

/// How a coordinator combines the weighted models of a round (`aggregator` in `[feddisco]`,
/// `[hcct]` and `[fedsac]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregator {
    /// The weighted average: each algorithm's own rule, bit for bit.
    #[default]
    Mean,
    /// In every coordinate, the weighted median of the models' values: a minority holding
    /// less than half the weight cannot move it outside the honest values' range.
    Median,
    /// In every coordinate, the weighted mean of the values left once `trim` of the weight is
    /// cut from each end.
    TrimmedMean,
    /// Multi-Krum: the weighted mean of the models left once the ⌈`trim`·n⌉ farthest from
    /// the others are dropped whole, with their weight ([`krum_keep`]).
    Krum,
}

impl Aggregator {
    /// The name a config writes.
    pub fn name(self) -> &'static str {
        match self {
            Aggregator::Mean => "mean",
            Aggregator::Median => "median",
            Aggregator::TrimmedMean => "trimmed_mean",
            Aggregator::Krum => "krum",
        }
    }
}

/// `trim`'s default: a fifth of the weight off each end (one of five equal members); for
/// `Krum`, a fifth of the models taken to be hostile (2 of 8).
pub const DEFAULT_TRIM: f64 = 0.2;

/// Checks a `trim` fraction: in [0, 0.5).
pub fn check_trim(trim: f64) -> Result<(), String> {
    if trim.is_finite() && (0.0..0.5).contains(&trim) {
        Ok(())
    } else {
        Err(format!("trim must be in [0, 0.5), got {trim}"))
    }
}

/// The models combined by `rule` with `weights` (≥ 0, not all 0; normalised here), in f64
/// and rounded once. `Mean` is Σ w_k m_k / Σ w; `Median` and `TrimmedMean` work coordinate by
/// coordinate on the values sorted, each carrying its model's weight. Models of different
/// lengths are a caller's bug: the shortest length is used.
pub fn combine(models: &[&[f32]], weights: &[f64], rule: Aggregator, trim: f64) -> Vec<f32> {
    let len = models.iter().map(|m| m.len()).min().unwrap_or(0);
    let total: f64 = weights.iter().take(models.len()).sum();
    if models.is_empty() || total <= 0.0 {
        return vec![0.0; len];
    }
    let mut w: Vec<f64> = weights.iter().map(|x| x / total).collect();
    if rule == Aggregator::Krum {
        w = krum_weights(models, &w, trim).0;
    }
    if matches!(rule, Aggregator::Mean | Aggregator::Krum) {
        let mut acc = vec![0f64; len];
        for (m, &wk) in models.iter().zip(&w) {
            acc.iter_mut()
                .zip(m.iter())
                .for_each(|(a, &x)| *a += wk * f64::from(x));
        }
        return acc.into_iter().map(|x| x as f32).collect();
    }
    let trim = match rule {
        Aggregator::Median => 0.5,
        _ => trim.clamp(0.0, 0.5),
    };
    let mut col: Vec<(f32, f64)> = Vec::with_capacity(models.len());
    (0..len)
        .map(|c| {
            col.clear();
            col.extend(models.iter().zip(&w).map(|(m, &wk)| (m[c], wk)));
            col.sort_by(|a, b| a.0.total_cmp(&b.0));
            trimmed(&col, trim) as f32
        })
        .collect()
}

/// Multi-Krum's choice (Blanchard et al., NeurIPS 2017; El Mhamdi et al., ICML 2018): of the n
/// models, f = ⌈`share`·n⌉ (at most n − 3) are taken to be hostile; each model scores the sum
/// of its squared distances to its n − f − 2 nearest others, and the n − f with the lowest
/// scores are kept (`true`; ties to the lower index). A model far from every other (scaled,
/// extreme, a lone sign flip) scores high and is dropped whole. Every model is judged, whatever
/// weight an algorithm gives it: a member that lies its way to all the weight (FedDisco's size
/// and discrepancy) is still judged by the model it sent. With f = 0 every model is kept.
pub fn krum_keep(models: &[&[f32]], share: f64) -> Vec<bool> {
    let n = models.len();
    let mut keep = vec![true; n];
    let f = ((share * n as f64 - 1e-9).ceil().max(0.0) as usize).min(n.saturating_sub(3));
    if f == 0 {
        return keep;
    }
    let mut d = vec![vec![0f64; n]; n];
    for i in 0..n {
        for j in i + 1..n {
            let v: f64 = models[i]
                .iter()
                .zip(models[j])
                .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
                .sum();
            d[i][j] = v;
            d[j][i] = v;
        }
    }
    let mut scores: Vec<(f64, usize)> = (0..n)
        .map(|i| {
            let mut row: Vec<f64> = (0..n).filter(|&j| j != i).map(|j| d[i][j]).collect();
            row.sort_by(f64::total_cmp);
            (row[..n - f - 2].iter().sum(), i)
        })
        .collect();
    scores.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    for &(_, i) in &scores[n - f..] {
        keep[i] = false;
    }
    keep
}

/// `weights` (≥ 0) with the models [`krum_keep`] drops at 0, normalised over the kept (equal
/// shares of the kept when the algorithm gave them no weight at all: the weight went to the
/// dropped), and how many models were dropped.
pub fn krum_weights(models: &[&[f32]], weights: &[f64], share: f64) -> (Vec<f64>, usize) {
    let keep = krum_keep(models, share);
    let dropped = keep.iter().filter(|&&k| !k).count();
    (kept_weights(weights, &keep), dropped)
}

/// `weights` (≥ 0) with the models not kept at 0, normalised over the kept (equal shares of
/// the kept when none of them had weight).
pub fn kept_weights(weights: &[f64], keep: &[bool]) -> Vec<f64> {
    let mut w: Vec<f64> = weights
        .iter()
        .zip(keep)
        .map(|(&x, &k)| if k { x } else { 0.0 })
        .collect();
    let kept: f64 = w.iter().sum();
    if kept > 0.0 {
        w.iter_mut().for_each(|x| *x /= kept);
    } else {
        let n = keep.iter().filter(|&&k| k).count().max(1) as f64;
        w = keep
            .iter()
            .map(|&k| if k { 1.0 / n } else { 0.0 })
            .collect();
    }
    w
}

/// The weighted mean of the sorted `(value, weight)` pairs (weights summing to 1) between the
/// cumulative weights `trim` and `1 − trim`; at `trim` = 0.5, the weighted median (the mean of
/// the two middle values when the halves meet between them).
fn trimmed(sorted: &[(f32, f64)], trim: f64) -> f64 {
    const EPS: f64 = 1e-12;
    if trim >= 0.5 - EPS {
        let mut cum = 0.0;
        for (i, &(v, wk)) in sorted.iter().enumerate() {
            cum += wk;
            if cum > 0.5 + EPS {
                return f64::from(v);
            }
            if cum >= 0.5 - EPS {
                let next = sorted[i + 1..]
                    .iter()
                    .find(|p| p.1 > 0.0)
                    .map_or(v, |p| p.0);
                return (f64::from(v) + f64::from(next)) / 2.0;
            }
        }
        return sorted.last().map_or(0.0, |p| f64::from(p.0));
    }
    let (lo, hi) = (trim, 1.0 - trim);
    let (mut cum, mut sum, mut kept) = (0.0, 0.0, 0.0);
    for &(v, wk) in sorted {
        let (a, b) = (cum, cum + wk);
        cum = b;
        let k = (b.min(hi) - a.max(lo)).max(0.0);
        sum += k * f64::from(v);
        kept += k;
    }
    if kept > 0.0 { sum / kept } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_and_trimmed_mean_ignore_a_minority_whatever_it_sends() {
        let honest: [&[f32]; 4] = [&[1.0, -1.0], &[2.0, -2.0], &[3.0, -3.0], &[4.0, -4.0]];
        let evil: &[f32] = &[f32::MAX, -1e30];
        let mut all: Vec<&[f32]> = honest.to_vec();
        all.push(evil);
        let w = [1.0; 5];
        // The mean is the attacker's.
        assert!(combine(&all, &w, Aggregator::Mean, 0.2)[0] > 1e37);
        // The median of five is the honest middle; the trimmed mean (a fifth off each end)
        // averages the three middle values.
        assert_eq!(combine(&all, &w, Aggregator::Median, 0.2), vec![3.0, -3.0]);
        assert_eq!(
            combine(&all, &w, Aggregator::TrimmedMean, 0.2),
            vec![3.0, -3.0]
        );
        // Equal weights and an even count: the mean of the two middle values.
        assert_eq!(
            combine(&honest, &[1.0; 4], Aggregator::Median, 0.2),
            vec![2.5, -2.5]
        );
        // Weights count: a member with more than half the weight is the median.
        assert_eq!(
            combine(&honest, &[1.0, 1.0, 1.0, 3.5], Aggregator::Median, 0.2),
            vec![4.0, -4.0]
        );
        // trim 0 is the weighted mean.
        let m = combine(&honest, &[1.0, 2.0, 3.0, 4.0], Aggregator::TrimmedMean, 0.0);
        assert!((m[0] - 3.0).abs() < 1e-6, "{m:?}");
        // A trimmed mean cuts partial weights at the ends: of 4 equal members (0.25 each),
        // 0.3 off each end keeps 0.2 of the 2nd and 0.2 of the 3rd.
        assert_eq!(
            combine(&honest, &[1.0; 4], Aggregator::TrimmedMean, 0.3),
            vec![2.5, -2.5]
        );
    }

    #[test]
    fn krum_drops_the_models_far_from_the_others_whole() {
        // Six honest models near (1, −1) and two attackers: one scaled, one sign-flipped.
        let honest: Vec<Vec<f32>> = (0..6)
            .map(|i| {
                let x = 1.0 + 0.1 * i as f32;
                vec![x, -x]
            })
            .collect();
        let scaled = vec![1e6f32, -1e6];
        let flipped = vec![-1.2f32, 1.2];
        let mut all: Vec<&[f32]> = honest.iter().map(Vec::as_slice).collect();
        all.push(&scaled);
        all.push(&flipped);
        let w = [1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        // ⌈0.2 · 8⌉ = 2 taken to be hostile: exactly the two attackers go.
        assert_eq!(
            krum_keep(&all, 0.2),
            [true, true, true, true, true, true, false, false]
        );
        let got = combine(&all, &w, Aggregator::Krum, 0.2);
        let want = combine(&all[..6], &w[..6], Aggregator::Mean, 0.0);
        assert_eq!(got, want, "the weighted mean of the six honest models");
        // The plain mean is the attacker's; the median keeps the honest range.
        assert!(combine(&all, &w, Aggregator::Mean, 0.2)[0] > 1e5);
        // f = ⌈0.1 · 8⌉ = 1: the scaled model goes first; the flipped one stays.
        let one = krum_keep(&all, 0.1);
        assert_eq!(one.iter().filter(|&&k| !k).count(), 1);
        assert!(!one[6]);
        // Nothing is taken to be hostile at share 0, or among fewer than 4 models.
        assert!(krum_keep(&all, 0.0).iter().all(|&k| k));
        assert!(krum_keep(&all[5..], 0.4).iter().all(|&k| k));
        // Weights do not shield a model: an attacker that holds all the weight is dropped all
        // the same, and the kept share equally.
        let liar = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        let (lw, dropped) = krum_weights(&all, &liar, 0.2);
        assert_eq!(dropped, 2);
        assert_eq!(lw[..6], [1.0 / 6.0; 6]);
        assert_eq!(lw[6..], [0.0; 2]);
        // An extreme but finite model (±f32::MAX) scores worst too.
        let ext = vec![f32::MAX, f32::MIN];
        all[6] = &ext;
        assert!(!krum_keep(&all, 0.2)[6]);
    }

    #[test]
    fn a_long_move_is_scaled_back_to_k_median_moves_along_its_direction() {
        let base: &[f32] = &[0.0, 0.0];
        let models: [&[f32]; 4] = [&[1.0, 0.0], &[0.0, 1.0], &[-1.0, 0.0], &[300.0, 400.0]];
        let clipped = clip_moves(&models, &[base; 4], Some(3.0));
        assert_eq!(clipped[..3], [None, None, None]);
        assert_eq!(clipped[3].as_deref(), Some(&[1.8f32, 2.4][..]));
        // An extreme move is scaled back as well: length 3 along (1, 1).
        let far: [&[f32]; 3] = [&[1.0, 0.0], &[0.0, 1.0], &[f32::MAX, f32::MAX]];
        let c = clip_moves(&far, &[base; 3], Some(3.0));
        let c2 = c[2].as_deref().unwrap();
        assert!((c2[0] - c2[1]).abs() < 1e-6 && (c2[0].hypot(c2[1]) - 3.0).abs() < 1e-4);
        assert!(
            clip_moves(&models, &[base; 4], None)
                .iter()
                .all(Option::is_none)
        );
    }

    #[test]
    fn a_lie_is_cut_to_cap_times_the_median_and_honest_counts_are_kept() {
        let sizes = [40, 60, 50, 1_000_000_000_000];
        assert_eq!(cap_sizes(&sizes, Some(2.0)), (vec![40, 60, 50, 100], 1));
        assert_eq!(cap_sizes(&sizes, None), (sizes.to_vec(), 0));
        assert_eq!(cap_sizes(&[], Some(2.0)), (vec![], 0));
        // Half the members lying together still meet the lower median of the honest half.
        let (c, n) = cap_sizes(&[10, 10, u64::MAX, u64::MAX], Some(3.0));
        assert_eq!((c, n), (vec![10, 10, 30, 30], 2));
    }
}
