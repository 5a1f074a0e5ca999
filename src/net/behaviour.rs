//! The libp2p behaviour of a node: membership (allow list), partitions (block list), connection
//! caps, the two FedeRiCo protocols with our size-capped bincode codec, identify, Kademlia,
//! ping and optional mDNS.
//! Owns: how the protocols are framed and bounded (each read through the node's
//! [`Intake`]: its receive budget and per-peer stream bound), refusing (logging with the sender,
//! counting, striking) frames that are not messages, and how the behaviour is assembled; and the swarm of the
//! coordinator-mode processes (a coordinator, a coordinated node), which carries their own
//! behaviours over the same transports and allow list.
//! Must not: interpret messages (that is the round driver) or train.

use super::intake::{Blocks, Intake};
use super::metrics::Metrics;
use crate::protocol::{
    self, CoordRequest, CoordResponse, GradientRequest, GradientResponse, ModelRequest,
    ModelResponse,
};
use libp2p::core::Endpoint;
use libp2p::core::transport::PortUse;
use libp2p::futures::{AsyncRead, AsyncWrite, AsyncWriteExt};
use libp2p::request_response::{self as rr, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::{
    ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm,
};
use libp2p::{
    Multiaddr, PeerId, StreamProtocol, allow_block_list, connection_limits, dcutr, identify,
    identity, kad, mdns, memory_connection_limits, ping, relay,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

/// How often a node pings each connected peer: libp2p's default. Every second made the test
/// bed's NATs get their mappings back at once after a flush (0 rounds at the deadline instead
/// of 2 to 8), but the relay-kill test then waited 8 and 18 rounds in 2 of 4 runs, so it is
/// not the default until that is understood (`tests/faults_swarm.rs`).
pub(crate) const PING_INTERVAL: Duration = Duration::from_secs(15);
/// The manifest's allow list: members are admitted, anyone else is refused at connection; off
/// (`None`) for an open federation.
pub(crate) type Members = Toggle<allow_block_list::Behaviour<allow_block_list::AllowedPeers>>;

/// The allow list of `allowed` (`None`: open).
pub(crate) fn members(allowed: Option<Vec<PeerId>>) -> Members {
    allowed
        .map(|ids| {
            let mut b = allow_block_list::Behaviour::<allow_block_list::AllowedPeers>::default();
            for id in ids {
                b.allow_peer(id);
            }
            b
        })
        .into()
}

/// A coordinator-mode process's swarm: TCP (Noise, Yamux) and QUIC as the nodes use, with the
/// nodes' bound on streams per connection, connections kept while idle (rounds may be far
/// apart), handshakes bounded by
/// [`limits::HANDSHAKE_TIMEOUT`](super::limits::HANDSHAKE_TIMEOUT), listening on `listen`.
/// The behaviour carries its own connection caps ([`super::limits::behaviour`]) and, through
/// [`Intake`] and [`Blocks`], the receive budget and bad-frame blocking of
/// [`Limits::coordinator`](super::intake::Limits::coordinator) or
/// [`Limits::node`](super::intake::Limits::node).
pub(crate) fn coordination_swarm<B: NetworkBehaviour>(
    key: identity::Keypair,
    listen: &[String],
    behaviour: B,
) -> anyhow::Result<libp2p::Swarm<B>> {
    let mut swarm = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_tcp(
            libp2p::tcp::Config::default().nodelay(true),
            libp2p::noise::Config::new,
            || {
                let mut c = libp2p::yamux::Config::default();
                c.set_max_num_streams(super::intake::YAMUX_STREAMS);
                c
            },
        )?
        .with_quic()
        .with_behaviour(|_| behaviour)?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(3600)))
        .with_connection_timeout(super::limits::HANDSHAKE_TIMEOUT)
        .build();
    for a in listen {
        let addr: Multiaddr = a
            .parse()
            .map_err(|e| anyhow::anyhow!("listen address {a:?}: {e}"))?;
        listen_on(&mut swarm, &addr).map_err(|e| anyhow::anyhow!(e))?;
    }
    Ok(swarm)
}

