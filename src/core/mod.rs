//! The FedeRiCo state machine (spec `federico.md` §3–§6), sans-IO.
//!
//! Owns: everything one silo decides — whom to sample (ε-greedy on the previous weights), how
//! measured losses become tracked losses and softmax weights, which weight scales each gradient,
//! which peers count at inference, which peers are suspect, and which gradients an owner accepts.
//!
//! Must not: touch tensors, sockets, clocks or threads. Losses arrive as numbers measured by a
//! driver (the simulator now, the libp2p runtime later); gradients are plain `Vec<f32>`. A round,
//! as a driver runs it (spec §3.2):
//!
//! 1. `peer.sample()` → the M others to pull models from (previous round's weights);
//! 2. the driver measures the mean loss of each sampled model *and its own* on local training data;
//! 3. `peer.handle_losses(n_train, &measured)` → E-step: new tracked losses and weights;
//! 4. the driver scales each model's summed gradient by `peer.weight(b)` (the *fresh* weight) and
//!    sends it to the owner, whose [`GradientInbox`] accepts it; the owner takes one optimizer
//!    step on the sum.

mod inbox;
pub mod round;
mod sampling;
mod softmax;
mod table;

pub(crate) use inbox::l2;
pub use inbox::{
    Bounded, DEFAULT_NORM_BOUND, GradientInbox, NormBound, PROBATION_DEADLINES, PROBATION_ROUNDS,
    Rejection, Stragglers,
};
pub use sampling::{SamplingMode, epsilon_greedy};
pub use softmax::{log_softmax, softmax};
pub use table::{CollaboratorTable, Entry, LossTracking, ema_update};

use crate::ids::NodeId;
use chacha20::ChaCha12Rng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The E-step temperature κ (spec §5.1): ℓ_ib = κ · mean per-sample loss of φ_b on D_i.
/// Written `"mean"`, `"sum"`, `"auto"` or a positive number in files.
///
/// Binary formats (checkpoints) store it as a plain enum: they cannot tell a name from a number
/// without a schema.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum LossScale {
    /// κ = 1: per-sample mean (default for classification).
    #[default]
    Mean,
    /// κ = n_i: the paper-literal summed loss (default for the sine regression toy).
    Sum,
    /// A fixed κ, e.g. a mini-batch size.
    Fixed(f64),
    /// Beyond the paper, set from the data: κ_i = n_i / P, the silo's training samples per
    /// model parameter, where that is above the default's temperature (1, or `soften`'s factor
    /// once it acts); else the default. The summed loss n_i · L (the EM posterior's) compared
    /// in units of P nats, about what fitting P parameters lowers a training loss by (AIC):
    /// a model with more parameters than the silo has samples (every model of the quality
    /// suite) keeps κ = 1 exactly; a small model on many rows (a softmax regression on a
    /// clinic's table) sees its loss gaps, which are real there, sharpened.
    Auto,
}

/// How a [`LossScale`] is written: a name or a number.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum LossScaleRepr {
    Name(String),
    Number(f64),
}

impl TryFrom<LossScaleRepr> for LossScale {
    type Error = String;
    fn try_from(r: LossScaleRepr) -> Result<Self, String> {
        match r {
            LossScaleRepr::Name(n) if n == "mean" => Ok(LossScale::Mean),
            LossScaleRepr::Name(n) if n == "sum" => Ok(LossScale::Sum),
            LossScaleRepr::Name(n) if n == "auto" => Ok(LossScale::Auto),
            LossScaleRepr::Number(k) if k.is_finite() && k > 0.0 => Ok(LossScale::Fixed(k)),
            LossScaleRepr::Name(n) => Err(format!(
                "loss_scale must be \"mean\", \"sum\", \"auto\" or a positive number, got \"{n}\""
            )),
            LossScaleRepr::Number(k) => Err(format!(
                "loss_scale must be \"mean\", \"sum\", \"auto\" or a positive number, got {k}"
            )),
        }
    }
}

impl From<LossScale> for LossScaleRepr {
    fn from(s: LossScale) -> Self {
        match s {
            LossScale::Mean => LossScaleRepr::Name("mean".into()),
            LossScale::Sum => LossScaleRepr::Name("sum".into()),
            LossScale::Fixed(k) => LossScaleRepr::Number(k),
            LossScale::Auto => LossScaleRepr::Name("auto".into()),
        }
    }
}

/// The binary form of a [`LossScale`].
#[derive(Serialize, Deserialize)]
enum LossScaleBin {
    Mean,
    Sum,
    Fixed(f64),
    Auto,
}

impl Serialize for LossScale {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            LossScaleRepr::from(*self).serialize(s)
        } else {
            match *self {
                LossScale::Mean => LossScaleBin::Mean,
                LossScale::Sum => LossScaleBin::Sum,
                LossScale::Fixed(k) => LossScaleBin::Fixed(k),
                LossScale::Auto => LossScaleBin::Auto,
            }
            .serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for LossScale {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let repr = if d.is_human_readable() {
            LossScaleRepr::deserialize(d)?
        } else {
            match LossScaleBin::deserialize(d)? {
                LossScaleBin::Mean => LossScaleRepr::Name("mean".into()),
                LossScaleBin::Sum => LossScaleRepr::Name("sum".into()),
                LossScaleBin::Fixed(k) => LossScaleRepr::Number(k),
                LossScaleBin::Auto => LossScaleRepr::Name("auto".into()),
            }
        };
        LossScale::try_from(repr).map_err(serde::de::Error::custom)
    }
}

