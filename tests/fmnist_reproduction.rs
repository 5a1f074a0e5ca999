//! The paper's Table 1 ordering reproduced on real data (Fashion-MNIST label groups, K = 8,
//! G = 4, 10% of the training set, MLP 784-200-10, 150 rounds), one seed.
//!
//! Needs `FEDERICO_DATA_DIR` (the data directory holding `fashion-mnist/`); `.ci/run` sets it.
//!
//! The E-step temperature is κ = 10 (`loss_scale = 10`, spec §5.1's "number" option), not the
//! default per-sample mean: with the mean, FedeRiCo's weights stay soft, models sampled across
//! groups become shared models of both label sets, and FedeRiCo ends below Local on this split
//! (95.44 ± 1.96 vs 96.64 ± 1.38 over seeds 1-3; README, "Fashion-MNIST label groups"). With
//! κ = 10 it is above Local on each of seeds 1-3 (97.05 ± 1.47). The run is deterministic, so
//! this one-seed check is exact, not a sample: seed 1 gives FedeRiCo 95.42, Local 95.17,
//! FedAvg+ 93.92, FedAvg 59.50.

use federico::scenario::Scenario;
use federico::sim;
use std::path::Path;

fn accuracy(o: &sim::Outcome, alg: &str) -> f64 {
    o.summary
        .algorithms
        .iter()
        .find(|a| a.algorithm == alg)
        .and_then(|a| a.accuracy)
        .expect("algorithm was run")
}

#[test]
fn fashion_mnist_label_groups_reproduce_the_papers_ordering() {
    let Some(dir) = std::env::var_os("FEDERICO_DATA_DIR") else {
        panic!(
            "set FEDERICO_DATA_DIR to the data directory holding fashion-mnist/ (e.g. ../shared/data)"
        );
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("simulations/fmnist-g4.toml");
    let s = Scenario::load_with(
        &path,
        &OVERRIDES.iter().map(|o| o.to_string()).collect::<Vec<_>>(),
    )
    .expect("the shipped scenario is valid");
    let out = tempfile::tempdir().unwrap();
    let opts = sim::Options {
        out: out.path().to_owned(),
        data_dir: Some(dir.into()),
        progress: false,
    };
    let o = sim::run(
        &Scenario {
            seeds: vec![1],
            ..s
        },
        &opts,
    )
    .expect("simulation runs");
    let [fed, local, fedavg, plus] =
        ["federico", "local", "fedavg", "fedavg_plus"].map(|a| accuracy(&o, a));
    eprint!("{}", o.table);
    assert!(fed > local, "FedeRiCo {fed} should beat Local {local}");
    assert!(local > fedavg, "Local {local} should beat FedAvg {fedavg}");
    assert!(plus > fedavg, "FedAvg+ {plus} should beat FedAvg {fedavg}");
}
/// The one departure from the shipped scenario (see the module doc).
const OVERRIDES: [&str; 1] = ["federico.loss_scale=10"];
