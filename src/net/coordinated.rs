//! A node in coordinated mode (issue 5): `[coordinated] mode = "feddisco"`, `"hcct"` or
//! `"fedsac"` in its config runs that algorithm against the coordinator named there instead of
//! FedeRiCo; `"fedcollab"` is handed to [`super::collab_node`] once config, key, manifest and
//! data are checked.
//! Owns: registering (FedDisco: `(N_k, δ_k)`, computed here from the node's own label counts —
//! the histogram never leaves it; HCCT: the sample count only), the round loop (fetch the
//! model the round starts from — FedDisco's global, HCCT's group model — train locally with
//! the simulator's recipe for the algorithm on a blocking thread, send the trained model,
//! evaluate), the fallback
//! when the coordinator is unreachable (keep training from the last model it has, retry every
//! round, reattach when the coordinator answers again), training alone once the coordinator
//! says its run started without this silo (HCCT, FedSaC: `join_s`), the run log and the
//! checkpoint.
//! Must not: weigh, group or aggregate (the coordinator does), or train inside the event loop: the
//! swarm runs in its own task and training on `spawn_blocking`.

use super::behaviour::{CoordCodec, Exchange, Members, coordination_swarm, members};
use super::client::{ExchangeError, Reply, route_coord_event};
use super::config::{CoordinatedAlgorithm, NodeConfig};
use super::identity::{self, Manifest};
use super::metrics::Metrics;
use crate::coord::feddisco;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Learner, Shard};
use crate::protocol::{COORD_PROTOCOL, CoordRequest, CoordResponse};
use crate::silo::{BatchCursor, LocalRecipe};
use libp2p::futures::StreamExt;
use libp2p::request_response::{self as rr, OutboundRequestId, ProtocolSupport};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

/// One line of the coordinated node's `rounds.jsonl`.
#[derive(Serialize)]
struct RoundLine {
    node: u32,
    round: u64,
    /// The coordinator's round of the global trained from (None when detached).
    global_round: Option<u64>,
    attached: bool,
    /// Trained this round (a FedSaC silo outside the cohort does not).
    trained: bool,
    update_acked: bool,
    seconds: f64,
    at: f64,
    eval: Option<crate::trace::EvalRecord>,
    /// Rebuilt on restart from the last-update marker ([`Sent`]): the node was killed after
    /// making this round's update and before its checkpoint, and the coordinator closed the
    /// round meanwhile (whether with this update is not known here: `update_acked` is false).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    recovered: bool,
    /// The coordinator's run started without this silo (it joined after the join deadline):
    /// it trains alone and no longer asks.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    alone: bool,
}

/// The final line.
#[derive(Serialize)]
struct FinalLine {
    node: u32,
    final_global_round: Option<u64>,
    /// FNV-1a of the final model's bytes: equal on every node that holds the same global.
    model_hash: String,
    eval: crate::trace::EvalRecord,
    /// `fallback = "federico"`: the coordinated rounds done before the switch (the rest ran as
    /// FedeRiCo, logged in `<state_dir>/federico/rounds.jsonl`; `eval` is then FedeRiCo's
    /// inference mixture on the last round).
    #[serde(skip_serializing_if = "Option::is_none")]
    fell_back_to_federico_at: Option<u64>,
}

/// The node's state on disk (`<state_dir>/coordinated.bin`).
#[derive(Serialize, Deserialize)]
struct Saved {
    peer_id: String,
    round: u64,
    last_global: Option<u64>,
    params: Vec<f32>,
    /// Local trainings done: a resumed node replays its random streams past them
    /// ([`LocalRecipe::skip`]), so it trains on the batches an uninterrupted run would.
    trained: u64,
}

/// Version 1: [`Saved`] without `trained` (written before restarts replayed the batches).
#[derive(Deserialize)]
struct SavedV1 {
    peer_id: String,
    round: u64,
    last_global: Option<u64>,
    params: Vec<f32>,
}

const MAGIC: &[u8; 8] = b"FEDCNOD1";
const VERSION: u32 = 2;

