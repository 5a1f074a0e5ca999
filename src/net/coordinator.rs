//! `federico coordinator --config FILE`: the thin FedDisco, HCCT, FedSaC or FedCollab coordinator as a libp2p
//! peer of the federation (same manifest, keys and Noise encryption as the nodes; it is a manifest member,
//! so the allow-list admits it). It never sees data and never trains.
//! Owns: the coordinator's swarm (allow-list + `/federico/coord/2`), the round
//! clock (close when every registered node sent, or at the update deadline τ), the join
//! deadline of FedCollab, HCCT and FedSaC (`join_s`: when it passes, joining is closed on the
//! silos that came), held fetches,
//! the per-round JSONL log and the checkpoint after every round (resumed on restart).
//! Must not: decide weights, groups, coalitions or models itself
//! ([`crate::coord::feddisco_server`], [`crate::coord::hcct_server`],
//! [`crate::coord::fedsac_server`] and [`crate::coord::fedcollab_server`] do; [`Server`] only
//! dispatches to them). FedCollab has no rounds here: the coordinator plans, takes the
//! distances, solves and serves each silo its coalition (`fedcollab.json`) until stopped. Nor
//! read its config file ([`super::config`] does, and checks it).
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
use super::metrics::Metrics;
use crate::coord::fedcollab_server::{self, FedCollabServer};
use crate::coord::feddisco::Params;
use crate::coord::feddisco_server::{FetchAnswer, ServerState};
use crate::coord::fedsac_server::{self, FedsacServer};
use crate::coord::hcct_server::{self, HcctServer};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::Learner;
use crate::protocol::{COORD_PROTOCOL, CoordRequest, CoordResponse};
use crate::scenario::FedsacScore;
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
    members: Members,
    coord: Exchange<CoordRequest, CoordResponse>,
}

/// One JSONL line of `coordinator.jsonl`.
#[derive(Serialize)]
struct LogLine {
    #[serde(flatten)]
    round: serde_json::Value,
    /// Seconds since the round opened.
    elapsed_s: f64,
}

/// The algorithm's state behind the coordinator: a dispatch, no decisions of its own.
enum Server {
    Disco(ServerState, Params),
    Hcct(Box<HcctServer>),
    Fedsac(Box<FedsacServer>),
    /// FedCollab has no rounds at the coordinator: it plans, collects distances and solves.
    Collab(Box<FedCollabServer>),
}

impl Server {
    fn round(&self) -> u64 {
        match self {
            Server::Disco(s, _) => s.round,
            Server::Hcct(s) => s.round(),
            Server::Fedsac(s) => s.round(),
            Server::Collab(_) => 0,
        }
    }

    fn registered(&self) -> usize {
        match self {
            Server::Disco(s, _) => s.reports.len(),
            Server::Hcct(s) => s.registered(),
            Server::Fedsac(s) => s.registered(),
            Server::Collab(s) => s.registered(),
        }
    }

    /// The round clock may run: FedDisco once anyone registered, HCCT and FedSaC once everyone
    /// did.
    fn clock_may_run(&self) -> bool {
        match self {
            Server::Disco(s, _) => !s.reports.is_empty(),
            Server::Hcct(s) => s.ready(),
            Server::Fedsac(s) => s.ready(),
            Server::Collab(_) => false,
        }
    }

    /// FedCollab's plan is out, HCCT's or FedSaC's run started (FedDisco needs neither).
    fn plan_out(&self) -> bool {
        match self {
            Server::Collab(s) => s.ready(),
            Server::Hcct(s) => s.ready(),
            Server::Fedsac(s) => s.ready(),
            Server::Disco(..) => true,
        }
    }

    /// Every update a round awaits can have come: FedDisco's round closes early only once
    /// `nodes` nodes registered; HCCT's and FedSaC's `all_in` already covers the run's silos
    /// (every silo, or those that came before the join deadline).
    fn complete(&self, nodes: usize) -> bool {
        match self {
            Server::Disco(s, _) => s.reports.len() >= nodes,
            _ => true,
        }
    }

