//! A peer's configuration file (`node-config/*.toml`): identity, network, data, model,
//! FedeRiCo hyperparameters, deadlines and where state goes.
//! Owns: the schema, its defaults, validation with messages naming the field, and resolving
//! relative paths against the file's directory.
//! Must not: open files other than the config itself, or start anything.

use crate::core::FedericoConfig;
use crate::learn::FeatureScale;
use crate::scenario::{ModelConfig, TrainConfig};
use libp2p::Multiaddr;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A config that cannot be used; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("node config {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error (in the message, so not a `source`: `{:#}` would repeat it).
        error: std::io::Error,
    },
    /// A field is missing, unknown, or has a bad value.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field and the allowed values.
        reason: String,
    },
}

fn is_default<T: Default + PartialEq>(t: &T) -> bool {
    *t == T::default()
}

/// `[deadlines]`, in seconds (spec §6: τ = max(5 s, 3 × expected transfer and compute)).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Deadlines {
    /// τ_model: how long a sampler waits for a pulled model before counting the owner as
    /// unreachable this round.
    pub model_s: f64,
    /// τ_grad: how long an owner waits, once its own gradient is in, for the gradients and
    /// round notices of the others before stepping with what arrived.
    pub gradient_s: f64,
    /// How long to wait at start for the manifest's members to connect, and show they run
    /// FedeRiCo (identify lists its protocol), before round 1.
    pub start_s: f64,
    /// How long in all a fresh node waits for a first peer before it trains alone. Unset (the
    /// default): it waits until one comes, saying so once every `start_s`, for a silo alone
    /// is no federation. A node resuming from a checkpoint never waits for this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alone_s: Option<f64>,
    /// After the last round: how long to keep serving the final model to peers still
    /// evaluating, at most (it leaves earlier once every live peer said it is done).
    pub linger_s: f64,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            model_s: 60.0,
            gradient_s: 60.0,
            start_s: 60.0,
            alone_s: None,
            linger_s: 30.0,
        }
    }
}

/// The standard formats a node reads its own data from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataFormat {
    /// MNIST-style IDX: `train = [images, labels]`, `test = [images, labels]` (gzip or plain).
    Idx,
    /// CIFAR-10 binary batches: `train = [batch, ...]`, `test = [batch, ...]`.
    Cifar10,
    /// CSV of numeric features and an integer label column: `train = [file]`, `test = [file]`.
    Csv,
    /// A folder of class sub-folders of PNG/JPEG images: `train = [folder]`, `test = [folder]`
    /// (classes numbered by sorted folder name over both).
    Images,
}

/// Where the silo's data comes from: a shard, or its own files in a standard format.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSource {
    /// A shard file written by `federico partition` (features, labels, train/test split).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<PathBuf>,
    /// Or: the format of the silo's own files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<DataFormat>,
    /// Training files (see [`DataFormat`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub train: Vec<PathBuf>,
    /// Test files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub test: Vec<PathBuf>,
    /// CSV: the label column, by header name or 0-based position (default: the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_column: Option<crate::learn::loaders::Column>,
    /// CSV: the number of classes in the federation (every silo must agree); images: optional,
    /// at least the number of class folders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<usize>,
    /// The federation's class names in class-id order (every silo lists the same), so that
    /// silos holding different classes number them alike. Images: the class folders' names
    /// (default: the sorted names of this silo's folders). CSV: the label column's values
    /// (`["healthy", "mild", "severe"]`; then `classes` may be left out), or, where the labels
    /// are class ids, the names of ids 0, 1, …. With any source they
    /// go into the exported `model.json`, so that `predict` reads and writes labels by name
    /// (a shard's default: the `classes.json` that `init` and `partition` write beside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_names: Option<Vec<String>>,
    /// CSV: the federation's feature constants (a `scale.json`: a mean and a std per column,
    /// the same file at every silo), applied to the training and test rows as they are read.
    /// Columns in their own units (years, mmHg, a sensor's counts) train badly; `init` and
    /// `partition` write one for a CSV scenario (`docs/data.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<PathBuf>,
}