/// Listens on `addr`, refusing a TCP port that another process already listens on.
///
/// libp2p's TCP transport sets `SO_REUSEPORT` on its listeners, so on Linux a second federico
/// process listening on the same port *succeeds* and the kernel splits the connections between
/// the two. A plain bind (no `SO_REUSEPORT`) fails while any socket listens there: it is tried
/// first and dropped at once (two processes started in the same instant can still both pass;
/// a node's `state_dir` lock stops two copies of one silo).
pub(crate) fn listen_on<B: NetworkBehaviour>(
    swarm: &mut libp2p::Swarm<B>,
    addr: &Multiaddr,
) -> Result<(), String> {
    use libp2p::multiaddr::Protocol;
    let mut parts = addr.iter();
    let ip: Option<std::net::IpAddr> = match parts.next() {
        Some(Protocol::Ip4(a)) => Some(a.into()),
        Some(Protocol::Ip6(a)) => Some(a.into()),
        _ => None,
    };
    if let (Some(ip), Some(Protocol::Tcp(port))) = (ip, parts.next())
        && port != 0
        && let Err(e) = std::net::TcpListener::bind((ip, port))
    {
        return Err(listen_failed(addr, libp2p::TransportError::Other(e)));
    }
    swarm
        .listen_on(addr.clone())
        .map(drop)
        .map_err(|e| listen_failed(addr, e))
}

/// Why listening on `addr` failed, in words. libp2p's `TransportError::Other` displays as
/// nothing, so the reason is taken from the error inside, with a hint for a port in use.
pub(crate) fn listen_failed(addr: &Multiaddr, e: libp2p::TransportError<std::io::Error>) -> String {
    match e {
        libp2p::TransportError::MultiaddrNotSupported(a) => {
            format!("listen on {addr}: address not supported ({a})")
        }
        libp2p::TransportError::Other(io) if io.kind() == std::io::ErrorKind::AddrInUse => {
            format!(
                "listen on {addr}: {io}: another process (another federico node?) holds that \
                 port; stop it or choose a free port in `listen`"
            )
        }
        libp2p::TransportError::Other(io) => format!("listen on {addr}: {io}"),
    }
}

/// Length-prefixed bincode-2 frames with a bound checked before allocation and bodies buffered
/// from the [`Intake`]'s budget; counts the bytes, and hands the frames it refuses to the intake
/// (which logs, counts and strikes).
pub(crate) struct Codec<Req, Resp> {
    max: u64,
    metrics: Metrics,
    /// Shared by every copy of every codec of the process.
    intake: Arc<Intake>,
    /// The remote peer, in the copies that serve a connection (`None` in the behaviour's own).
    peer: Option<PeerId>,
    /// The peer whose connection handler [`Exchange`] is creating right now: the copy made for
    /// that handler takes it (libp2p tells a codec nothing about the streams it reads).
    connecting: Arc<Mutex<Option<PeerId>>>,
    _types: PhantomData<fn() -> (Req, Resp)>,
}

impl<Req, Resp> Clone for Codec<Req, Resp> {
    fn clone(&self) -> Self {
        let connecting = || {
            *self
                .connecting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        Self {
            max: self.max,
            metrics: self.metrics.clone(),
            intake: self.intake.clone(),
            peer: self.peer.or_else(connecting),
            connecting: self.connecting.clone(),
            _types: PhantomData,
        }
    }
}

impl<Req, Resp> Codec<Req, Resp> {
    /// A codec that reads through `intake`.
    pub(crate) fn with_intake(max: u64, metrics: Metrics, intake: Arc<Intake>) -> Self {
        Self {
            max,
            metrics,
            intake,
            peer: None,
            connecting: Arc::default(),
            _types: PhantomData,
        }
    }

