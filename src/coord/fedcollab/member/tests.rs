//! A FedCollab silo's run on a virtual clock: the coordinator is scripted (what it answers to
//! each question, and how long the answer takes), the pairs and every training take a fixed
//! time, and the member's pauses are served in order with a step bound
//! ([`crate::testkit::Clock`], shared with the other engines' tests).
//! Owns: the FedCollab member engine's rule tests and their fixtures.
//! Must not: hold code the engine uses.

use super::*;
use crate::testkit::Clock;

const FETCH: Duration = Duration::from_secs(4);
const STRUCTURE: Duration = Duration::from_secs(30);
const ATTACH: Duration = Duration::from_millis(500);
const RETRY: Duration = Duration::from_millis(200);
/// How long an answer (or a failed dial) takes.
const RTT: Duration = Duration::from_millis(10);
const PAIRS_FOR: Duration = Duration::from_secs(60);
const TRAIN_FOR: Duration = Duration::from_secs(1);
const GRACE: Duration = Duration::from_millis(300);

fn config(me: u32, rounds: u64) -> CollabMemberConfig {
    CollabMemberConfig {
        me,
        n_train: 100,
        rounds,
        fetch: FETCH,
        structure_wait: STRUCTURE,
        attach_wait: ATTACH,
        retry: RETRY,
        eval_every: 2,
        excuse_rounds: 0,
        excused_grace: GRACE,
    }
}

/// What the scripted coordinator does with one question.
enum Says {
    /// Answers after [`RTT`].
    Answer(Reply),
    /// Cannot be reached: the exchange fails after [`RTT`].
    Unreachable,
    /// Never answers: the exchange takes its whole budget.
    Silent,
}

/// A member, its clock, and everything it asked and did.
struct Bench {
    m: CollabMember,
    clock: Clock,
    start: Instant,
    /// Every question: when it was asked (since the start), and with how long it was given.
    asks: Vec<(Duration, Ask, Duration)>,
    actions: Vec<Action>,
    /// The members whose model arrives in each pull (all, when `None`).
    arrive: Option<Vec<u32>>,
    /// Members silent in a span of rounds (counted from 0).
    silent: Vec<(u32, std::ops::Range<u64>)>,
    /// Members whose model comes after this long (not [`RTT`]) in a span of rounds.
    late: Vec<(u32, std::ops::Range<u64>, Duration)>,
    /// Each pull's round and how long it took.
    pulls: Vec<(u64, Duration)>,
    /// The members each pull did not wait for.
    excused_in: Vec<Vec<u32>>,
    /// Of each question, the index of its action in `actions`.
    ask_index: Vec<usize>,
}

impl Bench {
    fn new(cfg: CollabMemberConfig, resume: Resume) -> Self {
        let clock = Clock::new();
        Self {
            m: CollabMember::new(cfg, resume),
            start: clock.now(),
            clock,
            asks: Vec::new(),
            actions: Vec::new(),
            arrive: None,
            silent: Vec::new(),
            late: Vec::new(),
            pulls: Vec::new(),
            excused_in: Vec::new(),
            ask_index: Vec::new(),
        }
    }

    fn fresh(cfg: CollabMemberConfig) -> Self {
        Self::new(cfg, Resume::default())
    }

