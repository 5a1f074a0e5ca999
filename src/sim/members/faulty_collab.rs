//! FedCollab under a fault schedule: the same engines as the fault-free run (the coordinator's
//! [`Engine`] over [`FedCollabServer`], one [`CollabMember`] per silo) on a simulated network
//! with a virtual clock that moves, so budgets, retries, excuses and the final wait happen as
//! over a real network: a slow silo (`delay`), lost messages (`loss`), a coalition member that
//! registered and went silent (`leave`), and the coordinator's crash and restart from its last
//! checkpoint (`coordinator_crash`).
//!
//! Owns: the virtual clock and the messages in flight, the coordinator's and the coalition
//! members' (a silo's requests and answers leave after its delay, or are lost by its fault
//! stream; the coordinator's answers go out at once, lost by the receiver's stream; an
//! exchange with no answer fails at its `within`; a down coordinator refuses at once), what a
//! node's link holds (its published models of the last [`KEEP_ROUNDS`] rounds, the pulls held
//! until it trains the round, the pulls it served), the faults of each federation round (the
//! coordinator's crash and restart: [`SimCoordinator`]), and the record the checks read (each silo's rounds,
//! the rounds whose pull waited its whole budget for an awaited member).
//! Must not: decide anything (the engines do), judge the run
//! ([`crate::faults::checks::evaluate_collab`] does), or draw a loss from any stream but the
//! sender's fault stream ([`crate::faults::link::fate`]).
//!
//! Simplified: the distance phase takes no virtual time and none of its messages is lost or
//! late: once every planned silo that stayed asked for it, every pair is measured in this
//! process ([`Estimates`]) and each silo reports its planned partners' (a partner that left
//! reports no distance). Training takes no virtual time. A federation round `r` runs until a
//! silo that stayed completed `r` FL rounds (the leading silo's round); the last runs until
//! every silo that stayed finished.

use super::super::fedcollab::{Estimates, Record};
use super::super::pool::{Owner, score_each};
use super::super::{ClientEval, Ctx, SimError};
use super::Decode;
use super::collab::{Silo, read};
use super::coordinator::{Out, SimCoordinator};
use super::faulty::{Delivery, FaultyRun, answer_fate, loss_of, ms};
use crate::coord::PairDistance;
use crate::coord::engine::{EngineConfig, Request};
use crate::coord::fedcollab::member::{
    Action, Coalition, CollabMember, CollabMemberConfig, Reply, Resume,
};
use crate::coord::fedcollab::{FedCollabConfig, coalition_average};
use crate::coord::fedcollab_server::FedCollabServer;
use crate::faults::checks::{Applied, CollabInputs, Report, SiloRun};
use crate::faults::link::{Fate, fate};
use crate::faults::{Fault, Schedule, Timeline};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::trace::EvalRecord;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The rounds of its own model a node keeps for its coalition's pulls (as its link does).
const KEEP_ROUNDS: usize = 8;

/// What a FedCollab node gives an excused member's model at least (as its driver gives its
/// engine).
const EXCUSED_GRACE: Duration = Duration::from_millis(100);

/// Something due at a moment of the virtual clock.
enum Due {
    /// A member's request reaches the coordinator.
    ToCoordinator { from: usize, id: u64, req: Request },
    /// The answer to exchange `id` reaches silo `to`.
    ToMember { to: usize, id: u64, what: Delivery },
    /// Exchange `id` of silo `silo` has had its `within`.
    GiveUp { silo: usize, id: u64 },
    /// Pull `id` of silo `from` reaches coalition member `to`.
    PullReaches { from: usize, to: usize, id: u64 },
    /// Member `from`'s answer to pull `id` reaches silo `to` (`None`: refused).
    PullAnswer {
        to: usize,
        from: usize,
        id: u64,
        model: Option<Arc<Vec<f32>>>,
    },
    /// The pull `id` of silo `silo` from `mate` has had its `within`.
    PullGiveUp { silo: usize, id: u64, mate: usize },
    /// Silo `silo`'s wait `id` for its last pulls is over.
    ServedGiveUp { silo: usize, id: u64 },
}

/// A pull under way (the engine decides when it is over).
struct Pulling {
    id: u64,
    round: u64,
    got: BTreeMap<usize, Arc<Vec<f32>>>,
    /// When the pull ends having waited its whole budget.
    budget_until: Instant,
}

