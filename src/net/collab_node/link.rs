//! The FedCollab node's event loop: owns its swarm (the manifest's allow list,
//! `/federico/coord/2` to the coordinator and `/federico/collab/2` between silos), carries the
//! node's requests out and the answers back through its [`Client`], serves the coalition's
//! model pulls (held until the round is trained) and hands pair requests to the
//! discriminator thread.
//! Owns: the node's behaviour (allow list, connection caps, receive budget, bad-frame
//! blocking), the models it publishes for its coalition and who fetched
//! them, and the requests the node makes with their retry budgets ([`coord_within`],
//! [`peer_within`]).
//! Must not: step a discriminator or train (the threads do), or decide what an answer means.

use crate::net::behaviour::{Codec, CoordCodec, Exchange, Members, coordination_swarm, members};
use crate::net::client::{Client, ExchangeError, Pending, Reply, route_coord_event};
use crate::net::intake::{Blocks, Intake, Limits};
use crate::net::metrics::Metrics;
use crate::protocol::{
    COLLAB_PROTOCOL, COORD_PROTOCOL, CollabRequest, CollabResponse, CoordRequest, CoordResponse,
};
use libp2p::futures::StreamExt;
use libp2p::futures::stream::FuturesUnordered;
use libp2p::request_response::{self as rr, InboundRequestId, ProtocolSupport, ResponseChannel};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::warn;

/// Trained models of the last rounds a silo keeps for its coalition's pulls.
const KEEP_ROUNDS: usize = 8;

/// Room for pair requests waiting for the discriminator thread (each partner has one request
/// in flight at a time, a retransmission at most besides).
pub(super) const DISC_QUEUE: usize = 64;

/// How often an unreachable coordinator is asked again within a budget.
const COORD_RETRY: Duration = Duration::from_millis(500);
/// How often a peer that failed or is not ready is asked again within a budget.
const PEER_RETRY: Duration = Duration::from_millis(200);

/// What the node's tasks ask of the event loop.
pub(super) enum Cmd {
    Coord(CoordRequest, Reply<CoordResponse>),
    Peer(usize, CollabRequest, Reply<CollabResponse>),
    /// This silo's trained model of an FL round, for its coalition.
    Publish(u64, Arc<Vec<f32>>),
    /// How many peers have fetched this silo's model of a round.
    Served(u64, Reply<usize>),
    /// Where the pair requests go once the discriminator is built.
    DiscServer(SyncSender<DiscJob>),
    /// The silo has its coalition: no pair runs again, the answering thread may end.
    PairsOver,
}

/// The node's handle on its event loop.
pub(super) type Link = Client<Cmd>;

/// Where the event loop sends pair requests.
enum Disc {
    /// No distance plan yet.
    NotYet,
    /// The answering thread.
    Open(SyncSender<DiscJob>),
    /// The silo has its coalition: its pairs are over.
    Over,
}

/// A pair request for the discriminator thread.
pub(super) struct DiscJob {
    pub(super) from: usize,
    pub(super) req: CollabRequest,
    pub(super) reply: oneshot::Sender<CollabResponse>,
}

#[derive(NetworkBehaviour)]
struct CollabBehaviour {
    /// Peers blocked for a while after repeated bad frames (first: refused before the rest
    /// sees the connection).
    blocks: Blocks,
    members: Members,
    limits: libp2p::connection_limits::Behaviour,
    memory: libp2p::memory_connection_limits::Behaviour,
    coord: Exchange<CoordRequest, CoordResponse>,
    collab: Exchange<CollabRequest, CollabResponse>,
    ping: libp2p::ping::Behaviour,
}

/// What the swarm needs besides the key.
pub(super) struct SwarmConfig<'a> {
    pub(super) listen: &'a [String],
    /// Manifest members admitted (`None`: an open federation).
    pub(super) allowed: Option<Vec<PeerId>>,
    pub(super) max_message: u64,
    /// Bytes of frame bodies being received at once, all peers ([`Limits::node`]); every
    /// other silo and the coordinator get a floor of it ([`Limits::with_floors`]).
    pub(super) receive_budget: u64,
    /// The model's size, which the floors are sized for.
    pub(super) num_params: usize,
    /// Bounds one exchange with the coordinator (which holds fetches).
    pub(super) coord_timeout: Duration,
    /// Bounds one exchange with a silo.
    pub(super) peer_timeout: Duration,
    pub(super) coordinator: (PeerId, Vec<Multiaddr>),
    /// The silos by index.
    pub(super) peers: Vec<(PeerId, Vec<Multiaddr>)>,
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
    let me = key.public().to_peer_id();
    let others = sc.peers.iter().map(|p| p.0).chain([sc.coordinator.0]);
    let floored =
        Limits::node(sc.receive_budget).with_floors(others.filter(|p| *p != me), sc.num_params);
    let intake = Intake::new(floored, metrics.clone());
    let behaviour = CollabBehaviour {
        blocks: Blocks::new(intake.clone()),
        members: members(sc.allowed),
        limits,
        memory: crate::net::limits::memory(),
        coord: Exchange::new(
            CoordCodec::with_intake(sc.max_message, metrics.clone(), intake.clone()),
            [(StreamProtocol::new(COORD_PROTOCOL), ProtocolSupport::Full)],
            rr::Config::default().with_request_timeout(sc.coord_timeout),
        ),
        collab: Exchange::new(
            Codec::with_intake(sc.max_message, metrics, intake),
            [(StreamProtocol::new(COLLAB_PROTOCOL), ProtocolSupport::Full)],
            rr::Config::default()
                .with_request_timeout(sc.peer_timeout)
                .with_max_concurrent_streams(1024),
        ),
        ping: libp2p::ping::Behaviour::default(),
    };
    let swarm = coordination_swarm(key, sc.listen, behaviour)?;
    let (link, commands) = Client::new();
    let event_loop = EventLoop {
        swarm,
        coordinator: sc.coordinator,
        peers: sc.peers,
        commands,
        to_coord: Pending::default(),
        to_peer: Pending::default(),
        published: VecDeque::new(),
        held: Vec::new(),
        model_reqs: HashMap::new(),
        served: HashMap::new(),
        disc: Disc::NotYet,
        answers: FuturesUnordered::new(),
    };
    Ok((link, tokio::spawn(event_loop.run())))
}

