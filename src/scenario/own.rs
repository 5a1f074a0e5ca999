//! A scenario's own data (`[data] source = "csv" | "idx" | "images"`): where its files are,
//! which silo each sample belongs to under natural partitions, reading them once through the
//! loaders every driver shares, and the test set given as files.
//! Owns: [`Silos`], resolving the scenario's paths against its folder, expanding a silo
//! pattern, counting the silos, [`OwnData`] and attaching a separate test set.
//! Must not: parse a file format (`learn::loaders`) or cut a pool between silos
//! (`learn::partition`).

use super::{Scenario, ScenarioError, Source};
use crate::learn::loaders::{self, CsvColumns, Labelled};
use crate::learn::{DataError, Dataset, Federation, Labels};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// `data.silos`: natural partitions, one entry per silo.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Silos {
    /// One entry per silo, in silo order: a CSV file, an image folder, or an IDX
    /// `[images, labels]` pair (or a folder holding one `*images*` and one `*labels*` file).
    Each(Vec<SiloFiles>),
    /// A folder whose entries (sorted by name, hidden ones skipped) are the silos, or a pattern
    /// with `*` and `?` in its last component (`sites/*.csv`), matches sorted by name.
    Pattern(PathBuf),
}

/// One silo's files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SiloFiles {
    /// A CSV file, an image folder, or a folder of IDX images and labels.
    One(PathBuf),
    /// IDX: `[images, labels]`.
    Pair(Vec<PathBuf>),
}

/// Own data read and its classes numbered once for every part.
#[derive(Clone, Debug)]
pub struct OwnData {
    /// The pool a partitioner cuts (`None` under natural partitions).
    pub pool: Option<Dataset>,
    /// Natural partitions: each silo's samples, with its name for messages (file, folder or
    /// silo-column value).
    pub silos: Vec<(String, Dataset)>,
    /// A separate test set (`data.test_files`).
    pub test: Option<Dataset>,
    /// Each silo's own test set (`data.silo_tests`), in silo order; empty without.
    pub silo_tests: Vec<Dataset>,
    /// Class names by class id.
    pub classes: Vec<String>,
}

