//! The local swarm (`federico swarm`) and shard writing (`federico partition`): N real
//! `federico node` processes on 127.0.0.1, launched, watched and reported by one command.
//! Owns: the run directory (keys, manifest, node configs, shards, node logs), free ports,
//! starting and stopping the processes, the progress bar, and merging the nodes' run logs into
//! the same `rounds.jsonl`, `summary.json`, table and plots as `simulate`.
//! Must not: take part in a round; the nodes run the federation on their own.

pub mod coordinated;
mod faults;
mod netns;

use crate::faults::checks;
use crate::learn::{Evaluation, Federation, Shard};
use crate::net::config::Deadlines;
use crate::net::node::NodeRound;
use crate::net::{Manifest, Member, NodeConfig, keygen, load_key};
use crate::report::records::{AlgorithmResult, FedericoRound, RoundRecord, RunSummary};
use crate::report::summary::{
    Curves, Outcome, Report, algorithm_round, same_group_mass, write_json, write_seed_plots,
    write_summary,
};
use crate::scenario::{Algorithm, Scenario};
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Writes one shard per silo of `scenario`'s split for `seed` into `out`, plus
/// `partition.json`; returns the shard paths in node order.
pub fn write_shards(
    scenario: &Scenario,
    seed: u64,
    data_dir: Option<&Path>,
    out: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    Ok(split(scenario, seed, data_dir, out)?.1)
}

fn split(
    scenario: &Scenario,
    seed: u64,
    data_dir: Option<&Path>,
    out: &Path,
) -> anyhow::Result<(Federation, Vec<PathBuf>)> {
    let real = scenario.load_real(scenario.data_dir(data_dir).as_deref())?;
    let fed = scenario.federation(real.as_ref(), &mut Scenario::data_rng(seed))?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
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
}

/// Why `SwarmOptions::netns` cannot run on this machine (not Linux, not root, no `ip`, or no
/// namespaces allowed), or `None` when it can.
pub fn netns_unavailable() -> Option<String> {
    netns::unavailable()
}

