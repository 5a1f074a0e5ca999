//! FedDisco: discrepancy-aware aggregation weights (Ye et al., ICML 2023; spec
//! `docs/specs/feddisco.md`).
//!
//! Owns: the two halves of the method as pure functions on numbers.
//! * Silo side: [`report`] turns a silo's label counts into the only thing it sends, a
//!   [`DiscoReport`] (sample count and one scalar discrepancy to the uniform label
//!   distribution, spec §2.1 and §3.1). The histogram never leaves the silo.
//! * Coordinator side: [`weights`] turns the reports of the clients whose updates arrived this
//!   round into aggregation weights (per-round normalisation, spec §2.2; clipped scores with
//!   the fall-back to size weights, §2.3–§2.4), and [`aggregate`] forms `Σ p_k w_k` (§3.2).
//!
//! Must not: touch tensors, sockets, clocks or threads (std, rand and serde only), train
//! anything, or keep state between rounds: the caller stores the reports and calls [`weights`]
//! over each round's arrived set (spec §3.2, A4).
//!
//! Privacy (spec §3.4, A15): with KL to the uniform target the coordinator learns
//! `ln C − H(D_k)`, the entropy of the silo's label distribution; for two classes that fixes
//! the histogram up to swapping the labels.
//!
//! Layout: the method is here; `server.rs` is the network coordinator's state (also
//! `coord::feddisco_server`).

pub mod server;

use crate::coord::robust::{Aggregator, cap_sizes};
use serde::{Deserialize, Serialize};

/// `a`: how strongly discrepancy lowers a weight (spec §2.3; `args.py` and every run script).
pub const DEFAULT_A: f64 = 0.5;
/// `b`: the constant that pulls the weights towards uniform (spec §2.3).
pub const DEFAULT_B: f64 = 0.1;

/// Tolerance on "sums to one" and on a discrepancy's upper bound (rounding only).
const TOLERANCE: f64 = 1e-9;

/// Errors of FedDisco's computations. Each names the offending value and the allowed range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DiscoError {
    /// A silo with no labelled samples has no label distribution (spec §2.4: it is excluded).
    #[error("label counts sum to 0; a silo needs at least 1 labelled sample to report")]
    NoSamples,
    /// The label counts and the target disagree on the number of classes.
    #[error("the target has {target} classes but the label counts have {counts}; they must match")]
    ClassMismatch {
        /// Classes in the target.
        target: usize,
        /// Classes in the counts.
        counts: usize,
    },
    /// A target probability outside (0, 1] (KL would be infinite, spec §2.4).
    #[error("target probability {index} is {value}; every entry must be in (0, 1]")]
    BadTarget {
        /// The class.
        index: usize,
        /// Its probability.
        value: f64,
    },
    /// The target does not sum to 1.
    #[error("the target sums to {0}; it must sum to 1 (within 1e-9)")]
    TargetSum(f64),
    /// A reported discrepancy outside its range (spec §2.4 last row).
    #[error("report {index}: discrepancy {value} is outside the allowed range [0, {max}]")]
    BadDiscrepancy {
        /// Position of the report in the slice.
        index: usize,
        /// The reported value.
        value: f64,
        /// The metric's largest possible value (infinite when unknown).
        max: f64,
    },
    /// No report, or no report with a sample (nothing to aggregate).
    #[error("{0} reports with a positive sample count; at least 1 is needed")]
    NoParticipants(usize),
    /// `a` or `b` outside their range.
    #[error("{name} must be finite and >= 0, got {value}")]
    BadParameter {
        /// `"a"` or `"b"`.
        name: &'static str,
        /// The value.
        value: f64,
    },
    /// Models or weights of different lengths.
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        /// Which length.
        what: &'static str,
        /// The expected length.
        expected: usize,
        /// The length given.
        got: usize,
    },
}

/// How the discrepancy between a silo's label distribution `D_k` and the target `T` is measured
/// (spec §2.1; Table 7 ablation). KL is the paper's and the code's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// `KL(D_k ‖ T) = Σ_c D_c ln(D_c / T_c)` with `0 ln 0 = 0` (natural log).
    #[default]
    Kl,
    /// `Σ_c |D_c − T_c|`.
    L1,
    /// `‖D_k − T‖₂`.
    L2,
    /// `1 − cos(D_k, T)`.
    Cosine,
}