    /// Runs the member to its end against `coord` (asked with the question and the rounds
    /// done).
    fn run(&mut self, mut coord: impl FnMut(Ask, u64) -> Says) {
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
            let now = |b: &mut Self, by: Duration| {
                b.clock.advance(by);
                b.clock.now()
            };
            match a {
                Action::Ask { ask, within } => {
                    self.ask_index.push(self.actions.len() - 1);
                    self.asks.push((self.clock.now() - self.start, ask, within));
                    let reply = match coord(ask, self.m.round()) {
                        Says::Answer(r) if RTT < within => {
                            self.clock.advance(RTT);
                            r
                        }
                        Says::Unreachable if RTT < within => {
                            self.clock.advance(RTT);
                            Reply::Other("unreachable".into())
                        }
                        _ => {
                            self.clock.advance(within);
                            Reply::TimedOut
                        }
                    };
                    self.m.handle_reply(self.clock.now(), reply);
                }
                Action::RunPairs { .. } => {
                    let t = now(self, PAIRS_FOR);
                    self.m.handle_pairs(t);
                }
                Action::Train { .. } => {
                    let t = now(self, TRAIN_FOR);
                    self.m.handle_trained(t);
                }
                Action::Pull {
                    round,
                    coalition,
                    within,
                } => self.pull(round, &coalition, within),
                Action::EndRound(_) => self.m.handle_round_written(self.clock.now()),
                Action::AwaitServed { .. } => {
                    let t = now(self, RTT);
                    self.m.handle_served(t);
                }
                _ => {}
            }
        }
        panic!("the member did not finish: a busy loop");
    }

    /// Carries out a pull: each other member's model comes after [`RTT`] (or its `late`
    /// delay) unless it is silent or later than `within`, when its pull fails at `within`;
    /// each is reported when due, the member's timeouts served in between, until the engine
    /// ends the pull.
    fn pull(&mut self, round: u64, coalition: &Coalition, within: Duration) {
        self.excused_in.push(self.m.not_awaited.clone());
        let started = self.clock.now();
        let me = self.m.cfg.me;
        let mut fates: Vec<(Duration, u32, bool)> = coalition
            .members
            .iter()
            .copied()
            .filter(|&m| m != me)
            .map(|m| {
                let silent = self.arrive.as_ref().is_some_and(|a| !a.contains(&m))
                    || self
                        .silent
                        .iter()
                        .any(|(s, r)| *s == m && r.contains(&round));
                let after = self
                    .late
                    .iter()
                    .find(|(s, r, _)| *s == m && r.contains(&round))
                    .map_or(RTT, |l| l.2);
                match silent || after >= within {
                    true => (within, m, false),
                    false => (after, m, true),
                }
            })
            .collect();
        fates.sort();
        let mut fates = fates.into_iter().peekable();
        for _ in 0..1000 {
            if self.m.pulling.is_none() {
                self.pulls.push((round, self.clock.now() - started));
                return;
            }
            let fate = fates.peek().map(|f| started + f.0);
            let next = fate.into_iter().chain(self.m.poll_timeout()).min();
            let next = next.expect("the pull waits for nothing");
            self.clock.advance_to(next);
            let t = self.clock.now();
            match fates.next_if(|_| fate == Some(next)) {
                Some((_, m, came)) => self.m.handle_model(t, m, came),
                None => self.m.handle_timeout(t),
            }
        }
        panic!("the pull did not end: a busy loop");
    }

    fn questions(&self) -> Vec<Ask> {
        self.asks.iter().map(|a| a.1).collect()
    }

    fn outcomes(&self) -> Vec<RoundOutcome> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::EndRound(o) => Some(o.clone()),
                _ => None,
            })
            .collect()
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

    fn count(&self, f: impl Fn(&Action) -> bool) -> usize {
        self.actions.iter().filter(|a| f(a)).count()
    }

    fn last(&self) -> &Action {
        self.actions.last().expect("no action")
    }
}

fn plan(members: &[u32]) -> Reply {
    Reply::Plan {
        target: 20.0,
        nodes: 4,
        members: members.to_vec(),
    }
}

fn coalition(members: &[u32]) -> Reply {
    Reply::Coalition {
        sizes: vec![100; members.len()],
        members: members.to_vec(),
    }
}

/// A coordinator that answers everything: silo 1's coalition is {0, 1}.
fn helpful(ask: Ask, _: u64) -> Says {
    Says::Answer(match ask {
        Ask::Join | Ask::Distances => Reply::Ack,
        Ask::Plan => plan(&[0, 1, 2, 3]),
        Ask::Coalition => coalition(&[0, 1]),
    })
}

