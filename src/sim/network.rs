//! FedeRiCo under a fault schedule, as the nodes run it: one [`Round`] engine per silo — the
//! one the libp2p node drives — on a simulated network with a virtual clock (issue 4's
//! schedules, issue 15's one round implementation).
//!
//! Owns: the virtual clock and its queue of deliveries and finished jobs, ordered by
//! `(time, sequence)`; the federation's round clock that labels every record and fires the
//! faults (a silo's `at` is the federation round its round belongs to: its own round for a
//! silo there from the start; a silo that (re)starts at federation round `g` counts on from
//! `g` and stops with the others after the last one); the simulated network — partitions and heals as disconnections and
//! reconnections, a crash as the end of an engine (what it had in flight is lost, its peers see
//! it disconnect), a restart as a new engine from the bytes of its last checkpoint, a late join
//! as a new engine, a delay and a message loss on the models and gradients a silo sends, as
//! `net::impair` applies them, and the wide-area links of `[faults.links]` on every message
//! (`faults::link::Wire`, the rule `net::impair` follows) — firing each fault when the federation reaches its round (the
//! highest round any silo has completed, plus one: the swarm launcher's rule); running the
//! learner jobs the engines ask for in parallel batches; each silo's trace in the form a node
//! writes.
//! Must not: decide anything about a round (the engines decide, [`FedericoSilo`] computes), or
//! read a wall clock: every time here is virtual, and only waiting costs it — jobs take none,
//! messages none but their link's time under `[faults.links]`, a delay holds a message back, a
//! deadline is waited out — so a round's `seconds` are its waits and its network, and a run is
//! the same on every machine.

