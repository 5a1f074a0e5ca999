use super::table::{ColumnResult, rank, render, silo_record};
use super::*;
use crate::report::records::{AlgorithmResult, AlgorithmSummary, RunSummary};

const BASE: &str = r#"
name = "base"
rounds = 5
algorithms = ["local", "federico"]
[data]
source = "mixture"
[split]
clients = 4
groups = 2
[train]
batch_size = 20
"#;

fn suite_text(extra: &str) -> String {
    format!(
        r#"
name = "t"
seeds = [1, 2]
rounds = 3
algorithms = ["local", "federico", "fedsac", "feddisco"]
sizes = [30, 50]
test_per_silo = 10
equal_steps = true
[[data]]
label = "Mix"
scenario = "base.toml"
[[split]]
label = "G=2"
set = ["split.groups=2"]
[[split]]
label = "G=4 (x.5)"
set = ["split.groups=4"]
{extra}
"#
    )
}

fn write(dir: &Path, suite: &str) -> PathBuf {
    std::fs::write(dir.join("base.toml"), BASE).unwrap();
    let path = dir.join("suite.toml");
    std::fs::write(&path, suite).unwrap();
    path
}

#[test]
fn columns_are_data_by_split_by_size_with_sizes_and_equal_steps_set() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &suite_text(""));
    let suite = SuiteFile::load(&path).unwrap();
    let cols = suite.columns(&path, &[], &[]).unwrap();
    let ids: Vec<&str> = cols.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "mix-g2-n30",
            "mix-g2-n50",
            "mix-g4-xp5-n30",
            "mix-g4-xp5-n50"
        ]
    );
    let c = &cols[1];
    assert_eq!(c.scenario.name, "mix-g2-n50");
    assert_eq!(c.scenario.seeds, vec![1, 2]);
    assert_eq!(c.scenario.rounds, 3);
    assert_eq!(c.scenario.data.samples, Some(4 * 60));
    assert!((c.scenario.split.train_fraction - 50.0 / 60.0).abs() < 1e-12);
    assert_eq!(c.scenario.feddisco.local_epochs, 1);
    assert_eq!(c.scenario.fedsac.local_steps, 3); // ⌈50 / 20⌉
    assert_eq!(cols[2].scenario.split.groups, 4);
    // The printed command is the same scenario.
    assert!(
        c.command().contains("--set 'data.samples=240'"),
        "{}",
        c.command()
    );
    // --only keeps matching columns; --set comes last.
    let only = suite
        .columns(&path, &["rounds=7".into()], &["g4".into()])
        .unwrap();
    assert_eq!(only.len(), 2);
    assert!(only.iter().all(|c| c.scenario.rounds == 7));
    // A variant runs FedeRiCo alone with its overrides.
    let v = cols[0]
        .variant(&Entry {
            label: "cut 0.5".into(),
            scenario: None,
            set: vec!["federico.push_cut=0.5".into()],
        })
        .unwrap();
    assert_eq!(v.algorithms, vec![Algorithm::Federico]);
    assert_eq!(v.federico.push_cut, Some(0.5));
    assert_eq!(v.name, "mix-g2-n30-cut-0p5");
}

#[test]
fn only_selects_by_whole_parts_of_a_column_name() {
    assert!(matches("mnist-g2-n50", "mnist"));
    assert!(!matches("fmnist-g2-n50", "mnist"));
    assert!(matches("fmnist-g4-n150", "g4"));
    assert!(matches("fmnist-g4-n150", "fmnist-g4"));
    assert!(!matches("fmnist-g4-n500", "n50"));
    assert!(!matches("fmnist-g4-n50", "g4-fmnist"));
    assert!(!matches("fmnist-g4-n50", ""));
}

