//! The FedeRiCo round of one peer (spec `federico.md` §6) as a sans-IO state machine.
//!
//! Owns: every rule of a round over an unreliable network — when round 1 may start, when
//! pulling is over, which pull an owner holds for its next version, when an owner may step
//! (`owner.rs`), the deadlines, the stragglers, the evaluation fetches and their
//! renormalisation, when a finished peer may leave — and the order of the jobs a silo's learner
//! runs.
//! Must not: read a clock (time is passed in as `now`), touch sockets, threads or tensors. A
//! driver feeds it events (`handle_*`), executes its [`Action`]s (`poll_action`) and calls
//! [`Round::handle_timeout`] at [`Round::poll_timeout`]. The libp2p node (`net::node`) and the
//! simulator (`sim::federico`) are two such drivers.
//!
//! # A round
//!
//! Round 1 waits (at most `start`) until every member is connected *and* runs FedeRiCo.
//! Round r (the peer has completed r − 1 rounds and holds version v):
//! 1. `peer.sample()`; a [`Action::Pull`] goes to each sampled peer and an [`Action::Notice`]
//!    to every other connected peer, so every owner learns who will (not) pull from it.
//! 2. Models arrive ([`Round::handle_model`]); one that fails or misses τ_model counts as
//!    unreachable (it keeps its last loss).
//! 3. [`Job::Measure`] on what arrived and the own model; the core's E-step gives the fresh
//!    weights; [`Job::Scale`]; the weighted gradients go to their owners.
//! 4. As an owner, the peer served version v to every pull of round r and steps once its
//!    round is over (`owner.rs`); a pull of round r + 1 that arrives before the step is held
//!    until it, so it is served version v + 1. With no faults this is the simulator's
//!    lock-step round, decision for decision.
//! 5. After the step: on evaluation rounds, fetch the post-step models of the peers with
//!    inference weight and score the mixture; the round's [`RoundReport`]; a checkpoint.
//!
//! With a mini-batch M-step (`RoundConfig::sub_steps = Some(S)`, `mstep = "epoch"` by default)
//! steps 1–4 run S times per round. Pulls and notices name the step counted over the run
//! (round·S + sub-step + 1), so the owner's rules above hold per sub-step. The first sub-step
//! samples and measures ([`Job::Measure`] with `batched`, losses on all the silo's data, the
//! gradient on a mini-batch); each later one pulls again only the models the silo sends a
//! gradient to, with the first's weights ([`Job::Descend`]), and notices everyone else.

mod action;
mod job;
mod owner;
mod sampler;
#[cfg(test)]
mod tests;

pub use action::{Action, Asked, Event, ReqId, RoundReport};
pub use job::{Done, Job, Score};

