//! FedCollab in the simulator (`../shared/specs/fedcollab.md`): distances, structure, then
//! FedAvg inside each coalition, every silo in this process.
//!
//! Owns: the tensor side of the pairwise discriminator protocol (spec §3.2) on every pair of
//! silos: building each silo's discriminator inputs `[x, 2ν·onehot(y)]`, the plain-SGD steps of
//! both sides, the validation accuracies; handing sizes and distances to
//! [`crate::coord::fedcollab`], which decides the coalitions; and the per-round FedAvg inside
//! each coalition (spec §5), with the same local recipe as the FedAvg baseline (one local epoch
//! with the silo's persistent Adam, n_i-weighted averaging).
//! Must not: decide the structure, the early stop or the distance (that is
//! [`crate::coord::fedcollab`]), or touch other algorithms' state.
//!
//! The structure is found in the first round (its time is charged to that round) and is fixed
//! from then on. A record of it (sizes, raw distances, rounds per pair, coalitions, objective,
//! the C sweep of spec §8 item 7) is written to `<seed dir>/fedcollab.json`.

use super::coordinated::CoordinatedRun;
use super::{BatchCursor, ClientEval, Ctx, SimError, score_each};
use crate::coord::fedcollab::{
    Distance, EarlyStop, FedCollabConfig, Problem, Solution, average_pair, coalition_average,
    disc_split, disc_train_target, distance_matrix, label_branch_scale, label_tv,
};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Adam, Dataset, Labels, Learner, ModelSpec};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;
use serde::Serialize;
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

/// The C grid logged with every structure (spec §8 item 7).
const SWEEP: [f64; 9] = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0];

/// FedCollab across the rounds of one seed.
pub(crate) struct FedCollabRun {
    cfg: FedCollabConfig,
    /// Every coalition starts from these weights (spec §5, "initialisation").
    init: Vec<f32>,
    /// Adam state of each silo, kept across rounds as in the FedAvg baseline.
    opts: Vec<Adam>,
    rngs: Vec<StdRng>,
    /// Set in the first round.
    plan: Option<Plan>,
    record: Option<Record>,
}

/// The fixed structure and the coalition models.
struct Plan {
    /// Coalition index of every silo.
    coalition_of: Vec<usize>,
    /// Canonical coalitions.
    coalitions: Vec<Vec<usize>>,
    /// One model per coalition.
    models: Vec<Vec<f32>>,
}

/// What `fedcollab.json` holds.
#[derive(Serialize)]
struct Record {
    capacity: f64,
    distance: Distance,
    /// m_i: training-set sizes.
    sizes: Vec<u64>,
    /// Discriminator protocol only: the per-silo target, and realised split sizes.
    disc_train_target: Option<f64>,
    disc_train_sizes: Vec<usize>,
    disc_valid_sizes: Vec<usize>,
    /// Trainable discriminator parameters (P).
    disc_params: Option<usize>,
    /// Raw estimates (2·BalAcc − 1, before clamping), symmetric, zero diagonal.
    distances_raw: Vec<Vec<f64>>,
    /// Rounds each pair ran, `[i, j, rounds]`.
    pair_rounds: Vec<[usize; 3]>,
    /// Pairs that could not run (an empty split); their distance is 1.
    failed_pairs: Vec<(usize, usize)>,
    solution: Solution,
    sweep: Vec<SweepPoint>,
}

#[derive(Serialize)]
struct SweepPoint {
    capacity: f64,
    coalitions: Vec<Vec<usize>>,
    objective: f64,
}

/// One silo's discriminator data, as domain 0 (it is the lower index of a pair) or domain 1.
pub(crate) struct DiscData {
    train: [Dataset; 2],
    valid: [Dataset; 2],
}