    /// Silos still awaited before the run can start (none once it started, and none for
    /// FedDisco, which awaits nobody).
    fn missing(&self) -> Vec<usize> {
        match self {
            Server::Collab(s) if !s.ready() => s.missing(),
            Server::Hcct(s) if !s.ready() => s.missing(),
            Server::Fedsac(s) if !s.ready() => s.missing(),
            _ => Vec::new(),
        }
    }

    /// The run started without silo `index` (joining closed before it came).
    fn left_out(&self, index: Option<usize>) -> bool {
        let Some(i) = index else { return false };
        match self {
            Server::Collab(s) => s.left_out(i),
            Server::Hcct(s) => s.left_out(i),
            Server::Fedsac(s) => s.left_out(i),
            Server::Disco(..) => false,
        }
    }

    /// Joining may close on the silos that came (the algorithm says how many it needs).
    fn may_close_joining(&self) -> bool {
        match self {
            Server::Collab(s) => s.may_close_joining(),
            Server::Hcct(s) => s.may_close_joining(),
            Server::Fedsac(s) => s.may_close_joining(),
            Server::Disco(..) => false,
        }
    }

    /// Closes joining on the silos that came (the join deadline passed); the silos left out.
    fn close_joining(&mut self) -> Result<Vec<usize>, String> {
        match self {
            Server::Collab(s) => s.close_joining(),
            Server::Hcct(s) => s.close_joining(),
            Server::Fedsac(s) => s.close_joining(),
            Server::Disco(..) => Err("feddisco has no joining to close".into()),
        }
    }

    fn num_params(&self) -> usize {
        match self {
            Server::Disco(s, _) => s.global.len(),
            Server::Hcct(s) => s.num_params(),
            Server::Fedsac(s) => s.num_params(),
            // No model reaches a FedCollab coordinator.
            Server::Collab(_) => 0,
        }
    }

    /// Handles a registration; the error is the reason sent back.
    fn register(
        &mut self,
        who: &str,
        index: Option<usize>,
        req: &CoordRequest,
    ) -> Result<(), String> {
        match (self, req) {
            (
                Server::Disco(s, _),
                CoordRequest::Register {
                    n_train,
                    discrepancy,
                },
            ) => {
                s.register(
                    who,
                    crate::coord::feddisco::DiscoReport {
                        num_samples: *n_train,
                        discrepancy: *discrepancy,
                    },
                );
                Ok(())
            }
            (Server::Hcct(s), CoordRequest::Join { n_train }) => {
                let i = index.ok_or(NOT_A_SILO)?;
                s.register(i, *n_train)
            }
            (Server::Fedsac(s), CoordRequest::Join { n_train }) => {
                let i = index.ok_or(NOT_A_SILO)?;
                s.register(i, *n_train)
            }
            (Server::Collab(s), CoordRequest::Join { n_train }) => {
                let i = index.ok_or(NOT_A_SILO)?;
                s.register(i, *n_train)
            }
            (Server::Collab(_), _) => {
                Err("this coordinator runs fedcollab: join with n_train".into())
            }
            (Server::Disco(..), _) => {
                Err("this coordinator runs feddisco: register with (n_train, discrepancy)".into())
            }
            (Server::Hcct(_), _) => Err("this coordinator runs hcct: join with n_train".into()),
            (Server::Fedsac(_), _) => Err("this coordinator runs fedsac: join with n_train".into()),
        }
    }

    /// Handles an `Update` or a `Contribute`; true when every expected sender has sent.
    fn update(
        &mut self,
        who: &str,
        index: Option<usize>,
        req: CoordRequest,
    ) -> Result<bool, String> {
        match (self, req) {
            (Server::Disco(s, _), CoordRequest::Update { round, params, .. }) => {
                s.update(who, round, params)
            }
            (Server::Hcct(s), CoordRequest::Update { round, params, .. }) => {
                s.update(index.ok_or(NOT_A_SILO)?, round, params)
            }
            (
                Server::Fedsac(s),
                CoordRequest::Contribute {
                    round,
                    params,
                    subspace,
                },
            ) => s.update(index.ok_or(NOT_A_SILO)?, round, params, subspace),
            (Server::Fedsac(_), _) => {
                Err("this coordinator runs fedsac: contribute a model and a subspace".into())
            }
            (Server::Collab(s), CoordRequest::Distances { pairs }) => {
                s.report(index.ok_or(NOT_A_SILO)?, pairs)
            }
            (Server::Collab(_), _) => Err(
                "this coordinator runs fedcollab: it takes distances; models stay within \
                 the coalitions"
                    .into(),
            ),
            (_, CoordRequest::Distances { .. }) => {
                Err("distances are for a fedcollab coordinator".into())
            }
            _ => Err("send the trained model as an update".into()),
        }
    }

