//! Received bytes and bad frames under attack (issue 18, "Hardening"): a member of the
//! federation turned against a live node process.
//!
//! A federation of three: silo-0 and silo-1 are real `federico node` processes; silo-2 is this
//! test, holding silo-2's key (so the nodes let it connect) and speaking the model protocol
//! through codecs of its own, so it can send anything. It never plays a round: the nodes' pulls
//! to it fail at once (it does not answer the protocol), so the two honest nodes go on
//! completing rounds between themselves, and any stall the attack causes shows in their run logs.
//!
//! - **Memory flood** (attack report M4: 4 streams × 200 MiB on one connection took a node from
//!   40 MB to 1.16 GB). The member keeps as many streams open as a connection may, each
//!   announcing a frame just under `max_message_mib` (256 MiB, set explicitly as in M4) and
//!   sending 200 MiB of it; the node's RSS must stay within 64 MiB of its level before the
//!   attack, and both honest nodes must keep completing rounds.
//! - **Bad-frame storm.** The member sends garbage frames one after the other; after
//!   `intake::BAD_FRAMES` of them the node disconnects and blocks it, refuses its redial, counts
//!   every refusal and the block, writes a bounded number of warning lines, and the federation
//!   keeps completing rounds.

use federico::launch;
use federico::net::config::Deadlines;
use federico::net::{Manifest, NodeConfig, intake, load_key};
use federico::protocol::{self, MODEL_PROTOCOL, ModelRequest};
use federico::scenario::Scenario;
use libp2p::futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, StreamExt};
use libp2p::request_response::{self as rr, ProtocolSupport};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm, SwarmBuilder, noise, tcp, yamux};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_federico");

/// Budget the node's RSS may grow by under the flood.
const RSS_BUDGET_KB: u64 = 64 << 10;

/// A flood request: announce `.0` bytes, send `.1` of them (zeros), stall for `hold` (the
/// stream left open, so the node waits for the rest), then wait for the node.
#[derive(Clone, Default)]
struct Flood {
    /// Body bytes written, all streams.
    sent: Arc<AtomicU64>,
    hold: Duration,
}

impl rr::Codec for Flood {
    type Protocol = StreamProtocol;
    type Request = (u64, u64);
    type Response = ();

    async fn read_request<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        _: &mut T,
    ) -> io::Result<(u64, u64)> {
        Err(io::Error::other("the attacker serves nothing"))
    }

    async fn read_response<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<()> {
        // Ends when the node resets or closes the stream.
        let mut b = [0u8; 1];
        io.read_exact(&mut b).await
    }

    async fn write_request<T: AsyncWrite + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        (announce, send): (u64, u64),
    ) -> io::Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        io.write_all(&announce.to_le_bytes()).await?;
        let mut left = send;
        while left > 0 {
            let n = left.min(ZEROS.len() as u64) as usize;
            io.write_all(&ZEROS[..n]).await?;
            self.sent.fetch_add(n as u64, Ordering::Relaxed);
            left -= n as u64;
        }
        io.flush().await?;
        tokio::time::sleep(self.hold).await;
        Ok(())
    }

    async fn write_response<T: AsyncWrite + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        _: &mut T,
        _: (),
    ) -> io::Result<()> {
        Ok(())
    }
}

/// Requests as raw bytes, written verbatim; responses read to the end of the stream.
#[derive(Clone, Default)]
struct Raw;

impl rr::Codec for Raw {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        _: &mut T,
    ) -> io::Result<Vec<u8>> {
        Err(io::Error::other("the attacker serves nothing"))
    }

    async fn read_response<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        io.take(1 << 20).read_to_end(&mut buf).await?;
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
        _: &mut T,
        _: Vec<u8>,
    ) -> io::Result<()> {
        Ok(())
    }
}

#[derive(NetworkBehaviour)]
struct Attacker {
    flood: rr::Behaviour<Flood>,
    raw: rr::Behaviour<Raw>,
}