impl LossScale {
    /// The κ that scales the losses entering the tracked loss, for a silo with `n_train`
    /// training samples. [`LossScale::Auto`] scales them by 1 and acts on the weights instead
    /// ([`Peer::handle_losses`]).
    pub fn kappa(self, n_train: usize) -> f64 {
        match self {
            LossScale::Mean | LossScale::Auto => 1.0,
            LossScale::Sum => n_train as f64,
            LossScale::Fixed(k) => k,
        }
    }
}

/// What the M-step computes each round (spec §5.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MStep {
    /// One gradient over all local training data per (sampler, model) and one optimizer step per
    /// model per round (literal Algorithm 1).
    Full,
    /// `minibatch(S)` with S = one local epoch (⌈n_i / batch⌉ lock-step sub-steps), so a model's
    /// optimizer steps per round match the baselines' one local epoch (spec §8.2).
    #[default]
    Epoch,
    /// `minibatch(S)` with a fixed number S of sub-steps.
    Minibatch(usize),
    /// Beyond the paper, for a wide-area network: `full`'s one exchange per round (each
    /// sampler's gradient over all its data, sent once), after which the owner takes `epoch`'s
    /// S sub-steps alone: each on its own next mini-batch, the others' gradients held as they
    /// came. The owner's model gets an epoch's optimizer steps for one round trip of pulls and
    /// one of gradients (`docs/performance.md`, "Across a wide-area network").
    LocalEpoch,
}

impl MStep {
    /// The round engine's sub-steps per round ([`round::RoundConfig::sub_steps`]): `None` for
    /// `full`; for `epoch`, `epoch_steps` — one local epoch of the federation's largest silo,
    /// ⌈max n_i / batch⌉, which only someone who knows every silo's size can say.
    pub fn sub_steps(self, epoch_steps: u64) -> Option<u64> {
        match self {
            MStep::Full | MStep::LocalEpoch => None,
            MStep::Epoch => Some(epoch_steps.max(1)),
            MStep::Minibatch(s) => Some(s as u64),
        }
    }

    /// The owner's own sub-steps per round after its one exchange (`local_epoch`: an epoch of
    /// the federation's largest silo, as `epoch`); `None` for the others, whose owner steps
    /// once per (sub-)step on its inbox.
    pub fn own_steps(self, epoch_steps: u64) -> Option<u64> {
        match self {
            MStep::LocalEpoch => Some(epoch_steps.max(1)),
            _ => None,
        }
    }

    /// Both counts at once, in a federation whose epoch is `epoch_steps` sub-steps.
    pub fn steps(self, epoch_steps: u64) -> Steps {
        Steps {
            sub_steps: self.sub_steps(epoch_steps),
            own_steps: self.own_steps(epoch_steps),
        }
    }

    /// Whether every member must know the federation's epoch (`epoch_steps`).
    pub fn needs_epoch(self) -> bool {
        matches!(self, MStep::Epoch | MStep::LocalEpoch)
    }
}

/// What an M-step asks of a round ([`MStep::steps`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    /// The round engine's sub-steps, each an exchange ([`MStep::sub_steps`]).
    pub sub_steps: Option<u64>,
    /// The owner's own sub-steps after the round's one exchange ([`MStep::own_steps`]).
    pub own_steps: Option<u64>,
}

impl Steps {
    /// Mini-batches a silo draws a round: one per sub-step of either kind; `None`: none.
    pub fn batches(self) -> Option<u64> {
        self.sub_steps.or(self.own_steps)
    }
}

/// Beyond the paper: from round `from_round` on, the E-step's softmax runs on the tracked losses
/// times `factor` — a softer temperature (`factor` < 1) once the first rounds have picked a
/// silo's group. Written `soften = { from_round = 5, factor = 0.5 }` in files.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Soften {
    /// The first round (1-based) whose weights are softened.
    pub from_round: u64,
    /// The multiplier of the tracked losses from then on; 1 is off.
    pub factor: f64,
}

/// `soften` of `variant = "federico"` (where members > M + 1), chosen on the quality suite
/// (`docs/notes/quality-history.md`, "Softer after the first rounds").
pub const DEFAULT_SOFTEN: Soften = Soften {
    from_round: 5,
    factor: 0.5,
};

