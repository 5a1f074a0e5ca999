//! A coordinated silo's rounds on a virtual clock: the coordinator is scripted (what it answers
//! to each question, and how long the answer takes), the clock only moves when the bench moves
//! it, and the member's retry timeouts are served in order with a step bound
//! ([`crate::testkit::Clock`], shared with the coordinator engine's tests).
//! Owns: the member engine's rule tests and their fixtures.
//! Must not: hold code the engine uses.

use super::*;
use crate::testkit::Clock;

const BUDGET: Duration = Duration::from_secs(4);
const RETRY: Duration = Duration::from_millis(500);
/// How long a failed dial or an answer takes.
const RTT: Duration = Duration::from_millis(10);

fn config(rounds: u64) -> MemberConfig {
    MemberConfig {
        rounds,
        budget: BUDGET,
        retry: RETRY,
        final_budget: BUDGET * 4,
        eval_every: 2,
        fall_back_after: None,
    }
}

/// What the scripted coordinator does with one question.
enum Says {
    /// Answers after [`RTT`].
    Answer(Reply),
    /// Cannot be reached: the dial fails after [`RTT`].
    Unreachable,
    /// Never answers: the exchange times out.
    Silent,
}

/// A member, its clock, and everything it asked and did.
struct Bench {
    m: Member,
    clock: Clock,
    start: Instant,
    /// Every question, when it was asked and with how long it was given.
    asks: Vec<(Duration, Ask, Duration)>,
    actions: Vec<Action>,
    /// Rounds done when each question was asked.
    asked_in: Vec<u64>,
}

impl Bench {
    fn new(cfg: MemberConfig, resume: Resume) -> Self {
        let clock = Clock::new();
        Self {
            m: Member::new(cfg, resume),
            start: clock.now(),
            clock,
            asks: Vec::new(),
            actions: Vec::new(),
            asked_in: Vec::new(),
        }
    }

    fn fresh(cfg: MemberConfig) -> Self {
        Self::new(cfg, Resume::default())
    }

    /// Runs the member to its end against `coord` (asked with the question and the rounds
    /// done), training taking `train_for`.
    fn run(&mut self, mut coord: impl FnMut(Ask, u64) -> Says) {
        let train_for = Duration::from_secs(1);
        self.m.handle_start(self.clock.now());
        for _ in 0..100_000 {
            let Some(a) = self.m.poll_action() else {
                if self.m.is_over() {
                    return;
                }
                let t = self.m.poll_timeout().expect("the member waits for nothing");
                self.clock.run_until(
                    t,
                    &mut self.m,
                    |m| m.poll_timeout(),
                    |m, now| m.handle_timeout(now),
                );
                continue;
            };
            self.actions.push(a.clone());
            match a {
                Action::Ask { ask, within } => {
                    let at = self.clock.now() - self.start;
                    self.asks.push((at, ask, within));
                    self.asked_in.push(self.m.round());
                    let reply = match coord(ask, self.m.round()) {
                        Says::Answer(r) if RTT < within => {
                            self.clock.advance(RTT);
                            r
                        }
                        Says::Unreachable if RTT < within => {
                            self.clock.advance(RTT);
                            Reply::Failed("unreachable".into())
                        }
                        _ => {
                            self.clock.advance(within);
                            Reply::Failed("timed out".into())
                        }
                    };
                    self.m.handle_reply(self.clock.now(), reply);
                }
                Action::Train { .. } => {
                    self.clock.advance(train_for);
                    self.m.handle_trained(self.clock.now());
                }
                Action::EndRound(_) => self.m.handle_round_written(self.clock.now()),
                _ => {}
            }
        }
        panic!("the member did not finish: a busy loop");
    }

    fn questions(&self) -> Vec<Ask> {
        self.asks.iter().map(|a| a.1).collect()
    }

    fn outcomes(&self) -> Vec<RoundOutcome> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::EndRound(o) | Action::Recover { outcome: o, .. } => Some(*o),
                _ => None,
            })
            .collect()
    }

    fn trains(&self) -> Vec<u64> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::Train { at } => Some(*at),
                _ => None,
            })
            .collect()
    }

    fn last(&self) -> &Action {
        self.actions.last().expect("no action")
    }

    fn events(&self) -> Vec<&Event> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::Event(e) => Some(e),
                _ => None,
            })
            .collect()
    }
}

