//! The protocol rules of a FedCollab discriminator pair (spec §6 phase 2) over an unreliable
//! network, without the discriminator's arithmetic. The answering side's: which requests start a
//! pair, start it over or ask the driving side to start over ([`admit`]), what a request for a
//! pair that already ended gets ([`after_end`]), and which partners have been silent too long
//! ([`Silence`]); and the driving side's ([`Driving`]): each
//! exchange's budget, what an answer means, how often a pair may start over.
//! Owns: those rules (time is passed in as `now`).
//! Must not: read a clock, touch sockets, threads or tensors, or step, average or evaluate a
//! pair (`silo::fedcollab::PairHalf` does; `net::collab_node` carries out the decisions).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A pair request, as far as the protocol cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairRequest {
    /// The driving side's weights of `round`.
    Step {
        /// Its round.
        round: u32,
    },
    /// The driving side stopped the pair after `rounds`.
    Done {
        /// Its rounds.
        rounds: u32,
    },
}

/// What the answering side holds of a pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// Rounds this side has stepped.
    pub rounds: usize,
    /// The round of the last answer sent (kept for retransmissions).
    pub last_answered: Option<u32>,
}

/// What to do with a pair request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// A pair this side does not hold, asked to go on (this side was restarted): ask the
    /// driving side to start the pair over.
    Restart,
    /// A pair this side holds further on, asked from round 0 (the driving side was restarted):
    /// drop it and start afresh.
    StartOver,
    /// A new pair: start it.
    Start,
    /// Go on with the held pair.
    Continue,
}

/// The answering side's decision for `req` given what it holds of the pair.
pub fn admit(held: Option<Held>, req: PairRequest) -> Admit {
    let continues = match req {
        PairRequest::Step { round } => round > 0,
        PairRequest::Done { .. } => true,
    };
    match held {
        None if continues => Admit::Restart,
        None => Admit::Start,
        // Round 0 again after the pair moved on, and not a retransmission of round 0's answer.
        Some(h)
            if req == (PairRequest::Step { round: 0 })
                && h.rounds > 0
                && h.last_answered != Some(0) =>
        {
            Admit::StartOver
        }
        Some(_) => Admit::Continue,
    }
}

/// What the answering side does with a request for a pair that has ended on its side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The stop again, after the rounds the pair ended with: acknowledge it again (the first
    /// acknowledgement may have been lost).
    Ack,
    /// Round 0 of a pair that ended with an estimate: the driving side was restarted before it
    /// kept the pair's end. Run the pair again from round 0 (it ends as the first run did,
    /// both halves being seeded); its result was reported already and is not reported again.
    /// At most [`PAIR_RESTARTS`] times per pair: a partner asking for more only makes this
    /// side train.
    Replay,
    /// Anything else: the pair is over.
    Over,
}

/// The answering side's decision for `req`, for a pair that ended here with an estimate after
/// `agreed` rounds (`None`: it ended without one: failed, refused or given up) and has been
/// replayed `replays` times.
pub fn after_end(agreed: Option<u32>, req: PairRequest, replays: usize) -> Ended {
    match (agreed, req) {
        (Some(a), PairRequest::Done { rounds }) if a == rounds => Ended::Ack,
        (Some(_), PairRequest::Step { round: 0 }) if replays < PAIR_RESTARTS => Ended::Replay,
        _ => Ended::Over,
    }
}

/// When each partner was last heard from: a partner silent for longer than `idle` (counted
/// from the start for one never heard) has its pair given up.
#[derive(Clone, Debug)]
pub struct Silence {
    started: Instant,
    idle: Duration,
    seen: BTreeMap<usize, Instant>,
}

impl Silence {
    /// Nobody heard yet, at `now`.
    pub fn new(now: Instant, idle: Duration) -> Self {
        Self {
            started: now,
            idle,
            seen: BTreeMap::new(),
        }
    }

    /// `partner` was heard at `now`.
    pub fn heard(&mut self, partner: usize, now: Instant) {
        self.seen.insert(partner, now);
    }

