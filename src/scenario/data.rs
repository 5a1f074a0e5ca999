//! The `[data]` and `[split]` sections of a scenario, and turning them into a run's data: the
//! data directory, the real data set loaded once, and each run's [`Federation`].
//! Owns: [`DataConfig`], [`SplitConfig`], [`SplitKind`], [`Loaded`],
//! [`CLUSTER4_ODD_SHARE`] and `Scenario::{data_dir, load_real, federation}`: the pool's size,
//! which partitioner cuts it, and whether the features are standardized.
//! Must not: validate the whole file (`validate.rs`), find or read own files (`own.rs`), or
//! implement a loader or a partitioner (`learn::loaders`, `learn::partition`).

use super::own::{OwnData, Silos, attach_silo_tests, attach_test};
use super::{DATA_DIR_ENV, Scenario, ScenarioError, Source};
use crate::learn::loaders::{self, Column, RealSource};
use crate::learn::partition::Assign;
use crate::learn::scale::{self, FeatureScale};
use crate::learn::synthetic::{self, MixtureParams};
use crate::learn::{DataError, Dataset, Federation, partition};
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
/// Share of its odd label each cluster4 type gets (the paper's `cluster4_0.25`, FedCollab spec
/// §7.1): the odd label is 1/7 of a client's data.
pub const CLUSTER4_ODD_SHARE: f64 = 0.25;

/// A scenario's data, loaded once and shared by every run and seed.
#[derive(Clone, Debug)]
pub enum Loaded {
    /// A built-in data set's official training and test parts.
    Builtin(loaders::RealData),
    /// The scenario's own files.
    Own(OwnData),
}

/// `[data]`: the samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// Where samples come from.
    pub source: Source,
    /// Data directory for real data (overridden by `--data-dir` and `FEDERICO_DATA_DIR`).
    pub dir: Option<PathBuf>,
    /// Pool size as a fraction of the training set (built-in data: default 0.1, the paper's;
    /// own files: default all). Prefer `samples`: a fraction depends on the copy at hand.
    pub fraction: Option<f64>,
    /// Pool size in samples, drawn from the training set (exactly what the equivalent
    /// `fraction` drew); an error when the copy at hand holds fewer.
    pub samples: Option<usize>,
    /// Own data: the pool's files, relative to the scenario file's folder (csv: one or more
    /// files; idx: `[images, labels]`; images: `[folder]`).
    pub files: Vec<PathBuf>,
    /// Own data: a separate test set, in the form of `files`; each silo is then scored on its
    /// samples of the classes the silo trains on.
    pub test_files: Vec<PathBuf>,
    /// Own data, natural partitions: one entry per silo, or a folder or pattern of them.
    pub silos: Option<Silos>,
    /// With `silos`: each silo's own test set, in the form of `silos` and in silo order (a
    /// silo whose rotation, sensor or population is its own needs a test set drawn the same
    /// way). Each silo then trains on all its samples and is scored on its own test entry.
    pub silo_tests: Option<Silos>,
    /// CSV: the label column, by header name or 0-based position (default: the last).
    pub label_column: Option<Column>,
    /// CSV, natural partitions: the column naming each row's silo.
    pub silo_column: Option<Column>,
    /// Natural partitions: each silo's group, in silo order (as `simulate` lists the silos),
    /// when you know which silos share a distribution: reports then give FedeRiCo's weight on
    /// the silo's own group (same-group and peer mass). Names or numbers; equal means one group.
    pub silo_groups: Option<Vec<GroupName>>,
    /// Own data: the number of classes (default: as found, see `learn::loaders::unify`).
    pub classes: Option<usize>,
    /// Own data: put every feature on one scale (z-scores with constants fitted on every
    /// silo's training part together, [`crate::learn::scale`]) before training. Default: on for
    /// `"csv"` (columns in their own units), off for `"idx"` and `"images"` (pixels in [0, 1]).
    pub standardize: Option<bool>,
    /// Mixture: input clusters per group.
    pub classes_per_group: usize,
    /// Mixture: feature dimension.
    pub dim: usize,
    /// Synthetic: training samples per client.
    pub train: usize,
    /// Synthetic: test samples per client.
    pub test: usize,
    /// Mixture: distance scale between cluster centres.
    pub separation: f64,
    /// Sine: standard deviation of the noise on y.
    pub noise: f64,
}

