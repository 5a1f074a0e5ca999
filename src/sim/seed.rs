//! One seed of a simulation: every requested algorithm stepped round by round on the seed's
//! split, from the same initial weights.
//! Owns: building the seed's runs, timing and evaluating them each round, the seed's files
//! (`rounds.jsonl`, `partition.json`, `summary.json`, `timing.json`, plots, a coordinated
//! algorithm's record, and under faults `faults.txt` and `traces.jsonl`) and its fault checks.
//! Must not: make algorithm decisions (the runs do) or summarise across seeds (that is
//! [`crate::report::summary`], called by [`super::run`]).

use super::baselines::{FedAvgRun, LocalRun};
use super::feddisco::FeddiscoRun;
use super::federico::FedericoRun;
use super::hcct::HcctRun;
use super::members::{self, CollabRun, MemberRun, UnderFaults};
use super::network::FaultNet;
use super::pool::ExportTo;
use super::{ClientEval, Ctx, Setup, SimError, coordinated, io_err, ordered, setup};
use crate::faults::checks;
use crate::learn::ModelSpec;
use crate::report::records::{
    AlgorithmResult, AlgorithmRound, AlgorithmTiming, FedericoRound, RoundRecord, RunSummary,
    Timing,
};
use crate::report::summary::{
    Provenance, algorithm_round, reliance, same_group_mass, write_json, write_seed_plots,
};
use crate::scenario::{Algorithm, Scenario};
use crate::trace::EvalRecord;
use indicatif::ProgressBar;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One seed's scores of one algorithm at one evaluation.
struct Scored {
    algorithm: Algorithm,
    clients: Vec<ClientEval>,
}

/// [`algorithm_round`] of one [`Scored`] evaluation.
fn to_round(s: &Scored, regression: bool) -> AlgorithmRound {
    algorithm_round(
        s.algorithm,
        s.clients.iter().map(|&c| c.into()).collect(),
        regression,
    )
}

/// What one seed produced.
pub(super) struct SeedRun {
    pub(super) summary: RunSummary,
    pub(super) curves: Vec<(String, Vec<(usize, f64)>)>,
    pub(super) spec: ModelSpec,
    pub(super) num_params: usize,
    pub(super) clients: usize,
    pub(super) regression: bool,
}

