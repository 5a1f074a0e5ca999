//! The owner's side of a round: whom it serves, which requests it holds, and when its round is
//! over — the one place that answers "how does a peer decide a round is over?".
//!
//! Owns: the round-over rule, the optimizer step it triggers (the inbox handed to the learner,
//! the stragglers' bookkeeping), serving and holding model requests.
//! Must not: read a clock or touch the network: `now` comes in, [`Action`]s go out.
//!
//! # When is a round over?
//!
//! An owner in round r holds version v and has its own weighted gradient in its inbox. Its
//! round is over when either
//! - its inbox is complete — every sampler it served version v sent a gradient or a skip
//!   (samplers that keep missing the step, [`crate::core::Stragglers`], and samplers already
//!   in a later round than the owner's, served while it catches up, are served but not waited
//!   for; a sampler whose connection closed is not waited for, nor are its held pulls served) —
//!   *and* every connected peer has said what it does in round r (a pull or a notice for round
//!   r or later) or that it finished — peers two or more rounds behind, and peers silent since
//!   they reconnected after round 1, excepted ([`Round::unannounced`]); or
//! - τ_grad has passed since its own gradient went in; or
//! - the *grace* has passed since then, and every gradient still missing is from a sampler on
//!   probation (one that missed a step within the last [`crate::core::PROBATION_ROUNDS`] rounds
//!   or 100 τ_grad, [`crate::core::Stragglers::on_probation`]), and nobody is unannounced. The
//!   grace is two normal rounds (a moving average of the owner's complete rounds), at least
//!   [`MIN_GRACE`] and at most τ_grad.
//!
//! The second condition lets a round end on a partition, a crash or a silent sampler; the first
//! makes a fault-free round end as soon as the last gradient arrives, exactly the simulator's
//! lock-step round. The third bounds what one member can withhold: a sampler that made the
//! owner wait out τ_grad costs it at most the grace in each of the next rounds, whatever it
//! sends in between (insiders' review, M5r: a late `Skip` re-armed the full wait), while an
//! honest sampler that was late once is still awaited — briefly — and stays in step.

use super::{Action, Event, Job, Phase, Round};
use crate::core::GradientInbox;
use crate::ids::NodeId;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The shortest grace an owner gives a sampler on probation.
pub(super) const MIN_GRACE: Duration = Duration::from_millis(100);

impl<H> Round<H> {
    /// Whether the owner's round is over at `now` (see the module doc).
    pub(super) fn round_is_over(
        &self,
        now: Instant,
        deadline: Instant,
        grace: Option<Instant>,
    ) -> bool {
        if self.gradients_in() || now >= deadline {
            return true;
        }
        let r = self.current_round();
        grace.is_some_and(|g| now >= g)
            && self.unannounced().next().is_none()
            && self
                .inbox
                .missing()
                .all(|k| self.stragglers.on_probation(k, r, now))
    }

    /// How long after its own gradient an owner waits for samplers on probation: two normal
    /// rounds, within [`MIN_GRACE`] and τ_grad (`None` before a first complete round).
    pub(super) fn grace(&self) -> Option<Duration> {
        self.normal
            .map(|n| (n * 2).max(MIN_GRACE).min(self.cfg.gradient_deadline))
    }

    /// A complete owner round took `took`.
    pub(super) fn note_normal_round(&mut self, took: Duration) {
        self.normal = Some(match self.normal {
            None => took,
            Some(n) => n.mul_f64(0.8) + took.mul_f64(0.2),
        });
    }

    /// Everything the owner waits for in this round came.
    pub(super) fn gradients_in(&self) -> bool {
        self.inbox.is_complete() && self.unannounced().next().is_none()
    }

