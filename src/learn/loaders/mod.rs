//! Readers for real data sets in their standard file formats.
//!
//! Owns: which real data sets exist ([`RealSource`]), where their files are looked for under a
//! data directory, the `Missing` help text, and the error helpers every format shares.
//! A researcher's own files (CSV, IDX of any image size, folders of PNG/JPEG images) are read
//! into [`Labelled`] samples whose classes [`unify`] numbers once for every file of a scenario.
//! Must not: parse a file format itself (that is `idx.rs`, `cifar.rs`, `optdigits.rs`,
//! `csv.rs` and `images.rs`), split data between silos (that is `partition`), or panic on a bad file: every
//! problem is a [`DataError`] naming the file and what is wrong.

mod cifar;
mod csv;
mod idx;
mod images;
mod optdigits;
mod own;

pub use cifar::load_cifar_files;
pub use csv::{CsvColumns, CsvTable, load_csv, load_csv_column, read_csv};
pub use idx::{load_idx_files, read_idx_labelled};
#[cfg(test)]
pub(crate) use images::tests::write_folder as write_image_folder;
pub use images::{IMAGE_EXTENSIONS, read_image_folder};
pub use own::{Column, Labelled, unify, unify_named};

use super::data::{DataError, Dataset, Labels};
use cifar::{CIFAR_SIDE, load_cifar};
use idx::{IDX_FILES, IDX_SIDE, load_idx_pair};
use optdigits::load_optdigits;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

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

impl RealSource {
    /// Human-readable name, as used in messages.
    pub fn name(self) -> &'static str {
        match self {
            RealSource::Mnist => "MNIST",
            RealSource::FashionMnist => "Fashion-MNIST",
            RealSource::Cifar10 => "CIFAR-10",
            RealSource::Optdigits => "optdigits",
        }
    }

    /// The folder, relative to the data directory, where the files are looked for first.
    pub fn folder(self) -> &'static str {
        match self {
            RealSource::Mnist => "mnist",
            RealSource::FashionMnist => "fashion-mnist",
            RealSource::Cifar10 => "cifar-10/cifar-10-batches-bin",
            RealSource::Optdigits => "optdigits",
        }
    }

    /// The name `federico data download` takes for it (the top folder of [`Self::folder`]).
    pub fn download_name(self) -> &'static str {
        match self {
            RealSource::Mnist => "mnist",
            RealSource::FashionMnist => "fashion-mnist",
            RealSource::Cifar10 => "cifar-10",
            RealSource::Optdigits => "optdigits",
        }
    }

    /// Shape of one sample as loaded: `[channels, height, width]`.
    pub fn sample_shape(self) -> [usize; 3] {
        match self {
            RealSource::Mnist | RealSource::FashionMnist => [1, IDX_SIDE, IDX_SIDE],
            RealSource::Cifar10 => [3, CIFAR_SIDE, CIFAR_SIDE],
            RealSource::Optdigits => [1, 8, 8],
        }
    }

    /// Number of classes (10 for every source).
    pub fn num_classes(self) -> usize {
        CLASSES
    }
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
///
/// Where files are looked for, in order:
/// - MNIST: `dir/mnist/`, else `dir` itself; Fashion-MNIST: `dir/fashion-mnist/`, else `dir`.
///   Files `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`,
///   `t10k-labels-idx1-ubyte`, each possibly with a `.gz` suffix (gzip is detected by its magic
///   bytes, not by the name). Images must be 28×28.
/// - CIFAR-10: `dir/cifar-10/cifar-10-batches-bin/`, `dir/cifar-10-batches-bin/`, else `dir`.
///   Training = every `data_batch_*.bin` present (at least one, ordered by batch number); test =
///   `test_batch.bin`, or else the first (by name) `test_batch*.bin` (e.g. a
///   `test_batch_first1000.bin` prefix).
/// - optdigits: `dir/optdigits/`, else `dir`; `optdigits.tra` (training), `optdigits.tes` (test).
///
/// Pixels are scaled to [0, 1] (/255, or /16 for optdigits). Sample shapes are `[1, 28, 28]`,
/// `[3, 32, 32]` (R, G, B planes) and `[1, 8, 8]`.
pub fn load(source: RealSource, dir: &Path) -> Result<RealData, DataError> {
    let folder = resolve_folder(source, dir)?;
    match source {
        RealSource::Mnist | RealSource::FashionMnist => Ok(RealData {
            train: load_idx_pair(source, &folder, "train")?,
            test: load_idx_pair(source, &folder, "t10k")?,
        }),
        RealSource::Cifar10 => load_cifar(&folder),
        RealSource::Optdigits => Ok(RealData {
            train: load_optdigits(&require_file(source, &folder, &["optdigits.tra"])?)?,
            test: load_optdigits(&require_file(source, &folder, &["optdigits.tes"])?)?,
        }),
    }
}

const CLASSES: usize = 10;