use crate::core::{GradientInbox, NormBound, Peer, Rejection, Stragglers};
use crate::ids::NodeId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The fixed settings of one peer's rounds.
#[derive(Clone, Debug)]
pub struct RoundConfig {
    /// This peer.
    pub me: NodeId,
    /// Members of the federation, this peer included (round 1 waits for all of them).
    pub members: usize,
    /// Rounds to run; `None` runs until stopped.
    pub rounds: Option<u64>,
    /// Evaluate after every `eval_every`-th round (and the last).
    pub eval_every: u64,
    /// Training samples of this silo (the E-step's κ).
    pub n_train: usize,
    /// Parameters of the model.
    pub num_params: usize,
    /// Every accepted gradient is clipped to this L2 norm.
    pub clip_norm: Option<f64>,
    /// Missed steps before a sampler is no longer waited for.
    pub suspect_after: u32,
    /// τ_model: how long pulls and fetches wait for a model.
    pub model_deadline: Duration,
    /// τ_grad: how long an owner waits, once its own gradient is in, for the others.
    pub gradient_deadline: Duration,
    /// How long round 1 waits for the members; with no peer by then, how often it says it is
    /// still waiting.
    pub start_deadline: Duration,
    /// How long in all round 1 waits for a first peer before the silo trains alone; `None`
    /// waits until one comes (a node's default: a silo alone is no federation). A peer
    /// resuming from a checkpoint, or restarted after its last round, never waits here.
    pub alone_after: Option<Duration>,
    /// How long a finished peer keeps serving its final model at most.
    pub linger: Duration,
    /// The M-step (spec §5.5): `None`, one optimizer step per round on each sampler's
    /// full-data gradient (`mstep = "full"`); `Some(S)`, S mini-batch sub-steps per round
    /// (`"epoch"`, `"minibatch"`), each with its own pulls, notices and gradients, the weights
    /// of the round's E-step held. Every member must run the same S: an owner steps once per
    /// sub-step and the pulls name the step.
    pub sub_steps: Option<u64>,
    /// The owner's cap on the others' gradients against its own
    /// ([`FedericoConfig::foreign_cap`](crate::core::FedericoConfig::foreign_cap)).
    pub foreign_cap: Option<f64>,
    /// k of the owner's norm bound on the others' gradients ([`NormBound`]); `None`: none.
    pub norm_bound: Option<f64>,
    /// Whether absent members keep weight ([`crate::core::Defences::weigh_absent`]).
    pub weigh_absent: bool,
    /// Whether the owner leaves out gradients opposed to its own
    /// ([`crate::core::Defences::drop_opposed`]).
    pub drop_opposed: bool,
    /// Whether the owner distrusts members whose gradients it keeps flagging
    /// ([`crate::core::Defences::distrust`]).
    pub distrust: bool,
}

/// A round could not go on.
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    /// The silo's own gradient did not fit its own inbox: the learner and the round disagree.
    #[error("own gradient rejected: {0}")]
    OwnGradient(Rejection),
}

/// Where the peer is in its round.
#[derive(Debug)]
enum Phase {
    /// Waiting for the members to connect before round 1 (since `since`).
    Starting { until: Instant, since: Instant },
    /// Pulls out, waiting for models.
    Pulling {
        deadline: Instant,
        waiting: BTreeSet<NodeId>,
    },
    /// The learner measures losses and gradients.
    Measuring,
    /// The learner scales the gradients by the fresh weights.
    Scaling,
    /// Own gradient in; waiting for the others' gradients and round notices: at most until
    /// `deadline` (τ_grad), and for samplers on probation only until `grace`
    /// ([`Stragglers::on_probation`]; `None` before a first complete round gave a normal
    /// round's length). `grace_passed`: the grace was reached and the round went on (someone
    /// not on probation is still awaited).
    Owning {
        deadline: Instant,
        grace: Option<Instant>,
        grace_passed: bool,
    },
    /// The learner takes the optimizer step.
    Stepping,
    /// Fetching post-step models for evaluation.
    Fetching {
        deadline: Instant,
        waiting: BTreeSet<NodeId>,
    },
    /// The learner scores the mixture.
    Evaluating,
    /// All rounds done; serving the final model until every peer is done or the deadline.
    Lingering { until: Instant },
    /// Done serving.
    Finished,
}

/// A request an owner holds until it has the version to answer with.
#[derive(Debug)]
struct Held<H> {
    from: NodeId,
    handle: H,
    /// `Some(round)` for a pull (a gradient will follow), `None` for a fetch.
    pull_round: Option<u64>,
    /// For a fetch: the version wanted.
    version: u64,
}

