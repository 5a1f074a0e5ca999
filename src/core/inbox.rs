//! The owner's side of the M-step (FedeRiCo spec §3.2 steps 6–7 and §6).
//! Owns: which weighted gradients an owner waits for, which it accepts, the optional per-sender
//! norm clipping (spec §6, security), the norm bound learned from the accepted history
//! ([`NormBound`]), and their sum.
//! Must not: apply the optimizer step (the driver's learner does), read clocks (deadlines are
//! the driver's), or trust its inputs: every rejection is a value, never a panic, and a
//! rejected gradient or skip leaves the inbox exactly as it was.

use crate::ids::NodeId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Why a gradient (or `Skip`) was not accepted.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Rejection {
    /// Computed at an older version of the model (spec §6: stale gradients are dropped).
    #[error("stale: for version {got}, current is {current}")]
    Stale {
        /// Version the gradient was computed at.
        got: u64,
        /// Version the owner holds.
        current: u64,
    },
    /// Tagged with a version the owner never served.
    #[error("unknown version {got}, current is {current}")]
    FutureVersion {
        /// Version named by the sender.
        got: u64,
        /// Version the owner holds.
        current: u64,
    },
    /// The sender was not served this version.
    #[error("not served this version")]
    Unexpected,
    /// A second gradient from the same sender for the same version.
    #[error("duplicate")]
    Duplicate,
    /// Wrong number of values.
    #[error("wrong length: expected {expected}, got {got}")]
    WrongLength {
        /// Parameters of the model.
        expected: usize,
        /// Values received.
        got: usize,
    },
    /// A NaN or infinite value.
    #[error("non-finite value")]
    NonFinite,
}

/// Gradients for one version of an owner's model.
#[derive(Clone, Debug)]
pub struct GradientInbox {
    version: u64,
    len: usize,
    /// Each accepted gradient is scaled down to at most this L2 norm (`None`: no clipping).
    clip_norm: Option<f64>,
    expected: BTreeSet<NodeId>,
    /// Expected senders the owner does not wait for (see [`Stragglers`]).
    unawaited: BTreeSet<NodeId>,
    /// Served while ahead of the owner ([`Self::expect_ahead`]).
    ahead: BTreeSet<NodeId>,
    received: BTreeMap<NodeId, Option<Vec<f32>>>,
    /// The L2 norm of each received gradient (after `clip_norm`), by sender.
    norms: BTreeMap<NodeId, f64>,
    /// `(owner, b)`: every other sender's gradient is scaled down to an L2 norm of at most b
    /// in [`Self::sum`] ([`NormBound::apply`]).
    bound: Option<(NodeId, f64)>,
    /// `(owner, c)`: the others' summed gradient is scaled down to at most c times the L2 norm
    /// of the owner's own ([`Self::with_foreign_cap`]).
    foreign_cap: Option<(NodeId, f64)>,
    /// Other senders whose gradient points against the owner's own, left out of the sum
    /// ([`Self::leave_out_opposed`]).
    left_out: BTreeSet<NodeId>,
}

impl GradientInbox {
    /// An empty inbox for `version` of a model with `len` parameters.
    pub fn new(version: u64, len: usize) -> Self {
        Self {
            version,
            len,
            clip_norm: None,
            expected: BTreeSet::new(),
            unawaited: BTreeSet::new(),
            ahead: BTreeSet::new(),
            received: BTreeMap::new(),
            norms: BTreeMap::new(),
            bound: None,
            foreign_cap: None,
            left_out: BTreeSet::new(),
        }
    }

    /// Clips every accepted gradient to an L2 norm of at most `clip_norm` (when `Some`) before it
    /// is summed: no single sender — a malicious sampler included — moves the step by more than
    /// that (spec §6, security). Applies to every sender alike, the owner's own gradient too.
    /// Call before the first gradient arrives.
    pub fn with_clip_norm(mut self, clip_norm: Option<f64>) -> Self {
        self.clip_norm = clip_norm;
        self
    }

    /// Beyond the paper: `Some(c)` caps the others' gradients against the owner's `me` own. The
    /// step's input is then the owner's gradient plus the others' sum, that sum scaled down (its
    /// direction kept) to an L2 norm of at most c times the owner's gradient's. So an owner's
    /// model is trained mostly on its own data whatever its samplers push: with few silos,
    /// where every silo samples every model, the paper's rule trains every model on every silo
    /// alike and the weights never separate. Without the owner's own gradient (not in yet at a
    /// deadline), the plain sum. `None`: the plain sum (the paper's).
    pub fn with_foreign_cap(mut self, me: NodeId, cap: Option<f64>) -> Self {
        self.foreign_cap = cap.map(|c| (me, c));
        self
    }

    /// Beyond the paper, a defence against gradients of the wrong *direction* (insiders'
    /// review P2; `docs/insiders.md`): every other sender's gradient whose dot product with the
    /// owner `me`'s own is negative — a step along it would raise the owner's loss on its own
    /// rows, to first order — is left out of [`Self::sum`]. Returns them, in node-id order.
    /// Without the owner's own gradient (not in yet at a deadline), nothing is left out. Call
    /// once, before the step (the owner does when `drop_opposed` is on).
    pub fn leave_out_opposed(&mut self, me: NodeId) -> Vec<NodeId> {
        let opposed = self.opposed(me).unwrap_or_default();
        self.leave_out(&opposed);
        opposed
    }

