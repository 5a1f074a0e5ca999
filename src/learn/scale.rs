//! Putting features on one scale: per-feature standardization (z-scores) with constants fitted
//! on the training parts of every silo together, applied to every part.
//!
//! Owns: [`FeatureScale`] (fitting, applying, its JSON file `scale.json` and its checks) and [`standardize`] for a whole
//! federation. Why: features as they come from a user's files (an age in years, a pressure in
//! mmHg, a sensor at an offset of 500) make every model's training ill-conditioned, and mixing
//! such models fails first; `docs/quality.md` ("Own data in its own units") has the numbers.
//! Fitting on one silo alone is not offered: label skew moves each silo's means, so silos that
//! standardize apart no longer speak the same features (measured there too). The constants are
//! what silos would obtain by sharing per-feature counts, sums and sums of squares of their
//! training rows, never a row; test rows never enter them.
//! Must not: choose when to standardize (the scenario does) or find a `scale.json` (the
//! callers name the file).

use super::{DataError, Dataset, Federation};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Per-feature constants: a value x of feature f becomes (x − mean\[f\]) / std\[f\].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureScale {
    /// The mean of each feature over the fitted rows.
    pub mean: Vec<f32>,
    /// The population standard deviation of each feature over the fitted rows; 1 where a
    /// feature is constant there (it then only loses its offset).
    pub std: Vec<f32>,
}

impl FeatureScale {
    /// Fits the constants on the rows of `parts` together (f64 sums); `None` when they hold no
    /// row or their feature lengths differ.
    pub fn fit(parts: &[&Dataset]) -> Option<Self> {
        let d = parts.first()?.feature_len();
        if parts.iter().any(|p| p.feature_len() != d) {
            return None;
        }
        let n: usize = parts.iter().map(|p| p.len()).sum();
        if n == 0 {
            return None;
        }
        let mut sum = vec![0f64; d];
        for p in parts {
            for row in p.features.chunks_exact(d) {
                for (s, &x) in sum.iter_mut().zip(row) {
                    *s += f64::from(x);
                }
            }
        }
        let mean: Vec<f64> = sum.iter().map(|s| s / n as f64).collect();
        // Two passes: the sum of squared deviations does not cancel as Σx² − n·mean² can.
        let mut sq = vec![0f64; d];
        for p in parts {
            for row in p.features.chunks_exact(d) {
                for ((s, &x), m) in sq.iter_mut().zip(row).zip(&mean) {
                    let dev = f64::from(x) - m;
                    *s += dev * dev;
                }
            }
        }
        let std = sq
            .iter()
            .map(|s| {
                let sd = (s / n as f64).sqrt();
                if sd > 1e-12 && sd.is_finite() {
                    sd as f32
                } else {
                    1.0
                }
            })
            .collect();
        Some(Self {
            mean: mean.iter().map(|&m| m as f32).collect(),
            std,
        })
    }

    /// Reads a `scale.json` (as `init`, `partition` and `simulate` write it) and checks it:
    /// as many means as standard deviations, every value finite and every std positive.
    pub fn read(path: &Path) -> Result<Self, DataError> {
        let bad = |why: String| DataError::Invalid(format!("{}: {why}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let scale: Self = serde_json::from_str(&text).map_err(|e| {
            bad(format!(
                "not a feature scale ({{\"mean\": [...], \"std\": [...]}}, one value per \
                 feature): {e}"
            ))
        })?;
        if scale.mean.len() != scale.std.len() || scale.mean.is_empty() {
            return Err(bad(format!(
                "{} means and {} standard deviations",
                scale.mean.len(),
                scale.std.len()
            )));
        }
        if let Some(m) = scale.mean.iter().find(|m| !m.is_finite()) {
            return Err(bad(format!("mean {m} (each must be a finite number)")));
        }
        if let Some(s) = scale.std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(bad(format!("std {s} (each must be a positive number)")));
        }
        Ok(scale)
    }

    /// [`Self::apply`] for rows read from files: an error naming `source` when their feature
    /// length is not this scale's.
    pub fn apply_checked(&self, data: &mut Dataset, source: &str) -> Result<(), DataError> {
        if data.feature_len() != self.mean.len() {
            return Err(DataError::Invalid(format!(
                "{source}: rows of {} features, but the feature scale has {}",
                data.feature_len(),
                self.mean.len()
            )));
        }
        self.apply(data);
        Ok(())
    }

    /// Rescales every row of `data` in place.
    ///
    /// # Panics
    /// When `data`'s feature length is not this scale's (a caller's bug: [`standardize`]
    /// fits and applies on one federation).
    pub fn apply(&self, data: &mut Dataset) {
        let d = data.feature_len();
        assert_eq!(
            d,
            self.mean.len(),
            "feature scale for another feature length"
        );
        for row in data.features.chunks_exact_mut(d) {
            for ((x, m), s) in row.iter_mut().zip(&self.mean).zip(&self.std) {
                *x = (*x - m) / s;
            }
        }
    }
}

