//! A hostile peer against a live node process (issue 4, "hostile and broken peers").
//!
//! A federation of two: silo-0 is a real `federico node`; silo-1 is this test, holding silo-1's
//! key (so the node lets it connect) and speaking the protocols through a raw-bytes codec, so it
//! can send anything. It plays round 1 just well enough for the node to reach version 1, then
//! holds the node's `Pull{2}` unanswered, which keeps the node in round 2 at version 1 for as
//! long as `deadlines.model_s` (120 s) — a fixed state to aim at. It then sends every kind of bad
//! message, and checks that the node refused each with a log line naming silo-1 and a counter
//! for the reason, that its model and version did not move, and — after answering the held pull
//! properly — that it goes on to finish round 2. An outsider with a key of its own is refused
//! at connection time.
//!
//! A second test turns the same hostile member on a live HCCT coordinator (issue 5): every bad
//! coordinator request is refused with a reason, the coordinator stays up, and the honest
//! silo beside it finishes its run. A third makes it the third silo of a FedCollab federation:
//! its bad pair messages are refused by the honest silo it drives a pair with, its bad distance
//! reports by the coordinator; it can spoil only its own pairs, and the two honest silos finish
//! with their own pair's distance intact.

use federico::coord::PairDistance;
use federico::launch::{self, coordinated};
use federico::net::config::Deadlines;
use federico::net::{Manifest, NodeConfig, intake, load_key};
use federico::protocol::{
    self, COLLAB_PROTOCOL, COORD_PROTOCOL, CollabRequest, CollabResponse, CoordRequest,
    CoordResponse, GRADIENT_PROTOCOL, GradientRequest, GradientResponse, MODEL_PROTOCOL,
    ModelPayload, ModelRequest, ModelResponse,
};
use federico::scenario::Algorithm;
use federico::scenario::Scenario;
use libp2p::futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, StreamExt};
use libp2p::request_response::{
    self as rr, OutboundFailure, OutboundRequestId, ProtocolSupport, ResponseChannel,
};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm, SwarmBuilder, identity, noise, tcp, yamux};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_federico");

/// Requests and responses as raw bytes: whatever the test hands it is written verbatim, and
/// whatever arrives is read to the end of the stream.
#[derive(Clone, Default)]
struct Raw;

impl rr::Codec for Raw {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        io.take(64 << 20).read_to_end(&mut buf).await?;
        Ok(buf)
    }

    async fn read_response<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        io.take(64 << 20).read_to_end(&mut buf).await?;
        Ok(buf)
    }

    async fn write_request<T: AsyncWrite + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> io::Result<()> {
        io.write_all(&req).await?;
        io.flush().await
    }

    async fn write_response<T: AsyncWrite + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        resp: Vec<u8>,
    ) -> io::Result<()> {
        io.write_all(&resp).await?;
        io.flush().await
    }
}

#[derive(NetworkBehaviour)]
struct Hostile {
    model: rr::Behaviour<Raw>,
    gradient: rr::Behaviour<Raw>,
    /// The gradient protocol at a version the node does not speak.
    gradient_v2: rr::Behaviour<Raw>,
    /// The coordinator protocol (requests only).
    coord: rr::Behaviour<Raw>,
    /// FedCollab's silo-to-silo protocol (requests only).
    collab: rr::Behaviour<Raw>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Proto {
    Model,
    Gradient,
    GradientV2,
    Coord,
    Collab,
}

/// How a request of ours ended.
#[derive(Debug)]
enum Outcome {
    /// The bytes that came back (empty when the node closed the stream without answering).
    Answer(Vec<u8>),
    Failed(OutboundFailure),
}

/// A request from the node to us, not answered yet.
struct Inbound {
    proto: Proto,
    bytes: Vec<u8>,
    channel: ResponseChannel<Vec<u8>>,
}

fn swarm(key: identity::Keypair) -> Swarm<Hostile> {
    // Our side must not time out the node's pull we hold.
    let cfg = rr::Config::default().with_request_timeout(Duration::from_secs(300));
    let rr = |name: &'static str, support| {
        rr::Behaviour::with_codec(Raw, [(StreamProtocol::new(name), support)], cfg.clone())
    };
    SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            yamux::Config::default,
        )
        .unwrap()
        .with_behaviour(|_| Hostile {
            model: rr(MODEL_PROTOCOL, ProtocolSupport::Full),
            gradient: rr(GRADIENT_PROTOCOL, ProtocolSupport::Full),
            gradient_v2: rr("/federico/gradient/1", ProtocolSupport::Outbound),
            coord: rr(COORD_PROTOCOL, ProtocolSupport::Outbound),
            collab: rr(COLLAB_PROTOCOL, ProtocolSupport::Outbound),
        })
        .unwrap()
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(600)))
        .build()
}

/// Silo-1 as a hostile peer: sends raw requests to the node and collects the node's requests.
struct Client {
    swarm: Swarm<Hostile>,
    node: PeerId,
    inbound: Vec<Inbound>,
}

