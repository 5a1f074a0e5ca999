//! A FedCollab node (issue 5; spec §6): `[coordinated] mode = "fedcollab"`.
//! Owns: joining the coordinator with the sample count only; the pairwise discriminator protocol
//! with every other silo, peer to peer on `/federico/collab/2` (the higher index of a pair
//! drives it, the lower answers from its own thread; neither weights nor data reach the
//! coordinator); reporting the scalar distances; receiving its own coalition; FedAvg inside the
//! coalition peer to peer (all-to-all: every member pulls every other member's trained model of
//! the round and averages with weights m_j/M in ascending index order, so all members hold the
//! same model bit for bit; a member that does not answer within `fetch_s` is left out of that
//! round and the weights are renormalised); the run log and the checkpoint.
//! Must not: decide the structure (the coordinator solves it) or the distances' arithmetic
//! ([`PairHalf`] and [`crate::coord::fedcollab`] do), or train inside the event loop:
//! the swarm runs in its own task, discriminator steps and training on blocking threads.
//!
//! A node whose coordinator is gone keeps what it has: pairs and FL run without it; with no
//! structure yet after `structure_s`, it trains alone (FedCollab's singleton) and asks again
//! every round, joining its coalition once the coordinator answers. A node that is not in the
//! plan (it joined after the coordinator's `join_s` closed joining) runs no pair and trains
//! alone for the whole run.

use super::behaviour::{Codec, CoordCodec, Exchange, Members, coordination_swarm, members};
use super::client::{ExchangeError, Reply, route_coord_event};
use super::config::{Coordinated, NodeConfig};
use super::identity::Manifest;
use super::metrics::Metrics;
use crate::coord::PairDistance;
use crate::coord::fedcollab::{FedCollabConfig, coalition_average};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Adam, ClientData, Learner, ModelSpec};
use crate::protocol::{
    COLLAB_PROTOCOL, COORD_PROTOCOL, CollabRequest, CollabResponse, CoordRequest, CoordResponse,
};
use crate::silo::fedcollab::{DiscData, DiscModel, FL_BATCH_TAG, PairHalf};
use libp2p::futures::StreamExt;
use libp2p::futures::stream::FuturesUnordered;
use libp2p::request_response::{
    self as rr, InboundRequestId, OutboundRequestId, ProtocolSupport, ResponseChannel,
};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

/// What [`super::coordinated::run`] hands over once it has checked the config, the key, the
/// manifest and loaded the data.
pub(super) struct Prelude {
    pub(super) cfg: NodeConfig,
    pub(super) cc: Coordinated,
    pub(super) key: libp2p::identity::Keypair,
    pub(super) manifest: Manifest,
    pub(super) me: NodeId,
    pub(super) coordinator: PeerId,
    pub(super) coord_addrs: Vec<Multiaddr>,
    pub(super) data: ClientData,
    pub(super) spec: ModelSpec,
}

/// Trained models of the last rounds a silo keeps for its coalition's pulls.
const KEEP_ROUNDS: usize = 8;

type PeerReply = oneshot::Sender<Result<CollabResponse, ExchangeError>>;

/// What the node's tasks ask of the swarm task.
enum Cmd {
    Coord(CoordRequest, Reply),
    Peer(usize, CollabRequest, PeerReply),
    /// This silo's trained model of an FL round, for its coalition.
    Publish(u64, Arc<Vec<f32>>),
    /// How many peers have fetched this silo's model of a round.
    Served(u64, oneshot::Sender<usize>),
    /// Where the pair requests go once the discriminator is built.
    DiscServer(std::sync::mpsc::Sender<DiscJob>),
}

/// A pair request for the discriminator thread.
struct DiscJob {
    from: usize,
    req: CollabRequest,
    reply: oneshot::Sender<CollabResponse>,
}

#[derive(NetworkBehaviour)]
struct CollabBehaviour {
    members: Members,
    coord: Exchange<CoordRequest, CoordResponse>,
    collab: Exchange<CollabRequest, CollabResponse>,
}

type Answer =
    Pin<Box<dyn Future<Output = (ResponseChannel<CollabResponse>, CollabResponse)> + Send>>;

