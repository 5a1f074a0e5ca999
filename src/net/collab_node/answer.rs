//! The answering side of a silo's discriminator pairs (FedCollab spec §6 phase 2): the pairs
//! with higher-index partners, which drive them, answered on the silo's discriminator thread.
//! Owns: this side's half of each such pair (its steps, the cache of the last answer for
//! retransmissions), carrying out the protocol's decisions (start a pair over when either side
//! was restarted, give up on a silent partner: [`crate::coord::fedcollab::pairs`] decides),
//! and one result per pair.
//! Must not: touch the network (the event loop hands requests over and sends the answers),
//! decide the pair protocol's rules or compare times, or do the distances' arithmetic
//! ([`PairHalf`] does).

use super::link::DiscJob;
use crate::coord::PairDistance;
use crate::coord::fedcollab::FedCollabConfig;
use crate::coord::fedcollab::pairs::{Admit, Ended, Held, PairRequest, Silence, admit, after_end};
use crate::learn::Learner;
use crate::protocol::{CollabRequest, CollabResponse};
use crate::silo::fedcollab::{DiscData, DiscModel, PairHalf};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// What the answering side is given: the silo, its partners, the discriminator.
pub(super) struct Answering {
    pub(super) me: usize,
    /// The planned partners with a higher index (they drive).
    pub(super) higher: Vec<usize>,
    /// Pairs that ended before a restart: partner → rounds.
    pub(super) kept: HashMap<usize, u32>,
    pub(super) model: Arc<DiscModel>,
    pub(super) disc: Arc<DiscData>,
    pub(super) fc: FedCollabConfig,
    pub(super) seed: u64,
    pub(super) learner: Learner,
    /// One result per partner not in `kept` (bounded with room for all of them).
    pub(super) done: mpsc::Sender<PairDistance>,
    /// A partner silent this long has its pair given up.
    pub(super) idle: Duration,
}

/// This side's half of one pair.
struct Pair {
    half: PairHalf,
    /// This side's accuracy of the last evaluated average, until the partner's arrives.
    pending: Option<f64>,
    last: Option<(u32, CollabResponse)>,
}

