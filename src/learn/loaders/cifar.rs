//! The CIFAR-10 binary format: records of one label byte and 3,072 pixel bytes.
//!
//! Owns: finding and ordering the batch files of a CIFAR-10 folder, reading records, and
//! [`load_cifar_files`] for one silo's own batches.
//! Must not: look for the data directory (that is `mod.rs`).

use super::{CLASSES, RealData, RealSource, corrupt, dataset, io_err, missing};
use crate::learn::data::{DataError, Dataset};
use std::path::{Path, PathBuf};

pub(super) const CIFAR_SIDE: usize = 32;
const CIFAR_PIXELS: usize = 3 * CIFAR_SIDE * CIFAR_SIDE;
const CIFAR_RECORD: usize = 1 + CIFAR_PIXELS;

/// Orders `data_batch_<n>.bin` by `n` (then by name, for odd names).
fn batch_key(name: &str) -> (u64, String) {
    let n = name
        .strip_prefix("data_batch_")
        .and_then(|s| s.strip_suffix(".bin"))
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    (n, name.to_string())
}

pub(super) fn load_cifar(folder: &Path) -> Result<RealData, DataError> {
    let source = RealSource::Cifar10;
    let entries = std::fs::read_dir(folder).map_err(|e| io_err(folder, e))?;
    let mut names = Vec::new();
    for e in entries {
        let e = e.map_err(|e| io_err(folder, e))?;
        if e.path().is_file() {
            names.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    let mut train: Vec<String> = names
        .iter()
        .filter(|n| n.starts_with("data_batch_") && n.ends_with(".bin"))
        .cloned()
        .collect();
    train.sort_by_key(|n| batch_key(n));
    if train.is_empty() {
        return Err(missing(
            source,
            folder,
            format!(
                "CIFAR-10 incomplete: {} has no data_batch_*.bin",
                folder.display()
            ),
        ));
    }
    let test = if names.iter().any(|n| n == "test_batch.bin") {
        "test_batch.bin".to_string()
    } else {
        let mut tests: Vec<&String> = names
            .iter()
            .filter(|n| n.starts_with("test_batch") && n.ends_with(".bin"))
            .collect();
        tests.sort();
        match tests.first() {
            Some(t) => (*t).clone(),
            None => {
                return Err(missing(
                    source,
                    folder,
                    format!(
                        "CIFAR-10 incomplete: {} has no test_batch.bin",
                        folder.display()
                    ),
                ));
            }
        }
    };
    let mut features = Vec::new();
    let mut ids = Vec::new();
    for name in &train {
        read_cifar_batch(&folder.join(name), &mut features, &mut ids)?;
    }
    let first = folder.join(&train[0]);
    let train = dataset(&first, features, source.sample_shape().to_vec(), ids)?;
    let (mut features, mut ids) = (Vec::new(), Vec::new());
    let test_path = folder.join(test);
    read_cifar_batch(&test_path, &mut features, &mut ids)?;
    let test = dataset(&test_path, features, source.sample_shape().to_vec(), ids)?;
    Ok(RealData { train, test })
}

/// One silo's own data as CIFAR-10 binary batches (1 label byte + 3072 pixel bytes per record),
/// concatenated in the order given.
pub fn load_cifar_files(batches: &[PathBuf]) -> Result<Dataset, DataError> {
    let first = batches
        .first()
        .ok_or_else(|| DataError::Invalid("no CIFAR-10 batch files given".into()))?;
    let (mut features, mut ids) = (Vec::new(), Vec::new());
    for b in batches {
        read_cifar_batch(b, &mut features, &mut ids)?;
    }
    dataset(
        first,
        features,
        RealSource::Cifar10.sample_shape().to_vec(),
        ids,
    )
}

/// Appends the records of one CIFAR-10 binary batch (1 label byte + 3072 pixel bytes each).
fn read_cifar_batch(
    path: &Path,
    features: &mut Vec<f32>,
    ids: &mut Vec<u32>,
) -> Result<(), DataError> {
    let len = std::fs::metadata(path).map_err(|e| io_err(path, e))?.len();
    if len == 0 || len % CIFAR_RECORD as u64 != 0 {
        return Err(corrupt(
            path,
            format!(
                "{len} bytes is not a positive multiple of the {CIFAR_RECORD}-byte CIFAR-10 record \
                 (1 label byte + {CIFAR_PIXELS} pixel bytes); {} trailing bytes",
                len % CIFAR_RECORD as u64
            ),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    if bytes.len() as u64 != len || bytes.is_empty() {
        return Err(corrupt(
            path,
            format!(
                "file changed while reading ({len} then {} bytes)",
                bytes.len()
            ),
        ));
    }
    let n = bytes.len() / CIFAR_RECORD;
    features.reserve(n * CIFAR_PIXELS);
    ids.reserve(n);
    for (i, rec) in bytes.chunks_exact(CIFAR_RECORD).enumerate() {
        let label = rec[0];
        if usize::from(label) >= CLASSES {
            return Err(corrupt(
                path,
                format!(
                    "label {label} of record {i} is out of range 0..={}",
                    CLASSES - 1
                ),
            ));
        }
        ids.push(u32::from(label));
        features.extend(rec[1..].iter().map(|&b| f32::from(b) / 255.0));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::loaders::load;
    use crate::learn::loaders::tests::{assert_corrupt, assert_missing, class_ids};

    /// A CIFAR-10 record: label byte, then R, G, B planes with pixel value `seed + plane`.
    fn cifar_record(label: u8, seed: u8) -> Vec<u8> {
        let mut r = vec![label];
        for plane in 0..3u8 {
            r.extend(std::iter::repeat_n(seed.wrapping_add(plane * 50), 1024));
        }
        r
    }

    fn write_cifar(folder: &Path, test_name: &str) {
        std::fs::create_dir_all(folder).unwrap();
        let b1: Vec<u8> = [cifar_record(6, 0), cifar_record(9, 1)].concat();
        let b2 = cifar_record(1, 2);
        std::fs::write(folder.join("data_batch_2.bin"), b2).unwrap();
        std::fs::write(folder.join("data_batch_1.bin"), b1).unwrap();
        std::fs::write(folder.join(test_name), cifar_record(3, 3)).unwrap();
    }

    #[test]
    fn cifar_round_trip() {
        for sub in ["cifar-10/cifar-10-batches-bin", "cifar-10-batches-bin"] {
            let tmp = tempfile::tempdir().unwrap();
            write_cifar(&tmp.path().join(sub), "test_batch_first1000.bin");
            let d = load(RealSource::Cifar10, tmp.path()).unwrap();
            assert_eq!(d.train.sample_shape, vec![3, 32, 32]);
            assert_eq!(
                class_ids(&d.train),
                vec![6, 9, 1],
                "batches in number order"
            );
            assert_eq!(class_ids(&d.test), vec![3]);
            let row = d.train.row(1);
            assert_eq!(row[0], 1.0 / 255.0);
            assert_eq!(row[1023], 1.0 / 255.0);
            assert_eq!(row[1024], 51.0 / 255.0);
            assert_eq!(row[3071], 101.0 / 255.0);
            // The folder itself works too.
            let own = load(RealSource::Cifar10, &tmp.path().join(sub)).unwrap();
            assert_eq!(own.train, d.train);
        }
        // test_batch.bin wins over a prefix file.
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("cifar-10-batches-bin");
        write_cifar(&f, "test_batch_first1000.bin");
        std::fs::write(
            f.join("test_batch.bin"),
            [cifar_record(8, 0), cifar_record(0, 0)].concat(),
        )
        .unwrap();
        let d = load(RealSource::Cifar10, tmp.path()).unwrap();
        assert_eq!(class_ids(&d.test), vec![8, 0]);
    }

    #[test]
    fn cifar_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("cifar-10").join("cifar-10-batches-bin");
        write_cifar(&f, "test_batch.bin");
        let mut bad = cifar_record(6, 0);
        bad.pop();
        std::fs::write(f.join("data_batch_2.bin"), bad).unwrap();
        assert_corrupt(
            load(RealSource::Cifar10, tmp.path()),
            "data_batch_2.bin",
            &["3072 bytes", "multiple", "3073"],
        );
        std::fs::write(f.join("data_batch_2.bin"), Vec::<u8>::new()).unwrap();
        assert_corrupt(
            load(RealSource::Cifar10, tmp.path()),
            "data_batch_2.bin",
            &["0 bytes"],
        );
        std::fs::write(
            f.join("data_batch_2.bin"),
            [cifar_record(1, 0), cifar_record(12, 0)].concat(),
        )
        .unwrap();
        assert_corrupt(
            load(RealSource::Cifar10, tmp.path()),
            "data_batch_2.bin",
            &["label 12", "record 1"],
        );
        std::fs::write(f.join("data_batch_2.bin"), cifar_record(1, 0)).unwrap();
        std::fs::remove_file(f.join("test_batch.bin")).unwrap();
        assert_missing(
            load(RealSource::Cifar10, tmp.path()),
            &["test_batch.bin", "FEDERICO_DATA_DIR"],
        );
        std::fs::write(f.join("test_batch.bin"), cifar_record(1, 0)).unwrap();
        std::fs::remove_file(f.join("data_batch_1.bin")).unwrap();
        std::fs::remove_file(f.join("data_batch_2.bin")).unwrap();
        assert_missing(
            load(RealSource::Cifar10, tmp.path()),
            &["data_batch_", "FEDERICO_DATA_DIR"],
        );
    }
}
