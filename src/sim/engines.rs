//! FedeRiCo without faults, as the nodes run it: one [`Round`] engine per silo — the one the
//! libp2p node drives — on a simulated network where every message arrives at once, in every
//! M-step mode (the engine's sub-steps, the batch streams seeded as a node seeds them).
//!
//! Owns: carrying the engines' messages between them in order, running the learner jobs they
//! ask for in parallel batches (every silo's measure, then every silo's scale, then every
//! owner's step), and keeping the run lock-step: a call runs exactly one round on every silo.
//! Must not: decide anything about a round: the engines decide, the silo layer
//! ([`FedericoSilo`]) computes. Nothing here reads a clock: the engines' clock never moves, so
//! no deadline is ever reached and every round ends on its last gradient.

use super::mail::{Handle, Msg, deliver};
use super::pool::par_silos_with;
use super::{Ctx, SimError};
use crate::core::round::{Action, Done, Job, Round, RoundConfig};
use crate::core::{FedericoConfig, Peer};
use crate::ids::NodeId;
use crate::learn::Adam;
use crate::silo::federico::FedericoSilo;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every silo's engine and model.
pub(crate) struct Engines {
    rounds: Vec<Round<Handle>>,
    silos: Vec<FedericoSilo>,
    /// The job each engine asked for and has not had run (one at a time per engine).
    jobs: Vec<Option<Job>>,
    /// Messages on their way, in the order they were sent.
    mail: VecDeque<(usize, Msg)>,
    /// Peers each silo sampled in its last completed round.
    last_sampled: Vec<Vec<NodeId>>,
    /// The engines' clock, which never moves.
    now: Instant,
}