/// The swarm task: routes requests out and answers back, serves the coalition's model pulls
/// (held until the round is trained) and hands pair requests to the discriminator thread.
async fn swarm_task(
    mut swarm: libp2p::Swarm<CollabBehaviour>,
    coordinator: (PeerId, Vec<Multiaddr>),
    peers: Vec<(PeerId, Vec<Multiaddr>)>,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
) {
    let mut to_coord: HashMap<OutboundRequestId, Reply> = HashMap::new();
    let mut to_peer: HashMap<OutboundRequestId, PeerReply> = HashMap::new();
    let mut published: VecDeque<(u64, Arc<Vec<f32>>)> = VecDeque::new();
    let mut held: Vec<(u64, ResponseChannel<CollabResponse>)> = Vec::new();
    // A model counts as served once its response went out (not when it was queued), so a
    // silo does not leave while its last model is still on its way.
    let mut model_reqs: HashMap<InboundRequestId, (u64, PeerId)> = HashMap::new();
    let mut served: HashMap<u64, HashSet<PeerId>> = HashMap::new();
    let mut disc: Option<std::sync::mpsc::Sender<DiscJob>> = None;
    let mut answers: FuturesUnordered<Answer> = FuturesUnordered::new();
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => return,
                Some(Cmd::Coord(req, reply)) => {
                    for a in &coordinator.1 {
                        swarm.add_peer_address(coordinator.0, a.clone());
                    }
                    let id = swarm.behaviour_mut().coord.send_request(&coordinator.0, req);
                    to_coord.insert(id, reply);
                }
                Some(Cmd::Peer(i, req, reply)) => {
                    let Some((peer, addrs)) = peers.get(i) else {
                        let _ = reply.send(Err(ExchangeError::NoSilo(i)));
                        continue;
                    };
                    for a in addrs {
                        swarm.add_peer_address(*peer, a.clone());
                    }
                    let id = swarm.behaviour_mut().collab.send_request(peer, req);
                    to_peer.insert(id, reply);
                }
                Some(Cmd::Publish(round, params)) => {
                    published.push_back((round, params.clone()));
                    while published.len() > KEEP_ROUNDS {
                        published.pop_front();
                    }
                    let mut keep = Vec::new();
                    for (r, channel) in held.drain(..) {
                        if r == round {
                            let _ = swarm.behaviour_mut().collab.send_response(
                                channel,
                                CollabResponse::Model { round, params: params.clone() },
                            );
                        } else if r < round && !published.iter().any(|(p, _)| *p == r) {
                            // A round this silo will not publish: say so now.
                            let _ = swarm.behaviour_mut().collab.send_response(channel, CollabResponse::Error {
                                reason: format!("round {r} is not kept here (now at {round})"),
                            });
                        } else {
                            keep.push((r, channel));
                        }
                    }
                    held = keep;
                }
                Some(Cmd::Served(round, reply)) => {
                    let _ = reply.send(served.get(&round).map_or(0, HashSet::len));
                }
                Some(Cmd::DiscServer(tx)) => disc = Some(tx),
            },
            Some((channel, resp)) = answers.next(), if !answers.is_empty() => {
                let _ = swarm.behaviour_mut().collab.send_response(channel, resp);
            }
            ev = swarm.select_next_some() => match ev {
                SwarmEvent::Behaviour(CollabBehaviourEvent::Coord(ev)) => {
                    route_coord_event(ev, &mut to_coord, &mut swarm.behaviour_mut().coord);
                }
                SwarmEvent::Behaviour(CollabBehaviourEvent::Collab(rr::Event::Message {
                    message: rr::Message::Response { request_id, response },
                    ..
                })) => {
                    if let Some(r) = to_peer.remove(&request_id) {
                        let _ = r.send(Ok(response));
                    }
                }
                SwarmEvent::Behaviour(CollabBehaviourEvent::Collab(rr::Event::OutboundFailure {
                    request_id, error, ..
                })) => {
                    if let Some(r) = to_peer.remove(&request_id) {
                        let _ = r.send(Err(ExchangeError::Failed(error)));
                    }
                }
                SwarmEvent::Behaviour(CollabBehaviourEvent::Collab(rr::Event::ResponseSent {
                    request_id, ..
                })) => {
                    if let Some((round, peer)) = model_reqs.remove(&request_id) {
                        served.entry(round).or_default().insert(peer);
                    }
                }
                SwarmEvent::Behaviour(CollabBehaviourEvent::Collab(rr::Event::InboundFailure {
                    request_id, ..
                })) => {
                    model_reqs.remove(&request_id);
                }
                SwarmEvent::Behaviour(CollabBehaviourEvent::Collab(rr::Event::Message {
                    peer,
                    message: rr::Message::Request { request, channel, request_id },
                    ..
                })) => {
                    let Some(from) = peers.iter().position(|(p, _)| *p == peer) else {
                        warn!(%peer, "a collab request from a member that is not a silo");
                        let _ = swarm.behaviour_mut().collab.send_response(channel, CollabResponse::Error {
                            reason: "not a silo of this run".into(),
                        });
                        continue;
                    };
                    match request {
                        CollabRequest::Model { round } => {
                            if let Some((_, p)) = published.iter().find(|(r, _)| *r == round) {
                                model_reqs.insert(request_id, (round, peer));
                                let _ = swarm.behaviour_mut().collab.send_response(
                                    channel,
                                    CollabResponse::Model { round, params: p.clone() },
                                );
                            } else if published.back().is_none_or(|(r, _)| round > *r) {
                                model_reqs.insert(request_id, (round, peer));
                                held.push((round, channel));
                            } else {
                                let latest = published.back().map(|(r, _)| *r);
                                let _ = swarm.behaviour_mut().collab.send_response(channel, CollabResponse::Error {
                                    reason: format!("round {round} is no longer kept (latest {latest:?})"),
                                });
                            }
                        }
                        req => match &disc {
                            Some(tx) => {
                                let (otx, orx) = oneshot::channel();
                                if tx.send(DiscJob { from, req, reply: otx }).is_err() {
                                    let _ = swarm.behaviour_mut().collab.send_response(channel, CollabResponse::Error {
                                        reason: "this silo's pairs are over".into(),
                                    });
                                    continue;
                                }
                                answers.push(Box::pin(async move {
                                    let resp = orx.await.unwrap_or(CollabResponse::Error {
                                        reason: "this silo's pairs are over".into(),
                                    });
                                    (channel, resp)
                                }));
                            }
                            None => {
                                let _ = swarm.behaviour_mut().collab.send_response(channel, CollabResponse::Error {
                                    reason: "not ready: no distance plan yet".into(),
                                });
                            }
                        },
                    }
                }
                _ => {}
            }
        }
    }
}

/// The node's handle on the swarm task.
#[derive(Clone)]
struct Link(mpsc::UnboundedSender<Cmd>);

impl Link {
    /// Hands the swarm task a request made by `cmd` and waits for its answer, at most `limit`.
    async fn request<T>(
        &self,
        cmd: impl FnOnce(oneshot::Sender<Result<T, ExchangeError>>) -> Cmd,
        limit: Duration,
    ) -> Result<T, ExchangeError> {
        let (tx, rx) = oneshot::channel();
        self.0
            .send(cmd(tx))
            .map_err(|_| ExchangeError::SwarmEnded)?;
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(ExchangeError::SwarmEnded),
            Err(_) => Err(ExchangeError::TimedOut),
        }
    }

    async fn coord(
        &self,
        req: CoordRequest,
        limit: Duration,
    ) -> Result<CoordResponse, ExchangeError> {
        self.request(|tx| Cmd::Coord(req, tx), limit).await
    }

    async fn peer(
        &self,
        i: usize,
        req: CollabRequest,
        limit: Duration,
    ) -> Result<CollabResponse, ExchangeError> {
        self.request(|tx| Cmd::Peer(i, req, tx), limit).await
    }

    /// A peer request retried (every 200 ms) on transport failures and "not ready" refusals
    /// until `budget` has passed.
    async fn peer_within(
        &self,
        i: usize,
        req: CollabRequest,
        budget: Duration,
    ) -> Result<CollabResponse, ExchangeError> {
        let until = tokio::time::Instant::now() + budget;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let r = self.peer(i, req.clone(), left).await;
            let again = match &r {
                Err(_) => true,
                Ok(CollabResponse::Error { reason }) => reason.starts_with("not ready"),
                Ok(_) => false,
            };
            if again && tokio::time::Instant::now() + Duration::from_millis(200) < until {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            return r;
        }
    }

    /// A coordinator request retried every 500 ms while the coordinator is unreachable, until
    /// `budget` has passed; refusals are returned.
    async fn coord_within(
        &self,
        req: &CoordRequest,
        budget: Duration,
    ) -> Result<CoordResponse, ExchangeError> {
        let until = tokio::time::Instant::now() + budget;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            match self.coord(req.clone(), left).await {
                Err(_) if tokio::time::Instant::now() + Duration::from_millis(500) < until => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                r => return r,
            }
        }
    }
}

