//! HCCT's headline ordering (spec `hcct.md` §6.4 item 1): with latent clusters and little data
//! per silo, HCCT beats both independent training and one global model. Independent and Global
//! are HCCT's own run at α = 0 and at a huge α (spec §4: with the same seeds and routine they
//! *are* those baselines; `sim::hcct`'s unit tests check it bit for bit), so the three rows
//! differ only in the partition. Runs are deterministic, so each check is exact for its seeds.

mod common;

use federico::scenario::Scenario;
use federico::sim;
use std::path::Path;

fn load(file: &str, overrides: &[&str]) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("simulations")
        .join(file);
    let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
    Scenario::load_with(&path, &overrides).expect("the shipped scenario is valid")
}

/// HCCT's accuracy on `s`, and the summary file's bytes.
fn hcct(s: &Scenario, data_dir: Option<&Path>) -> (f64, Vec<u8>) {
    let out = tempfile::tempdir().unwrap();
    let o = sim::run(
        s,
        &sim::Options {
            out: out.path().to_owned(),
            data_dir: data_dir.map(Path::to_owned),
            progress: false,
            export: false,
            audit: false,
        },
    )
    .expect("simulation runs");
    let acc = o
        .summary
        .algorithms
        .iter()
        .find(|a| a.algorithm == "hcct")
        .and_then(|a| a.accuracy)
        .expect("hcct was run");
    let bytes = std::fs::read(out.path().join("summary.json")).unwrap();
    (acc, bytes)
}

/// Independent (α = 0), Global (α huge) and HCCT (the scenario's α) on `file`, HCCT only.
fn ordering(file: &str, seeds: &str, data_dir: Option<&Path>) -> [f64; 3] {
    let only = ["algorithms=[\"hcct\"]", seeds];
    let run = |alpha: Option<&str>| {
        let mut o = only.to_vec();
        o.extend(alpha);
        hcct(&load(file, &o), data_dir).0
    };
    let [ind, glob, hc] = [
        run(Some("hcct.alpha=0")),
        run(Some("hcct.alpha=1e12")),
        run(None),
    ];
    eprintln!("{file}: independent {ind:.4} global {glob:.4} hcct {hc:.4}");
    [ind, glob, hc]
}

#[test]
fn synthetic_label_groups_hcct_beats_independent_and_global() {
    let [ind, glob, hc] = ordering("hcct-quick.toml", "seeds=[1, 2, 3]", None);
    assert!(hc > ind, "HCCT {hc} should beat independent training {ind}");
    assert!(hc > glob, "HCCT {hc} should beat the global model {glob}");
    assert!(
        ind > glob,
        "with disjoint label sets, independent {ind} beats global {glob}"
    );
}

#[test]
fn same_seed_gives_a_bit_identical_summary() {
    let s = load("hcct-quick.toml", &["seeds=[2]", "rounds=10"]);
    let (_, a) = hcct(&s, None);
    let (_, b) = hcct(&s, None);
    assert!(a == b, "two runs of one seed wrote different summary.json");
    let (_, c) = hcct(&load("hcct-quick.toml", &["seeds=[3]", "rounds=10"]), None);
    assert!(a != c, "different seeds should differ");
}

/// Needs `FEDERICO_DATA_DIR` (the data directory holding `fashion-mnist/`), as
/// `tests/fmnist_reproduction.rs` does.
#[test]
fn fashion_mnist_label_groups_reproduce_the_headline_ordering() {
    let Some(dir) = common::data_dir(
        "fashion_mnist_label_groups_reproduce_the_headline_ordering",
        &["fashion-mnist"],
    ) else {
        return;
    };
    let [ind, glob, hc] = ordering("hcct-repro.toml", "seeds=[1]", Some(Path::new(&dir)));
    assert!(hc > ind, "HCCT {hc} should beat independent training {ind}");
    assert!(hc > glob, "HCCT {hc} should beat the global model {glob}");
}
