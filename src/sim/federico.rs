//! FedeRiCo in lock-step rounds (spec §3.2), every silo in this process.
//! Owns: moving models, losses and gradients between the [`Peer`] state machines and the
//! learners, in the order of Algorithm 1, with silos computed in parallel.
//! Must not: decide anything the core decides (sampling, weights, acceptance of gradients).

use super::{BatchCursor, ClientEval, Ctx, SimError, score_each};
use crate::core::{FedericoConfig, GradientInbox, MStep, Peer};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::Adam;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;

/// A model a silo evaluated: its owner, mean loss on the silo's data, summed gradient.
type Measured = (NodeId, f64, Vec<f32>);

/// Per-silo state of a FedeRiCo run.
pub(crate) struct FedericoRun {
    cfg: FedericoConfig,
    peers: Vec<Peer>,
    /// φ_i: each silo's own model.
    params: Vec<Vec<f32>>,
    /// Adam state of each owner, kept across rounds.
    opts: Vec<Adam>,
    /// v_i: bumped after every optimizer step.
    versions: Vec<u64>,
    cursors: Vec<BatchCursor>,
    /// Peers each silo sampled in the last round (for the run log).
    pub(crate) last_sampled: Vec<Vec<NodeId>>,
}

impl FedericoRun {
    pub(crate) fn new(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Self {
        let k = ctx.clients();
        let ids: Vec<NodeId> = (0..k as u32).map(NodeId).collect();
        let cfg = ctx.scenario.federico.clone();
        Self {
            peers: ids
                .iter()
                .map(|&me| {
                    Peer::new(
                        me,
                        ids.iter().copied(),
                        cfg.clone(),
                        stream_seed(ctx.seed, me, Stream::Sampling),
                    )
                })
                .collect(),
            cfg,
            params: init.to_vec(),
            opts: init.iter().map(|p| Adam::new(p.len(), ctx.lr())).collect(),
            versions: vec![0; k],
            cursors: ids
                .iter()
                .map(|&i| {
                    BatchCursor::new(
                        ctx.fed.clients[i.index()].train.len(),
                        StdRng::seed_from_u64(stream_seed(ctx.seed ^ 0xFEDE, i, Stream::Batches)),
                    )
                })
                .collect(),
            last_sampled: vec![Vec::new(); k],
        }
    }

    /// One round: sample, E-step on every silo, then the M-step (full or mini-batch).
    pub(crate) fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let sampled: Vec<Vec<NodeId>> = self.peers.iter_mut().map(Peer::sample).collect();
        // What each silo measures this round: the core says (sampled peers plus itself).
        let evaluated: Vec<Vec<NodeId>> = self
            .peers
            .iter()
            .zip(&sampled)
            .map(|(p, s)| p.round_models(s))
            .collect();
        let fed = ctx.fed;
        let params = &self.params;
        match self.cfg.mstep {
            MStep::Full => {
                // Loss and gradient come from one pass at the same parameters (spec §5.5).
                let out: Vec<Result<Vec<Measured>, SimError>> = ctx.pool.install(|| {
                    ctx.learners
                        .par_iter_mut()
                        .enumerate()
                        .map(|(i, learner)| {
                            let train = &fed.clients[i].train;
                            evaluated[i]
                                .iter()
                                .map(|&b| {
                                    let (loss_sum, grad) =
                                        learner.loss_and_grad(&params[b.index()], train, None)?;
                                    Ok((b, loss_sum / train.len() as f64, grad))
                                })
                                .collect()
                        })
                        .collect()
                });
                let mut mail = Mail::new(self.params.len());
                for (i, res) in out.into_iter().enumerate() {
                    let res = res?;
                    let measured: Vec<(NodeId, f64)> = res.iter().map(|r| (r.0, r.1)).collect();
                    self.peers[i].handle_losses(fed.clients[i].train.len(), &measured);
                    for (b, _, mut grad) in res {
                        scale(&mut grad, self.peers[i].weight(b));
                        mail.post(NodeId(i as u32), b, grad);
                    }
                }
                self.apply(ctx, &evaluated, mail)?;
            }
            MStep::Epoch | MStep::Minibatch(_) => {
                let out: Vec<Result<Vec<(NodeId, f64)>, SimError>> = ctx.pool.install(|| {
                    ctx.learners
                        .par_iter_mut()
                        .enumerate()
                        .map(|(i, learner)| {
                            let train = &fed.clients[i].train;
                            evaluated[i]
                                .iter()
                                .map(|&b| {
                                    Ok((
                                        b,
                                        learner.evaluate(&params[b.index()], train)?.mean_loss(),
                                    ))
                                })
                                .collect()
                        })
                        .collect()
                });
                for (i, res) in out.into_iter().enumerate() {
                    self.peers[i].handle_losses(fed.clients[i].train.len(), &res?);
                }
                let batch = ctx.batch_size();
                let steps = match self.cfg.mstep {
                    MStep::Minibatch(s) => s,
                    _ => fed
                        .clients
                        .iter()
                        .map(|c| c.train.len().div_ceil(batch))
                        .max()
                        .unwrap_or(1),
                };
                // Weights stay fixed within the round (spec §5.5).
                let weights: Vec<Vec<f32>> = (0..self.peers.len())
                    .map(|i| {
                        evaluated[i]
                            .iter()
                            .map(|&b| self.peers[i].weight(b) as f32)
                            .collect()
                    })
                    .collect();
                for _ in 0..steps {
                    let rows: Vec<Vec<usize>> =
                        self.cursors.iter_mut().map(|c| c.next(batch)).collect();
                    let params = &self.params;
                    let out: Vec<Result<Vec<Vec<f32>>, SimError>> = ctx.pool.install(|| {
                        ctx.learners
                            .par_iter_mut()
                            .enumerate()
                            .map(|(i, learner)| {
                                let train = &fed.clients[i].train;
                                // unbiased estimate of the full summed gradient (spec §5.4)
                                let rescale = train.len() as f32 / rows[i].len() as f32;
                                evaluated[i]
                                    .iter()
                                    .zip(&weights[i])
                                    .map(|(&b, &w)| {
                                        let (_, mut g) = learner.loss_and_grad(
                                            &params[b.index()],
                                            train,
                                            Some(&rows[i]),
                                        )?;
                                        scale(&mut g, (w * rescale) as f64);
                                        Ok(g)
                                    })
                                    .collect()
                            })
                            .collect()
                    });
                    let mut mail = Mail::new(self.params.len());
                    for (i, res) in out.into_iter().enumerate() {
                        for (&b, grad) in evaluated[i].iter().zip(res?) {
                            mail.post(NodeId(i as u32), b, grad);
                        }
                    }
                    self.apply(ctx, &evaluated, mail)?;
                }
            }
        }
        self.last_sampled = sampled;
        Ok(())
    }