impl Metric {
    /// The largest value the metric takes against the uniform target over `classes` classes
    /// (a one-class silo): `ln C`, `2(1 − 1/C)`, `√(1 − 1/C)` and `1 − 1/√C` (spec §2.1).
    pub fn max_to_uniform(self, classes: usize) -> f64 {
        let c = classes.max(1) as f64;
        match self {
            Metric::Kl => c.ln(),
            Metric::L1 => 2.0 * (1.0 - 1.0 / c),
            Metric::L2 => (1.0 - 1.0 / c).sqrt(),
            Metric::Cosine => 1.0 - 1.0 / c.sqrt(),
        }
    }
}

/// What a silo sends the coordinator once (and again if its data change): `(N_k, δ_k)`
/// (spec §3.1 step 1, §4.1 `DiscoReport`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiscoReport {
    /// `N_k`: labelled training samples (FedAvg reveals it anyway).
    pub num_samples: u64,
    /// `δ_k`: the raw (unnormalised) discrepancy to the target.
    pub discrepancy: f64,
}

impl DiscoReport {
    /// Coordinator-side range check against the run's metric and class count, uniform target
    /// (spec §2.4: reject NaN, negative or too large values).
    pub fn check(&self, metric: Metric, classes: usize) -> Result<(), DiscoError> {
        check_discrepancy(0, self.discrepancy, metric.max_to_uniform(classes))
    }
}

fn check_discrepancy(index: usize, value: f64, max: f64) -> Result<(), DiscoError> {
    if value.is_finite() && value >= 0.0 && value <= max + TOLERANCE {
        Ok(())
    } else {
        Err(DiscoError::BadDiscrepancy { index, value, max })
    }
}

/// The uniform target `T_c = 1/C` (spec §1: the paper's default, computable with no
/// communication).
pub fn uniform_target(classes: usize) -> Vec<f64> {
    vec![1.0 / classes.max(1) as f64; classes]
}

/// Silo side: `δ_k = e(D_k, T)` against the uniform target, from the silo's own label counts
/// (spec §2.1). Only this scalar leaves the silo.
pub fn discrepancy(label_counts: &[u64], metric: Metric) -> Result<f64, DiscoError> {
    discrepancy_to(label_counts, &uniform_target(label_counts.len()), metric)
}

/// `δ_k = e(D_k, T)` against an explicit target (spec A14: keep `T` a parameter). Every
/// target entry must be in (0, 1] and the entries must sum to 1.
pub fn discrepancy_to(
    label_counts: &[u64],
    target: &[f64],
    metric: Metric,
) -> Result<f64, DiscoError> {
    if target.len() != label_counts.len() {
        return Err(DiscoError::ClassMismatch {
            target: target.len(),
            counts: label_counts.len(),
        });
    }
    if let Some((index, &value)) = target
        .iter()
        .enumerate()
        .find(|(_, t)| !(**t > 0.0 && **t <= 1.0))
    {
        return Err(DiscoError::BadTarget { index, value });
    }
    let sum: f64 = target.iter().sum();
    if (sum - 1.0).abs() > TOLERANCE {
        return Err(DiscoError::TargetSum(sum));
    }
    let total: u64 = label_counts.iter().sum();
    if total == 0 {
        return Err(DiscoError::NoSamples);
    }
    let dist: Vec<f64> = label_counts
        .iter()
        .map(|&c| c as f64 / total as f64)
        .collect();
    let pairs = dist.iter().zip(target);
    let value = match metric {
        // scipy's elementwise kl_div adds −x + y, which cancels over two distributions (§2.1).
        Metric::Kl => pairs
            .filter(|(d, _)| **d > 0.0)
            .map(|(d, t)| d * (d / t).ln())
            .sum::<f64>(),
        Metric::L1 => pairs.map(|(d, t)| (d - t).abs()).sum(),
        Metric::L2 => pairs.map(|(d, t)| (d - t).powi(2)).sum::<f64>().sqrt(),
        Metric::Cosine => {
            let dot: f64 = pairs.map(|(d, t)| d * t).sum();
            let nd = dist.iter().map(|d| d * d).sum::<f64>().sqrt();
            let nt = target.iter().map(|t| t * t).sum::<f64>().sqrt();
            1.0 - dot / (nd * nt)
        }
    };
    // Rounding can leave −1e-17 for a balanced silo; the true value is ≥ 0.
    Ok(value.max(0.0))
}

