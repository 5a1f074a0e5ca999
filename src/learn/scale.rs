//! Putting features on one scale: per-feature standardization (z-scores) with constants fitted
//! on the training parts of every silo together, applied to every part.
//!
//! Owns: [`FeatureScale`] (fitting, applying, its JSON file `scale.json` and its checks),
//! [`standardize`] for a whole federation, and [`ColumnSums`]: one silo's per-column row count,
//! mean and sum of squared deviations, which silos exchange instead of rows and
//! [`FeatureScale::combine`] pools into the same constants (`federico scale`).
//!
//! Why: features as they come from a user's files (an age in years, a pressure in mmHg, a
//! sensor at an offset of 500) make every model's training ill-conditioned, and mixing such
//! models fails first; `docs/notes/quality-history.md` ("Own data in its own units") has the
//! numbers.
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
        let features: Vec<&[f32]> = parts.iter().map(|p| p.features.as_slice()).collect();
        let (n, mean, sq) = moments(&features, d);
        if n == 0 {
            return None;
        }
        let std = sq.iter().map(|s| std_of(s / n as f64)).collect();
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

/// The rows of `parts` (row-major, `d` values a row) together: their count, each feature's
/// mean and each feature's sum of squared deviations from it, in f64. Two passes: the sum of
/// squared deviations does not cancel as Σx² − n·mean² can.
fn moments(parts: &[&[f32]], d: usize) -> (usize, Vec<f64>, Vec<f64>) {
    let rows = || parts.iter().flat_map(|p| p.chunks_exact(d));
    let n = rows().count();
    let mut mean = vec![0f64; d];
    for row in rows() {
        for (m, &x) in mean.iter_mut().zip(row) {
            *m += f64::from(x);
        }
    }
    for m in &mut mean {
        *m /= n.max(1) as f64;
    }
    let mut m2 = vec![0f64; d];
    for row in rows() {
        for ((s, &x), m) in m2.iter_mut().zip(row).zip(&mean) {
            let dev = f64::from(x) - m;
            *s += dev * dev;
        }
    }
    (n, mean, m2)
}

/// A feature's std from its population variance: 1 where the feature is constant.
fn std_of(variance: f64) -> f32 {
    let sd = variance.max(0.0).sqrt();
    if sd > 1e-12 && sd.is_finite() {
        sd as f32
    } else {
        1.0
    }
}

/// The `format` of a [`ColumnSums`] file.
pub const SUMS_FORMAT: &str = "federico-column-sums/1";

/// One silo's training rows summarised per feature column, all a federation needs to fit its
/// [`FeatureScale`] without a row leaving a silo: the row count, each column's mean and its
/// sum of squared deviations from that mean (with the count, the same as its sum and sum of
/// squares). The feature columns' header names, when the file had a header, let the pooling
/// check that every silo lists its columns in one order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnSums {
    /// Always [`SUMS_FORMAT`].
    pub format: String,
    /// Training rows summarised.
    pub rows: u64,
    /// Each feature column's mean.
    pub mean: Vec<f64>,
    /// Each feature column's sum of squared deviations from its mean.
    pub m2: Vec<f64>,
    /// The feature columns' names (the label column left out), when the file had a header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
}

impl ColumnSums {
    /// Summarises rows of `d` features each (row-major `features`), as [`FeatureScale::fit`]
    /// does; `columns` names the features.
    pub fn of(features: &[f32], d: usize, columns: Option<Vec<String>>) -> Self {
        let (n, mean, m2) = moments(&[features], d);
        Self {
            format: SUMS_FORMAT.into(),
            rows: n as u64,
            mean,
            m2,
            columns,
        }
    }

    /// Reads a sums file and checks it: its format, at least one row, as many means as sums
    /// of squares (and column names, if any), every value finite, no negative sum of squares.
    pub fn read(path: &Path) -> Result<Self, DataError> {
        let bad = |why: String| DataError::Invalid(format!("{}: {why}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|error| DataError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        let sums: Self = serde_json::from_str(&text).map_err(|e| {
            bad(format!(
                "not a column summary (`federico scale summarize`): {e}"
            ))
        })?;
        if sums.format != SUMS_FORMAT {
            return Err(bad(format!(
                "format {:?}, expected {SUMS_FORMAT:?}",
                sums.format
            )));
        }
        if sums.rows == 0 {
            return Err(bad("summarises no rows".into()));
        }
        let d = sums.mean.len();
        if d == 0 || sums.m2.len() != d || sums.columns.as_ref().is_some_and(|c| c.len() != d) {
            return Err(bad(format!(
                "{d} means, {} sums of squares{}",
                sums.m2.len(),
                sums.columns
                    .as_ref()
                    .map_or(String::new(), |c| format!(" and {} column names", c.len()))
            )));
        }
        if sums.mean.iter().chain(&sums.m2).any(|v| !v.is_finite())
            || sums.m2.iter().any(|&v| v < 0.0)
        {
            return Err(bad(
                "holds a value that is not a finite number (or a negative sum of squares)".into(),
            ));
        }
        Ok(sums)
    }
}

