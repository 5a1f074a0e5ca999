//! `federico relay`: a circuit relay (libp2p's relay v2) for silos that cannot accept
//! connections (behind NAT or a firewall). Each silo reserves a slot on the manifest's relays and
//! the others reach it through them; hole punching (DCUtR, in the nodes) then turns a relayed
//! connection into a direct one where the NATs allow it.
//!
//! Owns: the relay process: its swarm (TCP and QUIC, the nodes' transports), who may use it (the
//! manifest's members only, unless the federation is open), its circuit limits, and what it
//! prints for the manifest.
//! Must not: hold data, train, or speak the federation's protocols: it forwards encrypted bytes
//! between members (Noise runs end to end through it) and nothing else.

use super::behaviour::{Members, coordination_swarm, members};
use super::identity::{self, Manifest};
use anyhow::{Context, bail};
use libp2p::futures::StreamExt;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, connection_limits, identify, ping, relay};
use std::path::PathBuf;
use std::time::Duration;
use tracing::{debug, info, warn};

/// What `federico relay` runs with.
#[derive(Clone, Debug)]
pub struct RelayOptions {
    /// Its key (`federico keygen`): its peer ID goes in the manifest's `relays`.
    pub key: PathBuf,
    /// The federation's manifest: only its members may reserve and open circuits.
    pub manifest: PathBuf,
    /// Where it listens (`/ip4/0.0.0.0/tcp/4100`).
    pub listen: Vec<String>,
    /// The addresses the silos dial it at (its public address): advertised in every
    /// reservation. Without them, the listen addresses that name a concrete IP.
    pub external: Vec<String>,
}

/// The relay's swarm.
#[derive(NetworkBehaviour)]
struct RelayBehaviour {
    /// Only manifest members (and so only their circuits) are admitted.
    members: Members,
    limits: connection_limits::Behaviour,
    relay: relay::Behaviour,
    /// Tells each silo the address it is seen at (hole punching needs it).
    identify: identify::Behaviour,
    ping: ping::Behaviour,
}

/// Circuit limits for a federation of `n` members. Only members can reserve or open circuits,
/// so a circuit carries the federation's models for as long as the run needs (no byte limit;
/// libp2p's default stops a circuit after 128 KiB and 2 minutes, made for hole-punching
/// handshakes only). A circuit cut at its time limit is dialled again by the nodes.
fn relay_config(n: usize) -> relay::Config {
    relay::Config {
        max_reservations: 2 * n + 16,
        max_reservations_per_peer: 4,
        max_circuits: n * n + 16,
        max_circuits_per_peer: 2 * n + 4,
        max_circuit_duration: Duration::from_secs(24 * 3600),
        max_circuit_bytes: 0,
        ..relay::Config::default()
    }
}

/// The addresses silos dial: `external`, else the concrete listen addresses.
fn advertised(opts: &RelayOptions) -> anyhow::Result<Vec<Multiaddr>> {
    let parse = |a: &String, what: &str| -> anyhow::Result<Multiaddr> {
        a.parse()
            .with_context(|| format!("{what} address {a:?} is not a multiaddr"))
    };
    if !opts.external.is_empty() {
        return opts.external.iter().map(|a| parse(a, "external")).collect();
    }
    let concrete: Vec<Multiaddr> = opts
        .listen
        .iter()
        .map(|a| parse(a, "listen"))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .filter(|a| match a.iter().next() {
            Some(Protocol::Ip4(ip)) => !ip.is_unspecified(),
            Some(Protocol::Ip6(ip)) => !ip.is_unspecified(),
            _ => true,
        })
        .collect();
    if concrete.is_empty() {
        bail!(
            "the relay listens on no concrete address ({}): give --external with the address \
             silos dial it at, e.g. --external /ip4/203.0.113.7/tcp/4100",
            opts.listen.join(", ")
        );
    }
    Ok(concrete)
}

/// Runs the relay until `shutdown` resolves.
pub async fn run(
    opts: RelayOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let key = identity::load_key(&opts.key)?;
    let manifest = Manifest::load(&opts.manifest)?;
    let me = key.public().to_peer_id();
    if manifest.node_of(&me).is_some() {
        bail!(
            "the relay's key {} is a member's key in {}: give the relay its own key (federico \
             keygen --out keys/relay.key)",
            opts.key.display(),
            opts.manifest.display()
        );
    }
    let external = advertised(&opts)?;
    let n = manifest.members.len();
    let allowed = (!manifest.open).then(|| manifest.members.iter().map(|m| m.peer_id).collect());
    let behaviour = RelayBehaviour {
        members: members(allowed),
        limits: super::limits::behaviour(n, manifest.open),
        relay: relay::Behaviour::new(me, relay_config(super::limits::sized_for(n, manifest.open))),
        identify: identify::Behaviour::new(identify::Config::new(
            "/federico/1".into(),
            key.public(),
        )),
        ping: ping::Behaviour::default(),
    };
    let mut swarm = coordination_swarm(key, &opts.listen, behaviour)?;
    for a in &external {
        swarm.add_external_address(a.clone());
        println!(
            "relay address for the manifest: \"{}\"",
            a.clone().with(Protocol::P2p(me))
        );
    }
    info!(peer = %me, members = n, open = manifest.open, "relay started");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            event = swarm.select_next_some() => match event {
                SwarmEvent::NewListenAddr { address, .. } => info!(%address, "listening"),
                SwarmEvent::Behaviour(RelayBehaviourEvent::Relay(e)) => log_relay_event(e),
                SwarmEvent::IncomingConnectionError { send_back_addr, error, .. } => {
                    debug!(from = %send_back_addr, "refused a connection: {error}");
                }
                _ => {}
            },
        }
    }
}

fn log_relay_event(e: relay::Event) {
    use relay::Event as E;
    match e {
        E::ReservationReqAccepted {
            src_peer_id,
            renewed,
        } => {
            if !renewed {
                info!(peer = %src_peer_id, "reservation accepted");
            }
        }
        E::ReservationReqDenied { src_peer_id, .. } => {
            warn!(peer = %src_peer_id, "reservation denied (limits)");
        }
        E::ReservationTimedOut { src_peer_id } => {
            info!(peer = %src_peer_id, "reservation expired");
        }
        E::CircuitReqAccepted {
            src_peer_id,
            dst_peer_id,
        } => info!(from = %src_peer_id, to = %dst_peer_id, "circuit opened"),
        E::CircuitReqDenied {
            src_peer_id,
            dst_peer_id,
            ..
        } => {
            warn!(from = %src_peer_id, to = %dst_peer_id, "circuit denied (limits or no reservation)")
        }
        E::CircuitClosed {
            src_peer_id,
            dst_peer_id,
            error,
        } => match error {
            Some(e) => info!(from = %src_peer_id, to = %dst_peer_id, "circuit closed: {e}"),
            None => debug!(from = %src_peer_id, to = %dst_peer_id, "circuit closed"),
        },
        other => debug!("relay: {other:?}"),
    }
}