/// FedeRiCo hyperparameters; defaults are the paper's (spec §4).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FedericoConfig {
    /// M: other peers sampled per round (self is always evaluated in addition).
    pub neighbours: usize,
    /// ε: probability that a slot explores uniformly instead of taking the top weight.
    pub epsilon: f64,
    /// β: weight of the *new* loss in the EMA.
    pub beta: f64,
    /// κ of the E-step. Absent: `"auto"` for `variant = "federico"` (the default κ = 1 where
    /// a model has more parameters than the silo has samples), `"mean"` (κ = 1) for `"paper"`.
    /// See [`FedericoConfig::loss_scale`].
    pub loss_scale: Option<LossScale>,
    /// Per-slot or per-round ε coin.
    pub sampling: SamplingMode,
    /// EMA (Algorithm 1) or accumulated loss (ablation).
    pub loss_tracking: LossTracking,
    /// At inference, peers below this weight are dropped before renormalising (spec §9 item 10).
    pub infer_min_weight: f64,
    /// Consecutive failures after which a peer becomes suspect (spec §6): it sits out the
    /// following rounds, 2 after its `suspect_after`-th failure and twice as many after each
    /// further one (up to [`MAX_BACKOFF_ROUNDS`]), then is tried again.
    pub suspect_after: u32,
    /// What the M-step computes per round (spec §5.5). Absent: `"epoch"` for `variant =
    /// "federico"` (chosen on the quality suite, `docs/quality.md`), `"full"` for `"paper"`
    /// (Algorithm 1). See [`FedericoConfig::mstep`].
    pub mstep: Option<MStep>,
    /// Optional per-sender gradient-norm clipping (spec §6, security): an owner scales each
    /// gradient it accepts, its own included, to an L2 norm of at most this before summing, so a
    /// malicious sampler cannot move a model by more than this per round. `None` (the default)
    /// is the paper's algorithm.
    pub clip_norm: Option<f64>,
    /// `"federico"` (the default: the paper's algorithm with this crate's remedies, each at its
    /// default) or `"paper"` (Algorithm 1 exactly: every remedy off; the reproduction
    /// scenarios use it).
    pub variant: Variant,
    /// Beyond the paper: a sampler sends its gradient to a sampled model only when its weight
    /// is at least `push_cut` times its largest weight; below, it sends a `Skip`, so a silo's
    /// data stops training models it does not rely on. Its own model always gets its gradient.
    /// Absent: [`DEFAULT_PUSH_CUT`] for `variant = "federico"`, 0 (every measured model gets
    /// one) for `"paper"`.
    pub push_cut: Option<f64>,
    /// Beyond the paper: an owner caps the others' gradients against its own — their sum enters
    /// its step scaled down to at most `foreign_cap` times its own gradient's L2 norm
    /// ([`GradientInbox::with_foreign_cap`]); 0 turns the cap off (the plain sum). Absent:
    /// for `variant = "federico"`, [`DEFAULT_FOREIGN_CAP`] in a federation so small that every
    /// silo samples every model each round (members ≤ `neighbours` + 1), off otherwise; off for
    /// `"paper"`. See [`FedericoConfig::foreign_cap`].
    pub foreign_cap: Option<f64>,
    /// Beyond the paper: a softer E-step temperature after the first rounds ([`Soften`]): the
    /// weights come from the tracked losses times `factor` from round `from_round` on. In the
    /// first rounds a silo's weights pick its group at full sharpness; later a softer softmax
    /// shares more among the models that fit its data. Absent: for `variant = "federico"`,
    /// [`DEFAULT_SOFTEN`] where members > `neighbours` + 1, off otherwise; off for `"paper"`;
    /// `factor = 1` turns it off. See [`FedericoConfig::soften`].
    pub soften: Option<Soften>,
    /// Beyond the paper, an option (0, the default, is off): a silo's gradient on its own model
    /// is scaled by at least `own_floor` (`max(w_ii, own_floor)`), so its own model keeps
    /// learning its data while its row relies on other models. Without it, a silo whose row
    /// locks on to a foreign model scales its own gradient by w_ii ≈ 0 and its model stops
    /// learning its data. The E-step, the mixture and the gradients to other models are
    /// unchanged. It rescues federations whose rows collapse on to another group's model
    /// (features left in their own units) and is about neutral on the quality suite, which
    /// chose the defaults (`docs/notes/quality-history.md`, "A floor under the own
    /// gradient"), so it is not one of them.
    pub own_floor: f64,
    /// Beyond the paper, an option (0, the default, is off): the share of a silo's training
    /// rows held out of every gradient and used only to score models (the E-step's losses),
    /// drawn per class from the run seed and the silo. Scored on rows it trained on, a silo's
    /// own model fits them best once it has memorised them (a small silo's, fast), and its row
    /// can lock on to itself. Held-out rows end that lock where it happens (small silos of the
    /// FedCollab scenarios: +11 to +15 points over Local instead of +0.1 to +1.1) but cost the
    /// rows' training everywhere else (0.5 to 1.5 points on the quality suite), so the default
    /// leaves it off (`docs/quality.md`, "Small silos that trust only themselves").
    pub score_share: f64,
}

/// `[defences]`: how much an owner trusts the members that send it gradients (insiders'
/// review, `docs/insiders.md`). Kept apart from [`FedericoConfig`] (the algorithm, written in
/// every checkpoint): a defence can change between runs without touching a silo's state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Defences {
    /// k of the owner's norm bound ([`NormBound`]): every other member's gradient enters the
    /// step scaled down to at most k times the typical norm of the gradients the owner summed
    /// recently (a lower median, its own included). 0 turns it off (every gradient as it came,
    /// the paper's rule). Absent: [`DEFAULT_NORM_BOUND`] for `variant = "federico"`, off for
    /// `"paper"` (Algorithm 1 exactly).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub norm_bound: Option<f64>,
    /// Whether an absent member — never measured, and its pulls keep failing (`suspect_after`
    /// in a row: never came, or refuses its model) — keeps the optimistic weight of a loss of 0
    /// that let 8 absent members take 0.70 of a row (insiders' review L4). `false`: it gets 0
    /// in the row, the push weights and the push cut until it answers; a member merely not
    /// sampled yet keeps its optimistic weight, so fault-free runs do not change. Absent:
    /// `false` for `variant = "federico"`, `true` for `"paper"` (Algorithm 1's row).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weigh_absent: Option<bool>,
    /// Whether an owner leaves out another member's gradient that points against its own (a
    /// negative dot product: a step along it raises the owner's loss on its own rows), against
    /// sign-flipped gradients and flipped labels ([`GradientInbox::leave_out_opposed`]).
    /// Absent: on for `variant = "federico"`, off for `"paper"` (Algorithm 1's plain sum).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drop_opposed: Option<bool>,
    /// Whether an owner distrusts a member whose gradients keep pointing against its own, or
    /// keep being scaled down by the norm bound, over many steps ([`Peer::handle_verdicts`]):
    /// the member then gets 0 in the owner's row, the push weights and the push cut, and its
    /// gradients are left out of the owner's steps, until its gradients agree again. Against
    /// gradient poisoners, whose own model is honest and would otherwise keep an honest peer's
    /// weight (insiders' review; `docs/insiders.md`).
    /// Absent: on for `variant = "federico"`, off for `"paper"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distrust: Option<bool>,
}