/// Fits a [`FeatureScale`] on every silo's training part together and applies it to every
/// silo's training and test parts; returns it (`None`, and nothing changed, when the
/// federation has no training row).
pub fn standardize(fed: &mut Federation) -> Option<FeatureScale> {
    let scale = FeatureScale::fit(&fed.clients.iter().map(|c| &c.train).collect::<Vec<_>>())?;
    for c in &mut fed.clients {
        scale.apply(&mut c.train);
        scale.apply(&mut c.test);
    }
    Some(scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::{ClientData, Labels};

    fn set(rows: &[[f32; 2]]) -> Dataset {
        Dataset::new(
            rows.iter().flatten().copied().collect(),
            vec![2],
            Labels::Class {
                ids: vec![0; rows.len()],
                num_classes: 2,
            },
        )
        .unwrap()
    }

    #[test]
    fn pooled_training_rows_get_mean_zero_and_unit_std_and_test_rows_follow() {
        // Two silos whose means differ (label skew): the constants are the pool's, not each
        // silo's, and the test rows never enter them.
        let a = set(&[[500.0, 7.0], [520.0, 7.0]]);
        let b = set(&[[580.0, 7.0], [600.0, 7.0]]);
        let test = set(&[[550.0, 9.0], [1e6, 7.0]]);
        let mut fed = Federation {
            clients: vec![
                ClientData {
                    train: a,
                    test: test.clone(),
                    group: None,
                },
                ClientData {
                    train: b,
                    test,
                    group: None,
                },
            ],
            group_labels: None,
        };
        let scale = standardize(&mut fed).unwrap();
        assert_eq!(scale.mean, vec![550.0, 7.0]);
        // Population std of 500, 520, 580, 600 is √1700; the constant feature keeps std 1.
        assert!(
            (scale.std[0] - 1700f32.sqrt()).abs() < 1e-3,
            "{:?}",
            scale.std
        );
        assert_eq!(scale.std[1], 1.0);
        let pooled: Vec<f32> = fed
            .clients
            .iter()
            .flat_map(|c| c.train.features.chunks(2).map(|r| r[0]))
            .collect();
        let mean: f32 = pooled.iter().sum::<f32>() / 4.0;
        let var: f32 = pooled.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / 4.0;
        assert!(
            mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4,
            "{mean} {var}"
        );
        // Silo 0's rows sit below the pool's mean, silo 1's above: the skew survives.
        assert!(fed.clients[0].train.features[0] < 0.0 && fed.clients[1].train.features[0] > 0.0);
        // Test rows: (550 − 550) / σ = 0, and the constant feature's 9 becomes 2.
        assert_eq!(fed.clients[0].test.row(0), &[0.0, 2.0]);
        assert!(fed.clients[1].test.row(1)[0] > 1e4);
    }

    #[test]
    fn no_rows_or_mixed_lengths_fit_nothing() {
        let empty = Dataset::new(
            vec![],
            vec![2],
            Labels::Class {
                ids: vec![],
                num_classes: 2,
            },
        )
        .unwrap();
        assert_eq!(FeatureScale::fit(&[&empty]), None);
        assert_eq!(FeatureScale::fit(&[]), None);
        let three = Dataset::new(
            vec![1.0, 2.0, 3.0],
            vec![3],
            Labels::Class {
                ids: vec![0],
                num_classes: 2,
            },
        )
        .unwrap();
        assert_eq!(FeatureScale::fit(&[&set(&[[1.0, 2.0]]), &three]), None);
    }
}
