//! In-memory data sets and the per-client view of a federation.
//! Owns: [`Dataset`] (features + labels), [`ClientData`] (a silo's train/test split) and
//! [`Federation`] (all silos of a run, with their known groups), and [`DataError`].
//! Must not: read files (that is `loaders`) or decide who gets which sample (`partition`).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Errors from loading, generating or splitting data. Each names the file or value at fault.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The data directory does not exist or lacks the files a source needs.
    #[error("{0}")]
    Missing(String),
    /// A file could not be read.
    #[error("reading {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error (in the message, so not a `source`: `{:#}` would repeat it).
        error: std::io::Error,
    },
    /// A file was read but its content is not what its format requires.
    #[error("{path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong: magic number, record size, count, ...
        reason: String,
    },
    /// Split or generator parameters that cannot be satisfied.
    #[error("{0}")]
    Invalid(String),
}

/// The targets of a data set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Labels {
    /// Class ids in `0..num_classes`.
    Class {
        /// One id per sample.
        ids: Vec<u32>,
        /// Number of classes of the task (not only those present).
        num_classes: usize,
    },
    /// One real-valued target per sample (regression).
    Real(Vec<f32>),
}

/// Samples held in memory: `len()` rows of `feature_len()` f32 features each.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    /// Row-major features, `len() * feature_len()` values.
    pub features: Vec<f32>,
    /// Shape of one sample: `[d]` for vectors, `[channels, height, width]` for images.
    pub sample_shape: Vec<usize>,
    /// Targets, one per sample.
    pub labels: Labels,
}

impl Dataset {
    /// Builds a data set, checking that features and labels agree in count.
    pub fn new(
        features: Vec<f32>,
        sample_shape: Vec<usize>,
        labels: Labels,
    ) -> Result<Self, DataError> {
        let d: usize = sample_shape.iter().product();
        let n = match &labels {
            Labels::Class { ids, num_classes } => {
                if let Some(bad) = ids.iter().find(|&&c| c as usize >= *num_classes) {
                    return Err(DataError::Invalid(format!(
                        "label {bad} out of range for {num_classes} classes"
                    )));
                }
                ids.len()
            }
            Labels::Real(v) => v.len(),
        };
        if d == 0 || features.len() != n * d {
            return Err(DataError::Invalid(format!(
                "{} feature values do not make {n} samples of shape {sample_shape:?}",
                features.len()
            )));
        }
        Ok(Self {
            features,
            sample_shape,
            labels,
        })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        match &self.labels {
            Labels::Class { ids, .. } => ids.len(),
            Labels::Real(v) => v.len(),
        }
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of f32 values per sample.
    pub fn feature_len(&self) -> usize {
        self.sample_shape.iter().product()
    }

    /// Number of classes for a classification set, `None` for regression.
    pub fn num_classes(&self) -> Option<usize> {
        match &self.labels {
            Labels::Class { num_classes, .. } => Some(*num_classes),
            Labels::Real(_) => None,
        }
    }

    /// Features of sample `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        let d = self.feature_len();
        &self.features[i * d..(i + 1) * d]
    }

    /// A new data set holding the given rows, in the given order.
    pub fn subset(&self, rows: &[usize]) -> Dataset {
        let d = self.feature_len();
        let mut features = Vec::with_capacity(rows.len() * d);
        for &i in rows {
            features.extend_from_slice(self.row(i));
        }
        let labels = match &self.labels {
            Labels::Class { ids, num_classes } => Labels::Class {
                ids: rows.iter().map(|&i| ids[i]).collect(),
                num_classes: *num_classes,
            },
            Labels::Real(v) => Labels::Real(rows.iter().map(|&i| v[i]).collect()),
        };
        Dataset {
            features,
            sample_shape: self.sample_shape.clone(),
            labels,
        }
    }

    /// Each row's class id, or 0 for every row of a regression target: the strata of a split
    /// by label.
    pub fn strata(&self) -> Vec<u32> {
        match &self.labels {
            Labels::Class { ids, .. } => ids.clone(),
            Labels::Real(v) => vec![0; v.len()],
        }
    }

    /// Samples per class (empty for regression).
    pub fn class_counts(&self) -> Vec<usize> {
        match &self.labels {
            Labels::Class { ids, num_classes } => {
                let mut c = vec![0; *num_classes];
                for &y in ids {
                    c[y as usize] += 1;
                }
                c
            }
            Labels::Real(_) => Vec::new(),
        }
    }
}

/// One silo's data: a training part (used for training and the E-step) and a test part.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientData {
    /// Training samples.
    pub train: Dataset,
    /// Held-out samples the silo is scored on.
    pub test: Dataset,
    /// The distribution (group) this silo was drawn from, when the split has known groups.
    pub group: Option<usize>,
}

/// All silos of one run.
#[derive(Clone, Debug)]
pub struct Federation {
    /// One entry per silo, indexed by node id.
    pub clients: Vec<ClientData>,
    /// For label-group splits: the label set of each group.
    pub group_labels: Option<Vec<Vec<u32>>>,
}

/// Per-client sample counts, written with every run (`partition.json`).
#[derive(Clone, Debug, Serialize)]
pub struct PartitionReport {
    /// One entry per silo.
    pub clients: Vec<ClientReport>,
    /// For label-group splits: the label set of each group.
    pub group_labels: Option<Vec<Vec<u32>>>,
}

/// Sample counts of one silo.
#[derive(Clone, Debug, Serialize)]
pub struct ClientReport {
    /// Node index.
    pub client: usize,
    /// Group, when known.
    pub group: Option<usize>,
    /// Training samples.
    pub train: usize,
    /// Test samples.
    pub test: usize,
    /// Training samples per class (empty for regression).
    pub train_per_class: Vec<usize>,
    /// Test samples per class (empty for regression).
    pub test_per_class: Vec<usize>,
}

impl Federation {
    /// Mini-batches of `batch` in one local epoch of the largest silo, ⌈max n_i / batch⌉ (at
    /// least 1): the sub-steps per round of FedeRiCo's `mstep = "epoch"`.
    pub fn epoch_steps(&self, batch: usize) -> u64 {
        self.clients
            .iter()
            .map(|c| c.train.len().div_ceil(batch.max(1)))
            .max()
            .unwrap_or(1)
            .max(1) as u64
    }

    /// The per-client counts report.
    pub fn report(&self) -> PartitionReport {
        PartitionReport {
            clients: self
                .clients
                .iter()
                .enumerate()
                .map(|(i, c)| ClientReport {
                    client: i,
                    group: c.group,
                    train: c.train.len(),
                    test: c.test.len(),
                    train_per_class: c.train.class_counts(),
                    test_per_class: c.test.class_counts(),
                })
                .collect(),
            group_labels: self.group_labels.clone(),
        }
    }

    /// Group of every client, when all are known.
    pub fn groups(&self) -> Option<Vec<usize>> {
        self.clients.iter().map(|c| c.group).collect()
    }
}
