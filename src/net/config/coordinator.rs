//! A coordinator's config file (`federico coordinator --config FILE`, e.g.
//! `node-config/coordinator.toml`).
//! Owns: the schema, its defaults, validation (per algorithm: what its coordinator needs) and
//! resolving relative paths against the file's directory.
//! Must not: build the algorithm's server or start anything ([`crate::net::coordinator`] does).

use super::algorithm::{CoordinatedAlgorithm, SettingsError, check_settings, read_algorithm};
use crate::coord::fedcollab::FedCollabConfig;
use crate::coord::hcct::HcctConfig;
use crate::scenario::{FeddiscoConfig, FedsacConfig, ModelConfig};
use serde::{Deserialize, Deserializer, Serialize};
use std::path::{Path, PathBuf};

/// The coordinator's config file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// Its keypair (`federico keygen`).
    pub key: PathBuf,
    /// The federation's manifest; the coordinator is a member under `name`.
    pub manifest: PathBuf,
    /// Its name in the manifest.
    pub name: String,
    /// Listen addresses.
    pub listen: Vec<String>,
    /// Checkpoint and round log.
    pub state_dir: PathBuf,
    /// Rounds to run.
    pub rounds: u64,
    /// The algorithm (`"feddisco"`, `"hcct"`, `"fedsac"` or `"fedcollab"`; default FedDisco).
    #[serde(
        default = "default_algorithm",
        deserialize_with = "read_algorithm_field"
    )]
    pub algorithm: CoordinatedAlgorithm,
    /// FedDisco's parameters (a, b, metric, normalise; the local recipe is the nodes').
    #[serde(default)]
    pub feddisco: FeddiscoConfig,
    /// HCCT's parameters (α, the learning-rate schedule the pseudo-gradients are divided by,
    /// round-0 and one-shot schedules; the nodes hold the same `[hcct]` for their training).
    #[serde(default)]
    pub hcct: HcctConfig,
    /// FedSaC's parameters (α, β, α's cutoff, principal angles, cohort size, which model is
    /// scored; the local recipe — steps, lr, λ, k, feature samples — is the nodes').
    #[serde(default)]
    pub fedsac: FedsacConfig,
    /// FedCollab's parameters: C, restarts and passes of the solver (the discriminator's
    /// settings are the nodes'; the coordinator only solves).
    #[serde(default)]
    pub fedcollab: FedCollabConfig,
    /// τ: how long a round waits for updates once it opened, in seconds.
    #[serde(default = "default_deadline")]
    pub update_deadline_s: f64,
    /// A member whose absence made a round wait its full τ is not waited for during the next
    /// `excuse_rounds` rounds (twice as many after each further time, up to 64 times as many);
    /// its updates still count when they come before the round closes. 0 waits for every
    /// member, every round (one silent member then costs every round τ).
    #[serde(default = "default_excuse_rounds")]
    pub excuse_rounds: u64,
    /// The run seed (the initial model is silo 0's under it).
    #[serde(default)]
    pub seed: u64,
    /// The model, as in scenario files.
    #[serde(default)]
    pub model: ModelConfig,
    /// One sample's shape (e.g. `[1, 28, 28]`).
    pub sample_shape: Vec<usize>,
    /// Number of classes.
    pub classes: usize,
    /// Nodes expected: a round closes before the deadline only once this many registered and
    /// all of them sent (0: whoever registered; FedDisco only). HCCT needs it: its silos are
    /// manifest members 0..nodes, and no round starts before all of them registered.
    #[serde(default)]
    pub nodes: usize,
    /// Largest message accepted, MiB.
    #[serde(default = "default_max_mib")]
    pub max_message_mib: u64,
    /// FedCollab, HCCT and FedSaC: how long the run waits for every silo, in seconds from the
    /// first join. Once it has passed, the run starts with the silos that joined (FedCollab:
    /// at least 2, its distance plan goes out to them; HCCT and FedSaC: partitions and
    /// cohorts among them); a silo that joins later trains alone (FedCollab's singleton). Unset:
    /// the run waits for every silo (the papers' setting, and the one `simulate` reproduces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join_s: Option<f64>,
}

fn default_algorithm() -> CoordinatedAlgorithm {
    CoordinatedAlgorithm::Feddisco
}

fn read_algorithm_field<'de, D: Deserializer<'de>>(d: D) -> Result<CoordinatedAlgorithm, D::Error> {
    read_algorithm(d, "algorithm")
}
fn default_excuse_rounds() -> u64 {
    100
}

fn default_deadline() -> f64 {
    30.0
}
fn default_max_mib() -> u64 {
    crate::protocol::DEFAULT_MAX_MESSAGE >> 20
}

/// A coordinator config that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorConfigError {
    /// The file could not be read.
    #[error("reading {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error (in the message, so not a `source`: `{:#}` would repeat it).
        error: std::io::Error,
    },
    /// The file is not TOML of this schema (the message names the field).
    #[error("{}: {error}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The underlying error (in the message).
        error: toml::de::Error,
    },
    /// A value is out of range.
    #[error("{}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: CoordinatorInvalid,
    },
}