/// A silo's group in `data.silo_groups`: a name or a number.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GroupName {
    /// `0`, `1`, …
    Number(i64),
    /// `"urban"`, …
    Name(String),
}

impl DataConfig {
    /// Each silo's group index (in order of first appearance) from `silo_groups` for a
    /// natural split of `names`; an error naming both counts when they differ.
    pub(super) fn groups_of(&self, names: &[String]) -> Result<Option<Vec<usize>>, ScenarioError> {
        let Some(given) = &self.silo_groups else {
            return Ok(None);
        };
        if given.len() != names.len() {
            return Err(ScenarioError::Invalid(format!(
                "data.silo_groups has {} entries; the data has {} silos ({}), one entry each, \
                 in that order",
                given.len(),
                names.len(),
                names.join(", ")
            )));
        }
        let mut seen: Vec<&GroupName> = Vec::new();
        let groups = given
            .iter()
            .map(|g| match seen.iter().position(|s| *s == g) {
                Some(i) => i,
                None => {
                    seen.push(g);
                    seen.len() - 1
                }
            })
            .collect();
        Ok(Some(groups))
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            source: Source::Mixture,
            dir: None,
            fraction: None,
            samples: None,
            files: Vec::new(),
            test_files: Vec::new(),
            silos: None,
            label_column: None,
            silo_column: None,
            silo_groups: None,
            silo_tests: None,
            classes: None,
            standardize: None,
            classes_per_group: 4,
            dim: 40,
            train: 40,
            test: 200,
            separation: 3.0,
            noise: 0.3,
        }
    }
}

/// How samples are divided between silos.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitKind {
    /// Disjoint label groups (spec §7.1); synthetic sources always use their own groups.
    LabelGroups,
    /// Dirichlet over label clusters (Table 4).
    Dirichlet,
    /// Pathological label shards.
    Shards,
    /// Uniformly random.
    Iid,
    /// FedCollab's four-type label shift with quantity skew (FedCollab spec §7.1; 10 classes,
    /// a multiple of 4 clients; `quantity_decay` shrinks the second half's training sets).
    Cluster4,
    /// FedCollab's concept shift on 10 classes: an IID split, each of four client types seeing
    /// the labels through its own permutation (a multiple of 4 clients; `quantity_decay` as for
    /// `cluster4`).
    Concept4,
    /// FedCollab's feature shift: an IID split, each of four client types seeing every image
    /// rotated by its own angle (−25°, 25°, 155°, 205°; images only, a multiple of 4 clients;
    /// `quantity_decay` as for `cluster4`).
    Rotate4,
    /// FedDisco's NIID-2: biased clients of `shards_per_client` whole classes each, then
    /// `uniform_clients` clients holding every class equally (FedDisco spec §5.2).
    BiasedUniform,
    /// Own data as it came: one silo per `data.silos` entry or `data.silo_column` value.
    Natural,
}

/// `[split]`: silos and how data is divided.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SplitConfig {
    /// The partitioner.
    pub kind: SplitKind,
    /// K: number of silos.
    pub clients: usize,
    /// G: groups for label-group splits (intervals for the sine toy).
    pub groups: usize,
    /// Dirichlet concentration.
    pub alpha: f64,
    /// Dirichlet: label clusters; unset, 4 or the number of classes where that is fewer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<usize>,
    /// Shards per client (for `biased_uniform`: whole classes per biased client).
    pub shards_per_client: usize,
    /// `biased_uniform`: clients holding every class equally (the last ones).
    pub uniform_clients: usize,
    /// `label_groups`: silos assigned to groups at random (default) or evenly.
    pub assign: Assign,
    /// Fraction of each client's samples used for training (the rest is its test set).
    pub train_fraction: f64,
    /// Cluster4: the second half of the clients keep `exp(-quantity_decay)` of their training
    /// share (FedCollab spec §7.1: 5.0 for FMNIST; 0 keeps all).
    pub quantity_decay: f64,
}

/// Dirichlet's label clusters where `split.clusters` is unset: 4, or every class in a
/// cluster of its own when there are fewer.
const DEFAULT_CLUSTERS: usize = 4;

