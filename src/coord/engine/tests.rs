//! The coordinator's round engine on a virtual clock: members are scripted (who sends what,
//! when), the clock only moves when a test moves it, and every timeout the engine asks for is
//! served in order with a step bound ([`crate::testkit::Clock`], shared with the FedeRiCo
//! round's tests).
//! Owns: the engine's rule tests and their fixtures.
//! Must not: hold code the engine uses.

use super::*;
use crate::coord::fedcollab::FedCollabConfig;
use crate::coord::fedcollab_server::FedCollabServer;
use crate::coord::feddisco::Params;
use crate::coord::feddisco_server::ServerState;
use crate::coord::fedsac_server::{FedsacServer, Settings};
use crate::coord::hcct::{Alpha, HcctConfig};
use crate::coord::hcct_server::HcctServer;
use crate::testkit::Clock;
use std::collections::BTreeMap;

const TAU: Duration = Duration::from_secs(10);
const LINGER: Duration = Duration::from_secs(5);
const MS: Duration = Duration::from_millis(1);
const LEN: usize = 3;

/// A ticket: the request's number.
type Ticket = u32;

/// One engine, its clock and everything it did.
struct Bench {
    engine: Engine<Ticket>,
    clock: Clock,
    next: Ticket,
    answers: BTreeMap<Ticket, Answer>,
    lines: Vec<RoundLine>,
    events: Vec<Event>,
    /// The actions in order, by kind ("respond", "save", "log", "solved", "event", "finished").
    kinds: Vec<&'static str>,
    finished: bool,
}

fn config(rounds: u64, names: usize) -> EngineConfig {
    EngineConfig {
        rounds,
        nodes: 0,
        round_deadline: TAU,
        join_deadline: None,
        linger: LINGER,
        excuse_rounds: 10,
        names: (0..names).map(name).collect(),
    }
}

fn name(i: usize) -> String {
    format!("peer-{i}")
}

fn disco() -> Box<dyn CoordAlgorithm> {
    Box::new(Disco {
        state: ServerState::new(vec![0.0; LEN]),
        params: Params::default(),
        robust: crate::coord::feddisco::Robust::NONE,
    })
}

fn hcct(nodes: usize, rounds: u64) -> Box<dyn CoordAlgorithm> {
    let cfg = HcctConfig {
        alpha: Alpha::Constant(0.0),
        ..HcctConfig::default()
    };
    Box::new(HcctServer::new(cfg, nodes, rounds, vec![0.0; LEN]).unwrap())
}

fn fedsac(nodes: usize, rounds: u64, cohort: usize) -> Box<dyn CoordAlgorithm> {
    let settings = Settings {
        alpha: 0.9,
        beta: 1.4,
        alpha_cutoff: 0.7,
        principal_angles: crate::coord::fedsac::PrincipalAngles::Standard,
        cohort_size: cohort,
        score_trained: false,
        size_cap: None,
        update_clip: None,
        aggregator: crate::coord::robust::Aggregator::Mean,
        trim: crate::coord::robust::DEFAULT_TRIM,
    };
    Box::new(FedsacServer::new(settings, nodes, rounds, 7, vec![0.0; LEN]).unwrap())
}

impl Bench {
    fn new(alg: Box<dyn CoordAlgorithm>, cfg: EngineConfig) -> Self {
        let clock = Clock::new();
        let mut engine = Engine::new(alg, cfg);
        engine.handle_start(clock.now()).unwrap();
        let mut b = Self {
            engine,
            clock,
            next: 0,
            answers: BTreeMap::new(),
            lines: Vec::new(),
            events: Vec::new(),
            kinds: Vec::new(),
            finished: false,
        };
        b.drain();
        b
    }

    fn drain(&mut self) {
        while let Some(a) = self.engine.poll_action() {
            let kind = match a {
                Action::Respond { ticket, answer } => {
                    assert!(
                        self.answers.insert(ticket, answer).is_none(),
                        "request {ticket} answered twice"
                    );
                    "respond"
                }
                Action::Save { bytes, .. } => {
                    bytes.unwrap();
                    "save"
                }
                Action::LogRound(l) => {
                    self.lines.push(l);
                    "log"
                }
                Action::Solved(_) => "solved",
                Action::Event(e) => {
                    self.events.push(e);
                    "event"
                }
                Action::Finished => {
                    self.finished = true;
                    "finished"
                }
            };
            self.kinds.push(kind);
        }
    }