impl DataSource {
    /// Checks the combination of fields; the message names them.
    pub fn validate(&self) -> Result<(), String> {
        match (&self.shard, self.format) {
            (Some(_), None) => {
                if !self.train.is_empty() || !self.test.is_empty() {
                    return Err("data: give either shard or format with train/test files, not both".into());
                }
                if self.scale.is_some() {
                    return Err(
                        "data.scale is for format \"csv\": a shard's rows were standardized when it was written".into(),
                    );
                }
                self.check_class_names()
            }
            (None, Some(f)) => {
                let (train, test) = (self.train.len(), self.test.len());
                let ok = match f {
                    DataFormat::Idx => train == 2 && test == 2,
                    DataFormat::Cifar10 => train >= 1 && test >= 1,
                    DataFormat::Csv | DataFormat::Images => train == 1 && test == 1,
                };
                if !ok {
                    return Err(format!(
                        "data.train/data.test for format {f:?}: {}, got {train} and {test} files",
                        match f {
                            DataFormat::Idx => "two files each, [images, labels]",
                            DataFormat::Cifar10 => "at least one batch file each",
                            DataFormat::Csv => "one file each",
                            DataFormat::Images => "one folder each",
                        }
                    ));
                }
                if self.scale.is_some() && f != DataFormat::Csv {
                    return Err(format!(
                        "data.scale is for format \"csv\" (rows in their own units), not {f:?}"
                    ));
                }
                if f == DataFormat::Csv
                    && self.class_names.is_none()
                    && self.classes.is_none_or(|c| c < 2)
                {
                    return Err(
                        "data.classes (>= 2) or data.class_names must be given for format \"csv\""
                            .into(),
                    );
                }
                self.check_class_names()
            }
            (Some(_), Some(_)) => Err("data: give either shard or format, not both".into()),
            (None, None) => Err(
                "data needs shard = \"<file from federico partition>\" or format = \"idx\" | \"cifar10\" | \"csv\" | \"images\" with train and test files"
                    .into(),
            ),
        }
    }

    /// `class_names`: at least two, none empty, none twice, and no more than `classes`.
    fn check_class_names(&self) -> Result<(), String> {
        let Some(names) = &self.class_names else {
            return Ok(());
        };
        crate::learn::export::check_class_names(names)
            .map_err(|e| format!("data.class_names {e}"))?;
        if let Some(c) = self.classes
            && c != names.len()
        {
            return Err(format!(
                "data.classes = {c}, but data.class_names lists {} names (give one of the two)",
                names.len()
            ));
        }
        Ok(())
    }

    /// Loads the silo's data (checked: counts, labels, finiteness for CSV).
    pub fn load(&self) -> Result<crate::learn::ClientData, crate::learn::DataError> {
        use crate::learn::loaders;
        if let Some(shard) = &self.shard {
            let data = crate::learn::Shard::read(shard)?.data;
            if let (Some(names), Some(classes)) = (&self.class_names, data.train.num_classes())
                && classes != names.len()
            {
                return Err(crate::learn::DataError::Invalid(format!(
                    "data.class_names lists {} names, but {} has {classes} classes",
                    names.len(),
                    shard.display(),
                )));
            }
            return Ok(data);
        }
        if self.format == Some(DataFormat::Images) {
            // One numbering of the classes for both folders (sorted names over both).
            let train = loaders::read_image_folder(&self.train[0])?;
            let test = loaders::read_image_folder(&self.test[0])?;
            if self.class_names.is_none() {
                // Another silo holding other classes would number its folders otherwise.
                tracing::warn!(
                    "data.class_names is not set: classes are numbered by this silo's own \
                     folder names, sorted ({}); where silos hold different classes, every \
                     silo must list the federation's class names in data.class_names",
                    train.names.join(", ")
                );
            }
            let (mut sets, _) =
                loaders::unify_named(&[&train, &test], self.classes, self.class_names.as_deref())?;
            let test = sets.pop().expect("unify returns one set per part");
            let train = sets.pop().expect("unify returns one set per part");
            return Ok(crate::learn::ClientData {
                train,
                test,
                group: None,
            });
        }
        let (mut train, mut test) = match (&self.class_names, self.format) {
            (Some(names), Some(DataFormat::Csv)) => self.load_named_csv(names)?,
            _ => {
                let part = |files: &[PathBuf]| self.load_part(files);
                (part(&self.train)?, part(&self.test)?)
            }
        };
        if train.sample_shape != test.sample_shape {
            return Err(crate::learn::DataError::Invalid(format!(
                "data: train samples are {:?} but test samples are {:?}",
                train.sample_shape, test.sample_shape
            )));
        }
        if let Some(path) = &self.scale {
            let scale = crate::learn::FeatureScale::read(path)?;
            scale.apply_checked(&mut train, &self.train[0].display().to_string())?;
            scale.apply_checked(&mut test, &self.test[0].display().to_string())?;
        }
        Ok(crate::learn::ClientData {
            train,
            test,
            group: None,
        })
    }