/// Silo side: the whole report from the silo's label counts (spec §3.1 step 1).
pub fn report(label_counts: &[u64], metric: Metric) -> Result<DiscoReport, DiscoError> {
    Ok(DiscoReport {
        num_samples: label_counts.iter().sum(),
        discrepancy: discrepancy(label_counts, metric)?,
    })
}

/// The coordinator's weighting rule (spec §2.2–§2.3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// `a ≥ 0`: discrepancy penalty.
    pub a: f64,
    /// `b ≥ 0`: constant score.
    pub b: f64,
    /// Normalise the discrepancies to sum to 1 over the round's participants (spec A2:
    /// recommended always; `false` is the official code v2's behaviour for non-KL metrics).
    pub normalise: bool,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            a: DEFAULT_A,
            b: DEFAULT_B,
            normalise: true,
        }
    }
}

impl Params {
    /// Checks `a` and `b` (finite, ≥ 0).
    pub fn validate(&self) -> Result<(), DiscoError> {
        for (name, value) in [("a", self.a), ("b", self.b)] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(DiscoError::BadParameter { name, value });
            }
        }
        Ok(())
    }
}

/// FedDisco's defences against a member's lies (insiders' review D3: a member that registered
/// with `n_train = 10^12` took 0.79 of the weight, and its ±10^6 parameters ruined every silo),
/// applied by the coordinator to each round's senders before [`weights`] and [`aggregate`], in
/// the simulator and the network alike. With nothing to cap or clip the round is bit for bit
/// the undefended one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Robust {
    /// A report's `n_k` counts at most this many times the (lower) median `n` of the round's
    /// senders; `None`: as reported.
    pub size_cap: Option<f64>,
    /// An update moves the global at most this many times the (lower) median distance of the
    /// round's updates from it (a longer move is scaled back along its direction); `None`: no
    /// bound.
    pub update_clip: Option<f64>,
    /// No sender's weight exceeds this many fair shares (`cap / K` for K senders; the excess
    /// goes to the others in proportion to their weights). A discrepancy of 0 is a claim no
    /// coordinator can check; this bounds what it buys. `None`: no cap.
    pub weight_cap: Option<f64>,
    /// How the weighted models are combined (the paper's weighted mean by default).
    pub aggregator: Aggregator,
    /// `TrimmedMean`: the weight cut from each end; `Krum`: the share of senders taken to be
    /// hostile.
    pub trim: f64,
}

impl Robust {
    /// No defence: the paper's FedDisco.
    pub const NONE: Robust = Robust {
        size_cap: None,
        update_clip: None,
        weight_cap: None,
        aggregator: Aggregator::Mean,
        trim: crate::coord::robust::DEFAULT_TRIM,
    };

    /// `p` with no entry above `weight_cap / K`, the excess spread over the others in
    /// proportion (water filling); how many were capped. `p` sums to 1.
    pub fn cap_weights(&self, p: &mut [f64]) -> usize {
        let Some(cap) = self.weight_cap.filter(|_| !p.is_empty()) else {
            return 0;
        };
        let limit = (cap / p.len() as f64).max(1.0 / p.len() as f64);
        let mut capped = vec![false; p.len()];
        loop {
            let over: Vec<usize> = (0..p.len())
                .filter(|&i| !capped[i] && p[i] > limit)
                .collect();
            if over.is_empty() {
                break;
            }
            for &i in &over {
                capped[i] = true;
            }
            let fixed = capped.iter().filter(|c| **c).count() as f64 * limit;
            let free: f64 = (0..p.len()).filter(|&i| !capped[i]).map(|i| p[i]).sum();
            for i in 0..p.len() {
                p[i] = if capped[i] {
                    limit
                } else if free > 0.0 {
                    p[i] * (1.0 - fixed) / free
                } else {
                    (1.0 - fixed) / (p.len() as f64 - fixed / limit)
                };
            }
        }
        capped.iter().filter(|c| **c).count()
    }

    /// The reports with `n_k` capped, and how many were.
    pub fn cap_sizes(&self, reports: &[DiscoReport]) -> (Vec<DiscoReport>, usize) {
        let sizes: Vec<u64> = reports.iter().map(|r| r.num_samples).collect();
        let (sizes, capped) = cap_sizes(&sizes, self.size_cap);
        let mut out = reports.to_vec();
        for (r, n) in out.iter_mut().zip(sizes) {
            r.num_samples = n;
        }
        (out, capped)
    }

