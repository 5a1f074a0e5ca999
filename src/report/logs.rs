//! Nodes' run logs into a seed's report: what `swarm` does after its nodes stop, and what
//! `federico report` does with the logs of nodes started by hand.
//! Owns: reading a node's `rounds.jsonl` ([`read_node_log`]: a bad line is an error naming file
//! and line, a torn last line a warning), merging the silos' logs into the simulator's per-round
//! records ([`merge`]), a seed's summary from them, and writing a seed's `rounds.jsonl` and plots
//! ([`write_node_seed`]).
//! Must not: start or watch nodes, or judge faults (`launch` adds its fault report and figures).

use super::bands::Curves;
use super::records::{AlgorithmResult, FedericoRound, PrivacySpent, RoundRecord, RunSummary};
use super::summary::{ReportError, algorithm_round, reliance, same_group_mass, write_seed_plots};
use crate::learn::Evaluation;
use crate::scenario::Algorithm;
use crate::trace::NodeRound;
use std::io::Write;
use std::path::Path;

/// A node's run log, and what was odd about it.
#[derive(Debug, Default)]
pub struct NodeLog {
    /// Its records, in file order.
    pub rounds: Vec<NodeRound>,
    /// A warning for a torn last line (the node was killed while writing it), which is left
    /// out.
    pub warning: Option<String>,
}

/// Reads a node's `rounds.jsonl`. A missing file is an empty log (a node that never finished a
/// round). A last line that does not parse and does not end in a newline is the record a
/// killed node was writing: it is left out, with a warning. Any other line that is not a record
/// is an error naming the file and the line, and so is a round that does not follow the one
/// before it (the log of two processes).
pub fn read_node_log(path: &Path) -> Result<NodeLog, ReportError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(NodeLog::default()),
        Err(e) => {
            return Err(ReportError::Input(format!(
                "reading {}: {e}",
                path.display()
            )));
        }
    };
    let torn_tail = !text.is_empty() && !text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut log = NodeLog::default();
    let mut last: Option<(u64, usize)> = None;
    for (n, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<NodeRound>(line) {
            // A node cuts its log back to its checkpoint when it starts, so its rounds only
            // move forward, across restarts too: a round again means two writers.
            Ok(r) if last.is_some_and(|(round, _)| r.round <= round) => {
                let (round, at) = last.expect("checked");
                return Err(ReportError::RunLog {
                    path: path.to_owned(),
                    line: n + 1,
                    reason: format!(
                        "round {} after round {round} (line {at}): two processes wrote this \
                         log at once (one silo started twice with one state_dir?), so its \
                         rounds cannot be told apart; run that silo again with a fresh \
                         state_dir",
                        r.round
                    ),
                });
            }
            Ok(r) => {
                last = Some((r.round, n + 1));
                log.rounds.push(r);
            }
            Err(e) if torn_tail && n + 1 == lines.len() => {
                log.warning = Some(format!(
                    "{}:{}: left out a torn last line ({e}); the node was probably stopped while writing it",
                    path.display(),
                    n + 1
                ));
            }
            Err(e) => {
                return Err(ReportError::RunLog {
                    path: path.to_owned(),
                    line: n + 1,
                    reason: format!("not a run log record: {e}"),
                });
            }
        }
    }
    Ok(log)
}

/// The silos' run logs (`logs[i]` is silo `i`'s) as the simulator's per-round records (FedeRiCo
/// only), up to the last round every silo finished. A round a node ran twice (it resumed from a
/// checkpoint) counts with its last run.
pub fn merge(
    seed: u64,
    logs: &[Vec<NodeRound>],
    k: usize,
    groups: Option<&[usize]>,
    regression: bool,
) -> Result<Vec<RoundRecord>, ReportError> {
    let rounds = logs
        .iter()
        .map(|l| l.iter().map(|r| r.round).max().unwrap_or(0))
        .min()
        .unwrap_or(0);
    let mut out = Vec::new();
    for round in 1..=rounds {
        let rows: Vec<&NodeRound> = logs
            .iter()
            .enumerate()
            .map(|(i, l)| {
                l.iter().rev().find(|r| r.round == round).ok_or_else(|| {
                    ReportError::Input(format!("silo-{i} has no record of round {round}"))
                })
            })
            .collect::<Result<_, _>>()?;
        let weights: Vec<Vec<f64>> = rows
            .iter()
            .map(|r| {
                let mut row = vec![0.0; k];
                for &(j, w) in &r.weights {
                    if (j as usize) < k {
                        row[j as usize] = w;
                    }
                }
                row
            })
            .collect();
        let mass = groups.map(|g| same_group_mass(&weights, g));
        let rel = reliance(&weights, groups);
        let evals: Option<Vec<Evaluation>> = rows
            .iter()
            .map(|r| {
                r.eval.map(|e| Evaluation {
                    loss_sum: e.loss_sum,
                    correct: e.correct,
                    count: e.count,
                })
            })
            .collect();
        out.push(RoundRecord {
            seed,
            round: round as usize,
            algorithms: evals
                .map(|e| vec![algorithm_round(Algorithm::Federico, e, regression)])
                .unwrap_or_default(),
            federico: Some(FedericoRound {
                weights,
                sampled: rows.iter().map(|r| r.sampled.clone()).collect(),
                same_group_mass: mass,
                // The logs do not carry every silo's training-set size.
                trained_group_mass: None,
                peer_mass: rel.peer_mass,
                self_weight: rel.self_weight,
            }),
        });
    }
    Ok(out)
}

