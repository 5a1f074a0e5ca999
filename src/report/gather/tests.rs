//! `federico report` on small synthetic run logs written in a temporary folder.

use super::*;
use crate::trace::EvalRecord;
use std::io::Write;

/// Silo `node`'s record of `round` in a federation of `k`: weights spread over its own group
/// (silos 0..k/2 and k/2..k), evaluated every 5th round with `correct[node]` of 20 right.
fn record(node: u32, round: u64, k: u32, correct: usize, t0: f64) -> NodeRound {
    let half = k / 2;
    let group = |j: u32| j >= half;
    let mine: Vec<u32> = (0..k).filter(|&j| group(j) == group(node)).collect();
    let w = 1.0 / mine.len() as f64;
    NodeRound {
        node,
        round,
        version: round,
        sampled: vec![(node + 1) % k],
        answered: vec![(node + 1) % k],
        gradients: 2,
        weights: (0..k)
            .map(|j| (j, if group(j) == group(node) { w } else { 0.0 }))
            .collect(),
        eval: (round % 5 == 0).then_some(EvalRecord {
            loss_sum: 4.0,
            correct: correct.min(round as usize * 2),
            count: 20,
        }),
        seconds: 0.5,
        bytes_sent: 100 * round,
        stream_bytes_sent: 110 * round,
        at: t0 + round as f64,
        start: t0 + round as f64 - 0.5,
        tracked: Vec::new(),
        last: Vec::new(),
        suspects: Vec::new(),
        resumed: false,
        privacy: None,
    }
}

fn write_log(path: &Path, records: &[NodeRound]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    for r in records {
        writeln!(f, "{}", serde_json::to_string(r).unwrap()).unwrap();
    }
}

const CORRECT: [usize; 4] = [18, 16, 15, 19];

/// A federation folder as `init` and three-plus nodes leave it: `state/silo-<i>/rounds.jsonl`,
/// `shards/partition.json` and node configs with the seed.
fn federation(dir: &Path, k: u32, rounds: u64) -> PathBuf {
    let fed = dir.join("fed");
    for i in 0..k {
        let recs: Vec<NodeRound> = (1..=rounds)
            .map(|r| record(i, r, k, CORRECT[i as usize], 1.7e9))
            .collect();
        write_log(&fed.join(format!("state/silo-{i}/rounds.jsonl")), &recs);
        std::fs::write(
            fed.join(format!("silo-{i}.toml")),
            format!("name = \"silo-{i}\"\nseed = 7\nstate_dir = \"state/silo-{i}\"\n"),
        )
        .unwrap();
    }
    let clients: Vec<serde_json::Value> = (0..k)
        .map(|i| serde_json::json!({"client": i, "group": usize::from(i >= k / 2)}))
        .collect();
    std::fs::create_dir_all(fed.join("shards")).unwrap();
    std::fs::write(
        fed.join("shards/partition.json"),
        serde_json::json!({ "clients": clients }).to_string(),
    )
    .unwrap();
    fed
}

fn state_dirs(fed: &Path, k: u32) -> Vec<PathBuf> {
    (0..k)
        .map(|i| fed.join(format!("state/silo-{i}")))
        .collect()
}

fn err_of(r: Result<Reported, ReportError>) -> String {
    match r {
        Ok(r) => panic!("reported {:?} instead of an error", r.out),
        Err(e) => e.to_string(),
    }
}