#[test]
fn a_bad_suite_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let no_local = suite_text("").replace("\"local\", ", "");
    let path = write(dir.path(), &no_local);
    let e = SuiteFile::load(&path).unwrap_err().to_string();
    assert!(e.contains("\"local\""), "{e}");
    let path = write(
        dir.path(),
        &suite_text("").replace("sizes = [30, 50]", "sizes = [0]"),
    );
    let e = SuiteFile::load(&path).unwrap_err().to_string();
    assert!(e.contains("sizes"), "{e}");
    let path = write(
        dir.path(),
        &suite_text("[[variant]]\nlabel = \"x\"\nset = [\"federico.push_cut=2\"]"),
    );
    let suite = SuiteFile::load(&path).unwrap();
    let cols = suite.columns(&path, &[], &[]).unwrap();
    let e = cols[0].variant(&suite.variant[0]).unwrap_err().to_string();
    assert!(
        e.contains("push_cut") && e.contains("mix-g2-n30 (x)"),
        "{e}"
    );
    let path = write(
        dir.path(),
        &suite_text("").replace("base.toml", "nowhere.toml"),
    );
    let suite = SuiteFile::load(&path).unwrap();
    let e = suite.columns(&path, &[], &[]).unwrap_err().to_string();
    assert!(e.contains("nowhere.toml"), "{e}");
}