    /// Connected peers the owner waits to hear from before its round r is over: it does not
    /// know yet whether they pull from it in round r. Not waited for: a peer that finished; a
    /// peer at least two rounds behind (catching up after a restart or a partition: its pull
    /// for round r comes rounds later, and is answered then); a peer that has said nothing
    /// since it (re)connected, except in this engine's first round (at the start every member
    /// is waited for; a rejoiner's first pull or notice follows its own start).
    fn unannounced(&self) -> impl Iterator<Item = NodeId> + '_ {
        let r = self.current_step();
        let first = r == 1;
        self.connected.iter().copied().filter(move |k| {
            if self.done_peers.contains(k) {
                return false;
            }
            match self.seen_round.get(k) {
                Some(&s) => s + 1 == r,
                None => first,
            }
        })
    }

    /// The round is over at `now` (`at_deadline`: at τ_grad): step on what arrived.
    pub(super) fn step(&mut self, now: Instant, at_deadline: bool) {
        let r = self.current_round();
        if !self.gradients_in() {
            let missing = self.inbox.missing().collect();
            if at_deadline {
                let unannounced = self.unannounced().collect();
                self.log(Event::SteppingAtDeadline {
                    round: r,
                    missing,
                    unannounced,
                });
            } else {
                self.log(Event::SteppingPastProbation { round: r, missing });
            }
        }
        let mut inbox = std::mem::replace(
            &mut self.inbox,
            GradientInbox::new(self.version + 1, self.cfg.num_params)
                .with_clip_norm(self.cfg.clip_norm)
                .with_foreign_cap(self.cfg.me, self.cfg.foreign_cap),
        );
        let before: Vec<bool> = (0..self.known)
            .map(|i| self.stragglers.awaits(NodeId(i)))
            .collect();
        self.stragglers.handle_step(&inbox, r, now);
        self.judge(&mut inbox, r);
        for (i, was) in before.into_iter().enumerate() {
            let id = NodeId(i as u32);
            if was && !self.stragglers.awaits(id) {
                self.log(Event::Straggler { peer: id, round: r });
            }
        }
        if let Some(rec) = self.pending.as_mut() {
            rec.gradients += inbox.gradients();
        }
        self.inbox.expect(self.cfg.me);
        self.phase = Phase::Stepping;
        self.actions.push_back(Action::Run(Job::Step { inbox }));
    }

    /// Applies the owner's defences to the inbox of its step in round `r`: the norm bound, the
    /// opposed gradients left out, and each sender's alignment with the owner's own gradient,
    /// which makes a member whose gradients keep pointing against it, or keep being oversized,
    /// distrusted (its gradients left out too).
    fn judge(&mut self, inbox: &mut GradientInbox, r: u64) {
        let me = self.cfg.me;
        let mut bounded = BTreeSet::new();
        for b in self.bound.apply(inbox, me) {
            bounded.insert(b.from);
            if b.first {
                self.log(Event::GradientBounded {
                    peer: b.from,
                    round: r,
                    norm: b.norm,
                    bound: b.bound,
                });
            }
        }
        // Without its own gradient (a step at the deadline) the owner has nothing to judge
        // directions by, and records no verdict.
        let Some(cosines) = inbox.cosines(me) else {
            return;
        };
        let opposed = crate::core::inbox::opposed_of(&cosines);
        let verdicts: Vec<(NodeId, f64)> = cosines
            .into_iter()
            .map(|(j, c)| (j, if bounded.contains(&j) { -1.0 } else { c }))
            .collect();
        self.peer.handle_verdicts(&verdicts);
        if self.cfg.drop_opposed {
            inbox.leave_out(&opposed);
            for &peer in &opposed {
                if self.opposed.insert(peer) {
                    self.log(Event::GradientOpposed { peer, round: r });
                }
            }
        }
        for (j, _) in verdicts {
            let now = self.peer.is_distrusted(j);
            if now {
                inbox.leave_out(&[j]);
            }
            if now != self.distrusted.contains(&j) {
                if now {
                    self.distrusted.insert(j);
                } else {
                    self.distrusted.remove(&j);
                }
                self.log(Event::Distrusted {
                    peer: j,
                    round: r,
                    distrusted: now,
                });
            }
        }
    }

    /// Serves held requests that can be answered now. Lingering, the model is final: every
    /// request is answered with it (a peer that ran more rounds asks for versions this peer
    /// will never reach).
    pub(super) fn serve_held(&mut self) {
        let held = std::mem::take(&mut self.held);
        let last = self.is_lingering();
        for h in held {
            let ready = last
                || match h.pull_round {
                    // A pull for this round, or from a peer further ahead than our next
                    // round (we are catching up: we may not reach its round before it gives
                    // up on us), is served; one for our next round waits for the next step.
                    Some(round) => round <= self.current_step() || round > self.current_step() + 1,
                    None => self.version >= h.version,
                };
            if ready {
                self.serve(h.from, h.handle, h.pull_round);
            } else {
                self.held.push(h);
            }
        }
    }

    /// Answers `from` with the current model. After a pull (`pull_round`), its gradient is
    /// expected: awaited (unless it is a straggler) for a pull of this round or an earlier one;
    /// for a pull from a peer ahead of us (we are catching up after a restart or a partition),
    /// taken if it comes but never waited for. That peer may itself be waiting, through a third
    /// peer, for us to announce our next round: awaiting it closed a wait-for cycle that only a
    /// deadline broke (`tests::a_restart_behind_peers_with_jittered_links_waits_on_no_deadline`).
    /// After a fetch nothing follows.
    pub(super) fn serve(&mut self, from: NodeId, handle: H, pull_round: Option<u64>) {
        match pull_round {
            Some(round) if round > self.current_step() => self.inbox.expect_ahead(from),
            Some(_) => self.stragglers.expect(&mut self.inbox, from),
            None => {}
        }
        self.actions.push_back(Action::Serve {
            to: from,
            handle,
            version: self.version,
            params: self.snapshot.clone(),
        });
    }
}
