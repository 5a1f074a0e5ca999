//! The baselines of spec §8.3 on the same drivers and splits: Local, FedAvg and FedAvg+.
//! Owns: their per-round work (one local epoch of mini-batch Adam per client per round) and
//! evaluation. FedAvg+ shares FedAvg's training run and only adds a fine-tuning epoch before it
//! scores, so one FedAvg run serves both rows.
//! Must not: touch FedeRiCo's state.

use super::pool::{Owner, score_each};
use super::{ClientEval, Ctx, SimError};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::Adam;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;

/// Each silo trains alone and is scored with its own model.
pub(crate) struct LocalRun {
    params: Vec<Vec<f32>>,
    opts: Vec<Adam>,
    rngs: Vec<StdRng>,
}

impl LocalRun {
    pub(crate) fn new(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Self {
        Self {
            params: init.to_vec(),
            opts: init.iter().map(|p| Adam::new(p.len(), ctx.lr())).collect(),
            rngs: batch_rngs(ctx, 0x10CA1),
        }
    }

    pub(crate) fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let fed = ctx.fed;
        let work = self
            .params
            .iter_mut()
            .zip(&mut self.opts)
            .zip(&mut self.rngs);
        let jobs: Vec<_> = ctx.learners.iter_mut().zip(work).collect();
        ctx.pool.install(|| {
            jobs.into_par_iter()
                .enumerate()
                .try_for_each(|(i, (learner, ((p, opt), rng)))| {
                    learner
                        .train_epoch(p, opt, &fed.clients[i].train, rng)
                        .map(|_| ())
                })
        })?;
        Ok(())
    }

    pub(crate) fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let params = &self.params;
        score_each(ctx, |i| vec![(Owner::Silo(i), params[i].as_slice(), 1.0)])
    }
}

/// FedAvg (FedEM's `CentralizedAggregator`): every client starts from the global model, trains
/// one local epoch with its own persistent Adam, and the global model becomes the n_i-weighted
/// average of the client models.
pub(crate) struct FedAvgRun {
    global: Vec<f32>,
    opts: Vec<Adam>,
    rngs: Vec<StdRng>,
}

impl FedAvgRun {
    /// Starts from silo 0's initial weights (the other algorithms' silo 0 starts there too).
    pub(crate) fn new(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Self {
        Self {
            global: init[0].clone(),
            opts: init.iter().map(|p| Adam::new(p.len(), ctx.lr())).collect(),
            rngs: batch_rngs(ctx, 0xFEDA),
        }
    }

    pub(crate) fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let fed = ctx.fed;
        let global = &self.global;
        let jobs: Vec<_> = ctx
            .learners
            .iter_mut()
            .zip(self.opts.iter_mut().zip(&mut self.rngs))
            .collect();
        let locals: Vec<Result<Vec<f32>, SimError>> = ctx.pool.install(|| {
            jobs.into_par_iter()
                .enumerate()
                .map(|(i, (learner, (opt, rng)))| {
                    let mut p = global.clone();
                    learner.train_epoch(&mut p, opt, &fed.clients[i].train, rng)?;
                    Ok(p)
                })
                .collect()
        });
        let total: f64 = fed.clients.iter().map(|c| c.train.len() as f64).sum();
        let mut avg = vec![0f64; self.global.len()];
        for (i, p) in locals.into_iter().enumerate() {
            let w = fed.clients[i].train.len() as f64 / total;
            for (a, x) in avg.iter_mut().zip(p?) {
                *a += w * x as f64;
            }
        }
        self.global = avg.into_iter().map(|x| x as f32).collect();
        Ok(())
    }

    /// FedAvg's score: the global model on each client's test split.
    pub(crate) fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let global = self.global.as_slice();
        score_each(ctx, |_| vec![(Owner::Shared, global, 1.0)])
    }

    /// FedAvg+'s score: each client copies the global model, fine-tunes it for one epoch on its
    /// own training data with a fresh Adam, and scores the copy. `round` seeds the fine-tuning
    /// shuffles, so the score does not depend on how often it is taken.
    pub(crate) fn evaluate_plus(
        &mut self,
        ctx: &mut Ctx<'_>,
        round: usize,
    ) -> Result<Vec<ClientEval>, SimError> {
        let fed = ctx.fed;
        let global = &self.global;
        let (seed, lr) = (ctx.seed, ctx.lr());
        let export = ctx.export.as_ref();
        ctx.pool.install(|| {
            ctx.learners
                .par_iter_mut()
                .enumerate()
                .map(|(i, l)| {
                    let mut p = global.clone();
                    let mut opt = Adam::new(p.len(), lr);
                    let s = stream_seed(
                        seed ^ 0xF17E ^ ((round as u64) << 20),
                        NodeId(i as u32),
                        Stream::Batches,
                    );
                    l.train_epoch(
                        &mut p,
                        &mut opt,
                        &fed.clients[i].train,
                        &mut StdRng::seed_from_u64(s),
                    )?;
                    let eval = ClientEval::from(l.evaluate(&p, &fed.clients[i].test)?);
                    if let Some(to) = export {
                        to.write(l, i, &[(Owner::Silo(i), &p, 1.0)], eval)?;
                    }
                    Ok(eval)
                })
                .collect()
        })
    }
}

/// One batch-order stream per silo for one algorithm (`tag` keeps algorithms' streams apart).
fn batch_rngs(ctx: &Ctx<'_>, tag: u64) -> Vec<StdRng> {
    (0..ctx.clients())
        .map(|i| {
            StdRng::seed_from_u64(stream_seed(
                ctx.seed ^ tag,
                NodeId(i as u32),
                Stream::Batches,
            ))
        })
        .collect()
}
