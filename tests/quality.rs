//! The quality suite's CI subset (`simulations/quality/ci.toml`): on Fashion-MNIST label groups
//! with 50 training samples per silo, the default FedeRiCo is never worse than a silo alone
//! (mean over seeds 1-3, at most 0.5 points below Local) and puts at least 0.9 of its weight
//! on its own group, by the models' owners and by whose data trained them. The whole suite
//! and its table: `federico suite simulations/quality/suite.toml`, docs/quality.md.
//!
//! Needs `FEDERICO_DATA_DIR` (the data directory holding `fashion-mnist/`); `.ci/run` sets it.

mod common;

use federico::suite::{RunOptions, SuiteFile, run};
use std::path::Path;

#[test]
fn the_ci_columns_of_the_quality_suite_meet_their_targets() {
    let Some(dir) = common::data_dir(
        "the_ci_columns_of_the_quality_suite_meet_their_targets",
        &["fashion-mnist"],
    ) else {
        return;
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("simulations/quality/ci.toml");
    let suite = SuiteFile::load(&path).expect("the shipped suite is valid");
    let columns = suite
        .columns(&path, &[], &[])
        .expect("its columns are valid");
    assert_eq!(columns.len(), 2);
    let out = tempfile::tempdir().unwrap();
    let opts = RunOptions {
        out: out.path().to_owned(),
        data_dir: Some(dir),
        rerun: false,
    };
    let text = run(
        &suite,
        &columns,
        "federico suite simulations/quality/ci.toml",
        &opts,
        |l| eprintln!("{l}"),
    )
    .expect("the suite runs");
    eprintln!("{text}");
    assert!(out.path().join("table.md").is_file());
    // Every column was computed here, and the table says on what.
    let here = federico::report::machine::Machine::this().describe();
    assert!(
        text.contains(&format!("Every column: {here}.")),
        "the table does not name this machine ({here})"
    );
    // Each column's own FedeRiCo (the defaults), and one step per round (variant "one step").
    let runs = columns.iter().flat_map(|c| {
        let dir = out.path().join(&c.id);
        let own = dir.join("summary.json");
        let one_step = dir.join("variant-one-step").join("summary.json");
        [
            (c.id.clone(), dir.clone(), own),
            (format!("{} (one step)", c.id), dir, one_step),
        ]
    });
    for (id, dir, path) in runs {
        let summary = federico::suite::read_summary(&path).expect("the run's summary");
        let get = |name: &str| {
            summary
                .algorithms
                .iter()
                .find(|a| a.algorithm == name)
                .expect("algorithm was run")
        };
        let fed = get("federico");
        let (f, l) = (fed.accuracy.unwrap(), main_local(&dir));
        assert!(
            f >= l - 0.005,
            "{id}: FedeRiCo {f} below Local {l} by more than 0.5 points"
        );
        let owner = fed.same_group_mass.expect("label groups have a mass");
        let trained = fed.trained_group_mass.expect("and a trained-with mass");
        assert!(owner >= 0.9, "{id}: same-group mass {owner} < 0.9");
        assert!(trained >= 0.9, "{id}: trained-with mass {trained} < 0.9");
    }
}

/// Local's accuracy in the column run in `dir` (a variant runs FedeRiCo alone).
fn main_local(dir: &Path) -> f64 {
    federico::suite::read_summary(&dir.join("summary.json"))
        .expect("the column's summary")
        .algorithms
        .iter()
        .find(|a| a.algorithm == "local")
        .and_then(|a| a.accuracy)
        .expect("Local was run")
}
