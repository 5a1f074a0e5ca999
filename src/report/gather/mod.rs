//! `federico report`: finds the run logs or run directory it is pointed at, checks they are one
//! run, and writes the report `swarm` writes, through the same functions.
//! Owns: what a path given to `report` may be (a node's state directory, a federation folder
//! from `federico init`, a `simulate`/`swarm` run directory), telling silos of different runs
//! apart as far as their logs allow ([`check_one_run`]), and the output folder's default.
//! Must not: summarise or plot on its own (`summary` and `logs` do, for every driver), or
//! write outside the output folder.

use super::logs::{NodeSeed, read_node_log, write_node_seed};
use super::records::{RoundRecord, RunSummary, Summary};
use super::summary::{Curves, Outcome, Report, ReportError, write_json, write_summary};
use crate::learn::ModelSpec;
use crate::learn::export::ModelCard;
use crate::scenario::Algorithm;
use crate::trace::NodeRound;
use std::path::{Path, PathBuf};

/// What [`report`] wrote.
#[derive(Debug)]
pub struct Reported {
    /// The summaries and the table, as `swarm` returns them.
    pub outcome: Outcome,
    /// The folder written.
    pub out: PathBuf,
    /// What was read: "3 silo run logs" or "the run directory runs/quickstart".
    pub source: String,
    /// Things the user should know (a torn last line left out, a seed not found).
    pub warnings: Vec<String>,
}

fn input(msg: impl Into<String>) -> ReportError {
    ReportError::Input(msg.into())
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A file that could not be read (`ReportError::Io` says "writing").
fn read_err(path: &Path, e: std::io::Error) -> ReportError {
    input(format!("reading {}: {e}", path.display()))
}

/// What one path given to `report` is.
#[derive(Debug)]
enum Source {
    /// A run log: a node's state directory's `rounds.jsonl` (or the file itself).
    Silo(PathBuf),
    /// A federation folder: the run logs under `state/`, and the folder.
    Federation(PathBuf, Vec<PathBuf>),
    /// A `simulate` or `swarm` run directory (`summary.json` and `seed-*/`).
    Run(PathBuf),
}

/// Sorts silo folder names by their number (`silo-2` before `silo-10`), then by name.
fn silo_order(path: &Path) -> (u64, String) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let digits: String = name
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    (digits.parse().unwrap_or(u64::MAX), name)
}

fn classify(path: &Path) -> Result<Source, ReportError> {
    if path.is_file() {
        return Ok(Source::Silo(path.to_owned()));
    }
    if !path.is_dir() {
        return Err(input(format!("{}: no such file or folder", path.display())));
    }
    if path.join("summary.json").is_file() && !path.join("rounds.jsonl").exists() {
        return Ok(Source::Run(path.to_owned()));
    }
    if path.join("summary.json").is_file() {
        let run = path.parent().unwrap_or(Path::new("."));
        return Err(input(format!(
            "{} is one seed of a run; give the run directory {} instead",
            path.display(),
            run.display()
        )));
    }
    if path.join("rounds.jsonl").is_file() {
        return Ok(Source::Silo(path.join("rounds.jsonl")));
    }
    let state = path.join("state");
    if state.is_dir() {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&state)
            .map_err(|e| read_err(&state, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("rounds.jsonl").is_file())
            .collect();
        logs.sort_by_key(|p| silo_order(p));
        if !logs.is_empty() {
            let logs = logs.into_iter().map(|p| p.join("rounds.jsonl")).collect();
            return Ok(Source::Federation(path.to_owned(), logs));
        }
    }
    Err(input(format!(
        "{}: no run log here: expected a node's state directory (with rounds.jsonl), a federation folder from `federico init` (with state/<silo>/rounds.jsonl) or a run directory of simulate or swarm (with summary.json)",
        path.display()
    )))
}

