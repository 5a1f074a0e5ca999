//! The round driver of one peer (`federico node`): spec `federico.md` §6 over libp2p.
//!
//! Owns: the event loop that owns the swarm and the FedeRiCo core ([`Peer`]), and moves models,
//! gradients and round notices between them and the training thread; deadlines; the owner's
//! serving rules; refusing decoded messages that fail the checks (a warning naming the peer, a
//! count by reason, and no change of state); checkpoints on round boundaries; the run log;
//! shutdown.
//! Must not: decide what the core decides (sampling, weights, which gradients count), or run
//! any tensor work: that goes to the training thread, so serving never waits for training.
//!
//! # A round, as this driver runs it
//!
//! Round 1 waits (at most `start_s`) until every member is connected *and* runs FedeRiCo: a
//! connection alone can be to another program holding the member's key and address.
//!
//! Round r (the node has completed r − 1 rounds and holds version v):
//! 1. `peer.sample()`; a `Pull{r}` goes to each sampled peer and a `Notice{r}` to every other
//!    connected peer, so every owner learns who will (not) pull from it this round.
//! 2. Pulled models are checked (fingerprint, size, finiteness) as they arrive; a peer that
//!    fails or misses τ_model counts as unreachable (it keeps its last loss, spec §6).
//! 3. The trainer measures each received model and the node's own; the core's E-step gives the
//!    fresh weights; the trainer scales the gradients, which go to their owners.
//! 4. As an owner, the node served its version v to every `Pull{r}`; it steps once its inbox
//!    is complete (every served requester sent a gradient or a skip) *and* every connected peer
//!    has said what it does in round r — or when τ_grad runs out. A `Pull{r+1}` that arrives
//!    before the step waits for it, so it is served version v + 1. With no faults this is the
//!    simulator's lock-step round, decision for decision.
//! 5. After the step: checkpoint; on evaluation rounds, `Fetch` the post-step models of the
//!    peers with inference weight and score the mixture on the test split; log the round.

use super::behaviour::{Behaviour, BehaviourConfig, BehaviourEvent};
use super::config::NodeConfig;
use super::control;
use super::identity::{self, Manifest};
use super::impair::{Impairment, LOST_HOLD, Route};
use super::metrics::{self, Metrics, Reason};
use super::trainer::{Checkpoint, Done, Job, OwnModel, Trainer};
use crate::core::{GradientInbox, Peer, Stragglers};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Adam, Learner, Shard};
use crate::protocol::{
    self as wire, GradientRequest, GradientResponse, ModelPayload, ModelRequest, ModelResponse,
    WireError,
};
pub use crate::trace::{EvalRecord, NodeRound};
use libp2p::futures::StreamExt;
use libp2p::request_response::{self as rr, OutboundRequestId, ResponseChannel};
use libp2p::swarm::{DialError, ListenError, SwarmEvent};
use libp2p::{Multiaddr, PeerId, Swarm, SwarmBuilder, noise, tcp, yamux};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
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

/// Where the node is in its round.
#[derive(Debug)]
enum Phase {
    /// Waiting for the members to connect before round 1.
    Starting { until: Instant },
    /// Pulls out, waiting for models.
    Pulling {
        deadline: Instant,
        waiting: BTreeSet<NodeId>,
    },
    /// The trainer measures losses and gradients.
    Measuring,
    /// The trainer scales the gradients by the fresh weights.
    Scaling,
    /// Own gradient in; waiting for the others' gradients and round notices.
    Owning { deadline: Instant },
    /// The trainer takes the optimizer step.
    Stepping,
    /// Fetching post-step models for evaluation.
    Fetching {
        deadline: Instant,
        waiting: BTreeSet<NodeId>,
    },
    /// The trainer scores the mixture.
    Evaluating,
    /// All rounds done; serving the final model until every peer is done or the deadline.
    Lingering { until: Instant },
}

/// What a model request was for.
#[derive(Clone, Copy, Debug)]
enum Outstanding {
    Pull { round: u64, to: NodeId },
    Fetch { to: NodeId },
    Other,
}

/// A request an owner holds until it has the version to answer with.
struct Held {
    from: NodeId,
    channel: ResponseChannel<ModelResponse>,
    /// `Some(round)` for a pull (a gradient will follow), `None` for a fetch.
    pull_round: Option<u64>,
    /// For a fetch: the version wanted.
    version: u64,
}

/// A message held back by a scheduled delay or loss (`impair`).
enum Deferred {
    /// A model answer, sent when due.
    Model {
        from: NodeId,
        channel: ResponseChannel<ModelResponse>,
        resp: ModelResponse,
    },
    /// A weighted gradient, sent when due.
    Gradient { to: NodeId, req: GradientRequest },
    /// A lost answer: its channel is dropped unanswered when due (the requester has timed out).
    Forget(#[allow(dead_code)] ResponseChannel<ModelResponse>),
}

/// The running node.
struct Driver {
    cfg: NodeConfig,
    me: NodeId,
    name: String,
    manifest: Manifest,
    swarm: Swarm<Behaviour>,
    peer: Peer,
    metrics: Metrics,
    registry: Arc<prometheus_client::registry::Registry>,
    /// Peer id of every known node, by node id (manifest order, then late joiners).
    peer_ids: Vec<PeerId>,
    nodes: HashMap<PeerId, NodeId>,
    connected: BTreeSet<NodeId>,
    /// Connected peers known to run FedeRiCo: identify listed the model protocol, or they sent
    /// a FedeRiCo request. A member's address can be held by another program of the same silo
    /// (the coordinated node it falls back from), which accepts the connection and speaks none
    /// of our protocols: round 1 waits for members in this set, not merely connected.
    speaking: BTreeSet<NodeId>,
    /// The latest round each peer said it is in (pull or notice).
    seen_round: BTreeMap<NodeId, u64>,
    /// Peers that finished their last round.
    done_peers: BTreeSet<NodeId>,

