//! `federico swarm` for a coordinator algorithm (issue 5: FedDisco, HCCT, FedSaC or FedCollab): a
//! `federico coordinator` process beside the node processes, every node in coordinated mode,
//! on 127.0.0.1.
//!
//! Owns: adding a coordinator to a prepared run directory (its key, its manifest entry, its
//! config, and `[coordinated]` in every node's config), starting and watching the processes,
//! and reading the nodes' run logs into the same summary, table and curves `simulate` writes.
//! Must not: hold algorithm logic (the coordinator and the coordinated nodes do), or run a
//! fault schedule (FedeRiCo swarms only, for now).

use super::{Prepared, free_ports, prepare, start_node, tail};
use crate::learn::Evaluation;
use crate::net::config::{
    CoordinatedAlgorithm, CoordinatedConfig, CoordinatorConfig, Deadlines, Fallback,
};
use crate::net::{Manifest, Member, NodeConfig, keygen};
use crate::report::records::{AlgorithmResult, RunSummary};
use crate::report::summary::{Curves, algorithm_round, write_json};
use crate::scenario::{Algorithm, Scenario};
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// The coordinator algorithms that run over the network.
pub const NETWORKED: [Algorithm; 4] = [
    Algorithm::Feddisco,
    Algorithm::Hcct,
    Algorithm::Fedsac,
    Algorithm::Fedcollab,
];

/// A coordinator added to a prepared run directory.
#[derive(Clone, Debug)]
pub struct CoordinatorSetup {
    /// Its config file.
    pub config: PathBuf,
    /// Its state directory (`coordinator.jsonl`, `coordinator.bin`).
    pub state_dir: PathBuf,
}

/// Adds a coordinator for `algorithm` (one of [`NETWORKED`]) to the run directory `dir` that
/// [`prepare`] wrote: a key, a manifest member (last, so the silos keep their indices), its
/// config (τ = `update_deadline_s`), and `[coordinated]` in every node's config (`fetch_s`).
pub fn add_coordinator(
    p: &Prepared,
    scenario: &Scenario,
    seed: u64,
    dir: &Path,
    update_deadline_s: f64,
    fetch_s: f64,
    algorithm: Algorithm,
) -> anyhow::Result<CoordinatorSetup> {
    let networked = CoordinatedAlgorithm::try_from(algorithm)?;
    let key_path = dir.join("keys").join("coordinator.key");
    let key = keygen(&key_path)?;
    let coordinator = key.public().to_peer_id();
    let port = free_ports(1)?[0];
    let listen = format!("/ip4/127.0.0.1/tcp/{port}");
    let manifest_path = dir.join("manifest.toml");
    let mut manifest = Manifest::load(&manifest_path)?;
    manifest.members.push(Member {
        name: "coordinator".into(),
        peer_id: coordinator,
        addrs: vec![listen.parse()?],
    });
    std::fs::write(&manifest_path, manifest.to_toml())?;
    for c in &p.configs {
        let mut cfg = NodeConfig::load(c)?;
        cfg.coordinated = Some(CoordinatedConfig {
            mode: networked,
            coordinator: coordinator.to_string(),
            feddisco: scenario.feddisco.clone(),
            hcct: scenario.hcct.clone(),
            fedsac: scenario.fedsac.clone(),
            fedcollab: scenario.fedcollab.clone(),
            fetch_s,
            structure_s: 300.0,
            excuse_rounds: 100,
            fallback: Fallback::Keep,
            fallback_after: 3,
        });
        std::fs::write(c, toml::to_string(&cfg)?)?;
    }
    let first = &p.federation.clients[0].train;
    let state_dir = dir.join("coordinator");
    let cfg = CoordinatorConfig {
        key: key_path,
        manifest: manifest_path,
        name: "coordinator".into(),
        listen: vec![listen],
        state_dir: state_dir.clone(),
        rounds: scenario.rounds as u64,
        algorithm: networked,
        feddisco: scenario.feddisco.clone(),
        hcct: scenario.hcct.clone(),
        fedsac: scenario.fedsac.clone(),
        fedcollab: scenario.fedcollab.clone(),
        update_deadline_s,
        excuse_rounds: 100,
        seed,
        model: scenario.model.clone(),
        sample_shape: first.sample_shape.clone(),
        classes: first
            .num_classes()
            .with_context(|| format!("{} needs a classification task", algorithm.name()))?,
        nodes: p.configs.len(),
        max_message_mib: 256,
        join_s: None,
    };
    let config = dir.join("coordinator.toml");
    std::fs::write(&config, toml::to_string(&cfg)?)?;
    Ok(CoordinatorSetup { config, state_dir })
}

