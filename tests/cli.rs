//! The `federico` binary as a user runs it.

use std::process::Command;

fn federico() -> Command {
    Command::new(env!("CARGO_BIN_EXE_federico"))
}

/// `federico ARGS` run in `dir`, its output.
fn run_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    federico().args(args).current_dir(dir).output().unwrap()
}

#[test]
fn bad_scenario_fails_naming_the_field_and_allowed_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "rounds = 5\n[federico]\nepsilom = 0.2\n").unwrap();
    let out = federico()
        .args(["simulate", path.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("epsilom") && err.contains("`epsilon`") && err.contains("bad.toml"),
        "{err}"
    );

    std::fs::write(&path, "[federico]\nbeta = 2.0\n").unwrap();
    let out = federico()
        .args(["simulate", path.to_str().unwrap(), "--quiet"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("federico.beta must be in (0, 1], got 2"),
        "{err}"
    );
}

#[test]
fn missing_data_directory_tells_the_user_what_to_put_where() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fm.toml");
    std::fs::write(
        &path,
        "[data]\nsource = \"fashion_mnist\"\n[model]\nkind = \"mlp\"\n",
    )
    .unwrap();
    let empty = dir.path().join("nothing-here");
    let out = federico()
        .args([
            "simulate",
            path.to_str().unwrap(),
            "--quiet",
            "--data-dir",
            empty.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nothing-here") && err.contains("train-images-idx3-ubyte"),
        "{err}"
    );
}

#[test]
fn simulate_writes_reports_and_prints_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/simulations/quickstart.toml");
    let out = federico()
        .args([
            "simulate", scenario, "--quiet", "--rounds", "5", "--seed", "7", "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for alg in ["local", "fedavg", "fedavg_plus", "federico"] {
        assert!(stdout.contains(alg), "{stdout}");
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["seeds"], serde_json::json!([7]));
    assert_eq!(summary["rounds"], 5);
    let log = std::fs::read_to_string(dir.path().join("seed-7/rounds.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 5);
}

/// Every scenario file shipped under `simulations/` parses and validates (a renamed field or a
/// tightened check would otherwise break a README command silently).
#[test]
fn every_shipped_scenario_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("simulations");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            federico::scenario::Scenario::load(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 20, "only {n} scenario files");
}

/// The README's "Running a federation of silos" commands, read from the README and run as
/// printed (`federico` = this build) from an empty temporary folder with relative paths: `init`,
/// then the three nodes at once. Each must finish its rounds and exit 0. Then `predict` and
/// `report` as the section prints them.
#[test]
fn the_readme_federation_commands_run_as_printed_from_an_empty_folder() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let section = readme
        .split("### Running a federation of silos")
        .nth(1)
        .expect("the README's federation section");
    let block = section
        .split("```sh")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block in the federation section");
    let commands: Vec<Vec<String>> = block
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("federico "))
        .map(|l| l.split_whitespace().skip(1).map(String::from).collect())
        .collect();
    assert_eq!(commands.len(), 4, "init and three nodes: {commands:?}");
    assert_eq!(commands[0][0], "init");
    let dir = tempfile::tempdir().unwrap();
    let init = federico()
        .args(&commands[0])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&init.stdout);
    assert!(
        init.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&init.stderr)
    );
    // init prints the node commands the README shows.
    for c in &commands[1..] {
        assert!(
            printed.contains(&format!("federico {}", c.join(" "))),
            "{printed}"
        );
    }
    let nodes: Vec<_> = commands[1..]
        .iter()
        .map(|c| {
            federico()
                .args(c)
                .current_dir(dir.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, node) in nodes.into_iter().enumerate() {
        let out = node.wait_with_output().unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "silo-{i}:\n{log}");
        let run_log = dir
            .path()
            .join(format!("federation/state/silo-{i}/rounds.jsonl"));
        let rounds = std::fs::read_to_string(&run_log).unwrap().lines().count();
        assert_eq!(rounds, 100, "silo-{i}");
    }
    // The README's predict command on silo-0's exported model: the accuracy the node reported
    // at its last evaluation, recomputed from the exported file.
    let predict: Vec<String> = section
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("federico predict "))
        .expect("a predict command in the federation section")
        .split_whitespace()
        .skip(1)
        .map(String::from)
        .collect();
    let out = federico()
        .args(&predict)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let last = std::fs::read_to_string(dir.path().join("federation/state/silo-0/rounds.jsonl"))
        .unwrap()
        .lines()
        .last()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .unwrap();
    let (correct, count) = (
        last["eval"]["correct"].as_u64().unwrap(),
        last["eval"]["count"].as_u64().unwrap(),
    );
    let rows = String::from_utf8_lossy(&out.stdout);
    let right = rows
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split(',').collect();
            f[1] == f[2]
        })
        .count();
    assert_eq!(
        rows.lines().count() as u64,
        count + 1,
        "one row per test sample"
    );
    assert_eq!(right as u64, correct, "{said}");
    assert!(
        said.contains(&format!("({correct} correct)")),
        "predict printed: {said}"
    );
    // The README's report command: the summary the nodes' final evaluations give.
    let report: Vec<String> = section
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("federico report "))
        .expect("a report command in the federation section")
        .split_whitespace()
        .skip(1)
        .map(String::from)
        .collect();
    let out = federico()
        .args(&report)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let finals: Vec<(u64, u64)> = (0..3)
        .map(|i| {
            let text = std::fs::read_to_string(
                dir.path()
                    .join(format!("federation/state/silo-{i}/rounds.jsonl")),
            )
            .unwrap();
            let last: serde_json::Value =
                serde_json::from_str(text.lines().last().unwrap()).unwrap();
            (
                last["eval"]["correct"].as_u64().unwrap(),
                last["eval"]["count"].as_u64().unwrap(),
            )
        })
        .collect();
    let report_dir = dir.path().join("federation/report");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report_dir.join("summary.json")).unwrap()).unwrap();
    let fed = &summary["algorithms"][0];
    assert_eq!(fed["algorithm"], "federico");
    let pooled = finals.iter().map(|f| f.0).sum::<u64>() as f64
        / finals.iter().map(|f| f.1).sum::<u64>() as f64;
    assert!(
        (fed["accuracy"].as_f64().unwrap() - pooled).abs() < 1e-12,
        "{summary}"
    );
    for (i, (c, n)) in finals.iter().enumerate() {
        let silo = fed["per_client"][i].as_f64().unwrap();
        assert!(
            (silo - *c as f64 / *n as f64).abs() < 1e-12,
            "silo-{i}: {summary}"
        );
    }
    assert_eq!(summary["rounds"], 100);
    assert!(
        printed.contains(&format!("{:.2}", pooled * 100.0)),
        "{printed}"
    );
    for f in ["table.txt", "accuracy.svg", "accuracy.png"] {
        assert!(report_dir.join(f).is_file(), "{f} missing");
    }
    // Run again, init refuses to overwrite the keys.
    let again = federico()
        .args(&commands[0])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
}