impl FedCollabRun {
    pub(crate) fn new(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Self {
        Self {
            cfg: ctx.scenario.fedcollab.clone(),
            init: init[0].clone(),
            opts: init.iter().map(|p| Adam::new(p.len(), ctx.lr())).collect(),
            rngs: (0..ctx.clients())
                .map(|i| {
                    StdRng::seed_from_u64(stream_seed(
                        ctx.seed ^ FL_BATCH_TAG,
                        NodeId(i as u32),
                        Stream::Batches,
                    ))
                })
                .collect(),
            plan: None,
            record: None,
        }
    }

    /// Distances, then the structure (spec §3, §4).
    fn find_structure(&mut self, ctx: &mut Ctx<'_>) -> Result<Plan, SimError> {
        let sizes: Vec<u64> = ctx
            .fed
            .clients
            .iter()
            .map(|c| c.train.len() as u64)
            .collect();
        let est = match self.cfg.distance {
            Distance::Discriminator => discriminator_distances(ctx, &self.cfg)?,
            Distance::LabelTv => label_tv_distances(ctx),
        };
        let invariant = |e: crate::coord::fedcollab::FedCollabError| {
            SimError::Invariant(format!("fedcollab: {e}"))
        };
        let problem = Problem::new(&sizes, &est.raw, self.cfg.capacity).map_err(invariant)?;
        let solve = |p: &Problem| {
            p.solve_for_run(&self.cfg.solver(), ctx.seed)
                .map_err(invariant)
        };
        let solution = solve(&problem)?;
        let sweep = SWEEP
            .iter()
            .map(|&c| {
                let s = solve(&problem.with_capacity(c).map_err(invariant)?)?;
                Ok(SweepPoint {
                    capacity: c,
                    coalitions: s.best.coalitions,
                    objective: s.best.objective,
                })
            })
            .collect::<Result<Vec<_>, SimError>>()?;
        let coalitions = solution.best.coalitions.clone();
        let mut coalition_of = vec![0; sizes.len()];
        for (k, c) in coalitions.iter().enumerate() {
            for &i in c {
                coalition_of[i] = k;
            }
        }
        self.record = Some(Record {
            capacity: self.cfg.capacity,
            distance: self.cfg.distance,
            sizes,
            disc_train_target: est.target,
            disc_train_sizes: est.train_sizes,
            disc_valid_sizes: est.valid_sizes,
            disc_params: est.params,
            distances_raw: est.raw,
            pair_rounds: est.pair_rounds,
            failed_pairs: est.failed,
            solution,
            sweep,
        });
        Ok(Plan {
            coalition_of,
            models: vec![self.init.clone(); coalitions.len()],
            coalitions,
        })
    }
}

impl CoordinatedRun for FedCollabRun {
    /// The first call finds the structure; every call runs one FedAvg round in each coalition:
    /// every member starts from its coalition's model, trains one local epoch, and the model
    /// becomes the m_j/M_k-weighted average, summed in ascending member order (spec §5, §6).
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        if self.plan.is_none() {
            self.plan = Some(self.find_structure(ctx)?);
        }
        let plan = self.plan.as_mut().expect("set just above");
        let fed = ctx.fed;
        let (models, coalition_of) = (&plan.models, &plan.coalition_of);
        let jobs: Vec<_> = ctx
            .learners
            .iter_mut()
            .zip(self.opts.iter_mut().zip(&mut self.rngs))
            .collect();
        let locals: Vec<Result<Vec<f32>, SimError>> = ctx.pool.install(|| {
            jobs.into_par_iter()
                .enumerate()
                .map(|(i, (learner, (opt, rng)))| {
                    let mut p = models[coalition_of[i]].clone();
                    learner.train_epoch(&mut p, opt, &fed.clients[i].train, rng)?;
                    Ok(p)
                })
                .collect()
        });
        let locals = locals.into_iter().collect::<Result<Vec<_>, _>>()?;
        for (k, members) in plan.coalitions.iter().enumerate() {
            let models: Vec<Option<&[f32]>> = members
                .iter()
                .map(|&i| Some(locals[i].as_slice()))
                .collect();
            let sizes: Vec<u64> = members
                .iter()
                .map(|&i| fed.clients[i].train.len() as u64)
                .collect();
            plan.models[k] = coalition_average(&models, &sizes);
        }
        Ok(())
    }

