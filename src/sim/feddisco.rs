//! FedDisco in lock-step rounds (FedDisco spec §3), every silo in this process: FedAvg whose
//! aggregation weights come from [`crate::coord::feddisco`].
//! Owns: the per-round driver work: drawing the round's participants (all, or
//! `clients_per_round` of them), local training of each from the global model with the
//! official code's recipe ([`crate::silo::feddisco`]; spec §5.1, A9: E epochs of ⌊N_k/B⌋
//! mini-batch SGD steps, momentum 0.9, weight decay 1e-5, a fresh optimiser every round), and
//! applying the coordinator's aggregate.
//! Must not: decide weights: each silo computes its own [`DiscoReport`] from its own label
//! counts once (spec §3.1), and only the report reaches the coordinator's
//! [`feddisco::weights`].

use super::coordinated::CoordinatedRun;
use super::pool::{Owner, score_each};
use super::{ClientEval, Ctx, SimError};
use crate::coord::feddisco::{self, DiscoReport};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::scenario::FeddiscoConfig;
use crate::silo::BatchCursor;
use crate::silo::feddisco::{STREAM_TAG, train_silo};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;

/// A FedDisco run across the rounds of one seed.
pub(crate) struct FeddiscoRun {
    cfg: FeddiscoConfig,
    /// w^(t): the model every participant starts from, and the one evaluated.
    global: Vec<f32>,
    /// What each silo sent at setup: `(N_k, δ_k)`.
    reports: Vec<DiscoReport>,
    /// Each silo's mini-batch order (epochs run on across rounds, drop_last).
    cursors: Vec<BatchCursor>,
    /// The coordinator's draw of each round's participants.
    sampler: StdRng,
}

impl FeddiscoRun {
    /// Starts from silo 0's initial weights, as FedAvg does.
    pub(crate) fn new(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Self {
        let cfg = ctx.scenario.feddisco.clone();
        let reports = ctx
            .fed
            .clients
            .iter()
            .map(|c| {
                // The silo's own computation: its histogram stays here, only the report leaves.
                let counts: Vec<u64> = c.train.class_counts().iter().map(|&n| n as u64).collect();
                feddisco::report(&counts, cfg.metric).unwrap_or(DiscoReport {
                    num_samples: 0,
                    discrepancy: 0.0,
                })
            })
            .collect();
        let cursors = (0..ctx.clients())
            .map(|i| {
                BatchCursor::new(
                    ctx.fed.clients[i].train.len(),
                    StdRng::seed_from_u64(stream_seed(
                        ctx.seed ^ STREAM_TAG,
                        NodeId(i as u32),
                        Stream::Batches,
                    )),
                )
            })
            .collect();
        Self {
            cfg,
            global: init[0].clone(),
            reports,
            cursors,
            sampler: StdRng::seed_from_u64(stream_seed(
                ctx.seed ^ STREAM_TAG,
                NodeId(u32::MAX),
                Stream::Sampling,
            )),
        }
    }

    /// This round's participants in increasing id (spec §4.1: a deterministic order).
    fn participants(&mut self, k: usize) -> Vec<usize> {
        let m = self.cfg.clients_per_round;
        if m == 0 || m >= k {
            return (0..k).collect();
        }
        let mut v = rand::seq::index::sample(&mut self.sampler, k, m).into_vec();
        v.sort_unstable();
        v
    }
}

impl CoordinatedRun for FeddiscoRun {
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let chosen = self.participants(ctx.clients());
        let fed = ctx.fed;
        let (global, cfg, batch) = (&self.global, &self.cfg, ctx.batch_size());
        let mut picked = vec![false; ctx.clients()];
        chosen.iter().for_each(|&i| picked[i] = true);
        let jobs: Vec<_> = ctx
            .learners
            .iter_mut()
            .zip(&mut self.cursors)
            .enumerate()
            .filter(|(i, _)| picked[*i])
            .collect();
        let locals: Vec<Result<Vec<f32>, SimError>> = ctx.pool.install(|| {
            jobs.into_par_iter()
                .map(|(i, (learner, cursor))| {
                    let mut p = global.clone();
                    train_silo(learner, &mut p, &fed.clients[i].train, cursor, batch, cfg)?;
                    Ok(p)
                })
                .collect()
        });
        let locals = locals.into_iter().collect::<Result<Vec<_>, _>>()?;
        // The coordinator: weights over the arrived set, then the weighted average.
        let arrived: Vec<DiscoReport> = chosen.iter().map(|&i| self.reports[i]).collect();
        let invariant = |e: feddisco::DiscoError| SimError::Invariant(format!("feddisco: {e}"));
        let models: Vec<&[f32]> = locals.iter().map(Vec::as_slice).collect();
        let (_, global, _) = self
            .cfg
            .robust()
            .aggregate(&arrived, &models, &self.global, &self.cfg.params())
            .map_err(invariant)?;
        self.global = global;
        Ok(())
    }

    /// The global model on every silo's test split.
    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let global = self.global.as_slice();
        score_each(ctx, |_| vec![(Owner::Shared, global, 1.0)])
    }
}
