//! Scenario files: what `federico simulate` runs.
//!
//! Owns: the TOML schema (data, split, model, training, FedeRiCo hyperparameters, algorithms,
//! rounds, seeds), its validation, and turning it into concrete objects (a [`Federation`], a
//! [`ModelSpec`]). Unknown fields and invalid values fail at load with a message naming the field
//! and the allowed values.
//! Must not: run anything.

use crate::coord::fedcollab::FedCollabConfig;
use crate::coord::hcct::HcctConfig;
use crate::core::FedericoConfig;
#[cfg(test)]
use crate::core::MStep;
use crate::faults::{FaultsConfig, Schedule};
use crate::learn::loaders::{self, RealSource};
use crate::learn::synthetic::{self, MixtureParams};
use crate::learn::{DataError, Federation, ModelSpec, partition};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Environment variable naming the data directory (after `--data-dir`, before `data.dir`).
pub const DATA_DIR_ENV: &str = "FEDERICO_DATA_DIR";

/// Errors loading or validating a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The scenario file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown field, or a value of the wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The scenario file.
        path: PathBuf,
        /// The parser's message (names the field, the line and the allowed values).
        message: String,
    },
    /// A value outside its allowed range.
    #[error("invalid scenario: {0}")]
    Invalid(String),
    /// The data could not be loaded or split.
    #[error(transparent)]
    Data(#[from] DataError),
}

/// Share of its odd label each cluster4 type gets (the paper's `cluster4_0.25`, FedCollab spec
/// §7.1): the odd label is 1/7 of a client's data.
pub const CLUSTER4_ODD_SHARE: f64 = 0.25;

/// An algorithm `simulate` can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Each silo trains alone (spec §8.3).
    Local,
    /// One global model, n_i-weighted averaging after one local epoch per round.
    Fedavg,
    /// FedAvg, then one epoch of local fine-tuning before evaluation.
    FedavgPlus,
    /// FedeRiCo (Algorithm 1).
    Federico,
    /// FedCollab: pairwise discriminator distances, coalitions from Algorithm 2, FedAvg inside
    /// each coalition (`../shared/specs/fedcollab.md`).
    Fedcollab,
    /// HCCT: per-round hierarchical merging of silos into groups (`[hcct]`).
    Hcct,
    /// FedDisco: FedAvg with discrepancy-aware aggregation weights (`[feddisco]`).
    Feddisco,
    /// FedSaC: personalised graphs balancing similarity and complementarity (`[fedsac]`).
    Fedsac,
}

impl Algorithm {
    /// The name used in files and tables.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Local => "local",
            Algorithm::Fedavg => "fedavg",
            Algorithm::FedavgPlus => "fedavg_plus",
            Algorithm::Federico => "federico",
            Algorithm::Fedcollab => "fedcollab",
            Algorithm::Hcct => "hcct",
            Algorithm::Feddisco => "feddisco",
            Algorithm::Fedsac => "fedsac",
        }
    }
}

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
}

/// `[data]`: the samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// Where samples come from.
    pub source: Source,
    /// Data directory for real data (overridden by `--data-dir` and `FEDERICO_DATA_DIR`).
    pub dir: Option<PathBuf>,
    /// Real data: fraction of the official training set used as the pool (paper: 0.1).
    pub fraction: f64,
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

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            source: Source::Mixture,
            dir: None,
            fraction: 0.1,
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
    /// Dirichlet: label clusters.
    pub clusters: usize,
    /// Shards per client (for `biased_uniform`: whole classes per biased client).
    pub shards_per_client: usize,
    /// `biased_uniform`: clients holding every class equally (the last ones).
    pub uniform_clients: usize,
    /// Fraction of each client's samples used for training (the rest is its test set).
    pub train_fraction: f64,
    /// Cluster4: the second half of the clients keep `exp(-quantity_decay)` of their training
    /// share (FedCollab spec §7.1: 5.0 for FMNIST; 0 keeps all).
    pub quantity_decay: f64,
}

impl Default for SplitConfig {
    fn default() -> Self {
        Self {
            kind: SplitKind::LabelGroups,
            clients: 8,
            groups: 2,
            alpha: 0.4,
            clusters: 4,
            shards_per_client: 2,
            uniform_clients: 1,
            train_fraction: 0.8,
            quantity_decay: 0.0,
        }
    }
}

/// Architecture family; sizes of inputs and outputs come from the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// Linear regression (the sine toy).
    Linear,
    /// Softmax regression.
    Softmax,
    /// Multi-layer perceptron.
    Mlp,
    /// Small CNN.
    Cnn,
}

/// `[model]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Architecture family.
    pub kind: ModelKind,
    /// MLP hidden widths.
    pub hidden: Vec<usize>,
    /// CNN conv channels per layer.
    pub conv: Vec<usize>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            kind: ModelKind::Softmax,
            hidden: vec![200],
            conv: vec![32, 64],
        }
    }
}

