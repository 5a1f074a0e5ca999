//! Real node processes on 127.0.0.1: the swarm against the simulator, crash and resume,
//! a model above 10 MiB, and a peer outside the manifest.

use federico::launch::{self, Prepared};
use federico::net::config::Deadlines;
use federico::net::node::NodeRound;
use federico::net::{Checkpoint, Manifest, Member, NodeConfig, keygen};
use federico::scenario::Scenario;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_federico");

fn quickstart(overrides: &[&str]) -> Scenario {
    let over: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    Scenario::load_with(Path::new("simulations/quickstart.toml"), &over).unwrap()
}

fn fast_deadlines() -> Deadlines {
    Deadlines {
        model_s: 3.0,
        gradient_s: 3.0,
        start_s: 10.0,
        // Round 1 at start_s with whoever came, as before nodes waited for a first peer.
        alone_s: Some(10.0),
        linger_s: 5.0,
    }
}

fn run_log(dir: &Path) -> Vec<NodeRound> {
    launch::read_run_log(&dir.join("rounds.jsonl")).unwrap()
}

/// Waits for `child` to exit, killing it after `limit` (a failsafe, not synchronisation).
fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let until = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("a node did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start_all(p: &Prepared) -> Vec<Child> {
    p.names
        .iter()
        .zip(&p.configs)
        .map(|(n, c)| {
            launch::start_node(Path::new(EXE), c, &p.nodes_dir.join(format!("{n}.log"))).unwrap()
        })
        .collect()
}

fn json(path: PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn a_fault_free_swarm_makes_the_simulators_decisions() {
    swarm_makes_the_simulators_decisions(&[]);
}

/// The same with the M-step of one epoch of mini-batch sub-steps: batches of 10 over 40
/// training samples per silo make four sub-steps per round, each with its own pulls and
/// gradients over the network.
#[test]
fn a_fault_free_swarm_with_epoch_sub_steps_makes_the_simulators_decisions() {
    swarm_makes_the_simulators_decisions(&[
        "--set",
        "federico.mstep=\"epoch\"",
        "--set",
        "train.batch_size=10",
    ]);
}

/// The M-step for a wide-area network (`local_epoch`): one exchange per round, then each owner
/// takes four sub-steps alone on its own batches of 10, the others' gradients held and
/// corrected. Every node takes the simulator's steps.
#[test]
fn a_fault_free_swarm_with_a_local_epoch_makes_the_simulators_decisions() {
    swarm_makes_the_simulators_decisions(&[
        "--set",
        "federico.mstep=\"local_epoch\"",
        "--set",
        "train.batch_size=10",
    ]);
}

/// Three silos, one alone in its label group, with FedeRiCo's defaults: every silo samples
/// every model, so the owners cap the others' gradients against their own (`foreign_cap`), over
/// four sub-steps per round.
#[test]
fn a_three_silo_swarm_with_the_foreign_cap_makes_the_simulators_decisions() {
    swarm_makes_the_simulators_decisions(&[
        "--set",
        "split.clients=3",
        "--set",
        "federico.mstep=\"epoch\"",
        "--set",
        "train.batch_size=10",
    ]);
}

/// The option `own_floor` (a silo trains its own model with weight at least 0.25) travels to
/// every node: the same decisions as in the simulator, over four sub-steps per round (the
/// floor acts here: it changes the weights of 99 of the 100 rounds of seed 1).
#[test]
fn a_swarm_with_a_floor_under_the_own_gradient_makes_the_simulators_decisions() {
    swarm_makes_the_simulators_decisions(&[
        "--set",
        "federico.mstep=\"epoch\"",
        "--set",
        "train.batch_size=10",
        "--set",
        "federico.own_floor=0.25",
    ]);
}

/// Four clinics' own CSV rows, a softmax regression of 21 parameters on 120 rows a clinic:
/// `loss_scale = "auto"` sets κ = 120 / 21 on every node as in the simulator.
#[test]
fn a_swarm_on_own_csv_with_the_data_set_temperature_makes_the_simulators_decisions() {
    let last = scenario_swarm_makes_the_simulators_decisions("simulations/own-csv.toml", &[]);
    // At κ = 1 every weight ends at 0.23-0.26; at 5.7 the clinics pair up.
    let rows = last["federico"]["weights"].as_array().unwrap().clone();
    let top = rows
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|w| w.as_f64().unwrap()))
        .fold(0.0, f64::max);
    assert!(top > 0.4, "{rows:?}");
}

/// `[privacy]` on every node (noise seeded from the run seed, as a swarm sets it), the clip
/// shared by the weights: the simulator's noise, Poisson samples, clip norms and decisions bit
/// for bit, and the same ε per silo in both summaries, calibrated to spend the budget.
#[test]
fn a_private_swarm_makes_the_simulators_decisions_and_spends_its_budget() {
    swarm_makes_the_simulators_decisions(&[
        "--set",
        "algorithms=[\"federico\"]",
        "--set",
        "privacy.epsilon=4",
        "--set",
        "privacy.clip_split=\"weights\"",
    ]);
}