/// What a node's link holds for its coalition.
#[derive(Default)]
struct Link {
    published: VecDeque<(u64, Arc<Vec<f32>>)>,
    /// Pulls held until this silo trains their round: (round, puller, pull).
    held: Vec<(u64, usize, u64)>,
    /// Pulls of each round answered.
    served: BTreeMap<u64, usize>,
    /// The final wait: (round, pulls to wait for, its id).
    serving: Option<(u64, usize, u64)>,
}

/// FedCollab's run under a fault schedule.
pub(crate) struct FaultyCollab {
    coordinator: SimCoordinator,
    cfg: FedCollabConfig,
    seed: u64,
    members: Vec<CollabMember>,
    silos: Vec<Silo>,
    links: Vec<Link>,
    pulls: Vec<Option<Pulling>>,
    /// The planned silos of a distance phase asked for.
    planned: Option<Vec<usize>>,
    now: Instant,
    due: BTreeMap<(Instant, u64), Due>,
    seq: u64,
    /// Each silo's exchange with the coordinator under way.
    asking: Vec<Option<u64>>,
    timeline: Timeline,
    faults: Vec<StdRng>,
    round: u64,
    rounds: u64,
    record: Option<Record>,
    applied: Vec<Applied>,
    runs: Vec<SiloRun>,
    /// Each silo's FL rounds (counted from 0) whose pull waited out its budget.
    waited: Vec<Vec<u64>>,
    schedule: Schedule,
}

/// The bound on the events of one federation round (a loop that never ends is a bug).
const MAX_STEPS: u64 = 10_000_000;

impl FaultyCollab {
    /// A run for `ctx`'s silos under `schedule`, every coalition starting from `init[0]`.
    pub(crate) fn new(
        ctx: &Ctx<'_>,
        init: &[Vec<f32>],
        schedule: Schedule,
    ) -> Result<Self, SimError> {
        let k = ctx.clients();
        let rounds = ctx.scenario.rounds as u64;
        let cfg = ctx.scenario.fedcollab.clone();
        let fc = &schedule.config;
        let fetch = Duration::from_secs_f64(fc.fetch_s);
        let names: Vec<String> = (0..k).map(|i| format!("silo-{i:06}")).collect();
        let coordinator = |e: String| SimError::Invariant(format!("fedcollab coordinator: {e}"));
        let server = FedCollabServer::new(cfg.clone(), k, ctx.seed).map_err(coordinator)?;
        let engine_cfg = EngineConfig {
            rounds,
            nodes: k,
            round_deadline: Duration::from_secs_f64(fc.update_deadline_s),
            // A silo that leaves before it joined does not hold the others forever.
            join_deadline: Some(Duration::from_secs_f64(fc.update_deadline_s)),
            linger: Duration::ZERO,
            excuse_rounds: fc.excuse_rounds,
            names,
        };
        let now = Instant::now();
        let (server_cfg, seed) = (cfg.clone(), ctx.seed);
        let decode: Decode = Box::new(move |b| {
            Ok(Box::new(FedCollabServer::decode(
                server_cfg.clone(),
                seed,
                b,
            )?))
        });
        let (coordinator, outs) = SimCoordinator::start(Box::new(server), engine_cfg, decode, now)?;
        let silos: Vec<Silo> = (0..k).map(|i| Silo::new(ctx, i, &init[0])).collect();
        let members = silos
            .iter()
            .enumerate()
            .map(|(i, s)| {
                CollabMember::new(
                    CollabMemberConfig {
                        me: i as u32,
                        n_train: s.n_train,
                        rounds,
                        fetch,
                        structure_wait: fetch * 5,
                        attach_wait: Duration::from_millis(500),
                        retry: Duration::from_millis(200),
                        eval_every: 0,
                        excuse_rounds: fc.excuse_rounds,
                        excused_grace: EXCUSED_GRACE,
                    },
                    Resume::default(),
                )
            })
            .collect();
        let mut run = Self {
            coordinator,
            cfg,
            seed: ctx.seed,
            members,
            silos,
            links: (0..k).map(|_| Link::default()).collect(),
            pulls: (0..k).map(|_| None).collect(),
            planned: None,
            now,
            due: BTreeMap::new(),
            seq: 0,
            asking: vec![None; k],
            timeline: schedule.timeline(rounds),
            faults: (0..k)
                .map(|i| {
                    StdRng::seed_from_u64(stream_seed(ctx.seed, NodeId(i as u32), Stream::Faults))
                })
                .collect(),
            round: 0,
            rounds,
            record: None,
            applied: Vec::new(),
            runs: vec![SiloRun::default(); k],
            waited: vec![Vec::new(); k],
            schedule,
        };
        run.carry(outs);
        for m in &mut run.members {
            m.handle_start(now);
        }
        Ok(run)
    }