    /// For each model, its clipped copy when its move from `global` is over the bound (`None`:
    /// taken as it is).
    pub fn clip_updates(&self, models: &[&[f32]], global: &[f32]) -> Vec<Option<Vec<f32>>> {
        crate::coord::robust::clip_moves(models, &vec![global; models.len()], self.update_clip)
    }

    /// One round under the defences: the weights over the capped reports (with `Krum`, those
    /// of the models it kept, the dropped at 0: `robust::krum_weights`) and the aggregate of
    /// the clipped models, with how many sizes were capped, updates clipped and models dropped.
    pub fn aggregate(
        &self,
        reports: &[DiscoReport],
        models: &[&[f32]],
        global: &[f32],
        params: &Params,
    ) -> Result<(Weights, Vec<f32>, Defended), DiscoError> {
        let (reports, sizes_capped) = self.cap_sizes(reports);
        let mut w = weights(&reports, params)?;
        let weights_capped = self.cap_weights(&mut w.p);
        let clipped = self.clip_updates(models, global);
        let updates_clipped = clipped.iter().filter(|c| c.is_some()).count();
        let taken: Vec<&[f32]> = models
            .iter()
            .zip(&clipped)
            .map(|(m, c)| c.as_deref().unwrap_or(m))
            .collect();
        let mut models_dropped = 0;
        let g = match self.aggregator {
            Aggregator::Mean => aggregate(&taken, &w.p)?,
            // Krum drops models whole: the weights become those the global is made with (the
            // dropped at 0), and the mean over the rest is the paper's.
            Aggregator::Krum => {
                (w.p, models_dropped) = crate::coord::robust::krum_weights(&taken, &w.p, self.trim);
                aggregate(&taken, &w.p)?
            }
            rule => crate::coord::robust::combine(&taken, &w.p, rule, self.trim),
        };
        Ok((
            w,
            g,
            Defended {
                sizes_capped,
                updates_clipped,
                weights_capped,
                models_dropped,
            },
        ))
    }
}

/// What the defences changed in one round (logged with it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Defended {
    /// Reports whose `n_k` was capped.
    pub sizes_capped: usize,
    /// Updates scaled back.
    pub updates_clipped: usize,
    /// Weights cut to the cap.
    pub weights_capped: usize,
    /// Models `Krum` left out (their weight set to 0).
    pub models_dropped: usize,
}

/// One round's weights and what produced them (spec §4.1: log `n`, `d`, `p` and the clip
/// count every round). All vectors are in the order of the reports given to [`weights`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Weights {
    /// `p_k`: the aggregation weights, ≥ 0, summing to 1.
    pub p: Vec<f64>,
    /// `n_k = N_k / Σ N_j` over the participants.
    pub n: Vec<f64>,
    /// `d_k`: the discrepancies used in the score (normalised unless [`Params::normalise`] is off).
    pub d: Vec<f64>,
    /// Participants whose score `n_k − a d_k + b` was negative and were zeroed (spec §2.4).
    pub clipped: usize,
    /// True when every score was ≤ 0 and the weights fell back to `p = n` (spec A5).
    pub fell_back: bool,
}

