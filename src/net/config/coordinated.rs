//! `[coordinated]` in a node config: the coordinator algorithm a silo runs instead of FedeRiCo,
//! its coordinator, the local recipe's settings and what the silo does while the coordinator is
//! gone.
//! Owns: the section's schema and defaults, and checking it into a [`Coordinated`] (the only
//! form the coordinated node runs from), with messages naming the field and the allowed values.
//! Must not: run anything ([`crate::net::coordinated`] does).

use super::algorithm::{CoordinatedAlgorithm, SettingsError, check_settings, read_algorithm};
use crate::coord::fedcollab::FedCollabConfig;
use crate::coord::hcct::HcctConfig;
use crate::scenario::{FeddiscoConfig, FedsacConfig};
use libp2p::PeerId;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;
use std::time::Duration;

/// `[coordinated]` in a node config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatedConfig {
    /// The algorithm (`"feddisco"`, `"hcct"`, `"fedsac"` or `"fedcollab"`).
    #[serde(deserialize_with = "read_mode")]
    pub mode: CoordinatedAlgorithm,
    /// The coordinator's peer ID; its addresses come from the manifest.
    pub coordinator: String,
    /// FedDisco's local recipe (epochs, lr, momentum, weight decay) and metric.
    #[serde(default)]
    pub feddisco: FeddiscoConfig,
    /// HCCT's local recipe (E epochs of plain SGD at η_t = lr · lr_decay^t); the same
    /// `[hcct]` as the coordinator's.
    #[serde(default)]
    pub hcct: HcctConfig,
    /// FedSaC's local recipe (steps, lr, momentum, weight decay, λ and its sign, k, feature
    /// samples); the same `[fedsac]` as the coordinator's.
    #[serde(default)]
    pub fedsac: FedsacConfig,
    /// FedCollab's discriminator protocol (hidden width, lr, batch, steps, evaluation
    /// schedule, patience, round cap); the same `[fedcollab]` as the coordinator's. The FL
    /// inside the coalition uses the node's `[train]`, like the FedAvg baseline.
    #[serde(default)]
    pub fedcollab: FedCollabConfig,
    /// How long a fetch of the next global may take before the node falls back to its own
    /// model for the round, in seconds.
    #[serde(default = "default_fetch_s")]
    pub fetch_s: f64,
    /// FedCollab: how long a silo that reported its distances waits for its coalition before
    /// training alone (asking again every round), in seconds.
    #[serde(default = "default_structure_s")]
    pub structure_s: f64,
    /// FedCollab: a coalition member whose model did not come in a round is not waited for
    /// during the next `excuse_rounds` rounds (twice as many after each further time, up to 64
    /// times as many); its model still counts when it comes while the others are pulled. 0
    /// waits for every member, every round (one silent member then costs every round
    /// `fetch_s`).
    #[serde(default = "default_excuse_rounds")]
    pub excuse_rounds: u64,
    /// What a node does while its coordinator is gone (FedDisco, HCCT, FedSaC): `"keep"`
    /// trains on from the last model it has and reattaches when the coordinator answers;
    /// `"federico"` switches, after `fallback_after` rounds in a row without it, to FedeRiCo
    /// with the other silos for the rest of its rounds (for good: it does not reattach).
    #[serde(default, deserialize_with = "read_fallback")]
    pub fallback: Fallback,
    /// Rounds in a row without the coordinator before `fallback = "federico"` switches.
    #[serde(default = "default_fallback_after")]
    pub fallback_after: u64,
}

fn default_fetch_s() -> f64 {
    20.0
}

fn default_structure_s() -> f64 {
    300.0
}

fn default_excuse_rounds() -> u64 {
    100
}

fn default_fallback_after() -> u64 {
    3
}

fn read_mode<'de, D: Deserializer<'de>>(d: D) -> Result<CoordinatedAlgorithm, D::Error> {
    read_algorithm(d, "[coordinated] mode")
}

/// What a coordinated node does while its coordinator is gone (`[coordinated] fallback`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// Train on from the last model it has; reattach when the coordinator answers.
    #[default]
    Keep,
    /// After `fallback_after` rounds in a row without the coordinator, run the rest of the
    /// rounds as FedeRiCo with the other silos (for good).
    Federico,
}