#[test]
fn a_fresh_silo_joins_runs_its_pairs_reports_and_trains_in_its_coalition() {
    let mut b = Bench::fresh(config(1, 4));
    b.run(helpful);
    assert_eq!(
        b.questions(),
        vec![Ask::Join, Ask::Plan, Ask::Distances, Ask::Coalition]
    );
    assert!(b.actions.contains(&Action::RunPairs {
        target: 20.0,
        planned: vec![0, 1, 2, 3],
    }));
    let c = Coalition {
        members: vec![0, 1],
        sizes: vec![100, 100],
    };
    assert!(b.actions.contains(&Action::Adopt(c.clone())));
    // Every round trains, then pulls the coalition's models within `fetch`, waiting for all.
    let pulls: Vec<_> = b
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Pull {
                round,
                coalition,
                within,
            } => Some((*round, coalition.clone(), *within)),
            _ => None,
        })
        .collect();
    assert!(b.excused_in.iter().all(|e| e.is_empty()));
    assert_eq!(
        pulls,
        (0..4).map(|r| (r, c.clone(), FETCH)).collect::<Vec<_>>()
    );
    let o = b.outcomes();
    assert_eq!(
        o.iter().map(|o| o.round).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert!(
        o.iter()
            .all(|o| o.attached && o.complete && o.averaged == [0, 1])
    );
    // Every second round is scored, the last in the final line instead.
    let scored: Vec<bool> = o.iter().map(|o| o.evaluate).collect();
    assert_eq!(scored, vec![false, true, false, false]);
    // The last model waits for the other member's pull, then the end.
    let n = b.actions.len();
    assert_eq!(
        b.actions[n - 2],
        Action::AwaitServed {
            round: 3,
            others: 1,
            within: FETCH,
        }
    );
    assert_eq!(b.last(), &Action::Finish);
    // The distances and the coalition are checkpointed before the rounds start.
    let first_train = b
        .actions
        .iter()
        .position(|a| matches!(a, Action::Train { .. }))
        .unwrap();
    let saves = b.actions[..first_train]
        .iter()
        .filter(|a| **a == Action::Save)
        .count();
    assert_eq!(saves, 2, "{:?}", &b.actions[..first_train]);
}

#[test]
fn a_refused_join_or_a_bad_plan_stops_the_run_naming_why() {
    let mut b = Bench::fresh(config(1, 4));
    b.run(|ask, _| match ask {
        Ask::Join => Says::Answer(Reply::Refused("not in the manifest".into())),
        _ => panic!("asked {ask:?} after a refused join"),
    });
    assert!(
        matches!(b.last(), Action::Fail(w) if w.contains("refused this silo: not in the manifest"))
    );

    let bad = [
        plan(&[0]),
        plan(&[2, 1]),
        plan(&[0, 9]),
        Reply::Plan {
            target: f64::NAN,
            nodes: 4,
            members: vec![0, 1],
        },
    ];
    for p in bad {
        let mut b = Bench::fresh(config(1, 4));
        let sent = format!("{p:?}");
        b.run(|ask, _| match ask {
            Ask::Join => Says::Answer(Reply::Ack),
            Ask::Plan => Says::Answer(p.clone()),
            _ => panic!("asked {ask:?} after a bad plan"),
        });
        assert!(
            matches!(b.last(), Action::Fail(w) if w.contains("bad plan")),
            "{sent}: {:?}",
            b.last()
        );
        assert_eq!(b.count(|a| matches!(a, Action::RunPairs { .. })), 0);
    }
    // A silo whose index the coordinator's run does not have.
    let mut b = Bench::fresh(config(7, 4));
    b.run(helpful);
    assert!(
        matches!(b.last(), Action::Fail(w) if w.contains("index 7")),
        "{:?}",
        b.last()
    );
}

