//! The summaries a run writes at the end, shared by `simulate` (the `sim` driver) and `swarm`
//! ([`crate::launch`]).
//! Owns: scoring one evaluation of every silo into an [`AlgorithmRound`], the same-group weight
//! mass, `summary.json` and `table.txt` over the seeds with the metric plot (mean ± std over
//! seeds), a seed's metric and weight plots, and pretty-printed JSON files. `federico report`
//! calls the same functions ([`super::gather`]).
//! Must not: run or evaluate models, or decide what a run's seeds and algorithms are (the
//! drivers hand it what they produced).

use super::bands;
pub(crate) use super::bands::Curves;
use super::records::{
    AlgorithmResult, AlgorithmRound, AlgorithmSummary, MembershipAudit, PrivacySpent, Reliance,
    RoundRecord, RunSummary, Summary,
};
use super::{plots, table};
use crate::learn::{Evaluation, ModelSpec};
use crate::scenario::Algorithm;
use std::path::{Path, PathBuf};

/// Errors writing a run's reports.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Writing (or re-reading) a report file.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A plot could not be drawn.
    #[error(transparent)]
    Plot(#[from] plots::PlotError),
    /// A run log line that is not a record (not the torn last line of a killed node).
    #[error("{path}:{line}: {reason}")]
    RunLog {
        /// The run log.
        path: PathBuf,
        /// The line, counted from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// Run logs or run directories that cannot be reported (none found, or not of one run).
    #[error("{0}")]
    Input(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What a finished run returns (`simulate` or `swarm`).
#[derive(Clone, Debug)]
pub struct Outcome {
    /// What was written to `summary.json`.
    pub summary: Summary,
    /// The final table (also written to `table.txt`).
    pub table: String,
}

/// Scores of every silo at one evaluation, as the run log and summaries hold them: loss and
/// accuracy (or MSE) pooled over silos, and per silo, summed in silo order.
pub(crate) fn algorithm_round(
    algorithm: Algorithm,
    evals: Vec<Evaluation>,
    regression: bool,
) -> AlgorithmRound {
    let count: usize = evals.iter().map(|c| c.count).sum::<usize>().max(1);
    let loss = evals.iter().map(|c| c.loss_sum).sum::<f64>() / count as f64;
    let correct: usize = evals.iter().map(|c| c.correct).sum();
    let per_client_loss: Vec<f64> = evals
        .iter()
        .map(|c| c.loss_sum / c.count.max(1) as f64)
        .collect();
    let per_client = if regression {
        per_client_loss.clone()
    } else {
        evals
            .iter()
            .map(|c| c.correct as f64 / c.count.max(1) as f64)
            .collect()
    };
    AlgorithmRound {
        algorithm: algorithm.name().into(),
        accuracy: (!regression).then(|| correct as f64 / count as f64),
        mse: regression.then_some(loss),
        loss,
        per_client,
        per_client_loss,
    }
}

/// Mean over silos of the weight each puts on its own group, self included (spec §8.1 item 6).
pub fn same_group_mass(weights: &[Vec<f64>], groups: &[usize]) -> f64 {
    let total: f64 = weights
        .iter()
        .enumerate()
        .map(|(i, row)| {
            row.iter()
                .enumerate()
                .filter(|(j, _)| groups[*j] == groups[i])
                .map(|(_, w)| w)
                .sum::<f64>()
        })
        .sum();
    total / weights.len().max(1) as f64
}

/// Peer mass and self-weight of a weight matrix (`weights[i][j]`: silo i's weight on model j,
/// rows summing to 1), with `groups` when the split has them. A silo's peer mass is its weight
/// on its own group's other silos over its weight on all other silos; undefined (`None`) when
/// it weighs nobody else or has no group-mate.
pub fn reliance(weights: &[Vec<f64>], groups: Option<&[usize]>) -> Reliance {
    let k = weights.len();
    let per_client_self_weight: Vec<f64> = (0..k)
        .map(|i| weights[i].get(i).copied().unwrap_or(0.0))
        .collect();
    let per_client_peer_mass: Vec<Option<f64>> = match groups {
        None => Vec::new(),
        Some(g) => (0..k)
            .map(|i| {
                let others = || weights[i].iter().enumerate().filter(move |(j, _)| *j != i);
                let on_others: f64 = others().map(|(_, w)| w).sum();
                let has_mate = (0..k).any(|j| j != i && g.get(j) == g.get(i));
                let on_group: f64 = others()
                    .filter(|(j, _)| g.get(*j) == g.get(i))
                    .map(|(_, w)| w)
                    .sum();
                (has_mate && on_others > 1e-12).then(|| on_group / on_others)
            })
            .collect(),
    };
    let defined: Vec<f64> = per_client_peer_mass.iter().flatten().copied().collect();
    Reliance {
        peer_mass: (!defined.is_empty())
            .then(|| defined.iter().sum::<f64>() / defined.len() as f64),
        self_weight: (k > 0).then(|| per_client_self_weight.iter().sum::<f64>() / k as f64),
        per_client_peer_mass,
        per_client_self_weight,
    }
}

/// Means over seeds of each seed's [`PrivacySpent`] (per silo: silo i of every seed's split).
pub fn mean_privacy(seeds: &[&PrivacySpent]) -> Option<PrivacySpent> {
    let first = seeds.first()?;
    let n = seeds.len() as f64;
    let per = |f: fn(&PrivacySpent) -> &Vec<f64>| -> Vec<f64> {
        (0..f(first).len())
            .map(|i| {
                seeds
                    .iter()
                    .map(|s| f(s).get(i).copied().unwrap_or(f64::NAN))
                    .sum::<f64>()
                    / n
            })
            .collect()
    };
    Some(PrivacySpent {
        budget: first.budget,
        epsilon: seeds.iter().map(|s| s.epsilon).sum::<f64>() / n,
        per_client_epsilon: per(|s| &s.per_client_epsilon),
        per_client_delta: per(|s| &s.per_client_delta),
        per_client_noise: per(|s| &s.per_client_noise),
        exhausted: seeds.iter().map(|s| s.exhausted).sum::<f64>() / n,
    })
}

/// Means over seeds of each seed's [`MembershipAudit`] (per silo: silo i of every seed's split).
pub fn mean_audit(seeds: &[&MembershipAudit]) -> Option<MembershipAudit> {
    let first = seeds.first()?;
    let n = seeds.len() as f64;
    let mean = |f: fn(&MembershipAudit) -> f64| seeds.iter().map(|s| f(s)).sum::<f64>() / n;
    Some(MembershipAudit {
        auc: mean(|s| s.auc),
        per_client_auc: (0..first.per_client_auc.len())
            .map(|i| {
                seeds
                    .iter()
                    .map(|s| s.per_client_auc.get(i).copied().unwrap_or(f64::NAN))
                    .sum::<f64>()
                    / n
            })
            .collect(),
        epsilon_lower_bound: mean(|s| s.epsilon_lower_bound),
        members: first.members,
        non_members: first.non_members,
        member_loss: mean(|s| s.member_loss),
        non_member_loss: mean(|s| s.non_member_loss),
    })
}

/// Means over seeds of each seed's [`Reliance`] (per silo: silo i of every seed's split; a
/// silo's peer mass over the seeds where it is defined).
pub fn mean_reliance(seeds: &[&Reliance]) -> Reliance {
    let mean = |xs: Vec<f64>| (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64);
    let clients = seeds
        .iter()
        .map(|r| r.per_client_self_weight.len())
        .max()
        .unwrap_or(0);
    Reliance {
        peer_mass: mean(seeds.iter().filter_map(|r| r.peer_mass).collect()),
        self_weight: mean(seeds.iter().filter_map(|r| r.self_weight).collect()),
        per_client_peer_mass: if seeds.iter().all(|r| r.per_client_peer_mass.is_empty()) {
            Vec::new()
        } else {
            (0..clients)
                .map(|i| {
                    mean(
                        seeds
                            .iter()
                            .filter_map(|r| r.per_client_peer_mass.get(i).copied().flatten())
                            .collect(),
                    )
                })
                .collect()
        },
        per_client_self_weight: (0..clients)
            .filter_map(|i| {
                mean(
                    seeds
                        .iter()
                        .filter_map(|r| r.per_client_self_weight.get(i).copied())
                        .collect(),
                )
            })
            .collect(),
    }
}

/// Whose data trained each model (the trained-by measure of same-group mass): for every model,
/// the share of its incoming gradient weight that came from each group, averaged over the rounds
/// seen. A round's share of silo i in model j is `w_ij · n_i` over the sum of that over every
/// silo that sent j a gradient (its owner and the peers that sampled it), the weight and the
/// sample count being what scale a FedeRiCo gradient (spec §5.4).
#[derive(Clone, Debug, Default)]
pub struct Provenance {
    /// `share[j][g]`: summed per-round share of group g in model j.
    share: Vec<Vec<f64>>,
    rounds: usize,
}

impl Provenance {
    /// Adds one round: `weights[i][j]` as used for the round's M-step, `sampled[i]` the peers
    /// silo i pulled (it always trains its own model too), `n_train[i]` its training samples.
    pub fn add_round(
        &mut self,
        weights: &[Vec<f64>],
        sampled: &[Vec<u32>],
        n_train: &[usize],
        groups: &[usize],
    ) {
        let k = weights.len();
        let g_count = groups.iter().max().map_or(0, |g| g + 1);
        if self.share.len() != k {
            self.share = vec![vec![0.0; g_count]; k];
        }
        let mut round = vec![vec![0.0; g_count]; k];
        for i in 0..k {
            let own = std::iter::once(i).chain(sampled[i].iter().map(|&j| j as usize));
            for j in own.filter(|&j| j < k) {
                round[j][groups[i]] += weights[i][j] * n_train[i] as f64;
            }
        }
        for (acc, row) in self.share.iter_mut().zip(round) {
            let total: f64 = row.iter().sum();
            if total > 0.0 {
                for (a, r) in acc.iter_mut().zip(row) {
                    *a += r / total;
                }
            }
        }
        self.rounds += 1;
    }

    /// Mean over silos of `Σ_j w_ij · share_j(group of i)`: the weight each silo puts on models
    /// trained with its own group's data. `None` before any round.
    pub fn trained_group_mass(&self, weights: &[Vec<f64>], groups: &[usize]) -> Option<f64> {
        if self.rounds == 0 || self.share.len() != weights.len() {
            return None;
        }
        let n = self.rounds as f64;
        let total: f64 = weights
            .iter()
            .enumerate()
            .map(|(i, row)| {
                row.iter()
                    .enumerate()
                    .map(|(j, w)| w * self.share[j][groups[i]] / n)
                    .sum::<f64>()
            })
            .sum();
        Some(total / weights.len().max(1) as f64)
    }
}

/// Writes `value` as pretty-printed JSON and a final newline to `path`.
pub(crate) fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), ReportError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| ReportError::Io {
        path: path.into(),
        source: e.into(),
    })?;
    std::fs::write(path, text + "\n").map_err(io_err(path))
}