/// A coordinator that answers everything: the model of the round asked for, and every update.
fn helpful(ask: Ask, _: u64) -> Says {
    Says::Answer(match ask {
        Ask::Register | Ask::Update { .. } => Reply::Ack,
        Ask::Fetch { round } => Reply::Model { round, train: true },
    })
}

fn model(round: u64) -> Says {
    Says::Answer(Reply::Model { round, train: true })
}

#[test]
fn an_attached_run_registers_once_then_fetches_trains_and_sends_each_round() {
    let mut b = Bench::fresh(config(3));
    b.run(helpful);
    use Ask::*;
    assert_eq!(
        b.questions(),
        vec![
            Register,
            Fetch { round: 0 },
            Update { round: 0 },
            Fetch { round: 1 },
            Update { round: 1 },
            Fetch { round: 2 },
            Update { round: 2 },
            // The final model, after the last round.
            Fetch { round: 3 },
        ]
    );
    assert_eq!(b.trains(), vec![0, 1, 2]);
    let o = b.outcomes();
    assert_eq!(o.len(), 3);
    assert!(o.iter().all(|o| o.trained && o.acked && !o.alone));
    assert_eq!(
        o.iter().map(|o| o.global_round).collect::<Vec<_>>(),
        vec![Some(0), Some(1), Some(2)]
    );
    // Every 2 rounds, but the last is scored in the final line.
    assert_eq!(
        o.iter().map(|o| o.evaluate).collect::<Vec<_>>(),
        vec![false, true, false]
    );
    // Each update's marker is written before it goes.
    let marks: Vec<usize> = (0..b.actions.len())
        .filter(|&i| matches!(b.actions[i], Action::MarkSent(_)))
        .collect();
    assert_eq!(marks.len(), 3);
    for i in marks {
        assert!(matches!(
            b.actions[i + 1],
            Action::Ask {
                ask: Ask::Update { .. },
                ..
            }
        ));
    }
    assert_eq!(
        b.last(),
        &Action::Finish {
            final_round: Some(3)
        }
    );
    assert_eq!(
        (b.m.round(), b.m.trained(), b.m.last_global()),
        (3, 3, Some(3))
    );
}

#[test]
fn an_unreachable_coordinator_is_asked_every_retry_within_one_budget_per_round() {
    let mut b = Bench::fresh(config(2));
    b.run(|_, _| Says::Unreachable);
    // Round 1's questions: registering is asked every RETRY while another try fits in the
    // budget; the fetch gets what is left of it.
    let first: Vec<_> = b
        .asks
        .iter()
        .zip(&b.asked_in)
        .filter(|(_, r)| **r == 0)
        .map(|(a, _)| *a)
        .collect();
    assert_eq!(first.len(), 9);
    let (registers, fetch) = first.split_at(8);
    assert!(registers.iter().all(|(_, ask, _)| *ask == Ask::Register));
    for w in registers.windows(2) {
        assert_eq!(w[1].0 - w[0].0, RTT + RETRY);
    }
    let (last_at, _, _) = registers[7];
    assert!(last_at + RTT + RETRY >= BUDGET - RETRY, "gave up early");
    let (at, ask, within) = fetch[0];
    assert_eq!((ask, at + within), (Ask::Fetch { round: 0 }, BUDGET));
    // Every round trains detached, on its own schedule, and sends nothing.
    assert_eq!(b.trains(), vec![0, 1]);
    assert!(
        b.outcomes()
            .iter()
            .all(|o| o.global_round.is_none() && !o.acked)
    );
    assert!(
        !b.questions()
            .iter()
            .any(|a| matches!(a, Ask::Update { .. }))
    );
    // Registering again every round; the final fetch gets the longer budget.
    assert!(b.asked_in.contains(&1));
    let finals: Vec<_> = b
        .asks
        .iter()
        .filter(|a| a.1 == Ask::Fetch { round: 2 })
        .collect();
    assert_eq!(finals[0].2, BUDGET * 4);
    assert!(finals.len() > 8);
    assert_eq!(b.last(), &Action::Finish { final_round: None });
}