/// One peer's rounds. `H` is the driver's handle of an inbound model request (a response
/// channel), held while the request waits for the version it may be answered with.
#[derive(Debug)]
pub struct Round<H> {
    cfg: RoundConfig,
    peer: Peer,
    /// Known nodes: ids `0..known` (members, then late joiners of an open federation).
    known: u32,
    connected: BTreeSet<NodeId>,
    /// Connected peers known to run FedeRiCo (the driver says so, or they sent a FedeRiCo
    /// request): round 1 waits for members in this set, not merely connected.
    speaking: BTreeSet<NodeId>,
    /// The latest round each peer said it is in (pull or notice).
    seen_round: BTreeMap<NodeId, u64>,
    /// Peers that finished their last round.
    done_peers: BTreeSet<NodeId>,
    /// Rounds completed.
    round: u64,
    /// Sub-steps completed in the round in progress (always 0 with one step per round).
    sub: u64,
    /// Models measured at the round's first sub-step (owners other than this peer): the
    /// later sub-steps pull those it pushes gradients to.
    measured: Vec<NodeId>,
    /// v_i.
    version: u64,
    /// The model served to pullers: the latest step's parameters.
    snapshot: Arc<Vec<f32>>,
    inbox: GradientInbox,
    stragglers: Stragglers,
    /// How long a complete owner round takes (a moving average of the rounds that ended with
    /// every awaited gradient in; `None` before the first).
    normal: Option<Duration>,
    /// The owner's bound on the size of the others' gradients.
    bound: NormBound,
    /// Senders whose gradient was left out as opposed to the owner's (each reported once).
    opposed: BTreeSet<NodeId>,
    /// Members distrusted at the last step ([`Peer::is_distrusted`]; each change is reported).
    distrusted: BTreeSet<NodeId>,
    held: Vec<Held<H>>,
    phase: Phase,
    round_started: Instant,
    sampled: Vec<NodeId>,
    received: Vec<(NodeId, u64, Arc<Vec<f32>>)>,
    /// Requests sent and not yet answered.
    outstanding: BTreeMap<ReqId, Asked>,
    /// Pulls given up on: their model may still come, and then gets a `Skip`.
    abandoned: BTreeSet<ReqId>,
    next_req: u64,
    /// The evaluation mixture: `(owner, model, weight)`; an empty model is still awaited.
    fetched: Vec<(NodeId, Arc<Vec<f32>>, f64)>,
    pending: Option<RoundReport>,
    resumed: bool,
    /// Evaluate at the end of the current round even off the `eval_every` schedule (a person
    /// asked for the model now: [`Round::request_evaluation`]).
    evaluate_next: bool,
    actions: VecDeque<Action<H>>,
}

impl<H> Round<H> {
    /// A peer that has completed `round` rounds and holds `params` as version `version` (a
    /// fresh peer: 0, 0). Round 1 (or the next) waits for the members until `now + start`.
    pub fn new(
        cfg: RoundConfig,
        mut peer: Peer,
        round: u64,
        version: u64,
        params: Arc<Vec<f32>>,
        now: Instant,
    ) -> Self {
        peer.set_data_ratio(cfg.n_train, cfg.num_params);
        peer.set_weigh_absent(cfg.weigh_absent);
        peer.set_distrust(cfg.distrust);
        let mut inbox = GradientInbox::new(version, cfg.num_params)
            .with_clip_norm(cfg.clip_norm)
            .with_foreign_cap(cfg.me, cfg.foreign_cap);
        inbox.expect(cfg.me);
        Self {
            known: cfg.members as u32,
            peer,
            connected: BTreeSet::new(),
            speaking: BTreeSet::new(),
            seen_round: BTreeMap::new(),
            done_peers: BTreeSet::new(),
            round,
            sub: 0,
            measured: Vec::new(),
            version,
            snapshot: params,
            inbox,
            stragglers: Stragglers::new(cfg.suspect_after).with_probation(cfg.gradient_deadline),
            normal: None,
            bound: NormBound::new(cfg.norm_bound),
            opposed: BTreeSet::new(),
            distrusted: BTreeSet::new(),
            held: Vec::new(),
            // Restarted after its last round: nothing to wait for, due at once.
            phase: Phase::Starting {
                until: match cfg.rounds {
                    Some(t) if round >= t => now,
                    _ => now + cfg.start_deadline,
                },
                since: now,
            },
            round_started: now,
            sampled: Vec::new(),
            received: Vec::new(),
            outstanding: BTreeMap::new(),
            abandoned: BTreeSet::new(),
            next_req: 0,
            fetched: Vec::new(),
            pending: None,
            resumed: round > 0,
            evaluate_next: false,
            actions: VecDeque::new(),
            cfg,
        }
    }

