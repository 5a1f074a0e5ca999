//! FedDisco, HCCT and FedSaC under a fault schedule: the same engines as the fault-free run
//! (the coordinator's [`Engine`], one [`Member`] per silo) on a simulated network with a
//! virtual clock that moves, so deadlines, budgets, retries and excuses happen as over a real
//! network: a slow silo (`delay`), lost messages (`loss`), a member that registered and went
//! silent (`leave`), members that poison the models they send (`attack`, carried out by
//! [`Poisoner`]), and the coordinator's crash and restart from its last checkpoint
//! (`coordinator_crash`).
//!
//! Owns: the virtual clock and the messages in flight (a request reaches the coordinator after
//! the sender's delay, or never; an answer comes back at once, or never; an exchange that got
//! no answer fails at the member's `within`; a down coordinator refuses at once), applying the
//! schedule's faults at the start of each federation round (the coordinator's crash and
//! restart are `coordinator.rs`'s [`SimCoordinator`]), and the record the checks read (each silo's rounds, each closed
//! coordinator round); and [`FaultyRun`], what `under_faults.rs` asks of this driver and of
//! `faulty_collab.rs`'s.
//! Must not: decide anything about a round (the engines do), judge the run
//! ([`crate::faults::checks::evaluate_coordinated`] does), or draw a loss from any stream but
//! the sender's fault stream ([`crate::faults::link::fate`]).
//!
//! A federation round `r` (one [`FaultyMembers::round`] call) runs until a silo that stayed
//! has completed `r` rounds (the leading silo's round, as the swarm counts it; a silo whose
//! coordinator is gone trains detached, so this always comes); the last runs until every silo
//! that stayed took its final model. Training takes no virtual time.

use super::super::pool::{Owner, score_each};
use super::coordinator::{Out, SimCoordinator};
use super::{Parts, Silo};
use crate::coord::engine::{Answer, EngineConfig, Request};
use crate::coord::member::{Action, Member, MemberConfig, Reply, Resume};
use crate::faults::checks::{Applied, ClosedRound, Report, SiloRun};
use crate::faults::link::{Fate, fate};
use crate::faults::{Fault, Schedule, Timeline};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::silo::attack::Poisoner;
use crate::sim::{ClientEval, Ctx, SimError};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What the coordinator's answer to an exchange is, as it reaches the member.
pub(super) enum Delivery {
    Answer(Answer),
    Failed(String),
}

/// Something due at a moment of the virtual clock.
enum Due {
    /// A member's request reaches the coordinator.
    ToCoordinator { from: usize, id: u64, req: Request },
    /// The answer to exchange `id` reaches silo `to`.
    ToMember { to: usize, id: u64, what: Delivery },
    /// Exchange `id` of silo `silo` has had its `within`.
    GiveUp { silo: usize, id: u64 },
}

/// The bound on the events of one federation round (a loop that never ends is a bug).
const MAX_STEPS: u64 = 10_000_000;

/// One coordinated algorithm's run under a fault schedule.
pub(crate) struct FaultyMembers {
    coordinator: SimCoordinator,
    members: Vec<Member>,
    silos: Vec<Silo>,
    now: Instant,
    /// Due events by (time, sequence).
    due: BTreeMap<(Instant, u64), Due>,
    seq: u64,
    /// Each silo's exchange under way.
    asking: Vec<Option<u64>>,
    timeline: Timeline,
    /// Each silo's fault stream (its loss draws).
    faults: Vec<StdRng>,
    /// Federation rounds started.
    round: u64,
    rounds: u64,
    /// What the checks read.
    applied: Vec<Applied>,
    runs: Vec<SiloRun>,
    closed: Vec<ClosedRound>,
    schedule: Schedule,
    /// The run's seed (an attacker's noise stream).
    seed: u64,
}

