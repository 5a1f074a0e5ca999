//! Scenario files: what `federico simulate` runs.
//!
//! Owns: the TOML schema (data, split, model, training, FedeRiCo hyperparameters, algorithms,
//! rounds, seeds), its validation, and turning it into concrete objects (a
//! [`Federation`](crate::learn::Federation), a [`ModelSpec`]). Unknown fields and invalid
//! values fail at load with a message naming the field and the allowed values.
//! Must not: run anything.
//!
//! Layout: `data.rs` (`[data]`, `[split]` and building the federation), `own.rs` (a scenario's
//! own files: paths, natural partitions, a separate test set), `model.rs` (`[model]`,
//! `[train]`), `algorithms.rs` (`[feddisco]`, `[fedsac]`), `validate.rs` (the whole-file
//! checks); the file itself, [`Algorithm`], loading and parsing are here.

mod algorithms;
mod data;
mod model;
mod own;
mod source;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_own;
mod validate;

pub use algorithms::{FeddiscoConfig, FedsacConfig, FedsacScore};
pub use data::{CLUSTER4_ODD_SHARE, DataConfig, Loaded, SplitConfig, SplitKind};
pub use model::{ModelConfig, ModelKind, TrainConfig};
pub use own::{OwnData, SiloFiles, Silos};
pub use source::Source;

use crate::coord::fedcollab::FedCollabConfig;
use crate::coord::hcct::HcctConfig;
use crate::core::FedericoConfig;
use crate::faults::{FaultsConfig, Schedule};
use crate::learn::{DataError, ModelSpec};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Environment variable naming the data directory (after `--data-dir`, before `data.dir`).
pub const DATA_DIR_ENV: &str = "FEDERICO_DATA_DIR";

/// The data directory when nothing names one: `data/` in the working directory, where
/// `federico data download` puts the data sets (and, when it exists, where every command looks).
pub const DEFAULT_DATA_DIR: &str = "data";

/// Errors loading or validating a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("scenario {}: {error}", path.display())]
    Io {
        /// The scenario file.
        path: PathBuf,
        /// The underlying error (in the message, so not a `source`: `{:#}` would repeat it).
        error: std::io::Error,
    },
    /// TOML syntax, an unknown field, or a value of the wrong type.
    #[error("scenario {}: {message}", path.display())]
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

/// `Ok` when `ok`, else [`ScenarioError::Invalid`] with `msg()`.
pub(super) fn check(ok: bool, msg: impl FnOnce() -> String) -> Result<(), ScenarioError> {
    if ok {
        Ok(())
    } else {
        Err(ScenarioError::Invalid(msg()))
    }
}

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
    /// each coalition (`docs/specs/fedcollab.md`).
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
    /// `[defences]`: how far an owner trusts the gradients of the other members (FedeRiCo).
    pub defences: crate::core::Defences,
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
    /// `[privacy]`: differential privacy at the source (FedeRiCo only so far). Absent: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub privacy: Option<crate::privacy::PrivacyConfig>,
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
            defences: Default::default(),
            fedcollab: FedCollabConfig::default(),
            hcct: HcctConfig::default(),
            feddisco: FeddiscoConfig::default(),
            fedsac: FedsacConfig::default(),
            faults: FaultsConfig::default(),
            privacy: None,
        }
    }
}