    /// Reads one message (a request when `request`). A request is refused at once when its
    /// sender already has as many being read as it may; the body is buffered from the intake's
    /// budget, held until it is decoded. A frame that is refused (over the bounds, oversized,
    /// truncated, not a message) goes to the intake, which logs it with its sender, counts it by
    /// reason and strikes the sender for a bad frame; it comes back as an `InvalidData` error
    /// carrying the [`protocol::WireError`]: for a request libp2p then drops the stream and tells
    /// no one, for a response the round driver sees an outbound failure.
    async fn read<T: AsyncRead + Unpin + Send, M: DeserializeOwned>(
        &self,
        protocol: &StreamProtocol,
        io: &mut T,
        request: bool,
    ) -> io::Result<M> {
        let _slot = match (request, self.peer) {
            (true, Some(peer)) => Some(self.intake.open_read(peer).map_err(|e| {
                self.refused(protocol, &e);
                protocol::invalid(e)
            })?),
            _ => None,
        };
        let budget = self.intake.budget(self.peer);
        let read = protocol::read_frame_within(io, self.max, &budget).await;
        self.intake.show_use();
        let (body, held) = read.inspect_err(|e| {
            if let Some(w) = protocol::rejection(e) {
                self.refused(protocol, w);
            }
        })?;
        self.metrics
            .count_bytes(protocol.as_ref(), "in", body.len() + 8);
        let msg = protocol::decode(&body).map_err(|e| {
            self.refused(protocol, &e);
            protocol::invalid(e)
        });
        drop((body, held));
        self.intake.show_use();
        msg
    }

    fn refused(&self, protocol: &StreamProtocol, e: &protocol::WireError) {
        self.intake.refused(self.peer, protocol.as_ref(), e);
    }

    async fn write<T: AsyncWrite + Unpin + Send, M: Serialize>(
        &self,
        protocol: &StreamProtocol,
        io: &mut T,
        msg: &M,
    ) -> io::Result<()> {
        let frame = protocol::encode(msg).map_err(io::Error::other)?;
        if frame.len() as u64 - 8 > self.max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                protocol::WireError::TooLarge {
                    len: frame.len() as u64 - 8,
                    max: self.max,
                },
            ));
        }
        io.write_all(&frame).await?;
        io.flush().await?;
        self.metrics
            .count_bytes(protocol.as_ref(), "out", frame.len());
        Ok(())
    }
}