use super::mail::{Handle, Msg, deliver};
use super::{Ctx, SimError, par_silos};
use crate::core::round::{Action, Done, Job, Round, RoundConfig};
use crate::core::{FedericoConfig, Peer};
use crate::faults::checks::{Applied, CrashEvidence};
use crate::faults::link::{self, Fate};
use crate::faults::{Fault, NetState, Schedule, Timeline};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::Adam;
use crate::silo::federico::{Checkpoint, FedericoSilo};
use crate::trace::NodeRound;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long round 1 waits for every member (a node's `deadlines.start_s`, and the swarm
/// launcher's 3 s when a silo joins late).
const START: Duration = Duration::from_secs(60);
const START_WITH_JOINER: Duration = Duration::from_secs(3);
/// How long a finished silo keeps serving its final model (a node's `deadlines.linger_s`;
/// unused: the simulator's engines run until it stops them).
const LINGER: Duration = Duration::from_secs(30);
/// Events one call may handle before the network counts as stalled.
const STEP_BOUND: usize = 50_000_000;

/// Something due on the virtual clock.
enum Ev {
    /// A message arrives. `lives` are the sender's and the receiver's incarnations when it was
    /// sent: a message of an incarnation that is gone is lost with its connection.
    Deliver {
        from: usize,
        to: usize,
        lives: (u64, u64),
        msg: Msg,
    },
    /// Silo `node`'s job is done.
    Done { node: usize, life: u64 },
}

/// A learner job on its way: asked for, then computed (its `Done` is queued for the instant it
/// was asked for, and handed over when that event is taken).
struct Pending {
    job: Option<Job>,
    done: Option<Done>,
}

/// One silo: its engine while it runs, its model, what it saved.
struct Slot {
    /// `None` while the silo is absent, crashed or gone.
    round: Option<Round<Handle>>,
    /// Ran its last round and lingered: the process has exited.
    exited: bool,
    /// Bumped at every start and crash: messages of an older incarnation are lost.
    life: u64,
    /// The federation round the silo's engine started in, and the rounds it had done then:
    /// its round `start.1 + n` is federation round `start.0 + n − 1`.
    start: (u64, u64),
    /// The federation round of its last record.
    label: u64,
    silo: FedericoSilo,
    job: Option<Pending>,
    /// The last checkpoint written.
    saved: Option<Checkpoint>,
    /// The core as last seen, for the weights of a silo that is down.
    ghost: Peer,
    /// The core it started with: a silo restarted without a checkpoint starts from it.
    first: Peer,
    /// Its draws of message loss (the node's fault stream).
    loss: StdRng,
}

impl Slot {
    fn alive(&self) -> bool {
        self.round.is_some() && !self.exited
    }

    fn peer(&self) -> &Peer {
        self.round.as_ref().map_or(&self.ghost, Round::peer)
    }
}

/// The network side of a faulty FedeRiCo run, with every silo's engine.
pub(crate) struct FaultNet {
    pub(crate) schedule: Schedule,
    timeline: Timeline,
    /// τ_model and τ_grad, in seconds.
    pub(crate) tau_model: f64,
    pub(crate) tau_grad: f64,
    rounds: u64,
    /// The settings every engine is built with (the silo's own fields filled in per silo).
    template: RoundConfig,
    /// Each silo's initial model and training-set size.
    init: Vec<Vec<f32>>,
    n_train: Vec<usize>,
    lr: f32,
    /// The run seed and batch size: a mini-batch M-step's batch streams.
    seed: u64,
    batch: usize,
    /// The M-step's sub-steps a round, the engine's and the owner's own.
    steps: crate::core::Steps,
    /// `[privacy]`: every silo's releases, and a restarted silo's ledger from its checkpoint.
    privacy: Option<crate::privacy::PrivacyConfig>,
    slots: Vec<Slot>,
    now: Instant,
    seq: u64,
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    events: BTreeMap<u64, Ev>,
    /// The network the schedule has in force.
    pub(crate) state: NetState,
    /// Rounds of the timeline applied so far.
    fired: u64,
    /// The highest round any silo has completed.
    logged: u64,
    /// Calls of [`Self::round`] so far.
    calls: u64,
    /// Each silo's trace.
    pub(crate) traces: Vec<Vec<NodeRound>>,
    pub(crate) applied: Vec<Applied>,
    pub(crate) crashes: Vec<CrashEvidence>,
    /// Each directed link's sending side under `[faults.links]` (`from * k + to`).
    wires: Vec<link::Wire>,
    /// Peers each silo sampled in its last completed round.
    pub(crate) last_sampled: Vec<Vec<NodeId>>,
}

impl FaultNet {
    /// Every silo's engine over `peers` (each silo's core) and `init` (each silo's model); the
    /// schedule's round-1 state is applied at once.
    pub(crate) fn new(
        ctx: &Ctx<'_>,
        cfg: &FedericoConfig,
        peers: Vec<Peer>,
        init: &[Vec<f32>],
        schedule: Schedule,
        rounds: u64,
    ) -> Result<Self, SimError> {
        let k = peers.len();
        let joiner = schedule
            .events
            .iter()
            .any(|e| matches!(e.fault, Fault::Join(_)));
        let steps = ctx.federico_steps();
        let template = RoundConfig {
            me: NodeId(0),
            members: k,
            // The simulator stops each engine after the federation's last round and scores the
            // silos itself between rounds.
            rounds: None,
            eval_every: u64::MAX,
            n_train: 0,
            num_params: init.first().map_or(0, Vec::len),
            clip_norm: cfg.clip_norm,
            suspect_after: cfg.suspect_after,
            model_deadline: Duration::from_secs_f64(schedule.config.model_deadline_s),
            gradient_deadline: Duration::from_secs_f64(schedule.config.gradient_deadline_s),
            start_deadline: if joiner { START_WITH_JOINER } else { START },
            // As a swarm's nodes: round 1 at the start deadline with whoever came.
            alone_after: Some(Duration::ZERO),
            linger: LINGER,
            sub_steps: steps.sub_steps,
            foreign_cap: cfg.foreign_cap(k),
            norm_bound: ctx.scenario.defences.norm_bound(cfg.variant),
            drop_opposed: ctx.scenario.defences.drop_opposed(cfg.variant),
            distrust: ctx.scenario.defences.distrust(cfg.variant),
            weigh_absent: ctx.scenario.defences.weigh_absent(cfg.variant),
        };
        let lr = ctx.lr();
        let slots = peers
            .into_iter()
            .zip(init)
            .enumerate()
            .map(|(i, (peer, p))| Slot {
                round: None,
                exited: false,
                life: 0,
                start: (1, 0),
                label: 0,
                silo: FedericoSilo::new(p.clone(), Adam::new(p.len(), lr), 0).with_score_rows(
                    cfg.score_share,
                    ctx.seed,
                    NodeId(i as u32),
                    &ctx.fed.clients[i].train,
                ),
                job: None,
                saved: None,
                first: peer.clone(),
                ghost: peer,
                loss: StdRng::seed_from_u64(stream_seed(
                    ctx.seed,
                    NodeId(i as u32),
                    Stream::Faults,
                )),
            })
            .collect();
        let t0 = Instant::now();
        let timeline = schedule.timeline(rounds);
        let mut net = Self {
            tau_model: schedule.config.model_deadline_s,
            tau_grad: schedule.config.gradient_deadline_s,
            state: timeline.at(1).clone(),
            timeline,
            schedule,
            rounds,
            template,
            init: init.to_vec(),
            n_train: (0..k).map(|i| ctx.fed.clients[i].train.len()).collect(),
            lr,
            seed: ctx.seed,
            batch: ctx.scenario.train.batch_size,
            steps,
            privacy: ctx.scenario.privacy.clone(),
            slots,
            now: t0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            fired: 0,
            logged: 0,
            calls: 0,
            traces: vec![Vec::new(); k],
            applied: Vec::new(),
            crashes: Vec::new(),
            wires: vec![link::Wire::default(); k * k],
            last_sampled: vec![Vec::new(); k],
        };
        net.fire_due()?;
        Ok(net)
    }

    /// The `calls`-th round of the federation: runs the network until every running silo has
    /// completed it; the last call runs it until every silo has stopped.
    pub(crate) fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        self.calls += 1;
        let target = self.calls;
        let last = target >= self.rounds;
        for _ in 0..STEP_BOUND {
            self.flush_all()?;
            let running = || self.slots.iter().filter(|s| s.alive());
            if running().all(|s| !last && s.label >= target) {
                return Ok(());
            }
            // One event at a time, so the round clock moves between any two.
            if let Some(&Reverse((t, seq))) = self.queue.peek()
                && t <= self.now
            {
                self.queue.pop();
                let ev = self.events.remove(&seq).expect("queued");
                if matches!(ev, Ev::Done { .. }) {
                    self.run_jobs(ctx)?;
                }
                self.dispatch(ev)?;
                continue;
            }
            if self.timeouts()? {
                continue;
            }
            let Some(next) = self.next_time() else {
                return Err(self.stalled(target));
            };
            self.now = next;
        }
        Err(self.stalled(target))
    }

    fn stalled(&self, target: u64) -> SimError {
        let done: Vec<u64> = self.slots.iter().map(|s| s.label).collect();
        SimError::Invariant(format!(
            "the simulated network stalled before round {target} (last round per silo: {done:?})"
        ))
    }

    /// The silo's core: its engine's, or the last one seen while it is down.
    pub(crate) fn peer(&self, i: usize) -> &Peer {
        self.slots[i].peer()
    }

    /// Every silo's learning state (a silo that is down: as it was when it went down).
    pub(crate) fn silos(&self) -> impl Iterator<Item = &FedericoSilo> {
        self.slots.iter().map(|s| &s.silo)
    }

    /// The model silo `i` serves: its engine's latest step (or its checkpoint's, while down).
    pub(crate) fn params(&self, i: usize) -> &[f32] {
        let s = &self.slots[i];
        match (&s.round, &s.saved) {
            (Some(r), _) => r.snapshot(),
            (None, Some(c)) => &c.params,
            (None, None) => &s.silo.params,
        }
    }

    /// The earliest of: the next event, a due job, an engine's timer.
    fn next_time(&self) -> Option<Instant> {
        let timers = self
            .slots
            .iter()
            .filter(|s| s.alive())
            .filter_map(|s| s.round.as_ref().and_then(Round::poll_timeout));
        self.queue
            .peek()
            .map(|Reverse((t, _))| *t)
            .into_iter()
            .chain(timers)
            .min()
    }

    fn at(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq)));
        self.events.insert(self.seq, ev);
    }

    /// Whether a message from `a` can reach `b` now.
    fn linked(&self, a: usize, b: usize) -> bool {
        self.slots[a].alive() && self.slots[b].alive() && self.state.connected(a as u32, b as u32)
    }

    /// Runs every outstanding job at once, in parallel: a silo's state changes only through its
    /// own jobs and it has one at a time, so computing it before it is due changes nothing.
    fn run_jobs(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        if !self
            .slots
            .iter()
            .any(|s| s.job.as_ref().is_some_and(|p| p.job.is_some()))
        {
            return Ok(());
        }
        let fed = ctx.fed;
        let cells: Vec<Mutex<(Option<Job>, &mut FedericoSilo)>> = self
            .slots
            .iter_mut()
            .map(|s| {
                let job = s.job.as_mut().and_then(|p| p.job.take());
                Mutex::new((job, &mut s.silo))
            })
            .collect();
        let out = par_silos(ctx, |i, learner| {
            let mut cell = cells[i].lock().expect("one worker per silo");
            let (job, silo) = &mut *cell;
            job.take()
                .map(|job| silo.run(learner, &fed.clients[i], job))
                .transpose()
        });
        drop(cells);
        for (slot, done) in self.slots.iter_mut().zip(out) {
            if let Some(done) = done? {
                slot.job.as_mut().expect("a job was asked for").done = Some(done);
            }
        }
        Ok(())
    }

    /// Fires every engine timer due now; whether any was.
    fn timeouts(&mut self) -> Result<bool, SimError> {
        let now = self.now;
        let mut any = false;
        for i in 0..self.slots.len() {
            if !self.slots[i].alive() {
                continue;
            }
            if let Some(r) = self.slots[i].round.as_mut()
                && r.poll_timeout().is_some_and(|t| t <= now)
            {
                r.handle_timeout(now);
                any = true;
                self.flush(i)?;
            }
        }
        Ok(any)
    }

    fn dispatch(&mut self, ev: Ev) -> Result<(), SimError> {
        let now = self.now;
        match ev {
            Ev::Done { node, life } => {
                let slot = &mut self.slots[node];
                if slot.life != life || !slot.alive() {
                    return Ok(());
                }
                let done =
                    slot.job.take().and_then(|p| p.done).ok_or_else(|| {
                        SimError::Invariant(format!("silo-{node}: a job due unrun"))
                    })?;
                if let Some(r) = slot.round.as_mut() {
                    r.handle_done(now, done)
                        .map_err(|e| SimError::Invariant(format!("silo-{node}: {e}")))?;
                }
                self.flush(node)
            }
            Ev::Deliver {
                from,
                to,
                lives,
                msg,
            } => {
                // What a silo sent before its run ended still arrives.
                let current = (self.slots[from].life, self.slots[to].life) == lives;
                let open = self.slots[from].round.is_some()
                    && self.slots[to].alive()
                    && self.state.connected(from as u32, to as u32);
                if !current || !open {
                    self.lose(from, to, msg);
                    self.flush(from)?;
                    return self.flush(to);
                }
                let r = self.slots[to].round.as_mut().expect("linked");
                // A refused gradient or skip is dropped, as a node drops it (and logs it).
                if let Ok(Some((back, reply))) = deliver(r, now, msg) {
                    self.send(to, back, reply);
                }
                self.flush(to)
            }
        }
    }

    /// Sends `msg` from `from` to `to`: a model or a gradient waits out the sender's delay and
    /// may be lost (the other side then waits out its deadline, as on a real network).
    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        if !self.linked(from, to) {
            return self.lose(from, to, msg);
        }
        let mut at = self.now;
        if msg.is_payload() {
            let p = self.state.loss_between(from as u32, to as u32);
            let delay = Duration::from_millis(self.state.delay_ms[from]);
            match link::fate(&mut self.slots[from].loss, p, delay) {
                Fate::Lost => return,
                Fate::After(d) => at += d,
            }
        }
        // The wide-area link, as `net::impair` charges it: after the loss draw, on every message.
        if let Some(links) = self.schedule.links() {
            let k = self.slots.len();
            let wan = links.link(from, to);
            at += self.wires[from * k + to].send(
                &mut self.slots[from].loss,
                &wan,
                self.now,
                msg.wire_bytes(),
            );
        }
        let lives = (self.slots[from].life, self.slots[to].life);
        self.at(
            at,
            Ev::Deliver {
                from,
                to,
                lives,
                msg,
            },
        );
    }

    /// A message on a link that is cut, or to or from an incarnation that is gone, is lost, and
    /// the request it belongs to fails at its requester, as a closed connection fails it.
    fn lose(&mut self, from: usize, to: usize, msg: Msg) {
        let Some((requester, req)) = msg.request(from, to) else {
            return;
        };
        let now = self.now;
        let slot = &mut self.slots[requester];
        if !slot.exited
            && let Some(r) = slot.round.as_mut()
        {
            r.handle_failed(now, req);
        }
    }

    fn flush_all(&mut self) -> Result<(), SimError> {
        for i in 0..self.slots.len() {
            self.flush(i)?;
        }
        Ok(())
    }

    /// Executes every action of silo `i`'s engine.
    fn flush(&mut self, i: usize) -> Result<(), SimError> {
        loop {
            let slot = &mut self.slots[i];
            if slot.exited {
                return Ok(());
            }
            let Some(r) = slot.round.as_mut() else {
                return Ok(());
            };
            let Some(action) = r.poll_action() else {
                break;
            };
            let round = r.rounds_done() + 1;
            match Msg::from_action(i, action) {
                Ok((to, msg)) => self.send(i, to, msg),
                Err(Action::Run(job)) => {
                    // Poisoning by the silo's own round, from its first job of the round the
                    // schedule names, as a node follows the swarm's plan (a restarted silo
                    // keeps playing it: the plan is in the new process's config).
                    let attack = self.timeline.at(round).attack[i].clone();
                    let slot = &mut self.slots[i];
                    slot.silo.set_attack(attack, NodeId(i as u32), self.seed);
                    if slot.job.is_some() {
                        return Err(SimError::Invariant(format!(
                            "silo-{i} asked for a job with one in flight"
                        )));
                    }
                    slot.job = Some(Pending {
                        job: Some(job),
                        done: None,
                    });
                    let life = slot.life;
                    self.at(self.now, Ev::Done { node: i, life });
                }
                Err(Action::Report(rep)) => {
                    let slot = &mut self.slots[i];
                    let label = slot.start.0 + (rep.round - slot.start.1) - 1;
                    slot.label = label;
                    self.logged = self.logged.max(label);
                    self.last_sampled[i] = rep.sampled.clone();
                    // On the round clock: the round's faults at `g − 0.5`, its start after them.
                    let mut rec = NodeRound::from_report(i as u32, rep, label as f64, 0, 0);
                    rec.start = label as f64 - 0.4;
                    rec.privacy = slot.silo.privacy_record();
                    self.traces[i].push(rec);
                    if label >= self.rounds {
                        // The federation's last round: the silo stops, what it sent still
                        // arrives, and it starts nothing more.
                        self.finish(i);
                        return Ok(());
                    }
                }
                Err(Action::Checkpoint { round, peer }) => {
                    let slot = &mut self.slots[i];
                    slot.saved = Some(Checkpoint {
                        peer_id: NodeId(i as u32).to_string(),
                        round,
                        version: slot.silo.version,
                        params: slot.silo.params.clone(),
                        adam: slot.silo.adam.clone(),
                        peer: *peer,
                        privacy: slot.silo.privacy().map(|(l, _, _)| l.clone()),
                    });
                }
                Err(_) => {}
            }
        }
        // After the whole batch: a round's checkpoint is written before its faults fire.
        self.fire_due()?;
        Ok(())
    }

    /// Silo `i` ran the federation's last round: it takes no further part.
    fn finish(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if let Some(r) = &slot.round {
            slot.ghost = r.peer().clone();
        }
        slot.exited = true;
        slot.job = None;
    }

    /// Starts silo `i`: from its last checkpoint after a crash (as a node does, through the
    /// checkpoint's bytes), else fresh.
    fn start(&mut self, i: usize, g: u64) -> Result<(), SimError> {
        let slot = &mut self.slots[i];
        let (silo, round, peer, ledger) = match slot.saved.take() {
            Some(c) => {
                let bytes = c.encode().map_err(SimError::Invariant)?;
                let c = Checkpoint::decode(&bytes)
                    .map_err(|e| SimError::Invariant(format!("silo {i}'s checkpoint: {e}")))?;
                let silo = FedericoSilo::new(c.params.clone(), c.adam.clone(), c.version);
                let (round, peer, ledger) = (c.round, c.peer.clone(), c.privacy.clone());
                slot.saved = Some(c);
                (silo, round, peer, ledger)
            }
            None => {
                let p = self.init[i].clone();
                let silo = FedericoSilo::new(p.clone(), Adam::new(p.len(), self.lr), 0);
                (silo, 0, slot.first.clone(), None)
            }
        };
        // The batch stream past the sub-steps of the rounds it resumes after, as a node's; the
        // privacy ledger carried on from the checkpoint, as a node's.
        slot.silo = silo
            .with_rows_of(&mut slot.silo)
            .with_batches(
                self.steps,
                self.seed,
                NodeId(i as u32),
                self.n_train[i],
                self.batch,
                round,
            )
            .with_privacy(
                self.privacy.as_ref(),
                self.seed,
                NodeId(i as u32),
                self.n_train[i],
                (self.rounds, self.template.sub_steps),
            );
        if let Some(l) = ledger {
            slot.silo
                .resume_privacy(l, round)
                .map_err(|e| SimError::Invariant(format!("silo {i}'s privacy ledger: {e}")))?;
        }
        let cfg = RoundConfig {
            me: NodeId(i as u32),
            n_train: self.n_train[i],
            ..self.template.clone()
        };
        let params = Arc::new(slot.silo.params.clone());
        slot.round = Some(Round::new(
            cfg,
            peer,
            round,
            slot.silo.version,
            params,
            self.now,
        ));
        slot.exited = false;
        slot.job = None;
        slot.life += 1;
        slot.start = (g, round);
        Ok(())
    }

    /// Applies the timeline up to the federation's round (the highest round completed, plus
    /// one). Returns whether anything fired.
    fn fire_due(&mut self) -> Result<bool, SimError> {
        let mut any = false;
        while self.fired < (self.logged + 1).min(self.rounds) {
            self.fired += 1;
            self.apply_round(self.fired)?;
            any = true;
        }
        Ok(any)
    }

    /// The transition into round `g` of the timeline: what fired, then the links it changed.
    fn apply_round(&mut self, g: u64) -> Result<(), SimError> {
        let k = self.slots.len();
        let fired = self.timeline.fired(g).to_vec();
        let at = g as f64 - 0.5;
        for fault in &fired {
            self.applied.push(Applied {
                at,
                fault: fault.clone(),
            });
        }
        // Crashes and leaves first: their peers see them disconnect.
        for fault in &fired {
            if let Fault::Crash { silo, .. } | Fault::Leave(silo) = *fault {
                self.kill(silo, matches!(fault, Fault::Crash { .. }));
            }
        }
        let before: Vec<Vec<bool>> = (0..k)
            .map(|a| (0..k).map(|b| a != b && self.linked(a, b)).collect())
            .collect();
        let mut started = vec![false; k];
        for fault in &fired {
            if let Fault::Restart(silo) = *fault {
                self.start(silo as usize, g)?;
                started[silo as usize] = true;
                if let Some(e) = self.crashes.iter_mut().rev().find(|e| e.silo == silo) {
                    let id = NodeId(silo).to_string();
                    e.peer_ids = Some((id.clone(), id));
                }
            }
        }
        self.state = self.timeline.at(g).clone();
        // Silos present from the start, and late joiners when their round comes.
        for (i, s) in started.iter_mut().enumerate() {
            let slot = &self.slots[i];
            if self.state.is_up(i as u32) && slot.round.is_none() && !slot.exited {
                self.start(i, g)?;
                *s = true;
            }
        }
        let now = self.now;
        for a in 0..k {
            for b in 0..k {
                if a == b || !self.slots[a].alive() {
                    continue;
                }
                let after = self.linked(a, b);
                let r = self.slots[a].round.as_mut().expect("alive");
                let id = NodeId(b as u32);
                if after && (!before[a][b] || started[a] || started[b]) {
                    r.handle_connected(now, id);
                    r.handle_speaking(now, id);
                } else if before[a][b] && !after {
                    r.handle_disconnected(now, id);
                }
            }
        }
        Ok(())
    }

    /// Silo `silo` is killed (`crash`: and may come back from its checkpoint) or leaves.
    fn kill(&mut self, silo: u32, crash: bool) {
        let s = silo as usize;
        if crash {
            // What a restart would find on disk, read back through its bytes.
            let checkpoint = match &self.slots[s].saved {
                Some(c) => c
                    .encode()
                    .and_then(|b| Checkpoint::decode(&b))
                    .map(|c| Some(c.round)),
                None => Ok(None),
            };
            self.crashes.push(CrashEvidence {
                silo,
                checkpoint,
                peer_ids: None,
            });
        }
        let now = self.now;
        if self.slots[s].alive() {
            for j in 0..self.slots.len() {
                if j != s && self.linked(s, j) {
                    let r = self.slots[j].round.as_mut().expect("linked");
                    r.handle_disconnected(now, NodeId(silo));
                }
            }
        }
        let slot = &mut self.slots[s];
        if let Some(r) = &slot.round {
            slot.ghost = r.peer().clone();
        }
        slot.round = None;
        slot.exited = true;
        slot.job = None;
        slot.life += 1;
    }
}
