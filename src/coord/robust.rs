//! Bounds on what a member says about itself, shared by the coordinator algorithms (insiders'
//! review D3: a FedDisco member that registered `n_train = 10^12` took 0.79 of the weight;
//! HCCT and FedSaC weigh the same self-reported count).
//! Owns: [`lower_median`] and [`cap_sizes`], the size-lie bound: a count is taken as at most
//! `cap` times the lower median of the counts it is weighed with.
//! Must not: know any algorithm's messages or weights (each algorithm applies the bound to
//! the counts it weighs).

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

#[cfg(test)]
mod tests {
    use super::*;

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