    /// Member `i` (named [`name`]`(i)`, silo index `i`) sends `req` now; its ticket.
    fn send(&mut self, i: usize, req: Request) -> Ticket {
        let t = self.next;
        self.next += 1;
        self.engine
            .handle_request(self.clock.now(), &name(i), Some(i), req, t)
            .unwrap();
        self.drain();
        t
    }

    fn answer(&self, t: Ticket) -> Option<&Answer> {
        self.answers.get(&t)
    }

    fn register(&mut self, i: usize) {
        let t = self.send(
            i,
            Request::Register {
                n_train: 10 * (i as u64 + 1),
                discrepancy: 0.1,
            },
        );
        assert_eq!(self.answer(t), Some(&Answer::Ack));
    }

    fn join(&mut self, i: usize) {
        let t = self.send(
            i,
            Request::Join {
                n_train: 10 * (i as u64 + 1),
            },
        );
        assert_eq!(self.answer(t), Some(&Answer::Ack));
    }

    fn update(&mut self, i: usize, round: u64) -> Ticket {
        self.send(
            i,
            Request::Update {
                round,
                params: Arc::new(vec![i as f32; LEN]),
            },
        )
    }

    /// Moves the clock by `d`, serving every timeout due on the way, in order.
    fn wait(&mut self, d: Duration) {
        let until = self.clock.now() + d;
        let mut clock = self.clock;
        clock.run_until(
            until,
            self,
            |b| b.engine.poll_timeout(),
            |b, now| {
                b.clock = Clock::at(now);
                b.engine.handle_timeout(now).unwrap();
                b.drain();
            },
        );
        self.clock = clock;
    }

    fn timed_out(&self) -> Vec<bool> {
        self.lines
            .iter()
            .map(|l| l.record["timed_out"].as_bool().unwrap())
            .collect()
    }

    fn excused_events(&self) -> Vec<(String, u64, u64)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Excused {
                    who, round, until, ..
                } => Some((who.clone(), *round, *until)),
                _ => None,
            })
            .collect()
    }
}

/// Members `0..n` registered with FedDisco.
fn disco_bench(n: usize, rounds: u64, cfg: impl FnOnce(&mut EngineConfig)) -> Bench {
    let mut c = config(rounds, n);
    cfg(&mut c);
    let mut b = Bench::new(disco(), c);
    for i in 0..n {
        b.register(i);
    }
    b
}

/// Every member of `senders` sends its update of the open round, 1 ms apart.
fn round_of(b: &mut Bench, senders: &[usize]) {
    let r = b.engine.round();
    for &i in senders {
        b.wait(MS);
        let t = b.update(i, r);
        assert_eq!(b.answer(t), Some(&Answer::Ack), "member {i}, round {r}");
    }
}

#[test]
fn the_clock_does_not_run_before_anyone_registered() {
    let b = Bench::new(disco(), config(3, 2));
    assert_eq!(b.engine.poll_timeout(), None);
}

#[test]
fn a_round_closes_as_soon_as_every_registered_node_sent() {
    let mut b = disco_bench(3, 5, |_| {});
    round_of(&mut b, &[0, 1, 2]);
    assert_eq!(b.engine.round(), 1);
    assert_eq!(b.timed_out(), [false]);
    assert!(
        (b.lines[0].elapsed_s - 0.003).abs() < 1e-9,
        "{}",
        b.lines[0].elapsed_s
    );
    assert!(b.lines[0].excused.is_empty());
}

#[test]
fn a_round_closes_at_its_deadline_with_whoever_sent() {
    let mut b = disco_bench(3, 5, |_| {});
    round_of(&mut b, &[0, 1]);
    b.wait(TAU - 3 * MS);
    assert_eq!(b.engine.round(), 0, "not before τ");
    b.wait(MS);
    assert_eq!(b.engine.round(), 1);
    assert_eq!(b.timed_out(), [true]);
    assert_eq!(
        b.lines[0].record["peers"],
        serde_json::json!(["peer-0", "peer-1"])
    );
}

