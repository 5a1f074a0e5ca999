//! FedeRiCo's work on one silo's data: the learner jobs of [`crate::core::round`] — measure,
//! scale, step, evaluate.
//!
//! Owns: the silo's own model between rounds (parameters, Adam state, version), which of its
//! training rows train and which only score models (`score_share`: [`score_rows`]), and the
//! arithmetic of a round: mean loss = summed loss / n; each measured gradient scaled in f32 by
//! its owner's fresh weight; one Adam step on the owner's inbox sum (summed in node order by
//! the inbox), or under `mstep = "local_epoch"` S steps on the owner's own batches with the
//! others' part held and corrected ([`FedericoSilo::local_epoch`]); then the version bumped.
//! The node's training thread and the simulator both run exactly this, so a fault-free swarm
//! makes the simulator's decisions.
//! Must not: decide anything (weights come in with the jobs), touch the network, read a clock
//! or write files other than through [`crate::store`] (the [`Checkpoint`] format is here, and
//! its file goes through the store's seal and generations; the drivers say when).

use crate::core::round::{Done, Job, Score};
use crate::core::{GradientInbox, Peer, Steps, l2};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Adam, ClientData, Dataset, Evaluation, LearnError, Learner};
use crate::privacy::{Ledger, PrivacyConfig};
use crate::silo::attack::{Attack, Poisoner};
use crate::silo::batches::{BatchCursor, skip_steps};
use crate::silo::private::{DpSilo, unmeasured_loss};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Arc;

/// One silo's FedeRiCo model and what it holds between the jobs of a round.
#[derive(Debug)]
pub struct FedericoSilo {
    /// φ_i: the silo's own parameters.
    pub params: Vec<f32>,
    /// Its optimizer state.
    pub adam: Adam,
    /// v_i: bumped after every step.
    pub version: u64,
    /// Gradients of the last `Measure`, waiting for their weights.
    pending: Vec<(NodeId, Vec<f32>)>,
    /// What the pending gradients are multiplied by besides their weight: n / batch for a
    /// mini-batch gradient (an unbiased estimate of the full sum, spec §5.4), else 1.
    rescale: f32,
    /// The mini-batch stream of a mini-batch M-step, and the batch size.
    batches: Option<(BatchCursor, usize)>,
    /// `mstep = "local_epoch"`: the owner's own sub-steps after each round's one exchange
    /// ([`Self::with_batches`]); `None`: one step on the inbox's sum.
    own_steps: Option<u64>,
    /// This silo and its weight on its own model, from the round's `Scale` (what its own
    /// sub-steps scale their gradients by).
    own: Option<(NodeId, f64)>,
    /// A poisoning attack in force (fault schedules only).
    poison: Option<Poisoner>,
    /// The training rows split into those that train and those that only score
    /// ([`FedericoSilo::with_score_rows`]); `None`: every row does both.
    split: Option<Split>,
    /// Differential privacy (`[privacy]`): every gradient and loss from the rows a DP release.
    dp: Option<Box<DpSilo>>,
}

/// A silo's training rows as two sets: `fit` (every gradient) and `score` (every loss).
#[derive(Debug)]
struct Split {
    fit_rows: Vec<usize>,
    score_rows: Vec<usize>,
    /// The two sets of the unpoisoned rows, built once.
    fit: Dataset,
    score: Dataset,
}

impl FedericoSilo {
    /// A silo holding `params` as version `version`, with its optimizer.
    pub fn new(params: Vec<f32>, adam: Adam, version: u64) -> Self {
        Self {
            params,
            adam,
            version,
            pending: Vec::new(),
            rescale: 1.0,
            batches: None,
            own_steps: None,
            own: None,
            poison: None,
            split: None,
            dp: None,
        }
    }

    /// Under `privacy` (`None`: none), every gradient and E-step loss this silo (node `me` of a
    /// run seeded `seed`, `n_train` training rows) computes is a DP release recorded in its
    /// ledger ([`crate::silo::private`]): Poisson samples of the batch size of
    /// [`Self::with_batches`] (call it first), or of every row for a full-batch M-step. A run
    /// of `rounds` rounds of `sub_steps` M-step sub-steps (`None`: one full step) plans one
    /// loss release and `sub_steps` gradient releases a round (σ's calibration).
    pub fn with_privacy(
        mut self,
        privacy: Option<&PrivacyConfig>,
        seed: u64,
        me: NodeId,
        n_train: usize,
        (rounds, sub_steps): (u64, Option<u64>),
    ) -> Self {
        self.dp = privacy.map(|cfg| {
            let batch = self.batches.as_ref().map(|(_, b)| *b);
            let planned = rounds * (sub_steps.unwrap_or(1) + 1);
            Box::new(DpSilo::new(
                cfg,
                seed,
                me,
                self.rows(n_train),
                batch,
                planned,
            ))
        });
        self
    }

    /// Carries on from a restarted silo's ledger (its checkpoint's) after `round` rounds
    /// ([`DpSilo::resume`]); call after [`Self::with_privacy`]. A ledger without `[privacy]`
    /// now, or `[privacy]` now without a ledger, is the caller's to report.
    pub fn resume_privacy(&mut self, ledger: Ledger, round: u64) -> Result<(), String> {
        match self.dp.as_deref_mut() {
            Some(dp) => dp.resume(ledger, round),
            None => Ok(()),
        }
    }

    /// The privacy ledger, the noise multiplier in force and whether the budget is spent
    /// (`None`: no `[privacy]`).
    pub fn privacy(&self) -> Option<(&Ledger, f64, bool)> {
        self.dp
            .as_deref()
            .map(|d| (d.ledger(), d.sigma(), d.exhausted()))
    }