#[test]
fn a_silo_left_out_of_the_plan_trains_alone_without_pairs_or_asking_again() {
    let mut b = Bench::fresh(config(3, 3));
    b.run(|ask, _| match ask {
        Ask::Plan => Says::Answer(plan(&[0, 1, 2])),
        _ => helpful(ask, 0),
    });
    assert_eq!(b.questions(), vec![Ask::Join, Ask::Plan]);
    assert!(b.events().contains(&&Event::NotPlanned {
        planned: vec![0, 1, 2]
    }));
    assert!(b.actions.contains(&Action::Adopt(Coalition {
        members: vec![3],
        sizes: vec![100],
    })));
    assert_eq!(b.count(|a| matches!(a, Action::RunPairs { .. })), 0);
    assert!(
        b.outcomes()
            .iter()
            .all(|o| o.attached && o.averaged == [3] && o.complete)
    );
    // Nobody else will pull its last model: no wait.
    assert_eq!(b.count(|a| matches!(a, Action::AwaitServed { .. })), 0);
    assert_eq!(b.last(), &Action::Finish);
}

#[test]
fn a_held_plan_is_asked_again_and_a_refused_one_joins_again() {
    let mut b = Bench::fresh(config(1, 1));
    let mut plans = 0;
    b.run(|ask, _| match ask {
        Ask::Plan => {
            plans += 1;
            match plans {
                // Held until every silo joined: the exchange times out twice.
                1 | 2 => Says::Silent,
                // The coordinator restarted and lost the join.
                3 => Says::Answer(Reply::Refused("unknown silo".into())),
                _ => helpful(ask, 0),
            }
        }
        _ => helpful(ask, 0),
    });
    use Ask::*;
    assert_eq!(
        b.questions(),
        vec![Join, Plan, Plan, Plan, Join, Plan, Distances, Coalition]
    );
    // Each held plan took its whole budget, and was asked again at once.
    let t: Vec<Duration> = b.asks.iter().map(|a| a.0).collect();
    assert_eq!(t[2] - t[1], FETCH);
    assert_eq!(t[3] - t[2], FETCH);
    assert!(
        b.events()
            .contains(&&Event::PlanRefused("unknown silo".into()))
    );
}

#[test]
fn an_unreachable_coordinator_is_asked_again_after_a_pause_not_in_a_busy_loop() {
    let mut b = Bench::fresh(config(1, 1));
    let mut joins = 0;
    b.run(|ask, _| match ask {
        Ask::Join if joins < 5 => {
            joins += 1;
            Says::Unreachable
        }
        _ => helpful(ask, 0),
    });
    let t: Vec<Duration> = b.asks.iter().map(|a| a.0).collect();
    for w in t[..6].windows(2) {
        assert_eq!(w[1] - w[0], RTT + RETRY, "{t:?}");
    }
    assert_eq!(b.outcomes().len(), 1);
}

#[test]
fn without_a_structure_in_time_rounds_train_alone_and_join_the_coalition_once_it_comes() {
    let mut b = Bench::fresh(config(1, 5));
    // The coordinator solves only after the silo's third round.
    b.run(|ask, round| match ask {
        Ask::Coalition if round < 3 => Says::Silent,
        _ => helpful(ask, round),
    });
    let o = b.outcomes();
    assert_eq!(
        o.iter().map(|o| o.attached).collect::<Vec<_>>(),
        vec![false, false, false, true, true]
    );
    assert!(o[..3].iter().all(|o| o.averaged == [1]));
    assert!(o[3..].iter().all(|o| o.averaged == [0, 1]));
    // The first wait is the structure's, each later one the round's short one; no ask runs
    // past its wait.
    let coalition_asks: Vec<_> = b
        .asks
        .iter()
        .filter(|a| a.1 == Ask::Coalition)
        .map(|a| a.2)
        .collect();
    assert_eq!(coalition_asks.len(), 5, "{coalition_asks:?}");
    assert!(coalition_asks[0] <= STRUCTURE && coalition_asks[0] > STRUCTURE - RTT * 2);
    assert!(coalition_asks[1..].iter().all(|&w| w == ATTACH));
    assert_eq!(
        b.events()
            .iter()
            .filter(|e| ***e == Event::NoStructure)
            .count(),
        4,
        "the structure's wait and rounds 0 to 2"
    );
    // The distances were reported once: each round asks only for the coalition.
    assert_eq!(
        b.questions()
            .iter()
            .filter(|&&q| q == Ask::Distances)
            .count(),
        1
    );
}