impl Engines {
    /// One engine per silo over `peers` (each silo's core) and `init` (each silo's model), all
    /// connected to each other.
    pub(crate) fn new(
        ctx: &Ctx<'_>,
        cfg: &FedericoConfig,
        peers: Vec<Peer>,
        init: &[Vec<f32>],
    ) -> Self {
        let k = peers.len();
        let now = Instant::now();
        let steps = ctx.federico_steps();
        let sub_steps = steps.sub_steps;
        // Deadlines exist (the engine needs them) but are never reached: time does not move.
        let day = Duration::from_secs(86_400);
        let mut rounds: Vec<Round<Handle>> = peers
            .into_iter()
            .zip(init)
            .enumerate()
            .map(|(i, (peer, params))| {
                let rc = RoundConfig {
                    me: NodeId(i as u32),
                    members: k,
                    rounds: None,
                    // The simulator scores the silos itself, between rounds.
                    eval_every: u64::MAX,
                    n_train: ctx.fed.clients[i].train.len(),
                    num_params: params.len(),
                    clip_norm: cfg.clip_norm,
                    suspect_after: cfg.suspect_after,
                    model_deadline: day,
                    gradient_deadline: day,
                    start_deadline: day,
                    alone_after: Some(Duration::ZERO),
                    linger: day,
                    sub_steps,
                    foreign_cap: cfg.foreign_cap(k),
                    norm_bound: ctx.scenario.defences.norm_bound(cfg.variant),
                    drop_opposed: ctx.scenario.defences.drop_opposed(cfg.variant),
                    distrust: ctx.scenario.defences.distrust(cfg.variant),
                    weigh_absent: ctx.scenario.defences.weigh_absent(cfg.variant),
                };
                Round::new(rc, peer, 0, 0, Arc::new(params.clone()), now)
            })
            .collect();
        for (i, r) in rounds.iter_mut().enumerate() {
            for j in (0..k).filter(|&j| j != i) {
                r.handle_connected(now, NodeId(j as u32));
                r.handle_speaking(now, NodeId(j as u32));
            }
        }
        let silos = init
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let n = ctx.fed.clients[i].train.len();
                let train = &ctx.fed.clients[i].train;
                FedericoSilo::new(p.clone(), Adam::new(p.len(), ctx.lr()), 0)
                    .with_score_rows(cfg.score_share, ctx.seed, NodeId(i as u32), train)
                    .with_batches(steps, ctx.seed, NodeId(i as u32), n, ctx.batch_size(), 0)
                    .with_privacy(
                        ctx.scenario.privacy.as_ref(),
                        ctx.seed,
                        NodeId(i as u32),
                        n,
                        (ctx.scenario.rounds as u64, sub_steps),
                    )
            })
            .collect();
        Self {
            rounds,
            silos,
            jobs: (0..k).map(|_| None).collect(),
            mail: VecDeque::new(),
            last_sampled: vec![Vec::new(); k],
            now,
        }
    }

    /// Each silo's core.
    pub(crate) fn peers(&self) -> impl Iterator<Item = &Peer> {
        self.rounds.iter().map(Round::peer)
    }

    /// Each silo.
    pub(crate) fn silos(&self) -> impl Iterator<Item = &FedericoSilo> {
        self.silos.iter()
    }

    /// Each silo's current parameters.
    pub(crate) fn params(&self, i: usize) -> &[f32] {
        &self.silos[i].params
    }

    /// Peers each silo sampled in the last round.
    pub(crate) fn last_sampled(&self) -> &[Vec<NodeId>] {
        &self.last_sampled
    }

    /// Runs one round on every silo. A job of the next round (a silo that finished this one
    /// and already has its next models) waits for the next call.
    pub(crate) fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let target = self.rounds.first().map_or(0, Round::rounds_done) + 1;
        loop {
            self.pump()?;
            let batch: Vec<Option<Job>> = self
                .jobs
                .iter_mut()
                .zip(&self.rounds)
                .map(|(job, r)| {
                    if r.rounds_done() < target {
                        job.take()
                    } else {
                        None
                    }
                })
                .collect();
            if batch.iter().all(Option::is_none) {
                break;
            }
            let fed = ctx.fed;
            let items: Vec<_> = batch.into_iter().zip(self.silos.iter_mut()).collect();
            let out = par_silos_with(ctx, items, |i, learner, (job, silo)| {
                job.map(|job| silo.run(learner, &fed.clients[i], job))
                    .transpose()
            });
            for (i, done) in out.into_iter().enumerate() {
                if let Some(done) = done? {
                    self.handle_done(i, done)?;
                }
            }
        }
        if let Some(i) = (0..self.rounds.len()).find(|&i| self.rounds[i].rounds_done() != target) {
            return Err(SimError::Invariant(format!(
                "silo-{i} did not complete round {target} in a fault-free round"
            )));
        }
        Ok(())
    }

    fn handle_done(&mut self, i: usize, done: Done) -> Result<(), SimError> {
        self.rounds[i]
            .handle_done(self.now, done)
            .map_err(|e| SimError::Invariant(format!("silo-{i}: {e}")))
    }

    /// Carries every action and message until the engines are quiet.
    fn pump(&mut self) -> Result<(), SimError> {
        loop {
            for i in 0..self.rounds.len() {
                self.take_actions(i)?;
            }
            if self.mail.is_empty() {
                return Ok(());
            }
            while let Some((to, msg)) = self.mail.pop_front() {
                self.deliver(to, msg)?;
            }
        }
    }

    fn take_actions(&mut self, i: usize) -> Result<(), SimError> {
        while let Some(action) = self.rounds[i].poll_action() {
            match Msg::from_action(i, action) {
                Ok(sent) => self.mail.push_back(sent),
                Err(Action::Run(job)) => {
                    if self.jobs[i].replace(job).is_some() {
                        return Err(SimError::Invariant(format!(
                            "silo-{i} asked for a job with one in flight"
                        )));
                    }
                }
                Err(Action::Report(rep)) => self.last_sampled[i] = rep.sampled,
                // Nothing is ever restarted in a fault-free run.
                Err(_) => {}
            }
        }
        Ok(())
    }

    fn deliver(&mut self, to: usize, msg: Msg) -> Result<(), SimError> {
        match deliver(&mut self.rounds[to], self.now, msg) {
            Ok(reply) => self.mail.extend(reply),
            Err(e) => {
                return Err(SimError::Invariant(format!(
                    "silo-{to} rejected the gradient of silo-{}: {}",
                    e.from, e.why
                )));
            }
        }
        Ok(())
    }
}