    /// [`Self::privacy`] as a run log records it after a round.
    pub fn privacy_record(&self) -> Option<crate::trace::PrivacyRecord> {
        self.privacy()
            .map(|(l, sigma, exhausted)| crate::trace::PrivacyRecord {
                epsilon: l.epsilon(),
                budget: l.budget().epsilon,
                delta: l.budget().delta,
                noise_multiplier: sigma,
                exhausted,
            })
    }

    /// Holds `share` of the training rows `train` of node `me` (a run seeded `seed`) out of
    /// every gradient: they only score models ([`score_rows`]). 0 (or too few rows to hold
    /// any out) keeps every row for both. Call before [`Self::with_batches`], whose stream
    /// then runs over the rows that train.
    pub fn with_score_rows(mut self, share: f64, seed: u64, me: NodeId, train: &Dataset) -> Self {
        let ids = train.strata();
        let mut rng = StdRng::seed_from_u64(stream_seed(seed ^ TAG_SCORE, me, Stream::Batches));
        let (fit_rows, score_rows) = score_rows(&ids, share, &mut rng);
        self.split = (!score_rows.is_empty()).then(|| Split {
            fit: train.subset(&fit_rows),
            score: train.subset(&score_rows),
            fit_rows,
            score_rows,
        });
        self
    }

    /// This silo with `old`'s split of the rows (a restarted silo of a simulation: the split
    /// depends only on the seed, the silo and its rows).
    pub fn with_rows_of(mut self, old: &mut FedericoSilo) -> Self {
        self.split = old.split.take();
        self
    }

    /// How many rows train and how many score (equal to the training rows when none are held
    /// out).
    pub fn rows(&self, n_train: usize) -> (usize, usize) {
        self.split.as_ref().map_or((n_train, n_train), |s| {
            (s.fit_rows.len(), s.score_rows.len())
        })
    }

    /// Starts (`Some`) or ends (`None`) a poisoning attack by this silo, node `me` of a run
    /// seeded `seed`: what it sends and serves from its next job on (`crate::silo::attack`).
    /// The same attack again keeps what it remembers (a stale gradient, a frozen model).
    pub fn set_attack(&mut self, attack: Option<Attack>, me: NodeId, seed: u64) {
        if attack.as_ref() == self.poison.as_ref().map(Poisoner::attack) {
            return;
        }
        self.poison = attack.map(|a| Poisoner::new(a, me, seed));
    }

    /// The attack in force, if any.
    pub fn attack(&self) -> Option<&Attack> {
        self.poison.as_ref().map(Poisoner::attack)
    }

    /// The silo of node `me` in a run seeded `seed` whose M-step takes `steps` a round: the
    /// stream it draws a batch of `batch` from for each sub-step ([`Steps::batches`]; none for
    /// one full step) over its `n_train` rows (those that train, after
    /// [`Self::with_score_rows`]), past the sub-steps of the `rounds_done` rounds already run (a
    /// resumed silo replays its draws: they depend only on the row count). Under `mstep =
    /// "local_epoch"` (`steps.own_steps` = `Some(S)`) the owner then steps S times a round on
    /// its own batches ([`Self::local_epoch`]). The simulator and the node derive the stream
    /// alike, so a fault-free swarm draws the simulator's batches.
    pub fn with_batches(
        mut self,
        steps: Steps,
        seed: u64,
        me: NodeId,
        n_train: usize,
        batch: usize,
        rounds_done: u64,
    ) -> Self {
        self.own_steps = steps.own_steps;
        let Some(s) = steps.batches() else {
            return self;
        };
        let rng = StdRng::seed_from_u64(stream_seed(seed ^ 0xFEDE, me, Stream::Batches));
        let (n_fit, _) = self.rows(n_train);
        let mut cursor = BatchCursor::new(n_fit, rng);
        skip_steps(&mut cursor, batch, (rounds_done * s) as usize);
        self.batches = Some((cursor, batch));
        self
    }

    /// The next mini-batch's rows and their rescale n / |batch|.
    fn next_batch(&mut self, n: usize) -> Result<(Vec<usize>, f32), LearnError> {
        let Some((cursor, batch)) = self.batches.as_mut() else {
            return Err(LearnError::Shape(
                "a mini-batch job for a silo built without a batch stream".into(),
            ));
        };
        let rows = cursor.next(*batch);
        let rescale = n as f32 / rows.len() as f32;
        Ok((rows, rescale))
    }

    /// Runs one job on `learner` over the silo's `data`.
    pub fn run(
        &mut self,
        learner: &mut Learner,
        data: &ClientData,
        job: Job,
    ) -> Result<Done, LearnError> {
        let flipped = self.poison.as_mut().and_then(|p| p.train_rows(&data.train));
        // The rows that train and those that score: built once, or from the poisoned rows.
        // Out of `self` while the job runs, which borrows the silo mutably.
        let split = self.split.take();
        let parts = match (&split, &flipped) {
            (None, _) => None,
            (Some(s), None) => Some((Cow::Borrowed(&s.fit), Cow::Borrowed(&s.score))),
            (Some(s), Some(f)) => Some((
                Cow::Owned(f.subset(&s.fit_rows)),
                Cow::Owned(f.subset(&s.score_rows)),
            )),
        };
        let train = flipped.as_deref().unwrap_or(&data.train);
        let (fit, held) = match &parts {
            Some((f, h)) => (f.as_ref(), h.as_ref()),
            None => (train, train),
        };
        let rows = Rows {
            fit,
            score: held,
            held_out: parts.is_some(),
        };
        let done = self.job(learner, data, rows, job);
        drop(parts);
        self.split = split;
        let mut done = done?;
        if let Some(p) = self.poison.as_mut() {
            match &mut done {
                Done::Scaled { grads } => p.gradients(grads),
                Done::Stepped { params, .. } => *params = p.served(params.clone()),
                _ => {}
            }
        }
        Ok(done)
    }