/// Written after training, before the update goes (`<state_dir>/coordinated.sent`): the
/// coordinator round the update is for, the trainings done with it and the trained model. A
/// node killed after sending but before its checkpoint finds the coordinator past that round
/// on restart: it takes the round as done (this model, its log line rebuilt) and skips that
/// training's draws instead of training again (see [`catch_up`]).
#[derive(Serialize, Deserialize)]
struct Sent {
    round: u64,
    trained: u64,
    params: Vec<f32>,
}

const SENT_MAGIC: &[u8; 8] = b"FEDCSNT1";

/// A resumed node's first global: when its last update went out but its checkpoint missed the
/// round (`sent` past the checkpoint's rounds) and the coordinator has closed that round, the
/// training behind the update counts: the streams move past it. When the round is still open,
/// the node trains it again on the same batches (the same update, which the coordinator takes
/// again). The trainings to skip.
fn catch_up(sent: Option<&Sent>, want: u64, got: u64, trained: u64) -> u64 {
    match sent {
        Some(s) if s.round >= want && got > s.round => s.trained.saturating_sub(trained),
        _ => 0,
    }
}

/// The node's checkpoint, if any; one of version 1 is read without its training count.
fn read_saved(path: &std::path::Path) -> anyhow::Result<Option<(Saved, bool)>> {
    match crate::store::read_versioned::<Saved>(path, MAGIC, VERSION) {
        Ok(s) => Ok(s.map(|s| (s, true))),
        Err(e) => match crate::store::read_versioned::<SavedV1>(path, MAGIC, 1) {
            Ok(Some(v1)) => Ok(Some((
                Saved {
                    peer_id: v1.peer_id,
                    round: v1.round,
                    last_global: v1.last_global,
                    params: v1.params,
                    trained: 0,
                },
                false,
            ))),
            _ => Err(anyhow::anyhow!("checkpoint {e}")),
        },
    }
}

#[derive(NetworkBehaviour)]
struct NodeBehaviour {
    members: Members,
    coord: Exchange<CoordRequest, CoordResponse>,
}

/// The swarm task: sends requests to the coordinator and routes the answers back.
async fn swarm_task(
    mut swarm: libp2p::Swarm<NodeBehaviour>,
    coordinator: PeerId,
    addrs: Vec<Multiaddr>,
    mut rx: mpsc::UnboundedReceiver<(CoordRequest, Reply)>,
) {
    let mut pending: HashMap<OutboundRequestId, Reply> = HashMap::new();
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let Some((req, reply)) = msg else { return };
                for a in &addrs {
                    swarm.add_peer_address(coordinator, a.clone());
                }
                let id = swarm.behaviour_mut().coord.send_request(&coordinator, req);
                pending.insert(id, reply);
            }
            ev = swarm.select_next_some() => {
                if let SwarmEvent::Behaviour(NodeBehaviourEvent::Coord(ev)) = ev {
                    route_coord_event(ev, &mut pending, &mut swarm.behaviour_mut().coord);
                }
            }
        }
    }
}

/// Sends one request and waits for its answer, at most `limit`.
async fn ask(
    tx: &mpsc::UnboundedSender<(CoordRequest, Reply)>,
    req: CoordRequest,
    limit: Duration,
) -> Result<CoordResponse, ExchangeError> {
    let (rtx, rrx) = oneshot::channel();
    tx.send((req, rtx)).map_err(|_| ExchangeError::SwarmEnded)?;
    match tokio::time::timeout(limit, rrx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(ExchangeError::SwarmEnded),
        Err(_) => Err(ExchangeError::TimedOut),
    }
}

/// Fetches global `want`, retrying failed exchanges (coordinator unreachable) until `limit`
/// has passed since the first try: the node waits at most `limit` per round for the global.
async fn fetch_within(
    tx: &mpsc::UnboundedSender<(CoordRequest, Reply)>,
    want: u64,
    limit: Duration,
) -> Result<CoordResponse, ExchangeError> {
    let until = tokio::time::Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let r = ask(tx, CoordRequest::Fetch { round: want }, left).await;
        match r {
            Err(_) if tokio::time::Instant::now() + Duration::from_millis(500) < until => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            r => return r,
        }
    }
}

