//! FedCollab as the network runs it: the coordinator's engine ([`Engine`] over
//! [`FedCollabServer`], the one `net::coordinator` drives) and one FedCollab member engine per
//! silo ([`CollabMember`], the one `net::collab_node` drives), on a simulated network where
//! every request is answered at once. The coalitions a fault-free `simulate` forms are the
//! ones a swarm forms by construction: the same engines decide, the same pair halves measure,
//! the same coalition average mixes.
//!
//! Owns: carrying each member's questions to the coordinator's engine and its answers back,
//! running the distance phase for every silo at once when they all ask for it (both halves of
//! every pair in this process, [`Estimates`]), the trainings and coalition pulls the members ask
//! for (trainings in parallel), what a node's driver holds (its model, optimiser, batch stream,
//! its trained model of the round), the record of the structure, and keeping the run
//! lock-step: a call runs exactly one FL round on every silo (the first also finds the
//! structure).
//! Must not: decide anything (the engines do), solve the structure (the coordinator's server
//! does; the record's own solve is checked against it), or combine models other than by
//! [`coalition_average`]. Nothing here reads a clock: the engines' clock never moves, so no
//! deadline is reached, and a member left out of the plan, refused, or without a structure is a
//! broken invariant, reported as an error.

use super::super::coordinated::CoordinatedRun;
use super::super::fedcollab::{Estimates, Record};
use super::super::pool::{Owner, par_silos_with, score_each};
use super::super::{ClientEval, Ctx, SimError};
use super::answered_at_once;
use crate::coord::PairDistance;
use crate::coord::engine::{Answer, Engine, EngineConfig, Request};
use crate::coord::fedcollab::member::{
    Action, Ask, Coalition, CollabMember, CollabMemberConfig, Event, Reply, Resume,
};
use crate::coord::fedcollab::{FedCollabConfig, coalition_average};
use crate::coord::fedcollab_server::FedCollabServer;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::Adam;
use crate::silo::fedcollab::FL_BATCH_TAG;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::time::{Duration, Instant};

/// What a FedCollab node's driver holds for its engine.
pub(super) struct Silo {
    pub(super) n_train: u64,
    /// Its model: the coalition's average of the last round.
    pub(super) params: Vec<f32>,
    pub(super) adam: Adam,
    pub(super) rng: StdRng,
    /// Its distances, once measured.
    pub(super) report: Option<Vec<PairDistance>>,
    /// The distance phase asked for, with the plan's discriminator-train target.
    pub(super) pairs: Option<f64>,
    /// The round of a training asked for.
    job: Option<u64>,
    /// Its trained model of a round, for the coalition's pulls.
    pub(super) local: Option<(u64, Vec<f32>)>,
    /// A pull asked for.
    pull: Option<(u64, Coalition)>,
}

impl Silo {
    /// Silo `i` of `ctx` before its run, its model `init` (silo 0's initialisation, as the
    /// nodes start), its batch stream seeded as its node seeds it.
    pub(super) fn new(ctx: &Ctx<'_>, i: usize, init: &[f32]) -> Self {
        Self {
            n_train: ctx.fed.clients[i].train.len() as u64,
            params: init.to_vec(),
            adam: Adam::new(init.len(), ctx.lr()),
            rng: StdRng::seed_from_u64(stream_seed(
                ctx.seed ^ FL_BATCH_TAG,
                NodeId(i as u32),
                Stream::Batches,
            )),
            report: None,
            pairs: None,
            job: None,
            local: None,
            pull: None,
        }
    }

    /// The member's question as the request its node sends.
    pub(super) fn request(&self, ask: Ask) -> Request {
        match ask {
            Ask::Join => Request::Join {
                n_train: self.n_train,
            },
            Ask::Plan => Request::Fetch { round: 0 },
            Ask::Distances => Request::Distances {
                pairs: self.report.clone().unwrap_or_default(),
            },
            Ask::Coalition => Request::Fetch { round: 1 },
        }
    }
}

