//! Numerically stable softmax in f64 (FedeRiCo spec §5.2).
//! Owns: turning scores into a distribution without overflow, underflow to NaN, or all-zero rows.
//! Must not: know where the scores come from.

/// `softmax(scores)`: `exp(a_j - max a) / Σ_k exp(a_k - max a)`.
///
/// Spreads of thousands of nats give exact zeros for the far entries, never NaN: the maximum
/// always contributes `exp(0) = 1` to the denominator. Non-finite scores are the caller's bug
/// and are treated as `-inf` (weight 0); if every score is non-finite the result is uniform.
pub fn softmax(scores: &[f64]) -> Vec<f64> {
    let max = scores
        .iter()
        .copied()
        .filter(|s| s.is_finite())
        .fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        let n = scores.len().max(1) as f64;
        return vec![1.0 / n; scores.len()];
    }
    let exps: Vec<f64> = scores
        .iter()
        .map(|&s| if s.is_finite() { (s - max).exp() } else { 0.0 })
        .collect();
    let total: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / total).collect()
}

/// `log softmax(scores)` = `a - logsumexp(a)`, for logging weights too small to print.
pub fn log_softmax(scores: &[f64]) -> Vec<f64> {
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        let n = scores.len().max(1) as f64;
        return vec![-n.ln(); scores.len()];
    }
    let lse = max + scores.iter().map(|&s| (s - max).exp()).sum::<f64>().ln();
    scores.iter().map(|&s| s - lse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_for_equal_scores() {
        let w = softmax(&[0.0; 4]);
        assert!(w.iter().all(|&x| (x - 0.25).abs() < 1e-15));
    }

    #[test]
    fn spreads_of_thousands_of_nats_stay_finite() {
        // Summed losses reach the thousands (spec §5.2): naive exp(-L) would give 0/0.
        let w = softmax(&[-5000.0, -5001.0, -9000.0]);
        assert!(w.iter().all(|x| x.is_finite()));
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let e = (-1.0f64).exp();
        assert!((w[0] - 1.0 / (1.0 + e)).abs() < 1e-12);
        assert_eq!(w[2], 0.0);
    }

    #[test]
    fn huge_positive_scores_do_not_overflow() {
        let w = softmax(&[1e6, 1e6 - 2.0]);
        assert!((w[0] + w[1] - 1.0).abs() < 1e-12 && w[0] > w[1]);
    }

    #[test]
    fn log_softmax_matches_softmax() {
        let s = [-3.0, -1.0, -2.5, -700.0];
        let w = softmax(&s);
        let lw = log_softmax(&s);
        for (a, b) in w.iter().zip(&lw) {
            assert!((a.ln() - b).abs() < 1e-9 || *a == 0.0);
        }
        // log weights stay informative where the weight itself underflows
        assert!(log_softmax(&[0.0, -2000.0])[1] < -1999.0);
    }

    #[test]
    fn non_finite_scores_get_zero_weight() {
        let w = softmax(&[0.0, f64::NAN, f64::NEG_INFINITY]);
        assert_eq!(w, vec![1.0, 0.0, 0.0]);
        assert_eq!(softmax(&[f64::NAN, f64::NAN]), vec![0.5, 0.5]);
    }
}