#[test]
fn refused_distances_join_again_and_report_again_within_the_wait() {
    let mut b = Bench::fresh(config(1, 1));
    let mut reports = 0;
    b.run(|ask, _| match ask {
        Ask::Distances => {
            reports += 1;
            if reports == 1 {
                Says::Answer(Reply::Refused("unknown silo".into()))
            } else {
                Says::Answer(Reply::Ack)
            }
        }
        _ => helpful(ask, 0),
    });
    use Ask::*;
    assert_eq!(
        b.questions(),
        vec![Join, Plan, Distances, Join, Distances, Coalition]
    );
    // Joined again, then a pause before the report.
    let t: Vec<Duration> = b.asks.iter().map(|a| a.0).collect();
    assert_eq!(t[4] - t[3], RTT + RETRY);
    assert!(b.outcomes()[0].attached);
}

#[test]
fn a_refused_coalition_reports_again_and_a_malformed_one_is_ignored() {
    let mut b = Bench::fresh(config(1, 1));
    let mut fetches = 0;
    b.run(|ask, _| match ask {
        Ask::Coalition => {
            fetches += 1;
            if fetches == 1 {
                Says::Answer(Reply::Refused("no report from silo 1".into()))
            } else {
                helpful(ask, 0)
            }
        }
        _ => helpful(ask, 0),
    });
    use Ask::*;
    assert_eq!(
        b.questions(),
        vec![Join, Plan, Distances, Coalition, Distances, Coalition]
    );
    assert!(b.outcomes()[0].attached);

    for bad in [
        coalition(&[0, 2]),
        coalition(&[1, 0]),
        Reply::Coalition {
            members: vec![0, 1],
            sizes: vec![100, 0],
        },
    ] {
        let mut b = Bench::fresh(config(1, 2));
        b.run(|ask, _| match ask {
            Ask::Coalition => Says::Answer(bad.clone()),
            _ => helpful(ask, 0),
        });
        assert_eq!(b.count(|a| matches!(a, Action::Adopt(_))), 0, "{bad:?}");
        assert!(
            b.outcomes()
                .iter()
                .all(|o| !o.attached && o.averaged == [1])
        );
        assert!(
            b.events()
                .iter()
                .any(|e| matches!(e, Event::MalformedCoalition { .. })),
            "{bad:?}"
        );
        // Ignored, not cut: no "no structure" for it.
        assert!(!b.events().contains(&&Event::NoStructure));
    }
}

#[test]
fn an_attach_gives_up_when_a_pause_would_not_fit_in_the_wait() {
    let mut b = Bench::fresh(config(1, 2));
    // The distances never go through: every report fails at once.
    b.run(|ask, _| match ask {
        Ask::Distances => Says::Unreachable,
        _ => helpful(ask, 0),
    });
    let start_pairs = PAIRS_FOR + RTT * 2;
    // The structure's wait: between the save of the distances and the save before the rounds.
    let saves: Vec<usize> = (0..b.actions.len())
        .filter(|&i| b.actions[i] == Action::Save)
        .collect();
    let first_wait: Vec<_> = b
        .asks
        .iter()
        .zip(&b.ask_index)
        .filter(|(_, i)| (saves[0]..saves[1]).contains(i))
        .map(|(a, _)| a)
        .collect();
    assert!(first_wait.iter().all(|a| a.1 == Ask::Distances));
    assert!(first_wait.len() > 100, "asked {} times", first_wait.len());
    assert!(
        first_wait
            .iter()
            .all(|a| a.0 + a.2 <= start_pairs + STRUCTURE)
    );
    assert!(b.outcomes().iter().all(|o| !o.attached));
    assert_eq!(
        b.events()
            .iter()
            .filter(|e| ***e == Event::NoStructure)
            .count(),
        3,
        "the first wait and each round's"
    );
}