    /// One part (`train` or `test`) of a format whose labels are class ids.
    fn load_part(
        &self,
        files: &[PathBuf],
    ) -> Result<crate::learn::Dataset, crate::learn::DataError> {
        use crate::learn::loaders;
        match self.format {
            Some(DataFormat::Idx) => loaders::load_idx_files(&files[0], &files[1]),
            Some(DataFormat::Cifar10) => loaders::load_cifar_files(files),
            Some(DataFormat::Csv) => loaders::load_csv_column(
                &files[0],
                self.label_column.as_ref(),
                self.classes.unwrap_or(0),
            ),
            Some(DataFormat::Images) | None => {
                Err(crate::learn::DataError::Invalid("data: no source".into()))
            }
        }
    }

    /// CSV train and test files whose labels are the names in `names` (a label's class id is
    /// its position); every label must be listed. Files whose labels are all class ids below
    /// `names.len()`, none of them a listed name, are read by id (the names then only name the
    /// classes), as `predict` reads them.
    fn load_named_csv(
        &self,
        names: &[String],
    ) -> Result<(crate::learn::Dataset, crate::learn::Dataset), crate::learn::DataError> {
        use crate::learn::loaders::{self, CsvColumns};
        let read = |path: &PathBuf| {
            loaders::read_csv(
                path,
                CsvColumns {
                    label: self.label_column.as_ref(),
                    ..CsvColumns::default()
                },
            )
            .map(|t| t.set)
        };
        let (train, test) = (read(&self.train[0])?, read(&self.test[0])?);
        let by_id = [&train, &test].iter().all(|p| {
            p.names
                .iter()
                .all(|n| !names.contains(n) && n.parse::<usize>().is_ok_and(|id| id < names.len()))
        });
        let fixed = (!by_id).then_some(names);
        let (mut sets, _) = loaders::unify_named(&[&train, &test], Some(names.len()), fixed)?;
        let test = sets.pop().expect("unify returns one set per part");
        let train = sets.pop().expect("unify returns one set per part");
        Ok((train, test))
    }
}

/// A whole node config file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// This silo's name in the manifest.
    pub name: String,
    /// The key file (`federico keygen --out …`).
    pub key: PathBuf,
    /// The federation manifest.
    pub manifest: PathBuf,
    /// Addresses to listen on (TCP and/or QUIC multiaddrs).
    #[serde(default = "default_listen")]
    pub listen: Vec<String>,
    /// Peers to dial at start, as multiaddrs ending in `/p2p/<peer id>` (manifest addresses
    /// are dialled too).
    #[serde(default)]
    pub bootstrap: Vec<String>,
    /// Discover peers on the local network with mDNS.
    #[serde(default)]
    pub mdns: bool,
    /// The federation's run seed: with the node's manifest index it seeds every random stream.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Rounds to run; 0 runs until stopped.
    #[serde(default = "default_rounds")]
    pub rounds: u64,
    /// Evaluate on the test split every this many rounds (and after the last).
    #[serde(default = "default_eval_every")]
    pub eval_every: u64,
    /// State directory: the checkpoint and the run log (`rounds.jsonl`) go here.
    pub state_dir: PathBuf,
    /// Serve Prometheus metrics on this address (e.g. `127.0.0.1:9464`).
    #[serde(default)]
    pub metrics: Option<String>,
    /// The largest message accepted, in MiB, checked before decoding. Unset: derived from the
    /// model's size ([`crate::protocol::message_bound`]: twice its largest message plus 64 KiB)
    /// for a FedeRiCo node, 256 MiB in coordinator mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_mib: Option<u64>,
    /// The bytes of frames being received that the node buffers at once, all peers and streams
    /// together, in MiB; one peer may hold a quarter of it. A frame that would pass either is
    /// refused (`over_budget`). Unset: four of the model's largest messages, at least 24 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive_budget_mib: Option<u64>,
    /// `[data]`.
    pub data: DataSource,
    /// `[model]`: as in scenario files.
    #[serde(default)]
    pub model: ModelConfig,
    /// `[train]`: as in scenario files.
    #[serde(default)]
    pub train: TrainConfig,
    /// `[federico]`: as in scenario files.
    #[serde(default)]
    pub federico: FedericoConfig,
    /// `[defences]`: as in scenario files.
    #[serde(default, skip_serializing_if = "is_default")]
    pub defences: crate::core::Defences,
    /// `[deadlines]`.
    #[serde(default)]
    pub deadlines: Deadlines,
    /// `[control]`: the local control channel `federico swarm` uses for fault schedules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<crate::net::control::ControlConfig>,
    /// `[coordinated]`: run against a coordinator (e.g. FedDisco) instead of FedeRiCo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinated: Option<super::coordinated::CoordinatedConfig>,
    /// `[privacy]`: differential privacy of everything this silo releases from its rows, with
    /// its budget (`docs/privacy.md`); the noise is secret unless `privacy.noise = "seeded"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privacy: Option<crate::privacy::PrivacyConfig>,
}

