//! `federico coordinator --config FILE`: the thin FedDisco, HCCT, FedSaC or FedCollab coordinator as a libp2p
//! peer of the federation (same manifest, keys and Noise encryption as the nodes; it is a manifest member,
//! so the allow-list admits it). It never sees data and never trains.
//! Owns: the coordinator's swarm (allow-list, connection caps, the receive budget and
//! bad-frame blocking of [`Limits::coordinator`], `/federico/coord/2`), the round
//! clock (close when every registered node sent, or at the update deadline τ), the join
//! deadline of FedCollab, HCCT and FedSaC (`join_s`: when it passes, joining is closed on the
//! silos that came), held fetches,
//! the per-round JSONL log and the checkpoint after every round (resumed on restart; a
//! failed write is counted, logged and tried again at the next change, never fatal).
//! Must not: decide weights, groups, coalitions or models itself
//! ([`crate::coord::feddisco_server`], [`crate::coord::hcct_server`],
//! [`crate::coord::fedsac_server`] and [`crate::coord::fedcollab_server`] do; the driver only
//! shuttles requests to them through one `CoordAlgorithm` each, in `coordinator/algorithm.rs`). FedCollab has no rounds here: the coordinator plans, takes the
//! distances, solves and serves each silo its coalition (`fedcollab.json`) until stopped. Nor
//! read its config file ([`super::config`] does, and checks it).
//!
//! The initial model is silo 0's seeded initialisation, exactly as `federico simulate`'s
//! FedDisco and HCCT start (`stream_seed(seed, NodeId(0), Stream::Init)` on the configured
//! model), so the coordinator needs the model, the sample shape and the class count, not the
//! data. HCCT's, FedSaC's and FedCollab's silos are named by their index in the manifest, as in
//! the simulator.

mod algorithm;

use super::behaviour::{CoordCodec, Exchange, Members, coordination_swarm, members};
use super::config::CoordinatedAlgorithm;
pub use super::config::CoordinatorConfig;
use super::identity::{self, Manifest};
use super::intake::{Blocks, Intake, Limits};
use super::metrics::Metrics;
use super::trainer::SaveHealth;
use crate::coord::fedcollab_server::FedCollabServer;
use crate::coord::feddisco::Params;
use crate::coord::feddisco_server::ServerState;
use crate::coord::fedsac_server::{self, FedsacServer};
use crate::coord::hcct_server::HcctServer;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::Learner;
use crate::protocol::{COORD_PROTOCOL, CoordRequest, CoordResponse};
use crate::scenario::FedsacScore;
use algorithm::{CoordAlgorithm, Disco};
use libp2p::StreamProtocol;
use libp2p::futures::StreamExt;
use libp2p::request_response::{self as rr, ProtocolSupport, ResponseChannel};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;
use std::io::Write;
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

impl CoordinatorConfig {
    /// FedSaC's coordinator settings.
    fn fedsac_settings(&self) -> fedsac_server::Settings {
        let f = &self.fedsac;
        fedsac_server::Settings {
            alpha: f.alpha,
            beta: f.beta,
            alpha_cutoff: f.alpha_cutoff,
            principal_angles: f.principal_angles,
            cohort_size: f.cohort_size,
            score_trained: f.score == FedsacScore::Trained,
        }
    }

    /// The seed of FedSaC's cohort stream: the simulator's.
    fn fedsac_sampler_seed(&self) -> u64 {
        stream_seed(
            self.seed ^ crate::silo::fedsac::STREAM_TAG,
            NodeId(u32::MAX),
            Stream::Sampling,
        )
    }

    fn params(&self) -> Params {
        Params {
            a: self.feddisco.a,
            b: self.feddisco.b,
            normalise: self.feddisco.normalise,
        }
    }
}

#[derive(NetworkBehaviour)]
struct CoordBehaviour {
    /// Members blocked for a while after repeated bad frames (first: refused before the rest
    /// sees the connection).
    blocks: Blocks,
    members: Members,
    limits: libp2p::connection_limits::Behaviour,
    memory: libp2p::memory_connection_limits::Behaviour,
    coord: Exchange<CoordRequest, CoordResponse>,
    ping: libp2p::ping::Behaviour,
}

/// One JSONL line of `coordinator.jsonl`.
#[derive(Serialize)]
struct LogLine {
    #[serde(flatten)]
    round: serde_json::Value,
    /// Seconds since the round opened.
    elapsed_s: f64,
}