    /// Of `partners`, those silent for longer than `idle` at `now`.
    pub fn silent(&self, partners: impl IntoIterator<Item = usize>, now: Instant) -> Vec<usize> {
        partners
            .into_iter()
            .filter(|p| {
                let seen = self.seen.get(p).copied().unwrap_or(self.started);
                now.saturating_duration_since(seen) > self.idle
            })
            .collect()
    }
}

/// How often a driven pair may be started over at the partner's request before it counts as
/// failed (a partner restarting again and again, or one that says so without cause).
pub const PAIR_RESTARTS: usize = 3;

/// What the driving side heard back from its partner.
#[derive(Clone, Debug, PartialEq)]
pub enum Heard {
    /// The answer asked for: the partner's step (to a step), its acknowledgement (to the stop).
    Answer,
    /// The partner does not hold the pair (it was restarted): start it over.
    Restart,
    /// Anything else (a refusal, a failure, an answer to another question), described.
    Other(String),
}

/// What the driving side does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Drive {
    /// Go on: combine the step, or (to the stop) the pair is done.
    Go,
    /// Start the pair over from round 0 with fresh halves.
    StartOver,
    /// The pair failed: its distance counts as 1.
    Fail(String),
}

/// The driving side's rules for one pair (the higher index drives, spec §6 phase 2): how long
/// each exchange may take, what an answer means, and how often the pair may start over.
#[derive(Clone, Debug)]
pub struct Driving {
    restarts: usize,
    first: bool,
}

impl Default for Driving {
    fn default() -> Self {
        Self::new()
    }
}

impl Driving {
    /// A pair about to start.
    pub fn new() -> Self {
        Self {
            restarts: 0,
            first: true,
        }
    }

    /// The budget of the next step's exchange: the first of the pair (or after a start-over)
    /// waits three times `fetch`, as the partner may still be waiting for its plan.
    pub fn budget(&mut self, fetch: Duration) -> Duration {
        let first = std::mem::replace(&mut self.first, false);
        if first { fetch * 3 } else { fetch }
    }

    /// The partner's answer to round `round`'s step.
    pub fn on_step(&mut self, round: u32, heard: Heard) -> Drive {
        match heard {
            Heard::Answer => Drive::Go,
            Heard::Restart if round > 0 => self.start_over(),
            Heard::Restart => Drive::Fail(format!("round {round}: Restart")),
            Heard::Other(what) => Drive::Fail(format!("round {round}: {what}")),
        }
    }

    /// The partner's answer to the stop.
    pub fn on_done(&mut self, heard: Heard) -> Drive {
        match heard {
            Heard::Answer => Drive::Go,
            Heard::Restart => self.start_over(),
            Heard::Other(what) => {
                Drive::Fail(format!("the partner did not confirm the stop: {what}"))
            }
        }
    }