#[test]
fn a_silent_coordinator_costs_one_budget_per_round() {
    let mut b = Bench::fresh(config(2));
    b.run(|_, _| Says::Silent);
    // One registration per round, given the whole budget, and nothing left for the fetch.
    assert_eq!(
        b.asks
            .iter()
            .map(|a| (a.0, a.1, a.2))
            .take(2)
            .collect::<Vec<_>>(),
        vec![
            (Duration::ZERO, Ask::Register, BUDGET),
            (BUDGET + Duration::from_secs(1), Ask::Register, BUDGET),
        ]
    );
    assert_eq!(b.trains(), vec![0, 1]);
}

#[test]
fn after_fall_back_after_rounds_without_a_model_the_member_switches() {
    let mut cfg = config(10);
    cfg.fall_back_after = Some(3);
    // Round 3 gets a model: the streak starts again.
    let mut b = Bench::fresh(cfg.clone());
    b.run(|ask, done| match (ask, done) {
        (Ask::Fetch { round }, 2) => model(round),
        (Ask::Register | Ask::Update { .. }, 2) => Says::Answer(Reply::Ack),
        _ => Says::Unreachable,
    });
    assert_eq!(b.last(), &Action::FallBack { at: 6 });
    assert!(b.events().contains(&&Event::FallingBack {
        round: 6,
        without: 3
    }));
    // Never once reached: after three rounds.
    let mut b = Bench::fresh(cfg.clone());
    b.run(|_, _| Says::Unreachable);
    assert_eq!(b.last(), &Action::FallBack { at: 3 });
    assert!(b.m.is_over());
    // No fallback configured: detached to the end.
    cfg.fall_back_after = None;
    let mut b = Bench::fresh(cfg);
    b.run(|_, _| Says::Unreachable);
    assert_eq!(b.trains().len(), 10);
    assert_eq!(b.last(), &Action::Finish { final_round: None });
}

#[test]
fn a_member_that_had_switched_goes_on_as_federico_after_a_restart() {
    let mut cfg = config(10);
    cfg.fall_back_after = Some(3);
    let resume = Resume {
        round: 4,
        switched: true,
        ..Resume::default()
    };
    let mut b = Bench::new(cfg, resume);
    b.run(helpful);
    assert!(b.asks.is_empty());
    assert_eq!(b.actions, vec![Action::FallBack { at: 4 }]);
}

#[test]
fn a_refused_registration_is_final_for_the_round_and_the_fetch_still_goes() {
    let mut b = Bench::fresh(config(2));
    b.run(|ask, _| match ask {
        Ask::Register => Says::Answer(Reply::Refused("not in the run".into())),
        other => helpful(other, 0),
    });
    use Ask::*;
    assert_eq!(
        b.questions(),
        vec![
            Register,
            Fetch { round: 0 },
            Update { round: 0 },
            // Not registered: asked again the next round.
            Register,
            Fetch { round: 1 },
            Update { round: 1 },
            Fetch { round: 2 },
        ]
    );
    assert!(matches!(b.events()[0], Event::NotRegistered(r) if r == "not in the run"));
}

#[test]
fn a_refused_update_registers_again_and_resends_once() {
    // The coordinator restarted and lost the registration: the resent update counts.
    let mut refused = false;
    let mut b = Bench::fresh(config(1));
    b.run(|ask, _| match ask {
        Ask::Update { .. } if !refused => {
            refused = true;
            Says::Answer(Reply::Refused("not registered".into()))
        }
        other => helpful(other, 0),
    });
    use Ask::*;
    assert_eq!(
        b.questions(),
        vec![
            Register,
            Fetch { round: 0 },
            Update { round: 0 },
            Register,
            Update { round: 0 },
            Fetch { round: 1 },
        ]
    );
    assert!(b.outcomes()[0].acked);
    // Refused again: no third try, and the round ends unacknowledged.
    let mut b = Bench::fresh(config(1));
    b.run(|ask, _| match ask {
        Ask::Update { .. } => Says::Answer(Reply::Refused("no".into())),
        other => helpful(other, 0),
    });
    assert_eq!(
        b.questions()
            .iter()
            .filter(|a| matches!(a, Update { .. }))
            .count(),
        2
    );
    assert!(!b.outcomes()[0].acked);
    // Each try of the update has a whole budget (not what is left of the round's).
    assert!(
        b.asks
            .iter()
            .filter(|a| matches!(a.1, Update { .. } | Register))
            .skip(1)
            .all(|a| a.2 == BUDGET)
    );
}