impl Client {
    async fn connect(&mut self, addr: Multiaddr) {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            self.swarm.dial(addr.clone()).unwrap();
            loop {
                match self.next().await {
                    SwarmEvent::ConnectionEstablished { peer_id, .. } if peer_id == self.node => {
                        return;
                    }
                    SwarmEvent::OutgoingConnectionError { .. } => break,
                    _ => {}
                }
            }
            assert!(
                Instant::now() < until,
                "the node never accepted a connection"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The next swarm event, with a failsafe.
    async fn next(&mut self) -> SwarmEvent<HostileEvent> {
        tokio::time::timeout(Duration::from_secs(30), self.swarm.select_next_some())
            .await
            .expect("no event from the swarm for 30 s")
    }

    /// Polls the swarm once: requests from the node are kept; returns what ended a request.
    async fn step(&mut self) -> Option<(OutboundRequestId, Outcome)> {
        let (proto, event) = match self.next().await {
            SwarmEvent::Behaviour(HostileEvent::Model(e)) => (Proto::Model, e),
            SwarmEvent::Behaviour(HostileEvent::Gradient(e)) => (Proto::Gradient, e),
            SwarmEvent::Behaviour(HostileEvent::GradientV2(e)) => (Proto::GradientV2, e),
            SwarmEvent::Behaviour(HostileEvent::Coord(e)) => (Proto::Coord, e),
            SwarmEvent::Behaviour(HostileEvent::Collab(e)) => (Proto::Collab, e),
            SwarmEvent::ConnectionClosed { peer_id, .. } if peer_id == self.node => {
                panic!("the node closed the connection")
            }
            _ => return None,
        };
        match event {
            rr::Event::Message {
                message:
                    rr::Message::Request {
                        request, channel, ..
                    },
                ..
            } => {
                self.inbound.push(Inbound {
                    proto,
                    bytes: request,
                    channel,
                });
                None
            }
            rr::Event::Message {
                message:
                    rr::Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => Some((request_id, Outcome::Answer(response))),
            rr::Event::OutboundFailure {
                request_id, error, ..
            } => Some((request_id, Outcome::Failed(error))),
            _ => None,
        }
    }

    /// Sends `bytes` on `proto` and waits for how it ended.
    async fn send(&mut self, proto: Proto, bytes: Vec<u8>) -> Outcome {
        let b = self.swarm.behaviour_mut();
        let id = match proto {
            Proto::Model => b.model.send_request(&self.node, bytes),
            Proto::Gradient => b.gradient.send_request(&self.node, bytes),
            Proto::GradientV2 => b.gradient_v2.send_request(&self.node, bytes),
            Proto::Coord => b.coord.send_request(&self.node, bytes),
            Proto::Collab => b.collab.send_request(&self.node, bytes),
        };
        loop {
            if let Some((done, outcome)) = self.step().await {
                assert_eq!(done, id, "one request at a time");
                return outcome;
            }
        }
    }

    async fn model(&mut self, req: ModelRequest) -> ModelResponse {
        match self
            .send(Proto::Model, protocol::encode(&req).unwrap())
            .await
        {
            Outcome::Answer(b) => decode(&b),
            Outcome::Failed(e) => panic!("{req:?} failed: {e}"),
        }
    }

    async fn gradient(&mut self, req: GradientRequest) -> GradientResponse {
        match self
            .send(Proto::Gradient, protocol::encode(&req).unwrap())
            .await
        {
            Outcome::Answer(b) => decode(&b),
            Outcome::Failed(e) => panic!("gradient failed: {e}"),
        }
    }

    /// Waits for the node's next model request.
    async fn pulled(&mut self) -> (ModelRequest, ResponseChannel<Vec<u8>>) {
        loop {
            if let Some(i) = self.inbound.iter().position(|r| r.proto == Proto::Model) {
                let r = self.inbound.remove(i);
                return (decode(&r.bytes), r.channel);
            }
            assert!(self.step().await.is_none(), "no request of ours is out");
        }
    }

    fn answer(&mut self, channel: ResponseChannel<Vec<u8>>, resp: &ModelResponse) {
        self.swarm
            .behaviour_mut()
            .model
            .send_response(channel, protocol::encode(resp).unwrap())
            .unwrap();
    }

    /// Accepts every gradient the node sent us (it does after a model we served).
    fn accept_gradients(&mut self) {
        let accepted = protocol::encode(&GradientResponse::Accepted).unwrap();
        let (grads, rest) = std::mem::take(&mut self.inbound)
            .into_iter()
            .partition(|r| r.proto == Proto::Gradient);
        self.inbound = rest;
        for g in grads {
            let _ = self
                .swarm
                .behaviour_mut()
                .gradient
                .send_response(g.channel, accepted.clone());
        }
    }
}

fn decode<M: serde::de::DeserializeOwned>(frame: &[u8]) -> M {
    let len = protocol::check_len(
        frame[..8].try_into().unwrap(),
        protocol::DEFAULT_MAX_MESSAGE,
    )
    .unwrap();
    assert_eq!(len, frame.len() - 8);
    protocol::decode(&frame[8..]).unwrap()
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// `federico_rejected_messages_total` by reason, and `federico_rounds`, from the endpoint.
fn scrape(addr: &str) -> (BTreeMap<String, u64>, u64) {
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sock.write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    sock.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    let mut rejected = BTreeMap::new();
    let mut rounds = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("federico_rejected_messages_total{reason=\"") {
            let (reason, n) = rest.split_once("\"} ").unwrap();
            rejected.insert(reason.to_string(), n.parse().unwrap());
        } else if let Some(n) = line.strip_prefix("federico_rounds ") {
            rounds = Some(n.parse().unwrap());
        }
    }
    (rejected, rounds.expect("federico_rounds is served"))
}

fn params(resp: ModelResponse) -> ModelPayload {
    match resp {
        ModelResponse::Model(p) => p,
        ModelResponse::Ack => panic!("an acknowledgement where a model was due"),
    }
}

/// Silo `i`'s key (a member of the federation) connected to the coordinator of `p` (the
/// manifest's last member): the client, its peer ID and the coordinator's address.
async fn member_at_coordinator(p: &launch::Prepared, i: usize) -> (Client, String, Multiaddr) {
    let manifest = Manifest::load(&p.nodes_dir.join("../manifest.toml")).unwrap();
    let coord = manifest.members.last().unwrap();
    let addr = coord.addrs[0]
        .clone()
        .with(libp2p::multiaddr::Protocol::P2p(coord.peer_id));
    let key = load_key(&NodeConfig::load(&p.configs[i]).unwrap().key).unwrap();
    let id = key.public().to_peer_id().to_string();
    let mut h = Client {
        swarm: swarm(key),
        node: coord.peer_id,
        inbound: Vec::new(),
    };
    h.connect(addr.clone()).await;
    (h, id, addr)
}

#[tokio::test]
async fn a_hostile_peer_changes_nothing_and_every_refusal_is_counted() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let over: Vec<String> = [
        "split.clients=2",
        "split.groups=1",
        "rounds=1000",
        "eval_every=1000",
        "federico.neighbours=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let scenario = Scenario::load_with(Path::new("simulations/quickstart.toml"), &over).unwrap();
    // Long model and gradient deadlines: the node waits for us, nothing times out during the test.
    let deadlines = Deadlines {
        model_s: 120.0,
        gradient_s: 120.0,
        start_s: 60.0,
        // Round 1 at start_s with whoever came, as before nodes waited for a first peer.
        alone_s: Some(60.0),
        linger_s: 1.0,
    };
    let p = launch::prepare(&scenario, 1, None, &deadlines, dir.path()).unwrap();
    let metrics = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut cfg = NodeConfig::load(&p.configs[0]).unwrap();
    cfg.metrics = Some(metrics.clone());
    std::fs::write(&p.configs[0], toml::to_string(&cfg).unwrap()).unwrap();
    let log_path = p.nodes_dir.join("silo-0.log");
    let mut node =
        KillOnDrop(launch::start_node(Path::new(EXE), &p.configs[0], &log_path).unwrap());

    let manifest = Manifest::load(&cfg.manifest).unwrap();
    let node_id = manifest.members[0].peer_id;
    let addr = manifest.members[0].addrs[0]
        .clone()
        .with(libp2p::multiaddr::Protocol::P2p(node_id));
    let key = load_key(&NodeConfig::load(&p.configs[1]).unwrap().key).unwrap();
    let hostile_id = key.public().to_peer_id().to_string();
    let mut h = Client {
        swarm: swarm(key),
        node: node_id,
        inbound: Vec::new(),
    };
    h.connect(addr.clone()).await;

    // Round 1, played just well enough. Our pull is served at version 0 (the node now waits for
    // our gradient or skip); its pull to us gets a model of the wrong size, which it refuses.
    let p0 = params(h.model(ModelRequest::Pull { round: 1 }).await);
    assert_eq!(p0.version, 0);
    let (fingerprint, n) = (p0.fingerprint, p0.params.len());
    let (req, channel) = h.pulled().await;
    assert_eq!(req, ModelRequest::Pull { round: 1 });
    h.answer(
        channel,
        &ModelResponse::Model(ModelPayload {
            version: 0,
            fingerprint,
            params: Arc::new(vec![0.0; n + 1]),
        }),
    );
    assert_eq!(
        h.gradient(GradientRequest::Skip { version: 0 }).await,
        GradientResponse::Accepted
    );
    // The node steps to version 1 and pulls from us for round 2: we hold that pull, so it stays
    // in round 2 at version 1 until model_s runs out.
    let (req, held) = h.pulled().await;
    assert_eq!(req, ModelRequest::Pull { round: 2 });

    let good = |version, grad: Vec<f32>| GradientRequest::Gradient {
        version,
        fingerprint,
        n_train: 40,
        weight: 0.5,
        grad,
    };
    let refused = |r: GradientResponse| match r {
        GradientResponse::Rejected { reason } => reason,
        GradientResponse::Accepted => panic!("accepted"),
    };
    // Not served version 1 yet: unexpected.
    let r = refused(h.gradient(good(1, vec![0.0; n])).await);
    assert!(r.contains("not served"), "{r}");
    // Now served: version 1, the parameters to compare with at the end.
    let p1 = params(h.model(ModelRequest::Pull { round: 2 }).await);
    assert_eq!(p1.version, 1);
    assert_ne!(p1.params, p0.params, "round 1 took a step");
    // Wrong shape, non-finite values and weight, wrong fingerprint, stale, from the future.
    refused(h.gradient(good(1, vec![0.0; n + 3])).await);
    let mut nan = vec![0.0; n];
    nan[n / 2] = f32::NAN;
    refused(h.gradient(good(1, nan)).await);
    let mut inf = vec![0.0; n];
    inf[0] = f32::INFINITY;
    refused(h.gradient(good(1, inf)).await);
    let r = refused(
        h.gradient(GradientRequest::Gradient {
            version: 1,
            fingerprint,
            n_train: 40,
            weight: f64::NAN,
            grad: vec![0.0; n],
        })
        .await,
    );
    assert!(r.contains("weight"), "{r}");
    refused(
        h.gradient(GradientRequest::Gradient {
            version: 1,
            fingerprint: fingerprint ^ 1,
            n_train: 40,
            weight: 0.5,
            grad: vec![0.0; n],
        })
        .await,
    );
    assert!(refused(h.gradient(good(0, vec![0.0; n])).await).starts_with("stale"));
    refused(h.gradient(good(1000, vec![0.0; n])).await);
    // One skip is taken; a second skip and a gradient after it are duplicates.
    assert_eq!(
        h.gradient(GradientRequest::Skip { version: 1 }).await,
        GradientResponse::Accepted
    );
    assert_eq!(
        refused(h.gradient(GradientRequest::Skip { version: 1 }).await),
        "duplicate"
    );
    assert_eq!(
        refused(h.gradient(good(1, vec![0.0; n])).await),
        "duplicate"
    );

    // Bytes the codec refuses: the node answers nothing and closes the stream.
    let skip = protocol::encode(&GradientRequest::Skip { version: 1 }).unwrap();
    let trailing = frame(&[&skip[8..], &[0u8][..]].concat());
    let mut cut = frame(&[7u8; 100]);
    cut.truncate(18);
    for (proto, bytes) in [
        (Proto::Gradient, frame(&[0xFF; 6])),               // garbage
        (Proto::Model, frame(&[9])),                        // garbage: no variant 9
        (Proto::Gradient, trailing),                        // garbage: a byte after the message
        (Proto::Gradient, cut),                             // truncated: 10 of 100 body bytes
        (Proto::Model, vec![1, 2, 3]),                      // truncated: inside the header
        (Proto::Gradient, u64::MAX.to_le_bytes().to_vec()), // oversized
        (Proto::Model, ((256u64 << 20) + 1).to_le_bytes().to_vec()), // oversized by one byte
    ] {
        match h.send(proto, bytes).await {
            Outcome::Answer(b) => assert!(b.is_empty(), "the node answered {b:?}"),
            Outcome::Failed(_) => {}
        }
    }
    // Another protocol version (the one before the f32 block layout): refused at
    // negotiation; the node never sees a frame.
    match h.send(Proto::GradientV2, skip.clone()).await {
        Outcome::Failed(OutboundFailure::UnsupportedProtocols) => {}
        other => panic!("/federico/gradient/1 was not refused: {other:?}"),
    }
    // A fetch for a version far in the future is answered at once with what the node holds.
    let far = params(h.model(ModelRequest::Fetch { version: u64::MAX }).await);
    assert_eq!((far.version, &far.params), (1, &p1.params));

    // An outsider with a key of its own is refused at connection time.
    let mut outsider = Client {
        swarm: swarm(identity::Keypair::generate_ed25519()),
        node: node_id,
        inbound: Vec::new(),
    };
    outsider.swarm.dial(addr.clone()).unwrap();
    loop {
        match outsider.next().await {
            SwarmEvent::ConnectionClosed { .. } | SwarmEvent::OutgoingConnectionError { .. } => {
                break;
            }
            _ => {}
        }
    }

    // Nothing moved: the process runs, same version, same parameters, one round done.
    assert!(node.0.try_wait().unwrap().is_none(), "the node exited");
    let now = params(h.model(ModelRequest::Fetch { version: 1 }).await);
    assert_eq!((now.version, &now.params), (1, &p1.params));
    let run_log = launch::read_run_log(&cfg.state_dir.join("rounds.jsonl")).unwrap();
    assert_eq!(run_log.len(), 1);
    assert_eq!((run_log[0].round, run_log[0].version), (1, 1));
    assert_eq!(
        run_log[0].gradients, 1,
        "round 1 summed the node's own gradient only"
    );

    // Every refusal counted by its reason (the outsider's once its denial is processed).
    let want: BTreeMap<String, u64> = [
        ("unexpected", 1),
        ("wrong_shape", 2), // the model we served in round 1, and one gradient
        ("non_finite", 3),
        ("wrong_fingerprint", 1),
        ("stale", 1),
        ("future_version", 1),
        ("duplicate", 2),
        ("garbage", 3),
        ("truncated", 2),
        ("oversized", 2),
        ("not_a_member", 1),
    ]
    .into_iter()
    .map(|(r, n)| (r.to_string(), n))
    .collect();
    let until = Instant::now() + Duration::from_secs(10);
    let (rejected, rounds) = loop {
        let (rejected, rounds) = scrape(&metrics);
        if rejected.contains_key("not_a_member") || Instant::now() > until {
            break (rejected, rounds);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(rejected, want);
    assert_eq!(rounds, 1);
    // And each logged with the peer: by name once a message is read, by peer ID for frames the
    // codec refused, by address for the outsider.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(&log_path).unwrap();
        let missing: Vec<&String> = want
            .keys()
            .filter(|r| {
                let peer = match r.as_str() {
                    "not_a_member" => "from=".to_string(),
                    "garbage" | "truncated" | "oversized" => format!("peer={hostile_id}"),
                    _ => "peer=silo-1".to_string(),
                };
                // Late gradients are routine under faults: logged at info, the rest warn.
                let level = if r.as_str() == "stale" {
                    "INFO"
                } else {
                    "WARN"
                };
                !log.lines().any(|l| {
                    l.contains(level) && l.contains(&format!("reason={r}")) && l.contains(&peer)
                })
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(Instant::now() < until, "no warning for {missing:?}:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Still healthy: answer the held pull properly and the node finishes round 2.
    h.answer(held, &ModelResponse::Model(p1.clone()));
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        h.accept_gradients();
        let log = launch::read_run_log(&cfg.state_dir.join("rounds.jsonl")).unwrap();
        if let Some(r2) = log.iter().find(|r| r.round == 2) {
            assert_eq!(r2.answered, vec![1], "our model was taken in round 2");
            assert_eq!(r2.version, 2);
            break;
        }
        assert!(Instant::now() < until, "the node did not finish round 2");
        let _ = tokio::time::timeout(Duration::from_millis(50), h.step()).await;
    }
    drop(node);
    eprintln!("hostile test took {:.1} s", started.elapsed().as_secs_f64());
}

/// Kills the node process when the test ends, pass or fail; asserts it was still running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let running = self.0.try_wait().map(|s| s.is_none()).unwrap_or(false);
        let _ = self.0.kill();
        let _ = self.0.wait();
        if !std::thread::panicking() {
            assert!(running, "the node process had exited");
        }
    }
}

/// A hostile member against a live HCCT coordinator: garbage, requests for another algorithm,
/// updates before the run opened, a zero sample count, a changed sample count, wrong-size,
/// NaN, overflowing and wrong-round models, and a FedSaC contribution are each refused with a
/// reason and a log line naming the member; the coordinator stays up, the honest silo finishes
/// every round, and both exit cleanly.
#[tokio::test]
async fn a_hostile_member_cannot_break_the_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let over: Vec<String> = [
        "split.clients=2",
        "rounds=3",
        "eval_every=1",
        "hcct.alpha=20",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let scenario = Scenario::load_with(Path::new("simulations/quickstart.toml"), &over).unwrap();
    let deadlines = Deadlines {
        start_s: 10.0,
        ..Deadlines::default()
    };
    let p = launch::prepare(&scenario, 1, None, &deadlines, dir.path()).unwrap();
    // τ = 3 s: rounds without the hostile member close at the deadline.
    let setup =
        coordinated::add_coordinator(&p, &scenario, 1, dir.path(), 3.0, 5.0, Algorithm::Hcct)
            .unwrap();
    let coord_log = p.nodes_dir.join("coordinator.log");
    let mut coordinator =
        KillOnDrop(coordinated::start_coordinator(Path::new(EXE), &setup, &coord_log).unwrap());
    let (mut h, hostile_id, _) = member_at_coordinator(&p, 1).await;

    let mut ask = async |req: &CoordRequest| -> CoordResponse {
        match h.send(Proto::Coord, protocol::encode(req).unwrap()).await {
            Outcome::Answer(b) => decode(&b),
            Outcome::Failed(e) => panic!("{req:?} failed: {e}"),
        }
    };
    let refused = |r: CoordResponse, what: &str| match r {
        CoordResponse::Error { reason } => {
            assert!(
                reason.contains(what),
                "refused, but for {reason:?}, not {what:?}"
            );
        }
        other => panic!("{other:?} where a refusal naming {what:?} was due"),
    };
    // Before the honest silo exists: nothing opens until both joined.
    let update = |round, params: Vec<f32>| CoordRequest::Update {
        round,
        params: Arc::new(params),
        n_train: 40,
    };
    let d = p.spec.num_params();
    refused(ask(&update(0, vec![0.0; d])).await, "registered");
    refused(
        ask(&CoordRequest::Join { n_train: 0 }).await,
        "n_train is 0",
    );
    refused(
        ask(&CoordRequest::Register {
            n_train: 40,
            discrepancy: 0.1,
        })
        .await,
        "runs hcct",
    );
    assert!(matches!(
        ask(&CoordRequest::Join { n_train: 40 }).await,
        CoordResponse::Ack
    ));
    // Garbage on the protocol: the stream is dropped, the coordinator stays.
    let outcome = h.send(Proto::Coord, frame(&[0xff; 64])).await;
    assert!(
        matches!(&outcome, Outcome::Failed(_))
            || matches!(&outcome, Outcome::Answer(b) if b.is_empty()),
        "{outcome:?}"
    );
    // The honest silo joins: round 0 opens.
    let mut node = KillOnDrop(
        launch::start_node(
            Path::new(EXE),
            &p.configs[0],
            &p.nodes_dir.join("silo-0.log"),
        )
        .unwrap(),
    );
    let start = match h
        .send(
            Proto::Coord,
            protocol::encode(&CoordRequest::Fetch { round: 0 }).unwrap(),
        )
        .await
    {
        Outcome::Answer(b) => match decode::<CoordResponse>(&b) {
            CoordResponse::Global { round: 0, params } => params,
            other => panic!("{other:?}"),
        },
        Outcome::Failed(e) => panic!("fetch failed: {e}"),
    };
    assert_eq!(start.len(), d);
    let mut ask = async |req: &CoordRequest| -> CoordResponse {
        match h.send(Proto::Coord, protocol::encode(req).unwrap()).await {
            Outcome::Answer(b) => decode(&b),
            Outcome::Failed(e) => panic!("{req:?} failed: {e}"),
        }
    };
    refused(ask(&CoordRequest::Join { n_train: 41 }).await, "fixed");
    refused(ask(&update(0, vec![0.0; d + 1])).await, "parameters");
    let mut nan = start.to_vec();
    nan[3] = f32::NAN;
    refused(ask(&update(0, nan)).await, "");
    let mut huge = start.to_vec();
    huge[0] = f32::MAX;
    huge[1] = -f32::MAX;
    refused(ask(&update(0, huge)).await, "not finite");
    refused(ask(&update(7, start.to_vec())).await, "round");
    refused(
        ask(&CoordRequest::Contribute {
            round: 0,
            params: start.clone(),
            subspace: None,
        })
        .await,
        "update",
    );
    // One honest update; then the member falls silent and the rounds close at τ without it.
    assert!(matches!(
        ask(&update(0, start.to_vec())).await,
        CoordResponse::Ack
    ));
    let until = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(s) = node.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "the honest silo did not finish");
        let _ = tokio::time::timeout(Duration::from_millis(50), h.step()).await;
    };
    assert!(status.success(), "the honest silo exited {status}");
    let lines = std::fs::read_to_string(
        NodeConfig::load(&p.configs[0])
            .unwrap()
            .state_dir
            .join("rounds.jsonl"),
    )
    .unwrap();
    let rounds: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rounds.len(), 4, "3 rounds and the final line: {lines}");
    assert!(rounds[..3].iter().all(|r| r["attached"] == true), "{lines}");
    // The coordinator is still serving (lingering for late fetches) or has ended cleanly, and
    // logged each refusal, garbage included, with the member's peer ID.
    match coordinator.0.try_wait().unwrap() {
        Some(s) => assert!(s.success(), "the coordinator exited {s}"),
        None => {
            let _ = coordinator.0.kill();
            let _ = coordinator.0.wait();
        }
    }
    let log = std::fs::read_to_string(&coord_log).unwrap();
    let named = log
        .lines()
        .filter(|l| l.contains("refused") && l.contains(&hostile_id))
        .count();
    assert_eq!(named, 10, "refusals logged with the member's ID:\n{log}");
    assert!(
        log.lines().any(|l| l.contains("refused a frame")
            && l.contains(&hostile_id)
            && l.contains("reason=garbage")),
        "{log}"
    );
    // Both processes were handled above.
    std::mem::forget(node);
    std::mem::forget(coordinator);
}

/// Insiders' review D3, as the member did it: a FedDisco member registers with
/// `n_train = 10^12` and a zero discrepancy, then sends ±10^6 parameters every round, speaking
/// the protocol correctly. With the coordinator's defences (`[feddisco] size_cap`,
/// `update_clip`, `weight_cap`, on by default) its weight is capped and the global stays the
/// honest silos'; with them off (the run before them) it takes most of the weight and the
/// global.
#[tokio::test]
async fn a_feddisco_member_lying_about_its_size_cannot_take_the_global() {
    let (weight, biggest, _) = feddisco_liar(&[]).await;
    // Three senders: at most 1.5 fair shares, 0.5 (its capped size and a claimed discrepancy
    // of 0 would give it 0.75).
    assert!(weight <= 0.5 + 1e-9, "defended: the liar's weight {weight}");
    assert!(
        biggest < 100.0,
        "defended: the global's largest parameter {biggest}"
    );
    let (weight_off, biggest_off, _) = feddisco_liar(&[
        "feddisco.size_cap=0",
        "feddisco.update_clip=0",
        "feddisco.weight_cap=0",
    ])
    .await;
    assert!(
        weight_off > 0.7,
        "undefended: the liar's weight {weight_off}"
    );
    assert!(
        biggest_off > 1e4,
        "undefended: the global's largest parameter {biggest_off}"
    );
    eprintln!(
        "feddisco liar (n_train 1e12, ±1e6 parameters): weight {weight:.3}, largest global \
         parameter {biggest:.3}; without the defences {weight_off:.3} and {biggest_off:.0}"
    );
}

/// Issue 38, Multi-Krum as the attacker meets it: five FedDisco silos, one of them the liar
/// above with every other bound off (`size_cap`, `update_clip`, `weight_cap` = 0) and
/// `aggregator = "krum"`. Its ±10^6 model is far from the four honest ones, so Krum leaves it
/// out whole: weight 0 in every round the coordinator logs with five senders, and the global
/// stays the honest silos'. The control is the undefended run of the test above (the liar
/// takes over 0.7 of the weight and the global).
#[tokio::test]
async fn krum_leaves_a_feddisco_members_poisoned_model_out_whole() {
    let (weight, biggest, rounds) = feddisco_liar(&[
        "split.clients=5",
        "feddisco.size_cap=0",
        "feddisco.update_clip=0",
        "feddisco.weight_cap=0",
        "feddisco.aggregator=\"krum\"",
    ])
    .await;
    let full: Vec<f64> = rounds
        .iter()
        .filter(|(senders, _)| *senders == 5)
        .map(|&(_, w)| w)
        .collect();
    assert!(full.len() >= 2, "rounds with every sender: {rounds:?}");
    assert!(
        full.iter().all(|&w| w == 0.0),
        "the liar's weights: {rounds:?}"
    );
    assert!(biggest < 100.0, "the global's largest parameter {biggest}");
    eprintln!(
        "feddisco liar under krum: weights {rounds:?} (senders, weight), largest global \
         parameter {biggest:.3}; largest weight {weight:.3}"
    );
}

/// Honest FedDisco silos (every silo of the scenario but 2) and a liar with silo-2's key, 3
/// rounds: the liar's largest weight in `coordinator.jsonl`, the largest parameter of the last
/// global it fetched, and each logged round's (senders, the liar's weight).
async fn feddisco_liar(extra: &[&str]) -> (f64, f64, Vec<(usize, f64)>) {
    let over: Vec<String> = ["split.clients=3", "rounds=3", "eval_every=1"]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
    let mut f = DiscoMember::start(&over, 5.0, 5.0, None).await;
    let (setup, liar_id, h) = (&f.setup, f.id.clone(), &mut f.h);
    let mut ask = async |req: &CoordRequest| -> CoordResponse {
        match h.send(Proto::Coord, protocol::encode(req).unwrap()).await {
            Outcome::Answer(b) => decode(&b),
            Outcome::Failed(e) => panic!("{req:?} failed: {e}"),
        }
    };
    assert!(matches!(
        ask(&CoordRequest::Register {
            n_train: 1_000_000_000_000,
            discrepancy: 0.0,
        })
        .await,
        CoordResponse::Ack
    ));
    let nodes = DiscoMember::start_honest(&f.p);
    let mut last = Vec::new();
    for round in 0..=3u64 {
        let params = match ask(&CoordRequest::Fetch { round }).await {
            CoordResponse::Global { params, .. } => params,
            other => panic!("round {round}: {other:?}"),
        };
        last = params.to_vec();
        if round == 3 {
            break;
        }
        let poison: Vec<f32> = (0..params.len())
            .map(|i| if i % 2 == 0 { 1e6 } else { -1e6 })
            .collect();
        let answer = ask(&CoordRequest::Update {
            round,
            params: Arc::new(poison),
            n_train: 1_000_000_000_000,
        })
        .await;
        assert!(matches!(answer, CoordResponse::Ack), "{answer:?}");
    }
    let lines = std::fs::read_to_string(setup.state_dir.join("coordinator.jsonl")).unwrap();
    let rounds: Vec<(usize, f64)> = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|l| {
            let peers = l["peers"].as_array()?.clone();
            let at = peers.iter().position(|p| p == &liar_id)?;
            Some((peers.len(), l["weights"][at].as_f64()?))
        })
        .collect();
    let weight = rounds.iter().map(|r| r.1).fold(0.0f64, f64::max);
    let biggest = last.iter().map(|x| f64::from(x.abs())).fold(0.0, f64::max);
    // The honest silos and the coordinator may have finished: stop them either way.
    f.stop(nodes);
    (weight, biggest, rounds)
}

/// Insiders' review D5, played with a member key: silo-2's key registers with a live FedDisco
/// coordinator, stays connected and is never heard from again, while the two honest silos run
/// 6 rounds. Every round awaits every registered member up to τ; with the excuse rule
/// (`excuse_rounds`, 100 by default) the member whose absence timed a round out is not
/// awaited in the rounds after it, so the federation loses two deadlines (the engine's first
/// round never excuses). With `excuse_rounds = 0` (the rule off, as before it) every round
/// waits its full τ.
#[tokio::test]
async fn a_silent_feddisco_registrant_costs_the_federation_one_deadline_not_every_round() {
    let rounds = 6;
    let (timed_out, excused, seconds) = silent_registrant(rounds, None).await;
    assert!(
        timed_out <= 2,
        "defended: {timed_out} of {rounds} rounds waited out τ"
    );
    // The rounds after the excuse name whom they closed without.
    assert!(
        excused >= rounds - 2,
        "only {excused} rounds list the excused member"
    );
    let (timed_out_off, excused_off, seconds_off) = silent_registrant(rounds, Some(0)).await;
    assert_eq!(
        timed_out_off, rounds,
        "undefended: every round should wait for the silent member"
    );
    assert_eq!(excused_off, 0);
    eprintln!(
        "silent FedDisco registrant, {rounds} rounds, tau 2 s: {timed_out} rounds timed out \
         ({seconds:.1} s) with the excuse rule, {timed_out_off} ({seconds_off:.1} s) without"
    );
}

/// Two honest FedDisco silos and a member with silo-2's key that registers and then stays
/// silent; the coordinator's τ is 2 s (`excuse_rounds` as given, else the default). The rounds
/// that timed out, the rounds whose line lists an excused member, and the seconds from the
/// registration to the last round's line.
async fn silent_registrant(rounds: usize, excuse_rounds: Option<u64>) -> (usize, usize, f64) {
    let over = [
        "split.clients=3".to_string(),
        format!("rounds={rounds}"),
        "eval_every=100".to_string(),
    ];
    let mut f = DiscoMember::start(&over, 2.0, 10.0, excuse_rounds).await;
    let register = CoordRequest::Register {
        n_train: 100,
        discrepancy: 0.1,
    };
    match f
        .h
        .send(Proto::Coord, protocol::encode(&register).unwrap())
        .await
    {
        Outcome::Answer(b) => assert!(matches!(decode(&b), CoordResponse::Ack)),
        Outcome::Failed(e) => panic!("registering failed: {e}"),
    }
    let started = Instant::now();
    let nodes = DiscoMember::start_honest(&f.p);
    // The member stays connected (its swarm is polled) and says nothing.
    let log = f.setup.state_dir.join("coordinator.jsonl");
    let coord_log = f.p.nodes_dir.join("coordinator.log");
    let read = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let until = Instant::now() + Duration::from_secs(120);
    while read().len() < rounds {
        assert!(
            Instant::now() < until,
            "{} of {rounds} rounds in 120 s; coordinator log:\n{}",
            read().len(),
            std::fs::read_to_string(&coord_log).unwrap_or_default()
        );
        let _ =
            tokio::time::timeout(Duration::from_millis(100), f.h.swarm.select_next_some()).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let lines = read();
    let timed_out = lines
        .iter()
        .filter(|l| l["timed_out"].as_bool() == Some(true))
        .count();
    let excused = lines
        .iter()
        .filter(|l| l["excused"].as_array().is_some_and(|a| !a.is_empty()))
        .count();
    f.stop(nodes);
    (timed_out, excused, seconds)
}

/// A three-silo FedDisco federation on the quick start (`over` added) with its coordinator
/// running (τ = `tau_s`, the silos' `fetch_s`; `excuse_rounds` written into its config when
/// given) and a client
/// holding silo-2's key connected to it: the member the FedDisco attack tests play. The
/// honest silos start when the test says ([`DiscoMember::start_honest`]).
struct DiscoMember {
    _dir: tempfile::TempDir,
    p: launch::Prepared,
    setup: coordinated::CoordinatorSetup,
    coordinator: KillOnDrop,
    h: Client,
    /// The member's peer ID.
    id: String,
}

impl DiscoMember {
    async fn start(over: &[String], tau_s: f64, fetch_s: f64, excuse_rounds: Option<u64>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let scenario = Scenario::load_with(Path::new("simulations/quickstart.toml"), over).unwrap();
        let p = launch::prepare(&scenario, 1, None, &Deadlines::default(), dir.path()).unwrap();
        let (d, alg) = (dir.path(), Algorithm::Feddisco);
        let setup = coordinated::add_coordinator(&p, &scenario, 1, d, tau_s, fetch_s, alg).unwrap();
        if let Some(n) = excuse_rounds {
            let text = std::fs::read_to_string(&setup.config).unwrap();
            let mut cfg: toml::Table = toml::from_str(&text).unwrap();
            cfg.insert("excuse_rounds".into(), toml::Value::Integer(n as i64));
            std::fs::write(&setup.config, toml::to_string(&cfg).unwrap()).unwrap();
        }
        let coord_log = p.nodes_dir.join("coordinator.log");
        let coordinator =
            KillOnDrop(coordinated::start_coordinator(Path::new(EXE), &setup, &coord_log).unwrap());
        let (h, id, _) = member_at_coordinator(&p, 2).await;
        Self {
            _dir: dir,
            p,
            setup,
            coordinator,
            h,
            id,
        }
    }

    /// Starts the honest silos of `p` (every silo of the federation but silo-2).
    fn start_honest(p: &launch::Prepared) -> Vec<KillOnDrop> {
        (0..p.configs.len())
            .filter(|&i| i != 2)
            .map(|i| {
                let log = p.nodes_dir.join(format!("silo-{i}.log"));
                KillOnDrop(launch::start_node(Path::new(EXE), &p.configs[i], &log).unwrap())
            })
            .collect()
    }

    /// Stops the honest silos and the coordinator, finished or not.
    fn stop(self, nodes: Vec<KillOnDrop>) {
        for mut c in nodes.into_iter().chain([self.coordinator]) {
            let _ = c.0.kill();
            let _ = c.0.wait();
            std::mem::forget(c);
        }
    }
}

/// A member that keeps sending garbage to a coordinator is disconnected and blocked after
/// `intake::BAD_FRAMES` bad frames, as a node blocks one (issue 18): its redial is refused,
/// the coordinator logs the block once, states its receive budget at start, and stays up.
#[tokio::test]
async fn a_bad_frame_storm_gets_a_member_blocked_by_the_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let over: Vec<String> = ["split.clients=2", "rounds=3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let scenario = Scenario::load_with(Path::new("simulations/quickstart.toml"), &over).unwrap();
    let p = launch::prepare(&scenario, 1, None, &Deadlines::default(), dir.path()).unwrap();
    let setup =
        coordinated::add_coordinator(&p, &scenario, 1, dir.path(), 3.0, 5.0, Algorithm::Hcct)
            .unwrap();
    let coord_log = p.nodes_dir.join("coordinator.log");
    let mut coordinator =
        KillOnDrop(coordinated::start_coordinator(Path::new(EXE), &setup, &coord_log).unwrap());
    let (mut h, hostile_id, addr) = member_at_coordinator(&p, 1).await;
    let coord_peer = h.node;
    // In good standing: a join is acknowledged.
    match h
        .send(
            Proto::Coord,
            protocol::encode(&CoordRequest::Join { n_train: 40 }).unwrap(),
        )
        .await
    {
        Outcome::Answer(b) => assert!(matches!(decode(&b), CoordResponse::Ack)),
        Outcome::Failed(e) => panic!("join failed: {e}"),
    }
    // The storm: well-framed garbage, one frame after the other, until the coordinator hangs up.
    let garbage = frame(&[0xff; 64]);
    let mut sent = 0;
    let mut closed = false;
    while !closed && sent < 3 * intake::BAD_FRAMES {
        let id = h
            .swarm
            .behaviour_mut()
            .coord
            .send_request(&coord_peer, garbage.clone());
        sent += 1;
        loop {
            match h.next().await {
                SwarmEvent::ConnectionClosed { peer_id, .. } if peer_id == coord_peer => {
                    closed = !h.swarm.is_connected(&coord_peer);
                    break;
                }
                SwarmEvent::Behaviour(HostileEvent::Coord(rr::Event::OutboundFailure {
                    request_id,
                    ..
                })) if request_id == id => break,
                SwarmEvent::Behaviour(HostileEvent::Coord(rr::Event::Message {
                    message:
                        rr::Message::Response {
                            request_id,
                            response,
                        },
                    ..
                })) if request_id == id => {
                    assert!(response.is_empty(), "the coordinator answered garbage");
                    break;
                }
                _ => {}
            }
        }
    }
    assert!(
        closed,
        "the coordinator kept the connection after {sent} bad frames"
    );
    assert!(
        sent >= intake::BAD_FRAMES,
        "cut after {sent} frames, before the threshold {}",
        intake::BAD_FRAMES
    );
    // Blocked: a redial is refused (the handshake completes, then the coordinator closes it).
    h.swarm.dial(addr.clone()).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let mut refused = false;
    while !refused && Instant::now() < until {
        match tokio::time::timeout(Duration::from_millis(100), h.swarm.select_next_some()).await {
            Ok(SwarmEvent::ConnectionClosed { peer_id, .. }) if peer_id == coord_peer => {
                refused = true;
            }
            Ok(SwarmEvent::OutgoingConnectionError { .. }) => refused = true,
            _ => {}
        }
    }
    assert!(
        refused && !h.swarm.is_connected(&coord_peer),
        "the blocked member's redial was kept"
    );
    assert!(
        coordinator.0.try_wait().unwrap().is_none(),
        "the coordinator exited"
    );
    let log = std::fs::read_to_string(&coord_log).unwrap();
    let blocked: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("disconnected and blocked a peer"))
        .collect();
    assert_eq!(blocked.len(), 1, "{log}");
    assert!(blocked[0].contains(&hostile_id), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("message bounds") && l.contains("receive_budget_kib")),
        "no receive budget stated:\n{log}"
    );
    // The block outlives a restart of the coordinator (insiders' review D2: it did not).
    drop(coordinator);
    let coord_log = p.nodes_dir.join("coordinator-2.log");
    let mut coordinator =
        KillOnDrop(coordinated::start_coordinator(Path::new(EXE), &setup, &coord_log).unwrap());
    let until = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&coord_log).is_ok_and(|l| l.contains("listening")) {
        assert!(
            Instant::now() < until,
            "the restarted coordinator never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = std::fs::read_to_string(&coord_log).unwrap();
    assert!(log.contains("blocks resumed from the block list"), "{log}");
    h.swarm.dial(addr).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let mut refused_again = false;
    while !refused_again && Instant::now() < until {
        let _ = tokio::time::timeout(Duration::from_millis(100), h.swarm.select_next_some()).await;
        refused_again = std::fs::read_to_string(&coord_log)
            .unwrap()
            .contains("refused a connection with a blocked peer");
    }
    assert!(
        refused_again && !h.swarm.is_connected(&coord_peer),
        "the restarted coordinator took the blocked member back:\n{}",
        std::fs::read_to_string(&coord_log).unwrap()
    );
    assert!(coordinator.0.try_wait().unwrap().is_none());
    eprintln!(
        "coordinator bad-frame storm: connection cut after {sent} bad frames (threshold {}); \
         the block held across a restart",
        intake::BAD_FRAMES
    );
}

/// A hostile third silo of a FedCollab federation (issue 5). It joins, then drives its pair
/// with silo-0 badly: garbage, weights of the wrong size, NaN weights, an accuracy outside
/// [0, 1], a round ahead of the pair, a stop the honest side would not make, and a step after
/// that. Each is refused with a reason (a round past 0 before the pair began gets `Restart`:
/// silo-0 holds no such pair); the pair counts as failed. It never contacts silo-1,
/// whose side of their pair gives up after 3·fetch_s. Its distance reports to the coordinator
/// that miss a partner, name itself or hold a value outside [-1, 1] are refused. The honest
/// silos' own pair is measured as usual, both finish, and the coordinator's record lists the
/// hostile silo's two pairs as failed.
#[tokio::test]
async fn a_hostile_fedcollab_silo_spoils_only_its_own_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let over: Vec<String> = [
        "split.clients=3",
        "rounds=3",
        "eval_every=1",
        "algorithms=[\"fedcollab\"]",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let scenario = Scenario::load_with(Path::new("simulations/quickstart.toml"), &over).unwrap();
    let deadlines = Deadlines {
        start_s: 10.0,
        ..Deadlines::default()
    };
    let p = launch::prepare(&scenario, 1, None, &deadlines, dir.path()).unwrap();
    let setup =
        coordinated::add_coordinator(&p, &scenario, 1, dir.path(), 3.0, 2.0, Algorithm::Fedcollab)
            .unwrap();
    let coord_log = p.nodes_dir.join("coordinator.log");
    let mut coordinator =
        KillOnDrop(coordinated::start_coordinator(Path::new(EXE), &setup, &coord_log).unwrap());
    let manifest = Manifest::load(&p.nodes_dir.join("../manifest.toml")).unwrap();
    let at = |m: &federico::net::Member| {
        m.addrs[0]
            .clone()
            .with(libp2p::multiaddr::Protocol::P2p(m.peer_id))
    };
    let coord = manifest.members.last().unwrap();
    let key = load_key(&NodeConfig::load(&p.configs[2]).unwrap().key).unwrap();
    let hostile_id = key.public().to_peer_id().to_string();
    let mut hc = Client {
        swarm: swarm(key.clone()),
        node: coord.peer_id,
        inbound: Vec::new(),
    };
    hc.connect(at(coord)).await;
    let mut nodes: Vec<KillOnDrop> = (0..2)
        .map(|i| {
            KillOnDrop(
                launch::start_node(
                    Path::new(EXE),
                    &p.configs[i],
                    &p.nodes_dir.join(format!("silo-{i}.log")),
                )
                .unwrap(),
            )
        })
        .collect();
    let coord_ask = async |h: &mut Client, req: &CoordRequest| -> CoordResponse {
        match h.send(Proto::Coord, protocol::encode(req).unwrap()).await {
            Outcome::Answer(b) => decode(&b),
            Outcome::Failed(e) => panic!("{req:?} failed: {e}"),
        }
    };
    assert!(matches!(
        coord_ask(&mut hc, &CoordRequest::Join { n_train: 40 }).await,
        CoordResponse::Ack
    ));
    // The plan is out once the honest silos joined too.
    match coord_ask(&mut hc, &CoordRequest::Fetch { round: 0 }).await {
        CoordResponse::DiscPlan { nodes: 3, .. } => {}
        other => panic!("{other:?}"),
    }

    // Silo-2 drives its pair with silo-0 (the higher index drives).
    let silo0 = &manifest.members[0];
    let mut h0 = Client {
        swarm: swarm(key),
        node: silo0.peer_id,
        inbound: Vec::new(),
    };
    h0.connect(at(silo0)).await;
    // The discriminator of this federation: 40 features + 8 labels → 200 → 2.
    let params = 200 + 48 * 200 + 2 + 200 * 2;
    let mut pair = async |req: &CollabRequest| -> CollabResponse {
        loop {
            let r = match h0.send(Proto::Collab, protocol::encode(req).unwrap()).await {
                Outcome::Answer(b) => decode(&b),
                Outcome::Failed(e) => panic!("{req:?} failed: {e}"),
            };
            match &r {
                // Silo-0 may not have built its discriminator yet.
                CollabResponse::NotReady { .. } => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                _ => return r,
            }
        }
    };
    let refused = |r: CollabResponse, what: &str| match r {
        CollabResponse::Error { reason } => {
            assert!(
                reason.contains(what),
                "refused, but for {reason:?}, not {what:?}"
            );
        }
        other => panic!("{other:?} where a refusal naming {what:?} was due"),
    };
    let step = |round, w: Vec<f32>, acc| CollabRequest::DiscStep {
        round,
        weights: Arc::new(w),
        acc,
    };
    refused(pair(&step(0, vec![0.0; 7], None)).await, "parameters");
    let mut nan = vec![0.0; params];
    nan[5] = f32::NAN;
    refused(pair(&step(0, nan, None)).await, "");
    refused(
        pair(&step(0, vec![0.0; params], Some(1.5))).await,
        "fraction",
    );
    // A round past 0 of a pair silo-0 does not hold: as after a restart, it asks to start
    // the pair over (and holds nothing for it).
    let r = pair(&step(4, vec![0.0; params], None)).await;
    assert!(matches!(r, CollabResponse::Restart), "{r:?}");
    // One well-formed round: silo-0 steps and answers with its weights and accuracy (round 0
    // is evaluated).
    match pair(&step(0, vec![0.0; params], None)).await {
        CollabResponse::DiscStep { weights, acc } => {
            assert_eq!(weights.len(), params);
            assert!(acc.is_some_and(|a| (0.0..=1.0).contains(&a)));
        }
        other => panic!("{other:?}"),
    }
    // A round ahead of the pair it now holds.
    refused(pair(&step(4, vec![0.0; params], None)).await, "round 4");
    refused(
        pair(&CollabRequest::DiscDone {
            rounds: 3,
            acc: None,
        })
        .await,
        "would not stop",
    );
    // "the pair (0, 2) is over", or "this silo's pairs are over" once its pair with silo-1 ended too.
    refused(pair(&step(1, vec![0.0; params], None)).await, "over");
    let outcome = h0.send(Proto::Collab, frame(&[0xff; 64])).await;
    assert!(
        matches!(&outcome, Outcome::Failed(_))
            || matches!(&outcome, Outcome::Answer(b) if b.is_empty()),
        "{outcome:?}"
    );

    // Its reports to the coordinator.
    let report = |v: &[(u32, Option<f64>)]| CoordRequest::Distances {
        pairs: v
            .iter()
            .map(|&(partner, distance)| PairDistance {
                partner,
                distance,
                rounds: 1,
            })
            .collect(),
    };
    let coord_refused = |r: CoordResponse, what: &str| match r {
        CoordResponse::Error { reason } => {
            assert!(
                reason.contains(what),
                "refused, but for {reason:?}, not {what:?}"
            );
        }
        other => panic!("{other:?} where a refusal naming {what:?} was due"),
    };
    coord_refused(coord_ask(&mut hc, &report(&[(0, None)])).await, "partners");
    coord_refused(
        coord_ask(&mut hc, &report(&[(0, None), (2, Some(0.0))])).await,
        "not a partner",
    );
    coord_refused(
        coord_ask(&mut hc, &report(&[(0, Some(2.0)), (1, None)])).await,
        "[-1, 1]",
    );
    assert!(matches!(
        coord_ask(&mut hc, &report(&[(0, None), (1, None)])).await,
        CoordResponse::Ack
    ));
    // It hears its own coalition only. The coalition waits for silo-1's distances, which come
    // once its pair with us gives up (3·fetch_s), and the coordinator holds a fetch at most 3τ
    // before it lets the stream go unanswered: ask again then, as a member does. (Once, the
    // test read that empty answer as a reply: CI of stop 51, on a loaded machine.)
    let fetch = protocol::encode(&CoordRequest::Fetch { round: 1 }).unwrap();
    let mut coalition = None;
    for _ in 0..5 {
        match hc.send(Proto::Coord, fetch.clone()).await {
            Outcome::Answer(b) if b.is_empty() => continue,
            Outcome::Answer(b) => {
                coalition = Some(decode::<CoordResponse>(&b));
                break;
            }
            Outcome::Failed(e) => panic!("the coalition fetch failed: {e}"),
        }
    }
    match coalition.expect("no coalition in five fetches of 3τ") {
        CoordResponse::Coalition { members, sizes } => {
            assert!(members.contains(&2));
            assert_eq!(members.len(), sizes.len());
        }
        other => panic!("{other:?}"),
    }

    // The honest silos finish (a coalition member that never answers is left out of each
    // round's average after fetch_s).
    let until = Instant::now() + Duration::from_secs(60);
    for (i, n) in nodes.iter_mut().enumerate() {
        let status = loop {
            if let Some(s) = n.0.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < until, "silo-{i} did not finish");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(status.success(), "silo-{i} exited {status}");
    }
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(setup.state_dir.join("fedcollab.json")).unwrap(),
    )
    .unwrap();
    let failed: Vec<(usize, usize)> = serde_json::from_value(record["failed"].clone()).unwrap();
    assert_eq!(failed, vec![(0, 2), (1, 2)], "{record}");
    let d: Vec<Vec<f64>> = serde_json::from_value(record["distances"].clone()).unwrap();
    assert_eq!(d[0][1], d[1][0], "the honest pair agrees");
    let mismatched: Vec<(usize, usize)> =
        serde_json::from_value(record["mismatched"].clone()).unwrap();
    assert!(mismatched.is_empty(), "{record}");
    let log0 = std::fs::read_to_string(p.nodes_dir.join("silo-0.log")).unwrap();
    assert_eq!(
        log0.lines()
            .filter(|l| l.contains("refused a pair request"))
            .count(),
        3,
        "{log0}"
    );
    assert!(
        log0.contains("the partner stopped where this side would not"),
        "{log0}"
    );
    let log1 = std::fs::read_to_string(p.nodes_dir.join("silo-1.log")).unwrap();
    assert!(log1.contains("pair partner silent"), "{log1}");
    let clog = std::fs::read_to_string(&coord_log).unwrap();
    assert_eq!(
        clog.lines()
            .filter(|l| l.contains("refused") && l.contains(&hostile_id))
            .count(),
        3,
        "the coordinator logged each refusal with the member's ID:\n{clog}"
    );
    for n in nodes {
        std::mem::forget(n);
    }
    let _ = coordinator.0.kill();
    let _ = coordinator.0.wait();
    std::mem::forget(coordinator);
}