/// What to put where (`folder`), and how to point federico at it; appended to every `Missing`
/// message.
fn help(source: RealSource, folder: &Path) -> String {
    let files = match source {
        RealSource::Mnist | RealSource::FashionMnist => IDX_FILES.join(", "),
        RealSource::Cifar10 => "data_batch_1.bin ... data_batch_5.bin (at least one) and \
                                test_batch.bin, from the CIFAR-10 binary version \
                                (cifar-10-binary.tar.gz)"
            .to_string(),
        RealSource::Optdigits => "optdigits.tra and optdigits.tes (UCI optdigits, CSV)".to_string(),
    };
    let note = match source {
        RealSource::Mnist | RealSource::FashionMnist => " (each may be gzipped, with a .gz suffix)",
        _ => "",
    };
    format!(
        "{} needs {files} in {}{note}. `federico data download {}` fetches them (into data/, or \
         --data-dir DIR); or point federico at the data directory that holds the `{}/` folder \
         with the FEDERICO_DATA_DIR environment variable, the --data-dir flag or the scenario's \
         `data.dir` field.",
        source.name(),
        folder.display(),
        source.download_name(),
        source.folder(),
    )
}

fn missing(source: RealSource, folder: &Path, what: String) -> DataError {
    DataError::Missing(format!("{what}. {}", help(source, folder)))
}

/// True when `dir` directly holds at least one file of `source`.
fn holds_files(source: RealSource, dir: &Path) -> bool {
    match source {
        RealSource::Mnist | RealSource::FashionMnist => IDX_FILES
            .iter()
            .any(|f| dir.join(f).is_file() || dir.join(format!("{f}.gz")).is_file()),
        RealSource::Cifar10 => std::fs::read_dir(dir)
            .map(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.ends_with(".bin")
                        && (name.starts_with("data_batch_") || name.starts_with("test_batch"))
                })
            })
            .unwrap_or(false),
        RealSource::Optdigits => {
            dir.join("optdigits.tra").is_file() || dir.join("optdigits.tes").is_file()
        }
    }
}

/// The folder holding the files of `source`: a sub-folder of `dir`, or `dir` itself.
fn resolve_folder(source: RealSource, dir: &Path) -> Result<PathBuf, DataError> {
    if !dir.is_dir() {
        return Err(missing(
            source,
            &dir.join(source.folder()),
            format!(
                "{} not found: the data directory {} does not exist",
                source.name(),
                dir.display()
            ),
        ));
    }
    let mut candidates = vec![dir.join(source.folder())];
    if source == RealSource::Cifar10 {
        candidates.push(dir.join("cifar-10-batches-bin"));
    }
    for c in &candidates {
        if c.is_dir() {
            return Ok(c.clone());
        }
    }
    if holds_files(source, dir) {
        return Ok(dir.to_path_buf());
    }
    let tried: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    Err(missing(
        source,
        &candidates[0],
        format!(
            "{} not found: no folder {} and no {} files directly in {}",
            source.name(),
            tried.join(" or "),
            source.name(),
            dir.display()
        ),
    ))
}