/// A budget that runs out: σ set by hand spends ε = 2 in a few rounds, then every silo
/// releases nothing new; nodes and simulator stop at the same round with the same ε.
#[test]
fn a_private_swarm_whose_budget_runs_out_stops_as_the_simulator_does() {
    let dir = tempfile::tempdir().unwrap();
    let set = [
        "--set",
        "algorithms=[\"federico\"]",
        "--set",
        "privacy.epsilon=2",
        "--set",
        "privacy.noise_multiplier=3",
        "--set",
        "rounds=30",
        "--set",
        "eval_every=10",
    ];
    let mut spent = Vec::new();
    for cmd in ["swarm", "simulate"] {
        let out = Command::new(EXE)
            .args([cmd, "simulations/quickstart.toml", "--seed", "1", "-q"])
            .args(set)
            .arg("--out")
            .arg(dir.path().join(cmd))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary = json(dir.path().join(cmd).join("seed-1/summary.json"));
        spent.push(summary["algorithms"][0]["privacy"].clone());
    }
    assert_eq!(spent[0], spent[1]);
    assert_eq!(spent[0]["exhausted"], 8.0, "{}", spent[0]);
    for e in spent[0]["per_client_epsilon"].as_array().unwrap() {
        let e = e.as_f64().unwrap();
        assert!(e <= 2.0 && e > 1.0, "{e}");
    }
    // Each node said so in its log, once.
    let logs = std::fs::read_dir(dir.path().join("swarm/seed-1/nodes"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(logs.len(), 8);
    for l in &logs {
        assert_eq!(l.matches("privacy budget spent").count(), 1, "{l}");
    }
}

/// `swarm` and `simulate` of the quick start with `set` on both: same accuracy, every round's
/// decisions the same.
fn swarm_makes_the_simulators_decisions(set: &[&str]) {
    scenario_swarm_makes_the_simulators_decisions("simulations/quickstart.toml", set);
}

/// [`swarm_makes_the_simulators_decisions`] on `scenario`; returns the swarm's last round.
fn scenario_swarm_makes_the_simulators_decisions(
    scenario: &str,
    set: &[&str],
) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let (swarm, sim) = (dir.path().join("swarm"), dir.path().join("sim"));
    let out = Command::new(EXE)
        .args(["swarm", scenario, "--seed", "1", "-q"])
        .args(set)
        .arg("--out")
        .arg(&swarm)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(EXE)
        .args(["simulate", scenario, "--seed", "1", "-q"])
        .args(set)
        .args(["--set", "algorithms=[\"federico\"]", "--out"])
        .arg(&sim)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let a = json(swarm.join("seed-1/summary.json"));
    let b = json(sim.join("seed-1/summary.json"));
    let (fa, fb) = (&a["algorithms"][0], &b["algorithms"][0]);
    let (acc_a, acc_b) = (
        fa["accuracy"].as_f64().unwrap(),
        fb["accuracy"].as_f64().unwrap(),
    );
    assert!(
        (acc_a - acc_b).abs() <= 0.02,
        "swarm {acc_a} vs simulate {acc_b}"
    );
    // Under `[privacy]`: the same ε spent, silo by silo (both `null` without it).
    assert_eq!(fa["privacy"], fb["privacy"]);
    // (DP's noisy losses blur the quick start's weights: the mass is checked without it.)
    if let Some(mass) = fa["same_group_mass"]
        .as_f64()
        .filter(|_| fa["privacy"].is_null())
    {
        assert!(mass >= 0.9, "same-group mass {mass}");
    }
    // Stronger than the 2-point tolerance: with no faults, every decision is the simulator's.
    let lines = |p: PathBuf| -> Vec<serde_json::Value> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (ra, rb) = (
        lines(swarm.join("seed-1/rounds.jsonl")),
        lines(sim.join("seed-1/rounds.jsonl")),
    );
    assert_eq!(ra.len(), rb.len());
    for (x, y) in ra.iter().zip(&rb) {
        // The simulator also writes the trained-with mass, which needs every silo's training
        // set size; the nodes' logs do not carry it.
        let mut y_fed = y["federico"].clone();
        if let Some(o) = y_fed.as_object_mut() {
            o.remove("trained_group_mass");
        }
        assert_eq!(x["federico"], y_fed, "round {}", x["round"]);
        assert_eq!(x["algorithms"], y["algorithms"], "round {}", x["round"]);
    }
    assert!(
        swarm.join("seed-1/weights_heatmap.svg").exists()
            || swarm.join("seed-1").read_dir().unwrap().any(|e| e
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "svg"))
    );
    ra.last().unwrap().clone()
}

#[test]
fn a_killed_node_resumes_from_its_checkpoint() {
    kill_and_resume(false);
}

/// A byte of the latest checkpoint flipped while the node is down: the restart falls back to
/// the previous generation, one round earlier, and the run log stays one line per round.
#[test]
fn a_killed_node_with_a_corrupt_checkpoint_resumes_from_the_previous_one() {
    kill_and_resume(true);
}