/// Coordinator side: FedDisco's weights over the reports of the clients whose updates arrived
/// this round (spec §2.2–§2.4, eq. 3):
///
/// `n_k = N_k / Σ N_j`, `d_k = δ_k / Σ δ_j` (0 for all when `Σ δ = 0`, or `δ_k` itself when
/// `normalise` is off), `p_k = max(n_k − a d_k + b, 0) / Σ_j max(n_j − a d_j + b, 0)`, and
/// `p = n` when every score is ≤ 0. A report with `N_k = 0` gets weight 0 and does not count
/// in any sum (it sends no update). Sort the reports by peer id first for reproducible sums.
pub fn weights(reports: &[DiscoReport], params: &Params) -> Result<Weights, DiscoError> {
    params.validate()?;
    for (i, r) in reports.iter().enumerate() {
        check_discrepancy(i, r.discrepancy, f64::INFINITY)?;
    }
    let present = reports.iter().filter(|r| r.num_samples > 0).count();
    if present == 0 {
        return Err(DiscoError::NoParticipants(0));
    }
    let total_n: f64 = reports.iter().map(|r| r.num_samples as f64).sum();
    let total_d: f64 = reports
        .iter()
        .filter(|r| r.num_samples > 0)
        .map(|r| r.discrepancy)
        .sum();
    let n: Vec<f64> = reports
        .iter()
        .map(|r| r.num_samples as f64 / total_n)
        .collect();
    let d: Vec<f64> = reports
        .iter()
        .map(|r| match (r.num_samples, params.normalise) {
            (0, _) => 0.0,
            (_, false) => r.discrepancy,
            (_, true) if total_d > 0.0 => r.discrepancy / total_d,
            (_, true) => 0.0,
        })
        .collect();
    let scores: Vec<f64> = reports
        .iter()
        .zip(n.iter().zip(&d))
        .map(|(r, (&n, &d))| {
            if r.num_samples == 0 {
                0.0
            } else {
                n - params.a * d + params.b
            }
        })
        .collect();
    let clipped = reports
        .iter()
        .zip(&scores)
        .filter(|(r, s)| r.num_samples > 0 && **s < 0.0)
        .count();
    let positive: f64 = scores.iter().map(|s| s.max(0.0)).sum();
    let (p, fell_back) = if positive > 0.0 {
        (
            scores.iter().map(|s| s.max(0.0) / positive).collect(),
            false,
        )
    } else {
        (n.clone(), true)
    };
    Ok(Weights {
        p,
        n,
        d,
        clipped,
        fell_back,
    })
}