/// A seed's summary from its merged records: FedeRiCo's last evaluated round, and the
/// same-group mass, peer mass and self-weight of the last round (no fault report).
pub fn seed_summary(
    seed: u64,
    rounds: usize,
    records: &[RoundRecord],
    groups: Option<&[usize]>,
) -> Result<RunSummary, ReportError> {
    let last = records
        .iter()
        .rev()
        .find(|r| !r.algorithms.is_empty())
        .ok_or_else(|| {
            ReportError::Input(format!(
                "no round that every silo evaluated (of {} merged rounds)",
                records.len()
            ))
        })?;
    let fed_round = &last.algorithms[0];
    let mass = records
        .last()
        .and_then(|r| r.federico.as_ref())
        .and_then(|f| f.same_group_mass);
    Ok(RunSummary {
        seed,
        rounds,
        algorithms: vec![AlgorithmResult {
            algorithm: fed_round.algorithm.clone(),
            accuracy: fed_round.accuracy,
            mse: fed_round.mse,
            per_client: fed_round.per_client.clone(),
            same_group_mass: mass,
            trained_group_mass: None,
            reliance: records
                .last()
                .and_then(|r| r.federico.as_ref())
                .map(|f| reliance(&f.weights, groups))
                .unwrap_or_default(),
            privacy: None,
            audit: None,
        }],
        faults: None,
        coordinated_faults: Default::default(),
    })
}

/// What each silo's last logged round says it spent of its privacy budget, over the silos that
/// ran under `[privacy]` (`None`: none did).
pub fn privacy_spent(logs: &[Vec<NodeRound>]) -> Option<PrivacySpent> {
    let last: Vec<crate::trace::PrivacyRecord> = logs
        .iter()
        .filter_map(|l| l.iter().rev().find_map(|r| r.privacy))
        .collect();
    PrivacySpent::of(&last)
}

/// What a seed of node logs reports.
#[derive(Debug)]
pub struct NodeSeed {
    /// The seed's summary (the caller adds a fault report and writes `summary.json`).
    pub summary: RunSummary,
    /// FedeRiCo's metric per evaluated round.
    pub curves: Curves,
}

/// Merges the silos' logs of seed `seed` of run `name` and writes `dir/rounds.jsonl` and the
/// seed's plots; returns its summary (of `rounds` rounds) and curve. Shared by `swarm` and
/// `federico report`.
pub fn write_node_seed(
    name: &str,
    seed: u64,
    rounds: usize,
    dir: &Path,
    logs: &[Vec<NodeRound>],
    groups: Option<&[usize]>,
    regression: bool,
) -> Result<NodeSeed, ReportError> {
    let records = merge(seed, logs, logs.len(), groups, regression)?;
    let log_path = dir.join("rounds.jsonl");
    let io = |source| ReportError::Io {
        path: log_path.clone(),
        source,
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(&log_path).map_err(io)?);
    for r in &records {
        serde_json::to_writer(&mut f, r).map_err(|e| io(e.into()))?;
        writeln!(f).map_err(io)?;
    }
    f.flush().map_err(io)?;
    drop(f);
    let mut summary = seed_summary(seed, rounds, &records, groups)?;
    summary.algorithms[0].privacy = privacy_spent(logs);
    let curves: Curves = vec![(
        Algorithm::Federico.name().to_string(),
        records
            .iter()
            .filter_map(|r| {
                r.algorithms
                    .first()
                    .map(|a| (r.round, a.accuracy.or(a.mse).unwrap_or(f64::NAN)))
            })
            .collect(),
    )];
    write_seed_plots(name, true, dir, &log_path, &curves, groups, regression)?;
    Ok(NodeSeed { summary, curves })
}
