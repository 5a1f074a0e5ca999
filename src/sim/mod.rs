//! The in-process simulator: all silos of a federation in one process, lock-step rounds,
//! deterministic for a seed (`federico simulate`).
//!
//! Owns: building each run (split, learners, identical initial weights for every algorithm),
//! stepping the algorithms round by round with silos computed in parallel on a thread pool,
//! evaluating them, and writing the run's files (`rounds.jsonl`, `partition.json`,
//! `summary.json`, plots).
//! Must not: make algorithm decisions: FedeRiCo's live in [`crate::core`], and the baselines'
//! per-round work is the plain recipe of spec §8.3.

mod baselines;
mod coordinated;
mod engines;
mod faults;
mod fedcollab;
mod feddisco;
mod federico;
mod fedsac;
mod hcct;

use crate::faults::checks;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Dataset, Evaluation, Federation, LearnError, Learner, ModelSpec};
use crate::report::plots;
use crate::report::records::{
    AlgorithmResult, AlgorithmRound, AlgorithmTiming, FedericoRound, RoundRecord, RunSummary,
    Timing,
};
pub use crate::report::summary::Outcome;
use crate::report::summary::{
    Curves, Report, ReportError, algorithm_round, same_group_mass, write_json, write_seed_plots,
    write_summary,
};
use crate::scenario::{Algorithm, Scenario, ScenarioError};
use crate::silo::SiloError;
use crate::trace::EvalRecord;
use baselines::{FedAvgRun, LocalRun};
use federico::FedericoRun;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Errors of a simulation run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario or its data.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// A model failed.
    #[error(transparent)]
    Learn(#[from] LearnError),
    /// Writing an output file.
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
    /// The worker pool could not start.
    #[error("starting {threads} worker threads: {reason}")]
    Threads {
        /// Threads asked for.
        threads: usize,
        /// Why it failed.
        reason: String,
    },
    /// Something that cannot happen in a fault-free lock-step run did.
    #[error("simulator invariant broken: {0}")]
    Invariant(String),
}

impl From<SiloError> for SimError {
    /// A silo's errors keep the messages they had when the silo's work lived here.
    fn from(e: SiloError) -> Self {
        match e {
            SiloError::Learn(e) => SimError::Learn(e),
            SiloError::Fedsac(e) => SimError::Invariant(format!("fedsac: {e}")),
            SiloError::Invariant(s) => SimError::Invariant(s),
        }
    }
}

impl From<ReportError> for SimError {
    /// A report's errors keep the messages they had when report writing lived here.
    fn from(e: ReportError) -> Self {
        match e {
            ReportError::Io { path, source } => SimError::Io { path, source },
            ReportError::Plot(e) => SimError::Plot(e),
        }
    }
}

/// How to run a scenario (from the command line).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Output directory.
    pub out: PathBuf,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// Show a progress bar on stderr (hidden anyway when stderr is not a terminal).
    pub progress: bool,
}

/// A client's test score: summed loss and correct predictions over its test samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ClientEval {
    loss_sum: f64,
    correct: usize,
    count: usize,
}

impl From<ClientEval> for EvalRecord {
    fn from(e: ClientEval) -> Self {
        Self {
            loss_sum: e.loss_sum,
            correct: e.correct,
            count: e.count,
        }
    }
}

impl From<ClientEval> for Evaluation {
    fn from(e: ClientEval) -> Self {
        Self {
            loss_sum: e.loss_sum,
            correct: e.correct,
            count: e.count,
        }
    }
}

impl From<Evaluation> for ClientEval {
    fn from(e: Evaluation) -> Self {
        Self {
            loss_sum: e.loss_sum,
            correct: e.correct,
            count: e.count,
        }
    }
}

/// What one run step needs: the split, one learner workspace per silo and the worker pool.
pub(crate) struct Ctx<'a> {
    scenario: &'a Scenario,
    fed: &'a Federation,
    seed: u64,
    learners: Vec<Learner>,
    pool: &'a rayon::ThreadPool,
}

impl Ctx<'_> {
    fn clients(&self) -> usize {
        self.fed.clients.len()
    }
    fn lr(&self) -> f32 {
        self.scenario.train.lr as f32
    }
    fn batch_size(&self) -> usize {
        self.scenario.train.batch_size
    }
}

/// Scores every silo on its own test split, in parallel: silo `i` predicts with the mixture
/// `model(i)` (one `(parameters, weight)` part per model; a single part is the model itself).
pub(crate) fn score_each<'p>(
    ctx: &mut Ctx<'_>,
    model: impl Fn(usize) -> Vec<(&'p [f32], f64)> + Sync,
) -> Result<Vec<ClientEval>, SimError> {
    let fed = ctx.fed;
    ctx.pool.install(|| {
        ctx.learners
            .par_iter_mut()
            .enumerate()
            .map(|(i, learner)| mix_eval(learner, &model(i), &fed.clients[i].test))
            .collect()
    })
}

