//! `[coordinated]` in a node config: the coordinator algorithm a silo runs instead of FedeRiCo,
//! its coordinator, the local recipe's settings and what the silo does while the coordinator is
//! gone.
//! Owns: the section's schema and defaults, and what FedCollab's settings must be over the
//! network ([`fedcollab_over_network`]).
//! Must not: run anything ([`crate::net::coordinated`] does).

use crate::coord::fedcollab::{Distance, FedCollabConfig};
use crate::coord::hcct::HcctConfig;
use crate::scenario::{FeddiscoConfig, FedsacConfig};
use serde::{Deserialize, Serialize};

/// `[coordinated]` in a node config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatedConfig {
    /// The algorithm: `"feddisco"`, `"hcct"` or `"fedsac"`.
    pub mode: String,
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
    /// What a node does while its coordinator is gone (FedDisco, HCCT, FedSaC): `"keep"`
    /// trains on from the last model it has and reattaches when the coordinator answers;
    /// `"federico"` switches, after `fallback_after` rounds in a row without it, to FedeRiCo
    /// with the other silos for the rest of its rounds (for good: it does not reattach).
    #[serde(default = "default_fallback")]
    pub fallback: String,
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

fn default_fallback() -> String {
    "keep".into()
}

fn default_fallback_after() -> u64 {
    3
}

/// `[fedcollab]` as the network runs it: valid, and with the discriminator protocol (the
/// label-histogram distance is a simulator debug mode that would reveal label histograms).
pub(crate) fn fedcollab_over_network(fc: &FedCollabConfig) -> Result<(), String> {
    fc.validate()?;
    if fc.distance != Distance::Discriminator {
        return Err(
            "distance = \"label_tv\" is a simulator debug mode (it reveals label histograms); \
             over the network FedCollab measures distances with the discriminator protocol"
                .into(),
        );
    }
    Ok(())
}
