//! The command line: clap types and what each subcommand calls in the library.
//! Owns: flags, their precedence over scenario fields, and printing results.
//! Must not: hold algorithm or simulation logic.

use crate::scenario::Scenario;
use crate::sim;
use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// federico: decentralized personalized federated learning.
#[derive(Debug, Parser)]
#[command(name = "federico", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a scenario in-process: all silos in one process, lock-step rounds, deterministic.
    Simulate(SimulateArgs),
}

/// `federico simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// The scenario file (TOML), e.g. simulations/quickstart.toml.
    pub scenario: PathBuf,
    /// Output directory [default: runs/<scenario name>].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run this single seed instead of the scenario's list.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run this many rounds instead of the scenario's.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Data directory with mnist/, fashion-mnist/, cifar-10/... [env: FEDERICO_DATA_DIR].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Worker threads (0 = all cores) instead of the scenario's.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Override a scenario field, e.g. `--set federico.loss_scale=10` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Simulate(args) => simulate(args),
    }
}

fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    let mut scenario = Scenario::load_with(&args.scenario, &args.set)
        .with_context(|| format!("loading scenario {}", args.scenario.display()))?;
    if let Some(seed) = args.seed {
        scenario.seeds = vec![seed];
    }
    if let Some(rounds) = args.rounds {
        scenario.rounds = rounds;
    }
    if let Some(threads) = args.threads {
        scenario.threads = threads;
    }
    scenario.validate().context("command-line overrides")?;
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from("runs").join(&scenario.name));
    let started = std::time::Instant::now();
    let outcome = sim::run(
        &scenario,
        &sim::Options {
            out: out.clone(),
            data_dir: args.data_dir,
            progress: !args.quiet,
        },
    )
    .with_context(|| format!("simulating {}", scenario.name))?;
    let mut text = format!(
        "{}: {} silos, {} rounds, {} seed(s), model with {} parameters, {:.1} s\n{}",
        scenario.name,
        outcome.summary.clients,
        scenario.rounds,
        scenario.seeds.len(),
        outcome.summary.num_params,
        started.elapsed().as_secs_f64(),
        outcome.table
    );
    if let Some(m) = outcome
        .summary
        .algorithms
        .iter()
        .find_map(|a| a.same_group_mass)
    {
        text += &format!("FedeRiCo weight on same-group peers (self included): {m:.3}\n");
    }
    text += &format!(
        "results in {}/ (summary.json, table.txt, seed-*/rounds.jsonl, plots *.svg)\n",
        out.display()
    );
    // A reader that went away (`| head`) is not an error: the results are on disk.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(())
}