/// Runs seed `seed` of `scenario` on `pool` and writes its files under `dir`.
pub(super) fn run_seed(
    scenario: &Scenario,
    seed: u64,
    real: Option<&crate::scenario::Loaded>,
    pool: &rayon::ThreadPool,
    dir: &Path,
    bar: &ProgressBar,
    opts: &super::Options,
) -> Result<SeedRun, SimError> {
    let Setup {
        fed,
        scale,
        spec,
        learners,
        init,
    } = setup(scenario, seed, real)?;
    write_json(&dir.join("partition.json"), &fed.report())?;
    if let Some(scale) = &scale {
        // Exported models read standardized features: `predict --scale` applies these.
        write_json(&dir.join("scale.json"), scale)?;
    }
    let regression = spec.is_regression();
    let num_params = init[0].len();
    let mut ctx = Ctx {
        scenario,
        fed: &fed,
        seed,
        learners,
        pool,
        export: None,
    };
    let groups = fed.groups();
    let wants = |a| scenario.algorithms.contains(&a);

    let mut local = wants(Algorithm::Local).then(|| LocalRun::new(&ctx, &init));
    let mut fedavg = (wants(Algorithm::Fedavg) || wants(Algorithm::FedavgPlus))
        .then(|| FedAvgRun::new(&ctx, &init));
    // A fault schedule applies to FedeRiCo; the same run without faults is kept beside it for
    // the recovery check.
    let schedule = scenario.fault_schedule()?;
    let faulty = !schedule.is_empty();
    let mut fedrc = match wants(Algorithm::Federico) {
        false => None,
        true if faulty => Some(FedericoRun::with_faults(
            &ctx,
            &init,
            schedule.clone(),
            scenario.rounds as u64,
        )?),
        true => Some(FedericoRun::new(&ctx, &init)),
    };
    let mut fault_free =
        (faulty && schedule.config.baseline).then(|| FedericoRun::new(&ctx, &init));
    let mut fault_free_finals = None;
    let mut coordinated: Vec<(Algorithm, Box<dyn coordinated::CoordinatedRun>)> = scenario
        .algorithms
        .iter()
        .filter_map(|&a| {
            coordinated_run(a, &ctx, &init, &schedule)
                .transpose()
                .map(|r| r.map(|r| (a, r)))
        })
        .collect::<Result<_, _>>()?;
    let algorithms = ordered(&scenario.algorithms);
    let started = Instant::now();
    let mut train_rounds: Vec<Vec<f64>> = vec![Vec::new(); algorithms.len()];
    let mut eval_seconds = vec![0f64; algorithms.len()];
    let slot = |a: Algorithm| {
        algorithms
            .iter()
            .position(|&x| x == a)
            .expect("only requested algorithms are timed")
    };
    let mut curves: Vec<(String, Vec<(usize, f64)>)> = algorithms
        .iter()
        .map(|a| (a.name().to_string(), Vec::new()))
        .collect();
    let mut last: Vec<AlgorithmRound> = Vec::new();
    let mut last_mass = None;
    let mut last_trained = None;
    let mut last_reliance = crate::report::records::Reliance::default();
    let mut provenance = Provenance::default();
    let n_train: Vec<usize> = fed.clients.iter().map(|c| c.train.len()).collect();

    let log_path = dir.join("rounds.jsonl");
    let mut log =
        std::io::BufWriter::new(std::fs::File::create(&log_path).map_err(io_err(&log_path))?);
    for round in 1..=scenario.rounds {
        // Train. FedAvg's time is shared by its two rows and charged to both.
        if let Some(run) = local.as_mut() {
            let t = Instant::now();
            run.round(&mut ctx)?;
            train_rounds[slot(Algorithm::Local)].push(t.elapsed().as_secs_f64());
        }
        if let Some(run) = fedavg.as_mut() {
            let t = Instant::now();
            run.round(&mut ctx)?;
            let s = t.elapsed().as_secs_f64();
            for a in [Algorithm::Fedavg, Algorithm::FedavgPlus] {
                if wants(a) {
                    train_rounds[slot(a)].push(s);
                }
            }
        }
        if let Some(run) = fedrc.as_mut() {
            let t = Instant::now();
            run.round(&mut ctx)?;
            train_rounds[slot(Algorithm::Federico)].push(t.elapsed().as_secs_f64());
        }
        if let Some(run) = fault_free.as_mut() {
            run.round(&mut ctx)?;
            if round == scenario.rounds {
                fault_free_finals = Some(run.evaluate(&mut ctx)?);
            }
        }
        for (a, run) in coordinated.iter_mut() {
            let t = Instant::now();
            run.round(&mut ctx)?;
            train_rounds[slot(*a)].push(t.elapsed().as_secs_f64());
        }

        // Evaluate.
        let mut scored = Vec::new();
        if crate::core::is_evaluation_round(
            round as u64,
            scenario.eval_every as u64,
            Some(scenario.rounds as u64),
        ) {
            for &a in &algorithms {
                // `--export`: the last round's predictors are written as they are scored.
                ctx.export = (opts.export && round == scenario.rounds).then(|| ExportTo {
                    dir: dir.join("models").join(a.name()),
                    round: round as u64,
                    data: crate::learn::export::CardData {
                        scale: scale.clone(),
                        class_names: real.and_then(|r| r.class_names()).map(<[_]>::to_vec),
                    },
                });
                let t = Instant::now();
                let clients = match a {
                    Algorithm::Local => local.as_mut().map(|r| r.evaluate(&mut ctx)),
                    Algorithm::Fedavg => fedavg.as_mut().map(|r| r.evaluate(&mut ctx)),
                    Algorithm::FedavgPlus => {
                        fedavg.as_mut().map(|r| r.evaluate_plus(&mut ctx, round))
                    }
                    Algorithm::Federico => fedrc.as_mut().map(|r| r.evaluate(&mut ctx)),
                    #[allow(unreachable_patterns)] // the coordinated algorithms
                    _ => coordinated
                        .iter_mut()
                        .find(|(x, _)| *x == a)
                        .map(|(_, r)| r.evaluate(&mut ctx)),
                }
                .expect("every requested algorithm has a run")?;
                eval_seconds[slot(a)] += t.elapsed().as_secs_f64();
                scored.push(Scored {
                    algorithm: a,
                    clients,
                });
            }
            ctx.export = None;
        }
        let rounds_scored: Vec<AlgorithmRound> =
            scored.iter().map(|s| to_round(s, regression)).collect();
        for (r, (_, pts)) in rounds_scored.iter().zip(curves.iter_mut()) {
            pts.push((round, r.accuracy.or(r.mse).unwrap_or(f64::NAN)));
        }
        let federico = fedrc.as_ref().map(|run| {
            let weights = run.weight_matrix();
            let mass = groups.as_deref().map(|g| same_group_mass(&weights, g));
            let rel = reliance(&weights, groups.as_deref());
            let sampled: Vec<Vec<u32>> = run
                .last_sampled
                .iter()
                .map(|s| s.iter().map(|n| n.0).collect())
                .collect();
            let trained = groups.as_deref().and_then(|g| {
                provenance.add_round(&weights, &sampled, &n_train, g);
                provenance.trained_group_mass(&weights, g)
            });
            last_mass = mass;
            last_trained = trained;
            let round = FedericoRound {
                sampled,
                same_group_mass: mass,
                trained_group_mass: trained,
                peer_mass: rel.peer_mass,
                self_weight: rel.self_weight,
                weights,
            };
            last_reliance = rel;
            round
        });
        let record = RoundRecord {
            seed,
            round,
            algorithms: rounds_scored.clone(),
            federico,
        };
        serde_json::to_writer(&mut log, &record).map_err(|e| SimError::Io {
            path: log_path.clone(),
            source: e.into(),
        })?;
        writeln!(log)
            .and_then(|_| log.flush())
            .map_err(io_err(&log_path))?;

        if !rounds_scored.is_empty() {
            let msg: Vec<String> = rounds_scored
                .iter()
                .map(|r| match r.accuracy {
                    Some(acc) => format!("{} {:.1}%", r.algorithm, 100.0 * acc),
                    None => format!("{} mse {:.4}", r.algorithm, r.mse.unwrap_or(f64::NAN)),
                })
                .collect();
            bar.set_message(format!("seed {seed}: {}", msg.join("  ")));
            last = rounds_scored;
        }
        bar.inc(1);
    }

    let audit = match (&fedrc, opts.audit) {
        (Some(run), true) => Some(run.audit(&mut ctx)?),
        _ => None,
    };
    let summary = RunSummary {
        seed,
        rounds: scenario.rounds,
        algorithms: last
            .iter()
            .zip(&algorithms)
            .map(|(r, &a)| AlgorithmResult {
                algorithm: r.algorithm.clone(),
                accuracy: r.accuracy,
                mse: r.mse,
                per_client: r.per_client.clone(),
                same_group_mass: (a == Algorithm::Federico).then_some(last_mass).flatten(),
                trained_group_mass: (a == Algorithm::Federico).then_some(last_trained).flatten(),
                reliance: match a {
                    Algorithm::Federico => last_reliance.clone(),
                    _ => Default::default(),
                },
                privacy: match a {
                    Algorithm::Federico => fedrc.as_ref().and_then(FedericoRun::privacy),
                    _ => None,
                },
                audit: match (a, &audit) {
                    (Algorithm::Federico, Some(audit)) => Some(audit.clone()),
                    _ => None,
                },
            })
            .collect(),
        faults: None,
        coordinated_faults: Default::default(),
    };
    let mut summary = summary;
    if let Some(f) = fedrc.as_ref().and_then(FedericoRun::faults) {
        let report = fault_report(scenario, f, groups.as_deref(), fault_free_finals.as_deref());
        write_fault_files(dir, f, &report)?;
        summary.faults = Some(serde_json::to_value(&report).map_err(|e| SimError::Io {
            path: dir.join("summary.json"),
            source: e.into(),
        })?);
    }
    for (a, run) in &coordinated {
        if let Some(report) = run.fault_report() {
            let path = dir.join(format!("faults-{}.txt", a.name()));
            std::fs::write(&path, report.render()).map_err(io_err(&path))?;
            let v = serde_json::to_value(&report).map_err(|e| SimError::Io {
                path: dir.join("summary.json"),
                source: e.into(),
            })?;
            summary.coordinated_faults.insert(a.name().to_string(), v);
        }
    }
    write_json(&dir.join("summary.json"), &summary)?;
    for (a, run) in &coordinated {
        if let Some(record) = run.record() {
            write_json(&dir.join(format!("{}.json", a.name())), &record)?;
        }
    }
    write_seed_plots(
        &scenario.name,
        scenario.algorithms.contains(&Algorithm::Federico),
        dir,
        &log_path,
        &curves,
        groups.as_deref(),
        regression,
    )?;
    let timing = Timing {
        seed,
        threads: pool.current_num_threads(),
        total_seconds: started.elapsed().as_secs_f64(),
        algorithms: algorithms
            .iter()
            .enumerate()
            .map(|(s, a)| AlgorithmTiming {
                algorithm: a.name().into(),
                train_seconds: train_rounds[s].iter().sum(),
                eval_seconds: eval_seconds[s],
                median_round_seconds: median(&train_rounds[s]),
            })
            .collect(),
        machine: crate::report::machine::Machine::this(),
    };
    write_json(&dir.join("timing.json"), &timing)?;
    Ok(SeedRun {
        summary,
        curves,
        spec,
        num_params,
        clients: fed.clients.len(),
        regression,
    })
}