fn attacker(key: libp2p::identity::Keypair, flood: Flood) -> Swarm<Attacker> {
    let cfg = rr::Config::default()
        .with_request_timeout(Duration::from_secs(120))
        .with_max_concurrent_streams(1024);
    let p = || {
        [(
            StreamProtocol::new(MODEL_PROTOCOL),
            ProtocolSupport::Outbound,
        )]
    };
    SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            yamux::Config::default,
        )
        .unwrap()
        .with_behaviour(|_| Attacker {
            flood: rr::Behaviour::with_codec(flood, p(), cfg.clone()),
            raw: rr::Behaviour::with_codec(Raw, p(), cfg.clone()),
        })
        .unwrap()
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(600)))
        .build()
}

/// Kills the node process when the test ends, pass or fail.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two honest nodes and the other silos' keys for the attackers (silo-2's first).
struct Federation {
    _dir: tempfile::TempDir,
    nodes: Vec<KillOnDrop>,
    state_dirs: Vec<PathBuf>,
    log: PathBuf,
    metrics: String,
    target: PeerId,
    addr: Multiaddr,
    key: libp2p::identity::Keypair,
    /// The keys of silo-2 onwards.
    keys: Vec<libp2p::identity::Keypair>,
}

/// Starts silo-0 (the target, serving metrics, with `max_message_mib`) and silo-1, in a
/// federation of three.
fn federation(max_message_mib: Option<u64>) -> Federation {
    federation_of(3, max_message_mib)
}

