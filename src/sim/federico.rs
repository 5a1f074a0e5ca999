//! FedeRiCo in lock-step rounds (spec §3.2), every silo in this process.
//! Owns: choosing how a run is driven — with `mstep = "full"` (what the nodes run), by the
//! nodes' own round engines: [`Engines`] without faults, [`FaultNet`] under a fault schedule;
//! the simulator's other M-step modes (which the nodes do not run) by moving models, losses and
//! gradients between the [`Peer`] state machines and the learners in the order of Algorithm 1 —
//! and scoring the silos.
//! Must not: decide anything the core decides (sampling, weights, acceptance of gradients).

use super::engines::Engines;
use super::network::FaultNet;
use super::pool::{Owner, score_each};
use super::{ClientEval, Ctx, SimError};
use crate::core::{FedericoConfig, GradientInbox, MStep, Peer};
use crate::faults::Schedule;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::Adam;
use crate::silo::BatchCursor;
use crate::silo::federico::scale;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;

/// Per-silo state of a FedeRiCo run.
pub(crate) struct FedericoRun {
    cfg: FedericoConfig,
    /// The nodes' round engines: a fault-free `mstep = "full"` run. When set, the lock-step
    /// fields below are not used.
    engines: Option<Engines>,
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
    /// The nodes' engines on a simulated network, for a run with a fault schedule.
    pub(crate) faults: Option<FaultNet>,
}