impl Fallback {
    /// Every one, in the order error messages list them.
    const ALL: [Self; 2] = [Self::Keep, Self::Federico];
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fallback::Keep => "keep",
            Fallback::Federico => "federico",
        })
    }
}

/// What `fallback` allows, for the messages of an unknown value and of `"federico"` with
/// FedCollab.
const FALLBACK_ALLOWED: &str = "allowed: \"keep\", and \"federico\" for feddisco, hcct and \
     fedsac (FedCollab's silos need no coordinator once they hold their coalition)";

fn read_fallback<'de, D: Deserializer<'de>>(d: D) -> Result<Fallback, D::Error> {
    let name = String::deserialize(d)?;
    Fallback::ALL
        .into_iter()
        .find(|f| f.to_string() == name)
        .ok_or_else(|| {
            D::Error::custom(format!(
                "[coordinated] fallback = {name:?}; {FALLBACK_ALLOWED}"
            ))
        })
}

/// A `[coordinated]` section the node cannot run; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatedError {
    /// The algorithm's own section. (The causes below are in the messages, so they are not
    /// `source`s: `{:#}` would print them twice.)
    #[error("[coordinated] {0}")]
    Settings(SettingsError),
    /// `coordinator` is not a peer ID.
    #[error("[coordinated] coordinator: {0}")]
    Coordinator(libp2p::identity::ParseError),
    /// `fetch_s` is not a positive number of seconds.
    #[error("[coordinated] fetch_s must be > 0, got {0}")]
    FetchS(f64),
    /// `fallback = "federico"` with `fallback_after = 0`.
    #[error("[coordinated] fallback_after must be at least 1 round")]
    FallbackAfter,
    /// `fallback = "federico"` with FedCollab.
    #[error("[coordinated] fallback = \"{fallback}\"; {}", FALLBACK_ALLOWED)]
    FallbackFedcollab {
        /// The value given.
        fallback: Fallback,
    },
    /// `structure_s` is not a number of seconds >= 0.
    #[error("[coordinated] structure_s must be >= 0, got {0}")]
    StructureS(f64),
}

impl CoordinatedConfig {
    /// Checks every field into the form the node runs from.
    pub fn check(&self) -> Result<Coordinated, CoordinatedError> {
        check_settings(self.mode, &self.hcct, &self.fedsac, &self.fedcollab)
            .map_err(CoordinatedError::Settings)?;
        let coordinator: PeerId = self
            .coordinator
            .parse()
            .map_err(CoordinatedError::Coordinator)?;
        if !(self.fetch_s.is_finite() && self.fetch_s > 0.0) {
            return Err(CoordinatedError::FetchS(self.fetch_s));
        }
        match self.fallback {
            Fallback::Keep => {}
            Fallback::Federico if self.mode == CoordinatedAlgorithm::Fedcollab => {
                return Err(CoordinatedError::FallbackFedcollab {
                    fallback: self.fallback,
                });
            }
            Fallback::Federico if self.fallback_after == 0 => {
                return Err(CoordinatedError::FallbackAfter);
            }
            Fallback::Federico => {}
        }
        if !(self.structure_s.is_finite() && self.structure_s >= 0.0) {
            return Err(CoordinatedError::StructureS(self.structure_s));
        }
        Ok(Coordinated {
            config: self.clone(),
            coordinator,
        })
    }
}

/// `[coordinated]` once checked ([`CoordinatedConfig::check`] is the only way to one): every
/// value in range, the coordinator's peer ID parsed.
#[derive(Clone, Debug)]
pub struct Coordinated {
    config: CoordinatedConfig,
    coordinator: PeerId,
}