/// The first of `names` that exists in `folder`, or `Missing`.
fn require_file(source: RealSource, folder: &Path, names: &[&str]) -> Result<PathBuf, DataError> {
    for n in names {
        let p = folder.join(n);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(missing(
        source,
        folder,
        format!(
            "{} incomplete: {} has no {}",
            source.name(),
            folder.display(),
            names.join(" or ")
        ),
    ))
}

fn corrupt(path: &Path, reason: impl Into<String>) -> DataError {
    DataError::Corrupt {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn io_err(path: &Path, error: io::Error) -> DataError {
    DataError::Io {
        path: path.to_path_buf(),
        error,
    }
}

fn dataset(
    path: &Path,
    features: Vec<f32>,
    shape: Vec<usize>,
    ids: Vec<u32>,
) -> Result<Dataset, DataError> {
    Dataset::new(
        features,
        shape,
        Labels::Class {
            ids,
            num_classes: CLASSES,
        },
    )
    .map_err(|e| corrupt(path, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::idx::tests::write_idx_set;
    use super::*;

    /// Asserts `r` is a `Corrupt` error for file `file` whose message contains all of `needles`.
    pub(super) fn assert_corrupt<T: std::fmt::Debug>(
        r: Result<T, DataError>,
        file: &str,
        needles: &[&str],
    ) {
        let err = r.expect_err("expected an error");
        let msg = err.to_string();
        match &err {
            DataError::Corrupt { path, .. } => {
                assert_eq!(
                    path.file_name().unwrap().to_string_lossy(),
                    file,
                    "wrong file in {msg}"
                )
            }
            other => panic!("expected Corrupt for {file}, got {other:?}"),
        }
        assert!(msg.contains(file), "message does not name {file}: {msg}");
        for n in needles {
            assert!(msg.contains(n), "message lacks {n:?}: {msg}");
        }
    }

    pub(super) fn assert_missing<T: std::fmt::Debug>(r: Result<T, DataError>, needles: &[&str]) {
        match r.expect_err("expected an error") {
            DataError::Missing(msg) => {
                for n in needles {
                    assert!(msg.contains(n), "message lacks {n:?}: {msg}");
                }
            }
            other => panic!("expected Missing, got {other:?}"),
        }
    }

    pub(super) fn class_ids(d: &Dataset) -> Vec<u32> {
        match &d.labels {
            Labels::Class { ids, num_classes } => {
                assert_eq!(*num_classes, 10);
                ids.clone()
            }
            Labels::Real(_) => panic!("real labels"),
        }
    }

    #[test]
    fn missing_directory_folder_or_file() {
        let tmp = tempfile::tempdir().unwrap();
        let help = ["FEDERICO_DATA_DIR", "--data-dir", "data.dir"];
        // No data directory at all.
        let nowhere = tmp.path().join("nowhere");
        let mut needles = vec!["does not exist", "nowhere", "train-images-idx3-ubyte"];
        needles.extend(help);
        assert_missing(load(RealSource::Mnist, &nowhere), &needles);
        // A data directory without the data set's folder.
        let mut needles = vec!["fashion-mnist", "t10k-labels-idx1-ubyte"];
        needles.extend(help);
        assert_missing(load(RealSource::FashionMnist, tmp.path()), &needles);
        let mut needles = vec![
            "cifar-10/cifar-10-batches-bin",
            "data_batch_1.bin",
            "test_batch.bin",
        ];
        needles.extend(help);
        assert_missing(load(RealSource::Cifar10, tmp.path()), &needles);
        let mut needles = vec!["optdigits.tra", "optdigits.tes"];
        needles.extend(help);
        assert_missing(load(RealSource::Optdigits, tmp.path()), &needles);
        // The folder exists but one file is missing.
        let f = tmp.path().join("mnist");
        write_idx_set(&f, true);
        std::fs::remove_file(f.join("t10k-labels-idx1-ubyte.gz")).unwrap();
        let mut needles = vec!["t10k-labels-idx1-ubyte", "mnist"];
        needles.extend(help);
        assert_missing(load(RealSource::Mnist, tmp.path()), &needles);
    }

    /// Loads the real Fashion-MNIST and CIFAR-10 copies from `$FEDERICO_DATA_DIR`.
    #[test]
    fn real_fashion_mnist_and_cifar10() {
        let needs = ["fashion-mnist", "cifar-10"];
        // As tests/common/mod.rs: FEDERICO_DATA_DIR, else the repository's data/.
        let dir = std::env::var_os("FEDERICO_DATA_DIR")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                let d = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
                d.is_dir().then_some(d)
            });
        let Some(dir) = dir.filter(|d| needs.iter().all(|n| d.join(n).is_dir())) else {
            // As tests/common/mod.rs: one line and a skip, or a failure under `.ci/run`.
            let line = "SKIPPED real_fashion_mnist_and_cifar10: needs fashion-mnist/, cifar-10/ \
                        in the data directory (FEDERICO_DATA_DIR, else data/); see README.md, \
                        Real data";
            assert!(
                std::env::var_os("FEDERICO_REQUIRE_DATA").is_none(),
                "{line}"
            );
            // Past the harness's capture, so the skip shows in every run.
            let _ =
                std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
            return;
        };
        let dir = dir.as_path();
        let f = load(RealSource::FashionMnist, dir).unwrap();
        assert_eq!((f.train.len(), f.test.len()), (60_000, 10_000));
        assert_eq!(f.train.sample_shape, vec![1, 28, 28]);
        assert_eq!(class_ids(&f.train)[..3], [9, 0, 0]);
        assert_eq!(class_ids(&f.test)[..3], [9, 2, 1]);
        assert_eq!(f.train.class_counts(), vec![6000; 10]);
        // Row 14 of the first training image starts 0, 0, 1, 4, 6, 7, 2, 0.
        assert_eq!(f.train.row(0)[14 * 28 + 3], 4.0 / 255.0);
        assert_eq!(f.train.row(0)[14 * 28 + 25], 1.0);
        drop(f);
        let c = load(RealSource::Cifar10, dir).unwrap();
        // The whole set as `federico data download` fetches it, or CI's 20k + 1k subset of it.
        assert!(
            matches!(
                (c.train.len(), c.test.len()),
                (50_000, 10_000) | (20_000, 1_000)
            ),
            "{} + {}",
            c.train.len(),
            c.test.len()
        );
        assert_eq!(c.train.sample_shape, vec![3, 32, 32]);
        assert_eq!(class_ids(&c.train)[..5], [6, 9, 9, 4, 1]);
        assert_eq!(
            class_ids(&c.train)[10_000],
            1,
            "data_batch_2 follows data_batch_1"
        );
        assert_eq!(class_ids(&c.test)[..5], [3, 8, 8, 0, 6]);
        assert_eq!(c.train.row(0)[0], 59.0 / 255.0);
    }
}