    /// Each silo's coalition model on its own test split (spec §5, "evaluation").
    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        match &self.plan {
            Some(plan) => score_each(ctx, |i| {
                vec![(plan.models[plan.coalition_of[i]].as_slice(), 1.0)]
            }),
            None => {
                let init = self.init.as_slice();
                score_each(ctx, |_| vec![(init, 1.0)])
            }
        }
    }

    fn record(&self) -> Option<serde_json::Value> {
        self.record
            .as_ref()
            .and_then(|r| serde_json::to_value(r).ok())
    }
}

/// What a distance measurement produced.
struct Estimates {
    raw: Vec<Vec<f64>>,
    target: Option<f64>,
    train_sizes: Vec<usize>,
    valid_sizes: Vec<usize>,
    params: Option<usize>,
    pair_rounds: Vec<[usize; 3]>,
    failed: Vec<(usize, usize)>,
}

/// The [`Distance::LabelTv`] debug distances: TV between training label histograms.
fn label_tv_distances(ctx: &Ctx<'_>) -> Estimates {
    let counts: Vec<Vec<usize>> = ctx
        .fed
        .clients
        .iter()
        .map(|c| c.train.class_counts())
        .collect();
    let n = counts.len();
    let raw = (0..n)
        .map(|i| (0..n).map(|j| label_tv(&counts[i], &counts[j])).collect())
        .collect();
    Estimates {
        raw,
        target: None,
        train_sizes: Vec::new(),
        valid_sizes: Vec::new(),
        params: None,
        pair_rounds: Vec::new(),
        failed: Vec::new(),
    }
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
    pub(crate) fn new(train: &Dataset, cfg: &FedCollabConfig, seed: u64) -> Result<Self, SimError> {
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
    ) -> Result<DiscData, SimError> {
        let ids: Vec<u32> = match &train.labels {
            Labels::Class { ids, .. } => ids.clone(),
            Labels::Real(v) => vec![0; v.len()],
        };
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

/// Algorithm 1 on every pair `i < j` (spec §3.2), pairs in parallel on the worker pool. Each
/// pair's result depends only on the shared initialisation, the two silos' data and the pair's
/// own batch streams, so it does not depend on the number of threads.
fn discriminator_distances(ctx: &Ctx<'_>, cfg: &FedCollabConfig) -> Result<Estimates, SimError> {
    let fed = ctx.fed;
    let n = fed.clients.len();
    let sizes: Vec<u64> = fed.clients.iter().map(|c| c.train.len() as u64).collect();
    let target = disc_train_target(&sizes);
    let model = DiscModel::new(&fed.clients[0].train, cfg, ctx.seed)?;
    let data: Vec<Arc<DiscData>> = (0..n)
        .map(|i| {
            Ok(Arc::new(model.silo_data(
                &fed.clients[i].train,
                i,
                ctx.seed,
                target,
            )?))
        })
        .collect::<Result<Vec<_>, SimError>>()?;
    let (spec, model) = (&model.spec, &model);
    let pairs: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .collect();
    let seed = ctx.seed;
    let results: Vec<Result<Option<(f64, usize)>, SimError>> = ctx.pool.install(|| {
        pairs
            .par_iter()
            .map_init(
                || Learner::new(spec, cfg.disc_batch_size),
                |learner, &(i, j)| {
                    let learner = learner.as_mut().map_err(|e| {
                        SimError::Invariant(format!("fedcollab discriminator: {e}"))
                    })?;
                    run_pair(learner, cfg, model, (i, &data[i]), (j, &data[j]), seed)
                },
            )
            .collect()
    });
    let mut found = Vec::with_capacity(pairs.len());
    let mut pair_rounds = Vec::with_capacity(pairs.len());
    for (&(i, j), r) in pairs.iter().zip(results) {
        let r = r?;
        found.push(((i, j), r.map(|(d, _)| d)));
        if let Some((_, rounds)) = r {
            pair_rounds.push([i, j, rounds]);
        }
    }
    let (raw, failed) = distance_matrix(n, &found);
    Ok(Estimates {
        raw,
        target: Some(target),
        train_sizes: data.iter().map(|d| d.train[0].len()).collect(),
        valid_sizes: data.iter().map(|d| d.valid[0].len()).collect(),
        params: Some(model.init.len()),
        pair_rounds,
        failed,
    })
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
) -> Result<Dataset, SimError> {
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
    .map_err(|e| SimError::Invariant(format!("fedcollab discriminator inputs: {e}")))
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
) -> Result<Vec<f32>, SimError> {
    let learner = Learner::new(spec, 1)?;
    let mut rng = StdRng::seed_from_u64(stream_seed(seed ^ TAG_DISC_INIT, NodeId(0), Stream::Init));
    let mut w = learner.init_params(&mut rng);
    let expected = hidden + (in_dim + label_dim) * hidden + 2 + hidden * 2;
    if w.len() != expected {
        return Err(SimError::Invariant(format!(
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

/// Algorithm 1 for one pair (spec §3.2 step 4), both halves in this process: per round each
/// side takes `disc_local_steps` plain-SGD steps on its own mini-batch from the current average
/// (a fresh optimiser: SGD has no state), the two results are averaged equally, and the
/// schedule of [`EarlyStop`] decides when to evaluate and stop. The two [`PairHalf`]s are the
/// ones a networked pair runs, so `simulate` and the swarm estimate the same distance by
/// construction. Returns `(2·BalAcc_best − 1, rounds run)`, or `None` when a side has no
/// discriminator-train or validation rows.
fn run_pair(
    learner: &mut Learner,
    cfg: &FedCollabConfig,
    model: &DiscModel,
    (i, di): (usize, &Arc<DiscData>),
    (j, dj): (usize, &Arc<DiscData>),
    seed: u64,
) -> Result<Option<(f64, usize)>, SimError> {
    let (Ok(mut lo), Ok(mut hi)) = (
        PairHalf::new(cfg, model, di.clone(), i, j, seed),
        PairHalf::new(cfg, model, dj.clone(), j, i, seed),
    ) else {
        return Ok(None);
    };
    let invariant = |e: String| SimError::Invariant(format!("fedcollab pair ({i}, {j}): {e}"));
    while !lo.done() {
        let (w_lo, w_hi) = (lo.step(learner)?, hi.step(learner)?);
        hi.combine(&w_hi, &w_lo).map_err(invariant)?;
        if lo.combine(&w_lo, &w_hi).map_err(invariant)? {
            let (acc_lo, acc_hi) = (lo.accuracy(learner)?, hi.accuracy(learner)?);
            hi.record(acc_lo, acc_hi);
            lo.record(acc_lo, acc_hi);
        }
    }
    Ok(lo.estimate().map(|d| (d, lo.rounds())))
}

/// One silo's half of a pair's Algorithm 1 run over the network (spec §6 phase 2): the steps
/// of [`run_pair`], split at the exchange. Drive it as: [`step`](Self::step), swap the result
/// with the partner's, [`combine`](Self::combine); when that says so, evaluate with
/// [`accuracy`](Self::accuracy), swap accuracies and [`record`](Self::record). Both halves
/// hold the same average bit for bit (each averages `(lower, higher)` in that order) and apply
/// the same early stop to the same metric, so they stop together with the same estimate.
/// [`run_pair`] drives both halves in one process.
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
    pub(crate) fn step(&mut self, learner: &mut Learner) -> Result<Vec<f32>, SimError> {
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
    pub(crate) fn accuracy(&self, learner: &mut Learner) -> Result<f64, SimError> {
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
) -> Result<Vec<f32>, SimError> {
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