#[test]
fn a_resumed_silo_skips_the_phases_its_checkpoint_holds() {
    // Holding its coalition: no question at all, and its last model offered again first.
    let resume = Resume {
        round: 2,
        reported: true,
        coalition: Some(Coalition {
            members: vec![0, 1],
            sizes: vec![100, 100],
        }),
        last_local: true,
    };
    let mut b = Bench::new(config(1, 4), resume);
    b.run(|ask, _| panic!("asked {ask:?} though the coalition is known"));
    assert_eq!(b.actions[0], Action::Republish);
    assert_eq!(
        b.outcomes().iter().map(|o| o.round).collect::<Vec<_>>(),
        vec![3, 4]
    );
    assert!(matches!(b.actions[1], Action::Train { round: 2 }));

    // Holding its distances only: report them, no join and no pairs.
    let resume = Resume {
        reported: true,
        ..Resume::default()
    };
    let mut b = Bench::new(config(1, 1), resume);
    b.run(helpful);
    assert_eq!(b.questions(), vec![Ask::Distances, Ask::Coalition]);
    assert_eq!(b.count(|a| matches!(a, Action::RunPairs { .. })), 0);
    assert_eq!(b.count(|a| *a == Action::Republish), 0);
}

#[test]
fn a_member_whose_model_did_not_arrive_is_left_out_of_the_round() {
    let mut b = Bench::fresh(config(1, 2));
    b.run(|ask, _| match ask {
        Ask::Coalition => Says::Answer(coalition(&[0, 1, 2])),
        _ => helpful(ask, 0),
    });
    assert!(b.outcomes().iter().all(|o| o.complete));
    let mut b = Bench::fresh(config(1, 2));
    b.arrive = Some(vec![2]);
    b.run(|ask, _| match ask {
        Ask::Coalition => Says::Answer(coalition(&[0, 1, 2])),
        _ => helpful(ask, 0),
    });
    assert!(
        b.outcomes()
            .iter()
            .all(|o| !o.complete && o.averaged == [1, 2] && o.attached)
    );
    assert!(matches!(
        b.actions[b.actions.len() - 2],
        Action::AwaitServed { others: 2, .. }
    ));
}

#[test]
fn replies_and_reports_that_come_for_no_question_are_ignored() {
    let mut m = CollabMember::new(config(1, 2), Resume::default());
    let clock = Clock::new();
    // Not started: nothing happens.
    m.handle_reply(clock.now(), Reply::Ack);
    m.handle_trained(clock.now());
    m.handle_model(clock.now(), 0, true);
    m.handle_pairs(clock.now());
    assert_eq!(m.poll_action(), None);
    m.handle_start(clock.now());
    assert_eq!(
        m.poll_action(),
        Some(Action::Ask {
            ask: Ask::Join,
            within: FETCH,
        })
    );
    // A second start, a stray training or pull report: ignored.
    m.handle_start(clock.now());
    m.handle_trained(clock.now());
    m.handle_round_written(clock.now());
    assert_eq!(m.poll_action(), None);
    assert_eq!(m.round(), 0);
}