impl FaultyMembers {
    /// A run of `parts` for `ctx`'s silos under `schedule`.
    pub(crate) fn new(ctx: &Ctx<'_>, parts: Parts, schedule: Schedule) -> Result<Self, SimError> {
        let Parts {
            alg,
            decode,
            register,
            recipes,
            ..
        } = parts;
        let k = ctx.clients();
        let rounds = ctx.scenario.rounds as u64;
        let now = Instant::now();
        let fc = &schedule.config;
        let names: Vec<String> = (0..k).map(|i| format!("silo-{i:06}")).collect();
        let engine_cfg = EngineConfig {
            rounds,
            nodes: k,
            round_deadline: Duration::from_secs_f64(fc.update_deadline_s),
            join_deadline: None,
            linger: Duration::from_secs_f64(fc.fetch_s * 4.0),
            excuse_rounds: fc.excuse_rounds,
            names,
        };
        let num_params = alg.num_params();
        let (coordinator, outs) = SimCoordinator::start(alg, engine_cfg, decode, now)?;
        let budget = Duration::from_secs_f64(fc.fetch_s);
        let members = (0..k)
            .map(|_| {
                Member::new(
                    MemberConfig {
                        rounds,
                        budget,
                        retry: Duration::from_millis(500),
                        final_budget: budget * 4,
                        eval_every: 0,
                        fall_back_after: None,
                    },
                    Resume::default(),
                )
            })
            .collect();
        let mut run = Self {
            coordinator,
            members,
            silos: register
                .into_iter()
                .zip(recipes)
                .map(|(r, recipe)| Silo::new(r, recipe, num_params))
                .collect(),
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
            applied: Vec::new(),
            runs: vec![SiloRun::default(); k],
            closed: Vec::new(),
            schedule,
            seed: ctx.seed,
        };
        run.carry(outs);
        for m in &mut run.members {
            m.handle_start(now);
        }
        Ok(run)
    }

    /// Runs federation round `round + 1`: its faults, then the engines until every silo that
    /// stayed completed it (the last round: took its final model).
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
        for step in 0..MAX_STEPS {
            self.pump(ctx)?;
            // The federation's round is its leading silo's, as the swarm counts it.
            let done = if last {
                (0..self.members.len()).all(|i| self.runs[i].left || self.runs[i].finished)
            } else {
                (0..self.members.len()).any(|i| !self.runs[i].left && self.members[i].round() >= r)
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

    /// Each silo's own model on its test split (what its node would score).
    fn score(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let models: Vec<&[f32]> = self.silos.iter().map(|s| s.model.as_slice()).collect();
        let evals = score_each(ctx, |i| vec![(Owner::Silo(i), models[i], 1.0)])?;
        if self.round >= self.rounds {
            for (run, e) in self.runs.iter_mut().zip(&evals) {
                if run.finished {
                    run.last = Some((*e).into());
                }
            }
        }
        Ok(evals)
    }

    /// The earliest moment something is due: a message, an exchange's end, a member's retry, a
    /// coordinator deadline.
    fn next_due(&self) -> Option<Instant> {
        let msgs = self.due.keys().next().map(|k| k.0);
        let engine = self.coordinator.poll_timeout();
        let members = self
            .members
            .iter()
            .zip(&self.runs)
            .filter(|(_, r)| !r.left)
            .filter_map(|(m, _)| m.poll_timeout());
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
                Due::ToMember { to, id, what } => self.at_member(to, id, what),
                Due::GiveUp { silo, id } => {
                    if self.asking[silo] == Some(id) {
                        self.asking[silo] = None;
                        let reply = Reply::Failed("no answer in time".into());
                        self.members[silo].handle_reply(now, reply);
                    }
                }
            }
        }
        let outs = self.coordinator.timeout(now)?;
        self.carry(outs);
        for i in 0..self.members.len() {
            if !self.runs[i].left && self.members[i].poll_timeout().is_some_and(|t| t <= now) {
                self.members[i].handle_timeout(now);
            }
        }
        Ok(())
    }