/// The node's state on disk (`<state_dir>/fedcollab.bin`).
#[derive(Serialize, Deserialize)]
struct Saved {
    peer_id: String,
    /// The distances it reported (or has to report).
    report: Option<Vec<PairDistance>>,
    /// Its coalition and the members' sizes.
    coalition: Option<(Vec<u32>, Vec<u64>)>,
    /// FL rounds done.
    round: u64,
    params: Vec<f32>,
    adam: Adam,
    /// This silo's own trained model of its last round, served to its coalition again after a
    /// restart (a partner may still be waiting for it).
    last_local: Option<(u64, Vec<f32>)>,
}

const MAGIC: &[u8; 8] = b"FEDCLND1";
const VERSION: u32 = 1;

/// One line of `rounds.jsonl`.
#[derive(Serialize)]
struct RoundLine {
    node: u32,
    round: u64,
    /// The FL round this line closes (the coalition's round), once the coalition is known.
    global_round: Option<u64>,
    /// In a coalition (false: training alone while the structure is not known).
    attached: bool,
    trained: bool,
    /// Every other member's model arrived in time.
    update_acked: bool,
    /// Members whose model went into the average, this silo included.
    averaged: Vec<u32>,
    seconds: f64,
    at: f64,
    eval: Option<crate::trace::EvalRecord>,
}

/// The final line.
#[derive(Serialize)]
struct FinalLine {
    node: u32,
    final_global_round: Option<u64>,
    model_hash: String,
    /// The coalition the model belongs to.
    coalition: Option<Vec<u32>>,
    eval: crate::trace::EvalRecord,
}

fn save(path: &std::path::Path, s: &Saved) -> anyhow::Result<()> {
    crate::store::write_versioned(path, MAGIC, VERSION, s).map_err(|e| anyhow::anyhow!(e))
}