impl FeatureScale {
    /// Pools silos' [`ColumnSums`] (each with a name for messages) into the constants
    /// [`FeatureScale::fit`] gives on their rows together, up to rounding (Chan et al.'s
    /// pairwise update, in the order given). Refuses summaries of different column counts or
    /// names.
    pub fn combine(parts: &[(ColumnSums, String)]) -> Result<Self, DataError> {
        let Some((first, first_name)) = parts.first() else {
            return Err(DataError::Invalid("no column summaries to combine".into()));
        };
        let d = first.mean.len();
        for (p, name) in &parts[1..] {
            if p.mean.len() != d {
                return Err(DataError::Invalid(format!(
                    "{name} summarises {} feature columns, {first_name} {d}",
                    p.mean.len()
                )));
            }
            if let (Some(a), Some(b)) = (&first.columns, &p.columns)
                && a != b
            {
                return Err(DataError::Invalid(format!(
                    "{name} names its columns {}, {first_name} {}: every silo must list the \
                     same features in the same order",
                    b.join(", "),
                    a.join(", ")
                )));
            }
        }
        let (mut n, mut mean, mut m2) = (0f64, vec![0f64; d], vec![0f64; d]);
        for (p, _) in parts {
            let nb = p.rows as f64;
            let total = n + nb;
            for f in 0..d {
                let delta = p.mean[f] - mean[f];
                mean[f] += delta * nb / total;
                m2[f] += p.m2[f] + delta * delta * n * nb / total;
            }
            n = total;
        }
        Ok(Self {
            mean: mean.iter().map(|&m| m as f32).collect(),
            std: m2.iter().map(|&s| std_of(s / n)).collect(),
        })
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

    #[test]
    fn silos_column_sums_pool_into_the_constants_of_their_rows_together() {
        let a = set(&[[500.0, 7.0], [520.0, 7.0], [610.5, 7.0]]);
        let b = set(&[[580.0, 7.0], [600.0, 7.0]]);
        let c = set(&[[433.25, 7.0]]);
        let fitted = FeatureScale::fit(&[&a, &b, &c]).unwrap();
        let named = |d: &Dataset, n: &str| (ColumnSums::of(&d.features, 2, None), n.to_string());
        let pooled =
            FeatureScale::combine(&[named(&a, "a"), named(&b, "b"), named(&c, "c")]).unwrap();
        for (x, y) in pooled.mean.iter().zip(&fitted.mean) {
            assert!((x - y).abs() <= 1e-4, "{pooled:?} against {fitted:?}");
        }
        for (x, y) in pooled.std.iter().zip(&fitted.std) {
            assert!((x - y).abs() <= 1e-4 * y, "{pooled:?} against {fitted:?}");
        }
        assert_eq!(pooled.std[1], 1.0, "a constant column keeps std 1");
        // A file round trip, and what a bad one says.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        let cols = Some(vec!["age".to_string(), "dose".to_string()]);
        let sums = ColumnSums::of(&a.features, 2, cols.clone());
        std::fs::write(&path, serde_json::to_string(&sums).unwrap()).unwrap();
        assert_eq!(ColumnSums::read(&path).unwrap(), sums);
        for (text, why) in [
            (
                r#"{"format": "x", "rows": 1, "mean": [0.0], "m2": [0.0]}"#,
                "format \"x\"",
            ),
            (
                r#"{"format": "federico-column-sums/1", "rows": 0, "mean": [0.0], "m2": [0.0]}"#,
                "no rows",
            ),
            (
                r#"{"format": "federico-column-sums/1", "rows": 2, "mean": [0.0], "m2": []}"#,
                "1 means, 0 sums",
            ),
            (
                r#"{"format": "federico-column-sums/1", "rows": 2, "mean": [0.0], "m2": [-1.0]}"#,
                "negative",
            ),
            ("[1, 2]", "not a column summary"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = ColumnSums::read(&path).unwrap_err().to_string();
            assert!(e.contains("a.json") && e.contains(why), "{e}");
        }
        // Silos that list their columns differently, or another count, are refused by name.
        let swapped = ColumnSums::of(
            &b.features,
            2,
            Some(vec!["dose".to_string(), "age".to_string()]),
        );
        let e = FeatureScale::combine(&[(sums.clone(), "a".into()), (swapped, "b".into())])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("b names its columns dose, age, a age, dose"),
            "{e}"
        );
        let labels = Labels::Class {
            ids: vec![0],
            num_classes: 2,
        };
        let one = Dataset::new(vec![1.0], vec![1], labels).unwrap();
        let e = FeatureScale::combine(&[
            (sums, "a".into()),
            (ColumnSums::of(&one.features, 1, None), "z".into()),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("z summarises 1 feature columns, a 2"), "{e}");
    }
}
