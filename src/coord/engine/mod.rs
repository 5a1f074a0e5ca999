//! The coordinator's round engine, sans-IO: every protocol rule of a FedDisco, HCCT, FedSaC or
//! FedCollab coordinator over an unreliable network, shaped like [`crate::core::round::Round`].
//!
//! Owns: joining and its deadline (`join_s`: once it passed, joining closes on the silos that
//! came), the round clock (a round closes when every awaited member sent, or at τ with whoever
//! did), which members a round still awaits (the *excuse* rule below), held fetches (answered
//! once their round exists), the linger after the last round, and when the checkpoint, the
//! round's log line and FedCollab's structure are due.
//! Must not: read a clock (time is passed in as `now`), touch sockets, files or threads, check
//! wire frames (the driver does, before a request gets here), or decide weights, groups,
//! coalitions or models (the servers of [`crate::coord`] do, behind [`CoordAlgorithm`]).
//!
//! A driver calls `handle_*(now, …)` with what happened (a request, a timeout), carries out the
//! engine's [`Action`]s (`poll_action`: answer a request, write the checkpoint, append the
//! round's log line, write the solved structure, log an event, stop) and calls
//! [`Engine::handle_timeout`] at [`Engine::poll_timeout`]. `net::coordinator` is the libp2p
//! driver; the tests beside this file drive it on a virtual clock.
//!
//! # Excused members (insiders' review D5)
//!
//! A member that registered and then stays silent would make every round wait its full τ. So a
//! member whose absence made a round time out is *excused*: the rounds that follow close without
//! waiting for it (its updates still count when they come before the round closes). The first
//! excuse lasts `excuse_rounds` rounds; each later one twice as long as the one before (at most
//! 64 times), so one silent key costs the federation one τ per excuse, ever fewer. Nobody is
//! excused when the round had no update at all, when the missing members outnumber the senders
//! (that is the network or the coordinator failing, not a member), or in the first round after
//! the engine started (a restarted coordinator lost that round's updates).
//!
//! # Members ahead of the round
//!
//! A member whose fetch is held for a later round than the open one (it trained detached while
//! the coordinator was away and ran ahead, or it is done and waits for the final model) sends
//! nothing more for the open round: the round does not wait for it.

mod algorithm;
#[cfg(test)]
mod tests;

pub use algorithm::{CoordAlgorithm, Disco, NOT_A_SILO};

use super::excuse::Excuses;
use crate::coord::PairDistance;
use crate::coord::fedcollab_server::Solved;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A member's request, as the engine takes it (the wire's `CoordRequest`, checked).
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// FedDisco: join with `(N_k, δ_k)`.
    Register {
        /// `N_k`.
        n_train: u64,
        /// `δ_k`.
        discrepancy: f64,
    },
    /// HCCT, FedSaC, FedCollab: join with the sample count.
    Join {
        /// Training samples.
        n_train: u64,
    },
    /// The model (or plan) of `round`; held until it exists.
    Fetch {
        /// The round wanted.
        round: u64,
    },
    /// FedDisco, HCCT: the model trained from global `round`.
    Update {
        /// The round trained.
        round: u64,
        /// Flat parameters.
        params: Arc<Vec<f32>>,
    },
    /// FedSaC: a cohort member's model and feature subspace.
    Contribute {
        /// The round trained.
        round: u64,
        /// Flat parameters.
        params: Arc<Vec<f32>>,
        /// The subspace's rows.
        subspace: Option<Vec<Vec<f64>>>,
    },
    /// FedCollab: the silo's pairwise distances.
    Distances {
        /// One per partner.
        pairs: Vec<PairDistance>,
    },
}

/// The engine's answer to a request (the wire's `CoordResponse`).
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// The global (or group) model `round` starts from.
    Global {
        /// Its round.
        round: u64,
        /// Flat parameters.
        params: Arc<Vec<f32>>,
    },
    /// FedSaC: the silo's personalised model, its direction, and whether it trains.
    Assigned {
        /// The round.
        round: u64,
        /// θ̃.
        params: Arc<Vec<f32>>,
        /// c.
        direction: Option<Arc<Vec<f32>>>,
        /// In the cohort.
        train: bool,
    },
    /// Recorded.
    Ack,
    /// Refused, and why.
    Error {
        /// In words.
        reason: String,
    },
    /// FedCollab's distance plan.
    DiscPlan {
        /// m_train.
        target: f64,
        /// Silos in the run.
        nodes: u32,
        /// The planned silos.
        members: Vec<u32>,
    },
    /// FedCollab: the silo's coalition and its members' sizes.
    Coalition {
        /// Members.
        members: Vec<u32>,
        /// Their sizes.
        sizes: Vec<u64>,
    },
    /// The run started without this silo: it trains alone.
    Alone,
}