/// Runs the FedCollab node until its rounds are done or `shutdown` resolves.
pub(super) async fn run(
    p: Prelude,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let Prelude {
        cfg,
        cc,
        key,
        manifest,
        me,
        coordinator,
        coord_addrs,
        data,
        spec,
    } = p;
    let fc: FedCollabConfig = cc.config().fedcollab.clone();
    let peer_id = key.public().to_peer_id();
    let me_i = me.0 as usize;
    let n_train = data.train.len() as u64;
    let batch = cfg.train.batch_size;
    let fetch = cc.fetch();
    let structure_wait = cc.structure_wait();
    let learner = Learner::new(&spec, batch).map_err(|e| anyhow::anyhow!("{e}"))?;

    std::fs::create_dir_all(&cfg.state_dir)?;
    let ckpt = cfg.state_dir.join("fedcollab.bin");
    let pairs_path = cfg.state_dir.join("fedcollab.pairs");
    let saved: Option<Saved> = crate::store::read_versioned(&ckpt, MAGIC, VERSION)
        .map_err(|e| anyhow::anyhow!("checkpoint {e}"))?;
    if saved
        .as_ref()
        .is_some_and(|s| s.peer_id != peer_id.to_string())
    {
        anyhow::bail!("checkpoint {} belongs to another peer", ckpt.display());
    }
    // Every coalition starts from silo 0's seeded initialisation (spec §5), as in `simulate`.
    let init = || {
        learner.init_params(&mut StdRng::seed_from_u64(stream_seed(
            cfg.seed,
            NodeId(0),
            Stream::Init,
        )))
    };
    let mut state = match saved {
        Some(s) => {
            if s.params.len() != spec.num_params() || s.adam.num_params() != spec.num_params() {
                anyhow::bail!(
                    "checkpoint {}: a model of {} parameters, the config's has {}",
                    ckpt.display(),
                    s.params.len(),
                    spec.num_params()
                );
            }
            s
        }
        None => {
            let params = init();
            Saved {
                peer_id: peer_id.to_string(),
                report: None,
                coalition: None,
                round: 0,
                adam: Adam::new(params.len(), cfg.train.lr as f32),
                last_local: None,
                params,
            }
        }
    };

    // The swarm, in its own task.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let allowed: Option<Vec<PeerId>> =
        (!manifest.open).then(|| manifest.members.iter().map(|m| m.peer_id).collect());
    let max = cfg.max_message();
    let behaviour = CollabBehaviour {
        members: members(allowed),
        coord: Exchange::new(
            CoordCodec::new(max, metrics.clone()),
            [(StreamProtocol::new(COORD_PROTOCOL), ProtocolSupport::Full)],
            rr::Config::default().with_request_timeout(fetch.max(structure_wait)),
        ),
        collab: Exchange::new(
            Codec::new(max, metrics),
            [(StreamProtocol::new(COLLAB_PROTOCOL), ProtocolSupport::Full)],
            rr::Config::default()
                .with_request_timeout(fetch)
                .with_max_concurrent_streams(1024),
        ),
    };
    let swarm = coordination_swarm(key, &cfg.listen, behaviour)?;
    // Silos are the manifest's members other than the coordinator, by index.
    let peers: Vec<(PeerId, Vec<Multiaddr>)> = manifest
        .members
        .iter()
        .filter(|m| m.peer_id != coordinator)
        .map(|m| (m.peer_id, m.addrs.clone()))
        .collect();
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(swarm_task(swarm, (coordinator, coord_addrs), peers, rx));
    let link = Link(tx);

    let log_path = cfg.state_dir.join("rounds.jsonl");
    let cut = crate::trace::trim_log(&log_path, state.round + 1).map_err(|e| anyhow::anyhow!(e))?;
    if cut > 0 {
        warn!(
            lines = cut,
            checkpoint_round = state.round,
            "run log cut back to the checkpoint"
        );
    }
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    info!(node = %me, peer = %peer_id, round = state.round, "fedcollab node started");
    tokio::pin!(shutdown);
    let data = Arc::new(data);
    let join = CoordRequest::Join { n_train };

    let result: anyhow::Result<()> = async {
        // Phases 0-2: join, the plan, the pairs (skipped once the distances are in hand).
        if state.report.is_none() && state.coalition.is_none() {
            let (target, nodes, planned) = tokio::select! {
                _ = &mut shutdown => { info!("stopped by a signal"); return Ok(()); }
                r = plan(&link, &join, fetch) => r?,
            };
            if me_i >= nodes {
                anyhow::bail!("this silo has index {me_i}; the coordinator runs {nodes} silos");
            }
            if !planned.contains(&me_i) {
                warn!(
                    ?planned,
                    "this silo joined after the distance plan went out: it is in no pair and \
                     trains alone (FedCollab's singleton)"
                );
                state.coalition = Some((vec![me.0], vec![n_train]));
                save(&ckpt, &state)?;
            } else {
            let started = Instant::now();
            let report = tokio::select! {
                _ = &mut shutdown => { info!("stopped by a signal"); return Ok(()); }
                r = estimate(&link, &fc, &data, cfg.seed, me_i, &planned, target, fetch, &pairs_path) => r?,
            };
            let failed = report.iter().filter(|p| p.distance.is_none()).count();
            info!(
                pairs = report.len(),
                failed,
                seconds = started.elapsed().as_secs_f64(),
                distances = ?report.iter().map(|p| p.distance).collect::<Vec<_>>(),
                "distances estimated"
            );
            state.report = Some(report);
            save(&ckpt, &state)?;
            }
        }
        // Phase 3: report, then the coalition (retried every round while unknown).
        let until = tokio::time::Instant::now() + structure_wait;
        let mut reported = false;
        if state.coalition.is_none() {
            tokio::select! {
                _ = &mut shutdown => { info!("stopped by a signal"); return Ok(()); }
                r = attach(&link, &join, &mut state, &mut reported, until, me_i) => r,
            }
            save(&ckpt, &state)?;
        }

        // Phase 4: FedAvg inside the coalition.
        let mut learner = learner;
        let mut rng = StdRng::seed_from_u64(stream_seed(cfg.seed ^ FL_BATCH_TAG, me, Stream::Batches));
        // A resumed silo replays its batch stream to its round: an epoch draws one shuffle of
        // the training rows (`Learner::train_epoch`), so the stream is where an uninterrupted
        // run's would be and the resumed rounds train exactly as they would have.
        for _ in 0..state.round {
            let mut order: Vec<usize> = (0..data.train.len()).collect();
            order.shuffle(&mut rng);
        }
        // Resumed: the last round's own model may not have reached every member yet.
        if let Some((r, p)) = &state.last_local {
            let _ = link.0.send(Cmd::Publish(*r, Arc::new(p.clone())));
        }
        while state.round < cfg.rounds {
            let started = Instant::now();
            if state.coalition.is_none() {
                let until = tokio::time::Instant::now() + Duration::from_millis(500);
                attach(&link, &join, &mut state, &mut reported, until, me_i).await;
            }
            let round = state.round;
            let (l, mut p, mut opt, r, d) =
                (learner, state.params.clone(), state.adam.clone(), rng, data.clone());
            let (l, p, opt, r) = tokio::task::spawn_blocking(move || {
                let (mut l, mut r) = (l, r);
                l.train_epoch(&mut p, &mut opt, &d.train, &mut r)
                    .map(|_| (l, p, opt, r))
            })
            .await?
            .map_err(|e| anyhow::anyhow!("training: {e}"))?;
            learner = l;
            rng = r;
            state.adam = opt;
            let local = Arc::new(p);
            let _ = link.0.send(Cmd::Publish(round, local.clone()));
            state.last_local = Some((round, local.to_vec()));
            let (members, sizes) = state
                .coalition
                .clone()
                .unwrap_or_else(|| (vec![me.0], vec![n_train]));
            let got = tokio::select! {
                _ = &mut shutdown => { info!("stopped by a signal"); return Ok(()); }
                g = pull_models(&link, &members, me.0, round, local.clone(), fetch, local.len()) => g,
            };
            let heard: Vec<u32> = members
                .iter()
                .zip(&got)
                .filter(|(_, g)| g.is_some())
                .map(|(&m, _)| m)
                .collect();
            let arrived: Vec<Option<&[f32]>> = got.iter().map(|m| m.as_deref().map(|v| v.as_slice())).collect();
            state.params = coalition_average(&arrived, &sizes);
            state.round += 1;
            let eval = if cfg.eval_every > 0 && state.round % cfg.eval_every == 0 && state.round < cfg.rounds {
                let ev = learner.evaluate(&state.params, &data.test).map_err(|e| anyhow::anyhow!("{e}"))?;
                Some(crate::trace::EvalRecord::from(ev))
            } else {
                None
            };
            let line = RoundLine {
                node: me.0,
                round: state.round,
                global_round: state.coalition.as_ref().map(|_| round),
                attached: state.coalition.is_some(),
                trained: true,
                update_acked: heard.len() == members.len(),
                averaged: heard,
                seconds: started.elapsed().as_secs_f64(),
                at: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0),
                eval,
            };
            writeln!(log, "{}", serde_json::to_string(&line)?)?;
            log.flush()?;
            save(&ckpt, &state)?;
        }
        // Let every other member fetch the last round's model before leaving.
        if let Some((members, _)) = &state.coalition {
            let others = members.len().saturating_sub(1);
            let last = cfg.rounds.saturating_sub(1);
            let until = Instant::now() + fetch;
            while Instant::now() < until {
                let (tx, rx) = oneshot::channel();
                let _ = link.0.send(Cmd::Served(last, tx));
                if rx.await.unwrap_or(0) >= others {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let ev = learner.evaluate(&state.params, &data.test).map_err(|e| anyhow::anyhow!("{e}"))?;
        let accuracy = ev.accuracy();
        let line = FinalLine {
            node: me.0,
            final_global_round: state.coalition.as_ref().map(|_| cfg.rounds),
            model_hash: crate::ids::model_hash(&state.params),
            coalition: state.coalition.as_ref().map(|c| c.0.clone()),
            eval: crate::trace::EvalRecord::from(ev),
        };
        writeln!(log, "{}", serde_json::to_string(&line)?)?;
        log.flush()?;
        info!(accuracy, coalition = ?state.coalition.as_ref().map(|c| &c.0), "fedcollab run done");
        Ok(())
    }
    .await;
    task.abort();
    result
}

/// Joins and fetches the distance plan, retrying until the coordinator answers (it holds the
/// plan until every silo joined): `(m_train target, silos)`.
async fn plan(
    link: &Link,
    join: &CoordRequest,
    fetch: Duration,
) -> anyhow::Result<(f64, usize, Vec<usize>)> {
    let mut joined = false;
    loop {
        if !joined {
            match link.coord_within(join, fetch).await {
                Ok(CoordResponse::Ack) => joined = true,
                Ok(CoordResponse::Error { reason }) => {
                    anyhow::bail!("the coordinator refused this silo: {reason}")
                }
                other => {
                    warn!(?other, "could not join the coordinator; trying again");
                    continue;
                }
            }
        }
        match link
            .coord_within(&CoordRequest::Fetch { round: 0 }, fetch)
            .await
        {
            Ok(CoordResponse::DiscPlan {
                target,
                nodes,
                members,
            }) => {
                let ascending = members.windows(2).all(|w| w[0] < w[1]);
                if !(target.is_finite() && target >= 0.0)
                    || nodes < 2
                    || members.len() < 2
                    || !ascending
                    || members.iter().any(|&m| m >= nodes)
                {
                    anyhow::bail!(
                        "the coordinator sent a bad plan (target {target}, {nodes} silos, \
                         planned {members:?})"
                    );
                }
                let members = members.into_iter().map(|m| m as usize).collect();
                return Ok((target, nodes as usize, members));
            }
            Ok(CoordResponse::Error { reason }) => {
                // Typically a restarted coordinator that lost the registration.
                warn!(%reason, "plan refused; joining again");
                joined = false;
            }
            other => warn!(?other, "no distance plan yet; asking again"),
        }
    }
}

/// Phase 3: sends the distances until acknowledged, then fetches the coalition, until
/// `until`. Leaves `state.coalition` unset when the coordinator did not answer in time.
async fn attach(
    link: &Link,
    join: &CoordRequest,
    state: &mut Saved,
    reported: &mut bool,
    until: tokio::time::Instant,
    me: usize,
) {
    let left = || until.saturating_duration_since(tokio::time::Instant::now());
    while !left().is_zero() {
        if !*reported {
            let Some(pairs) = state.report.clone() else {
                return;
            };
            match link
                .coord_within(&CoordRequest::Distances { pairs }, left())
                .await
            {
                Ok(CoordResponse::Ack) => *reported = true,
                Ok(CoordResponse::Error { reason }) => {
                    // A restarted coordinator without this silo's join: join again.
                    warn!(%reason, "distances refused; joining again");
                    let _ = link.coord_within(join, left()).await;
                    tokio::time::sleep(Duration::from_millis(200).min(left())).await;
                    continue;
                }
                other => {
                    warn!(?other, "could not report the distances");
                    continue;
                }
            }
        }
        match link
            .coord_within(&CoordRequest::Fetch { round: 1 }, left())
            .await
        {
            Ok(CoordResponse::Coalition { members, sizes }) => {
                let ok = members.len() == sizes.len()
                    && members.contains(&(me as u32))
                    && members.windows(2).all(|w| w[0] < w[1])
                    && sizes.iter().all(|&s| s > 0);
                if ok {
                    info!(?members, "coalition received");
                    state.coalition = Some((members, sizes));
                    return;
                }
                warn!(?members, ?sizes, "a malformed coalition; ignored");
                return;
            }
            Ok(CoordResponse::Error { reason }) => {
                warn!(%reason, "coalition refused; reporting again");
                *reported = false;
            }
            other => {
                if !left().is_zero() {
                    warn!(?other, "no coalition yet");
                }
            }
        }
    }
    warn!("no collaboration structure yet: training alone this round");
}

/// Pairs this silo finished in the distance phase (`fedcollab.pairs`, rewritten after each),
/// for the plan they belong to: a silo restarted before its report runs only the others.
#[derive(Serialize, Deserialize)]
struct PairsDone {
    target: f64,
    planned: Vec<usize>,
    pairs: Vec<PairDistance>,
}

const PAIRS_MAGIC: &[u8; 8] = b"FEDCPRS1";

/// The pairs of `path` that belong to this plan (none when it is absent or was written for
/// another plan); an unreadable file is an error naming it.
fn pairs_done(
    path: &std::path::Path,
    target: f64,
    planned: &[usize],
) -> anyhow::Result<Vec<PairDistance>> {
    let saved: Option<PairsDone> = crate::store::read_versioned(path, PAIRS_MAGIC, 1)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(match saved {
        Some(p) if p.target == target && p.planned == planned => p.pairs,
        Some(_) => {
            warn!(file = %path.display(), "finished pairs of another plan: ignored");
            Vec::new()
        }
        None => Vec::new(),
    })
}

/// Phase 2: Algorithm 1 with every other planned silo. This silo drives the pairs with
/// lower-index partners (its requests) and answers those with higher-index partners (its
/// discriminator thread); returns one distance per partner, ascending. Each pair that ends
/// with a distance is kept in `pairs_path` at once; restarted, the silo runs only the pairs
/// not kept there, and a pair it restarts or that its partner restarted is run again from
/// round 0 on both sides ([`CollabResponse::Restart`]), which ends as the first run would.
#[allow(clippy::too_many_arguments)]
async fn estimate(
    link: &Link,
    fc: &FedCollabConfig,
    data: &ClientData,
    seed: u64,
    me: usize,
    planned: &[usize],
    target: f64,
    fetch: Duration,
    pairs_path: &std::path::Path,
) -> anyhow::Result<Vec<PairDistance>> {
    let mut kept: Vec<PairDistance> = pairs_done(pairs_path, target, planned)?
        .into_iter()
        .filter(|p| {
            let j = p.partner as usize;
            j != me && planned.contains(&j) && p.distance.is_some()
        })
        .collect();
    if !kept.is_empty() {
        info!(
            pairs = kept.len(),
            "resuming the distance phase: these pairs finished before the restart"
        );
    }
    let is_kept = |j: usize| kept.iter().any(|p| p.partner as usize == j);
    let model = Arc::new(
        DiscModel::new(&data.train, fc, seed).map_err(|e| anyhow::anyhow!("discriminator: {e}"))?,
    );
    let disc = Arc::new(
        model
            .silo_data(&data.train, me, seed, target)
            .map_err(|e| anyhow::anyhow!("discriminator data: {e}"))?,
    );
    let lower: Vec<usize> = planned
        .iter()
        .copied()
        .filter(|&p| p < me && !is_kept(p))
        .collect();
    let higher: Vec<usize> = planned.iter().copied().filter(|&p| p > me).collect();
    let higher_kept: HashMap<usize, u32> = kept
        .iter()
        .filter(|p| p.partner as usize > me)
        .map(|p| (p.partner as usize, p.rounds))
        .collect();
    let expected = lower.len() + higher.len() - higher_kept.len();
    // The answering side, on its own thread.
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let server = {
        let (model, disc, fc, done_tx) = (model.clone(), disc.clone(), fc.clone(), done_tx.clone());
        let learner = Learner::new(&model.spec, fc.disc_batch_size)
            .map_err(|e| anyhow::anyhow!("discriminator: {e}"))?;
        let idle = fetch * 3;
        let higher = higher.clone();
        std::thread::spawn(move || {
            answer_pairs(
                me,
                &higher,
                higher_kept,
                &model,
                disc,
                &fc,
                seed,
                learner,
                jobs_rx,
                done_tx,
                idle,
            )
        })
    };
    link.0
        .send(Cmd::DiscServer(jobs_tx))
        .map_err(|_| anyhow::anyhow!("swarm task ended"))?;
    // The driving side: one task per lower-index partner.
    for partner in lower {
        let learner = Learner::new(&model.spec, fc.disc_batch_size)
            .map_err(|e| anyhow::anyhow!("discriminator: {e}"))?;
        let (link, model, disc, fc, done) = (
            link.clone(),
            model.clone(),
            disc.clone(),
            fc.clone(),
            done_tx.clone(),
        );
        tokio::spawn(async move {
            let fresh = || PairHalf::new(&fc, &model, disc.clone(), me, partner, seed);
            let r = drive_pair(&link, fresh, learner, partner, fetch).await;
            let _ = done.send(match r {
                Ok((d, rounds)) => PairDistance {
                    partner: partner as u32,
                    distance: d,
                    rounds,
                },
                Err(e) => {
                    warn!(partner, error = %e, "pair failed: its distance counts as 1");
                    PairDistance {
                        partner: partner as u32,
                        distance: None,
                        rounds: 0,
                    }
                }
            });
        });
    }
    drop(done_tx);
    let mut out: Vec<PairDistance> = kept.clone();
    for _ in 0..expected {
        let Some(p) = done_rx.recv().await else {
            break;
        };
        if p.distance.is_some() {
            kept.push(p.clone());
            let record = PairsDone {
                target,
                planned: planned.to_vec(),
                pairs: kept.clone(),
            };
            crate::store::write_versioned(pairs_path, PAIRS_MAGIC, 1, &record)
                .map_err(|e| anyhow::anyhow!("{}: {e}", pairs_path.display()))?;
        }
        out.push(p);
    }
    let _ = tokio::task::spawn_blocking(move || server.join()).await;
    for &partner in planned.iter().filter(|&&p| p != me) {
        if !out.iter().any(|p| p.partner as usize == partner) {
            out.push(PairDistance {
                partner: partner as u32,
                distance: None,
                rounds: 0,
            });
        }
    }
    out.sort_by_key(|p| p.partner);
    Ok(out)
}

/// How often a pair may be started over at the partner's request before it counts as failed
/// (a partner restarting again and again, or one that says so without cause).
const PAIR_RESTARTS: usize = 3;

/// Drives one pair as its higher-index silo: per round, the own step, the exchange, the
/// average, and every evaluation's accuracies. `(estimate, rounds)`. When the partner lost
/// the pair (it was restarted), both start it over from round 0 with fresh halves (`fresh`).
async fn drive_pair(
    link: &Link,
    fresh: impl Fn() -> Result<PairHalf, String>,
    learner: Learner,
    partner: usize,
    fetch: Duration,
) -> Result<(Option<f64>, u32), String> {
    let (mut half, mut learner) = (fresh()?, learner);
    let mut acc_prev: Option<f64> = None;
    let mut first = true;
    let mut restarts = 0;
    let mut start_over = |half: &mut PairHalf, at: u32| -> Result<(), String> {
        restarts += 1;
        if restarts > PAIR_RESTARTS {
            return Err(format!(
                "the partner asked to start the pair over {restarts} times"
            ));
        }
        info!(
            partner,
            at, "the partner lost the pair (restarted): starting it over"
        );
        *half = fresh()?;
        Ok(())
    };
    loop {
        let (h, l, own) = tokio::task::spawn_blocking(move || {
            let own = half.step(&mut learner);
            (half, learner, own)
        })
        .await
        .map_err(|e| e.to_string())?;
        (half, learner) = (h, l);
        let own = own.map_err(|e| e.to_string())?;
        let round = half.rounds() as u32;
        let req = CollabRequest::DiscStep {
            round,
            weights: Arc::new(own.clone()),
            acc: acc_prev.take(),
        };
        // The partner may still be waiting for its plan: the first exchange waits longer.
        let budget = if first { fetch * 3 } else { fetch };
        first = false;
        let (theirs, acc_lo) = match link
            .peer_within(partner, req, budget)
            .await
            .map_err(|e| e.to_string())?
        {
            CollabResponse::DiscStep { weights, acc } => (weights, acc),
            CollabResponse::Restart if round > 0 => {
                start_over(&mut half, round)?;
                (acc_prev, first) = (None, true);
                continue;
            }
            other => return Err(format!("round {round}: {other:?}")),
        };
        let (h, l, r) = tokio::task::spawn_blocking(move || {
            let r = (|| {
                if !half.combine(&own, &theirs)? {
                    return Ok(None);
                }
                let acc_hi = half.accuracy(&mut learner).map_err(|e| e.to_string())?;
                let acc_lo = acc_lo.ok_or("the partner sent no accuracy for an evaluated round")?;
                if !(acc_lo.is_finite() && (0.0..=1.0).contains(&acc_lo)) {
                    return Err(format!("the partner's accuracy {acc_lo} is not a fraction"));
                }
                half.record(acc_lo, acc_hi);
                Ok(Some(acc_hi))
            })();
            (half, learner, r)
        })
        .await
        .map_err(|e| e.to_string())?;
        (half, learner) = (h, l);
        acc_prev = r?;
        if half.done() {
            let rounds = half.rounds() as u32;
            match link
                .peer_within(
                    partner,
                    CollabRequest::DiscDone {
                        rounds,
                        acc: acc_prev,
                    },
                    fetch,
                )
                .await
                .map_err(|e| e.to_string())?
            {
                CollabResponse::Ack => return Ok((half.estimate(), rounds)),
                CollabResponse::Restart => {
                    start_over(&mut half, rounds)?;
                    (acc_prev, first) = (None, true);
                }
                other => return Err(format!("the partner did not confirm the stop: {other:?}")),
            }
        }
    }
}

/// The answering side of this silo's pairs with higher-index partners, on its own thread:
/// each `DiscStep` is the partner's weights of a round; this side takes its own step from the
/// pair's average, averages, evaluates when due and answers with its weights (and accuracy).
/// A retransmitted round is answered from the cache without stepping again. A partner silent
/// for `idle` has its pair given up (distance `None`). Sends one result per partner not in
/// `kept` (pairs that ended before a restart: partner → rounds).
///
/// Restarts: a round past 0 of a pair this side does not hold (it was restarted) is answered
/// [`CollabResponse::Restart`]; round 0 of a pair this side holds further on means the
/// partner restarted: the pair starts over. A repeated `DiscDone` of a pair that ended with
/// the same rounds is acknowledged again (the first acknowledgement may have been lost).
#[allow(clippy::too_many_arguments)]
fn answer_pairs(
    me: usize,
    higher: &[usize],
    kept: HashMap<usize, u32>,
    model: &DiscModel,
    disc: Arc<DiscData>,
    fc: &FedCollabConfig,
    seed: u64,
    mut learner: Learner,
    jobs: std::sync::mpsc::Receiver<DiscJob>,
    done: mpsc::UnboundedSender<PairDistance>,
    idle: Duration,
) {
    struct Pair {
        half: PairHalf,
        /// This side's accuracy of the last evaluated average, until the partner's arrives.
        pending: Option<f64>,
        last: Option<(u32, CollabResponse)>,
        seen: Instant,
    }
    let started = Instant::now();
    let mut pairs: HashMap<usize, Pair> = HashMap::new();
    let mut finished: HashSet<usize> = kept.keys().copied().collect();
    // Pairs that ended with an estimate: partner → rounds.
    let mut agreed = kept;
    let params = model.init.len();
    let finish = |finished: &mut HashSet<usize>, partner: usize, d: Option<f64>, rounds| {
        if finished.insert(partner) {
            let _ = done.send(PairDistance {
                partner: partner as u32,
                distance: d,
                rounds,
            });
        }
    };
    while finished.len() < higher.len() {
        let job = match jobs.recv_timeout(Duration::from_millis(250)) {
            Ok(j) => j,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                for &partner in higher {
                    let seen = pairs.get(&partner).map_or(started, |p| p.seen);
                    if !finished.contains(&partner) && seen.elapsed() > idle {
                        warn!(partner, "pair partner silent: pair given up");
                        finish(&mut finished, partner, None, 0);
                    }
                }
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let DiscJob { from, req, reply } = job;
        let refuse = |reason: String| CollabResponse::Error { reason };
        if !higher.contains(&from) {
            let _ = reply.send(refuse(format!(
                "silo {from} does not drive a pair with silo {me} (the higher index of two \
                 planned silos drives)"
            )));
            continue;
        }
        if finished.contains(&from) {
            let again = matches!(req, CollabRequest::DiscDone { rounds, .. }
                if agreed.get(&from) == Some(&rounds));
            let _ = reply.send(if again {
                CollabResponse::Ack
            } else {
                refuse(format!("the pair ({me}, {from}) is over"))
            });
            continue;
        }
        if let Err(reason) = req.check(params) {
            warn!(partner = from, %reason, "refused a pair request");
            let _ = reply.send(refuse(reason));
            continue;
        }
        let continues = match &req {
            CollabRequest::DiscStep { round, .. } => *round > 0,
            CollabRequest::DiscDone { .. } => true,
            CollabRequest::Model { .. } => false,
        };
        match pairs.get(&from) {
            None if continues => {
                info!(
                    partner = from,
                    "a pair this silo does not hold: asking to start it over"
                );
                let _ = reply.send(CollabResponse::Restart);
                continue;
            }
            Some(p)
                if matches!(req, CollabRequest::DiscStep { round: 0, .. })
                    && p.half.rounds() > 0
                    && !matches!(p.last, Some((0, _))) =>
            {
                info!(
                    partner = from,
                    at = p.half.rounds(),
                    "the partner started the pair over (restarted): so does this side"
                );
                pairs.remove(&from);
            }
            _ => {}
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = pairs.entry(from) {
            match PairHalf::new(fc, model, disc.clone(), me, from, seed) {
                Ok(half) => {
                    slot.insert(Pair {
                        half,
                        pending: None,
                        last: None,
                        seen: Instant::now(),
                    });
                }
                Err(reason) => {
                    let _ = reply.send(refuse(reason));
                    finish(&mut finished, from, None, 0);
                    continue;
                }
            }
        }
        let pair = pairs.get_mut(&from).expect("inserted above");
        pair.seen = Instant::now();
        let answer = match req {
            CollabRequest::DiscStep {
                round,
                weights,
                acc,
            } => {
                if let Some((r, resp)) = &pair.last
                    && *r == round
                {
                    // The partner did not get the answer: send it again.
                    resp.clone()
                } else if round as usize != pair.half.rounds() {
                    refuse(format!(
                        "round {round}; the pair ({me}, {from}) is at round {}",
                        pair.half.rounds()
                    ))
                } else {
                    let step = (|| -> Result<CollabResponse, String> {
                        if let Some(acc_hi) = acc {
                            let acc_lo = pair
                                .pending
                                .take()
                                .ok_or("an accuracy for a round that was not evaluated")?;
                            if pair.half.record(acc_lo, acc_hi) {
                                return Err("the pair has stopped: expected its end".into());
                            }
                        }
                        let own = pair.half.step(&mut learner).map_err(|e| e.to_string())?;
                        let evaluated = pair.half.combine(&own, &weights)?;
                        let acc = if evaluated {
                            Some(
                                pair.half
                                    .accuracy(&mut learner)
                                    .map_err(|e| e.to_string())?,
                            )
                        } else {
                            None
                        };
                        pair.pending = acc;
                        Ok(CollabResponse::DiscStep {
                            weights: Arc::new(own),
                            acc,
                        })
                    })();
                    match step {
                        Ok(resp) => {
                            pair.last = Some((round, resp.clone()));
                            resp
                        }
                        Err(reason) => {
                            warn!(partner = from, %reason, "pair failed");
                            finish(&mut finished, from, None, pair.half.rounds() as u32);
                            refuse(reason)
                        }
                    }
                }
            }
            CollabRequest::DiscDone { rounds, acc } => {
                if let (Some(acc_hi), Some(acc_lo)) = (acc, pair.pending.take()) {
                    pair.half.record(acc_lo, acc_hi);
                }
                let agree = rounds as usize == pair.half.rounds() && pair.half.done();
                if agree {
                    if pair.half.estimate().is_some() {
                        agreed.insert(from, rounds);
                    }
                    finish(&mut finished, from, pair.half.estimate(), rounds);
                    CollabResponse::Ack
                } else {
                    warn!(
                        partner = from,
                        rounds,
                        here = pair.half.rounds(),
                        "the partner stopped where this side would not"
                    );
                    finish(&mut finished, from, None, rounds);
                    refuse(format!(
                        "stopped after {rounds} rounds; this side ran {} and would {}stop",
                        pair.half.rounds(),
                        if pair.half.done() { "" } else { "not " }
                    ))
                }
            }
            CollabRequest::Model { .. } => refuse("not a pair request".into()),
        };
        let _ = reply.send(answer);
    }
}

/// Every coalition member's trained model of `round` (this silo's own included, at its
/// position), pulled concurrently; `None` for a member that did not answer within `fetch`.
async fn pull_models(
    link: &Link,
    members: &[u32],
    me: u32,
    round: u64,
    own: Arc<Vec<f32>>,
    fetch: Duration,
    len: usize,
) -> Vec<Option<Arc<Vec<f32>>>> {
    let pulls = members.iter().map(|&m| {
        let (link, own) = (link.clone(), own.clone());
        async move {
            if m == me {
                return Some(own);
            }
            match link
                .peer_within(m as usize, CollabRequest::Model { round }, fetch)
                .await
            {
                Ok(resp @ CollabResponse::Model { round: r, .. }) if r == round => {
                    match resp.check(len) {
                        Ok(()) => match resp {
                            CollabResponse::Model { params, .. } => Some(params),
                            _ => None,
                        },
                        Err(reason) => {
                            warn!(member = m, %reason, "refused a member's model");
                            None
                        }
                    }
                }
                other => {
                    warn!(
                        member = m,
                        round,
                        ?other,
                        "no model from a coalition member this round"
                    );
                    None
                }
            }
        }
    });
    libp2p::futures::future::join_all(pulls).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pd(partner: u32, d: Option<f64>) -> PairDistance {
        PairDistance {
            partner,
            distance: d,
            rounds: 120,
        }
    }

    /// The finished pairs are read back for the plan they were written for; another plan's
    /// are ignored, a missing file is none, and a corrupt one is an error naming the file.
    #[test]
    fn finished_pairs_belong_to_their_plan() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fedcollab.pairs");
        assert!(pairs_done(&path, 20.0, &[0, 1, 2]).unwrap().is_empty());
        let record = PairsDone {
            target: 20.0,
            planned: vec![0, 1, 2],
            pairs: vec![pd(0, Some(0.25)), pd(2, Some(1.0))],
        };
        crate::store::write_versioned(&path, PAIRS_MAGIC, 1, &record).unwrap();
        assert_eq!(
            pairs_done(&path, 20.0, &[0, 1, 2]).unwrap(),
            record.pairs,
            "the same plan"
        );
        assert!(pairs_done(&path, 19.0, &[0, 1, 2]).unwrap().is_empty());
        assert!(pairs_done(&path, 20.0, &[0, 1, 3]).unwrap().is_empty());
        std::fs::write(&path, b"FEDCPRS1\x01\x00\x00\x00garbage").unwrap();
        let e = pairs_done(&path, 20.0, &[0, 1, 2]).unwrap_err().to_string();
        assert!(e.contains("fedcollab.pairs"), "{e}");
    }
}
