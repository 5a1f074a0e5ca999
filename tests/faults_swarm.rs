//! Fault schedules on real node processes (`federico swarm`): a 4 | 4 partition made of real
//! disconnections and healed, a SIGKILL crash with a restart from the checkpoint, a late
//! joiner, a straggler started by a time trigger, message loss, and (as root on Linux) a
//! partition cut in the kernel between nodes in their own network namespaces. The verdicts are asserted,
//! and so are the run logs behind them.

use federico::faults::{DelaySpec, EventSpec, LossSpec};
use federico::launch::{self, SwarmOptions};
use federico::scenario::Scenario;
use federico::trace::NodeRound;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_federico");

fn scenario(file: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("simulations")
        .join(file);
    let mut s = Scenario::load(&path).expect("the shipped scenario is valid");
    s.seeds = vec![1];
    s
}

/// One swarm at a time: three 8-process swarms at once on a 2-core machine would race for free
/// ports and blur the 2 s deadlines the checks are about.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(s: &Scenario, out: &Path) -> (Value, Vec<Vec<NodeRound>>) {
    run_with(s, out, false)
}

fn run_with(s: &Scenario, out: &Path, netns: bool) -> (Value, Vec<Vec<NodeRound>>) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let outcome = launch::swarm(
        s,
        &SwarmOptions {
            out: out.to_owned(),
            data_dir: None,
            exe: PathBuf::from(EXE),
            progress: false,
            deadlines: Default::default(),
            timeout: Duration::from_secs(120),
            netns,
            nat: None,
            baseline: Some(|s, seed, data| Ok(federico::sim::fault_free_finals(s, seed, data)?)),
        },
    )
    .expect("the swarm runs");
    let report = outcome.summary.runs[0]
        .faults
        .clone()
        .expect("a fault report");
    let states = out.join("seed-1/nodes");
    let mut traces = Vec::new();
    for i in 0..s.split.clients {
        let path = states.join(format!("silo-{i}/rounds.jsonl"));
        traces.push(launch::read_run_log(&path).unwrap_or_else(|e| panic!("{e}")));
    }
    (report, traces)
}

