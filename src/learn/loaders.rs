//! Readers for real data sets in their standard file formats.
//! Owns: MNIST / Fashion-MNIST IDX files (gzipped or not), CIFAR-10 binary batches, UCI optdigits,
//! and where they are looked for under a data directory.
//! Must not: split data between silos (that is `partition`), or panic on a bad file: every
//! problem is a [`DataError`] naming the file and what is wrong.

use super::data::{DataError, Dataset};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A real data set federico can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RealSource {
    /// MNIST digits, 28×28 grey, 10 classes; folder `mnist/`.
    Mnist,
    /// Fashion-MNIST, 28×28 grey, 10 classes; folder `fashion-mnist/`.
    FashionMnist,
    /// CIFAR-10 binary version, 32×32 RGB, 10 classes; folder `cifar-10/cifar-10-batches-bin/`.
    Cifar10,
    /// UCI optdigits, 8×8 counts in 0..=16, 10 classes; folder `optdigits/`.
    Optdigits,
}

/// The official training and test parts of a real data set; pixels scaled to [0, 1].
#[derive(Clone, Debug)]
pub struct RealData {
    /// Training part.
    pub train: Dataset,
    /// Test part.
    pub test: Dataset,
}

/// Loads `source` from `dir` (the data directory holding one folder per data set; the data
/// set's own folder is accepted too).
pub fn load(source: RealSource, dir: &Path) -> Result<RealData, DataError> {
    let _ = (source, dir);
    todo!()
}
