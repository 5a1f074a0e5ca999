//! `federico coordinator --config FILE`: the thin FedDisco, HCCT, FedSaC or FedCollab coordinator
//! as a libp2p peer of the federation (same manifest, keys and Noise encryption as the nodes; it
//! is a manifest member, so the allow-list admits it). It never sees data and never trains.
//! Owns: the coordinator's swarm (allow-list, connection caps, the receive budget and
//! bad-frame blocking of [`Limits::coordinator`], `/federico/coord/2`), the wire checks of a
//! request, and carrying out the round engine's actions: answers, the round log
//! (`coordinator.jsonl`, never fatal: [`RunLog`]), the checkpoint (a failed write is counted,
//! logged and tried again at the next change), `fedcollab.json`, and log lines.
//! Must not: decide anything about a run. When a round closes, whom it waits for, when joining
//! closes, which fetch is held and when the run ends are [`crate::coord::engine::Engine`]'s
//! rules (this driver passes `Instant::now()` in and compares no deadline itself); weights,
//! groups, coalitions and models are the servers' of [`crate::coord`]. Nor read its config file
//! ([`super::config`] does, and checks it).
//!
//! The initial model is silo 0's seeded initialisation, exactly as `federico simulate`'s
//! FedDisco and HCCT start (`stream_seed(seed, NodeId(0), Stream::Init)` on the configured
//! model), so the coordinator needs the model, the sample shape and the class count, not the
//! data. HCCT's, FedSaC's and FedCollab's silos are named by their index in the manifest, as in
//! the simulator.

use super::behaviour::{CoordCodec, Exchange, Members, coordination_swarm, members};
use super::config::CoordinatedAlgorithm;
pub use super::config::CoordinatorConfig;
use super::identity::{self, Manifest};
use super::intake::{Blocks, Intake, Limits};
use super::metrics::Metrics;
use super::runlog::RunLog;
use super::trainer::SaveHealth;
use crate::coord::engine::{Action, CoordAlgorithm, Disco, Engine, EngineConfig, Event};
use crate::coord::fedcollab_server::FedCollabServer;
use crate::coord::feddisco_server::ServerState;
use crate::coord::fedsac_server::FedsacServer;
use crate::coord::hcct_server::HcctServer;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::Learner;
use crate::protocol::{COORD_PROTOCOL, CoordRequest, CoordResponse};
use libp2p::StreamProtocol;
use libp2p::futures::StreamExt;
use libp2p::request_response::{self as rr, ProtocolSupport, ResponseChannel};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::path::Path;
use std::time::{Duration, Instant};
use tracing::{info, warn};

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
    intake.remember_blocks(cfg.state_dir.join("blocks.json"));
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
    let log = RunLog::open_file(cfg.state_dir.join("coordinator.jsonl"), state.round())
        .map_err(|e| anyhow::anyhow!(e))?;
    info!(peer = %peer_id, algorithm = %cfg.algorithm, round = state.round(), rounds = cfg.rounds, "coordinator started");
    let engine = Engine::new(
        state,
        EngineConfig {
            rounds: cfg.rounds,
            nodes: cfg.nodes,
            round_deadline: deadline,
            join_deadline: cfg.join_s.map(Duration::from_secs_f64),
            linger: deadline.min(Duration::from_secs(10)),
            excuse_rounds: cfg.excuse_rounds,
            names: manifest
                .members
                .iter()
                .map(|m| m.peer_id.to_string())
                .collect(),
        },
    );
    let driver = Driver {
        num_params: engine.algorithm().num_params(),
        silos: manifest.members.iter().map(|m| m.peer_id).collect(),
        cfg: &cfg,
        engine,
        swarm,
        log,
        ckpt,
        saves,
    };
    driver.run(shutdown).await
}

/// The configured algorithm's server: resumed from the checkpoint `ckpt` when there is one,
/// else fresh, every silo starting from silo 0's seeded initialisation.
fn open_algorithm(cfg: &CoordinatorConfig, ckpt: &Path) -> anyhow::Result<Box<dyn CoordAlgorithm>> {
    let spec = cfg
        .model
        .spec(&cfg.sample_shape, Some(cfg.classes))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let params = cfg.feddisco.params();
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
                cfg.fedsac.settings(),
                cfg.rounds,
                crate::silo::fedsac::cohort_seed(cfg.seed),
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
                robust: cfg.feddisco.robust(),
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
                cfg.fedsac.settings(),
                cfg.nodes,
                cfg.rounds,
                crate::silo::fedsac::cohort_seed(cfg.seed),
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
            robust: cfg.feddisco.robust(),
        }),
    })
}