/// Runs `f(i, learner_i)` for every silo on the worker pool, the largest silos first, each worker
/// taking the next silo when it is free (longest-processing-time order: two workers finish
/// within one small silo of each other, where a split by index can leave one with 60 % of the
/// work). Results come back in silo order and do not depend on which worker ran what.
pub(crate) fn par_silos<T: Send>(
    ctx: &mut Ctx<'_>,
    f: impl Fn(usize, &mut Learner) -> T + Sync,
) -> Vec<T> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let fed = ctx.fed;
    let mut order: Vec<(usize, &mut Learner)> = ctx.learners.iter_mut().enumerate().collect();
    order.sort_by_key(|(i, _)| (std::cmp::Reverse(fed.clients[*i].train.len()), *i));
    let n = order.len();
    let jobs: Vec<Mutex<Option<(usize, &mut Learner)>>> =
        order.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let results: Vec<Mutex<Option<T>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let workers = ctx.pool.current_num_threads().min(n).max(1);
    ctx.pool.scope(|s| {
        for _ in 0..workers {
            s.spawn(|_| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= n {
                        break;
                    }
                    let job = jobs[k].lock().expect("job lock").take();
                    if let Some((i, learner)) = job {
                        let out = f(i, learner);
                        *results[i].lock().expect("result lock") = Some(out);
                    }
                }
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .expect("result lock")
                .expect("every silo ran")
        })
        .collect()
}

/// Scores a mixture `Σ w_j · model_j` on `test`: mixed class probabilities (accuracy and the
/// mixture's cross-entropy) or mixed regression outputs (squared error).
pub(crate) fn mix_eval(
    learner: &mut Learner,
    parts: &[(&[f32], f64)],
    test: &Dataset,
) -> Result<ClientEval, SimError> {
    Ok(learner.evaluate_mixture(parts, test)?.into())
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Algorithms in table order.
fn ordered(algs: &[Algorithm]) -> Vec<Algorithm> {
    let mut a = algs.to_vec();
    a.sort();
    a
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

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SimError + '_ {
    move |source| SimError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Runs every seed of `scenario` and writes the reports under `opts.out`.
pub fn run(scenario: &Scenario, opts: &Options) -> Result<Outcome, SimError> {
    let threads = match scenario.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("silo-worker-{i}"))
        .build()
        .map_err(|e| SimError::Threads {
            threads,
            reason: e.to_string(),
        })?;
    // The simulator runs in rounds: a schedule timed in seconds is for the swarm.
    scenario
        .fault_schedule()?
        .rounds_only()
        .map_err(ScenarioError::Invalid)?;
    std::fs::create_dir_all(&opts.out).map_err(io_err(&opts.out))?;
    let data_dir = scenario.data_dir(opts.data_dir.as_deref());
    let real = scenario.load_real(data_dir.as_deref())?;

    let algorithms = ordered(&scenario.algorithms);
    let bar = if opts.progress {
        let b = ProgressBar::new((scenario.rounds * scenario.seeds.len()) as u64);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} rounds  {msg}",
            )
            .expect("the template is a valid constant"),
        );
        b
    } else {
        ProgressBar::hidden()
    };

    let mut runs = Vec::new();
    let mut curves: Vec<Curves> = Vec::new();
    let mut meta = None;
    for &seed in &scenario.seeds {
        let dir = opts.out.join(format!("seed-{seed}"));
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let r = run_seed(scenario, seed, real.as_ref(), &pool, &dir, &bar)?;
        meta.get_or_insert((r.spec.clone(), r.num_params, r.clients, r.regression));
        curves.push(r.curves);
        runs.push(r.summary);
    }
    bar.finish_and_clear();
    let (spec, num_params, clients, regression) = meta.expect("seeds is validated non-empty");
    let report = Report {
        spec,
        num_params,
        clients,
        regression,
        runs,
        curves,
    };
    Ok(write_summary(scenario, &opts.out, &algorithms, report)?)
}

/// What every run of a seed starts from.
struct Setup {
    fed: Federation,
    spec: ModelSpec,
    /// One learner workspace per silo.
    learners: Vec<Learner>,
    /// Silo i's initial weights, identical for every algorithm.
    init: Vec<Vec<f32>>,
}

