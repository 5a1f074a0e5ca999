//! The sampler's side of a round: pulling models, measuring, and fetching models for
//! evaluation.
//!
//! Owns: starting a round (sampling, pulls and notices), what each answer or failure of a pull
//! or fetch does (a model kept in sampled order, a failure or a late model counted against its
//! owner, a model too late for its round released with a skip), when pulling and fetching are
//! over, and the renormalisation of an incomplete evaluation mixture.
//! Must not: read a clock or touch the network: `now` comes in, [`Action`]s go out.

use super::{Action, Asked, Event, Job, Phase, ReqId, Round};
use crate::ids::NodeId;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

impl<H> Round<H> {
    /// What request `req` asked for, while it is unanswered.
    pub fn asked(&self, req: ReqId) -> Option<Asked> {
        self.outstanding.get(&req).copied()
    }

    /// A model (checked by the driver: fingerprint, length, finite values) answers `req`.
    pub fn handle_model(&mut self, now: Instant, req: ReqId, version: u64, params: Arc<Vec<f32>>) {
        let abandoned = self.abandoned.remove(&req);
        match self.outstanding.remove(&req) {
            Some(Asked::Pull { round, to }) if !abandoned && round == self.current_step() => {
                // Liveness is the round's first pull's to record (a sub-step's pull is the
                // same owner again, within the round).
                if self.sub == 0 {
                    self.peer.handle_reachable(to);
                }
                self.received.push((to, version, params));
                // Keep the sampled order (the simulator's order of measurement).
                let order = &self.sampled;
                self.received
                    .sort_by_key(|x| order.iter().position(|b| *b == x.0));
                self.pull_settled(to);
            }
            Some(Asked::Pull { to, .. }) => {
                // Too late for its round: release the owner.
                self.actions.push_back(Action::Skip { to, version });
            }
            Some(Asked::Fetch { to }) => {
                if let Phase::Fetching { waiting, .. } = &mut self.phase {
                    if waiting.remove(&to) {
                        if let Some(slot) = self.fetched.iter_mut().find(|f| f.0 == to) {
                            slot.1 = params;
                        }
                    }
                }
            }
            Some(Asked::Notice) | None => {}
        }
        self.advance(now);
    }

    /// An acknowledgement answers `req` (a notice).
    pub fn handle_ack(&mut self, req: ReqId) {
        self.abandoned.remove(&req);
        self.outstanding.remove(&req);
    }

    /// The answer to `req` was refused (the wrong kind, or a model that failed its checks), or
    /// the request failed: a pull of this round counts as failed (the owner keeps its last
    /// loss, spec §6), a fetch leaves the mixture. Returns what it asked for.
    pub fn handle_failed(&mut self, now: Instant, req: ReqId) -> Option<Asked> {
        let abandoned = self.abandoned.remove(&req);
        let asked = self.outstanding.remove(&req);
        match asked {
            Some(Asked::Pull { round, to }) if !abandoned && round == self.current_step() => {
                if self.sub == 0 {
                    self.peer.handle_unreachable(to);
                }
                self.pull_settled(to);
            }
            Some(Asked::Fetch { to }) => {
                if let Phase::Fetching { waiting, .. } = &mut self.phase {
                    waiting.remove(&to);
                }
            }
            _ => {}
        }
        self.advance(now);
        asked
    }

    /// `req` was never sent (a scheduled message loss): its deadline decides, nothing answers.
    pub fn forget(&mut self, req: ReqId) {
        self.outstanding.remove(&req);
        self.abandoned.remove(&req);
    }

    pub(super) fn pull_settled(&mut self, b: NodeId) {
        if let Phase::Pulling { waiting, .. } = &mut self.phase {
            waiting.remove(&b);
        }
    }

    pub(super) fn start_round(&mut self, now: Instant) {
        self.round_started = now;
        self.sampled = self.peer.sample();
        self.log(Event::RoundStarts {
            round: self.current_round(),
            sampled: self.sampled.clone(),
        });
        let sampled = self.sampled.clone();
        self.start_pulls(now, sampled);
    }

    /// A later sub-step of a mini-batch M-step: pulls go to the models measured at the
    /// round's first sub-step that this silo pushes gradients to (the weights are held over
    /// the round); every other connected peer gets a notice.
    pub(super) fn start_sub_step(&mut self, now: Instant) {
        let pulls: Vec<NodeId> = self
            .measured
            .iter()
            .copied()
            .filter(|&b| self.peer.push_weight(b).is_some())
            .collect();
        self.start_pulls(now, pulls);
    }