    /// The owners' side, every owner in parallel: a [`GradientInbox`] for the current version
    /// expects exactly the silos that evaluated the model (itself included), accepts what they
    /// sent, and the owner takes one optimizer step on the sum (spec §5.4), then bumps its version.
    fn apply(
        &mut self,
        ctx: &Ctx<'_>,
        evaluated: &[Vec<NodeId>],
        mail: Mail,
    ) -> Result<(), SimError> {
        let mut served: Vec<Vec<NodeId>> = vec![Vec::new(); self.params.len()];
        for (i, models) in evaluated.iter().enumerate() {
            for b in models {
                served[b.index()].push(NodeId(i as u32));
            }
        }
        let clip_norm = self.cfg.clip_norm;
        let owners = self
            .params
            .iter_mut()
            .zip(&mut self.opts)
            .zip(&mut self.versions);
        let jobs: Vec<_> = owners.zip(served).zip(mail.boxes).collect();
        ctx.pool.install(|| {
            jobs.into_par_iter().enumerate().try_for_each(
                |(b, ((((params, opt), version), served), letters))| {
                    let mut inbox =
                        GradientInbox::new(*version, params.len()).with_clip_norm(clip_norm);
                    for from in served {
                        inbox.expect(from);
                    }
                    for (from, grad) in letters {
                        inbox.handle_gradient(from, *version, grad).map_err(|r| {
                            SimError::Invariant(format!(
                                "silo-{b} rejected the gradient of {from}: {r}"
                            ))
                        })?;
                    }
                    if !inbox.is_complete() {
                        return Err(SimError::Invariant(format!(
                            "silo-{b} is missing gradients in a fault-free round"
                        )));
                    }
                    opt.step(params, &inbox.sum());
                    *version += 1;
                    Ok(())
                },
            )
        })
    }

    /// Each silo's test score with its mixture of measured peers (spec §3 inference).
    pub(crate) fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let mixes: Vec<Vec<(NodeId, f64)>> =
            self.peers.iter().map(Peer::inference_weights).collect();
        let params = &self.params;
        score_each(ctx, |i| {
            mixes[i]
                .iter()
                .map(|&(j, w)| (params[j.index()].as_slice(), w))
                .collect()
        })
    }

    /// The K×K weight matrix w_ij (row i: silo, column j: model), self included.
    pub(crate) fn weight_matrix(&self) -> Vec<Vec<f64>> {
        self.peers
            .iter()
            .map(|p| p.weights().into_iter().map(|(_, w)| w).collect())
            .collect()
    }
}

/// Weighted gradients on their way to the owners, moved, never copied.
struct Mail {
    boxes: Vec<Vec<(NodeId, Vec<f32>)>>,
}

impl Mail {
    fn new(owners: usize) -> Self {
        Self {
            boxes: (0..owners).map(|_| Vec::new()).collect(),
        }
    }
    fn post(&mut self, from: NodeId, to: NodeId, grad: Vec<f32>) {
        self.boxes[to.index()].push((from, grad));
    }
}

fn scale(g: &mut [f32], w: f64) {
    let w = w as f32;
    for x in g {
        *x *= w;
    }
}
