//! A FedCollab silo's run (spec §6), sans-IO: every rule a FedCollab member follows over an
//! unreliable network, shaped like [`crate::coord::member::Member`] (the other coordinated
//! algorithms' silo) and [`crate::core::round::Round`].
//!
//! Owns: the order of the phases (join, the distance plan, the pairs, the report, the
//! coalition, the FL rounds, the wait for the coalition's last pulls); every deadline (each
//! exchange's, the structure's `structure_wait`, the short re-ask of each round that still has
//! no coalition, the final wait); what each answer of the coordinator means (a refusal: join or
//! report again; a bad plan or a refused join: the run stops with the reason; a malformed
//! coalition: ignored); checking the plan and the coalition; the singleton of a silo left out
//! of the plan; who each round's average waits for, when a pull is over and whose model goes
//! into the average (an excused member's only within its grace or while the others are
//! pulled); and which rounds are evaluated.
//! Must not: read a clock (time is passed in as `now`), touch sockets, files, threads or models
//! (the driver runs the pairs, trains, pulls, averages, evaluates and writes), or decide the
//! structure (the coordinator does) or the pairs' rules ([`super::pairs`]).
//!
//! A driver calls [`CollabMember::handle_start`], carries out each [`Action`] from
//! [`CollabMember::poll_action`] and reports back: a reply to every [`Action::Ask`]
//! ([`CollabMember::handle_reply`]), the distances of [`Action::RunPairs`]
//! ([`CollabMember::handle_pairs`]), the end of every [`Action::Train`], [`Action::EndRound`]
//! and [`Action::AwaitServed`], and each member's model of an [`Action::Pull`] as it comes or
//! fails ([`CollabMember::handle_model`]); while it waits it calls
//! [`CollabMember::handle_timeout`] at [`CollabMember::poll_timeout`]. At most one action waits
//! for its report at a time; a pull ends with [`Action::Average`], when the engine says so.
//! `net::collab_node` is the libp2p driver; the tests beside this
//! file drive it on a virtual clock.

#[cfg(test)]
mod tests;

use crate::coord::excuse::Excuses;
use crate::core::is_evaluation_round;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The fixed settings of a member's run.
#[derive(Clone, Debug)]
pub struct CollabMemberConfig {
    /// This silo's index in the manifest.
    pub me: u32,
    /// Its training rows (its size in its own singleton).
    pub n_train: u64,
    /// FL rounds of the run.
    pub rounds: u64,
    /// How long one exchange (with the coordinator or a coalition member) may take.
    pub fetch: Duration,
    /// After the distances: how long to wait for the structure before training alone.
    pub structure_wait: Duration,
    /// A round that starts with no coalition asks for it this long before training alone.
    pub attach_wait: Duration,
    /// The pause before asking again after an answer that was no answer, or after joining
    /// again.
    pub retry: Duration,
    /// Evaluate every this many rounds (0: only the final model).
    pub eval_every: u64,
    /// A coalition member whose model did not come in a round is not waited for during the
    /// next `excuse_rounds` rounds (each later time twice as long, [`crate::coord::excuse`]);
    /// 0 waits for every member every round.
    pub excuse_rounds: u64,
    /// The least an excused member's model is given: the grace is two normal pulls (a
    /// moving average of the pulls in which every member's model came), at least this, at
    /// most `fetch`; longer while other members' models are awaited.
    pub excused_grace: Duration,
}

/// A coalition: ascending manifest indices, this silo included, and the members' sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coalition {
    /// The members, ascending.
    pub members: Vec<u32>,
    /// Their training rows.
    pub sizes: Vec<u64>,
}

/// Where a member resumes (a fresh run: `Resume::default()`).
#[derive(Clone, Debug, Default)]
pub struct Resume {
    /// FL rounds done.
    pub round: u64,
    /// The distances are in hand (the pairs need not run again).
    pub reported: bool,
    /// The coalition, once received.
    pub coalition: Option<Coalition>,
    /// The silo holds its own model of its last round, which a member may still be waiting
    /// for.
    pub last_local: bool,
}

/// What to ask the coordinator (the driver adds what it holds: the sample count, the
/// distances).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Join with the sample count.
    Join,
    /// The distance plan (the coordinator's round 0).
    Plan,
    /// Report the distances.
    Distances,
    /// This silo's coalition (the coordinator's round 1).
    Coalition,
}