#[test]
fn summary_from_a_federation_folder_matches_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let fed = federation(dir.path(), 4, 20);
    let r = report(std::slice::from_ref(&fed), None).unwrap();
    assert_eq!(r.out, fed.join("report"));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let s = &r.outcome.summary;
    assert_eq!((s.scenario.as_str(), s.clients, s.rounds), ("fed", 4, 20));
    assert_eq!(s.seeds, [7]);
    let fed_alg = &s.algorithms[0];
    assert_eq!(fed_alg.algorithm, "federico");
    // Pooled over silos at round 20: (18 + 16 + 15 + 19) / 80.
    let pooled = CORRECT.iter().sum::<usize>() as f64 / 80.0;
    assert!((fed_alg.accuracy.unwrap() - pooled).abs() < 1e-12, "{s:?}");
    let per_silo: Vec<f64> = CORRECT.iter().map(|&c| c as f64 / 20.0).collect();
    assert_eq!(fed_alg.per_client, per_silo);
    // All weight on the own group.
    assert!((fed_alg.same_group_mass.unwrap() - 1.0).abs() < 1e-12);
    assert!(r.outcome.table.contains("federico") && r.outcome.table.contains("85.00"));
    for f in [
        "summary.json",
        "table.txt",
        "accuracy.svg",
        "accuracy.png",
        "seed-7/summary.json",
        "seed-7/rounds.jsonl",
        "seed-7/accuracy.png",
        "seed-7/weights_final.svg",
        "seed-7/weights_final.png",
        "seed-7/weights_over_rounds.png",
    ] {
        assert!(r.out.join(f).is_file(), "{f} missing");
    }
    let merged = std::fs::read_to_string(r.out.join("seed-7/rounds.jsonl")).unwrap();
    assert_eq!(merged.lines().count(), 20);

    // The silos' state directories give the same summary, in the next free folder.
    let again = report(&state_dirs(&fed, 4), None).unwrap();
    assert_eq!(again.out, fed.join("report-2"));
    assert_eq!(
        serde_json::to_value(&again.outcome.summary).unwrap(),
        serde_json::to_value(s).unwrap()
    );
    // The federation folder, as the paths give it.
    assert_eq!(
        federation_root(&[
            PathBuf::from("fed/state/silo-0/rounds.jsonl"),
            PathBuf::from("fed/state/silo-1/rounds.jsonl"),
        ]),
        Some(PathBuf::from("fed"))
    );
    assert_eq!(
        federation_root(&[PathBuf::from("state/silo-0/rounds.jsonl")]),
        Some(PathBuf::from("."))
    );
}

#[test]
fn a_run_directory_is_reported_again() {
    let dir = tempfile::tempdir().unwrap();
    let fed = federation(dir.path(), 4, 10);
    let first = report(std::slice::from_ref(&fed), None).unwrap();
    // The report folder has the layout of a swarm run directory: report it again.
    let out = dir.path().join("again");
    let r = report(std::slice::from_ref(&first.out), Some(&out)).unwrap();
    assert_eq!(
        serde_json::to_value(&r.outcome.summary).unwrap(),
        serde_json::to_value(&first.outcome.summary).unwrap()
    );
    assert_eq!(r.outcome.table, first.outcome.table);
    assert!(out.join("accuracy.png").is_file() && out.join("seed-7/weights_final.png").is_file());
    // A seed of it alone is refused with the way out.
    let e = err_of(report(&[first.out.join("seed-7")], None));
    assert!(e.contains("one seed of a run"), "{e}");
    // A run directory whose seeds keep no merged run log (a coordinator swarm's).
    std::fs::remove_file(first.out.join("seed-7/rounds.jsonl")).unwrap();
    let e = err_of(report(&[first.out], Some(&dir.path().join("third"))));
    assert!(
        e.contains("seed-7/rounds.jsonl is missing") && e.contains("coordinator swarm"),
        "{e}"
    );
}

#[test]
fn a_torn_last_line_is_left_out_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let fed = federation(dir.path(), 2, 10);
    let log = fed.join("state/silo-1/rounds.jsonl");
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    write!(f, "{{\"node\":1,\"round\":11,\"vers").unwrap();
    drop(f);
    let r = report(std::slice::from_ref(&fed), None).unwrap();
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains("silo-1/rounds.jsonl:11") && r.warnings[0].contains("torn"),
        "{:?}",
        r.warnings
    );
    assert_eq!(r.outcome.summary.rounds, 10);
}