/// The fixed settings of a coordinator's run.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Rounds to run.
    pub rounds: u64,
    /// FedDisco: a round closes before its deadline only once this many registered (0: any).
    pub nodes: usize,
    /// τ: how long a round waits for updates once it opened.
    pub round_deadline: Duration,
    /// How long joining stays open after the first join (`None`: until every silo came).
    pub join_deadline: Option<Duration>,
    /// How long the final model is served after the last round.
    pub linger: Duration,
    /// Rounds of a member's first excuse (0: nobody is ever excused; every round waits for
    /// every member up to τ).
    pub excuse_rounds: u64,
    /// The manifest's members by silo index (their peer IDs), for the algorithms that index
    /// their silos.
    pub names: Vec<String>,
}

/// What the driver does next.
#[derive(Debug)]
pub enum Action<T> {
    /// Answer the request behind `ticket`.
    Respond {
        /// The driver's handle of the request.
        ticket: T,
        /// The answer.
        answer: Answer,
    },
    /// Write the checkpoint (`bytes`: the algorithm's encoding, or why it failed).
    Save {
        /// The round open now.
        round: u64,
        /// The bytes.
        bytes: Result<Vec<u8>, String>,
    },
    /// Append a closed round's line to the round log (before the checkpoint that follows).
    LogRound(RoundLine),
    /// FedCollab's structure is solved: write it (`fedcollab.json`).
    Solved(Solved),
    /// Say what happened.
    Event(Event),
    /// The run is over: stop.
    Finished,
}

/// One closed round's line in the round log.
#[derive(Clone, Debug, Serialize)]
pub struct RoundLine {
    /// The algorithm's record of the round.
    #[serde(flatten)]
    pub record: serde_json::Value,
    /// Seconds since the round opened.
    pub elapsed_s: f64,
    /// Excused members the round closed without (absent from the line when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub excused: Vec<String>,
}

/// Something worth a log line.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A registration was taken.
    Registered {
        /// Its peer.
        who: String,
        /// Its silo index.
        index: Option<usize>,
        /// Silos still awaited before the run starts.
        waiting_for: Vec<usize>,
        /// The run started without it: it trains alone.
        left_out: bool,
    },
    /// A request was refused.
    Refused {
        /// Its peer.
        who: String,
        /// What it was ("a registration", "an update", "distances").
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A silo's distances were taken.
    DistancesIn {
        /// Its peer.
        who: String,
        /// Its silo index.
        index: Option<usize>,
    },
    /// The join deadline passed: the run starts without these silos.
    JoiningClosed {
        /// The silos left out.
        absent: Vec<usize>,
    },
    /// A round closed.
    RoundClosed {
        /// Its number.
        round: u64,
        /// Updates aggregated.
        senders: usize,
        /// At its deadline.
        timed_out: bool,
    },
    /// A member's absence made round `round` time out: rounds before `until` do not wait for it.
    Excused {
        /// Its name.
        who: String,
        /// The round that timed out.
        round: u64,
        /// The first round that awaits it again.
        until: u64,
        /// Its excuses so far.
        strikes: u32,
    },
    /// Every round is done: the final model is served a while.
    AllRoundsDone,
}

/// A round could not close: the algorithm refused (a bug, never a member's doing).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EngineError(pub String);

/// A fetch held until its round exists.
#[derive(Debug)]
struct Held<T> {
    who: String,
    index: Option<usize>,
    round: u64,
    ticket: T,
}

/// The coordinator's run: one algorithm and the rules around it. `T` is the driver's handle of
/// a request it must answer (a response channel; anything in tests).
pub struct Engine<T> {
    alg: Box<dyn CoordAlgorithm>,
    cfg: EngineConfig,
    held: Vec<Held<T>>,
    actions: VecDeque<Action<T>>,
    /// When the open round closes with what arrived; `None` while the clock does not run.
    round_deadline: Option<Instant>,
    /// When the open round opened.
    opened: Option<Instant>,
    /// When joining closes (armed by the first join).
    join_deadline: Option<Instant>,
    /// The join deadline passed (joining closes once the algorithm may).
    join_due: bool,
    /// Serving the final model until then.
    linger_until: Option<Instant>,
    finished: bool,
    /// The round open when the engine started (it never excuses anyone).
    first_round: u64,
    excuses: Excuses<String>,
}

