//! Setting a node up: its place in the manifest, its data, its state (fresh or from its
//! checkpoint), its swarm, its control channel and its run log.
//!
//! Owns: refusing a key, a checkpoint or a model that does not belong to this node, by name.
//! Must not: start a round or touch the round engine.

use super::{NodeError, Start, fatal};
use crate::core::Peer;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Adam, ClientData, Learner, Shard};
use crate::net::behaviour::{Behaviour, BehaviourConfig, listen_on};
use crate::net::config::NodeConfig;
use crate::net::control;
use crate::net::identity::Manifest;
use crate::net::intake::{self, Intake, Limits};
use crate::net::limits;
use crate::net::metrics::Metrics;
use crate::protocol;
use crate::silo::federico::{Checkpoint, FedericoSilo};
use libp2p::{Multiaddr, PeerId, Swarm, SwarmBuilder, noise, tcp, yamux};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::time::Duration;
use tracing::{info, warn};

/// This node's id in the manifest, checked against its key.
pub(super) fn member_of(
    cfg: &NodeConfig,
    manifest: &Manifest,
    peer_id: PeerId,
) -> Result<NodeId, NodeError> {
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
    Ok(me)
}

/// The silo's data: its shard, or the data set the config names.
pub(super) fn load_data(cfg: &NodeConfig, me: NodeId) -> Result<ClientData, NodeError> {
    Ok(match &cfg.data.shard {
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
        None => {
            let data = cfg.data.load()?;
            if cfg.data.scale.is_none() {
                warn_unscaled(cfg, &data.train);
            }
            data
        }
    })
}

/// A CSV silo without the federation's `data.scale` whose columns are plainly in their own
/// units (a mean or a standard deviation above 10) trains badly, and every model mixed with
/// it too (`docs/notes/quality-history.md`, "Own data in its own units"): say so, naming the
/// column.
fn warn_unscaled(cfg: &NodeConfig, train: &crate::learn::Dataset) {
    if cfg.data.format != Some(crate::net::config::DataFormat::Csv) {
        return;
    }
    let Some(fit) = crate::learn::FeatureScale::fit(&[train]) else {
        return;
    };
    if let Some((column, (mean, std))) = fit
        .mean
        .iter()
        .zip(&fit.std)
        .enumerate()
        .find(|(_, (m, s))| m.abs() > 10.0 || **s > 10.0)
    {
        warn!(
            column,
            mean = %format!("{mean:.3}"),
            std = %format!("{std:.3}"),
            file = %cfg.data.train[0].display(),
            "CSV columns in their own units and no data.scale: models train badly on them; \
             give the federation's scale.json (`federico scale summarize` at every silo, then \
             `federico scale combine`; docs/data.md)"
        );
    }
}

/// The node's state: from its checkpoint when there is one, else fresh (from `start`, or the
/// seeded initialisation).
pub(super) fn resume(
    cfg: &NodeConfig,
    manifest: &Manifest,
    me: NodeId,
    peer_id: PeerId,
    ckpt_path: &std::path::Path,
    learner: &Learner,
    start: Option<Vec<f32>>,
) -> Result<Start, NodeError> {
    let num_params = learner.num_params();
    if let Some(c) = Checkpoint::resume(ckpt_path).map_err(fatal)? {
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
        if cfg.rounds > 0 && c.round >= cfg.rounds {
            info!(
                "this node already finished its {} rounds: nothing to do. To start a new run, \
                 remove {} or point state_dir elsewhere",
                cfg.rounds,
                cfg.state_dir.display()
            );
        }
        let mut adam = c.adam;
        if adam.repair() {
            warn!(
                "the checkpoint's optimizer state was not finite (an extreme gradient that an \
                 older federico took froze this model): its moments are reset, the \
                 model is kept and learns again"
            );
        }
        return Ok(Start {
            peer: c.peer,
            silo: FedericoSilo::new(c.params, adam, c.version),
            round: c.round,
            ledger: c.privacy,
        });
    }
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
    let ids = (0..manifest.members.len() as u32).map(NodeId);
    let peer = Peer::new(
        me,
        ids,
        cfg.federico.clone(),
        stream_seed(cfg.seed, me, Stream::Sampling),
    );
    let adam = Adam::new(num_params, cfg.train.lr as f32);
    Ok(Start {
        peer,
        silo: FedericoSilo::new(params, adam, 0),
        round: 0,
        ledger: None,
    })
}

