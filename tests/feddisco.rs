//! FedDisco's headline ordering at small scale (FedDisco spec §5.4 items 1–2): on NIID-2
//! (five two-class silos and one uniform silo of equal size, Fashion-MNIST), FedAvg with
//! Disco weights beats FedAvg on the same local recipe (`a = b = 0`, which gives `p = n`, here
//! `1/K`). Both arms share the split, the initial model and every batch; only the weights
//! differ. The comparison is on the mean test accuracy of the last 10 rounds, since NIID-2's
//! accuracy swings from round to round.
//!
//! Configuration: `simulations/feddisco-repro.toml` with 25% of the training pool and 20
//! rounds, seed 1 (about 15 s per arm on two cores). Seeds 1–5 of this configuration all
//! order the same way (docs/results-feddisco.md). Needs `FEDERICO_DATA_DIR` (the directory
//! holding `fashion-mnist/`).

mod common;

use federico::scenario::Scenario;
use federico::sim;
use std::path::Path;

/// Runs the shipped scenario with `overrides`; returns the per-round accuracies of seed 1.
fn run(dir: &Path, overrides: &[&str], out: &Path) -> Vec<f64> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("simulations/feddisco-repro.toml");
    let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
    let s = Scenario::load_with(&path, &overrides).expect("the shipped scenario is valid");
    let opts = sim::Options {
        out: out.to_owned(),
        data_dir: Some(dir.to_owned()),
        progress: false,
        export: false,
        audit: false,
    };
    sim::run(&s, &opts).expect("simulation runs");
    let log = std::fs::read_to_string(out.join("seed-1/rounds.jsonl")).unwrap();
    log.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            v["algorithms"][0]["accuracy"].as_f64().unwrap()
        })
        .collect()
}

const SMALL: [&str; 3] = ["seeds=[1]", "rounds=20", "data.fraction=0.25"];

#[test]
fn disco_weights_beat_size_weights_on_niid2() {
    let Some(data) = common::data_dir(
        "disco_weights_beat_size_weights_on_niid2",
        &["fashion-mnist"],
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let disco = run(&data, &SMALL, &tmp.path().join("disco"));
    let fedavg = run(
        &data,
        &[&SMALL[..], &["feddisco.a=0", "feddisco.b=0"]].concat(),
        &tmp.path().join("fedavg"),
    );
    let last10 = |v: &[f64]| v[v.len() - 10..].iter().sum::<f64>() / 10.0;
    let (d, f) = (last10(&disco), last10(&fedavg));
    eprintln!("last-10-round mean accuracy: FedDisco {d:.4}, FedAvg {f:.4}");
    assert!(d > f, "FedDisco {d} should beat FedAvg {f} on NIID-2");
}

#[test]
fn same_seed_gives_a_bit_identical_summary() {
    let Some(data) = common::data_dir(
        "same_seed_gives_a_bit_identical_summary",
        &["fashion-mnist"],
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let tiny = [
        "seeds=[1]",
        "rounds=2",
        "data.fraction=0.05",
        "feddisco.clients_per_round=4",
    ];
    run(&data, &tiny, &tmp.path().join("a"));
    run(&data, &tiny, &tmp.path().join("b"));
    let read = |d: &str| std::fs::read(tmp.path().join(d).join("summary.json")).unwrap();
    assert_eq!(read("a"), read("b"));
}