/// What every seed of a run produced, ready to be summarised.
pub(crate) struct Report {
    /// The architecture (unknown for nodes that wrote no model card).
    pub(crate) spec: Option<ModelSpec>,
    pub(crate) num_params: usize,
    pub(crate) clients: usize,
    pub(crate) regression: bool,
    /// One summary per seed.
    pub(crate) runs: Vec<RunSummary>,
    /// Per seed: each algorithm's metric per evaluated round.
    pub(crate) curves: Vec<Curves>,
}

/// The y axis of a run's metric plots: accuracy in percent, or MSE as it is.
fn metric_axis(regression: bool) -> plots::Axis<'static> {
    plots::Axis {
        label: if regression {
            "test MSE"
        } else {
            "test accuracy (%)"
        },
        accuracy: !regression,
        percent: !regression,
    }
}

/// Writes `summary.json`, the metric plot (mean ± std over seeds) and `table.txt` under `out`
/// for the seeds in `report`, naming the run `name` (its scenario) of `rounds` rounds; shared by
/// `simulate`, `swarm` and `report`.
pub(crate) fn write_summary(
    name: &str,
    rounds: usize,
    out: &Path,
    algorithms: &[Algorithm],
    report: Report,
) -> Result<Outcome, ReportError> {
    let Report {
        spec,
        num_params,
        clients,
        regression,
        runs,
        curves,
    } = report;
    let seeds: Vec<u64> = runs.iter().map(|r| r.seed).collect();
    let algorithms: Vec<AlgorithmSummary> = algorithms
        .iter()
        .map(|alg| {
            let results: Vec<&AlgorithmResult> = runs
                .iter()
                .map(|r| {
                    r.algorithms
                        .iter()
                        .find(|a| a.algorithm == alg.name())
                        .expect("every run scores every algorithm")
                })
                .collect();
            let per_seed: Vec<f64> = results
                .iter()
                .map(|a| a.accuracy.or(a.mse).unwrap_or(f64::NAN))
                .collect();
            let (mean, std) = table::mean_std(&per_seed);
            let per_client = (0..clients)
                .map(|i| {
                    results.iter().map(|a| a.per_client[i]).sum::<f64>() / results.len() as f64
                })
                .collect();
            let masses: Vec<f64> = results.iter().filter_map(|a| a.same_group_mass).collect();
            let reliance = mean_reliance(&results.iter().map(|a| &a.reliance).collect::<Vec<_>>());
            let trained: Vec<f64> = results
                .iter()
                .filter_map(|a| a.trained_group_mass)
                .collect();
            AlgorithmSummary {
                algorithm: alg.name().into(),
                accuracy: (!regression).then_some(mean),
                accuracy_std: (!regression).then_some(std),
                mse: regression.then_some(mean),
                mse_std: regression.then_some(std),
                per_seed,
                per_client,
                same_group_mass: (!masses.is_empty())
                    .then(|| masses.iter().sum::<f64>() / masses.len() as f64),
                trained_group_mass: (!trained.is_empty())
                    .then(|| trained.iter().sum::<f64>() / trained.len() as f64),
                reliance,
                privacy: mean_privacy(
                    &results
                        .iter()
                        .filter_map(|a| a.privacy.as_ref())
                        .collect::<Vec<_>>(),
                ),
                audit: mean_audit(
                    &results
                        .iter()
                        .filter_map(|a| a.audit.as_ref())
                        .collect::<Vec<_>>(),
                ),
            }
        })
        .collect();
    let metric = if regression { "mse" } else { "accuracy" };
    let summary = Summary {
        scenario: name.to_string(),
        metric: metric.into(),
        model: spec
            .and_then(|s| serde_json::to_value(&s).ok())
            .unwrap_or_default(),
        num_params,
        clients,
        rounds,
        seeds: seeds.clone(),
        algorithms,
        runs,
    };
    write_json(&out.join("summary.json"), &summary)?;

    // Every algorithm's mean over seeds, with the spread as a band.
    let seeds_said = match seeds.len() {
        1 => "1 seed".to_string(),
        n => format!("mean ± std over {n} seeds"),
    };
    plots::metric_bands(
        &out.join(format!("{metric}.svg")),
        &format!("{name}: test {metric} per round ({seeds_said})"),
        metric_axis(regression),
        &bands::curves_over_seeds(&curves),
    )?;

    let rows: Vec<table::Row> = summary
        .algorithms
        .iter()
        .map(|a| table::Row {
            algorithm: a.algorithm.clone(),
            values: a.per_seed.clone(),
        })
        .collect();
    let text = table::render(metric, !regression, &rows);
    let table_path = out.join("table.txt");
    std::fs::write(&table_path, &text).map_err(io_err(&table_path))?;
    Ok(Outcome {
        summary,
        table: text,
    })
}