/// Free TCP ports on 127.0.0.1 (bound, read, released; nodes bind them right after).
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("finding free ports on 127.0.0.1")?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// Runs every seed of `scenario` as a swarm of node processes; writes what `simulate` writes.
pub fn swarm(scenario: &Scenario, opts: &SwarmOptions) -> anyhow::Result<Outcome> {
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
        scenario,
        &opts.out,
        &[Algorithm::Federico],
        Report {
            spec,
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
    if opts.netns {
        bail!("--netns runs FedeRiCo swarms only");
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
        scenario,
        &opts.out,
        &[algorithm],
        Report {
            spec,
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

/// A started node process.
struct Proc {
    name: String,
    child: std::process::Child,
    log: PathBuf,
    run_log: PathBuf,
    status: Option<std::process::ExitStatus>,
    /// Largest resident set seen while it ran (KiB, from /proc).
    max_rss_kib: u64,
    /// How each earlier process of this silo ended (a schedule's crashes).
    lives: Vec<String>,
    /// Every log this silo's processes wrote.
    logs: Vec<PathBuf>,
    /// Killed by the fault schedule and not (yet) restarted, or told to leave.
    by_schedule: bool,
}

impl Proc {
    fn new(name: String, child: std::process::Child, log: PathBuf, run_log: PathBuf) -> Self {
        Self {
            name,
            child,
            logs: vec![log.clone()],
            log,
            run_log,
            status: None,
            max_rss_kib: 0,
            lives: Vec::new(),
            by_schedule: false,
        }
    }

    fn is_running(&self) -> bool {
        self.status.is_none()
    }

    /// SIGKILL now, as a crash.
    fn kill_by_schedule(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
        self.lives.push("killed by the schedule".into());
        self.by_schedule = true;
    }

    /// SIGTERM: a clean stop for good.
    fn leave(&mut self) {
        if self.status.is_none() {
            // SAFETY: kill(2) on a child we started and have not reaped.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        self.by_schedule = true;
    }

    /// A silo that joins late: nothing runs until the schedule starts it ([`Self::join`]).
    fn absent(exe: &Path, name: String, log: PathBuf, run_log: PathBuf) -> anyhow::Result<Self> {
        // A stand-in process that exits at once, so every `Proc` owns a child.
        let child = std::process::Command::new(exe)
            .arg("--help")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut p = Self::new(name, child, log, run_log);
        p.status = p.child.wait().ok();
        p.logs.clear();
        p.by_schedule = true;
        Ok(p)
    }

    /// The late joiner's first process.
    fn join(&mut self, child: std::process::Child, log: PathBuf) {
        self.relaunch(child, log);
    }

    /// A new process for the same silo (same config, key, state directory).
    fn relaunch(&mut self, child: std::process::Child, log: PathBuf) {
        self.child = child;
        self.status = None;
        self.by_schedule = false;
        self.logs.push(log.clone());
        self.log = log;
    }

    /// Ended as it should: success, or stopped by the schedule.
    fn ended_well(&self) -> bool {
        self.status.is_some_and(|s| s.success()) || (self.by_schedule && self.status.is_some())
    }
}

/// Resident set size of a process in KiB (Linux; 0 elsewhere or once it has exited).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Speed and size of one swarm run (`seed-<n>/swarm.json`), the figures of issue 3.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SwarmFigures {
    /// Node processes.
    pub nodes: usize,
    /// Model parameters d.
    pub num_params: usize,
    /// M.
    pub neighbours: usize,
    /// The payload minimum per node per round: 2·M·4d bytes (M gradients sent, M models served
    /// on average).
    pub payload_min_bytes: f64,
    /// Encoded message bytes sent per node per round (mean over rounds without evaluation).
    pub message_bytes: f64,
    /// Stream bytes sent per node per round (libp2p's count: messages plus negotiation).
    pub stream_bytes: f64,
    /// `message_bytes / payload_min_bytes`.
    pub message_ratio: f64,
    /// `stream_bytes / payload_min_bytes`.
    pub stream_ratio: f64,
    /// Median round wall time over nodes and rounds without evaluation.
    pub median_round_seconds: f64,
    /// Every round evaluated, so the figures include the evaluation fetches.
    pub includes_evaluation: bool,
    /// Largest resident set of any node (MiB).
    pub max_rss_mib: f64,
    /// Median over nodes of their largest resident set (MiB).
    pub median_rss_mib: f64,
    /// From starting the processes until every node had finished round 1.
    pub first_round_seconds: f64,
    /// The whole run, start to last exit.
    pub total_seconds: f64,
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
    prepare_at(scenario, seed, data_dir, deadlines, dir, None)
}

/// [`prepare`], with each silo at its own address (a network namespace's) on
/// [`netns::NODE_PORT`] when `hosts` is given.
fn prepare_at(
    scenario: &Scenario,
    seed: u64,
    data_dir: Option<&Path>,
    deadlines: &Deadlines,
    dir: &Path,
    hosts: Option<&[std::net::Ipv4Addr]>,
) -> anyhow::Result<Prepared> {
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
            addrs: vec![format!("/ip4/{}/tcp/{port}", hosts[i]).parse()?],
        });
    }
    let manifest = Manifest {
        open: false,
        members,
    };
    let manifest_path = dir.join("manifest.toml");
    std::fs::write(&manifest_path, manifest.to_toml())?;

    // One config per node, written as a user would write it.
    let nodes_dir = dir.join("nodes");
    std::fs::create_dir_all(&nodes_dir)?;
    let mut procs = Vec::with_capacity(k);
    for (i, port) in ports.iter().enumerate() {
        let name = format!("silo-{i}");
        let cfg = NodeConfig {
            name: name.clone(),
            key: dir.join("keys").join(format!("{name}.key")),
            manifest: manifest_path.clone(),
            listen: vec![format!("/ip4/{}/tcp/{port}", hosts[i])],
            bootstrap: Vec::new(),
            mdns: false,
            seed,
            rounds: scenario.rounds as u64,
            eval_every: scenario.eval_every as u64,
            state_dir: nodes_dir.join(&name),
            metrics: None,
            max_message_mib: 256,
            data: crate::net::config::DataSource {
                shard: Some(shards[i].clone()),
                ..Default::default()
            },
            model: scenario.model.clone(),
            train: scenario.train.clone(),
            federico: scenario.federico.clone(),
            deadlines: deadlines.clone(),
            control: None,
            coordinated: None,
        };
        cfg.validate()
            .map_err(|e| anyhow::anyhow!("node config for {name}: {e}"))?;
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

/// Starts `exe node --config <config>` with its log (stderr) in `log`.
pub fn start_node(exe: &Path, config: &Path, log: &Path) -> anyhow::Result<std::process::Child> {
    spawn_node(std::process::Command::new(exe), exe, config, log)
}

/// Starts silo `silo`'s node, inside its network namespace when there is one.
fn start_silo(
    ns: Option<&netns::Netns>,
    silo: usize,
    exe: &Path,
    config: &Path,
    log: &Path,
) -> anyhow::Result<std::process::Child> {
    match ns {
        Some(ns) => spawn_node(ns.command(silo, exe), exe, config, log),
        None => start_node(exe, config, log),
    }
}

fn spawn_node(
    mut command: std::process::Command,
    exe: &Path,
    config: &Path,
    log: &Path,
) -> anyhow::Result<std::process::Child> {
    command
        .arg("node")
        .arg("--config")
        .arg(config)
        .env("RAYON_NUM_THREADS", "1")
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| {
            format!(
                "starting {} node --config {}",
                exe.display(),
                config.display()
            )
        })
}

fn run_seed(
    scenario: &Scenario,
    seed: u64,
    opts: &SwarmOptions,
    dir: &Path,
) -> anyhow::Result<SeedOutcome> {
    // Each node in its own network namespace: created before the configs (they name the
    // namespaces' addresses), removed when this seed is over.
    let netns = if opts.netns {
        Some(std::sync::Arc::new(netns::Netns::create(
            scenario.split.clients,
        )?))
    } else {
        None
    };
    // Under a fault schedule both drivers use its deadlines.
    let mut deadlines = opts.deadlines.clone();
    if !scenario.faults.is_empty() {
        deadlines.model_s = scenario.faults.model_deadline_s;
        deadlines.gradient_s = scenario.faults.gradient_deadline_s;
        // With a late joiner the others must not wait long for it before round 1.
        if scenario.faults.events.iter().any(|e| e.join.is_some()) {
            deadlines.start_s = deadlines.start_s.min(3.0);
        }
    }
    let Prepared {
        federation: fed,
        names,
        configs,
        state_dirs,
        nodes_dir,
        spec,
    } = {
        let hosts: Option<Vec<_>> = netns
            .as_deref()
            .map(|ns| (0..scenario.split.clients).map(|i| ns.addr(i)).collect());
        prepare_at(
            scenario,
            seed,
            opts.data_dir.as_deref(),
            &deadlines,
            dir,
            hosts.as_deref(),
        )?
    };
    let k = fed.clients.len();
    let regression = spec.is_regression();
    let num_params = spec.num_params();
    // A fault schedule: every node gets a control channel only this launcher has the token of.
    let schedule = scenario.fault_schedule()?;
    let mut fault_driver: Option<Box<dyn FnOnce() -> faults::FaultDriver>> = None;
    if !schedule.events.is_empty() {
        let token_file = dir.join("control.token");
        let token = faults::write_token(&token_file)?;
        let mut peer_ids = Vec::with_capacity(k);
        for (i, c) in configs.iter().enumerate() {
            let mut cfg = NodeConfig::load(c)?;
            // In a namespace the launcher reaches the node at its own address.
            let host = netns
                .as_deref()
                .map_or(std::net::Ipv4Addr::LOCALHOST, |ns| ns.addr(i));
            cfg.control = Some(crate::net::control::ControlConfig {
                listen: format!("{host}:0"),
                token_file: token_file.clone(),
            });
            peer_ids.push(load_key(&cfg.key)?.public().to_peer_id());
            std::fs::write(c, toml::to_string(&cfg)?)?;
        }
        let (configs, state_dirs, nodes_dir, exe) = (
            configs.clone(),
            state_dirs.clone(),
            nodes_dir.clone(),
            opts.exe.clone(),
        );
        let schedule = schedule.clone();
        let netns_driver = netns.clone();
        fault_driver = Some(Box::new(move || {
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
        }));
    }
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
    for (i, ((name, cfg_path), state_dir)) in
        names.into_iter().zip(configs).zip(state_dirs).enumerate()
    {
        let log = nodes_dir.join(format!("{name}.log"));
        let run_log = state_dir.join("rounds.jsonl");
        if late.contains(&i) {
            running.push(Proc::absent(&opts.exe, name, log, run_log)?);
            continue;
        }
        let child = start_silo(netns.as_deref(), i, &opts.exe, &cfg_path, &log)?;
        running.push(Proc::new(name, child, log, run_log));
    }
    let mut first_round = None;
    let mut driver = fault_driver.take().map(|make| make());
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

    // Merge the run logs into the simulator's records.
    let logs: Vec<Vec<NodeRound>> = running
        .iter()
        .map(|p| read_run_log(&p.run_log))
        .collect::<anyhow::Result<_>>()?;
    let groups = fed.groups();
    let records = merge(seed, &logs, k, groups.as_deref(), regression)?;
    let log_path = dir.join("rounds.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&log_path)?);
    for r in &records {
        serde_json::to_writer(&mut f, r)?;
        writeln!(f)?;
    }
    f.flush()?;
    drop(f);
    let last = records
        .iter()
        .rev()
        .find(|r| !r.algorithms.is_empty())
        .context("no node evaluated")?;
    let fed_round = &last.algorithms[0];
    let mass = records
        .last()
        .and_then(|r| r.federico.as_ref())
        .and_then(|f| f.same_group_mass);
    let summary = RunSummary {
        seed,
        rounds: scenario.rounds,
        algorithms: vec![AlgorithmResult {
            algorithm: fed_round.algorithm.clone(),
            accuracy: fed_round.accuracy,
            mse: fed_round.mse,
            per_client: fed_round.per_client.clone(),
            same_group_mass: mass,
        }],
        faults: None,
    };
    let mut summary = summary;
    if let Some(driver) = &driver {
        let report = fault_report(
            scenario,
            seed,
            opts,
            driver,
            &running,
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
        &running,
        first_round.map_or(f64::NAN, |d| d.as_secs_f64()),
        total_seconds,
    );
    write_json(&dir.join("swarm.json"), &figures)?;
    let curves: Curves = vec![(
        Algorithm::Federico.name().to_string(),
        records
            .iter()
            .filter_map(|r| {
                r.algorithms
                    .first()
                    .map(|a| (r.round, a.accuracy.or(a.mse).unwrap_or(f64::NAN)))
            })
            .collect(),
    )];
    let mut plot_scenario = scenario.clone();
    plot_scenario.algorithms = vec![Algorithm::Federico];
    write_seed_plots(
        &plot_scenario,
        dir,
        &log_path,
        &curves,
        groups.as_deref(),
        regression,
    )?;
    Ok(SeedOutcome {
        summary,
        curves,
        spec,
        num_params,
        clients: k,
        regression,
    })
}

/// The checks of a faulty swarm. The round budget is τ_model (pulls) + τ_grad (gradients) +
/// τ_model (the evaluation fetch) plus a compute allowance of 3× the median round of the run
/// and 1 s; the baseline is the simulator's fault-free run of the same seed, which the
/// fault-free swarm reproduces decision for decision (`tests/swarm.rs`).
fn fault_report(
    scenario: &Scenario,
    seed: u64,
    opts: &SwarmOptions,
    driver: &faults::FaultDriver,
    procs: &[Proc],
    logs: &[Vec<NodeRound>],
    groups: Option<&[usize]>,
) -> anyhow::Result<checks::Report> {
    let cfg = &scenario.faults;
    let all: Vec<f64> = logs.iter().flatten().map(|r| r.seconds).collect();
    let budget = 2.0 * cfg.model_deadline_s + cfg.gradient_deadline_s + 1.0 + 3.0 * median(all);
    // The one use of the simulator here: the baseline is a simulation, not a report.
    let baseline = if cfg.baseline {
        Some(
            crate::sim::fault_free_finals(scenario, seed, opts.data_dir.as_deref())
                .context("the fault-free baseline run")?,
        )
    } else {
        None
    };
    let exits: Vec<checks::ExitEvidence> = procs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut exits = p.lives.clone();
            exits.push(match p.status {
                Some(s) if s.success() => "ok".into(),
                Some(_) if p.by_schedule => "killed by the schedule".into(),
                Some(s) => format!("exited {s}"),
                None => "still running".into(),
            });
            let bad_lines = p
                .logs
                .iter()
                .flat_map(|l| {
                    std::fs::read_to_string(l)
                        .unwrap_or_default()
                        .lines()
                        .filter(|x| x.contains("panicked") || x.contains(" ERROR "))
                        .map(|x| x.chars().take(200).collect::<String>())
                        .collect::<Vec<_>>()
                })
                .collect();
            checks::ExitEvidence {
                silo: i as u32,
                exits,
                bad_lines,
            }
        })
        .collect();
    let schedule = scenario.fault_schedule()?;
    Ok(checks::evaluate(&checks::Inputs {
        schedule: &schedule,
        applied: &driver.applied,
        traces: logs,
        groups,
        baseline: baseline.as_deref(),
        round_budget_s: budget,
        stall_after: budget,
        suspect_after: scenario.federico.suspect_after,
        crashes: &driver.crashes,
        exits: Some(&exits),
    }))
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Per-round figures from the run logs: rounds that evaluated (and fetched models for it)
/// and round 1 (start-up) are left out of the byte and time medians.
fn figures(
    logs: &[Vec<NodeRound>],
    scenario: &Scenario,
    num_params: usize,
    procs: &[Proc],
    first_round_seconds: f64,
    total_seconds: f64,
) -> SwarmFigures {
    let m = scenario.federico.neighbours;
    let payload = 2.0 * m as f64 * 4.0 * num_params as f64;
    let rounds = logs.iter().map(|l| l.len()).min().unwrap_or(0);
    let consecutive = |r: usize| logs.iter().all(|l| l[r - 1].round + 1 == l[r].round);
    let plain = |r: usize| consecutive(r) && logs.iter().all(|l| l[r].eval.is_none());
    // Evaluation rounds also fetch models for the mixture; leave them out when there are others.
    let includes_evaluation = !(1..rounds).any(plain);
    let (mut msg, mut stream, mut secs) = (Vec::new(), Vec::new(), Vec::new());
    for r in 1..rounds {
        let keep = if includes_evaluation {
            consecutive(r)
        } else {
            plain(r)
        };
        if !keep {
            continue;
        }
        let k = logs.len() as f64;
        msg.push(
            logs.iter()
                .map(|l| (l[r].bytes_sent - l[r - 1].bytes_sent.min(l[r].bytes_sent)) as f64)
                .sum::<f64>()
                / k,
        );
        stream.push(
            logs.iter()
                .map(|l| {
                    (l[r].stream_bytes_sent
                        - l[r - 1].stream_bytes_sent.min(l[r].stream_bytes_sent))
                        as f64
                })
                .sum::<f64>()
                / k,
        );
        secs.extend(logs.iter().map(|l| l[r].seconds));
    }
    let rss: Vec<f64> = procs
        .iter()
        .map(|p| p.max_rss_kib as f64 / 1024.0)
        .collect();
    // Bytes are averaged, not medianed: a pull served early for the next round lands in this
    // round's count, so single rounds scatter around the mean while their sum does not.
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (message_bytes, stream_bytes) = (mean(&msg), mean(&stream));
    SwarmFigures {
        nodes: logs.len(),
        num_params,
        neighbours: m,
        payload_min_bytes: payload,
        message_bytes,
        stream_bytes,
        message_ratio: message_bytes / payload,
        stream_ratio: stream_bytes / payload,
        median_round_seconds: median(secs),
        includes_evaluation,
        max_rss_mib: rss.iter().copied().fold(0.0, f64::max),
        median_rss_mib: median(rss),
        first_round_seconds,
        total_seconds,
    }
}

/// Follows the nodes until all have exited, showing progress; Ctrl-C stops them.
fn watch(
    procs: &mut [Proc],
    scenario: &Scenario,
    seed: u64,
    opts: &SwarmOptions,
    started: Instant,
    first_round: &mut Option<Duration>,
    mut faults: Option<&mut faults::FaultDriver>,
) -> anyhow::Result<()> {
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = interrupted.clone();
    // SIGINT while the swarm runs: stop the nodes cleanly (they checkpoint), then report.
    let _ = ctrlc_hook(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
    let total = scenario.rounds as u64 * procs.len() as u64;
    let bar = if opts.progress {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {msg}")
                .expect("the template is a valid constant"),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    loop {
        let mut done = 0u64;
        let mut min_round = u64::MAX;
        let mut logged = 0u64;
        let mut acc = Vec::new();
        for p in procs.iter_mut() {
            if p.status.is_none() {
                p.max_rss_kib = p.max_rss_kib.max(rss_kib(p.child.id()));
                p.status = p.child.try_wait()?;
            }
            let rounds = read_run_log(&p.run_log).unwrap_or_default();
            logged = logged.max(rounds.last().map_or(0, |r| r.round));
            done += rounds.len() as u64;
            min_round = min_round.min(rounds.len() as u64);
            if let Some(e) = rounds.iter().rev().find_map(|r| r.eval) {
                acc.push(e.correct as f64 / e.count.max(1) as f64);
            }
        }
        bar.set_position(done);
        if first_round.is_none() && min_round >= 1 && min_round != u64::MAX {
            *first_round = Some(started.elapsed());
        }
        let mean_acc = if acc.is_empty() {
            String::new()
        } else {
            format!(
                "  federico {:.1}%",
                100.0 * acc.iter().sum::<f64>() / acc.len() as f64
            )
        };
        bar.set_message(format!(
            "seed {seed}: {} nodes, slowest at round {}/{}{mean_acc}",
            procs.len(),
            if min_round == u64::MAX { 0 } else { min_round },
            scenario.rounds
        ));
        if let Some(f) = faults.as_deref_mut() {
            // With nobody running, a restart due at a round would wait for ever: fire it.
            let idle = procs.iter().all(|p| p.status.is_some());
            f.tick(procs, if idle { u64::MAX - 1 } else { logged })?;
        }
        let pending = faults.as_deref().is_some_and(|f| f.pending());
        if procs.iter().all(|p| p.status.is_some()) && !pending {
            break;
        }
        if let Some(p) = procs.iter().find(|p| p.status.is_some() && !p.ended_well()) {
            bar.finish_and_clear();
            bail!(
                "node {} exited {}; stopping the swarm. Its log ({}):\n{}",
                p.name,
                p.status.map(|s| s.to_string()).unwrap_or_default(),
                p.log.display(),
                tail(&p.log, 12)
            );
        }
        if interrupted.load(std::sync::atomic::Ordering::SeqCst) {
            bar.finish_and_clear();
            bail!("interrupted: nodes stopped; their checkpoints and logs are in place");
        }
        if started.elapsed() > opts.timeout {
            bar.finish_and_clear();
            bail!("the swarm did not finish within {:?}", opts.timeout);
        }
        // A pending fault is fired within a few milliseconds of its round.
        let pause = if pending { 10 } else { 200 };
        std::thread::sleep(Duration::from_millis(pause));
    }
    bar.finish_and_clear();
    Ok(())
}

/// Installs a SIGINT handler that runs `f` (once per signal) instead of killing the launcher.
fn ctrlc_hook(f: impl Fn() + Send + 'static) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("sigint".into())
        .spawn(move || {
            rt.block_on(async {
                while tokio::signal::ctrl_c().await.is_ok() {
                    f();
                }
            })
        })?;
    Ok(())
}

/// SIGTERM to every node still running, then SIGKILL after a grace period.
fn stop_all(procs: &mut [Proc]) {
    for p in procs.iter_mut().filter(|p| p.status.is_none()) {
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe {
            libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM);
        }
    }
    let grace = Instant::now() + Duration::from_secs(10);
    while Instant::now() < grace && procs.iter().any(|p| p.status.is_none()) {
        for p in procs.iter_mut().filter(|p| p.status.is_none()) {
            p.status = p.child.try_wait().ok().flatten();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in procs.iter_mut().filter(|p| p.status.is_none()) {
        let _ = p.child.kill();
        p.status = p.child.wait().ok();
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A node's run log; a torn last line (the node was killed mid-write) is ignored.
pub fn read_run_log(path: &Path) -> anyhow::Result<Vec<NodeRound>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<NodeRound>(l).ok())
        .collect())
}

/// The nodes' run logs as the simulator's per-round records (FedeRiCo only). A round a node
/// ran twice (it resumed from a checkpoint) counts with its last run.
fn merge(
    seed: u64,
    logs: &[Vec<NodeRound>],
    k: usize,
    groups: Option<&[usize]>,
    regression: bool,
) -> anyhow::Result<Vec<RoundRecord>> {
    let rounds = logs
        .iter()
        .map(|l| l.iter().map(|r| r.round).max().unwrap_or(0))
        .min()
        .unwrap_or(0);
    let mut out = Vec::new();
    for round in 1..=rounds {
        let rows: Vec<&NodeRound> = logs
            .iter()
            .enumerate()
            .map(|(i, l)| {
                l.iter()
                    .rev()
                    .find(|r| r.round == round)
                    .with_context(|| format!("silo-{i} has no record of round {round}"))
            })
            .collect::<anyhow::Result<_>>()?;
        let weights: Vec<Vec<f64>> = rows
            .iter()
            .map(|r| {
                let mut row = vec![0.0; k];
                for &(j, w) in &r.weights {
                    if (j as usize) < k {
                        row[j as usize] = w;
                    }
                }
                row
            })
            .collect();
        let mass = groups.map(|g| same_group_mass(&weights, g));
        let evals: Option<Vec<Evaluation>> = rows
            .iter()
            .map(|r| {
                r.eval.map(|e| Evaluation {
                    loss_sum: e.loss_sum,
                    correct: e.correct,
                    count: e.count,
                })
            })
            .collect();
        out.push(RoundRecord {
            seed,
            round: round as usize,
            algorithms: evals
                .map(|e| vec![algorithm_round(Algorithm::Federico, e, regression)])
                .unwrap_or_default(),
            federico: Some(FedericoRound {
                weights,
                sampled: rows.iter().map(|r| r.sampled.clone()).collect(),
                same_group_mass: mass,
            }),
        });
    }
    Ok(out)
}