/// A federation of three on one machine: silo-0 and silo-1 are real nodes (τ_model = τ_grad =
/// 2 s, one neighbour each), silo-2 is the test, a member holding silo-2's key. Returns once
/// silo-0 has run 10 rounds, with the test connected to silo-0.
struct Three {
    // Fields drop in order: the nodes go before their folder.
    _nodes: Vec<KillOnDrop>,
    _dir: tempfile::TempDir,
    run_log: std::path::PathBuf,
    node_log: std::path::PathBuf,
    h: Client,
}

impl Three {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let over: Vec<String> = [
            "split.clients=3",
            "split.groups=1",
            "rounds=100000",
            "eval_every=100000",
            "federico.neighbours=1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let scenario =
            Scenario::load_with(Path::new("simulations/quickstart.toml"), &over).unwrap();
        let deadlines = Deadlines {
            model_s: 2.0,
            gradient_s: 2.0,
            start_s: 1.0,
            // Round 1 at start_s with whoever came, as before nodes waited for a first peer.
            alone_s: Some(1.0),
            linger_s: 1.0,
        };
        let p = launch::prepare(&scenario, 1, None, &deadlines, dir.path()).unwrap();
        let mut nodes = Vec::new();
        for i in 0..2 {
            let log = p.nodes_dir.join(format!("silo-{i}.log"));
            nodes.push(KillOnDrop(
                launch::start_node(Path::new(EXE), &p.configs[i], &log).unwrap(),
            ));
        }
        let cfg = NodeConfig::load(&p.configs[0]).unwrap();
        let run_log = cfg.state_dir.join("rounds.jsonl");
        let until = Instant::now() + Duration::from_secs(60);
        while launch::read_run_log(&run_log).unwrap_or_default().len() < 10 {
            assert!(Instant::now() < until, "silo-0 did not reach round 10");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let manifest = Manifest::load(&cfg.manifest).unwrap();
        let node_id = manifest.members[0].peer_id;
        let addr = manifest.members[0].addrs[0]
            .clone()
            .with(libp2p::multiaddr::Protocol::P2p(node_id));
        let key = load_key(&NodeConfig::load(&p.configs[2]).unwrap().key).unwrap();
        let mut h = Client {
            swarm: swarm(key),
            node: node_id,
            inbound: Vec::new(),
        };
        h.connect(addr).await;
        Self {
            node_log: p.nodes_dir.join("silo-0.log"),
            _dir: dir,
            _nodes: nodes,
            run_log,
            h,
        }
    }

    fn rounds(&self) -> Vec<federico::trace::NodeRound> {
        launch::read_run_log(&self.run_log).unwrap_or_default()
    }

    /// `d` of saying nothing: the node's own requests to us are dropped unanswered.
    async fn silent_for(&mut self, d: Duration) {
        let pause = Instant::now() + d;
        while Instant::now() < pause {
            let _ = tokio::time::timeout(Duration::from_millis(50), self.h.step()).await;
            self.h.inbound.clear();
        }
    }

    /// silo-0's rounds since `from` that took at least 1.5 s (a wait at τ_grad = 2 s).
    fn stalls_since(&self, from: usize) -> Vec<(u64, f64)> {
        self.rounds()[from..]
            .iter()
            .filter(|r| r.seconds >= 1.5)
            .map(|r| (r.round, r.seconds))
            .collect()
    }
}

/// Attack M5 of the hostile-load review: a member pulls a model and never sends the gradient.
/// Once the two are running, silo-2 pulls from silo-0 eight times, a second apart, and never
/// answers — not a gradient, not a skip, not silo-0's own pulls. The owner waits τ_grad for it
/// once; after that it serves it without waiting (before the fix: three stalls,
/// `suspect_after`, each a full τ_grad, and with the default 60 s deadlines, three minutes).
#[tokio::test]
async fn a_member_that_pulls_and_never_pushes_stalls_an_owner_once() {
    let started = Instant::now();
    let mut f = Three::start().await;
    let attack_from = f.rounds().len();
    let attack_started = Instant::now();
    for _ in 0..8 {
        let m = params(f.h.model(ModelRequest::Pull { round: 1 }).await);
        assert!(!m.params.is_empty());
        f.silent_for(Duration::from_secs(1)).await;
    }
    let done = f.rounds().len();
    let stalls = f.stalls_since(attack_from);
    let slowest = f.rounds()[attack_from..]
        .iter()
        .map(|r| r.seconds)
        .fold(0.0f64, f64::max);
    eprintln!(
        "silent puller: 8 pulls over {:.1} s; silo-0 completed {} rounds, {} of them at τ_grad \
         ({stalls:?}), slowest {slowest:.2} s",
        attack_started.elapsed().as_secs_f64(),
        done - attack_from,
        stalls.len(),
    );
    assert!(stalls.len() <= 1, "the owner waited again: {stalls:?}");
    assert!(
        done - attack_from > 20,
        "silo-0 nearly stopped: {} rounds",
        done - attack_from
    );
    drop(f);
    eprintln!(
        "silent-puller test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Attack M5r of the insiders' review (`docs/insiders.md`): the same silent pull, re-armed. Each
/// cycle silo-2 pulls, says nothing past τ_grad, then sends the `Skip` it owed (refused as
/// stale) and pulls again. Before the fix the late `Skip` cleared the "silent" mark and the
/// owner waited out τ_grad again: 3 stalls in 4 cycles. Now a sampler that missed a step is on
/// probation for 100 rounds (`core::Stragglers::on_probation`): the owner waits for it at most
/// a grace of two normal rounds, whatever it sends in between. An honest sampler late once
/// stays awaited, briefly (`core::round`'s tests), so the federation stays in step.
#[tokio::test]
async fn a_member_cannot_re_arm_its_stall_with_late_skips() {
    let mut f = Three::start().await;
    let attack_from = f.rounds().len();
    let mut refused = Vec::new();
    for _ in 0..4 {
        let m = params(f.h.model(ModelRequest::Pull { round: 1 }).await);
        f.silent_for(Duration::from_millis(2500)).await;
        match f
            .h
            .gradient(GradientRequest::Skip { version: m.version })
            .await
        {
            GradientResponse::Rejected { reason } => refused.push(reason),
            GradientResponse::Accepted => {}
        }
    }
    f.silent_for(Duration::from_millis(500)).await;
    let stalls = f.stalls_since(attack_from);
    let done = f.rounds().len() - attack_from;
    eprintln!(
        "re-armed silent puller: 4 cycles, silo-0 completed {done} rounds, stalls {stalls:?}, \
         late skips refused: {refused:?}"
    );
    assert!(
        refused.iter().any(|r| r.contains("stale")),
        "the late skips were meant to be refused as stale: {refused:?}"
    );
    assert!(
        stalls.len() <= 1,
        "the late Skip re-armed the wait: {stalls:?}"
    );
}

/// Attack P3 of the insiders' review: a member pulls silo-0's model and answers with the
/// largest finite f32 in every coordinate, five times. It passes every check a gradient is
/// given (finite, right length, right fingerprint). Before the fix the owner's Adam state
/// overflowed to +inf and its model never changed again (0 of 328 parameters, across
/// restarts). Now the gradient enters the step scaled to the owner's norm bound, the model goes
/// on learning, and the node says so once; after four such gradients the owner distrusts the
/// member (`[defences] distrust`: its weight in the owner's row is 0 and its gradients are left
/// out) and says so too.
#[tokio::test]
async fn a_members_extreme_gradients_do_not_freeze_an_owners_model() {
    let mut f = Three::start().await;
    let mut attacked = Vec::new();
    while attacked.len() < 5 {
        let m = params(f.h.model(ModelRequest::Pull { round: 1 }).await);
        if attacked.contains(&m.version) {
            // Our gradient for this version is in: wait for the owner's next.
            f.silent_for(Duration::from_millis(20)).await;
            continue;
        }
        attacked.push(m.version);
        let r =
            f.h.gradient(GradientRequest::Gradient {
                version: m.version,
                fingerprint: m.fingerprint,
                n_train: 40,
                weight: 1.0,
                grad: vec![f32::MAX; m.params.len()],
            })
            .await;
        assert_eq!(r, GradientResponse::Accepted, "a finite gradient is taken");
    }
    let a = params(f.h.model(ModelRequest::Fetch { version: 0 }).await);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        f.silent_for(Duration::from_millis(200)).await;
        let b = params(f.h.model(ModelRequest::Fetch { version: 0 }).await);
        if b.version >= a.version + 10 {
            assert!(b.params.iter().all(|x| x.is_finite()));
            let changed = a
                .params
                .iter()
                .zip(b.params.iter())
                .filter(|(x, y)| x != y)
                .count();
            eprintln!(
                "after 5 gradients of f32::MAX: versions {} → {}, {changed} of {} parameters \
                 changed",
                a.version,
                b.version,
                a.params.len()
            );
            assert!(
                changed * 2 > a.params.len(),
                "the owner's model is frozen: {changed} of {} parameters changed in {} steps",
                a.params.len(),
                b.version - a.version
            );
            break;
        }
        assert!(
            Instant::now() < until,
            "silo-0 stopped at version {}",
            b.version
        );
    }
    let log = std::fs::read_to_string(&f.node_log).unwrap();
    // One line for the attacker (an honest member's gradient can cross the bound too, by
    // chance late in a run: that line names it, not silo-2).
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("far above the federation's typical norm")
                && l.contains("peer=silo-2"))
            .count(),
        1,
        "one warning naming the bound: {log}"
    );
    // One line for the attacker. (silo-1, honest, can be named too, later: two silos of a
    // few dozen rows each, sampling each other every round, overfit their own rows until each
    // one's gradient points against the other's; docs/insiders.md, "Distrust".)
    let distrusted = log
        .lines()
        .filter(|l| l.contains("[defences] distrust") && l.contains("peer=silo-2"))
        .count();
    assert_eq!(
        distrusted, 1,
        "one warning naming the distrusted member: {log}"
    );
}