/// `Σ_k p_k w_k` over flat models of equal length, accumulated in f64 and cast to f32
/// (spec §3.2, A17, A18: every parameter, the same weight for all).
pub fn aggregate(models: &[&[f32]], p: &[f64]) -> Result<Vec<f32>, DiscoError> {
    if models.len() != p.len() {
        return Err(DiscoError::Shape {
            what: "weights per model",
            expected: models.len(),
            got: p.len(),
        });
    }
    let Some(first) = models.first() else {
        return Err(DiscoError::NoParticipants(0));
    };
    let mut acc = vec![0f64; first.len()];
    for (m, &w) in models.iter().zip(p) {
        if m.len() != acc.len() {
            return Err(DiscoError::Shape {
                what: "parameters per model",
                expected: acc.len(),
                got: m.len(),
            });
        }
        if w != 0.0 {
            for (a, &x) in acc.iter_mut().zip(m.iter()) {
                *a += w * f64::from(x);
            }
        }
    }
    Ok(acc.into_iter().map(|x| x as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defences_cap_sizes_at_the_lower_median_and_scale_long_moves_back() {
        let r = |n| DiscoReport {
            num_samples: n,
            discrepancy: 0.0,
        };
        let robust = Robust {
            size_cap: Some(2.0),
            update_clip: Some(3.0),
            weight_cap: Some(1.5),
            ..Robust::NONE
        };
        // No weight above 1.5 fair shares, the rest in proportion; sums stay 1.
        let mut p = [0.7, 0.2, 0.1];
        assert_eq!(robust.cap_weights(&mut p), 1);
        assert!(
            (p[0] - 0.5).abs() < 1e-12 && (p[1] / p[2] - 2.0).abs() < 1e-12,
            "{p:?}"
        );
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let mut even = [0.25; 4];
        assert_eq!(robust.cap_weights(&mut even), 0);
        assert_eq!(even, [0.25; 4]);
        // Two members, one lying: the lower median is the honest one's.
        let (capped, n) = robust.cap_sizes(&[r(40), r(u64::MAX)]);
        assert_eq!((capped[1].num_samples, n), (80, 1));
        assert_eq!(robust.cap_sizes(&[]).1, 0);
        assert_eq!(Robust::NONE.cap_sizes(&[r(1), r(1000)]).1, 0);
        // Moves of 1, 1 and 10 from the global: the third is scaled back to 3, same direction.
        let g = [1.0f32, 1.0];
        let ms: [&[f32]; 3] = [&[2.0, 1.0], &[1.0, 0.0], &[1.0, 11.0]];
        let c = robust.clip_updates(&ms, &g);
        assert!(c[0].is_none() && c[1].is_none());
        assert_eq!(c[2].as_deref(), Some(&[1.0f32, 4.0][..]));
        // Every other update equal to the global: the outlier is taken back to it.
        let ms: [&[f32]; 3] = [&g, &g, &[5.0, 5.0]];
        assert_eq!(robust.clip_updates(&ms, &g)[2].as_deref(), Some(&g[..]));
    }

    /// Issue 38: one of five senders sends a sign-flipped ×10⁶ model. FedAvg's weights (a = b
    /// = 0, no bounds) hand the global to it; with `aggregator = Median` the global stays
    /// within the honest models' values, and `Krum` leaves the attacker out.
    #[test]
    fn the_median_and_krum_keep_the_global_within_the_honest_models() {
        let reports: Vec<DiscoReport> = (0..5)
            .map(|_| DiscoReport {
                num_samples: 40,
                discrepancy: 0.0,
            })
            .collect();
        let honest: [&[f32]; 4] = [&[1.0, -1.0], &[1.1, -1.1], &[1.2, -1.2], &[1.3, -1.3]];
        let mut models = honest.to_vec();
        let evil: &[f32] = &[-1e6, 1e6];
        models.push(evil);
        let fedavg = Params {
            a: 0.0,
            b: 0.0,
            normalise: true,
        };
        let global = [0.0f32, 0.0];
        let run = |robust: Robust| {
            robust
                .aggregate(&reports, &models, &global, &fedavg)
                .unwrap()
                .1
        };
        let mean = run(Robust::NONE);
        assert!(mean[0] < -1e5, "the attacker owns the mean: {mean:?}");
        let median = run(Robust {
            aggregator: Aggregator::Median,
            ..Robust::NONE
        });
        assert_eq!(median, vec![1.1, -1.1]);
        // Krum (⌈0.2 · 5⌉ = 1 taken to be hostile) drops it whole: the honest models' mean,
        // and the weights logged are those used, the attacker's 0.
        let krum = Robust {
            aggregator: Aggregator::Krum,
            ..Robust::NONE
        };
        let (w, g, defended) = krum.aggregate(&reports, &models, &global, &fedavg).unwrap();
        assert!((g[0] - 1.15).abs() < 1e-6, "{g:?}");
        assert_eq!(w.p, [0.25, 0.25, 0.25, 0.25, 0.0]);
        assert_eq!(defended.models_dropped, 1);
    }

    fn close(got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= tol, "{got:?} vs {want:?}");
        }
    }

    /// Spec §2.5 NIID-2: clients 0–4 hold two classes each, client 5 all ten, equal sizes.
    fn niid2_counts() -> Vec<Vec<u64>> {
        let mut v: Vec<Vec<u64>> = (0..5)
            .map(|i| {
                let mut c = vec![0; 10];
                c[2 * i] = 500;
                c[2 * i + 1] = 500;
                c
            })
            .collect();
        v.push(vec![100; 10]);
        v
    }

    fn reports(counts: &[Vec<u64>], metric: Metric) -> Vec<DiscoReport> {
        counts.iter().map(|c| report(c, metric).unwrap()).collect()
    }

    #[test]
    fn niid2_golden_weights_five_at_0_1515_one_at_0_2424() {
        let r = reports(&niid2_counts(), Metric::Kl);
        for x in &r[..5] {
            assert!((x.discrepancy - 5f64.ln()).abs() < 1e-12);
        }
        assert_eq!(r[5].discrepancy, 0.0);
        let w = weights(&r, &Params::default()).unwrap();
        close(&w.n, &[1.0 / 6.0; 6], 1e-15);
        close(&w.d, &[0.2, 0.2, 0.2, 0.2, 0.2, 0.0], 1e-15);
        let biased = (1.0 / 6.0) / 1.1;
        let uniform = (1.0 / 6.0 + 0.1) / 1.1;
        close(
            &w.p,
            &[biased, biased, biased, biased, biased, uniform],
            1e-12,
        );
        assert!((biased - 0.151515).abs() < 1e-6 && (uniform - 0.242424).abs() < 1e-6);
        assert_eq!((w.clipped, w.fell_back), (0, false));
    }

    #[test]
    fn niid2_raw_l2_zeroes_the_biased_and_normalised_l2_matches_kl() {
        let r = reports(&niid2_counts(), Metric::L2);
        assert!((r[0].discrepancy - 0.632456).abs() < 1e-6);
        let raw = Params {
            normalise: false,
            ..Params::default()
        };
        let w = weights(&r, &raw).unwrap();
        close(&w.p, &[0.0, 0.0, 0.0, 0.0, 0.0, 1.0], 1e-15);
        assert_eq!(w.clipped, 5);
        let kl = weights(&reports(&niid2_counts(), Metric::Kl), &Params::default()).unwrap();
        close(&weights(&r, &Params::default()).unwrap().p, &kl.p, 1e-12);
    }

    #[test]
    fn all_balanced_clients_are_size_weighted_and_shrunk_to_uniform() {
        let r = reports(&[vec![10; 10], vec![20; 10], vec![30; 10]], Metric::Kl);
        let w = weights(&r, &Params::default()).unwrap();
        close(&w.d, &[0.0; 3], 0.0);
        close(&w.p, &[0.205128, 0.333333, 0.461538], 1e-6);
    }

    #[test]
    fn a_tiny_one_class_client_is_clipped_to_zero() {
        let mut tiny = vec![0; 10];
        tiny[0] = 5;
        let r = reports(&[vec![1000; 10], vec![900; 10], tiny], Metric::Kl);
        let w = weights(&r, &Params::default()).unwrap();
        close(&w.n, &[0.526177, 0.473560, 0.000263], 1e-6);
        close(&w.d, &[0.0, 0.0, 1.0], 1e-15);
        close(&w.p, &[0.521929, 0.478071, 0.0], 1e-6);
        assert_eq!((w.clipped, w.fell_back), (1, false));
    }

    #[test]
    fn all_non_positive_scores_fall_back_to_size_weights() {
        let one = |c: usize| {
            let mut v = vec![0; 10];
            v[c] = 50;
            v
        };
        let r = reports(&[one(0), one(1)], Metric::Kl);
        let p = Params {
            a: 2.0,
            b: 0.0,
            normalise: true,
        };
        let w = weights(&r, &p).unwrap();
        assert!(w.fell_back);
        assert_eq!(w.clipped, 2);
        close(&w.p, &[0.5, 0.5], 0.0);
    }

    #[test]
    fn dirichlet_example_delta_to_p() {
        // Spec §2.5: CIFAR-10 sizes and KL discrepancies of a numpy Dir(0.5) partition, seed 0.
        let sizes = [5307, 3688, 4435, 5047, 5189, 3803, 5202, 4325, 8078, 4926];
        let delta = [
            0.830724, 0.857335, 0.473879, 0.470271, 0.964001, 0.845026, 0.916467, 0.476634,
            0.656991, 0.622457,
        ];
        let r: Vec<DiscoReport> = sizes
            .iter()
            .zip(delta)
            .map(|(&n, d)| DiscoReport {
                num_samples: n,
                discrepancy: d,
            })
            .collect();
        let w = weights(&r, &Params::default()).unwrap();
        close(
            &w.p,
            &[
                0.098501, 0.075668, 0.103595, 0.111924, 0.090683, 0.077778, 0.093083, 0.102000,
                0.143588, 0.103180,
            ],
            2e-6,
        );
        assert_eq!(w.clipped, 0);
    }

    #[test]
    fn closed_form_and_the_uniform_clients_relative_weight() {
        // Spec §2.3: one uniform client among m two-class clients of equal size.
        for (k, ratio) in [(6, 1.60), (10, 1.38), (30, 1.15), (50, 1.09), (100, 1.05)] {
            let mut counts: Vec<Vec<u64>> = (0..k - 1)
                .map(|i| {
                    let mut c = vec![0; 10];
                    c[(2 * i) % 10] = 50;
                    c[(2 * i + 1) % 10] = 50;
                    c
                })
                .collect();
            counts.push(vec![10; 10]);
            let w = weights(&reports(&counts, Metric::Kl), &Params::default()).unwrap();
            let got = w.p[k - 1] / w.p[0];
            assert!((got - ratio).abs() < 0.006, "K = {k}: {got} vs {ratio}");
            // p_k = (n_k − a d_k + b) / (1 − a + b |S|) when nothing is clipped.
            let denom = 1.0 - 0.5 + 0.1 * k as f64;
            assert!((w.p[0] - (w.n[0] - 0.5 * w.d[0] + 0.1) / denom).abs() < 1e-12);
        }
    }

    #[test]
    fn a_and_b_zero_give_fedavg_weights() {
        let r = reports(&[vec![3, 0, 1], vec![0, 0, 8], vec![4, 4, 4]], Metric::Kl);
        let w = weights(
            &r,
            &Params {
                a: 0.0,
                b: 0.0,
                normalise: true,
            },
        )
        .unwrap();
        close(&w.p, &[4.0 / 24.0, 8.0 / 24.0, 12.0 / 24.0], 1e-15);
    }

    #[test]
    fn single_participant_gets_everything() {
        let w = weights(&reports(&[vec![0, 7]], Metric::Kl), &Params::default()).unwrap();
        assert_eq!(w.p, vec![1.0]);
        let p = Params {
            a: 5.0,
            b: 0.0,
            normalise: true,
        };
        assert_eq!(
            weights(&reports(&[vec![0, 7]], Metric::Kl), &p).unwrap().p,
            vec![1.0]
        );
    }

    #[test]
    fn weights_are_recomputed_over_the_arrived_set() {
        // Spec §3.2: the same client's weight depends on who else arrived.
        let all = reports(&niid2_counts(), Metric::Kl);
        let w6 = weights(&all, &Params::default()).unwrap();
        let w3 = weights(&[all[0], all[1], all[5]], &Params::default()).unwrap();
        // n = 1/3, d = (0.5, 0.5, 0): p = (1/3 − 0.25 + 0.1, …, 1/3 + 0.1) / (1 − 0.5 + 0.3).
        close(
            &w3.p,
            &[0.183333 / 0.8, 0.183333 / 0.8, 0.433333 / 0.8],
            1e-6,
        );
        assert!(w3.p[2] > w6.p[5]);
    }

    #[test]
    fn silos_without_samples_are_excluded() {
        let r = vec![
            DiscoReport {
                num_samples: 0,
                discrepancy: 0.0,
            },
            report(&[5, 5], Metric::Kl).unwrap(),
        ];
        let w = weights(&r, &Params::default()).unwrap();
        assert_eq!(w.p, vec![0.0, 1.0]);
        assert_eq!(
            weights(&r[..1], &Params::default()),
            Err(DiscoError::NoParticipants(0))
        );
        assert_eq!(report(&[0, 0], Metric::Kl), Err(DiscoError::NoSamples));
    }

    #[test]
    fn bad_inputs_are_rejected_with_their_value() {
        let bad = DiscoReport {
            num_samples: 3,
            discrepancy: f64::NAN,
        };
        let e = weights(&[bad], &Params::default()).unwrap_err().to_string();
        assert!(e.contains("NaN") && e.contains("[0,"), "{e}");
        let big = DiscoReport {
            num_samples: 3,
            discrepancy: 2.5,
        };
        assert!(big.check(Metric::Kl, 10).is_err());
        assert!(big.check(Metric::Kl, 20).is_ok());
        let e = weights(
            &[big],
            &Params {
                a: -1.0,
                ..Params::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("a must be") && e.contains("-1"), "{e}");
        let e = discrepancy_to(&[1, 1], &[1.0, 0.0], Metric::Kl)
            .unwrap_err()
            .to_string();
        assert!(e.contains("(0, 1]"), "{e}");
        assert!(discrepancy_to(&[1, 1, 1], &[0.5, 0.5], Metric::Kl).is_err());
        assert!(discrepancy_to(&[1, 1], &[0.5, 0.6], Metric::Kl).is_err());
    }

    #[test]
    fn metrics_reach_their_maximum_on_one_class_and_zero_when_balanced() {
        for m in [Metric::Kl, Metric::L1, Metric::L2, Metric::Cosine] {
            let one = discrepancy(&[0, 0, 9, 0], m).unwrap();
            assert!((one - m.max_to_uniform(4)).abs() < 1e-12, "{m:?}");
            assert!(
                discrepancy(&[3, 3, 3, 3], m).unwrap().abs() < 1e-12,
                "{m:?}"
            );
        }
        // KL(D‖T) = ln C − H(D) with uniform T.
        let d: [f64; 3] = [0.5, 0.25, 0.25];
        let h: f64 = -d.iter().map(|p| p * p.ln()).sum::<f64>();
        assert!((discrepancy(&[2, 1, 1], Metric::Kl).unwrap() - (3f64.ln() - h)).abs() < 1e-12);
    }

    #[test]
    fn aggregate_is_the_weighted_average() {
        let a = [1.0f32, 2.0];
        let b = [3.0f32, -2.0];
        assert_eq!(
            aggregate(&[&a, &b], &[0.25, 0.75]).unwrap(),
            vec![2.5, -1.0]
        );
        assert!(aggregate(&[&a, &b], &[1.0]).is_err());
        assert!(aggregate(&[&a, &[1.0]], &[0.5, 0.5]).is_err());
    }
}