/// What is wrong with a coordinator config's values; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorInvalid {
    /// The algorithm's own section.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// `nodes` is below what the algorithm needs.
    #[error(
        "algorithm = \"{algorithm}\" needs nodes = the number of silos{}",
        if algorithm.min_nodes() > 1 { format!(" (at least {})", algorithm.min_nodes()) } else { String::new() }
    )]
    TooFewNodes {
        /// The algorithm.
        algorithm: CoordinatedAlgorithm,
    },
    /// `join_s` with an algorithm that has no joining.
    #[error(
        "join_s is for fedcollab, hcct and fedsac; FedDisco waits for nobody (a round closes \
         with the silos registered)"
    )]
    JoinWithoutJoining,
    /// `join_s` is not a positive number of seconds.
    #[error("join_s must be > 0 seconds, got {0}")]
    JoinS(f64),
    /// `update_deadline_s` is not a positive number of seconds.
    #[error("update_deadline_s must be > 0")]
    UpdateDeadline,
    /// `classes` is below 2.
    #[error("classes must be ≥ 2")]
    Classes,
}

impl CoordinatorConfig {
    /// Reads and validates a config; relative paths are resolved against the file's folder.
    pub fn load(path: &Path) -> Result<Self, CoordinatorConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| CoordinatorConfigError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        let mut c: Self = toml::from_str(&text).map_err(|error| CoordinatorConfigError::Parse {
            path: path.to_path_buf(),
            error,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        for p in [&mut c.key, &mut c.manifest, &mut c.state_dir] {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        c.validate()
            .map_err(|reason| CoordinatorConfigError::Invalid {
                path: path.to_path_buf(),
                reason,
            })?;
        Ok(c)
    }

    /// Checks every value against the algorithm's needs.
    pub fn validate(&self) -> Result<(), CoordinatorInvalid> {
        let algorithm = self.algorithm;
        check_settings(algorithm, &self.hcct, &self.fedsac, &self.fedcollab)?;
        if self.nodes < algorithm.min_nodes() {
            return Err(CoordinatorInvalid::TooFewNodes { algorithm });
        }
        if let Some(j) = self.join_s {
            if !algorithm.has_joining() {
                return Err(CoordinatorInvalid::JoinWithoutJoining);
            }
            if !(j.is_finite() && j > 0.0) {
                return Err(CoordinatorInvalid::JoinS(j));
            }
        }
        if !(self.update_deadline_s.is_finite() && self.update_deadline_s > 0.0) {
            return Err(CoordinatorInvalid::UpdateDeadline);
        }
        if self.classes < 2 {
            return Err(CoordinatorInvalid::Classes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(edit: impl Fn(String) -> String) -> Result<CoordinatorConfig, CoordinatorConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("node-config/coordinator.toml"),
        )
        .unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, edit(text)).unwrap();
        CoordinatorConfig::load(&path)
    }

    #[test]
    fn the_example_loads_and_bad_settings_are_named() {
        let c = load(|t| t).unwrap();
        assert_eq!(c.hcct.alpha, crate::coord::hcct::Alpha::Constant(25.0));
        let e = load(|t| t.replace(r#"algorithm = "hcct""#, r#"algorithm = "fedprox""#))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("allowed: \"feddisco\", \"hcct\", \"fedsac\", \"fedcollab\""),
            "{e}"
        );
        let fedcollab =
            |t: String| t.replace(r#"algorithm = "hcct""#, r#"algorithm = "fedcollab""#);
        assert_eq!(load(fedcollab).unwrap().fedcollab.capacity, 10.0);
        let e = load(|t| fedcollab(t).replace("max_passes = 100", r#"distance = "label_tv""#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("label_tv") && e.contains("discriminator"), "{e}");
        let e = load(|t| fedcollab(t).replace("nodes = 3 ", "nodes = 1 "))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 2"), "{e}");
        let e = load(|t| t.replace("nodes = 3 ", "nodes = 0 "))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs nodes"), "{e}");
        let e = load(|t| t.replace("one_shot = false", "efficient = true"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hcct.efficient"), "{e}");
        let e = load(|t| t.replace("alpha = 25 ", "alpha = -1 "))
            .unwrap_err()
            .to_string();
        assert!(e.contains("alpha"), "{e}");
        let c = load(|t| fedcollab(t).replace("# join_s = 600 ", "join_s = 600 ")).unwrap();
        assert_eq!(c.join_s, Some(600.0));
        let e = load(|t| fedcollab(t).replace("# join_s = 600 ", "join_s = 0 "))
            .unwrap_err()
            .to_string();
        assert!(e.contains("join_s must be > 0"), "{e}");
        let hcct = load(|t| t.replace("# join_s = 600 ", "join_s = 600 ")).unwrap();
        assert_eq!(
            (hcct.algorithm.as_str(), hcct.join_s),
            ("hcct", Some(600.0))
        );
        let fedsac = |t: String| t.replace(r#"algorithm = "hcct""#, r#"algorithm = "fedsac""#);
        let c = load(|t| fedsac(t).replace("# join_s = 600 ", "join_s = 0.5 ")).unwrap();
        assert_eq!(c.join_s, Some(0.5));
        let e = load(|t| {
            t.replace(r#"algorithm = "hcct""#, r#"algorithm = "feddisco""#)
                .replace("# join_s = 600 ", "join_s = 600 ")
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("join_s is for fedcollab, hcct and fedsac"),
            "{e}"
        );
    }
}
