//! HCCT's hyperparameters (spec `docs/specs/hcct.md` §1.3, §2.3, §3, §6): the trade-off
//! constant α, the stopping rule of ClientPartition, the local optimizer, the `[hcct]` section
//! of a scenario with the spec's defaults and its validation, and the learning-rate schedule.
//! Owns: [`HcctConfig`], [`Alpha`], [`Stop`], [`Optimizer`], [`learning_rate`], and the settings
//! of ClientPartition and of the coordinator's schedule ([`PartitionConfig`],
//! [`CoordinatorConfig`]).
//! Must not: compute utilities, partitions or models (`gram.rs`, `partition.rs`, `models.rs`).

use super::HcctError;
use crate::coord::robust::Aggregator;
use serde::{Deserialize, Serialize};

/// The trade-off constant α of the utility (spec §1.3–1.4). Written as a number or
/// `"client_size"` in files.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "AlphaRepr", into = "AlphaRepr")]
pub enum Alpha {
    /// One α for every client: size term −α / D̂_G.
    Constant(f64),
    /// α_i = D_i (code `--alpha -1`): size term −D_i / D̂_G, so every merge gains exactly +1 in
    /// the size term (spec §1.4, §4 item 5).
    ClientSize,
}

impl Default for Alpha {
    /// α = 1: the code's default (`utils/options.py`) and the paper's value for Digit and
    /// CIFAR-10 (spec §6.1).
    fn default() -> Self {
        Alpha::Constant(1.0)
    }
}

impl Alpha {
    /// α_i of a client with `size` training samples.
    pub fn of(self, size: usize) -> f64 {
        match self {
            Alpha::Constant(a) => a,
            Alpha::ClientSize => size as f64,
        }
    }

    /// Checks a constant α is finite and ≥ 0.
    pub fn validate(self) -> Result<(), HcctError> {
        match self {
            Alpha::Constant(a) if !(a.is_finite() && a >= 0.0) => Err(HcctError::Alpha(a)),
            _ => Ok(()),
        }
    }
}

/// How an [`Alpha`] is written: a number or a name.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum AlphaRepr {
    Number(f64),
    Name(String),
}

impl TryFrom<AlphaRepr> for Alpha {
    type Error = String;
    fn try_from(r: AlphaRepr) -> Result<Self, String> {
        match r {
            AlphaRepr::Number(a) => {
                let alpha = Alpha::Constant(a);
                alpha.validate().map_err(|e| e.to_string())?;
                Ok(alpha)
            }
            AlphaRepr::Name(n) if n == "client_size" => Ok(Alpha::ClientSize),
            AlphaRepr::Name(n) => Err(format!(
                "alpha must be a finite number >= 0 or \"client_size\", got \"{n}\""
            )),
        }
    }
}

impl From<Alpha> for AlphaRepr {
    fn from(a: Alpha) -> Self {
        match a {
            Alpha::Constant(a) => AlphaRepr::Number(a),
            Alpha::ClientSize => AlphaRepr::Name("client_size".into()),
        }
    }
}

/// When ClientPartition stops merging (spec §2.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stop {
    /// Merge while the best benefit is strictly positive (Algorithm 2 and the code; A3).
    #[default]
    PositiveBenefit,
    /// Always merge the best pair, even at B ≤ 0, until this many groups remain (the code's
    /// `--fix_D` ablation, Figs. 5–6).
    Groups(usize),
}

/// The local optimizer of a silo's round (spec §3 step 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// Plain mini-batch SGD at η_t = `lr` · `lr_decay`^t, momentum 0, no weight decay (the
    /// paper and the code's `torch.optim.SGD`).
    #[default]
    Sgd,
    /// The crate's shared local routine (the `local` and `fedavg` baselines'): one persistent
    /// Adam per silo at `train.lr`, so HCCT compares with them on the same routine (spec §5, last
    /// point). `lr` and `lr_decay` are then unused; pseudo-gradients are divided by `train.lr`.
    Adam,
}

/// `[hcct] size_cap`'s default, FedDisco's.
const DEFAULT_SIZE_CAP: f64 = 2.0;

/// `[hcct]`: HCCT's hyperparameters. Defaults are the spec's (§3, §6.1, §7).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HcctConfig {
    /// α, the weight of the data-size term of the utility (§1.3). Default 1 (the code's; the
    /// paper uses 1 for Digit and CIFAR-10, 100 for FMNIST). Recalibrate it for other sizes
    /// (§6.4): two equal-size singletons of D samples merge iff α / D > 2 − cos₁ − cos₂.
    pub alpha: Alpha,
    /// E: local epochs per round (Table 3: 1 for FMNIST and CIFAR-10, 5 for Digit).
    pub epochs: usize,
    /// η₀ of SGD (code default 0.1).
    pub lr: f64,
    /// Per-round decay of η: η_t = η₀ · decay^t with t the 0-based round (code default 0.995).
    pub lr_decay: f64,
    /// The local optimizer.
    pub optimizer: Optimizer,
    /// Round 0 as one FedAvg group instead of singletons (the code's behaviour, A1). Default
    /// off: the paper's singletons from a common initial model.
    pub round0_global: bool,
    /// Partition once, after round 0, and keep it (the code's `--one_shot`, A4). Default off:
    /// a fresh partition from singletons every round.
    pub one_shot: bool,
    /// Force this many groups, merging even at B ≤ 0 (the code's `--fix_D` ablation). Default
    /// unset: stop at the first non-positive best benefit.
    pub groups: Option<usize>,
    /// HCCT-E (§2.5): similarities use one layer's block of the pseudo-gradients, the layer
    /// chosen once before training by [`select_layer`](super::select_layer). Default off (full
    /// HCCT). It needs its own α (the paper: 100 for FMNIST and Digit, 10 for CIFAR-10).
    pub efficient: bool,
    /// HCCT-P (§2.6, A12): group members share the body but keep their own classifier (the
    /// last linear layer): a member starts each round from its group's average body and its
    /// own head, and keeps its own trained head after aggregation. Similarities still use the
    /// full pseudo-gradients. Default off.
    pub personal: bool,
    /// A silo's sample count weighs at most this many times the lower median count of the
    /// run's silos, in the partition and in its group's average (insiders' review: a member
    /// registering `n_train = 10^12` otherwise owns its group's model). Default 2 (it changed
    /// no HCCT result on the quality suite's Dirichlet columns, where silos differ in size);
    /// 0: as registered, the paper's weights.
    pub size_cap: f64,
    /// A member's end model moves from its group's start model at most this many times the
    /// round's median move (a longer move is scaled back along its direction, before the
    /// pseudo-gradients and the group averages); 0 (the default): no bound.
    pub update_clip: f64,
    /// How a group combines its members' models: `"mean"` (the paper's size-weighted average,
    /// default), `"median"`, `"trimmed_mean"` or `"krum"` (`coord::robust`), each weighted by
    /// size.
    pub aggregator: Aggregator,
    /// `"trimmed_mean"`: the share of a group's weight cut from each end; `"krum"`: the share
    /// of a group's members taken to be hostile. In [0, 0.5).
    pub trim: f64,
}