/// `kill -USR1` asks a node for its model now: the round in progress ends with an evaluation
/// (off the `eval_every` schedule) and `<state_dir>/model.json` is written for that round.
#[cfg(unix)]
#[test]
fn a_node_writes_its_model_when_sent_sigusr1() {
    let dir = tempfile::tempdir().unwrap();
    let init = federico()
        .args(["init", "2", "--out", "fed", "--port", "47391"])
        .args(["--set", "rounds=1000000", "--set", "eval_every=1000000"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let mut nodes: Vec<_> = (0..2)
        .map(|i| {
            federico()
                .args(["node", "--config", &format!("fed/silo-{i}.toml")])
                .current_dir(dir.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let state = dir.path().join("fed/state/silo-0");
    let rounds = |n: &str| {
        std::fs::read_to_string(state.join(n))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while rounds("rounds.jsonl") < 20 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(rounds("rounds.jsonl") >= 20, "the federation did not start");
    assert!(
        !state.join("model.json").exists(),
        "no evaluation is due yet"
    );
    // SAFETY: kill(2) on a child process this test started.
    let sent = unsafe { libc::kill(nodes[0].id() as i32, libc::SIGUSR1) };
    assert_eq!(sent, 0);
    while !state.join("model.json").exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for n in &mut nodes {
        let _ = n.kill();
        let _ = n.wait();
    }
    let card: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("model.json")).unwrap()).unwrap();
    let round = card["round"].as_u64().unwrap();
    // That round's log line carries the evaluation the card reports.
    let line = std::fs::read_to_string(state.join("rounds.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["round"].as_u64() == Some(round))
        .expect("the exported round is in the run log");
    let (correct, count) = (
        line["eval"]["correct"].as_f64().unwrap(),
        line["eval"]["count"].as_f64().unwrap(),
    );
    assert_eq!(card["test_accuracy"].as_f64(), Some(correct / count));
}

/// A node whose peers never come waits for one, saying so, instead of running the federation's
/// rounds alone; a second copy of the same silo (the same config in another terminal) is
/// refused for its locked state_dir, and another silo configured on a port a node holds is
/// refused for the port (libp2p's listeners set SO_REUSEPORT, so both used to start and share
/// the port, and two copies of one silo appended every round twice to one run log).
#[cfg(unix)]
#[test]
fn a_lone_node_waits_and_a_second_copy_or_a_taken_port_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let init = run_in(
        dir.path(),
        &[
            "init", "2", "--out", "fed", "--port", "47411", "--set", "rounds=3",
        ],
    );
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let cfg = dir.path().join("fed/silo-0.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("start_s = 60.0"), "{text}");
    std::fs::write(&cfg, text.replace("start_s = 60.0", "start_s = 1.0")).unwrap();
    let log = dir.path().join("silo-0.log");
    let mut lone = federico()
        .args(["node", "--config", "fed/silo-0.toml"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    while said().matches("no peer to train with yet").count() < 2
        && std::time::Instant::now() < until
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let second = run_in(dir.path(), &["node", "--config", "fed/silo-0.toml"]);
    // silo-1's config on silo-0's port: its own state_dir, a taken port.
    let other = dir.path().join("fed/silo-1-on-4011.toml");
    let text = std::fs::read_to_string(dir.path().join("fed/silo-1.toml")).unwrap();
    assert!(text.contains("/tcp/47412"), "{text}");
    std::fs::write(&other, text.replace("/tcp/47412", "/tcp/47411")).unwrap();
    let taken = run_in(dir.path(), &["node", "--config", "fed/silo-1-on-4011.toml"]);
    let _ = lone.kill();
    let _ = lone.wait();
    let said = said();
    assert!(
        said.matches("no peer to train with yet").count() >= 2,
        "the lone node says it waits, once a start deadline:\n{said}"
    );
    let rounds = dir.path().join("fed/state/silo-0/rounds.jsonl");
    assert_eq!(
        std::fs::read_to_string(&rounds).unwrap_or_default(),
        "",
        "no round run alone"
    );
    let e = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{e}");
    assert!(
        e.contains("state/silo-0 is in use by another federico process (process "),
        "{e}"
    );
    let e = String::from_utf8_lossy(&taken.stderr);
    assert_eq!(taken.status.code(), Some(2), "{e}");
    assert!(
        e.contains("listen on /ip4/127.0.0.1/tcp/47411") && e.contains("holds that port"),
        "{e}"
    );
    // Told to train alone after a second (deadlines.alone_s), it runs its 3 rounds, and its
    // last line says in capitals that no peer took part.
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("start_s = 1.0", "start_s = 1.0\nalone_s = 1.0"),
    )
    .unwrap();
    let alone = run_in(dir.path(), &["node", "--config", "fed/silo-0.toml"]);
    let e = String::from_utf8_lossy(&alone.stderr);
    assert!(alone.status.success(), "{e}");
    assert_eq!(std::fs::read_to_string(&rounds).unwrap().lines().count(), 3);
    let last = e
        .lines()
        .rev()
        .find(|l| l.contains("run finished"))
        .unwrap_or("");
    assert!(
        last.contains("run finished: 3 rounds")
            && last.contains("NO PEER TOOK PART in any of the 3 rounds"),
        "{e}"
    );
}

/// `simulate --export` writes every silo's final predictor of every algorithm; `predict` on
/// it, with the shard `partition` cuts for the same seed, gives the accuracy the run reported
/// for that silo, for all eight algorithms.
#[test]
fn simulate_exports_models_that_predict_what_the_run_reported() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/simulations/compare-all.toml");
    let run = |args: &[&str]| {
        let out = federico()
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    run(&[
        "simulate", scenario, "--seed", "1", "--rounds", "3", "--export", "--quiet", "--out", "run",
    ]);
    run(&["partition", scenario, "--seed", "1", "--out", "shards"]);
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("run/seed-1/summary.json")).unwrap(),
    )
    .unwrap();
    let algorithms = summary["algorithms"].as_array().unwrap();
    assert_eq!(algorithms.len(), 8);
    for a in algorithms {
        let name = a["algorithm"].as_str().unwrap();
        for silo in [0, 5] {
            let model = format!("run/seed-1/models/{name}/silo-{silo}/model.json");
            let shard = format!("shards/silo-{silo}.shard");
            let out = run(&["predict", "--model", &model, "--data", &shard]);
            let rows = String::from_utf8_lossy(&out.stdout);
            let (right, total) = rows.lines().skip(1).fold((0, 0), |(r, t), l| {
                let f: Vec<&str> = l.split(',').collect();
                (r + usize::from(f[1] == f[2]), t + 1)
            });
            let reported = a["per_client"][silo].as_f64().unwrap();
            assert_eq!(right as f64 / total as f64, reported, "{name} silo-{silo}");
        }
    }
}

/// Own CSV columns in their own units: `simulate` standardizes them and writes the constants
/// (`scale.json`) per seed, `partition` writes the same beside its shards, and `predict`
/// applies them to rows in their own units (`--scale`): the exported model then predicts raw
/// rows as it predicts the shard's, and `--scale` on a shard is refused.
#[test]
fn raw_csv_columns_are_standardized_and_predict_applies_the_same_scale() {
    let dir = tempfile::tempdir().unwrap();
    // The own-data example's clinics, as a sensor would report them: gain 80, offset 500.
    let clinics = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/own-data/clinics.csv"
    ))
    .unwrap();
    let mut lines = clinics.lines();
    let mut raw = format!("{}\n", lines.next().unwrap());
    for l in lines {
        let cells: Vec<&str> = l.split(',').collect();
        let (x, rest) = cells.split_at(6);
        let x: Vec<String> = x
            .iter()
            .map(|v| format!("{:.3}", 500.0 + 80.0 * v.parse::<f64>().unwrap()))
            .collect();
        raw += &format!("{},{}\n", x.join(","), rest.join(","));
    }
    std::fs::write(dir.path().join("raw.csv"), raw).unwrap();
    std::fs::write(
        dir.path().join("raw.toml"),
        "name = \"raw\"\nrounds = 3\nalgorithms = [\"local\", \"federico\"]\n\
         [data]\nsource = \"csv\"\nfiles = [\"raw.csv\"]\nlabel_column = \"outcome\"\n\
         silo_column = \"clinic\"\n[split]\nkind = \"natural\"\ntrain_fraction = 0.8\n\
         [model]\nkind = \"softmax\"\n[train]\nlr = 0.01\nbatch_size = 20\n\
         [federico]\nneighbours = 2\n",
    )
    .unwrap();
    let run = |args: &[&str]| run_in(dir.path(), args);
    let ok = |args: &[&str]| {
        let out = run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    ok(&[
        "simulate", "raw.toml", "--seed", "1", "--export", "--quiet", "--out", "run",
    ]);
    ok(&["partition", "raw.toml", "--seed", "1", "--out", "shards"]);
    let read = |p: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(p)).unwrap()).unwrap()
    };
    let scale = read("shards/scale.json");
    assert_eq!(scale, read("run/seed-1/scale.json"));
    let values = |key: &str| -> Vec<f64> {
        let list = scale[key].as_array().unwrap();
        list.iter().map(|v| v.as_f64().unwrap()).collect()
    };
    let (mean, std) = (values("mean"), values("std"));
    assert_eq!(mean.len(), 6);
    assert!(mean.iter().all(|m| (300.0..700.0).contains(m)), "{mean:?}");
    assert!(std.iter().all(|s| (40.0..200.0).contains(s)), "{std:?}");

    let model = "run/seed-1/models/federico/silo-0/model.json";
    let from_shard = ok(&["predict", "--model", model, "--data", "shards/silo-0.shard"]);
    // The shard's test rows back in their own units, as a new patient's would come.
    let shard: federico::learn::Shard =
        federico::learn::Shard::read(&dir.path().join("shards/silo-0.shard")).unwrap();
    let test = &shard.data.test;
    let federico::learn::Labels::Class { ids, .. } = &test.labels else {
        panic!("a classification shard")
    };
    let mut csv = String::from("a,b,c,d,e,f,label\n");
    for (row, y) in test.features.chunks(6).zip(ids) {
        let cells: Vec<String> = row
            .iter()
            .zip(mean.iter().zip(&std))
            .map(|(x, (m, s))| format!("{}", *x as f64 * s + m))
            .collect();
        csv += &format!("{},{y}\n", cells.join(","));
    }
    std::fs::write(dir.path().join("new.csv"), csv).unwrap();
    let from_raw = ok(&[
        "predict",
        "--model",
        model,
        "--data",
        "new.csv",
        "--scale",
        "shards/scale.json",
    ]);
    let column = |t: &str| {
        t.lines()
            .skip(1)
            .map(|l| l.split(',').nth(1).unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(column(&from_raw), column(&from_shard));
    // The model's card carries the constants, so the raw rows need no --scale.
    assert_eq!(read(model)["scale"], scale);
    let from_card = ok(&["predict", "--model", model, "--data", "new.csv"]);
    assert_eq!(column(&from_card), column(&from_shard));
    // The outcomes are text: the card and the shards' classes.json name the class ids, and
    // predictions come out by name.
    let names = ["healthy", "mild", "severe"];
    assert_eq!(read(model)["class_names"], serde_json::json!(names));
    assert_eq!(read("shards/classes.json"), serde_json::json!(names));
    assert!(from_shard.starts_with("row,predicted,label,probability\n"));
    assert!(
        column(&from_card)
            .iter()
            .all(|c| names.contains(&c.as_str()))
    );
    // New rows as a clinic writes them: text outcomes, or none yet.
    let (mut named, mut unlabelled) = (String::from("a,b,c,d,e,f,outcome\n"), String::new());
    for l in std::fs::read_to_string(dir.path().join("new.csv"))
        .unwrap()
        .lines()
        .skip(1)
    {
        let (x, y) = l.rsplit_once(',').unwrap();
        named += &format!("{x},{}\n", names[y.parse::<usize>().unwrap()]);
        unlabelled += &format!("{x}\n");
    }
    std::fs::write(dir.path().join("named.csv"), named).unwrap();
    std::fs::write(dir.path().join("unlabelled.csv"), unlabelled).unwrap();
    let accuracy = |args: &[&str]| {
        let err = String::from_utf8(run(args).stderr).unwrap();
        err[err.find(" samples").unwrap()..].to_string()
    };
    let by_name = ok(&["predict", "--model", model, "--data", "named.csv"]);
    assert_eq!(by_name, from_card, "text labels read by the card's names");
    assert_eq!(
        accuracy(&["predict", "--model", model, "--data", "named.csv"]),
        accuracy(&["predict", "--model", model, "--data", "shards/silo-0.shard"])
    );
    let unknown = ok(&["predict", "--model", model, "--data", "unlabelled.csv"]);
    assert!(
        unknown.starts_with("row,predicted,probability\n"),
        "{unknown}"
    );
    assert_eq!(column(&unknown), column(&from_card));
    let note = accuracy(&["predict", "--model", model, "--data", "unlabelled.csv"]);
    assert!(note.contains("predictions only"), "{note}");
    let out = run(&[
        "predict",
        "--model",
        model,
        "--data",
        "named.csv",
        "--class-names",
        "no,yes",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("2 names, but the model has 3 classes"),
        "{err}"
    );
    // A scale for other rows is refused, naming the file.
    std::fs::write(
        dir.path().join("bad.json"),
        r#"{"mean": [0.0, 0.0], "std": [1.0, 1.0]}"#,
    )
    .unwrap();
    let out = run(&[
        "predict", "--model", model, "--data", "new.csv", "--scale", "bad.json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("new.csv") && err.contains("has 2"),
        "{err}"
    );
    let out = run(&[
        "predict",
        "--model",
        model,
        "--data",
        "shards/silo-0.shard",
        "--scale",
        "shards/scale.json",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is a shard") && err.contains("drop --scale"),
        "{err}"
    );
}

/// `federico scale`: each silo summarises its own training CSV, the summaries pool into the
/// constants of all the rows together, and a node config reads the result.
#[test]
fn scale_summaries_pool_into_the_federations_constants() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write(
        "a.csv",
        "age,pressure,outcome\n40,120,healthy\n60,140,mild\n",
    );
    write(
        "b.csv",
        "age,pressure,outcome\n50,170,severe\n70,130,mild\n90,150,mild\n",
    );
    write("c.csv", "pressure,age,outcome\n120,40,healthy\n");
    let run = |args: &[&str]| run_in(dir.path(), args);
    for silo in ["a", "b", "c"] {
        let out = run(&[
            "scale",
            "summarize",
            &format!("{silo}.csv"),
            "--label-column",
            "outcome",
            "--out",
            &format!("{silo}.sums.json"),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A summary holds counts, means and sums of squares, never a row.
    let sums = std::fs::read_to_string(dir.path().join("b.sums.json")).unwrap();
    assert!(
        sums.contains("\"rows\": 3") && !sums.contains("170"),
        "{sums}"
    );
    let out = run(&["scale", "combine", "a.sums.json", "b.sums.json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let scale = federico::learn::FeatureScale::read(&dir.path().join("scale.json")).unwrap();
    // Ages 40, 60, 50, 70, 90: mean 62, population std √(1480 / 5) = √296; pressures 120,
    // 140, 170, 130, 150: mean 142, the same deviations.
    for (f, mean) in [(0, 62.0), (1, 142.0)] {
        assert!((scale.mean[f] - mean).abs() < 1e-4, "{scale:?}");
        assert!((scale.std[f] - 296f32.sqrt()).abs() < 1e-4, "{scale:?}");
    }
    // A silo whose columns come in another order is refused, naming both files.
    let out = run(&[
        "scale",
        "combine",
        "a.sums.json",
        "c.sums.json",
        "--out",
        "x.json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err
                .contains("c.sums.json names its columns pressure, age, a.sums.json age, pressure"),
        "{err}"
    );
    assert!(!dir.path().join("x.json").exists());
}

/// `federico suite --no-variants` runs the columns alone; without it the suite file's FedeRiCo
/// variants run beside them. The table names the machine that computed it.
#[test]
fn suite_runs_variants_unless_told_not_to() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("base.toml"),
        "name = \"base\"\nrounds = 3\nalgorithms = [\"local\", \"federico\"]\n\
         [data]\nsource = \"mixture\"\n[split]\nclients = 4\ngroups = 2\n[train]\nbatch_size = 20\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("suite.toml"),
        "name = \"t\"\nseeds = [1]\nrounds = 3\nalgorithms = [\"local\", \"federico\"]\n\
         sizes = [30]\ntest_per_silo = 10\n\
         [[data]]\nlabel = \"Mix\"\nscenario = \"base.toml\"\n\
         [[split]]\nlabel = \"G=2\"\nset = [\"split.groups=2\"]\n\
         [[variant]]\nlabel = \"one step\"\nset = [\"federico.mstep=\\\"full\\\"\"]\n",
    )
    .unwrap();
    let suite = |extra: &[&str]| {
        let out = federico()
            .current_dir(dir.path())
            .args(["suite", "suite.toml", "--out", "out"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let column = dir.path().join("out/mix-g2-n30");
    let table = suite(&["--no-variants"]);
    assert!(column.join("summary.json").is_file());
    assert!(!column.join("variant-one-step").exists());
    assert!(
        table.contains("`federico suite suite.toml --no-variants`"),
        "{table}"
    );
    assert!(table.contains("\n## Machine\n"), "{table}");
    assert!(table.contains("Every column: "), "{table}");
    let table = suite(&[]);
    assert!(column.join("variant-one-step/summary.json").is_file());
    assert!(table.contains("one step"), "{table}");
}

/// `simulate`, like `swarm` and `report`, never overwrites a run: without `--out` a second
/// run goes to `runs/<name>-2`, and an explicit `--out` that holds anything is refused.
#[test]
fn simulate_never_overwrites_an_earlier_run() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/simulations/quickstart.toml");
    let args = [
        "simulate", scenario, "--seed", "1", "--rounds", "2", "--quiet",
    ];
    for want in ["runs/quickstart/", "runs/quickstart-2/"] {
        let out = run_in(dir.path(), &args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(&format!("results in {want} ")), "{text}");
    }
    let before = std::fs::read(dir.path().join("runs/quickstart/summary.json")).unwrap();
    let out = run_in(
        dir.path(),
        &[&args[..], &["--out", "runs/quickstart"]].concat(),
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains("runs/quickstart already exists and is not empty"),
        "{e}"
    );
    let after = std::fs::read(dir.path().join("runs/quickstart/summary.json")).unwrap();
    assert_eq!(before, after);
}

/// Every subcommand's `--help` ends with examples; `node --help` says how to stop the node,
/// how to ask it for its model and what happens when its peers do not come.
#[test]
fn every_subcommand_help_has_examples_and_node_help_says_how_to_run_one() {
    let help = |args: &[&str]| {
        let out = federico().args(args).arg("--help").output().unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&[]);
    let subcommands: Vec<&str> = top
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(subcommands.len() >= 12, "{top}");
    for c in subcommands {
        assert!(help(&[c]).contains("Examples:"), "federico {c} --help");
    }
    for c in [
        ["data", "download"],
        ["data", "verify"],
        ["scale", "summarize"],
        ["scale", "combine"],
    ] {
        assert!(help(&c).contains("Examples:"), "federico {c:?} --help");
    }
    let node = help(&["node"]);
    for needle in [
        "SIGINT",
        "kill -USR1",
        "no peer at all",
        "deadlines.alone_s",
    ] {
        assert!(node.contains(needle), "{needle}: {node}");
    }
}

/// `init N` on a scenario whose data comes as M silos names the N typed and the command to
/// type, not a `split.clients` nobody wrote.
#[test]
fn init_with_the_wrong_silo_count_for_natural_data_says_which_count_to_give() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/simulations/own-csv.toml");
    let out = run_in(
        dir.path(),
        &["init", "3", "--out", "fed", "--scenario", scenario],
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains("init 3: the data of") && e.contains("run `federico init 4 --scenario"),
        "{e}"
    );
    assert!(!e.contains("split.clients"), "{e}");
    assert!(!dir.path().join("fed").exists());
}

/// A full disk mid-run (insiders review S1: the node died on its first failed run-log append):
/// silo-0's state_dir is a small tmpfs in a mount namespace of its own; once 50 rounds are
/// logged a filler takes all its space until the node warns that its run log waits (at most ten
/// seconds; a fixed half second raced the slack in the log's last page), then goes. The node warns, keeps
/// running, writes the rounds that waited once there is room, and ends with every round in
/// its log, in order, none torn. Linux as root (CI); elsewhere it says it skips.
#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_mid_run_loses_no_round_and_does_not_stop_the_node() {
    let dir = tempfile::tempdir().unwrap();
    // Rounds take a few milliseconds here: the run outlasts the full disk by far.
    let rounds = 1000;
    let init = run_in(
        dir.path(),
        &[
            "init",
            "2",
            "--out",
            "fed",
            "--port",
            "47431",
            "--set",
            &format!("rounds={rounds}"),
        ],
    );
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let state = dir.path().join("fed/state/silo-0");
    std::fs::create_dir_all(&state).unwrap();
    let log = state.join("rounds.jsonl");
    let kept = dir.path().join("silo-0-rounds.jsonl");
    let err = dir.path().join("silo-0.err");
    let script = format!(
        "mount -t tmpfs -o size=4m tmpfs {s} || exit 97
         (while [ \"$(cat {log} 2>/dev/null | wc -l)\" -lt 50 ]; do sleep 0.02; done
          cat /dev/zero > {s}/filler 2>/dev/null; i=0
          while ! grep -q 'run log not written' {err} && [ $i -lt 500 ]; do
            sleep 0.02; i=$((i+1)); done
          rm -f {s}/filler) &
         {exe} node --config fed/silo-0.toml 2> {err}; rc=$?
         cp {log} {kept}; exit $rc",
        s = state.display(),
        log = log.display(),
        kept = kept.display(),
        err = err.display(),
        exe = env!("CARGO_BIN_EXE_federico"),
    );
    let victim = federico_in_namespace(dir.path(), &script);
    let other = federico()
        .args(["node", "--config", "fed/silo-1.toml"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let (Some(victim), Ok(mut other)) = (victim, other) else {
        eprintln!("SKIPPED a_full_disk_mid_run: needs unshare(1)");
        return;
    };
    let out = victim.wait_with_output().unwrap();
    let _ = other.wait();
    let said =
        std::fs::read_to_string(&err).unwrap_or_default() + &String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(97) {
        eprintln!("SKIPPED a_full_disk_mid_run: cannot mount a tmpfs here (needs root)\n{said}");
        return;
    }
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("run log not written (the disk is full?)"),
        "{said}"
    );
    assert!(said.contains("run log written again"), "{said}");
    let text = std::fs::read_to_string(&kept).unwrap();
    let got: Vec<u64> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["round"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        got,
        (1..=rounds).collect::<Vec<u64>>(),
        "every round once, in order"
    );
}

/// `sh -c script` in a mount namespace of its own (`unshare -m`), in `dir`; `None` without
/// `unshare`.
#[cfg(target_os = "linux")]
fn federico_in_namespace(dir: &std::path::Path, script: &str) -> Option<std::process::Child> {
    std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", script])
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()
}

/// `[privacy]`: `simulate` spends at most the budget and says so; `partition` says the setting
/// belongs in each node's config.
#[test]
fn a_private_run_reports_its_budget_and_partition_points_to_the_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/simulations/quickstart.toml");
    let private = [
        "--set",
        "algorithms=[\"federico\"]",
        "--set",
        "privacy.epsilon=4",
    ];
    let mut args = vec!["--rounds", "10"];
    args.extend(private);
    let (stdout, summary) = simulate_quickstart(&args, &dir.path().join("sim"));
    assert!(stdout.contains("privacy: epsilon spent"), "{stdout}");
    let p = &summary["algorithms"][0]["privacy"];
    let spent: Vec<f64> = p["per_client_epsilon"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(spent.len(), 8, "{p}");
    // The noise is calibrated so the run's releases spend the budget, and no more.
    assert!(spent.iter().all(|&e| e <= 4.0 && e > 3.8), "{spent:?}");
    assert_eq!(p["exhausted"], 0.0);
    // `partition` writes rows, not settings: it says where [privacy] goes instead.
    let out = federico()
        .args(["partition", scenario])
        .args(private)
        .arg("--out")
        .arg(dir.path().join("shards"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("put it in each node's config"), "{stdout}");
}

/// `simulate --audit` plays a curious member on the quick start: without `[privacy]` its
/// loss threshold tells training rows from held-out rows (AUC 0.65 on seed 1) and proves an ε
/// above 1; at ε = 1 it is a coin to within 0.05 and proves no more than the budget.
#[test]
fn the_membership_audit_sees_a_plain_model_and_not_a_private_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut found = Vec::new();
    for (name, set) in [("plain", None), ("private", Some("privacy.epsilon=1"))] {
        let mut args = vec![
            "--seed",
            "1",
            "--audit",
            "--set",
            "algorithms=[\"federico\"]",
        ];
        args.extend(set.iter().flat_map(|s| ["--set", *s]));
        let (stdout, summary) = simulate_quickstart(&args, &dir.path().join(name));
        assert!(stdout.contains("membership audit"), "{stdout}");
        let a = summary["algorithms"][0]["audit"].clone();
        assert_eq!(a["members"], 320, "{a}");
        found.push((
            a["auc"].as_f64().unwrap(),
            a["epsilon_lower_bound"].as_f64().unwrap(),
        ));
    }
    let ((auc, eps), (dp_auc, dp_eps)) = (found[0], found[1]);
    assert!(
        auc > 0.6 && eps > 1.0,
        "without DP: AUC {auc}, epsilon {eps}"
    );
    assert!((dp_auc - 0.5).abs() < 0.05, "at epsilon 1: AUC {dp_auc}");
    assert!(
        dp_eps <= 1.0,
        "the audit proved {dp_eps} against a budget of 1"
    );
}

/// `federico simulate` of the quick start, quiet, with `args`, into `out`: its stdout and its
/// `summary.json`; a failure shows stderr.
fn simulate_quickstart(args: &[&str], out: &std::path::Path) -> (String, serde_json::Value) {
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/simulations/quickstart.toml");
    let run = federico()
        .args(["simulate", scenario, "--quiet"])
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let summary = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap());
    (
        String::from_utf8_lossy(&run.stdout).into_owned(),
        summary.unwrap(),
    )
}