#[test]
fn a_silo_left_out_of_the_run_trains_alone_and_never_asks_again() {
    let mut cfg = config(4);
    cfg.fall_back_after = Some(1);
    let mut b = Bench::fresh(cfg);
    b.run(|ask, _| match ask {
        Ask::Fetch { .. } => Says::Answer(Reply::Alone),
        other => helpful(other, 0),
    });
    assert_eq!(b.questions(), vec![Ask::Register, Ask::Fetch { round: 0 }]);
    assert_eq!(b.trains(), vec![0, 1, 2, 3]);
    assert!(
        b.outcomes()
            .iter()
            .all(|o| o.alone && o.global_round.is_none())
    );
    assert_eq!(b.events(), vec![&Event::Alone { round: 0 }]);
    // Alone is not "the coordinator is gone": no switch, and no final fetch.
    assert_eq!(b.last(), &Action::Finish { final_round: None });
}

#[test]
fn a_coordinator_past_its_last_round_ends_the_run() {
    // A silo that skipped rounds finds the coordinator done: it takes the model and finishes.
    let mut b = Bench::fresh(config(3));
    b.run(|ask, _| match ask {
        Ask::Fetch { .. } => model(7),
        other => helpful(other, 0),
    });
    assert!(b.trains().is_empty());
    assert!(b.actions.contains(&Action::Adopt { round: 7 }));
    assert_eq!(
        b.questions(),
        vec![
            Ask::Register,
            Ask::Fetch { round: 0 },
            Ask::Fetch { round: 3 }
        ]
    );
    assert_eq!(
        b.last(),
        &Action::Finish {
            final_round: Some(7)
        }
    );
}

#[test]
fn outside_the_cohort_a_silo_takes_the_model_and_neither_trains_nor_sends() {
    let mut b = Bench::fresh(config(2));
    b.run(|ask, _| match ask {
        Ask::Fetch { round: 0 } => Says::Answer(Reply::Model {
            round: 0,
            train: false,
        }),
        other => helpful(other, 0),
    });
    assert_eq!(b.trains(), vec![1]);
    let o = b.outcomes();
    assert_eq!(
        (o[0].global_round, o[0].trained, o[0].acked),
        (Some(0), false, false)
    );
    assert_eq!(
        (o[1].global_round, o[1].trained, o[1].acked),
        (Some(1), true, true)
    );
    assert_eq!(b.m.trained(), 1);
}

#[test]
fn a_detached_round_trains_on_its_own_schedule_and_the_next_reattaches() {
    let mut b = Bench::fresh(config(3));
    b.run(|ask, done| match (ask, done) {
        (Ask::Fetch { .. }, 1) => Says::Answer(Reply::Unusable("a model of 2 parameters".into())),
        (other, _) => helpful(other, 0),
    });
    use Ask::*;
    assert_eq!(
        b.questions(),
        vec![
            Register,
            Fetch { round: 0 },
            Update { round: 0 },
            Fetch { round: 1 },
            // Unusable: detached, and registered again next round.
            Register,
            Fetch { round: 1 },
            Update { round: 1 },
            Fetch { round: 3 },
        ]
    );
    // Round 2 (detached) trains on its own round's schedule; round 3 on global 1's.
    assert_eq!(b.trains(), vec![0, 1, 1]);
    assert_eq!(
        b.outcomes()
            .iter()
            .map(|o| o.global_round)
            .collect::<Vec<_>>(),
        vec![Some(0), None, Some(1)]
    );
    assert!(matches!(b.events()[0], Event::Detached { round: 1, .. }));
}

