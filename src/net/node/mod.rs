//! The libp2p driver of one FedeRiCo peer (`federico node`): spec `federico.md` §6 over libp2p.
//!
//! Owns: setting a node up (key, manifest, data, checkpoint, swarm, metrics, control channel,
//! training thread), the event loop, and executing the round engine's actions on the network
//! (requests, responses, scheduled delay and loss), on the training thread and in the run log.
//! Must not: decide anything about a round — when it starts, is over, which request waits,
//! what a deadline means: [`crate::core::round`] decides, with the time this driver passes in —
//! compare a deadline with the clock, or run tensor work (the training thread does).
//!
//! `setup.rs` builds what a node runs with; `translate.rs` turns swarm events into the
//! engine's inputs; `log.rs` words the engine's events for the log and listens for `SIGUSR1`.

mod log;
mod reach;
mod setup;
mod translate;

use super::behaviour::Behaviour;
use super::config::NodeConfig;
use super::control;
use super::identity::{self, Manifest};
use super::impair::{Impairment, LOST_HOLD, Route};
use super::limits;
use super::metrics::{self, Metrics};
use super::progress;
use super::runlog::RunLog;
use super::throttle::Throttle;
use super::trainer::{Output, QUEUE, SaveHealth, Trainer, Work};
use crate::core::round::{Action, Done, Job, ReqId, Round, RoundConfig, RoundReport};
use crate::core::{MStep, Peer, Steps};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Evaluation, Learner};
use crate::protocol::{GradientRequest, ModelPayload, ModelRequest, ModelResponse};
use crate::silo::federico::FedericoSilo;
pub use crate::trace::{EvalRecord, NodeRound};
use libp2p::futures::StreamExt;
use libp2p::request_response::{OutboundRequestId, ResponseChannel};
use libp2p::{Multiaddr, PeerId, Swarm};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Why a node could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Keys or manifest.
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    /// The data shard.
    #[error(transparent)]
    Data(#[from] crate::learn::DataError),
    /// Anything else that stops the node, in words.
    #[error("{0}")]
    Fatal(String),
}

fn fatal(e: impl std::fmt::Display) -> NodeError {
    NodeError::Fatal(e.to_string())
}

/// How a node run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Every configured round ran.
    Finished,
    /// Stopped by a signal after the last completed round's checkpoint.
    Interrupted,
}

/// The driver's handle of an inbound model request: its response channel.
type Channel = ResponseChannel<ModelResponse>;