#[test]
fn a_corrupt_line_is_an_error_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let fed = federation(dir.path(), 2, 10);
    let log = fed.join("state/silo-0/rounds.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[3] = "{\"node\":0,\"round\":garbage}";
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    let e = err_of(report(&[fed], None));
    assert!(
        e.contains("silo-0/rounds.jsonl:4: not a run log record"),
        "{e}"
    );
}

/// Two copies of silo-0 started with one state_dir append every round twice to one log
/// (1, 1, 2, 2, …): the report refuses it, naming the file, the line and the state_dir, where
/// it would otherwise have taken the last copy of each round.
#[test]
fn a_log_two_processes_wrote_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fed = federation(dir.path(), 2, 10);
    let twice: Vec<NodeRound> = (1..=10)
        .flat_map(|r| [record(0, r, 2, 18, 1.7e9), record(0, r, 2, 3, 1.7e9 + 0.2)])
        .collect();
    write_log(&fed.join("state/silo-0/rounds.jsonl"), &twice);
    let e = err_of(report(std::slice::from_ref(&fed), None));
    assert!(
        e.contains("silo-0/rounds.jsonl:2")
            && e.contains("round 1 after round 1 (line 1)")
            && e.contains("two processes wrote this log"),
        "{e}"
    );
}

#[test]
fn folders_without_run_logs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let e = err_of(report(&[dir.path().to_path_buf()], None));
    assert!(e.contains("no run log here"), "{e}");
    let e = err_of(report(&[dir.path().join("nosuch")], None));
    assert!(e.contains("no such file or folder"), "{e}");
    // A state directory whose node never finished a round.
    let empty = dir.path().join("state/silo-0");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("rounds.jsonl"), "").unwrap();
    let e = err_of(report(&[empty], None));
    assert!(e.contains("no round yet"), "{e}");
    assert!(err_of(report(&[], None)).contains("no run logs"));
}

#[test]
fn silos_of_different_runs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = federation(&dir.path().join("a"), 2, 10);
    let b = federation(&dir.path().join("b"), 2, 10);

    // silo-0 twice.
    let e = err_of(report(
        &[a.join("state/silo-0"), b.join("state/silo-0")],
        None,
    ));
    assert!(e.contains("both silo-0's run log"), "{e}");

    // A silo missing.
    let e = err_of(report(&[a.join("state/silo-1")], None));
    assert!(e.contains("silo-0") && e.contains("no run log"), "{e}");

    // Same size, run at other times.
    let late: Vec<NodeRound> = (1..=10).map(|r| record(1, r, 2, 18, 1.8e9)).collect();
    write_log(&b.join("state/silo-1/rounds.jsonl"), &late);
    let e = err_of(report(
        &[a.join("state/silo-0"), b.join("state/silo-1")],
        None,
    ));
    assert!(e.contains("different runs"), "{e}");

    // Two silos' records in one file.
    let log = a.join("state/silo-1/rounds.jsonl");
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    writeln!(
        f,
        "{}",
        serde_json::to_string(&record(0, 11, 2, 18, 1.7e9)).unwrap()
    )
    .unwrap();
    drop(f);
    let e = err_of(report(std::slice::from_ref(&a), None));
    assert!(e.contains("mixes silos"), "{e}");

    // Two federation folders, or one with a state directory.
    let e = err_of(report(&[a.clone(), b.clone()], None));
    assert!(e.contains("one federation folder"), "{e}");
}

#[test]
fn different_models_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fed = federation(dir.path(), 2, 10);
    for (i, hidden) in [(0, 8), (1, 16)] {
        let card = serde_json::json!({
            "format": "federico-model/1",
            "silo": format!("silo-{i}"),
            "model": {"kind": "mlp", "inputs": 4, "hidden": [hidden], "classes": 2},
            "input_shape": [4],
            "parts": [],
            "round": 10,
            "test_accuracy": null,
            "weights": "model.safetensors",
        });
        std::fs::write(
            fed.join(format!("state/silo-{i}/model.json")),
            card.to_string(),
        )
        .unwrap();
    }
    let e = err_of(report(&[fed], None));
    assert!(e.contains("different models"), "{e}");
}

#[test]
fn an_explicit_out_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let fed = federation(dir.path(), 2, 10);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Empty: used.
    report(std::slice::from_ref(&fed), Some(&out)).unwrap();
    let e = err_of(report(&[fed], Some(&out)));
    assert!(e.contains("already exists and is not empty"), "{e}");
}
