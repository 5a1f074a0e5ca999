//! The libp2p behaviour of a node: membership (allow list), partitions (block list), the two
//! FedeRiCo protocols with our size-capped bincode codec, identify, Kademlia and optional mDNS.
//! Owns: how the protocols are framed and bounded, counting frames refused by the codec, and how
//! the behaviour is assembled.
//! Must not: interpret messages (that is the round driver) or train.

use super::metrics::{Metrics, Reason};
use crate::wire::{self, GradientRequest, GradientResponse, ModelRequest, ModelResponse};
use libp2p::futures::{AsyncRead, AsyncWrite, AsyncWriteExt};
use libp2p::request_response::{self as rr, ProtocolSupport};
use libp2p::swarm::NetworkBehaviour;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::{StreamProtocol, allow_block_list, identify, identity, kad, mdns};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io;
use std::marker::PhantomData;
use std::time::Duration;

/// Length-prefixed bincode-2 frames with a bound checked before allocation; counts the bytes.
pub(crate) struct Codec<Req, Resp> {
    max: u64,
    metrics: Metrics,
    _types: PhantomData<fn() -> (Req, Resp)>,
}

impl<Req, Resp> Clone for Codec<Req, Resp> {
    fn clone(&self) -> Self {
        Self {
            max: self.max,
            metrics: self.metrics.clone(),
            _types: PhantomData,
        }
    }
}

impl<Req, Resp> Codec<Req, Resp> {
    pub(crate) fn new(max: u64, metrics: Metrics) -> Self {
        Self {
            max,
            metrics,
            _types: PhantomData,
        }
    }

    /// Reads one message. A frame that is refused (oversized, truncated, not a message) is
    /// counted here by reason and comes back as an `InvalidData` error carrying the
    /// [`wire::WireError`], which the round driver logs with the peer (libp2p reports it as an
    /// inbound or outbound failure; the codec never learns who sent the bytes).
    async fn read<T: AsyncRead + Unpin + Send, M: DeserializeOwned>(
        &self,
        protocol: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<M> {
        let body = wire::read_frame(io, self.max).await.inspect_err(|e| {
            if let Some(w) = wire::rejection(e) {
                self.metrics.reject(Reason::from(w));
            }
        })?;
        self.metrics
            .count_bytes(protocol.as_ref(), "in", body.len() + 8);
        wire::decode(&body).map_err(|e| {
            self.metrics.reject(Reason::from(&e));
            wire::invalid(e)
        })
    }

    async fn write<T: AsyncWrite + Unpin + Send, M: Serialize>(
        &self,
        protocol: &StreamProtocol,
        io: &mut T,
        msg: &M,
    ) -> io::Result<()> {
        let frame = wire::encode(msg).map_err(io::Error::other)?;
        if frame.len() as u64 - 8 > self.max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                wire::WireError::TooLarge {
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
        self.read(p, io).await
    }

    async fn read_response<T: AsyncRead + Unpin + Send>(
        &mut self,
        p: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<Resp> {
        self.read(p, io).await
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

/// Everything a node's swarm does.
#[derive(NetworkBehaviour)]
pub(crate) struct Behaviour {
    /// Only manifest members may connect (absent when the federation is open).
    pub(crate) members: Toggle<allow_block_list::Behaviour<allow_block_list::AllowedPeers>>,
    /// Peers cut off on purpose (partition tests).
    pub(crate) blocked: allow_block_list::Behaviour<allow_block_list::BlockedPeers>,
    /// Pulls, notices and fetches → models and acks.
    pub(crate) model: rr::Behaviour<ModelCodec>,
    /// Weighted gradients and skips → acknowledgements.
    pub(crate) gradient: rr::Behaviour<GradientCodec>,
    /// Exchanges listen addresses.
    pub(crate) identify: identify::Behaviour,
    /// Finds peers beyond the bootstrap list.
    pub(crate) kad: kad::Behaviour<kad::store::MemoryStore>,
    /// LAN discovery, when enabled.
    pub(crate) mdns: Toggle<mdns::tokio::Behaviour>,
}

/// Knobs for [`Behaviour::new`].
pub(crate) struct BehaviourConfig {
    pub(crate) allowed: Option<Vec<libp2p::PeerId>>,
    pub(crate) max_message: u64,
    /// Bounds a whole exchange on both sides, including the owner's wait before serving.
    pub(crate) request_timeout: Duration,
    pub(crate) mdns: bool,
}

impl Behaviour {
    pub(crate) fn new(
        key: &identity::Keypair,
        cfg: BehaviourConfig,
        metrics: Metrics,
    ) -> io::Result<Self> {
        let peer_id = key.public().to_peer_id();
        let members = cfg.allowed.map(|ids| {
            let mut b = allow_block_list::Behaviour::<allow_block_list::AllowedPeers>::default();
            for id in ids {
                b.allow_peer(id);
            }
            b
        });
        let rr_cfg = rr::Config::default()
            .with_request_timeout(cfg.request_timeout)
            .with_max_concurrent_streams(1024);
        let model = rr::Behaviour::with_codec(
            ModelCodec::new(cfg.max_message, metrics.clone()),
            [(
                StreamProtocol::new(wire::MODEL_PROTOCOL),
                ProtocolSupport::Full,
            )],
            rr_cfg.clone(),
        );
        let gradient = rr::Behaviour::with_codec(
            GradientCodec::new(cfg.max_message, metrics),
            [(
                StreamProtocol::new(wire::GRADIENT_PROTOCOL),
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
            members: members.into(),
            blocked: Default::default(),
            model,
            gradient,
            identify,
            kad,
            mdns: mdns.into(),
        })
    }
}