impl Defences {
    /// The norm bound's k in force for a federation running `variant` (`None`: off).
    pub fn norm_bound(&self, variant: Variant) -> Option<f64> {
        match self.norm_bound {
            Some(k) if k > 0.0 => Some(k),
            Some(_) => None,
            None => (variant == Variant::Federico).then_some(DEFAULT_NORM_BOUND),
        }
    }

    /// Whether owners leave out gradients opposed to their own, in a federation running
    /// `variant`.
    pub fn drop_opposed(&self, variant: Variant) -> bool {
        self.drop_opposed.unwrap_or(variant == Variant::Federico)
    }

    /// Whether owners distrust members whose gradients keep pointing against their own, in a
    /// federation running `variant`.
    pub fn distrust(&self, variant: Variant) -> bool {
        self.distrust.unwrap_or(variant == Variant::Federico)
    }

    /// Whether absent members keep weight, for a federation running `variant`.
    pub fn weigh_absent(&self, variant: Variant) -> bool {
        self.weigh_absent.unwrap_or(variant == Variant::Paper)
    }

    /// Checks every value; errors name the field (without the `defences.` prefix).
    pub fn validate(&self) -> Result<(), String> {
        if let Some(k) = self.norm_bound
            && !(k == 0.0 || (k.is_finite() && k >= 1.0))
        {
            return Err(format!(
                "norm_bound must be 0 (off) or a finite number of at least 1 (times the \
                 typical gradient norm), got {k}"
            ));
        }
        Ok(())
    }
}

/// Which FedeRiCo runs: the paper's Algorithm 1, or it with this crate's remedies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// The remedies on at their defaults (`push_cut` = [`DEFAULT_PUSH_CUT`]).
    #[default]
    Federico,
    /// Algorithm 1 as the paper writes it.
    Paper,
}

/// `push_cut` of `variant = "federico"`, chosen on the quality suite (`docs/quality.md`).
pub const DEFAULT_PUSH_CUT: f64 = 0.5;

/// `foreign_cap` of `variant = "federico"` where every silo samples every model each round
/// (`docs/notes/quality-history.md`, "Few silos": without it such a federation's models become
/// one).
pub const DEFAULT_FOREIGN_CAP: f64 = 0.5;

impl Default for FedericoConfig {
    fn default() -> Self {
        Self {
            neighbours: 3,
            epsilon: 0.3,
            beta: 0.6,
            loss_scale: None,
            sampling: SamplingMode::PerSlot,
            loss_tracking: LossTracking::Ema,
            infer_min_weight: 1e-3,
            suspect_after: 3,
            mstep: None,
            clip_norm: None,
            variant: Variant::Federico,
            push_cut: None,
            foreign_cap: None,
            soften: None,
            own_floor: 0.0,
            score_share: 0.0,
        }
    }
}

impl FedericoConfig {
    /// The `push_cut` in force: the one given, else the variant's.
    pub fn push_cut(&self) -> f64 {
        self.push_cut.unwrap_or(match self.variant {
            Variant::Federico => DEFAULT_PUSH_CUT,
            Variant::Paper => 0.0,
        })
    }

    /// The owner's cap on the others' gradients in force in a federation of `members` silos
    /// (`None`: off): the one given (0: off), else the variant's. `"federico"` caps where every
    /// silo samples every model each round (members ≤ M + 1): there sampling cannot break the
    /// symmetry of the first rounds, every model steps on the same gradients and the weights
    /// never separate; with more members (the quality suite's 8) it does not cap, since the cap
    /// also limits what a group's silos learn from each other (`docs/notes/quality-history.md`).
    pub fn foreign_cap(&self, members: usize) -> Option<f64> {
        match self.foreign_cap {
            Some(c) if c > 0.0 => Some(c),
            Some(_) => None,
            None => match self.variant {
                Variant::Federico if self.samples_every_model(members) => Some(DEFAULT_FOREIGN_CAP),
                _ => None,
            },
        }
    }

    /// The κ rule in force: the one given, else the variant's.
    pub fn loss_scale(&self) -> LossScale {
        self.loss_scale.unwrap_or(match self.variant {
            Variant::Federico => LossScale::Auto,
            Variant::Paper => LossScale::Mean,
        })
    }

    /// The M-step in force: the one given, else the variant's.
    pub fn mstep(&self) -> MStep {
        self.mstep.unwrap_or(match self.variant {
            Variant::Federico => MStep::Epoch,
            Variant::Paper => MStep::Full,
        })
    }

    /// Whether, in a federation of `members` silos, every silo samples every model each round
    /// (members ≤ M + 1): where `"federico"` caps foreign gradients and does not soften.
    fn samples_every_model(&self, members: usize) -> bool {
        members <= self.neighbours + 1
    }

    /// The [`Soften`] in force in a federation of `members` silos (`None`: off): the one given
    /// (`factor = 1`: off), else the variant's. `"federico"` softens where a silo samples only
    /// some of the models each round (members > M + 1, the suite's eight silos); where it
    /// samples every model, the few-silo federations [`Self::foreign_cap`] is for, a softer row
    /// leaks weight to the other group's models (`docs/notes/quality-history.md`, "Softer after
    /// the first rounds"), so it does not.
    pub fn soften(&self, members: usize) -> Option<Soften> {
        let s = match self.soften {
            Some(s) => s,
            None => match self.variant {
                Variant::Federico if !self.samples_every_model(members) => DEFAULT_SOFTEN,
                _ => return None,
            },
        };
        (s.factor != 1.0).then_some(s)
    }

