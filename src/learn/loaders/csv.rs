//! One silo's own data as CSV: numeric features and an integer class id per line.
//!
//! Owns: [`load_csv`], its header detection and its per-cell error messages.
//! Must not: guess the number of classes (the federation says it) or look for folders.

use super::{corrupt, io_err};
use crate::learn::data::{DataError, Dataset, Labels};
use std::path::Path;

/// One silo's own data as CSV: one sample per line, numeric features and an integer class id in
/// `label_column` (0-based; `None` = the last column), `classes` classes in the federation. A
/// first line that is not numeric is taken as a header. Errors name the file, line and column.
pub fn load_csv(
    path: &Path,
    label_column: Option<usize>,
    classes: usize,
) -> Result<Dataset, DataError> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    let (mut features, mut ids) = (Vec::new(), Vec::new());
    let mut width = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let numeric = cells.iter().all(|c| c.parse::<f64>().is_ok());
        if !numeric && i == 0 {
            continue; // header
        }
        let at = |what: String| corrupt(path, format!("line {}: {what}", i + 1));
        if cells.len() < 2 {
            return Err(at(format!(
                "{} column(s); need features and a label",
                cells.len()
            )));
        }
        if *width.get_or_insert(cells.len()) != cells.len() {
            return Err(at(format!(
                "{} columns where the first row has {}",
                cells.len(),
                width.unwrap_or(0)
            )));
        }
        let lc = label_column.unwrap_or(cells.len() - 1);
        if lc >= cells.len() {
            return Err(at(format!(
                "label_column {lc} but only {} columns",
                cells.len()
            )));
        }
        for (c, cell) in cells.iter().enumerate() {
            if c == lc {
                let y: u32 = cell
                    .parse()
                    .map_err(|_| at(format!("label {cell:?} (column {c}) is not a class id")))?;
                if y as usize >= classes {
                    return Err(at(format!(
                        "label {y} is out of range 0..={} (data.classes = {classes})",
                        classes - 1
                    )));
                }
                ids.push(y);
            } else {
                let v: f32 = cell
                    .parse()
                    .map_err(|_| at(format!("column {c}: {cell:?} is not a number")))?;
                if !v.is_finite() {
                    return Err(at(format!("column {c}: {cell:?} is not finite")));
                }
                features.push(v);
            }
        }
    }
    let d = width.ok_or_else(|| corrupt(path, "no samples"))? - 1;
    Dataset::new(
        features,
        vec![d],
        Labels::Class {
            ids,
            num_classes: classes,
        },
    )
    .map_err(|e| corrupt(path, e.to_string()))
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn csv_reads_features_and_labels_and_names_bad_cells() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.csv");
        std::fs::write(&p, "x1,x2,y\n0.5,1,2\n-1,2e-3,0\n").unwrap();
        let d = load_csv(&p, None, 3).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d.features, vec![0.5, 1.0, -1.0, 0.002]);
        assert_eq!(
            d.labels,
            Labels::Class {
                ids: vec![2, 0],
                num_classes: 3
            }
        );
        let q = dir.path().join("b.csv");
        std::fs::write(&q, "2,0.5,1\n0,-1,2e-3\n").unwrap();
        let d = load_csv(&q, Some(0), 3).unwrap();
        assert_eq!(d.features, vec![0.5, 1.0, -1.0, 0.002]);
        assert_eq!(
            d.labels,
            Labels::Class {
                ids: vec![2, 0],
                num_classes: 3
            }
        );
        for (text, needle) in [
            ("1,2,5\n", "line 1: label 5 is out of range 0..=2"),
            (
                "1,2,0\n1,0\n",
                "line 2: 2 columns where the first row has 3",
            ),
            ("1,2,0\n1,x,0\n", "line 2: column 1: \"x\" is not a number"),
            ("1,2,0.5\n", "label \"0.5\""),
            ("", "no samples"),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = load_csv(&p, None, 3).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("a.csv"), "{text:?}: {e}");
        }
    }
}