/// The coordinated algorithms a fault schedule applies to (the simulator runs them on the
/// network's engines, on a moving clock).
pub const COORDINATED_UNDER_FAULTS: [Algorithm; 4] = [
    Algorithm::Feddisco,
    Algorithm::Hcct,
    Algorithm::Fedsac,
    Algorithm::Fedcollab,
];

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        Self::load_with(path, &[])
    }

    /// Reads a scenario file with `--set` overrides (see [`Self::parse_with`]).
    pub fn load_with(path: &Path, overrides: &[String]) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|error| ScenarioError::Io {
            path: path.to_owned(),
            error,
        })?;
        let base = path.parent().unwrap_or(Path::new(""));
        let mut s = Self::parse_in(&text, overrides, base).map_err(|e| match e {
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
    ///
    /// Own-data paths are taken relative to the working directory here; [`Self::load_with`]
    /// takes them relative to the scenario file.
    pub fn parse_with(text: &str, overrides: &[String]) -> Result<Self, ScenarioError> {
        Self::parse_in(text, overrides, Path::new(""))
    }

    /// [`Self::parse_with`], own-data paths relative to `base`.
    fn parse_in(text: &str, overrides: &[String], base: &Path) -> Result<Self, ScenarioError> {
        let (mut s, clients_given) = Self::build(text, overrides).map_err(|e| match e {
            ScenarioError::Parse { path, message } if !overrides.is_empty() => {
                ScenarioError::Parse {
                    path,
                    message: blame_override(text, overrides, message),
                }
            }
            other => other,
        })?;
        s.settle_own(base, clients_given)?;
        s.validate()?;
        Ok(s)
    }

    /// The text with its overrides, deserialized but neither settled nor validated; and
    /// whether `split.clients` was given.
    fn build(text: &str, overrides: &[String]) -> Result<(Self, bool), ScenarioError> {
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
            // The pool's size is one setting given two ways: overriding one drops the other.
            if key.trim() == "data.fraction" {
                table.remove("samples");
            } else if key.trim() == "data.samples" {
                table.remove("fraction");
            }
            table.insert(last.to_string(), value);
        }
        let clients_given = doc.get("split").and_then(|t| t.get("clients")).is_some();
        let s: Scenario = if overrides.is_empty() {
            // From the text itself, so the message shows the line and a caret.
            toml::from_str(text).map_err(|e| parse_err(plain(e.to_string())))?
        } else {
            doc.try_into()
                .map_err(|e: toml::de::Error| parse_err(plain(e.to_string())))?
        };
        Ok((s, clients_given))
    }

    /// The validated fault schedule (empty when the scenario has no `[faults]` events). Faults
    /// apply to FedeRiCo and to FedDisco, HCCT, FedSaC and FedCollab (on the network's engines: delay,
    /// loss, leave and the coordinator's crash); the other algorithms run fault-free beside.
    pub fn fault_schedule(&self) -> Result<Schedule, ScenarioError> {
        let s = self
            .faults
            .schedule(self.split.clients)
            .map_err(ScenarioError::Invalid)?;
        let invalid = |m: String| Err(ScenarioError::Invalid(m));
        if s.links().is_some() {
            if !self.algorithms.contains(&Algorithm::Federico) {
                return invalid(
                    "faults.links model a wide-area network for FedeRiCo: list \"federico\" in algorithms"
                        .into(),
                );
            }
            if let Some(a) = self
                .algorithms
                .iter()
                .find(|a| COORDINATED_UNDER_FAULTS.contains(a))
            {
                return invalid(format!(
                    "faults.links apply to FedeRiCo only so far; {} would run without them: remove it \
                     from algorithms",
                    a.name()
                ));
            }
        }
        if s.events.is_empty() {
            return Ok(s);
        }
        let coordinated: Vec<Algorithm> = self
            .algorithms
            .iter()
            .copied()
            .filter(|a| COORDINATED_UNDER_FAULTS.contains(a))
            .collect();
        if !self.algorithms.contains(&Algorithm::Federico) && coordinated.is_empty() {
            return invalid(
                "faults apply to FedeRiCo, FedDisco, HCCT, FedSaC and FedCollab runs, but \
                 algorithms lists none of \"federico\", \"feddisco\", \"hcct\", \"fedsac\", \
                 \"fedcollab\""
                    .into(),
            );
        }
        for (n, e) in s.events.iter().enumerate() {
            let n = n + 1;
            let kind = e.fault.kind();
            if kind == "coordinator_crash" && coordinated.is_empty() {
                return invalid(format!(
                    "faults.events[{n}]: coordinator_crash needs a run with a coordinator: list \
                     \"feddisco\", \"hcct\", \"fedsac\" or \"fedcollab\" in algorithms"
                ));
            }
            if kind == "attack"
                && let Some(a) = coordinated.iter().find(|&&a| a == Algorithm::Fedcollab)
            {
                return invalid(format!(
                    "faults.events[{n}]: attack is not simulated for {} (its members pull each \
                     other's models without a coordinator to defend them); run it with \
                     \"federico\", \"feddisco\", \"hcct\" or \"fedsac\"",
                    a.name()
                ));
            }
            if let Some(a) = coordinated.first()
                && !["delay", "loss", "leave", "coordinator_crash", "attack"].contains(&kind)
            {
                return invalid(format!(
                    "faults.events[{n}]: {kind} is not simulated for {} (a coordinated run takes \
                     delay, loss, leave, coordinator_crash and attack); run it with \"federico\" \
                     alone",
                    a.name()
                ));
            }
        }
        if coordinated.contains(&Algorithm::Feddisco)
            && self.feddisco.clients_per_round != 0
            && self.feddisco.clients_per_round < self.split.clients
        {
            return invalid(
                "faults: feddisco.clients_per_round is a simulator mode without faults (the \
                 network's FedDisco hears from every silo); drop it or the faults"
                    .into(),
            );
        }
        if coordinated.contains(&Algorithm::Hcct)
            && let Err(e) = crate::coord::hcct_server::HcctServer::check_config(&self.hcct)
        {
            return invalid(format!(
                "faults: {e}, and so without faults (faults run on the network's engines)"
            ));
        }
        Ok(s)
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

/// A deserializer's message in a user's words: Rust type names become what to write.
fn plain(message: String) -> String {
    let mut m = message;
    for (rust, words) in [
        ("expected usize", "expected a whole number (0 or more)"),
        ("expected u64", "expected a whole number (0 or more)"),
        ("expected u32", "expected a whole number (0 or more)"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
    ] {
        m = m.replace(rust, words);
    }
    m = m.trim_end().to_string();
    // `rounds = "100"`: a number in quotes.
    if let Some(rest) = m.split("invalid type: string \"").nth(1)
        && let Some(quoted) = rest.split('"').next()
        && quoted.trim().parse::<f64>().is_ok()
    {
        m += &format!("\n(write {quoted} without quotes)");
    }
    // `--set algorithms=[federico]`: the shell ate nothing, but TOML needs the quotes.
    if m.contains("invalid type: string \"[") && m.contains("expected a sequence") {
        m +=
            "\n(a list of names needs quotes inside: --set 'algorithms=[\"local\", \"federico\"]')";
    }
    m
}

/// The message of a scenario that fails only with its `--set` overrides: it names the first
/// override that breaks the file on its own (the file is not to blame).
fn blame_override(text: &str, overrides: &[String], message: String) -> String {
    let parses = |sets: &[String]| Scenario::build(text, sets).is_ok();
    if !parses(&[]) {
        return message;
    }
    match overrides.iter().find(|o| !parses(std::slice::from_ref(*o))) {
        Some(o) => format!("--set {o}: {message}"),
        None => format!("--set {}: {message}", overrides.join(" --set ")),
    }
}
