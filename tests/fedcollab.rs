//! FedCollab's label-shift ordering (FedCollab spec §7.3) on real data, scaled down to run in
//! well under a minute: the shipped `simulations/fedcollab-repro.toml` with 8 clients instead
//! of 20 (two per type; clients 0-3 large, 4-7 small), 10 % of the Fashion-MNIST training set
//! (~315 / ~31 training samples, ~210 test samples per client, as in the full scenario), 40
//! rounds, seeds 1 and 2, and the discriminator protocol with its official settings.
//!
//! Needs `FEDERICO_DATA_DIR` (the data directory holding `fashion-mnist/`); `.ci/run` sets it.
//!
//! The runs are deterministic, so these checks are exact, not samples. At the time of writing:
//! FedCollab 89.51 %, Local 86.80 %, FedAvg 43.70 % (mean of seeds 1-2); both seeds give the
//! structure {0,1} {2,3} {4-7}.

mod common;

use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// Runs `federico simulate simulations/fedcollab-repro.toml` with `overrides` into `out` and
/// returns its `summary.json`. The binary, not `sim::run`, so the run gets `main`'s settings
/// (one candle thread per silo worker, freed memory kept): in the test harness the same run is
/// about 4x slower.
fn simulate(dir: &Path, out: &Path, overrides: &[&str]) -> Value {
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("simulations/fedcollab-repro.toml");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_federico"));
    cmd.arg("simulate")
        .arg(&scenario)
        .arg("--out")
        .arg(out)
        .arg("--data-dir")
        .arg(dir)
        .arg("--quiet");
    for o in overrides {
        cmd.arg("--set").arg(o);
    }
    let res = cmd.output().expect("federico runs");
    assert!(
        res.status.success(),
        "federico failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&res.stdout));
    read_json(&out.join("summary.json"))
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path:?}: {e}"));
    serde_json::from_str(&text).expect("JSON")
}

fn numbers(v: &Value) -> Vec<f64> {
    serde_json::from_value(v.clone()).expect("a list of numbers")
}

/// The small configuration (see the module doc).
const SMALL: [&str; 5] = [
    "split.clients=8",
    "data.fraction=0.1",
    "rounds=40",
    "eval_every=40",
    "seeds=[1, 2]",
];

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn fedcollab_beats_local_beats_global_under_label_shift() {
    let Some(data) = common::data_dir(
        "fedcollab_beats_local_beats_global_under_label_shift",
        &["fashion-mnist"],
    ) else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let summary = simulate(&data, out.path(), &SMALL);
    let algorithm = |list: &Value, alg: &str| -> Value {
        list.as_array()
            .expect("a list of algorithms")
            .iter()
            .find(|a| a["algorithm"] == alg)
            .cloned()
            .unwrap_or_else(|| panic!("{alg} was run"))
    };
    let acc = |alg: &str| {
        algorithm(&summary["algorithms"], alg)["accuracy"]
            .as_f64()
            .unwrap()
    };
    let [fc, local, global] = ["fedcollab", "local", "fedavg"].map(acc);
    // Spec §7.3 ordering 3 (label shift): FedCollab > Local > Global.
    assert!(fc > local, "FedCollab {fc} should beat Local {local}");
    assert!(
        local > global,
        "Local {local} should beat global FedAvg {global}"
    );

    let n = summary["clients"].as_u64().unwrap() as usize;
    assert_eq!(n, 8);
    let small = n / 2..n;
    let runs = summary["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        let seed = run["seed"].as_u64().unwrap();
        let per_client = |alg: &str| numbers(&algorithm(&run["algorithms"], alg)["per_client"]);
        let (fc, local, global) = (
            per_client("fedcollab"),
            per_client("local"),
            per_client("fedavg"),
        );
        // Global FL serves the large clients' labels; the small ones share none of them.
        let global_small = mean(&global[small.clone()]);
        assert!(
            global_small < 0.1,
            "seed {seed}: global FedAvg gives small clients {global_small}"
        );
        // Ordering 5: the gains over Local spread less under FedCollab than under Global.
        let rsd = |acc: &[f64]| {
            let d: Vec<f64> = acc.iter().zip(&local).map(|(a, l)| a - l).collect();
            let m = mean(&d);
            (d.iter().map(|x| (x - m).powi(2)).sum::<f64>() / d.len() as f64).sqrt()
        };
        assert!(rsd(&fc) < rsd(&global), "seed {seed}: RSD");

        // The structure and the distances behind it (ordering 1 and 2).
        let record = read_json(&out.path().join(format!("seed-{seed}/fedcollab.json")));
        let coalitions: Vec<Vec<usize>> =
            serde_json::from_value(record["solution"]["best"]["coalitions"].clone()).unwrap();
        assert!(
            coalitions.contains(&small.clone().collect()),
            "seed {seed}: small clients should be pooled, got {coalitions:?}"
        );
        assert!(
            coalitions
                .iter()
                .all(|c| c.iter().all(|&i| i < n / 2) || c.iter().all(|&i| i >= n / 2)),
            "seed {seed}: large and small clients share no label, got {coalitions:?}"
        );
        let d: Vec<Vec<f64>> = serde_json::from_value(record["distances_raw"].clone()).unwrap();
        let per = n / 4;
        let block = |a: std::ops::Range<usize>, b: std::ops::Range<usize>| {
            let v: Vec<f64> = a
                .flat_map(|i| b.clone().filter(move |&j| j != i).map(move |j| (i, j)))
                .map(|(i, j)| d[i][j])
                .collect();
            mean(&v)
        };
        let within = block(0..per, 0..per);
        let partner = block(0..per, per..2 * per);
        let opposite = block(0..n / 2, n / 2..n);
        assert!(
            within < partner && partner < opposite,
            "seed {seed}: large-client distances within {within}, partner {partner}, opposite {opposite}"
        );
    }
}

#[test]
fn same_seed_gives_identical_files_whatever_the_thread_count() {
    let Some(data) = common::data_dir(
        "same_seed_gives_identical_files_whatever_the_thread_count",
        &["fashion-mnist"],
    ) else {
        return;
    };
    // An economy discriminator (hidden 32, at most 200 rounds) and 3 rounds keep this short.
    let base = [
        "split.clients=8",
        "data.fraction=0.1",
        "rounds=3",
        "seeds=[3]",
        "fedcollab.disc_hidden=32",
        "fedcollab.disc_max_rounds=200",
    ];
    let outs: Vec<tempfile::TempDir> = ["threads=1", "threads=2", "threads=2"]
        .iter()
        .map(|t| {
            let mut o: Vec<&str> = base.to_vec();
            o.push(t);
            let dir = tempfile::tempdir().unwrap();
            simulate(&data, dir.path(), &o);
            dir
        })
        .collect();
    for file in [
        "summary.json",
        "seed-3/fedcollab.json",
        "seed-3/rounds.jsonl",
    ] {
        let read = |d: &tempfile::TempDir| std::fs::read(d.path().join(file)).unwrap();
        let first = read(&outs[0]);
        assert!(!first.is_empty());
        for o in &outs[1..] {
            assert!(read(o) == first, "{file} differs between runs");
        }
    }
}