/// Starts silo-0 and silo-1 of a federation of `silos`.
fn federation_of(silos: usize, max_message_mib: Option<u64>) -> Federation {
    let dir = tempfile::tempdir().unwrap();
    let clients = format!("split.clients={silos}");
    let over: Vec<String> = [
        clients.as_str(),
        "split.groups=1",
        "rounds=100000",
        "eval_every=100000",
        "federico.neighbours=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let scenario = Scenario::load_with(Path::new("simulations/quickstart.toml"), &over).unwrap();
    // Long exchange deadlines (the node holds a flood stream as long as M4's did); the honest
    // pair never waits for silo-2, which neither pulls nor announces rounds.
    let deadlines = Deadlines {
        model_s: 60.0,
        gradient_s: 60.0,
        start_s: 2.0,
        // Round 1 at start_s with whoever came, as before nodes waited for a first peer.
        alone_s: Some(2.0),
        linger_s: 1.0,
    };
    let p = launch::prepare(&scenario, 1, None, &deadlines, dir.path()).unwrap();
    let metrics = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut cfg = NodeConfig::load(&p.configs[0]).unwrap();
    cfg.metrics = Some(metrics.clone());
    cfg.max_message_mib = max_message_mib;
    std::fs::write(&p.configs[0], toml::to_string(&cfg).unwrap()).unwrap();
    let log = p.nodes_dir.join("silo-0.log");
    let nodes = (0..2)
        .map(|i| {
            let log = p.nodes_dir.join(format!("silo-{i}.log"));
            KillOnDrop(launch::start_node(Path::new(EXE), &p.configs[i], &log).unwrap())
        })
        .collect();
    let manifest = Manifest::load(&cfg.manifest).unwrap();
    let target = manifest.members[0].peer_id;
    let addr = manifest.members[0].addrs[0]
        .clone()
        .with(libp2p::multiaddr::Protocol::P2p(target));
    let keys: Vec<_> = p.configs[2..]
        .iter()
        .map(|c| load_key(&NodeConfig::load(c).unwrap().key).unwrap())
        .collect();
    let key = keys[0].clone();
    Federation {
        _dir: dir,
        nodes,
        state_dirs: p.state_dirs[..2].to_vec(),
        log,
        metrics,
        target,
        addr,
        key,
        keys,
    }
}

impl Federation {
    /// Rounds each honest node has logged.
    fn rounds(&self) -> Vec<usize> {
        self.state_dirs
            .iter()
            .map(|d| launch::read_run_log(&d.join("rounds.jsonl")).unwrap().len())
            .collect()
    }

    /// Waits until every honest node has logged `n` more rounds than `from`.
    async fn wait_rounds(&self, from: &[usize], n: usize, within: Duration) -> Vec<usize> {
        let until = Instant::now() + within;
        loop {
            let now = self.rounds();
            if now.iter().zip(from).all(|(a, b)| *a >= b + n) {
                return now;
            }
            for (i, node) in self.nodes.iter().enumerate() {
                let pid = node.0.id();
                assert!(
                    Path::new(&format!("/proc/{pid}")).exists(),
                    "silo-{i} exited"
                );
            }
            assert!(
                Instant::now() < until,
                "the honest nodes did not complete {n} rounds in {within:?}: {from:?} → {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Each honest node's longest round among its rounds `from[i]..`, in seconds.
    fn longest(&self, from: &[usize]) -> Vec<f64> {
        self.state_dirs
            .iter()
            .zip(from)
            .map(|(d, &from)| {
                launch::read_run_log(&d.join("rounds.jsonl"))
                    .unwrap()
                    .iter()
                    .skip(from)
                    .map(|r| r.seconds)
                    .fold(0.0, f64::max)
            })
            .collect()
    }

    fn pid(&self) -> u32 {
        self.nodes[0].0.id()
    }

    async fn connect(&self, swarm: &mut Swarm<Attacker>) {
        swarm.dial(self.addr.clone()).unwrap();
        loop {
            match next(swarm).await {
                SwarmEvent::ConnectionEstablished { peer_id, .. } if peer_id == self.target => {
                    break;
                }
                SwarmEvent::OutgoingConnectionError { error, .. } => panic!("dial: {error}"),
                _ => {}
            }
        }
        // "Finished": the owner need not wait for our pulls or notices, so a round takes what
        // the two honest nodes take, and any slowdown is the attack's.
        let done = protocol::encode(&ModelRequest::Done).unwrap();
        let (answered, _) = send(swarm, self.target, done).await;
        assert!(answered, "the node did not acknowledge our Done");
    }
}

async fn next(swarm: &mut Swarm<Attacker>) -> SwarmEvent<AttackerEvent> {
    tokio::time::timeout(Duration::from_secs(30), swarm.select_next_some())
        .await
        .expect("no event from the swarm for 30 s")
}

/// Sends `bytes` on the model protocol; whether the node answered (with anything) and whether
/// it closed the connection meanwhile.
async fn send(swarm: &mut Swarm<Attacker>, target: PeerId, bytes: Vec<u8>) -> (bool, bool) {
    let id = swarm.behaviour_mut().raw.send_request(&target, bytes);
    let mut closed = false;
    loop {
        match next(swarm).await {
            SwarmEvent::Behaviour(AttackerEvent::Raw(rr::Event::Message {
                message:
                    rr::Message::Response {
                        request_id,
                        response,
                    },
                ..
            })) if request_id == id => return (!response.is_empty(), closed),
            SwarmEvent::Behaviour(AttackerEvent::Raw(rr::Event::OutboundFailure {
                request_id,
                ..
            })) if request_id == id => return (false, closed),
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } if peer_id == target => closed = true,
            _ => {}
        }
    }
}

/// `VmRSS` and `VmHWM` of a process, in kB.
fn memory_kb(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The node's counters: `federico_rejected_messages_total` by reason, plus
/// `federico_blocked_peers_total` under `"blocked_peers"`.
fn scrape(addr: &str) -> BTreeMap<String, u64> {
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sock.write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    sock.read_to_string(&mut text).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("federico_rejected_messages_total{reason=\"") {
            let (reason, n) = rest.split_once("\"} ").unwrap();
            out.insert(reason.to_string(), n.parse().unwrap());
        } else if let Some(n) = line.strip_prefix("federico_blocked_peers_total ") {
            out.insert("blocked_peers".into(), n.parse().unwrap());
        } else if let Some(n) = line.strip_prefix("federico_receiving_bytes ") {
            out.insert("receiving_bytes".into(), n.parse().unwrap());
        }
    }
    out
}

#[tokio::test]
async fn a_member_memory_flood_stays_within_the_receive_budget() {
    let started = Instant::now();
    // As in M4: the per-frame bound left at 256 MiB, so only the receive budget stands between
    // the flood and the node's memory.
    let fed = federation(Some(256));
    let r0 = fed.wait_rounds(&[0, 0], 3, Duration::from_secs(30)).await;
    let (before, _) = memory_kb(fed.pid());

    let flood = Flood::default();
    let mut swarm = attacker(fed.key.clone(), flood.clone());
    fed.connect(&mut swarm).await;
    // RSS sampled every 20 ms from here until the end.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, pid) = (stop.clone(), fed.pid());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(memory_kb(pid).0);
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    // As many streams as a connection may carry (the node's yamux allows 64 in all, a few of
    // them its own), each announcing 255 MiB and sending 200 MiB; every stream that ends is
    // replaced at once.
    const STREAMS: usize = 56;
    let request = (255u64 << 20, 200u64 << 20);
    let mut open = 0;
    let (mut ended, mut completed) = (0u64, 0u64);
    let attack = Instant::now();
    while attack.elapsed() < Duration::from_secs(8) {
        while open < STREAMS {
            swarm
                .behaviour_mut()
                .flood
                .send_request(&fed.target, request);
            open += 1;
        }
        let ev = tokio::time::timeout(Duration::from_millis(200), swarm.select_next_some()).await;
        match ev {
            Ok(SwarmEvent::Behaviour(AttackerEvent::Flood(rr::Event::OutboundFailure {
                ..
            }))) => {
                open -= 1;
                ended += 1;
            }
            Ok(SwarmEvent::Behaviour(AttackerEvent::Flood(rr::Event::Message { .. }))) => {
                open -= 1;
                completed += 1;
            }
            Ok(SwarmEvent::ConnectionClosed { .. }) => {
                // The node may drop us (e.g. yamux on a stream too many): come back.
                open = 0;
                fed.connect(&mut swarm).await;
            }
            _ => {}
        }
    }
    let r_attack = fed.rounds();
    let sent = flood.sent.load(Ordering::Relaxed);
    drop(swarm);
    let r_after = fed.wait_rounds(&r_attack, 3, Duration::from_secs(20)).await;
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    let (after, hwm) = memory_kb(fed.pid());
    let counts = scrape(&fed.metrics);
    let longest = fed.longest(&r0);
    eprintln!(
        "memory flood: RSS before {before} kB, peak {peak} kB (+{} kB), after {after} kB, \
         VmHWM {hwm} kB; attacker sent {} MiB on {} streams that ended ({completed} answered); \
         refusals {counts:?}; rounds {r0:?} → {r_attack:?} (8 s of attack) → {r_after:?}, \
         longest round since the attack began {longest:.2?} s; {:.1} s",
        peak.saturating_sub(before),
        sent >> 20,
        ended,
        started.elapsed().as_secs_f64()
    );
    // The attack pushed against the bounds: more bytes sent than the RSS budget, and frames
    // refused for the budget or the stream bound.
    assert!(
        sent > 2 * (RSS_BUDGET_KB << 10),
        "the flood sent only {} MiB",
        sent >> 20
    );
    assert!(
        counts.get("over_budget").copied().unwrap_or(0) > 0,
        "no frame was refused for the budget: {counts:?}"
    );
    assert!(
        peak <= before + RSS_BUDGET_KB,
        "RSS grew from {before} kB to {peak} kB, more than {RSS_BUDGET_KB} kB"
    );
    assert!(
        r_attack.iter().zip(&r0).all(|(a, b)| a > b),
        "an honest node completed no round during the attack: {r0:?} → {r_attack:?}"
    );
    // No round waited out a deadline (τ = 60 s here) for an honest message the budget refused.
    assert!(
        longest.iter().all(|&s| s < 5.0),
        "a round took {longest:?} s under the flood"
    );
}

/// Attack M4b (insiders' review): four colluding members each hold their whole share of the
/// target's receive budget (a quarter) with frames that trickle in and stall, so together the
/// whole budget, for as long as the node waits for the rest of a frame. Before member floors
/// every frame silo-1 sent silo-0 was refused `over_budget` and the honest pair stopped; now
/// each member has a floor of its own, and the pair goes on.
#[tokio::test]
async fn colluding_members_holding_the_whole_budget_do_not_starve_an_honest_one() {
    // As in M4, `max_message_mib` raised to 256 (the default for this tiny model, 66 KiB,
    // caps what one peer can hold at 16 streams × 66 KiB, far below its share; a model of a
    // few million parameters gets a default bound as large as the share).
    let fed = federation_of(6, Some(256));
    let r0 = fed.wait_rounds(&[0, 0], 3, Duration::from_secs(30)).await;
    // Each colluder: 12 streams, each announcing 255 MiB and sending 256 KiB + 1 byte, which
    // makes the node hold 512 KiB for it (its buffer doubles from 64 KiB): 6 MiB each, the
    // quarter of the 24 MiB budget a peer may hold.
    let request = (255u64 << 20, (256u64 << 10) + 1);
    let mut tasks = Vec::new();
    for key in &fed.keys {
        let flood = Flood {
            hold: Duration::from_secs(9),
            ..Flood::default()
        };
        let mut swarm = attacker(key.clone(), flood.clone());
        fed.connect(&mut swarm).await;
        for _ in 0..12 {
            swarm
                .behaviour_mut()
                .flood
                .send_request(&fed.target, request);
        }
        let stop = Instant::now() + Duration::from_secs(10);
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let _ = tokio::time::timeout(Duration::from_millis(100), swarm.select_next_some())
                    .await;
            }
            flood.sent.load(Ordering::Relaxed)
        }));
    }
    // The frames are in; from here the budget is as full as the colluders can make it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r_full = fed.rounds();
    let held = scrape(&fed.metrics)["receiving_bytes"];
    tokio::time::sleep(Duration::from_secs(6)).await;
    let r_attack = fed.rounds();
    let held_after = scrape(&fed.metrics)["receiving_bytes"];
    let counts = scrape(&fed.metrics);
    let mut sent = 0;
    for t in tasks {
        sent += t.await.unwrap();
    }
    let longest = fed.longest(&r_full);
    eprintln!(
        "colluders: sent {} KiB; the node held {} KiB, then {} KiB; refusals {counts:?}; rounds {r0:?} → {r_full:?} → {r_attack:?} \
         (6 s with the budget held), longest round {longest:.2?} s",
        sent >> 10,
        held >> 10,
        held_after >> 10
    );
    // The colluders held all they could: the budget but for silo-1's floor.
    let budget = intake::MIN_RECEIVE_BUDGET;
    assert!(
        held.min(held_after) >= budget - (1 << 20),
        "the colluders held only {held} and {held_after} of {budget} bytes"
    );
    assert!(
        sent >= 4 * 12 * (256 << 10),
        "the colluders sent only {sent} bytes"
    );
    assert!(
        r_attack.iter().zip(&r_full).all(|(a, b)| a >= &(b + 3)),
        "the honest pair stalled while the colluders held the budget: {r_full:?} → {r_attack:?}"
    );
    assert!(
        longest.iter().all(|&s| s < 5.0),
        "a round took {longest:?} s while the colluders held the budget"
    );
}

