//! A coordinator's config file (`federico coordinator --config FILE`, e.g.
//! `node-config/coordinator.toml`).
//! Owns: the schema, its defaults, validation (per algorithm: what its coordinator needs) and
//! resolving relative paths against the file's directory.
//! Must not: build the algorithm's server or start anything ([`crate::net::coordinator`] does).

use crate::coord::fedcollab::FedCollabConfig;
use crate::coord::hcct::HcctConfig;
use crate::coord::hcct_server::HcctServer;
use crate::scenario::{FeddiscoConfig, FedsacConfig, ModelConfig};
use serde::{Deserialize, Serialize};
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
    /// `"feddisco"`, `"hcct"`, `"fedsac"` or `"fedcollab"`.
    #[serde(default = "feddisco_name")]
    pub algorithm: String,
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

fn feddisco_name() -> String {
    "feddisco".into()
}
fn default_deadline() -> f64 {
    30.0
}
fn default_max_mib() -> u64 {
    crate::wire::DEFAULT_MAX_MESSAGE >> 20
}

impl CoordinatorConfig {
    /// Reads and validates a config; relative paths are resolved against the file's folder.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let mut c: Self =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        for p in [&mut c.key, &mut c.manifest, &mut c.state_dir] {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        match c.algorithm.as_str() {
            "feddisco" => {}
            "hcct" => {
                HcctServer::check_config(&c.hcct)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                if c.nodes == 0 {
                    anyhow::bail!(
                        "{}: algorithm = \"hcct\" needs nodes = the number of silos",
                        path.display()
                    );
                }
            }
            "fedsac" => {
                c.fedsac
                    .validate()
                    .map_err(|e| anyhow::anyhow!("{}: fedsac.{e}", path.display()))?;
                if c.nodes == 0 {
                    anyhow::bail!(
                        "{}: algorithm = \"fedsac\" needs nodes = the number of silos",
                        path.display()
                    );
                }
            }
            "fedcollab" => {
                super::coordinated::fedcollab_over_network(&c.fedcollab)
                    .map_err(|e| anyhow::anyhow!("{}: fedcollab.{e}", path.display()))?;
                if c.nodes < 2 {
                    anyhow::bail!(
                        "{}: algorithm = \"fedcollab\" needs nodes = the number of silos (at least 2)",
                        path.display()
                    );
                }
            }
            other => anyhow::bail!(
                "{}: algorithm = {other:?}; allowed: \"feddisco\", \"hcct\", \"fedsac\", \"fedcollab\"",
                path.display()
            ),
        }
        if let Some(j) = c.join_s {
            if c.algorithm == "feddisco" {
                anyhow::bail!(
                    "{}: join_s is for fedcollab, hcct and fedsac; FedDisco waits for nobody \
                     (a round closes with the silos registered)",
                    path.display()
                );
            }
            if !(j.is_finite() && j > 0.0) {
                anyhow::bail!("{}: join_s must be > 0 seconds, got {j}", path.display());
            }
        }
        if !(c.update_deadline_s.is_finite() && c.update_deadline_s > 0.0) {
            anyhow::bail!("{}: update_deadline_s must be > 0", path.display());
        }
        if c.classes < 2 {
            anyhow::bail!("{}: classes must be ≥ 2", path.display());
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(edit: impl Fn(String) -> String) -> anyhow::Result<CoordinatorConfig> {
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