    /// The other senders whose gradient points against the owner `me`'s own (a negative dot
    /// product), in node-id order; `None` without the owner's own gradient (nothing to judge
    /// by).
    pub fn opposed(&self, me: NodeId) -> Option<Vec<NodeId>> {
        self.cosines(me).map(|c| opposed_of(&c))
    }

    /// The cosine of each other sender's gradient with the owner `me`'s own, in node-id order
    /// (0 for a zero gradient); `None` without the owner's own gradient. One dot product per
    /// sender; the norms are the ones kept at arrival.
    pub fn cosines(&self, me: NodeId) -> Option<Vec<(NodeId, f64)>> {
        let Some(Some(own)) = self.received.get(&me) else {
            return None;
        };
        let norm = |k: &NodeId| self.norms.get(k).copied().unwrap_or(0.0);
        let own_norm = norm(&me);
        Some(
            self.received
                .iter()
                .filter(|(k, _)| **k != me)
                .filter_map(|(&k, g)| g.as_ref().map(|g| (k, g)))
                .map(|(k, g)| {
                    let n = own_norm * norm(&k);
                    (k, if n > 0.0 { dot(g, own) / n } else { 0.0 })
                })
                .collect(),
        )
    }

    /// Leaves the gradients of `senders` out of [`Self::sum`] (the owner's own is never left
    /// out: callers pass other senders only).
    pub fn leave_out(&mut self, senders: &[NodeId]) {
        self.left_out.extend(senders.iter().copied());
    }

    /// The version this inbox collects for.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Records that `from` was served this version, so a gradient from it is awaited. The owner
    /// itself must be expected too: its own gradient is one of the inputs.
    pub fn expect(&mut self, from: NodeId) {
        self.expected.insert(from);
    }

    /// Records that `from` was served this version without waiting for it: its gradient is
    /// taken if it comes before the step, but [`Self::is_complete`] does not wait for it (a
    /// sampler late round after round, see [`Stragglers`]).
    pub fn expect_unawaited(&mut self, from: NodeId) {
        self.expected.insert(from);
        self.unawaited.insert(from);
    }

    /// Records that `from`, a peer in a later round than the owner's, was served this version:
    /// its gradient is taken if it comes before the step, never waited for, and a missing one
    /// does not count against it ([`Stragglers::handle_step`]): it was not the owner's round.
    pub fn expect_ahead(&mut self, from: NodeId) {
        self.expected.insert(from);
        self.unawaited.insert(from);
        self.ahead.insert(from);
    }

    /// `from` can no longer answer this version (its connection is gone): stop waiting for
    /// it. A gradient from it is still taken if it comes before the step.
    pub fn stop_awaiting(&mut self, from: NodeId) {
        if self.expected.contains(&from) {
            self.unawaited.insert(from);
        }
    }

    fn check(&self, from: NodeId, version: u64) -> Result<(), Rejection> {
        if version < self.version {
            return Err(Rejection::Stale {
                got: version,
                current: self.version,
            });
        }
        if version > self.version {
            return Err(Rejection::FutureVersion {
                got: version,
                current: self.version,
            });
        }
        if !self.expected.contains(&from) {
            return Err(Rejection::Unexpected);
        }
        if self.received.contains_key(&from) {
            return Err(Rejection::Duplicate);
        }
        Ok(())
    }

    /// Accepts at most one weighted gradient per (sender, version), of the model's length, with
    /// finite values, from a sender that was served this version; clipped if configured.
    pub fn handle_gradient(
        &mut self,
        from: NodeId,
        version: u64,
        mut grad: Vec<f32>,
    ) -> Result<(), Rejection> {
        self.check(from, version)?;
        if grad.len() != self.len {
            return Err(Rejection::WrongLength {
                expected: self.len,
                got: grad.len(),
            });
        }
        if grad.iter().any(|g| !g.is_finite()) {
            return Err(Rejection::NonFinite);
        }
        if let Some(clip) = self.clip_norm {
            clip_to_norm(&mut grad, clip);
        }
        self.norms.insert(from, l2(&grad));
        self.received.insert(from, Some(grad));
        Ok(())
    }

    /// Accepts a `Skip`: the sender releases the owner's wait without a gradient.
    pub fn handle_skip(&mut self, from: NodeId, version: u64) -> Result<(), Rejection> {
        self.check(from, version)?;
        self.received.insert(from, None);
        Ok(())
    }

    /// True when every awaited sender has sent a gradient or a `Skip`.
    pub fn is_complete(&self) -> bool {
        self.missing().next().is_none()
    }

    /// Awaited senders that have not answered yet.
    pub fn missing(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.expected
            .iter()
            .copied()
            .filter(|id| !self.received.contains_key(id) && !self.unawaited.contains(id))
    }

    /// Number of gradients (not skips) received.
    pub fn gradients(&self) -> usize {
        self.received.values().filter(|g| g.is_some()).count()
    }