/// Whether `test` must skip because the machine cannot run it (`why`): it says so on stderr.
/// Not a pass: FEDERICO_REQUIRE_NETNS=1 makes a skip fail instead.
fn skipped(test: &str, why: Option<String>) -> bool {
    let Some(why) = why else {
        return false;
    };
    assert!(
        std::env::var_os("FEDERICO_REQUIRE_NETNS").is_none(),
        "FEDERICO_REQUIRE_NETNS is set but {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
    true
}

fn check(report: &Value, name: &str) -> Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check: {report:#}"))
        .clone()
}

fn applied_at(report: &Value, what: &str) -> f64 {
    report["applied"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["what"].as_str().unwrap().starts_with(what))
        .unwrap_or_else(|| panic!("{what} was not applied: {report:#}"))["at"]
        .as_f64()
        .unwrap()
}

#[test]
fn a_real_4_4_partition_heals_and_every_check_passes() {
    let s = scenario("partition-heal.toml");
    let dir = tempfile::tempdir().unwrap();
    let (report, traces) = run(&s, dir.path());
    for c in ["liveness", "memory", "recovery", "clean_exit"] {
        assert_eq!(check(&report, c)["pass"], true, "{c}: {report:#}");
    }
    let (cut, heal) = (
        applied_at(&report, "partition"),
        applied_at(&report, "heal"),
    );
    assert!(heal > cut);
    let side = |i: u32| usize::from(i >= 4);
    let mut inside = 0;
    for (i, t) in traces.iter().enumerate() {
        assert_eq!(t.len(), 60, "silo {i} ran every round");
        // No model crossed in a round that began after the cut and ended before the heal.
        for r in t.iter().filter(|r| r.start > cut && r.at < heal) {
            inside += 1;
            assert!(
                r.answered.iter().all(|&b| side(b) == side(i as u32)),
                "silo {i} got a model across the partition in round {}",
                r.round
            );
        }
    }
    assert!(inside >= 8, "only {inside} rounds ran inside the partition");
    // Every silo pulled across again after the heal.
    let crossed = traces
        .iter()
        .enumerate()
        .filter(|(i, t)| {
            t.iter()
                .filter(|r| r.start > heal)
                .any(|r| r.answered.iter().any(|&b| side(b) != side(*i as u32)))
        })
        .count();
    assert!(
        crossed >= 4,
        "only {crossed} silos pulled across after the heal"
    );
    let failed = check(&report, "memory")["figures"]["failed_pulls"]
        .as_u64()
        .unwrap();
    assert!(
        failed > 0 && failed <= 8 * 4 * 6 + 8,
        "failed pulls {failed}"
    );
}

#[test]
fn a_killed_node_restarts_from_its_checkpoint_with_its_peer_id() {
    let s = scenario("crash-restart.toml");
    let dir = tempfile::tempdir().unwrap();
    let (report, traces) = run(&s, dir.path());
    for c in [
        "liveness",
        "memory",
        "crash_safety",
        "clean_exit",
        "recovery",
    ] {
        assert_eq!(check(&report, c)["pass"], true, "{c}: {report:#}");
    }
    let crash = &check(&report, "crash_safety")["figures"]["crashes"][0];
    assert_eq!(crash["silo"], 5);
    assert_eq!(crash["same_peer_id"], true);
    let last = crash["last_round_before"].as_u64().unwrap();
    let first = crash["first_round_after"].as_u64().unwrap();
    assert!(first == last + 1 || first == last + 2, "{crash}");
    // Its run log: every round once except at most the one in flight, and one resumption.
    let t = &traces[5];
    assert_eq!(t.iter().filter(|r| r.resumed).count(), 1);
    let mut rounds: Vec<u64> = t.iter().map(|r| r.round).collect();
    rounds.dedup();
    assert_eq!(rounds.len(), t.len(), "a round logged twice");
    assert!(t.len() >= 59, "silo 5 logged {} of 60 rounds", t.len());
    assert_eq!(t.last().unwrap().round, 60);
    // The kill costs no deadline (the owners stop waiting for a sampler whose connection
    // closed, and drop its pulls held for their next step) and the restarted silo, rounds
    // behind, is not waited for, nor does it, catching up, wait for the gradients of peers
    // ahead of it (`core::round::tests`). Every round after the first (start-up, about 0.5 s)
    // stays far under one deadline (τ = 2 s): 0.028–0.046 s in 24 runs of
    // `federico swarm simulations/crash-restart.toml --seed 1..3`. Before: a round of τ in 1 run
    // of 8 (6 of 19 with RUST_LOG=debug); before that 2.02 s and 4.00 s on seeds 1 and 2.
    let slowest = traces
        .iter()
        .flatten()
        .filter(|r| r.round > 1)
        .map(|r| r.seconds)
        .fold(0.0f64, f64::max);
    eprintln!("crash-restart: slowest round after round 1 of any silo {slowest:.3} s");
    assert!(
        slowest < 1.0,
        "a round waited {slowest:.2} s around the crash: a deadline (τ = 2 s) or most of one"
    );
    // Two processes for silo 5, both logs kept; nine processes in all.
    let clean = check(&report, "clean_exit");
    assert_eq!(clean["figures"]["processes"], 9);
    assert!(dir.path().join("seed-1/nodes/silo-5.2.log").exists());
}

#[test]
fn a_late_joiner_process_is_found_by_its_group() {
    let s = scenario("late-join.toml");
    let dir = tempfile::tempdir().unwrap();
    let (report, traces) = run(&s, dir.path());
    for c in ["liveness", "late_join", "clean_exit", "recovery"] {
        assert_eq!(check(&report, c)["pass"], true, "{c}: {report:#}");
    }
    let joined = applied_at(&report, "join silo 7");
    // Silo 7 ran nothing before its join, then all its rounds; a group mate pulled it.
    assert!(traces[7].iter().all(|r| r.start >= joined));
    assert_eq!(traces[7].len(), 60);
    let join = &check(&report, "late_join")["figures"]["joins"][0];
    assert!(
        join["rounds_to_first_pull_by_mate"].as_u64().unwrap() <= 10,
        "{join}"
    );
    // Before the join the others tried it `suspect_after` times each, then only backed off:
    // 2, 4 and 8 rounds apart in its 20 absent rounds, 6 tries at most.
    for (i, t) in traces.iter().enumerate().take(7) {
        let tries = t
            .iter()
            .filter(|r| r.at < joined && r.sampled.contains(&7))
            .count();
        assert!(
            tries <= 6,
            "silo {i} pulled the absent silo 7 {tries} times"
        );
        // Insiders' review L1: those failures are one WARN line per peer and minute, not one
        // per try (the absence lasts seconds here).
        let log =
            std::fs::read_to_string(dir.path().join(format!("seed-1/nodes/silo-{i}.log"))).unwrap();
        let lines = log
            .lines()
            .filter(|l| l.contains("pull failed") && l.contains("peer=silo-7"))
            .count();
        assert!(
            lines <= 1 && (tries <= 1 || lines < tries),
            "silo {i}: {lines} lines for {tries} failed pulls of the absent silo 7"
        );
    }
}

#[test]
fn a_straggler_is_waited_for_at_most_a_deadline_then_avoided_until_a_time_trigger_ends_it() {
    // From round 3, everything silo 2 sends is 1.5 s late: past both 1 s deadlines. A time
    // trigger ends the delay 8 s after the swarm started.
    let mut s = scenario("straggler.toml");
    s.rounds = 30;
    s.eval_every = 10;
    s.faults.model_deadline_s = 1.0;
    s.faults.gradient_deadline_s = 1.0;
    s.faults.events = vec![
        EventSpec {
            round: Some(3),
            delay: Some(DelaySpec { silo: 2, ms: 1500 }),
            ..Default::default()
        },
        EventSpec {
            at_s: Some(8.0),
            delay: Some(DelaySpec { silo: 2, ms: 0 }),
            ..Default::default()
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    let (report, traces) = run(&s, dir.path());
    for c in ["liveness", "recovery", "clean_exit"] {
        assert_eq!(check(&report, c)["pass"], true, "{c}: {report:#}");
    }
    let slow = applied_at(&report, "delay silo 2 by 1500 ms");
    let fast = applied_at(&report, "delay silo 2 by 0 ms");
    // The time trigger fired about 8 s after the nodes started (round 1 begins ~0.1 s in).
    let first = traces.iter().map(|t| t[0].start).fold(f64::MAX, f64::min);
    assert!(
        (6.5..10.0).contains(&(fast - first)),
        "at_s = 8 fired {:.2} s after round 1",
        fast - first
    );
    // While slow, no model of silo 2 reached anyone in time, and every sampler that kept
    // trying it marked it a suspect.
    let mut tried = 0;
    let mut slow_rounds = Vec::new();
    let mut fast_rounds = Vec::new();
    for (i, t) in traces.iter().enumerate() {
        let during: Vec<&NodeRound> = t
            .iter()
            .filter(|r| r.start > slow + 0.05 && r.at < fast)
            .collect();
        slow_rounds.extend(during.iter().map(|r| r.seconds));
        fast_rounds.extend(
            t.iter()
                .filter(|r| r.start > fast + 0.05)
                .map(|r| r.seconds),
        );
        if i == 2 {
            continue;
        }
        for r in &during {
            assert!(
                !r.answered.contains(&2),
                "silo {i} got silo 2's late model in time in round {}",
                r.round
            );
        }
        let tries = during.iter().filter(|r| r.sampled.contains(&2)).count();
        tried += tries;
        if tries >= 3 {
            assert!(
                during.last().unwrap().suspects.contains(&2),
                "silo {i} failed to pull silo 2 {tries} times and does not suspect it"
            );
        }
    }
    assert!(tried > 0, "nobody sampled the straggler while it was slow");
    // Slow rounds wait out a deadline; once the delay ends the rounds are fast again.
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    assert!(
        slow_rounds.len() >= 8 && fast_rounds.len() >= 8,
        "{} rounds while slow, {} after (delay {slow:.2}, end {fast:.2}, first round {first:.2})",
        slow_rounds.len(),
        fast_rounds.len()
    );
    let (ms, mf) = (median(&mut slow_rounds), median(&mut fast_rounds));
    eprintln!("median round {ms:.3} s while slow, {mf:.3} s after");
    assert!(ms >= 0.9, "median round {ms:.3} s while silo 2 was slow");
    assert!(
        mf < 0.5 * ms,
        "median round {mf:.3} s after, {ms:.3} s during"
    );
    // Once on time again it is found again: a backed-off retry gets its model (no
    // reconnection tells anyone it is back; its connections never closed).
    let found = traces
        .iter()
        .flat_map(|t| t.iter())
        .filter(|r| r.start > fast + 0.05 && r.answered.contains(&2))
        .count();
    assert!(found > 0, "nobody got silo 2's model after its delay ended");
    // The straggler itself kept completing rounds.
    assert_eq!(traces[2].len(), 30);
}

#[test]
fn lost_messages_cost_their_deadline_and_the_federation_keeps_going() {
    // 30 % of every pull, model and gradient dropped from round 3 to round 15.
    let mut s = scenario("message-loss.toml");
    s.rounds = 25;
    s.faults.baseline = false;
    s.eval_every = 5;
    s.faults.model_deadline_s = 1.0;
    s.faults.gradient_deadline_s = 1.0;
    s.faults.events = vec![
        EventSpec {
            round: Some(3),
            loss: Some(LossSpec {
                fraction: 0.3,
                silos: None,
            }),
            ..Default::default()
        },
        EventSpec {
            round: Some(15),
            loss: Some(LossSpec {
                fraction: 0.0,
                silos: None,
            }),
            ..Default::default()
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    let (report, traces) = run(&s, dir.path());
    // Accuracy under loss varies with which messages are lost (the network's timing draws
    // them here, not the seed alone): the recovery check is reported, not asserted; the
    // shipped 60-round scenario is where it is judged (README).
    for c in ["liveness", "clean_exit"] {
        assert_eq!(check(&report, c)["pass"], true, "{c}: {report:#}");
    }
    let on = applied_at(&report, "loss 0.3");
    let off = report["applied"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["what"] == "loss 0")
        .unwrap_or_else(|| panic!("the loss was not ended: {report:#}"))["at"]
        .as_f64()
        .unwrap();
    let (mut sampled, mut answered) = (0, 0);
    let (mut sampled_after, mut answered_after) = (0, 0);
    // Rounds begun under the loss may still wait out a deadline after it ends (an owner that
    // served a pull whose answer was lost waits τ_grad, and holds the next round's pulls until
    // it steps): judge the rounds from two after the last one logged under the loss.
    let last_lossy = traces
        .iter()
        .flatten()
        .filter(|r| r.at <= off)
        .map(|r| r.round)
        .max()
        .unwrap();
    for t in &traces {
        assert_eq!(t.len(), 25);
        for r in t {
            if r.start > on + 0.05 && r.at < off {
                sampled += r.sampled.len();
                answered += r.answered.len();
            } else if r.start > off + 0.05 && r.round > last_lossy + 2 {
                sampled_after += r.sampled.len();
                answered_after += r.answered.len();
            }
        }
    }
    // A pull succeeds when neither the pull nor its model is lost: 0.7² = 0.49.
    let rate = answered as f64 / sampled.max(1) as f64;
    assert!(sampled >= 50, "only {sampled} pulls under loss");
    assert!(
        (0.3..0.7).contains(&rate),
        "{answered}/{sampled} pulls answered under 30 % loss"
    );
    assert!(
        sampled_after >= 50,
        "only {sampled_after} pulls after the loss"
    );
    assert_eq!(
        answered_after, sampled_after,
        "pulls failed after the loss ended (rounds after {last_lossy} + 2)"
    );
}

#[test]
fn a_kernel_partition_between_network_namespaces_heals_and_every_check_passes() {
    if skipped(
        "a_kernel_partition_between_network_namespaces_heals",
        launch::netns_unavailable(),
    ) {
        return;
    }
    // 4 | 4 from round 10 to round 20 of 40, cut by blackhole routes: packets are dropped, so
    // pulls across time out (1 s) on connections that stay open, as over a real partition.
    let mut s = scenario("partition-heal.toml");
    s.rounds = 40;
    s.eval_every = 10;
    s.faults.model_deadline_s = 1.0;
    s.faults.gradient_deadline_s = 1.0;
    s.faults.events[0].round = Some(10);
    s.faults.events[1].round = Some(20);
    let dir = tempfile::tempdir().unwrap();
    let (report, traces) = run_with(&s, dir.path(), true);
    for c in ["liveness", "memory", "recovery", "clean_exit"] {
        assert_eq!(check(&report, c)["pass"], true, "{c}: {report:#}");
    }
    // The nodes listened on their namespaces' addresses, and no node cut a link itself.
    let manifest = std::fs::read_to_string(dir.path().join("seed-1/manifest.toml")).unwrap();
    assert!(manifest.contains("/ip4/10.2"), "{manifest}");
    for i in 0..8 {
        let log =
            std::fs::read_to_string(dir.path().join(format!("seed-1/nodes/silo-{i}.log"))).unwrap();
        assert!(
            !log.contains("links cut by the control channel"),
            "silo {i}"
        );
    }
    let (cut, heal) = (
        applied_at(&report, "partition"),
        applied_at(&report, "heal"),
    );
    let side = |i: u32| usize::from(i >= 4);
    let mut inside = 0;
    for (i, t) in traces.iter().enumerate() {
        assert_eq!(t.len(), 40, "silo {i} ran every round");
        for r in t.iter().filter(|r| r.start > cut && r.at < heal) {
            inside += 1;
            assert!(
                r.answered.iter().all(|&b| side(b) == side(i as u32)),
                "silo {i} got a model across the partition in round {}",
                r.round
            );
        }
    }
    assert!(inside >= 8, "only {inside} rounds ran inside the partition");
    // A dropped packet is a timeout, not a refusal: the cut-off pulls waited their deadline.
    let slowest = check(&report, "liveness")["figures"]["slowest_round_s"]
        .as_f64()
        .unwrap();
    assert!(slowest >= 0.9, "slowest round {slowest} s: no pull waited");
    // Models cross again after the heal, on the connections that survived it.
    let crossed = traces
        .iter()
        .enumerate()
        .filter(|(i, t)| {
            t.iter()
                .filter(|r| r.start > heal)
                .any(|r| r.answered.iter().any(|&b| side(b) != side(*i as u32)))
        })
        .count();
    assert!(
        crossed >= 4,
        "only {crossed} silos pulled across after the heal"
    );
    // Every namespace of the run is gone.
    let left = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let me = format!("federico-{}-", std::process::id());
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains(&me),
        "namespaces left behind"
    );
}

/// A poisoning member on real processes: the swarm tells silo 3, through its control channel,
/// to send gradients of ±3.4e38 from round 3 on (what the simulator's silo 3 does, from the
/// same `crate::silo::attack` code). The owners bound them, and the swarm makes the
/// simulator's decisions under the attack: the same honest accuracy to the last row. (Twenty
/// rounds are not enough to absorb it: the honest silos are 5.4 points below the clean run
/// here, within 1 point by round 60 in the simulator; docs/insiders.md.)
#[test]
fn a_node_told_to_poison_sends_extreme_gradients_as_the_simulators_silo_does() {
    let mut s = scenario("poisoning.toml");
    s.rounds = 20;
    s.faults.events[0].round = Some(3);
    s.faults.events[0].attack = Some(federico::faults::AttackSpec {
        silos: vec![3],
        kind: "extreme".into(),
        factor: None,
    });
    let dir = tempfile::tempdir().unwrap();
    let (report, traces) = run(&s, &dir.path().join("swarm"));
    for c in ["liveness", "clean_exit"] {
        assert_eq!(check(&report, c)["pass"], true, "{c}: {report:#}");
    }
    assert!(applied_at(&report, "attack extreme by silos [3]") > 0.0);
    assert!(traces.iter().all(|t| t.len() == 20));
    let sim = simulate(&s, &dir.path().join("sim"));
    let sim = sim.summary.runs[0].faults.clone().unwrap();
    let fig = |r: &Value, f: &str| check(r, "poisoning")["figures"][f].clone();
    for f in ["honest_accuracy", "clean_accuracy", "attacker_weight_mean"] {
        assert_eq!(fig(&report, f), fig(&sim, f), "{f}: {report:#} {sim:#}");
    }
    let log = |i: usize| {
        std::fs::read_to_string(dir.path().join(format!("swarm/seed-1/nodes/silo-{i}.log")))
            .unwrap()
    };
    assert!(log(3).contains("now poisons what it sends"), "{}", log(3));
    // Silo 3's gradients reached owners and were scaled down there.
    let bounded = (0..8)
        .filter(|&i| i != 3)
        .filter(|&i| {
            log(i).lines().any(|l| {
                l.contains("far above the federation's typical norm")
                    && l.contains("peer=silo-3")
                    && l.contains("e39")
            })
        })
        .count();
    assert!(bounded >= 1, "no owner bounded silo 3's gradients");
}

/// `drop_opposed` on real processes, against a member playing the protocol: silo 3 sends every
/// owner it samples its gradient negated from round 3 on. Honest owners leave them out and say
/// so once (without the defence no such line is written), and the swarm's honest accuracy is
/// the simulator's.
#[test]
fn a_nodes_sign_flipped_gradients_are_left_out_by_the_owners() {
    let mut s = scenario("poisoning.toml");
    s.rounds = 20;
    s.faults.events[0].round = Some(3);
    s.faults.events[0].attack = Some(federico::faults::AttackSpec {
        silos: vec![3],
        kind: "sign_flip".into(),
        factor: None,
    });
    let dir = tempfile::tempdir().unwrap();
    let (report, _) = run(&s, &dir.path().join("swarm"));
    assert_eq!(check(&report, "clean_exit")["pass"], true, "{report:#}");
    let sim = simulate(&s, &dir.path().join("sim"));
    let sim = sim.summary.runs[0].faults.clone().unwrap();
    let fig = |r: &Value| check(r, "poisoning")["figures"]["honest_accuracy"].clone();
    assert_eq!(fig(&report), fig(&sim));
    let left_out = (0..8)
        .filter(|&i| i != 3)
        .filter(|&i| {
            let log = std::fs::read_to_string(
                dir.path().join(format!("swarm/seed-1/nodes/silo-{i}.log")),
            )
            .unwrap();
            log.lines()
                .any(|l| l.contains("pointed against this silo's own") && l.contains("peer=silo-3"))
        })
        .count();
    assert!(left_out >= 1, "no owner left silo 3's gradients out");
}

/// Eight silos at four sites behind NAT (`swarm --nat 4`): no silo accepts a connection from
/// outside its site, the manifest lists no member address, and the federation runs through the
/// relay, decision for decision as the simulator runs it.
#[test]
fn silos_behind_nat_federate_through_a_relay_and_make_the_simulators_decisions() {
    if skipped(
        "silos_behind_nat_federate_through_a_relay",
        launch::nat_unavailable(),
    ) {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let exe = env!("CARGO_BIN_EXE_federico");
    let dir = tempfile::tempdir().unwrap();
    let (swarm, sim) = (dir.path().join("swarm"), dir.path().join("sim"));
    let run = |args: &[&str], out: &Path| {
        let o = std::process::Command::new(exe)
            .args(args)
            .args([
                "simulations/quickstart.toml",
                "--seed",
                "1",
                "--rounds",
                "40",
                "-q",
            ])
            .arg("--out")
            .arg(out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    run(&["swarm", "--nat", "4"], &swarm);
    run(&["simulate", "--set", "algorithms=[\"federico\"]"], &sim);
    let seed = swarm.join("seed-1");
    let manifest = federico::net::Manifest::load(&seed.join("manifest.toml")).unwrap();
    assert!(manifest.members.iter().all(|m| m.addrs.is_empty()));
    assert_eq!(manifest.relays.len(), 2, "the relay over QUIC and TCP");
    // How the connections ended, in swarm.json (each pair counted from both sides).
    let figures: Value =
        serde_json::from_str(&std::fs::read_to_string(seed.join("swarm.json")).unwrap()).unwrap();
    let paths = &figures["paths"];
    let ended = paths["direct"].as_u64().unwrap() + paths["relayed"].as_u64().unwrap();
    assert!((1..=56).contains(&ended), "{paths}");
    eprintln!("behind NAT, at the end: {paths}");
    // Every decision is the simulator's.
    assert_same_decisions(&seed, &sim.join("seed-1"), 40);
    // Silos at other sites can be reached through the relay only (a silo's one site-mate is
    // on its LAN); every silo held a reservation and connected through the relay.
    let relay_log = std::fs::read_to_string(seed.join("nodes/relay.log")).unwrap();
    assert!(
        relay_log.matches("circuit opened").count() >= 8,
        "{relay_log}"
    );
    for i in 0..8 {
        let log = std::fs::read_to_string(seed.join(format!("nodes/silo-{i}.log"))).unwrap();
        assert!(log.contains("reachable through the relay"), "silo {i}");
        assert!(log.contains("connected through a relay"), "silo {i}");
        assert!(log.contains("members connected at the end"), "silo {i}");
    }
}

/// The relay of a federation behind NAT is killed mid-run (`swarm --nat` starts it again at
/// once, as a service manager would): the silos get their reservations back and open circuits
/// again; the run usually costs a round at the deadline (at most 20 allowed, below) and loses
/// nothing.
#[test]
fn a_relay_killed_behind_nat_costs_a_deadline_and_loses_nothing() {
    if skipped("a_relay_killed_behind_nat", launch::nat_unavailable()) {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let swarm = nat_swarm_in_background(dir.path());
    let nodes = dir.path().join("seed-1/nodes");
    wait_for_round(&nodes, 150);
    let pid: i32 = std::fs::read_to_string(nodes.join("relay.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let killed_at = unix_now();
    // SAFETY: kill(2) on the relay's pid, which this test's swarm started and still holds.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    swarm.join().unwrap().expect("the swarm finishes");

    let relay = std::fs::read_to_string(nodes.join("relay.log")).unwrap();
    assert_eq!(relay.matches("relay started").count(), 2, "{relay}");
    let after_restart = relay.split("relay started").nth(2).unwrap();
    assert!(after_restart.contains("circuit opened"), "{relay}");
    for i in 0..8 {
        let log = std::fs::read_to_string(nodes.join(format!("silo-{i}.log"))).unwrap();
        assert_eq!(
            log.matches("reachable through the relay").count(),
            2,
            "silo {i} got its reservation back"
        );
        assert!(log.contains("reservation on the relay lost"), "silo {i}");
    }
    // The rounds that waited a deadline (2 s) after the kill. Usually 1, but with the other
    // swarm tests running one silo has waited 8 and 18 (a 1 s ping, 2026-12-07) and 15 (the
    // 15 s ping, full suite 2026-12-08): more than issue 41's "a few rounds", not understood. The bound holds the run to
    // recovering within 20 rounds, everything kept, until the cause is found.
    assert_recovered(&nodes, killed_at, 20);
}

/// Every NAT mapping of the test bed expires at once, mid-run: the routers' connection tracking
/// tables are flushed (`conntrack -F` in each router's namespace), so packets from outside are
/// dropped as unasked until a silo sends again, and the relay's and the punched connections
/// must come back through new mappings: a few rounds wait a deadline, and nothing is lost.
#[test]
fn nat_mappings_that_expire_mid_run_cost_a_few_rounds_and_lose_nothing() {
    let conntrack = std::process::Command::new("conntrack")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let why = launch::nat_unavailable().or_else(|| {
        (!conntrack).then(|| "needs conntrack (the conntrack package) to flush the NAT".into())
    });
    if skipped("nat_mappings_that_expire_mid_run", why) {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let swarm = nat_swarm_in_background(dir.path());
    let nodes = dir.path().join("seed-1/nodes");
    wait_for_round(&nodes, 150);
    // This process's test bed: its routers are `federico-<pid>-<n>-r<site>`. Nothing here may
    // panic before the swarm is joined (it would leave the nodes and namespaces behind).
    let flushed_at = unix_now();
    let flush = || -> Result<(usize, u64), String> {
        let listed = std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .map_err(|e| e.to_string())?;
        let mine = format!("federico-{}-", std::process::id());
        let is_router = |n: &str| {
            n.starts_with(&mine)
                && n.rsplit('-').next().is_some_and(|t| {
                    t.strip_prefix('r')
                        .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
                })
        };
        let routers: Vec<String> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| is_router(n))
            .map(String::from)
            .collect();
        let conntrack = |r: &str, arg: &str| -> Result<String, String> {
            let o = std::process::Command::new("ip")
                .args(["netns", "exec", r, "conntrack", arg])
                .output()
                .map_err(|e| e.to_string())?;
            if !o.status.success() {
                return Err(String::from_utf8_lossy(&o.stderr).into());
            }
            Ok(String::from_utf8_lossy(&o.stdout).into())
        };
        let mut flushed = 0;
        for r in &routers {
            // The mappings held (`-C` counts them), then none (`-F`).
            let held = conntrack(r, "-C")?;
            flushed += held
                .trim()
                .parse::<u64>()
                .map_err(|e| format!("{held}: {e}"))?;
            conntrack(r, "-F")?;
        }
        Ok((routers.len(), flushed))
    };
    let flushed = flush();
    swarm.join().unwrap().expect("the swarm finishes");
    let (routers, flushed) = flushed.expect("conntrack -F in every router");
    eprintln!("NAT mappings flushed: {flushed} in {routers} routers");
    assert_eq!(routers, 4, "four sites' routers");
    assert!(
        flushed >= 8,
        "the routers held the silos' mappings: {flushed}"
    );
    // Measured: 2, 4, 6, 7 and 8 rounds at the 2 s deadline after the flush: a retransmission
    // from outside is dropped until the silo behind the flushed NAT happens to send on that
    // connection again. (A ping every second made it 0, but slowed the relay-kill recovery;
    // see `net::behaviour::PING_INTERVAL`.)
    assert_recovered(&nodes, flushed_at, 10);
}

/// The quick federation, 600 rounds (evaluated every 100), as `swarm --nat 4` with 2 s
/// deadlines, in a thread: the caller acts on it mid-run, then joins it.
fn nat_swarm_in_background(out: &Path) -> std::thread::JoinHandle<Result<(), String>> {
    let mut s = scenario("quickstart.toml");
    s.rounds = 600;
    s.eval_every = 100;
    let out = out.to_owned();
    std::thread::spawn(move || {
        launch::swarm(
            &s,
            &SwarmOptions {
                out,
                data_dir: None,
                exe: PathBuf::from(EXE),
                progress: false,
                deadlines: federico::net::config::Deadlines {
                    model_s: 2.0,
                    gradient_s: 2.0,
                    start_s: 10.0,
                    alone_s: Some(10.0),
                    linger_s: 5.0,
                },
                timeout: Duration::from_secs(300),
                netns: false,
                nat: Some(4),
                baseline: None,
            },
        )
        .map(drop)
        .map_err(|e| format!("{e:#}"))
    })
}

/// Rounds silo `i` has written to its run log under `nodes`.
fn rounds_logged(nodes: &Path, i: usize) -> usize {
    std::fs::read_to_string(nodes.join(format!("silo-{i}/rounds.jsonl")))
        .map_or(0, |t| t.lines().count())
}

/// Waits (at most 2 minutes) until silo 0 has run `round` rounds.
fn wait_for_round(nodes: &Path, round: usize) {
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while rounds_logged(nodes, 0) < round {
        assert!(std::time::Instant::now() < until, "silo-0 made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// After a fault at `since` (Unix seconds) in [`nat_swarm_in_background`]'s run: every silo ran
/// all 600 rounds, at most `max_slow` of its rounds after the fault waited a deadline, and the
/// last 100 rounds got every model they asked for in at least 95.
fn assert_recovered(nodes: &Path, since: f64, max_slow: usize) {
    for i in 0..8 {
        assert_eq!(rounds_logged(nodes, i), 600, "silo {i} ran every round");
        let trace = launch::read_run_log(&nodes.join(format!("silo-{i}/rounds.jsonl"))).unwrap();
        let slow = trace
            .iter()
            .filter(|r| r.at > since && r.seconds > 1.0)
            .count();
        eprintln!("silo {i}: {slow} rounds waited a deadline after the fault");
        assert!(
            slow <= max_slow,
            "silo {i}: {slow} rounds waited a deadline"
        );
        let full = trace[500..]
            .iter()
            .filter(|r| r.answered.len() == r.sampled.len())
            .count();
        assert!(full >= 95, "silo {i}: {full} of 100 late rounds complete");
    }
}

/// `federico simulate` of `s` into `out`.
fn simulate(s: &Scenario, out: &Path) -> federico::sim::Outcome {
    federico::sim::run(
        s,
        &federico::sim::Options {
            out: out.to_owned(),
            data_dir: None,
            progress: false,
            export: false,
            audit: false,
        },
    )
    .unwrap()
}

/// Every line of a JSON-lines file.
fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The swarm's `rounds.jsonl` under `swarm_seed` makes the simulator's decisions under
/// `sim_seed`, round for round, over `rounds` rounds.
fn assert_same_decisions(swarm_seed: &Path, sim_seed: &Path, rounds: usize) {
    let (ra, rb) = (
        jsonl(&swarm_seed.join("rounds.jsonl")),
        jsonl(&sim_seed.join("rounds.jsonl")),
    );
    assert_eq!(ra.len(), rounds);
    assert_eq!(ra.len(), rb.len());
    for (x, y) in ra.iter().zip(&rb) {
        let mut y_fed = y["federico"].clone();
        if let Some(o) = y_fed.as_object_mut() {
            o.remove("trained_group_mass");
        }
        assert_eq!(x["federico"], y_fed, "round {}", x["round"]);
    }
}

/// Seconds since the Unix epoch, as the run logs' `at`.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A wide-area network (`[faults.links]`) in both drivers: every silo 100 ms one way from every
/// other (10 ms of jitter) at 20 Mbit/s. A round (a pull, the model back, the gradient on) then
/// costs the nodes at least three one-way trips, as it costs the simulator's virtual clock,
/// where it took nothing before; and the decisions stay the simulator's.
#[test]
fn a_wide_area_link_costs_every_round_its_trips_in_both_drivers_and_changes_no_decision() {
    let mut s = scenario("quickstart.toml");
    s.rounds = 8;
    s.algorithms = vec![federico::scenario::Algorithm::Federico];
    s.faults.model_deadline_s = 10.0;
    s.faults.gradient_deadline_s = 10.0;
    s.faults.baseline = false;
    s.faults.links = Some(federico::faults::LinksConfig {
        sites: vec![0; 8],
        one_way_ms: vec![vec![100.0]],
        jitter_ms: 10.0,
        mbit_s: Some(20.0),
    });
    let dir = tempfile::tempdir().unwrap();
    let (report, traces) = run(&s, &dir.path().join("swarm"));
    assert_eq!(check(&report, "clean_exit")["pass"], true, "{report:#}");
    simulate(&s, &dir.path().join("sim"));
    let sim_traces = jsonl(&dir.path().join("sim/seed-1/traces.jsonl"));
    // Rounds 2 and on (round 1 also waits for the start): the simulator's virtual seconds are
    // the network's alone; the nodes add their compute.
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let sim_s = median(
        sim_traces
            .iter()
            .filter(|t| t["round"].as_u64().unwrap() > 1)
            .map(|t| t["seconds"].as_f64().unwrap())
            .collect(),
    );
    let swarm_s = median(
        traces
            .iter()
            .flatten()
            .filter(|t| t.round > 1)
            .map(|t| t.seconds)
            .collect(),
    );
    eprintln!("median round: simulator {sim_s:.3} s, swarm {swarm_s:.3} s");
    assert!((0.3..1.0).contains(&sim_s), "simulator: {sim_s} s a round");
    assert!((0.3..3.0).contains(&swarm_s), "swarm: {swarm_s} s a round");
    assert_same_decisions(
        &dir.path().join("swarm/seed-1"),
        &dir.path().join("sim/seed-1"),
        8,
    );
    let log = std::fs::read_to_string(dir.path().join("swarm/seed-1/nodes/silo-0.log")).unwrap();
    assert!(
        log.contains("emulating the scenario's wide-area links"),
        "{log}"
    );
}