    fn job(
        &mut self,
        learner: &mut Learner,
        data: &ClientData,
        rows: Rows<'_>,
        job: Job,
    ) -> Result<Done, LearnError> {
        let (train, held, split) = (rows.fit, rows.score, rows.held_out);
        if let Some(dp) = self.dp.as_deref_mut() {
            match job {
                Job::Measure { models, .. } => {
                    let (losses, grads) = private_measure(dp, learner, &models, train, held)?;
                    self.pending = grads;
                    self.rescale = 1.0;
                    return Ok(Done::Measured { losses });
                }
                Job::Descend { models } => {
                    return Ok(Done::Scaled {
                        grads: private_descend(dp, learner, &models, train)?,
                    });
                }
                Job::Scale { ref weights } => dp.weighted(weights),
                _ => {}
            }
        }
        Ok(match job {
            Job::Measure {
                models,
                batched: false,
            } => {
                self.pending.clear();
                self.rescale = 1.0;
                let mut losses = Vec::with_capacity(models.len());
                for (b, params) in models {
                    let (loss_sum, grad) = learner.loss_and_grad(&params, train, None)?;
                    let loss = if split {
                        learner.evaluate(&params, held)?.mean_loss()
                    } else {
                        loss_sum / train.len() as f64
                    };
                    losses.push((b, loss));
                    self.pending.push((b, grad));
                }
                Done::Measured { losses }
            }
            Job::Measure {
                models,
                batched: true,
            } => {
                self.pending.clear();
                let (rows, rescale) = self.next_batch(train.len())?;
                self.rescale = rescale;
                let mut losses = Vec::with_capacity(models.len());
                for (b, params) in models {
                    losses.push((b, learner.evaluate(&params, held)?.mean_loss()));
                    let (_, grad) = learner.loss_and_grad(&params, train, Some(&rows))?;
                    self.pending.push((b, grad));
                }
                Done::Measured { losses }
            }
            Job::Scale { weights } => {
                // The own model is measured last.
                self.own = self.pending.last().map(|(me, _)| {
                    let w = weights.iter().find(|(id, _)| id == me).map_or(0.0, |x| x.1);
                    (*me, w)
                });
                let mut grads = std::mem::take(&mut self.pending);
                for (b, g) in &mut grads {
                    let w = weights.iter().find(|(id, _)| id == b).map_or(0.0, |x| x.1);
                    // The weight rounded to f32 once, then times the rescale in f32.
                    scale(g, ((w as f32) * self.rescale) as f64);
                }
                Done::Scaled { grads }
            }
            Job::Descend { models } => {
                let (rows, rescale) = self.next_batch(train.len())?;
                let mut grads = Vec::with_capacity(models.len());
                for (b, params, w) in models {
                    let (_, mut grad) = learner.loss_and_grad(&params, train, Some(&rows))?;
                    scale(&mut grad, ((w as f32) * rescale) as f64);
                    grads.push((b, grad));
                }
                Done::Scaled { grads }
            }
            Job::Step { inbox } => {
                match (self.own_steps, self.own.take()) {
                    (Some(steps), Some(own)) => {
                        self.local_epoch(learner, train, &inbox, steps, own)?
                    }
                    _ => self.adam.step(&mut self.params, &inbox.sum()),
                }
                self.version += 1;
                Done::Stepped {
                    params: Arc::new(self.params.clone()),
                    version: self.version,
                }
            }
            Job::Evaluate { round, parts } => {
                let parts: Vec<(&[f32], f64)> =
                    parts.iter().map(|(_, p, w)| (p.as_slice(), *w)).collect();
                let eval = learner.evaluate_mixture(&parts, &data.test)?;
                Done::Evaluated {
                    round,
                    score: score(&eval),
                }
            }
        })
    }
}

impl FedericoSilo {
    /// `mstep = "local_epoch"`'s step from `inbox`, the round's one exchange: `steps` Adam steps,
    /// each on the owner's gradient m over its next mini-batch (rescaled to its data's size and
    /// scaled by `own`'s weight, as `epoch`'s sub-steps) plus the others' gradients F as they
    /// came ([`GradientInbox::foreign_sum`]), which
    /// were taken at the version the round started from. As the model moves away from it, F
    /// would go stale; each step corrects it by the change of the owner's own gradient since
    /// then, scaled by how much the others weigh against the owner (SCAFFOLD's control
    /// variate, Karimireddy et al. 2020): the step's input is m·(1 + r) − r·o + F, o the owner's
    /// gradient of the exchange (all its rows, at the round's start) and r = ‖F‖ / ‖o‖. At the
    /// round's start it is F + o, `full`'s sum, in expectation. Without the correction the held
    /// F pushes S times along one direction: 3 points lost on Fashion-MNIST Dir(0.4) at 150 rows
    /// a silo (`docs/performance.md`).
    fn local_epoch(
        &mut self,
        learner: &mut Learner,
        train: &Dataset,
        inbox: &GradientInbox,
        steps: u64,
        (me, weight): (NodeId, f64),
    ) -> Result<(), LearnError> {
        let foreign = inbox.foreign_sum(me);
        let zeros;
        let own = match inbox.own(me) {
            Some(o) => o,
            None => {
                zeros = vec![0f32; foreign.len()];
                &zeros
            }
        };
        let own_norm = l2(own);
        let r = if own_norm > 0.0 {
            (l2(&foreign) / own_norm) as f32
        } else {
            0.0
        };
        for _ in 0..steps {
            let (rows, rescale) = self.next_batch(train.len())?;
            let (_, mut g) = learner.loss_and_grad(&self.params, train, Some(&rows))?;
            scale(&mut g, ((weight as f32) * rescale) as f64);
            for ((m, f), o) in g.iter_mut().zip(&foreign).zip(own) {
                *m = *m * (1.0 + r) - r * o + f;
            }
            self.adam.step(&mut self.params, &g);
        }
        Ok(())
    }
}