/// `silo` under the config's `[privacy]` (secret noise unless it says `"seeded"`), carrying on
/// from the checkpoint's ledger after `round` rounds: what was spent before a restart stays
/// spent. A checkpoint whose ledger the config no longer asks for, or a resumed run that had
/// none, is said in the log.
pub(super) fn private(
    cfg: &NodeConfig,
    silo: FedericoSilo,
    me: NodeId,
    n_train: usize,
    sub_steps: Option<u64>,
    (ledger, round): (Option<crate::privacy::Ledger>, u64),
) -> Result<FedericoSilo, NodeError> {
    let Some(p) = &cfg.privacy else {
        if ledger.is_some() {
            warn!(
                "the checkpoint holds a privacy ledger but this config has no [privacy]: from \
                 now on this silo's releases are not private"
            );
        }
        return Ok(silo);
    };
    let noise = p.noise.unwrap_or(crate::privacy::NoiseSource::Secret);
    let p = crate::privacy::PrivacyConfig {
        noise: Some(noise),
        ..p.clone()
    };
    let mut silo = silo.with_privacy(Some(&p), cfg.seed, me, n_train, (cfg.rounds, sub_steps));
    match ledger {
        Some(l) => silo.resume_privacy(l, round).map_err(fatal)?,
        None if round > 0 => warn!(
            round,
            "[privacy] starts now: the {round} rounds before this restart were not private"
        ),
        None => {}
    }
    if let Some((ledger, sigma, _)) = silo.privacy() {
        let b = ledger.budget();
        info!(
            epsilon_budget = b.epsilon,
            delta = %format!("{:.1e}", b.delta),
            epsilon_spent = %format!("{:.3}", ledger.epsilon()),
            noise_multiplier = %format!("{sigma:.3}"),
            noise = ?noise,
            "differential privacy"
        );
    }
    Ok(silo)
}