/// Writes the report of `inputs` into `out` (default: `report/` beside them, or `report-2/`,
/// `report-3/`, … when taken; an `out` that exists and is not empty is refused).
///
/// `inputs` is either the run logs of one run's silos (their state directories, their
/// `rounds.jsonl` files, or the federation folder `federico init` wrote, whose `state/*/` are
/// read), or one `simulate`/`swarm` run directory, whose report is written again (with the
/// current plots) from its `summary.json` and `seed-*/rounds.jsonl`.
pub fn report(inputs: &[PathBuf], out: Option<&Path>) -> Result<Reported, ReportError> {
    if inputs.is_empty() {
        return Err(input("no run logs or run directory given"));
    }
    let sources: Vec<Source> = inputs
        .iter()
        .map(|p| classify(p))
        .collect::<Result<_, _>>()?;
    if let Some(Source::Run(run)) = sources.iter().find(|s| matches!(s, Source::Run(_))) {
        if sources.len() > 1 {
            return Err(input(format!(
                "{} is a whole run directory: report it on its own, not with other paths",
                run.display()
            )));
        }
        let out = output_folder(out, run)?;
        return regenerate(run, &out);
    }
    let federations: Vec<&PathBuf> = sources
        .iter()
        .filter_map(|s| match s {
            Source::Federation(f, _) => Some(f),
            _ => None,
        })
        .collect();
    if federations.len() > 1 || (federations.len() == 1 && sources.len() > 1) {
        return Err(input(
            "give one federation folder, or the state directories of one run's silos, not both or several",
        ));
    }
    let (root, logs): (Option<PathBuf>, Vec<PathBuf>) = match &sources[..] {
        [Source::Federation(f, logs)] => (Some(f.clone()), logs.clone()),
        _ => {
            let logs: Vec<PathBuf> = sources
                .into_iter()
                .filter_map(|s| match s {
                    Source::Silo(p) => Some(p),
                    _ => None,
                })
                .collect();
            (federation_root(&logs), logs)
        }
    };
    let base = root.clone().unwrap_or_else(|| PathBuf::from("."));
    let out = output_folder(out, &base)?;
    from_node_logs(root.as_deref(), &logs, &out)
}

/// The federation folder of run logs at `<folder>/state/<silo>/rounds.jsonl`, when they all
/// share one: as given when the paths show it (`federation/state/silo-0`), else from their
/// absolute paths (`silo-0` given from inside `state/`).
fn federation_root(logs: &[PathBuf]) -> Option<PathBuf> {
    fn root(log: &Path) -> Option<PathBuf> {
        let state = log.parent()?.parent()?;
        if state.file_name()? != "state" {
            return None;
        }
        Some(match state.parent()? {
            p if p.as_os_str().is_empty() => PathBuf::from("."),
            p => p.to_path_buf(),
        })
    }
    let shared = |roots: Option<Vec<PathBuf>>| {
        let roots = roots?;
        let first = roots.first()?.clone();
        roots.iter().all(|r| *r == first).then_some(first)
    };
    shared(logs.iter().map(|l| root(l)).collect()).or_else(|| {
        shared(
            logs.iter()
                .map(|l| root(&std::path::absolute(l).ok()?))
                .collect(),
        )
    })
}

/// `out` if given and free (missing or empty), else the first free `base/report`,
/// `base/report-2`, … ([`crate::store::fresh_folder`]).
fn output_folder(out: Option<&Path>, base: &Path) -> Result<PathBuf, ReportError> {
    crate::store::fresh_folder(out, &base.join("report")).map_err(input)
}

/// The silos' logs (read from `paths`), with their paths, in silo order, when they are one
/// run's: each log is one silo's (its
/// records' `node`), no silo twice, none missing (every peer a log names has a log), and their
/// times overlap (a federation's nodes run together). The logs carry no federation or run id,
/// so two federations of the same size run at the same time cannot be told apart here; the
/// model check in [`from_node_logs`] catches different architectures.
pub fn check_one_run(
    paths: &[PathBuf],
    logs: Vec<Vec<NodeRound>>,
) -> Result<Vec<(PathBuf, Vec<NodeRound>)>, ReportError> {
    let mut by_silo: Vec<Option<(usize, Vec<NodeRound>)>> = Vec::new();
    let mut peers_named = 0usize;
    for (i, log) in logs.into_iter().enumerate() {
        let path = paths[i].display();
        let Some(first) = log.first() else {
            return Err(input(format!("{path}: the run log has no round yet")));
        };
        let node = first.node as usize;
        if let Some(other) = log.iter().find(|r| r.node as usize != node) {
            return Err(input(format!(
                "{path} mixes silos: it has records of silo-{node} and silo-{} (logs of different federations appended to one file?)",
                other.node
            )));
        }
        for r in &log {
            let named = r
                .weights
                .iter()
                .map(|&(j, _)| j)
                .chain(r.sampled.iter().copied())
                .max()
                .map_or(0, |j| j as usize + 1);
            peers_named = peers_named.max(named);
        }
        if by_silo.len() <= node {
            by_silo.resize_with(node + 1, || None);
        }
        if let Some((j, _)) = &by_silo[node] {
            return Err(input(format!(
                "{path} and {} are both silo-{node}'s run log: these are not the silos of one run",
                paths[*j].display()
            )));
        }
        by_silo[node] = Some((i, log));
    }
    let k = by_silo.len().max(peers_named);
    by_silo.resize_with(k, || None);
    let missing: Vec<String> = by_silo
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_none())
        .map(|(j, _)| format!("silo-{j}"))
        .collect();
    if !missing.is_empty() {
        return Err(input(format!(
            "the logs name {k} silos, and these have no run log among those given: {} (give every silo's state directory, or the federation folder)",
            missing.join(", ")
        )));
    }
    let by_silo: Vec<(usize, Vec<NodeRound>)> = by_silo.into_iter().flatten().collect();
    // One run's nodes run at the same time: every log's time span meets every other's. Logs
    // without times (`at` = 0, older nodes) are not compared.
    let spans: Vec<Option<(f64, f64)>> = by_silo
        .iter()
        .map(|(_, log)| {
            let start = log.iter().map(|r| r.start).fold(f64::INFINITY, f64::min);
            let end = log.iter().map(|r| r.at).fold(0.0, f64::max);
            (start > 0.0 && end > 0.0).then_some((start, end))
        })
        .collect();
    for (a, sa) in spans.iter().enumerate() {
        for (b, sb) in spans.iter().enumerate().skip(a + 1) {
            let (Some((s1, e1)), Some((s2, e2))) = (sa, sb) else {
                continue;
            };
            if e1 < s2 || e2 < s1 {
                return Err(input(format!(
                    "{} ran from {s1:.0} to {e1:.0} (Unix seconds) and {} from {s2:.0} to {e2:.0}: silos of one run run at the same time, so these are from different runs",
                    paths[by_silo[a].0].display(),
                    paths[by_silo[b].0].display()
                )));
            }
        }
    }
    Ok(by_silo
        .into_iter()
        .map(|(i, log)| (paths[i].clone(), log))
        .collect())
}