    /// Pulls from `pulls` and notices to every other connected peer, for the current step.
    fn start_pulls(&mut self, now: Instant, pulls: Vec<NodeId>) {
        let t = self.current_step();
        self.received.clear();
        let pulled: BTreeSet<NodeId> = pulls.iter().copied().collect();
        for b in pulls {
            let req = self.request(Asked::Pull { round: t, to: b });
            self.actions.push_back(Action::Pull {
                req,
                to: b,
                round: t,
            });
        }
        let others: Vec<NodeId> = self
            .connected
            .iter()
            .copied()
            .filter(|k| !pulled.contains(k))
            .collect();
        for k in others {
            let req = self.request(Asked::Notice);
            self.actions.push_back(Action::Notice {
                req,
                to: k,
                round: t,
            });
        }
        self.phase = Phase::Pulling {
            deadline: now + self.cfg.model_deadline,
            waiting: pulled,
        };
    }

    /// Pulling is over (every model came or failed, or τ_model ran out): measure.
    pub(super) fn end_pulling(&mut self) {
        let r = self.current_round();
        let t = self.current_step();
        let late: Vec<NodeId> = match &self.phase {
            Phase::Pulling { waiting, .. } => waiting.iter().copied().collect(),
            _ => Vec::new(),
        };
        for b in late {
            self.log(Event::ModelLate { peer: b, round: r });
            if self.sub == 0 {
                self.peer.handle_unreachable(b);
            }
        }
        for (req, asked) in &self.outstanding {
            if matches!(asked, Asked::Pull { round, .. } if *round == t) {
                self.abandoned.insert(*req);
            }
        }
        let mut models: Vec<(NodeId, Arc<Vec<f32>>)> = self
            .received
            .iter()
            .map(|(b, _, p)| (*b, p.clone()))
            .collect();
        models.push((self.cfg.me, self.snapshot.clone()));
        self.phase = Phase::Measuring;
        let job = if self.sub == 0 {
            self.measured = self.received.iter().map(|x| x.0).collect();
            Job::Measure {
                models,
                batched: self.cfg.sub_steps.is_some(),
            }
        } else {
            // The weights of the round's E-step; every pulled model has one (see
            // `start_sub_step`), the silo's own always.
            let models = models
                .into_iter()
                .map(|(b, p)| (b, p, self.peer.push_weight(b).unwrap_or(0.0)))
                .collect();
            Job::Descend { models }
        };
        self.actions.push_back(Action::Run(job));
    }

    pub(super) fn start_fetching(&mut self, now: Instant) {
        let mix = self.peer.inference_weights();
        self.fetched.clear();
        let mut waiting = BTreeSet::new();
        for (id, w) in mix {
            if id == self.cfg.me {
                self.fetched.push((id, self.snapshot.clone(), w));
            } else {
                let req = self.request(Asked::Fetch { to: id });
                self.actions.push_back(Action::Fetch {
                    req,
                    to: id,
                    version: self.round * self.steps(),
                });
                waiting.insert(id);
                // Remember the weight until the model arrives.
                self.fetched.push((id, Arc::new(Vec::new()), w));
            }
        }
        self.phase = Phase::Fetching {
            deadline: now + self.cfg.model_deadline,
            waiting,
        };
    }

    /// Fetching is over: peers whose final model did not come are dropped and the rest
    /// renormalised (spec §6, departed peers at inference); a complete mixture keeps the
    /// core's weights exactly.
    pub(super) fn end_fetching(&mut self) {
        let late: Vec<NodeId> = match &self.phase {
            Phase::Fetching { waiting, .. } => waiting.iter().copied().collect(),
            _ => Vec::new(),
        };
        for peer in late {
            self.log(Event::FetchLate { peer });
        }
        let all = std::mem::take(&mut self.fetched);
        let mix: Vec<(NodeId, f64)> = all.iter().map(|p| (p.0, p.2)).collect();
        let arrived = |id: NodeId| all.iter().any(|p| p.0 == id && !p.1.is_empty());
        let me = self.cfg.me;
        let parts = crate::core::incomplete_mixture(&mix, arrived, me)
            .into_iter()
            .map(|(id, w)| {
                let params = match all.iter().find(|p| p.0 == id) {
                    Some(p) if id != me || !p.1.is_empty() => p.1.clone(),
                    _ => self.snapshot.clone(),
                };
                (id, params, w)
            })
            .collect();
        self.phase = Phase::Evaluating;
        self.actions.push_back(Action::Run(Job::Evaluate {
            round: self.round,
            parts,
        }));
    }
}