    /// The sum of the received gradients, added in node-id order so the result does not depend
    /// on arrival order (spec §5.4: one step per model per round on the sum).
    /// Each other sender's gradient enters scaled down to the owner's norm bound first, when
    /// one is set ([`NormBound::apply`]).
    pub fn sum(&self) -> Vec<f32> {
        if let Some((me, cap)) = self.foreign_cap
            && let Some(Some(own)) = self.received.get(&me)
        {
            return self.capped_sum(me, own, cap);
        }
        let mut total = vec![0f32; self.len];
        for (&from, g) in &self.received {
            if let Some(g) = g
                && !self.left_out.contains(&from)
            {
                self.add_bounded(&mut total, from, g);
            }
        }
        total
    }

    /// Adds `g`, from `from`, to `total`, scaled down to the norm bound unless `from` is the
    /// owner or no bound is set.
    fn add_bounded(&self, total: &mut [f32], from: NodeId, g: &[f32]) {
        let scale = match self.bound {
            Some((me, b)) if from != me => {
                let n = self.norms.get(&from).copied().unwrap_or(0.0);
                if n > b { (b / n) as f32 } else { 1.0 }
            }
            _ => 1.0,
        };
        if scale == 1.0 {
            for (t, x) in total.iter_mut().zip(g) {
                *t += x;
            }
        } else {
            for (t, x) in total.iter_mut().zip(g) {
                *t += x * scale;
            }
        }
    }
}

impl GradientInbox {
    /// The owner's gradient `own` plus the others' sum, that sum scaled to an L2 norm of at most
    /// `cap` times `own`'s ([`Self::with_foreign_cap`]).
    fn capped_sum(&self, me: NodeId, own: &[f32], cap: f64) -> Vec<f32> {
        let mut foreign = self.others_sum(me);
        clip_to_norm(&mut foreign, cap * l2(own));
        own.iter().zip(&foreign).map(|(a, b)| a + b).collect()
    }

    /// The others' gradients (every sender but `me`), each bounded and the left-out left out
    /// as in [`Self::sum`], added in node-id order.
    fn others_sum(&self, me: NodeId) -> Vec<f32> {
        let mut foreign = vec![0f32; self.len];
        for (&from, g) in self.received.iter().filter(|(k, _)| **k != me) {
            if let Some(g) = g
                && !self.left_out.contains(&from)
            {
                self.add_bounded(&mut foreign, from, g);
            }
        }
        foreign
    }

    /// The owner `me`'s own gradient, when it is in.
    pub fn own(&self, me: NodeId) -> Option<&[f32]> {
        self.received.get(&me).and_then(|g| g.as_deref())
    }

    /// The others' part of [`Self::sum`] for the owner `me`: their gradients as the sum takes
    /// them (bounded, the left-out left out), that part capped against the owner's own
    /// gradient ([`Self::with_foreign_cap`]) when the cap is set and the own gradient is in.
    /// `mstep = "local_epoch"` holds it through the owner's own sub-steps.
    pub fn foreign_sum(&self, me: NodeId) -> Vec<f32> {
        let mut foreign = self.others_sum(me);
        if let Some((owner, cap)) = self.foreign_cap
            && owner == me
            && let Some(Some(own)) = self.received.get(&me)
        {
            clip_to_norm(&mut foreign, cap * l2(own));
        }
        foreign
    }
}

/// The senders of `cosines` whose gradient points against the owner's (a negative cosine, so a
/// negative dot product; a zero gradient is not opposed).
pub(crate) fn opposed_of(cosines: &[(NodeId, f64)]) -> Vec<NodeId> {
    cosines
        .iter()
        .filter(|(_, c)| *c < 0.0)
        .map(|(k, _)| *k)
        .collect()
}

/// The dot product of `a` and `b`, computed in f64.
fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// The L2 norm of `g`, computed in f64.
pub(crate) fn l2(g: &[f32]) -> f64 {
    g.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()
}

/// Scales `g` so that its L2 norm is at most `clip` (computed in f64; finite values only).
fn clip_to_norm(g: &mut [f32], clip: f64) {
    let norm = l2(g);
    if norm > clip {
        let scale = (clip / norm) as f32;
        for x in g {
            *x *= scale;
        }
    }
}

/// The owner's bound on the size of the others' gradients, learned from the federation itself
/// (insiders' review P2/P3): at each step every other sender's gradient enters the sum scaled
/// down (its direction kept) to an L2 norm of at most `k` times the *reference*, the lower
/// median of the norms of the last [`NormBound::HISTORY`] gradients the owner summed (as
/// bounded) together with this step's. The owner's own gradient is never scaled and counts in
/// the reference, so from its first step the owner has a yardstick no sampler chose: a single
/// gradient of 3.4e38, or ×10⁶ ones, enters at k times a typical honest gradient, and a
/// minority of senders (below half of the recent gradients) cannot move the reference.
/// Honest gradients sit well inside k = [`DEFAULT_NORM_BOUND`]: on the quality suite the bound
/// changes nothing measurable (`docs/insiders.md`).
#[derive(Clone, Debug)]
pub struct NormBound {
    k: Option<f64>,
    history: VecDeque<f64>,
    /// Senders whose gradient was scaled down at least once (each is reported once).
    reported: BTreeSet<NodeId>,
}

