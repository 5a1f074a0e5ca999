//! A FedeRiCo silo's releases under differential privacy (spec `privacy.md` §2–§3).
//!
//! Owns: the Poisson samples, the DP-SGD gradient and E-step loss releases of a silo's rows
//! (through [`Learner::private_grads`] and [`Learner::private_losses`]), recording each in
//! the silo's [`Ledger`] before it is made, and refusing the one that would exceed the budget.
//! Must not: decide weights or whom to send to (the core), or talk to anyone.
//!
//! Every release is seen by every member: each step's gradients include the silo's own model's
//! (jointly clipped, one mechanism), and any member may pull that model; the E-step's losses
//! decide whom the silo samples, which those it samples see. So the ledger's view against one
//! peer equals the view against everyone under this recipe.
//!
//! The noise and the samples are secret (the operating system's randomness: a node's default)
//! or follow the run seed and the silo (`privacy.noise = "seeded"`, the simulator's default, so
//! that it and a swarm's nodes make the same draws): reproducible, and so **not secret** from a
//! member who knows the run seed.

use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Clip, Dataset, LearnError, Learner};
use crate::privacy::{
    Audience, Budget, ClipSplit, Ledger, NoiseSource, PrivacyConfig, Release, split,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Stream tags under [`Stream::Privacy`].
const TAG_SAMPLES: u64 = 0xD15A_0001;
const TAG_NOISE: u64 = 0xD15A_0002;

/// One silo's DP state: settings, ledger and streams.
#[derive(Debug)]
pub(crate) struct DpSilo {
    cfg: PrivacyConfig,
    /// σ in force (configured or calibrated).
    sigma: f64,
    ledger: Ledger,
    /// Expected rows per gradient step (`None`: every row, a full-batch M-step).
    batch: Option<usize>,
    samples: StdRng,
    noise: StdRng,
    /// The run seed and the silo, to re-seed the streams on a restart (seeded noise).
    seeded: Option<(u64, NodeId)>,
    /// A release was refused: nothing more comes from the rows.
    exhausted: bool,
    /// The weights of the silo's last step (`clip_split = "weights"` shares the next step's
    /// clip norm by them when the step's own are not known yet).
    last_weights: Vec<(NodeId, f64)>,
}

/// The sample and noise streams: secret (`None`), or seeded by the run seed, the silo and the
/// round they start at (0 for a fresh silo, as the simulator).
fn streams(seeded: Option<(u64, NodeId)>, round: u64) -> (StdRng, StdRng) {
    match seeded {
        None => (rand::make_rng(), rand::make_rng()),
        Some((seed, me)) => {
            let at = |tag: u64| {
                let s = stream_seed(seed ^ tag, me, Stream::Privacy);
                StdRng::seed_from_u64(match round {
                    0 => s,
                    r => stream_seed(
                        s ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                        me,
                        Stream::Privacy,
                    ),
                })
            };
            (at(TAG_SAMPLES), at(TAG_NOISE))
        }
    }
}

/// What a silo whose budget is spent reports as the loss of a model it cannot measure.
pub(crate) fn unmeasured_loss(cfg: &PrivacyConfig) -> f64 {
    cfg.loss_clip
}

impl DpSilo {
    /// Silo `me` of a run seeded `seed` with `(fit, score)` training rows (those that train,
    /// those that score), drawing Poisson samples of `batch` rows expected (`None`: all rows),
    /// in a run that plans `planned` releases (for σ's calibration).
    pub(crate) fn new(
        cfg: &PrivacyConfig,
        seed: u64,
        me: NodeId,
        (fit, score): (usize, usize),
        batch: Option<usize>,
        planned: u64,
    ) -> Self {
        let budget = Budget {
            epsilon: cfg.epsilon,
            delta: cfg.delta_for(fit.max(score)),
        };
        let q = |n: usize| batch.map_or(1.0, |b| (b as f64 / n.max(1) as f64).min(1.0));
        let seeded = (cfg.noise != Some(NoiseSource::Secret)).then_some((seed, me));
        let (samples, noise) = streams(seeded, 0);
        Self {
            cfg: cfg.clone(),
            sigma: cfg.noise_for(budget, q(fit).max(q(score)), planned),
            ledger: Ledger::new(budget),
            batch,
            samples,
            noise,
            seeded,
            exhausted: false,
            last_weights: Vec::new(),
        }
    }

    /// Carries on from `ledger` (a restarted silo's, from its checkpoint) after `round`
    /// rounds: what it released stays spent, under the budget configured now. Seeded streams
    /// restart from a seed of their own for the round, so a restart never repeats the noise of
    /// an earlier release. An error names a ledger that cannot be read as one.
    pub(crate) fn resume(&mut self, ledger: Ledger, round: u64) -> Result<(), String> {
        self.ledger = ledger
            .rebudgeted(self.ledger.budget())
            .ok_or("the checkpoint's privacy ledger is not a ledger of this version")?;
        self.exhausted = false;
        if round > 0 {
            (self.samples, self.noise) = streams(self.seeded, round);
        }
        Ok(())
    }

    /// The ledger.
    pub(crate) fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Whether the budget is spent.
    pub(crate) fn exhausted(&self) -> bool {
        self.exhausted
    }

    /// σ in force.
    pub(crate) fn sigma(&self) -> f64 {
        self.sigma
    }

    /// The settings.
    pub(crate) fn config(&self) -> &PrivacyConfig {
        &self.cfg
    }

    /// A Poisson sample of `0..n` at the rate for `n` rows, and the rate.
    fn sample(&mut self, n: usize) -> (Vec<usize>, f64) {
        let q = match self.batch {
            Some(b) => (b as f64 / n.max(1) as f64).min(1.0),
            None => 1.0,
        };
        let rows = (0..n)
            .filter(|_| self.samples.random::<f64>() < q)
            .collect();
        (rows, q)
    }

    /// Records `r` if it fits the budget; else marks the silo exhausted.
    fn spend(&mut self, r: Release) -> bool {
        if self.exhausted || !self.ledger.affords(r) {
            self.exhausted = true;
            return false;
        }
        self.ledger.record(r, &Audience::Everyone);
        true
    }

    /// Remembers the weights of a step (for the next step's clip split).
    pub(crate) fn weighted(&mut self, weights: &[(NodeId, f64)]) {
        self.last_weights = weights.to_vec();
    }

    /// One DP-SGD step on `models` (by owner) over `data` (the rows that train): each model's
    /// noisy clipped sum over a Poisson sample, times 1/q (an estimate of the sum over all
    /// rows, as the plain recipe's n / batch). The clip is joint, or shared by the weights
    /// ([`Self::weighted`]'s last). `None` once the budget is spent.
    pub(crate) fn gradients(
        &mut self,
        learner: &mut Learner,
        models: &[(NodeId, &[f32])],
        data: &Dataset,
    ) -> Result<Option<Vec<Vec<f32>>>, LearnError> {
        let (rows, q) = self.sample(data.len());
        let release = Release {
            q,
            sigma: self.sigma,
            count: 1,
        };
        if !self.spend(release) {
            return Ok(None);
        }
        let clip = match self.cfg.clip_split {
            ClipSplit::Joint => Clip::Joint(self.cfg.clip),
            ClipSplit::Weights => {
                let ids: Vec<NodeId> = models.iter().map(|(b, _)| *b).collect();
                Clip::Split {
                    total: self.cfg.clip,
                    per_model: split::by_weight(self.cfg.clip, &ids, &self.last_weights),
                }
            }
        };
        let refs: Vec<&[f32]> = models.iter().map(|(_, p)| *p).collect();
        let mut out =
            learner.private_grads(&refs, data, &rows, clip, self.sigma, &mut self.noise)?;
        let rescale = (1.0 / q) as f32;
        for g in &mut out.grads {
            g.iter_mut().for_each(|v| *v *= rescale);
        }
        Ok(Some(out.grads))
    }

    /// The E-step's losses of `models` on `data` (the rows that score): each model's noisy
    /// clipped loss sum over a Poisson sample, over the expected sample size, at least 0.
    /// `None` once the budget is spent.
    pub(crate) fn losses(
        &mut self,
        learner: &mut Learner,
        models: &[&[f32]],
        data: &Dataset,
    ) -> Result<Option<Vec<f64>>, LearnError> {
        let (rows, q) = self.sample(data.len());
        let release = Release {
            q,
            sigma: self.sigma,
            count: 1,
        };
        if !self.spend(release) {
            return Ok(None);
        }
        let sums = learner.private_losses(
            models,
            data,
            &rows,
            self.cfg.loss_clip,
            self.sigma,
            &mut self.noise,
        )?;
        let expected = q * data.len() as f64;
        Ok(Some(
            sums.into_iter().map(|s| (s / expected).max(0.0)).collect(),
        ))
    }
}