#[test]
fn a_kill_after_the_update_is_caught_up_once_its_round_closed() {
    // Checkpoint after 2 rounds (global 1, 2 trainings); the update of global 2 (training 3)
    // went out before the kill.
    let resume = || Resume {
        round: 2,
        last_global: Some(1),
        trained: 2,
        sent: Some(SentMark {
            round: 2,
            trained: 3,
        }),
        switched: false,
    };
    // The coordinator closed round 2 meanwhile (it serves round 3's model): the round behind
    // the marker counts, rebuilt, its training skipped.
    let mut b = Bench::new(config(5), resume());
    b.run(|ask, _| match ask {
        Ask::Fetch { round: 2 } => model(3),
        other => helpful(other, 0),
    });
    let i = b
        .actions
        .iter()
        .position(|a| matches!(a, Action::Recover { .. }))
        .expect("no recovery");
    assert_eq!(b.actions[i - 1], Action::Adopt { round: 3 });
    assert!(b.actions.contains(&Action::Recover {
        skip: 1,
        outcome: RoundOutcome {
            round: 3,
            global_round: Some(2),
            trained: true,
            acked: false,
            alone: false,
            recovered: true,
            evaluate: false,
        },
    }));
    assert_eq!(b.trains(), vec![3, 4]);
    assert_eq!((b.m.round(), b.m.trained()), (5, 5));
    // Round 2 still open: trained again on the same batches, nothing skipped.
    let mut b = Bench::new(config(5), resume());
    b.run(helpful);
    assert!(
        !b.actions
            .iter()
            .any(|a| matches!(a, Action::Recover { .. }))
    );
    assert_eq!(b.trains(), vec![2, 3, 4]);
    assert_eq!((b.m.round(), b.m.trained()), (5, 5));
}

#[test]
fn the_final_fetch_waits_up_to_its_longer_budget() {
    // The coordinator is away for two round budgets after the last round, then serves it.
    let mut b = Bench::fresh(config(1));
    let mut final_asks = 0;
    b.run(|ask, _| match ask {
        Ask::Fetch { round: 1 } => {
            final_asks += 1;
            if final_asks * (RTT + RETRY) < BUDGET * 2 {
                Says::Unreachable
            } else {
                model(1)
            }
        }
        other => helpful(other, 0),
    });
    assert_eq!(
        b.last(),
        &Action::Finish {
            final_round: Some(1)
        }
    );
    assert_eq!(b.m.last_global(), Some(1));
}

#[test]
fn the_catch_up_counts_an_update_only_once_its_round_closed() {
    let sent = Some(SentMark {
        round: 7,
        trained: 8,
    });
    // Checkpoint after global 6 (7 trainings), the coordinator closed round 7: skip one.
    assert_eq!(catch_up(sent, 7, 8, 7), 1);
    // Round 7 still open: train it again, on the same batches.
    assert_eq!(catch_up(sent, 7, 7, 7), 0);
    // The checkpoint already covers round 7 (the marker is old news).
    assert_eq!(catch_up(sent, 8, 9, 8), 0);
    assert_eq!(catch_up(None, 7, 8, 7), 0);
}

#[test]
fn a_reply_while_waiting_to_ask_again_is_ignored() {
    let mut m = Member::new(config(2), Resume::default());
    let mut clock = Clock::new();
    m.handle_start(clock.now());
    assert!(matches!(
        m.poll_action(),
        Some(Action::Ask {
            ask: Ask::Register,
            ..
        })
    ));
    clock.advance(RTT);
    m.handle_reply(clock.now(), Reply::Failed("unreachable".into()));
    assert_eq!(m.poll_timeout(), Some(clock.now() + RETRY));
    assert_eq!(m.poll_action(), None);
    // A stray answer (a duplicate, a late one): nothing changes.
    m.handle_reply(clock.now(), Reply::Ack);
    m.handle_trained(clock.now());
    m.handle_round_written(clock.now());
    assert_eq!(m.poll_action(), None);
    // An early timeout does nothing; the due one asks again.
    m.handle_timeout(clock.now());
    assert_eq!(m.poll_action(), None);
    clock.advance(RETRY);
    m.handle_timeout(clock.now());
    assert!(matches!(
        m.poll_action(),
        Some(Action::Ask {
            ask: Ask::Register,
            ..
        })
    ));
    assert_eq!(m.poll_timeout(), None);
}
