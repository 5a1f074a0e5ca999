//! FedCollab in the simulator (`docs/specs/fedcollab.md`): distances, structure, then
//! FedAvg inside each coalition, every silo in this process.
//!
//! Owns: the pairwise discriminator protocol (spec §3.2) on every pair of silos, both halves
//! ([`crate::silo::fedcollab`]: each silo's inputs, plain-SGD steps, validation accuracies) in
//! this process; handing sizes and distances to [`crate::coord::fedcollab`], which decides the
//! coalitions; and the per-round FedAvg inside each coalition (spec §5), with the same local
//! recipe as the FedAvg baseline (one local epoch with the silo's persistent Adam, n_i-weighted
//! averaging).
//! Must not: decide the structure, the early stop or the distance (that is
//! [`crate::coord::fedcollab`]), or touch other algorithms' state.
//!
//! The structure is found in the first round (its time is charged to that round) and is fixed
//! from then on. A record of it (sizes, raw distances, rounds per pair, coalitions, objective,
//! the C sweep of spec §8 item 7) is written to `<seed dir>/fedcollab.json`.

use super::coordinated::CoordinatedRun;
use super::pool::{Owner, score_each};
use super::{ClientEval, Ctx, SimError};
use crate::coord::fedcollab::{
    Distance, FedCollabConfig, Problem, Solution, coalition_average, disc_train_target,
    distance_matrix, label_tv,
};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Adam, Learner};
use crate::silo::fedcollab::{DiscData, DiscModel, FL_BATCH_TAG, PairHalf};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;
use serde::Serialize;
use std::sync::Arc;

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
                vec![(
                    Owner::Shared,
                    plan.models[plan.coalition_of[i]].as_slice(),
                    1.0,
                )]
            }),
            None => {
                let init = self.init.as_slice();
                score_each(ctx, |_| vec![(Owner::Shared, init, 1.0)])
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