    /// The multiplier of the tracked losses in the E-step of round `round` (1-based) in a
    /// federation of `members` silos.
    pub fn sharpness(&self, round: u64, members: usize) -> f64 {
        match self.soften(members) {
            Some(s) if round >= s.from_round => s.factor,
            _ => 1.0,
        }
    }

    /// Refuses a remedy `name` switched on (`value` > 0) with `variant = "paper"`.
    fn beyond_the_paper(&self, name: &str, value: f64) -> Result<(), String> {
        if self.variant == Variant::Paper && value > 0.0 {
            return Err(format!(
                "{name} = {value} is not the paper's algorithm: variant = \"paper\" runs \
                 without it (drop one of the two)"
            ));
        }
        Ok(())
    }

    /// Checks every field; the error names the field, the allowed range and the value.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.epsilon) {
            return Err(format!("epsilon must be in [0, 1], got {}", self.epsilon));
        }
        if !(self.beta > 0.0 && self.beta <= 1.0) {
            return Err(format!("beta must be in (0, 1], got {}", self.beta));
        }
        if let Some(LossScale::Fixed(k)) = self.loss_scale {
            if !(k.is_finite() && k > 0.0) {
                return Err(format!(
                    "loss_scale must be \"mean\", \"sum\", \"auto\" or a positive number, got {k}"
                ));
            }
        }
        if self.variant == Variant::Paper && self.loss_scale == Some(LossScale::Auto) {
            return Err(
                "loss_scale = \"auto\" is not the paper's algorithm: variant = \"paper\" runs \
                 a fixed κ (drop one of the two)"
                    .into(),
            );
        }
        if !(0.0..1.0).contains(&self.infer_min_weight) {
            return Err(format!(
                "infer_min_weight must be in [0, 1), got {}",
                self.infer_min_weight
            ));
        }
        if self.mstep == Some(MStep::Minibatch(0)) {
            return Err("mstep minibatch count must be at least 1, got 0".into());
        }
        if let Some(c) = self.push_cut {
            if !(0.0..=1.0).contains(&c) {
                return Err(format!("push_cut must be in [0, 1], got {c}"));
            }
            self.beyond_the_paper("push_cut", c)?;
        }
        if let Some(c) = self.foreign_cap {
            if !(c.is_finite() && c >= 0.0) {
                return Err(format!(
                    "foreign_cap must be 0 (off) or a positive number, got {c}"
                ));
            }
            self.beyond_the_paper("foreign_cap", c)?;
        }
        let f = self.own_floor;
        if !(0.0..=1.0).contains(&f) {
            return Err(format!("own_floor must be in [0, 1] (0: off), got {f}"));
        }
        self.beyond_the_paper("own_floor", f)?;
        let h = self.score_share;
        if !(0.0..=0.5).contains(&h) {
            return Err(format!(
                "score_share must be in [0, 0.5] (0, the default: every row trains), got {h}"
            ));
        }
        self.beyond_the_paper("score_share", h)?;
        if let Some(s) = self.soften {
            if !(s.factor.is_finite() && s.factor > 0.0) {
                return Err(format!(
                    "soften.factor must be a positive number (1: off), got {}",
                    s.factor
                ));
            }
            if self.variant == Variant::Paper && s.factor != 1.0 {
                return Err(format!(
                    "soften = {{ from_round = {}, factor = {} }} is not the paper's algorithm: \
                     variant = \"paper\" runs without it (drop one of the two)",
                    s.from_round, s.factor
                ));
            }
        }
        if self.suspect_after == 0 {
            return Err("suspect_after must be at least 1, got 0".into());
        }
        if let Some(c) = self.clip_norm {
            if !(c.is_finite() && c > 0.0) {
                return Err(format!(
                    "clip_norm must be a positive finite number (or absent), got {c}"
                ));
            }
        }
        Ok(())
    }
}

/// The longest a suspect sits out between two tries, in rounds.
pub const MAX_BACKOFF_ROUNDS: u64 = 64;

/// Consecutive failed pulls of one peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Failures {
    /// How many in a row.
    count: u32,
    /// E-steps completed when the last one happened.
    at: u64,
    /// The one early try a heartbeat may grant per run of failures.
    probe: Probe,
}

/// Where a suspect stands with its heartbeat-granted try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
enum Probe {
    /// Not granted yet.
    #[default]
    Unused,
    /// Granted: it may be sampled before its backoff runs out.
    Granted,
    /// Granted and failed: only the backoff now.
    Used,
}

/// One silo's FedeRiCo state: its collaborator table, its sampling RNG and peer liveness.
///
/// It serializes whole (RNG position included), so a checkpoint restores the exact stream: the
/// RNG is ChaCha12, the generator behind `rand`'s `StdRng`, so the draws are the same as a
/// `StdRng` seeded alike.
#[derive(Debug, Serialize, Deserialize)]
pub struct Peer {
    me: NodeId,
    cfg: FedericoConfig,
    #[serde(with = "rng_state")]
    rng: ChaCha12Rng,
    table: CollaboratorTable,
    /// Consecutive failed pulls per peer (absent = none).
    failures: BTreeMap<NodeId, Failures>,
    /// E-steps completed.
    rounds: u64,
    /// Training samples per model parameter, n_i / P, for [`LossScale::Auto`] (0 until the
    /// driver says: [`Peer::set_data_ratio`]). Derived from the data and the model, so not
    /// kept in checkpoints: a resumed driver sets it again.
    #[serde(skip)]
    data_ratio: f64,
    /// No weight for absent members ([`Defences::weigh_absent`] false); a setting of this run,
    /// not state, so not kept in checkpoints: the driver sets it ([`Peer::set_weigh_absent`]).
    #[serde(skip)]
    drop_absent: bool,
    /// How well each other member's recent gradients agreed with this silo's own, as an owner:
    /// a moving average of their alignments ([`Self::handle_verdicts`]). Kept in checkpoints,
    /// so a restart does not forgive a poisoner.
    alignment: BTreeMap<NodeId, f64>,
    /// The members whose alignment average was below [`DISTRUST_BELOW`] at the last E-step: the
    /// row changes only there, so every driver, whatever the order in which its owner steps and
    /// its E-steps interleave, weighs alike.
    below: BTreeSet<NodeId>,
    /// Members flagged in most of their recent gradients get no weight
    /// ([`Defences::distrust`]); a setting of this run, set by the driver.
    #[serde(skip)]
    distrust: bool,
}