    fn stayed(&self, i: usize) -> bool {
        !self.runs[i].left
    }

    /// Runs federation round `round + 1`: its faults, then the engines until a silo that
    /// stayed completed it (the last round: every silo that stayed finished).
    fn run_round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        self.round += 1;
        let r = self.round;
        for fault in self.timeline.fired(r).to_vec() {
            self.apply(&fault)?;
            self.applied.push(Applied {
                at: r as f64 - 0.5,
                fault,
            });
        }
        let last = r >= self.rounds;
        let k = self.members.len();
        for step in 0..MAX_STEPS {
            self.pump(ctx)?;
            let done = if last {
                (0..k).all(|i| !self.stayed(i) || self.runs[i].finished)
            } else {
                (0..k).any(|i| self.stayed(i) && self.members[i].round() >= r)
            };
            if done {
                return Ok(());
            }
            let Some(next) = self.next_due() else {
                return Err(SimError::Invariant(format!(
                    "round {r}: nothing is due and the silos have not finished (step {step})"
                )));
            };
            self.now = self.now.max(next);
            self.fire()?;
        }
        Err(SimError::Invariant(format!(
            "round {r} took more than {MAX_STEPS} events"
        )))
    }

    /// The earliest moment something is due.
    fn next_due(&self) -> Option<Instant> {
        let msgs = self.due.keys().next().map(|k| k.0);
        let engine = self.coordinator.poll_timeout();
        let members = (0..self.members.len())
            .filter(|&i| self.stayed(i))
            .filter_map(|i| self.members[i].poll_timeout());
        msgs.into_iter().chain(engine).chain(members).min()
    }

    /// Everything due by now.
    fn fire(&mut self) -> Result<(), SimError> {
        let now = self.now;
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            match entry.remove() {
                Due::ToCoordinator { from, id, req } => self.at_coordinator(from, id, req)?,
                Due::ToMember { to, id, what } => {
                    if self.stayed(to) && self.asking[to] == Some(id) {
                        self.asking[to] = None;
                        let reply = match what {
                            Delivery::Answer(a) => read(a),
                            Delivery::Failed(why) => Reply::Other(why),
                        };
                        self.members[to].handle_reply(now, reply);
                    }
                }
                Due::GiveUp { silo, id } => {
                    if self.asking[silo] == Some(id) {
                        self.asking[silo] = None;
                        self.members[silo].handle_reply(now, Reply::TimedOut);
                    }
                }
                Due::PullReaches { from, to, id } => self.pull_reaches(from, to, id),
                Due::PullAnswer {
                    to,
                    from,
                    id,
                    model,
                } => self.pull_answered(to, from, id, model),
                Due::PullGiveUp { silo, id, mate } => self.pull_answered(silo, mate, id, None),
                Due::ServedGiveUp { silo, id } => {
                    if self.links[silo].serving.is_some_and(|s| s.2 == id) {
                        self.links[silo].serving = None;
                        self.members[silo].handle_served(now);
                    }
                }
            }
        }
        let outs = self.coordinator.timeout(now)?;
        self.carry(outs);
        for i in 0..self.members.len() {
            if self.stayed(i) && self.members[i].poll_timeout().is_some_and(|t| t <= now) {
                self.members[i].handle_timeout(now);
            }
        }
        Ok(())
    }

    /// Carries out every member's actions until none has more.
    fn pump(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        loop {
            let mut moved = false;
            for i in 0..self.members.len() {
                if !self.stayed(i) {
                    continue;
                }
                while let Some(action) = self.members[i].poll_action() {
                    moved = true;
                    self.act(ctx, i, action)?;
                }
            }
            if self.pairs_due() {
                self.distances(ctx)?;
                moved = true;
            }
            if !moved {
                return Ok(());
            }
        }
    }

    fn act(&mut self, ctx: &mut Ctx<'_>, i: usize, action: Action) -> Result<(), SimError> {
        let now = self.now;
        match action {
            Action::Ask { ask, within } => {
                self.seq += 1;
                let id = self.seq;
                self.asking[i] = Some(id);
                self.at(now + within, Due::GiveUp { silo: i, id });
                let req = self.silos[i].request(ask);
                if let Some(d) = self.send_from(i) {
                    self.at(now + d, Due::ToCoordinator { from: i, id, req });
                }
            }
            Action::RunPairs { target, planned } => {
                self.silos[i].pairs = Some(target);
                self.planned = Some(planned);
            }
            Action::Train { round } => {
                let s = &mut self.silos[i];
                let mut p = s.params.clone();
                ctx.learners[i]
                    .train_epoch(&mut p, &mut s.adam, &ctx.fed.clients[i].train, &mut s.rng)
                    .map_err(|e| SimError::Invariant(format!("silo-{i} training: {e}")))?;
                s.local = Some((round, p.clone()));
                self.publish(i, round, Arc::new(p));
                self.members[i].handle_trained(now);
            }
            Action::Pull {
                round,
                coalition,
                within,
            } => self.start_pull(i, round, &coalition, within),
            Action::Average {
                round,
                coalition,
                averaged,
            } => self.average(i, round, &coalition, &averaged),
            Action::EndRound(o) => {
                if o.attached {
                    self.runs[i].attached.push(self.round);
                }
                self.members[i].handle_round_written(now);
            }
            Action::AwaitServed {
                round,
                others,
                within,
            } => {
                if self.links[i].served.get(&round).copied().unwrap_or(0) >= others {
                    self.members[i].handle_served(now);
                } else {
                    self.seq += 1;
                    let id = self.seq;
                    self.links[i].serving = Some((round, others, id));
                    self.at(now + within, Due::ServedGiveUp { silo: i, id });
                }
            }
            Action::Finish => self.runs[i].finished = true,
            Action::Fail(why) => {
                return Err(SimError::Invariant(format!("silo-{i} stopped: {why}")));
            }
            // The coalition is the engine's; nothing is written, nobody restarts.
            Action::Adopt(_) | Action::Save | Action::Republish | Action::Event(_) => {}
        }
        Ok(())
    }

    /// When a message silo `i` sends now arrives (after its delay), or `None`: lost.
    fn send_from(&mut self, i: usize) -> Option<Duration> {
        let st = self.timeline.at(self.round);
        let (loss, delay) = (loss_of(st, i), st.delay_ms[i]);
        match fate(&mut self.faults[i], loss, ms(delay)) {
            Fate::After(d) => Some(d),
            _ => None,
        }
    }

    /// The distance phase is due: every planned silo that stayed asked for it.
    fn pairs_due(&self) -> bool {
        let Some(planned) = &self.planned else {
            return false;
        };
        let asked = planned.iter().filter(|&&p| self.silos[p].pairs.is_some());
        asked.count() > 0
            && planned
                .iter()
                .all(|&p| !self.stayed(p) || self.silos[p].pairs.is_some())
    }

    /// The distance phase, at once: every pair measured in this process, each planned silo
    /// that stayed handed its planned partners' distances (none for a partner that left).
    fn distances(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let planned = self.planned.take().unwrap_or_default();
        let target = planned
            .iter()
            .find_map(|&p| self.silos[p].pairs)
            .unwrap_or_default();
        let est = Estimates::measure(ctx, &self.cfg, target)?;
        let all = planned.len() == self.silos.len() && planned.iter().all(|&p| self.stayed(p));
        for &i in &planned {
            if !self.stayed(i) || self.silos[i].pairs.take().is_none() {
                continue;
            }
            let report: Vec<PairDistance> = est
                .report(i)
                .into_iter()
                .filter(|d| planned.contains(&(d.partner as usize)))
                .map(|d| match self.stayed(d.partner as usize) {
                    true => d,
                    false => PairDistance {
                        distance: None,
                        rounds: 0,
                        ..d
                    },
                })
                .collect();
            self.silos[i].report = Some(report);
            self.members[i].handle_pairs(self.now);
        }
        if all {
            let sizes: Vec<u64> = self.silos.iter().map(|s| s.n_train).collect();
            self.record = Some(Record::new(&self.cfg, sizes, est, self.seed)?.0);
        }
        Ok(())
    }

    /// Silo `i` trained `round`: its model is kept and the pulls held for it answered.
    fn publish(&mut self, i: usize, round: u64, model: Arc<Vec<f32>>) {
        let link = &mut self.links[i];
        link.published.push_back((round, model.clone()));
        while link.published.len() > KEEP_ROUNDS {
            link.published.pop_front();
        }
        let held = std::mem::take(&mut link.held);
        for (r, from, id) in held {
            if r == round {
                self.answer_pull(i, from, id, r, Some(model.clone()));
            } else if r < round && !self.links[i].published.iter().any(|(p, _)| *p == r) {
                self.answer_pull(i, from, id, r, None);
            } else {
                self.links[i].held.push((r, from, id));
            }
        }
    }

    /// Starts silo `i`'s pull of `round` from every other member of `coalition`.
    fn start_pull(&mut self, i: usize, round: u64, coalition: &Coalition, within: Duration) {
        self.seq += 1;
        let id = self.seq;
        let now = self.now;
        let mates: BTreeSet<usize> = coalition
            .members
            .iter()
            .map(|&m| m as usize)
            .filter(|&m| m != i)
            .collect();
        self.pulls[i] = Some(Pulling {
            id,
            round,
            got: BTreeMap::new(),
            budget_until: now + within,
        });
        for mate in mates {
            self.at(now + within, Due::PullGiveUp { silo: i, id, mate });
            if let Some(d) = self.send_from(i) {
                self.at(
                    now + d,
                    Due::PullReaches {
                        from: i,
                        to: mate,
                        id,
                    },
                );
            }
        }
    }

    /// Pull `id` of silo `from` at member `to`: answered, held until `to` trains the round,
    /// or refused when the round is no longer kept; lost at a silo that left.
    fn pull_reaches(&mut self, from: usize, to: usize, id: u64) {
        if !self.stayed(to) {
            return;
        }
        let Some(round) = self.pulls[from]
            .as_ref()
            .filter(|p| p.id == id)
            .map(|p| p.round)
        else {
            return;
        };
        let link = &self.links[to];
        if let Some((_, m)) = link.published.iter().find(|(r, _)| *r == round) {
            let m = m.clone();
            self.answer_pull(to, from, id, round, Some(m));
        } else if link.published.back().is_none_or(|(r, _)| round > *r) {
            self.links[to].held.push((round, from, id));
        } else {
            self.answer_pull(to, from, id, round, None);
        }
    }

    /// Member `mate` answers pull `id` of silo `to` (after its delay, or lost).
    fn answer_pull(
        &mut self,
        mate: usize,
        to: usize,
        id: u64,
        round: u64,
        model: Option<Arc<Vec<f32>>>,
    ) {
        if model.is_some() {
            *self.links[mate].served.entry(round).or_default() += 1;
            self.check_served(mate);
        }
        if let Some(d) = self.send_from(mate) {
            let what = Due::PullAnswer {
                to,
                from: mate,
                id,
                model,
            };
            self.at(self.now + d, what);
        }
    }

    /// Silo `i`'s final wait is over once enough of its pulls were served.
    fn check_served(&mut self, i: usize) {
        if let Some((round, others, _)) = self.links[i].serving
            && self.links[i].served.get(&round).copied().unwrap_or(0) >= others
        {
            self.links[i].serving = None;
            self.members[i].handle_served(self.now);
        }
    }

    /// Member `mate`'s model (or its refusal, or the end of its budget) in pull `id` of silo
    /// `i`, told to its engine.
    fn pull_answered(&mut self, i: usize, mate: usize, id: u64, model: Option<Arc<Vec<f32>>>) {
        if !self.stayed(i) {
            // A silo that left carries out nothing.
            return;
        }
        let Some(p) = self.pulls[i].as_mut().filter(|p| p.id == id) else {
            return;
        };
        // A second report of a member (its model after its give-up, or the reverse) is the
        // engine's to ignore.
        let came = model.is_some();
        if let Some(m) = model {
            p.got.insert(mate, m);
        }
        self.members[i].handle_model(self.now, mate as u32, came);
    }

    /// The engine ended silo `i`'s pull: its model is the average of the members it names.
    fn average(&mut self, i: usize, round: u64, coalition: &Coalition, averaged: &[u32]) {
        let p = self.pulls[i].take().filter(|p| p.round == round);
        let own = self.silos[i]
            .local
            .as_ref()
            .filter(|(r, _)| *r == round)
            .map(|(_, m)| m.as_slice());
        let got = p.as_ref().map(|p| &p.got);
        let models: Vec<Option<&[f32]>> = coalition
            .members
            .iter()
            .map(|&m| match m as usize {
                _ if !averaged.contains(&m) => None,
                m if m == i => own,
                m => got.and_then(|g| g.get(&m)).map(|v| v.as_slice()),
            })
            .collect();
        self.silos[i].params = coalition_average(&models, &coalition.sizes);
        if p.is_some_and(|p| self.now >= p.budget_until) {
            self.waited[i].push(round);
        }
    }

    /// A request reaches the coordinator (or finds it down: refused at once).
    fn at_coordinator(&mut self, from: usize, id: u64, req: Request) -> Result<(), SimError> {
        match self.coordinator.request(self.now, from, id, req)? {
            Some(outs) => self.carry(outs),
            None => {
                let what = Delivery::Failed("the coordinator is unreachable".into());
                self.at(self.now, Due::ToMember { to: from, id, what });
            }
        }
        Ok(())
    }

    /// The coordinator's answers go out (or are lost); FedCollab's coordinator has no rounds
    /// the checks read.
    fn carry(&mut self, outs: Vec<Out>) {
        for out in outs {
            if let Out::Respond { to, id, answer } = out
                && let Some(d) = answer_fate(&mut self.faults[to], &self.timeline, self.round, to)
            {
                let what = Delivery::Answer(answer);
                self.at(self.now + d, Due::ToMember { to, id, what });
            }
        }
    }

    fn at(&mut self, when: Instant, what: Due) {
        self.seq += 1;
        self.due.insert((when, self.seq), what);
    }

    /// Applies one fault of the schedule now.
    fn apply(&mut self, fault: &Fault) -> Result<(), SimError> {
        match fault {
            // Read from the timeline when a message goes.
            Fault::Delay { .. } | Fault::Loss { .. } => {}
            // It registered; now it says nothing (its connection stays up).
            Fault::Leave(s) => self.runs[*s as usize].left = true,
            Fault::CoordinatorCrash { .. } => self.coordinator.crash(),
            Fault::CoordinatorRestart => {
                let outs = self.coordinator.restart(self.now)?;
                self.carry(outs);
            }
            other => {
                return Err(SimError::Invariant(format!(
                    "{} is not simulated for a coordinated run",
                    other.kind()
                )));
            }
        }
        Ok(())
    }
}