/// The checks of a faulty FedeRiCo run, judged as a swarm's are ([`checks::round_budget`]) on
/// the simulated network's virtual clock.
fn fault_report(
    scenario: &Scenario,
    f: &FaultNet,
    groups: Option<&[usize]>,
    fault_free: Option<&[ClientEval]>,
) -> checks::Report {
    let baseline: Option<Vec<Option<EvalRecord>>> =
        fault_free.map(|v| v.iter().map(|&e| Some(e.into())).collect());
    let seconds: Vec<f64> = f.traces.iter().flatten().map(|r| r.seconds).collect();
    let budget = checks::round_budget(f.tau_model, f.tau_grad, &seconds);
    checks::evaluate(&checks::Inputs {
        schedule: &f.schedule,
        applied: &f.applied,
        traces: &f.traces,
        groups,
        baseline: baseline.as_deref(),
        round_budget_s: budget,
        stall_after: budget,
        suspect_after: scenario.federico.suspect_after,
        crashes: &f.crashes,
        exits: None,
    })
}

/// `faults.txt` (the printed report) and `traces.jsonl` (every silo's per-round record, as
/// nodes write them) in the seed's directory.
fn write_fault_files(dir: &Path, f: &FaultNet, report: &checks::Report) -> Result<(), SimError> {
    let path = dir.join("faults.txt");
    std::fs::write(&path, report.render()).map_err(io_err(&path))?;
    let path = dir.join("traces.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).map_err(io_err(&path))?);
    for rec in f.traces.iter().flatten() {
        serde_json::to_writer(&mut out, rec).map_err(|e| SimError::Io {
            path: path.clone(),
            source: e.into(),
        })?;
        writeln!(out).map_err(io_err(&path))?;
    }
    out.flush().map_err(io_err(&path))
}

/// The run for `algorithm`, or `None` when it is not a coordinated algorithm (Local, FedAvg,
/// FedAvg+ and FedeRiCo have their own drivers). `init[i]` is silo i's initial weights,
/// identical for every algorithm. FedDisco, HCCT and FedSaC run on the engines the network
/// runs ([`MemberRun`]) whenever the network can run their settings, FedCollab always
/// ([`CollabRun`]); the simulator's own modes
/// (FedDisco's partial participation, HCCT-E, HCCT-P, HCCT with Adam, HCCT's trace) on their
/// lock-step loops. Under a fault schedule the engines run on a moving clock
/// ([`UnderFaults`]).
fn coordinated_run(
    algorithm: Algorithm,
    ctx: &Ctx<'_>,
    init: &[Vec<f32>],
    schedule: &crate::faults::Schedule,
) -> Result<Option<Box<dyn coordinated::CoordinatedRun>>, SimError> {
    if !schedule.events.is_empty()
        && crate::scenario::COORDINATED_UNDER_FAULTS.contains(&algorithm)
        && let Some(parts) = members::parts(algorithm, ctx, init)?
    {
        let beside = match schedule.config.baseline {
            true => members::parts(algorithm, ctx, init)?,
            false => None,
        };
        return Ok(Some(Box::new(UnderFaults::members(
            ctx,
            parts,
            beside,
            schedule.clone(),
        )?)));
    }
    if !schedule.events.is_empty() && algorithm == Algorithm::Fedcollab {
        return Ok(Some(Box::new(UnderFaults::collab(
            ctx,
            init,
            schedule.config.baseline,
            schedule.clone(),
        )?)));
    }
    Ok(match algorithm {
        Algorithm::Local | Algorithm::Fedavg | Algorithm::FedavgPlus | Algorithm::Federico => None,
        Algorithm::Fedcollab => Some(Box::new(CollabRun::new(ctx, init)?)),
        // HCCT's trace prints the Gram matrix only the lock-step loop sees (same decisions).
        Algorithm::Hcct if std::env::var_os("FEDERICO_HCCT_TRACE").is_some() => {
            Some(Box::new(HcctRun::new(ctx, init)))
        }
        a => match (members::parts(a, ctx, init)?, a) {
            (Some(parts), _) => Some(Box::new(MemberRun::new(ctx, parts))),
            (None, Algorithm::Hcct) => Some(Box::new(HcctRun::new(ctx, init))),
            (None, _) => Some(Box::new(FeddiscoRun::new(ctx, init))),
        },
    })
}