/// The coordinator's reply to an [`Ask`], as the driver read it.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// Recorded.
    Ack,
    /// Refused, and why (typically a restarted coordinator that lost the registration).
    Refused(String),
    /// The distance plan.
    Plan {
        /// The discriminator-train target m_train.
        target: f64,
        /// Silos in the run.
        nodes: u32,
        /// The planned silos.
        members: Vec<u32>,
    },
    /// This silo's coalition.
    Coalition {
        /// Its members.
        members: Vec<u32>,
        /// Their sizes.
        sizes: Vec<u64>,
    },
    /// The exchange took its whole budget.
    TimedOut,
    /// Anything else: a failure, or an answer to another question.
    Other(String),
}

/// One finished FL round, for its line in the run log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundOutcome {
    /// Rounds done, this one included.
    pub round: u64,
    /// The round was trained in a coalition (false: alone, the structure still unknown).
    pub attached: bool,
    /// Members whose model went into the average, this silo included.
    pub averaged: Vec<u32>,
    /// Every member's model arrived.
    pub complete: bool,
    /// Score this round's model (an evaluation round before the last).
    pub evaluate: bool,
}

/// Something worth a log line.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Joining failed; asking again.
    NotJoined(String),
    /// No plan yet; asking again.
    NoPlan(String),
    /// The plan was refused (the coordinator lost this silo's join): joining again.
    PlanRefused(String),
    /// This silo joined after the plan went out: no pair, it trains alone for the run.
    NotPlanned {
        /// The planned silos.
        planned: Vec<u32>,
    },
    /// The distances were refused (the coordinator lost the join): joining again.
    DistancesRefused(String),
    /// The distances did not go through; asking again.
    NotReported(String),
    /// The coalition was refused: reporting again.
    CoalitionRefused(String),
    /// No coalition yet; asking again.
    NoCoalition(String),
    /// The coalition, received.
    CoalitionReceived(Vec<u32>),
    /// A coalition without this silo, unordered, or with a zero size: ignored.
    MalformedCoalition {
        /// What came.
        members: Vec<u32>,
        /// With these sizes.
        sizes: Vec<u64>,
    },
    /// No structure within the wait: this round trains alone.
    NoStructure,
    /// A coalition member's model did not come: it is not waited for before round `until`.
    Excused {
        /// The member.
        member: u32,
        /// The round (counted from 0) it made wait.
        round: u64,
        /// Waited for again from this round on.
        until: u64,
        /// Its excuses so far.
        strikes: u32,
    },
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Ask the coordinator, giving up after `within`; report with
    /// [`CollabMember::handle_reply`].
    Ask {
        /// The question.
        ask: Ask,
        /// How long the exchange may take.
        within: Duration,
    },
    /// Run the distance phase with the other planned silos (spec §6 phase 2); report with
    /// [`CollabMember::handle_pairs`].
    RunPairs {
        /// The plan's m_train target.
        target: f64,
        /// The planned silos, ascending.
        planned: Vec<usize>,
    },
    /// Keep this coalition (the next checkpoint holds it).
    Adopt(Coalition),
    /// Write the checkpoint.
    Save,
    /// Offer the own model of the last round again (a restarted silo's coalition may still be
    /// waiting for it).
    Republish,
    /// Train one local epoch from the silo's model and publish the result as its model of FL
    /// round `round` (counted from 0); report with [`CollabMember::handle_trained`].
    Train {
        /// The round.
        round: u64,
    },
    /// Pull every other member's model of `round`, each within `within`, and report each one
    /// as it comes or fails with [`CollabMember::handle_model`]; keep what came until
    /// [`Action::Average`] ends the pull (a pull still under way then is dropped).
    Pull {
        /// The round.
        round: u64,
        /// The members (this silo's own model is not pulled).
        coalition: Coalition,
        /// How long each pull may take.
        within: Duration,
    },
    /// The pull of `round` is over: the silo's model becomes the average of the `averaged`
    /// members' models of the round (this silo's own among them; weights m_j/M over those,
    /// ascending). Other models that came are dropped.
    Average {
        /// The round.
        round: u64,
        /// The coalition pulled.
        coalition: Coalition,
        /// The members whose model goes in, ascending.
        averaged: Vec<u32>,
    },
    /// The round is over: evaluate when asked, write its line and the checkpoint; report with
    /// [`CollabMember::handle_round_written`].
    EndRound(RoundOutcome),
    /// Wait until `others` members fetched the model of `round`, at most `within`; report with
    /// [`CollabMember::handle_served`].
    AwaitServed {
        /// The last round.
        round: u64,
        /// How many pulls to wait for.
        others: usize,
        /// At most this long.
        within: Duration,
    },
    /// Score the model and write the final line. The member is done.
    Finish,
    /// The run cannot go on, and why. The member is done.
    Fail(String),
    /// Say what happened.
    Event(Event),
}