    /// The answer to a fetch, or `None` to hold it.
    fn fetch(&self, index: Option<usize>, round: u64) -> Result<Option<CoordResponse>, String> {
        let global = |round, params| Some(CoordResponse::Global { round, params });
        match self {
            Server::Disco(s, _) => Ok(match s.fetch(round) {
                FetchAnswer::Now { round, params } => global(round, params),
                FetchAnswer::Hold => None,
            }),
            Server::Hcct(s) => Ok(match s.fetch(index.ok_or(NOT_A_SILO)?, round)? {
                hcct_server::FetchAnswer::Now { round, params } => global(round, params),
                hcct_server::FetchAnswer::Hold => None,
                hcct_server::FetchAnswer::Alone => Some(CoordResponse::Alone),
            }),
            Server::Fedsac(s) => Ok(match s.fetch(index.ok_or(NOT_A_SILO)?, round)? {
                fedsac_server::FetchAnswer::Now(a) => Some(CoordResponse::Assigned {
                    round: a.round,
                    params: a.params,
                    direction: a.direction,
                    train: a.train,
                }),
                fedsac_server::FetchAnswer::Hold => None,
                fedsac_server::FetchAnswer::Alone => Some(CoordResponse::Alone),
            }),
            Server::Collab(s) => Ok(match s.fetch(index.ok_or(NOT_A_SILO)?, round)? {
                fedcollab_server::FetchAnswer::Hold => None,
                fedcollab_server::FetchAnswer::Plan {
                    target,
                    nodes,
                    members,
                } => Some(CoordResponse::DiscPlan {
                    target,
                    nodes,
                    members,
                }),
                fedcollab_server::FetchAnswer::Coalition { members, sizes } => {
                    Some(CoordResponse::Coalition { members, sizes })
                }
            }),
        }
    }

    /// Closes the open round: its number, how many sent, and the log line's fields.
    fn close(&mut self, timed_out: bool) -> Result<(u64, usize, serde_json::Value), String> {
        let (round, senders, v) = match self {
            Server::Disco(s, p) => {
                let l = s.close(p, timed_out)?;
                (l.round, l.peers.len(), serde_json::to_value(&l))
            }
            Server::Hcct(s) => {
                let l = s.close(timed_out)?;
                (l.round, l.senders.len(), serde_json::to_value(&l))
            }
            Server::Fedsac(s) => {
                let l = s.close(timed_out)?;
                (l.round, l.senders.len(), serde_json::to_value(&l))
            }
            Server::Collab(_) => return Err("fedcollab has no rounds to close".into()),
        };
        Ok((round, senders, v.map_err(|e| e.to_string())?))
    }

    fn save(&self, path: &Path) -> Result<(), String> {
        let bytes = match self {
            Server::Disco(s, _) => return s.save(path),
            Server::Hcct(s) => s.encode()?,
            Server::Fedsac(s) => s.encode()?,
            Server::Collab(s) => s.encode()?,
        };
        crate::store::write_atomic(path, &bytes).map_err(|e| format!("{}: {e}", path.display()))
    }
}

const NOT_A_SILO: &str = "not a silo of this federation's manifest";