/// The norm bound's k when none is configured: a sender may weigh in at most this many times a
/// typical gradient of the federation.
pub const DEFAULT_NORM_BOUND: f64 = 10.0;

/// A gradient [`NormBound::apply`] scaled down.
#[derive(Clone, Debug, PartialEq)]
pub struct Bounded {
    /// The sender.
    pub from: NodeId,
    /// Its gradient's L2 norm.
    pub norm: f64,
    /// The bound it was scaled to.
    pub bound: f64,
    /// The first time this sender's gradient was bounded.
    pub first: bool,
}

impl NormBound {
    /// Norms of recently summed gradients the reference is taken over.
    pub const HISTORY: usize = 64;

    /// A bound of `k` times the reference; `None` or 0: no bound (every gradient as it came).
    pub fn new(k: Option<f64>) -> Self {
        Self {
            k: k.filter(|&k| k > 0.0),
            history: VecDeque::new(),
            reported: BTreeSet::new(),
        }
    }

    /// The bound an inbox with these received norms would get (`None` without one).
    fn bound_for(&self, norms: impl Iterator<Item = f64>) -> Option<f64> {
        let k = self.k?;
        let mut all: Vec<f64> = self
            .history
            .iter()
            .copied()
            .chain(norms)
            .filter(|n| *n > 0.0)
            .collect();
        if all.is_empty() {
            return None;
        }
        all.sort_by(f64::total_cmp);
        Some(k * all[(all.len() - 1) / 2])
    }

    /// Sets the bound of `inbox`, the owner `me`'s, before its step, records the gradients it
    /// sums (in node-id order, so every driver learns the same history), and returns the ones
    /// it scales down.
    pub fn apply(&mut self, inbox: &mut GradientInbox, me: NodeId) -> Vec<Bounded> {
        let Some(b) = self.bound_for(inbox.norms.values().copied()) else {
            return Vec::new();
        };
        inbox.bound = Some((me, b));
        let mut out = Vec::new();
        for (&from, &n) in &inbox.norms {
            let kept = if from != me && n > b {
                out.push(Bounded {
                    from,
                    norm: n,
                    bound: b,
                    first: self.reported.insert(from),
                });
                b
            } else {
                n
            };
            self.history.push_back(kept);
            if self.history.len() > Self::HISTORY {
                self.history.pop_front();
            }
        }
        out
    }
}

/// Rounds a sampler stays on probation after it missed a step, at least
/// ([`Stragglers::on_probation`]).
pub const PROBATION_ROUNDS: u64 = 100;
/// How long a sampler stays on probation after it missed a step, at least, in gradient
/// deadlines (τ_grad): in a fast federation 100 rounds pass in seconds.
pub const PROBATION_DEADLINES: u32 = 100;

/// The samplers an owner stops waiting for (spec §6, stragglers: "a persistently slow sampler
/// simply has less influence on the models it uses"). Each served sampler has a lateness count:
/// a step it missed adds one (up to `2·after`); an answer (gradient or `Skip`) before the step
/// clears it, or takes one off while it is a straggler. A sampler counting `after` or more is
/// served without being awaited: its gradient still counts if it comes before the step, and
/// after enough answers in time it is awaited again. So one answer that beat a slow step does
/// not make the owner wait for a straggler again, and a straggler that is fast again is
/// awaited again within `after` rounds. Without this, one slow silo makes every owner it
/// samples wait τ_grad every round.
///
/// A sampler that missed a step and has not been heard from since — no gradient or `Skip`
/// came for that version, even late — is *silent*: it is not awaited until it answers again.
/// So a peer that pulls and never pushes (a crashed sampler, a hostile member) costs an owner
/// one τ_grad, once; a slow sampler, whose late gradient arrives after the step
/// ([`Self::handle_late`]), is still counted by the lateness rule above.
///
/// A sampler that missed a step is also *on probation* for [`PROBATION_ROUNDS`] rounds
/// ([`Self::on_probation`]), whatever it sends in between: an owner waits for it then only a
/// short grace, never τ_grad again (insiders' review, M5r: a late answer, even a refused one,
/// cleared the silent mark and re-armed the full wait).
#[derive(Clone, Debug)]
pub struct Stragglers {
    after: u32,
    /// Consecutive steps each sampler missed (absent = 0).
    late: BTreeMap<NodeId, u32>,
    /// Samplers that missed a step and sent nothing since.
    silent: BTreeSet<NodeId>,
    /// The round and the time of each sampler's last missed step.
    missed_in: BTreeMap<NodeId, (u64, Instant)>,
    /// How long probation lasts at least.
    probation_for: Duration,
}

impl Stragglers {
    /// Stops waiting after `after` missed steps in a row (at least 1).
    pub fn new(after: u32) -> Self {
        Self {
            after: after.max(1),
            late: BTreeMap::new(),
            silent: BTreeSet::new(),
            missed_in: BTreeMap::new(),
            probation_for: Duration::ZERO,
        }
    }

    /// Probation lasts at least [`PROBATION_DEADLINES`] times `gradient_deadline` (τ_grad).
    pub fn with_probation(mut self, gradient_deadline: Duration) -> Self {
        self.probation_for = gradient_deadline * PROBATION_DEADLINES;
        self
    }

