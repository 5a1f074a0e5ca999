//! The protocol rules of the answering side of a FedCollab discriminator pair (spec §6 phase 2)
//! over an unreliable network, without the discriminator's arithmetic: which requests start a
//! pair, start it over or ask the driving side to start over ([`admit`]), and which partners
//! have been silent too long ([`Silence`]).
//! Owns: those two rules (time is passed in as `now`).
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
    /// The driving side stopped the pair.
    Done,
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
        PairRequest::Done => true,
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
        assert_eq!(admit(None, PairRequest::Done), Admit::Restart);
        assert_eq!(admit(held(3, Some(2)), step(3)), Admit::Continue);
        assert_eq!(admit(held(3, Some(2)), PairRequest::Done), Admit::Continue);
        // The driving side restarted: round 0 again after the pair moved on.
        assert_eq!(admit(held(3, Some(2)), step(0)), Admit::StartOver);
        // Round 0's answer was lost: its retransmission is no restart.
        assert_eq!(admit(held(1, Some(0)), step(0)), Admit::Continue);
        // Held but never stepped (a pair just started).
        assert_eq!(admit(held(0, None), step(0)), Admit::Continue);
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
