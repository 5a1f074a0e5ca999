//! The local swarm (`federico swarm`) and shard writing (`federico partition`): N real
//! `federico node` processes on 127.0.0.1, launched, watched and reported by one command.
//! Owns: the run directory (keys, manifest, node configs, shards, node logs), free ports,
//! starting and stopping the processes, the progress bar, and merging the nodes' run logs into
//! the same `rounds.jsonl`, `summary.json`, table and plots as `simulate`.
//! Must not: take part in a round (the nodes run the federation on their own), or import
//! `sim`: the fault checks' simulated baseline comes from the caller ([`SwarmOptions::baseline`]).
//!
//! Layout: the run directory and each seed's run (set-up, the node processes, the report) are
//! here; `procs.rs` starts, watches and stops the node processes; `outcome.rs` merges their
//! run logs and computes the figures and fault checks; `faults.rs` applies a fault schedule;
//! `netns.rs` sets up network namespaces (behind NAT, `relay.rs` keeps the relay up);
//! `coordinated.rs` runs the coordinated algorithms.

pub mod coordinated;
mod faults;
mod init;
mod netns;
mod outcome;
mod procs;
mod relay;

use crate::faults::Schedule;
use crate::learn::{Federation, Shard};
use crate::net::config::Deadlines;
use crate::net::node::NodeRound;
use crate::net::{Manifest, Member, NodeConfig, keygen, load_key};
use crate::report::logs::{NodeSeed, read_node_log, write_node_seed};
use crate::report::records::RunSummary;
use crate::report::summary::{Curves, Outcome, Report, write_json, write_summary};
use crate::scenario::{Algorithm, Scenario};
use crate::trace::EvalRecord;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use init::{DEFAULT_SCENARIO, Initialised, init};
pub use outcome::{Paths, SwarmFigures, read_run_log};
use outcome::{fault_report, figures};
pub use procs::start_node;
use procs::{Proc, start_silo, stop_all, tail, watch};

/// Writes one shard per silo of `scenario`'s split for `seed` into `out`, plus
/// `partition.json`; returns the shard paths in node order and the federation's one-epoch sub-step count ([`Federation::epoch_steps`]) for its
/// manifest.
pub fn write_shards(
    scenario: &Scenario,
    seed: u64,
    data_dir: Option<&Path>,
    out: &Path,
) -> anyhow::Result<(Vec<PathBuf>, u64)> {
    let (fed, paths) = split(scenario, seed, data_dir, out)?;
    Ok((paths, fed.epoch_steps(scenario.train.batch_size)))
}

