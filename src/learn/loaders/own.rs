//! A researcher's own files before their classes are numbered: samples that carry class
//! *names* (CSV cells, IDX label bytes, image sub-folder names), and numbering the classes of
//! several such parts (a pool, its test set, one part per silo) once, the same for all.
//! Owns: [`Labelled`], [`Column`], [`unify`] (and [`unify_named`]) and the numbering rule.
//! Must not: read files (`csv.rs`, `idx.rs`, `images.rs` do) or split samples between silos
//! (`partition`).

use super::corrupt;
use crate::learn::data::{DataError, Dataset, Labels};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Samples read from one file or folder, labelled by class name.
#[derive(Clone, Debug, PartialEq)]
pub struct Labelled {
    /// Row-major features, `len × product(sample_shape)` values.
    pub features: Vec<f32>,
    /// Shape of one sample: `[d]` for CSV, `[channels, height, width]` for images.
    pub sample_shape: Vec<usize>,
    /// Per sample, an index into `names`.
    pub labels: Vec<u32>,
    /// The class names found, in order of first appearance.
    pub names: Vec<String>,
    /// Names are class ids when every part says so (CSV cells and IDX bytes that are all
    /// integers); image folders are numbered by sorted name.
    pub numbered: bool,
    /// The file or folder the samples came from (for messages).
    pub path: PathBuf,
}

impl Labelled {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The samples of the given rows, in that order (names and shape kept).
    pub fn rows(&self, rows: &[usize]) -> Labelled {
        let d: usize = self.sample_shape.iter().product();
        let mut features = Vec::with_capacity(rows.len() * d);
        for &r in rows {
            features.extend_from_slice(&self.features[r * d..(r + 1) * d]);
        }
        Labelled {
            features,
            labels: rows.iter().map(|&r| self.labels[r]).collect(),
            ..self.clone_empty()
        }
    }

    fn clone_empty(&self) -> Labelled {
        Labelled {
            features: Vec::new(),
            sample_shape: self.sample_shape.clone(),
            labels: Vec::new(),
            names: self.names.clone(),
            numbered: self.numbered,
            path: self.path.clone(),
        }
    }
}

/// A CSV column, by its header name or its 0-based position.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Column {
    /// 0-based position.
    Index(usize),
    /// Header name.
    Name(String),
}

impl std::str::FromStr for Column {
    type Err = std::convert::Infallible;

    /// A number is a position, anything else a header name.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().parse::<usize>() {
            Ok(i) => Column::Index(i),
            Err(_) => Column::Name(s.trim().to_string()),
        })
    }
}

impl std::fmt::Display for Column {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Column::Index(i) => write!(f, "{i}"),
            Column::Name(n) => write!(f, "{n:?}"),
        }
    }
}

/// Numbers the classes of `parts` once for all of them and returns one [`Dataset`] per part,
/// with the class names by id.
///
/// The rule: when every part's names are integers (CSV, IDX), a name *is* its class id and the
/// class count is the largest id + 1; otherwise (image folders, CSV with text labels) the
/// distinct names of all parts, sorted, are numbered 0, 1, …. `classes`, when given, is the
/// class count (at least the one found). A part of grey images (one channel) is widened to
/// three channels when another part is RGB; any other difference in sample shape is an error
/// naming both files.
pub fn unify(
    parts: &[&Labelled],
    classes: Option<usize>,
) -> Result<(Vec<Dataset>, Vec<String>), DataError> {
    unify_named(parts, classes, None)
}

/// [`unify`], with the class names in class-id order fixed by `fixed` when given (a node's
/// `class_names`, so that silos holding different classes number them alike): every name found
/// must be listed, and a name's id is its position.
pub fn unify_named(
    parts: &[&Labelled],
    classes: Option<usize>,
    fixed: Option<&[String]>,
) -> Result<(Vec<Dataset>, Vec<String>), DataError> {
    let Some(first) = parts.first() else {
        return Ok((Vec::new(), Vec::new()));
    };
    if let Some(list) = fixed {
        for p in parts {
            if let Some(n) = p.names.iter().find(|n| !list.contains(n)) {
                return Err(corrupt(
                    &p.path,
                    format!("class {n:?} is not in data.class_names ({})", shorten(list)),
                ));
            }
        }
    }
    let numbered = fixed.is_none() && parts.iter().all(|p| p.numbered);
    let names: Vec<String> = if let Some(list) = fixed {
        list.to_vec()
    } else if numbered {
        let mut top = None;
        for p in parts {
            for n in &p.names {
                let id: u32 = n
                    .parse()
                    .map_err(|_| corrupt(&p.path, format!("label {n:?} is not a class id")))?;
                top = top.max(Some(id));
            }
        }
        let found = top.map_or(0, |t| t as usize + 1);
        (0..classes.unwrap_or(found).max(found))
            .map(|i| i.to_string())
            .collect()
    } else {
        let set: BTreeSet<&str> = parts
            .iter()
            .flat_map(|p| p.names.iter().map(String::as_str))
            .collect();
        set.into_iter().map(str::to_string).collect()
    };
    if let Some(c) = classes
        && c < names.len()
    {
        return Err(DataError::Invalid(format!(
            "data.classes = {c}, but the files hold {} classes ({})",
            names.len(),
            shorten(&names)
        )));
    }
    let total = classes.unwrap_or(names.len());
    if total < 2 {
        return Err(corrupt(
            &first.path,
            format!(
                "only one class ({}) in all the files; classification needs at least 2",
                shorten(&names)
            ),
        ));
    }
    // Widen grey to RGB when another part is RGB.
    let shape_of = |p: &Labelled| p.sample_shape.clone();
    let rgb = parts
        .iter()
        .any(|p| p.sample_shape.len() == 3 && p.sample_shape[0] == 3);
    let mut out = Vec::with_capacity(parts.len());
    let mut want: Option<(Vec<usize>, &PathBuf)> = None;
    for p in parts {
        let mut shape = shape_of(p);
        let mut features = p.features.clone();
        if rgb && shape.len() == 3 && shape[0] == 1 {
            tracing::warn!(
                "{}: grey images read as RGB, 3 channels, because another part of the data set \
                 is in colour; convert the colour images to grey if the data set is grey",
                p.path.display()
            );
            let plane = shape[1] * shape[2];
            features = p
                .features
                .chunks(plane)
                .flat_map(|g| g.iter().chain(g).chain(g).copied())
                .collect();
            shape[0] = 3;
        }
        match &want {
            None => want = Some((shape.clone(), &p.path)),
            Some((w, path)) if *w != shape => {
                return Err(corrupt(
                    &p.path,
                    format!(
                        "samples of shape {} where {} has {}; every file must have the same \
                         columns or image size",
                        show_shape(&shape),
                        path.display(),
                        show_shape(w)
                    ),
                ));
            }
            _ => {}
        }
        let map: Vec<u32> = p
            .names
            .iter()
            .map(|n| {
                if numbered {
                    n.parse().expect("checked above: every name is an integer")
                } else {
                    names
                        .iter()
                        .position(|x| x == n)
                        .expect("names holds every part's names") as u32
                }
            })
            .collect();
        let ids = p.labels.iter().map(|&l| map[l as usize]).collect();
        let d = Dataset::new(
            features,
            shape,
            Labels::Class {
                ids,
                num_classes: total,
            },
        )
        .map_err(|e| corrupt(&p.path, e.to_string()))?;
        out.push(d);
    }
    let mut names = names;
    names.extend((names.len()..total).map(|i| i.to_string()));
    Ok((out, names))
}