impl Coordinated {
    /// The algorithm.
    pub fn mode(&self) -> CoordinatedAlgorithm {
        self.config.mode
    }
    /// The coordinator's peer ID.
    pub fn coordinator(&self) -> PeerId {
        self.coordinator
    }
    /// How long a fetch of the round's model may take (`fetch_s`).
    pub fn fetch(&self) -> Duration {
        Duration::from_secs_f64(self.config.fetch_s)
    }
    /// FedCollab: how long to wait for the coalition before training alone (`structure_s`).
    pub fn structure_wait(&self) -> Duration {
        Duration::from_secs_f64(self.config.structure_s)
    }
    /// FedCollab: a silent coalition member's first excuse, in rounds (0: none).
    pub fn excuse_rounds(&self) -> u64 {
        self.config.excuse_rounds
    }
    /// `fallback = "federico"`: the rounds in a row without the coordinator after which the
    /// node switches to FedeRiCo (at least 1); `None` for `"keep"`.
    pub fn federico_after(&self) -> Option<u64> {
        (self.config.fallback == Fallback::Federico).then_some(self.config.fallback_after)
    }
    /// The section as written (the algorithms' settings).
    pub fn config(&self) -> &CoordinatedConfig {
        &self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh key's peer ID, as a config names its coordinator.
    fn peer() -> String {
        libp2p::identity::Keypair::generate_ed25519()
            .public()
            .to_peer_id()
            .to_string()
    }

    fn parse(extra: &str) -> Result<Coordinated, String> {
        parse_with(&peer(), extra)
    }

    fn parse_with(peer: &str, extra: &str) -> Result<Coordinated, String> {
        let text = format!("mode = \"hcct\"\ncoordinator = \"{peer}\"\n{extra}");
        let cc: CoordinatedConfig = toml::from_str(&text).map_err(|e| e.to_string())?;
        cc.check().map_err(|e| e.to_string())
    }

    #[test]
    fn a_section_checks_into_what_the_node_runs_from() {
        let peer = peer();
        let c = parse_with(
            &peer,
            "fallback = \"federico\"\nfallback_after = 2\nfetch_s = 4",
        )
        .unwrap();
        assert_eq!(c.mode(), CoordinatedAlgorithm::Hcct);
        assert_eq!(c.coordinator().to_string(), peer);
        assert_eq!(c.federico_after(), Some(2));
        assert_eq!(c.fetch(), Duration::from_secs(4));
        assert_eq!(parse("").unwrap().federico_after(), None);
        // Written back, it reads the same.
        let cc = parse("fallback = \"federico\"").unwrap().config().clone();
        let again: CoordinatedConfig = toml::from_str(&toml::to_string(&cc).unwrap()).unwrap();
        assert_eq!(again, cc);
    }

    #[test]
    fn bad_values_name_their_field_and_what_is_allowed() {
        let bad_mode = format!("mode = \"fedprox\"\ncoordinator = \"{}\"\n", peer());
        let e = toml::from_str::<CoordinatedConfig>(&bad_mode)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "[coordinated] mode = \"fedprox\"; allowed: \"feddisco\", \"hcct\", \"fedsac\", \"fedcollab\""
            ),
            "{e}"
        );
        for (extra, says) in [
            (
                "fallback = \"later\"",
                "fallback = \"later\"; allowed: \"keep\"",
            ),
            (
                "fallback = \"federico\"\nfallback_after = 0",
                "fallback_after",
            ),
            ("fetch_s = 0", "fetch_s must be > 0"),
            ("structure_s = -1", "structure_s must be >= 0"),
            ("[hcct]\nefficient = true", "hcct.efficient"),
        ] {
            let e = parse(extra).unwrap_err();
            assert!(e.contains(says), "{extra:?} gave {e}");
        }
        let collab = format!(
            "mode = \"fedcollab\"\ncoordinator = \"{}\"\nfallback = \"federico\"",
            peer()
        );
        let cc: CoordinatedConfig = toml::from_str(&collab).unwrap();
        let e = cc.check().unwrap_err().to_string();
        assert!(
            e.contains("fallback = \"federico\"; allowed: \"keep\", and \"federico\" for feddisco"),
            "{e}"
        );
        let e = toml::from_str::<CoordinatedConfig>("mode = \"hcct\"\ncoordinator = \"x\"")
            .unwrap()
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("[coordinated] coordinator: "), "{e}");
    }
}