fn split(
    scenario: &Scenario,
    seed: u64,
    data_dir: Option<&Path>,
    out: &Path,
) -> anyhow::Result<(Federation, Vec<PathBuf>)> {
    let real = scenario.load_real(scenario.data_dir(data_dir).as_deref())?;
    let (fed, scale) = scenario.federation_scaled(real.as_ref(), &mut Scenario::data_rng(seed))?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    if let Some(scale) = scale {
        // The shards hold standardized features; new rows need the same constants.
        let path = out.join("scale.json");
        std::fs::write(&path, serde_json::to_string_pretty(&scale)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(names) = real.as_ref().and_then(|r| r.class_names()) {
        // The shards' labels are class ids; a node's exported card names them.
        let path = out.join(crate::learn::export::CLASSES_FILE);
        std::fs::write(&path, serde_json::to_string(names)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let mut paths = Vec::new();
    for (i, client) in fed.clients.iter().enumerate() {
        let path = out.join(format!("silo-{i}.shard"));
        Shard {
            silo: format!("silo-{i}"),
            node: i as u32,
            provenance: format!("{} seed {seed}", scenario.name),
            data: client.clone(),
        }
        .write(&path)?;
        paths.push(path);
    }
    let report = out.join("partition.json");
    std::fs::write(&report, serde_json::to_string_pretty(&fed.report())? + "\n")
        .with_context(|| format!("writing {}", report.display()))?;
    Ok((fed, paths))
}

/// How to run a swarm.
#[derive(Clone, Debug)]
pub struct SwarmOptions {
    /// Run directory.
    pub out: PathBuf,
    /// Data directory for real data.
    pub data_dir: Option<PathBuf>,
    /// The `federico` executable to start nodes with.
    pub exe: PathBuf,
    /// Show a progress bar.
    pub progress: bool,
    /// Node deadlines.
    pub deadlines: Deadlines,
    /// Give up on the whole swarm after this long.
    pub timeout: Duration,
    /// Each node in its own network namespace, partitions cut in the kernel (Linux, root).
    pub netns: bool,
    /// Behind NAT: the silos at this many NATed sites (network namespaces, `nft` masquerade),
    /// reaching each other through a `federico relay` on the public side (implies `netns`).
    pub nat: Option<usize>,
    /// The fault checks' accuracy baseline (`faults.baseline`): the CLI passes the
    /// simulator's fault-free run. `None` refuses a schedule that asks for a baseline.
    pub baseline: Option<Baseline>,
}

/// The simulator's fault-free run of `scenario` at a seed (data from the directory given, if
/// any), scored: each silo's final evaluation. A faulty swarm's finals are checked against it
/// (the fault-free swarm reproduces the simulator decision for decision, `tests/swarm.rs`).
/// The caller supplies it (the CLI passes `sim::fault_free_finals`): `launch` never runs the
/// simulator itself.
pub type Baseline = fn(&Scenario, u64, Option<&Path>) -> anyhow::Result<Vec<Option<EvalRecord>>>;

/// Why `SwarmOptions::netns` cannot run on this machine (not Linux, not root, no `ip`, or no
/// namespaces allowed), or `None` when it can.
pub fn netns_unavailable() -> Option<String> {
    netns::unavailable()
}

/// Why `SwarmOptions::nat` cannot run here (what [`netns_unavailable`] says, or no `nft`).
pub fn nat_unavailable() -> Option<String> {
    netns::unavailable().or_else(netns::nat_unavailable)
}

/// Free TCP ports on 127.0.0.1 (bound, read, released; nodes bind them when they start).
/// They are drawn from below Linux's ephemeral range (32768–60999), where the kernel does not
/// hand out ports to other programs' outgoing connections or `bind(0)`: a late joiner starts
/// rounds after its port was chosen, and a port from the ephemeral range could be taken by then.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    use rand::RngExt;
    let mut rng = rand::rng();
    let mut held: Vec<std::net::TcpListener> = Vec::with_capacity(n);
    for _ in 0..n * 50 {
        if held.len() == n {
            break;
        }
        let port: u16 = rng.random_range(20_000..32_768);
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    // Crowded below the range: let the kernel pick the rest.
    while held.len() < n {
        held.push(
            std::net::TcpListener::bind("127.0.0.1:0")
                .context("finding free ports on 127.0.0.1")?,
        );
    }
    held.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// Runs every seed of `scenario` as a swarm of node processes; writes what `simulate` writes.
pub fn swarm(scenario: &Scenario, opts: &SwarmOptions) -> anyhow::Result<Outcome> {
    // Every path a node is given is absolute: a node resolves relative paths against its own
    // config's folder, not against the directory the swarm was started from.
    let absolute;
    let opts = if opts.out.is_absolute() {
        opts
    } else {
        let out = std::path::absolute(&opts.out)
            .with_context(|| format!("--out {}", opts.out.display()))?;
        absolute = SwarmOptions {
            out,
            ..opts.clone()
        };
        &absolute
    };
    // FedeRiCo runs peer to peer when the scenario lists it; else FedDisco or HCCT with a
    // coordinator process. The scenario's other algorithms are in-process only.
    if !scenario.algorithms.contains(&Algorithm::Federico) {
        let coordinated: Vec<Algorithm> = scenario
            .algorithms
            .iter()
            .copied()
            .filter(|a| coordinated::NETWORKED.contains(a))
            .collect();
        match coordinated[..] {
            [one] => return swarm_coordinated(scenario, opts, one),
            [] => {}
            _ => bail!(
                "`federico swarm` runs one coordinator algorithm at a time; the scenario lists {} (pick one with --set 'algorithms=[\"...\"]')",
                coordinated
                    .iter()
                    .map(|a| a.name())
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        }
        bail!(
            "`federico swarm` runs federico (peer to peer), or feddisco or hcct (with a coordinator); the scenario lists {}",
            scenario
                .algorithms
                .iter()
                .map(|a| a.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut runs = Vec::new();
    let mut curves = Vec::new();
    let mut meta = None;
    for &seed in &scenario.seeds {
        let dir = opts.out.join(format!("seed-{seed}"));
        let r = run_seed(scenario, seed, opts, &dir)?;
        meta.get_or_insert((r.spec.clone(), r.num_params, r.clients, r.regression));
        curves.push(r.curves);
        runs.push(r.summary);
    }
    let (spec, num_params, clients, regression) = meta.context("no seeds")?;
    let out = write_summary(
        &scenario.name,
        scenario.rounds,
        &opts.out,
        &[Algorithm::Federico],
        Report {
            spec: Some(spec),
            num_params,
            clients,
            regression,
            runs,
            curves,
        },
    )?;
    Ok(out)
}

/// [`swarm`] for a coordinator algorithm: a coordinator and coordinated nodes per seed.
fn swarm_coordinated(
    scenario: &Scenario,
    opts: &SwarmOptions,
    algorithm: Algorithm,
) -> anyhow::Result<Outcome> {
    if opts.netns || opts.nat.is_some() {
        bail!("--netns and --nat run FedeRiCo swarms only");
    }
    let mut runs = Vec::new();
    let mut curves = Vec::new();
    let mut meta = None;
    for &seed in &scenario.seeds {
        let dir = opts.out.join(format!("seed-{seed}"));
        let r = coordinated::run_seed(scenario, seed, opts, &dir, algorithm)?;
        meta.get_or_insert((r.spec.clone(), r.num_params, r.clients));
        curves.push(r.curves);
        runs.push(r.summary);
    }
    let (spec, num_params, clients) = meta.context("no seeds")?;
    Ok(write_summary(
        &scenario.name,
        scenario.rounds,
        &opts.out,
        &[algorithm],
        Report {
            spec: Some(spec),
            num_params,
            clients,
            regression: false,
            runs,
            curves,
        },
    )?)
}

struct SeedOutcome {
    summary: RunSummary,
    curves: Curves,
    spec: crate::learn::ModelSpec,
    num_params: usize,
    clients: usize,
    regression: bool,
}

/// A swarm run directory, ready to start: keys, manifest, shards and one config per node.
pub struct Prepared {
    /// The seed's split (for groups and reports).
    pub federation: Federation,
    /// Node names, in manifest order.
    pub names: Vec<String>,
    /// Each node's config file.
    pub configs: Vec<PathBuf>,
    /// Each node's state directory (checkpoint, run log).
    pub state_dirs: Vec<PathBuf>,
    /// Where node logs go.
    pub nodes_dir: PathBuf,
    /// The model every silo runs.
    pub spec: crate::learn::ModelSpec,
}

/// Writes a swarm run directory for `scenario` at `seed` under `dir`: shards, keys, a closed
/// manifest with 127.0.0.1 addresses on free ports, and node configs.
pub fn prepare(
    scenario: &Scenario,
    seed: u64,
    data_dir: Option<&Path>,
    deadlines: &Deadlines,
    dir: &Path,
) -> anyhow::Result<Prepared> {
    prepare_at(
        scenario,
        seed,
        data_dir,
        deadlines,
        dir,
        Placement {
            hosts: None,
            relay: None,
        },
    )
}

/// Where the silos of a swarm run: each at its own address (a network namespace's) on
/// [`netns::NODE_PORT`] when `hosts` is given, else on 127.0.0.1; behind NAT, reached through
/// the relay at `relay` (the manifest then lists no member address: none accepts a connection).
struct Placement<'a> {
    hosts: Option<&'a [std::net::Ipv4Addr]>,
    relay: Option<std::net::Ipv4Addr>,
}

/// [`prepare`], with each silo at its own address (a network namespace's) on
/// [`netns::NODE_PORT`] when `hosts` is given.
fn prepare_at(
    scenario: &Scenario,
    seed: u64,
    data_dir: Option<&Path>,
    deadlines: &Deadlines,
    dir: &Path,
    at: Placement<'_>,
) -> anyhow::Result<Prepared> {
    let hosts = at.hosts;
    if dir.join("nodes").exists() {
        bail!(
            "{} already holds a swarm run; choose another --out (nodes would resume from its checkpoints)",
            dir.display()
        );
    }
    let (fed, shards) = split(scenario, seed, data_dir, &dir.join("shards"))?;
    let k = fed.clients.len();
    let first = &fed.clients[0].train;
    let spec = scenario.model_spec(&first.sample_shape, first.num_classes())?;

    // Keys, addresses, manifest.
    let (hosts, ports): (Vec<std::net::Ipv4Addr>, Vec<u16>) = match hosts {
        // Behind NAT, a port per silo: a site's NAT keeps each silo's port on the public side
        // only when they differ (hole punching dials the port the relay saw).
        Some(h) if h.len() == k && at.relay.is_some() => (
            h.to_vec(),
            (0..k).map(|i| netns::NODE_PORT + i as u16).collect(),
        ),
        Some(h) if h.len() == k => (h.to_vec(), vec![netns::NODE_PORT; k]),
        Some(h) => bail!("{} addresses for {k} silos", h.len()),
        None => (vec![std::net::Ipv4Addr::LOCALHOST; k], free_ports(k)?),
    };
    let mut members = Vec::with_capacity(k);
    for (i, port) in ports.iter().enumerate() {
        let key_path = dir.join("keys").join(format!("silo-{i}.key"));
        let key = if key_path.exists() {
            load_key(&key_path)?
        } else {
            keygen(&key_path)?
        };
        members.push(Member {
            name: format!("silo-{i}"),
            peer_id: key.public().to_peer_id(),
            addrs: match at.relay {
                Some(_) => Vec::new(),
                None => vec![format!("/ip4/{}/tcp/{port}", hosts[i]).parse()?],
            },
        });
    }
    let relays = match at.relay {
        Some(r) => {
            let key_path = dir.join("keys").join("relay.key");
            let key = if key_path.exists() {
                load_key(&key_path)?
            } else {
                keygen(&key_path)?
            };
            let id = key.public().to_peer_id();
            // QUIC first: the reservation runs over it, so the relay sees (and tells) each
            // silo's UDP mapping, which hole punching uses.
            [
                format!("/ip4/{r}/udp/{}/quic-v1/p2p/{id}", relay::RELAY_PORT),
                format!("/ip4/{r}/tcp/{}/p2p/{id}", relay::RELAY_PORT),
            ]
            .into_iter()
            .map(|a| {
                Ok(crate::net::identity::Relay {
                    peer_id: id,
                    addr: a.parse()?,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?
        }
        None => Vec::new(),
    };
    let manifest = Manifest {
        open: false,
        epoch_steps: Some(fed.epoch_steps(scenario.train.batch_size)),
        members,
        relays,
    };
    let manifest_path = dir.join("manifest.toml");
    std::fs::write(&manifest_path, manifest.to_toml())?;

    // One config per node, written as a user would write it.
    let nodes_dir = dir.join("nodes");
    std::fs::create_dir_all(&nodes_dir)?;
    let mut procs = Vec::with_capacity(k);
    for (i, port) in ports.iter().enumerate() {
        let name = format!("silo-{i}");
        let cfg = silo_config(
            scenario,
            seed,
            SiloPaths {
                name: &name,
                key: dir.join("keys").join(format!("{name}.key")),
                manifest: manifest_path.clone(),
                listen: match at.relay {
                    // Behind NAT, QUIC as well: UDP holes punch more often than TCP's.
                    Some(_) => vec![
                        format!("/ip4/{}/tcp/{port}", hosts[i]),
                        format!("/ip4/{}/udp/{port}/quic-v1", hosts[i]),
                    ],
                    None => vec![format!("/ip4/{}/tcp/{port}", hosts[i])],
                },
                state_dir: nodes_dir.join(&name),
                shard: shards[i].clone(),
            },
            deadlines,
        )?;
        let cfg_path = nodes_dir.join(format!("{name}.toml"));
        std::fs::write(&cfg_path, toml::to_string(&cfg)?)?;
        procs.push((name, cfg_path, cfg.state_dir));
    }

    Ok(Prepared {
        federation: fed,
        names: procs.iter().map(|p| p.0.clone()).collect(),
        configs: procs.iter().map(|p| p.1.clone()).collect(),
        state_dirs: procs.into_iter().map(|p| p.2).collect(),
        nodes_dir,
        spec,
    })
}

/// Where one silo's files are, as its node config names them.
struct SiloPaths<'a> {
    name: &'a str,
    key: PathBuf,
    manifest: PathBuf,
    listen: Vec<String>,
    state_dir: PathBuf,
    shard: PathBuf,
}

/// The node config of one silo of `scenario` (its model, training and FedeRiCo settings), as a
/// user would write it; validated.
fn silo_config(
    scenario: &Scenario,
    seed: u64,
    at: SiloPaths<'_>,
    deadlines: &Deadlines,
) -> anyhow::Result<NodeConfig> {
    let cfg = NodeConfig {
        name: at.name.to_string(),
        key: at.key,
        manifest: at.manifest,
        listen: at.listen,
        bootstrap: Vec::new(),
        mdns: false,
        seed,
        rounds: scenario.rounds as u64,
        eval_every: scenario.eval_every as u64,
        state_dir: at.state_dir,
        metrics: None,
        max_message_mib: None,
        receive_budget_mib: None,
        data: crate::net::config::DataSource {
            shard: Some(at.shard),
            ..Default::default()
        },
        model: scenario.model.clone(),
        train: scenario.train.clone(),
        federico: scenario.federico.clone(),
        defences: scenario.defences.clone(),
        deadlines: deadlines.clone(),
        control: None,
        coordinated: None,
        // A swarm is a simulation of nodes: the noise follows the run seed, as in `simulate`.
        privacy: scenario
            .privacy
            .clone()
            .map(|p| crate::privacy::PrivacyConfig {
                noise: Some(p.noise.unwrap_or(crate::privacy::NoiseSource::Seeded)),
                ..p
            }),
    };
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("node config for {}: {e}", at.name))?;
    Ok(cfg)
}

/// One seed of a FedeRiCo swarm: its run directory, the node processes until they are done,
/// then what `simulate` writes for a seed.
fn run_seed(
    scenario: &Scenario,
    seed: u64,
    opts: &SwarmOptions,
    dir: &Path,
) -> anyhow::Result<SeedOutcome> {
    // Each node in its own network namespace: created before the configs (they name the
    // namespaces' addresses), removed when this seed is over.
    let netns = if opts.netns || opts.nat.is_some() {
        Some(std::sync::Arc::new(netns::Netns::create(
            scenario.split.clients,
            opts.nat.unwrap_or(0),
        )?))
    } else {
        None
    };
    let relay = netns
        .as_deref()
        .filter(|ns| ns.behind_nat())
        .map(|ns| ns.relay_addr());
    let prepared = {
        let hosts: Option<Vec<_>> = netns
            .as_deref()
            .map(|ns| (0..scenario.split.clients).map(|i| ns.addr(i)).collect());
        prepare_at(
            scenario,
            seed,
            opts.data_dir.as_deref(),
            &seed_deadlines(scenario, opts),
            dir,
            Placement {
                hosts: hosts.as_deref(),
                relay,
            },
        )?
    };
    // Behind NAT, the relay runs (in its namespace) for as long as the nodes do.
    let _relay = match netns.as_deref().filter(|ns| ns.behind_nat()) {
        Some(ns) => Some(relay::Relay::start(ns, &opts.exe, dir)?),
        None => None,
    };
    let schedule = scenario.fault_schedule()?;
    let fault_driver = if schedule.is_empty() {
        None
    } else {
        Some(fault_control(
            &schedule,
            dir,
            &prepared,
            netns.as_ref(),
            &opts.exe,
        )?)
    };
    let run = run_nodes(
        scenario,
        seed,
        opts,
        &prepared,
        &schedule,
        netns.as_deref(),
        fault_driver,
    )?;
    report_seed(scenario, seed, opts, dir, prepared, &run)
}

/// The node deadlines of a seed: the options', or under a fault schedule its own.
fn seed_deadlines(scenario: &Scenario, opts: &SwarmOptions) -> Deadlines {
    let mut deadlines = opts.deadlines.clone();
    if !scenario.faults.is_empty() {
        deadlines.model_s = scenario.faults.model_deadline_s;
        deadlines.gradient_s = scenario.faults.gradient_deadline_s;
        // With a late joiner the others must not wait long for it before round 1.
        if scenario.faults.events.iter().any(|e| e.join.is_some()) {
            deadlines.start_s = deadlines.start_s.min(3.0);
        }
    }
    // Round 1 at the start deadline with whoever came, as `simulate` starts it: the launcher
    // starts every node itself and watches them, so none waits forever for a first peer.
    deadlines.alone_s.get_or_insert(deadlines.start_s);
    deadlines
}

/// Makes the driver of a fault schedule once the nodes run.
type MakeFaultDriver = Box<dyn FnOnce() -> faults::FaultDriver>;

/// A fault schedule's control channels: every node's config gets one that only this launcher
/// has the token of. Returns what makes the schedule's driver once the nodes run.
fn fault_control(
    schedule: &Schedule,
    dir: &Path,
    p: &Prepared,
    netns: Option<&std::sync::Arc<netns::Netns>>,
    exe: &Path,
) -> anyhow::Result<MakeFaultDriver> {
    let token_file = dir.join("control.token");
    let token = faults::write_token(&token_file)?;
    let mut peer_ids = Vec::with_capacity(p.configs.len());
    let mut plans = faults::attack_plans(schedule).into_iter();
    let mut cfgs = Vec::with_capacity(p.configs.len());
    for c in &p.configs {
        cfgs.push(NodeConfig::load(c)?);
    }
    let names: Vec<String> = cfgs.iter().map(|c| c.name.clone()).collect();
    for (i, (c, mut cfg)) in p.configs.iter().zip(cfgs).enumerate() {
        let links = schedule.links().map_or_else(Vec::new, |l| {
            (0..names.len())
                .filter(|&j| j != i)
                .map(|j| crate::net::control::EmulatedLink::new(names[j].clone(), &l.link(i, j)))
                .collect()
        });
        // In a namespace the launcher reaches the node at its own address.
        let host = netns.map_or(std::net::Ipv4Addr::LOCALHOST, |ns| ns.addr(i));
        cfg.control = Some(crate::net::control::ControlConfig {
            listen: format!("{host}:0"),
            token_file: token_file.clone(),
            attacks: plans.next().unwrap_or_default(),
            links,
        });
        peer_ids.push(load_key(&cfg.key)?.public().to_peer_id());
        std::fs::write(c, toml::to_string(&cfg)?)?;
    }
    let (configs, state_dirs, nodes_dir, exe) = (
        p.configs.clone(),
        p.state_dirs.clone(),
        p.nodes_dir.clone(),
        exe.to_owned(),
    );
    let schedule = schedule.clone();
    let netns_driver = netns.cloned();
    Ok(Box::new(move || {
        faults::FaultDriver::new(
            schedule,
            token,
            peer_ids,
            configs,
            state_dirs,
            nodes_dir,
            exe,
            netns_driver,
        )
    }))
}

/// The node processes of one seed, as they ended.
struct NodesRun {
    running: Vec<Proc>,
    driver: Option<faults::FaultDriver>,
    /// From starting the processes until every node had finished round 1.
    first_round: Option<Duration>,
    total_seconds: f64,
}

/// Starts every node (a late joiner only when the schedule says), watches them until they are
/// done while the fault driver applies its schedule, and stops whatever still runs. Refused:
/// a node that ended abnormally, with its last log lines.
fn run_nodes(
    scenario: &Scenario,
    seed: u64,
    opts: &SwarmOptions,
    p: &Prepared,
    schedule: &Schedule,
    netns: Option<&netns::Netns>,
    fault_driver: Option<MakeFaultDriver>,
) -> anyhow::Result<NodesRun> {
    let k = p.names.len();
    let started = Instant::now();
    let mut running: Vec<Proc> = Vec::with_capacity(k);
    let late: Vec<usize> = schedule
        .events
        .iter()
        .filter_map(|e| match e.fault {
            crate::faults::Fault::Join(s) => Some(s as usize),
            _ => None,
        })
        .collect();
    for (i, ((name, cfg_path), state_dir)) in p
        .names
        .iter()
        .zip(&p.configs)
        .zip(&p.state_dirs)
        .enumerate()
    {
        let log = p.nodes_dir.join(format!("{name}.log"));
        let run_log = state_dir.join("rounds.jsonl");
        if late.contains(&i) {
            running.push(Proc::absent(&opts.exe, name.clone(), log, run_log)?);
            continue;
        }
        let child = start_silo(netns, i, &opts.exe, cfg_path, &log)?;
        running.push(Proc::new(name.clone(), child, log, run_log));
    }
    let mut first_round = None;
    let mut driver = fault_driver.map(|make| make());
    let watched = watch(
        &mut running,
        scenario,
        seed,
        opts,
        started,
        &mut first_round,
        driver.as_mut(),
    );
    let total_seconds = started.elapsed().as_secs_f64();
    // Whatever happened, no node outlives the swarm.
    stop_all(&mut running);
    watched?;
    let abnormal: Vec<String> = running
        .iter()
        .filter(|p| !p.ended_well())
        .map(|p| {
            format!(
                "{} exited {}; last log lines ({}):\n{}",
                p.name,
                p.status.map_or("by force".into(), |s| s.to_string()),
                p.log.display(),
                tail(&p.log, 8)
            )
        })
        .collect();
    if !abnormal.is_empty() {
        bail!(
            "{} of {k} nodes ended abnormally:\n{}",
            abnormal.len(),
            abnormal.join("\n")
        );
    }
    Ok(NodesRun {
        running,
        driver,
        first_round,
        total_seconds,
    })
}

/// What `simulate` writes for a seed, from the nodes' run logs: `rounds.jsonl`,
/// `summary.json` (with the fault report under a schedule), `swarm.json` and the plots.
fn report_seed(
    scenario: &Scenario,
    seed: u64,
    opts: &SwarmOptions,
    dir: &Path,
    p: Prepared,
    run: &NodesRun,
) -> anyhow::Result<SeedOutcome> {
    let Prepared {
        federation: fed,
        spec,
        ..
    } = p;
    let k = fed.clients.len();
    let regression = spec.is_regression();
    let num_params = spec.num_params();
    let running = &run.running;
    // The nodes' run logs, merged into the simulator's records and plotted as `report` does.
    let mut logs: Vec<Vec<NodeRound>> = Vec::with_capacity(running.len());
    for p in running {
        let log = read_node_log(&p.run_log)?;
        if let Some(w) = log.warning {
            tracing::warn!("{w}");
        }
        logs.push(log.rounds);
    }
    let groups = fed.groups();
    let NodeSeed {
        mut summary,
        curves,
    } = write_node_seed(
        &scenario.name,
        seed,
        scenario.rounds,
        dir,
        &logs,
        groups.as_deref(),
        regression,
    )?;
    if let Some(driver) = &run.driver {
        let report = fault_report(
            scenario,
            seed,
            opts,
            driver,
            running,
            &logs,
            groups.as_deref(),
        )?;
        std::fs::write(dir.join("faults.txt"), report.render())?;
        summary.faults = Some(serde_json::to_value(&report)?);
    }
    write_json(&dir.join("summary.json"), &summary)?;
    let figures = figures(
        &logs,
        scenario,
        num_params,
        running,
        run.first_round.map_or(f64::NAN, |d| d.as_secs_f64()),
        run.total_seconds,
    );
    write_json(&dir.join("swarm.json"), &figures)?;
    Ok(SeedOutcome {
        summary,
        curves,
        spec,
        num_params,
        clients: k,
        regression,
    })
}