    fn start_over(&mut self) -> Drive {
        self.restarts += 1;
        if self.restarts > PAIR_RESTARTS {
            return Drive::Fail(format!(
                "the partner asked to start the pair over {} times",
                self.restarts
            ));
        }
        self.first = true;
        Drive::StartOver
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Clock;

    const IDLE: Duration = Duration::from_secs(30);

    #[test]
    fn a_pair_is_started_continued_started_over_or_restarted_as_each_side_restarted() {
        let step = |round| PairRequest::Step { round };
        let held = |rounds, last_answered| {
            Some(Held {
                rounds,
                last_answered,
            })
        };
        assert_eq!(admit(None, step(0)), Admit::Start);
        // This side restarted and lost the pair: the driving side starts over.
        assert_eq!(admit(None, step(3)), Admit::Restart);
        assert_eq!(admit(None, PairRequest::Done { rounds: 3 }), Admit::Restart);
        assert_eq!(admit(held(3, Some(2)), step(3)), Admit::Continue);
        assert_eq!(
            admit(held(3, Some(2)), PairRequest::Done { rounds: 3 }),
            Admit::Continue
        );
        // The driving side restarted: round 0 again after the pair moved on.
        assert_eq!(admit(held(3, Some(2)), step(0)), Admit::StartOver);
        // Round 0's answer was lost: its retransmission is no restart.
        assert_eq!(admit(held(1, Some(0)), step(0)), Admit::Continue);
        // Held but never stepped (a pair just started).
        assert_eq!(admit(held(0, None), step(0)), Admit::Continue);
    }

    #[test]
    fn an_ended_pair_acks_its_stop_again_and_replays_only_when_it_ended_with_an_estimate() {
        let done = |rounds| PairRequest::Done { rounds };
        let step = |round| PairRequest::Step { round };
        assert_eq!(after_end(Some(40), done(40), 0), Ended::Ack);
        assert_eq!(after_end(Some(40), done(30), 0), Ended::Over);
        // The driving side restarted before keeping the end: the pair runs again, a few times.
        assert_eq!(after_end(Some(40), step(0), 0), Ended::Replay);
        assert_eq!(
            after_end(Some(40), step(0), PAIR_RESTARTS - 1),
            Ended::Replay
        );
        assert_eq!(after_end(Some(40), step(0), PAIR_RESTARTS), Ended::Over);
        // Anything else of an ended pair, and every request of a pair that failed, is refused.
        assert_eq!(after_end(Some(40), step(5), 0), Ended::Over);
        assert_eq!(after_end(None, step(0), 0), Ended::Over);
        assert_eq!(after_end(None, done(40), 0), Ended::Over);
    }

    #[test]
    fn the_driving_side_waits_longer_first_and_starts_over_at_most_three_times() {
        let fetch = Duration::from_secs(2);
        let mut d = Driving::new();
        assert_eq!(
            d.budget(fetch),
            fetch * 3,
            "the partner may still wait for its plan"
        );
        assert_eq!(d.budget(fetch), fetch);
        assert_eq!(d.on_step(4, Heard::Answer), Drive::Go);
        // The partner lost the pair: start over, and the next exchange waits longer again.
        assert_eq!(d.on_step(4, Heard::Restart), Drive::StartOver);
        assert_eq!(d.budget(fetch), fetch * 3);
        assert_eq!(d.on_done(Heard::Restart), Drive::StartOver);
        assert_eq!(d.on_step(1, Heard::Restart), Drive::StartOver);
        // The fourth request to start over fails the pair.
        let Drive::Fail(why) = d.on_step(2, Heard::Restart) else {
            panic!("a fourth start-over was allowed");
        };
        assert!(why.contains("4 times"), "{why}");
        // A restart at round 0 and any other answer fail at once, naming what came.
        let mut d = Driving::new();
        assert!(matches!(d.on_step(0, Heard::Restart), Drive::Fail(_)));
        let Drive::Fail(why) = d.on_step(3, Heard::Other("Error(busy)".into())) else {
            panic!("an unexpected answer was taken");
        };
        assert!(why.contains("round 3") && why.contains("busy"), "{why}");
        let Drive::Fail(why) = d.on_done(Heard::Other("Ack?".into())) else {
            panic!("an unconfirmed stop was taken");
        };
        assert!(why.contains("did not confirm the stop"), "{why}");
        assert_eq!(d.on_done(Heard::Answer), Drive::Go);
    }

    #[test]
    fn a_partner_is_silent_only_after_idle_without_a_word() {
        let mut clock = Clock::new();
        let mut s = Silence::new(clock.now(), IDLE);
        clock.advance(IDLE);
        // Exactly `idle` is not yet too long; never heard counts from the start.
        assert!(s.silent([1, 2], clock.now()).is_empty());
        s.heard(1, clock.now());
        clock.advance(Duration::from_millis(1));
        assert_eq!(s.silent([1, 2], clock.now()), vec![2]);
        clock.advance(IDLE);
        assert_eq!(s.silent([1, 2], clock.now()), vec![1, 2]);
        // A word resets the clock; only the partners asked about are reported.
        s.heard(2, clock.now());
        assert_eq!(s.silent([2, 3], clock.now()), vec![3]);
    }
}