#[test]
fn feddisco_closes_early_only_once_nodes_registered() {
    let mut b = disco_bench(2, 5, |c| c.nodes = 3);
    round_of(&mut b, &[0, 1]);
    assert_eq!(b.engine.round(), 0, "a third node is expected");
    b.wait(TAU);
    assert_eq!(b.timed_out(), [true]);
}

#[test]
fn a_fetch_of_a_round_that_does_not_exist_is_held_until_it_closes() {
    let mut b = disco_bench(2, 5, |_| {});
    let t = b.send(0, Request::Fetch { round: 1 });
    assert_eq!(b.answer(t), None, "held");
    round_of(&mut b, &[0, 1]);
    match b.answer(t) {
        Some(Answer::Global { round: 1, params }) => {
            assert_eq!(params.len(), LEN)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_fetch_of_an_old_round_gets_the_newest_global() {
    let mut b = disco_bench(2, 5, |_| {});
    round_of(&mut b, &[0, 1]);
    round_of(&mut b, &[0, 1]);
    let t = b.send(1, Request::Fetch { round: 0 });
    assert!(matches!(b.answer(t), Some(Answer::Global { round: 2, .. })));
}

#[test]
fn an_update_for_another_round_is_refused_and_the_round_still_waits() {
    let mut b = disco_bench(2, 5, |_| {});
    round_of(&mut b, &[0]);
    let t = b.update(1, 7);
    assert!(matches!(b.answer(t), Some(Answer::Error { .. })));
    assert!(b.events.iter().any(|e| matches!(
        e,
        Event::Refused {
            what: "an update",
            ..
        }
    )));
    assert_eq!(
        b.engine.round(),
        0,
        "a refused update does not complete a round"
    );
    let t = b.update(1, 0);
    assert_eq!(b.answer(t), Some(&Answer::Ack));
    assert_eq!(b.engine.round(), 1);
}

#[test]
fn an_update_from_a_node_that_never_registered_is_refused() {
    let mut b = disco_bench(1, 5, |_| {});
    let t = b.update(5, 0);
    assert!(matches!(b.answer(t), Some(Answer::Error { .. })));
    assert_eq!(b.engine.round(), 0);
}

#[test]
fn the_round_line_comes_before_the_checkpoint_that_follows_it() {
    let mut b = disco_bench(2, 5, |_| {});
    b.kinds.clear();
    round_of(&mut b, &[0, 1]);
    let log = b.kinds.iter().position(|k| *k == "log").unwrap();
    assert_eq!(b.kinds[log + 1], "save", "{:?}", b.kinds);
    // A registration is saved too.
    b.kinds.clear();
    b.register(1);
    assert!(b.kinds.contains(&"save"));
}

#[test]
fn after_the_last_round_updates_are_refused_and_the_run_lingers_then_ends() {
    let mut b = disco_bench(2, 2, |_| {});
    round_of(&mut b, &[0, 1]);
    round_of(&mut b, &[0, 1]);
    assert!(b.events.contains(&Event::AllRoundsDone));
    let t = b.update(0, 2);
    assert!(matches!(b.answer(t), Some(Answer::Error { reason }) if reason.contains("over")));
    // The final model is still served while lingering.
    let t = b.send(1, Request::Fetch { round: 2 });
    assert!(matches!(b.answer(t), Some(Answer::Global { round: 2, .. })));
    b.wait(LINGER - MS);
    assert!(!b.finished);
    b.wait(MS);
    assert!(b.finished);
    assert_eq!(b.engine.poll_timeout(), None);
}

/// Insiders' review D5: a member registers and never sends. Before the excuse rule every round
/// waited τ for it, forever; now one round does.
#[test]
fn a_silent_registrant_costs_one_round_its_deadline_then_rounds_close_without_it() {
    let mut b = disco_bench(4, 12, |_| {});
    round_of(&mut b, &[0, 1, 2, 3]);
    b.register(9); // mal: registered, silent
    for _ in 1..12 {
        let r = b.engine.round();
        round_of(&mut b, &[0, 1, 2, 3]);
        if b.engine.round() == r {
            b.wait(TAU);
        }
    }
    let timed = b.timed_out();
    assert_eq!(timed.len(), 12);
    assert_eq!(timed.iter().filter(|t| **t).count(), 1, "{timed:?}");
    assert!(timed[1], "the round after the registration waits τ once");
    assert_eq!(b.excused_events(), [(name(9), 1, 12)]);
    for l in &b.lines[2..] {
        assert_eq!(l.excused, [name(9)]);
        assert!(l.elapsed_s < 0.01, "{}", l.elapsed_s);
    }
}

/// The same key cannot re-arm the stall: each further excuse is twice as long, so over 1,000
/// rounds one silent key costs a handful of τ, not one per round.
#[test]
fn a_silent_key_costs_ever_fewer_deadlines_over_a_long_run() {
    let rounds = 1000;
    let mut b = disco_bench(3, rounds, |_| {});
    b.register(7);
    while b.engine.round() < rounds {
        let r = b.engine.round();
        round_of(&mut b, &[0, 1, 2]);
        if b.engine.round() == r {
            b.wait(TAU);
        }
    }
    let timed = b.timed_out().iter().filter(|t| **t).count();
    // The first round (the engine's first) excuses nobody; then excuses of 10, 20, 40, ...,
    // 640 rounds (64 × 10), then 640 again.
    let excuses = b.excused_events();
    assert!(timed <= 9, "{timed} timed-out rounds: {excuses:?}");
    let lengths: Vec<u64> = excuses.iter().map(|(_, r, u)| u - r - 1).collect();
    assert_eq!(&lengths[..4], [10, 20, 40, 80]);
    assert!(lengths.iter().all(|&l| l <= 640));
}

#[test]
fn an_excused_members_update_still_counts_when_it_comes_in_time() {
    let mut b = disco_bench(3, 20, |_| {});
    round_of(&mut b, &[0, 1, 2]);
    round_of(&mut b, &[0, 1]);
    b.wait(TAU);
    assert!(b.engine.is_excused(&name(2)));
    // Member 2 sends first: the round waits for 0 and 1 and takes 2's update too.
    round_of(&mut b, &[2, 0, 1]);
    assert_eq!(
        b.lines[2].record["peers"],
        serde_json::json!(["peer-0", "peer-1", "peer-2"])
    );
    assert!(b.lines[2].excused.is_empty());
    // It is still not waited for: the next round closes without it.
    round_of(&mut b, &[0, 1]);
    assert_eq!(b.lines.len(), 4);
    assert_eq!(b.lines[3].excused, [name(2)]);
}

#[test]
fn nobody_is_excused_when_no_update_came() {
    let mut b = disco_bench(3, 5, |_| {});
    round_of(&mut b, &[0, 1, 2]);
    b.wait(TAU);
    b.wait(TAU);
    assert_eq!(b.timed_out(), [false, true, true]);
    assert!(b.excused_events().is_empty());
}

#[test]
fn nobody_is_excused_when_the_missing_outnumber_the_senders() {
    let mut b = disco_bench(5, 5, |_| {});
    round_of(&mut b, &[0, 1, 2, 3, 4]);
    round_of(&mut b, &[0, 1]);
    b.wait(TAU);
    assert!(b.excused_events().is_empty(), "3 missing, 2 sent");
    round_of(&mut b, &[0, 1, 2]);
    b.wait(TAU);
    assert_eq!(b.excused_events().len(), 2, "2 missing, 3 sent");
}

#[test]
fn the_first_round_after_a_restart_excuses_nobody() {
    // A coordinator resumed at round 4: its open round's updates died with the old process.
    let mut state = ServerState::new(vec![0.0; LEN]);
    state.round = 4;
    let alg = Box::new(Disco {
        state,
        params: Params::default(),
        robust: crate::coord::feddisco::Robust::NONE,
    });
    let mut b = Bench::new(alg, config(10, 3));
    for i in 0..3 {
        b.register(i);
    }
    round_of(&mut b, &[0, 1]);
    b.wait(TAU);
    assert_eq!(b.timed_out(), [true]);
    assert!(b.excused_events().is_empty());
    round_of(&mut b, &[0, 1]);
    b.wait(TAU);
    assert_eq!(b.excused_events().len(), 1);
}

#[test]
fn excuse_rounds_zero_waits_for_every_member_every_round() {
    let mut b = disco_bench(3, 6, |c| c.excuse_rounds = 0);
    for _ in 0..6 {
        round_of(&mut b, &[0, 1]);
        b.wait(TAU);
    }
    assert_eq!(b.timed_out(), [true; 6]);
    assert!(b.excused_events().is_empty());
}

#[test]
fn an_hcct_round_opens_once_every_silo_joined_and_waits_for_its_members() {
    let mut b = Bench::new(hcct(3, 5), config(5, 3));
    b.join(0);
    b.join(1);
    let t = b.send(0, Request::Fetch { round: 0 });
    assert_eq!(b.answer(t), None, "held until the run starts");
    assert_eq!(b.engine.poll_timeout(), None, "no clock before the run");
    b.join(2);
    assert!(matches!(b.answer(t), Some(Answer::Global { round: 0, .. })));
    round_of(&mut b, &[0, 1, 2]);
    assert_eq!(b.timed_out(), [false]);
    // A silent silo of the run: one deadline, then it is excused.
    round_of(&mut b, &[0, 1]);
    b.wait(TAU);
    round_of(&mut b, &[0, 1]);
    assert_eq!(b.timed_out(), [false, true, false]);
    assert_eq!(b.lines[2].excused, [name(2)]);
}

#[test]
fn the_join_deadline_is_armed_by_the_first_join_and_leaves_out_who_never_came() {
    let mut c = config(5, 3);
    c.join_deadline = Some(Duration::from_secs(30));
    let mut b = Bench::new(hcct(3, 5), c);
    assert_eq!(
        b.engine.poll_timeout(),
        None,
        "armed by a join, not at start"
    );
    b.wait(Duration::from_secs(100));
    b.join(0);
    let armed = b.engine.poll_timeout().unwrap();
    assert_eq!(armed, b.clock.now() + Duration::from_secs(30));
    b.wait(Duration::from_secs(10));
    b.join(1);
    b.wait(Duration::from_secs(20) - MS);
    assert!(
        !b.events
            .iter()
            .any(|e| matches!(e, Event::JoiningClosed { .. }))
    );
    b.wait(MS);
    assert!(
        b.events.contains(&Event::JoiningClosed { absent: vec![2] }),
        "{:?}",
        b.events
    );
    round_of(&mut b, &[0, 1]);
    assert_eq!(b.timed_out(), [false], "the run's silos are 0 and 1");
    // The latecomer is told it trains alone.
    b.join(2);
    assert!(
        b.events
            .iter()
            .any(|e| matches!(e, Event::Registered { left_out: true, .. }))
    );
    let t = b.send(2, Request::Fetch { round: 1 });
    assert_eq!(b.answer(t), Some(&Answer::Alone));
}

#[test]
fn a_fedsac_round_waits_for_its_cohort_only() {
    let mut b = Bench::new(fedsac(4, 6, 2), config(6, 4));
    for i in 0..4 {
        b.join(i);
    }
    let contribute = |b: &mut Bench, i: usize| {
        let round = b.engine.round();
        b.wait(MS);
        let t = b.send(
            i,
            Request::Contribute {
                round,
                params: Arc::new(vec![1.0; LEN]),
                subspace: None,
            },
        );
        assert_eq!(b.answer(t), Some(&Answer::Ack), "silo {i} in round {round}");
    };
    for _ in 0..3 {
        let cohort: Vec<usize> = (0..4)
            .filter(|&i| {
                let t = b.send(
                    i,
                    Request::Fetch {
                        round: b.engine.round(),
                    },
                );
                matches!(b.answer(t), Some(Answer::Assigned { train: true, .. }))
            })
            .collect();
        assert_eq!(cohort.len(), 2);
        for i in cohort {
            contribute(&mut b, i);
        }
    }
    assert_eq!(b.timed_out(), [false, false, false]);
}

#[test]
fn a_fedcollab_coordinator_plans_takes_distances_and_answers_held_fetches_once_solved() {
    let cfg = FedCollabConfig {
        restarts: 4,
        ..Default::default()
    };
    let alg = Box::new(FedCollabServer::new(cfg, 2, 7).unwrap());
    let mut b = Bench::new(alg, config(1, 2));
    b.join(0);
    let plan = b.send(0, Request::Fetch { round: 0 });
    assert_eq!(b.answer(plan), None);
    b.join(1);
    assert!(matches!(
        b.answer(plan),
        Some(Answer::DiscPlan { nodes: 2, .. })
    ));
    assert_eq!(
        b.engine.poll_timeout(),
        None,
        "no round clock for fedcollab"
    );
    let coalition = b.send(1, Request::Fetch { round: 1 });
    assert_eq!(b.answer(coalition), None);
    for (i, j) in [(0, 1), (1, 0)] {
        let t = b.send(
            i,
            Request::Distances {
                pairs: vec![PairDistance {
                    partner: j,
                    distance: Some(0.0),
                    rounds: 10,
                }],
            },
        );
        assert_eq!(b.answer(t), Some(&Answer::Ack));
    }
    assert!(b.kinds.contains(&"solved"));
    assert!(matches!(
        b.answer(coalition),
        Some(Answer::Coalition { .. })
    ));
    let t = b.update(0, 0);
    assert!(matches!(b.answer(t), Some(Answer::Error { .. })));
}

#[test]
fn a_refused_registration_says_why_and_changes_nothing() {
    let mut b = Bench::new(hcct(2, 5), config(5, 2));
    let t = b.send(
        0,
        Request::Register {
            n_train: 5,
            discrepancy: 0.0,
        },
    );
    assert!(matches!(b.answer(t), Some(Answer::Error { reason }) if reason.contains("hcct")));
    assert!(!b.kinds.contains(&"save"));
}

#[test]
fn a_round_with_every_update_lost_closes_at_its_deadline_and_keeps_the_global() {
    let mut b = disco_bench(2, 5, |_| {});
    round_of(&mut b, &[0, 1]);
    let t = b.send(0, Request::Fetch { round: 1 });
    let before = match b.answer(t) {
        Some(Answer::Global { params, .. }) => params.clone(),
        other => panic!("{other:?}"),
    };
    b.wait(TAU);
    let t = b.send(0, Request::Fetch { round: 2 });
    assert!(matches!(b.answer(t), Some(Answer::Global { round: 2, params }) if *params == before));
}

/// A member whose fetch waits for a later round (its update of the open round was lost, it
/// trained detached and ran ahead, or it is done and waits for the final model) sends nothing
/// more for the open round: the round closes without waiting out τ for it.
#[test]
fn a_round_does_not_wait_for_a_member_waiting_for_a_later_round() {
    let mut b = disco_bench(3, 5, |_| {});
    let t = b.send(2, Request::Fetch { round: 1 });
    assert_eq!(b.answer(t), None, "held");
    // Its fetch excuses only itself: member 1 is still awaited.
    round_of(&mut b, &[0]);
    assert_eq!(b.engine.round(), 0, "member 1 has not sent");
    round_of(&mut b, &[1]);
    assert_eq!(b.engine.round(), 1, "closed on the last awaited update");
    assert_eq!(b.timed_out(), [false]);
    assert!(matches!(b.answer(t), Some(Answer::Global { round: 1, .. })));
    // Once served, it is awaited again.
    round_of(&mut b, &[0, 1]);
    assert_eq!(b.engine.round(), 1, "member 2 is awaited in round 1");
    b.wait(TAU);
    assert_eq!(b.timed_out(), [false, true]);
    // Done and waiting for the final model (round 5): the rounds left do not wait for it.
    let done = b.send(2, Request::Fetch { round: 5 });
    for r in 2..5 {
        round_of(&mut b, &[0, 1]);
        assert_eq!(b.engine.round(), r + 1);
    }
    assert_eq!(b.timed_out(), [false, true, false, false, false]);
    assert!(matches!(
        b.answer(done),
        Some(Answer::Global { round: 5, .. })
    ));
}
