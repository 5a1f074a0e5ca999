//! A FedCollab silo's side of the pairwise discriminator protocol (spec
//! `docs/specs/fedcollab.md` §3.2), the same in `simulate` and in a coordinated node.
//! Owns: the discriminator of a federation ([`DiscModel`]: its network, the one initialisation
//! every pair starts from, each silo's inputs `[x, 2ν·onehot(y)]`), one silo's half of a pair's
//! run ([`PairHalf`]: plain-SGD steps, the pair average, validation accuracy, the early stop),
//! and the stream tags of FedCollab's random streams.
//! Must not: decide the distance, the structure or the early-stop rule (that is
//! [`crate::coord::fedcollab`]), or exchange anything with the partner (the driver swaps the
//! halves' weights and accuracies).

use super::{BatchCursor, SiloError};
use crate::coord::fedcollab::{
    EarlyStop, FedCollabConfig, average_pair, disc_split, label_branch_scale,
};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Dataset, Labels, LearnError, Learner, ModelSpec};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;

/// Stream tags (mixed into the run seed) keeping FedCollab's random streams apart from every
/// other algorithm's and from each other.
pub(crate) const FL_BATCH_TAG: u64 = 0xFC01_0001;
/// Each silo's discriminator-train/validation split.
const TAG_DISC_SPLIT: u64 = 0xFC01_0002;
/// The one discriminator initialisation shared by all pairs (spec §3.2 step 3).
const TAG_DISC_INIT: u64 = 0xFC01_0003;
/// A silo's mini-batch order inside one pair (the partner's index is mixed in too).
const TAG_DISC_BATCHES: u64 = 0xFC01_0004;

/// One silo's discriminator data, as domain 0 (it is the lower index of a pair) or domain 1.
pub(crate) struct DiscData {
    /// Discriminator-train rows, labelled as domain 0 and as domain 1.
    pub(crate) train: [Dataset; 2],
    /// Validation rows, labelled as domain 0 and as domain 1.
    pub(crate) valid: [Dataset; 2],
}

/// The discriminator of one federation (spec §3.2): the network, the one initialisation w⁰
/// every pair starts from, and how a silo's rows become its inputs. Every silo builds the same
/// one from the run seed and the shape of its own data, so peers need not exchange it.
pub(crate) struct DiscModel {
    pub(crate) spec: ModelSpec,
    pub(crate) init: Vec<f32>,
    in_dim: usize,
    label_dim: usize,
    classes: usize,
    scale: f32,
}

impl DiscModel {
    /// The discriminator for data shaped like `train` (features, classes).
    pub(crate) fn new(
        train: &Dataset,
        cfg: &FedCollabConfig,
        seed: u64,
    ) -> Result<Self, SiloError> {
        let in_dim = train.feature_len();
        // Label branch: one-hot × 2ν for classes (spec §3.2); a regression target as one
        // feature.
        let (label_dim, classes) = match &train.labels {
            Labels::Class { num_classes, .. } => ((*num_classes).max(2), (*num_classes).max(2)),
            Labels::Real(_) => (1, 1),
        };
        let spec = ModelSpec::Mlp {
            inputs: in_dim + label_dim,
            hidden: vec![cfg.disc_hidden],
            classes: 2,
        };
        let init = disc_init(&spec, in_dim, label_dim, cfg.disc_hidden, seed)?;
        Ok(Self {
            spec,
            init,
            in_dim,
            label_dim,
            classes,
            scale: 2.0 * label_branch_scale(classes) as f32,
        })
    }

    /// Silo `index`'s discriminator-train and validation parts (spec §3.2 step 1), as either
    /// domain; `target` is [`disc_train_target`] over every silo's size.
    pub(crate) fn silo_data(
        &self,
        train: &Dataset,
        index: usize,
        seed: u64,
        target: f64,
    ) -> Result<DiscData, SiloError> {
        let ids = train.strata();
        let mut rng = StdRng::seed_from_u64(stream_seed(
            seed ^ TAG_DISC_SPLIT,
            NodeId(index as u32),
            Stream::Batches,
        ));
        let (t, v) = disc_split(&ids, self.classes, target, &mut rng);
        let build = |rows: &[usize], domain: u32| {
            disc_inputs(train, rows, self.in_dim, self.label_dim, self.scale, domain)
        };
        Ok(DiscData {
            train: [build(&t, 0)?, build(&t, 1)?],
            valid: [build(&v, 0)?, build(&v, 1)?],
        })
    }
}