    fingerprint: u64,
    num_params: usize,
    n_train: usize,
    /// Rounds completed.
    round: u64,
    /// v_i.
    version: u64,
    /// The model served to pullers: the latest step's parameters.
    snapshot: Arc<Vec<f32>>,
    inbox: GradientInbox,
    /// Samplers whose gradients keep missing the step: served, taken, not waited for.
    stragglers: Stragglers,
    held: Vec<Held>,
    phase: Phase,

    // The round in progress.
    round_started: Instant,
    /// The same, in Unix seconds, for the run log.
    round_started_unix: f64,
    sampled: Vec<NodeId>,
    received: Vec<(NodeId, u64, Arc<Vec<f32>>)>,
    /// Pulls given up on: their model may still come, and then gets a `Skip`.
    abandoned: HashSet<OutboundRequestId>,
    outstanding: HashMap<OutboundRequestId, Outstanding>,
    fetched: Vec<(NodeId, Arc<Vec<f32>>, f64)>,
    pending_record: Option<NodeRound>,
    /// Resumed from a checkpoint and the first round since is not logged yet.
    resumed: bool,
    /// Peers cut off by the control channel (a scheduled partition).
    blocked: HashSet<PeerId>,
    /// Delay and loss set by the control channel (a scheduled straggler or lossy network).
    impair: Impairment<Deferred>,
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    log: std::io::BufWriter<std::fs::File>,
    log_path: PathBuf,
}

/// How a node run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Every configured round ran.
    Finished,
    /// Stopped by a signal after the last completed round's checkpoint.
    Interrupted,
}