/// The answering side of this silo's pairs with higher-index partners, on its own thread:
/// each `DiscStep` is the partner's weights of a round; this side takes its own step from the
/// pair's average, averages, evaluates when due and answers with its weights (and accuracy).
/// A retransmitted round is answered from the cache without stepping again. A partner silent
/// for `idle` has its pair given up (distance `None`). Sends one result per partner not in
/// `kept`.
///
/// Restarts: a round past 0 of a pair this side does not hold (it was restarted) is answered
/// [`CollabResponse::Restart`]; round 0 of a pair this side holds further on means the
/// partner restarted: the pair starts over. A pair that ended here is over, except as
/// [`after_end`] says: its stop is acknowledged again, and a partner restarted before it kept
/// the pair's end runs it again (reported once). So the thread answers until the event loop
/// lets go of `jobs` (when the silo has its coalition), not only until its pairs ended.
pub(super) fn answer_pairs(a: Answering, jobs: Receiver<DiscJob>) {
    let finished: HashSet<usize> = a.kept.keys().copied().collect();
    // The one clock of this thread: read here, passed in to the side's rules.
    let mut side = Side {
        params: a.model.init.len(),
        silence: Silence::new(Instant::now(), a.idle),
        pairs: HashMap::new(),
        finished,
        // Pairs that ended with an estimate: partner → rounds.
        agreed: a.kept.clone(),
        replaying: HashSet::new(),
        replays: HashMap::new(),
        a,
    };
    loop {
        match jobs.recv_timeout(Duration::from_millis(250)) {
            Ok(DiscJob { from, req, reply }) => {
                let now = Instant::now();
                let _ = reply.send(side.answer(now, from, req));
                // A busy pair must not hide a silent one: the timeout below may never fire.
                side.give_up_silent(now);
            }
            Err(RecvTimeoutError::Timeout) => side.give_up_silent(Instant::now()),
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// The answering side's state.
struct Side {
    a: Answering,
    /// Weights a request must carry.
    params: usize,
    /// When each partner was last heard from.
    silence: Silence,
    pairs: HashMap<usize, Pair>,
    finished: HashSet<usize>,
    /// Pairs that ended with an estimate: partner → rounds.
    agreed: HashMap<usize, u32>,
    /// Ended pairs run again for a restarted partner ([`Ended::Replay`]).
    replaying: HashSet<usize>,
    /// How often each ended pair was run again.
    replays: HashMap<usize, usize>,
}

fn refuse(reason: String) -> CollabResponse {
    CollabResponse::Error { reason }
}

/// A pair request as the protocol's rules see it; `None` for any other request.
fn pair_request(req: &CollabRequest) -> Option<PairRequest> {
    match req {
        CollabRequest::DiscStep { round, .. } => Some(PairRequest::Step { round: *round }),
        CollabRequest::DiscDone { rounds, .. } => Some(PairRequest::Done { rounds: *rounds }),
        CollabRequest::Model { .. } => None,
    }
}

impl Side {
    /// Records a pair's result, once (a replayed pair's end is not reported again).
    fn finish(&mut self, partner: usize, d: Option<f64>, rounds: u32) {
        self.replaying.remove(&partner);
        if self.finished.insert(partner) {
            let _ = self.a.done.try_send(PairDistance {
                partner: partner as u32,
                distance: d,
                rounds,
            });
        }
    }

    /// Gives up the pairs whose partner has been silent for `idle` at `now`.
    fn give_up_silent(&mut self, now: Instant) {
        let open = self.a.higher.iter().copied();
        let open = open.filter(|p| !self.finished.contains(p));
        for partner in self.silence.silent(open.collect::<Vec<_>>(), now) {
            warn!(partner, "pair partner silent: pair given up");
            self.finish(partner, None, 0);
        }
    }

    /// The answer to one pair request from silo `from`, arrived at `now`.
    fn answer(&mut self, now: Instant, from: usize, req: CollabRequest) -> CollabResponse {
        let me = self.a.me;
        if !self.a.higher.contains(&from) {
            return refuse(format!(
                "silo {from} does not drive a pair with silo {me} (the higher index of two \
                 planned silos drives)"
            ));
        }
        let Some(asked) = pair_request(&req) else {
            return refuse("not a pair request".into());
        };
        if self.finished.contains(&from) && !self.replaying.contains(&from) {
            let replays = self.replays.get(&from).copied().unwrap_or(0);
            match after_end(self.agreed.get(&from).copied(), asked, replays) {
                Ended::Ack => return CollabResponse::Ack,
                Ended::Over => return refuse(format!("the pair ({me}, {from}) is over")),
                Ended::Replay => {
                    info!(
                        partner = from,
                        "the partner lost the pair's end (restarted): running it again"
                    );
                    self.replaying.insert(from);
                    *self.replays.entry(from).or_default() += 1;
                }
            }
        }
        if let Err(reason) = req.check(self.params) {
            warn!(partner = from, %reason, "refused a pair request");
            return refuse(reason);
        }
        if let Err(answer) = self.hold(now, from, asked) {
            return answer;
        }
        match req {
            CollabRequest::DiscStep {
                round,
                weights,
                acc,
            } => self.step(from, round, &weights, acc),
            CollabRequest::DiscDone { rounds, acc } => self.done(from, rounds, acc),
            CollabRequest::Model { .. } => refuse("not a pair request".into()),
        }
    }

    /// The pair `req` belongs to, started (or started over) as the request says; the answer
    /// instead when the pair cannot go on here.
    fn hold(
        &mut self,
        now: Instant,
        from: usize,
        asked: PairRequest,
    ) -> Result<(), CollabResponse> {
        let held = self.pairs.get(&from).map(|p| Held {
            rounds: p.half.rounds(),
            last_answered: p.last.as_ref().map(|(r, _)| *r),
        });
        match admit(held, asked) {
            Admit::Restart => {
                info!(
                    partner = from,
                    "a pair this silo does not hold: asking to start it over"
                );
                return Err(CollabResponse::Restart);
            }
            Admit::StartOver => {
                info!(
                    partner = from,
                    at = held.map_or(0, |h| h.rounds),
                    "the partner started the pair over (restarted): so does this side"
                );
                self.pairs.remove(&from);
            }
            Admit::Start | Admit::Continue => {}
        }
        if !self.pairs.contains_key(&from) {
            let a = &self.a;
            match PairHalf::new(&a.fc, &a.model, a.disc.clone(), a.me, from, a.seed) {
                Ok(half) => {
                    let pair = Pair {
                        half,
                        pending: None,
                        last: None,
                    };
                    self.pairs.insert(from, pair);
                }
                Err(reason) => {
                    self.finish(from, None, 0);
                    return Err(refuse(reason));
                }
            }
        }
        self.silence.heard(from, now);
        Ok(())
    }

    /// The partner's weights of `round`: this side's step, the average, the evaluation when
    /// due; a retransmitted round is answered from the cache.
    fn step(
        &mut self,
        from: usize,
        round: u32,
        weights: &[f32],
        acc: Option<f64>,
    ) -> CollabResponse {
        let me = self.a.me;
        let pair = self.pairs.get_mut(&from).expect("held above");
        if let Some((r, resp)) = &pair.last
            && *r == round
        {
            // The partner did not get the answer: send it again.
            return resp.clone();
        }
        if round as usize != pair.half.rounds() {
            return refuse(format!(
                "round {round}; the pair ({me}, {from}) is at round {}",
                pair.half.rounds()
            ));
        }
        let learner = &mut self.a.learner;
        let step = (|| -> Result<CollabResponse, String> {
            if let Some(acc_hi) = acc {
                let acc_lo = pair
                    .pending
                    .take()
                    .ok_or("an accuracy for a round that was not evaluated")?;
                if pair.half.record(acc_lo, acc_hi) {
                    return Err("the pair has stopped: expected its end".into());
                }
            }
            let own = pair.half.step(learner).map_err(|e| e.to_string())?;
            let evaluated = pair.half.combine(&own, weights)?;
            let acc = if evaluated {
                Some(pair.half.accuracy(learner).map_err(|e| e.to_string())?)
            } else {
                None
            };
            pair.pending = acc;
            Ok(CollabResponse::DiscStep {
                weights: Arc::new(own),
                acc,
            })
        })();
        match step {
            Ok(resp) => {
                pair.last = Some((round, resp.clone()));
                resp
            }
            Err(reason) => {
                warn!(partner = from, %reason, "pair failed");
                let rounds = pair.half.rounds() as u32;
                self.finish(from, None, rounds);
                refuse(reason)
            }
        }
    }

    /// The partner stopped the pair after `rounds`: acknowledged when this side would stop
    /// there too.
    fn done(&mut self, from: usize, rounds: u32, acc: Option<f64>) -> CollabResponse {
        let pair = self.pairs.get_mut(&from).expect("held above");
        if let (Some(acc_hi), Some(acc_lo)) = (acc, pair.pending.take()) {
            pair.half.record(acc_lo, acc_hi);
        }
        let (here, stops, estimate) = (pair.half.rounds(), pair.half.done(), pair.half.estimate());
        if rounds as usize == here && stops {
            if estimate.is_some() {
                self.agreed.insert(from, rounds);
            }
            self.finish(from, estimate, rounds);
            return CollabResponse::Ack;
        }
        warn!(
            partner = from,
            rounds, here, "the partner stopped where this side would not"
        );
        self.finish(from, None, rounds);
        refuse(format!(
            "stopped after {rounds} rounds; this side ran {here} and would {}stop",
            if stops { "" } else { "not " }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::fedcollab::pairs::PAIR_RESTARTS;
    use crate::learn::{Dataset, Labels};

    const SEED: u64 = 7;

    /// 40 rows of two features, two classes; silo 1's features are shifted, so the pair's
    /// discriminator has something to tell apart.
    fn silo_rows(shift: f32) -> Dataset {
        let n = 40;
        let features = (0..n)
            .flat_map(|i| [((i * 7) % 11) as f32 / 11.0 + shift, (i % 2) as f32])
            .collect();
        let ids = (0..n).map(|i| (i % 2) as u32).collect();
        Dataset::new(
            features,
            vec![2],
            Labels::Class {
                ids,
                num_classes: 2,
            },
        )
        .unwrap()
    }

    fn config() -> FedCollabConfig {
        FedCollabConfig {
            disc_hidden: 8,
            disc_batch_size: 8,
            disc_eval_every: 2,
            disc_patience: 2,
            disc_max_rounds: 12,
            ..FedCollabConfig::default()
        }
    }

    /// Silo 0's answering side of its pair with silo 1, and where its results go.
    fn side(fc: &FedCollabConfig) -> (Side, mpsc::Receiver<PairDistance>) {
        let train = silo_rows(0.0);
        let model = Arc::new(DiscModel::new(&train, fc, SEED).unwrap());
        let disc = Arc::new(model.silo_data(&train, 0, SEED, 10.0).unwrap());
        let (done, results) = mpsc::channel(4);
        let a = Answering {
            me: 0,
            higher: vec![1],
            kept: HashMap::new(),
            learner: Learner::new(&model.spec, fc.disc_batch_size).unwrap(),
            model,
            disc,
            fc: fc.clone(),
            seed: SEED,
            done,
            idle: Duration::from_secs(60),
        };
        let side = Side {
            params: a.model.init.len(),
            silence: Silence::new(Instant::now(), a.idle),
            pairs: HashMap::new(),
            finished: HashSet::new(),
            agreed: HashMap::new(),
            replaying: HashSet::new(),
            replays: HashMap::new(),
            a,
        };
        (side, results)
    }

    /// Silo 1 drives the pair with `side` from round 0 as a node's driving side does, each
    /// exchange a direct call: `(estimate, rounds)`, or the first answer that was not the one
    /// asked for.
    fn drive(side: &mut Side, fc: &FedCollabConfig) -> Result<(Option<f64>, u32), String> {
        let train = silo_rows(0.5);
        let model = DiscModel::new(&train, fc, SEED).unwrap();
        let disc = Arc::new(model.silo_data(&train, 1, SEED, 10.0).unwrap());
        let mut half = PairHalf::new(fc, &model, disc, 1, 0, SEED)?;
        let mut learner = Learner::new(&model.spec, fc.disc_batch_size).unwrap();
        let mut acc_prev = None;
        while !half.done() {
            let own = half.step(&mut learner).unwrap();
            let req = CollabRequest::DiscStep {
                round: half.rounds() as u32,
                weights: Arc::new(own.clone()),
                acc: acc_prev.take(),
            };
            let resp = side.answer(Instant::now(), 1, req);
            let CollabResponse::DiscStep { weights, acc } = resp else {
                return Err(format!("round {}: {resp:?}", half.rounds()));
            };
            if half.combine(&own, &weights)? {
                let acc_hi = half.accuracy(&mut learner).unwrap();
                half.record(acc.expect("an evaluated round's accuracy"), acc_hi);
                acc_prev = Some(acc_hi);
            }
        }
        let rounds = half.rounds() as u32;
        let stop = CollabRequest::DiscDone {
            rounds,
            acc: acc_prev,
        };
        match side.answer(Instant::now(), 1, stop) {
            CollabResponse::Ack => Ok((half.estimate(), rounds)),
            other => Err(format!("the stop: {other:?}")),
        }
    }

    /// The flake this guards against: the driving silo was killed after its partner
    /// acknowledged the pair's end but before it kept the result. Restarted, it drives the pair
    /// from round 0 again; refusing it ("the pair is over") left the driving silo without that
    /// distance while its partner had reported one.
    #[test]
    fn a_partner_restarted_after_the_pairs_end_runs_it_again_and_it_is_reported_once() {
        let fc = config();
        let (mut side, mut results) = side(&fc);
        let first = drive(&mut side, &fc).unwrap();
        assert!(
            first.0.is_some(),
            "the pair ended with an estimate: {first:?}"
        );
        let reported = results.try_recv().unwrap();
        assert_eq!((reported.distance, reported.rounds), first);

        let again = drive(&mut side, &fc).expect("the ended pair runs again");
        assert_eq!(again, first, "a replay ends as the first run did");
        assert!(results.try_recv().is_err(), "reported twice");
        // The stop is acknowledged again; any other step of the ended pair is refused.
        let stop = CollabRequest::DiscDone {
            rounds: first.1,
            acc: None,
        };
        assert_eq!(side.answer(Instant::now(), 1, stop), CollabResponse::Ack);
        let late = CollabRequest::DiscStep {
            round: 3,
            weights: Arc::new(side.a.model.init.clone()),
            acc: None,
        };
        let resp = side.answer(Instant::now(), 1, late);
        assert!(
            matches!(&resp, CollabResponse::Error { reason } if reason.contains("is over")),
            "{resp:?}"
        );
        // A member asking for the ended pair again and again gets it run a bounded number of
        // times, then refused: it cannot keep this side training.
        for _ in 1..PAIR_RESTARTS {
            assert_eq!(drive(&mut side, &fc).unwrap(), first);
        }
        let e = drive(&mut side, &fc).unwrap_err();
        assert!(e.contains("round 0") && e.contains("is over"), "{e}");
        assert!(results.try_recv().is_err(), "reported again");
    }
}