impl SplitConfig {
    /// Dirichlet's label clusters for data of `classes` classes: `clusters` as given (a value
    /// above `classes` is the partitioner's error, naming it), else
    /// 4 capped at `classes`.
    pub fn clusters_for(&self, classes: usize) -> usize {
        self.clusters
            .unwrap_or(DEFAULT_CLUSTERS.min(classes.max(1)))
    }
}

impl Default for SplitConfig {
    fn default() -> Self {
        Self {
            kind: SplitKind::LabelGroups,
            clients: 8,
            groups: 2,
            alpha: 0.4,
            clusters: None,
            shards_per_client: 2,
            uniform_clients: 1,
            assign: Assign::Random,
            train_fraction: 0.8,
            quantity_decay: 0.0,
        }
    }
}

impl Loaded {
    /// The class names by class id where the labels had names (own CSV files with text
    /// labels, image folders; classes that `data.classes` adds beyond them are named by their
    /// ids); `None` where the labels are the class ids.
    pub fn class_names(&self) -> Option<&[String]> {
        match self {
            Loaded::Own(own) => {
                let ids = own
                    .classes
                    .iter()
                    .enumerate()
                    .all(|(i, n)| *n == i.to_string());
                (!ids).then_some(own.classes.as_slice())
            }
            Loaded::Builtin(_) => None,
        }
    }
}

impl Scenario {
    /// The data directory: `--data-dir`, else `FEDERICO_DATA_DIR`, else `data.dir`, else
    /// `data/` in the working directory when it exists (where `federico data download` puts
    /// the data sets).
    pub fn data_dir(&self, cli: Option<&Path>) -> Option<PathBuf> {
        cli.map(Path::to_path_buf)
            .or_else(|| std::env::var_os(DATA_DIR_ENV).map(PathBuf::from))
            .or_else(|| self.data.dir.clone())
            .or_else(|| Some(PathBuf::from(super::DEFAULT_DATA_DIR)).filter(|d| d.is_dir()))
    }

    /// Loads the data once for every run: a built-in data set from the data directory, or the
    /// scenario's own files (synthetic sources return `None`).
    pub fn load_real(&self, data_dir: Option<&Path>) -> Result<Option<Loaded>, ScenarioError> {
        let source = match self.data.source {
            Source::Mixture | Source::Sine => return Ok(None),
            Source::Csv | Source::Idx | Source::Images => {
                return Ok(Some(Loaded::Own(self.load_own()?)));
            }
            Source::Mnist => RealSource::Mnist,
            Source::FashionMnist => RealSource::FashionMnist,
            Source::Cifar10 => RealSource::Cifar10,
            Source::Optdigits => RealSource::Optdigits,
        };
        let dir = data_dir.ok_or_else(|| {
            DataError::Missing(format!(
                "source \"{}\" needs real data: pass --data-dir DIR, set {DATA_DIR_ENV}, or set data.dir in the scenario \
                 (DIR holds mnist/, fashion-mnist/, cifar-10/cifar-10-batches-bin/, optdigits/; see docs/data.md), \
                 or run `federico data download {}`, which puts it in data/",
                self.data.source.name(),
                source.download_name()
            ))
        })?;
        Ok(Some(Loaded::Builtin(loaders::load(source, dir)?)))
    }

    /// The training pool a partitioner cuts: `data.samples` of `train`, else `data.fraction`
    /// (default 0.1 for built-in sets, all of own files), drawn from the run's data stream.
    fn pool(&self, train: &Dataset, rng: &mut StdRng) -> Result<Dataset, ScenarioError> {
        let d = &self.data;
        let default = if d.source.is_own() { 1.0 } else { 0.1 };
        Ok(match (d.samples, d.fraction.unwrap_or(default)) {
            (Some(n), _) => partition::subsample_count(train, n, rng)
                .map_err(|e| ScenarioError::Invalid(format!("data.{e}")))?,
            (None, f) if f < 1.0 => partition::subsample(train, f, rng)?,
            (None, _) => train.clone(),
        })
    }

