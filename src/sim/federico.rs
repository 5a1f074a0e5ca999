//! FedeRiCo in lock-step rounds (spec §3.2), every silo in this process.
//! Owns: choosing how a run is driven — without faults and with `mstep = "full"` (what the
//! nodes run), by the nodes' own round engines ([`Engines`]); the simulator's other M-step
//! modes and fault schedules, by moving models, losses and gradients between the [`Peer`]
//! state machines and the learners in the order of Algorithm 1 — and scoring the silos.
//! Must not: decide anything the core decides (sampling, weights, acceptance of gradients).

use super::engines::Engines;
use super::faults::{FaultSim, Msg};
use super::pool::{par_silos, score_each};
use super::{ClientEval, Ctx, SimError};
use crate::core::{FedericoConfig, GradientInbox, MStep, Peer, Stragglers};
use crate::faults::checks::CrashEvidence;
use crate::faults::{Fault, Schedule};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::Adam;
use crate::silo::BatchCursor;
use crate::silo::federico::{Checkpoint, scale};
use crate::trace::NodeRound;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;

/// A model a silo evaluated: its owner, mean loss on the silo's data, summed gradient.
type Measured = (NodeId, f64, Vec<f32>);

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
    /// The simulated network of a run with a fault schedule.
    pub(crate) faults: Option<FaultSim>,
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

    /// The same run under a fault schedule (`mstep = "full"`, what the peers run).
    pub(crate) fn with_faults(mut self, schedule: Schedule, rounds: u64, seed: u64) -> Self {
        // A fault schedule runs lock-step, on the state the engines were built from.
        self.engines = None;
        let suspect_after = self.peers.first().map_or(3, |p| p.config().suspect_after);
        self.faults = Some(FaultSim::new(schedule, rounds, seed, suspect_after));
        self
    }

    /// One round: sample, E-step on every silo, then the M-step (full or mini-batch).
    pub(crate) fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        if let Some(mut f) = self.faults.take() {
            let r = self.round_with_faults(ctx, &mut f);
            self.faults = Some(f);
            return r;
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

    /// One round under the fault schedule (spec §6), `mstep = "full"`. Per silo that is up:
    /// sample; pull each sampled model (a partition, a crashed owner, a lost request or reply,
    /// or a reply later than τ_model is a failed pull: the core keeps the loss and counts the
    /// failure; an answer clears it); measure what arrived and itself; send weighted gradients
    /// (a lost one, or one later than τ_grad, never counts). Every owner that is up steps on
    /// what it received, its own gradient always included. Down silos do nothing.
    fn round_with_faults(&mut self, ctx: &mut Ctx<'_>, f: &mut FaultSim) -> Result<(), SimError> {
        let (g, st, fired) = f.begin();
        let k = self.peers.len();
        for fault in &fired {
            match *fault {
                Fault::Crash { silo, .. } | Fault::Leave(silo) => {
                    let s = silo as usize;
                    let ckpt = Checkpoint {
                        peer_id: NodeId(silo).to_string(),
                        round: f.own_round[s],
                        version: self.versions[s],
                        params: self.params[s].clone(),
                        adam: self.opts[s].clone(),
                        peer: self.peers[s].clone(),
                    };
                    let bytes = ckpt.encode().map_err(SimError::Invariant)?;
                    if matches!(fault, Fault::Crash { .. }) {
                        f.crashes.push(CrashEvidence {
                            silo,
                            checkpoint: Checkpoint::decode(&bytes).map(|c| Some(c.round)),
                            peer_ids: None,
                        });
                    }
                    f.saved[s] = Some(bytes);
                }
                Fault::Restart(silo) => {
                    // The silo comes back from the bytes it left, as a node does.
                    let s = silo as usize;
                    let bytes = f.saved[s].take().ok_or_else(|| {
                        SimError::Invariant(format!("silo {silo} restarts without a checkpoint"))
                    })?;
                    let c = Checkpoint::decode(&bytes).map_err(|e| {
                        SimError::Invariant(format!("silo {silo}'s checkpoint: {e}"))
                    })?;
                    self.peers[s] = c.peer;
                    self.params[s] = c.params;
                    self.opts[s] = c.adam;
                    self.versions[s] = c.version;
                    f.own_round[s] = c.round;
                    f.resumed[s] = true;
                    f.stragglers[s] = Stragglers::new(self.peers[s].config().suspect_after);
                    if let Some(e) = f.crashes.iter_mut().rev().find(|e| e.silo == silo) {
                        let id = NodeId(silo).to_string();
                        e.peer_ids = Some((id.clone(), id));
                    }
                }
                _ => {}
            }
        }
        // A connection that comes (back) shows the peer alive: sampleable again (spec §6).
        for i in 0..k as u32 {
            for j in 0..k as u32 {
                if i != j
                    && st.connected(i, j)
                    && (!f.prev.connected(i, j) || fired_restart(&fired, i))
                {
                    self.peers[i as usize].handle_reachable(NodeId(j));
                }
            }
        }
        let up: Vec<bool> = (0..k as u32).map(|i| st.is_up(i)).collect();
        let sampled: Vec<Vec<NodeId>> = self
            .peers
            .iter_mut()
            .zip(&up)
            .map(|(p, &u)| if u { p.sample() } else { Vec::new() })
            .collect();
        // Pulls: who got which model; who served whom (the owner then expects a gradient).
        let mut answered: Vec<Vec<NodeId>> = vec![Vec::new(); k];
        let mut served: Vec<Vec<NodeId>> = vec![Vec::new(); k];
        let mut wait = vec![0f64; k];
        for i in 0..k {
            for &b in &sampled[i] {
                let (iu, bu) = (i as u32, b.0);
                let request = st.connected(iu, bu) && !f.lost(&st, g, iu, bu, Msg::Pull);
                let reply = request
                    && !f.lost(&st, g, bu, iu, Msg::Model)
                    && FaultSim::delay_s(&st, bu) < f.tau_model;
                if request {
                    served[b.index()].push(NodeId(iu));
                }
                if reply {
                    answered[i].push(b);
                    self.peers[i].handle_reachable(b);
                    wait[i] = wait[i].max(FaultSim::delay_s(&st, bu));
                } else {
                    self.peers[i].handle_unreachable(b);
                    wait[i] = f.tau_model;
                }
            }
        }
        let evaluated: Vec<Vec<NodeId>> = (0..k)
            .map(|i| {
                if up[i] {
                    self.peers[i].round_models(&answered[i])
                } else {
                    Vec::new()
                }
            })
            .collect();
        let fed = ctx.fed;
        let params = &self.params;
        let out: Vec<Result<Vec<Measured>, SimError>> = par_silos(ctx, |i, learner| {
            let train = &fed.clients[i].train;
            evaluated[i]
                .iter()
                .map(|&b| {
                    let (loss_sum, grad) =
                        learner.loss_and_grad(&params[b.index()], train, None)?;
                    Ok((b, loss_sum / train.len() as f64, grad))
                })
                .collect()
        });
        let mut mail = Mail::new(k);
        for (i, res) in out.into_iter().enumerate() {
            let res = res?;
            if !up[i] {
                continue;
            }
            let measured: Vec<(NodeId, f64)> = res.iter().map(|r| (r.0, r.1)).collect();
            self.peers[i].handle_losses(fed.clients[i].train.len(), &measured);
            for (b, _, mut grad) in res {
                let (iu, bu) = (i as u32, b.0);
                let arrives = b.index() == i
                    || (!f.lost(&st, g, iu, bu, Msg::Gradient)
                        && FaultSim::delay_s(&st, iu) < f.tau_grad);
                if arrives {
                    scale(&mut grad, self.peers[i].weight(b));
                    mail.post(NodeId(iu), b, grad);
                }
            }
        }
        // Owners that are up step on what arrived (their own gradient is always there).
        let mut gradients = vec![0usize; k];
        for (b, letters) in mail.boxes.into_iter().enumerate() {
            if !up[b] {
                continue;
            }
            let mut inbox = GradientInbox::new(self.versions[b], self.params[b].len());
            inbox.expect(NodeId(b as u32));
            for &from in &served[b] {
                f.stragglers[b].expect(&mut inbox, from);
            }
            let mut late = 0f64;
            for (from, grad) in letters {
                late = late.max(FaultSim::delay_s(&st, from.0));
                inbox
                    .handle_gradient(from, self.versions[b], grad)
                    .map_err(|r| {
                        SimError::Invariant(format!(
                            "silo-{b} rejected the gradient of {from}: {r}"
                        ))
                    })?;
            }
            wait[b] += if inbox.is_complete() {
                late
            } else {
                f.tau_grad
            };
            f.stragglers[b].handle_step(&inbox);
            gradients[b] = inbox.gradients();
            self.opts[b].step(&mut self.params[b], &inbox.sum());
            self.versions[b] += 1;
        }
        for i in (0..k).filter(|&i| up[i]) {
            f.own_round[i] += 1;
            let table = self.peers[i].table();
            let rec = NodeRound {
                node: i as u32,
                round: f.own_round[i],
                version: self.versions[i],
                sampled: sampled[i].iter().map(|b| b.0).collect(),
                answered: answered[i].iter().map(|b| b.0).collect(),
                gradients: gradients[i],
                weights: self.peers[i]
                    .weights()
                    .into_iter()
                    .map(|(id, w)| (id.0, w))
                    .collect(),
                eval: None,
                seconds: wait[i],
                bytes_sent: 0,
                stream_bytes_sent: 0,
                at: g as f64,
                start: g as f64 - 0.4,
                tracked: table
                    .iter()
                    .map(|(id, e, _)| (id.0, e.tracked_loss))
                    .collect(),
                last: table.iter().map(|(id, e, _)| (id.0, e.last_loss)).collect(),
                suspects: (0..k as u32)
                    .filter(|&j| self.peers[i].is_suspect(NodeId(j)))
                    .collect(),
                resumed: std::mem::take(&mut f.resumed[i]),
            };
            f.traces[i].push(rec);
        }
        f.prev = st;
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
        let mut mixes: Vec<Vec<(NodeId, f64)>> = match &self.engines {
            Some(e) => e.peers().map(Peer::inference_weights).collect(),
            None => self.peers.iter().map(Peer::inference_weights).collect(),
        };
        if let Some(f) = &self.faults {
            // A node fetches the final models of its mixture; the unreachable ones are dropped
            // and the rest renormalised (spec §6). A silo that is down is scored on its own.
            for (i, mix) in mixes.iter_mut().enumerate() {
                let me = i as u32;
                if !f.prev.is_up(me) {
                    *mix = vec![(NodeId(me), 1.0)];
                    continue;
                }
                mix.retain(|&(j, _)| j.0 == me || f.prev.connected(me, j.0));
                let total: f64 = mix.iter().map(|x| x.1).sum();
                if total > 0.0 {
                    for x in mix.iter_mut() {
                        x.1 /= total;
                    }
                } else {
                    *mix = vec![(NodeId(me), 1.0)];
                }
            }
        }
        let engines = self.engines.as_ref();
        let params = &self.params;
        let model = |j: NodeId| match engines {
            Some(e) => e.params(j.index()),
            None => params[j.index()].as_slice(),
        };
        let evals = score_each(ctx, |i| {
            mixes[i].iter().map(|&(j, w)| (model(j), w)).collect()
        })?;
        if let Some(f) = self.faults.as_mut() {
            let g = f.round as f64;
            for (t, e) in f.traces.iter_mut().zip(&evals) {
                if let Some(rec) = t.last_mut().filter(|r| r.at == g) {
                    rec.eval = Some((*e).into());
                }
            }
        }
        Ok(evals)
    }

    /// The K×K weight matrix w_ij (row i: silo, column j: model), self included.
    pub(crate) fn weight_matrix(&self) -> Vec<Vec<f64>> {
        let row = |p: &Peer| p.weights().into_iter().map(|(_, w)| w).collect();
        match &self.engines {
            Some(e) => e.peers().map(row).collect(),
            None => self.peers.iter().map(row).collect(),
        }
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

/// Whether `silo` was restarted at the start of this round (its connections are all new).
fn fired_restart(fired: &[Fault], silo: u32) -> bool {
    fired.contains(&Fault::Restart(silo))
}