/// A coordinator request retried every 500 ms while the coordinator is unreachable, until
/// `budget` has passed; refusals are returned.
pub(super) async fn coord_within(
    link: &Link,
    req: &CoordRequest,
    budget: Duration,
) -> Result<CoordResponse, ExchangeError> {
    coord_until(link, req, Instant::now() + budget).await
}

/// [`coord_within`] until `until`.
pub(super) async fn coord_until(
    link: &Link,
    req: &CoordRequest,
    until: Instant,
) -> Result<CoordResponse, ExchangeError> {
    let make = |r| Cmd::Coord(req.clone(), r);
    link.request_until(make, until, COORD_RETRY).await
}

/// A peer request retried every 200 ms on transport failures and "not ready" answers until
/// `budget` has passed.
pub(super) async fn peer_within(
    link: &Link,
    i: usize,
    req: CollabRequest,
    budget: Duration,
) -> Result<CollabResponse, ExchangeError> {
    let make = |r| Cmd::Peer(i, req.clone(), r);
    link.request_until(make, Instant::now() + budget, PEER_RETRY)
        .await
}

type Answer =
    Pin<Box<dyn Future<Output = (ResponseChannel<CollabResponse>, CollabResponse)> + Send>>;

/// Owns the swarm and what it serves.
struct EventLoop {
    swarm: libp2p::Swarm<CollabBehaviour>,
    coordinator: (PeerId, Vec<Multiaddr>),
    peers: Vec<(PeerId, Vec<Multiaddr>)>,
    commands: mpsc::Receiver<Cmd>,
    to_coord: Pending<CoordResponse>,
    to_peer: Pending<CollabResponse>,
    /// This silo's models of its last rounds.
    published: VecDeque<(u64, Arc<Vec<f32>>)>,
    /// Pulls of a round not trained yet.
    held: Vec<(u64, ResponseChannel<CollabResponse>)>,
    /// A model counts as served once its response went out (not when it was queued), so a
    /// silo does not leave while its last model is still on its way.
    model_reqs: HashMap<InboundRequestId, (u64, PeerId)>,
    served: HashMap<u64, HashSet<PeerId>>,
    disc: Disc,
    /// The discriminator thread's answers on their way out.
    answers: FuturesUnordered<Answer>,
}