/// The weight of each new gradient in a member's alignment average ([`Peer::handle_verdicts`]).
/// Slow on purpose: an honest member's single gradients scatter widely around the owner's
/// (cosines from −0.97 to +0.97 within one label group on Fashion-MNIST), so only a sustained
/// run of opposed or oversized gradients moves the average far below 0.
pub const ALIGNMENT_RATE: f64 = 0.05;
/// The alignment average below which a member is distrusted ([`Peer::is_distrusted`]).
/// Chosen on the recorded cosines of the quick federation and Fashion-MNIST G=2
/// (`docs/insiders.md`, "Distrust"): no honest member of the quick federation ever fell below
/// it; a sign-flipping one did in 60–73 % of its gradients.
pub const DISTRUST_BELOW: f64 = -0.15;

impl Clone for Peer {
    /// A copy at the same RNG position (checkpoints are written from a copy).
    fn clone(&self) -> Self {
        Self {
            me: self.me,
            cfg: self.cfg.clone(),
            rng: ChaCha12Rng::deserialize_state(&self.rng.serialize_state()),
            table: self.table.clone(),
            failures: self.failures.clone(),
            rounds: self.rounds,
            data_ratio: self.data_ratio,
            drop_absent: self.drop_absent,
            alignment: self.alignment.clone(),
            below: self.below.clone(),
            distrust: self.distrust,
        }
    }
}

impl Peer {
    /// A silo `me` that knows `peers` (itself is added if absent), all unmeasured. `seed` seeds
    /// its sampling stream; derive it from (run seed, node id) with [`crate::ids::stream_seed`].
    pub fn new(
        me: NodeId,
        peers: impl IntoIterator<Item = NodeId>,
        cfg: FedericoConfig,
        seed: u64,
    ) -> Self {
        let mut table = CollaboratorTable::new(peers);
        table.insert(me, 1.0);
        Self {
            me,
            cfg,
            rng: ChaCha12Rng::seed_from_u64(seed),
            table,
            failures: BTreeMap::new(),
            rounds: 0,
            data_ratio: 0.0,
            drop_absent: false,
            alignment: BTreeMap::new(),
            below: BTreeSet::new(),
            distrust: false,
        }
    }

    /// Whether absent members keep weight ([`Defences::weigh_absent`]). When not, a member
    /// never measured whose pulls keep failing (a suspect) is 0 in the row, the push weights and
    /// the push cut. Sampling still sees it optimistically (spec §3.1), so it is tried again
    /// as its backoff allows.
    pub fn set_weigh_absent(&mut self, weigh: bool) {
        self.drop_absent = !weigh;
    }

    /// A member never measured whose pulls keep failing: absent, or refusing its model.
    fn is_absent(&self, peer: NodeId, e: &Entry) -> bool {
        !e.seen && self.is_suspect(peer)
    }

    /// Whether members whose gradients keep pointing against this silo's own lose their weight
    /// ([`Defences::distrust`]).
    pub fn set_distrust(&mut self, on: bool) {
        self.distrust = on;
    }

    /// This silo, as an owner, judged the gradients other members sent for one step:
    /// `(member, alignment)`, the cosine of the member's gradient with the owner's own, or −1
    /// when the norm bound scaled it down (oversized, whatever its direction). Each moves the
    /// member's alignment average by [`ALIGNMENT_RATE`] (from 0, for a member not judged yet);
    /// the owner's own gradient is never judged, and a value outside [−1, 1] counts as its
    /// bound.
    pub fn handle_verdicts(&mut self, verdicts: &[(NodeId, f64)]) {
        for &(j, a) in verdicts.iter().filter(|(j, _)| *j != self.me) {
            let a = if a.is_nan() { -1.0 } else { a.clamp(-1.0, 1.0) };
            let x = self.alignment.entry(j).or_insert(0.0);
            *x = (1.0 - ALIGNMENT_RATE) * *x + ALIGNMENT_RATE * a;
        }
    }

    /// Whether `peer`'s recent gradients pointed against this silo's own, or were oversized,
    /// so persistently that their alignment average was below [`DISTRUST_BELOW`] at the last
    /// E-step, and distrust is on: it then has no weight in this silo's row, and its gradients
    /// are left out of this silo's steps. It is still sampled and judged, so a member whose
    /// gradients agree again is trusted again (from the next E-step).
    pub fn is_distrusted(&self, peer: NodeId) -> bool {
        self.distrust && self.below.contains(&peer)
    }

    /// Whether `peer` has no weight in the row: absent (unless absent members keep weight) or
    /// distrusted.
    fn is_excluded(&self, peer: NodeId, e: &Entry) -> bool {
        (self.drop_absent && self.is_absent(peer, e)) || self.is_distrusted(peer)
    }

