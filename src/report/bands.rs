//! Curves over seeds: each algorithm's metric per round as the mean over seeds with the standard
//! deviation around it, the shaded band of the metric figure.
//! Owns: [`over_seeds`] (one round's statistics from the seeds that reached it) and
//! [`curves_over_seeds`] (every algorithm's curve, labelled with its display name).
//! Must not: draw (`plots` does) or read files.

use super::names::display_label;
use super::plots::{Curve, CurvePoint};
use super::table::mean_std;
use std::collections::BTreeMap;

/// Mean and sample standard deviation over seeds at every round any seed reached, in round
/// order. A round only some seeds reached (a shorter run, a different evaluation schedule) is
/// averaged over those seeds; one seed gives a spread of 0; a NaN at a round makes that round's
/// mean and spread NaN (a gap in the figure).
pub fn over_seeds(seeds: &[&[(usize, f64)]]) -> Vec<CurvePoint> {
    let mut by_round: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for seed in seeds {
        for &(round, value) in *seed {
            by_round.entry(round).or_default().push(value);
        }
    }
    by_round
        .into_iter()
        .map(|(round, values)| {
            let (mean, std) = mean_std(&values);
            CurvePoint { round, mean, std }
        })
        .collect()
}

/// A metric per evaluated round, per algorithm: `(name, [(round, value)])`.
pub(crate) type Curves = Vec<(String, Vec<(usize, f64)>)>;

/// One curve per algorithm, in the order of the first seed's, from every seed's curves
/// (`curves[seed]` lists `(algorithm name, points)`); an algorithm is matched across seeds by
/// name, so seeds need not list them in one order. Labels are display names.
pub fn curves_over_seeds(curves: &[Curves]) -> Vec<Curve> {
    let Some(first) = curves.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|(name, _)| {
            let per_seed: Vec<&[(usize, f64)]> = curves
                .iter()
                .filter_map(|seed| {
                    seed.iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, pts)| pts.as_slice())
                })
                .collect();
            Curve {
                label: display_label(name),
                points: over_seeds(&per_seed),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn mean_and_sample_std_per_round() {
        let a = [(1, 0.5), (2, 0.7)];
        let b = [(1, 0.7), (2, 0.9)];
        let c = [(1, 0.6), (2, 0.8)];
        let pts = over_seeds(&[&a, &b, &c]);
        assert_eq!(pts.len(), 2);
        assert_eq!((pts[0].round, pts[1].round), (1, 2));
        assert!(
            close(pts[0].mean, 0.6) && close(pts[1].mean, 0.8),
            "{pts:?}"
        );
        // Sample std of {0.5, 0.6, 0.7}: 0.1.
        assert!(close(pts[0].std, 0.1) && close(pts[1].std, 0.1), "{pts:?}");
    }

    #[test]
    fn unequal_lengths_use_the_seeds_that_reached_the_round() {
        let long = [(10, 0.2), (20, 0.4), (30, 0.6)];
        let short = [(10, 0.4), (20, 0.6)];
        let other_schedule = [(15, 0.5)];
        let pts = over_seeds(&[&long, &short, &other_schedule]);
        let rounds: Vec<usize> = pts.iter().map(|p| p.round).collect();
        assert_eq!(rounds, [10, 15, 20, 30]);
        assert!(close(pts[0].mean, 0.3));
        assert!(
            close(pts[1].mean, 0.5) && pts[1].std == 0.0,
            "one seed: no band"
        );
        assert!(close(pts[3].mean, 0.6) && pts[3].std == 0.0);
        assert!(close(pts[2].std, (0.02f64).sqrt()), "{pts:?}");
    }

    #[test]
    fn nan_and_empty_inputs() {
        let a = [(1, f64::NAN), (2, 0.5)];
        let b = [(1, 0.5), (2, 0.5)];
        let pts = over_seeds(&[&a, &b]);
        assert!(pts[0].mean.is_nan() && pts[0].std.is_nan());
        assert!(close(pts[1].mean, 0.5) && pts[1].std == 0.0);
        assert!(over_seeds(&[]).is_empty());
        assert!(curves_over_seeds(&[]).is_empty());
    }

    #[test]
    fn curves_are_matched_by_name_and_labelled_for_display() {
        let seed1: Curves = vec![
            ("fedavg_plus".into(), vec![(1, 0.4)]),
            ("federico".into(), vec![(1, 0.8)]),
        ];
        let seed2: Curves = vec![
            ("federico".into(), vec![(1, 0.9)]),
            ("fedavg_plus".into(), vec![(1, 0.6)]),
        ];
        let curves = curves_over_seeds(&[seed1, seed2]);
        assert_eq!(curves.len(), 2);
        assert_eq!(curves[0].label, "FedAvg+");
        assert!(close(curves[0].points[0].mean, 0.5));
        assert_eq!(curves[1].label, "FedeRiCo");
        assert!(close(curves[1].points[0].mean, 0.85));
    }
}