/// Runs the coordinator until its rounds are done or `shutdown` resolves.
pub async fn run(
    cfg: CoordinatorConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    super::limits::raise_open_files();
    let key = identity::load_key(&cfg.key)?;
    let peer_id = key.public().to_peer_id();
    let manifest = Manifest::load(&cfg.manifest)?;
    let (_, member) = manifest
        .by_name(&cfg.name)
        .ok_or_else(|| anyhow::anyhow!("name {:?} is not in the manifest", cfg.name))?;
    if member.peer_id != peer_id {
        anyhow::bail!(
            "key has peer ID {peer_id}, the manifest lists {} for {:?}",
            member.peer_id,
            cfg.name
        );
    }
    std::fs::create_dir_all(&cfg.state_dir)?;
    let _lock = crate::store::lock_dir(&cfg.state_dir).map_err(|e| anyhow::anyhow!(e))?;
    let ckpt = cfg.state_dir.join("coordinator.bin");
    let state = open_algorithm(&cfg, &ckpt)?;
    if state.round() > 0 || state.registered() > 0 {
        info!(
            round = state.round(),
            registered = state.registered(),
            "resuming from checkpoint"
        );
    }
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let allowed: Option<Vec<libp2p::PeerId>> =
        (!manifest.open).then(|| manifest.members.iter().map(|m| m.peer_id).collect());
    let max = cfg.max_message_mib << 20;
    let deadline = Duration::from_secs_f64(cfg.update_deadline_s);
    let silos = super::limits::sized_for(manifest.members.len(), manifest.open);
    let intake_limits = Limits::coordinator(silos, state.num_params());
    info!(
        max_message_kib = max.div_ceil(1024),
        receive_budget_kib = intake_limits.budget.div_ceil(1024),
        peer_share_kib = intake_limits.peer_budget.div_ceil(1024),
        streams_per_peer = intake_limits.streams_per_peer,
        "message bounds"
    );
    let intake = Intake::new(intake_limits, metrics.clone());
    let saves = SaveHealth::new(metrics.checkpoint_failures.clone());
    let behaviour = CoordBehaviour {
        blocks: Blocks::new(intake.clone()),
        members: members(allowed),
        limits: super::limits::behaviour(manifest.members.len(), manifest.open),
        memory: super::limits::memory(),
        coord: Exchange::new(
            CoordCodec::with_intake(max, metrics, intake),
            [(StreamProtocol::new(COORD_PROTOCOL), ProtocolSupport::Full)],
            // Fetches are held up to a whole round: bound the exchange by 3 τ.
            rr::Config::default()
                .with_request_timeout(deadline * 3)
                .with_max_concurrent_streams(1024),
        ),
        ping: libp2p::ping::Behaviour::default(),
    };
    let swarm = coordination_swarm(key, &cfg.listen, behaviour)?;
    let log_path = cfg.state_dir.join("coordinator.jsonl");
    let cut = crate::trace::trim_log(&log_path, state.round()).map_err(|e| anyhow::anyhow!(e))?;
    if cut > 0 {
        warn!(
            lines = cut,
            checkpoint_round = state.round(),
            "round log cut back to the checkpoint"
        );
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    info!(peer = %peer_id, algorithm = %cfg.algorithm, round = state.round(), rounds = cfg.rounds, "coordinator started");
    let driver = Driver {
        num_params: state.num_params(),
        silos: manifest.members.iter().map(|m| m.peer_id).collect(),
        cfg: &cfg,
        state,
        swarm,
        held: Vec::new(),
        log,
        ckpt,
        saves,
        opened: Instant::now(),
        round_deadline: None,
    };
    driver.run(deadline, shutdown).await
}

/// The configured algorithm's server: resumed from the checkpoint `ckpt` when there is one,
/// else fresh, every silo starting from silo 0's seeded initialisation.
fn open_algorithm(cfg: &CoordinatorConfig, ckpt: &Path) -> anyhow::Result<Box<dyn CoordAlgorithm>> {
    let spec = cfg
        .model
        .spec(&cfg.sample_shape, Some(cfg.classes))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let params = cfg.params();
    params.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let init = || {
        Learner::new(&spec, 1)
            .map(|l| {
                l.init_params(&mut StdRng::seed_from_u64(stream_seed(
                    cfg.seed,
                    NodeId(0),
                    Stream::Init,
                )))
            })
            .map_err(|e| anyhow::anyhow!("{e}"))
    };
    // A latest that fails its checksum or does not decode falls back to the previous
    // generation (with a warning); both failing is an error naming both files.
    type Decode<'a> = &'a dyn Fn(&[u8]) -> Result<Box<dyn CoordAlgorithm>, String>;
    let load = |decode: Decode| {
        crate::store::load(ckpt, decode)
            .map(|l| l.map(|l| l.value))
            .map_err(|e| anyhow::anyhow!("checkpoint {e}"))
    };
    let same_silos = |saved: usize| {
        if saved == cfg.nodes {
            Ok(())
        } else {
            Err(format!(
                "saved for {saved} silos, the config has nodes = {}",
                cfg.nodes
            ))
        }
    };
    let resumed = match cfg.algorithm {
        CoordinatedAlgorithm::Hcct => load(&|b| {
            let s = HcctServer::decode(cfg.hcct.clone(), cfg.rounds, b)?;
            same_silos(s.nodes())?;
            Ok(Box::new(s))
        })?,
        CoordinatedAlgorithm::Fedsac => load(&|b| {
            let s = FedsacServer::decode(
                cfg.fedsac_settings(),
                cfg.rounds,
                cfg.fedsac_sampler_seed(),
                b,
            )?;
            same_silos(s.nodes())?;
            Ok(Box::new(s))
        })?,
        CoordinatedAlgorithm::Fedcollab => load(&|b| {
            let s = FedCollabServer::decode(cfg.fedcollab.clone(), cfg.seed, b)?;
            same_silos(s.nodes())?;
            Ok(Box::new(s))
        })?,
        CoordinatedAlgorithm::Feddisco => load(&|b| {
            Ok(Box::new(Disco {
                state: ServerState::decode(b)?,
                params,
            }))
        })?,
    };
    if let Some(s) = resumed {
        return Ok(s);
    }
    Ok(match cfg.algorithm {
        CoordinatedAlgorithm::Hcct => Box::new(
            HcctServer::new(cfg.hcct.clone(), cfg.nodes, cfg.rounds, init()?)
                .map_err(|e| anyhow::anyhow!(e))?,
        ),
        CoordinatedAlgorithm::Fedsac => Box::new(
            FedsacServer::new(
                cfg.fedsac_settings(),
                cfg.nodes,
                cfg.rounds,
                cfg.fedsac_sampler_seed(),
                init()?,
            )
            .map_err(|e| anyhow::anyhow!(e))?,
        ),
        CoordinatedAlgorithm::Fedcollab => Box::new(
            FedCollabServer::new(cfg.fedcollab.clone(), cfg.nodes, cfg.seed)
                .map_err(|e| anyhow::anyhow!(e))?,
        ),
        CoordinatedAlgorithm::Feddisco => Box::new(Disco {
            state: ServerState::new(init()?),
            params,
        }),
    })
}

/// A fetch held until its round exists: the silo's index, the round, the channel.
type Held = (Option<usize>, u64, ResponseChannel<CoordResponse>);

/// The coordinator's loop: one algorithm behind [`CoordAlgorithm`], its swarm, the held
/// fetches, the round clock, the round log and the checkpoint.
struct Driver<'a> {
    cfg: &'a CoordinatorConfig,
    state: Box<dyn CoordAlgorithm>,
    swarm: libp2p::Swarm<CoordBehaviour>,
    /// Fetches answered once their round exists.
    held: Vec<Held>,
    /// `coordinator.jsonl`.
    log: std::fs::File,
    /// `coordinator.bin`, written after every change a restart must not lose.
    ckpt: std::path::PathBuf,
    /// How the checkpoint writes are going (a failed one is logged and tried again).
    saves: SaveHealth,
    /// When the open round opened (its log line's `elapsed_s`).
    opened: Instant,
    /// When the open round closes with what arrived (τ after it opened); `None` while the
    /// clock does not run.
    round_deadline: Option<Instant>,
    /// The model size requests are checked against (0: no model reaches this coordinator).
    num_params: usize,
    /// The manifest's members, whose positions are the silo indices.
    silos: Vec<libp2p::PeerId>,
}