impl<T> Engine<T> {
    /// An engine over `alg` (fresh, or resumed from its checkpoint).
    pub fn new(alg: Box<dyn CoordAlgorithm>, cfg: EngineConfig) -> Self {
        Self {
            first_round: alg.round(),
            alg,
            held: Vec::new(),
            actions: VecDeque::new(),
            round_deadline: None,
            opened: None,
            join_deadline: None,
            join_due: false,
            linger_until: None,
            finished: false,
            excuses: Excuses::new(cfg.excuse_rounds),
            cfg,
        }
    }

    /// The algorithm (read only).
    pub fn algorithm(&self) -> &dyn CoordAlgorithm {
        self.alg.as_ref()
    }

    /// The round open now.
    pub fn round(&self) -> u64 {
        self.alg.round()
    }

    /// The run is over.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether `who` is excused in the open round.
    pub fn is_excused(&self, who: &str) -> bool {
        self.excused_in(who, self.alg.round())
    }

    fn excused_in(&self, who: &str, round: u64) -> bool {
        self.excuses.is_excused(who, round)
    }

    /// The next action for the driver.
    pub fn poll_action(&mut self) -> Option<Action<T>> {
        self.actions.pop_front()
    }

    /// When [`Engine::handle_timeout`] is due; `None`: only a request moves the engine.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.finished {
            return None;
        }
        if let Some(l) = self.linger_until {
            return Some(l);
        }
        let join = self
            .join_deadline
            .filter(|_| !self.join_due && !self.alg.plan_out());
        match (join, self.round_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The engine starts (or resumes): a resumed round's clock runs, a finished run lingers.
    pub fn handle_start(&mut self, now: Instant) -> Result<(), EngineError> {
        self.advance(now)
    }

    /// Time passed: a deadline may have come.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), EngineError> {
        if self.finished {
            return Ok(());
        }
        if let Some(l) = self.linger_until {
            if now >= l {
                self.finished = true;
                self.actions.push_back(Action::Finished);
            }
            return Ok(());
        }
        if self.join_deadline.is_some_and(|j| now >= j) && !self.alg.plan_out() {
            self.join_due = true;
        }
        if self.round_deadline.is_some_and(|d| now >= d) {
            self.close_round(now, true)?;
        }
        self.advance(now)
    }

    /// A member's request (`who`: its peer ID; `index`: its silo index, `None` when it is not
    /// one of the run's silos), to be answered through `ticket`, now or once its round exists.
    pub fn handle_request(
        &mut self,
        now: Instant,
        who: &str,
        index: Option<usize>,
        request: Request,
        ticket: T,
    ) -> Result<(), EngineError> {
        if self.finished {
            self.respond(ticket, error("the run is over"));
            return Ok(());
        }
        match request {
            Request::Register { .. } | Request::Join { .. } => {
                let answer = match self.alg.register(who, index, &request) {
                    Ok(()) => {
                        self.event(Event::Registered {
                            who: who.to_string(),
                            index,
                            waiting_for: self.alg.missing(),
                            left_out: index.is_some_and(|i| self.alg.left_out(i)),
                        });
                        self.save();
                        // HCCT: the last registration opens round 0.
                        self.serve_held();
                        Answer::Ack
                    }
                    Err(reason) => self.refuse(who, "a registration", reason),
                };
                self.respond(ticket, answer);
            }
            Request::Fetch { round } => match self.alg.fetch(index, round) {
                Ok(Some(answer)) => self.respond(ticket, answer),
                Ok(None) => self.held.push(Held {
                    who: who.to_string(),
                    index,
                    round,
                    ticket,
                }),
                Err(reason) => self.respond(ticket, Answer::Error { reason }),
            },
            Request::Distances { .. } => {
                let answer = match self.alg.update(who, index, request) {
                    Ok(solved) => {
                        self.event(Event::DistancesIn {
                            who: who.to_string(),
                            index,
                        });
                        self.save();
                        if solved && let Some(s) = self.alg.solved() {
                            self.actions.push_back(Action::Solved(s.clone()));
                            self.serve_held();
                        }
                        Answer::Ack
                    }
                    Err(reason) => self.refuse(who, "distances", reason),
                };
                self.respond(ticket, answer);
            }
            Request::Update { .. } | Request::Contribute { .. } => {
                if self.alg.round() >= self.cfg.rounds {
                    self.respond(ticket, error("the run is over"));
                    return Ok(());
                }
                match self.alg.update(who, index, request) {
                    Ok(_) => {
                        self.respond(ticket, Answer::Ack);
                        if self.all_awaited_in() {
                            self.close_round(now, false)?;
                        }
                    }
                    Err(reason) => {
                        let answer = self.refuse(who, "an update", reason);
                        self.respond(ticket, answer);
                    }
                }
            }
        }
        self.advance(now)
    }

    /// Every member the open round awaits has sent (the excused are not awaited, nor a member
    /// whose fetch waits for a later round: it is past the open round, and sends nothing more
    /// for it).
    fn all_awaited_in(&self) -> bool {
        let round = self.alg.round();
        self.alg.complete(self.cfg.nodes)
            && self
                .alg
                .waiting(&self.cfg.names)
                .iter()
                .all(|w| self.excused_in(w, round) || self.ahead(w, round))
    }

    /// `who` waits for the model of a round after `round`.
    fn ahead(&self, who: &str, round: u64) -> bool {
        self.held.iter().any(|h| h.who == who && h.round > round)
    }

    /// The rules that follow from the state: joining closes once due, the round clock starts,
    /// the run lingers once every round is done.
    fn advance(&mut self, now: Instant) -> Result<(), EngineError> {
        if let Some(j) = self.cfg.join_deadline
            && !self.alg.plan_out()
            && self.alg.registered() > 0
        {
            self.join_deadline.get_or_insert(now + j);
            if self.join_due && self.alg.may_close_joining() {
                let absent = self.alg.close_joining().map_err(EngineError)?;
                self.event(Event::JoiningClosed { absent });
                self.save();
                self.serve_held();
            }
        }
        // The round clock runs whenever a round is open and someone registered, so a round
        // whose updates were lost (a restart) still closes, keeping the global.
        if self.round_deadline.is_none()
            && self.alg.round() < self.cfg.rounds
            && self.alg.clock_may_run()
        {
            self.round_deadline = Some(now + self.cfg.round_deadline);
            self.opened = Some(now);
        }
        if self.alg.round() >= self.cfg.rounds && self.linger_until.is_none() {
            self.event(Event::AllRoundsDone);
            self.linger_until = Some(now + self.cfg.linger);
        }
        Ok(())
    }

    /// Closes the open round (at its deadline, or once every awaited update is in): excuses
    /// for the members that made it time out, its log line, then the checkpoint; the next
    /// round's clock starts over and held fetches of it go.
    fn close_round(&mut self, now: Instant, timed_out: bool) -> Result<(), EngineError> {
        let round = self.alg.round();
        let waiting = self.alg.waiting(&self.cfg.names);
        let (closed, senders, record) = self.alg.close(timed_out).map_err(EngineError)?;
        debug_assert_eq!(closed, round);
        let (excused, awaited): (Vec<String>, Vec<String>) =
            waiting.into_iter().partition(|w| self.excused_in(w, round));
        let mut missing = excused;
        if timed_out
            && self.cfg.excuse_rounds > 0
            && senders > 0
            && awaited.len() <= senders
            && round != self.first_round
        {
            for who in &awaited {
                if let Some((until, strikes)) = self.excuses.strike(who, round) {
                    let ev = Event::Excused {
                        who: who.clone(),
                        round,
                        until,
                        strikes,
                    };
                    self.event(ev);
                }
            }
            missing.extend(awaited);
        }
        missing.sort();
        let elapsed_s = self
            .opened
            .map_or(0.0, |o| now.saturating_duration_since(o).as_secs_f64());
        // The line before the checkpoint: a kill between the two leaves a line the restart cuts.
        self.actions.push_back(Action::LogRound(RoundLine {
            record,
            elapsed_s,
            excused: missing,
        }));
        self.save();
        self.event(Event::RoundClosed {
            round: closed,
            senders,
            timed_out,
        });
        self.round_deadline = None;
        self.opened = Some(now);
        self.serve_held();
        Ok(())
    }

    /// Answers the held fetches whose round now exists (or that are now refused).
    fn serve_held(&mut self) {
        for h in std::mem::take(&mut self.held) {
            let answer = match self.alg.fetch(h.index, h.round) {
                Ok(Some(answer)) => answer,
                Ok(None) => {
                    self.held.push(h);
                    continue;
                }
                Err(reason) => Answer::Error { reason },
            };
            self.respond(h.ticket, answer);
        }
    }

    fn save(&mut self) {
        self.actions.push_back(Action::Save {
            round: self.alg.round(),
            bytes: self.alg.encode(),
        });
    }

    fn respond(&mut self, ticket: T, answer: Answer) {
        self.actions.push_back(Action::Respond { ticket, answer });
    }

    fn event(&mut self, e: Event) {
        self.actions.push_back(Action::Event(e));
    }

    /// A refusal: its event, and the answer that says why.
    fn refuse(&mut self, who: &str, what: &'static str, reason: String) -> Answer {
        self.event(Event::Refused {
            who: who.to_string(),
            what,
            reason: reason.clone(),
        });
        Answer::Error { reason }
    }
}

fn error(reason: &str) -> Answer {
    Answer::Error {
        reason: reason.to_string(),
    }
}
