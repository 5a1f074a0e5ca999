//! The in-process simulator: all silos of a federation in one process, round by round,
//! deterministic for a seed (`federico simulate`).
//!
//! Owns: building each run (split, learners, identical initial weights for every algorithm),
//! the seed loop and the worker pool, the fault-free baseline and the round benchmark; each
//! seed's rounds, evaluations and files are `seed.rs`'s, the parallel loops over silos
//! `pool.rs`'s, and the summaries over seeds [`crate::report::summary`]'s.
//! Must not: make algorithm decisions: FedeRiCo's live in [`crate::core`], and the baselines'
//! per-round work is the plain recipe of spec §8.3.

mod baselines;
mod coordinated;
mod engines;
mod fedcollab;
mod feddisco;
mod federico;
mod hcct;
mod mail;
mod members;
mod network;
mod pool;
mod seed;

use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Evaluation, Federation, LearnError, Learner, ModelSpec};
use crate::report::plots;
pub use crate::report::summary::Outcome;
use crate::report::summary::{Curves, Report, ReportError, write_summary};
use crate::scenario::{Algorithm, Scenario, ScenarioError};
use crate::silo::SiloError;
use crate::trace::EvalRecord;
use federico::FedericoRun;
use indicatif::{ProgressBar, ProgressStyle};
use pool::par_silos;
use rand::SeedableRng;
use rand::rngs::StdRng;
use seed::run_seed;
use std::path::{Path, PathBuf};

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
            // A run's own files only: the simulator just wrote its run log.
            e @ (ReportError::RunLog { .. } | ReportError::Input(_)) => {
                SimError::Invariant(e.to_string())
            }
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
    /// Write every silo's final predictor of every algorithm to take home
    /// (`seed-<s>/models/<algorithm>/silo-<i>/model.json`, as a node's `model.json`).
    pub export: bool,
    /// Play a curious member at the end of each seed: membership inference on every silo's own
    /// FedeRiCo model ([`crate::privacy::audit`]).
    pub audit: bool,
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
    /// Set while the last round is scored under `simulate --export`: the predictors scored
    /// are written too.
    export: Option<pool::ExportTo>,
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
    /// FedeRiCo's sub-steps per round in this federation, the round engine's and the owner's
    /// own ([`crate::core::Steps`]): an epoch counts the largest silo's batches.
    fn federico_steps(&self) -> crate::core::Steps {
        let epoch = self.fed.epoch_steps(self.batch_size());
        self.scenario.federico.mstep().steps(epoch)
    }
}

/// Algorithms in table order.
fn ordered(algs: &[Algorithm]) -> Vec<Algorithm> {
    let mut a = algs.to_vec();
    a.sort();
    a
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
    // Data first: a missing or bad file stops the run before anything is written.
    let data_dir = scenario.data_dir(opts.data_dir.as_deref());
    let real = scenario.load_real(data_dir.as_deref())?;
    // The first seed's split too (cheap next to training): sizes that cannot be met
    // (data.samples, too few samples for a silo) also stop the run with nothing written.
    scenario.federation(real.as_ref(), &mut Scenario::data_rng(scenario.seeds[0]))?;
    std::fs::create_dir_all(&opts.out).map_err(io_err(&opts.out))?;

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
        let r = run_seed(scenario, seed, real.as_ref(), &pool, &dir, &bar, opts)?;
        meta.get_or_insert((r.spec.clone(), r.num_params, r.clients, r.regression));
        curves.push(r.curves);
        runs.push(r.summary);
    }
    bar.finish_and_clear();
    let (spec, num_params, clients, regression) = meta.expect("seeds is validated non-empty");
    let report = Report {
        spec: Some(spec),
        num_params,
        clients,
        regression,
        runs,
        curves,
    };
    Ok(write_summary(
        &scenario.name,
        scenario.rounds,
        &opts.out,
        &algorithms,
        report,
    )?)
}

/// What every run of a seed starts from.
struct Setup {
    fed: Federation,
    /// The constants `fed`'s features were standardized with, if any (`data.standardize`).
    scale: Option<crate::learn::FeatureScale>,
    spec: ModelSpec,
    /// One learner workspace per silo.
    learners: Vec<Learner>,
    /// Silo i's initial weights, identical for every algorithm.
    init: Vec<Vec<f32>>,
}

/// Runs `f` with a context for `s` at `seed` (2 worker threads) and the silos' initial
/// models: the unit tests' way to drive one run by hand.
#[cfg(test)]
pub(crate) fn with_ctx<R>(
    s: &Scenario,
    seed: u64,
    f: impl FnOnce(&mut Ctx<'_>, &[Vec<f32>]) -> R,
) -> R {
    let setup = setup(s, seed, None).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut ctx = Ctx {
        scenario: s,
        fed: &setup.fed,
        seed,
        learners: setup.learners,
        pool: &pool,
        export: None,
    };
    f(&mut ctx, &setup.init)
}

/// Draws the seed's split and the silos' initial weights (each from its own (seed, node) stream).
fn setup(
    scenario: &Scenario,
    seed: u64,
    real: Option<&crate::scenario::Loaded>,
) -> Result<Setup, SimError> {
    let (fed, scale) = scenario.federation_scaled(real, &mut Scenario::data_rng(seed))?;
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
        scale,
        spec,
        learners,
        init,
    })
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
        export: None,
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
            export: None,
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
