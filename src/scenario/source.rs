//! Where a scenario's samples come from: a built-in data set, a synthetic task, or a
//! researcher's own files.
//! Owns: [`Source`] and its names.
//! Must not: load anything (`data.rs`, `own.rs` and `learn::loaders` do).

use serde::{Deserialize, Serialize};

/// Where samples come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Synthetic label-group Gaussian mixture (no files).
    Mixture,
    /// The sine toy of the paper's Figure 1 (no files).
    Sine,
    /// MNIST IDX files.
    Mnist,
    /// Fashion-MNIST IDX files.
    FashionMnist,
    /// CIFAR-10 binary batches.
    Cifar10,
    /// UCI optdigits.
    Optdigits,
    /// Own CSV files: numeric feature columns and a label column (`label_column`).
    Csv,
    /// Own IDX files: `[images, labels]`, images of any size.
    Idx,
    /// Own images: a folder of class sub-folders of PNG/JPEG images.
    Images,
}

impl Source {
    /// The name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Source::Mixture => "mixture",
            Source::Sine => "sine",
            Source::Mnist => "mnist",
            Source::FashionMnist => "fashion_mnist",
            Source::Cifar10 => "cifar10",
            Source::Optdigits => "optdigits",
            Source::Csv => "csv",
            Source::Idx => "idx",
            Source::Images => "images",
        }
    }

    /// A researcher's own files rather than a built-in data set.
    pub fn is_own(self) -> bool {
        matches!(self, Source::Csv | Source::Idx | Source::Images)
    }
}