/// Registers, retrying unreachable-coordinator failures every 500 ms until `until`. A refusal
/// is final for the round (logged). True once acknowledged.
async fn register_within(
    tx: &mpsc::UnboundedSender<(CoordRequest, Reply)>,
    register: &CoordRequest,
    until: tokio::time::Instant,
) -> bool {
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        match ask(tx, register.clone(), left).await {
            Ok(CoordResponse::Ack) => return true,
            Ok(other) => {
                warn!(?other, "registration refused");
                return false;
            }
            Err(_) if tokio::time::Instant::now() + Duration::from_millis(500) < until => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                warn!(error = %e, "could not register");
                return false;
            }
        }
    }
}

/// Runs a coordinated node until its rounds are done or `shutdown` resolves.
pub async fn run(
    cfg: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let cc = cfg
        .coordinated
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("no [coordinated] section"))?
        .check()?;
    let coordinator = cc.coordinator();
    let key = identity::load_key(&cfg.key)?;
    let peer_id = key.public().to_peer_id();
    let manifest = Manifest::load(&cfg.manifest)?;
    let (me, member) = manifest
        .by_name(&cfg.name)
        .ok_or_else(|| anyhow::anyhow!("name {:?} is not in the manifest", cfg.name))?;
    if member.peer_id != peer_id {
        anyhow::bail!(
            "key has peer ID {peer_id}, the manifest lists {}",
            member.peer_id
        );
    }
    let coord_addrs = manifest
        .members
        .iter()
        .find(|m| m.peer_id == coordinator)
        .map(|m| m.addrs.clone())
        .ok_or_else(|| anyhow::anyhow!("the coordinator {coordinator} is not in the manifest"))?;
    let data = match &cfg.data.shard {
        Some(path) => Shard::read(path)?.data,
        None => cfg.data.load()?,
    };
    let spec = cfg
        .model
        .spec(&data.train.sample_shape, data.train.num_classes())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if cc.mode() == CoordinatedAlgorithm::Fedcollab {
        return super::collab_node::run(
            super::collab_node::Prelude {
                cfg,
                cc,
                key,
                manifest,
                me,
                coordinator,
                coord_addrs,
                data,
                spec,
            },
            shutdown,
        )
        .await;
    }
    let batch = cfg.train.batch_size;
    let mut learner = Learner::new(&spec, batch).map_err(|e| anyhow::anyhow!("{e}"))?;
    let n_train = data.train.len() as u64;
    let register = match cc.mode() {
        CoordinatedAlgorithm::Hcct | CoordinatedAlgorithm::Fedsac => CoordRequest::Join { n_train },
        // FedDisco (FedCollab's node runs in `collab_node`).
        _ => {
            let counts: Vec<u64> = data
                .train
                .class_counts()
                .iter()
                .map(|&n| n as u64)
                .collect();
            let report = feddisco::report(&counts, cc.config().feddisco.metric)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            CoordRequest::Register {
                n_train: report.num_samples,
                discrepancy: report.discrepancy,
            }
        }
    };

    std::fs::create_dir_all(&cfg.state_dir)?;
    let ckpt = cfg.state_dir.join("coordinated.bin");
    let saved = read_saved(&ckpt)?;
    if saved
        .as_ref()
        .is_some_and(|(s, _)| s.peer_id != peer_id.to_string())
    {
        anyhow::bail!("checkpoint {} belongs to another peer", ckpt.display());
    }
    let replay = match &saved {
        Some((s, true)) => s.trained,
        Some((s, false)) => {
            warn!(
                round = s.round,
                "checkpoint from an older federico: resuming without replaying the batch order"
            );
            0
        }
        None => 0,
    };
    let (mut round, mut last_global, mut model) = match saved {
        Some((s, _)) => (s.round, s.last_global, s.params),
        None => (
            0,
            None,
            learner.init_params(&mut StdRng::seed_from_u64(stream_seed(
                cfg.seed,
                me,
                Stream::Init,
            ))),
        ),
    };
    let mut recipe = match cc.mode() {
        CoordinatedAlgorithm::Fedsac => {
            let rng =
                |tag: u64| StdRng::seed_from_u64(stream_seed(cfg.seed ^ tag, me, Stream::Batches));
            LocalRecipe::Fedsac {
                cfg: Box::new(cc.config().fedsac.clone()),
                cursor: BatchCursor::new(data.train.len(), rng(crate::silo::fedsac::STREAM_TAG)),
                features: rng(crate::silo::fedsac::FEATURE_TAG),
            }
        }
        CoordinatedAlgorithm::Hcct => LocalRecipe::Hcct {
            cfg: cc.config().hcct.clone(),
            rng: StdRng::seed_from_u64(stream_seed(
                cfg.seed ^ crate::silo::hcct::BATCH_TAG,
                me,
                Stream::Batches,
            )),
        },
        _ => LocalRecipe::Feddisco {
            cfg: cc.config().feddisco.clone(),
            cursor: BatchCursor::new(
                data.train.len(),
                StdRng::seed_from_u64(stream_seed(
                    cfg.seed ^ crate::silo::feddisco::STREAM_TAG,
                    me,
                    Stream::Batches,
                )),
            ),
        },
    };
    // Resumed: the streams go where an uninterrupted run's are after its trainings.
    recipe.skip(replay, data.train.len(), batch);
    let mut trained = replay;
    let sent_path = cfg.state_dir.join("coordinated.sent");
    let mut sent: Option<Sent> = crate::store::read_versioned(&sent_path, SENT_MAGIC, 1)
        .unwrap_or_else(|e| {
            warn!(error = %e, "ignoring the last-update marker");
            None
        });

    // The swarm, in its own task.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let fetch = cc.fetch();
    let allowed: Option<Vec<PeerId>> =
        (!manifest.open).then(|| manifest.members.iter().map(|m| m.peer_id).collect());
    let max = cfg.max_message();
    let behaviour = NodeBehaviour {
        members: members(allowed),
        coord: Exchange::new(
            CoordCodec::new(max, metrics),
            [(StreamProtocol::new(COORD_PROTOCOL), ProtocolSupport::Full)],
            rr::Config::default().with_request_timeout(fetch),
        ),
    };
    let swarm = coordination_swarm(key, &cfg.listen, behaviour)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(swarm_task(swarm, coordinator, coord_addrs, rx));

    let log_path = cfg.state_dir.join("rounds.jsonl");
    // Each round's line is written before its checkpoint: cut what the checkpoint lacks.
    let cut = crate::trace::trim_log(&log_path, round + 1).map_err(|e| anyhow::anyhow!(e))?;
    if cut > 0 {
        warn!(
            lines = cut,
            checkpoint_round = round,
            "run log cut back to the checkpoint"
        );
    }
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    info!(node = %me, peer = %peer_id, round, "coordinated node started");

    let mut registered = false;
    tokio::pin!(shutdown);
    let data = Arc::new(data);

    // `fallback = "federico"`: the rounds after the switch run as FedeRiCo
    // (`run_rest_as_federico`).
    let falls_back = cc.federico_after();
    // The evaluation of a round's model on the rounds evaluated on the way (the last is
    // evaluated in the final line).
    let eval_at = |learner: &mut Learner, params: &[f32], round: u64| {
        if cfg.eval_every > 0 && round % cfg.eval_every == 0 && round < cfg.rounds {
            let ev = learner
                .evaluate(params, &data.test)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            anyhow::Ok(Some(crate::trace::EvalRecord::from(ev)))
        } else {
            Ok(None)
        }
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    };
    let mut streak = 0u64;
    // The coordinator's run started without this silo: no more asking.
    let mut alone = false;
    let result: anyhow::Result<Option<u64>> = async {
        if falls_back.is_some() && cfg.state_dir.join("federico/checkpoint.bin").exists() {
            // Switched before a restart: go on as FedeRiCo.
            return Ok(Some(round));
        }
        while round < cfg.rounds {
            let started = std::time::Instant::now();
            // One budget per round for registering and fetching: a coordinator that is not
            // up yet (or restarting) is retried within it.
            let until = tokio::time::Instant::now() + fetch;
            if !registered && !alone {
                registered = tokio::select! {
                    _ = &mut shutdown => { info!("stopped by a signal"); return Ok(None); }
                    r = register_within(&tx, &register, until) => r,
                };
            }
            let want = last_global.map_or(0, |g| g + 1);
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let got = if alone {
                Ok(CoordResponse::Alone)
            } else {
                tokio::select! {
                    _ = &mut shutdown => { info!("stopped by a signal"); return Ok(None); }
                    r = fetch_within(&tx, want, left) => r,
                }
            };
            let fits = |p: &[f32]| p.len() == model.len();
            let (global_round, direction, train) = match got {
                Ok(CoordResponse::Global { round: g, params }) if fits(&params) => {
                    model = params.to_vec();
                    last_global = Some(g);
                    (Some(g), None, true)
                }
                Ok(CoordResponse::Assigned {
                    round: g,
                    params,
                    direction,
                    train,
                }) if fits(&params) && direction.as_deref().is_none_or(|d| fits(d)) => {
                    model = params.to_vec();
                    last_global = Some(g);
                    (Some(g), direction, train)
                }
                Ok(CoordResponse::Alone) => {
                    if !alone {
                        warn!(
                            round,
                            "the coordinator's run started without this silo (it joined after \
                             the join deadline): training alone for the remaining rounds"
                        );
                        alone = true;
                    }
                    (None, None, true)
                }
                other => {
                    warn!(
                        round,
                        ?other,
                        "no model from the coordinator: training from the last model (fallback)"
                    );
                    registered = false;
                    (None, None, true)
                }
            };
            // The coordinator is already past its last round (this node skipped rounds it
            // was not needed in, e.g. outside FedSaC's cohorts): nothing left to train.
            if global_round.is_some_and(|g| g >= cfg.rounds) {
                break;
            }
            if let Some(g) = global_round
                && let Some(s) = sent.take()
            {
                let skip = catch_up(Some(&s), want, g, trained);
                if skip > 0 {
                    info!(
                        round = s.round,
                        "the last update went out before the kill: not training it again"
                    );
                    recipe.skip(skip, data.train.len(), batch);
                    trained += skip;
                    // The round after the checkpoint, as it ended before the kill.
                    round += 1;
                    let eval = eval_at(&mut learner, &s.params, round)?;
                    let line = RoundLine {
                        node: me.0,
                        round,
                        global_round: Some(s.round),
                        attached: true,
                        trained: true,
                        update_acked: false,
                        seconds: 0.0,
                        at: now(),
                        eval,
                        recovered: true,
                        alone: false,
                    };
                    writeln!(log, "{}", serde_json::to_string(&line)?)?;
                    log.flush()?;
                }
            }
            // Local training off the event loop, with the simulator's recipe. Detached, the
            // round's schedule (HCCT's η_t) follows the node's own round. A FedSaC silo outside
            // the round's cohort does not train.
            let contributes = matches!(recipe, LocalRecipe::Fedsac { .. });
            let (local, subspace) = if train {
                let (l, r, d, p) = (learner, recipe, data.clone(), model.clone());
                let at = global_round.unwrap_or(round);
                let (l, r, p, q) = tokio::task::spawn_blocking(move || {
                    let (mut l, mut r, mut p) = (l, r, p);
                    r.train(
                        &mut l,
                        &mut p,
                        &d.train,
                        batch,
                        at,
                        direction.as_ref().map(|d| d.as_slice()),
                    )
                    .map(|q| (l, r, p, q))
                })
                .await?
                .map_err(|e| anyhow::anyhow!("training: {e}"))?;
                learner = l;
                recipe = r;
                trained += 1;
                (p, q)
            } else {
                (model.clone(), None)
            };
            let mut acked = false;
            if let Some(g) = global_round.filter(|_| train) {
                let mark = Sent {
                    round: g,
                    trained,
                    params: local.clone(),
                };
                crate::store::write_versioned(&sent_path, SENT_MAGIC, 1, &mark)
                    .map_err(|e| anyhow::anyhow!(e))?;
                let up = if contributes {
                    CoordRequest::Contribute {
                        round: g,
                        params: Arc::new(local.clone()),
                        subspace,
                    }
                } else {
                    CoordRequest::Update {
                        round: g,
                        params: Arc::new(local.clone()),
                        n_train,
                    }
                };
                acked = match ask(&tx, up.clone(), fetch).await {
                    Ok(CoordResponse::Ack) => true,
                    // Refused, typically because the registration was lost (a node that
                    // started before the coordinator listened, or a coordinator restarted
                    // without it): register again and resend once.
                    Ok(CoordResponse::Error { reason }) => {
                        warn!(round, %reason, "update refused; registering again");
                        registered = matches!(
                            ask(&tx, register.clone(), fetch).await,
                            Ok(CoordResponse::Ack)
                        );
                        registered && matches!(ask(&tx, up, fetch).await, Ok(CoordResponse::Ack))
                    }
                    _ => false,
                };
            }
            // Detached: the own model carries on; attached: the next global replaces it.
            model = local;
            round += 1;
            let eval = eval_at(&mut learner, &model, round)?;
            let line = RoundLine {
                node: me.0,
                round,
                global_round,
                attached: global_round.is_some(),
                trained: train,
                update_acked: acked,
                seconds: started.elapsed().as_secs_f64(),
                at: now(),
                eval,
                recovered: false,
                alone,
            };
            writeln!(log, "{}", serde_json::to_string(&line)?)?;
            log.flush()?;
            crate::store::write_versioned(
                &ckpt,
                MAGIC,
                VERSION,
                &Saved {
                    peer_id: peer_id.to_string(),
                    round,
                    last_global,
                    params: model.clone(),
                    trained,
                },
            )
            .map_err(|e| anyhow::anyhow!(e))?;
            streak = if global_round.is_some() || alone {
                0
            } else {
                streak + 1
            };
            if falls_back.is_some_and(|after| streak >= after) && round < cfg.rounds {
                warn!(
                    round,
                    rounds_without = streak,
                    "the coordinator is gone: switching to FedeRiCo with the other silos"
                );
                return Ok(Some(round));
            }
        }
        // The final model: the coordinator's after its last round (or the own model when it
        // cannot be had). That round (`rounds`, shared with the coordinator's config) may lie
        // ahead when rounds were spent detached: wait for it a little longer.
        let want = cfg.rounds;
        let fetch = fetch * 4;
        let mut final_round = None;
        if !alone
            && let Ok(
                CoordResponse::Global { round: g, params }
                | CoordResponse::Assigned {
                    round: g, params, ..
                },
            ) = fetch_within(&tx, want, fetch).await
            && params.len() == model.len()
        {
            model = params.to_vec();
            final_round = Some(g);
        }
        let ev = learner
            .evaluate(&model, &data.test)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let accuracy = ev.accuracy();
        let line = FinalLine {
            node: me.0,
            final_global_round: final_round,
            model_hash: crate::ids::model_hash(&model),
            eval: crate::trace::EvalRecord::from(ev),
            fell_back_to_federico_at: None,
        };
        writeln!(log, "{}", serde_json::to_string(&line)?)?;
        log.flush()?;
        info!(accuracy, final_round, "coordinated run done");
        Ok(None)
    }
    .await;
    task.abort();
    // The swarm must be gone (its listen addresses free) before FedeRiCo's starts.
    let _ = task.await;
    let Some(at) = result? else {
        return Ok(());
    };
    let Some(line) =
        run_rest_as_federico(&cfg, &manifest, me, coordinator, model, at, &mut shutdown).await?
    else {
        return Ok(());
    };
    writeln!(log, "{}", serde_json::to_string(&line)?)?;
    log.flush()?;
    info!(after = at, "coordinated run done (the rest as FedeRiCo)");
    Ok(())
}