/// Attack (insiders' review, the FedCollab form of D5): a coalition member that stays silent
/// would make every round of its coalition wait the whole `fetch`. The excuse rule makes it cost
/// one `fetch` per excuse, ever fewer; its model still counts whenever it comes.
#[test]
fn a_silent_coalition_member_costs_one_fetch_per_excuse_not_one_per_round() {
    let run = |excuse_rounds: u64| {
        let mut b = Bench::fresh(CollabMemberConfig {
            excuse_rounds,
            ..config(1, 40)
        });
        b.silent = vec![(0, 4..u64::MAX)];
        b.run(|ask, _| match ask {
            Ask::Coalition => Says::Answer(coalition(&[0, 1, 2])),
            _ => helpful(ask, 0),
        });
        assert_eq!(b.m.round(), 40);
        b
    };
    let waited = |b: &Bench| -> Vec<u64> {
        b.pulls
            .iter()
            .filter(|(_, took)| *took == FETCH)
            .map(|(r, _)| *r)
            .collect()
    };
    // Without the rule: every round from the 5th on waits the whole fetch.
    assert_eq!(waited(&run(0)), (4..40).collect::<Vec<_>>());
    // With excuses of 5, 10, 20 rounds: rounds 4, 10 and 21 wait, no other.
    let b = run(5);
    assert_eq!(waited(&b), vec![4, 10, 21]);
    let excused: Vec<(u32, u64, u64, u32)> = b
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Excused {
                member,
                round,
                until,
                strikes,
            } => Some((*member, *round, *until, *strikes)),
            _ => None,
        })
        .collect();
    assert_eq!(excused, vec![(0, 4, 10, 1), (0, 10, 21, 2), (0, 21, 42, 3)]);
    // An excused member is still pulled; the rounds it is excused in wait only the grace.
    let graced = b.pulls.iter().filter(|(_, t)| *t == GRACE).count();
    assert_eq!(graced, 40 - 4 - 3);
    assert!(b.outcomes()[5..].iter().all(|o| o.averaged == [1, 2]));
    // The grace is two normal pulls when that is more than its floor.
    let mut b = Bench::fresh(CollabMemberConfig {
        excuse_rounds: 5,
        excused_grace: Duration::from_millis(1),
        ..config(1, 10)
    });
    b.silent = vec![(0, 4..u64::MAX)];
    b.run(|ask, _| match ask {
        Ask::Coalition => Says::Answer(coalition(&[0, 1, 2])),
        _ => helpful(ask, 0),
    });
    let graced: Vec<Duration> = b.pulls[5..].iter().map(|p| p.1).collect();
    assert_eq!(graced, vec![RTT * 2; 5]);
}

#[test]
fn an_excused_members_model_counts_when_it_comes_and_a_cut_off_silo_excuses_nobody() {
    // Member 0 misses round 2 only: excused in rounds 3 to 7, still pulled and averaged there.
    let mut b = Bench::fresh(CollabMemberConfig {
        excuse_rounds: 5,
        ..config(1, 10)
    });
    b.silent = vec![(0, 2..3)];
    b.run(|ask, _| match ask {
        Ask::Coalition => Says::Answer(coalition(&[0, 1, 2])),
        _ => helpful(ask, 0),
    });
    let excused_in = b.excused_in.clone();
    let none: Vec<u32> = Vec::new();
    let expected: Vec<Vec<u32>> = (0..10)
        .map(|r| {
            if (3..8).contains(&r) {
                vec![0]
            } else {
                none.clone()
            }
        })
        .collect();
    assert_eq!(excused_in, expected);
    let averaged: Vec<Vec<u32>> = b.outcomes().into_iter().map(|o| o.averaged).collect();
    assert_eq!(averaged[2], [1, 2]);
    assert!(
        averaged
            .iter()
            .enumerate()
            .all(|(r, a)| r == 2 || *a == [0, 1, 2])
    );
    // This silo is the one cut off (both others missing, one model in hand): nobody is
    // excused, every round still waits for both.
    let mut b = Bench::fresh(CollabMemberConfig {
        excuse_rounds: 5,
        ..config(1, 6)
    });
    b.arrive = Some(vec![]);
    b.run(|ask, _| match ask {
        Ask::Coalition => Says::Answer(coalition(&[0, 1, 2])),
        _ => helpful(ask, 0),
    });
    assert!(
        !b.events()
            .iter()
            .any(|e| matches!(e, Event::Excused { .. }))
    );
    assert!(b.pulls.iter().all(|(_, t)| *t == FETCH));
}