/// `p` against `base` unless absolute.
fn under(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

impl Scenario {
    /// True when the silos come from the data (`data.silos` or `data.silo_column`).
    pub fn natural(&self) -> bool {
        self.data.silos.is_some() || self.data.silo_column.is_some()
    }

    /// Resolves the own-data paths against `base` (the scenario file's folder), then, under
    /// natural partitions, sets `split.clients` to the number of silos in the data, or refuses a
    /// `split.clients` the file gave (`clients_given`) that differs.
    pub(super) fn settle_own(
        &mut self,
        base: &Path,
        clients_given: bool,
    ) -> Result<(), ScenarioError> {
        let d = &mut self.data;
        for p in d.files.iter_mut().chain(d.test_files.iter_mut()) {
            *p = under(base, p);
        }
        for silos in [&mut d.silos, &mut d.silo_tests] {
            match silos {
                Some(Silos::Pattern(p)) => *p = under(base, p),
                Some(Silos::Each(list)) => {
                    for e in list {
                        match e {
                            SiloFiles::One(p) => *p = under(base, p),
                            SiloFiles::Pair(v) => v.iter_mut().for_each(|p| *p = under(base, p)),
                        }
                    }
                }
                None => {}
            }
        }
        if !self.data.source.is_own() || !self.natural() {
            return Ok(());
        }
        self.validate_own()?;
        let n = match &self.data.silo_column {
            Some(_) => self.silo_values()?.len(),
            None => self.silo_entries()?.len(),
        };
        if self.data.silo_tests.is_some() {
            let tests = entries(self.data.silo_tests.as_ref())?.len();
            if tests != n {
                return Err(ScenarioError::Invalid(format!(
                    "data.silo_tests has {tests} entries; data.silos has {n}: one test entry \
                     per silo, in the same order"
                )));
            }
        }
        let what = if self.data.silo_column.is_some() {
            "values in data.silo_column"
        } else {
            "entries in data.silos"
        };
        if n == 0 {
            return Err(ScenarioError::Invalid(format!(
                "natural partitions: no silos ({what})"
            )));
        }
        if clients_given && self.split.clients != n {
            return Err(ScenarioError::Invalid(format!(
                "split.clients = {}, but the data has {n} silos ({what}); with natural partitions \
                 the silos come from the data: drop split.clients or make it {n}",
                self.split.clients
            )));
        }
        self.split.clients = n;
        Ok(())
    }

    /// Each silo's files under `data.silos`, in silo order.
    fn silo_entries(&self) -> Result<Vec<Vec<PathBuf>>, ScenarioError> {
        entries(self.data.silos.as_ref())
    }

    /// The distinct values of `data.silo_column` over `data.files`, in silo order (numeric when
    /// all are integers, else by name).
    fn silo_values(&self) -> Result<Vec<String>, ScenarioError> {
        let mut values = BTreeSet::new();
        for t in self.read_csv_files(&self.data.files)? {
            values.extend(t.silos.unwrap_or_default());
        }
        Ok(order_silos(values.into_iter().collect()))
    }

    fn read_csv_files(&self, files: &[PathBuf]) -> Result<Vec<loaders::CsvTable>, DataError> {
        files
            .iter()
            .map(|f| {
                loaders::read_csv(
                    f,
                    CsvColumns {
                        label: self.data.label_column.as_ref(),
                        silo: self.data.silo_column.as_ref(),
                        ids_below: None,
                        unlabelled: false,
                    },
                )
            })
            .collect()
    }

    /// One part of own data: CSV files (concatenated), an IDX pair, or an image folder.
    fn read_part(&self, files: &[PathBuf]) -> Result<Vec<Labelled>, ScenarioError> {
        Ok(match self.data.source {
            Source::Csv => self
                .read_csv_files(files)?
                .into_iter()
                .map(|t| t.set)
                .collect(),
            Source::Idx => {
                let (images, labels) = idx_pair(files)?;
                vec![loaders::read_idx_labelled(&images, &labels)?]
            }
            _ => files
                .iter()
                .map(|f| loaders::read_image_folder(f))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Reads the scenario's own files once: the pool or each silo's part, and the test set.
    pub(super) fn load_own(&self) -> Result<OwnData, ScenarioError> {
        let d = &self.data;
        let test = if d.test_files.is_empty() {
            Vec::new()
        } else {
            self.read_part(&d.test_files)?
        };
        // Each silo's own test parts (`data.silo_tests`).
        let silo_tests: Vec<Vec<Labelled>> = entries(d.silo_tests.as_ref())?
            .iter()
            .map(|files| self.read_part(files))
            .collect::<Result<_, _>>()?;
        // (silo name, its parts), or one unnamed entry for the pool.
        let mut groups: Vec<(String, Vec<Labelled>)> = Vec::new();
        if d.silo_column.is_some() {
            let order = self.silo_values()?;
            let mut per: Vec<Vec<Labelled>> = vec![Vec::new(); order.len()];
            for t in self.read_csv_files(&d.files)? {
                let silos = t.silos.unwrap_or_default();
                for (k, name) in order.iter().enumerate() {
                    let rows: Vec<usize> =
                        (0..silos.len()).filter(|&r| &silos[r] == name).collect();
                    if !rows.is_empty() {
                        per[k].push(t.set.rows(&rows));
                    }
                }
            }
            groups = order.into_iter().zip(per).collect();
        } else if d.silos.is_some() {
            for files in self.silo_entries()? {
                let name = files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" + ");
                groups.push((name, self.read_part(&files)?));
            }
        } else {
            groups.push((String::new(), self.read_part(&d.files)?));
        }
        let mut refs: Vec<&Labelled> = groups.iter().flat_map(|(_, p)| p.iter()).collect();
        refs.extend(silo_tests.iter().flatten());
        refs.extend(test.iter());
        let (mut sets, classes) = loaders::unify(&refs, d.classes)?;
        let test = if test.is_empty() {
            None
        } else {
            Some(concat(sets.split_off(sets.len() - test.len())))
        };
        let mut tests_of = sets.split_off(sets.len() - silo_tests.iter().flatten().count());
        let silo_tests: Vec<Dataset> = silo_tests
            .iter()
            .map(|parts| concat(tests_of.drain(..parts.len()).collect()))
            .collect();
        let mut sets = sets.into_iter();
        let mut silos: Vec<(String, Dataset)> = groups
            .iter()
            .map(|(name, parts)| {
                (
                    name.clone(),
                    concat(sets.by_ref().take(parts.len()).collect()),
                )
            })
            .collect();
        let pool = if self.natural() {
            None
        } else {
            silos.pop().map(|(_, d)| d)
        };
        Ok(OwnData {
            pool,
            silos,
            test,
            silo_tests,
            classes,
        })
    }
}

/// Under a separate test set, every silo trains on all its samples (the partitioner's train and
/// test shares together) and is scored on the test set's samples of the classes it trains on.
pub(super) fn attach_test(fed: &mut Federation, test: &Dataset) -> Result<(), ScenarioError> {
    let Labels::Class { ids, .. } = &test.labels else {
        return Err(ScenarioError::Invalid(
            "data.test_files: no class labels".into(),
        ));
    };
    for (i, c) in fed.clients.iter_mut().enumerate() {
        let held: Vec<bool> = c.train.class_counts().iter().map(|&n| n > 0).collect();
        let rows: Vec<usize> = (0..ids.len())
            .filter(|&r| held.get(ids[r] as usize).copied().unwrap_or(false))
            .collect();
        if rows.is_empty() {
            return Err(ScenarioError::Invalid(format!(
                "data.test_files holds no sample of the classes silo {i} trains on"
            )));
        }
        let train = std::mem::replace(&mut c.train, test.subset(&[]));
        let share = std::mem::replace(&mut c.test, test.subset(&rows));
        c.train = concat(vec![train, share]);
    }
    Ok(())
}

/// Under `data.silo_tests`, every silo trains on all its samples (the partitioner's train and
/// test shares together) and is scored on its own test set.
pub(super) fn attach_silo_tests(fed: &mut Federation, tests: &[Dataset]) {
    for (c, test) in fed.clients.iter_mut().zip(tests) {
        let train = std::mem::replace(&mut c.train, test.subset(&[]));
        let share = std::mem::replace(&mut c.test, test.clone());
        c.train = concat(vec![train, share]);
    }
}

/// Each silo's files of a `data.silos`-shaped field, in silo order.
fn entries(silos: Option<&Silos>) -> Result<Vec<Vec<PathBuf>>, ScenarioError> {
    Ok(match silos {
        None => Vec::new(),
        Some(Silos::Each(list)) => list
            .iter()
            .map(|e| match e {
                SiloFiles::One(p) => vec![p.clone()],
                SiloFiles::Pair(v) => v.clone(),
            })
            .collect(),
        Some(Silos::Pattern(p)) => expand(p)?.into_iter().map(|p| vec![p]).collect(),
    })
}

/// The parts' samples one after another (same shape and classes, as `unify` made them).
fn concat(mut parts: Vec<Dataset>) -> Dataset {
    if parts.len() == 1 {
        return parts.pop().expect("one part");
    }
    let mut out = parts.first().expect("at least one part").subset(&[]);
    for p in parts {
        out.features.extend_from_slice(&p.features);
        match (&mut out.labels, p.labels) {
            (Labels::Class { ids, .. }, Labels::Class { ids: more, .. }) => ids.extend(more),
            (Labels::Real(v), Labels::Real(more)) => v.extend(more),
            _ => unreachable!("unify gives every part class labels"),
        }
    }
    out
}

/// Silo values in order: numeric when all are integers, else by name.
fn order_silos(mut v: Vec<String>) -> Vec<String> {
    if v.iter().all(|s| s.parse::<i64>().is_ok()) {
        v.sort_by_key(|s| s.parse::<i64>().expect("checked: an integer"));
    }
    v
}

/// An IDX `[images, labels]` pair, or a folder holding one `*images*` and one `*labels*` file.
fn idx_pair(files: &[PathBuf]) -> Result<(PathBuf, PathBuf), ScenarioError> {
    match files {
        [images, labels] => Ok((images.clone(), labels.clone())),
        [dir] if dir.is_dir() => {
            let find = |what: &str| -> Result<PathBuf, ScenarioError> {
                let found: Vec<PathBuf> = list(dir)?
                    .into_iter()
                    .filter(|p| p.is_file() && name(p).contains(what))
                    .collect();
                match &found[..] {
                    [one] => Ok(one.clone()),
                    _ => Err(DataError::Missing(format!(
                        "{}: an IDX silo folder holds exactly one file whose name contains \
                         {what:?}, found {}",
                        dir.display(),
                        found.len()
                    ))
                    .into()),
                }
            };
            Ok((find("images")?, find("labels")?))
        }
        other => Err(ScenarioError::Invalid(format!(
            "source \"idx\" takes [images, labels] files (or a folder holding both), got {other:?}"
        ))),
    }
}

fn name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A folder's entries, hidden ones skipped, sorted by name.
fn list(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let io = |e| DataError::Io {
        path: dir.to_path_buf(),
        error: e,
    };
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        let p = e.map_err(io)?.path();
        if !name(&p).starts_with('.') {
            v.push(p);
        }
    }
    v.sort();
    Ok(v)
}

/// A silo pattern: a folder's entries, or the matches of `*`/`?` in the last component.
fn expand(pattern: &Path) -> Result<Vec<PathBuf>, ScenarioError> {
    let last = name(pattern);
    if !last.contains(['*', '?']) {
        if !pattern.is_dir() {
            return Err(DataError::Missing(format!(
                "data.silos = {}: no such folder (give a folder of silos, a pattern such as \
                 sites/*.csv, or a list)",
                pattern.display()
            ))
            .into());
        }
        return Ok(list(pattern)?);
    }
    let dir = pattern.parent().unwrap_or(Path::new("."));
    let found: Vec<PathBuf> = list(dir)?
        .into_iter()
        .filter(|p| wildcard(&last, &name(p)))
        .collect();
    if found.is_empty() {
        return Err(DataError::Missing(format!(
            "data.silos = {}: nothing matches",
            pattern.display()
        ))
        .into());
    }
    Ok(found)
}

/// `*` (any run) and `?` (any one character) matching.
fn wildcard(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_as_a_shell_does() {
        assert!(wildcard("*.csv", "site-a.csv"));
        assert!(wildcard("site-?.csv", "site-b.csv"));
        assert!(!wildcard("*.csv", "site-a.csv.bak"));
        assert!(wildcard("*", ""));
        assert!(!wildcard("a*b", "acd"));
    }

    #[test]
    fn silo_values_are_numeric_when_they_can_be() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(order_silos(v(&["10", "9", "2"])), v(&["2", "9", "10"]));
        assert_eq!(order_silos(v(&["b", "a"])), v(&["b", "a"]));
    }
}