fn default_listen() -> Vec<String> {
    vec![
        "/ip4/0.0.0.0/tcp/0".into(),
        "/ip4/0.0.0.0/udp/0/quic-v1".into(),
    ]
}
fn default_seed() -> u64 {
    1
}
fn default_rounds() -> u64 {
    100
}
fn default_eval_every() -> u64 {
    10
}

impl NodeConfig {
    /// The constants this silo's rows were standardized with, for its exported model: the
    /// config's `data.scale`, else the `scale.json` that `init` and `partition` write beside a
    /// shard of standardized rows; `None` when the rows are used as read.
    pub fn feature_scale(&self) -> Result<Option<FeatureScale>, crate::learn::DataError> {
        let beside_shard = self
            .data
            .shard
            .as_ref()
            .map(|s| s.with_file_name("scale.json"))
            .filter(|p| p.is_file());
        self.data
            .scale
            .clone()
            .or(beside_shard)
            .map(|p| FeatureScale::read(&p))
            .transpose()
    }

    /// The federation's class names, for its exported model: the config's `data.class_names`,
    /// else the `classes.json` that `init` and `partition` write beside a shard whose labels
    /// had names; `None` where the labels are class ids.
    pub fn class_names(&self) -> Result<Option<Vec<String>>, crate::learn::DataError> {
        if let Some(names) = &self.data.class_names {
            return Ok(Some(names.clone()));
        }
        let Some(path) = self
            .data
            .shard
            .as_ref()
            .map(|s| s.with_file_name(crate::learn::export::CLASSES_FILE))
            .filter(|p| p.is_file())
        else {
            return Ok(None);
        };
        crate::learn::export::read_class_names(&path).map(Some)
    }

    /// What this silo's exported cards say about its rows: [`Self::feature_scale`] and
    /// [`Self::class_names`].
    pub fn card_data(&self) -> Result<crate::learn::export::CardData, crate::learn::DataError> {
        Ok(crate::learn::export::CardData {
            scale: self.feature_scale()?,
            class_names: self.class_names()?,
        })
    }

    /// Reads, validates and resolves a config file (relative paths are relative to it).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        let invalid = |reason: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let mut cfg: NodeConfig = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        cfg.validate().map_err(invalid)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let data = &mut cfg.data;
        let paths = [&mut cfg.key, &mut cfg.manifest, &mut cfg.state_dir]
            .into_iter()
            .chain(data.shard.as_mut())
            .chain(data.scale.as_mut())
            .chain(data.train.iter_mut())
            .chain(data.test.iter_mut());
        for p in paths {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        Ok(cfg)
    }

