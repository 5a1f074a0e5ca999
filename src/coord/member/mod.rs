//! A coordinated silo's rounds (FedDisco, HCCT, FedSaC), sans-IO: every rule a member of a
//! coordinator's run follows over an unreliable network, shaped like
//! [`crate::core::round::Round`] and [`crate::coord::engine::Engine`] (the coordinator's side).
//!
//! Owns: the round's budget for registering and fetching (one per round, shared by both, the
//! coordinator asked again every `retry` while it is unreachable), when a round trains
//! *detached* (from the own model, no update sent) and when it reattaches, re-registering when
//! the coordinator lost the registration (an update refused: register again and resend once),
//! training alone once the coordinator's run started without this silo, the catch-up after a
//! kill between an update and its checkpoint ([`catch_up`]), the streak of rounds without a
//! model and the switch to FedeRiCo after `fall_back_after` of them, which rounds are
//! evaluated, and the final fetch after the last round (a longer budget).
//! Must not: read a clock (time is passed in as `now`), touch sockets, files, threads or models
//! (the driver holds the parameters the coordinator sent, trains, evaluates and writes), or
//! check wire frames (a model of the wrong length reaches the engine as [`Reply::Unusable`]).
//!
//! A driver calls [`Member::handle_start`], carries out each [`Action`] from
//! [`Member::poll_action`] and reports back: a reply to every [`Action::Ask`]
//! ([`Member::handle_reply`]), the end of every [`Action::Train`] ([`Member::handle_trained`])
//! and of every [`Action::EndRound`] ([`Member::handle_round_written`]); while it waits to ask
//! again it calls [`Member::handle_timeout`] at [`Member::poll_timeout`]. The rounds are
//! sequential: at most one action waits for its report at a time. `net::coordinated` is the
//! libp2p driver; the tests beside this file drive it on a virtual clock.

#[cfg(test)]
mod tests;

use crate::core::is_evaluation_round;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The fixed settings of a member's run.
#[derive(Clone, Debug)]
pub struct MemberConfig {
    /// Rounds of the run (the coordinator's, from the shared config).
    pub rounds: u64,
    /// Per round: the budget for registering and fetching together; per exchange: how long an
    /// update (or a re-registration) may take.
    pub budget: Duration,
    /// The pause before asking an unreachable coordinator again within a budget.
    pub retry: Duration,
    /// The budget of the final fetch after the last round.
    pub final_budget: Duration,
    /// Evaluate every this many rounds (0: only the final model).
    pub eval_every: u64,
    /// `fallback = "federico"`: switch after this many rounds in a row without a model from
    /// the coordinator (`None`: never switch).
    pub fall_back_after: Option<u64>,
}

/// Where a member resumes (a fresh run: all zero, nothing sent).
#[derive(Clone, Debug, Default)]
pub struct Resume {
    /// Rounds done.
    pub round: u64,
    /// The coordinator's round of the last model taken.
    pub last_global: Option<u64>,
    /// Local trainings done.
    pub trained: u64,
    /// The last-update marker: an update made and (perhaps) sent after the checkpoint.
    pub sent: Option<SentMark>,
    /// The member had switched to FedeRiCo before it stopped.
    pub switched: bool,
}

/// What the last-update marker says: the coordinator round the update was for, and the
/// trainings done with it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SentMark {
    /// The coordinator's round.
    pub round: u64,
    /// Trainings done, this one included.
    pub trained: u64,
}

/// What to ask the coordinator (the driver adds what it holds: the registration's numbers, the
/// trained parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Register (FedDisco's `(N_k, δ_k)`, HCCT's and FedSaC's sample count).
    Register,
    /// The model round `round` starts from.
    Fetch {
        /// The coordinator's round.
        round: u64,
    },
    /// The model trained from round `round`'s (FedSaC: with its subspace).
    Update {
        /// The coordinator's round.
        round: u64,
    },
}