/// Discriminator inputs for `rows` of `train`: features `[x, scale·onehot(y)]` (or `[x, y]` for
/// a regression target), every row labelled `domain`. Concatenating the scaled one-hot into the
/// first layer's input is the paper's two branches summed before the ReLU (spec §3.2): the
/// label branch's ×2 becomes part of the input scale, which leaves the SGD dynamics of the
/// pre-activation unchanged; the two branch biases become one.
fn disc_inputs(
    train: &Dataset,
    rows: &[usize],
    in_dim: usize,
    label_dim: usize,
    scale: f32,
    domain: u32,
) -> Result<Dataset, SiloError> {
    let mut features = Vec::with_capacity(rows.len() * (in_dim + label_dim));
    for &r in rows {
        features.extend_from_slice(train.row(r));
        match &train.labels {
            Labels::Class { ids, .. } => {
                let start = features.len();
                features.resize(start + label_dim, 0.0);
                features[start + ids[r] as usize] = scale;
            }
            Labels::Real(v) => features.push(v[r]),
        }
    }
    Dataset::new(
        features,
        vec![in_dim + label_dim],
        Labels::Class {
            ids: vec![domain; rows.len()],
            num_classes: 2,
        },
    )
    .map_err(|e| SiloError::Invariant(format!("fedcollab discriminator inputs: {e}")))
}

/// The one discriminator initialisation w⁰ for every pair (spec §3.2 step 3): PyTorch's default
/// per layer, except that the label rows of the first layer are drawn as the paper's separate
/// `Linear(L → hidden)` would be, U(±1/√L), rather than with the concatenated fan-in.
///
/// Relies on the documented flat layout of [`Learner`]: `fc0.bias`, `fc0.weight` (`[in, out]`
/// row-major), `fc1.bias`, `fc1.weight`.
fn disc_init(
    spec: &ModelSpec,
    in_dim: usize,
    label_dim: usize,
    hidden: usize,
    seed: u64,
) -> Result<Vec<f32>, SiloError> {
    let learner = Learner::new(spec, 1)?;
    let mut rng = StdRng::seed_from_u64(stream_seed(seed ^ TAG_DISC_INIT, NodeId(0), Stream::Init));
    let mut w = learner.init_params(&mut rng);
    let expected = hidden + (in_dim + label_dim) * hidden + 2 + hidden * 2;
    if w.len() != expected {
        return Err(SiloError::Invariant(format!(
            "fedcollab discriminator: {} parameters, the layout fc0.bias, fc0.weight, fc1.bias, \
             fc1.weight gives {expected}",
            w.len()
        )));
    }
    let bound = 1.0 / (label_dim as f32).sqrt();
    let start = hidden + in_dim * hidden;
    for x in &mut w[start..start + label_dim * hidden] {
        *x = (rng.random::<f32>() * 2.0 - 1.0) * bound;
    }
    Ok(w)
}

/// One silo's half of a pair's Algorithm 1 run over the network (spec §6 phase 2): the steps
/// of the simulator's `run_pair`, split at the exchange. Drive it as: [`step`](Self::step), swap the result
/// with the partner's, [`combine`](Self::combine); when that says so, evaluate with
/// [`accuracy`](Self::accuracy), swap accuracies and [`record`](Self::record). Both halves
/// hold the same average bit for bit (each averages `(lower, higher)` in that order) and apply
/// the same early stop to the same metric, so they stop together with the same estimate.
/// The simulator's `run_pair` drives both halves in one process.
pub(crate) struct PairHalf {
    cfg: FedCollabConfig,
    data: Arc<DiscData>,
    /// This silo is the pair's lower index (domain 0).
    lower: bool,
    w: Vec<f32>,
    cursor: BatchCursor,
    es: EarlyStop,
    rounds: usize,
    stopped: bool,
}

impl PairHalf {
    /// Silo `me`'s half of its pair with `partner`; an error when its own discriminator-train
    /// or validation part is empty (the pair cannot run: its distance becomes 1).
    pub(crate) fn new(
        cfg: &FedCollabConfig,
        model: &DiscModel,
        data: Arc<DiscData>,
        me: usize,
        partner: usize,
        seed: u64,
    ) -> Result<Self, String> {
        let lower = me < partner;
        let d = usize::from(!lower);
        if data.train[d].is_empty() || data.valid[d].is_empty() {
            return Err(format!(
                "silo {me} has {} discriminator-train and {} validation rows",
                data.train[d].len(),
                data.valid[d].len()
            ));
        }
        let cursor = disc_cursor(seed, me, partner, data.train[d].len());
        Ok(Self {
            es: EarlyStop::new(cfg.disc_eval_every, cfg.disc_patience, cfg.disc_max_rounds),
            cfg: cfg.clone(),
            data,
            lower,
            w: model.init.clone(),
            cursor,
            rounds: 0,
            stopped: false,
        })
    }

    /// Rounds completed.
    pub(crate) fn rounds(&self) -> usize {
        self.rounds
    }

    /// The pair has stopped (early, or at the round cap).
    pub(crate) fn done(&self) -> bool {
        self.stopped || self.rounds >= self.es.max_rounds()
    }