/// Runs the coordinator until its rounds are done or `shutdown` resolves.
pub async fn run(
    cfg: CoordinatorConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
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
    let spec = cfg
        .model
        .spec(&cfg.sample_shape, Some(cfg.classes))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::create_dir_all(&cfg.state_dir)?;
    let ckpt = cfg.state_dir.join("coordinator.bin");
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
    let resumed = match std::fs::read(&ckpt) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => anyhow::bail!("{}: {e}", ckpt.display()),
    };
    let bad = |e: String| anyhow::anyhow!("checkpoint {}: {e}", ckpt.display());
    let mut state = match (cfg.algorithm, resumed) {
        (CoordinatedAlgorithm::Hcct, Some(b)) => {
            let s = HcctServer::decode(cfg.hcct.clone(), cfg.rounds, &b).map_err(bad)?;
            if s.nodes() != cfg.nodes {
                return Err(bad(format!(
                    "saved for {} silos, the config has nodes = {}",
                    s.nodes(),
                    cfg.nodes
                )));
            }
            Server::Hcct(Box::new(s))
        }
        (CoordinatedAlgorithm::Hcct, None) => Server::Hcct(Box::new(
            HcctServer::new(cfg.hcct.clone(), cfg.nodes, cfg.rounds, init()?)
                .map_err(|e| anyhow::anyhow!(e))?,
        )),
        (CoordinatedAlgorithm::Fedsac, Some(b)) => {
            let s = FedsacServer::decode(
                cfg.fedsac_settings(),
                cfg.rounds,
                cfg.fedsac_sampler_seed(),
                &b,
            )
            .map_err(bad)?;
            if s.nodes() != cfg.nodes {
                return Err(bad(format!(
                    "saved for {} silos, the config has nodes = {}",
                    s.nodes(),
                    cfg.nodes
                )));
            }
            Server::Fedsac(Box::new(s))
        }
        (CoordinatedAlgorithm::Fedsac, None) => Server::Fedsac(Box::new(
            FedsacServer::new(
                cfg.fedsac_settings(),
                cfg.nodes,
                cfg.rounds,
                cfg.fedsac_sampler_seed(),
                init()?,
            )
            .map_err(|e| anyhow::anyhow!(e))?,
        )),
        (CoordinatedAlgorithm::Fedcollab, Some(b)) => {
            let s = FedCollabServer::decode(cfg.fedcollab.clone(), cfg.seed, &b).map_err(bad)?;
            if s.nodes() != cfg.nodes {
                return Err(bad(format!(
                    "saved for {} silos, the config has nodes = {}",
                    s.nodes(),
                    cfg.nodes
                )));
            }
            Server::Collab(Box::new(s))
        }
        (CoordinatedAlgorithm::Fedcollab, None) => Server::Collab(Box::new(
            FedCollabServer::new(cfg.fedcollab.clone(), cfg.nodes, cfg.seed)
                .map_err(|e| anyhow::anyhow!(e))?,
        )),
        (CoordinatedAlgorithm::Feddisco, Some(b)) => {
            Server::Disco(ServerState::decode(&b).map_err(bad)?, params)
        }
        (CoordinatedAlgorithm::Feddisco, None) => Server::Disco(ServerState::new(init()?), params),
    };
    if state.round() > 0 || state.registered() > 0 {
        info!(
            round = state.round(),
            registered = state.registered(),
            "resuming from checkpoint"
        );
    }
    let num_params = state.num_params();
    // HCCT's and FedSaC's silos are the manifest's members, by index.
    let index_of = |peer: &libp2p::PeerId| {
        manifest
            .members
            .iter()
            .position(|m| m.peer_id == *peer)
            .filter(|&i| cfg.algorithm == CoordinatedAlgorithm::Feddisco || i < cfg.nodes)
    };

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let allowed: Option<Vec<libp2p::PeerId>> =
        (!manifest.open).then(|| manifest.members.iter().map(|m| m.peer_id).collect());
    let max = cfg.max_message_mib << 20;
    let deadline = Duration::from_secs_f64(cfg.update_deadline_s);
    let behaviour = CoordBehaviour {
        members: members(allowed),
        coord: Exchange::new(
            CoordCodec::new(max, metrics),
            [(StreamProtocol::new(COORD_PROTOCOL), ProtocolSupport::Full)],
            // Fetches are held up to a whole round: bound the exchange by 3 τ.
            rr::Config::default()
                .with_request_timeout(deadline * 3)
                .with_max_concurrent_streams(1024),
        ),
    };
    let mut swarm = coordination_swarm(key, &cfg.listen, behaviour)?;
    let log_path = cfg.state_dir.join("coordinator.jsonl");
    let cut = crate::trace::trim_log(&log_path, state.round()).map_err(|e| anyhow::anyhow!(e))?;
    if cut > 0 {
        warn!(
            lines = cut,
            checkpoint_round = state.round(),
            "round log cut back to the checkpoint"
        );
    }
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    info!(peer = %peer_id, algorithm = %cfg.algorithm, round = state.round(), rounds = cfg.rounds, "coordinator started");

    let mut held: Vec<Held> = Vec::new();
    let mut opened = Instant::now();
    let mut round_deadline: Option<Instant> = None;
    let mut linger: Option<Instant> = None;
    // The join deadline (FedCollab, HCCT, FedSaC): armed by the first join (or a resumed
    // one), it closes joining once enough silos are in; `join_due` once it passed with fewer.
    let mut join_deadline: Option<Instant> = None;
    let mut join_due = false;
    tokio::pin!(shutdown);
    loop {
        if let Some(j) = cfg.join_s
            && !state.plan_out()
            && state.registered() > 0
        {
            let at =
                *join_deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs_f64(j));
            if (join_due || Instant::now() >= at) && state.may_close_joining() {
                let absent = state.close_joining().map_err(|e| anyhow::anyhow!(e))?;
                warn!(
                    ?absent,
                    join_s = j,
                    "join deadline passed: the run starts without these silos; they will train alone"
                );
                state.save(&ckpt).map_err(|e| anyhow::anyhow!(e))?;
                serve_held(&mut swarm, &state, &mut held);
                continue;
            }
            if Instant::now() >= at {
                join_due = true;
            }
        }
        // The round clock runs whenever a round is open and someone registered, so a round
        // whose updates were lost (a restart) still closes, keeping the global.
        if round_deadline.is_none() && state.round() < cfg.rounds && state.clock_may_run() {
            round_deadline = Some(Instant::now() + deadline);
            opened = Instant::now();
        }
        if state.round() >= cfg.rounds && linger.is_none() {
            info!("all rounds done; serving the final model a while");
            linger = Some(Instant::now() + deadline.min(Duration::from_secs(10)));
        }
        let wake = match (round_deadline, linger) {
            (_, Some(l)) => l,
            (Some(d), None) => d,
            (None, None) => join_deadline
                .filter(|_| !join_due && !state.plan_out())
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)),
        };
        tokio::select! {
            _ = &mut shutdown => {
                info!("stopped by a signal");
                return Ok(());
            }
            _ = tokio::time::sleep_until(wake) => {
                if linger.is_some() {
                    return Ok(());
                }
                // (Without a round open, this was the join deadline: the top of the loop
                // handles it.)
                if round_deadline.is_some() {
                    close(&mut state, true, &mut log, opened, &ckpt)?;
                    round_deadline = None;
                    opened = Instant::now();
                    serve_held(&mut swarm, &state, &mut held);
                }
            }
            ev = swarm.select_next_some() => {
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
                let who = peer.to_string();
                let index = index_of(&peer);
                if let Err(reason) = request.check(cfg.feddisco.metric, cfg.classes, num_params) {
                    warn!(peer = %who, %reason, "refused a request");
                    let _ = swarm.behaviour_mut().coord.send_response(channel, CoordResponse::Error { reason });
                    continue;
                }
                match request {
                    CoordRequest::Register { .. } | CoordRequest::Join { .. } => {
                        let answer = match state.register(&who, index, &request) {
                            Ok(()) => {
                                let waiting_for = state.missing();
                                info!(peer = %who, ?index, ?request, ?waiting_for, "registered");
                                if state.left_out(index) {
                                    warn!(peer = %who, ?index, "registered after the run started without it: it trains alone");
                                }
                                state.save(&ckpt).map_err(|e| anyhow::anyhow!(e))?;
                                // HCCT: the last registration opens round 0.
                                serve_held(&mut swarm, &state, &mut held);
                                CoordResponse::Ack
                            }
                            Err(reason) => {
                                warn!(peer = %who, %reason, "refused a registration");
                                CoordResponse::Error { reason }
                            }
                        };
                        let _ = swarm.behaviour_mut().coord.send_response(channel, answer);
                    }
                    CoordRequest::Fetch { round } => match state.fetch(index, round) {
                        Ok(Some(answer)) => {
                            let _ = swarm.behaviour_mut().coord.send_response(channel, answer);
                        }
                        Ok(None) => held.push((index, round, channel)),
                        Err(reason) => {
                            let _ = swarm.behaviour_mut().coord.send_response(channel, CoordResponse::Error { reason });
                        }
                    },
                    CoordRequest::Distances { .. } => {
                        let answer = match state.update(&who, index, request) {
                            Ok(solved) => {
                                info!(peer = %who, ?index, "distances received");
                                state.save(&ckpt).map_err(|e| anyhow::anyhow!(e))?;
                                if solved && let Server::Collab(s) = &state {
                                    let record = s.solved().map(serde_json::to_value).transpose()?;
                                    crate::report::summary::write_json(&cfg.state_dir.join("fedcollab.json"), &record)
                                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                                    info!(coalitions = ?s.solved().map(|x| &x.coalitions), "structure solved");
                                    serve_held(&mut swarm, &state, &mut held);
                                }
                                CoordResponse::Ack
                            }
                            Err(reason) => {
                                warn!(peer = %who, %reason, "refused distances");
                                CoordResponse::Error { reason }
                            }
                        };
                        let _ = swarm.behaviour_mut().coord.send_response(channel, answer);
                    }
                    CoordRequest::Update { .. } | CoordRequest::Contribute { .. } => {
                        if state.round() >= cfg.rounds {
                            let _ = swarm.behaviour_mut().coord.send_response(channel, CoordResponse::Error {
                                reason: "the run is over".into(),
                            });
                            continue;
                        }
                        match state.update(&who, index, request) {
                            Ok(all_in) => {
                                let _ = swarm.behaviour_mut().coord.send_response(channel, CoordResponse::Ack);
                                if all_in && state.complete(cfg.nodes) {
                                    close(&mut state, false, &mut log, opened, &ckpt)?;
                                    round_deadline = None;
                                    opened = Instant::now();
                                    serve_held(&mut swarm, &state, &mut held);
                                }
                            }
                            Err(reason) => {
                                warn!(peer = %who, %reason, "refused an update");
                                let _ = swarm.behaviour_mut().coord.send_response(channel, CoordResponse::Error { reason });
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A fetch held until its round exists: the silo's index, the round, the channel.
type Held = (Option<usize>, u64, ResponseChannel<CoordResponse>);

fn close(
    state: &mut Server,
    timed_out: bool,
    log: &mut std::fs::File,
    opened: Instant,
    ckpt: &Path,
) -> anyhow::Result<()> {
    let (round, senders, line) = state.close(timed_out).map_err(|e| anyhow::anyhow!(e))?;
    // The line before the checkpoint: a kill between the two leaves a line the restart cuts.
    let text = serde_json::to_string(&LogLine {
        round: line,
        elapsed_s: opened.elapsed().as_secs_f64(),
    })?;
    writeln!(log, "{text}")?;
    log.flush()?;
    state.save(ckpt).map_err(|e| anyhow::anyhow!(e))?;
    info!(round, senders, timed_out, "round closed");
    Ok(())
}

fn serve_held(swarm: &mut libp2p::Swarm<CoordBehaviour>, state: &Server, held: &mut Vec<Held>) {
    let mut keep = Vec::new();
    for (index, round, channel) in held.drain(..) {
        let answer = match state.fetch(index, round) {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                keep.push((index, round, channel));
                continue;
            }
            Err(reason) => CoordResponse::Error { reason },
        };
        let _ = swarm.behaviour_mut().coord.send_response(channel, answer);
    }
    *held = keep;
}