/// Runs a node until its rounds are done or `shutdown` resolves.
pub async fn run(
    cfg: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Ending, NodeError> {
    run_from(cfg, None, shutdown).await
}

/// [`run`], starting a run without a checkpoint from `start` instead of the seeded
/// initialisation (a coordinated node falling back to FedeRiCo carries its model over).
pub(crate) async fn run_from(
    cfg: NodeConfig,
    start: Option<Vec<f32>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Ending, NodeError> {
    let key = identity::load_key(&cfg.key)?;
    let peer_id = key.public().to_peer_id();
    let manifest = Manifest::load(&cfg.manifest)?;
    let (me, member) = manifest.by_name(&cfg.name).ok_or_else(|| {
        fatal(format!(
            "name {:?} is not a member of the manifest {} (members: {})",
            cfg.name,
            cfg.manifest.display(),
            manifest
                .members
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    if member.peer_id != peer_id {
        return Err(fatal(format!(
            "key {} has peer ID {peer_id}, but the manifest lists {} for {:?}",
            cfg.key.display(),
            member.peer_id,
            cfg.name
        )));
    }
    let data = match &cfg.data.shard {
        Some(path) => {
            let shard = Shard::read(path)?;
            if shard.node != me.0 {
                warn!(
                    shard_node = shard.node,
                    manifest_node = me.0,
                    "shard was written for another position in the federation"
                );
            }
            shard.data
        }
        None => cfg.data.load()?,
    };
    let train = &data.train;
    let spec = cfg
        .model
        .spec(&train.sample_shape, train.num_classes())
        .map_err(fatal)?;
    let learner = Learner::new(&spec, cfg.train.batch_size).map_err(fatal)?;
    let num_params = learner.num_params();
    let fingerprint = spec.fingerprint();
    let n_train = train.len();

    std::fs::create_dir_all(&cfg.state_dir)
        .map_err(|e| fatal(format!("creating {}: {e}", cfg.state_dir.display())))?;
    let ckpt_path = cfg.state_dir.join("checkpoint.bin");
    let ids: Vec<NodeId> = (0..manifest.members.len() as u32).map(NodeId).collect();
    let (peer, params, adam, version, round) = match Checkpoint::read(&ckpt_path).map_err(fatal)? {
        Some(c) => {
            if c.peer_id != peer_id.to_string() {
                return Err(fatal(format!(
                    "checkpoint {} belongs to peer {}, not to this key ({peer_id})",
                    ckpt_path.display(),
                    c.peer_id
                )));
            }
            if c.params.len() != num_params {
                return Err(fatal(format!(
                    "checkpoint {} holds {} parameters, the configured model has {num_params}",
                    ckpt_path.display(),
                    c.params.len()
                )));
            }
            info!(
                round = c.round,
                version = c.version,
                "resuming from checkpoint"
            );
            (c.peer, c.params, c.adam, c.version, c.round)
        }
        None => {
            let params = match start {
                Some(p) if p.len() == num_params => p,
                Some(p) => {
                    return Err(fatal(format!(
                        "a starting model of {} parameters, the configured model has {num_params}",
                        p.len()
                    )));
                }
                None => learner.init_params(&mut StdRng::seed_from_u64(stream_seed(
                    cfg.seed,
                    me,
                    Stream::Init,
                ))),
            };
            let peer = Peer::new(
                me,
                ids.iter().copied(),
                cfg.federico.clone(),
                stream_seed(cfg.seed, me, Stream::Sampling),
            );
            let adam = Adam::new(num_params, cfg.train.lr as f32);
            (peer, params, adam, 0, 0)
        }
    };
    drop(learner);

    // Metrics: ours plus libp2p's transport bandwidth, in one registry.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let allowed = (!manifest.open).then(|| manifest.members.iter().map(|m| m.peer_id).collect());
    let behaviour_cfg = BehaviourConfig {
        allowed,
        max_message: cfg.max_message(),
        request_timeout: cfg.model_deadline() + cfg.gradient_deadline(),
        mdns: cfg.mdns,
    };
    let behaviour_metrics = metrics.clone();
    let mut swarm = SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            yamux::Config::default,
        )
        .map_err(fatal)?
        .with_quic()
        .with_bandwidth_metrics(&mut registry)
        .with_behaviour(|key| {
            Behaviour::new(key, behaviour_cfg, behaviour_metrics)
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })
        .map_err(fatal)?
        // Rounds must not drop connections: idle means "between rounds" here.
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(3600)))
        .build();
    for a in &cfg.listen {
        let addr: Multiaddr = a.parse().map_err(fatal)?;
        swarm
            .listen_on(addr.clone())
            .map_err(|e| fatal(format!("listen on {addr}: {e}")))?;
    }
    let registry = Arc::new(registry);
    if let Some(addr) = &cfg.metrics {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| fatal(format!("metrics address {addr}: {e}")))?;
        info!(%addr, "serving metrics");
        tokio::spawn(metrics::serve(listener, registry.clone()));
    }

    // The control channel of a swarm's fault schedule (only with the token it wrote).
    let (control_tx, mut control_rx) = tokio::sync::mpsc::channel::<control::Request>(16);
    if let Some(c) = &cfg.control {
        let token = std::fs::read_to_string(&c.token_file)
            .map_err(|e| fatal(format!("control token {}: {e}", c.token_file.display())))?
            .trim()
            .to_string();
        if token.is_empty() {
            return Err(fatal(format!(
                "control token {} is empty",
                c.token_file.display()
            )));
        }
        let listener = tokio::net::TcpListener::bind(&c.listen)
            .await
            .map_err(|e| fatal(format!("control address {}: {e}", c.listen)))?;
        let addr = listener.local_addr().map_err(fatal)?;
        crate::store::write_atomic(
            &cfg.state_dir.join("control.addr"),
            addr.to_string().as_bytes(),
        )
        .map_err(fatal)?;
        info!(%addr, "control channel listening");
        tokio::spawn(control::serve(listener, token, control_tx));
    } else {
        drop(control_tx);
    }

    let peer_ids: Vec<PeerId> = manifest.members.iter().map(|m| m.peer_id).collect();
    let nodes = peer_ids
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, NodeId(i as u32)))
        .collect();
    for (i, m) in manifest.members.iter().enumerate() {
        if i == me.index() {
            continue;
        }
        for a in &m.addrs {
            swarm.add_peer_address(m.peer_id, a.clone());
            swarm.behaviour_mut().kad.add_address(&m.peer_id, a.clone());
        }
    }
    for b in &cfg.bootstrap {
        let addr: Multiaddr = b.parse().map_err(fatal)?;
        if let Some(libp2p::multiaddr::Protocol::P2p(p)) = addr.iter().last() {
            swarm.add_peer_address(p, addr.clone());
            swarm.behaviour_mut().kad.add_address(&p, addr.clone());
        }
    }

    // The training thread.
    let (job_tx, job_rx) = std::sync::mpsc::channel();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let trainer = Trainer::new(
        &spec,
        cfg.train.batch_size,
        data,
        OwnModel {
            params: params.clone(),
            adam,
            version,
        },
        peer_id.to_string(),
        ckpt_path,
    )
    .map_err(fatal)?;
    let trainer_thread = std::thread::Builder::new()
        .name("trainer".into())
        .spawn(move || trainer.run(job_rx, done_tx))
        .map_err(fatal)?;

    let log_path = cfg.state_dir.join("rounds.jsonl");
    let cut = crate::trace::trim_log(&log_path, round + 1).map_err(fatal)?;
    if cut > 0 {
        warn!(
            lines = cut,
            checkpoint_round = round,
            "run log cut back to the checkpoint (rounds it had not saved, or a torn line)"
        );
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| fatal(format!("{}: {e}", log_path.display())))?;

    let start_deadline = Instant::now() + Duration::from_secs_f64(cfg.deadlines.start_s);
    let mut d = Driver {
        name: cfg.name.clone(),
        me,
        manifest,
        swarm,
        peer,
        metrics,
        registry,
        peer_ids,
        nodes,
        connected: BTreeSet::new(),
        speaking: BTreeSet::new(),
        seen_round: BTreeMap::new(),
        done_peers: BTreeSet::new(),
        fingerprint,
        num_params,
        n_train,
        round,
        version,
        snapshot: Arc::new(params),
        inbox: GradientInbox::new(version, num_params).with_clip_norm(cfg.federico.clip_norm),
        stragglers: Stragglers::new(cfg.federico.suspect_after),
        held: Vec::new(),
        phase: Phase::Starting {
            until: start_deadline,
        },
        round_started: Instant::now(),
        round_started_unix: 0.0,
        sampled: Vec::new(),
        received: Vec::new(),
        abandoned: HashSet::new(),
        outstanding: HashMap::new(),
        fetched: Vec::new(),
        pending_record: None,
        resumed: round > 0,
        blocked: HashSet::new(),
        impair: Impairment::new(stream_seed(cfg.seed, me, Stream::Faults)),
        jobs: Some(job_tx),
        log: std::io::BufWriter::new(log),
        log_path,
        cfg,
    };
    d.inbox.expect(me);
    d.metrics.rounds.set(round as i64);
    d.dial_members();
    info!(node = %me, peer = %peer_id, name = %d.name, round, "node started");

    let result = d.event_loop(&mut done_rx, &mut control_rx, shutdown).await;
    // Closing the job channel ends the trainer after the jobs already queued (a checkpoint
    // among them is written whole).
    d.jobs = None;
    if trainer_thread.join().is_err() {
        return Err(fatal("the training thread panicked"));
    }
    result
}

impl Driver {
    fn dial_members(&mut self) {
        for (i, m) in self.manifest.members.iter().enumerate() {
            if i != self.me.index()
                && !m.addrs.is_empty()
                && !self.connected.contains(&NodeId(i as u32))
                && !self.blocked.contains(&m.peer_id)
            {
                if let Err(e) = self.swarm.dial(m.peer_id) {
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
            control::Command::Status => {}
        }
        serde_json::json!({"ok": true, "round": self.round, "version": self.version,
            "connected": self.connected.len(), "blocked": self.blocked.len(),
            "impairment": self.impair.describe()})
    }

    fn send_job(&mut self, job: Job) -> Result<(), NodeError> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| fatal("the training thread stopped"))
    }

    fn total_rounds(&self) -> Option<u64> {
        (self.cfg.rounds > 0).then_some(self.cfg.rounds)
    }

