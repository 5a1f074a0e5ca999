//! What the integration tests that read a real data set share: finding it, or saying in one
//! line what is skipped and how to get the data.

use std::io::Write;
use std::path::PathBuf;

/// The data directory when it holds every folder of `needs` (`fashion-mnist`, `cifar-10`, …);
/// otherwise `None`, after one line on stderr naming the test it skips and how to get the data.
/// With `FEDERICO_REQUIRE_DATA` set (`.ci/run` sets it) a missing data set fails the test
/// instead, so CI never passes by skipping.
pub fn data_dir(test: &str, needs: &[&str]) -> Option<PathBuf> {
    // As the CLI finds it: FEDERICO_DATA_DIR, else `data/` (where `federico data download`
    // puts the sets) in the repository, the working directory of `cargo test`.
    let dir = std::env::var_os("FEDERICO_DATA_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data");
            d.is_dir().then_some(d)
        });
    let missing: Vec<&str> = match &dir {
        Some(d) => needs
            .iter()
            .copied()
            .filter(|n| !d.join(n).is_dir())
            .collect(),
        None => needs.to_vec(),
    };
    if missing.is_empty() {
        return dir;
    }
    let why = match &dir {
        Some(d) => format!("{} has no {}/", d.display(), missing.join("/, ")),
        None => "FEDERICO_DATA_DIR is not set and there is no data/ here".to_string(),
    };
    let line = format!(
        "SKIPPED {test}: needs {}/ in the data directory ({why}); see README.md, Real data",
        needs.join("/, ")
    );
    if std::env::var_os("FEDERICO_REQUIRE_DATA").is_some() {
        panic!("{line} (FEDERICO_REQUIRE_DATA is set, so a skip fails)");
    }
    // Straight to stderr, past the test harness's capture, so the skip shows in every run.
    let _ = writeln!(std::io::stderr(), "{line}");
    None
}