/// `(algorithm, accuracy per seed, per-client accuracy per seed)`.
type Alg<'a> = (&'a str, &'a [f64], &'a [&'a [f64]]);

fn summary(accs: &[Alg<'_>]) -> Summary {
    let seeds = accs[0].2.len();
    let runs = (0..seeds)
        .map(|s| RunSummary {
            seed: s as u64 + 1,
            rounds: 10,
            algorithms: accs
                .iter()
                .map(|(name, _, per_seed_clients)| AlgorithmResult {
                    algorithm: name.to_string(),
                    accuracy: Some(0.0),
                    mse: None,
                    per_client: per_seed_clients[s].to_vec(),
                    same_group_mass: None,
                    trained_group_mass: None,
                    reliance: Default::default(),
                    privacy: None,
                    audit: None,
                })
                .collect(),
            faults: None,
            coordinated_faults: Default::default(),
        })
        .collect();
    Summary {
        scenario: "s".into(),
        metric: "accuracy".into(),
        model: serde_json::Value::Null,
        num_params: 1,
        clients: 2,
        rounds: 10,
        seeds: (1..=seeds as u64).collect(),
        algorithms: accs
            .iter()
            .map(|(name, per_seed, _)| AlgorithmSummary {
                algorithm: name.to_string(),
                accuracy: Some(per_seed.iter().sum::<f64>() / per_seed.len() as f64),
                accuracy_std: Some(0.0),
                mse: None,
                mse_std: None,
                per_seed: per_seed.to_vec(),
                per_client: Vec::new(),
                same_group_mass: (*name == "federico").then_some(0.95),
                trained_group_mass: (*name == "federico").then_some(0.5),
                reliance: Default::default(),
                privacy: None,
                audit: None,
            })
            .collect(),
        runs,
    }
}

/// Column "D G=2", 50 samples per silo, with `summary` and its `variants`.
fn column(summary: Summary, variants: Vec<(String, Summary)>) -> ColumnResult {
    ColumnResult {
        id: "x".into(),
        data: "D".into(),
        split: "G=2".into(),
        size: 50,
        summary,
        variants,
        machines: Vec::new(),
    }
}

#[test]
fn the_table_counts_silo_wins_ranks_and_targets() {
    let s = summary(&[
        ("local", &[0.80, 0.82], &[&[0.80, 0.90], &[0.70, 0.90]]),
        ("federico", &[0.84, 0.86], &[&[0.85, 0.905], &[0.60, 0.95]]),
        ("fedavg", &[0.90, 0.90], &[&[0.9, 0.9], &[0.9, 0.9]]),
    ]);
    // Silo by silo: +5 (win), +0.5 (tie), -10 (loss), +5 (win).
    assert_eq!(silo_record(&s, &s), (2, 1, 1));
    assert_eq!(rank(&s), Some(2));
    let col = column(s, Vec::new());
    let text = render("T", "federico suite x", &[col]);
    assert!(text.contains("| D G=2 | 50 | 81.0 ± 1.4 | 85.0 ± 1.4 | 90.0 ± 0.0 | +4.0 | 2/1/1 | 0.95 / 0.50 | 2nd |"), "{text}");
    assert!(
        text.contains("Never worse than alone (Δ ≥ −0.5): 1 of 1"),
        "{text}"
    );
    assert!(text.contains("Local is below 85 %: 1 of 1"), "{text}");
    assert!(
        text.contains("1 of 1 by owner, 0 of 1 by whose data"),
        "{text}"
    );
    assert!(
        text.contains("FedeRiCo first of the algorithms: 0 of 1"),
        "{text}"
    );
}

/// The variants' table ranks each variant in the default's place, against the column's
/// other algorithms (not against the default).
#[test]
fn the_variants_table_ranks_each_variant_in_the_defaults_place() {
    let main = summary(&[
        ("local", &[0.80, 0.82], &[&[0.8, 0.8], &[0.8, 0.8]]),
        ("federico", &[0.84, 0.86], &[&[0.8, 0.8], &[0.8, 0.8]]),
        ("fedavg", &[0.90, 0.90], &[&[0.9, 0.9], &[0.9, 0.9]]),
    ]);
    let variant = |a: f64| summary(&[("federico", &[a, a], &[&[a, a], &[a, a]])]);
    let col = column(
        main,
        vec![
            ("better".into(), variant(0.95)),
            ("level".into(), variant(0.90)),
            ("worse".into(), variant(0.70)),
        ],
    );
    let text = render("T", "federico suite x", &[col]);
    assert!(
        text.contains(
            "| first of the algorithms, in the default's place | | 0 of 1 | 1 of 1 | 1 of 1 | 0 of 1 |"
        ),
        "{text}"
    );
    assert!(text.contains("| D G=2 n=50 | 81.0 | 85.0 (+4.0)"), "{text}");
}

#[test]
fn a_column_run_again_with_the_same_scenario_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &suite_text(""));
    let suite = SuiteFile::load(&path).unwrap();
    let cols = suite
        .columns(
            &path,
            &["algorithms=[\"local\", \"federico\"]".into()],
            &["g2-n30".into()],
        )
        .unwrap();
    let opts = RunOptions {
        out: dir.path().join("out"),
        data_dir: None,
        rerun: false,
    };
    let mut lines = Vec::new();
    let text = run(&suite, &cols, "cmd", &opts, |l| lines.push(l.to_string())).unwrap();
    assert!(text.contains("| Mix G=2 | 30 |"), "{text}");
    assert!(dir.path().join("out/table.md").exists());
    assert!(!lines[0].contains("reused"), "{lines:?}");
    run(&suite, &cols, "cmd", &opts, |l| lines.push(l.to_string())).unwrap();
    assert!(lines[1].ends_with("(reused)"), "{lines:?}");
    // Another scenario in the same folder runs again.
    let other = suite
        .columns(
            &path,
            &[
                "algorithms=[\"local\", \"federico\"]".into(),
                "rounds=2".into(),
            ],
            &["g2-n30".into()],
        )
        .unwrap();
    run(&suite, &other, "cmd", &opts, |l| lines.push(l.to_string())).unwrap();
    assert!(!lines[2].contains("reused"), "{lines:?}");
}