impl ModelConfig {
    /// The architecture for data whose samples have `sample_shape` and `classes` classes
    /// (`None` for regression).
    pub fn spec(
        &self,
        sample_shape: &[usize],
        classes: Option<usize>,
    ) -> Result<ModelSpec, ScenarioError> {
        let inputs: usize = sample_shape.iter().product();
        let m = self;
        let need_classes = || {
            classes.ok_or_else(|| {
                ScenarioError::Invalid(format!(
                    "model.kind {:?} needs a classification task",
                    m.kind
                ))
            })
        };
        Ok(match m.kind {
            ModelKind::Linear => ModelSpec::Linear { inputs, outputs: 1 },
            ModelKind::Softmax => ModelSpec::Softmax {
                inputs,
                classes: need_classes()?,
            },
            ModelKind::Mlp => ModelSpec::Mlp {
                inputs,
                hidden: m.hidden.clone(),
                classes: need_classes()?,
            },
            ModelKind::Cnn => {
                let [channels, height, width] = sample_shape else {
                    return Err(ScenarioError::Invalid(format!(
                        "model.kind \"cnn\" needs image samples [channels, height, width], got {sample_shape:?}"
                    )));
                };
                let mut side = (*height).min(*width);
                for _ in &m.conv {
                    if side < 4 {
                        break;
                    }
                    side = (side - 2) / 2;
                }
                check(
                    side >= 1 && (*height).min(*width) >= 4 * m.conv.len(),
                    || {
                        format!(
                            "model.conv has {} layers, too many for {height}x{width} images",
                            m.conv.len()
                        )
                    },
                )?;
                ModelSpec::Cnn {
                    channels: *channels,
                    height: *height,
                    width: *width,
                    conv: m.conv.clone(),
                    classes: need_classes()?,
                }
            }
        })
    }
}

/// `[train]`: optimisation shared by every algorithm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Adam learning rate (paper: 0.01).
    pub lr: f64,
    /// Mini-batch size for local epochs and for chunking full passes (paper: 50).
    pub batch_size: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            lr: 0.01,
            batch_size: 50,
        }
    }
}

/// `[feddisco]`: FedDisco's weights (FedDisco spec §2) and its local training recipe (the
/// official code's, spec §5.1 and A9: SGD with momentum, re-created every round).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeddiscoConfig {
    /// `a`: discrepancy penalty (spec §2.3: 0.5). `a = b = 0` is FedAvg on the same recipe.
    pub a: f64,
    /// `b`: constant score pulling weights towards uniform (spec §2.3: 0.1).
    pub b: f64,
    /// Discrepancy measure (spec §2.1: KL).
    pub metric: crate::coord::feddisco::Metric,
    /// Normalise discrepancies over each round's participants (spec A2: always).
    pub normalise: bool,
    /// Local epochs E per round (spec §5.1: 10), each of `⌊N_k / batch_size⌋` steps.
    pub local_epochs: usize,
    /// SGD learning rate (spec §5.1: 0.01).
    pub lr: f64,
    /// SGD momentum (spec A9: 0.9).
    pub momentum: f64,
    /// L2 weight decay (spec A9: 1e-5).
    pub weight_decay: f64,
    /// Clients sampled per round, uniformly without replacement (0 = all; spec §5.2 partial
    /// participation uses 10).
    pub clients_per_round: usize,
}

impl Default for FeddiscoConfig {
    fn default() -> Self {
        Self {
            a: crate::coord::feddisco::DEFAULT_A,
            b: crate::coord::feddisco::DEFAULT_B,
            metric: crate::coord::feddisco::Metric::Kl,
            normalise: true,
            local_epochs: 10,
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 1e-5,
            clients_per_round: 0,
        }
    }
}

impl FeddiscoConfig {
    /// The coordinator's weighting rule.
    pub fn params(&self) -> crate::coord::feddisco::Params {
        crate::coord::feddisco::Params {
            a: self.a,
            b: self.b,
            normalise: self.normalise,
        }
    }

    /// Checks every field; the error names the field (without the section), the allowed
    /// range and the value.
    pub fn validate(&self, clients: usize) -> Result<(), String> {
        for (name, v) in [("a", self.a), ("b", self.b)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be finite and >= 0, got {v}"));
            }
        }
        if self.local_epochs == 0 {
            return Err("local_epochs must be at least 1, got 0".into());
        }
        check_sgd(self.lr, self.momentum, self.weight_decay)?;
        if self.clients_per_round > clients {
            return Err(format!(
                "clients_per_round must be in [0, split.clients = {clients}] (0 = all), got {}",
                self.clients_per_round
            ));
        }
        Ok(())
    }
}