/// Starts `exe coordinator --config <config>` with its log (stderr) in `log`.
pub fn start_coordinator(
    exe: &Path,
    setup: &CoordinatorSetup,
    log: &Path,
) -> anyhow::Result<Child> {
    std::process::Command::new(exe)
        .arg("coordinator")
        .arg("--config")
        .arg(&setup.config)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {} coordinator", exe.display()))
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn evaluation(v: &serde_json::Value) -> Option<Evaluation> {
    let e = v.get("eval")?;
    Some(Evaluation {
        loss_sum: e.get("loss_sum")?.as_f64()?,
        correct: e.get("correct")?.as_u64()? as usize,
        count: e.get("count")?.as_u64()? as usize,
    })
}

/// What one seed of a coordinated swarm gives the launcher.
pub(crate) struct CoordinatedSeed {
    pub(crate) summary: RunSummary,
    pub(crate) curves: Curves,
    pub(crate) spec: crate::learn::ModelSpec,
    pub(crate) num_params: usize,
    pub(crate) clients: usize,
}

/// One seed: a coordinator and K coordinated nodes until every round is done.
pub(crate) fn run_seed(
    scenario: &Scenario,
    seed: u64,
    opts: &super::SwarmOptions,
    dir: &Path,
    algorithm: Algorithm,
) -> anyhow::Result<CoordinatedSeed> {
    if !scenario.faults.is_empty() {
        bail!(
            "fault schedules run with FedeRiCo swarms only; coordinated swarms have their coordinator-fault test (tests/coordinator.rs)"
        );
    }
    let deadlines = Deadlines {
        start_s: 10.0,
        ..opts.deadlines.clone()
    };
    let p = prepare(scenario, seed, opts.data_dir.as_deref(), &deadlines, dir)?;
    let setup = add_coordinator(&p, scenario, seed, dir, 10.0, 20.0, algorithm)?;
    let mut procs = start_all(&p, &setup, &opts.exe)?;
    let started = Instant::now();
    let outcome = watch(&mut procs, &p, scenario, seed, opts, algorithm, started);
    for (_, child, _, status) in &mut procs {
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    outcome?;
    let seconds = started.elapsed().as_secs_f64();
    report_seed(scenario, seed, dir, algorithm, p, &setup, seconds)
}

/// A started process: its name, the child, its log, and how it exited once it did.
type Started = (String, Child, PathBuf, Option<std::process::ExitStatus>);

/// Starts the coordinator, then every node.
fn start_all(p: &Prepared, setup: &CoordinatorSetup, exe: &Path) -> anyhow::Result<Vec<Started>> {
    let coord_log = p.nodes_dir.join("coordinator.log");
    let mut procs: Vec<Started> = vec![(
        "coordinator".into(),
        start_coordinator(exe, setup, &coord_log)?,
        coord_log,
        None,
    )];
    for (name, cfg) in p.names.iter().zip(&p.configs) {
        let log = p.nodes_dir.join(format!("{name}.log"));
        procs.push((name.clone(), start_node(exe, cfg, &log)?, log, None));
    }
    Ok(procs)
}

/// Watches the processes (the coordinator first) until all exited: stops the coordinator once
/// every node has its final model. Refused: a process that failed (with its log's tail), or
/// the swarm's timeout (with what each process still running last logged). Whatever is still
/// running when this returns is the caller's to stop.
fn watch(
    procs: &mut [Started],
    p: &Prepared,
    scenario: &Scenario,
    seed: u64,
    opts: &super::SwarmOptions,
    algorithm: Algorithm,
    started: Instant,
) -> anyhow::Result<()> {
    let k = p.configs.len();
    let bar = if opts.progress {
        let b = ProgressBar::new((k * scenario.rounds) as u64);
        b.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} node-rounds {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let mut stopping = false;
    let outcome = loop {
        for (_, child, _, s) in procs.iter_mut() {
            if s.is_none() {
                *s = child.try_wait()?;
            }
        }
        let done: usize = p
            .state_dirs
            .iter()
            .map(|d| lines(&d.join("rounds.jsonl")).len().min(scenario.rounds))
            .sum();
        bar.set_position(done as u64);
        bar.set_message(format!(
            "seed {seed}: {}, coordinator + {k} nodes",
            algorithm.name()
        ));
        if let Some((name, _, log, Some(s))) = procs
            .iter()
            .find(|(_, _, _, s)| s.is_some_and(|s| !s.success()))
        {
            break Err(anyhow::anyhow!(
                "{name} exited {s}; stopping the swarm. Its log ({}):\n{}",
                log.display(),
                tail(log, 12)
            ));
        }
        if procs.iter().all(|(_, _, _, s)| s.is_some()) {
            break Ok(());
        }
        // Every node has its final model: the coordinator need not linger for late fetches.
        if procs[1..].iter().all(|(_, _, _, s)| s.is_some()) && !stopping {
            stopping = true;
            // SAFETY: kill(2) on a child we started and have not reaped.
            unsafe {
                libc::kill(procs[0].1.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        if started.elapsed() > opts.timeout {
            // Say who is still running and what each last logged.
            let running: Vec<String> = procs
                .iter()
                .filter(|(_, _, _, s)| s.is_none())
                .map(|(name, _, log, _)| format!("{name} ({}):\n{}", log.display(), tail(log, 6)))
                .collect();
            break Err(anyhow::anyhow!(
                "the swarm did not finish within {:?}; still running: {}",
                opts.timeout,
                running.join("\n")
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    bar.finish_and_clear();
    outcome
}

/// What `simulate` writes for a seed, from the nodes' run logs (one line per round, then the
/// final line with the model's evaluation and hash) and the coordinator's: `summary.json`,
/// and `swarm.json` (rounds closed, at the deadline, one final model everywhere, coalitions).
fn report_seed(
    scenario: &Scenario,
    seed: u64,
    dir: &Path,
    algorithm: Algorithm,
    p: Prepared,
    setup: &CoordinatorSetup,
    seconds: f64,
) -> anyhow::Result<CoordinatedSeed> {
    let k = p.configs.len();
    let logs: Vec<Vec<serde_json::Value>> = p
        .state_dirs
        .iter()
        .map(|d| lines(&d.join("rounds.jsonl")))
        .collect();
    let mut finals = Vec::with_capacity(k);
    let mut hashes = Vec::with_capacity(k);
    for (i, l) in logs.iter().enumerate() {
        let last = l
            .last()
            .filter(|v| v.get("model_hash").is_some())
            .with_context(|| format!("silo-{i} wrote no final line"))?;
        finals.push(evaluation(last).with_context(|| format!("silo-{i}: no final evaluation"))?);
        hashes.push(last["model_hash"].as_str().unwrap_or_default().to_string());
    }
    let regression = p.spec.is_regression();
    let last = algorithm_round(algorithm, finals, regression);
    let summary = RunSummary {
        seed,
        rounds: scenario.rounds,
        algorithms: vec![AlgorithmResult {
            algorithm: last.algorithm.clone(),
            accuracy: last.accuracy,
            mse: last.mse,
            per_client: last.per_client.clone(),
            same_group_mass: None,
            trained_group_mass: None,
            reliance: Default::default(),
            privacy: None,
            audit: None,
        }],
        faults: None,
        coordinated_faults: Default::default(),
    };
    write_json(&dir.join("summary.json"), &summary)?;
    let curve = curve(&logs, scenario.rounds, algorithm, regression);
    let closed = lines(&setup.state_dir.join("coordinator.jsonl"));
    // FedCollab has no coordinator rounds: its record is the structure.
    let coalitions = std::fs::read_to_string(setup.state_dir.join("fedcollab.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|r| r["coalitions"].clone());
    let timed_out = closed
        .iter()
        .filter(|l| l["timed_out"].as_bool() == Some(true))
        .count();
    write_json(
        &dir.join("swarm.json"),
        &serde_json::json!({
            "algorithm": algorithm.name(),
            "nodes": k,
            "seconds": seconds,
            "coordinator_rounds": closed.len(),
            "rounds_closed_at_deadline": timed_out,
            "same_final_model_everywhere": hashes.windows(2).all(|w| w[0] == w[1]),
            "coalitions": coalitions,
        }),
    )?;
    Ok(CoordinatedSeed {
        summary,
        curves: vec![(algorithm.name().to_string(), curve)],
        num_params: p.spec.num_params(),
        spec: p.spec,
        clients: k,
    })
}

/// The rounds every node evaluated, scored as `simulate` scores them, for the curve.
fn curve(
    logs: &[Vec<serde_json::Value>],
    rounds: usize,
    algorithm: Algorithm,
    regression: bool,
) -> Vec<(usize, f64)> {
    let mut curve = Vec::new();
    for round in 1..=rounds as u64 {
        let evals: Option<Vec<Evaluation>> = logs
            .iter()
            .map(|l| {
                l.iter()
                    .find(|v| v["round"].as_u64() == Some(round))
                    .and_then(evaluation)
            })
            .collect();
        if let Some(e) = evals {
            let r = algorithm_round(algorithm, e, regression);
            curve.push((round as usize, r.accuracy.or(r.mse).unwrap_or(f64::NAN)));
        }
    }
    curve
}