/// `fallback = "federico"`: the rounds after the first `at` as a FedeRiCo node in
/// `<state_dir>/federico/` (resumed from its checkpoint there, else started from `model`), with
/// the manifest minus the coordinator. Returns the final line (`None` when stopped by a signal).
async fn run_rest_as_federico(
    cfg: &NodeConfig,
    manifest: &Manifest,
    me: NodeId,
    coordinator: PeerId,
    model: Vec<f32>,
    at: u64,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Option<FinalLine>> {
    let dir = cfg.state_dir.join("federico");
    std::fs::create_dir_all(&dir)?;
    // The federation without its coordinator: the silos' FedeRiCo.
    let mut silos = manifest.clone();
    silos.members.retain(|m| m.peer_id != coordinator);
    let manifest_path = dir.join("manifest.toml");
    std::fs::write(&manifest_path, silos.to_toml())?;
    let mut fed = cfg.clone();
    fed.coordinated = None;
    fed.rounds = cfg.rounds - at;
    fed.state_dir = dir.clone();
    fed.manifest = manifest_path;
    info!(
        after = at,
        rounds = fed.rounds,
        "running the remaining rounds as FedeRiCo"
    );
    let ending = super::node::run_from(fed, Some(model), shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("FedeRiCo after the coordinator: {e}"))?;
    if ending == super::node::Ending::Interrupted {
        return Ok(None);
    }
    // The final line: FedeRiCo's last round (always evaluated) and the model it ended with.
    let fed_log = std::fs::read_to_string(dir.join("rounds.jsonl"))?;
    let last: crate::trace::NodeRound = fed_log
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<crate::trace::NodeRound>(l).ok())
        .ok_or_else(|| anyhow::anyhow!("the FedeRiCo run logged no round"))?;
    let eval = last
        .eval
        .ok_or_else(|| anyhow::anyhow!("FedeRiCo's last round was not evaluated"))?;
    let ckpt = crate::silo::federico::Checkpoint::read(&dir.join("checkpoint.bin"))
        .map_err(|e| anyhow::anyhow!(e))?
        .ok_or_else(|| anyhow::anyhow!("the FedeRiCo run left no checkpoint"))?;
    Ok(Some(FinalLine {
        node: me.0,
        final_global_round: None,
        model_hash: crate::ids::model_hash(&ckpt.params),
        eval,
        fell_back_to_federico_at: Some(at),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_1_checkpoint_resumes_without_its_training_count() {
        #[derive(Serialize)]
        struct V1 {
            peer_id: String,
            round: u64,
            last_global: Option<u64>,
            params: Vec<f32>,
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coordinated.bin");
        let v1 = V1 {
            peer_id: "p".into(),
            round: 4,
            last_global: Some(3),
            params: vec![1.0, 2.0],
        };
        crate::store::write_versioned(&path, MAGIC, 1, &v1).unwrap();
        let (s, current) = read_saved(&path).unwrap().unwrap();
        assert!(!current);
        assert_eq!(
            (s.round, s.last_global, s.params),
            (4, Some(3), vec![1.0, 2.0])
        );
        let now = Saved {
            peer_id: "p".into(),
            round: 5,
            last_global: Some(4),
            params: vec![3.0],
            trained: 5,
        };
        crate::store::write_versioned(&path, MAGIC, VERSION, &now).unwrap();
        let (s, current) = read_saved(&path).unwrap().unwrap();
        assert!(current);
        assert_eq!((s.round, s.trained), (5, 5));
        // Neither version: the error names the file.
        std::fs::write(&path, b"garbage").unwrap();
        let Err(e) = read_saved(&path) else {
            panic!("garbage read as a checkpoint")
        };
        let e = e.to_string();
        assert!(e.contains("coordinated.bin"), "{e}");
        assert!(read_saved(&dir.path().join("none.bin")).unwrap().is_none());
    }

    #[test]
    fn a_training_whose_update_went_out_is_skipped_only_once_its_round_closed() {
        let sent = Sent {
            round: 7,
            trained: 8,
            params: vec![],
        };
        // Checkpoint after global 6 (7 trainings), the coordinator closed round 7: skip one.
        assert_eq!(catch_up(Some(&sent), 7, 8, 7), 1);
        // Round 7 still open: train it again, on the same batches.
        assert_eq!(catch_up(Some(&sent), 7, 7, 7), 0);
        // The checkpoint already covers round 7 (the marker is old news).
        assert_eq!(catch_up(Some(&sent), 8, 9, 8), 0);
        assert_eq!(catch_up(None, 7, 8, 7), 0);
    }
}