/// The node's swarm, listening, with the members' and bootstrap addresses known; its message
/// bound and receive budget sized for a model of `num_params` parameters (unless the config sets
/// them), and said in the log.
pub(super) fn build_swarm(
    cfg: &NodeConfig,
    manifest: &Manifest,
    me: NodeId,
    key: libp2p::identity::Keypair,
    registry: &mut prometheus_client::registry::Registry,
    metrics: &Metrics,
    num_params: usize,
) -> Result<Swarm<Behaviour>, NodeError> {
    let allowed = (!manifest.open).then(|| manifest.members.iter().map(|m| m.peer_id).collect());
    let max_message = cfg.max_message_for(num_params);
    let budget = cfg.receive_budget_for(num_params);
    let others = manifest
        .members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != me.index())
        .map(|(_, m)| m.peer_id);
    let limits = Limits::node(budget).with_floors(others, num_params);
    let kib = |b: u64| b.div_ceil(1024);
    info!(
        max_message_kib = kib(max_message),
        max_message_from = if cfg.max_message_mib.is_some() {
            "config"
        } else {
            "model size"
        },
        receive_budget_kib = kib(budget),
        peer_share_kib = kib(budget / intake::PEER_SHARE),
        member_floor_kib = kib(limits.floor),
        streams_per_peer = intake::STREAMS_PER_PEER,
        "message bounds"
    );
    if max_message > budget {
        warn!(
            max_message_kib = kib(max_message),
            receive_budget_kib = kib(budget),
            "max_message_mib is above receive_budget_mib: messages larger than the budget will \
             be refused (over_budget)"
        );
    }
    if !limits.floors_hold_a_message(num_params) {
        let members = limits.floored.len() as u64;
        warn!(
            receive_budget_kib = kib(budget),
            member_floor_kib = kib(limits.floor),
            largest_message_kib = kib(protocol::largest_message(num_params)),
            needed_mib = (2 * members * protocol::message_bound(num_params)).div_ceil(1 << 20),
            "the receive budget cannot set a message aside for every member: members that fill \
             it together could get others' messages refused; raise receive_budget_mib"
        );
    }
    let intake = Intake::new(limits, metrics.clone());
    intake.remember_blocks(cfg.state_dir.join("blocks.json"));
    let behaviour_cfg = BehaviourConfig {
        allowed,
        relays: manifest.relays.iter().map(|r| r.peer_id).collect(),
        max_message,
        intake,
        limits: limits::caps(
            manifest.members.len() + manifest.relays.len(),
            manifest.open,
        ),
        request_timeout: cfg.model_deadline() + cfg.gradient_deadline(),
        mdns: cfg.mdns,
    };
    let behaviour_metrics = metrics.clone();
    let mut swarm = SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            || {
                let mut c = yamux::Config::default();
                c.set_max_num_streams(intake::YAMUX_STREAMS);
                c
            },
        )
        .map_err(fatal)?
        .with_quic()
        .with_relay_client(noise::Config::new, || {
            let mut c = yamux::Config::default();
            c.set_max_num_streams(intake::YAMUX_STREAMS);
            c
        })
        .map_err(fatal)?
        .with_bandwidth_metrics(registry)
        .with_behaviour(|key, relay_client| {
            Behaviour::new(key, relay_client, behaviour_cfg, behaviour_metrics)
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })
        .map_err(fatal)?
        // Rounds must not drop connections: idle means "between rounds" here.
        // (Members only: the allow list refuses anyone else, the connection caps bound the
        // rest.)
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(3600)))
        // A socket that never finishes its handshake holds a descriptor this long at most.
        .with_connection_timeout(limits::HANDSHAKE_TIMEOUT)
        .build();
    for a in &cfg.listen {
        let addr: Multiaddr = a.parse().map_err(fatal)?;
        listen_on(&mut swarm, &addr).map_err(fatal)?;
    }
    for (i, m) in manifest.members.iter().enumerate() {
        if i == me.index() {
            continue;
        }
        for a in &m.addrs {
            swarm.add_peer_address(m.peer_id, a.clone());
            swarm.behaviour_mut().kad.add_address(&m.peer_id, a.clone());
        }
    }
    // Every member is also reachable through every relay (the driver reserves this node's
    // slot on each, `reach`).
    for r in &manifest.relays {
        swarm.add_peer_address(r.peer_id, r.addr.clone());
        for (i, m) in manifest.members.iter().enumerate() {
            if i != me.index() {
                let circuit = r.circuit_to(m.peer_id);
                swarm.add_peer_address(m.peer_id, circuit.clone());
                swarm.behaviour_mut().kad.add_address(&m.peer_id, circuit);
            }
        }
    }
    for b in &cfg.bootstrap {
        let addr: Multiaddr = b.parse().map_err(fatal)?;
        if let Some(libp2p::multiaddr::Protocol::P2p(p)) = addr.iter().last() {
            swarm.add_peer_address(p, addr.clone());
            swarm.behaviour_mut().kad.add_address(&p, addr.clone());
        }
    }
    Ok(swarm)
}

/// The control channel of a swarm's fault schedule (only with the token it wrote).
pub(super) async fn start_control(
    cfg: &NodeConfig,
) -> Result<tokio::sync::mpsc::Receiver<control::Request>, NodeError> {
    let (control_tx, control_rx) = tokio::sync::mpsc::channel::<control::Request>(16);
    let Some(c) = &cfg.control else {
        return Ok(control_rx);
    };
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
    Ok(control_rx)
}
