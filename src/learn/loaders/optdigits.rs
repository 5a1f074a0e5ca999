//! The UCI optdigits format: CSV lines of 64 counts in 0..=16 and a class.
//!
//! Owns: reading `optdigits.tra` / `optdigits.tes`.
//! Must not: look for the data directory (that is `mod.rs`).

use super::{CLASSES, RealSource, corrupt, dataset, io_err};
use crate::learn::data::{DataError, Dataset};
use std::path::Path;

const OPTDIGITS_FEATURES: usize = 64;

/// Reads a UCI optdigits CSV file: per line, 64 counts in 0..=16 then the class 0..=9.
pub(super) fn load_optdigits(path: &Path) -> Result<Dataset, DataError> {
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    let text =
        String::from_utf8(bytes).map_err(|e| corrupt(path, format!("not UTF-8 text: {e}")))?;
    let mut features = Vec::new();
    let mut ids = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != OPTDIGITS_FEATURES + 1 {
            return Err(corrupt(
                path,
                format!(
                    "line {}: expected {} comma-separated integers (64 counts and the class), found {}",
                    ln + 1,
                    OPTDIGITS_FEATURES + 1,
                    fields.len()
                ),
            ));
        }
        for (k, f) in fields.iter().enumerate() {
            let v: u32 = f.parse().map_err(|_| {
                corrupt(
                    path,
                    format!("line {}, field {}: {f:?} is not an integer", ln + 1, k + 1),
                )
            })?;
            if k < OPTDIGITS_FEATURES {
                if v > 16 {
                    return Err(corrupt(
                        path,
                        format!(
                            "line {}, field {}: count {v} is out of range 0..=16",
                            ln + 1,
                            k + 1
                        ),
                    ));
                }
                features.push(v as f32 / 16.0);
            } else {
                if v as usize >= CLASSES {
                    return Err(corrupt(
                        path,
                        format!(
                            "line {}: class {v} is out of range 0..={}",
                            ln + 1,
                            CLASSES - 1
                        ),
                    ));
                }
                ids.push(v);
            }
        }
    }
    if ids.is_empty() {
        return Err(corrupt(path, "no samples"));
    }
    dataset(
        path,
        features,
        RealSource::Optdigits.sample_shape().to_vec(),
        ids,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::loaders::load;
    use crate::learn::loaders::tests::{assert_corrupt, class_ids};

    fn optdigits_line(v: u32, class: u32) -> String {
        let mut f: Vec<String> = (0..64).map(|k| ((k + v) % 17).to_string()).collect();
        f.push(class.to_string());
        f.join(",")
    }

    #[test]
    fn optdigits_round_trip_and_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("optdigits");
        std::fs::create_dir_all(&f).unwrap();
        let tra = format!("{}\n{}\n", optdigits_line(0, 4), optdigits_line(3, 9));
        std::fs::write(f.join("optdigits.tra"), &tra).unwrap();
        std::fs::write(
            f.join("optdigits.tes"),
            format!("{}\r\n\n", optdigits_line(16, 0)),
        )
        .unwrap();
        let d = load(RealSource::Optdigits, tmp.path()).unwrap();
        assert_eq!(d.train.sample_shape, vec![1, 8, 8]);
        assert_eq!(class_ids(&d.train), vec![4, 9]);
        assert_eq!(class_ids(&d.test), vec![0]);
        assert_eq!(d.train.row(1)[0], 3.0 / 16.0);
        assert_eq!(d.train.row(0)[16], 16.0 / 16.0);
        assert_eq!(d.test.row(0)[1], 0.0);
        let own = load(RealSource::Optdigits, &f).unwrap();
        assert_eq!(own.train, d.train);

        let mut short = optdigits_line(0, 4);
        short.truncate(short.rfind(',').unwrap());
        std::fs::write(
            f.join("optdigits.tes"),
            format!("{}\n{short}\n", optdigits_line(0, 1)),
        )
        .unwrap();
        assert_corrupt(
            load(RealSource::Optdigits, tmp.path()),
            "optdigits.tes",
            &["line 2", "expected 65", "found 64"],
        );
        std::fs::write(f.join("optdigits.tes"), optdigits_line(0, 10)).unwrap();
        assert_corrupt(
            load(RealSource::Optdigits, tmp.path()),
            "optdigits.tes",
            &["class 10"],
        );
        std::fs::write(
            f.join("optdigits.tes"),
            optdigits_line(0, 1).replacen("0,", "17,", 1),
        )
        .unwrap();
        assert_corrupt(
            load(RealSource::Optdigits, tmp.path()),
            "optdigits.tes",
            &["17", "0..=16"],
        );
        std::fs::write(
            f.join("optdigits.tes"),
            optdigits_line(0, 1).replacen("0,", "x,", 1),
        )
        .unwrap();
        assert_corrupt(
            load(RealSource::Optdigits, tmp.path()),
            "optdigits.tes",
            &["not an integer"],
        );
        std::fs::write(f.join("optdigits.tes"), "\n").unwrap();
        assert_corrupt(
            load(RealSource::Optdigits, tmp.path()),
            "optdigits.tes",
            &["no samples"],
        );
    }
}
