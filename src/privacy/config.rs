//! `[privacy]`: a silo's differential-privacy settings (DP-SGD and its budget).
//!
//! Owns: the settings, their defaults and their validation.
//! Must not: apply them (that is `silo`) or account (that is [`super::ledger`]).

use serde::{Deserialize, Serialize};

/// `[privacy]`: record-level (ε, δ)-DP for every silo's rows (spec `privacy.md` §2). Every
/// gradient a silo computes from its rows is a DP-SGD release (Poisson sample of rate
/// batch / rows, per-example gradients clipped jointly across the step's models to `clip`,
/// Gaussian noise of standard deviation `noise_multiplier · clip`), and every E-step loss a
/// noisy clipped mean; each is recorded in the silo's ledger, and a silo whose next release
/// would exceed `epsilon` releases nothing more from its rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrivacyConfig {
    /// The budget ε against everyone together, per silo.
    pub epsilon: f64,
    /// δ. Absent: 1 / the silo's training rows.
    pub delta: Option<f64>,
    /// C: the L2 norm each example's gradients (on all the step's models together) are
    /// clipped to.
    pub clip: f64,
    /// σ: noise standard deviation over the clip norm, for gradients and losses alike.
    /// Absent: each silo calibrates it ([`super::rdp::calibrate`]) so that the releases the
    /// run plans (every round's E-step losses and gradient steps) spend exactly `epsilon`.
    pub noise_multiplier: Option<f64>,
    /// Each example's loss is clipped to [0, `loss_clip`] before the E-step's noisy mean.
    pub loss_clip: f64,
    /// Where the noise and the Poisson samples come from. Absent: `"secret"` on a node,
    /// `"seeded"` in `simulate` (and `swarm`, a simulation of nodes).
    pub noise: Option<NoiseSource>,
    /// How a step's clip norm is shared among its models: `"joint"` (the textbook joint clip)
    /// or `"weights"` (each model's norm proportional to the silo's weight on it: budget-aware
    /// collaboration, [`super::split`]). The same ε either way.
    pub clip_split: super::ClipSplit,
}

/// Where a silo's DP noise and Poisson samples come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NoiseSource {
    /// The operating system's randomness: secret, and not reproducible. What a real
    /// federation needs: noise a member could regenerate protects nothing.
    Secret,
    /// A stream seeded by the run seed and the silo: reproducible (the simulator and a swarm's
    /// nodes draw the same), and so known to anyone who knows the seed.
    Seeded,
}

impl Default for PrivacyConfig {
    fn default() -> Self {
        Self {
            epsilon: 8.0,
            delta: None,
            clip: 1.0,
            noise_multiplier: None,
            loss_clip: 5.0,
            noise: None,
            clip_split: super::ClipSplit::Joint,
        }
    }
}

impl PrivacyConfig {
    /// The first field out of range, named.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "privacy.{name} must be positive and finite, got {v}"
                ))
            }
        };
        positive("epsilon", self.epsilon)?;
        positive("clip", self.clip)?;
        if let Some(s) = self.noise_multiplier {
            positive("noise_multiplier", s)?;
        }
        positive("loss_clip", self.loss_clip)?;
        if let Some(d) = self.delta
            && !(d > 0.0 && d < 1.0)
        {
            return Err(format!("privacy.delta must be in (0, 1), got {d}"));
        }
        Ok(())
    }

    /// σ for a silo whose `planned` releases sample at rate `q`, with budget `budget`: the
    /// configured one, or the smallest that fits (10⁴ where none does; the budget then runs
    /// out early).
    pub fn noise_for(&self, budget: super::Budget, q: f64, planned: u64) -> f64 {
        self.noise_multiplier.unwrap_or_else(|| {
            let orders = super::rdp::default_orders();
            super::rdp::calibrate(&orders, budget.epsilon, budget.delta, q, planned.max(1))
                .unwrap_or(1e4)
        })
    }

    /// δ for a silo of `rows` training rows.
    pub fn delta_for(&self, rows: usize) -> f64 {
        self.delta.unwrap_or(1.0 / rows.max(2) as f64)
    }
}