/// The coordinator's answer as a node's driver reads it.
pub(super) fn read(answer: Answer) -> Reply {
    match answer {
        Answer::Ack => Reply::Ack,
        Answer::Error { reason } => Reply::Refused(reason),
        Answer::DiscPlan {
            target,
            nodes,
            members,
        } => Reply::Plan {
            target,
            nodes,
            members,
        },
        Answer::Coalition { members, sizes } => Reply::Coalition { members, sizes },
        other => Reply::Other(format!("an answer to another question: {other:?}")),
    }
}

/// FedCollab's run over its engines.
pub(crate) struct CollabRun {
    engine: Engine<usize>,
    members: Vec<CollabMember>,
    silos: Vec<Silo>,
    names: Vec<String>,
    cfg: FedCollabConfig,
    seed: u64,
    record: Option<Record>,
    /// The engines' clock, which never moves.
    now: Instant,
}

impl CollabRun {
    /// A fault-free run for `ctx`'s silos, every coalition starting from `init[0]` (silo 0's
    /// seeded initialisation, as the nodes start).
    pub(crate) fn new(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Result<Self, SimError> {
        let k = ctx.clients();
        let cfg = ctx.scenario.fedcollab.clone();
        let now = Instant::now();
        let rounds = ctx.scenario.rounds as u64;
        // Deadlines exist (the engines need them) but are never reached: time does not move.
        let day = Duration::from_secs(86_400);
        let names: Vec<String> = (0..k).map(|i| format!("silo-{i:06}")).collect();
        let server = FedCollabServer::new(cfg.clone(), k, ctx.seed)
            .map_err(|e| SimError::Invariant(format!("fedcollab coordinator: {e}")))?;
        let mut engine = Engine::new(
            Box::new(server),
            EngineConfig {
                rounds,
                nodes: k,
                round_deadline: day,
                join_deadline: None,
                linger: Duration::ZERO,
                excuse_rounds: 0,
                names: names.clone(),
            },
        );
        engine
            .handle_start(now)
            .map_err(|e| SimError::Invariant(format!("fedcollab coordinator: {e}")))?;
        let silos: Vec<Silo> = (0..k).map(|i| Silo::new(ctx, i, &init[0])).collect();
        let mut members: Vec<CollabMember> = silos
            .iter()
            .enumerate()
            .map(|(i, s)| {
                CollabMember::new(
                    CollabMemberConfig {
                        me: i as u32,
                        n_train: s.n_train,
                        rounds,
                        fetch: day,
                        structure_wait: day,
                        attach_wait: day,
                        retry: Duration::from_millis(200),
                        // The simulator scores the silos itself, between rounds.
                        eval_every: 0,
                        // Nobody misses a pull here.
                        excuse_rounds: 0,
                        excused_grace: Duration::ZERO,
                    },
                    Resume::default(),
                )
            })
            .collect();
        for m in &mut members {
            m.handle_start(now);
        }
        Ok(Self {
            engine,
            members,
            silos,
            names,
            cfg,
            seed: ctx.seed,
            record: None,
            now,
        })
    }

    /// Carries every action and answer until the engines are quiet.
    fn pump(&mut self) -> Result<(), SimError> {
        loop {
            let mut moved = false;
            for i in 0..self.members.len() {
                while let Some(action) = self.members[i].poll_action() {
                    moved = true;
                    self.act(i, action)?;
                }
            }
            if !moved {
                return Ok(());
            }
        }
    }

    /// Carries out member `i`'s action.
    fn act(&mut self, i: usize, action: Action) -> Result<(), SimError> {
        let broken = |what: String| Err(SimError::Invariant(format!("silo-{i}: {what}")));
        let s = &mut self.silos[i];
        match action {
            Action::Ask { ask, .. } => self.ask(i, ask)?,
            Action::RunPairs { planned, .. } if planned.len() != self.members.len() => {
                return broken(format!("planned {planned:?} in a fault-free run"));
            }
            Action::RunPairs { target, .. } => s.pairs = Some(target),
            Action::Train { round } => {
                if s.job.replace(round).is_some() {
                    return broken("asked to train with a training in flight".into());
                }
            }
            Action::Pull {
                round, coalition, ..
            } => s.pull = Some((round, coalition)),
            Action::Average {
                round,
                coalition,
                averaged,
            } => {
                let models = coalition
                    .members
                    .iter()
                    .map(|&m| match &self.silos[m as usize].local {
                        _ if !averaged.contains(&m) => Ok(None),
                        Some((r, p)) if *r == round => Ok(Some(p.as_slice())),
                        _ => Err(SimError::Invariant(format!(
                            "silo-{i} averaged round {round} of silo-{m}, which has not trained it"
                        ))),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.silos[i].params = coalition_average(&models, &coalition.sizes);
            }
            Action::EndRound(_) => self.members[i].handle_round_written(self.now),
            Action::AwaitServed { .. } => self.members[i].handle_served(self.now),
            // The coalition is the engine's; nothing is written or republished here.
            Action::Adopt(_) | Action::Save | Action::Republish | Action::Finish => {}
            Action::Event(Event::CoalitionReceived(_)) => {}
            Action::Event(e) => return broken(format!("{e:?} in a fault-free run")),
            Action::Fail(why) => return broken(why),
        }
        Ok(())
    }

    /// Member `i`'s question to the coordinator's engine; the answers it gives (to `i`, or to
    /// silos whose held fetches it now serves) go back to their members.
    fn ask(&mut self, i: usize, ask: Ask) -> Result<(), SimError> {
        let request = self.silos[i].request(ask);
        for (ticket, answer) in
            answered_at_once(&mut self.engine, self.now, &self.names[i], i, request)?
        {
            self.members[ticket].handle_reply(self.now, read(answer));
        }
        Ok(())
    }

    /// The distance phase, once every silo asked for it: every pair measured in this process,
    /// each silo handed its report, and the record of the structure kept.
    fn distances(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let targets: Vec<Option<f64>> = self.silos.iter().map(|s| s.pairs).collect();
        let Some(target) = targets[0].filter(|_| targets.iter().all(|t| *t == targets[0])) else {
            return Err(SimError::Invariant(format!(
                "the silos asked for the distance phase with the targets {targets:?}"
            )));
        };
        let sizes: Vec<u64> = self.silos.iter().map(|s| s.n_train).collect();
        let est = Estimates::measure(ctx, &self.cfg, target)?;
        for (i, s) in self.silos.iter_mut().enumerate() {
            s.report = Some(est.report(i));
            s.pairs = None;
        }
        let (record, coalitions) = Record::new(&self.cfg, sizes, est, self.seed)?;
        for m in &mut self.members {
            m.handle_pairs(self.now);
        }
        self.pump()?;
        let solved = self.engine.algorithm().solved().map(|s| &s.coalitions);
        if solved != Some(&coalitions) {
            return Err(SimError::Invariant(format!(
                "the coordinator solved {solved:?}; the record's solve found {coalitions:?}"
            )));
        }
        self.record = Some(record);
        Ok(())
    }

    /// Every pull asked for, answered from the members' trained models of the round (the
    /// engine then averages them: [`Action::Average`]).
    fn pulls(&mut self) -> Result<bool, SimError> {
        let mut any = false;
        for i in 0..self.silos.len() {
            let Some((round, c)) = self.silos[i].pull.take() else {
                continue;
            };
            any = true;
            for &m in c.members.iter().filter(|&&m| m as usize != i) {
                match &self.silos[m as usize].local {
                    Some((r, _)) if *r == round => self.members[i].handle_model(self.now, m, true),
                    _ => {
                        return Err(SimError::Invariant(format!(
                            "silo-{i} pulled round {round} of silo-{m}, which has not trained it"
                        )));
                    }
                }
            }
        }
        Ok(any)
    }
}

impl CoordinatedRun for CollabRun {
    /// One FL round in every coalition (the first call also joins, measures the distances and
    /// gets the structure): every member trains one local epoch from its coalition's model,
    /// and the model becomes the m_j/M_k-weighted average, summed in ascending member order
    /// (spec §5, §6). A training of the next round waits for the next call.
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let target = self.members.iter().map(|m| m.round()).min().unwrap_or(0) + 1;
        loop {
            self.pump()?;
            if self.silos.iter().any(|s| s.pairs.is_some()) {
                self.distances(ctx)?;
                continue;
            }
            if self.pulls()? {
                continue;
            }
            let jobs: Vec<Option<u64>> = self
                .silos
                .iter_mut()
                .zip(&self.members)
                .map(|(s, m)| {
                    if m.round() < target {
                        s.job.take()
                    } else {
                        None
                    }
                })
                .collect();
            if jobs.iter().all(Option::is_none) {
                break;
            }
            let fed = ctx.fed;
            let items: Vec<_> = jobs.into_iter().zip(self.silos.iter_mut()).collect();
            let out = par_silos_with(ctx, items, |i, learner, (job, s)| {
                let Some(round) = job else {
                    return Ok(false);
                };
                let mut p = s.params.clone();
                learner.train_epoch(&mut p, &mut s.adam, &fed.clients[i].train, &mut s.rng)?;
                s.local = Some((round, p));
                Ok::<bool, SimError>(true)
            });
            for (i, trained) in out.into_iter().enumerate() {
                if trained? {
                    self.members[i].handle_trained(self.now);
                }
            }
        }
        if let Some(i) = (0..self.members.len()).find(|&i| self.members[i].round() < target) {
            return Err(SimError::Invariant(format!(
                "silo-{i} did not complete round {target} in a fault-free round"
            )));
        }
        Ok(())
    }

    /// Each silo's coalition model on its own test split (spec §5, "evaluation").
    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let silos = &self.silos;
        score_each(ctx, |i| {
            vec![(Owner::Shared, silos[i].params.as_slice(), 1.0)]
        })
    }

    fn record(&self) -> Option<serde_json::Value> {
        self.record
            .as_ref()
            .and_then(|r| serde_json::to_value(r).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    /// 6 silos of a synthetic task in two label groups, FedCollab with `distance`.
    fn scenario(distance: &str) -> Scenario {
        Scenario::parse(&format!(
            "rounds = 4\nalgorithms = [\"fedcollab\"]\n\
             [data]\nsource = \"mixture\"\ntrain = 40\ntest = 50\n\
             [split]\nclients = 6\ngroups = 2\n[model]\nkind = \"softmax\"\n\
             [train]\nbatch_size = 16\n[fedcollab]\ndistance = \"{distance}\"\n"
        ))
        .unwrap()
    }

    /// The engines find the structure in the first round, the coordinator's solve and the
    /// record's agree (checked inside the run), and every round leaves each coalition's
    /// members with one model, bit for bit, that moves from round to round.
    #[test]
    fn coalitions_form_on_the_engines_and_their_members_hold_one_model() {
        for distance in ["label_tv", "discriminator"] {
            let s = scenario(distance);
            super::super::super::with_ctx(&s, 3, |ctx, init| {
                let mut run = CollabRun::new(ctx, init).unwrap();
                let mut before: Option<Vec<Vec<f32>>> = None;
                for r in 0..4 {
                    run.round(ctx).unwrap();
                    assert!(run.members.iter().all(|m| m.round() == r + 1));
                    let coalitions = run.engine.algorithm().solved().unwrap().coalitions.clone();
                    for c in &coalitions {
                        let first = &run.silos[c[0]].params;
                        assert!(c.iter().all(|&i| run.silos[i].params == *first), "{c:?}");
                    }
                    let now: Vec<Vec<f32>> = run.silos.iter().map(|s| s.params.clone()).collect();
                    assert_ne!(
                        before.as_ref(),
                        Some(&now),
                        "{distance} round {r}: no change"
                    );
                    before = Some(now);
                }
                let coalitions = &run.engine.algorithm().solved().unwrap().coalitions;
                assert!(coalitions.len() >= 2, "{distance}: {coalitions:?}");
                assert!(run.record().is_some());
            });
        }
    }
}
