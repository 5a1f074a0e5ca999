//! CSV files of numeric features and a label column: one silo's own data (`federico node`,
//! `predict`) and a scenario's own data (`[data] source = "csv"`), read by one function.
//!
//! Owns: [`read_csv`] (header detection, the label and silo columns by name or position,
//! per-cell error messages naming the file, line and column; or no label column at all, for
//! new rows) and [`load_csv`], its form for a node whose labels are class ids.
//! Must not: number classes across files (`own.rs`) or look for folders.

use super::own::{Column, Labelled};
use super::{corrupt, io_err};
use crate::learn::data::{DataError, Dataset, Labels};
use std::collections::HashMap;
use std::path::Path;

/// Which columns of a CSV file are not features.
#[derive(Clone, Copy, Debug, Default)]
pub struct CsvColumns<'a> {
    /// The label column (default: the last).
    pub label: Option<&'a Column>,
    /// The column naming each row's silo (natural partitions), if any.
    pub silo: Option<&'a Column>,
    /// Labels must be integer class ids below this (a node's `data.classes`), checked per line.
    pub ids_below: Option<usize>,
    /// No label column: every column (but the silo column) is a feature, as in new rows to
    /// predict on. The rows are then all labelled with one empty name.
    pub unlabelled: bool,
}

/// A CSV file read: its samples, and each row's silo when a silo column was asked for.
#[derive(Clone, Debug)]
pub struct CsvTable {
    /// The samples, labelled by the label column's text.
    pub set: Labelled,
    /// Per row, the silo column's text.
    pub silos: Option<Vec<String>>,
    /// The feature columns' names, in order, when the file has a header as wide as its rows.
    pub columns: Option<Vec<String>>,
}

/// Reads `path`: one sample per line, comma-separated; every column other than the label (and
/// silo) column is a numeric feature. A first line that is not all numbers is a header (needed
/// to name columns). Cells may be quoted with `"`. Errors name the file, the line and the
/// column: a missing column, a cell that is not a finite number, a row of another width, a file
/// with no rows.
pub fn read_csv(path: &Path, cols: CsvColumns<'_>) -> Result<CsvTable, DataError> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    let mut features = Vec::new();
    let (mut labels, mut names, mut index) = (Vec::new(), Vec::new(), HashMap::new());
    let mut silos = cols.silo.map(|_| Vec::new());
    let mut header: Option<Vec<String>> = None;
    // (width, label column, silo column), fixed by the first row.
    let mut layout: Option<(usize, Option<usize>, Option<usize>)> = None;
    let mut first = true;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let cells: Vec<&str> = line
            .split(',')
            .map(|c| c.trim().trim_matches('"'))
            .collect();
        let at = |what: String| corrupt(path, format!("line {}: {what}", i + 1));
        if std::mem::take(&mut first) && !cells.iter().all(|c| c.parse::<f64>().is_ok()) {
            header = Some(cells.iter().map(|c| c.to_string()).collect());
            continue;
        }
        let (width, lc, sc) = match layout {
            Some(l) => l,
            None => {
                // The rows set the width; a header only names columns (it may be shorter,
                // as a free-text first line is, unless a column is asked for by name).
                let width = cells.len();
                let find = |c: &Column, what: &str| -> Result<usize, DataError> {
                    match (c, &header) {
                        (Column::Index(k), _) if *k < width => Ok(*k),
                        (Column::Index(k), _) => Err(corrupt(
                            path,
                            format!("{what} {k} but the file has only {width} columns"),
                        )),
                        (Column::Name(n), Some(h)) if h.len() != width => Err(corrupt(
                            path,
                            format!(
                                "{what} {n:?}: the header has {} columns but the rows have {width}",
                                h.len()
                            ),
                        )),
                        (Column::Name(n), Some(h)) => {
                            h.iter().position(|x| x == n).ok_or_else(|| {
                                corrupt(
                                    path,
                                    format!(
                                        "{what} {n:?} is not a column; the header has {}",
                                        h.join(", ")
                                    ),
                                )
                            })
                        }
                        (Column::Name(n), None) => Err(corrupt(
                            path,
                            format!(
                                "{what} {n:?} names a column, but the file has no header row (its first line is all numbers)"
                            ),
                        )),
                    }
                };
                let lc = match (cols.label, cols.unlabelled) {
                    (_, true) => None,
                    (Some(c), false) => Some(find(c, "label_column")?),
                    (None, false) => Some(width - 1),
                };
                let sc = cols.silo.map(|c| find(c, "silo_column")).transpose()?;
                if sc.is_some() && sc == lc {
                    return Err(corrupt(
                        path,
                        "silo_column and label_column are the same column",
                    ));
                }
                let need = 1 + usize::from(lc.is_some()) + usize::from(sc.is_some());
                if width < need {
                    return Err(at(format!(
                        "{width} column(s); need features{}{}",
                        if lc.is_some() { " and a label" } else { "" },
                        if sc.is_some() { " and a silo" } else { "" }
                    )));
                }
                *layout.insert((width, lc, sc))
            }
        };
        if cells.len() != width {
            return Err(at(format!(
                "{} columns where the first row has {width}",
                cells.len()
            )));
        }
        let name_of = |c: usize| match header.as_ref().filter(|h| h.len() == width) {
            Some(h) => format!("column {c} ({:?})", h[c]),
            None => format!("column {c}"),
        };
        if lc.is_none() {
            // Unlabelled rows: one empty name for all.
            if names.is_empty() {
                names.push(String::new());
            }
            labels.push(0);
        }
        for (c, cell) in cells.iter().enumerate() {
            if Some(c) == lc {
                if let Some(classes) = cols.ids_below {
                    let y: u32 = cell.parse().map_err(|_| {
                        at(format!("label {cell:?} ({}) is not a class id", name_of(c)))
                    })?;
                    if y as usize >= classes {
                        return Err(at(format!(
                            "label {y} is out of range 0..={} (data.classes = {classes})",
                            classes.saturating_sub(1)
                        )));
                    }
                }
                if cell.is_empty() {
                    return Err(at(format!("the label ({}) is empty", name_of(c))));
                }
                let next = names.len() as u32;
                let id = *index.entry(cell.to_string()).or_insert_with(|| {
                    names.push(cell.to_string());
                    next
                });
                labels.push(id);
            } else if Some(c) == sc {
                if cell.is_empty() {
                    return Err(at(format!("the silo ({}) is empty", name_of(c))));
                }
                if let Some(s) = silos.as_mut() {
                    s.push(cell.to_string());
                }
            } else {
                let v: f32 = cell
                    .parse()
                    .map_err(|_| at(format!("{}: {cell:?} is not a number", name_of(c))))?;
                if !v.is_finite() {
                    return Err(at(format!("{}: {cell:?} is not finite", name_of(c))));
                }
                features.push(v);
            }
        }
    }
    let Some((width, lc, sc)) = layout else {
        return Err(corrupt(path, "no samples (no data rows)"));
    };
    let numbered = lc.is_some() && names.iter().all(|n| n.parse::<u32>().is_ok());
    let columns = header.filter(|h| h.len() == width).map(|h| {
        h.into_iter()
            .enumerate()
            .filter(|&(c, _)| Some(c) != lc && Some(c) != sc)
            .map(|(_, name)| name)
            .collect()
    });
    Ok(CsvTable {
        set: Labelled {
            features,
            sample_shape: vec![width - usize::from(lc.is_some()) - usize::from(sc.is_some())],
            labels,
            names,
            numbered,
            path: path.to_path_buf(),
        },
        silos,
        columns,
    })
}