    /// The silo's `n_train` training samples and its model's `num_params` parameters, which
    /// [`LossScale::Auto`] sets κ from. Drivers call it before the first E-step.
    pub fn set_data_ratio(&mut self, n_train: usize, num_params: usize) {
        self.data_ratio = if num_params == 0 {
            0.0
        } else {
            n_train as f64 / num_params as f64
        };
    }

    /// The multiplier of the tracked losses in the weights of E-step `round`: `soften`'s
    /// ([`FedericoConfig::sharpness`]), raised to n_i / P under [`LossScale::Auto`].
    fn sharpness(&self, round: u64) -> f64 {
        let a = self.cfg.sharpness(round, self.table.len());
        match self.cfg.loss_scale() {
            LossScale::Auto => a.max(self.data_ratio),
            _ => a,
        }
    }

    /// This silo's id.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// The hyperparameters.
    pub fn config(&self) -> &FedericoConfig {
        &self.cfg
    }

    /// E-steps completed so far.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// A peer became known (discovery, late join): it enters with ℓ = L̂ = 0 and `seen = false`,
    /// so greedy slots try it soon (spec §6, late joiners). Known peers are left as they are.
    pub fn handle_peer_joined(&mut self, peer: NodeId) {
        let a = self.sharpness(self.rounds);
        self.table.insert(peer, a);
    }

    /// Step 1 of a round: the M other peers to pull models from, by ε-greedy on the current
    /// (previous round's) weights. Never itself, never a duplicate, never a suspect sitting out
    /// its backoff.
    pub fn sample(&mut self) -> Vec<NodeId> {
        let candidates: Vec<(NodeId, f64)> = self
            .table
            .iter()
            .filter(|&(id, _, _)| id != self.me && !self.is_backing_off(id))
            .map(|(id, _, w)| (id, w))
            .collect();
        epsilon_greedy(
            &candidates,
            self.cfg.neighbours,
            self.cfg.epsilon,
            self.cfg.sampling,
            &mut self.rng,
        )
    }

    /// The models this silo measures and sends gradients for this round: the `sampled` peers
    /// and, always, itself (spec §3.4: self is never one of the M slots but is evaluated and
    /// trained every round).
    pub fn round_models(&self, sampled: &[NodeId]) -> Vec<NodeId> {
        sampled.iter().copied().chain([self.me]).collect()
    }

    /// Step 4, the E-step: `measured` holds the mean per-sample loss of each model evaluated
    /// this round on this silo's `n_train` training samples — the sampled peers that answered,
    /// and itself. Losses are scaled by κ, unmeasured peers keep their last loss, every tracked
    /// loss is updated and the weights recomputed. Non-finite losses are ignored (a model that
    /// gives NaN on our data is treated as not measured).
    pub fn handle_losses(&mut self, n_train: usize, measured: &[(NodeId, f64)]) {
        let kappa = self.cfg.loss_scale().kappa(n_train);
        let scaled: Vec<(NodeId, f64)> = measured
            .iter()
            .filter(|(_, l)| l.is_finite())
            .map(|&(id, l)| (id, kappa * l))
            .collect();
        let a = self.sharpness(self.rounds + 1);
        self.table
            .record_round(&scaled, self.cfg.beta, self.cfg.loss_tracking, a);
        self.below = self
            .alignment
            .iter()
            .filter(|&(_, &x)| x < DISTRUST_BELOW)
            .map(|(&j, _)| j)
            .collect();
        self.rounds += 1;
    }

    /// w_ij: the current weight of `peer` (the fresh one after `handle_losses`); 0 for an
    /// absent member unless absent members keep weight ([`Self::set_weigh_absent`]), and for a
    /// distrusted one ([`Self::is_distrusted`]).
    pub fn weight(&self, peer: NodeId) -> f64 {
        if self.drop_absent || self.distrust {
            self.table
                .weight_without(peer, |j, e| self.is_excluded(j, e))
        } else {
            self.table.weight(peer)
        }
    }

    /// The factor of the gradient this silo sends to `peer`'s model this round: w_ij (spec
    /// §3.2 step 5), or `None` when `push_cut` holds it back (the weight is below `push_cut`
    /// times the row's largest) and a `Skip` goes instead. Its own model always gets one,
    /// scaled by at least `own_floor` (0 unless set).
    pub fn push_weight(&self, peer: NodeId) -> Option<f64> {
        let w = self.weight(peer);
        if peer == self.me {
            return Some(w.max(self.cfg.own_floor));
        }
        let cut = self.cfg.push_cut();
        if cut <= 0.0 {
            return Some(w);
        }
        let top = self
            .weights()
            .iter()
            .map(|&(_, x)| x)
            .fold(0.0f64, f64::max);
        (w >= cut * top).then_some(w)
    }

    /// The whole row `(peer, weight)`, by id, self included (as [`Self::weight`] gives them).
    pub fn weights(&self) -> Vec<(NodeId, f64)> {
        if self.drop_absent || self.distrust {
            self.table.row_without(|j, e| self.is_excluded(j, e))
        } else {
            self.table.iter().map(|(id, _, w)| (id, w)).collect()
        }
    }

    /// The table, for reports and checkpoints.
    pub fn table(&self) -> &CollaboratorTable {
        &self.table
    }