    /// Whether `from` missed a step within [`PROBATION_ROUNDS`] rounds before `round`, or
    /// within [`PROBATION_DEADLINES`] τ_grad before `now`: an owner waits for it only a short
    /// grace (`core::round`'s round-over rule), whatever it sent since. So a member that
    /// withholds its gradient makes an owner wait out τ_grad at most once per 100 rounds and
    /// per 100 τ_grad (at most about 1 % of the time), and a late answer cannot re-arm the full
    /// wait.
    pub fn on_probation(&self, from: NodeId, round: u64, now: Instant) -> bool {
        self.missed_in.get(&from).is_some_and(|&(r, at)| {
            round.saturating_sub(r) < PROBATION_ROUNDS
                || now.saturating_duration_since(at) < self.probation_for
        })
    }

    /// Whether the owner waits for `from`'s gradient.
    pub fn awaits(&self, from: NodeId) -> bool {
        !self.silent.contains(&from) && self.late.get(&from).is_none_or(|&n| n < self.after)
    }

    /// `from` answered for a version the owner already stepped past (a stale gradient or
    /// `Skip`): it is slow, not silent.
    pub fn handle_late(&mut self, from: NodeId) {
        self.silent.remove(&from);
    }

    /// Records in `inbox` that `from` was served: awaited unless it is a straggler.
    pub fn expect(&self, inbox: &mut GradientInbox, from: NodeId) {
        if self.awaits(from) {
            inbox.expect(from);
        } else {
            inbox.expect_unawaited(from);
        }
    }