/// A message held back by a scheduled delay or loss (`impair`).
enum Deferred {
    /// A model answer, sent when due.
    Model {
        from: NodeId,
        channel: Channel,
        resp: ModelResponse,
    },
    /// A weighted gradient or a skip, sent when due.
    Gradient { to: NodeId, req: GradientRequest },
    /// A request for a model (a pull, a notice, a fetch, the end), sent when due.
    Request {
        req: ReqId,
        to: NodeId,
        request: ModelRequest,
    },
    /// A lost answer: its channel is dropped unanswered when due (the requester has timed out).
    Forget(#[allow(dead_code)] Channel),
}

/// The parameters a model answer carries (none for an acknowledgement).
fn params_len(resp: &ModelResponse) -> usize {
    match resp {
        ModelResponse::Model(p) => p.params.len(),
        _ => 0,
    }
}

/// An inference mixture: `(owner, parameters, weight)`.
type Mixture = Vec<(NodeId, Arc<Vec<f32>>, f64)>;

/// The running node.
struct Driver {
    cfg: NodeConfig,
    me: NodeId,
    name: String,
    manifest: Manifest,
    swarm: Swarm<Behaviour>,
    round: Round<Channel>,
    metrics: Metrics,
    registry: Arc<prometheus_client::registry::Registry>,
    /// Peer id of every known node, by node id (manifest order, then late joiners).
    peer_ids: Vec<PeerId>,
    nodes: HashMap<PeerId, NodeId>,
    fingerprint: u64,
    num_params: usize,
    n_train: usize,
    /// The engine's name of each request in flight.
    reqs: HashMap<OutboundRequestId, ReqId>,
    /// Rounds completed, as the metrics last showed them.
    shown_rounds: u64,
    /// Peers cut off by the control channel (a scheduled partition).
    blocked: HashSet<PeerId>,
    /// Delay and loss set by the control channel (a scheduled straggler or lossy network).
    impair: Impairment<Deferred>,
    /// The swarm's poisoning plan by round (`[control] attacks`), and how many of its entries
    /// have started.
    attack_plan: Vec<(u64, Option<crate::silo::attack::Attack>)>,
    attack_planned: usize,
    jobs: Option<std::sync::mpsc::SyncSender<Work>>,
    /// The mixture of the evaluation in flight: exported once it is scored.
    evaluating: Option<(u64, Mixture)>,
    /// The scored mixture's export, sent once the round's checkpoint is queued.
    export: Option<Work>,
    /// The round whose export a person asked for (`SIGUSR1`, the control channel): its
    /// writing is logged where a person sees it.
    export_asked: Option<u64>,
    /// The latest evaluation: round and accuracy (for the closing summary).
    last_eval: Option<(u64, f64)>,
    /// Rounds this process ran, and of those the ones where a peer's model arrived (for the
    /// closing summary: a silo that trained alone must not read as a federation's result).
    rounds_run: u64,
    rounds_with_peers: u64,
    /// What the progress line shows now: rounds done, peers connected, last evaluated round.
    on_screen: (u64, usize, Option<u64>),
    /// The run log: a failed append (a full disk) is a warning, and its lines wait for the
    /// next one, in order.
    log: RunLog,
    /// Failed checkpoint writes (counted, logged, retried next round).
    saves: SaveHealth,
    /// One warning per period for refused incoming connections (a flood of them is counted in
    /// the metrics, not written out line by line).
    refused_in: Throttle<()>,
    /// The same for our dials refused by our own caps.
    refused_out: Throttle<()>,
    /// Failed pulls, logged once per peer per [`FAILED_PULL_LOG_PERIOD`] (an absent member is
    /// tried again and again; insiders' review L1).
    failed_pulls: Throttle<NodeId>,
    /// Under `[privacy]`: the silo's ledger after the latest job.
    privacy: Option<crate::trace::PrivacyRecord>,
    /// Reservations on the manifest's relays and the path of each member connection.
    reach: reach::Reach,
}

/// At most one warning per this period for each kind of refused connection.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);
/// How often a failed pull to one peer is logged; the failures between are counted on the next
/// line.
const FAILED_PULL_LOG_PERIOD: Duration = Duration::from_secs(60);

/// Runs a node until its rounds are done or `shutdown` resolves.
pub async fn run(
    cfg: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Ending, NodeError> {
    run_from(cfg, None, shutdown).await
}

/// What a node starts from: its core, model and round (fresh or from its checkpoint).
struct Start {
    peer: Peer,
    silo: FedericoSilo,
    round: u64,
    /// The checkpoint's privacy ledger, if it had one.
    ledger: Option<crate::privacy::Ledger>,
}

/// [`run`], starting a run without a checkpoint from `start` instead of the seeded
/// initialisation (a coordinated node falling back to FedeRiCo carries its model over).
pub(crate) async fn run_from(
    cfg: NodeConfig,
    start: Option<Vec<f32>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Ending, NodeError> {
    // Sockets, the checkpoint and the run log share this limit.
    limits::raise_open_files();
    let key = identity::load_key(&cfg.key)?;
    let peer_id = key.public().to_peer_id();
    let manifest = Manifest::load(&cfg.manifest)?;
    let me = setup::member_of(&cfg, &manifest, peer_id)?;
    let data = setup::load_data(&cfg, me)?;
    let card_data = cfg.card_data()?;
    let train = &data.train;
    let spec = cfg
        .model
        .spec(&train.sample_shape, train.num_classes())
        .map_err(fatal)?;
    if let Some(names) = &card_data.class_names
        && Some(names.len()) != train.num_classes()
    {
        return Err(fatal(format!(
            "{} class names (data.class_names, or the classes.json beside the shard) for data \
             of {} classes",
            names.len(),
            train.num_classes().unwrap_or(0)
        )));
    }
    let fingerprint = spec.fingerprint();
    let n_train = train.len();
    std::fs::create_dir_all(&cfg.state_dir)
        .map_err(|e| fatal(format!("creating {}: {e}", cfg.state_dir.display())))?;
    // Held until this function returns: a second copy of this silo stops here.
    let _lock = crate::store::lock_dir(&cfg.state_dir).map_err(fatal)?;
    let ckpt_path = cfg.state_dir.join("checkpoint.bin");
    let learner = Learner::new(&spec, cfg.train.batch_size).map_err(fatal)?;
    let Start {
        peer,
        silo,
        round,
        ledger,
    } = setup::resume(&cfg, &manifest, me, peer_id, &ckpt_path, &learner, start)?;
    let steps = sub_steps(&cfg, &manifest)?;
    let sub_steps = steps.sub_steps;
    let silo = silo
        .with_score_rows(cfg.federico.score_share, cfg.seed, me, train)
        .with_batches(steps, cfg.seed, me, n_train, cfg.train.batch_size, round);
    let silo = setup::private(&cfg, silo, me, n_train, sub_steps, (ledger, round))?;
    let num_params = silo.params.len();
    let privacy = silo.privacy_record();
    drop(learner);

    // Metrics: ours plus libp2p's transport bandwidth, in one registry.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    if cfg.privacy.is_some() {
        metrics.register_privacy(&mut registry);
    }
    let swarm = setup::build_swarm(
        &cfg,
        &manifest,
        me,
        key,
        &mut registry,
        &metrics,
        num_params,
    )?;
    let registry = Arc::new(registry);
    if let Some(addr) = &cfg.metrics {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| fatal(format!("metrics address {addr}: {e}")))?;
        info!(%addr, "serving metrics");
        tokio::spawn(metrics::serve(listener, registry.clone()));
    }
    let mut control_rx = setup::start_control(&cfg).await?;

    let peer_ids: Vec<PeerId> = manifest.members.iter().map(|m| m.peer_id).collect();
    let nodes = peer_ids
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, NodeId(i as u32)))
        .collect();

    let round_cfg = round_config(&cfg, &manifest, me, n_train, num_params, sub_steps);
    let snapshot = Arc::new(silo.params.clone());
    let engine = Round::new(
        round_cfg,
        peer,
        round,
        silo.version,
        snapshot,
        Instant::now(),
    );

    // The training thread, over bounded channels both ways.
    let (job_tx, job_rx) = std::sync::mpsc::sync_channel(QUEUE);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel(QUEUE);
    let trainer = Trainer::new(
        &spec,
        cfg.train.batch_size,
        data,
        silo,
        peer_id.to_string(),
        ckpt_path,
        cfg.name.clone(),
    )
    .map_err(fatal)?
    .with_card_data(card_data);
    let trainer_thread = std::thread::Builder::new()
        .name("trainer".into())
        .spawn(move || trainer.run(job_rx, done_tx))
        .map_err(fatal)?;

    let log = RunLog::open(&cfg.state_dir, round).map_err(fatal)?;
    let saves = SaveHealth::new(metrics.checkpoint_failures.clone());
    let mut d = Driver {
        name: cfg.name.clone(),
        me,
        manifest,
        swarm,
        round: engine,
        metrics,
        registry,
        peer_ids,
        nodes,
        fingerprint,
        num_params,
        n_train,
        reqs: HashMap::new(),
        shown_rounds: round,
        blocked: HashSet::new(),
        impair: Impairment::new(stream_seed(cfg.seed, me, Stream::Faults)),
        attack_plan: cfg
            .control
            .as_ref()
            .map(|c| control::attack_plan(&c.attacks))
            .transpose()
            .map_err(fatal)?
            .unwrap_or_default(),
        attack_planned: 0,
        jobs: Some(job_tx),
        evaluating: None,
        export: None,
        export_asked: None,
        last_eval: None,
        rounds_run: 0,
        rounds_with_peers: 0,
        on_screen: (u64::MAX, 0, None),
        log,
        saves,
        refused_in: Throttle::new(REFUSAL_LOG_PERIOD),
        refused_out: Throttle::new(REFUSAL_LOG_PERIOD),
        failed_pulls: Throttle::new(FAILED_PULL_LOG_PERIOD),
        privacy: None,
        reach: reach::Reach::default(),
        cfg,
    };
    d.metrics.rounds.set(round as i64);
    d.emulate_links()?;
    d.note_privacy(privacy);
    d.listen_on_relays();
    d.dial_members();
    info!(node = %me, peer = %peer_id, name = %d.name, round, "node started");

    let result = d.event_loop(&mut done_rx, &mut control_rx, shutdown).await;
    // Closing the job channel ends the trainer after the jobs already queued (a checkpoint
    // among them is written whole).
    d.jobs = None;
    drop(done_rx);
    if trainer_thread.join().is_err() {
        return Err(fatal("the training thread panicked"));
    }
    result
}