    /// Weights to mix predictions with (spec §5.3c, §9 item 10): measured peers only, those below
    /// `infer_min_weight` dropped, renormalised. Falls back to itself alone when nothing is left.
    pub fn inference_weights(&self) -> Vec<(NodeId, f64)> {
        let seen: Vec<(NodeId, f64)> = self
            .table
            .iter()
            .filter(|(_, e, _)| e.seen)
            .map(|(id, _, w)| (id, w))
            .collect();
        let total: f64 = seen.iter().map(|x| x.1).sum();
        let kept: Vec<(NodeId, f64)> = seen
            .into_iter()
            .filter(|&(_, w)| total > 0.0 && w / total >= self.cfg.infer_min_weight)
            .collect();
        let kept_total: f64 = kept.iter().map(|x| x.1).sum();
        if kept.is_empty() || kept_total <= 0.0 {
            return vec![(self.me, 1.0)];
        }
        kept.into_iter()
            .map(|(id, w)| (id, w / kept_total))
            .collect()
    }

    /// A pull from `peer` failed (timeout, refused): its loss is kept as it is; after
    /// `suspect_after` consecutive failures it is a suspect, and sits out rounds with
    /// exponential backoff (see [`Self::is_backing_off`]) until it answers again or
    /// [`Self::handle_reachable`] says it is back.
    pub fn handle_unreachable(&mut self, peer: NodeId) {
        let f = self.failures.entry(peer).or_default();
        f.count += 1;
        f.at = self.rounds;
        if f.probe == Probe::Granted {
            f.probe = Probe::Used;
        }
    }

    /// A timely request from `peer` reached this silo (a heartbeat, spec §6: "until discovery
    /// or a heartbeat shows it alive again"): a suspect backing off may be tried at once — once
    /// per run of failures, so a partition healed on connections that never closed is found at
    /// the next round, while a straggler whose requests come but whose models do not costs one
    /// extra try, not one per round. Its failure count and its losses are kept.
    pub fn handle_heard_from(&mut self, peer: NodeId) {
        let after = self.cfg.suspect_after;
        if let Some(f) = self.failures.get_mut(&peer) {
            if f.count >= after && f.probe == Probe::Unused {
                f.probe = Probe::Granted;
            }
        }
    }

    /// `peer` answered or was seen alive again: its failure count is cleared.
    pub fn handle_reachable(&mut self, peer: NodeId) {
        self.failures.remove(&peer);
    }

    /// Whether `peer` failed `suspect_after` pulls in a row (and has not answered since).
    pub fn is_suspect(&self, peer: NodeId) -> bool {
        self.failures
            .get(&peer)
            .is_some_and(|f| f.count >= self.cfg.suspect_after)
    }

    /// Whether `peer` is a suspect sitting out its backoff, so not sampled now (spec §6: "back
    /// off exponentially meanwhile"). After its `suspect_after`-th failure in a row it sits out
    /// until 2 rounds have passed since that failure, after the next 4, then 8, … up to
    /// [`MAX_BACKOFF_ROUNDS`]; each try in between is one more failure or clears it. A straggler
    /// that recovers, or a partition healed on connections that survived, is found again this
    /// way with no reconnection to tell.
    pub fn is_backing_off(&self, peer: NodeId) -> bool {
        self.failures.get(&peer).is_some_and(|f| {
            f.count >= self.cfg.suspect_after
                && f.probe != Probe::Granted
                && self.rounds < f.at + backoff_rounds(f.count - self.cfg.suspect_after + 1)
        })
    }
}

/// Whether round `round` (counted from 1) is scored: every `every`-th round (0: none) and the
/// last (`rounds`; `None`: the run has no last round). The one rule of every driver: the
/// simulator, the FedeRiCo round engine, and the coordinated and FedCollab nodes (which score
/// their last round in their final line).
pub fn is_evaluation_round(round: u64, every: u64, rounds: Option<u64>) -> bool {
    (every > 0 && round % every == 0) || rounds.is_some_and(|t| round >= t)
}

/// An evaluation mixture (`mix`, from [`Peer::inference_weights`]) after some of its models
/// could not be had (spec §6, departed peers at inference): the parts whose model `arrived`,
/// renormalised over them. A complete mixture keeps its weights exactly; when nothing with
/// weight is left, the silo `me` alone. The one rule for the node's round engine and the
/// simulator's fault network.
pub fn incomplete_mixture(
    mix: &[(NodeId, f64)],
    arrived: impl Fn(NodeId) -> bool,
    me: NodeId,
) -> Vec<(NodeId, f64)> {
    let kept: Vec<(NodeId, f64)> = mix.iter().copied().filter(|&(j, _)| arrived(j)).collect();
    if kept.len() == mix.len() {
        return kept;
    }
    let total: f64 = kept.iter().map(|x| x.1).sum();
    if total > 0.0 {
        kept.into_iter().map(|(j, w)| (j, w / total)).collect()
    } else {
        vec![(me, 1.0)]
    }
}

/// Rounds a suspect sits out after the `n`-th failure counted from `suspect_after` (n ≥ 1):
/// 2, 4, 8, … up to [`MAX_BACKOFF_ROUNDS`].
pub fn backoff_rounds(n: u32) -> u64 {
    (1u64 << n.min(63)).min(MAX_BACKOFF_ROUNDS)
}

/// ChaCha12's exact position as 49 bytes (key, stream, word position).
mod rng_state {
    use chacha20::ChaCha12Rng;
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(rng: &ChaCha12Rng, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&rng.serialize_state())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ChaCha12Rng, D::Error> {
        let bytes: Vec<u8> = serde::de::Deserialize::deserialize(d)?;
        let state: [u8; 49] = bytes.as_slice().try_into().map_err(|_| {
            serde::de::Error::custom(format!(
                "sampling RNG state must be 49 bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(ChaCha12Rng::deserialize_state(&state))
    }
}

#[cfg(test)]
mod tests;