/// A `Measure` under differential privacy: the E-step's noisy losses on the rows that score,
/// and each model's DP-SGD gradient on the rows that train (zeros, and the worst loss, once the
/// budget is spent).
type Measured = (Vec<(NodeId, f64)>, Vec<(NodeId, Vec<f32>)>);

fn private_measure(
    dp: &mut DpSilo,
    learner: &mut Learner,
    models: &[(NodeId, Arc<Vec<f32>>)],
    train: &Dataset,
    held: &Dataset,
) -> Result<Measured, LearnError> {
    let refs: Vec<&[f32]> = models.iter().map(|(_, p)| p.as_slice()).collect();
    let losses = match dp.losses(learner, &refs, held)? {
        Some(l) => l,
        None => vec![unmeasured_loss(dp.config()); models.len()],
    };
    let owned: Vec<(NodeId, &[f32])> = models.iter().map(|(b, p)| (*b, p.as_slice())).collect();
    let grads = match dp.gradients(learner, &owned, train)? {
        Some(g) => g,
        None => vec![vec![0.0; learner.num_params()]; models.len()],
    };
    let ids = || models.iter().map(|(b, _)| *b);
    Ok((ids().zip(losses).collect(), ids().zip(grads).collect()))
}

/// A `Descend` under differential privacy: each model's DP-SGD gradient times its weight (zeros
/// once the budget is spent).
fn private_descend(
    dp: &mut DpSilo,
    learner: &mut Learner,
    models: &[(NodeId, Arc<Vec<f32>>, f64)],
    train: &Dataset,
) -> Result<Vec<(NodeId, Vec<f32>)>, LearnError> {
    // A descent knows its weights now: the clip split follows them.
    dp.weighted(&models.iter().map(|(b, _, w)| (*b, *w)).collect::<Vec<_>>());
    let owned: Vec<(NodeId, &[f32])> = models.iter().map(|(b, p, _)| (*b, p.as_slice())).collect();
    let grads = dp
        .gradients(learner, &owned, train)?
        .unwrap_or_else(|| vec![vec![0.0; learner.num_params()]; models.len()]);
    Ok(models
        .iter()
        .zip(grads)
        .map(|((b, _, w), mut g)| {
            scale(&mut g, f64::from(*w as f32));
            (*b, g)
        })
        .collect())
}

/// The rows a job uses: those that train (every gradient) and those that score (every loss);
/// the same rows twice when none are held out.
struct Rows<'a> {
    fit: &'a Dataset,
    score: &'a Dataset,
    /// The two differ (some rows only score).
    held_out: bool,
}

/// Stream tag of the score rows' draw (mixed into the run seed).
const TAG_SCORE: u64 = 0x5C0E_0001;

/// Splits a silo's training rows (given by their class ids; one class for a regression target)
/// into `(fit, score)`: `round(share · n)` rows score, at most `n − 1`, taken one at a time from
/// the class furthest below its share of them (ties in a shuffled order), so each class gives
/// about its share and a silo with a few rows per class gives one row of as many classes as
/// it can; never a class's last row (it stays to train). Each class's rows
/// are shuffled with `rng`. Both lists ascending.
pub fn score_rows<R: rand::Rng + ?Sized>(
    ids: &[u32],
    share: f64,
    rng: &mut R,
) -> (Vec<usize>, Vec<usize>) {
    use rand::seq::SliceRandom;
    let n = ids.len();
    let want = ((share * n as f64).round() as usize).min(n.saturating_sub(1));
    let classes = ids.iter().map(|&c| c as usize + 1).max().unwrap_or(0);
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); classes];
    for (i, &c) in ids.iter().enumerate() {
        by_class[c as usize].push(i);
    }
    let mut order: Vec<usize> = (0..classes).collect();
    order.shuffle(rng);
    for rows in &mut by_class {
        rows.shuffle(rng);
    }
    // A class's due: its share of `want` (size · want / n) less what it gave, times n.
    let sizes: Vec<i64> = by_class.iter().map(|r| r.len() as i64).collect();
    let mut given = vec![0i64; classes];
    let mut score = Vec::with_capacity(want);
    while score.len() < want {
        // The class furthest below its share (first in the shuffled order among equals).
        let due = |c: usize| sizes[c] * want as i64 - given[c] * n as i64;
        let Some((_, &c)) = order
            .iter()
            .enumerate()
            .filter(|(_, c)| by_class[**c].len() > 1)
            .max_by_key(|(at, c)| (due(**c), std::cmp::Reverse(*at)))
        else {
            break;
        };
        score.push(by_class[c].pop().expect("more than one row"));
        given[c] += 1;
    }
    let mut fit: Vec<usize> = by_class.into_iter().flatten().collect();
    fit.sort_unstable();
    score.sort_unstable();
    (fit, score)
}

/// Multiplies a gradient by a weight, in f32 (the weight rounded once).
pub fn scale(g: &mut [f32], w: f64) {
    let w = w as f32;
    for x in g {
        *x *= w;
    }
}

/// A learner's evaluation as the round's numbers.
pub fn score(e: &Evaluation) -> Score {
    Score {
        loss_sum: e.loss_sum,
        correct: e.correct,
        count: e.count,
    }
}