/// The coordinator's reply to an [`Ask`], as the driver read it.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// Recorded.
    Ack,
    /// Refused, and why.
    Refused(String),
    /// The model of the coordinator's round `round` (the driver keeps its parameters): train
    /// from it when `train` (FedSaC: outside the cohort, a silo only takes its model).
    Model {
        /// The coordinator's round.
        round: u64,
        /// Train this round.
        train: bool,
    },
    /// The run started without this silo: it trains alone.
    Alone,
    /// No answer (unreachable, timed out): worth asking again within the budget.
    Failed(String),
    /// An answer that cannot be used (a model of the wrong length, an answer to another
    /// question) or a failure not worth asking again.
    Unusable(String),
}

/// One finished round, for its line in the run log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundOutcome {
    /// Rounds done, this one included.
    pub round: u64,
    /// The coordinator's round trained from (`None`: detached).
    pub global_round: Option<u64>,
    /// Trained this round.
    pub trained: bool,
    /// The coordinator acknowledged the update.
    pub acked: bool,
    /// The coordinator's run goes on without this silo.
    pub alone: bool,
    /// Rebuilt after a restart from the last-update marker.
    pub recovered: bool,
    /// Score this round's model (an evaluation round before the last).
    pub evaluate: bool,
}

/// Something worth a log line.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Not registered this round (refused, or the coordinator unreachable): final for the
    /// round.
    NotRegistered(String),
    /// No model this round: it trains from the own model.
    Detached {
        /// The round (rounds done before it).
        round: u64,
        /// Why.
        reason: String,
    },
    /// The coordinator's run started without this silo.
    Alone {
        /// The round.
        round: u64,
    },
    /// An update was refused: registering again and resending once.
    UpdateRefused {
        /// The round.
        round: u64,
        /// Why.
        reason: String,
    },
    /// The coordinator seems gone: switching to FedeRiCo.
    FallingBack {
        /// Rounds done.
        round: u64,
        /// Rounds in a row without a model.
        without: u64,
    },
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Ask the coordinator, giving up after `within`; report with [`Member::handle_reply`].
    Ask {
        /// The question.
        ask: Ask,
        /// How long the exchange may take.
        within: Duration,
    },
    /// Take the model the coordinator sent as the silo's model.
    Adopt {
        /// Its coordinator round.
        round: u64,
    },
    /// The update behind the last-update marker went out before a kill and its round closed:
    /// move the training streams past `skip` trainings and write the round `outcome` (with the
    /// marker's model) that the kill cut off.
    Recover {
        /// Trainings to skip.
        skip: u64,
        /// The round it closes.
        outcome: RoundOutcome,
    },
    /// Train the silo's model (with the direction the coordinator sent, if any) on the
    /// schedule of round `at`; report with [`Member::handle_trained`].
    Train {
        /// The round the schedule follows (the coordinator's; the own one when detached).
        at: u64,
    },
    /// Write the last-update marker before the update goes.
    MarkSent(SentMark),
    /// The round is over: evaluate when asked, write its line and the checkpoint; report with
    /// [`Member::handle_round_written`].
    EndRound(RoundOutcome),
    /// Say what happened.
    Event(Event),
    /// Run the rounds after round `at` as FedeRiCo. The member is done.
    FallBack {
        /// Rounds done.
        at: u64,
    },
    /// The last round is done: take the coordinator's final model when `final_round` is set
    /// (its parameters came with the last reply), score it and write the final line. The
    /// member is done.
    Finish {
        /// The coordinator round of the final model (`None`: the own model).
        final_round: Option<u64>,
    },
}

/// What the member waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Not started.
    Idle,
    /// A reply to its `Register` (`Some`: resend this update once it is acknowledged).
    Registering { resend: Option<u64> },
    /// A reply to `Fetch { round }`.
    Fetching { round: u64 },
    /// The training's end.
    Training,
    /// A reply to its update (`resent`: the second try, after registering again).
    Updating { round: u64, resent: bool },
    /// The round's line and checkpoint.
    Ending,
    /// A reply to the final fetch.
    Finishing,
    /// Done (finished or switched).
    Over,
}

/// The round under way.
#[derive(Clone, Copy, Debug, Default)]
struct Current {
    global: Option<u64>,
    train: bool,
    acked: bool,
}