/// The seed's plots: metric per round, and, when the run had FedeRiCo (`federico`), its
/// weights over rounds and at the end (read back from the seed's `rounds.jsonl` at `log_path`).
pub(crate) fn write_seed_plots(
    name: &str,
    federico: bool,
    dir: &Path,
    log_path: &Path,
    curves: &[(String, Vec<(usize, f64)>)],
    groups: Option<&[usize]>,
    regression: bool,
) -> Result<(), ReportError> {
    let metric = if regression { "mse" } else { "accuracy" };
    plots::metric_bands(
        &dir.join(format!("{metric}.svg")),
        &format!("{name}: test {metric}"),
        metric_axis(regression),
        &bands::curves_over_seeds(&[curves.to_vec()]),
    )?;
    if !federico {
        return Ok(());
    }
    // Re-read the weights from the run log rather than keeping every round in memory.
    let text = std::fs::read_to_string(log_path).map_err(io_err(log_path))?;
    let mut rounds = Vec::new();
    let mut weights = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let rec: RoundRecord = serde_json::from_str(line).map_err(|e| ReportError::RunLog {
            path: log_path.to_owned(),
            line: n + 1,
            reason: e.to_string(),
        })?;
        if let Some(f) = rec.federico {
            rounds.push(rec.round);
            weights.push(f.weights);
        }
    }
    plots::weights_over_rounds(
        &dir.join("weights_over_rounds.svg"),
        &rounds,
        &weights,
        groups,
    )?;
    if let Some(fin) = weights.last() {
        plots::weight_heatmap(
            &dir.join("weights_final.svg"),
            &format!(
                "{name}: {} weights after round {}",
                super::names::display_name(Algorithm::Federico),
                rounds.last().copied().unwrap_or(0)
            ),
            fin,
            groups,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trained_group_mass_follows_whose_gradients_trained_a_model() {
        // Every silo relies wholly on model 2: silos 0 and 1 (group 0) sampled it, silo 2
        // (group 1) owns it.
        let w = vec![
            vec![0.0, 0.0, 1.0],
            vec![0.0, 0.0, 1.0],
            vec![0.0, 0.0, 1.0],
        ];
        let mut p = Provenance::default();
        assert_eq!(p.trained_group_mass(&w, &[0, 0, 1]), None);
        p.add_round(&w, &[vec![2], vec![2], vec![]], &[10, 10, 10], &[0, 0, 1]);
        // Model 2 received 10 + 10 from group 0 and 10 from group 1 (its owner): 2/3 group 0.
        let m = p.trained_group_mass(&w, &[0, 0, 1]).unwrap();
        assert!(
            (m - (2.0 / 3.0 + 2.0 / 3.0 + 1.0 / 3.0) / 3.0).abs() < 1e-12,
            "{m}"
        );
        // By owner, silos 0 and 1 put everything on another group's model.
        assert!((same_group_mass(&w, &[0, 0, 1]) - 1.0 / 3.0).abs() < 1e-12);
    }

    /// Issue 39: a silo that trusts only itself reads same-group mass 1.0; self-weight and peer
    /// mass tell it apart from one that trusts its group.
    #[test]
    fn self_weight_and_peer_mass_tell_a_self_locked_silo_from_one_that_trusts_its_group() {
        let locked = vec![
            vec![0.98, 0.01, 0.01],
            vec![0.3, 0.6, 0.1],
            vec![0.0, 0.0, 1.0],
        ];
        let groups = [0, 0, 1];
        assert!(same_group_mass(&locked[..1], &groups) > 0.98);
        let r = reliance(&locked, Some(&groups));
        assert_eq!(r.per_client_self_weight, vec![0.98, 0.6, 1.0]);
        // Silo 0: half of its 0.02 on others is on its group; silo 1: 0.3 of 0.4; silo 2 weighs
        // nobody else (and has no group-mate).
        let p = &r.per_client_peer_mass;
        assert!((p[0].unwrap() - 0.5).abs() < 1e-9 && (p[1].unwrap() - 0.75).abs() < 1e-9);
        assert_eq!(p[2], None);
        assert!((r.peer_mass.unwrap() - 0.625).abs() < 1e-9);
        assert!((r.self_weight.unwrap() - 2.58 / 3.0).abs() < 1e-9);
        // Without groups: self-weight only.
        let r = reliance(&locked, None);
        assert!(r.per_client_peer_mass.is_empty() && r.peer_mass.is_none());
        // Over seeds: per silo, over the seeds where it is defined.
        let other = reliance(&[vec![0.5, 0.5], vec![0.2, 0.8]], Some(&[0, 0]));
        let one = reliance(&[vec![1.0, 0.0], vec![0.6, 0.4]], Some(&[0, 0]));
        let m = mean_reliance(&[&other, &one]);
        assert_eq!(m.per_client_peer_mass, vec![Some(1.0), Some(1.0)]);
        let w = &m.per_client_self_weight;
        assert!(w.len() == 2 && (w[0] - 0.75).abs() < 1e-12 && (w[1] - 0.6).abs() < 1e-12);
    }

    #[test]
    fn same_group_mass_counts_self_and_group_peers() {
        let w = vec![
            vec![0.5, 0.4, 0.1],
            vec![0.2, 0.2, 0.6],
            vec![0.0, 0.0, 1.0],
        ];
        let m = same_group_mass(&w, &[0, 0, 1]);
        assert!((m - (0.9 + 0.4 + 1.0) / 3.0).abs() < 1e-12);
    }
}