impl Action {
    /// The action is a question, the distance phase, a training or a pull: it may take as long
    /// as its budget, or longer.
    pub fn waits_on_the_network(&self) -> bool {
        matches!(
            self,
            Action::Ask { .. }
                | Action::RunPairs { .. }
                | Action::Train { .. }
                | Action::Pull { .. }
        )
    }
}

/// What the member waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Idle,
    Joining,
    Planning,
    Pairs,
    /// Reporting the distances.
    Reporting,
    /// Joining again after the distances were refused.
    Rejoining,
    /// Asking for the coalition.
    Fetching,
    Training,
    Pulling,
    Ending,
    Serving,
    Over,
}

/// Where an attach goes when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// The first attach, after the distances: save, then the rounds.
    Rounds,
    /// A round's re-ask: train the round.
    Train,
}

/// A pull under way.
#[derive(Debug)]
struct Pulling {
    round: u64,
    coalition: Coalition,
    /// Awaited members whose model has neither come nor failed.
    awaited: Vec<u32>,
    /// Excused members whose model has neither come nor failed.
    excused: Vec<u32>,
    /// Members whose model came in time (this silo's own included).
    came: Vec<u32>,
    started: Instant,
    /// Until then an excused member's model is waited for.
    grace_until: Instant,
    /// [`CollabMember::handle_timeout`] was called at `grace_until` or later.
    grace_over: bool,
}

/// A FedCollab silo's run (see the module documentation).
#[derive(Debug)]
pub struct CollabMember {
    cfg: CollabMemberConfig,
    round: u64,
    has_report: bool,
    reported: bool,
    coalition: Option<Coalition>,
    republish: bool,
    step: Step,
    /// The structure's deadline while attaching.
    until: Option<Instant>,
    then: Then,
    /// Ask `step`'s question again then.
    retry_at: Option<Instant>,
    /// Coalition members not waited for, by member.
    excuses: Excuses<u32>,
    /// The members the last pull did not wait for.
    not_awaited: Vec<u32>,
    /// The pull under way.
    pulling: Option<Pulling>,
    /// A moving average of the pulls in which every member's model came.
    normal: Option<Duration>,
    actions: VecDeque<Action>,
}

impl CollabMember {
    /// A member resumed at `resume` (fresh: `Resume::default()`).
    pub fn new(cfg: CollabMemberConfig, resume: Resume) -> Self {
        Self {
            excuses: Excuses::new(cfg.excuse_rounds),
            not_awaited: Vec::new(),
            pulling: None,
            normal: None,
            cfg,
            round: resume.round,
            has_report: resume.reported,
            reported: false,
            coalition: resume.coalition,
            republish: resume.last_local,
            step: Step::Idle,
            until: None,
            then: Then::Rounds,
            retry_at: None,
            actions: VecDeque::new(),
        }
    }

    /// FL rounds done.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The coalition, once known.
    pub fn coalition(&self) -> Option<&Coalition> {
        self.coalition.as_ref()
    }

    /// The member is done.
    pub fn is_over(&self) -> bool {
        self.step == Step::Over && self.actions.is_empty()
    }

    /// Starts the run (once): the phases the checkpoint does not already hold.
    pub fn handle_start(&mut self, now: Instant) {
        if self.step != Step::Idle {
            return;
        }
        if self.coalition.is_some() {
            self.begin_rounds(now);
        } else if self.has_report {
            self.attach(now, now + self.cfg.structure_wait, Then::Rounds);
        } else {
            self.join();
        }
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When to call [`CollabMember::handle_timeout`] (`None`: nothing is due).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let grace = self
            .pulling
            .as_ref()
            .filter(|p| !p.excused.is_empty() && !p.grace_over)
            .map(|p| p.grace_until);
        self.retry_at.into_iter().chain(grace).min()
    }