/// The excused-pull rule, on the engine's clock: an excused member's model counts when it
/// comes within its grace or while an awaited member is still being pulled; otherwise the pull
/// ends at the grace without it, and the model that comes later is dropped.
#[test]
fn an_excused_members_model_counts_within_its_grace_or_while_the_others_are_pulled() {
    // Member 0 misses round 2: excused in rounds 3 to 7 (the grace is its 300 ms floor).
    let run = |late: Vec<(u32, std::ops::Range<u64>, Duration)>| {
        let mut b = Bench::fresh(CollabMemberConfig {
            excuse_rounds: 5,
            ..config(1, 8)
        });
        b.silent = vec![(0, 2..3)];
        b.late = late;
        b.run(|ask, _| match ask {
            Ask::Coalition => Says::Answer(coalition(&[0, 1, 2])),
            _ => helpful(ask, 0),
        });
        assert_eq!(b.excused_in[3], [0]);
        let o = b.outcomes();
        (o[3].averaged.clone(), b.pulls[3].1, b.actions.clone())
    };
    let ms = Duration::from_millis;
    // Within the grace: it counts, and the pull ends when it comes.
    let (averaged, took, _) = run(vec![(0, 3..4, ms(200))]);
    assert_eq!((averaged, took), (vec![0, 1, 2], ms(200)));
    // After the grace, with nobody else outstanding: the pull ends at the grace without it.
    let (averaged, took, actions) = run(vec![(0, 3..4, ms(500))]);
    assert_eq!((averaged, took), (vec![1, 2], GRACE));
    assert!(actions.contains(&Action::Average {
        round: 3,
        coalition: Coalition {
            members: vec![0, 1, 2],
            sizes: vec![100; 3],
        },
        averaged: vec![1, 2],
    }));
    // After the grace, but while awaited member 2 is still pulled: it counts.
    let (averaged, took, _) = run(vec![(0, 3..4, ms(500)), (2, 3..4, ms(900))]);
    assert_eq!((averaged, took), (vec![0, 1, 2], ms(900)));
    // After both: the pull ends when member 2's model comes, without member 0's.
    let (averaged, took, _) = run(vec![(0, 3..4, ms(1500)), (2, 3..4, ms(900))]);
    assert_eq!((averaged, took), (vec![1, 2], ms(900)));
}

#[test]
fn a_model_reported_twice_or_by_a_stranger_changes_nothing() {
    let mut m = CollabMember::new(
        config(1, 2),
        Resume {
            round: 0,
            reported: true,
            coalition: Some(Coalition {
                members: vec![0, 1, 2],
                sizes: vec![100; 3],
            }),
            last_local: false,
        },
    );
    let clock = Clock::new();
    m.handle_start(clock.now());
    assert_eq!(m.poll_action(), Some(Action::Train { round: 0 }));
    m.handle_trained(clock.now());
    assert!(matches!(
        m.poll_action(),
        Some(Action::Pull { round: 0, .. })
    ));
    // A stranger, and member 0 twice (a failure after its model came): still waiting for 2.
    m.handle_model(clock.now(), 7, true);
    m.handle_model(clock.now(), 0, true);
    m.handle_model(clock.now(), 0, false);
    assert_eq!(m.poll_action(), None);
    m.handle_model(clock.now(), 2, false);
    assert!(matches!(
        m.poll_action(),
        Some(Action::Average { round: 0, averaged, .. }) if averaged == [0, 1]
    ));
}