fn show_shape(s: &[usize]) -> String {
    match s {
        [d] => format!("{d} features"),
        [c, h, w] => format!("{w}×{h} with {c} channel(s)"),
        other => format!("{other:?}"),
    }
}

/// The first few names, for messages.
fn shorten(names: &[String]) -> String {
    let mut s: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
    if names.len() > 8 {
        s.push("…");
    }
    s.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(names: &[&str], labels: &[u32], shape: Vec<usize>, numbered: bool) -> Labelled {
        let d: usize = shape.iter().product();
        Labelled {
            features: (0..labels.len() * d).map(|i| i as f32).collect(),
            sample_shape: shape,
            labels: labels.to_vec(),
            names: names.iter().map(|s| s.to_string()).collect(),
            numbered,
            path: PathBuf::from(format!("{}.x", names.join("-"))),
        }
    }

    fn ids(d: &Dataset) -> Vec<u32> {
        match &d.labels {
            Labels::Class { ids, .. } => ids.clone(),
            Labels::Real(_) => unreachable!(),
        }
    }

    #[test]
    fn integer_names_are_class_ids_and_text_names_are_sorted() {
        let a = part(&["3", "0"], &[0, 1, 0], vec![2], true);
        let b = part(&["1"], &[0], vec![2], true);
        let (sets, names) = unify(&[&a, &b], None).unwrap();
        assert_eq!(names, ["0", "1", "2", "3"]);
        assert_eq!(ids(&sets[0]), [3, 0, 3]);
        assert_eq!(ids(&sets[1]), [1]);
        assert_eq!(sets[0].num_classes(), Some(4));
        let (sets, names) = unify(&[&a, &b], Some(10)).unwrap();
        assert_eq!(names.len(), 10);
        assert_eq!(sets[1].num_classes(), Some(10));
        // Text: sorted over all parts, so a silo without a class still numbers the others alike.
        let c = part(&["dog", "cat"], &[0, 1], vec![1, 2, 2], false);
        let d = part(&["emu", "cat"], &[1, 0], vec![1, 2, 2], false);
        let (sets, names) = unify(&[&c, &d], None).unwrap();
        assert_eq!(names, ["cat", "dog", "emu"]);
        assert_eq!(ids(&sets[0]), [1, 0]);
        assert_eq!(ids(&sets[1]), [0, 2]);
        // Fixed names: a silo's folders numbered by the federation's list.
        let fixed: Vec<String> = ["emu", "dog", "cat"].map(String::from).to_vec();
        let (sets, _) = unify_named(&[&c], None, Some(&fixed)).unwrap();
        assert_eq!(ids(&sets[0]), [1, 2]);
        assert_eq!(sets[0].num_classes(), Some(3));
        let e = unify_named(&[&c], None, Some(&fixed[..2])).unwrap_err();
        assert!(
            e.to_string().contains("\"cat\" is not in data.class_names"),
            "{e}"
        );
    }

    #[test]
    fn grey_widens_to_rgb_and_other_shape_differences_are_errors() {
        let g = part(&["a"], &[0], vec![1, 1, 2], false);
        let c = part(&["b"], &[0], vec![3, 1, 2], false);
        let (sets, _) = unify(&[&g, &c], None).unwrap();
        assert_eq!(sets[0].sample_shape, [3, 1, 2]);
        assert_eq!(sets[0].features, [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]);
        let big = part(&["c"], &[0], vec![3, 2, 2], false);
        let e = unify(&[&c, &big], None).unwrap_err().to_string();
        assert!(
            e.contains("b.x") && e.contains("2×2") && e.contains("2×1"),
            "{e}"
        );
        let e = unify(&[&part(&["0"], &[0], vec![2], true)], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("only one class"), "{e}");
        let e = unify(&[&c, &g], Some(1)).unwrap_err().to_string();
        assert!(e.contains("data.classes = 1"), "{e}");
    }
}