/// A coordinated silo's run (see the module documentation).
#[derive(Debug)]
pub struct Member {
    cfg: MemberConfig,
    round: u64,
    last_global: Option<u64>,
    trained: u64,
    sent: Option<SentMark>,
    switched: bool,
    registered: bool,
    alone: bool,
    /// Rounds in a row without a model from the coordinator.
    streak: u64,
    cur: Current,
    step: Step,
    /// Registering and fetching give up here (this round's budget, or the final fetch's).
    until: Option<Instant>,
    /// Ask `step`'s question again then (the coordinator was unreachable).
    retry_at: Option<Instant>,
    actions: VecDeque<Action>,
}

/// A resumed member's first model: when its last update went out but its checkpoint missed the
/// round (the marker's round at or past the round wanted) and the coordinator has closed that
/// round (`got` past it), the training behind the update counts: the streams move past it.
/// When the round is still open, the member trains it again on the same batches (the same
/// update, which the coordinator takes again). The trainings to skip.
pub fn catch_up(sent: Option<SentMark>, want: u64, got: u64, trained: u64) -> u64 {
    match sent {
        Some(s) if s.round >= want && got > s.round => s.trained.saturating_sub(trained),
        _ => 0,
    }
}

impl Member {
    /// A member resumed at `resume` (fresh: `Resume::default()`).
    pub fn new(cfg: MemberConfig, resume: Resume) -> Self {
        Self {
            cfg,
            round: resume.round,
            last_global: resume.last_global,
            trained: resume.trained,
            sent: resume.sent,
            switched: resume.switched,
            registered: false,
            alone: false,
            streak: 0,
            cur: Current::default(),
            step: Step::Idle,
            until: None,
            retry_at: None,
            actions: VecDeque::new(),
        }
    }

    /// Rounds done.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The coordinator's round of the last model taken.
    pub fn last_global(&self) -> Option<u64> {
        self.last_global
    }

    /// Local trainings done (what a checkpoint keeps to replay the streams).
    pub fn trained(&self) -> u64 {
        self.trained
    }

    /// The member is done: finished, or switched to FedeRiCo.
    pub fn is_over(&self) -> bool {
        self.step == Step::Over && self.actions.is_empty()
    }

    /// Starts the run (once).
    pub fn handle_start(&mut self, now: Instant) {
        if self.step != Step::Idle {
            return;
        }
        if self.switched && self.cfg.fall_back_after.is_some() {
            // Switched before a restart: go on as FedeRiCo.
            self.step = Step::Over;
            self.actions.push_back(Action::FallBack { at: self.round });
            return;
        }
        self.begin_round(now);
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When to call [`Member::handle_timeout`] (`None`: nothing is due).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The clock reached [`Member::poll_timeout`]: ask again.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.retry_at {
            Some(t) if t <= now => self.retry_at = None,
            _ => return,
        }
        match self.step {
            Step::Registering { resend: None } => self.ask_in_budget(now, Ask::Register),
            Step::Fetching { round } => self.ask_in_budget(now, Ask::Fetch { round }),
            Step::Finishing => self.ask_in_budget(
                now,
                Ask::Fetch {
                    round: self.cfg.rounds,
                },
            ),
            _ => {}
        }
    }