impl Default for HcctConfig {
    fn default() -> Self {
        Self {
            alpha: Alpha::default(),
            epochs: 1,
            lr: 0.1,
            lr_decay: 0.995,
            optimizer: Optimizer::Sgd,
            round0_global: false,
            one_shot: false,
            groups: None,
            efficient: false,
            personal: false,
            size_cap: DEFAULT_SIZE_CAP,
            update_clip: 0.0,
            aggregator: Aggregator::Mean,
            trim: crate::coord::robust::DEFAULT_TRIM,
        }
    }
}

impl HcctConfig {
    /// Checks every field; the error names the field, the allowed range and the value.
    pub fn validate(&self) -> Result<(), HcctError> {
        self.alpha.validate()?;
        if self.epochs < 1 {
            return Err(HcctError::Epochs(self.epochs));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(HcctError::Lr(self.lr));
        }
        if !(self.lr_decay > 0.0 && self.lr_decay <= 1.0) {
            return Err(HcctError::LrDecay(self.lr_decay));
        }
        if let Some(k) = self.groups.filter(|&k| k < 1) {
            return Err(HcctError::Groups(k));
        }
        if !(self.size_cap.is_finite() && (self.size_cap == 0.0 || self.size_cap >= 1.0)) {
            return Err(HcctError::SizeCap(self.size_cap));
        }
        if !(self.update_clip.is_finite() && (self.update_clip == 0.0 || self.update_clip >= 1.0)) {
            return Err(HcctError::UpdateClip(self.update_clip));
        }
        crate::coord::robust::check_trim(self.trim).map_err(HcctError::Trim)?;
        let robust = self.update_clip > 0.0 || self.aggregator != Aggregator::Mean;
        if robust && (self.efficient || self.personal || self.optimizer == Optimizer::Adam) {
            return Err(HcctError::Trim(
                "update_clip and aggregator apply to HCCT as a coordinator runs it, not with \
                 efficient, personal or optimizer = \"adam\""
                    .into(),
            ));
        }
        Ok(())
    }

    /// The sample counts the run weighs, of its silos `sizes` in order: each at most
    /// `size_cap` times their lower median ([`crate::coord::robust::cap_sizes`]).
    pub fn run_sizes(&self, sizes: &[usize]) -> Vec<usize> {
        let cap = (self.size_cap > 0.0).then_some(self.size_cap);
        let counts: Vec<u64> = sizes.iter().map(|&d| d as u64).collect();
        let (capped, _) = crate::coord::robust::cap_sizes(&counts, cap);
        capped.into_iter().map(|d| d as usize).collect()
    }

    /// The partition rule these settings ask for.
    pub fn partition_config(&self) -> PartitionConfig {
        PartitionConfig {
            alpha: self.alpha,
            stop: self.groups.map_or(Stop::PositiveBenefit, Stop::Groups),
        }
    }

    /// The coordinator schedule these settings ask for.
    pub fn coordinator_config(&self) -> CoordinatorConfig {
        CoordinatorConfig {
            partition: self.partition_config(),
            round0_global: self.round0_global,
            one_shot: self.one_shot,
        }
    }

    /// η_t for SGD (§3): `lr · lr_decay^t`, t the 0-based round.
    pub fn sgd_lr(&self, round: usize) -> f64 {
        learning_rate(self.lr, self.lr_decay, round)
    }
}

/// η_t = η₀ · decay^t (spec §3; the paper's 0.995^{t−1} with t from 1).
pub fn learning_rate(lr0: f64, decay: f64, round: usize) -> f64 {
    lr0 * decay.powf(round as f64)
}

/// What ClientPartition (`partition.rs`) needs besides the gradients and sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PartitionConfig {
    /// α.
    pub alpha: Alpha,
    /// When to stop merging.
    pub stop: Stop,
}

/// How a [`super::Coordinator`] schedules partitions.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CoordinatorConfig {
    /// ClientPartition's rule.
    pub partition: PartitionConfig,
    /// Round 0 as one group (code) instead of singletons (paper), A1.
    pub round0_global: bool,
    /// Partition once after round 0 and keep it, A4.
    pub one_shot: bool,
}