impl FedericoRun {
    pub(crate) fn new(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Self {
        let k = ctx.clients();
        let ids: Vec<NodeId> = (0..k as u32).map(NodeId).collect();
        let cfg = ctx.scenario.federico.clone();
        let mut run = Self {
            engines: None,
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
            faults: None,
        };
        if run.cfg.mstep == MStep::Full {
            run.engines = Some(Engines::new(ctx, &run.cfg, run.peers.clone(), init));
        }
        run
    }

    /// The same run under a fault schedule (`mstep = "full"`, what the peers run), on the
    /// state the engines were built from.
    pub(crate) fn with_faults(
        mut self,
        ctx: &Ctx<'_>,
        schedule: Schedule,
        rounds: u64,
        init: &[Vec<f32>],
    ) -> Result<Self, SimError> {
        self.engines = None;
        let net = FaultNet::new(ctx, &self.cfg, self.peers.clone(), init, schedule, rounds)?;
        self.faults = Some(net);
        Ok(self)
    }

    /// One round: sample, E-step on every silo, then the M-step (full or mini-batch).
    pub(crate) fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        if let Some(f) = self.faults.as_mut() {
            f.round(ctx)?;
            self.last_sampled = f.last_sampled.clone();
            return Ok(());
        }
        if let Some(e) = self.engines.as_mut() {
            e.round(ctx)?;
            self.last_sampled = e.last_sampled().to_vec();
            return Ok(());
        }
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
                return Err(SimError::Invariant(
                    "a fault-free mstep = \"full\" run is driven by the round engines".into(),
                ));
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
                // Weights stay fixed within the round (spec §5.5); `None`: the silo holds its
                // gradient back from that model (`push_cut`) and sends a skip.
                let weights: Vec<Vec<Option<f32>>> = (0..self.peers.len())
                    .map(|i| {
                        evaluated[i]
                            .iter()
                            .map(|&b| self.peers[i].push_weight(b).map(|w| w as f32))
                            .collect()
                    })
                    .collect();
                for _ in 0..steps {
                    let rows: Vec<Vec<usize>> =
                        self.cursors.iter_mut().map(|c| c.next(batch)).collect();
                    let params = &self.params;
                    type Grads = Vec<Option<Vec<f32>>>;
                    let out: Vec<Result<Grads, SimError>> = ctx.pool.install(|| {
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
                                        let Some(w) = w else { return Ok(None) };
                                        let (_, mut g) = learner.loss_and_grad(
                                            &params[b.index()],
                                            train,
                                            Some(&rows[i]),
                                        )?;
                                        scale(&mut g, (w * rescale) as f64);
                                        Ok(Some(g))
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
                        let taken = match grad {
                            Some(grad) => inbox.handle_gradient(from, *version, grad),
                            None => inbox.handle_skip(from, *version),
                        };
                        taken.map_err(|r| {
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
        if let Some(f) = self.faults.as_mut() {
            return evaluate_faulty(ctx, f);
        }
        let mixes: Vec<Vec<(NodeId, f64)>> = match &self.engines {
            Some(e) => e.peers().map(Peer::inference_weights).collect(),
            None => self.peers.iter().map(Peer::inference_weights).collect(),
        };
        let engines = self.engines.as_ref();
        let params = &self.params;
        let model = |j: NodeId| match engines {
            Some(e) => e.params(j.index()),
            None => params[j.index()].as_slice(),
        };
        score_each(ctx, |i| {
            mixes[i]
                .iter()
                .map(|&(j, w)| (Owner::Silo(j.index()), model(j), w))
                .collect()
        })
    }

    /// The K×K weight matrix w_ij (row i: silo, column j: model), self included.
    pub(crate) fn weight_matrix(&self) -> Vec<Vec<f64>> {
        let row = |p: &Peer| p.weights().into_iter().map(|(_, w)| w).collect();
        if let Some(f) = &self.faults {
            return (0..self.peers.len()).map(|i| row(f.peer(i))).collect();
        }
        match &self.engines {
            Some(e) => e.peers().map(row).collect(),
            None => self.peers.iter().map(row).collect(),
        }
    }
}

/// Weighted gradients on their way to the owners, moved, never copied.
/// Each owner's letters of one sub-step: `(sender, gradient)`, `None` for a skip.
struct Mail {
    boxes: Vec<Vec<(NodeId, Option<Vec<f32>>)>>,
}

impl Mail {
    fn new(owners: usize) -> Self {
        Self {
            boxes: (0..owners).map(|_| Vec::new()).collect(),
        }
    }
    fn post(&mut self, from: NodeId, to: NodeId, grad: Option<Vec<f32>>) {
        self.boxes[to.index()].push((from, grad));
    }
}

/// Each silo's score under faults: a node fetches the models of its mixture; the unreachable
/// ones are dropped and the rest renormalised (spec §6). A silo that is down is scored on its
/// own model. The score goes into the silo's latest record when that has none yet.
fn evaluate_faulty(ctx: &mut Ctx<'_>, f: &mut FaultNet) -> Result<Vec<ClientEval>, SimError> {
    let k = f.traces.len();
    let mut mixes: Vec<Vec<(NodeId, f64)>> =
        (0..k).map(|i| f.peer(i).inference_weights()).collect();
    for (i, mix) in mixes.iter_mut().enumerate() {
        let me = i as u32;
        if !f.state.is_up(me) {
            *mix = vec![(NodeId(me), 1.0)];
            continue;
        }
        mix.retain(|&(j, _)| j.0 == me || f.state.connected(me, j.0));
        let total: f64 = mix.iter().map(|x| x.1).sum();
        if total > 0.0 {
            for x in mix.iter_mut() {
                x.1 /= total;
            }
        } else {
            *mix = vec![(NodeId(me), 1.0)];
        }
    }
    let net = &*f;
    let evals = score_each(ctx, |i| {
        mixes[i]
            .iter()
            .map(|&(j, w)| (Owner::Silo(j.index()), net.params(j.index()), w))
            .collect()
    })?;
    for (i, (t, e)) in f.traces.iter_mut().zip(&evals).enumerate() {
        if let Some(rec) = t.last_mut().filter(|r| r.eval.is_none())
            && f.state.is_up(i as u32)
        {
            rec.eval = Some((*e).into());
        }
    }
    Ok(evals)
}