    /// The reply to the last [`Action::Ask`] (one that came for no question is ignored).
    pub fn handle_reply(&mut self, now: Instant, reply: Reply) {
        if self.retry_at.is_some() {
            return;
        }
        match self.step {
            Step::Registering { resend: None } => self.registered(now, reply),
            Step::Registering {
                resend: Some(round),
            } => {
                self.registered = reply == Reply::Ack;
                if self.registered {
                    self.step = Step::Updating {
                        round,
                        resent: true,
                    };
                    self.ask_for(Ask::Update { round }, self.cfg.budget);
                } else {
                    self.end_round();
                }
            }
            Step::Fetching { round } => self.fetched(now, round, reply),
            Step::Updating { round, resent } => match reply {
                Reply::Ack => {
                    self.cur.acked = true;
                    self.end_round();
                }
                // Refused, typically because the registration was lost (a member that started
                // before the coordinator listened, or a coordinator restarted without it):
                // register again and resend once.
                Reply::Refused(reason) if !resent => {
                    self.event(Event::UpdateRefused {
                        round: self.round,
                        reason,
                    });
                    self.step = Step::Registering {
                        resend: Some(round),
                    };
                    self.ask_for(Ask::Register, self.cfg.budget);
                }
                _ => self.end_round(),
            },
            Step::Finishing => match reply {
                Reply::Failed(_) if self.may_retry(now) => {
                    self.retry_at = Some(now + self.cfg.retry);
                }
                Reply::Model { round, .. } => self.finish(Some(round)),
                _ => self.finish(None),
            },
            Step::Idle | Step::Training | Step::Ending | Step::Over => {}
        }
    }

    /// The last [`Action::Train`] is done.
    pub fn handle_trained(&mut self, _now: Instant) {
        if self.step != Step::Training {
            return;
        }
        self.trained += 1;
        match self.cur.global {
            // Attached: the update goes to the coordinator, its marker first.
            Some(round) => {
                self.actions.push_back(Action::MarkSent(SentMark {
                    round,
                    trained: self.trained,
                }));
                self.step = Step::Updating {
                    round,
                    resent: false,
                };
                self.ask_for(Ask::Update { round }, self.cfg.budget);
            }
            None => self.end_round(),
        }
    }

    /// The last [`Action::EndRound`] is written: the next round (or the switch, or the end).
    pub fn handle_round_written(&mut self, now: Instant) {
        if self.step != Step::Ending {
            return;
        }
        self.streak = if self.cur.global.is_some() || self.alone {
            0
        } else {
            self.streak + 1
        };
        if self
            .cfg
            .fall_back_after
            .is_some_and(|after| self.streak >= after)
            && self.round < self.cfg.rounds
        {
            self.event(Event::FallingBack {
                round: self.round,
                without: self.streak,
            });
            self.step = Step::Over;
            self.actions.push_back(Action::FallBack { at: self.round });
            return;
        }
        self.begin_round(now);
    }

    /// A round: register if needed, then fetch; or the end.
    fn begin_round(&mut self, now: Instant) {
        if self.round >= self.cfg.rounds {
            return self.begin_finish(now);
        }
        self.cur = Current::default();
        self.until = Some(now + self.cfg.budget);
        if !self.registered && !self.alone {
            self.step = Step::Registering { resend: None };
            self.ask_in_budget(now, Ask::Register);
        } else {
            self.fetch(now);
        }
    }

    /// The registration's reply: a refusal is final for the round; on to fetching either way.
    fn registered(&mut self, now: Instant, reply: Reply) {
        match reply {
            Reply::Failed(_) if self.may_retry(now) => {
                self.retry_at = Some(now + self.cfg.retry);
                return;
            }
            Reply::Ack => self.registered = true,
            Reply::Failed(why) | Reply::Unusable(why) | Reply::Refused(why) => {
                self.event(Event::NotRegistered(why))
            }
            other => self.event(Event::NotRegistered(format!("{other:?}"))),
        }
        self.fetch(now);
    }

    /// Fetches the model the round starts from (alone: nothing to fetch).
    fn fetch(&mut self, now: Instant) {
        if self.alone {
            return self.detached();
        }
        let round = self.last_global.map_or(0, |g| g + 1);
        self.step = Step::Fetching { round };
        self.ask_in_budget(now, Ask::Fetch { round });
    }