    /// Checks every value; the message names the field and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("name must be this silo's name in the manifest".into());
        }
        for a in &self.listen {
            a.parse::<Multiaddr>()
                .map_err(|e| format!("listen: {a:?} is not a multiaddr: {e}"))?;
        }
        if self.listen.is_empty() {
            return Err(
                "listen must name at least one address, e.g. \"/ip4/0.0.0.0/tcp/4001\"".into(),
            );
        }
        if let Some(c) = &self.control {
            crate::net::control::attack_plan(&c.attacks)?;
            for l in &c.links {
                l.wan()?;
            }
        }
        for a in &self.bootstrap {
            let addr: Multiaddr = a
                .parse()
                .map_err(|e| format!("bootstrap: {a:?} is not a multiaddr: {e}"))?;
            if !addr
                .iter()
                .any(|p| matches!(p, libp2p::multiaddr::Protocol::P2p(_)))
            {
                return Err(format!("bootstrap: {a:?} must end in /p2p/<peer id>"));
            }
        }
        self.data.validate()?;
        if self.eval_every == 0 {
            return Err("eval_every must be at least 1".into());
        }
        if let Some(m) = self.max_message_mib
            && !(1..=4096).contains(&m)
        {
            return Err(format!("max_message_mib must be in 1..=4096, got {m}"));
        }
        if let Some(b) = self.receive_budget_mib
            && !(1..=65_536).contains(&b)
        {
            return Err(format!("receive_budget_mib must be in 1..=65536, got {b}"));
        }
        if let Some(m) = &self.metrics {
            m.parse::<std::net::SocketAddr>().map_err(|e| {
                format!("metrics: {m:?} is not an address like 127.0.0.1:9464: {e}")
            })?;
        }
        let d = &self.deadlines;
        for (name, v) in [
            ("deadlines.model_s", d.model_s),
            ("deadlines.gradient_s", d.gradient_s),
            ("deadlines.start_s", d.start_s),
            ("deadlines.linger_s", d.linger_s),
            ("deadlines.alone_s", d.alone_s.unwrap_or(0.0)),
        ] {
            if !(v.is_finite() && (0.0..=86_400.0).contains(&v)) {
                return Err(format!("{name} must be in [0, 86400] seconds, got {v}"));
            }
        }
        if !(self.train.lr.is_finite() && self.train.lr > 0.0) {
            return Err(format!("train.lr must be positive, got {}", self.train.lr));
        }
        if self.train.batch_size == 0 {
            return Err("train.batch_size must be at least 1".into());
        }
        self.defences
            .validate()
            .map_err(|e| format!("defences.{e}"))?;
        self.federico
            .validate()
            .map_err(|e| format!("federico.{e}"))?;
        if let Some(p) = &self.privacy {
            p.validate()?;
            if self.coordinated.is_some() {
                return Err(
                    "[privacy] is for FedeRiCo nodes: the coordinator algorithms' \
                            statistics are not privatised, so [coordinated] refuses it"
                        .into(),
                );
            }
            if self.federico.mstep() == crate::core::MStep::LocalEpoch {
                return Err(crate::privacy::REFUSES_LOCAL_EPOCH.into());
            }
            if self.rounds == 0 && p.noise_multiplier.is_none() {
                return Err(
                    "[privacy] on a node that runs until stopped (rounds = 0) needs \
                            privacy.noise_multiplier: there is no planned run to calibrate the \
                            noise to"
                        .into(),
                );
            }
        }
        Ok(())
    }

    /// τ_model.
    pub fn model_deadline(&self) -> Duration {
        Duration::from_secs_f64(self.deadlines.model_s)
    }
    /// τ_grad.
    pub fn gradient_deadline(&self) -> Duration {
        Duration::from_secs_f64(self.deadlines.gradient_s)
    }
    /// The message bound in bytes in coordinator mode: `max_message_mib`, or 256 MiB.
    pub fn max_message(&self) -> u64 {
        self.max_message_mib
            .map_or(crate::protocol::DEFAULT_MAX_MESSAGE, |m| m << 20)
    }

    /// The message bound in bytes of a FedeRiCo node whose model has `num_params` parameters:
    /// `max_message_mib`, or derived from the model's size.
    pub fn max_message_for(&self, num_params: usize) -> u64 {
        self.max_message_mib
            .map_or_else(|| crate::protocol::message_bound(num_params), |m| m << 20)
    }

    /// The receive budget in bytes for a model of `num_params` parameters:
    /// `receive_budget_mib`, or [`crate::net::intake::default_receive_budget`].
    pub fn receive_budget_for(&self, num_params: usize) -> u64 {
        self.receive_budget_mib.map_or_else(
            || crate::net::intake::default_receive_budget(num_params),
            |m| m << 20,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "a"
key = "a.key"
manifest = "manifest.toml"
state_dir = "state/a"
[data]
shard = "a.shard"
"#;

    fn parse(extra: &str) -> Result<NodeConfig, String> {
        let cfg: NodeConfig =
            toml::from_str(&format!("{GOOD}{extra}")).map_err(|e| e.to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    #[test]
    fn image_folders_number_classes_by_the_federations_names() {
        use crate::learn::loaders::write_image_folder;
        let tmp = tempfile::tempdir().unwrap();
        write_image_folder(&tmp.path().join("train"), &["dog", "emu"], 3, 4, 4, false);
        write_image_folder(&tmp.path().join("test"), &["emu"], 2, 4, 4, false);
        let mut d = DataSource {
            format: Some(DataFormat::Images),
            train: vec![tmp.path().join("train")],
            test: vec![tmp.path().join("test")],
            ..Default::default()
        };
        d.validate().unwrap();
        let own = d.load().unwrap();
        assert_eq!(own.train.num_classes(), Some(2), "dog 0, emu 1");
        assert_eq!(own.test.class_counts(), [0, 2]);
        d.class_names = Some(["cat", "dog", "emu"].map(String::from).to_vec());
        let named = d.load().unwrap();
        assert_eq!(named.train.class_counts(), [0, 3, 3]);
        assert_eq!(named.test.class_counts(), [0, 0, 2]);
        d.class_names = Some(vec!["dog".into(), "cat".into()]);
        let e = d.load().unwrap_err().to_string();
        assert!(e.contains("\"emu\" is not in data.class_names"), "{e}");
    }

    #[test]
    fn a_csv_silo_reads_text_labels_by_the_federations_class_names() {
        let dir = tempfile::tempdir().unwrap();
        let (train, test) = (dir.path().join("train.csv"), dir.path().join("test.csv"));
        std::fs::write(&train, "age,outcome\n1,mild\n2,healthy\n3,mild\n").unwrap();
        std::fs::write(&test, "age,outcome\n4,mild\n").unwrap();
        let mut d = DataSource {
            format: Some(DataFormat::Csv),
            train: vec![train.clone()],
            test: vec![test],
            class_names: Some(["healthy", "mild", "severe"].map(String::from).to_vec()),
            ..Default::default()
        };
        d.validate().unwrap();
        // "severe" is nowhere in this silo's files, yet it is class 2 here as everywhere.
        let own = d.load().unwrap();
        assert_eq!(own.train.class_counts(), [1, 2, 0]);
        assert_eq!(own.test.class_counts(), [0, 1, 0]);
        // Labels that are class ids are read by id: the names only name them.
        let ids = dir.path().join("ids.csv");
        std::fs::write(&ids, "age,outcome\n1,1\n2,0\n3,1\n").unwrap();
        let by_id = DataSource {
            train: vec![ids.clone()],
            test: vec![ids],
            ..d.clone()
        };
        assert_eq!(by_id.load().unwrap().train.class_counts(), [1, 2, 0]);
        // Without the names, text labels are refused; a label not listed names itself.
        d.class_names = None;
        d.classes = Some(3);
        let e = d.load().unwrap_err().to_string();
        assert!(
            e.contains("\"mild\"") && e.contains("not a class id"),
            "{e}"
        );
        d.class_names = Some(vec!["healthy".into(), "severe".into()]);
        d.classes = None;
        let e = d.load().unwrap_err().to_string();
        assert!(e.contains("\"mild\" is not in data.class_names"), "{e}");
        // Bad lists are refused before anything is read.
        for (names, classes, why) in [
            (vec!["a"], None, "at least 2 names"),
            (vec!["a", "b", "a"], None, "\"a\" twice"),
            (vec!["a", ""], None, "empty name"),
            (
                vec!["a", "b"],
                Some(3),
                "data.classes = 3, but data.class_names lists 2",
            ),
        ] {
            d.class_names = Some(names.into_iter().map(String::from).collect());
            d.classes = classes;
            let e = d.validate().unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        // A shard's silo names its classes by the classes.json beside the shards.
        let cfg_path = dir.path().join("node.toml");
        let shard = GOOD.replace("a.shard", "shards/silo-0.shard");
        std::fs::write(&cfg_path, &shard).unwrap();
        let cfg = NodeConfig::load(&cfg_path).unwrap();
        assert_eq!(cfg.class_names().unwrap(), None);
        std::fs::create_dir(dir.path().join("shards")).unwrap();
        let listed = dir.path().join("shards/classes.json");
        std::fs::write(&listed, r#"["healthy", "mild", "severe"]"#).unwrap();
        let names = cfg.card_data().unwrap().class_names.unwrap();
        assert_eq!(names, ["healthy", "mild", "severe"]);
        std::fs::write(&listed, r#"["healthy", "healthy"]"#).unwrap();
        let e = cfg.class_names().unwrap_err().to_string();
        assert!(e.contains("classes.json") && e.contains("twice"), "{e}");
    }

    #[test]
    fn defaults_are_the_papers() {
        let c = parse("").unwrap();
        assert_eq!(c.federico.neighbours, 3);
        assert_eq!(c.train.lr, 0.01);
        assert_eq!(c.rounds, 100);
    }

    #[test]
    fn the_message_bound_follows_the_model_unless_set() {
        let c = parse("").unwrap();
        assert_eq!(c.max_message_for(335), crate::protocol::message_bound(335));
        assert!(c.max_message_for(335) < 1 << 20);
        assert_eq!(c.max_message(), 256 << 20, "coordinator mode keeps 256 MiB");
        assert_eq!(c.receive_budget_for(335), 24 << 20);
        // ResNet-18: its budget grows with it.
        assert!(c.receive_budget_for(11_000_000) >= 4 * 44_000_000);
        let text = format!("max_message_mib = 3\nreceive_budget_mib = 5\n{GOOD}");
        let c: NodeConfig = toml::from_str(&text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.max_message_for(335), 3 << 20);
        assert_eq!(c.max_message(), 3 << 20);
        assert_eq!(c.receive_budget_for(335), 5 << 20);
    }

    #[test]
    fn bad_values_name_their_field() {
        for (extra, field) in [
            ("[deadlines]\nmodel_s = -1\n", "deadlines.model_s"),
            ("[federico]\nepsilon = 2\n", "epsilon"),
            ("[federico]\nmstep = { minibatch = 0 }\n", "federico.mstep"),
            ("[defences]\nnorm_bound = 0.5\n", "defences.norm_bound"),
            ("[defences]\nnorm_bound = inf\n", "defences.norm_bound"),
            ("[defences]\nbound = 5\n", "bound"),
            ("max_message_mib = 0\n", "max_message_mib"),
            ("receive_budget_mib = 0\n", "receive_budget_mib"),
            ("metrics = \"nowhere\"\n", "metrics"),
            ("colour = 3\n", "colour"),
        ] {
            let e = parse(extra).unwrap_err();
            assert!(e.contains(field), "{extra:?} gave {e}");
        }
        for (data, field) in [
            ("format = \"csv\"", "data.train/data.test"),
            ("shard = \"a\"\nformat = \"idx\"", "either shard or format"),
            (
                "format = \"csv\"\ntrain = [\"a\"]\ntest = [\"b\"]",
                "data.classes",
            ),
            ("", "data needs shard"),
            (
                "shard = \"a\"\nscale = \"s.json\"",
                "a shard's rows were standardized",
            ),
            (
                "format = \"idx\"\ntrain = [\"a\", \"b\"]\ntest = [\"c\", \"d\"]\nscale = \"s.json\"",
                "data.scale is for format \"csv\"",
            ),
        ] {
            let text = GOOD.replace("shard = \"a.shard\"", data);
            let c: NodeConfig = toml::from_str(&text).unwrap();
            let e = c.validate().unwrap_err();
            assert!(e.contains(field), "{data:?} gave {e}");
        }
        // A node runs every M-step (the epoch's sub-step count comes from the manifest).
        let c = parse("[federico]\nmstep = \"epoch\"\n").unwrap();
        assert_eq!(c.federico.mstep(), crate::core::MStep::Epoch);
        let c = parse("[federico]\nmstep = { minibatch = 4 }\n").unwrap();
        assert_eq!(c.federico.mstep(), crate::core::MStep::Minibatch(4));
        let c = parse("[federico]\nmstep = \"local_epoch\"\n").unwrap();
        assert_eq!(c.federico.mstep(), crate::core::MStep::LocalEpoch);
        let bad = format!("listen = [\"tcp:4001\"]\n{GOOD}");
        let c: NodeConfig = toml::from_str(&bad).unwrap();
        assert!(c.validate().unwrap_err().contains("listen"));
        let bad = format!("bootstrap = [\"/ip4/1.2.3.4/tcp/1\"]\n{GOOD}");
        let c: NodeConfig = toml::from_str(&bad).unwrap();
        assert!(c.validate().unwrap_err().contains("/p2p/"));
    }

    #[test]
    fn privacy_is_checked_and_refused_where_it_cannot_hold() {
        let c = parse("[privacy]\nepsilon = 3\n").unwrap();
        let p = c.privacy.unwrap();
        assert_eq!(
            (p.epsilon, p.noise),
            (3.0, None),
            "secret unless it says seeded"
        );
        let c = parse("[privacy]\nnoise = \"seeded\"\n").unwrap();
        assert_eq!(
            c.privacy.unwrap().noise,
            Some(crate::privacy::NoiseSource::Seeded)
        );
        for (extra, why) in [
            ("[privacy]\nepsilon = 0\n", "privacy.epsilon"),
            ("[privacy]\nclip = -1\n", "privacy.clip"),
            ("[privacy]\nnoise = \"loud\"\n", "loud"),
        ] {
            let e = parse(extra).unwrap_err();
            assert!(e.contains(why), "{extra:?} gave {e}");
        }
        // A node that runs until stopped has no plan to calibrate σ to.
        let text = format!("rounds = 0\n{GOOD}[privacy]\nepsilon = 1\n");
        let c: NodeConfig = toml::from_str(&text).unwrap();
        assert!(c.validate().unwrap_err().contains("noise_multiplier"));
        let text = format!("rounds = 0\n{GOOD}[privacy]\nnoise_multiplier = 2\n");
        let c: NodeConfig = toml::from_str(&text).unwrap();
        c.validate().unwrap();
        // The owner's own sub-steps of a local epoch are releases no ledger plans.
        let e = parse("[federico]\nmstep = \"local_epoch\"\n[privacy]\nepsilon = 4\n").unwrap_err();
        assert!(e.contains("local_epoch"), "{e}");
    }

    #[test]
    fn a_csv_silo_applies_the_federations_scale_to_both_parts() {
        let dir = tempfile::tempdir().unwrap();
        let csv = "age,pressure,label\n40,120,0\n60,140,1\n";
        std::fs::write(dir.path().join("train.csv"), csv).unwrap();
        std::fs::write(
            dir.path().join("test.csv"),
            "age,pressure,label\n50,130,1\n",
        )
        .unwrap();
        let scale = r#"{"mean": [50.0, 130.0], "std": [10.0, 20.0]}"#;
        std::fs::write(dir.path().join("scale.json"), scale).unwrap();
        let data = "format = \"csv\"\ntrain = [\"train.csv\"]\ntest = [\"test.csv\"]\n\
                    classes = 2\nscale = \"scale.json\"";
        let text = GOOD.replace("shard = \"a.shard\"", data);
        let path = dir.path().join("node.toml");
        std::fs::write(&path, &text).unwrap();
        // Relative to the config, as every path in it.
        let cfg = NodeConfig::load(&path).unwrap();
        assert_eq!(
            cfg.data.scale.as_deref(),
            Some(dir.path().join("scale.json").as_path())
        );
        let fitted = cfg.feature_scale().unwrap().unwrap();
        assert_eq!((fitted.mean[1], fitted.std[1]), (130.0, 20.0));
        // A shard's silo finds the scale.json that init and partition write beside the shards,
        // and one without it has none.
        let shard = GOOD.replace("a.shard", "shards/silo-0.shard");
        std::fs::write(&path, &shard).unwrap();
        let beside = NodeConfig::load(&path).unwrap();
        assert_eq!(beside.feature_scale().unwrap(), None);
        std::fs::create_dir(dir.path().join("shards")).unwrap();
        std::fs::write(dir.path().join("shards/scale.json"), scale).unwrap();
        assert_eq!(beside.feature_scale().unwrap(), Some(fitted.clone()));
        let d = cfg.data.load().unwrap();
        assert_eq!(d.train.features, vec![-1.0, -0.5, 1.0, 0.5]);
        assert_eq!(d.test.features, vec![0.0, 0.0]);
        // A scale for other columns, or a broken one, stops the node with the file's name.
        for (bad, why) in [
            (r#"{"mean": [50.0], "std": [10.0]}"#, "rows of 2 features"),
            (r#"{"mean": [50.0, 1.0], "std": [10.0, 0.0]}"#, "std 0"),
            (r#"{"mean": [50.0, 1.0]}"#, "not a feature scale"),
        ] {
            std::fs::write(dir.path().join("scale.json"), bad).unwrap();
            let e = cfg.data.load().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