    /// The round in progress (or about to start).
    fn current_round(&self) -> u64 {
        self.round + 1
    }

    fn next_deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Starting { until } | Phase::Lingering { until } => Some(*until),
            Phase::Pulling { deadline, .. }
            | Phase::Owning { deadline }
            | Phase::Fetching { deadline, .. } => Some(*deadline),
            _ => None,
        }
    }

    async fn event_loop(
        &mut self,
        done_rx: &mut tokio::sync::mpsc::UnboundedReceiver<Done>,
        control_rx: &mut tokio::sync::mpsc::Receiver<control::Request>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<Ending, NodeError> {
        tokio::pin!(shutdown);
        let mut redial = tokio::time::interval(Duration::from_secs(5));
        loop {
            let deadline = self.next_deadline();
            let sleep = async {
                match deadline {
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
                    info!(round = self.round, "stopping: the round in flight is abandoned; the last checkpoint stands");
                    return Ok(Ending::Interrupted);
                }
                event = self.swarm.select_next_some() => self.handle_swarm(event)?,
                done = done_rx.recv() => match done {
                    Some(done) => self.handle_done(done)?,
                    None => return Err(fatal("the training thread stopped")),
                },
                _ = sleep => self.handle_timeout()?,
                _ = release => self.release_held(),
                Some((cmd, reply)) = control_rx.recv() => {
                    let _ = reply.send(self.handle_control(cmd));
                }
                _ = redial.tick() => {
                    if self.connected.len() + 1 < self.manifest.members.len() {
                        self.dial_members();
                    }
                }
            }
            if self.advance()? {
                return Ok(Ending::Finished);
            }
        }
    }

    /// Moves the phase on when its condition holds; true when the node is finished.
    fn advance(&mut self) -> Result<bool, NodeError> {
        loop {
            match &self.phase {
                Phase::Starting { until } => {
                    let ready = self.connected.intersection(&self.speaking).count();
                    let all = ready + 1 >= self.manifest.members.len();
                    if !(all || Instant::now() >= *until) {
                        return Ok(false);
                    }
                    if !all {
                        warn!(
                            connected = self.connected.len(),
                            running_federico = ready,
                            members = self.manifest.members.len(),
                            "starting without every member"
                        );
                    }
                    if self.total_rounds().is_some_and(|t| self.round >= t) {
                        self.finish();
                        continue;
                    }
                    self.start_round();
                }
                Phase::Pulling { deadline, waiting } => {
                    if !waiting.is_empty() && Instant::now() < *deadline {
                        return Ok(false);
                    }
                    let late: Vec<NodeId> = waiting.iter().copied().collect();
                    let r = self.current_round();
                    for b in late {
                        warn!(peer = %b, round = r, "model did not arrive in time");
                        self.peer.handle_unreachable(b);
                    }
                    for (id, what) in &self.outstanding {
                        if matches!(what, Outstanding::Pull { round, .. } if *round == r) {
                            self.abandoned.insert(*id);
                        }
                    }
                    let mut models: Vec<(NodeId, Arc<Vec<f32>>)> = self
                        .received
                        .iter()
                        .map(|(b, _, p)| (*b, p.clone()))
                        .collect();
                    models.push((self.me, self.snapshot.clone()));
                    self.phase = Phase::Measuring;
                    self.send_job(Job::Measure { models })?;
                }
                Phase::Owning { deadline } => {
                    let r = self.current_round();
                    let notices_in = self.connected.iter().all(|k| {
                        self.done_peers.contains(k)
                            || self.seen_round.get(k).is_some_and(|&s| s >= r)
                    });
                    let complete = self.inbox.is_complete() && notices_in;
                    if !complete && Instant::now() < *deadline {
                        return Ok(false);
                    }
                    if !complete {
                        let missing: Vec<String> =
                            self.inbox.missing().map(|m| m.to_string()).collect();
                        warn!(round = r, ?missing, "stepping at the gradient deadline");
                    }
                    let inbox = std::mem::replace(
                        &mut self.inbox,
                        GradientInbox::new(self.version + 1, self.num_params)
                            .with_clip_norm(self.cfg.federico.clip_norm),
                    );
                    let before: Vec<bool> = (0..self.peer_ids.len() as u32)
                        .map(|i| self.stragglers.awaits(NodeId(i)))
                        .collect();
                    self.stragglers.handle_step(&inbox);
                    for (i, was) in before.into_iter().enumerate() {
                        let id = NodeId(i as u32);
                        if was && !self.stragglers.awaits(id) {
                            info!(peer = %id, round = r, "a sampler keeps missing the step: its gradients are taken but no longer waited for");
                        }
                    }
                    if let Some(rec) = self.pending_record.as_mut() {
                        rec.gradients = inbox.gradients();
                    }
                    self.inbox.expect(self.me);
                    self.phase = Phase::Stepping;
                    self.send_job(Job::Step { inbox })?;
                }
                Phase::Fetching { deadline, waiting } => {
                    if !waiting.is_empty() && Instant::now() < *deadline {
                        return Ok(false);
                    }
                    // Peers whose final model did not come are dropped and the rest
                    // renormalised (spec §6, departed peers at inference).
                    // Placeholders of fetches that never arrived are dropped here and the
                    // rest renormalised; a complete mixture keeps the core's weights exactly.
                    let all = std::mem::take(&mut self.fetched);
                    let wanted = all.len();
                    let mut parts: Vec<_> = all.into_iter().filter(|p| !p.1.is_empty()).collect();
                    if parts.len() < wanted {
                        let total: f64 = parts.iter().map(|p| p.2).sum();
                        for p in &mut parts {
                            p.2 /= total;
                        }
                    }
                    self.phase = Phase::Evaluating;
                    self.send_job(Job::Evaluate {
                        round: self.round,
                        parts,
                    })?;
                }
                Phase::Lingering { until } => {
                    let all_done = self.connected.iter().all(|k| self.done_peers.contains(k));
                    return Ok(all_done || Instant::now() >= *until);
                }
                Phase::Measuring | Phase::Scaling | Phase::Stepping | Phase::Evaluating => {
                    return Ok(false);
                }
            }
        }
    }

    fn start_round(&mut self) {
        let r = self.current_round();
        self.round_started = Instant::now();
        self.round_started_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.received.clear();
        self.sampled = self.peer.sample();
        let sampled: BTreeSet<NodeId> = self.sampled.iter().copied().collect();
        debug!(round = r, sampled = ?self.sampled, "round starts");
        for &b in &self.sampled {
            if self.impair.lost(&self.peer_ids[b.index()]) {
                // Never sent: the pull runs out its deadline, as a lost request would.
                debug!(peer = %b, round = r, "pull lost (scheduled message loss)");
                continue;
            }
            let id = self
                .swarm
                .behaviour_mut()
                .model
                .send_request(&self.peer_ids[b.index()], ModelRequest::Pull { round: r });
            self.outstanding
                .insert(id, Outstanding::Pull { round: r, to: b });
        }
        let others: Vec<NodeId> = self
            .connected
            .iter()
            .copied()
            .filter(|k| !sampled.contains(k))
            .collect();
        for k in others {
            let id = self
                .swarm
                .behaviour_mut()
                .model
                .send_request(&self.peer_ids[k.index()], ModelRequest::Notice { round: r });
            self.outstanding.insert(id, Outstanding::Other);
        }
        self.phase = Phase::Pulling {
            deadline: Instant::now() + self.cfg.model_deadline(),
            waiting: sampled,
        };
    }

    fn finish(&mut self) {
        info!(
            round = self.round,
            "last round done; serving the final model until peers are done"
        );
        for k in self.connected.clone() {
            let id = self
                .swarm
                .behaviour_mut()
                .model
                .send_request(&self.peer_ids[k.index()], ModelRequest::Done);
            self.outstanding.insert(id, Outstanding::Other);
        }
        self.phase = Phase::Lingering {
            until: Instant::now() + Duration::from_secs_f64(self.cfg.deadlines.linger_s),
        };
        self.serve_held();
    }

    fn handle_timeout(&mut self) -> Result<(), NodeError> {
        // Deadlines are checked in `advance`; fetches that ran out are dropped there.
        if let Phase::Fetching { deadline, waiting } = &self.phase {
            if Instant::now() >= *deadline {
                for b in waiting {
                    warn!(peer = %b, "final model did not arrive; dropped from the mixture");
                }
            }
        }
        Ok(())
    }

    fn handle_done(&mut self, done: Done) -> Result<(), NodeError> {
        match done {
            Done::Failed(e) => return Err(fatal(format!("training thread: {e}"))),
            Done::Measured { losses } => {
                self.peer.handle_losses(self.n_train, &losses);
                let weights: Vec<(NodeId, f64)> = losses
                    .iter()
                    .map(|(b, _)| (*b, self.peer.weight(*b)))
                    .collect();
                self.phase = Phase::Scaling;
                self.send_job(Job::Scale { weights })?;
            }
            Done::Scaled { grads } => {
                for (b, grad) in grads {
                    if b == self.me {
                        if let Err(r) = self.inbox.handle_gradient(self.me, self.version, grad) {
                            return Err(fatal(format!("own gradient rejected: {r}")));
                        }
                        continue;
                    }
                    let Some((_, version, _)) = self.received.iter().find(|x| x.0 == b) else {
                        continue;
                    };
                    let req = GradientRequest::Gradient {
                        version: *version,
                        fingerprint: self.fingerprint,
                        n_train: self.n_train as u64,
                        weight: self.peer.weight(b),
                        grad,
                    };
                    // Its acknowledgement (or a rejection) is only logged.
                    match self.impair.route(&self.peer_ids[b.index()]) {
                        Route::Now => {
                            self.swarm
                                .behaviour_mut()
                                .gradient
                                .send_request(&self.peer_ids[b.index()], req);
                        }
                        Route::At(t) => self.impair.hold(t, Deferred::Gradient { to: b, req }),
                        Route::Lost => {
                            debug!(peer = %b, "gradient lost (scheduled message loss)")
                        }
                    }
                }
                self.pending_record = Some(NodeRound {
                    node: self.me.0,
                    round: self.current_round(),
                    version: self.version,
                    sampled: self.sampled.iter().map(|b| b.0).collect(),
                    answered: self.received.iter().map(|x| x.0.0).collect(),
                    gradients: 0,
                    weights: self
                        .peer
                        .weights()
                        .into_iter()
                        .map(|(id, w)| (id.0, w))
                        .collect(),
                    eval: None,
                    seconds: 0.0,
                    bytes_sent: 0,
                    stream_bytes_sent: 0,
                    at: 0.0,
                    start: self.round_started_unix,
                    tracked: self
                        .peer
                        .table()
                        .iter()
                        .map(|(id, e, _)| (id.0, e.tracked_loss))
                        .collect(),
                    last: self
                        .peer
                        .table()
                        .iter()
                        .map(|(id, e, _)| (id.0, e.last_loss))
                        .collect(),
                    suspects: Vec::new(),
                    resumed: std::mem::take(&mut self.resumed),
                });
                self.phase = Phase::Owning {
                    deadline: Instant::now() + self.cfg.gradient_deadline(),
                };
            }
            Done::Stepped { params, version } => {
                self.snapshot = params;
                self.version = version;
                self.round += 1;
                self.metrics.rounds.set(self.round as i64);
                self.update_peer_metrics();
                self.serve_held();
                let last = self.total_rounds().is_some_and(|t| self.round >= t);
                if self.round % self.cfg.eval_every == 0 || last {
                    self.start_fetching();
                } else {
                    self.end_round(None)?;
                }
            }
            Done::Evaluated { round, eval } => {
                debug_assert_eq!(round, self.round);
                self.metrics.test_accuracy.set(eval.accuracy());
                info!(
                    round,
                    accuracy = eval.accuracy(),
                    loss = eval.mean_loss(),
                    "evaluated"
                );
                self.end_round(Some(eval.into()))?;
            }
            Done::Saved { round } => debug!(round, "checkpoint written"),
        }
        Ok(())
    }

    fn start_fetching(&mut self) {
        let mix = self.peer.inference_weights();
        self.fetched.clear();
        let mut waiting = BTreeSet::new();
        for (id, w) in mix {
            if id == self.me {
                self.fetched.push((id, self.snapshot.clone(), w));
            } else {
                let req = self.swarm.behaviour_mut().model.send_request(
                    &self.peer_ids[id.index()],
                    ModelRequest::Fetch {
                        version: self.round,
                    },
                );
                self.outstanding.insert(req, Outstanding::Fetch { to: id });
                waiting.insert(id);
                // Remember the weight until the model arrives.
                self.fetched.push((id, Arc::new(Vec::new()), w));
            }
        }
        self.phase = Phase::Fetching {
            deadline: Instant::now() + self.cfg.model_deadline(),
            waiting,
        };
    }

    fn end_round(&mut self, eval: Option<EvalRecord>) -> Result<(), NodeError> {
        if let Some(mut rec) = self.pending_record.take() {
            rec.version = self.version;
            rec.eval = eval;
            rec.seconds = self.round_started.elapsed().as_secs_f64();
            rec.bytes_sent = self.metrics.sent.get();
            rec.stream_bytes_sent = metrics::stream_bytes_sent(&self.registry);
            rec.at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            rec.suspects = (0..self.peer_ids.len() as u32)
                .filter(|&i| self.peer.is_suspect(NodeId(i)))
                .collect();
            // The round's line goes to disk before its checkpoint: a kill between the two
            // leaves a line past the checkpoint, which the restart cuts (`trim_log`), never a
            // checkpointed round without its line.
            self.append_log(&rec)?;
        }
        self.send_job(Job::Checkpoint {
            round: self.round,
            peer: Box::new(self.peer.clone()),
        })?;
        info!(
            round = self.round,
            seconds = self.round_started.elapsed().as_secs_f64(),
            "round done"
        );
        if self.total_rounds().is_some_and(|t| self.round >= t) {
            self.finish();
        } else {
            self.start_round();
        }
        Ok(())
    }

    /// Appends one round to the run log and flushes it.
    fn append_log(&mut self, rec: &NodeRound) -> Result<(), NodeError> {
        let path = &self.log_path;
        serde_json::to_writer(&mut self.log, rec)
            .map_err(|e| fatal(format!("{}: {e}", path.display())))?;
        writeln!(self.log).map_err(|e| fatal(format!("{}: {e}", path.display())))?;
        self.log
            .flush()
            .map_err(|e| fatal(format!("{}: {e}", path.display())))
    }

    fn update_peer_metrics(&self) {
        let suspects = (0..self.peer_ids.len() as u32)
            .filter(|&i| self.peer.is_suspect(NodeId(i)))
            .count();
        self.metrics.suspects.set(suspects as i64);
        for (id, e, w) in self.peer.table().iter() {
            self.metrics.set_peer(&id.to_string(), w, e.tracked_loss);
        }
    }

    /// Serves held requests that can be answered now. Lingering, the model is final: every
    /// request is answered with it (a peer that ran more rounds asks for versions this node
    /// will never reach, e.g. silos that fell back to FedeRiCo at different rounds).
    fn serve_held(&mut self) {
        let held = std::mem::take(&mut self.held);
        let last = matches!(self.phase, Phase::Lingering { .. });
        for h in held {
            let ready = last
                || match h.pull_round {
                    Some(round) => round <= self.current_round(),
                    None => self.version >= h.version,
                };
            if ready {
                self.serve(h.from, h.channel, h.pull_round.is_some());
            } else {
                self.held.push(h);
            }
        }
    }

    fn serve(&mut self, from: NodeId, channel: ResponseChannel<ModelResponse>, expect: bool) {
        if expect {
            self.stragglers.expect(&mut self.inbox, from);
        }
        let resp = ModelResponse::Model(ModelPayload {
            version: self.version,
            fingerprint: self.fingerprint,
            params: self.snapshot.clone(),
        });
        match self.impair.route(&self.peer_ids[from.index()]) {
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
                self.impair
                    .hold(Instant::now() + LOST_HOLD, Deferred::Forget(channel));
            }
        }
    }

    fn send_model(
        &mut self,
        from: NodeId,
        channel: ResponseChannel<ModelResponse>,
        resp: ModelResponse,
    ) {
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
                Deferred::Forget(channel) => drop(channel),
            }
        }
    }

    fn node_of(&mut self, peer: &PeerId) -> Option<NodeId> {
        if let Some(&n) = self.nodes.get(peer) {
            return Some(n);
        }
        if !self.manifest.open {
            return None;
        }
        // Open federation: a new peer joins late, with the optimistic initial loss (spec §6).
        let n = NodeId(self.peer_ids.len() as u32);
        self.peer_ids.push(*peer);
        self.nodes.insert(*peer, n);
        self.peer.handle_peer_joined(n);
        info!(%peer, node = %n, "a new peer joined the open federation");
        Some(n)
    }

    fn handle_swarm(&mut self, event: SwarmEvent<BehaviourEvent>) -> Result<(), NodeError> {
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                info!(%address, "listening");
            }
            SwarmEvent::ConnectionEstablished { peer_id, .. } => {
                if let Some(n) = self.node_of(&peer_id) {
                    if self.connected.insert(n) {
                        debug!(peer = %n, "connected");
                        // Seen alive again: sampleable again (spec §6).
                        self.peer.handle_reachable(n);
                        // A peer that (re)connects after we finished must not wait for our
                        // round notices.
                        if matches!(self.phase, Phase::Lingering { .. }) {
                            let id = self
                                .swarm
                                .behaviour_mut()
                                .model
                                .send_request(&peer_id, ModelRequest::Done);
                            self.outstanding.insert(id, Outstanding::Other);
                        }
                    }
                    self.metrics
                        .connected_peers
                        .set(self.connected.len() as i64);
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } => {
                if let Some(&n) = self.nodes.get(&peer_id) {
                    self.connected.remove(&n);
                    self.speaking.remove(&n);
                    debug!(peer = %n, "disconnected");
                    self.metrics
                        .connected_peers
                        .set(self.connected.len() as i64);
                }
            }
            SwarmEvent::IncomingConnectionError {
                error: ListenError::Denied { cause },
                send_back_addr,
                ..
            } => {
                self.metrics.reject(Reason::NotAMember);
                warn!(from = %send_back_addr, reason = %Reason::NotAMember, "refused a connection: {cause}");
            }
            SwarmEvent::OutgoingConnectionError {
                error: DialError::Denied { cause },
                ..
            } => {
                warn!("refused to dial: {cause}");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Model(e)) => self.handle_model_event(e)?,
            SwarmEvent::Behaviour(BehaviourEvent::Gradient(e)) => self.handle_gradient_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Identify(
                libp2p::identify::Event::Received { peer_id, info, .. },
            )) => {
                if let Some(&n) = self.nodes.get(&peer_id)
                    && info
                        .protocols
                        .iter()
                        .any(|p| p.as_ref() == wire::MODEL_PROTOCOL)
                {
                    self.speaking.insert(n);
                }
                for a in info.listen_addrs {
                    self.swarm.behaviour_mut().kad.add_address(&peer_id, a);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(libp2p::mdns::Event::Discovered(list))) => {
                for (p, a) in list {
                    self.swarm.add_peer_address(p, a);
                    if self.nodes.contains_key(&p) || self.manifest.open {
                        let _ = self.swarm.dial(p);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn handle_model_event(
        &mut self,
        event: rr::Event<ModelRequest, ModelResponse>,
    ) -> Result<(), NodeError> {
        match event {
            rr::Event::Message {
                peer,
                message:
                    rr::Message::Request {
                        request, channel, ..
                    },
                ..
            } => {
                let Some(from) = self.node_of(&peer) else {
                    // Dropping the channel answers nothing.
                    self.metrics.reject(Reason::NotAMember);
                    warn!(%peer, reason = %Reason::NotAMember, "refused a model request from outside the manifest");
                    return Ok(());
                };
                self.speaking.insert(from);
                match request {
                    ModelRequest::Pull { round } => {
                        let s = self.seen_round.entry(from).or_default();
                        *s = (*s).max(round);
                        if round >= self.current_round() {
                            self.peer.handle_heard_from(from);
                        }
                        // A pull for our next round waits for our step, so it gets the model
                        // of that round (lock-step when nothing fails); any other is served now.
                        let hold = matches!(self.phase, Phase::Stepping)
                            || (round == self.current_round() + 1
                                && !matches!(self.phase, Phase::Lingering { .. }));
                        if hold {
                            self.held.push(Held {
                                from,
                                channel,
                                pull_round: Some(round),
                                version: 0,
                            });
                        } else {
                            self.serve(from, channel, true);
                        }
                    }
                    ModelRequest::Notice { round } => {
                        let s = self.seen_round.entry(from).or_default();
                        *s = (*s).max(round);
                        // A timely request is a heartbeat: a suspect may be tried again.
                        if round >= self.current_round() {
                            self.peer.handle_heard_from(from);
                        }
                        let _ = self
                            .swarm
                            .behaviour_mut()
                            .model
                            .send_response(channel, ModelResponse::Ack);
                    }
                    ModelRequest::Fetch { version } => {
                        // Far-future versions are answered at once: never wait on a peer that
                        // is more than a step ahead.
                        if self.version >= version
                            || version > self.version + 1
                            || matches!(self.phase, Phase::Lingering { .. })
                        {
                            self.serve(from, channel, false);
                        } else {
                            self.held.push(Held {
                                from,
                                channel,
                                pull_round: None,
                                version,
                            });
                        }
                    }
                    ModelRequest::Done => {
                        self.done_peers.insert(from);
                        let _ = self
                            .swarm
                            .behaviour_mut()
                            .model
                            .send_response(channel, ModelResponse::Ack);
                    }
                }
            }
            rr::Event::Message {
                peer,
                message:
                    rr::Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => {
                let what = self.outstanding.remove(&request_id);
                let abandoned = self.abandoned.remove(&request_id);
                let Some(from) = self.nodes.get(&peer).copied() else {
                    self.metrics.reject(Reason::NotAMember);
                    warn!(%peer, reason = %Reason::NotAMember, "refused a response from outside the manifest");
                    return Ok(());
                };
                let payload = match (response, what) {
                    (
                        ModelResponse::Model(p),
                        Some(Outstanding::Pull { .. } | Outstanding::Fetch { .. }),
                    ) => p,
                    (ModelResponse::Ack, Some(Outstanding::Other)) => return Ok(()),
                    (response, what) => {
                        // A model for a notice, an acknowledgement for a pull or a fetch, or an
                        // answer to nothing we asked.
                        let reason = Reason::Unexpected;
                        self.metrics.reject(reason);
                        let got = match response {
                            ModelResponse::Model(_) => "a model",
                            ModelResponse::Ack => "an acknowledgement",
                        };
                        warn!(peer = %from, %reason, "refused {got} in answer to {what:?}");
                        self.model_refused(what, abandoned);
                        return Ok(());
                    }
                };
                if let Err(e) = payload.check(self.fingerprint, self.num_params) {
                    let reason = Reason::from(&e);
                    self.metrics.reject(reason);
                    warn!(peer = %from, %reason, "refused a model: {e}");
                    self.model_refused(what, abandoned);
                    return Ok(());
                }
                match what {
                    Some(Outstanding::Pull { round, to })
                        if !abandoned && round == self.current_round() =>
                    {
                        self.peer.handle_reachable(to);
                        self.received.push((to, payload.version, payload.params));
                        // Keep the sampled order (the simulator's order of measurement).
                        let order = &self.sampled;
                        self.received
                            .sort_by_key(|x| order.iter().position(|b| *b == x.0));
                        self.pull_settled(to);
                    }
                    Some(Outstanding::Pull { to, .. }) => {
                        // Too late for its round: release the owner.
                        let _ = self.swarm.behaviour_mut().gradient.send_request(
                            &self.peer_ids[to.index()],
                            GradientRequest::Skip {
                                version: payload.version,
                            },
                        );
                    }
                    Some(Outstanding::Fetch { to }) => {
                        if let Phase::Fetching { waiting, .. } = &mut self.phase {
                            if waiting.remove(&to) {
                                if let Some(slot) = self.fetched.iter_mut().find(|f| f.0 == to) {
                                    slot.1 = payload.params;
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
            rr::Event::OutboundFailure {
                peer,
                request_id,
                error,
                ..
            } => {
                self.abandoned.remove(&request_id);
                // A response the codec refused was logged and counted there.
                let reason = outbound_rejection(&error).map(Reason::from);
                match self.outstanding.remove(&request_id) {
                    Some(Outstanding::Pull { round, to }) => {
                        warn!(peer = %to, round, reason = reason.map(Reason::label), "pull failed: {error}");
                        if round == self.current_round() {
                            self.peer.handle_unreachable(to);
                            self.pull_settled(to);
                        }
                    }
                    Some(Outstanding::Fetch { to }) => {
                        warn!(peer = %to, reason = reason.map(Reason::label), "fetch failed: {error}");
                        if let Phase::Fetching { waiting, .. } = &mut self.phase {
                            waiting.remove(&to);
                        }
                    }
                    _ => match reason {
                        Some(reason) => {
                            warn!(%peer, %reason, "refused the answer to a notice: {error}")
                        }
                        None => debug!("notice failed: {error}"),
                    },
                }
            }
            // A request the codec refused never gets here: the codec logs and counts it.
            rr::Event::InboundFailure { peer, error, .. } => {
                debug!(%peer, "inbound model request failed: {error}");
            }
            rr::Event::ResponseSent { .. } => {}
        }
        Ok(())
    }

    /// A model response was refused: a pull of this round counts as failed (the owner keeps its
    /// last loss, spec §6), a fetch leaves the mixture. Nothing of the response is kept.
    fn model_refused(&mut self, what: Option<Outstanding>, abandoned: bool) {
        match what {
            Some(Outstanding::Pull { round, to })
                if !abandoned && round == self.current_round() =>
            {
                self.peer.handle_unreachable(to);
                self.pull_settled(to);
            }
            Some(Outstanding::Fetch { to }) => {
                if let Phase::Fetching { waiting, .. } = &mut self.phase {
                    waiting.remove(&to);
                }
            }
            _ => {}
        }
    }

    fn pull_settled(&mut self, b: NodeId) {
        if let Phase::Pulling { waiting, .. } = &mut self.phase {
            waiting.remove(&b);
        }
    }

    fn handle_gradient_event(&mut self, event: rr::Event<GradientRequest, GradientResponse>) {
        match event {
            rr::Event::Message {
                peer,
                message:
                    rr::Message::Request {
                        request, channel, ..
                    },
                ..
            } => {
                let Some(from) = self.nodes.get(&peer).copied() else {
                    self.metrics.reject(Reason::NotAMember);
                    warn!(%peer, reason = %Reason::NotAMember, "refused a gradient from outside the manifest");
                    return;
                };
                // Every check runs before the inbox is touched; the inbox's own checks leave it
                // as it was when they refuse.
                let verdict = match request {
                    GradientRequest::Gradient {
                        version,
                        fingerprint,
                        weight,
                        grad,
                        ..
                    } => {
                        if fingerprint != self.fingerprint {
                            let e = WireError::Fingerprint {
                                got: fingerprint,
                                want: self.fingerprint,
                            };
                            Err((Reason::WrongFingerprint, e.to_string()))
                        } else if !weight.is_finite() {
                            Err((Reason::NonFinite, format!("non-finite weight {weight}")))
                        } else {
                            self.inbox
                                .handle_gradient(from, version, grad)
                                .map_err(|r| (Reason::from(&r), r.to_string()))
                        }
                    }
                    GradientRequest::Skip { version } => self
                        .inbox
                        .handle_skip(from, version)
                        .map_err(|r| (Reason::from(&r), r.to_string())),
                };
                let resp = match verdict {
                    Ok(()) => GradientResponse::Accepted,
                    Err((reason, text)) => {
                        self.metrics.reject(reason);
                        // Late gradients are routine under faults (info); anything else is a
                        // warning. Both name the sender.
                        if reason == Reason::Stale {
                            info!(peer = %from, peer_id = %peer, %reason, "refused a gradient: {text}");
                        } else {
                            warn!(peer = %from, peer_id = %peer, %reason, "refused a gradient: {text}");
                        }
                        GradientResponse::Rejected { reason: text }
                    }
                };
                let _ = self
                    .swarm
                    .behaviour_mut()
                    .gradient
                    .send_response(channel, resp);
            }
            rr::Event::Message {
                message:
                    rr::Message::Response {
                        response: GradientResponse::Rejected { reason },
                        ..
                    },
                peer,
                ..
            } => {
                // The peer's words: shortened and escaped before they reach our log.
                let reason: String = reason.chars().take(200).collect();
                debug!(%peer, "our gradient was rejected: {reason:?}");
            }
            rr::Event::OutboundFailure { peer, error, .. } => {
                let reason = outbound_rejection(&error).map(Reason::from);
                warn!(%peer, reason = reason.map(Reason::label), "gradient not delivered: {error}");
            }
            _ => {}
        }
    }
}

/// The frame the codec refused on an outbound stream (the answer), if that is why it failed.
fn outbound_rejection(e: &rr::OutboundFailure) -> Option<&WireError> {
    match e {
        rr::OutboundFailure::Io(e) => wire::rejection(e),
        _ => None,
    }
}