/// One silo's own data as CSV: one sample per line, numeric features and an integer class id in
/// `label_column` (a header name or a 0-based position; `None` = the last column), `classes`
/// classes in the federation. A first line that is not numeric is taken as a header. Errors name
/// the file, line and column. The same reader as a scenario's CSV data ([`read_csv`]).
pub fn load_csv(
    path: &Path,
    label_column: Option<usize>,
    classes: usize,
) -> Result<Dataset, DataError> {
    load_csv_column(path, label_column.map(Column::Index).as_ref(), classes)
}

/// [`load_csv`] with the label column given by header name or position.
pub fn load_csv_column(
    path: &Path,
    label_column: Option<&Column>,
    classes: usize,
) -> Result<Dataset, DataError> {
    let table = read_csv(
        path,
        CsvColumns {
            label: label_column,
            silo: None,
            ids_below: Some(classes),
            unlabelled: false,
        },
    )?;
    let set = table.set;
    let map: Vec<u32> = set
        .names
        .iter()
        .map(|n| {
            n.parse()
                .expect("read_csv checked every label is a class id")
        })
        .collect();
    Dataset::new(
        set.features,
        set.sample_shape,
        Labels::Class {
            ids: set.labels.iter().map(|&l| map[l as usize]).collect(),
            num_classes: classes,
        },
    )
    .map_err(|e| corrupt(path, e.to_string()))
}
#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn unlabelled_rows_are_all_features() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("new.csv");
        std::fs::write(&p, "age,bmi\n40,21.5\n\n61,30\n").unwrap();
        let cols = CsvColumns {
            unlabelled: true,
            ..CsvColumns::default()
        };
        let t = read_csv(&p, cols).unwrap();
        assert_eq!(t.set.sample_shape, [2]);
        assert_eq!(t.set.features, [40.0, 21.5, 61.0, 30.0]);
        assert_eq!((t.set.len(), t.set.numbered), (2, false));
        std::fs::write(&p, "age,bmi\n40,x\n").unwrap();
        let e = read_csv(&p, cols).unwrap_err().to_string();
        assert!(
            e.contains("column 1 (\"bmi\"): \"x\" is not a number"),
            "{e}"
        );
    }

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
        // A first line that is not the columns' names is skipped as before.
        std::fs::write(&p, "features...,label\n0.5,1,2\n").unwrap();
        assert_eq!(load_csv(&p, None, 3).unwrap().features, vec![0.5, 1.0]);
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