    /// Carries out every member's instant actions (asking sends a message; training takes no
    /// virtual time).
    fn pump(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        loop {
            let mut moved = false;
            for i in 0..self.members.len() {
                if self.runs[i].left {
                    continue;
                }
                while let Some(action) = self.members[i].poll_action() {
                    moved = true;
                    self.act(ctx, i, action)?;
                }
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
                let st = self.timeline.at(self.round);
                let (loss, delay) = (loss_of(st, i), st.delay_ms[i]);
                if let Fate::After(d) = fate(&mut self.faults[i], loss, ms(delay)) {
                    self.at(now + d, Due::ToCoordinator { from: i, id, req });
                }
            }
            Action::Adopt { .. } => self.silos[i].adopt(),
            Action::Train { at } => {
                let (fed, batch) = (ctx.fed, ctx.batch_size());
                self.silos[i]
                    .train(&mut ctx.learners[i], &fed.clients[i].train, batch, at)
                    .map_err(|e| SimError::Invariant(format!("silo-{i} training: {e}")))?;
                self.members[i].handle_trained(now);
            }
            // A silo never crashes here: its marker is not needed.
            Action::MarkSent(_) => {}
            Action::EndRound(o) => {
                if o.global_round.is_some() && o.trained {
                    self.runs[i].attached.push(self.round);
                }
                self.members[i].handle_round_written(now);
            }
            Action::Event(_) => {}
            Action::Finish { final_round } => {
                if final_round.is_some() {
                    self.silos[i].adopt();
                }
                self.runs[i].finished = true;
            }
            Action::Recover { .. } | Action::FallBack { .. } => {
                return Err(SimError::Invariant(format!(
                    "silo-{i}: {action:?} without a silo crash or a fallback configured"
                )));
            }
        }
        Ok(())
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

    /// The coordinator's answers go out (or are lost); closed rounds are recorded.
    fn carry(&mut self, outs: Vec<Out>) {
        for out in outs {
            match out {
                Out::Respond { to, id, answer } => {
                    if let Some(d) =
                        answer_fate(&mut self.faults[to], &self.timeline, self.round, to)
                    {
                        let what = Delivery::Answer(answer);
                        self.at(self.now + d, Due::ToMember { to, id, what });
                    }
                }
                Out::Closed(c) => self.closed.push(c),
            }
        }
    }

    /// An answer reaches silo `to` (dropped when the exchange is over, or the silo gone).
    fn at_member(&mut self, to: usize, id: u64, what: Delivery) {
        if self.runs[to].left || self.asking[to] != Some(id) {
            return;
        }
        self.asking[to] = None;
        let reply = match what {
            Delivery::Answer(a) => self.silos[to].read(a),
            Delivery::Failed(why) => Reply::Failed(why),
        };
        self.members[to].handle_reply(self.now, reply);
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
            // What it sends from its next training on (`None` ends the attack).
            Fault::Attack { silos, attack } => {
                for &s in silos {
                    let p = attack
                        .clone()
                        .map(|a| Poisoner::new(a, NodeId(s), self.seed));
                    self.silos[s as usize].poisoner = p;
                }
            }
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

/// When the coordinator's answer to silo `to`, sent now, arrives: at once, or `None` when the
/// loss in force on its link drops it (drawn from `to`'s fault stream).
pub(super) fn answer_fate(
    faults: &mut StdRng,
    timeline: &Timeline,
    round: u64,
    to: usize,
) -> Option<Duration> {
    match fate(faults, loss_of(timeline.at(round), to), Duration::ZERO) {
        Fate::After(d) => Some(d),
        _ => None,
    }
}

/// The loss in force on silo `i`'s link to the coordinator.
pub(super) fn loss_of(st: &crate::faults::NetState, i: usize) -> f64 {
    match &st.loss {
        Some((f, None)) => *f,
        Some((f, Some(silos))) if silos.contains(&(i as u32)) => *f,
        _ => 0.0,
    }
}

pub(super) fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A coordinated algorithm's run under a fault schedule, as `under_faults::UnderFaults` drives
/// it (this driver and `faulty_collab::FaultyCollab`).
pub(super) trait FaultyRun {
    /// One federation round, its faults first.
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError>;
    /// The last round is done.
    fn is_last(&self) -> bool;
    /// Every silo's model now, scored.
    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError>;
    /// The record of the algorithm's decisions, as `CoordinatedRun::record`.
    fn record(&self) -> Option<serde_json::Value> {
        None
    }
    /// The verdicts, against `baseline` (each silo's final score without the faults).
    fn report(&self, baseline: Option<&[crate::trace::EvalRecord]>) -> Report;
}

impl FaultyRun for FaultyMembers {
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        self.run_round(ctx)
    }

    fn is_last(&self) -> bool {
        self.round >= self.rounds
    }

    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        self.score(ctx)
    }

    fn report(&self, baseline: Option<&[crate::trace::EvalRecord]>) -> Report {
        crate::faults::checks::evaluate_coordinated(&crate::faults::checks::CoordInputs {
            schedule: &self.schedule,
            applied: &self.applied,
            rounds: self.rounds,
            silos: &self.runs,
            closed: &self.closed,
            baseline,
        })
    }
}