/// A node's whole state on disk (DESIGN: model, optimizer, collaborator table, round, RNG),
/// written atomically after every round (`<state_dir>/checkpoint.bin`).
#[derive(Serialize, Deserialize)]
pub struct Checkpoint {
    /// The key's peer ID, to refuse a checkpoint of another silo.
    pub peer_id: String,
    /// Rounds completed.
    pub round: u64,
    /// v_i.
    pub version: u64,
    /// The silo's own parameters.
    pub params: Vec<f32>,
    /// Its optimizer state.
    pub adam: Adam,
    /// The FedeRiCo core: table, sampling RNG position, liveness.
    pub peer: Peer,
    /// Under `[privacy]`: the ledger of everything released so far (a restart must not forget
    /// what was spent).
    pub privacy: Option<Ledger>,
}

const MAGIC: &[u8; 8] = b"FEDCKPT1";
/// 2: `FedericoConfig` (inside the core's state) gained `clip_norm`.
/// 3: the core's per-peer failures gained the round of the last one and the heartbeat probe
/// (suspects back off exponentially); an older checkpoint is refused by name, not misread.
/// 4: `FedericoConfig` gained `variant` and `push_cut`.
/// 5: `FedericoConfig::mstep` became optional (absent: the variant's); `foreign_cap`.
/// 6: `FedericoConfig` gained `soften`.
/// 7: `FedericoConfig::loss_scale` became optional (absent: the variant's) and gained `auto`.
/// 8: `FedericoConfig` gained `own_floor`.
/// 9: `FedericoConfig` gained `score_share`.
/// 10: the core gained each member's flag average (`[defences] distrust`).
/// 11: the privacy ledger (`[privacy]`).
const VERSION: u32 = 11;

impl Checkpoint {
    /// The file's bytes inside the store's seal (header and body; [`Checkpoint::save`] seals
    /// them).
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = crate::store::header(MAGIC, VERSION);
        bincode::serde::encode_into_std_write(self, &mut out, bincode::config::standard())
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Writes the checkpoint to `path`: sealed with its checksum, atomically, the file it
    /// replaces kept as the previous generation ([`crate::store::save`]).
    pub fn save(&self, path: &std::path::Path) -> Result<(), String> {
        let bytes = self.encode()?;
        crate::store::save(path, &bytes)
            .map_err(|e| format!("writing checkpoint {}: {e}", path.display()))
    }

    /// Reads a checkpoint; `None` when there is none yet. A latest that fails its checksum or
    /// does not decode falls back to the previous generation with a warning (the state of one
    /// round earlier); the error names both files when neither loads.
    pub fn read(path: &std::path::Path) -> Result<Option<Self>, String> {
        Ok(Self::load(path)?.map(|l| l.value))
    }

    /// [`Checkpoint::read`] for the node that resumes from it: after a fallback, the previous
    /// generation is put back as the latest ([`crate::store::restore_previous`]; the refused
    /// file is kept as `checkpoint.bin.corrupt`), so the next write keeps a good previous one
    /// (when that fails, a warning: the node resumes all the same).
    pub fn resume(path: &std::path::Path) -> Result<Option<Self>, String> {
        let Some(l) = Self::load(path)? else {
            return Ok(None);
        };
        if l.fell_back.is_some()
            && let Err(e) = crate::store::restore_previous(path)
        {
            // Resuming goes on: only the next write's previous generation is the refused file.
            tracing::warn!(
                file = %path.display(),
                error = %e,
                "could not put the previous checkpoint back as the latest"
            );
        }
        Ok(Some(l.value))
    }

    /// [`Checkpoint::read`], saying which generation it came from.
    pub fn load(path: &std::path::Path) -> Result<Option<crate::store::Loaded<Self>>, String> {
        crate::store::load(path, Self::decode).map_err(|e| format!("checkpoint {e}"))
    }

    /// Decodes a checkpoint's bytes (header, version and body checked; the seal, when there
    /// is one, is the store's to strip).
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let body = crate::store::strip_header(bytes, MAGIC, VERSION)?;
        let (c, n): (Self, usize) =
            crate::store::decode_bounded(body).map_err(|e| format!("undecodable ({e})"))?;
        if n != body.len() {
            return Err("trailing bytes".into());
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{FedericoConfig, MStep};

    /// A real checkpoint of a 3-member federation's node after `round` rounds (small model).
    fn checkpoint(round: u64) -> Checkpoint {
        let params: Vec<f32> = (0..200)
            .map(|i| (i as f32 * 0.37 + round as f32).sin())
            .collect();
        let peer = Peer::new(NodeId(0), (0..3).map(NodeId), FedericoConfig::default(), 42);
        Checkpoint {
            peer_id: "12D3KooWtest".into(),
            round,
            version: round,
            params,
            adam: Adam::new(200, 0.01),
            peer,
            privacy: Some({
                use crate::privacy::{Audience, Budget, Release};
                let mut l = Ledger::new(Budget {
                    epsilon: 4.0,
                    delta: 1e-5,
                });
                let r = Release {
                    q: 0.1,
                    sigma: 1.0,
                    count: round as u32 + 1,
                };
                l.record(r, &Audience::Everyone);
                l
            }),
        }
    }

    /// Every single-byte corruption of a written checkpoint, at every offset and with three
    /// flip patterns, is refused by the read (the seal's checksum, or the header check for the
    /// seal's own magic): never a silent load of other state.
    #[test]
    fn every_single_byte_corruption_of_a_checkpoint_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.bin");
        checkpoint(7).save(&path).unwrap();
        let good = std::fs::read(&path).unwrap();
        assert!(good.len() > 2000, "{} bytes", good.len());
        // What `load` does with a file's bytes.
        let read = |b: &[u8]| crate::store::unseal(b).and_then(|u| Checkpoint::decode(u.bytes()));
        assert_eq!(read(&good).unwrap().round, 7);
        let (mut refused, mut tries) = (0, 0);
        for offset in 0..good.len() {
            for flip in [0x01u8, 0x80, 0xFF] {
                let mut bad = good.clone();
                bad[offset] ^= flip;
                tries += 1;
                match read(&bad) {
                    Err(_) => refused += 1,
                    Ok(c) => panic!("offset {offset} ^{flip:#x} loaded round {}", c.round),
                }
            }
        }
        assert_eq!(refused, good.len() * 3);
        // The figure for docs/hardening.md.
        eprintln!(
            "checkpoint of {} bytes: {refused} of {tries} single-byte corruptions (every offset, \
             xor 01/80/ff) refused",
            good.len()
        );
    }