/// `[fedsac]`: FedSaC's graph (FedSaC spec §2–§4, paper values where the paper gives them,
/// §7.5) and its local training recipe (spec §4: SGD with momentum, re-created every round).
/// `alpha = 0` is pFedGraph with λ = 1/β (spec §3; its scripts' λ = 0.8 is `beta = 1.25`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FedsacConfig {
    /// α: complementarity weight (paper: 0.9; 0.5 for pathological splits).
    pub alpha: f64,
    /// β: similarity weight (paper: 1.4; 1.6 for pathological splits).
    pub beta: f64,
    /// α is 0 once `t / rounds` exceeds this (paper B.1: 0.7; ≥ 1 keeps α on).
    pub alpha_cutoff: f64,
    /// k: dimension of each silo's feature subspace (paper: 3).
    pub k: usize,
    /// Principal angles between subspaces (spec §7.2: `"standard"`, or the code's
    /// `"greedy_signed"`).
    pub principal_angles: crate::coord::fedsac::PrincipalAngles,
    /// λ: weight of the local cosine regulariser (paper: 0.01).
    pub lambda: f64,
    /// Sign of the regulariser (spec §7.4: the paper's `"attract"`, or the code's `"repel"`).
    pub reg_sign: crate::coord::fedsac::RegSign,
    /// Mini-batch SGD steps per round, the batch order recycled (paper: 200 on CIFAR-10).
    pub local_steps: usize,
    /// SGD learning rate (paper: 0.01).
    pub lr: f64,
    /// SGD momentum (code: 0.9).
    pub momentum: f64,
    /// L2 weight decay (code: 1e-5).
    pub weight_decay: f64,
    /// Clients per round, uniformly sampled when fewer than the silos (spec §4, §7.16: 10;
    /// 0 = all).
    pub cohort_size: usize,
    /// Training samples (a seeded random subset) whose features give the subspace (spec §7.10:
    /// 1000).
    pub feature_samples: usize,
    /// Which model a silo is scored with (spec §7.12).
    pub score: FedsacScore,
}

/// Which of a FedSaC silo's models is scored (FedSaC spec §4 step 5, §7.12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FedsacScore {
    /// The personalised aggregate θ̃^i it holds after the round (the spec's final-round metric).
    #[default]
    Aggregated,
    /// The model right after its local training, before aggregation (the official code's
    /// second per-round evaluation, which its reported best-validation numbers can pick).
    Trained,
}

impl Default for FedsacConfig {
    fn default() -> Self {
        use crate::coord::fedsac as f;
        Self {
            alpha: f::DEFAULT_ALPHA,
            beta: f::DEFAULT_BETA,
            alpha_cutoff: f::DEFAULT_ALPHA_CUTOFF,
            k: f::DEFAULT_K,
            principal_angles: f::PrincipalAngles::Standard,
            lambda: f::DEFAULT_LAMBDA,
            reg_sign: f::RegSign::Attract,
            local_steps: 200,
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 1e-5,
            cohort_size: 10,
            feature_samples: 1000,
            score: FedsacScore::Aggregated,
        }
    }
}

impl FedsacConfig {
    /// Checks every field; the error names the field (without the section), the allowed
    /// range and the value.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("alpha", self.alpha),
            ("beta", self.beta),
            ("alpha_cutoff", self.alpha_cutoff),
            ("lambda", self.lambda),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be finite and >= 0, got {v}"));
            }
        }
        if self.k == 0 {
            return Err("k must be at least 1, got 0".into());
        }
        if self.local_steps == 0 {
            return Err("local_steps must be at least 1, got 0".into());
        }
        if self.feature_samples <= self.k {
            return Err(format!(
                "feature_samples must be greater than k = {}, got {}",
                self.k, self.feature_samples
            ));
        }
        check_sgd(self.lr, self.momentum, self.weight_decay)
    }
}

/// Checks an SGD recipe; the error names the field.
fn check_sgd(lr: f64, momentum: f64, weight_decay: f64) -> Result<(), String> {
    if !(lr > 0.0 && lr.is_finite()) {
        return Err(format!("lr must be positive, got {lr}"));
    }
    if !(0.0..1.0).contains(&momentum) {
        return Err(format!("momentum must be in [0, 1), got {momentum}"));
    }
    if !(weight_decay >= 0.0 && weight_decay.is_finite()) {
        return Err(format!(
            "weight_decay must be finite and >= 0, got {weight_decay}"
        ));
    }
    Ok(())
}

/// A whole scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// Name used in reports (default: the file stem).
    pub name: String,
    /// One line saying what the scenario shows.
    pub description: String,
    /// Run seeds; the table reports mean ± std over them.
    pub seeds: Vec<u64>,
    /// Rounds per run.
    pub rounds: usize,
    /// Evaluate every this many rounds (the last round is always evaluated).
    pub eval_every: usize,
    /// Worker threads for training silos in parallel (0 = all cores).
    pub threads: usize,
    /// Algorithms to compare, on identical splits and initial weights.
    pub algorithms: Vec<Algorithm>,
    /// `[data]`.
    pub data: DataConfig,
    /// `[split]`.
    pub split: SplitConfig,
    /// `[model]`.
    pub model: ModelConfig,
    /// `[train]`.
    pub train: TrainConfig,
    /// `[federico]`.
    pub federico: FedericoConfig,
    /// `[fedcollab]`.
    pub fedcollab: FedCollabConfig,
    /// `[hcct]`.
    pub hcct: HcctConfig,
    /// `[feddisco]`.
    pub feddisco: FeddiscoConfig,
    /// `[fedsac]`.
    pub fedsac: FedsacConfig,
    /// `[faults]`: what goes wrong and when (FedeRiCo runs only; the other algorithms run
    /// fault-free beside it).
    pub faults: FaultsConfig,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            name: String::new(),
            description: String::new(),
            seeds: vec![1],
            rounds: 100,
            eval_every: 1,
            threads: 0,
            algorithms: vec![
                Algorithm::Local,
                Algorithm::Fedavg,
                Algorithm::FedavgPlus,
                Algorithm::Federico,
            ],
            data: DataConfig::default(),
            split: SplitConfig::default(),
            model: ModelConfig::default(),
            train: TrainConfig::default(),
            federico: FedericoConfig::default(),
            fedcollab: FedCollabConfig::default(),
            hcct: HcctConfig::default(),
            feddisco: FeddiscoConfig::default(),
            fedsac: FedsacConfig::default(),
            faults: FaultsConfig::default(),
        }
    }
}