/// A silo's `model.json` beside its run log, when it wrote one.
fn model_card(log: &Path) -> Result<Option<ModelCard>, ReportError> {
    let path = log.with_file_name("model.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(&path, e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| input(format!("{}: not a model card: {e}", path.display())))
}

/// The groups of `partition.json` (every silo's `group`), when all silos have one.
fn read_groups(path: &Path) -> Option<Vec<usize>> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("clients")?
        .as_array()?
        .iter()
        .map(|c| c.get("group")?.as_u64().map(|g| g as usize))
        .collect()
}

/// The `seed` of a federation's node configs (`<root>/*.toml` with a `state_dir`), when they
/// agree.
fn federation_seed(root: &Path) -> Option<u64> {
    let mut seeds: Vec<u64> = std::fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .filter_map(|p| {
            let v: toml::Table = std::fs::read_to_string(&p).ok()?.parse().ok()?;
            v.get("state_dir")?;
            v.get("seed")?.as_integer().map(|s| s as u64)
        })
        .collect();
    seeds.sort_unstable();
    seeds.dedup();
    match seeds[..] {
        [one] => Some(one),
        _ => None,
    }
}

/// The report of hand-started nodes' run logs (`logs`, one per silo), as `swarm` writes it
/// for one seed. Groups come from `<root>/shards/partition.json` and the seed from the
/// federation's node configs when `root` (the federation folder) is known.
fn from_node_logs(
    root: Option<&Path>,
    paths: &[PathBuf],
    out: &Path,
) -> Result<Reported, ReportError> {
    let mut warnings = Vec::new();
    let mut logs = Vec::with_capacity(paths.len());
    for p in paths {
        let log = read_node_log(p)?;
        warnings.extend(log.warning);
        logs.push(log.rounds);
    }
    let (paths, logs): (Vec<PathBuf>, Vec<Vec<NodeRound>>) =
        check_one_run(paths, logs)?.into_iter().unzip();

    // The model, from the silos' model cards: one architecture, or not one run.
    let mut spec: Option<(ModelSpec, &Path)> = None;
    for p in &paths {
        if let Some(card) = model_card(p)? {
            match &spec {
                Some((s, first)) if *s != card.model => {
                    return Err(input(format!(
                        "{} and {} hold different models: these are not the silos of one run",
                        first.with_file_name("model.json").display(),
                        p.with_file_name("model.json").display()
                    )));
                }
                Some(_) => {}
                None => spec = Some((card.model, p)),
            }
        }
    }
    let spec = spec.map(|(s, _)| s);
    let regression = spec.as_ref().is_some_and(ModelSpec::is_regression);
    let groups = root.and_then(|r| read_groups(&r.join("shards").join("partition.json")));
    let seed = match root.and_then(federation_seed) {
        Some(s) => s,
        None => {
            warnings.push(
                "the seed is not in the run logs and no node config was found beside them: reported as seed 0"
                    .into(),
            );
            0
        }
    };
    let name = root
        .and_then(|r| std::path::absolute(r).ok())
        .and_then(|r| r.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "federation".into());
    let rounds = logs
        .iter()
        .map(|l| l.iter().map(|r| r.round).max().unwrap_or(0))
        .min()
        .unwrap_or(0) as usize;

    let seed_dir = out.join(format!("seed-{seed}"));
    std::fs::create_dir_all(&seed_dir).map_err(io_at(&seed_dir))?;
    let NodeSeed { summary, curves } = write_node_seed(
        &name,
        seed,
        rounds,
        &seed_dir,
        &logs,
        groups.as_deref(),
        regression,
    )?;
    write_json(&seed_dir.join("summary.json"), &summary)?;
    let outcome = write_summary(
        &name,
        rounds,
        out,
        &[Algorithm::Federico],
        Report {
            num_params: spec.as_ref().map_or(0, ModelSpec::num_params),
            spec,
            clients: logs.len(),
            regression,
            runs: vec![summary],
            curves: vec![curves],
        },
    )?;
    Ok(Reported {
        outcome,
        out: out.to_owned(),
        source: format!("{} silo run logs", logs.len()),
        warnings,
    })
}

