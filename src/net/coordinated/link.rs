//! The coordinated node's event loop: owns its swarm (the manifest's allow list and
//! `/federico/coord/2`) and carries the round loop's requests to the coordinator, through the
//! node's [`Client`].
//! Owns: the node's behaviour (allow list, connection caps, receive budget, bad-frame
//! blocking), dialing the coordinator, and one exchange with it ([`ask`]).
//! Must not: decide what the answers mean, when to ask again or for how long (the round
//! engine, [`crate::coord::member`], does) or train.

use crate::net::behaviour::{CoordCodec, Exchange, Members, coordination_swarm, members};
use crate::net::client::{Client, ExchangeError, Pending, Reply, route_coord_event};
use crate::net::intake::{Blocks, Intake, Limits};
use crate::net::metrics::Metrics;
use crate::protocol::{COORD_PROTOCOL, CoordRequest, CoordResponse};
use libp2p::futures::StreamExt;
use libp2p::request_response::{self as rr, ProtocolSupport};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use std::time::Duration;
use tokio::sync::mpsc;

/// One request to the coordinator and where its answer goes.
pub(super) type Command = (CoordRequest, Reply<CoordResponse>);

/// The round loop's handle on the event loop.
pub(super) type Link = Client<Command>;

#[derive(NetworkBehaviour)]
struct NodeBehaviour {
    /// Peers blocked for a while after repeated bad frames (first: refused before the rest
    /// sees the connection).
    blocks: Blocks,
    members: Members,
    limits: libp2p::connection_limits::Behaviour,
    memory: libp2p::memory_connection_limits::Behaviour,
    coord: Exchange<CoordRequest, CoordResponse>,
    ping: libp2p::ping::Behaviour,
}

/// What the swarm needs besides the key.
pub(super) struct SwarmConfig<'a> {
    pub(super) listen: &'a [String],
    /// Manifest members admitted (`None`: an open federation).
    pub(super) allowed: Option<Vec<PeerId>>,
    pub(super) max_message: u64,
    /// Bytes of frame bodies being received at once, all peers ([`Limits::node`]); the
    /// coordinator gets a floor of it ([`Limits::with_floors`]), so members cannot fill it
    /// against its answers.
    pub(super) receive_budget: u64,
    /// The model's size, which the floor is sized for.
    pub(super) num_params: usize,
    /// Bounds one exchange with the coordinator.
    pub(super) request_timeout: Duration,
    pub(super) coordinator: PeerId,
    pub(super) coord_addrs: Vec<Multiaddr>,
}

/// Builds the swarm and starts its event loop on its own task: the client, and the task
/// (aborted once the node is done).
pub(super) fn start(
    key: libp2p::identity::Keypair,
    sc: SwarmConfig<'_>,
) -> anyhow::Result<(Link, tokio::task::JoinHandle<()>)> {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let limits = crate::net::limits::behaviour(
        sc.allowed.as_ref().map_or(0, Vec::len),
        sc.allowed.is_none(),
    );
    let floored = Limits::node(sc.receive_budget).with_floors([sc.coordinator], sc.num_params);
    let intake = Intake::new(floored, metrics.clone());
    let behaviour = NodeBehaviour {
        blocks: Blocks::new(intake.clone()),
        members: members(sc.allowed),
        limits,
        memory: crate::net::limits::memory(),
        coord: Exchange::new(
            CoordCodec::with_intake(sc.max_message, metrics, intake),
            [(StreamProtocol::new(COORD_PROTOCOL), ProtocolSupport::Full)],
            rr::Config::default().with_request_timeout(sc.request_timeout),
        ),
        ping: libp2p::ping::Behaviour::default(),
    };
    let swarm = coordination_swarm(key, sc.listen, behaviour)?;
    let (link, commands) = Client::new();
    let event_loop = EventLoop {
        swarm,
        coordinator: sc.coordinator,
        addrs: sc.coord_addrs,
        commands,
        pending: Pending::default(),
    };
    Ok((link, tokio::spawn(event_loop.run())))
}

/// Owns the swarm: sends requests to the coordinator and routes the answers back.
struct EventLoop {
    swarm: libp2p::Swarm<NodeBehaviour>,
    coordinator: PeerId,
    addrs: Vec<Multiaddr>,
    commands: mpsc::Receiver<Command>,
    pending: Pending<CoordResponse>,
}

impl EventLoop {
    /// Runs until the client is gone.
    async fn run(mut self) {
        loop {
            tokio::select! {
                cmd = self.commands.recv() => {
                    let Some((req, reply)) = cmd else { return };
                    for a in &self.addrs {
                        self.swarm.add_peer_address(self.coordinator, a.clone());
                    }
                    let coord = &mut self.swarm.behaviour_mut().coord;
                    self.pending.send(coord, &self.coordinator, req, reply);
                }
                ev = self.swarm.select_next_some() => {
                    if let SwarmEvent::Behaviour(NodeBehaviourEvent::Coord(ev)) = ev {
                        route_coord_event(ev, &mut self.pending, &mut self.swarm.behaviour_mut().coord);
                    }
                }
            }
        }
    }
}

/// One request, answered within `limit`.
pub(super) async fn ask(
    link: &Link,
    req: CoordRequest,
    limit: Duration,
) -> Result<CoordResponse, ExchangeError> {
    link.request_within(|r| (req, r), limit).await
}
