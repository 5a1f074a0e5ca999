//! FedSaC's orderings that reproduce at small scale (FedSaC spec §6, "must hold" items 1–2),
//! on `simulations/fedsac-repro.toml` (Fashion-MNIST, K = 10, 25% of the training pool, MLP,
//! 50 local steps per round) shortened to 10 rounds, seed 1 (about 10 s per run on two cores):
//!
//! * Dirichlet(0.1): FedSaC's personalised models beat FedAvg's global model (item 1);
//! * Homo (IID): FedSaC beats Local (item 2).
//!
//! Seeds 1–3 all order the same way at 10 rounds (by 7–27 and 2–3 points) and at the
//! scenario's 20 rounds (by 7–10 and 3–4 points; docs/results-fedsac.md). The
//! paper's main claims, FedSaC > pFedGraph under Dirichlet splits and FedSaC ≥ Local
//! everywhere, do *not* reproduce in this setting, so they are not asserted; the results
//! document gives the numbers and the reason (the model similarity saturates and the graph
//! collapses towards FedAvg). Needs `FEDERICO_DATA_DIR` (the directory holding `fashion-mnist/`).

mod common;

use federico::scenario::Scenario;
use federico::sim;
use std::path::Path;

fn run(dir: &Path, overrides: &[&str], out: &Path) -> sim::Outcome {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("simulations/fedsac-repro.toml");
    let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
    let s = Scenario::load_with(&path, &overrides).expect("the shipped scenario is valid");
    let opts = sim::Options {
        out: out.to_owned(),
        data_dir: Some(dir.to_owned()),
        progress: false,
        export: false,
        audit: false,
    };
    sim::run(&s, &opts).expect("simulation runs")
}

fn accuracy(o: &sim::Outcome, alg: &str) -> f64 {
    o.summary
        .algorithms
        .iter()
        .find(|a| a.algorithm == alg)
        .and_then(|a| a.accuracy)
        .expect("algorithm was run")
}

#[test]
fn fedsac_beats_fedavg_under_high_label_skew() {
    let Some(data) = common::data_dir(
        "fedsac_beats_fedavg_under_high_label_skew",
        &["fashion-mnist"],
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let o = run(
        &data,
        &[
            "seeds=[1]",
            "rounds=10",
            "algorithms=[\"fedavg\", \"fedsac\"]",
        ],
        tmp.path(),
    );
    eprint!("{}", o.table);
    let (sac, avg) = (accuracy(&o, "fedsac"), accuracy(&o, "fedavg"));
    assert!(
        sac > avg,
        "FedSaC {sac} should beat FedAvg {avg} under Dirichlet(0.1)"
    );
}

#[test]
fn fedsac_beats_local_on_iid_silos() {
    let Some(data) = common::data_dir("fedsac_beats_local_on_iid_silos", &["fashion-mnist"]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let o = run(
        &data,
        &[
            "seeds=[1]",
            "rounds=10",
            "algorithms=[\"local\", \"fedsac\"]",
            "split.kind=\"iid\"",
        ],
        tmp.path(),
    );
    eprint!("{}", o.table);
    let (sac, local) = (accuracy(&o, "fedsac"), accuracy(&o, "local"));
    assert!(
        sac > local,
        "FedSaC {sac} should beat Local {local} on IID silos"
    );
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
        "algorithms=[\"fedsac\"]",
        "fedsac.local_steps=5",
        "fedsac.cohort_size=6",
    ];
    run(&data, &tiny, &tmp.path().join("a"));
    run(&data, &tiny, &tmp.path().join("b"));
    let read = |d: &str| std::fs::read(tmp.path().join(d).join("summary.json")).unwrap();
    assert_eq!(read("a"), read("b"));
}