    /// On disk, a corrupt latest checkpoint falls back to the previous generation (one round
    /// earlier), and without one it is an error naming the file: over the seal, the header
    /// and a spread of body offsets.
    #[test]
    fn a_corrupt_checkpoint_falls_back_to_the_previous_one_or_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (lone, kept) = (dir.path().join("lone"), dir.path().join("kept"));
        std::fs::create_dir(&lone).unwrap();
        std::fs::create_dir(&kept).unwrap();
        let (lone, kept) = (lone.join("checkpoint.bin"), kept.join("checkpoint.bin"));
        checkpoint(7).save(&lone).unwrap();
        checkpoint(6).save(&kept).unwrap();
        checkpoint(7).save(&kept).unwrap();
        let good = std::fs::read(&kept).unwrap();
        for offset in (0..32).chain((32..good.len()).step_by(61)) {
            let mut bad = good.clone();
            bad[offset] ^= 0x80;
            std::fs::write(&lone, &bad).unwrap();
            let e = Checkpoint::load(&lone)
                .err()
                .expect("a corrupt lone checkpoint loaded");
            assert!(e.contains("lone/checkpoint.bin:"), "{e}");
            assert!(e.contains("no previous generation"), "{e}");
            std::fs::write(&kept, &bad).unwrap();
            let l = Checkpoint::load(&kept).unwrap().unwrap();
            assert_eq!(l.value.round, 6, "offset {offset}");
            assert_eq!(l.from, crate::store::prev_path(&kept));
            assert!(l.fell_back.is_some());
        }
        // Both corrupt: an error naming both files.
        let prev = crate::store::prev_path(&kept);
        let mut bad = std::fs::read(&prev).unwrap();
        bad[100] ^= 0x01;
        std::fs::write(&prev, &bad).unwrap();
        let e = Checkpoint::load(&kept).err().unwrap();
        assert!(e.contains("kept/checkpoint.bin:"), "{e}");
        assert!(e.contains("kept/checkpoint.bin.prev:"), "{e}");
    }

    #[test]
    fn score_rows_spread_over_the_classes_and_never_take_a_class_s_last_row() {
        // 10 rows of class 0, 3 of class 1, 1 of class 2.
        let ids: Vec<u32> = [vec![0; 10], vec![1; 3], vec![2]].concat();
        let draw =
            |share: f64, seed: u64| score_rows(&ids, share, &mut StdRng::seed_from_u64(seed));
        let (fit, score) = draw(0.25, 1);
        assert_eq!(score.len(), 4, "round(0.25 · 14)");
        let mut all = [fit.clone(), score.clone()].concat();
        all.sort_unstable();
        assert_eq!(all, (0..14).collect::<Vec<_>>(), "disjoint, and all rows");
        let of = |c: u32| score.iter().filter(|&&i| ids[i] == c).count();
        // Each class about its share of 4: 2.9, 0.9 and 0.3.
        assert_eq!((of(0), of(1), of(2)), (3, 1, 0), "{score:?}");
        // Two rows of each of ten classes, four held out: from four classes.
        let pairs: Vec<u32> = (0..20).map(|i| i / 2).collect();
        let (_, spread) = score_rows(&pairs, 0.2, &mut StdRng::seed_from_u64(5));
        let mut classes: Vec<u32> = spread.iter().map(|&i| pairs[i]).collect();
        classes.dedup();
        assert_eq!(classes.len(), 4, "{spread:?}");
        assert_eq!(
            draw(0.25, 1),
            (fit, score),
            "the same stream, the same rows"
        );
        assert_ne!(
            draw(0.25, 2).1,
            draw(0.25, 1).1,
            "another stream, other rows"
        );
        // Nothing held out at 0; at most every class's rows but one.
        assert!(draw(0.0, 1).1.is_empty());
        assert_eq!(draw(0.5, 1).1.len(), 7);
        let (fit, score) = score_rows(&[0, 1, 2], 0.5, &mut StdRng::seed_from_u64(1));
        assert_eq!(
            (fit.len(), score.len()),
            (3, 0),
            "one row per class: all train"
        );
    }

    /// `n` rows of 3 features in two classes (train and test alike), and a small MLP for them.
    fn tiny_silo(n: usize) -> (ClientData, crate::learn::ModelSpec) {
        use crate::learn::{Labels, ModelSpec};
        let train = Dataset::new(
            (0..n * 3).map(|i| ((i * 13) % 7) as f32 / 7.0).collect(),
            vec![3],
            Labels::Class {
                ids: (0..n).map(|i| (i % 2) as u32).collect(),
                num_classes: 2,
            },
        )
        .unwrap();
        let data = ClientData {
            train: train.clone(),
            test: train,
            group: None,
        };
        let spec = ModelSpec::Mlp {
            inputs: 3,
            hidden: vec![4],
            classes: 2,
        };
        (data, spec)
    }

    /// Held-out rows never enter a gradient, and every loss is theirs: the measured loss is
    /// the model's mean loss on the score rows, the gradient the one over the rows that train.
    #[test]
    fn a_silo_holding_rows_out_scores_on_them_and_trains_on_the_rest() {
        use crate::core::round::{Done, Job};
        let n = 20;
        let (data, spec) = tiny_silo(n);
        let train = data.train.clone();
        let mut learner = Learner::new(&spec, 8).unwrap();
        let params = learner.init_params(&mut StdRng::seed_from_u64(3));
        let mut silo = FedericoSilo::new(params.clone(), Adam::new(params.len(), 0.01), 0)
            .with_score_rows(0.25, 9, NodeId(1), &train);
        assert_eq!(silo.rows(n), (15, 5));
        let (fit_rows, score_rows) = {
            let s = silo.split.as_ref().unwrap();
            (s.fit_rows.clone(), s.score_rows.clone())
        };
        let me = NodeId(1);
        let measure = Job::Measure {
            models: vec![(me, Arc::new(params.clone()))],
            batched: false,
        };
        let Done::Measured { losses } = silo.run(&mut learner, &data, measure).unwrap() else {
            panic!("not a measure");
        };
        let held = learner
            .evaluate(&params, &train.subset(&score_rows))
            .unwrap();
        assert_eq!(losses, vec![(me, held.mean_loss())]);
        let everyone = learner.evaluate(&params, &train).unwrap().mean_loss();
        assert_ne!(losses[0].1, everyone, "scored on every row");
        let scale = Job::Scale {
            weights: vec![(me, 1.0)],
        };
        let Done::Scaled { grads } = silo.run(&mut learner, &data, scale).unwrap() else {
            panic!("not a scale");
        };
        let (_, fit_grad) = learner
            .loss_and_grad(&params, &train.subset(&fit_rows), None)
            .unwrap();
        assert_eq!(grads, vec![(me, fit_grad)]);
        // Mini-batches come from the rows that train only.
        let mut silo = silo.with_batches(MStep::Minibatch(4).steps(1), 9, me, n, 8, 0);
        let (cursor, _) = silo.batches.as_mut().unwrap();
        for _ in 0..10 {
            assert!(cursor.next(8).iter().all(|&i| i < 15));
        }
    }

    /// `mstep = "local_epoch"`: one exchange, then the owner's own sub-steps. A peer that holds
    /// the owner's very rows sends, at weight 0.3, the gradient the owner's own would be at
    /// 0.3: held as it came, it goes stale as the model moves; corrected, every sub-step's
    /// input is the fresh gradient at weight 0.7 + 0.3, so the owner ends where an owner alone
    /// at weight 1.0 ends (without the correction it ends elsewhere: the held part pushes
    /// along the round's first direction).
    #[test]
    fn a_local_epoch_corrects_the_others_held_gradient_by_the_owners_own() {
        use crate::core::round::{Done, Job};
        let n = 24;
        let (data, spec) = tiny_silo(n);
        let train = data.train.clone();
        let mut learner = Learner::new(&spec, 8).unwrap();
        let params = learner.init_params(&mut StdRng::seed_from_u64(3));
        let (me, twin) = (NodeId(1), NodeId(0));
        let (_, full) = learner.loss_and_grad(&params, &train, None).unwrap();
        // One round of `silo` with the others' gradients `others`, its own weight `w`.
        let round = |w: f64, others: Vec<(NodeId, Vec<f32>)>| {
            let mut learner = Learner::new(&spec, 8).unwrap();
            let mut silo = FedericoSilo::new(params.clone(), Adam::new(params.len(), 0.05), 0)
                .with_batches(MStep::LocalEpoch.steps(5), 9, me, n, 8, 0);
            let measure = Job::Measure {
                models: vec![(me, Arc::new(params.clone()))],
                batched: false,
            };
            silo.run(&mut learner, &data, measure).unwrap();
            let scale = Job::Scale {
                weights: vec![(me, w)],
            };
            let Done::Scaled { grads } = silo.run(&mut learner, &data, scale).unwrap() else {
                panic!("not a scale");
            };
            let mut inbox = GradientInbox::new(0, params.len());
            for (from, g) in grads.into_iter().chain(others) {
                inbox.expect(from);
                inbox.handle_gradient(from, 0, g).unwrap();
            }
            let Done::Stepped { params, version } =
                silo.run(&mut learner, &data, Job::Step { inbox }).unwrap()
            else {
                panic!("not a step");
            };
            assert_eq!(version, 1);
            params
        };
        let mut from_twin = full.clone();
        scale(&mut from_twin, 0.3);
        let with_twin = round(0.7, vec![(twin, from_twin)]);
        let alone = round(1.0, vec![]);
        assert_ne!(*alone, params, "five steps moved nothing");
        let gap = with_twin
            .iter()
            .zip(alone.iter())
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(gap < 1e-4, "the held gradient was not corrected: {gap}");
    }

    #[test]
    fn a_checkpoint_without_the_seal_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.bin");
        crate::store::write_atomic(&path, &checkpoint(3).encode().unwrap()).unwrap();
        let l = Checkpoint::load(&path).unwrap().unwrap();
        assert_eq!((l.value.round, l.fell_back), (3, None));
        // A later write seals it and keeps it as the previous generation.
        checkpoint(4).save(&path).unwrap();
        assert!(
            std::fs::read(&path)
                .unwrap()
                .starts_with(crate::store::SEAL)
        );
        let prev = Checkpoint::read(&crate::store::prev_path(&path))
            .unwrap()
            .unwrap();
        assert_eq!(prev.round, 3);
    }

    /// Under `[privacy]` every measured loss and gradient is a recorded release, and once the
    /// next would exceed the budget the silo releases nothing from its rows: the worst loss and
    /// zero gradients, its ledger at most ε.
    #[test]
    fn a_private_silo_records_every_release_and_stops_at_its_budget() {
        use crate::core::round::{Done, Job};
        use crate::privacy::PrivacyConfig;
        let n = 40;
        let (data, spec) = tiny_silo(n);
        let mut learner = Learner::new(&spec, 8).unwrap();
        let params = learner.init_params(&mut StdRng::seed_from_u64(3));
        let cfg = PrivacyConfig {
            epsilon: 4.0,
            noise_multiplier: Some(1.0),
            ..PrivacyConfig::default()
        };
        let (me, peer) = (NodeId(1), NodeId(2));
        let silo = |cfg: &PrivacyConfig| {
            FedericoSilo::new(params.clone(), Adam::new(params.len(), 0.01), 0)
                .with_batches(MStep::Minibatch(2).steps(1), 9, me, n, 10, 0)
                .with_privacy(Some(cfg), 9, me, n, (100, Some(2)))
        };
        let models = vec![
            (peer, Arc::new(params.clone())),
            (me, Arc::new(params.clone())),
        ];
        let mut private = silo(&cfg);
        let (mut releases, mut before) = (0, 0.0);
        loop {
            let measure = Job::Measure {
                models: models.clone(),
                batched: true,
            };
            let Done::Measured { losses } = private.run(&mut learner, &data, measure).unwrap()
            else {
                panic!("not a measure");
            };
            let scale = Job::Scale {
                weights: vec![(peer, 0.5), (me, 0.5)],
            };
            let Done::Scaled { grads } = private.run(&mut learner, &data, scale).unwrap() else {
                panic!("not a scale");
            };
            let (ledger, sigma, out) = private.privacy().unwrap();
            assert_eq!(sigma, 1.0);
            assert!(ledger.epsilon() <= 4.0, "spent {}", ledger.epsilon());
            if out {
                // Nothing from the rows: the worst loss, and zeros.
                assert!(
                    losses.iter().all(|&(_, l)| l == cfg.loss_clip),
                    "{losses:?}"
                );
                assert!(grads.iter().all(|(_, g)| g.iter().all(|&x| x == 0.0)));
                assert!(ledger.epsilon() >= before, "the ledger never shrinks");
                break;
            }
            assert!(
                ledger.epsilon() > before,
                "release {releases} was not recorded"
            );
            assert!(grads.iter().all(|(_, g)| g.iter().any(|&x| x != 0.0)));
            before = ledger.epsilon();
            releases += 1;
            assert!(releases < 10_000, "the budget never ran out");
        }
        assert!(releases > 3, "only {releases} rounds fit epsilon = 4");
        // Once out, a later Descend releases nothing either.
        let descend = Job::Descend {
            models: vec![(me, Arc::new(params.clone()), 1.0)],
        };
        let Done::Scaled { grads } = private.run(&mut learner, &data, descend).unwrap() else {
            panic!("not scaled");
        };
        assert!(grads[0].1.iter().all(|&x| x == 0.0));
        // The same seed makes the same releases; without a σ, one is calibrated to the plan.
        let mut again = silo(&cfg);
        let mut first = silo(&cfg);
        let m = || Job::Measure {
            models: models.clone(),
            batched: true,
        };
        let (a, b) = (
            first.run(&mut learner, &data, m()).unwrap(),
            again.run(&mut learner, &data, m()).unwrap(),
        );
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let calibrated = silo(&PrivacyConfig {
            noise_multiplier: None,
            ..cfg.clone()
        });
        let sigma = calibrated.privacy().unwrap().1;
        assert!(sigma > 1.0 && sigma < 100.0, "calibrated sigma {sigma}");
        // A restart carries on from the checkpoint's ledger: what was spent stays spent.
        let scale = || Job::Scale {
            weights: vec![(peer, 0.5), (me, 0.5)],
        };
        let mut early = silo(&cfg);
        early.run(&mut learner, &data, m()).unwrap();
        let partly = early.privacy().unwrap().0.clone();
        let mut restarted = silo(&cfg);
        restarted.resume_privacy(partly.clone(), 1).unwrap();
        restarted.run(&mut learner, &data, m()).unwrap();
        let now = restarted.privacy().unwrap().0.epsilon();
        assert!(now > partly.epsilon(), "{now} after {}", partly.epsilon());
        let spent = private.privacy().unwrap().0.clone();
        let mut restarted = silo(&cfg);
        restarted.resume_privacy(spent.clone(), 7).unwrap();
        restarted.run(&mut learner, &data, m()).unwrap();
        let Done::Scaled { grads } = restarted.run(&mut learner, &data, scale()).unwrap() else {
            panic!("not scaled");
        };
        assert!(grads.iter().all(|(_, g)| g.iter().all(|&x| x == 0.0)));
        assert!(
            restarted.privacy().unwrap().2,
            "a spent budget is spent after a restart"
        );
        assert_eq!(restarted.privacy().unwrap().0.epsilon(), spent.epsilon());
        // Secret noise: two silos alike in everything draw different releases.
        let secret = PrivacyConfig {
            noise: Some(crate::privacy::NoiseSource::Secret),
            ..cfg.clone()
        };
        let (a, b) = (
            silo(&secret).run(&mut learner, &data, m()).unwrap(),
            silo(&secret).run(&mut learner, &data, m()).unwrap(),
        );
        assert_ne!(format!("{a:?}"), format!("{b:?}"));
    }
}
