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

//! FedCollab's distances in the simulator (`docs/specs/fedcollab.md`), and the record of the
//! structure found from them.
//!
//! Owns: the pairwise discriminator protocol (spec §3.2) on every pair of silos, both halves
//! ([`crate::silo::fedcollab`]: each silo's inputs, plain-SGD steps, validation accuracies) in
//! this process, pairs in parallel; the label-TV debug distances; each silo's report as a
//! node sends it; and the record of the structure (sizes, raw distances, rounds per pair,
//! coalitions, objective, the C sweep of spec §8 item 7) written to
//! `<seed dir>/fedcollab.json`.
//! Must not: decide the structure, the early stop or the distance (that is
//! [`crate::coord::fedcollab`]), or run the rounds: [`super::members::CollabRun`] drives the
//! coordinator's and the members' engines and calls this for the distance phase.

use super::{Ctx, SimError};
use crate::coord::PairDistance;
use crate::coord::fedcollab::{
    Distance, FedCollabConfig, Problem, Solution, distance_matrix, label_tv,
};
use crate::learn::Learner;
use crate::silo::fedcollab::{DiscData, DiscModel, PairHalf};
use rayon::prelude::*;
use serde::Serialize;
use std::sync::Arc;

/// The C grid logged with every structure (spec §8 item 7).
const SWEEP: [f64; 9] = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0];

/// What `fedcollab.json` holds.
#[derive(Serialize)]
pub(crate) struct Record {
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

impl Record {
    /// The structure of `est` with `sizes` as the coordinator solves it, and the C sweep; the
    /// record and its coalitions.
    pub(crate) fn new(
        cfg: &FedCollabConfig,
        sizes: Vec<u64>,
        est: Estimates,
        seed: u64,
    ) -> Result<(Self, Vec<Vec<usize>>), SimError> {
        let invariant = |e: crate::coord::fedcollab::FedCollabError| {
            SimError::Invariant(format!("fedcollab: {e}"))
        };
        let problem = Problem::new(&sizes, &est.raw, cfg.capacity).map_err(invariant)?;
        let solve = |p: &Problem| p.solve_for_run(&cfg.solver(), seed).map_err(invariant);
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
        let record = Self {
            capacity: cfg.capacity,
            distance: cfg.distance,
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
        };
        Ok((record, coalitions))
    }
}

/// What a distance measurement produced.
pub(crate) struct Estimates {
    raw: Vec<Vec<f64>>,
    target: Option<f64>,
    train_sizes: Vec<usize>,
    valid_sizes: Vec<usize>,
    params: Option<usize>,
    pair_rounds: Vec<[usize; 3]>,
    failed: Vec<(usize, usize)>,
}

impl Estimates {
    /// Every pair's distance for `cfg.distance` (the discriminator's with the plan's
    /// discriminator-train `target`).
    pub(crate) fn measure(
        ctx: &Ctx<'_>,
        cfg: &FedCollabConfig,
        target: f64,
    ) -> Result<Self, SimError> {
        match cfg.distance {
            Distance::Discriminator => discriminator_distances(ctx, cfg, target),
            Distance::LabelTv => Ok(label_tv_distances(ctx)),
        }
    }

    /// Silo `i`'s report, as its node sends it: one distance per other silo, ascending (none
    /// for a pair that could not run).
    pub(crate) fn report(&self, i: usize) -> Vec<PairDistance> {
        let n = self.raw.len();
        (0..n)
            .filter(|&j| j != i)
            .map(|j| {
                let pair = (i.min(j), i.max(j));
                let rounds = self
                    .pair_rounds
                    .iter()
                    .find(|r| (r[0], r[1]) == pair)
                    .map_or(0, |r| r[2] as u32);
                PairDistance {
                    partner: j as u32,
                    distance: (!self.failed.contains(&pair)).then_some(self.raw[i][j]),
                    rounds,
                }
            })
            .collect()
    }
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
fn discriminator_distances(
    ctx: &Ctx<'_>,
    cfg: &FedCollabConfig,
    target: f64,
) -> Result<Estimates, SimError> {
    let fed = ctx.fed;
    let n = fed.clients.len();
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