impl<Req, Resp> rr::Codec for Codec<Req, Resp>
where
    Req: Serialize + DeserializeOwned + Send + Sync,
    Resp: Serialize + DeserializeOwned + Send + Sync,
{
    type Protocol = StreamProtocol;
    type Request = Req;
    type Response = Resp;

    async fn read_request<T: AsyncRead + Unpin + Send>(
        &mut self,
        p: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<Req> {
        self.read(p, io, true).await
    }

    async fn read_response<T: AsyncRead + Unpin + Send>(
        &mut self,
        p: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<Resp> {
        self.read(p, io, false).await
    }

    async fn write_request<T: AsyncWrite + Unpin + Send>(
        &mut self,
        p: &StreamProtocol,
        io: &mut T,
        r: Req,
    ) -> io::Result<()> {
        self.write(p, io, &r).await
    }

    async fn write_response<T: AsyncWrite + Unpin + Send>(
        &mut self,
        p: &StreamProtocol,
        io: &mut T,
        r: Resp,
    ) -> io::Result<()> {
        self.write(p, io, &r).await
    }
}

pub(crate) type ModelCodec = Codec<ModelRequest, ModelResponse>;
pub(crate) type GradientCodec = Codec<GradientRequest, GradientResponse>;
/// The codec of `/federico/coord/2`: the nodes' size-capped bincode frames.
pub(crate) type CoordCodec = Codec<CoordRequest, CoordResponse>;

/// One FedeRiCo protocol: request-response with our [`Codec`], whose copy for each connection
/// knows the remote peer, so a frame it refuses is logged with its sender. Everything else is
/// libp2p's request-response behaviour, reached through `Deref`.
pub(crate) struct Exchange<Req: Message, Resp: Message> {
    inner: rr::Behaviour<Codec<Req, Resp>>,
    /// Shared with the codec: set while the inner behaviour creates a connection's handler
    /// (which copies the codec).
    connecting: Arc<Mutex<Option<PeerId>>>,
}

/// What the codec can carry.
pub(crate) trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {}
impl<M: Serialize + DeserializeOwned + Send + Sync + 'static> Message for M {}

impl<Req: Message, Resp: Message> Exchange<Req, Resp> {
    pub(crate) fn new(
        codec: Codec<Req, Resp>,
        protocols: impl IntoIterator<Item = (StreamProtocol, ProtocolSupport)>,
        cfg: rr::Config,
    ) -> Self {
        let connecting = codec.connecting.clone();
        Self {
            inner: rr::Behaviour::with_codec(codec, protocols, cfg),
            connecting,
        }
    }

    /// Runs `f` (which creates a connection handler) with `peer` announced to the codec.
    fn for_peer<T>(
        &mut self,
        peer: PeerId,
        f: impl FnOnce(&mut rr::Behaviour<Codec<Req, Resp>>) -> T,
    ) -> T {
        let slot = || {
            self.connecting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        *slot() = Some(peer);
        let out = f(&mut self.inner);
        *self
            .connecting
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        out
    }
}

impl<Req: Message, Resp: Message> Deref for Exchange<Req, Resp> {
    type Target = rr::Behaviour<Codec<Req, Resp>>;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl<Req: Message, Resp: Message> DerefMut for Exchange<Req, Resp> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

impl<Req: Message, Resp: Message> NetworkBehaviour for Exchange<Req, Resp> {
    type ConnectionHandler = THandler<rr::Behaviour<Codec<Req, Resp>>>;
    type ToSwarm = rr::Event<Req, Resp>;

    fn handle_pending_inbound_connection(
        &mut self,
        id: ConnectionId,
        local: &Multiaddr,
        remote: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        self.inner
            .handle_pending_inbound_connection(id, local, remote)
    }

    fn handle_established_inbound_connection(
        &mut self,
        id: ConnectionId,
        peer: PeerId,
        local: &Multiaddr,
        remote: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.for_peer(peer, |b| {
            b.handle_established_inbound_connection(id, peer, local, remote)
        })
    }

    fn handle_pending_outbound_connection(
        &mut self,
        id: ConnectionId,
        peer: Option<PeerId>,
        addresses: &[Multiaddr],
        role: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        self.inner
            .handle_pending_outbound_connection(id, peer, addresses, role)
    }

    fn handle_established_outbound_connection(
        &mut self,
        id: ConnectionId,
        peer: PeerId,
        addr: &Multiaddr,
        role: Endpoint,
        port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.for_peer(peer, |b| {
            b.handle_established_outbound_connection(id, peer, addr, role, port_use)
        })
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        self.inner.on_swarm_event(event)
    }

    fn on_connection_handler_event(
        &mut self,
        peer: PeerId,
        id: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        self.inner.on_connection_handler_event(peer, id, event)
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        self.inner.poll(cx)
    }
}

/// Everything a node's swarm does.
#[derive(NetworkBehaviour)]
pub(crate) struct Behaviour {
    /// Peers blocked for a while after repeated bad frames (first: they are refused before the
    /// others see the connection).
    pub(crate) blocks: Blocks,
    /// Only manifest members may connect (absent when the federation is open).
    pub(crate) members: Members,
    /// Peers cut off on purpose (partition tests).
    pub(crate) blocked: allow_block_list::Behaviour<allow_block_list::BlockedPeers>,
    /// Caps on pending and established connections (after the allow list, so an outsider is
    /// refused as one).
    pub(crate) limits: connection_limits::Behaviour,
    /// No new connections while the process's memory is near the machine's.
    pub(crate) memory: memory_connection_limits::Behaviour,
    /// Pulls, notices and fetches → models and acks.
    pub(crate) model: Exchange<ModelRequest, ModelResponse>,
    /// Weighted gradients and skips → acknowledgements.
    pub(crate) gradient: Exchange<GradientRequest, GradientResponse>,
    /// Exchanges listen addresses.
    pub(crate) identify: identify::Behaviour,
    /// Finds peers beyond the bootstrap list.
    pub(crate) kad: kad::Behaviour<kad::store::MemoryStore>,
    /// Answers and sends libp2p pings (liveness for generic probes; round trip times), every
    /// [`PING_INTERVAL`].
    pub(crate) ping: ping::Behaviour,
    /// LAN discovery, when enabled.
    pub(crate) mdns: Toggle<mdns::tokio::Behaviour>,
    /// Reservations on the manifest's circuit relays, and connections through them.
    pub(crate) relay_client: relay::client::Behaviour,
    /// Hole punching: turns a connection through a relay into a direct one where the NATs
    /// allow it.
    pub(crate) dcutr: dcutr::Behaviour,
}

/// Knobs for [`Behaviour::new`].
pub(crate) struct BehaviourConfig {
    pub(crate) allowed: Option<Vec<libp2p::PeerId>>,
    /// The manifest's relays: admitted beside the members (they carry circuits; the round
    /// driver does not count them as members).
    pub(crate) relays: Vec<libp2p::PeerId>,
    /// Connection caps ([`super::limits::caps`]).
    pub(crate) limits: connection_limits::ConnectionLimits,
    pub(crate) max_message: u64,
    /// The receive budget, stream bound and strikes every frame is read through.
    pub(crate) intake: Arc<Intake>,
    /// Bounds a whole exchange on both sides, including the owner's wait before serving.
    pub(crate) request_timeout: Duration,
    pub(crate) mdns: bool,
}

impl Behaviour {
    pub(crate) fn new(
        key: &identity::Keypair,
        relay_client: relay::client::Behaviour,
        cfg: BehaviourConfig,
        metrics: Metrics,
    ) -> io::Result<Self> {
        let peer_id = key.public().to_peer_id();
        let members = members(cfg.allowed.map(|mut ids| {
            ids.extend(cfg.relays);
            ids
        }));
        let rr_cfg = rr::Config::default()
            .with_request_timeout(cfg.request_timeout)
            .with_max_concurrent_streams(1024);
        let model = Exchange::new(
            ModelCodec::with_intake(cfg.max_message, metrics.clone(), cfg.intake.clone()),
            [(
                StreamProtocol::new(protocol::MODEL_PROTOCOL),
                ProtocolSupport::Full,
            )],
            rr_cfg.clone(),
        );
        let gradient = Exchange::new(
            GradientCodec::with_intake(cfg.max_message, metrics, cfg.intake.clone()),
            [(
                StreamProtocol::new(protocol::GRADIENT_PROTOCOL),
                ProtocolSupport::Full,
            )],
            rr_cfg,
        );
        let identify =
            identify::Behaviour::new(identify::Config::new("/federico/1".into(), key.public()));
        let mut kad_cfg = kad::Config::new(StreamProtocol::new("/federico/kad/1"));
        kad_cfg.set_query_timeout(Duration::from_secs(30));
        let mut kad =
            kad::Behaviour::with_config(peer_id, kad::store::MemoryStore::new(peer_id), kad_cfg);
        kad.set_mode(Some(kad::Mode::Server));
        let mdns = if cfg.mdns {
            Some(mdns::tokio::Behaviour::new(
                mdns::Config::default(),
                peer_id,
            )?)
        } else {
            None
        };
        Ok(Self {
            blocks: Blocks::new(cfg.intake),
            members,
            blocked: Default::default(),
            limits: connection_limits::Behaviour::new(cfg.limits),
            memory: super::limits::memory(),
            model,
            gradient,
            identify,
            kad,
            ping: ping::Behaviour::new(ping::Config::new().with_interval(PING_INTERVAL)),
            mdns: mdns.into(),
            relay_client,
            dcutr: dcutr::Behaviour::new(peer_id),
        })
    }
}