fn check(ok: bool, msg: impl FnOnce() -> String) -> Result<(), ScenarioError> {
    if ok {
        Ok(())
    } else {
        Err(ScenarioError::Invalid(msg()))
    }
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        Self::load_with(path, &[])
    }

    /// Reads a scenario file with `--set` overrides (see [`Self::parse_with`]).
    pub fn load_with(path: &Path, overrides: &[String]) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut s = Self::parse_with(&text, overrides).map_err(|e| match e {
            ScenarioError::Parse { message, .. } => ScenarioError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })?;
        if s.name.is_empty() {
            s.name = path
                .file_stem()
                .map_or("scenario".into(), |n| n.to_string_lossy().into_owned());
        }
        Ok(s)
    }

    /// Parses and validates scenario text.
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        Self::parse_with(text, &[])
    }

    /// Parses scenario text with `key=value` overrides applied first (`--set`): `key` is a dotted
    /// path such as `federico.loss_scale`, `value` a TOML value (`10`, `"sum"`, `[1, 2]`); a bare
    /// word that is not valid TOML is taken as a string. The result is validated as a whole.
    pub fn parse_with(text: &str, overrides: &[String]) -> Result<Self, ScenarioError> {
        let parse_err = |message: String| ScenarioError::Parse {
            path: PathBuf::from("<scenario>"),
            message,
        };
        let mut doc: toml::Table = toml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        for o in overrides {
            let (key, value) = o.split_once('=').ok_or_else(|| {
                ScenarioError::Invalid(format!("--set {o:?}: expected KEY=VALUE"))
            })?;
            let value: toml::Value =
                toml::from_str::<toml::Table>(&format!("v = {}", value.trim()))
                    .ok()
                    .and_then(|mut t| t.remove("v"))
                    .unwrap_or_else(|| toml::Value::String(value.trim().to_string()));
            let mut path: Vec<&str> = key.trim().split('.').collect();
            let last = path
                .pop()
                .filter(|k| !k.is_empty())
                .ok_or_else(|| ScenarioError::Invalid(format!("--set {o:?}: empty key")))?;
            let mut table = &mut doc;
            for part in path {
                table = table
                    .entry(part)
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                    .as_table_mut()
                    .ok_or_else(|| {
                        ScenarioError::Invalid(format!("--set {o:?}: {part} is not a table"))
                    })?;
            }
            table.insert(last.to_string(), value);
        }
        let s: Scenario = doc
            .try_into()
            .map_err(|e: toml::de::Error| parse_err(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// Checks every value; errors name the field, the allowed range and the value.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        check(!self.seeds.is_empty(), || {
            "seeds must list at least one seed".into()
        })?;
        check(self.rounds >= 1, || {
            format!("rounds must be at least 1, got {}", self.rounds)
        })?;
        check(self.eval_every >= 1, || {
            format!("eval_every must be at least 1, got {}", self.eval_every)
        })?;
        check(!self.algorithms.is_empty(), || {
            "algorithms must name at least one of \"local\", \"fedavg\", \"fedavg_plus\", \"federico\", \"fedcollab\", \"hcct\", \"feddisco\", \"fedsac\"".into()
        })?;
        let mut algs = self.algorithms.clone();
        algs.sort();
        algs.dedup();
        check(algs.len() == self.algorithms.len(), || {
            "algorithms lists an algorithm twice".into()
        })?;
        let d = &self.data;
        let sp = &self.split;
        check(sp.clients >= 1, || {
            format!("split.clients must be at least 1, got {}", sp.clients)
        })?;
        check(sp.groups >= 1 && sp.groups <= sp.clients, || {
            format!(
                "split.groups must be in [1, split.clients = {}], got {}",
                sp.clients, sp.groups
            )
        })?;
        check(sp.train_fraction > 0.0 && sp.train_fraction < 1.0, || {
            format!(
                "split.train_fraction must be in (0, 1), got {}",
                sp.train_fraction
            )
        })?;
        check(sp.alpha > 0.0 && sp.alpha.is_finite(), || {
            format!("split.alpha must be positive, got {}", sp.alpha)
        })?;
        check(sp.clusters >= 1, || {
            format!("split.clusters must be at least 1, got {}", sp.clusters)
        })?;
        check(sp.shards_per_client >= 1, || {
            format!(
                "split.shards_per_client must be at least 1, got {}",
                sp.shards_per_client
            )
        })?;
        if matches!(
            sp.kind,
            SplitKind::Cluster4 | SplitKind::Concept4 | SplitKind::Rotate4
        ) {
            check(sp.clients % 4 == 0, || {
                format!(
                    "split.clients must be a multiple of 4 for split.kind \"{}\" (four types), got {}",
                    match sp.kind {
                        SplitKind::Cluster4 => "cluster4",
                        SplitKind::Concept4 => "concept4",
                        _ => "rotate4",
                    },
                    sp.clients
                )
            })?;
        }
        check(
            sp.quantity_decay.is_finite() && sp.quantity_decay >= 0.0,
            || {
                format!(
                    "split.quantity_decay must be a finite number >= 0, got {}",
                    sp.quantity_decay
                )
            },
        )?;
        check(d.fraction > 0.0 && d.fraction <= 1.0, || {
            format!("data.fraction must be in (0, 1], got {}", d.fraction)
        })?;
        let synthetic = matches!(d.source, Source::Mixture | Source::Sine);
        if synthetic {
            check(sp.kind == SplitKind::LabelGroups, || {
                "split.kind must be \"label_groups\" for synthetic sources (they generate their own groups)".into()
            })?;
            check(d.train >= 1, || {
                format!("data.train must be at least 1, got {}", d.train)
            })?;
            check(d.test >= 1, || {
                format!("data.test must be at least 1, got {}", d.test)
            })?;
        }
        if d.source == Source::Mixture {
            check(d.classes_per_group >= 2, || {
                format!(
                    "data.classes_per_group must be at least 2, got {}",
                    d.classes_per_group
                )
            })?;
            check(d.dim >= 1, || {
                format!("data.dim must be at least 1, got {}", d.dim)
            })?;
            check(d.separation > 0.0, || {
                format!("data.separation must be positive, got {}", d.separation)
            })?;
        }
        if d.source == Source::Sine {
            check(d.noise >= 0.0, || {
                format!("data.noise must be >= 0, got {}", d.noise)
            })?;
            check(self.model.kind == ModelKind::Linear, || {
                "model.kind must be \"linear\" for the sine source (a regression task)".into()
            })?;
        } else {
            check(self.model.kind != ModelKind::Linear, || {
                format!(
                    "model.kind \"linear\" is for regression (source \"sine\"), not {:?}",
                    d.source
                )
            })?;
        }
        if self.model.kind == ModelKind::Mlp {
            check(self.model.hidden.iter().all(|&h| h >= 1), || {
                "model.hidden widths must be at least 1".into()
            })?;
        }
        if self.model.kind == ModelKind::Cnn {
            check(
                !self.model.conv.is_empty() && self.model.conv.iter().all(|&c| c >= 1),
                || "model.conv must list at least one positive channel count".into(),
            )?;
            check(
                matches!(
                    d.source,
                    Source::Mnist | Source::FashionMnist | Source::Cifar10 | Source::Optdigits
                ),
                || {
                    "model.kind \"cnn\" needs image data (mnist, fashion_mnist, cifar10, optdigits)"
                        .into()
                },
            )?;
        }
        check(self.train.lr > 0.0 && self.train.lr.is_finite(), || {
            format!("train.lr must be positive, got {}", self.train.lr)
        })?;
        check(self.train.batch_size >= 1, || {
            format!(
                "train.batch_size must be at least 1, got {}",
                self.train.batch_size
            )
        })?;
        self.federico
            .validate()
            .map_err(|m| ScenarioError::Invalid(format!("federico.{m}")))?;
        self.fedcollab
            .validate()
            .map_err(|m| ScenarioError::Invalid(format!("fedcollab.{m}")))?;
        self.hcct
            .validate()
            .map_err(|e| ScenarioError::Invalid(format!("hcct.{e}")))?;
        self.feddisco
            .validate(sp.clients)
            .map_err(|m| ScenarioError::Invalid(format!("feddisco.{m}")))?;
        self.fedsac
            .validate()
            .map_err(|m| ScenarioError::Invalid(format!("fedsac.{m}")))?;
        if sp.kind == SplitKind::BiasedUniform {
            check(sp.uniform_clients <= sp.clients, || {
                format!(
                    "split.uniform_clients must be in [0, split.clients = {}], got {}",
                    sp.clients, sp.uniform_clients
                )
            })?;
        }
        if d.source == Source::Sine {
            let needs_classes =
                |a: &&Algorithm| matches!(a, Algorithm::Feddisco | Algorithm::Fedsac);
            if let Some(a) = self.algorithms.iter().find(needs_classes) {
                return Err(ScenarioError::Invalid(format!(
                    "algorithm \"{}\" needs class labels; source \"sine\" is a regression task",
                    a.name()
                )));
            }
        }
        self.fault_schedule()?;
        Ok(())
    }

    /// The validated fault schedule (empty when the scenario has no `[faults]` events).
    pub fn fault_schedule(&self) -> Result<Schedule, ScenarioError> {
        let s = self
            .faults
            .schedule(self.split.clients)
            .map_err(ScenarioError::Invalid)?;
        if !s.events.is_empty() && !self.algorithms.contains(&Algorithm::Federico) {
            return Err(ScenarioError::Invalid(
                "faults apply to FedeRiCo runs, but algorithms does not list \"federico\"".into(),
            ));
        }
        if !s.events.is_empty() && self.federico.mstep != crate::core::MStep::Full {
            return Err(ScenarioError::Invalid(format!(
                "faults need federico.mstep = \"full\" (what the peers run), got {:?}",
                self.federico.mstep
            )));
        }
        Ok(s)
    }

    /// The data directory: `--data-dir`, else `FEDERICO_DATA_DIR`, else `data.dir`.
    pub fn data_dir(&self, cli: Option<&Path>) -> Option<PathBuf> {
        cli.map(Path::to_path_buf)
            .or_else(|| std::env::var_os(DATA_DIR_ENV).map(PathBuf::from))
            .or_else(|| self.data.dir.clone())
    }

    /// Loads the real data set once (synthetic sources return `None`).
    pub fn load_real(
        &self,
        data_dir: Option<&Path>,
    ) -> Result<Option<loaders::RealData>, ScenarioError> {
        let source = match self.data.source {
            Source::Mixture | Source::Sine => return Ok(None),
            Source::Mnist => RealSource::Mnist,
            Source::FashionMnist => RealSource::FashionMnist,
            Source::Cifar10 => RealSource::Cifar10,
            Source::Optdigits => RealSource::Optdigits,
        };
        let dir = data_dir.ok_or_else(|| {
            DataError::Missing(format!(
                "source {:?} needs real data: pass --data-dir DIR, set {DATA_DIR_ENV}, or set data.dir in the scenario \
                 (DIR holds mnist/, fashion-mnist/, cifar-10/cifar-10-batches-bin/, optdigits/)",
                self.data.source
            ))
        })?;
        Ok(Some(loaders::load(source, dir)?))
    }

    /// The federation of one run: generated (synthetic) or subsampled and split (real), from the
    /// run's data stream.
    pub fn federation(
        &self,
        real: Option<&loaders::RealData>,
        rng: &mut StdRng,
    ) -> Result<Federation, ScenarioError> {
        let d = &self.data;
        let sp = &self.split;
        let fed = match (d.source, real) {
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
            (_, Some(real)) => {
                let pool = if d.fraction < 1.0 {
                    partition::subsample(&real.train, d.fraction, rng)?
                } else {
                    real.train.clone()
                };
                match sp.kind {
                    SplitKind::LabelGroups => partition::label_groups(
                        &pool,
                        sp.clients,
                        sp.groups,
                        sp.train_fraction,
                        rng,
                    )?,
                    SplitKind::Dirichlet => partition::dirichlet(
                        &pool,
                        sp.clients,
                        sp.clusters,
                        sp.alpha,
                        sp.train_fraction,
                        rng,
                    )?,
                    SplitKind::Shards => partition::shards(
                        &pool,
                        sp.clients,
                        sp.shards_per_client,
                        sp.train_fraction,
                        rng,
                    )?,
                    SplitKind::Iid => partition::iid(&pool, sp.clients, sp.train_fraction, rng)?,
                    SplitKind::Cluster4 => partition::cluster4(
                        &pool,
                        sp.clients,
                        CLUSTER4_ODD_SHARE,
                        sp.train_fraction,
                        sp.quantity_decay,
                        rng,
                    )?,
                    SplitKind::Concept4 => partition::concept4(
                        &pool,
                        sp.clients,
                        sp.train_fraction,
                        sp.quantity_decay,
                        rng,
                    )?,
                    SplitKind::Rotate4 => partition::rotate4(
                        &pool,
                        sp.clients,
                        sp.train_fraction,
                        sp.quantity_decay,
                        rng,
                    )?,
                    SplitKind::BiasedUniform => partition::biased_uniform(
                        &pool,
                        sp.clients,
                        sp.uniform_clients,
                        sp.shards_per_client,
                        sp.train_fraction,
                        rng,
                    )?,
                }
            }
        };
        Ok(fed)
    }

    /// The model for this scenario's data: see [`ModelConfig::spec`].
    pub fn model_spec(
        &self,
        sample_shape: &[usize],
        classes: Option<usize>,
    ) -> Result<ModelSpec, ScenarioError> {
        self.model.spec(sample_shape, classes)
    }

    /// The data RNG of a run seed (shared by all silos: the split is one draw).
    pub fn data_rng(seed: u64) -> StdRng {
        StdRng::seed_from_u64(crate::ids::stream_seed(
            seed,
            crate::ids::NodeId(u32::MAX),
            crate::ids::Stream::Data,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers() {
        let s = Scenario::parse("").unwrap();
        assert_eq!(s.federico.neighbours, 3);
        assert_eq!(s.federico.epsilon, 0.3);
        assert_eq!(s.federico.beta, 0.6);
        assert_eq!(s.train.lr, 0.01);
    }

    #[test]
    fn feddisco_defaults_are_the_specs() {
        let s = Scenario::parse("algorithms = [\"feddisco\"]\n").unwrap();
        let f = &s.feddisco;
        assert_eq!((f.a, f.b, f.normalise), (0.5, 0.1, true));
        assert_eq!(f.metric, crate::coord::feddisco::Metric::Kl);
        assert_eq!(
            (f.local_epochs, f.lr, f.momentum, f.weight_decay),
            (10, 0.01, 0.9, 1e-5)
        );
        let e = Scenario::parse("[feddisco]\nalpha = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("alpha") && e.contains("local_epochs"), "{e}");
        let e = Scenario::parse("[feddisco]\nmetric = \"js\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("js") && e.contains("cosine"), "{e}");
    }

    #[test]
    fn fedsac_defaults_are_the_papers() {
        let s = Scenario::parse("algorithms = [\"fedsac\"]\n").unwrap();
        let f = &s.fedsac;
        assert_eq!(
            (f.alpha, f.beta, f.alpha_cutoff, f.k, f.lambda),
            (0.9, 1.4, 0.7, 3, 0.01)
        );
        assert_eq!(
            (f.local_steps, f.lr, f.momentum, f.weight_decay),
            (200, 0.01, 0.9, 1e-5)
        );
        assert_eq!((f.cohort_size, f.feature_samples), (10, 1000));
        assert_eq!(f.reg_sign, crate::coord::fedsac::RegSign::Attract);
        let e = Scenario::parse("[fedsac]\ngamma = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("gamma") && e.contains("alpha"), "{e}");
        let e = Scenario::parse("[fedsac]\nreg_sign = \"up\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("attract") && e.contains("repel"), "{e}");
    }

    #[test]
    fn unknown_field_is_named_with_the_allowed_ones() {
        let e = Scenario::parse("[federico]\nepsilom = 0.2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("epsilom") && e.contains("epsilon"), "{e}");
        let e = Scenario::parse("roundz = 3\n").unwrap_err().to_string();
        assert!(e.contains("roundz") && e.contains("rounds"), "{e}");
    }

    #[test]
    fn bad_enum_value_lists_allowed_values() {
        let e = Scenario::parse("algorithms = [\"fedprox\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("fedprox") && e.contains("federico"), "{e}");
        let e = Scenario::parse("[split]\nkind = \"random\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("label_groups") && e.contains("dirichlet"), "{e}");
    }

    #[test]
    fn out_of_range_values_name_the_field() {
        for (text, field) in [
            ("[federico]\nepsilon = 1.5\n", "federico.epsilon"),
            ("[federico]\nbeta = 0\n", "federico.beta"),
            ("[federico]\nloss_scale = \"median\"\n", "loss_scale"),
            ("[federico]\nloss_scale = -2\n", "loss_scale"),
            ("rounds = 0\n", "rounds"),
            ("[split]\nclients = 2\ngroups = 3\n", "split.groups"),
            ("[split]\ntrain_fraction = 1.0\n", "split.train_fraction"),
            ("[train]\nlr = -0.1\n", "train.lr"),
            ("[feddisco]\na = -0.5\n", "feddisco.a"),
            ("[feddisco]\nlocal_epochs = 0\n", "feddisco.local_epochs"),
            ("[feddisco]\nmomentum = 1.0\n", "feddisco.momentum"),
            (
                "[feddisco]\nclients_per_round = 9\n",
                "feddisco.clients_per_round",
            ),
            ("[fedsac]\nalpha = -1\n", "fedsac.alpha"),
            ("[fedsac]\nk = 0\n", "fedsac.k"),
            ("[fedsac]\nfeature_samples = 3\n", "fedsac.feature_samples"),
            ("[fedsac]\nlr = 0\n", "fedsac.lr"),
            (
                "algorithms = [\"fedsac\"]\n[data]\nsource = \"sine\"\n[model]\nkind = \"linear\"\n",
                "class labels",
            ),
            (
                "[data]\nsource = \"mnist\"\n[split]\nkind = \"biased_uniform\"\nuniform_clients = 9\n",
                "split.uniform_clients",
            ),
            ("[data]\nsource = \"sine\"\n", "model.kind"),
            ("[fedcollab]\ncapacity = -2\n", "fedcollab.capacity"),
            (
                "[fedcollab]\ndisc_max_rounds = 0\n",
                "fedcollab.disc_max_rounds",
            ),
            (
                "[split]\nkind = \"cluster4\"\nclients = 6\ngroups = 2\n",
                "split.clients",
            ),
            ("[split]\nquantity_decay = -1\n", "split.quantity_decay"),
        ] {
            let e = Scenario::parse(text).unwrap_err().to_string();
            assert!(e.contains(field), "{text:?} gave {e}");
        }
    }

    #[test]
    fn fedcollab_section_defaults_and_unknown_fields() {
        let s = Scenario::parse("algorithms = [\"fedcollab\"]\n").unwrap();
        assert_eq!(s.algorithms, vec![Algorithm::Fedcollab]);
        assert_eq!(s.fedcollab, FedCollabConfig::default());
        assert_eq!(s.fedcollab.capacity, 10.0);
        let s = Scenario::parse("[fedcollab]\ncapacity = 8\ndistance = \"label_tv\"\n").unwrap();
        assert_eq!(s.fedcollab.capacity, 8.0);
        let e = Scenario::parse("[fedcollab]\ncapacityy = 8\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("capacityy") && e.contains("capacity"), "{e}");
        let e = Scenario::parse("[fedcollab]\ndistance = \"euclid\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("discriminator") && e.contains("label_tv"), "{e}");
    }

    #[test]
    fn loss_scale_and_mstep_forms() {
        let s =
            Scenario::parse("[federico]\nloss_scale = 50\nmstep = { minibatch = 4 }\n").unwrap();
        assert_eq!(s.federico.loss_scale, crate::core::LossScale::Fixed(50.0));
        assert_eq!(s.federico.mstep, MStep::Minibatch(4));
        let s = Scenario::parse("[federico]\nloss_scale = \"sum\"\nmstep = \"epoch\"\n").unwrap();
        assert_eq!(s.federico.loss_scale, crate::core::LossScale::Sum);
        assert_eq!(s.federico.mstep, MStep::Epoch);
    }

    #[test]
    fn overrides_set_nested_fields_and_are_validated() {
        let s = Scenario::parse_with(
            "[federico]\nepsilon = 0.3\n",
            &[
                "federico.loss_scale=10".into(),
                "seeds=[4, 5]".into(),
                "data.source=sine".into(),
                "model.kind=linear".into(),
            ],
        )
        .unwrap();
        assert_eq!(s.federico.loss_scale, crate::core::LossScale::Fixed(10.0));
        assert_eq!(s.seeds, vec![4, 5]);
        assert_eq!(s.data.source, Source::Sine);
        let e = Scenario::parse_with("", &["federico.epsilon=2".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("federico.epsilon"), "{e}");
        let e = Scenario::parse_with("", &["federico.epsilom=0.1".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("epsilom"), "{e}");
        assert!(Scenario::parse_with("", &["rounds".into()]).is_err());
    }

    #[test]
    fn hcct_section_defaults_forms_and_errors() {
        use crate::coord::hcct::{Alpha, Optimizer};
        let s = Scenario::parse("algorithms = [\"hcct\"]\n").unwrap();
        assert_eq!(s.algorithms, vec![Algorithm::Hcct]);
        assert_eq!(Algorithm::Hcct.name(), "hcct");
        assert_eq!(s.hcct, HcctConfig::default());
        let s = Scenario::parse(
            "[hcct]\nalpha = 25\nepochs = 5\noptimizer = \"adam\"\ngroups = 3\none_shot = true\n",
        )
        .unwrap();
        assert_eq!(s.hcct.alpha, Alpha::Constant(25.0));
        assert_eq!((s.hcct.epochs, s.hcct.groups), (5, Some(3)));
        assert_eq!(s.hcct.optimizer, Optimizer::Adam);
        assert!(s.hcct.one_shot);
        let s = Scenario::parse("[hcct]\nalpha = \"client_size\"\n").unwrap();
        assert_eq!(s.hcct.alpha, Alpha::ClientSize);
        for (text, needle) in [
            ("[hcct]\nalpah = 1\n", "alpah"),
            ("[hcct]\nalpha = -1\n", "alpha must be a finite number >= 0"),
            ("[hcct]\nalpha = \"big\"\n", "\"big\""),
            (
                "[hcct]\nepochs = 0\n",
                "hcct.epochs must be at least 1, got 0",
            ),
            (
                "[hcct]\nlr_decay = 0\n",
                "hcct.lr_decay must be in (0, 1], got 0",
            ),
            ("[hcct]\nlr = -0.1\n", "hcct.lr must be"),
            (
                "[hcct]\ngroups = 0\n",
                "hcct.groups must be at least 1, got 0",
            ),
            ("[hcct]\noptimizer = \"sgdm\"\n", "sgd"),
        ] {
            let e = Scenario::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?} gave {e}");
        }
    }

    #[test]
    fn cnn_spec_from_cifar_shape() {
        let s = Scenario::parse(
            "[data]\nsource = \"cifar10\"\n[model]\nkind = \"cnn\"\nconv = [128, 128, 128]\n",
        )
        .unwrap();
        let spec = s.model_spec(&[3, 32, 32], Some(10)).unwrap();
        assert!(matches!(spec, ModelSpec::Cnn { channels: 3, .. }));
    }

    #[test]
    fn missing_data_dir_says_what_to_do() {
        let s = Scenario::parse("[data]\nsource = \"fashion_mnist\"\n").unwrap();
        let e = s.load_real(None).unwrap_err().to_string();
        assert!(e.contains("--data-dir") && e.contains(DATA_DIR_ENV), "{e}");
    }
}