impl FaultyRun for FaultyCollab {
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        self.run_round(ctx)
    }

    fn is_last(&self) -> bool {
        self.round >= self.rounds
    }

    /// Each silo's coalition model on its test split.
    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let silos = &self.silos;
        let evals = score_each(ctx, |i| {
            vec![(Owner::Shared, silos[i].params.as_slice(), 1.0)]
        })?;
        if self.round >= self.rounds {
            for (run, e) in self.runs.iter_mut().zip(&evals) {
                if run.finished {
                    run.last = Some((*e).into());
                }
            }
        }
        Ok(evals)
    }

    fn record(&self) -> Option<serde_json::Value> {
        self.record
            .as_ref()
            .and_then(|r| serde_json::to_value(r).ok())
    }

    fn report(&self, baseline: Option<&[EvalRecord]>) -> Report {
        let coalitions: Vec<Vec<usize>> = self
            .members
            .iter()
            .map(|m| {
                m.coalition()
                    .map(|c| c.members.iter().map(|&x| x as usize).collect())
                    .unwrap_or_default()
            })
            .collect();
        crate::faults::checks::evaluate_collab(&CollabInputs {
            schedule: &self.schedule,
            applied: &self.applied,
            rounds: self.rounds,
            silos: &self.runs,
            coalitions: &coalitions,
            waited: &self.waited,
            baseline,
        })
    }
}