/// A node whose checkpoint cannot be written (its path taken by a directory mid-run, as a full
/// disk or no file descriptors left would fail it) warns and keeps completing rounds; the
/// run finishes.
#[test]
fn a_node_whose_checkpoint_cannot_be_written_keeps_going() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = quickstart(&["split.clients=4", "rounds=200", "eval_every=50"]);
    let p = launch::prepare(&scenario, 3, None, &fast_deadlines(), dir.path()).unwrap();
    let mut nodes = start_all(&p);
    let victim = 2;
    let state = &p.state_dirs[victim];
    let until = Instant::now() + Duration::from_secs(60);
    while run_log(state).len() < 20 {
        assert!(Instant::now() < until, "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Take the checkpoint's path (the node may write it again meanwhile: try until it holds).
    let path = state.join("checkpoint.bin");
    loop {
        let _ = std::fs::remove_file(&path);
        if std::fs::create_dir(&path).is_ok() {
            break;
        }
    }
    std::fs::write(path.join("in-the-way"), b"").unwrap();
    let blocked_at = run_log(state).len();
    for n in &mut nodes {
        assert!(wait(n, Duration::from_secs(180)).success());
    }
    let rounds: Vec<u64> = run_log(state).iter().map(|r| r.round).collect();
    assert_eq!(
        rounds,
        (1..=200).collect::<Vec<u64>>(),
        "one line per round"
    );
    assert!(blocked_at < 190, "blocked only at round {blocked_at}");
    let log = std::fs::read_to_string(p.nodes_dir.join(format!("silo-{victim}.log"))).unwrap();
    assert!(log.contains("checkpoint not written"), "{log}");
    // Rate-limited: far fewer warnings than failed rounds.
    let warnings = log.matches("checkpoint not written").count();
    assert!(warnings < 10, "{warnings} warnings");
}

fn kill_and_resume(corrupt: bool) {
    let dir = tempfile::tempdir().unwrap();
    let scenario = quickstart(&["split.clients=4", "rounds=300", "eval_every=50"]);
    let p = launch::prepare(&scenario, 3, None, &fast_deadlines(), dir.path()).unwrap();
    let mut nodes = start_all(&p);
    let victim = 3;
    let state = &p.state_dirs[victim];

    // Let it run a while, then kill it without warning.
    let until = Instant::now() + Duration::from_secs(60);
    while run_log(state).len() < 20 {
        assert!(Instant::now() < until, "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    nodes[victim].kill().unwrap(); // SIGKILL
    nodes[victim].wait().unwrap();
    let logged = run_log(state).iter().map(|r| r.round).max().unwrap();
    let ckpt = Checkpoint::read(&state.join("checkpoint.bin"))
        .unwrap()
        .unwrap();
    // A round's line is written just before its checkpoint: the log is at most one round
    // ahead, and never behind.
    assert!(
        logged == ckpt.round || logged == ckpt.round + 1,
        "checkpoint at {} but {logged} rounds logged",
        ckpt.round
    );
    if let Some(rec) = run_log(state).iter().rev().find(|r| r.round == ckpt.round) {
        let table: Vec<(u32, f64)> = ckpt
            .peer
            .weights()
            .into_iter()
            .map(|(id, w)| (id.0, w))
            .collect();
        assert_eq!(
            rec.weights, table,
            "the checkpoint holds the round's collaborator table"
        );
    }
    let first_log = std::fs::read_to_string(p.nodes_dir.join("silo-3.log")).unwrap();
    let ckpt = if corrupt {
        let path = state.join("checkpoint.bin");
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x01;
        // Written as a new file: a kill between the store's link of the old file to `.prev`
        // and its rename of the new one leaves both names on one inode, and an in-place write
        // would damage both.
        let damaged = state.join("damaged.tmp");
        std::fs::write(&damaged, &bytes).unwrap();
        std::fs::rename(&damaged, &path).unwrap();
        let prev = federico::store::prev_path(&path);
        let prev = Checkpoint::read(&prev).unwrap().unwrap();
        assert!(
            prev.round + 1 == ckpt.round || prev.round == ckpt.round,
            "the previous generation is one round older (or the same, killed mid-save): {} vs {}",
            prev.round,
            ckpt.round
        );
        prev
    } else {
        ckpt
    };

    // Restart with the same config.
    let relog = p.nodes_dir.join("silo-3.restart.log");
    nodes[victim] = launch::start_node(Path::new(EXE), &p.configs[victim], &relog).unwrap();
    for n in &mut nodes {
        assert!(wait(n, Duration::from_secs(180)).success());
    }
    let second_log = std::fs::read_to_string(&relog).unwrap();
    assert_eq!(
        second_log.contains("resuming from its previous generation"),
        corrupt,
        "{second_log}"
    );
    // The refused file is kept for inspection, and the latest is good again.
    assert_eq!(state.join("checkpoint.bin.corrupt").exists(), corrupt);
    let latest = Checkpoint::read(&state.join("checkpoint.bin"))
        .unwrap()
        .unwrap();
    assert!(latest.round > ckpt.round, "checkpoint at {}", latest.round);
    assert!(
        second_log.contains(&format!(
            "resuming from checkpoint round={} version={}",
            ckpt.round, ckpt.version
        )),
        "{second_log}"
    );
    let peer_of = |log: &str| {
        log.lines()
            .find(|l| l.contains("node started"))
            .and_then(|l| l.split("peer=").nth(1))
            .map(|s| s.split_whitespace().next().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(
        peer_of(&first_log),
        peer_of(&second_log),
        "same peer ID after restart"
    );
    assert_eq!(peer_of(&first_log), ckpt.peer_id);
    // The run continues from the checkpoint: the restart cut the log back to it, so every
    // round is logged exactly once, and the first one after is marked resumed.
    let log = run_log(state);
    let rounds: Vec<u64> = log.iter().map(|r| r.round).collect();
    assert_eq!(
        rounds,
        (1..=300).collect::<Vec<u64>>(),
        "one line per round"
    );
    let resumed: Vec<u64> = log.iter().filter(|r| r.resumed).map(|r| r.round).collect();
    assert_eq!(
        resumed,
        vec![ckpt.round + 1],
        "resumed at the checkpoint's next round"
    );
    if logged > ckpt.round {
        assert!(
            second_log.contains("run log cut back to the checkpoint"),
            "{second_log}"
        );
    }
}

#[test]
fn a_model_above_10_mib_crosses_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    // 40 inputs → 70 000 hidden → 8 classes: 3.4 M parameters, 13.7 MB per model message,
    // above libp2p's stock 10 MiB response cap.
    let scenario = quickstart(&[
        "split.clients=2",
        "split.groups=1",
        "rounds=2",
        "eval_every=2",
        "model.kind=\"mlp\"",
        "model.hidden=[70000]",
        "federico.neighbours=1",
        // Every pulled model gets its gradient back (the push cut could send a skip).
        "federico.variant=\"paper\"",
    ]);
    // What is tested is the size, not the speed: the deadlines leave room for a loaded
    // machine (CI on a CPU without AVX2 once missed the 3 s one, with the file's other tests
    // running beside it). A size cap that refused the model would fail the pull at once.
    let deadlines = Deadlines {
        model_s: 20.0,
        gradient_s: 20.0,
        ..fast_deadlines()
    };
    let p = launch::prepare(&scenario, 1, None, &deadlines, dir.path()).unwrap();
    let mut nodes = start_all(&p);
    for n in &mut nodes {
        assert!(wait(n, Duration::from_secs(120)).success());
    }
    // The nodes' warnings and errors, for a failure's message.
    let trouble = || {
        p.names
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(p.nodes_dir.join(format!("{n}.log")))
                    .unwrap_or_default();
                let bad: Vec<&str> = text.lines().filter(|l| !l.contains(" INFO ")).collect();
                format!("{n}:\n{}", bad.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    for s in &p.state_dirs {
        let log = run_log(s);
        assert_eq!(log.len(), 2);
        for r in &log {
            assert_eq!(r.sampled.len(), 1);
            assert_eq!(
                r.answered,
                r.sampled,
                "round {}: the big model did not arrive\n{}",
                r.round,
                trouble()
            );
            assert_eq!(
                r.gradients, 2,
                "round {}: own gradient plus the sampler's",
                r.round
            );
        }
    }
}

/// Silo 1's config made an outsider's: its key, manifest and state in `out_dir`, any free port,
/// 3 rounds.
fn outsider_config(p: &Prepared, out_dir: &Path) -> NodeConfig {
    let mut cfg = NodeConfig::load(&p.configs[1]).unwrap();
    cfg.name = "outsider".into();
    cfg.key = out_dir.join("outsider.key");
    cfg.manifest = out_dir.join("manifest.toml");
    cfg.listen = vec!["/ip4/127.0.0.1/tcp/0".into()];
    cfg.state_dir = out_dir.join("state");
    cfg.rounds = 3;
    cfg
}

#[test]
fn a_peer_outside_the_manifest_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = quickstart(&[
        "split.clients=2",
        "split.groups=1",
        "rounds=1000000",
        "federico.neighbours=1",
    ]);
    let p = launch::prepare(&scenario, 1, None, &fast_deadlines(), dir.path()).unwrap();

    // An outsider: its own key, a manifest of its own that lists silo-0 as it really is.
    let members = Manifest::load(&dir.path().join("manifest.toml"))
        .unwrap()
        .members;
    let out_dir = dir.path().join("outsider");
    let key = keygen(&out_dir.join("outsider.key")).unwrap();
    let manifest = Manifest {
        open: false,
        epoch_steps: None,
        members: vec![
            members[0].clone(),
            Member {
                name: "outsider".into(),
                peer_id: key.public().to_peer_id(),
                addrs: vec![],
            },
        ],
        relays: vec![],
    };
    std::fs::write(out_dir.join("manifest.toml"), manifest.to_toml()).unwrap();
    let mut cfg = outsider_config(&p, &out_dir);
    // It never sees a member run FedeRiCo (its connection is refused), so it starts alone.
    cfg.deadlines.start_s = 0.5;
    cfg.deadlines.model_s = 1.0;
    cfg.deadlines.gradient_s = 1.0;
    let cfg_path = out_dir.join("outsider.toml");
    std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();

    let mut nodes = start_all(&p);
    // The members are up and running before the outsider knocks. They would run a million
    // rounds: they are stopped with SIGTERM once the outsider is done, so how fast a loaded
    // machine runs their rounds cannot end them before the refusal is exercised.
    let until = Instant::now() + Duration::from_secs(60);
    while run_log(&p.state_dirs[0]).is_empty() {
        assert!(Instant::now() < until, "silo-0 made no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut outsider =
        launch::start_node(Path::new(EXE), &cfg_path, &out_dir.join("outsider.log")).unwrap();
    assert!(wait(&mut outsider, Duration::from_secs(60)).success());
    assert!(
        nodes[0].try_wait().unwrap().is_none(),
        "silo-0 exited before the outsider was done: the refusal was not exercised"
    );
    // Rounds the members finished while the outsider knocked; later rounds may see a member
    // already stopped by the SIGTERM below.
    let knocked: Vec<usize> = p.state_dirs.iter().map(|s| run_log(s).len()).collect();
    for n in &mut nodes {
        unsafe { libc::kill(n.id() as i32, libc::SIGTERM) };
        assert!(wait(n, Duration::from_secs(60)).success());
    }
    let log = run_log(&cfg.state_dir);
    assert_eq!(log.len(), 3);
    for r in &log {
        assert_eq!(r.sampled, vec![0], "it can only sample silo-0");
        assert!(
            r.answered.is_empty(),
            "round {}: the outsider got a model",
            r.round
        );
    }
    let silo0 = std::fs::read_to_string(p.nodes_dir.join("silo-0.log")).unwrap();
    assert!(silo0.contains("refused a connection"), "{silo0}");
    // The members never counted the outsider: they ran their rounds with each other.
    for (s, n) in p.state_dirs.iter().zip(knocked) {
        assert!(n > 0);
        assert!(run_log(s)[..n].iter().all(|r| r.answered == r.sampled));
    }
}

#[test]
fn the_example_node_configs_and_manifest_are_valid() {
    let manifest = Manifest::load(Path::new("node-config/manifest.toml")).unwrap();
    for name in ["hospital-a", "hospital-b", "lab-c"] {
        let cfg = NodeConfig::load(Path::new(&format!("node-config/{name}.toml"))).unwrap();
        assert_eq!(cfg.name, name);
        assert!(
            manifest.by_name(name).is_some(),
            "{name} is not in the manifest"
        );
        assert!(cfg.manifest.ends_with("node-config/manifest.toml"));
    }
    let coord = federico::net::coordinator::CoordinatorConfig::load(Path::new(
        "node-config/coordinator.toml",
    ))
    .unwrap();
    assert_eq!(coord.algorithm, "hcct");
    assert_eq!(coord.nodes, 3);
    assert!(coord.manifest.ends_with("node-config/manifest.toml"));
}

#[test]
fn a_bad_node_config_names_the_field_and_the_node_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string("node-config/hospital-a.toml")
        .unwrap()
        .replace("epsilon = 0.3", "epsilon = 1.5");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(EXE)
        .args(["node", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("federico.epsilon must be in [0, 1], got 1.5"),
        "{err}"
    );
}

/// The epoch M-step's sub-step count is federation-wide: a node told to run it by a manifest
/// that does not carry `epoch_steps` exits 2 saying where to put it.
#[test]
fn an_epoch_node_without_the_manifests_epoch_steps_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let fed = dir.path().join("federation");
    let out = Command::new(EXE)
        .args(["init", "2", "--port", "4741", "--out"])
        .arg(&fed)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest = fed.join("manifest.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("epoch_steps = 1"), "{text}");
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("epoch_steps"))
        .collect();
    std::fs::write(&manifest, kept.join("\n")).unwrap();
    let cfg = fed.join("silo-0.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("mstep = \"full\""), "{text}");
    std::fs::write(&cfg, text.replace("mstep = \"full\"", "mstep = \"epoch\"")).unwrap();
    let out = Command::new(EXE)
        .args(["node", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("set epoch_steps = ceil("), "{err}");
    assert!(err.contains("manifest.toml"), "{err}");
}

#[test]
fn nodes_read_their_own_csv_data() {
    use federico::learn::{Labels, Shard};
    use federico::net::config::{DataFormat, DataSource};
    let dir = tempfile::tempdir().unwrap();
    let scenario = quickstart(&[
        "split.clients=2",
        "split.groups=1",
        "rounds=3",
        "federico.neighbours=1",
    ]);
    let p = launch::prepare(&scenario, 1, None, &fast_deadlines(), dir.path()).unwrap();
    let mut nodes = Vec::new();
    for (i, cfg_path) in p.configs.iter().enumerate() {
        let mut cfg = NodeConfig::load(cfg_path).unwrap();
        let shard = Shard::read(cfg.data.shard.as_ref().unwrap()).unwrap();
        let mut files = Vec::new();
        for (part, d) in [("train", &shard.data.train), ("test", &shard.data.test)] {
            let Labels::Class { ids, .. } = &d.labels else {
                panic!()
            };
            let w = d.feature_len();
            let mut text = String::from("features...,label\n");
            for (row, y) in d.features.chunks(w).zip(ids) {
                let cells: Vec<String> = row.iter().map(|v| format!("{v:?}")).collect();
                text += &format!("{},{y}\n", cells.join(","));
            }
            let f = dir.path().join(format!("silo-{i}-{part}.csv"));
            std::fs::write(&f, text).unwrap();
            files.push(f);
        }
        cfg.data = DataSource {
            format: Some(DataFormat::Csv),
            train: vec![files[0].clone()],
            test: vec![files[1].clone()],
            classes: Some(shard.data.train.num_classes().unwrap()),
            ..Default::default()
        };
        std::fs::write(cfg_path, toml::to_string(&cfg).unwrap()).unwrap();
        nodes.push(
            launch::start_node(
                Path::new(EXE),
                cfg_path,
                &p.nodes_dir.join(format!("silo-{i}.log")),
            )
            .unwrap(),
        );
    }
    for n in &mut nodes {
        assert!(wait(n, Duration::from_secs(60)).success());
    }
    for s in &p.state_dirs {
        let log = run_log(s);
        assert_eq!(log.len(), 3);
        assert!(
            log.iter()
                .all(|r| r.answered == r.sampled && r.eval.is_some())
        );
    }
}

/// `/tcp/<port>` → `/udp/<port>/quic-v1` in a manifest or config.
fn to_quic(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/tcp/") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 5..];
        let end = after
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after.len());
        out.push_str(&format!("/udp/{}/quic-v1", &after[..end]));
        rest = &after[end..];
    }
    out + rest
}

#[test]
fn a_swarm_runs_over_quic_and_decides_as_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = quickstart(&["split.clients=4", "rounds=10"]);
    let tcp = launch::prepare(
        &scenario,
        2,
        None,
        &fast_deadlines(),
        &dir.path().join("tcp"),
    )
    .unwrap();
    let quic = launch::prepare(
        &scenario,
        2,
        None,
        &fast_deadlines(),
        &dir.path().join("quic"),
    )
    .unwrap();
    let manifest = dir.path().join("quic/manifest.toml");
    std::fs::write(
        &manifest,
        to_quic(&std::fs::read_to_string(&manifest).unwrap()),
    )
    .unwrap();
    for c in &quic.configs {
        std::fs::write(c, to_quic(&std::fs::read_to_string(c).unwrap())).unwrap();
        assert!(std::fs::read_to_string(c).unwrap().contains("quic-v1"));
    }
    for p in [&tcp, &quic] {
        let mut nodes = start_all(p);
        for n in &mut nodes {
            assert!(wait(n, Duration::from_secs(60)).success());
        }
    }
    for (a, b) in tcp.state_dirs.iter().zip(&quic.state_dirs) {
        let (la, lb) = (run_log(a), run_log(b));
        assert_eq!(la.len(), 10);
        for (x, y) in la.iter().zip(&lb) {
            assert_eq!((&x.sampled, &x.weights), (&y.sampled, &y.weights));
            assert_eq!(x.answered, x.sampled);
        }
    }
}

#[test]
fn metrics_are_served_and_sigterm_stops_a_node_cleanly() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let scenario = quickstart(&["split.clients=2", "split.groups=1"]);
    let p = launch::prepare(&scenario, 1, None, &fast_deadlines(), dir.path()).unwrap();
    // silo-0 alone, in a federation of one, running until stopped.
    let mut cfg = NodeConfig::load(&p.configs[0]).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    cfg.metrics = Some(format!("127.0.0.1:{port}"));
    cfg.rounds = 0;
    let solo = Manifest {
        open: false,
        epoch_steps: None,
        members: vec![Manifest::load(&cfg.manifest).unwrap().members[0].clone()],
        relays: vec![],
    };
    cfg.manifest = dir.path().join("solo.toml");
    std::fs::write(&cfg.manifest, solo.to_toml()).unwrap();
    let path = dir.path().join("solo-node.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    let mut node = launch::start_node(Path::new(EXE), &path, &dir.path().join("solo.log")).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while run_log(&cfg.state_dir).len() < 3 {
        assert!(Instant::now() < until, "no rounds");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    sock.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    for name in [
        "federico_rounds ",
        "federico_weight{peer=\"silo-0\"}",
        "federico_test_accuracy",
        "federico_connected_peers",
    ] {
        assert!(body.contains(name), "{name} missing from\n{body}");
    }
    // SIGTERM: the round in flight is abandoned, the checkpoint stands, exit 0.
    unsafe { libc::kill(node.id() as i32, libc::SIGTERM) };
    assert!(wait(&mut node, Duration::from_secs(30)).success());
    let ckpt = Checkpoint::read(&cfg.state_dir.join("checkpoint.bin"))
        .unwrap()
        .unwrap();
    let logged = run_log(&cfg.state_dir)
        .iter()
        .map(|r| r.round)
        .max()
        .unwrap();
    assert!(ckpt.round >= logged);
}

/// A libp2p program holding `key` on `addr` that accepts connections and speaks none of
/// FedeRiCo's protocols: what a silo's coordinated node looks like to a silo that already fell
/// back to FedeRiCo. It runs until the returned runtime is dropped.
fn stand_in(rt: &tokio::runtime::Runtime, key: &Path, addr: &str) {
    use libp2p::futures::StreamExt;
    let key = federico::net::identity::load_key(key).unwrap();
    let addr: libp2p::Multiaddr = addr.parse().unwrap();
    rt.spawn(async move {
        let mut swarm = libp2p::SwarmBuilder::with_existing_identity(key)
            .with_tokio()
            .with_tcp(
                libp2p::tcp::Config::default(),
                libp2p::noise::Config::new,
                libp2p::yamux::Config::default,
            )
            .unwrap()
            .with_behaviour(|_| libp2p::swarm::dummy::Behaviour)
            .unwrap()
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(60)))
            .build();
        swarm.listen_on(addr).unwrap();
        loop {
            swarm.select_next_some().await;
        }
    });
}

/// Silo 0 starts while every other member's address is held by a program of the same key that
/// speaks none of FedeRiCo's protocols (their coordinated nodes, not yet fallen back). Silo 0
/// connects to them, but must not count them as present: it waits in its start phase until the
/// real nodes run (they start 1 s after the stand-ins are gone), then every round of every silo
/// hears every peer it sampled. It once ran all its rounds alone in milliseconds instead.
#[test]
fn a_member_speaking_something_else_is_not_counted_as_present() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = quickstart(&["split.clients=4", "rounds=20"]);
    let p = launch::prepare(&scenario, 1, None, &fast_deadlines(), dir.path()).unwrap();
    let manifest = Manifest::load(&dir.path().join("manifest.toml")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for c in &p.configs[1..] {
        let cfg = NodeConfig::load(c).unwrap();
        let (_, m) = manifest.by_name(&cfg.name).unwrap();
        stand_in(&rt, &cfg.key, &m.addrs[0].to_string());
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut first = launch::start_node(
        Path::new(EXE),
        &p.configs[0],
        &p.nodes_dir.join("silo-0.log"),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // The stand-ins go (their connections close); the real nodes come a second later.
    drop(rt);
    std::thread::sleep(Duration::from_millis(1000));
    let mut nodes: Vec<Child> = p.names[1..]
        .iter()
        .zip(&p.configs[1..])
        .map(|(n, c)| {
            launch::start_node(Path::new(EXE), c, &p.nodes_dir.join(format!("{n}.log"))).unwrap()
        })
        .collect();
    assert!(wait(&mut first, Duration::from_secs(120)).success());
    for n in &mut nodes {
        assert!(wait(n, Duration::from_secs(120)).success());
    }
    let silo0 = std::fs::read_to_string(p.nodes_dir.join("silo-0.log")).unwrap();
    for (i, s) in p.state_dirs.iter().enumerate() {
        let log = run_log(s);
        assert_eq!(log.len(), 20, "silo {i}");
        for r in &log {
            assert!(!r.sampled.is_empty());
            assert_eq!(
                r.answered, r.sampled,
                "silo {i} round {}: a sampled peer went unheard; silo-0's log:\n{silo0}",
                r.round
            );
        }
    }
}

/// A `federico relay` for the federation prepared in `dir`, whose manifest then lists no member
/// address, only the relay (`open`: any peer may join). Returns the relay's process and log,
/// once it has started, and the manifest.
fn relay_for(dir: &Path, open: bool) -> (std::process::Child, PathBuf, Manifest) {
    let relay_key = dir.join("relay.key");
    let relay_id = keygen(&relay_key).unwrap().public().to_peer_id();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let relay_addr = format!("/ip4/127.0.0.1/tcp/{port}/p2p/{relay_id}");
    // The members can be reached through the relay only.
    let mut manifest = Manifest::load(&dir.join("manifest.toml")).unwrap();
    for m in &mut manifest.members {
        m.addrs.clear();
    }
    manifest.open = open;
    manifest.relays = vec![federico::net::identity::Relay {
        peer_id: relay_id,
        addr: relay_addr.parse().unwrap(),
    }];
    std::fs::write(dir.join("manifest.toml"), manifest.to_toml()).unwrap();
    let relay_log = dir.join("relay.log");
    let relay = Command::new(EXE)
        .args(["relay", "--key"])
        .arg(&relay_key)
        .arg("--manifest")
        .arg(dir.join("manifest.toml"))
        .args(["--listen", &format!("/ip4/127.0.0.1/tcp/{port}")])
        .stderr(std::fs::File::create(&relay_log).unwrap())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&relay_log)
        .unwrap()
        .contains("relay started")
    {
        assert!(Instant::now() < until, "the relay did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (relay, relay_log, manifest)
}

/// In an open federation any peer that connects joins late; the relay connects to every
/// member but is never one of them: no member counts it, weighs it or samples it.
#[test]
fn a_relay_never_joins_an_open_federation() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = quickstart(&["split.clients=2", "split.groups=1", "rounds=10"]);
    let p = launch::prepare(&scenario, 1, None, &fast_deadlines(), dir.path()).unwrap();
    let (mut relay, relay_log, manifest) = relay_for(dir.path(), true);
    let relay_id = manifest.relays[0].peer_id.to_string();
    let mut nodes = start_all(&p);
    for n in &mut nodes {
        assert!(wait(n, Duration::from_secs(120)).success());
    }
    let _ = relay.kill();
    let _ = relay.wait();
    let relayed = std::fs::read_to_string(&relay_log).unwrap();
    assert!(relayed.contains("circuit opened"), "{relayed}");
    for (i, s) in p.state_dirs.iter().enumerate() {
        let text = std::fs::read_to_string(p.nodes_dir.join(format!("silo-{i}.log"))).unwrap();
        assert!(text.contains("reachable through the relay"), "silo {i}");
        assert!(
            !text
                .lines()
                .any(|l| l.contains("joined the open federation") && l.contains(&relay_id)),
            "silo {i} took the relay in: {text}"
        );
        let log = run_log(s);
        assert_eq!(log.len(), 10, "silo {i}");
        assert!(log.iter().any(|r| !r.answered.is_empty()), "silo {i}");
        for r in &log {
            assert_eq!(
                r.weights.len(),
                2,
                "silo {i} round {}: {:?}",
                r.round,
                r.weights
            );
        }
    }
}

/// A relay (`federico relay`) carries the members' circuits and nobody else's: two silos whose
/// manifest lists no address but the relay's federate through it, and an outsider with its own
/// key is refused a reservation.
#[test]
fn a_relay_carries_members_and_refuses_an_outsider() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = quickstart(&["split.clients=2", "split.groups=1", "rounds=20"]);
    let p = launch::prepare(&scenario, 1, None, &fast_deadlines(), dir.path()).unwrap();
    let (mut relay, relay_log, manifest) = relay_for(dir.path(), false);

    // An outsider: its own key, a manifest listing itself, silo-0 and the relay.
    let out_dir = dir.path().join("outsider");
    let key = keygen(&out_dir.join("outsider.key")).unwrap();
    let mut theirs = manifest.clone();
    theirs.members[1] = Member {
        name: "outsider".into(),
        peer_id: key.public().to_peer_id(),
        addrs: vec![],
    };
    std::fs::write(out_dir.join("manifest.toml"), theirs.to_toml()).unwrap();
    let mut cfg = outsider_config(&p, &out_dir);
    cfg.deadlines.start_s = 3.0;
    cfg.deadlines.alone_s = Some(3.0);
    let cfg_path = out_dir.join("outsider.toml");
    std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();
    let mut outsider =
        launch::start_node(Path::new(EXE), &cfg_path, &out_dir.join("outsider.log")).unwrap();
    let mut nodes = start_all(&p);
    for n in &mut nodes {
        assert!(wait(n, Duration::from_secs(120)).success());
    }
    assert!(wait(&mut outsider, Duration::from_secs(60)).success());
    let _ = relay.kill();
    let _ = relay.wait();

    // The members federated, through the relay.
    for (i, s) in p.state_dirs.iter().enumerate() {
        let log = run_log(s);
        assert_eq!(log.len(), 20, "silo {i}");
        assert!(
            log.iter().any(|r| !r.answered.is_empty()),
            "silo {i} never got its peer's model"
        );
        let text = std::fs::read_to_string(p.nodes_dir.join(format!("silo-{i}.log"))).unwrap();
        assert!(text.contains("reachable through the relay"), "silo {i}");
    }
    let relayed = std::fs::read_to_string(&relay_log).unwrap();
    assert!(relayed.contains("circuit opened"), "{relayed}");
    // The outsider never got a reservation, a circuit or a model.
    let text = std::fs::read_to_string(out_dir.join("outsider.log")).unwrap();
    assert!(!text.contains("reachable through the relay"), "{text}");
    assert!(text.contains("no reservation on the relay"), "{text}");
    assert!(
        run_log(&cfg.state_dir)
            .iter()
            .all(|r| r.answered.is_empty())
    );
    let outsider_id = key.public().to_peer_id().to_string();
    assert!(
        !relayed
            .lines()
            .any(|l| l.contains(&outsider_id) && (l.contains("accepted") || l.contains("opened"))),
        "{relayed}"
    );
}