/// The coordinator's loop: the round engine, its swarm, the round log and the checkpoint.
struct Driver<'a> {
    cfg: &'a CoordinatorConfig,
    engine: Engine<ResponseChannel<CoordResponse>>,
    swarm: libp2p::Swarm<CoordBehaviour>,
    /// `coordinator.jsonl`.
    log: RunLog,
    /// `coordinator.bin`, written after every change a restart must not lose.
    ckpt: std::path::PathBuf,
    /// How the checkpoint writes are going (a failed one is logged and tried again).
    saves: SaveHealth,
    /// The model size requests are checked against (0: no model reaches this coordinator).
    num_params: usize,
    /// The manifest's members, whose positions are the silo indices.
    silos: Vec<libp2p::PeerId>,
}

impl Driver<'_> {
    /// The loop: the engine's timeouts and the peers' requests, until the engine finishes or
    /// `shutdown` resolves.
    async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
        tokio::pin!(shutdown);
        self.engine.handle_start(Instant::now())?;
        loop {
            if self.act() {
                self.log.close();
                return Ok(());
            }
            let wake = self.engine.poll_timeout();
            let timer = tokio::time::sleep_until(tokio::time::Instant::from_std(
                wake.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)),
            ));
            tokio::select! {
                _ = &mut shutdown => {
                    info!("stopped by a signal");
                    self.act();
                    self.log.close();
                    return Ok(());
                }
                _ = timer, if wake.is_some() => self.engine.handle_timeout(Instant::now())?,
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

    /// One peer's request: the wire checks, then the engine.
    fn handle_request(
        &mut self,
        peer: libp2p::PeerId,
        request: CoordRequest,
        channel: ResponseChannel<CoordResponse>,
    ) -> anyhow::Result<()> {
        let cfg = self.cfg;
        if let Err(reason) = request.check(cfg.feddisco.metric, cfg.classes, self.num_params) {
            warn!(%peer, %reason, "refused a request");
            self.respond(channel, CoordResponse::Error { reason });
            return Ok(());
        }
        let index = self.index_of(&peer);
        let now = Instant::now();
        let who = peer.to_string();
        self.engine
            .handle_request(now, &who, index, request.into(), channel)?;
        Ok(())
    }

    /// Carries out the engine's actions; true once the run is over.
    fn act(&mut self) -> bool {
        let mut finished = false;
        while let Some(action) = self.engine.poll_action() {
            match action {
                Action::Respond { ticket, answer } => self.respond(ticket, answer.into()),
                Action::Save { round, bytes } => self.save(round, bytes),
                Action::LogRound(line) => {
                    let round = line.record["round"].as_u64().unwrap_or(0);
                    self.log.write(round, &line);
                }
                Action::Solved(s) => {
                    let path = self.cfg.state_dir.join("fedcollab.json");
                    let written = serde_json::to_value(&s)
                        .map_err(|e| e.to_string())
                        .and_then(|v| {
                            crate::report::summary::write_json(&path, &Some(v))
                                .map_err(|e| e.to_string())
                        });
                    info!(coalitions = ?Some(&s.coalitions), "structure solved");
                    if let Err(e) = written {
                        warn!(path = %path.display(), error = %e,
                            "the solved structure could not be written (it is in the checkpoint)");
                    }
                }
                Action::Event(e) => log_event(e),
                Action::Finished => finished = true,
            }
        }
        finished
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
    fn save(&mut self, round: u64, bytes: Result<Vec<u8>, String>) {
        let written = bytes.and_then(|bytes| {
            crate::store::save(&self.ckpt, &bytes)
                .map_err(|e| format!("{}: {e}", self.ckpt.display()))
        });
        match written {
            Ok(()) => self.saves.saved(round),
            Err(e) => self.saves.failed(round, &e, std::time::Instant::now()),
        }
    }
}

/// The log line of an engine event.
fn log_event(e: Event) {
    match e {
        Event::Registered {
            who,
            index,
            waiting_for,
            left_out,
        } => {
            info!(peer = %who, ?index, ?waiting_for, "registered");
            if left_out {
                warn!(peer = %who, ?index, "registered after the run started without it: it trains alone");
            }
        }
        Event::Refused { who, what, reason } => {
            warn!(peer = %who, %reason, "refused {what}")
        }
        Event::DistancesIn { who, index } => info!(peer = %who, ?index, "distances received"),
        Event::JoiningClosed { absent } => warn!(
            ?absent,
            "join deadline passed: the run starts without these silos; they will train alone"
        ),
        Event::RoundClosed {
            round,
            senders,
            timed_out,
        } => info!(round, senders, timed_out, "round closed"),
        Event::Excused {
            who,
            round,
            until,
            strikes,
        } => warn!(
            peer = %who,
            round,
            until,
            strikes,
            "a member made the round wait its full deadline: the rounds before `until` do not \
             wait for it (its updates still count when they come in time)"
        ),
        Event::AllRoundsDone => info!("all rounds done; serving the final model a while"),
    }
}