    /// The fetch's reply.
    fn fetched(&mut self, now: Instant, want: u64, reply: Reply) {
        match reply {
            Reply::Failed(_) if self.may_retry(now) => {
                self.retry_at = Some(now + self.cfg.retry);
            }
            Reply::Model { round, train } => {
                self.actions.push_back(Action::Adopt { round });
                self.last_global = Some(round);
                // The coordinator is already past its last round (this silo skipped rounds it
                // was not needed in, e.g. outside FedSaC's cohorts): nothing left to train.
                if round >= self.cfg.rounds {
                    return self.begin_finish(now);
                }
                self.recover(want, round);
                self.cur.global = Some(round);
                self.cur.train = train;
                if train {
                    self.train(round);
                } else {
                    self.end_round();
                }
            }
            Reply::Alone => {
                if !self.alone {
                    self.event(Event::Alone { round: self.round });
                    self.alone = true;
                }
                self.detached();
            }
            Reply::Failed(reason) | Reply::Unusable(reason) | Reply::Refused(reason) => {
                self.event(Event::Detached {
                    round: self.round,
                    reason,
                });
                self.registered = false;
                self.detached();
            }
            Reply::Ack => {
                self.event(Event::Detached {
                    round: self.round,
                    reason: "an acknowledgement where a model was due".into(),
                });
                self.registered = false;
                self.detached();
            }
        }
    }

    /// A round without the coordinator's model: train from the own one, on the own round's
    /// schedule, and send nothing.
    fn detached(&mut self) {
        self.cur.global = None;
        self.cur.train = true;
        self.train(self.round);
    }

    fn train(&mut self, at: u64) {
        self.step = Step::Training;
        self.actions.push_back(Action::Train { at });
    }

    /// The first model after a restart: the round the kill cut off, if its update counts.
    fn recover(&mut self, want: u64, got: u64) {
        let Some(sent) = self.sent.take() else {
            return;
        };
        let skip = catch_up(Some(sent), want, got, self.trained);
        if skip == 0 {
            return;
        }
        self.trained += skip;
        self.round += 1;
        let outcome = RoundOutcome {
            round: self.round,
            global_round: Some(sent.round),
            trained: true,
            acked: false,
            alone: false,
            recovered: true,
            evaluate: self.evaluates(self.round),
        };
        self.actions.push_back(Action::Recover { skip, outcome });
    }

    fn end_round(&mut self) {
        self.round += 1;
        self.step = Step::Ending;
        let outcome = RoundOutcome {
            round: self.round,
            global_round: self.cur.global,
            trained: self.cur.train,
            acked: self.cur.acked,
            alone: self.alone,
            recovered: false,
            evaluate: self.evaluates(self.round),
        };
        self.actions.push_back(Action::EndRound(outcome));
    }

    /// The last round is scored in the final line.
    fn evaluates(&self, round: u64) -> bool {
        is_evaluation_round(round, self.cfg.eval_every, Some(self.cfg.rounds))
            && round < self.cfg.rounds
    }

    /// The final model: the coordinator's after its last round, asked for with a longer budget
    /// (that round may lie ahead when rounds were spent detached).
    fn begin_finish(&mut self, now: Instant) {
        if self.alone {
            return self.finish(None);
        }
        self.step = Step::Finishing;
        self.until = Some(now + self.cfg.final_budget);
        self.ask_in_budget(
            now,
            Ask::Fetch {
                round: self.cfg.rounds,
            },
        );
    }

    fn finish(&mut self, final_round: Option<u64>) {
        if let Some(g) = final_round {
            self.last_global = Some(g);
        }
        self.step = Step::Over;
        self.actions.push_back(Action::Finish { final_round });
    }

    /// Asks within what is left of the budget; with nothing left, the ask fails at once.
    fn ask_in_budget(&mut self, now: Instant, ask: Ask) {
        let left = self
            .until
            .map_or(Duration::ZERO, |u| u.saturating_duration_since(now));
        if left.is_zero() {
            return self.handle_reply(now, Reply::Failed("the round's budget is spent".into()));
        }
        self.ask_for(ask, left);
    }

    fn ask_for(&mut self, ask: Ask, within: Duration) {
        self.actions.push_back(Action::Ask { ask, within });
    }

    /// Another try, after a pause, still fits in the budget.
    fn may_retry(&self, now: Instant) -> bool {
        self.until
            .and_then(|u| u.checked_sub(self.cfg.retry))
            .is_some_and(|last_try| now < last_try)
    }

    fn event(&mut self, e: Event) {
        self.actions.push_back(Action::Event(e));
    }
}