    /// Evaluates (and so scores the predictor a driver exports) at the end of the round in
    /// progress, or of the next one to start, even when `eval_every` would skip it. Returns
    /// the round that will be evaluated. The evaluation fetches models as any other does, so
    /// the round's timing changes; its decisions do not.
    pub fn request_evaluation(&mut self) -> u64 {
        self.evaluate_next = true;
        self.round + 1
    }

    /// The FedeRiCo core.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// The model this peer serves: its latest step's parameters.
    pub fn snapshot(&self) -> &Arc<Vec<f32>> {
        &self.snapshot
    }

    /// Rounds completed.
    pub fn rounds_done(&self) -> u64 {
        self.round
    }

    /// The version this peer serves.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Connected peers.
    pub fn connected(&self) -> usize {
        self.connected.len()
    }

    /// Whether `peer` is connected.
    pub fn is_connected(&self, peer: NodeId) -> bool {
        self.connected.contains(&peer)
    }

    /// Known nodes (ids `0..known`), members and late joiners.
    pub fn known(&self) -> u32 {
        self.known
    }

    /// Whether the peer is still waiting for the members before its first round.
    pub fn is_starting(&self) -> bool {
        matches!(self.phase, Phase::Starting { .. })
    }

    /// Whether the peer ran its rounds and is done serving: the driver may stop.
    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished)
    }

    /// Whether the peer ran its last round (it may still be serving its final model).
    pub fn is_lingering(&self) -> bool {
        matches!(self.phase, Phase::Lingering { .. } | Phase::Finished)
    }

    /// The next thing to do, in order.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action<H>> {
        self.actions.pop_front()
    }

    /// When [`Self::handle_timeout`] must be called next, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Starting { until, .. } | Phase::Lingering { until } => Some(*until),
            Phase::Owning {
                deadline,
                grace: Some(grace),
                grace_passed: false,
            } => Some((*grace).min(*deadline)),
            Phase::Pulling { deadline, .. }
            | Phase::Owning { deadline, .. }
            | Phase::Fetching { deadline, .. } => Some(*deadline),
            _ => None,
        }
    }

    /// Time has passed: deadlines at or before `now` take effect.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
    }

    /// A connection to `peer` came up. True when it was not connected before.
    pub fn handle_connected(&mut self, now: Instant, peer: NodeId) -> bool {
        let new = self.connected.insert(peer);
        if new {
            // Seen alive again: sampleable again (spec §6).
            self.peer.handle_reachable(peer);
            // A peer that (re)connects after we finished must not wait for our round notices.
            if self.is_lingering() {
                let req = self.request(Asked::Notice);
                self.actions.push_back(Action::Finished { req, to: peer });
            } else if !matches!(self.phase, Phase::Starting { .. }) {
                // A peer (re)joining mid-run learns our round now, not at our next round
                // start: it must not wait τ_grad for a notice we sent before it was here.
                let req = self.request(Asked::Notice);
                self.actions.push_back(Action::Notice {
                    req,
                    to: peer,
                    round: self.current_step(),
                });
            }
        }
        self.advance(now);
        new
    }

    /// The last connection to `peer` closed.
    pub fn handle_disconnected(&mut self, now: Instant, peer: NodeId) -> bool {
        let was = self.connected.remove(&peer);
        self.speaking.remove(&peer);
        // It may come back in an earlier round (restarted from a checkpoint): what it says
        // after reconnecting counts, not the round it had reached.
        self.seen_round.remove(&peer);
        // A sampler whose connection is gone cannot send the gradient of the version it was
        // served: the owner does not wait τ_grad for it (it still counts if it comes).
        self.inbox.stop_awaiting(peer);
        // Nor can it take an answer to a request of its that is held for the next step: the
        // request went with the connection. Serving it after the step would await a gradient
        // that cannot come.
        self.held.retain(|h| h.from != peer);
        self.advance(now);
        was
    }

    /// `peer` is known to run FedeRiCo (it listed the protocol).
    pub fn handle_speaking(&mut self, now: Instant, peer: NodeId) {
        self.speaking.insert(peer);
        self.advance(now);
    }

    /// A new peer joined an open federation under the next free id, which it returns.
    pub fn handle_peer_joined(&mut self) -> NodeId {
        let id = NodeId(self.known);
        self.known += 1;
        self.peer.handle_peer_joined(id);
        id
    }

    /// `from` asks for our model for its round `round` (a gradient will follow).
    pub fn handle_pull(&mut self, now: Instant, from: NodeId, round: u64, handle: H) {
        self.heard(from, round);
        // A pull for our next round waits for our step, so it gets the model of that round
        // (lock-step when nothing fails); during the step every pull waits for it (the inbox
        // already collects for the next version); any other is served now.
        let hold = matches!(self.phase, Phase::Stepping)
            || (round == self.current_step() + 1 && !self.is_lingering());
        if hold {
            self.held.push(Held {
                from,
                handle,
                pull_round: Some(round),
                version: 0,
            });
        } else {
            self.serve(from, handle, Some(round));
        }
        self.advance(now);
    }

    /// `from` is in its round `round` and will not pull from us.
    pub fn handle_notice(&mut self, now: Instant, from: NodeId, round: u64) {
        self.heard(from, round);
        self.advance(now);
    }

    /// `from` asks for our model of version `version` or later (evaluation).
    pub fn handle_fetch(&mut self, now: Instant, from: NodeId, version: u64, handle: H) {
        self.speaking.insert(from);
        // Far-future versions are answered at once: never wait on a peer more than a step ahead.
        if self.version >= version || version > self.version + 1 || self.is_lingering() {
            self.serve(from, handle, None);
        } else {
            self.held.push(Held {
                from,
                handle,
                pull_round: None,
                version,
            });
        }
        self.advance(now);
    }

    /// `from` ran its last round.
    pub fn handle_peer_finished(&mut self, now: Instant, from: NodeId) {
        self.speaking.insert(from);
        self.done_peers.insert(from);
        self.advance(now);
    }

    /// A weighted gradient from `from` for our version `version`. A refusal leaves the state as
    /// it was.
    pub fn handle_gradient(
        &mut self,
        now: Instant,
        from: NodeId,
        version: u64,
        grad: Vec<f32>,
    ) -> Result<(), Rejection> {
        let r = self.inbox.handle_gradient(from, version, grad);
        self.heard_late(from, &r);
        self.advance(now);
        r
    }

    /// `from` will send no gradient for our version `version` (its pull came too late).
    pub fn handle_skip(
        &mut self,
        now: Instant,
        from: NodeId,
        version: u64,
    ) -> Result<(), Rejection> {
        let r = self.inbox.handle_skip(from, version);
        self.heard_late(from, &r);
        self.advance(now);
        r
    }

    /// The learner finished a job.
    pub fn handle_done(&mut self, now: Instant, done: Done) -> Result<(), RoundError> {
        match done {
            Done::Measured { losses } => {
                self.peer.handle_losses(self.cfg.n_train, &losses);
                // A model the silo holds its gradient back from is scaled by 0 and gets a
                // `Skip` (see `handle_scaled`).
                let weights = losses
                    .iter()
                    .map(|(b, _)| (*b, self.peer.push_weight(*b).unwrap_or(0.0)))
                    .collect();
                self.phase = Phase::Scaling;
                self.actions.push_back(Action::Run(Job::Scale { weights }));
            }
            Done::Scaled { grads } => self.handle_scaled(now, grads)?,
            Done::Stepped { params, version } => {
                self.snapshot = params;
                self.version = version;
                self.sub += 1;
                if self.sub < self.steps() {
                    // The next sub-step: its pulls go out now, so held pulls are served the
                    // new version first.
                    self.serve_held();
                    self.start_sub_step(now);
                    self.advance(now);
                    return Ok(());
                }
                self.sub = 0;
                self.round += 1;
                self.serve_held();
                let asked = std::mem::take(&mut self.evaluate_next);
                let scored = crate::core::is_evaluation_round(
                    self.round,
                    self.cfg.eval_every,
                    self.cfg.rounds,
                );
                if scored || asked {
                    self.start_fetching(now);
                } else {
                    self.end_round(now, None);
                }
            }
            Done::Evaluated { score, .. } => self.end_round(now, Some(score)),
        }
        self.advance(now);
        Ok(())
    }

    fn handle_scaled(
        &mut self,
        now: Instant,
        grads: Vec<(NodeId, Vec<f32>)>,
    ) -> Result<(), RoundError> {
        let me = self.cfg.me;
        for (b, grad) in grads {
            if b == me {
                self.inbox
                    .handle_gradient(me, self.version, grad)
                    .map_err(RoundError::OwnGradient)?;
                continue;
            }
            let Some(&(_, version, _)) = self.received.iter().find(|x| x.0 == b) else {
                continue;
            };
            match self.peer.push_weight(b) {
                Some(weight) => self.actions.push_back(Action::Gradient {
                    to: b,
                    version,
                    weight,
                    grad,
                }),
                None => self.actions.push_back(Action::Skip { to: b, version }),
            }
        }
        self.phase = Phase::Owning {
            deadline: now + self.cfg.gradient_deadline,
            grace: self.grace().map(|g| now + g),
            grace_passed: false,
        };
        if self.sub > 0 {
            // The round's record was opened at its first sub-step.
            return Ok(());
        }
        let table = self.peer.table();
        self.pending = Some(RoundReport {
            round: self.current_round(),
            version: self.version,
            sampled: self.sampled.clone(),
            answered: self.received.iter().map(|x| x.0).collect(),
            gradients: 0,
            weights: self.peer.weights(),
            tracked: table
                .iter()
                .map(|(id, e, _)| (id, e.tracked_loss))
                .collect(),
            last: table.iter().map(|(id, e, _)| (id, e.last_loss)).collect(),
            suspects: Vec::new(),
            eval: None,
            duration: Duration::ZERO,
            resumed: std::mem::take(&mut self.resumed),
        });
        Ok(())
    }

    /// The round in progress (or about to start).
    pub(super) fn current_round(&self) -> u64 {
        self.round + 1
    }

    /// Optimizer steps per round: 1, or the sub-steps of a mini-batch M-step.
    pub(super) fn steps(&self) -> u64 {
        self.cfg.sub_steps.unwrap_or(1)
    }

    /// The step in progress (or about to start), counted over the whole run: what pulls and
    /// notices name and what an owner's round-over rule compares. With one step per round it
    /// is the round.
    pub(super) fn current_step(&self) -> u64 {
        self.round * self.steps() + self.sub + 1
    }

    pub(super) fn is_last_round(&self) -> bool {
        self.cfg.rounds.is_some_and(|t| self.round >= t)
    }

    pub(super) fn request(&mut self, asked: Asked) -> ReqId {
        let req = ReqId(self.next_req);
        self.next_req += 1;
        self.outstanding.insert(req, asked);
        req
    }

    /// A request from `from` in its round `round`: it runs FedeRiCo, and a timely request is a
    /// heartbeat (a suspect may be tried again).
    fn heard(&mut self, from: NodeId, round: u64) {
        self.speaking.insert(from);
        let s = self.seen_round.entry(from).or_default();
        *s = (*s).max(round);
        if round >= self.current_step() {
            self.peer.handle_heard_from(from);
        }
    }

    /// An answer for a version already stepped past: `from` is slow, not silent.
    fn heard_late(&mut self, from: NodeId, r: &Result<(), Rejection>) {
        if matches!(r, Err(Rejection::Stale { .. })) {
            self.stragglers.handle_late(from);
        }
    }

    /// Moves the phase on while its condition holds.
    fn advance(&mut self, now: Instant) {
        loop {
            match &self.phase {
                Phase::Starting { until, since } => {
                    let ready = self.connected.intersection(&self.speaking).count();
                    let all = ready + 1 >= self.cfg.members;
                    // A peer resuming from a checkpoint rejoins a running federation: one
                    // peer to talk to is enough (the others are sampled once connected),
                    // never a wait for a member that may be down.
                    let rejoining = self.round > 0 && ready > 0;
                    if !(all || rejoining || now >= *until) {
                        return;
                    }
                    // Nobody at all by the deadline: a fresh silo keeps waiting (and says so
                    // once a deadline) rather than run the whole federation alone.
                    let waited = now.saturating_duration_since(*since);
                    if !all
                        && ready == 0
                        && self.round == 0
                        && !self.is_last_round()
                        && self.cfg.alone_after.is_none_or(|a| waited < a)
                    {
                        let next = now + self.cfg.start_deadline;
                        let until = self.cfg.alone_after.map_or(next, |a| next.min(*since + a));
                        let since = *since;
                        self.log(Event::WaitingForPeers {
                            waited,
                            connected: self.connected.len(),
                            members: self.cfg.members,
                        });
                        self.phase = Phase::Starting { until, since };
                        return;
                    }
                    if !all && !self.is_last_round() {
                        self.log(Event::StartingWithout {
                            connected: self.connected.len(),
                            running: ready,
                            members: self.cfg.members,
                        });
                    }
                    if self.is_last_round() {
                        self.finish(now);
                    } else {
                        self.start_round(now);
                    }
                }
                Phase::Pulling { deadline, waiting } => {
                    if !waiting.is_empty() && now < *deadline {
                        return;
                    }
                    self.end_pulling();
                }
                Phase::Owning {
                    deadline, grace, ..
                } => {
                    let (deadline, grace) = (*deadline, *grace);
                    if !self.round_is_over(now, deadline, grace) {
                        if let Phase::Owning { grace_passed, .. } = &mut self.phase {
                            *grace_passed |= grace.is_some_and(|g| now >= g);
                        }
                        return;
                    }
                    if self.gradients_in() {
                        let since = deadline - self.cfg.gradient_deadline;
                        self.note_normal_round(now.saturating_duration_since(since));
                    }
                    self.step(now, now >= deadline);
                }
                Phase::Fetching { deadline, waiting } => {
                    if !waiting.is_empty() && now < *deadline {
                        return;
                    }
                    self.end_fetching();
                }
                Phase::Lingering { until } => {
                    let all_done = self.connected.iter().all(|k| self.done_peers.contains(k));
                    if !(all_done || now >= *until) {
                        return;
                    }
                    self.phase = Phase::Finished;
                }
                Phase::Measuring
                | Phase::Scaling
                | Phase::Stepping
                | Phase::Evaluating
                | Phase::Finished => return,
            }
        }
    }

    pub(super) fn log(&mut self, e: Event) {
        self.actions.push_back(Action::Log(e));
    }

    fn end_round(&mut self, now: Instant, eval: Option<Score>) {
        let duration = now.saturating_duration_since(self.round_started);
        if let Some(mut rec) = self.pending.take() {
            rec.version = self.version;
            rec.eval = eval;
            rec.duration = duration;
            rec.suspects = (0..self.known)
                .map(NodeId)
                .filter(|&i| self.peer.is_suspect(i))
                .collect();
            // The round's record goes out before its checkpoint: a kill between the two
            // leaves a line past the checkpoint, which a restart cuts, never a checkpointed
            // round without its line.
            self.actions.push_back(Action::Report(rec));
        }
        self.actions.push_back(Action::Checkpoint {
            round: self.round,
            peer: Box::new(self.peer.clone()),
        });
        self.log(Event::RoundDone {
            round: self.round,
            duration,
        });
        if self.is_last_round() {
            self.finish(now);
        } else {
            self.start_round(now);
        }
    }

    fn finish(&mut self, now: Instant) {
        self.log(Event::Lingering { round: self.round });
        for k in self.connected.clone() {
            let req = self.request(Asked::Notice);
            self.actions.push_back(Action::Finished { req, to: k });
        }
        self.phase = Phase::Lingering {
            until: now + self.cfg.linger,
        };
        self.serve_held();
    }
}