/// The report of a `simulate` or `swarm` run directory, written again into `out` from its
/// `summary.json` and every seed's `rounds.jsonl` (and `partition.json` for the groups).
fn regenerate(run: &Path, out: &Path) -> Result<Reported, ReportError> {
    let path = run.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|e| read_err(&path, e))?;
    let old: Summary = serde_json::from_str(&text)
        .map_err(|e| input(format!("{}: not a run summary: {e}", path.display())))?;
    let algorithms: Vec<Algorithm> = old
        .algorithms
        .iter()
        .map(|a| {
            serde_json::from_value(serde_json::Value::String(a.algorithm.clone())).map_err(|_| {
                input(format!(
                    "{}: unknown algorithm {:?}",
                    path.display(),
                    a.algorithm
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let regression = old.metric == "mse";
    // A report of nodes without model cards has no model (null).
    let spec: Option<ModelSpec> = serde_json::from_value(old.model.clone())
        .map_err(|e| input(format!("{}: model: {e}", path.display())))?;
    std::fs::create_dir_all(out).map_err(io_at(out))?;
    let mut curves: Vec<Curves> = Vec::new();
    let mut runs: Vec<RunSummary> = Vec::new();
    for seed_run in &old.runs {
        let seed_src = run.join(format!("seed-{}", seed_run.seed));
        let log_path = seed_src.join("rounds.jsonl");
        let text = match std::fs::read_to_string(&log_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(input(format!(
                    "{} is missing: report writes again the reports of simulate and of FedeRiCo swarms, whose seeds keep a merged run log (a coordinator swarm's do not)",
                    log_path.display()
                )));
            }
            Err(e) => return Err(read_err(&log_path, e)),
        };
        let mut seed_curves: Curves = old
            .algorithms
            .iter()
            .map(|a| (a.algorithm.clone(), Vec::new()))
            .collect();
        for (n, line) in text.lines().enumerate() {
            let rec: RoundRecord = serde_json::from_str(line).map_err(|e| ReportError::RunLog {
                path: log_path.clone(),
                line: n + 1,
                reason: e.to_string(),
            })?;
            for a in &rec.algorithms {
                if let Some((_, pts)) = seed_curves.iter_mut().find(|(n, _)| *n == a.algorithm) {
                    pts.push((rec.round, a.accuracy.or(a.mse).unwrap_or(f64::NAN)));
                }
            }
        }
        let seed_out = out.join(format!("seed-{}", seed_run.seed));
        std::fs::create_dir_all(&seed_out).map_err(io_at(&seed_out))?;
        write_json(&seed_out.join("summary.json"), seed_run)?;
        super::summary::write_seed_plots(
            &old.scenario,
            algorithms.contains(&Algorithm::Federico),
            &seed_out,
            &log_path,
            &seed_curves,
            read_groups(&seed_src.join("partition.json"))
                .or_else(|| read_groups(&seed_src.join("shards").join("partition.json")))
                .as_deref(),
            regression,
        )?;
        curves.push(seed_curves);
        runs.push(seed_run.clone());
    }
    if runs.is_empty() {
        return Err(input(format!("{}: a summary of no seeds", path.display())));
    }
    let outcome = write_summary(
        &old.scenario,
        old.rounds,
        out,
        &algorithms,
        Report {
            spec,
            num_params: old.num_params,
            clients: old.clients,
            regression,
            runs,
            curves,
        },
    )?;
    Ok(Reported {
        outcome,
        out: out.to_owned(),
        source: format!("the run directory {}", run.display()),
        warnings: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