/// A stamp written before `foreign_cap` existed is a run without the cap: it matches a
/// scenario that leaves the cap to its default where that default is off (8 silos, M = 3), not
/// where it caps (3 silos); an unset field matches its value in force; any other difference
/// reruns.
/// A stamp written before HCCT's and FedSaC's `size_cap` existed ran without the cap.
#[test]
fn a_stamp_from_before_size_cap_is_a_run_without_it() {
    let stamp = |hcct: &str, fedsac: &str| {
        format!(
            r#"{{"name": "a", "hcct": {{"lr": 0.1{hcct}}}, "fedsac": {{"beta": 1.4{fedsac}}}}}"#
        )
    };
    let old = stamp("", "");
    assert!(same_scenario(
        &old,
        &stamp(r#", "size_cap": 0.0"#, r#", "size_cap": 0.0"#)
    ));
    assert!(!same_scenario(
        &old,
        &stamp(r#", "size_cap": 2.0"#, r#", "size_cap": 0.0"#)
    ));
    assert!(!same_scenario(
        &old,
        &stamp(r#", "size_cap": 0.0"#, r#", "size_cap": 2.0"#)
    ));
}

#[test]
fn stamps_compare_the_federico_settings_in_force() {
    let stamp = |clients: u32, federico: &str| {
        format!(r#"{{"name": "a", "split": {{"clients": {clients}}}, "federico": {{{federico}}}}}"#)
    };
    let old = stamp(8, r#""push_cut": null, "beta": 0.6"#);
    assert!(same_scenario(
        &old,
        &stamp(8, r#""beta": 0.6, "foreign_cap": null"#)
    ));
    assert!(same_scenario(
        &old,
        &stamp(8, r#""beta": 0.6, "foreign_cap": 0.0"#)
    ));
    assert!(!same_scenario(
        &old,
        &stamp(8, r#""beta": 0.6, "foreign_cap": 0.5"#)
    ));
    let old3 = stamp(3, r#""beta": 0.6"#);
    assert!(!same_scenario(
        &old3,
        &stamp(3, r#""beta": 0.6, "foreign_cap": null"#)
    ));
    assert!(same_scenario(
        &old3,
        &stamp(3, r#""beta": 0.6, "foreign_cap": 0.0"#)
    ));
    // The default written out is the same as left unset.
    let unset = stamp(8, r#""beta": 0.6, "foreign_cap": null"#);
    assert!(same_scenario(
        &unset,
        &stamp(8, r#""beta": 0.6, "push_cut": 0.5"#)
    ));
    // `own_floor` is off unless set: a stamp from before it existed matches 0, not a floor.
    assert!(same_scenario(
        &old,
        &stamp(8, r#""beta": 0.6, "own_floor": 0.0"#)
    ));
    assert!(!same_scenario(
        &old,
        &stamp(8, r#""beta": 0.6, "own_floor": 0.25"#)
    ));
    // `score_share` too: off unless set.
    assert!(same_scenario(
        &old,
        &stamp(8, r#""beta": 0.6, "score_share": 0.0"#)
    ));
    assert!(!same_scenario(
        &old,
        &stamp(8, r#""beta": 0.6, "score_share": 0.2"#)
    ));
    assert!(!same_scenario(&old, &stamp(8, r#""beta": 0.5"#)));
    assert!(!same_scenario("not json", &old));
}

#[test]
fn the_table_names_the_machines_that_computed_it() {
    use crate::report::machine::Machine;
    let here = Machine {
        cpu: Some("CPU A".into()),
        arch: "x86_64 avx2+fma".into(),
        l1d_bytes: Some(48 * 1024),
        l1d_ways: Some(12),
    };
    let there = Machine {
        l1d_ways: Some(8),
        ..here.clone()
    };
    let mut a = column(
        summary(&[
            ("local", &[0.8], &[&[0.8, 0.8]]),
            ("federico", &[0.9], &[&[0.9, 0.9]]),
        ]),
        vec![],
    );
    a.machines = vec![here.clone()];
    let text = render("t", "cmd", std::slice::from_ref(&a));
    assert!(
        text.contains("Every column: CPU A (x86_64 avx2+fma), L1d 48 KiB 12-way."),
        "{text}"
    );
    let mut b = a.clone();
    b.id = "y".into();
    b.machines = vec![there, Machine::default()];
    let mut c = a.clone();
    c.id = "z".into();
    let text = render("t", "cmd", &[a, b, c]);
    assert!(
        text.contains("- CPU A (x86_64 avx2+fma), L1d 48 KiB 12-way: x, z\n"),
        "{text}"
    );
    assert!(
        text.contains("- CPU A (x86_64 avx2+fma), L1d 48 KiB 8-way: y\n"),
        "{text}"
    );
    assert!(
        text.contains("- not recorded (run before federico recorded it): y\n"),
        "{text}"
    );
}
