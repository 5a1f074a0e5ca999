//! The quality suite (`federico suite FILE`): a grid of simulator runs — base scenarios × splits
//! × training samples per silo — with FedeRiCo variants beside them, and one table over it.
//! Owns: [`SuiteFile`], expanding it into [`Column`]s (the scenario each column runs), running
//! them with `sim::run` and reusing a column already run with the same scenario, and the
//! table ([`table`]).
//! Must not: score anything itself (every number comes from a column's `summary.json`), or
//! change a scenario beyond what the suite file and the command line say.

pub mod table;

use crate::report::records::Summary;
use crate::scenario::{Algorithm, Scenario, ScenarioError};
use crate::sim;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A suite file (`simulations/quality/suite.toml`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteFile {
    /// Name (the default output folder is `runs/<name>`).
    pub name: String,
    /// One line on what the suite measures.
    #[serde(default)]
    pub description: String,
    /// Seeds of every column.
    pub seeds: Vec<u64>,
    /// Rounds of every column.
    pub rounds: usize,
    /// Evaluate every this many rounds (and at the last).
    #[serde(default)]
    pub eval_every: Option<usize>,
    /// The algorithms of every column.
    pub algorithms: Vec<Algorithm>,
    /// Training samples per silo, one column per size.
    pub sizes: Vec<usize>,
    /// Test samples per silo (the same at every size, so scores are equally precise).
    pub test_per_silo: usize,
    /// Give every algorithm one local epoch of optimizer steps per round: FedDisco 1 local
    /// epoch, FedSaC ⌈size / batch⌉ local steps (their papers' recipes run more).
    #[serde(default)]
    pub equal_steps: bool,
    /// Base scenarios: data set, model and training recipe.
    pub data: Vec<Entry>,
    /// Splits: overrides of the `[split]` section.
    pub split: Vec<Entry>,
    /// FedeRiCo variants, each run with `algorithms = ["federico"]` beside every column.
    #[serde(default)]
    pub variant: Vec<Entry>,
}

/// One value of an axis: a label and the `--set` overrides it adds (data entries also name
/// their base scenario, relative to the suite file).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Shown in the table.
    pub label: String,
    /// Data entries: the base scenario file.
    #[serde(default)]
    pub scenario: Option<PathBuf>,
    /// `KEY=VALUE` overrides, as `simulate --set` takes them.
    #[serde(default)]
    pub set: Vec<String>,
}

/// One column of the suite: a base scenario, a split and a size.
#[derive(Clone, Debug)]
pub struct Column {
    /// Folder name under the suite's output, e.g. `fmnist-g2-n50`.
    pub id: String,
    /// Data entry's label.
    pub data: String,
    /// Split entry's label.
    pub split: String,
    /// Training samples per silo.
    pub size: usize,
    /// The base scenario file.
    pub path: PathBuf,
    /// Every override the column applies to it, in order: the same run is
    /// `federico simulate PATH --set S1 --set S2 …`.
    pub sets: Vec<String>,
    /// The scenario it runs (all algorithms).
    pub scenario: Scenario,
}

impl Column {
    /// The column's scenario for one FedeRiCo variant: FedeRiCo alone, the variant's
    /// overrides after the column's.
    pub fn variant(&self, variant: &Entry) -> Result<Scenario, SuiteError> {
        let mut sets = self.sets.clone();
        sets.extend(variant.set.iter().cloned());
        sets.push("algorithms=[\"federico\"]".into());
        sets.push(format!(
            "name={:?}",
            format!("{}-{}", self.id, slug(&variant.label))
        ));
        Scenario::load_with(&self.path, &sets).map_err(|cause| SuiteError::Scenario {
            column: format!("{} ({})", self.id, variant.label),
            cause,
        })
    }

    /// The equivalent `simulate` command line.
    pub fn command(&self) -> String {
        let mut cmd = format!("federico simulate {}", self.path.display());
        for s in &self.sets {
            cmd += &format!(" --set '{s}'");
        }
        cmd
    }
}

/// What went wrong with a suite.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// The suite file could not be read or parsed.
    #[error("suite {path}: {msg}")]
    File {
        /// The suite file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A column's scenario is invalid.
    // The cause is in the message and not chained as a source: the CLI prints a chain, and
    // would print it twice.
    #[error("suite column {column}: {cause}")]
    Scenario {
        /// The column (and variant).
        column: String,
        /// The scenario's error.
        cause: ScenarioError,
    },
    /// A column failed to run.
    #[error("suite column {column}: {cause}")]
    Run {
        /// The column's scenario name.
        column: String,
        /// The simulator's error.
        cause: sim::SimError,
    },
    /// A file of the output could not be read or written.
    #[error("{path}: {msg}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error.
        msg: String,
    },
}