/// The M-step's sub-steps per round, the round engine's and the owner's own (`mstep =
/// "local_epoch"`): `"epoch"` and `"local_epoch"` take the manifest's `epoch_steps`, which
/// every member must share (an error names the fix when it is missing).
fn sub_steps(cfg: &NodeConfig, manifest: &Manifest) -> Result<Steps, NodeError> {
    let mstep = cfg.federico.mstep();
    match manifest.epoch_steps {
        None if mstep.needs_epoch() => Err(fatal(format!(
            "federico.mstep = {} takes one epoch of the federation's \
             largest silo in sub-steps per round, a number every member must share: set \
             epoch_steps = ceil(largest silo's training samples / train.batch_size) in the \
             manifest {} (`federico init` writes it), or mstep = \"full\" or \
             {{ minibatch = S }} in this node's config",
            if mstep == MStep::Epoch {
                "\"epoch\" (the default)"
            } else {
                "\"local_epoch\""
            },
            cfg.manifest.display()
        ))),
        steps => Ok(mstep.steps(steps.unwrap_or(1))),
    }
}

/// The round engine's settings from the node's config and the manifest.
fn round_config(
    cfg: &NodeConfig,
    manifest: &Manifest,
    me: NodeId,
    n_train: usize,
    num_params: usize,
    sub_steps: Option<u64>,
) -> RoundConfig {
    RoundConfig {
        me,
        members: manifest.members.len(),
        rounds: (cfg.rounds > 0).then_some(cfg.rounds),
        eval_every: cfg.eval_every,
        n_train,
        num_params,
        clip_norm: cfg.federico.clip_norm,
        suspect_after: cfg.federico.suspect_after,
        model_deadline: cfg.model_deadline(),
        gradient_deadline: cfg.gradient_deadline(),
        start_deadline: Duration::from_secs_f64(cfg.deadlines.start_s),
        alone_after: cfg.deadlines.alone_s.map(Duration::from_secs_f64),
        linger: Duration::from_secs_f64(cfg.deadlines.linger_s),
        sub_steps,
        foreign_cap: cfg.federico.foreign_cap(manifest.members.len()),
        norm_bound: cfg.defences.norm_bound(cfg.federico.variant),
        drop_opposed: cfg.defences.drop_opposed(cfg.federico.variant),
        distrust: cfg.defences.distrust(cfg.federico.variant),
        weigh_absent: cfg.defences.weigh_absent(cfg.federico.variant),
    }
}

