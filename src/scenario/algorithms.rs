//! The `[feddisco]` and `[fedsac]` sections of a scenario: each algorithm's hyperparameters
//! with the spec's defaults, its local training recipe, and their checks.
//! Owns: [`FeddiscoConfig`], [`FedsacConfig`], [`FedsacScore`] and the shared SGD-recipe check.
//! Must not: compute weights or graphs (`coord::feddisco`, `coord::fedsac`).

use crate::coord::robust::{Aggregator, DEFAULT_TRIM, check_trim};
use serde::{Deserialize, Serialize};
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
    /// A sender's `n_k` counts at most this many times the round's median (0: as reported;
    /// `coord::feddisco::Robust`, insiders' review D3).
    pub size_cap: f64,
    /// An update moves the global at most this many times the round's median move (0: no
    /// bound).
    pub update_clip: f64,
    /// No sender's weight exceeds this many fair shares, 1/K each (0: no cap).
    pub weight_cap: f64,
    /// How the weighted models are combined: `"mean"` (the paper's, default), `"median"`,
    /// `"trimmed_mean"` or `"krum"` (`coord::robust`).
    pub aggregator: Aggregator,
    /// `"trimmed_mean"`: the share of the weight cut from each end; `"krum"`: the share of the
    /// senders taken to be hostile. In [0, 0.5).
    pub trim: f64,
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
            size_cap: DEFAULT_SIZE_CAP,
            update_clip: DEFAULT_UPDATE_CLIP,
            weight_cap: DEFAULT_WEIGHT_CAP,
            aggregator: Aggregator::Mean,
            trim: DEFAULT_TRIM,
        }
    }
}

/// `[feddisco] size_cap`'s default.
const DEFAULT_SIZE_CAP: f64 = 2.0;
/// `[feddisco] update_clip`'s default.
const DEFAULT_UPDATE_CLIP: f64 = 3.0;
/// `[feddisco] weight_cap`'s default: NIID-2's uniform silo, which FedDisco raises to 1.45
/// fair shares, is below it.
const DEFAULT_WEIGHT_CAP: f64 = 1.5;

impl FeddiscoConfig {
    /// The coordinator's defences against members' lies.
    pub fn robust(&self) -> crate::coord::feddisco::Robust {
        let on = |v: f64| (v > 0.0).then_some(v);
        crate::coord::feddisco::Robust {
            size_cap: on(self.size_cap),
            update_clip: on(self.update_clip),
            weight_cap: on(self.weight_cap),
            aggregator: self.aggregator,
            trim: self.trim,
        }
    }

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
        for (name, v) in [
            ("size_cap", self.size_cap),
            ("update_clip", self.update_clip),
            ("weight_cap", self.weight_cap),
        ] {
            if !(v.is_finite() && (v == 0.0 || v >= 1.0)) {
                return Err(format!("{name} must be 0 (off) or at least 1, got {v}"));
            }
        }
        check_trim(self.trim)?;
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
    /// A silo's sample count counts at most this many times the lower median of the round's,
    /// in the size prior (insiders' review: a size lie takes every silo's mixing weight); 0
    /// (the default): as registered.
    pub size_cap: f64,
    /// A sender's model moves from the personalised model it started from at most this many
    /// times the round's median move (a longer move is scaled back along its direction);
    /// default 3 (on the quality suite's 12 Fashion-MNIST columns it moved FedSaC by −0.3 to
    /// +0.2 points, 11 columns by at most 0.1); 0: no bound, the paper's.
    pub update_clip: f64,
    /// How each silo's row of the graph combines the models: `"mean"` (the paper's weighted
    /// sum, default), `"median"`, `"trimmed_mean"` or `"krum"` (`coord::robust`).
    pub aggregator: Aggregator,
    /// `"trimmed_mean"`: the share of a row's weight cut from each end; `"krum"`: the share
    /// of a row's senders taken to be hostile. In [0, 0.5).
    pub trim: f64,
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
            size_cap: 0.0,
            update_clip: DEFAULT_UPDATE_CLIP,
            aggregator: Aggregator::Mean,
            trim: DEFAULT_TRIM,
        }
    }
}

impl FedsacConfig {
    /// The coordinator's settings (graph, cohort, what is scored).
    pub fn settings(&self) -> crate::coord::fedsac_server::Settings {
        crate::coord::fedsac_server::Settings {
            alpha: self.alpha,
            beta: self.beta,
            alpha_cutoff: self.alpha_cutoff,
            principal_angles: self.principal_angles,
            cohort_size: self.cohort_size,
            score_trained: self.score == FedsacScore::Trained,
            size_cap: (self.size_cap > 0.0).then_some(self.size_cap),
            update_clip: (self.update_clip > 0.0).then_some(self.update_clip),
            aggregator: self.aggregator,
            trim: self.trim,
        }
    }

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
        for (name, v) in [
            ("size_cap", self.size_cap),
            ("update_clip", self.update_clip),
        ] {
            if !(v.is_finite() && (v == 0.0 || v >= 1.0)) {
                return Err(format!("{name} must be 0 (off) or at least 1, got {v}"));
            }
        }
        check_trim(self.trim)?;
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