    fn domain(&self) -> usize {
        usize::from(!self.lower)
    }

    /// This side's weights for the next round: its SGD steps from the current average.
    pub(crate) fn step(&mut self, learner: &mut Learner) -> Result<Vec<f32>, LearnError> {
        let d = self.domain();
        sgd_steps(
            learner,
            &self.cfg,
            &self.w,
            &self.data.train[d],
            &mut self.cursor,
        )
    }

    /// Averages this side's and the partner's weights of the round; true when the round's
    /// average is to be evaluated. A partner vector of the wrong length is refused.
    pub(crate) fn combine(&mut self, own: &[f32], partner: &[f32]) -> Result<bool, String> {
        if partner.len() != own.len() {
            return Err(format!(
                "the partner sent {} discriminator weights, the discriminator has {}",
                partner.len(),
                own.len()
            ));
        }
        self.w = if self.lower {
            average_pair(own, partner)
        } else {
            average_pair(partner, own)
        };
        let r = self.rounds;
        self.rounds += 1;
        Ok(self.es.evaluates_after(r))
    }

    /// This side's validation accuracy of the current average: the fraction of its own
    /// validation rows predicted as its own domain.
    pub(crate) fn accuracy(&self, learner: &mut Learner) -> Result<f64, LearnError> {
        let e = learner.evaluate(&self.w, &self.data.valid[self.domain()])?;
        Ok(e.correct as f64 / e.count as f64)
    }

    /// Records an evaluation, `acc_lower + acc_higher` in that order; true when the pair stops.
    pub(crate) fn record(&mut self, acc_lower: f64, acc_higher: f64) -> bool {
        if self.es.record(acc_lower + acc_higher) {
            self.stopped = true;
        }
        self.done()
    }

    /// 2·BalAcc_best − 1, once evaluated.
    pub(crate) fn estimate(&self) -> Option<f64> {
        self.es.estimate()
    }
}

/// Silo `me`'s mini-batch order in its pair with `partner`.
fn disc_cursor(seed: u64, me: usize, partner: usize, len: usize) -> BatchCursor {
    let s = stream_seed(
        seed ^ TAG_DISC_BATCHES ^ ((partner as u64) << 32),
        NodeId(me as u32),
        Stream::Batches,
    );
    BatchCursor::new(len, StdRng::seed_from_u64(s))
}

/// `steps` plain-SGD steps (no momentum, no weight decay) from `w` on mini-batches of `data`,
/// each on the batch-mean loss.
fn sgd_steps(
    learner: &mut Learner,
    cfg: &FedCollabConfig,
    w: &[f32],
    data: &Dataset,
    cursor: &mut BatchCursor,
) -> Result<Vec<f32>, LearnError> {
    let mut p = w.to_vec();
    for _ in 0..cfg.disc_local_steps {
        let rows = cursor.next(cfg.disc_batch_size);
        let (_, grad) = learner.loss_and_grad(&p, data, Some(&rows))?;
        let step = (cfg.disc_lr / rows.len() as f64) as f32;
        for (x, g) in p.iter_mut().zip(&grad) {
            *x -= step * g;
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disc_inputs_append_the_scaled_one_hot() {
        let train = Dataset::new(
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            vec![2],
            Labels::Class {
                ids: vec![2, 0, 1],
                num_classes: 3,
            },
        )
        .unwrap();
        let d = disc_inputs(&train, &[2, 0], 2, 3, 7.0, 1).unwrap();
        assert_eq!(
            d.features,
            vec![5.0, 6.0, 0.0, 7.0, 0.0, 1.0, 2.0, 0.0, 0.0, 7.0]
        );
        assert_eq!(
            d.labels,
            Labels::Class {
                ids: vec![1, 1],
                num_classes: 2
            }
        );
    }

    #[test]
    fn disc_init_redraws_only_the_label_rows() {
        let spec = ModelSpec::Mlp {
            inputs: 6,
            hidden: vec![4],
            classes: 2,
        };
        let w = disc_init(&spec, 4, 2, 4, 9).unwrap();
        assert_eq!(w.len(), 4 + 6 * 4 + 2 + 4 * 2);
        // Feature rows keep U(±1/√6); label rows are U(±1/√2), so some exceed 1/√6.
        let feat = &w[4..4 + 16];
        let label = &w[20..28];
        assert!(feat.iter().all(|x| x.abs() <= 1.0 / 6f32.sqrt()));
        assert!(label.iter().all(|x| x.abs() <= 1.0 / 2f32.sqrt()));
        assert!(
            label.iter().any(|x| x.abs() > 1.0 / 6f32.sqrt()),
            "{label:?}"
        );
        assert_eq!(w, disc_init(&spec, 4, 2, 4, 9).unwrap());
    }
}