    /// The clock reached [`CollabMember::poll_timeout`]: an excused member's grace is over, or
    /// ask again.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(p) = self.pulling.as_mut()
            && now >= p.grace_until
        {
            p.grace_over = true;
            self.end_pull_if_over(now);
        }
        match self.retry_at {
            Some(t) if t <= now => self.retry_at = None,
            _ => return,
        }
        match self.step {
            Step::Joining => self.join(),
            Step::Planning => self.ask(Ask::Plan, self.cfg.fetch),
            Step::Reporting | Step::Rejoining => self.report(now),
            Step::Fetching => self.ask_in_wait(now, Ask::Coalition),
            _ => {}
        }
    }

    /// The reply to the last [`Action::Ask`] (one that came for no question is ignored).
    pub fn handle_reply(&mut self, now: Instant, reply: Reply) {
        if self.retry_at.is_some() {
            return;
        }
        match self.step {
            Step::Joining => self.joined_reply(now, reply),
            Step::Planning => self.planned(now, reply),
            Step::Reporting => self.reported_reply(now, reply),
            // Whatever the coordinator said, report again after a pause.
            Step::Rejoining => self.pause(now),
            Step::Fetching => self.fetched(now, reply),
            _ => {}
        }
    }

    /// The distance phase is over: the distances are in hand (the driver keeps them).
    pub fn handle_pairs(&mut self, now: Instant) {
        if self.step != Step::Pairs {
            return;
        }
        self.has_report = true;
        self.reported = false;
        self.actions.push_back(Action::Save);
        self.attach(now, now + self.cfg.structure_wait, Then::Rounds);
    }

    /// The last [`Action::Train`] is done (its model published): the pull.
    pub fn handle_trained(&mut self, now: Instant) {
        if self.step != Step::Training {
            return;
        }
        self.republish = false;
        self.step = Step::Pulling;
        let me = self.cfg.me;
        let coalition = self.coalition.clone().unwrap_or_else(|| Coalition {
            members: vec![me],
            sizes: vec![self.cfg.n_train],
        });
        let round = self.round;
        let (excused, awaited): (Vec<u32>, Vec<u32>) = coalition
            .members
            .iter()
            .copied()
            .filter(|&m| m != me)
            .partition(|m| self.excuses.is_excused(m, round));
        self.not_awaited = excused.clone();
        self.pulling = Some(Pulling {
            round,
            coalition: coalition.clone(),
            awaited,
            excused,
            came: vec![me],
            started: now,
            grace_until: now + self.grace(),
            grace_over: false,
        });
        self.actions.push_back(Action::Pull {
            round,
            coalition,
            within: self.cfg.fetch,
        });
        self.end_pull_if_over(now);
    }

    /// Member `member`'s model of the pull under way came (`came`), or its pull failed or ran
    /// out of its `within`. A member that is not outstanding in the pull under way is ignored.
    pub fn handle_model(&mut self, now: Instant, member: u32, came: bool) {
        let Some(p) = self.pulling.as_mut() else {
            return;
        };
        let outstanding = [&mut p.awaited, &mut p.excused].into_iter().any(|list| {
            match list.iter().position(|&m| m == member) {
                Some(at) => {
                    list.remove(at);
                    true
                }
                None => false,
            }
        });
        if outstanding && came {
            p.came.push(member);
        }
        self.end_pull_if_over(now);
    }

    /// The excused-pull rule: a pull is over once no awaited member is outstanding and every
    /// excused one came, failed, or had its grace; then [`Action::Average`] and the round's
    /// end.
    fn end_pull_if_over(&mut self, now: Instant) {
        let over = self.pulling.as_ref().is_some_and(|p| {
            p.awaited.is_empty() && (p.excused.is_empty() || now >= p.grace_until)
        });
        if !over {
            return;
        }
        let Some(p) = self.pulling.take() else {
            return;
        };
        let averaged: Vec<u32> = p
            .coalition
            .members
            .iter()
            .copied()
            .filter(|m| p.came.contains(m))
            .collect();
        let expected = p.coalition.members.len();
        if averaged.len() == expected && expected > 1 {
            let took = now.saturating_duration_since(p.started);
            self.normal = Some(
                self.normal
                    .map_or(took, |n| n.mul_f64(0.8) + took.mul_f64(0.2)),
            );
        }
        self.actions.push_back(Action::Average {
            round: p.round,
            coalition: p.coalition,
            averaged: averaged.clone(),
        });
        self.excuse_the_missing(&averaged);
        self.round += 1;
        self.step = Step::Ending;
        let outcome = RoundOutcome {
            round: self.round,
            attached: self.coalition.is_some(),
            complete: averaged.len() == expected,
            averaged,
            evaluate: is_evaluation_round(self.round, self.cfg.eval_every, Some(self.cfg.rounds))
                && self.round < self.cfg.rounds,
        };
        self.actions.push_back(Action::EndRound(outcome));
    }

    /// What an excused member's model is given: two normal pulls, at least `excused_grace`, at
    /// most `fetch`.
    fn grace(&self) -> Duration {
        let floor = self.cfg.excused_grace;
        self.normal
            .map_or(floor, |n| (n * 2).max(floor))
            .min(self.cfg.fetch)
    }

    /// The excuse rule: every awaited member whose model did not come made the round wait, and
    /// is excused; unless the missing outnumber the models that came (this silo's own
    /// included): then this silo is the one cut off, and it blames nobody.
    fn excuse_the_missing(&mut self, averaged: &[u32]) {
        let Some(c) = &self.coalition else {
            return;
        };
        let missing: Vec<u32> = c
            .members
            .iter()
            .copied()
            .filter(|m| !averaged.contains(m) && !self.not_awaited.contains(m))
            .collect();
        if missing.len() > averaged.len() {
            return;
        }
        for member in missing {
            if let Some((until, strikes)) = self.excuses.strike(&member, self.round) {
                self.actions.push_back(Action::Event(Event::Excused {
                    member,
                    round: self.round,
                    until,
                    strikes,
                }));
            }
        }
    }

    /// The last [`Action::EndRound`] is written: the next round, or the end.
    pub fn handle_round_written(&mut self, now: Instant) {
        if self.step == Step::Ending {
            self.begin_round(now);
        }
    }

    /// The last [`Action::AwaitServed`] is over (served or not).
    pub fn handle_served(&mut self, _now: Instant) {
        if self.step == Step::Serving {
            self.finish();
        }
    }

    fn join(&mut self) {
        self.step = Step::Joining;
        self.ask(Ask::Join, self.cfg.fetch);
    }

    fn joined_reply(&mut self, now: Instant, reply: Reply) {
        match reply {
            Reply::Ack => {
                self.step = Step::Planning;
                self.ask(Ask::Plan, self.cfg.fetch);
            }
            Reply::Refused(reason) => {
                self.fail(format!("the coordinator refused this silo: {reason}"))
            }
            Reply::TimedOut => {
                self.event(Event::NotJoined("no answer".into()));
                self.join();
            }
            other => {
                self.event(Event::NotJoined(format!("{other:?}")));
                self.pause(now);
            }
        }
    }

    /// The plan's reply: checked, then the pairs (or the singleton of a silo left out).
    fn planned(&mut self, now: Instant, reply: Reply) {
        match reply {
            Reply::Plan {
                target,
                nodes,
                members,
            } => {
                let ascending = members.windows(2).all(|w| w[0] < w[1]);
                if !(target.is_finite() && target >= 0.0)
                    || nodes < 2
                    || members.len() < 2
                    || !ascending
                    || members.iter().any(|&m| m >= nodes)
                {
                    return self.fail(format!(
                        "the coordinator sent a bad plan (target {target}, {nodes} silos, \
                         planned {members:?})"
                    ));
                }
                let me = self.cfg.me;
                if me >= nodes {
                    return self.fail(format!(
                        "this silo has index {me}; the coordinator runs {nodes} silos"
                    ));
                }
                if !members.contains(&me) {
                    self.event(Event::NotPlanned { planned: members });
                    let alone = Coalition {
                        members: vec![me],
                        sizes: vec![self.cfg.n_train],
                    };
                    self.coalition = Some(alone.clone());
                    self.actions.push_back(Action::Adopt(alone));
                    self.actions.push_back(Action::Save);
                    return self.begin_rounds(now);
                }
                self.step = Step::Pairs;
                self.actions.push_back(Action::RunPairs {
                    target,
                    planned: members.into_iter().map(|m| m as usize).collect(),
                });
            }
            Reply::Refused(reason) => {
                self.event(Event::PlanRefused(reason));
                self.join();
            }
            Reply::TimedOut => {
                // The coordinator holds the plan until every silo joined.
                self.event(Event::NoPlan("not out yet".into()));
                self.ask(Ask::Plan, self.cfg.fetch);
            }
            other => {
                self.event(Event::NoPlan(format!("{other:?}")));
                self.pause(now);
            }
        }
    }

    /// Reports the distances, then fetches the coalition, until `until`; then `then`.
    fn attach(&mut self, now: Instant, until: Instant, then: Then) {
        self.until = Some(until);
        self.then = then;
        if !self.has_report {
            // Nothing to report: nothing to wait for.
            return self.attached(now, false);
        }
        self.report(now);
    }

    fn report(&mut self, now: Instant) {
        if self.reported {
            self.step = Step::Fetching;
            self.ask_in_wait(now, Ask::Coalition);
        } else {
            self.step = Step::Reporting;
            self.ask_in_wait(now, Ask::Distances);
        }
    }

    fn reported_reply(&mut self, now: Instant, reply: Reply) {
        match reply {
            Reply::Ack => {
                self.reported = true;
                self.report(now);
            }
            Reply::TimedOut => self.attached(now, true),
            Reply::Refused(reason) => {
                // A restarted coordinator without this silo's join: join again.
                self.event(Event::DistancesRefused(reason));
                self.step = Step::Rejoining;
                self.ask_in_wait(now, Ask::Join);
            }
            other => {
                self.event(Event::NotReported(format!("{other:?}")));
                self.pause(now);
            }
        }
    }

    fn fetched(&mut self, now: Instant, reply: Reply) {
        match reply {
            Reply::Coalition { members, sizes } => {
                let ok = members.len() == sizes.len()
                    && members.contains(&self.cfg.me)
                    && members.windows(2).all(|w| w[0] < w[1])
                    && sizes.iter().all(|&s| s > 0);
                if ok {
                    self.event(Event::CoalitionReceived(members.clone()));
                    let c = Coalition { members, sizes };
                    self.coalition = Some(c.clone());
                    self.actions.push_back(Action::Adopt(c));
                } else {
                    self.event(Event::MalformedCoalition { members, sizes });
                }
                self.attached(now, false);
            }
            Reply::TimedOut => self.attached(now, true),
            Reply::Refused(reason) => {
                self.event(Event::CoalitionRefused(reason));
                self.reported = false;
                self.report(now);
            }
            other => {
                self.event(Event::NoCoalition(format!("{other:?}")));
                self.pause(now);
            }
        }
    }

    /// The attach is over (`cut`: the wait ran out).
    fn attached(&mut self, now: Instant, cut: bool) {
        self.until = None;
        if cut {
            self.event(Event::NoStructure);
        }
        match self.then {
            Then::Rounds => {
                self.actions.push_back(Action::Save);
                self.begin_rounds(now);
            }
            Then::Train => self.train(),
        }
    }

    fn begin_rounds(&mut self, now: Instant) {
        if self.republish {
            self.actions.push_back(Action::Republish);
        }
        self.begin_round(now);
    }

    /// A round: ask for the structure briefly while it is unknown, then train; or the end.
    fn begin_round(&mut self, now: Instant) {
        if self.round >= self.cfg.rounds {
            return self.begin_finish();
        }
        if self.coalition.is_none() {
            return self.attach(now, now + self.cfg.attach_wait, Then::Train);
        }
        self.train();
    }

    fn train(&mut self) {
        self.step = Step::Training;
        self.actions.push_back(Action::Train { round: self.round });
    }

    /// Lets the other members fetch the last model, at most `fetch`, then the end.
    fn begin_finish(&mut self) {
        let others = self
            .coalition
            .as_ref()
            .map_or(0, |c| c.members.len().saturating_sub(1));
        if others == 0 || self.cfg.rounds == 0 {
            return self.finish();
        }
        self.step = Step::Serving;
        self.actions.push_back(Action::AwaitServed {
            round: self.cfg.rounds - 1,
            others,
            within: self.cfg.fetch,
        });
    }

    fn finish(&mut self) {
        self.step = Step::Over;
        self.actions.push_back(Action::Finish);
    }

    fn fail(&mut self, reason: String) {
        self.step = Step::Over;
        self.actions.push_back(Action::Fail(reason));
    }

    fn ask(&mut self, ask: Ask, within: Duration) {
        self.actions.push_back(Action::Ask { ask, within });
    }

    /// Asks within what is left of the structure's wait; with nothing left, the attach ends.
    fn ask_in_wait(&mut self, now: Instant, ask: Ask) {
        let left = self
            .until
            .map_or(Duration::ZERO, |u| u.saturating_duration_since(now));
        if left.is_zero() {
            return self.attached(now, true);
        }
        self.ask(ask, left);
    }

    /// Asks again after `retry`; while attaching, only when that still fits in the wait.
    fn pause(&mut self, now: Instant) {
        let at = now + self.cfg.retry;
        if self.until.is_some_and(|u| at >= u) {
            return self.attached(now, true);
        }
        self.retry_at = Some(at);
    }

    fn event(&mut self, e: Event) {
        self.actions.push_back(Action::Event(e));
    }
}