impl EventLoop {
    /// Runs until the client is gone.
    async fn run(mut self) {
        loop {
            tokio::select! {
                cmd = self.commands.recv() => match cmd {
                    None => return,
                    Some(cmd) => self.on_command(cmd),
                },
                Some((channel, resp)) = self.answers.next(), if !self.answers.is_empty() => {
                    self.respond(channel, resp);
                }
                ev = self.swarm.select_next_some() => match ev {
                    SwarmEvent::Behaviour(CollabBehaviourEvent::Coord(ev)) => {
                        let coord = &mut self.swarm.behaviour_mut().coord;
                        route_coord_event(ev, &mut self.to_coord, coord);
                    }
                    SwarmEvent::Behaviour(CollabBehaviourEvent::Collab(ev)) => {
                        if let Some(ev) = self.to_peer.route(ev) {
                            self.on_collab(ev);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn respond(&mut self, channel: ResponseChannel<CollabResponse>, resp: CollabResponse) {
        let _ = self
            .swarm
            .behaviour_mut()
            .collab
            .send_response(channel, resp);
    }

    fn refuse(&mut self, channel: ResponseChannel<CollabResponse>, reason: String) {
        self.respond(channel, CollabResponse::Error { reason });
    }

    fn on_command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Coord(req, reply) => {
                let (coordinator, addrs) = &self.coordinator;
                for a in addrs {
                    self.swarm.add_peer_address(*coordinator, a.clone());
                }
                let coord = &mut self.swarm.behaviour_mut().coord;
                self.to_coord.send(coord, coordinator, req, reply);
            }
            Cmd::Peer(i, req, reply) => {
                let Some((peer, addrs)) = self.peers.get(i) else {
                    let _ = reply.send(Err(ExchangeError::NoSilo(i)));
                    return;
                };
                for a in addrs {
                    self.swarm.add_peer_address(*peer, a.clone());
                }
                let collab = &mut self.swarm.behaviour_mut().collab;
                self.to_peer.send(collab, peer, req, reply);
            }
            Cmd::Publish(round, params) => self.publish(round, params),
            Cmd::Served(round, reply) => {
                let _ = reply.send(Ok(self.served.get(&round).map_or(0, HashSet::len)));
            }
            Cmd::DiscServer(tx) => self.disc = Disc::Open(tx),
            // Dropping the sender ends the answering thread.
            Cmd::PairsOver => self.disc = Disc::Over,
        }
    }

    /// Keeps this silo's model of `round` and answers the pulls held for it.
    fn publish(&mut self, round: u64, params: Arc<Vec<f32>>) {
        self.published.push_back((round, params.clone()));
        while self.published.len() > KEEP_ROUNDS {
            self.published.pop_front();
        }
        for (r, channel) in std::mem::take(&mut self.held) {
            if r == round {
                let params = params.clone();
                self.respond(channel, CollabResponse::Model { round, params });
            } else if r < round && !self.published.iter().any(|(p, _)| *p == r) {
                // A round this silo will not publish: say so now.
                self.refuse(
                    channel,
                    format!("round {r} is not kept here (now at {round})"),
                );
            } else {
                self.held.push((r, channel));
            }
        }
    }

    /// An event of the collab exchange that is not an answer to this silo's requests.
    fn on_collab(&mut self, ev: rr::Event<CollabRequest, CollabResponse>) {
        match ev {
            rr::Event::ResponseSent { request_id, .. } => {
                if let Some((round, peer)) = self.model_reqs.remove(&request_id) {
                    self.served.entry(round).or_default().insert(peer);
                }
            }
            rr::Event::InboundFailure { request_id, .. } => {
                self.model_reqs.remove(&request_id);
            }
            rr::Event::Message {
                peer,
                message:
                    rr::Message::Request {
                        request,
                        channel,
                        request_id,
                    },
                ..
            } => {
                let Some(from) = self.peers.iter().position(|(p, _)| *p == peer) else {
                    warn!(%peer, "a collab request from a member that is not a silo");
                    self.refuse(channel, "not a silo of this run".into());
                    return;
                };
                match request {
                    CollabRequest::Model { round } => {
                        self.serve_model(peer, round, channel, request_id)
                    }
                    req => self.hand_to_disc(from, req, channel),
                }
            }
            _ => {}
        }
    }

    /// A coalition member's pull of this silo's model of `round`: answered now, held until
    /// the round is trained, or refused when the round is no longer kept.
    fn serve_model(
        &mut self,
        peer: PeerId,
        round: u64,
        channel: ResponseChannel<CollabResponse>,
        request_id: InboundRequestId,
    ) {
        if let Some((_, p)) = self.published.iter().find(|(r, _)| *r == round) {
            let params = p.clone();
            self.model_reqs.insert(request_id, (round, peer));
            self.respond(channel, CollabResponse::Model { round, params });
        } else if self.published.back().is_none_or(|(r, _)| round > *r) {
            self.model_reqs.insert(request_id, (round, peer));
            self.held.push((round, channel));
        } else {
            let latest = self.published.back().map(|(r, _)| *r);
            self.refuse(
                channel,
                format!("round {round} is no longer kept (latest {latest:?})"),
            );
        }
    }

    /// A pair request: to the discriminator thread, whose answer goes out when it comes.
    fn hand_to_disc(
        &mut self,
        from: usize,
        req: CollabRequest,
        channel: ResponseChannel<CollabResponse>,
    ) {
        let over = || CollabResponse::Error {
            reason: "this silo's pairs are over".into(),
        };
        let tx = match &self.disc {
            Disc::Open(tx) => tx,
            Disc::NotYet => {
                let reason = "no distance plan yet".into();
                self.respond(channel, CollabResponse::NotReady { reason });
                return;
            }
            Disc::Over => return self.respond(channel, over()),
        };
        let (otx, orx) = oneshot::channel();
        match tx.try_send(DiscJob {
            from,
            req,
            reply: otx,
        }) {
            Ok(()) => self.answers.push(Box::pin(async move {
                (channel, orx.await.unwrap_or_else(|_| over()))
            })),
            Err(TrySendError::Full(_)) => {
                let reason = "the discriminator is busy".into();
                self.respond(channel, CollabResponse::NotReady { reason });
            }
            Err(TrySendError::Disconnected(_)) => self.respond(channel, over()),
        }
    }
}