impl Driver {
    fn dial_members(&mut self) {
        for (i, m) in self.manifest.members.iter().enumerate() {
            let reachable = !m.addrs.is_empty() || !self.manifest.relays.is_empty();
            if i != self.me.index()
                && reachable
                && !self.round.is_connected(NodeId(i as u32))
                && !self.blocked.contains(&m.peer_id)
            {
                // The manifest's addresses and the circuits through every relay, given again
                // each time: libp2p's behaviours forget an address after a failed dial, and a
                // relay that was down for a moment must not leave a member undialable.
                let addrs: Vec<Multiaddr> = m
                    .addrs
                    .iter()
                    .cloned()
                    .chain(self.manifest.relays.iter().map(|r| r.circuit_to(m.peer_id)))
                    .collect();
                let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(m.peer_id)
                    .addresses(addrs)
                    .extend_addresses_through_behaviour()
                    .build();
                if let Err(e) = self.swarm.dial(opts) {
                    debug!(peer = %m.name, "dial: {e}");
                }
            }
        }
        for b in self.cfg.bootstrap.clone() {
            if let Ok(addr) = b.parse::<Multiaddr>() {
                let _ = self.swarm.dial(addr);
            }
        }
    }

    /// A command of the control channel: cut or restore links (a scheduled partition).
    fn handle_control(&mut self, cmd: control::Command) -> serde_json::Value {
        match cmd {
            control::Command::Block(peers) => {
                for p in peers {
                    // Closes the open connections and refuses new ones, both ways.
                    self.swarm.behaviour_mut().blocked.block_peer(p);
                    self.blocked.insert(p);
                }
                info!(
                    blocked = self.blocked.len(),
                    "links cut by the control channel"
                );
            }
            control::Command::Unblock(peers) => {
                for p in peers {
                    self.swarm.behaviour_mut().blocked.unblock_peer(p);
                    self.blocked.remove(&p);
                    if let Err(e) = self.swarm.dial(p) {
                        debug!(peer = %p, "dial after unblock: {e}");
                    }
                }
                info!(
                    blocked = self.blocked.len(),
                    "links restored by the control channel"
                );
            }
            control::Command::Delay(d) => {
                self.impair.set_delay(d);
                info!(
                    delay_ms = d.as_millis() as u64,
                    "delay of what this node sends set by the control channel"
                );
            }
            control::Command::Loss { fraction, peers } => {
                let n = peers.len();
                self.impair.set_loss(fraction, peers);
                info!(
                    fraction,
                    peers = n,
                    "message loss set by the control channel (0 peers: every peer)"
                );
            }
            control::Command::Export => self.ask_export("the control channel"),
            control::Command::Attack(attack) => {
                let what = attack.as_ref().map_or("none".into(), |a| a.describe());
                let work = Work::Attack {
                    attack,
                    me: self.me,
                    seed: self.cfg.seed,
                };
                if let Err(e) = self.send_work(work) {
                    return serde_json::json!({"ok": false, "error": e.to_string()});
                }
                warn!(attack = %what, "this node now poisons what it sends (control channel)");
            }
            control::Command::Status => {}
        }
        serde_json::json!({"ok": true, "round": self.round.rounds_done(),
            "version": self.round.version(), "connected": self.round.connected(),
            "blocked": self.blocked.len(), "impairment": self.impair.describe()})
    }

