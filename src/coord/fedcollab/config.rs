//! FedCollab's hyperparameters (spec `docs/specs/fedcollab.md` §3.2, §4, §8 items 7-9):
//! the `[fedcollab]` section of a scenario with the official scripts' defaults, its
//! validation, and the distance measure it picks.
//! Owns: [`FedCollabConfig`] and [`Distance`].
//! Must not: solve, measure or train anything (`solver.rs`, `distance.rs`, the drivers).

use super::SolverConfig;
use serde::{Deserialize, Serialize};
/// How pairwise distances are measured (spec §3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Distance {
    /// The paper's C-divergence estimate: a discriminator trained federatedly by each pair
    /// (Algorithm 1, spec §3.2). The default.
    Discriminator,
    /// Total variation between training label histograms. **Debug/test only** (spec §8 item 12):
    /// exact for pure label shift, blind to feature and concept shift, and it reveals label
    /// histograms, so it is never the default.
    LabelTv,
}

/// `[fedcollab]`: FedCollab's hyperparameters; defaults are the official scripts' (spec §3.2,
/// §4, §8 items 7-9). The FL inside coalitions uses the scenario's `[train]` settings, like the
/// FedAvg baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FedCollabConfig {
    /// C, the model-capacity constant of the generalisation term (spec §2; paper: 10 for
    /// FMNIST and CIFAR-10, 8 for CIFAR-100). In absolute-sample units (spec §8 item 7).
    pub capacity: f64,
    /// Random restarts of Algorithm 2 (spec §4; code: 100).
    pub restarts: usize,
    /// Passes per restart before giving up on convergence (spec §4; code: 100).
    pub max_passes: usize,
    /// How distances are measured.
    pub distance: Distance,
    /// Hidden width of the discriminator MLP (spec §3.2: 200; economy mode: 64).
    pub disc_hidden: usize,
    /// Plain-SGD learning rate of the discriminator (spec §3.2: 0.01 for FMNIST and CIFAR-10).
    pub disc_lr: f64,
    /// Discriminator mini-batch (spec §3.2: 32).
    pub disc_batch_size: usize,
    /// SGD steps each side takes per round before averaging (spec §3.2: 1).
    pub disc_local_steps: usize,
    /// Evaluate every this many rounds (spec §3.2: 10; first evaluation after round 0).
    pub disc_eval_every: usize,
    /// Stop after this many evaluations without a strict improvement (spec §3.2: 10; 0 never
    /// stops early).
    pub disc_patience: usize,
    /// Most rounds per pair (spec §3.2: 2000).
    pub disc_max_rounds: usize,
}

impl Default for FedCollabConfig {
    fn default() -> Self {
        Self {
            capacity: 10.0,
            restarts: 100,
            max_passes: 100,
            distance: Distance::Discriminator,
            disc_hidden: 200,
            disc_lr: 0.01,
            disc_batch_size: 32,
            disc_local_steps: 1,
            disc_eval_every: 10,
            disc_patience: 10,
            disc_max_rounds: 2000,
        }
    }
}

impl FedCollabConfig {
    /// Checks every field; the error names the field, the allowed range and the value.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.capacity.is_finite() && self.capacity >= 0.0) {
            return Err(format!(
                "capacity must be a finite number >= 0, got {}",
                self.capacity
            ));
        }
        if !(self.disc_lr.is_finite() && self.disc_lr > 0.0) {
            return Err(format!("disc_lr must be positive, got {}", self.disc_lr));
        }
        for (name, v) in [
            ("restarts", self.restarts),
            ("max_passes", self.max_passes),
            ("disc_hidden", self.disc_hidden),
            ("disc_batch_size", self.disc_batch_size),
            ("disc_local_steps", self.disc_local_steps),
            ("disc_eval_every", self.disc_eval_every),
            ("disc_max_rounds", self.disc_max_rounds),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1, got 0"));
            }
        }
        Ok(())
    }

    /// The solver knobs of this section.
    pub fn solver(&self) -> SolverConfig {
        SolverConfig {
            restarts: self.restarts,
            max_passes: self.max_passes,
        }
    }
}