impl SuiteFile {
    /// Reads and checks a suite file.
    pub fn load(path: &Path) -> Result<Self, SuiteError> {
        let err = |msg: String| SuiteError::File {
            path: path.into(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let suite: SuiteFile = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
        if suite.seeds.is_empty() || suite.sizes.is_empty() || suite.data.is_empty() {
            return Err(err(
                "seeds, sizes and data must each name at least one".into()
            ));
        }
        if suite.split.is_empty() {
            return Err(err("split must name at least one".into()));
        }
        if let Some(&s) = suite.sizes.iter().find(|&&s| s == 0) {
            return Err(err(format!("sizes must be at least 1, got {s}")));
        }
        if suite.test_per_silo == 0 {
            return Err(err("test_per_silo must be at least 1, got 0".into()));
        }
        if !suite.algorithms.contains(&Algorithm::Federico)
            || !suite.algorithms.contains(&Algorithm::Local)
        {
            return Err(err(
                "algorithms must include \"federico\" and \"local\" (the table compares them)"
                    .into(),
            ));
        }
        for d in &suite.data {
            if d.scenario.is_none() {
                return Err(err(format!("data entry {:?} names no scenario", d.label)));
            }
        }
        for e in suite.split.iter().chain(&suite.variant) {
            if e.scenario.is_some() {
                return Err(err(format!(
                    "{:?}: only data entries name a scenario",
                    e.label
                )));
            }
        }
        Ok(suite)
    }

    /// Every column, in the order data × split × size; `extra` overrides follow the suite's
    /// own (the command line's `--set`), `only` keeps the columns one of its patterns
    /// [`matches`] (all when empty).
    pub fn columns(
        &self,
        file: &Path,
        extra: &[String],
        only: &[String],
    ) -> Result<Vec<Column>, SuiteError> {
        let base = file.parent().unwrap_or(Path::new("."));
        let mut out = Vec::new();
        for d in &self.data {
            let path = base.join(d.scenario.as_ref().expect("checked by load"));
            for s in &self.split {
                for &size in &self.sizes {
                    let id = format!("{}-{}-n{size}", slug(&d.label), slug(&s.label));
                    if !only.is_empty() && !only.iter().any(|o| matches(&id, o)) {
                        continue;
                    }
                    let (sets, scenario) = self.column_scenario(&path, d, s, size, extra, &id)?;
                    out.push(Column {
                        id,
                        data: d.label.clone(),
                        split: s.label.clone(),
                        size,
                        path: path.clone(),
                        sets,
                        scenario,
                    });
                }
            }
        }
        Ok(out)
    }

    /// A column's overrides: the entries', then its size and the suite's settings, then the
    /// command line's; and the scenario they give.
    #[allow(clippy::too_many_arguments)]
    fn column_scenario(
        &self,
        path: &Path,
        data: &Entry,
        split: &Entry,
        size: usize,
        extra: &[String],
        id: &str,
    ) -> Result<(Vec<String>, Scenario), SuiteError> {
        let bad = |cause| SuiteError::Scenario {
            column: id.into(),
            cause,
        };
        let mut sets: Vec<String> = data.set.iter().chain(&split.set).cloned().collect();
        // Silos and batch size as the column will have them, for its sizes.
        let probe = {
            let mut probe_sets = sets.clone();
            probe_sets.extend(extra.iter().cloned());
            Scenario::load_with(path, &probe_sets).map_err(bad)?
        };
        let per_silo = size + self.test_per_silo;
        let names: Vec<String> = self
            .algorithms
            .iter()
            .map(|a| format!("{:?}", a.name()))
            .collect();
        sets.push(format!("name={id:?}"));
        sets.push(format!("seeds={:?}", self.seeds));
        sets.push(format!("rounds={}", self.rounds));
        if let Some(e) = self.eval_every {
            sets.push(format!("eval_every={e}"));
        }
        sets.push(format!("algorithms=[{}]", names.join(", ")));
        sets.push(format!("data.samples={}", probe.split.clients * per_silo));
        sets.push(format!(
            "split.train_fraction={}",
            size as f64 / per_silo as f64
        ));
        if self.equal_steps {
            sets.push("feddisco.local_epochs=1".into());
            sets.push(format!(
                "fedsac.local_steps={}",
                size.div_ceil(probe.train.batch_size.max(1))
            ));
        }
        // The command line's overrides come last, as for `simulate --set`.
        sets.extend(extra.iter().cloned());
        let scenario = Scenario::load_with(path, &sets).map_err(bad)?;
        Ok((sets, scenario))
    }
}

/// Whether `--only pattern` selects column `id`: the pattern's dash-separated parts appear as
/// a run of whole parts of the id, so `mnist` is MNIST's columns (not `fmnist`'s), `g4` every
/// G = 4 column, `n50` the 50-sample ones (not `n500`), `fmnist-g4` both at once.
pub fn matches(id: &str, pattern: &str) -> bool {
    let parts: Vec<&str> = id.split('-').collect();
    let want: Vec<&str> = pattern.split('-').filter(|p| !p.is_empty()).collect();
    !want.is_empty() && parts.windows(want.len()).any(|w| w == want.as_slice())
}

/// A label as a folder name: lower case, `=`, spaces and punctuation as nothing or `-`.
pub fn slug(label: &str) -> String {
    let mut out = String::new();
    for c in label.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if c == '.' {
            out.push('p');
        } else if !out.ends_with('-') && !out.is_empty() && c != '=' && c != '(' && c != ')' {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// How `run` reports progress.
pub struct RunOptions {
    /// The suite's output folder.
    pub out: PathBuf,
    /// Data directory (as `simulate --data-dir`).
    pub data_dir: Option<PathBuf>,
    /// Run again even where a column's results for the same scenario exist.
    pub rerun: bool,
}

/// Whether two scenario stamps (`scenario.json`) hold the same scenario: equal JSON once
/// FedeRiCo's settings that default by variant are resolved to the values in force (for the
/// split's `clients`; without one, an unset `foreign_cap` stays unresolved) and `null` fields
/// dropped. So a stamp written before an optional field existed matches one that has it
/// unset, and a changed default does not let an old run pass for a new one. `old` is a stored
/// stamp: one without `foreign_cap` was run before it existed, without the cap.
fn same_scenario(old: &str, wanted: &str) -> bool {
    fn drop_nulls(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.retain(|_, x| !x.is_null());
                m.values_mut().for_each(drop_nulls);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(drop_nulls),
            _ => {}
        }
    }
    let parse = |s: &str, stored: bool| -> Option<serde_json::Value> {
        let mut v: serde_json::Value = serde_json::from_str(s).ok()?;
        let members = v
            .get("split")
            .and_then(|s| s.get("clients"))
            .and_then(serde_json::Value::as_u64);
        if let Some(f) = v.get_mut("federico").and_then(|f| f.as_object_mut()) {
            if stored && !f.contains_key("foreign_cap") {
                f.insert("foreign_cap".into(), 0.0.into());
            }
            let cfg: crate::core::FedericoConfig =
                serde_json::from_value(serde_json::Value::Object(f.clone())).ok()?;
            f.insert("mstep".into(), serde_json::to_value(cfg.mstep()).ok()?);
            f.insert("push_cut".into(), cfg.push_cut().into());
            // Absent from stamps written before they existed: off, as they ran.
            f.insert("own_floor".into(), cfg.own_floor.into());
            f.insert("score_share".into(), cfg.score_share.into());
            if let Some(k) = members {
                let cap = cfg.foreign_cap(k as usize).unwrap_or(0.0);
                f.insert("foreign_cap".into(), cap.into());
            }
        }
        // HCCT's and FedSaC's `size_cap`: absent from stamps written before it existed, which
        // ran without the cap.
        for section in ["hcct", "fedsac"] {
            if let Some(s) = v.get_mut(section).and_then(|s| s.as_object_mut())
                && stored
                && !s.contains_key("size_cap")
            {
                s.insert("size_cap".into(), 0.0.into());
            }
        }
        // Only Dirichlet splits read `clusters`, which stamps written before it could be unset
        // carry everywhere (4).
        if let Some(sp) = v.get_mut("split").and_then(|s| s.as_object_mut())
            && sp.get("kind").and_then(serde_json::Value::as_str) != Some("dirichlet")
        {
            sp.remove("clusters");
        }
        drop_nulls(&mut v);
        Some(v)
    };
    matches!((parse(old, true), parse(wanted, false)), (Some(a), Some(b)) if a == b)
}

/// Runs (or reuses) one scenario under `dir`; returns its summary and whether it ran now.
/// A run is reused when `dir/scenario.json` holds the same scenario and `summary.json` exists.
pub fn run_one(
    scenario: &Scenario,
    dir: &Path,
    opts: &RunOptions,
) -> Result<(Summary, bool), SuiteError> {
    let stamp = dir.join("scenario.json");
    let summary_path = dir.join("summary.json");
    let wanted = serde_json::to_string_pretty(scenario).expect("a scenario serializes") + "\n";
    let io = |path: &Path, e: &dyn std::fmt::Display| SuiteError::Io {
        path: path.into(),
        msg: e.to_string(),
    };
    if !opts.rerun
        && summary_path.exists()
        && std::fs::read_to_string(&stamp)
            .ok()
            .is_some_and(|old| same_scenario(&old, &wanted))
    {
        return Ok((read_summary(&summary_path)?, false));
    }
    // A stale stamp must not vouch for the run about to replace its results.
    let _ = std::fs::remove_file(&stamp);
    let outcome = sim::run(
        scenario,
        &sim::Options {
            out: dir.to_path_buf(),
            data_dir: opts.data_dir.clone(),
            progress: false,
            export: false,
            audit: false,
        },
    )
    .map_err(|cause| SuiteError::Run {
        column: scenario.name.clone(),
        cause,
    })?;
    std::fs::write(&stamp, wanted).map_err(|e| io(&stamp, &e))?;
    Ok((outcome.summary, true))
}

/// Reads a column's `summary.json`.
pub fn read_summary(path: &Path) -> Result<Summary, SuiteError> {
    let io = |e: &dyn std::fmt::Display| SuiteError::Io {
        path: path.into(),
        msg: e.to_string(),
    };
    let text = std::fs::read_to_string(path).map_err(|e| io(&e))?;
    serde_json::from_str(&text).map_err(|e| io(&e))
}

/// Adds the machines recorded in the `seed-N/timing.json` of a run folder's `seeds` to `out`,
/// each once; a seed whose file does not name one (written before federico recorded it, or
/// unreadable) adds an empty [`Machine`](crate::report::machine::Machine).
fn add_machines(run: &Path, seeds: &[u64], out: &mut Vec<crate::report::machine::Machine>) {
    for seed in seeds {
        let machine = std::fs::read_to_string(run.join(format!("seed-{seed}/timing.json")))
            .ok()
            .and_then(|t| serde_json::from_str::<crate::report::records::Timing>(&t).ok())
            .map(|t| t.machine)
            .unwrap_or_default();
        if !out.contains(&machine) {
            out.push(machine);
        }
    }
}

/// Runs every column (reusing those already run with the same scenario) and its variants,
/// calling `progress` with a line after each, then writes `table.md` in the output folder
/// and returns its text.
pub fn run(
    suite: &SuiteFile,
    columns: &[Column],
    command: &str,
    opts: &RunOptions,
    mut progress: impl FnMut(&str),
) -> Result<String, SuiteError> {
    let mut results = Vec::new();
    for (k, c) in columns.iter().enumerate() {
        let dir = opts.out.join(&c.id);
        let started = std::time::Instant::now();
        let (summary, mut ran) = run_one(&c.scenario, &dir, opts)?;
        let mut machines = Vec::new();
        add_machines(&dir, &summary.seeds, &mut machines);
        let mut variants = Vec::new();
        for v in &suite.variant {
            let scenario = c.variant(v)?;
            let vdir = dir.join(format!("variant-{}", slug(&v.label)));
            let (s, ran_now) = run_one(&scenario, &vdir, opts)?;
            add_machines(&vdir, &s.seeds, &mut machines);
            ran |= ran_now;
            variants.push((v.label.clone(), s));
        }
        let result = table::ColumnResult {
            id: c.id.clone(),
            data: c.data.clone(),
            split: c.split.clone(),
            size: c.size,
            summary,
            variants,
            machines,
        };
        let line = table::progress_line(&result);
        progress(&format!(
            "[{}/{}] {} {} ({})",
            k + 1,
            columns.len(),
            c.id,
            line,
            if ran {
                format!("{:.0} s", started.elapsed().as_secs_f64())
            } else {
                "reused".into()
            }
        ));
        results.push(result);
    }
    let title = format!("Quality suite {}: {}", suite.name, suite.description);
    let mut text = table::render(&title, command, &results);
    text += "\n## Columns\n\nEach column is one `simulate` run:\n\n";
    for c in columns {
        text += &format!("- `{}`: `{}`\n", c.id, c.command());
    }
    let path = opts.out.join("table.md");
    std::fs::create_dir_all(&opts.out).map_err(|e| SuiteError::Io {
        path: opts.out.clone(),
        msg: e.to_string(),
    })?;
    std::fs::write(&path, &text).map_err(|e| SuiteError::Io {
        path,
        msg: e.to_string(),
    })?;
    Ok(text)
}

#[cfg(test)]
mod tests;