    /// Someone wants the model now: the round in progress ends with an evaluation, and the
    /// predictor it scores is exported as after any evaluation.
    fn ask_export(&mut self, by: &str) {
        let round = self.round.request_evaluation();
        self.export_asked = Some(round);
        info!(
            round,
            "export asked for by {by}: evaluating at the end of this round"
        );
    }

    async fn event_loop(
        &mut self,
        done_rx: &mut tokio::sync::mpsc::Receiver<Output>,
        control_rx: &mut tokio::sync::mpsc::Receiver<control::Request>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<Ending, NodeError> {
        tokio::pin!(shutdown);
        let mut redial = tokio::time::interval(Duration::from_secs(5));
        let mut usr1 = log::export_signal();
        loop {
            self.apply_actions()?;
            self.show_progress();
            if self.round.is_finished() {
                progress::finish();
                self.summary();
                return Ok(Ending::Finished);
            }
            let timeout = self.round.poll_timeout();
            let sleep = async {
                match timeout {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            let held_due = self.impair.next_due();
            let release = async {
                match held_due {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut shutdown => {
                    info!(round = self.round.rounds_done(), "stopping: the round in flight is abandoned; the last checkpoint stands");
                    return Ok(Ending::Interrupted);
                }
                event = self.swarm.select_next_some() => self.handle_swarm(event),
                out = done_rx.recv() => match out {
                    Some(out) => self.handle_output(out)?,
                    None => return Err(fatal("the training thread stopped")),
                },
                _ = sleep => self.round.handle_timeout(Instant::now()),
                _ = release => self.release_held(),
                Some((cmd, reply)) = control_rx.recv() => {
                    let _ = reply.send(self.handle_control(cmd));
                }
                Some(()) = log::next_signal(&mut usr1) => self.ask_export("SIGUSR1"),
                _ = redial.tick() => {
                    self.listen_on_relays();
                    if self.round.connected() + 1 < self.manifest.members.len() {
                        self.dial_members();
                    }
                }
            }
        }
    }

    /// What the training thread produced.
    fn handle_output(&mut self, out: Output) -> Result<(), NodeError> {
        let done = match out {
            Output::Failed(e) => return Err(fatal(format!("training thread: {e}"))),
            Output::Saved { round } => {
                debug!(round, "checkpoint written");
                self.saves.saved(round);
                return Ok(());
            }
            Output::SaveFailed { round, error } => {
                self.saves.failed(round, &error, Instant::now());
                return Ok(());
            }
            Output::Exported { round, written } => {
                let asked = self.export_asked.is_some_and(|r| round >= r);
                match written {
                    Ok(path) if asked => {
                        self.export_asked = None;
                        info!(round, path = %path.display(), "model exported as asked")
                    }
                    Ok(path) => debug!(round, path = %path.display(), "model exported"),
                    Err(e) => warn!(round, error = %e, "could not export the model"),
                }
                return Ok(());
            }
            Output::Done(done, privacy) => {
                self.note_privacy(privacy);
                done
            }
        };
        if let Done::Evaluated { round, score } = &done {
            let eval = Evaluation {
                loss_sum: score.loss_sum,
                correct: score.correct,
                count: score.count,
            };
            self.metrics.test_accuracy.set(eval.accuracy());
            self.last_eval = Some((*round, eval.accuracy()));
            info!(
                round,
                accuracy = eval.accuracy(),
                loss = eval.mean_loss(),
                "evaluated"
            );
            // The predictor just scored becomes the silo's model to take home.
            if let Some((r, parts)) = self.evaluating.take().filter(|(r, _)| r == round) {
                let parts = parts
                    .into_iter()
                    .map(|(b, p, w)| (self.node_name(b), p, w))
                    .collect();
                let accuracy = (eval.count > 0).then(|| eval.accuracy());
                // Sent after the round's checkpoint (`apply_actions`): exporting never delays it.
                self.export = Some(Work::Export {
                    round: r,
                    parts,
                    accuracy,
                });
            }
        }
        self.round
            .handle_done(Instant::now(), done)
            .map_err(fatal)?;
        if self.round.rounds_done() != self.shown_rounds {
            self.shown_rounds = self.round.rounds_done();
            self.metrics.rounds.set(self.shown_rounds as i64);
            self.update_peer_metrics();
        }
        Ok(())
    }

    /// The progress line on a terminal, when something on it changed.
    fn show_progress(&mut self) {
        if !progress::shown() {
            return;
        }
        let now = (
            self.round.rounds_done(),
            self.round.connected(),
            self.last_eval.map(|e| e.0),
        );
        if now != self.on_screen {
            self.on_screen = now;
            let peers = self.manifest.members.len().saturating_sub(1);
            let total = (self.cfg.rounds > 0).then_some(self.cfg.rounds);
            progress::show(now.0, total, self.last_eval, (now.1, peers));
        }
    }

    /// The closing lines a person reads: rounds, the last accuracy, how many rounds had a
    /// peer in them, where the results are.
    fn summary(&mut self) {
        self.log.close();
        let state = &self.cfg.state_dir;
        let (done, run) = (self.round.rounds_done(), self.rounds_run);
        if run == 0 {
            info!(
                "run already finished: {done} rounds; run log {}, model {}",
                self.log.path().display(),
                state.join("model.json").display()
            );
            return;
        }
        let mut accuracy = self.last_eval.map_or("not evaluated".into(), |(r, a)| {
            format!("accuracy {:.2} % at round {r}", 100.0 * a)
        });
        if let Some(p) = self.privacy {
            accuracy += &format!(
                ", privacy: epsilon {:.2} spent of {} (delta {:.1e}){}",
                p.epsilon,
                p.budget,
                p.delta,
                if p.exhausted { ", budget spent" } else { "" }
            );
        }
        if !self.manifest.relays.is_empty() {
            let (direct, relayed) = self.paths();
            info!(
                direct,
                relayed,
                "members connected at the end: {direct} directly, {relayed} through a relay only"
            );
        }
        let paths = format!(
            "run log {}, model {}",
            self.log.path().display(),
            state.join("model.json").display()
        );
        if self.rounds_with_peers == 0 {
            warn!(
                "run finished: {done} rounds, {accuracy}, but NO PEER TOOK PART in any of the \
                 {run} rounds this process ran: this silo trained alone (a Local run, not a \
                 federation); check that the other silos ran and could reach this one; {paths}"
            );
        } else {
            info!(
                "run finished: {done} rounds, {accuracy}; peers' models arrived in {} of the \
                 {run} rounds this process ran; {paths}",
                self.rounds_with_peers
            );
        }
    }

    /// A node's name: its manifest name, or `node-<i>` for a late joiner.
    fn node_name(&self, b: NodeId) -> String {
        self.manifest
            .members
            .get(b.index())
            .map_or_else(|| format!("node-{}", b.index()), |m| m.name.clone())
    }

    fn send_work(&mut self, work: Work) -> Result<(), NodeError> {
        let Some(jobs) = self.jobs.as_ref() else {
            return Err(fatal("the training thread stopped"));
        };
        jobs.try_send(work).map_err(|e| match e {
            std::sync::mpsc::TrySendError::Full(_) => {
                fatal("the training thread's queue is full (more than one round in flight)")
            }
            std::sync::mpsc::TrySendError::Disconnected(_) => fatal("the training thread stopped"),
        })
    }

    /// The wide-area links of the swarm's scenario (`[control] links`), by member name.
    fn emulate_links(&mut self) -> Result<(), NodeError> {
        let Some(c) = &self.cfg.control else {
            return Ok(());
        };
        let mut links = Vec::with_capacity(c.links.len());
        for l in &c.links {
            let Some(m) = self.manifest.members.iter().find(|m| m.name == l.to) else {
                return Err(fatal(format!(
                    "control.links: the manifest has no member named {:?}",
                    l.to
                )));
            };
            links.push((m.peer_id, l.wan().map_err(fatal)?));
        }
        if !links.is_empty() {
            info!(
                links = links.len(),
                "emulating the scenario's wide-area links on what this node sends"
            );
        }
        self.impair.set_links(links);
        Ok(())
    }

    /// Starts the planned attack of the round in progress before its next job (the simulator's
    /// silo starts it at the same job: both follow the engine's round count).
    fn follow_attack_plan(&mut self) -> Result<(), NodeError> {
        let round = self.round.rounds_done() + 1;
        let mut due = None;
        while let Some((from, attack)) = self.attack_plan.get(self.attack_planned) {
            if *from > round {
                break;
            }
            due = Some(attack.clone());
            self.attack_planned += 1;
        }
        let Some(attack) = due else {
            return Ok(());
        };
        match &attack {
            Some(a) => warn!(
                attack = %a.describe(),
                round,
                "this node now poisons what it sends (the swarm's plan)"
            ),
            None => info!(round, "this node sends honestly again (the swarm's plan)"),
        }
        self.send_work(Work::Attack {
            attack,
            me: self.me,
            seed: self.cfg.seed,
        })
    }

    /// Carries out what the round engine asks for, in order.
    fn apply_actions(&mut self) -> Result<(), NodeError> {
        while let Some(action) = self.round.poll_action() {
            match action {
                Action::Pull { req, to, round } => {
                    if self.impair.lost(&self.peer_ids[to.index()]) {
                        // Never sent: the pull runs out its deadline, as a lost request would.
                        debug!(peer = %to, round, "pull lost (scheduled message loss)");
                        self.round.forget(req);
                    } else {
                        self.request(req, to, ModelRequest::Pull { round });
                    }
                }
                Action::Notice { req, to, round } => {
                    self.request(req, to, ModelRequest::Notice { round })
                }
                Action::Fetch { req, to, version } => {
                    self.request(req, to, ModelRequest::Fetch { version })
                }
                Action::Finished { req, to } => self.request(req, to, ModelRequest::Done),
                Action::Serve {
                    to,
                    handle,
                    version,
                    params,
                } => self.serve(to, handle, version, params),
                Action::Gradient {
                    to,
                    version,
                    weight,
                    grad,
                } => {
                    let req = GradientRequest::Gradient {
                        version,
                        fingerprint: self.fingerprint,
                        n_train: self.n_train as u64,
                        weight,
                        grad,
                    };
                    self.send_gradient(to, req);
                }
                Action::Skip { to, version } => {
                    self.send_gradient(to, GradientRequest::Skip { version })
                }
                Action::Run(job) => {
                    self.follow_attack_plan()?;
                    if let Job::Evaluate { round, parts } = &job {
                        self.evaluating = Some((*round, parts.clone()));
                    }
                    self.send_work(Work::Learn(job))?
                }
                Action::Checkpoint { round, peer } => {
                    self.send_work(Work::Checkpoint { round, peer })?;
                    if let Some(export) = self.export.take() {
                        self.send_work(export)?;
                    }
                }
                Action::Report(rep) => self.append_log(rep)?,
                Action::Log(e) => log::event(&e),
            }
        }
        Ok(())
    }

    fn request(&mut self, req: ReqId, to: NodeId, request: ModelRequest) {
        match self
            .impair
            .route_small(Instant::now(), &self.peer_ids[to.index()])
        {
            Route::At(t) => self.impair.hold(t, Deferred::Request { req, to, request }),
            _ => self.send_request_now(req, to, request),
        }
    }

    fn send_request_now(&mut self, req: ReqId, to: NodeId, request: ModelRequest) {
        let id = self
            .swarm
            .behaviour_mut()
            .model
            .send_request(&self.peer_ids[to.index()], request);
        self.reqs.insert(id, req);
    }

    fn serve(&mut self, from: NodeId, channel: Channel, version: u64, params: Arc<Vec<f32>>) {
        let resp = ModelResponse::Model(ModelPayload {
            version,
            fingerprint: self.fingerprint,
            params,
        });
        let now = Instant::now();
        let bytes = crate::faults::link::wire_bytes(params_len(&resp));
        match self.impair.route(now, &self.peer_ids[from.index()], bytes) {
            Route::Now => self.send_model(from, channel, resp),
            Route::At(t) => self.impair.hold(
                t,
                Deferred::Model {
                    from,
                    channel,
                    resp,
                },
            ),
            Route::Lost => {
                debug!(peer = %from, "model lost (scheduled message loss)");
                self.impair.hold(now + LOST_HOLD, Deferred::Forget(channel));
            }
        }
    }

    fn send_gradient(&mut self, to: NodeId, req: GradientRequest) {
        // Its acknowledgement (or a rejection) is only logged.
        let now = Instant::now();
        let peer = self.peer_ids[to.index()];
        let route = match &req {
            GradientRequest::Gradient { grad, .. } => {
                let bytes = crate::faults::link::wire_bytes(grad.len());
                self.impair.route(now, &peer, bytes)
            }
            // A skip is not a payload: the scheduled delay and loss leave it alone.
            _ => self.impair.route_small(now, &peer),
        };
        match route {
            Route::Now => {
                self.swarm
                    .behaviour_mut()
                    .gradient
                    .send_request(&self.peer_ids[to.index()], req);
            }
            Route::At(t) => self.impair.hold(t, Deferred::Gradient { to, req }),
            Route::Lost => debug!(peer = %to, "gradient lost (scheduled message loss)"),
        }
    }

    /// Answers a notice or the end of a peer's run, after the link's time if it has one.
    fn acknowledge(&mut self, from: NodeId, channel: Channel) {
        let resp = ModelResponse::Ack;
        match self
            .impair
            .route_small(Instant::now(), &self.peer_ids[from.index()])
        {
            Route::At(t) => self.impair.hold(
                t,
                Deferred::Model {
                    from,
                    channel,
                    resp,
                },
            ),
            _ => self.send_model(from, channel, resp),
        }
    }

    fn send_model(&mut self, from: NodeId, channel: Channel, resp: ModelResponse) {
        if self
            .swarm
            .behaviour_mut()
            .model
            .send_response(channel, resp)
            .is_err()
        {
            debug!(peer = %from, "requester left before the model was sent");
        }
    }

    /// Sends the messages a scheduled delay held back that are due now.
    fn release_held(&mut self) {
        for d in self.impair.due(Instant::now()) {
            match d {
                Deferred::Model {
                    from,
                    channel,
                    resp,
                } => self.send_model(from, channel, resp),
                Deferred::Gradient { to, req } => {
                    self.swarm
                        .behaviour_mut()
                        .gradient
                        .send_request(&self.peer_ids[to.index()], req);
                }
                Deferred::Request { req, to, request } => self.send_request_now(req, to, request),
                Deferred::Forget(channel) => drop(channel),
            }
        }
    }

    /// Shows the ledger after a job in the metrics, and says once, at WARN, when the budget
    /// runs out.
    fn note_privacy(&mut self, now: Option<crate::trace::PrivacyRecord>) {
        let Some(p) = now else { return };
        self.metrics.privacy_epsilon.set(p.epsilon);
        self.metrics.privacy_exhausted.set(i64::from(p.exhausted));
        if p.exhausted && !self.privacy.is_some_and(|q| q.exhausted) {
            warn!(
                epsilon_spent = %format!("{:.3}", p.epsilon),
                epsilon_budget = p.budget,
                "privacy budget spent: this silo releases nothing new from its rows (zero \
                 gradients, the worst loss for every model); its model is still served"
            );
        }
        self.privacy = Some(p);
    }

    /// Appends one round to the run log and flushes it.
    fn append_log(&mut self, rep: RoundReport) -> Result<(), NodeError> {
        self.rounds_run += 1;
        self.rounds_with_peers += u64::from(!rep.answered.is_empty());
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let rec = NodeRound::from_report(
            self.me.0,
            rep,
            at,
            self.metrics.sent.get(),
            metrics::stream_bytes_sent(&self.registry),
        );
        let rec = NodeRound {
            privacy: self.privacy,
            ..rec
        };
        self.log.write(rec.round, &rec);
        Ok(())
    }

    fn update_peer_metrics(&self) {
        let peer = self.round.peer();
        let suspects = (0..self.round.known())
            .filter(|&i| peer.is_suspect(NodeId(i)))
            .count();
        self.metrics.suspects.set(suspects as i64);
        for (id, e, _) in peer.table().iter() {
            self.metrics
                .set_peer(&id.to_string(), peer.weight(id), e.tracked_loss);
        }
    }
}