    /// Learns from the inbox an owner steps on in `round` at `now`: who answered in time, who
    /// did not.
    pub fn handle_step(&mut self, inbox: &GradientInbox, round: u64, now: Instant) {
        for &from in inbox.expected.difference(&inbox.ahead) {
            let late = self.late.entry(from).or_default();
            if !inbox.received.contains_key(&from) {
                *late = (*late + 1).min(2 * self.after);
                self.silent.insert(from);
                self.missed_in.insert(from, (round, now));
                continue;
            }
            self.silent.remove(&from);
            if *late >= self.after {
                *late -= 1;
            } else {
                *late = 0;
            }
            if *late == 0 {
                self.late.remove(&from);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gradient_against_the_owners_own_is_left_out_only_with_drop_opposed() {
        let (me, honest, flipper) = (NodeId(0), NodeId(1), NodeId(2));
        // `on`: the owner leaves out opposed gradients before its step, as with drop_opposed.
        let fill = |on: bool, own: bool, cap: Option<f64>| {
            let mut inbox = GradientInbox::new(0, 2).with_foreign_cap(me, cap);
            for k in [me, honest, flipper] {
                inbox.expect(k);
            }
            if own {
                inbox.handle_gradient(me, 0, vec![1.0, 1.0]).unwrap();
            }
            inbox.handle_gradient(honest, 0, vec![2.0, -0.5]).unwrap();
            inbox.handle_gradient(flipper, 0, vec![-1.0, -3.0]).unwrap();
            let left_out = if on {
                inbox.leave_out_opposed(me)
            } else {
                Vec::new()
            };
            (inbox, left_out)
        };
        let (on, left_out) = fill(true, true, None);
        assert_eq!(left_out, vec![flipper]);
        assert_eq!(on.sum(), vec![3.0, 0.5]);
        // Off: the plain sum; on, but without the owner's own gradient: nothing to compare with.
        assert_eq!(fill(false, true, None).0.sum(), vec![2.0, -2.5]);
        let (no_own, left_out) = fill(true, false, None);
        assert!(left_out.is_empty());
        assert_eq!(no_own.sum(), vec![1.0, -3.5]);
        // With the foreign cap, the same gradients are left out.
        assert_eq!(fill(true, true, Some(100.0)).0.sum(), vec![3.0, 0.5]);
    }

    #[test]
    fn cosines_compare_each_sender_with_the_owners_own_gradient() {
        let (me, a, b, z) = (NodeId(0), NodeId(1), NodeId(2), NodeId(3));
        let mut inbox = GradientInbox::new(0, 2);
        for k in [me, a, b, z] {
            inbox.expect(k);
        }
        inbox.handle_gradient(a, 0, vec![3.0, 0.0]).unwrap();
        assert_eq!(inbox.cosines(me), None);
        inbox.handle_gradient(me, 0, vec![1.0, 0.0]).unwrap();
        inbox.handle_gradient(b, 0, vec![-1.0, 1.0]).unwrap();
        inbox.handle_gradient(z, 0, vec![0.0, 0.0]).unwrap();
        let c = inbox.cosines(me).unwrap();
        assert_eq!(c[0], (a, 1.0));
        assert_eq!(c[1].0, b);
        assert!((c[1].1 + 0.5f64.sqrt()).abs() < 1e-12);
        assert_eq!(c[2], (z, 0.0));
        assert_eq!(inbox.opposed(me), Some(vec![b]));
    }

    #[test]
    fn a_persistently_late_sampler_is_taken_but_not_awaited() {
        let (me, slow) = (NodeId(0), NodeId(1));
        let mut st = Stragglers::new(3);
        for round in 0..3u64 {
            let mut inbox = GradientInbox::new(round, 2);
            inbox.expect(me);
            st.expect(&mut inbox, slow);
            inbox.handle_gradient(me, round, vec![1.0, 1.0]).unwrap();
            assert!(!inbox.is_complete(), "round {round}: still awaited");
            assert_eq!(inbox.missing().collect::<Vec<_>>(), vec![slow]);
            st.handle_step(&inbox, 0, Instant::now());
            // Its gradient comes after the step: late, not silent.
            st.handle_late(slow);
        }
        // Three steps missed in a row: served without waiting, its gradient still counts.
        assert!(!st.awaits(slow));
        let mut inbox = GradientInbox::new(3, 2);
        inbox.expect(me);
        st.expect(&mut inbox, slow);
        inbox.handle_gradient(me, 3, vec![1.0, 1.0]).unwrap();
        assert!(inbox.is_complete());
        inbox.handle_gradient(slow, 3, vec![2.0, 2.0]).unwrap();
        assert_eq!(inbox.sum(), vec![3.0, 3.0]);
        // On time once after three misses: awaited again (the count falls below 3).
        st.handle_step(&inbox, 0, Instant::now());
        assert!(st.awaits(slow));
        // Many misses saturate at 2·3 = 6: then it takes four answers in time to be awaited
        // again (6 → 5 → 4 → 3 → 2), each a Skip or a gradient before the step.
        for v in 4..14u64 {
            let mut inbox = GradientInbox::new(v, 2);
            st.expect(&mut inbox, slow);
            st.handle_step(&inbox, 0, Instant::now());
        }
        for (n, v) in (14..18u64).enumerate() {
            assert!(!st.awaits(slow), "after {n} answers");
            let mut inbox = GradientInbox::new(v, 2);
            st.expect(&mut inbox, slow);
            inbox.handle_skip(slow, v).unwrap();
            st.handle_step(&inbox, 0, Instant::now());
        }
        assert!(st.awaits(slow));
    }

    #[test]
    fn a_sampler_that_pulls_and_never_answers_is_awaited_once() {
        let (me, silent) = (NodeId(0), NodeId(1));
        let mut st = Stragglers::new(3);
        let mut inbox = GradientInbox::new(0, 2);
        inbox.expect(me);
        st.expect(&mut inbox, silent);
        inbox.handle_gradient(me, 0, vec![1.0, 1.0]).unwrap();
        assert!(!inbox.is_complete(), "the first time it is awaited");
        st.handle_step(&inbox, 0, Instant::now());
        // Nothing came, not even late: the next pull is served without waiting.
        assert!(!st.awaits(silent));
        let mut inbox = GradientInbox::new(1, 2);
        inbox.expect(me);
        st.expect(&mut inbox, silent);
        inbox.handle_gradient(me, 1, vec![1.0, 1.0]).unwrap();
        assert!(inbox.is_complete());
        // A late answer for the version it missed shows it is alive: awaited again.
        st.handle_step(&inbox, 0, Instant::now());
        st.handle_late(silent);
        assert!(st.awaits(silent), "one miss is below suspect_after = 3");
        // An answer in time clears it as well.
        let mut inbox = GradientInbox::new(2, 2);
        st.expect(&mut inbox, silent);
        st.handle_step(&inbox, 0, Instant::now());
        assert!(!st.awaits(silent));
        let mut inbox = GradientInbox::new(3, 2);
        st.expect(&mut inbox, silent);
        inbox.handle_skip(silent, 3).unwrap();
        st.handle_step(&inbox, 0, Instant::now());
        assert!(st.awaits(silent));
    }

    /// Insiders' review P3 and P2: one gradient of the largest finite f32, and ×10⁶ ones, enter
    /// the step at k times a typical gradient, from the owner's first step on; honest ones
    /// pass untouched.
    #[test]
    fn the_norm_bound_scales_extreme_gradients_to_a_fair_share_from_the_first_step() {
        let (me, a, b, mal) = (NodeId(0), NodeId(1), NodeId(2), NodeId(3));
        let mut nb = NormBound::new(Some(5.0));
        let mut sums = Vec::new();
        for v in 0..20u64 {
            let mut inbox = GradientInbox::new(v, 2);
            for id in [me, a, b, mal] {
                inbox.expect(id);
            }
            inbox.handle_gradient(me, v, vec![0.3, 0.4]).unwrap(); // norm 0.5
            inbox.handle_gradient(a, v, vec![0.6, 0.8]).unwrap(); // norm 1
            inbox.handle_gradient(b, v, vec![-0.3, 0.4]).unwrap(); // norm 0.5
            let bad = if v % 2 == 0 { f32::MAX } else { -1e6 };
            inbox.handle_gradient(mal, v, vec![bad, 0.0]).unwrap();
            let bounded = nb.apply(&mut inbox, me);
            assert_eq!(bounded.len(), 1, "{bounded:?}");
            assert_eq!(bounded[0].from, mal);
            assert_eq!(bounded[0].first, v == 0);
            // Reference: the lower median of the norms, 0.5; the bound 2.5.
            assert!((bounded[0].bound - 2.5).abs() < 1e-6, "{bounded:?}");
            let sum = inbox.sum();
            assert!(sum.iter().all(|x| x.is_finite()));
            sums.push(sum);
        }
        // Honest part (0.6, 1.6) plus the attacker's ±2.5 along x.
        for (v, s) in sums.iter().enumerate() {
            let x = if v % 2 == 0 { 0.6 + 2.5 } else { 0.6 - 2.5 };
            assert!(
                (s[0] - x).abs() < 1e-5 && (s[1] - 1.6).abs() < 1e-5,
                "{v}: {s:?}"
            );
        }
        // Off: the plain sum, as before.
        let mut inbox = GradientInbox::new(0, 2);
        inbox.expect(me);
        inbox.expect(mal);
        inbox.handle_gradient(me, 0, vec![0.3, 0.4]).unwrap();
        inbox.handle_gradient(mal, 0, vec![1e6, 0.0]).unwrap();
        assert!(NormBound::new(None).apply(&mut inbox, me).is_empty());
        assert_eq!(inbox.sum(), vec![1e6 + 0.3, 0.4]);
    }

    /// The reference is a lower median: a minority of senders, however large their gradients,
    /// cannot move it; and the owner's own gradient is never scaled, however large.
    #[test]
    fn a_minority_cannot_raise_the_norm_bound_and_the_owner_is_never_bounded() {
        let me = NodeId(0);
        let mut nb = NormBound::new(Some(5.0));
        for v in 0..200u64 {
            let mut inbox = GradientInbox::new(v, 1);
            for k in 0..8 {
                inbox.expect(NodeId(k));
            }
            inbox.handle_gradient(me, v, vec![100.0]).unwrap();
            for k in 1..5 {
                inbox.handle_gradient(NodeId(k), v, vec![1.0]).unwrap();
            }
            // Three colluders send what the last bound allowed, to ratchet it up.
            for k in 5..8 {
                inbox.handle_gradient(NodeId(k), v, vec![1e30]).unwrap();
            }
            let bounded = nb.apply(&mut inbox, me);
            assert_eq!(bounded.len(), 3, "round {v}");
            assert!(bounded.iter().all(|b| b.bound == 5.0), "{bounded:?}");
            let sum = inbox.sum()[0];
            assert!((sum - 119.0).abs() < 1e-4, "round {v}: {sum}");
        }
    }

    #[test]
    fn accepts_each_expected_sender_once_and_sums_in_id_order() {
        let mut a = GradientInbox::new(3, 2);
        let mut b = GradientInbox::new(3, 2);
        for inbox in [&mut a, &mut b] {
            inbox.expect(NodeId(0));
            inbox.expect(NodeId(5));
        }
        assert!(!a.is_complete());
        a.handle_gradient(NodeId(0), 3, vec![1e8, 1.0]).unwrap();
        a.handle_gradient(NodeId(5), 3, vec![-1e8, 2.0]).unwrap();
        b.handle_gradient(NodeId(5), 3, vec![-1e8, 2.0]).unwrap();
        b.handle_gradient(NodeId(0), 3, vec![1e8, 1.0]).unwrap();
        assert!(a.is_complete());
        assert_eq!(a.sum(), b.sum());
        assert_eq!(
            a.handle_gradient(NodeId(0), 3, vec![0.0, 0.0]),
            Err(Rejection::Duplicate)
        );
    }

    #[test]
    fn rejects_stale_future_unexpected_bad_shape_and_non_finite() {
        let mut i = GradientInbox::new(3, 2);
        i.expect(NodeId(1));
        assert_eq!(
            i.handle_gradient(NodeId(1), 2, vec![0.0; 2]),
            Err(Rejection::Stale { got: 2, current: 3 })
        );
        assert!(matches!(
            i.handle_gradient(NodeId(1), 4, vec![0.0; 2]),
            Err(Rejection::FutureVersion { .. })
        ));
        assert_eq!(
            i.handle_gradient(NodeId(9), 3, vec![0.0; 2]),
            Err(Rejection::Unexpected)
        );
        assert!(matches!(
            i.handle_gradient(NodeId(1), 3, vec![0.0; 3]),
            Err(Rejection::WrongLength { .. })
        ));
        assert_eq!(
            i.handle_gradient(NodeId(1), 3, vec![f32::NAN, 0.0]),
            Err(Rejection::NonFinite)
        );
        // none of the rejections changed the state
        assert_eq!(i.gradients(), 0);
        assert_eq!(i.missing().collect::<Vec<_>>(), vec![NodeId(1)]);
    }

    #[test]
    fn skip_completes_without_adding() {
        let mut i = GradientInbox::new(0, 1);
        i.expect(NodeId(0));
        i.expect(NodeId(1));
        i.handle_gradient(NodeId(0), 0, vec![2.0]).unwrap();
        i.handle_skip(NodeId(1), 0).unwrap();
        assert!(i.is_complete());
        assert_eq!(i.sum(), vec![2.0]);
        assert_eq!(i.handle_skip(NodeId(1), 0), Err(Rejection::Duplicate));
    }

    fn norm(g: &[f32]) -> f64 {
        g.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()
    }

    #[test]
    fn a_foreign_cap_scales_the_others_sum_against_the_owners_gradient() {
        let inbox = |cap| {
            let mut i = GradientInbox::new(0, 2).with_foreign_cap(NodeId(0), cap);
            for k in 0..4 {
                i.expect(NodeId(k));
            }
            i.handle_gradient(NodeId(1), 0, vec![6.0, 0.0]).unwrap();
            i.handle_gradient(NodeId(2), 0, vec![0.0, 8.0]).unwrap();
            i.handle_skip(NodeId(3), 0).unwrap();
            i
        };
        // The owner's gradient has norm 5; the others' sum (6, 8) has norm 10.
        let mut i = inbox(Some(0.5));
        // Without the owner's gradient (not in yet): the plain sum.
        assert_eq!(i.sum(), vec![6.0, 8.0]);
        i.handle_gradient(NodeId(0), 0, vec![3.0, 4.0]).unwrap();
        // Capped to 0.5 × 5 = 2.5, direction kept: (1.5, 2).
        assert_eq!(i.sum(), vec![4.5, 6.0]);
        // `local_epoch` holds the others' part alone, capped as in the sum, and the own.
        assert_eq!(i.foreign_sum(NodeId(0)), vec![1.5, 2.0]);
        assert_eq!(i.own(NodeId(0)), Some(&[3.0f32, 4.0][..]));
        // A cap above the others' norm leaves the sum as it is.
        let mut i = inbox(Some(3.0));
        i.handle_gradient(NodeId(0), 0, vec![3.0, 4.0]).unwrap();
        assert_eq!(i.sum(), vec![9.0, 12.0]);
        let mut i = inbox(None);
        i.handle_gradient(NodeId(0), 0, vec![3.0, 4.0]).unwrap();
        assert_eq!(i.sum(), vec![9.0, 12.0]);
        assert_eq!(i.foreign_sum(NodeId(0)), vec![6.0, 8.0]);
    }

    #[test]
    fn clipping_bounds_each_senders_norm_and_keeps_its_direction() {
        let mut i = GradientInbox::new(0, 2).with_clip_norm(Some(1.0));
        for k in 0..3 {
            i.expect(NodeId(k));
        }
        i.handle_gradient(NodeId(0), 0, vec![3.0, 4.0]).unwrap(); // norm 5 → 1
        i.handle_gradient(NodeId(1), 0, vec![0.3, 0.4]).unwrap(); // norm 0.5: kept
        // A huge but finite gradient (its squares overflow f32, not f64).
        i.handle_gradient(NodeId(2), 0, vec![-3e38, 0.0]).unwrap();
        let sum = i.sum();
        let want = [0.6 + 0.3 - 1.0, 0.8 + 0.4];
        for (s, w) in sum.iter().zip(want) {
            assert!((f64::from(*s) - w).abs() < 1e-6, "{sum:?}");
        }
        assert!(norm(&sum) <= 3.0 + 1e-6);
        // No clipping configured: the sum is the plain sum.
        let mut j = GradientInbox::new(0, 2);
        j.expect(NodeId(0));
        j.handle_gradient(NodeId(0), 0, vec![3.0, 4.0]).unwrap();
        assert_eq!(j.sum(), vec![3.0, 4.0]);
    }

    #[test]
    fn a_clipped_gradient_has_at_most_the_clip_norm() {
        for (clip, g) in [
            (0.5, vec![1.0f32; 1000]),
            (1e-3, vec![1e-2, -7.0, 3.5]),
            (2.0, vec![0.0, 0.0]),
        ] {
            let mut g2 = g.clone();
            clip_to_norm(&mut g2, clip);
            assert!(norm(&g2) <= clip * (1.0 + 1e-6), "{clip}: {}", norm(&g2));
            if norm(&g) > clip {
                assert!((norm(&g2) - clip).abs() <= clip * 1e-5);
            } else {
                assert_eq!(g2, g);
            }
        }
    }

    #[test]
    fn a_rejected_gradient_changes_nothing_even_when_it_would_complete_the_inbox() {
        let mut i = GradientInbox::new(5, 2);
        i.expect(NodeId(0));
        i.expect(NodeId(1));
        i.handle_gradient(NodeId(0), 5, vec![1.0, 1.0]).unwrap();
        let before = (i.sum(), i.gradients(), i.missing().collect::<Vec<_>>());
        for r in [
            i.handle_gradient(NodeId(1), 4, vec![0.0; 2]),
            i.handle_gradient(NodeId(1), 6, vec![0.0; 2]),
            i.handle_gradient(NodeId(1), 5, vec![0.0; 1]),
            i.handle_gradient(NodeId(1), 5, vec![f32::NEG_INFINITY, 0.0]),
            i.handle_gradient(NodeId(2), 5, vec![0.0; 2]),
            i.handle_gradient(NodeId(0), 5, vec![0.0; 2]),
            i.handle_skip(NodeId(1), 4),
            i.handle_skip(NodeId(2), 5),
            i.handle_skip(NodeId(0), 5),
        ] {
            assert!(r.is_err());
        }
        assert!(!i.is_complete());
        assert_eq!(
            (i.sum(), i.gradients(), i.missing().collect::<Vec<_>>()),
            before
        );
    }
}