    /// Cuts `pool` between silos with `split.kind`'s partitioner.
    fn split_pool(&self, pool: &Dataset, rng: &mut StdRng) -> Result<Federation, ScenarioError> {
        let sp = &self.split;
        Ok(match sp.kind {
            SplitKind::LabelGroups => partition::label_groups_assigned(
                pool,
                sp.clients,
                sp.groups,
                sp.assign,
                sp.train_fraction,
                rng,
            )?,
            SplitKind::Dirichlet => partition::dirichlet(
                pool,
                sp.clients,
                sp.clusters_for(pool.num_classes().unwrap_or(0)),
                sp.alpha,
                sp.train_fraction,
                rng,
            )?,
            SplitKind::Shards => partition::shards(
                pool,
                sp.clients,
                sp.shards_per_client,
                sp.train_fraction,
                rng,
            )?,
            SplitKind::Iid => partition::iid(pool, sp.clients, sp.train_fraction, rng)?,
            SplitKind::Cluster4 => partition::cluster4(
                pool,
                sp.clients,
                CLUSTER4_ODD_SHARE,
                sp.train_fraction,
                sp.quantity_decay,
                rng,
            )?,
            SplitKind::Concept4 => {
                partition::concept4(pool, sp.clients, sp.train_fraction, sp.quantity_decay, rng)?
            }
            SplitKind::Rotate4 => {
                partition::rotate4(pool, sp.clients, sp.train_fraction, sp.quantity_decay, rng)?
            }
            SplitKind::BiasedUniform => partition::biased_uniform(
                pool,
                sp.clients,
                sp.uniform_clients,
                sp.shards_per_client,
                sp.train_fraction,
                rng,
            )?,
            SplitKind::Natural => {
                return Err(ScenarioError::Invalid(
                    "split.kind \"natural\" needs own data with data.silos or data.silo_column"
                        .into(),
                ));
            }
        })
    }

    /// Whether features are standardized (`data.standardize`, else the source's default: on
    /// for CSV only).
    pub fn standardizes(&self) -> bool {
        self.data
            .standardize
            .unwrap_or(self.data.source == Source::Csv)
    }

    /// The federation of one run: generated (synthetic) or subsampled and split (real), from the
    /// run's data stream; standardized where [`Self::standardizes`].
    pub fn federation(
        &self,
        real: Option<&Loaded>,
        rng: &mut StdRng,
    ) -> Result<Federation, ScenarioError> {
        Ok(self.federation_scaled(real, rng)?.0)
    }

    /// [`Self::federation`] and the [`FeatureScale`] applied to it, if any.
    pub fn federation_scaled(
        &self,
        real: Option<&Loaded>,
        rng: &mut StdRng,
    ) -> Result<(Federation, Option<FeatureScale>), ScenarioError> {
        let d = &self.data;
        let sp = &self.split;
        let mut fed = match (d.source, real) {
            (Source::Mixture, _) => synthetic::label_group_mixture(
                &MixtureParams {
                    clients: sp.clients,
                    groups: sp.groups,
                    classes_per_group: d.classes_per_group,
                    dim: d.dim,
                    train: d.train,
                    test: d.test,
                    separation: d.separation,
                },
                rng,
            )?,
            (Source::Sine, _) => {
                synthetic::sine(sp.clients, sp.groups, d.train, d.test, d.noise, rng)?
            }
            (_, None) => return Err(ScenarioError::Invalid("real data was not loaded".into())),
            (_, Some(Loaded::Builtin(real))) => {
                let pool = self.pool(&real.train, rng)?;
                self.split_pool(&pool, rng)?
            }
            (_, Some(Loaded::Own(own))) => {
                let mut fed = match &own.pool {
                    Some(train) => {
                        let pool = self.pool(train, rng)?;
                        self.split_pool(&pool, rng)?
                    }
                    None => {
                        let (names, sets): (Vec<String>, Vec<Dataset>) =
                            own.silos.iter().cloned().unzip();
                        let mut fed = partition::natural(&sets, &names, sp.train_fraction, rng)?;
                        if let Some(groups) = self.data.groups_of(&names)? {
                            for (c, g) in fed.clients.iter_mut().zip(groups) {
                                c.group = Some(g);
                            }
                        }
                        fed
                    }
                };
                if let Some(test) = &own.test {
                    attach_test(&mut fed, test)?;
                }
                if !own.silo_tests.is_empty() {
                    attach_silo_tests(&mut fed, &own.silo_tests);
                }
                fed
            }
        };
        let scale = if self.standardizes() {
            scale::standardize(&mut fed)
        } else {
            None
        };
        Ok((fed, scale))
    }
}