#[tokio::test]
async fn a_bad_frame_storm_gets_the_member_blocked() {
    let started = Instant::now();
    let fed = federation(None);
    let r0 = fed.wait_rounds(&[0, 0], 3, Duration::from_secs(30)).await;
    let mut swarm = attacker(fed.key.clone(), Flood::default());
    fed.connect(&mut swarm).await;
    let fetch = protocol::encode(&ModelRequest::Fetch { version: 0 }).unwrap();
    // A member in good standing: its fetch is answered.
    let (answered, _) = send(&mut swarm, fed.target, fetch.clone()).await;
    assert!(answered, "the node did not answer a fetch before the storm");
    // The storm: well-framed garbage, one frame after the other, until the node hangs up.
    let garbage = {
        let mut f = 6u64.to_le_bytes().to_vec();
        f.extend([0xFF; 6]);
        f
    };
    let mut sent = 0;
    let mut closed = false;
    while !closed && sent < 3 * intake::BAD_FRAMES {
        let (answered, c) = send(&mut swarm, fed.target, garbage.clone()).await;
        assert!(!answered, "the node answered garbage");
        sent += 1;
        closed = c || !swarm.is_connected(&fed.target);
    }
    assert!(
        closed,
        "the node kept the connection after {sent} bad frames"
    );
    let cut_after = sent;
    // Blocked: a redial is refused (the handshake completes, then the node closes it), and a
    // fetch gets no answer.
    swarm.dial(fed.addr.clone()).unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let mut refused = false;
    while !refused && Instant::now() < until {
        match tokio::time::timeout(Duration::from_millis(100), swarm.select_next_some()).await {
            Ok(SwarmEvent::ConnectionClosed { peer_id, .. }) if peer_id == fed.target => {
                refused = true;
            }
            Ok(SwarmEvent::OutgoingConnectionError { .. }) => refused = true,
            _ => {}
        }
    }
    assert!(
        refused && !swarm.is_connected(&fed.target),
        "the blocked member's redial was kept"
    );
    let (answered, _) = send(&mut swarm, fed.target, fetch.clone()).await;
    assert!(!answered, "a blocked member's fetch was answered");
    // The federation goes on.
    let r1 = fed.rounds();
    let r2 = fed.wait_rounds(&r1, 3, Duration::from_secs(20)).await;
    let counts = scrape(&fed.metrics);
    let log = std::fs::read_to_string(&fed.log).unwrap();
    let refused_lines = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("refused a frame"))
        .count();
    let blocked_lines = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("blocked a peer"))
        .count();
    let refused_conn_lines = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("refused a connection with a blocked peer"))
        .count();
    eprintln!(
        "bad-frame storm: connection cut after {cut_after} bad frames (threshold {}), \
         counters {counts:?}, WARN lines: {refused_lines} refused-frame, {blocked_lines} \
         blocked, {refused_conn_lines} refused-connection; rounds {r0:?} → {r1:?} → {r2:?}; \
         {:.1} s",
        intake::BAD_FRAMES,
        started.elapsed().as_secs_f64()
    );
    let garbage_count = counts.get("garbage").copied().unwrap_or(0);
    assert!(
        (intake::BAD_FRAMES as u64..=cut_after as u64).contains(&garbage_count),
        "{garbage_count} garbage frames counted, {cut_after} sent, threshold {}",
        intake::BAD_FRAMES
    );
    assert_eq!(counts.get("blocked_peers"), Some(&1), "{counts:?}");
    assert_eq!(
        counts.get("not_a_member"),
        None,
        "a blocked member is not counted as an outsider"
    );
    let peer = fed.key.public().to_peer_id().to_string();
    assert!(
        log.lines()
            .any(|l| l.contains("reason=garbage") && l.contains(&peer)),
        "no warning names the member"
    );
    // One warning line per peer and reason per period, however many frames.
    assert!(
        refused_lines <= 2,
        "{refused_lines} refused-frame warnings for {garbage_count} frames"
    );
    assert_eq!(blocked_lines, 1);
    assert!((1..=2).contains(&refused_conn_lines));
}
