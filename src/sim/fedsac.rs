//! FedSaC in lock-step rounds (FedSaC spec §4), every silo in this process; with `alpha = 0`
//! it is pFedGraph.
//! Owns: the per-round driver work: drawing the cohort, running each cohort member's round
//! ([`crate::silo::fedsac`]: local training from its own personalised model with the paper's
//! recipe, then its feature subspace; spec §4 step 1, §2.1) on the worker pool, handing
//! models, subspaces and sample counts to the pure core, and installing the personalised
//! models it returns.
//! Must not: decide weights: the graph comes from [`crate::coord::fedsac`]; or train
//! differently from a coordinated node (the recipe is [`crate::silo`]'s).

use super::coordinated::CoordinatedRun;
use super::pool::{Owner, score_each};
use super::{ClientEval, Ctx, SimError};
use crate::coord::fedsac::{self, FedsacError, GraphSettings, Subspace};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::scenario::{FedsacConfig, FedsacScore};
use crate::silo::BatchCursor;
use crate::silo::fedsac::{FEATURE_TAG, STREAM_TAG, train_silo};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;

/// A FedSaC run across the rounds of one seed.
pub(crate) struct FedsacRun {
    cfg: FedsacConfig,
    /// T, for the α schedule.
    rounds: usize,
    /// t: rounds completed.
    t: usize,
    /// θ^0: the common initialisation, kept for the whole run (similarity is on θ − θ^0).
    init: Vec<f32>,
    /// θ̃^i: each silo's personalised model (what it trains from and is scored with).
    params: Vec<Vec<f32>>,
    /// c^i: the regulariser's direction from the silo's last aggregation; `None` before the
    /// first one and after a round without the silo (spec §7.11).
    directions: Vec<Option<Vec<f32>>>,
    /// θ^i_t: each silo's model right after its last local training (scored when
    /// `score = "trained"`); `None` before its first round.
    trained: Vec<Option<Vec<f32>>>,
    /// Each silo's mini-batch order (recycled when exhausted).
    cursors: Vec<BatchCursor>,
    /// Each silo's draw of the samples its subspace is computed on.
    feature_rngs: Vec<StdRng>,
    /// The coordinator's draw of each round's cohort.
    sampler: StdRng,
}

impl FedsacRun {
    /// Every silo starts from silo 0's initial weights: FedSaC needs one common θ^0.
    pub(crate) fn new(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Self {
        let k = ctx.clients();
        let rng = |tag: u64, i: u32, stream| {
            StdRng::seed_from_u64(stream_seed(ctx.seed ^ tag, NodeId(i), stream))
        };
        Self {
            cfg: ctx.scenario.fedsac.clone(),
            rounds: ctx.scenario.rounds,
            t: 0,
            init: init[0].clone(),
            params: vec![init[0].clone(); k],
            directions: vec![None; k],
            trained: vec![None; k],
            cursors: (0..k)
                .map(|i| {
                    BatchCursor::new(
                        ctx.fed.clients[i].train.len(),
                        rng(STREAM_TAG, i as u32, Stream::Batches),
                    )
                })
                .collect(),
            feature_rngs: (0..k as u32)
                .map(|i| rng(FEATURE_TAG, i, Stream::Batches))
                .collect(),
            sampler: rng(STREAM_TAG, u32::MAX, Stream::Sampling),
        }
    }

    /// This round's cohort in increasing id.
    fn cohort(&mut self, k: usize) -> Vec<usize> {
        let all: Vec<usize> = (0..k).collect();
        fedsac::draw_cohort(&mut self.sampler, &all, self.cfg.cohort_size)
    }
}

fn core_error(e: FedsacError) -> SimError {
    SimError::Invariant(format!("fedsac: {e}"))
}

impl CoordinatedRun for FedsacRun {
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let cohort = self.cohort(ctx.clients());
        let mut picked = vec![false; ctx.clients()];
        cohort.iter().for_each(|&i| picked[i] = true);
        let fed = ctx.fed;
        let (cfg, batch) = (&self.cfg, ctx.batch_size());
        let jobs: Vec<_> = ctx
            .learners
            .iter_mut()
            .zip(&mut self.cursors)
            .zip(&mut self.feature_rngs)
            .zip(self.params.iter().zip(&self.directions))
            .enumerate()
            .filter(|(i, _)| picked[*i])
            .collect();
        type Trained = (Vec<f32>, Option<Subspace>);
        let trained: Vec<Result<Trained, SimError>> = ctx.pool.install(|| {
            jobs.into_par_iter()
                .map(|(i, (((learner, cursor), frng), (start, dir)))| {
                    let data = &fed.clients[i].train;
                    let mut p = start.clone();
                    let q = train_silo(
                        learner,
                        &mut p,
                        data,
                        cursor,
                        frng,
                        batch,
                        cfg,
                        dir.as_deref(),
                    )?;
                    Ok((p, q))
                })
                .collect()
        });
        let (models, subspaces): (Vec<Vec<f32>>, Vec<Option<Subspace>>) = trained
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();

        // The coordinator: p, S and C over the cohort, then one projection per row.
        let counts: Vec<u64> = cohort
            .iter()
            .map(|&i| fed.clients[i].train.len() as u64)
            .collect();
        let views: Vec<&[f32]> = models.iter().map(Vec::as_slice).collect();
        let settings = GraphSettings {
            alpha: cfg.alpha,
            alpha_cutoff: cfg.alpha_cutoff,
            beta: cfg.beta,
            principal_angles: cfg.principal_angles,
        };
        let w = fedsac::round_graph(
            &views,
            &self.init,
            &counts,
            &subspaces,
            &settings,
            self.t,
            self.rounds,
        )
        .map_err(core_error)?
        .graph;

        // Personalised aggregation: each cohort member replaces its model.
        // One (θ̃^i, c^i) per cohort member, rows in parallel.
        type Mixed = Result<(Vec<f32>, Vec<f32>), FedsacError>;
        let mixed: Vec<Mixed> = ctx.pool.install(|| {
            w.par_iter()
                .map(|row| fedsac::personalise(&views, row))
                .collect()
        });
        let mut next = mixed.into_iter();
        for (&i, model) in cohort.iter().zip(models) {
            self.trained[i] = Some(model);
        }
        for (i, dir) in self.directions.iter_mut().enumerate() {
            if picked[i] {
                let (model, c) = next
                    .next()
                    .expect("one graph row per cohort member")
                    .map_err(core_error)?;
                self.params[i] = model;
                *dir = Some(c);
            } else {
                *dir = None;
            }
        }
        self.t += 1;
        Ok(())
    }

    /// Each silo's personalised model θ̃^i on its own test split, or (`score = "trained"`)
    /// the model its last local training produced, as the official code's second evaluation.
    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let (params, trained) = (&self.params, &self.trained);
        let score = self.cfg.score;
        score_each(ctx, |i| {
            let model = match (score, &trained[i]) {
                (FedsacScore::Trained, Some(t)) => t,
                _ => &params[i],
            };
            vec![(Owner::Silo(i), model.as_slice(), 1.0)]
        })
    }
}