/// Draws the seed's split and the silos' initial weights (each from its own (seed, node) stream).
fn setup(
    scenario: &Scenario,
    seed: u64,
    real: Option<&crate::learn::loaders::RealData>,
) -> Result<Setup, SimError> {
    let fed = scenario.federation(real, &mut Scenario::data_rng(seed))?;
    let first = &fed.clients[0].train;
    let spec = scenario.model_spec(&first.sample_shape, first.num_classes())?;
    let learners = (0..fed.clients.len())
        .map(|_| Learner::new(&spec, scenario.train.batch_size))
        .collect::<Result<Vec<_>, _>>()?;
    let init = (0..fed.clients.len() as u32)
        .map(|i| {
            learners[0].init_params(&mut StdRng::seed_from_u64(stream_seed(
                seed,
                NodeId(i),
                Stream::Init,
            )))
        })
        .collect();
    Ok(Setup {
        fed,
        spec,
        learners,
        init,
    })
}

/// What one seed produced.
struct SeedRun {
    summary: RunSummary,
    curves: Vec<(String, Vec<(usize, f64)>)>,
    spec: ModelSpec,
    num_params: usize,
    clients: usize,
    regression: bool,
}

fn run_seed(
    scenario: &Scenario,
    seed: u64,
    real: Option<&crate::learn::loaders::RealData>,
    pool: &rayon::ThreadPool,
    dir: &Path,
    bar: &ProgressBar,
) -> Result<SeedRun, SimError> {
    let Setup {
        fed,
        spec,
        learners,
        init,
    } = setup(scenario, seed, real)?;
    write_json(&dir.join("partition.json"), &fed.report())?;
    let regression = spec.is_regression();
    let num_params = init[0].len();
    let mut ctx = Ctx {
        scenario,
        fed: &fed,
        seed,
        learners,
        pool,
    };
    let groups = fed.groups();
    let wants = |a| scenario.algorithms.contains(&a);

    let mut local = wants(Algorithm::Local).then(|| LocalRun::new(&ctx, &init));
    let mut fedavg = (wants(Algorithm::Fedavg) || wants(Algorithm::FedavgPlus))
        .then(|| FedAvgRun::new(&ctx, &init));
    // A fault schedule applies to FedeRiCo; the same run without faults is kept beside it for
    // the recovery check.
    let schedule = scenario.fault_schedule()?;
    let faulty = !schedule.events.is_empty();
    let mut fedrc = wants(Algorithm::Federico).then(|| {
        let run = FedericoRun::new(&ctx, &init);
        if faulty {
            run.with_faults(schedule.clone(), scenario.rounds as u64, seed)
        } else {
            run
        }
    });
    let mut fault_free =
        (faulty && schedule.config.baseline).then(|| FedericoRun::new(&ctx, &init));
    let mut fault_free_finals = None;
    let mut coordinated: Vec<(Algorithm, Box<dyn coordinated::CoordinatedRun>)> = scenario
        .algorithms
        .iter()
        .filter_map(|&a| coordinated::build(a, &ctx, &init).map(|r| (a, r)))
        .collect();
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
        if round % scenario.eval_every == 0 || round == scenario.rounds {
            for &a in &algorithms {
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
        }
        let rounds_scored: Vec<AlgorithmRound> =
            scored.iter().map(|s| to_round(s, regression)).collect();
        for (r, (_, pts)) in rounds_scored.iter().zip(curves.iter_mut()) {
            pts.push((round, r.accuracy.or(r.mse).unwrap_or(f64::NAN)));
        }
        let federico = fedrc.as_ref().map(|run| {
            let weights = run.weight_matrix();
            let mass = groups.as_deref().map(|g| same_group_mass(&weights, g));
            last_mass = mass;
            FedericoRound {
                sampled: run
                    .last_sampled
                    .iter()
                    .map(|s| s.iter().map(|n| n.0).collect())
                    .collect(),
                same_group_mass: mass,
                weights,
            }
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
            })
            .collect(),
        faults: None,
    };
    let mut summary = summary;
    if let Some(f) = fedrc.as_ref().and_then(|r| r.faults.as_ref()) {
        let report = fault_report(scenario, f, groups.as_deref(), fault_free_finals.as_deref());
        write_fault_files(dir, f, &report)?;
        summary.faults = Some(serde_json::to_value(&report).map_err(|e| SimError::Io {
            path: dir.join("summary.json"),
            source: e.into(),
        })?);
    }
    write_json(&dir.join("summary.json"), &summary)?;
    for (a, run) in &coordinated {
        if let Some(record) = run.record() {
            write_json(&dir.join(format!("{}.json", a.name())), &record)?;
        }
    }
    write_seed_plots(
        scenario,
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

/// The checks of a faulty FedeRiCo run; the round budget is τ_model + τ_grad (the simulator's
/// rounds cost only their waits).
fn fault_report(
    scenario: &Scenario,
    f: &faults::FaultSim,
    groups: Option<&[usize]>,
    fault_free: Option<&[ClientEval]>,
) -> checks::Report {
    let baseline: Option<Vec<Option<EvalRecord>>> =
        fault_free.map(|v| v.iter().map(|&e| Some(e.into())).collect());
    checks::evaluate(&checks::Inputs {
        schedule: &f.schedule,
        applied: &f.applied,
        traces: &f.traces,
        groups,
        baseline: baseline.as_deref(),
        round_budget_s: f.tau_model + f.tau_grad,
        stall_after: 1.0,
        suspect_after: scenario.federico.suspect_after,
        crashes: &f.crashes,
        exits: None,
    })
}

/// `faults.txt` (the printed report) and `traces.jsonl` (every silo's per-round record, as
/// nodes write them) in the seed's directory.
fn write_fault_files(
    dir: &Path,
    f: &faults::FaultSim,
    report: &checks::Report,
) -> Result<(), SimError> {
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

/// Each silo's final test score of the scenario's FedeRiCo run *without* its faults, for the
/// swarm's recovery check (the fault-free swarm makes the simulator's decisions bit for bit).
pub fn fault_free_finals(
    scenario: &Scenario,
    seed: u64,
    data_dir: Option<&Path>,
) -> Result<Vec<Option<EvalRecord>>, SimError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| SimError::Threads {
            threads,
            reason: e.to_string(),
        })?;
    let real = scenario.load_real(scenario.data_dir(data_dir).as_deref())?;
    let Setup {
        fed,
        learners,
        init,
        ..
    } = setup(scenario, seed, real.as_ref())?;
    let mut ctx = Ctx {
        scenario,
        fed: &fed,
        seed,
        learners,
        pool: &pool,
    };
    let mut run = FedericoRun::new(&ctx, &init);
    for _ in 0..scenario.rounds {
        run.round(&mut ctx)?;
    }
    Ok(run
        .evaluate(&mut ctx)?
        .into_iter()
        .map(|e| Some(e.into()))
        .collect())
}

/// One seed's FedeRiCo run held in memory and stepped by the caller, for benchmarks: a full
/// round, or only the model passes a round makes, to measure what the algorithm adds.
pub struct RoundBench {
    scenario: Scenario,
    fed: Federation,
    pool: rayon::ThreadPool,
    learners: Vec<Learner>,
    init: Vec<Vec<f32>>,
    run: Option<FedericoRun>,
    seed: u64,
}

impl RoundBench {
    /// Builds seed `seed` of `scenario` with `threads` workers.
    pub fn new(
        scenario: &Scenario,
        seed: u64,
        threads: usize,
        data_dir: Option<&Path>,
    ) -> Result<Self, SimError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| SimError::Threads {
                threads,
                reason: e.to_string(),
            })?;
        let real = scenario.load_real(scenario.data_dir(data_dir).as_deref())?;
        let Setup {
            fed,
            learners,
            init,
            ..
        } = setup(scenario, seed, real.as_ref())?;
        let mut bench = Self {
            scenario: scenario.clone(),
            fed,
            pool,
            learners,
            init,
            run: None,
            seed,
        };
        let init = bench.init.clone();
        let ctx = bench.ctx();
        let run = FedericoRun::new(&ctx, &init);
        bench.learners = ctx.learners;
        bench.run = Some(run);
        Ok(bench)
    }

    fn ctx(&mut self) -> Ctx<'_> {
        Ctx {
            scenario: &self.scenario,
            fed: &self.fed,
            seed: self.seed,
            learners: std::mem::take(&mut self.learners),
            pool: &self.pool,
        }
    }

    /// Parameters per model.
    pub fn num_params(&self) -> usize {
        self.init[0].len()
    }

    /// One whole FedeRiCo round: sampling, E-step, weighted gradients, one step per model.
    pub fn federico_round(&mut self) -> Result<(), SimError> {
        let mut run = self.run.take().expect("set in new");
        let mut ctx = self.ctx();
        let res = run.round(&mut ctx);
        self.learners = ctx.learners;
        self.run = Some(run);
        res
    }

    /// Only the model compute of a round with M = `neighbours`: every silo computes loss and
    /// summed gradient of M + 1 models on its training data, in parallel, with no algorithm.
    /// Scheduled as the round schedules its own compute ([`par_silos`]).
    pub fn compute_only(&mut self) -> Result<(), SimError> {
        let m = self.scenario.federico.neighbours;
        let k = self.fed.clients.len();
        let init = std::mem::take(&mut self.init);
        let mut ctx = self.ctx();
        let fed = ctx.fed;
        let out = par_silos(&mut ctx, |i, l| {
            for b in 0..=m {
                l.loss_and_grad(&init[(i + b) % k], &fed.clients[i].train, None)?;
            }
            Ok::<(), SimError>(())
        });
        self.learners = ctx.learners;
        self.init = init;
        out.into_iter().collect()
    }
}