impl Driver<'_> {
    /// The loop: the join deadline, the round clock, the linger after the last round, and the
    /// peers' requests, until the rounds are done or `shutdown` resolves.
    async fn run(
        mut self,
        deadline: Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let cfg = self.cfg;
        let mut linger: Option<Instant> = None;
        // The join deadline (FedCollab, HCCT, FedSaC): armed by the first join (or a resumed
        // one), it closes joining once enough silos are in; `join_due` once it passed with
        // fewer.
        let mut join_deadline: Option<Instant> = None;
        let mut join_due = false;
        tokio::pin!(shutdown);
        loop {
            if let Some(j) = cfg.join_s
                && !self.state.plan_out()
                && self.state.registered() > 0
            {
                join_deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs_f64(j));
                if join_due && self.state.may_close_joining() {
                    let absent = self.state.close_joining().map_err(|e| anyhow::anyhow!(e))?;
                    warn!(
                        ?absent,
                        join_s = j,
                        "join deadline passed: the run starts without these silos; they will train alone"
                    );
                    self.save();
                    self.serve_held();
                    continue;
                }
            }
            // The round clock runs whenever a round is open and someone registered, so a round
            // whose updates were lost (a restart) still closes, keeping the global.
            if self.round_deadline.is_none()
                && self.state.round() < cfg.rounds
                && self.state.clock_may_run()
            {
                self.round_deadline = Some(Instant::now() + deadline);
                self.opened = Instant::now();
            }
            if self.state.round() >= cfg.rounds && linger.is_none() {
                info!("all rounds done; serving the final model a while");
                linger = Some(Instant::now() + deadline.min(Duration::from_secs(10)));
            }
            let wake = linger
                .or(self.round_deadline)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            // The join deadline, while joining is open and it has not passed yet.
            let join_at = join_deadline.filter(|_| !join_due && !self.state.plan_out());
            let join_timer = tokio::time::sleep_until(join_at.unwrap_or(wake));
            tokio::select! {
                _ = &mut shutdown => {
                    info!("stopped by a signal");
                    return Ok(());
                }
                _ = tokio::time::sleep_until(wake) => {
                    if linger.is_some() {
                        return Ok(());
                    }
                    if self.round_deadline.is_some() {
                        self.close_round(true)?;
                    }
                }
                // (The top of the loop closes joining once it may.)
                _ = join_timer, if join_at.is_some() => join_due = true,
                ev = self.swarm.select_next_some() => {
                    let SwarmEvent::Behaviour(CoordBehaviourEvent::Coord(rr::Event::Message {
                        peer,
                        message: rr::Message::Request { request, channel, .. },
                        ..
                    })) = ev else {
                        // (A request the codec refused never gets here: the codec logs it with
                        // the member's peer ID and counts it by reason.)
                        if let SwarmEvent::NewListenAddr { address, .. } = ev {
                            info!(%address, "listening");
                        }
                        continue;
                    };
                    self.handle_request(peer, request, channel)?;
                }
            }
        }
    }

    /// HCCT's, FedSaC's and FedCollab's silos are the manifest's members, by index (FedDisco
    /// takes any member).
    fn index_of(&self, peer: &libp2p::PeerId) -> Option<usize> {
        self.silos
            .iter()
            .position(|p| p == peer)
            .filter(|&i| self.cfg.algorithm == CoordinatedAlgorithm::Feddisco || i < self.cfg.nodes)
    }

    /// One peer's request: checked, then handed to the algorithm; answered now, or held (a
    /// fetch of a round that does not exist yet). A registration, distances or the last update
    /// of a round may let held fetches go.
    fn handle_request(
        &mut self,
        peer: libp2p::PeerId,
        request: CoordRequest,
        channel: ResponseChannel<CoordResponse>,
    ) -> anyhow::Result<()> {
        let cfg = self.cfg;
        let who = peer.to_string();
        let index = self.index_of(&peer);
        if let Err(reason) = request.check(cfg.feddisco.metric, cfg.classes, self.num_params) {
            warn!(peer = %who, %reason, "refused a request");
            self.respond(channel, CoordResponse::Error { reason });
            return Ok(());
        }
        match request {
            CoordRequest::Register { .. } | CoordRequest::Join { .. } => {
                let answer = match self.state.register(&who, index, &request) {
                    Ok(()) => {
                        let waiting_for = self.state.missing();
                        info!(peer = %who, ?index, ?request, ?waiting_for, "registered");
                        if index.is_some_and(|i| self.state.left_out(i)) {
                            warn!(peer = %who, ?index, "registered after the run started without it: it trains alone");
                        }
                        self.save();
                        // HCCT: the last registration opens round 0.
                        self.serve_held();
                        CoordResponse::Ack
                    }
                    Err(reason) => {
                        warn!(peer = %who, %reason, "refused a registration");
                        CoordResponse::Error { reason }
                    }
                };
                self.respond(channel, answer);
            }
            CoordRequest::Fetch { round } => match self.state.fetch(index, round) {
                Ok(Some(answer)) => self.respond(channel, answer),
                Ok(None) => self.held.push((index, round, channel)),
                Err(reason) => self.respond(channel, CoordResponse::Error { reason }),
            },
            CoordRequest::Distances { .. } => {
                let answer = match self.state.update(&who, index, request) {
                    Ok(solved) => {
                        info!(peer = %who, ?index, "distances received");
                        self.save();
                        if solved && let Some(s) = self.state.solved() {
                            let record = Some(serde_json::to_value(s)?);
                            crate::report::summary::write_json(
                                &cfg.state_dir.join("fedcollab.json"),
                                &record,
                            )
                            .map_err(|e| anyhow::anyhow!("{e}"))?;
                            info!(coalitions = ?Some(&s.coalitions), "structure solved");
                            self.serve_held();
                        }
                        CoordResponse::Ack
                    }
                    Err(reason) => {
                        warn!(peer = %who, %reason, "refused distances");
                        CoordResponse::Error { reason }
                    }
                };
                self.respond(channel, answer);
            }
            CoordRequest::Update { .. } | CoordRequest::Contribute { .. } => {
                if self.state.round() >= cfg.rounds {
                    let reason = "the run is over".into();
                    self.respond(channel, CoordResponse::Error { reason });
                    return Ok(());
                }
                match self.state.update(&who, index, request) {
                    Ok(all_in) => {
                        self.respond(channel, CoordResponse::Ack);
                        if all_in && self.state.complete(cfg.nodes) {
                            self.close_round(false)?;
                        }
                    }
                    Err(reason) => {
                        warn!(peer = %who, %reason, "refused an update");
                        self.respond(channel, CoordResponse::Error { reason });
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends an answer; a peer that has gone meanwhile is no error.
    fn respond(&mut self, channel: ResponseChannel<CoordResponse>, answer: CoordResponse) {
        let _ = self
            .swarm
            .behaviour_mut()
            .coord
            .send_response(channel, answer);
    }

    /// Writes the checkpoint. A write that fails (a full disk, no file descriptors left) is
    /// counted and logged, never fatal: the previous checkpoint stays, and the next change
    /// writes again.
    fn save(&mut self) {
        let round = self.state.round();
        let written = self.state.encode().and_then(|bytes| {
            crate::store::save(&self.ckpt, &bytes)
                .map_err(|e| format!("{}: {e}", self.ckpt.display()))
        });
        match written {
            Ok(()) => self.saves.saved(round),
            Err(e) => self.saves.failed(round, &e, std::time::Instant::now()),
        }
    }

    /// Closes the open round (at its deadline, or once every update is in): its log line, then
    /// the checkpoint; the next round's clock starts over and held fetches of it go.
    fn close_round(&mut self, timed_out: bool) -> anyhow::Result<()> {
        let (round, senders, line) = self
            .state
            .close(timed_out)
            .map_err(|e| anyhow::anyhow!(e))?;
        // The line before the checkpoint: a kill between the two leaves a line the restart cuts.
        let text = serde_json::to_string(&LogLine {
            round: line,
            elapsed_s: self.opened.elapsed().as_secs_f64(),
        })?;
        writeln!(self.log, "{text}")?;
        self.log.flush()?;
        self.save();
        info!(round, senders, timed_out, "round closed");
        self.round_deadline = None;
        self.opened = Instant::now();
        self.serve_held();
        Ok(())
    }

    /// Answers the held fetches whose round now exists (or that are now refused).
    fn serve_held(&mut self) {
        let mut keep = Vec::new();
        for (index, round, channel) in std::mem::take(&mut self.held) {
            let answer = match self.state.fetch(index, round) {
                Ok(Some(answer)) => answer,
                Ok(None) => {
                    keep.push((index, round, channel));
                    continue;
                }
                Err(reason) => CoordResponse::Error { reason },
            };
            self.respond(channel, answer);
        }
        self.held = keep;
    }
}
