//! The command line: clap types and what each subcommand calls in the library.
//! Owns: flags, their precedence over scenario fields, and printing results.
//! Must not: hold algorithm or simulation logic.

mod data;
mod scale;
mod suite;

pub use data::{DataArgs, DataCommand, DataDownloadArgs, DataVerifyArgs};
pub use suite::SuiteArgs;

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
    #[command(after_help = "Examples:
  federico simulate simulations/quickstart.toml
  federico simulate simulations/quickstart.toml --seed 1 --rounds 20 --out runs/try
  federico simulate simulations/own-csv.toml --set federico.epsilon=0.1 --export")]
    Simulate(SimulateArgs),
    /// Write a new silo keypair (its peer ID is printed; put it in the manifest).
    #[command(after_help = "Examples:
  federico keygen --out keys/hospital-a.key    # prints the peer ID for the manifest")]
    Keygen(KeygenArgs),
    /// Write one data shard per silo from a scenario's split, for `federico node`.
    #[command(after_help = "Examples:
  federico partition simulations/quickstart.toml --out shards
  federico partition simulations/quickstart.toml --seed 2 --out shards-seed2")]
    Partition(PartitionArgs),
    /// Write a federation of N silos that runs on this machine as printed: keys, a manifest,
    /// shards and one node config per silo (distinct ports on 127.0.0.1). It starts nothing:
    /// start each silo with the `federico node` command it prints.
    #[command(after_help = "Examples:
  federico init 3 --out federation
  federico init 4 --out clinics --scenario simulations/own-csv.toml --port 5001")]
    Init(InitArgs),
    /// Run one peer (a silo) over libp2p until its rounds are done or it is stopped.
    #[command(after_help = "While it runs:
  Ctrl-C (SIGINT) or SIGTERM stops it; the last checkpoint stands, and the same command
  resumes from it (only the round in flight is lost).
  kill -USR1 <pid> asks for the model now: the round in progress ends with an evaluation and
  <state_dir>/model.json is written (federico predict --model <state_dir>/model.json ...).
  Before round 1 it waits deadlines.start_s (60 s) for every member; with some there it
  starts, and with no peer at all it keeps waiting, saying so every start_s, for a silo
  alone is no federation (deadlines.alone_s lets it train alone after that many seconds).
  A port another process holds, or a state_dir another federico uses, stops it at once.

Examples:
  federico node --config federation/silo-0.toml
  federico node --config federation/silo-0.toml --log-json > silo-0.jsonl")]
    Node(NodeArgs),
    /// Predict with a model a node exported (`<state_dir>/model.json`): predictions as CSV on
    /// stdout, accuracy on stderr.
    #[command(after_help = "Examples:
  federico predict --model federation/state/silo-0/model.json --data federation/shards/silo-0.shard
  federico predict --model clinics/state/silo-0/model.json --data new-patients.csv --out predictions.csv
  federico predict --model runs/digits/seed-1/models/federico/silo-2/model.json --data my-images/")]
    Predict(PredictArgs),
    /// Run the thin FedDisco, HCCT, FedSaC or FedCollab coordinator as a peer of the federation.
    #[command(
        after_help = "Stop it with Ctrl-C (SIGINT); it resumes from its checkpoint.

Examples:
  federico coordinator --config node-config/coordinator.toml
  (docs/coordinator-mode.md: the coordinated nodes' configs, and `federico swarm` with a
  coordinator-mode scenario)"
    )]
    Coordinator(CoordinatorArgs),
    /// Run a circuit relay for silos behind NAT: members reserve a slot on it and reach each
    /// other through it (hole punching then makes the connections direct where the NATs allow).
    /// It holds no data and need not be a member; only the manifest's members may use it.
    #[command(after_help = "Stop it with Ctrl-C (SIGINT) or SIGTERM.

Examples:
  federico keygen --out keys/relay.key
  federico relay --key keys/relay.key --manifest manifest.toml \\
      --listen /ip4/0.0.0.0/tcp/4100 --external /ip4/203.0.113.7/tcp/4100
  (it prints the address to add to the manifest's `relays`; docs/federation.md)")]
    Relay(RelayArgs),
    /// Run a scenario as N real node processes on 127.0.0.1 (FedeRiCo peer to peer, or FedDisco,
    /// HCCT, FedSaC or FedCollab with a coordinator process) and report like simulate.
    #[command(after_help = "Examples:
  federico swarm simulations/quickstart.toml --seed 1
  federico swarm simulations/partition-heal.toml --seed 1")]
    Swarm(SwarmArgs),
    /// Download the standard data sets (MNIST, Fashion-MNIST, CIFAR-10, optdigits) into a data
    /// directory, or check the ones there against their published SHA-256s.
    #[command(after_help = "Examples:
  federico data download fashion-mnist
  federico data download all --data-dir /srv/data
  federico data verify")]
    Data(DataArgs),
    /// Write the summary, table and plots that swarm writes from hand-started nodes' run logs
    /// (their state directories, or the federation folder `init` wrote), or again from a
    /// simulate or swarm run directory.
    #[command(after_help = "Examples:
  federico report federation
  federico report federation/state/silo-0 federation/state/silo-1 --out my-report
  federico report runs/quickstart")]
    Report(ReportArgs),
    /// Run a quality suite: a grid of simulate runs (data sets × splits × training samples per
    /// silo, FedeRiCo variants beside them) and one table over it (`<out>/table.md`).
    #[command(after_help = "Examples:
  federico suite simulations/quality/suite.toml --list
  federico suite simulations/quality/suite.toml --only fmnist --no-variants")]
    Suite(SuiteArgs),
    /// The federation's feature constants (`scale.json`) without sharing rows: `summarize`
    /// one silo's training CSV per column, then `combine` every silo's summary.
    #[command(after_help = "Examples:
  federico scale summarize train.csv --label-column diagnosis --out site-0.sums.json
  federico scale combine site-0.sums.json site-1.sums.json --out scale.json")]
    Scale(scale::ScaleArgs),
}

/// `federico report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The state directories of one run's silos (each with rounds.jsonl), or a federation
    /// folder from `federico init` (its state/*/ are read), or one simulate/swarm run directory.
    #[arg(required = true, value_name = "RUN_DIR")]
    pub inputs: Vec<PathBuf>,
    /// Output folder [default: report/ in the federation or run folder (for state directories
    /// outside one, in the current folder), or report-2/, -3/, … when taken]; an explicit one
    /// must be missing or empty.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `federico swarm`.
#[derive(Debug, clap::Args)]
pub struct SwarmArgs {
    /// The scenario file (TOML).
    pub scenario: PathBuf,
    /// Run directory [default: runs/<scenario name>-swarm, or -2, -3, … when taken]; an
    /// explicit one must be missing or empty (a run never overwrites another).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run this single seed instead of the scenario's list.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run this many rounds instead of the scenario's.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Data directory [env: FEDERICO_DATA_DIR].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Override a scenario field (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Linux, as root: run each node in its own network namespace, joined by veth links, and
    /// cut partitions in the kernel (blackhole routes) instead of by the nodes' block lists.
    #[arg(long)]
    pub netns: bool,
    /// Linux, as root, with nft: put the silos at SITES sites behind NAT (a router per site
    /// masquerades its LAN and lets nothing in), with a `federico relay` on the public side,
    /// the only open port; silos reach each other through it and punch holes where they can.
    #[arg(long, value_name = "SITES", value_parser = clap::value_parser!(u64).range(1..=16))]
    pub nat: Option<u64>,
}

/// `federico keygen`.
#[derive(Debug, clap::Args)]
pub struct KeygenArgs {
    /// Where to write the key (never overwritten).
    #[arg(long)]
    pub out: PathBuf,
}

/// `federico init`.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Number of silos (at least 2).
    pub silos: usize,
    /// The folder to write (must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// Cut the silos' shards from this scenario's data and split [default: the quick start's
    /// synthetic label groups, with split.clients = N].
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// The federation's run seed [default: the scenario's first seed].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Silo i listens on 127.0.0.1 at this port + i.
    #[arg(long, default_value_t = 4001)]
    pub port: u16,
    /// Data directory [env: FEDERICO_DATA_DIR].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Override a scenario field (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// `federico predict`.
#[derive(Debug, clap::Args)]
pub struct PredictArgs {
    /// The exported model: a node's `<state_dir>/model.json` (or the `.safetensors` beside it).
    #[arg(long)]
    pub model: PathBuf,
    /// The data: a `.shard` file, a `.csv` file, IDX images and labels (two files), or CIFAR-10
    /// `.bin` batches.
    #[arg(long, num_args = 1.., required = true)]
    pub data: Vec<PathBuf>,
    /// The data's format [default: from the file names].
    #[arg(long, value_enum)]
    pub format: Option<PredictFormat>,
    /// CSV: the label column, a header name or a 0-based position [default: the last, when
    /// a row has one column more than the model's features; rows as wide as the model's
    /// input have no label, and are only predicted]
    #[arg(long)]
    pub label_column: Option<crate::learn::loaders::Column>,
    /// The federation's class names in class-id order, comma-separated (a node's
    /// `data.class_names`): CSV labels and image folders are read by them and predictions
    /// written with them [default: those in the model's card, where its labels had names;
    /// images: else the folder's class sub-folders, sorted]
    #[arg(long, value_delimiter = ',')]
    pub class_names: Option<Vec<String>>,
    /// Shards: predict on the training split instead of the test split.
    #[arg(long)]
    pub train_split: bool,
    /// The feature constants to apply to the rows read before predicting (a `scale.json`, as
    /// `init`/`partition` write beside the shards and `simulate` per seed where
    /// `data.standardize` is on) [default: those in the model's card, which a model trained on
    /// standardized columns carries]. Not for shards, which hold standardized rows.
    #[arg(long)]
    pub scale: Option<PathBuf>,
    /// Write the predictions here instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Data formats `predict` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PredictFormat {
    /// A shard file.
    Shard,
    /// CSV.
    Csv,
    /// IDX images + labels.
    Idx,
    /// CIFAR-10 binary batches.
    Cifar10,
    /// A folder of class sub-folders of PNG/JPEG images.
    Images,
}

/// `federico partition`.
#[derive(Debug, clap::Args)]
pub struct PartitionArgs {
    /// The scenario file whose data and split to use.
    pub scenario: PathBuf,
    /// Directory for `silo-<i>.shard` files and `partition.json`.
    #[arg(long)]
    pub out: PathBuf,
    /// The seed of the split [default: the scenario's first seed].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Data directory [env: FEDERICO_DATA_DIR].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Override a scenario field (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// `federico node`.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// The node's config (TOML), e.g. federation/silo-0.toml from `federico init`. Relative
    /// paths in it are relative to the file.
    #[arg(long)]
    pub config: PathBuf,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long)]
    pub log_json: bool,
}

/// `federico coordinator`.
#[derive(Debug, clap::Args)]
pub struct CoordinatorArgs {
    /// The coordinator's config (TOML), e.g. node-config/coordinator.toml. Relative paths in
    /// it are relative to the file.
    #[arg(long)]
    pub config: PathBuf,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long)]
    pub log_json: bool,
}

/// `federico relay`.
#[derive(Debug, clap::Args)]
pub struct RelayArgs {
    /// The relay's key (`federico keygen`), not a member's.
    #[arg(long)]
    pub key: PathBuf,
    /// The federation's manifest: only its members may use the relay.
    #[arg(long)]
    pub manifest: PathBuf,
    /// Where to listen (repeat for more).
    #[arg(long, default_values_t = ["/ip4/0.0.0.0/tcp/4100".to_string(), "/ip4/0.0.0.0/udp/4100/quic-v1".to_string()])]
    pub listen: Vec<String>,
    /// The address silos dial the relay at, its public one (repeat for more) [default: the
    /// listen addresses that name a concrete IP].
    #[arg(long)]
    pub external: Vec<String>,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long)]
    pub log_json: bool,
}

/// `federico simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// The scenario file (TOML), e.g. simulations/quickstart.toml.
    pub scenario: PathBuf,
    /// Output directory [default: runs/<scenario name>, or -2, -3, … when taken]; an explicit
    /// one must be missing or empty (a run never overwrites another).
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
    /// Also write every silo's final model of every algorithm, to take home or predict with
    /// (`<out>/seed-<s>/models/<algorithm>/silo-<i>/model.json`, as a node writes).
    #[arg(long)]
    pub export: bool,
    /// Play a curious member at the end: membership inference (a loss threshold) on every silo's
    /// own FedeRiCo model, its training rows against its held-out rows, as an AUC and the ε it
    /// proves (`docs/privacy.md`).
    #[arg(long)]
    pub audit: bool,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    if !matches!(
        cli.command,
        Command::Node(_) | Command::Coordinator(_) | Command::Relay(_)
    ) {
        init_warnings();
    }
    match cli.command {
        Command::Simulate(args) => simulate(args),
        Command::Keygen(args) => keygen(args),
        Command::Partition(args) => partition(args),
        Command::Init(args) => init(args),
        Command::Node(args) => node(args),
        Command::Predict(args) => predict(args),
        Command::Coordinator(args) => coordinator(args),
        Command::Relay(args) => relay(args),
        Command::Swarm(args) => swarm(args),
        Command::Data(args) => match args.command {
            DataCommand::Download(args) => data::download(args),
            DataCommand::Verify(args) => data::verify(args),
        },
        Command::Report(args) => report(args),
        Command::Suite(args) => suite::suite(args),
        Command::Scale(args) => scale::scale(args),
    }
}

fn report(args: ReportArgs) -> anyhow::Result<()> {
    let reported = crate::report::gather::report(&args.inputs, args.out.as_deref())?;
    for w in &reported.warnings {
        eprintln!("warning: {w}");
    }
    let summary = &reported.outcome.summary;
    let mut text = format!(
        "{} (report of {}): {} silos, {} rounds, {} seed(s)\n{}",
        summary.scenario,
        reported.source,
        summary.clients,
        summary.rounds,
        summary.seeds.len(),
        reported.outcome.table
    );
    text += &same_group_line(&reported.outcome);
    text += &fault_lines(&reported.outcome);
    text += &format!(
        "report in {}/ (summary.json, table.txt, {metric}.svg and .png, seed-*/)\n",
        reported.out.display(),
        metric = summary.metric
    );
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(())
}

fn swarm(args: SwarmArgs) -> anyhow::Result<()> {
    let scenario = load_scenario(&args.scenario, &args.set, args.seed, args.rounds, |_| {})?;
    // A swarm run's folder also holds checkpoints that a second run would resume from.
    let default = PathBuf::from("runs").join(format!("{}-swarm", scenario.name));
    let out =
        crate::store::fresh_folder(args.out.as_deref(), &default).map_err(anyhow::Error::msg)?;
    let started = std::time::Instant::now();
    let outcome = crate::launch::swarm(
        &scenario,
        &crate::launch::SwarmOptions {
            out: out.clone(),
            data_dir: args.data_dir,
            exe: std::env::current_exe().context("locating the federico executable")?,
            progress: !args.quiet,
            deadlines: Default::default(),
            timeout: std::time::Duration::from_secs(args.timeout),
            netns: args.netns,
            nat: args.nat.map(|s| s as usize),
            baseline: Some(|scenario, seed, data_dir| {
                Ok(sim::fault_free_finals(scenario, seed, data_dir)?)
            }),
        },
    )
    .with_context(|| format!("swarm of {}", scenario.name))?;
    let mut text = format!(
        "{} (swarm): {} node processes, {} rounds, {} seed(s), {:.1} s\n{}",
        scenario.name,
        outcome.summary.clients,
        scenario.rounds,
        scenario.seeds.len(),
        started.elapsed().as_secs_f64(),
        outcome.table
    );
    text += &same_group_line(&outcome);
    text += &fault_lines(&outcome);
    for seed in &scenario.seeds {
        let path = out.join(format!("seed-{seed}/swarm.json"));
        if let Ok(f) = std::fs::read_to_string(&path)
            .map_err(anyhow::Error::from)
            .and_then(|t| Ok(serde_json::from_str::<crate::launch::SwarmFigures>(&t)?))
        {
            text += &format!(
                "seed {seed}: median round {:.3} s; sent per node per round {:.0} B = {:.3}x the payload minimum 2*M*4d ({:.0} B) ({:.3}x with stream negotiation); node RSS max {:.0} MiB; all nodes through round 1 after {:.1} s\n",
                f.median_round_seconds,
                f.message_bytes,
                f.message_ratio,
                f.payload_min_bytes,
                f.stream_ratio,
                f.max_rss_mib,
                f.first_round_seconds
            );
            if let Some(p) = f.paths {
                text += &format!(
                    "seed {seed}: members connected at the end, summed over the nodes: {} directly, {} through a relay only; hole punches: {} succeeded, {} failed\n",
                    p.direct, p.relayed, p.hole_punched, p.hole_punch_failed
                );
            }
        }
    }
    let logs = if scenario
        .algorithms
        .contains(&crate::scenario::Algorithm::Federico)
    {
        "seed-*/rounds.jsonl, seed-*/nodes/*.log"
    } else {
        "seed-*/coordinator/coordinator.jsonl, seed-*/nodes/silo-*/rounds.jsonl, seed-*/nodes/*.log"
    };
    text += &format!(
        "results in {}/ (summary.json, table.txt, seed-*/swarm.json, {logs}, plots)\n",
        out.display()
    );
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(())
}

fn keygen(args: KeygenArgs) -> anyhow::Result<()> {
    let key = crate::net::keygen(&args.out)?;
    println!("{}", key.public().to_peer_id());
    Ok(())
}

/// Reads a scenario with its `--set` overrides; every message names the file (or the flag) once.
fn read_scenario(path: &std::path::Path, set: &[String]) -> anyhow::Result<Scenario> {
    use crate::scenario::ScenarioError;
    Scenario::load_with(path, set).map_err(|e| match e {
        ScenarioError::Io { .. } | ScenarioError::Parse { .. } => anyhow::Error::new(e),
        other => anyhow::Error::new(other).context(format!("scenario {}", path.display())),
    })
}

fn init(args: InitArgs) -> anyhow::Result<()> {
    let n = args.silos;
    let mut set = vec![format!("split.clients={n}")];
    let scenario = match &args.scenario {
        Some(path) => {
            // Natural partitions: the data says how many silos there are, and the N typed
            // here must agree (a message about split.clients would blame a field nobody wrote).
            let plain = read_scenario(path, &args.set)?;
            if plain.data.source.is_own() && plain.natural() {
                let m = plain.split.clients;
                if m != n {
                    anyhow::bail!(
                        "init {n}: the data of {} comes as {m} silos (data.silos or \
                         data.silo_column), so its federation has {m}: run `federico init {m} \
                         --scenario {}` with the rest of the command as it was",
                        path.display(),
                        path.display()
                    );
                }
                plain
            } else {
                set.extend(args.set.iter().cloned());
                read_scenario(path, &set)?
            }
        }
        None => {
            // The quick start's federation, cut to N silos. Below 6 silos one label group: with
            // 3 silos in 2 groups FedeRiCo's weights stay uniform and it ends far below Local
            // (seed 1: 48.0 % against 83.0 %; one group: 91.2 % against 84.5 %).
            set.push(format!("split.groups={}", if n >= 6 { 2 } else { 1 }));
            set.push(format!(
                "federico.neighbours={}",
                n.saturating_sub(1).clamp(1, 3)
            ));
            set.extend(args.set.iter().cloned());
            Scenario::parse_with(crate::launch::DEFAULT_SCENARIO, &set)
                .context("the built-in quick-start scenario")?
        }
    };
    let seed = args.seed.unwrap_or(scenario.seeds[0]);
    let done = crate::launch::init(
        &scenario,
        seed,
        args.data_dir.as_deref(),
        &args.out,
        args.port,
    )?;
    let mut text = format!(
        "a federation of {n} silos ({} data, seed {seed}) in {}/: keys/, manifest.toml, shards/, \
         silo-<i>.toml\nstart each silo, in its own terminal:\n",
        scenario.name,
        args.out.display()
    );
    for (cfg, addr) in done.configs.iter().zip(&done.addrs) {
        text += &format!("  federico node --config {}    # {addr}\n", cfg.display());
    }
    text += "each writes its run log to state/silo-<i>/rounds.jsonl beside its config; the comments \
             in manifest.toml say what to change for real hosts\n";
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(())
}

fn predict(args: PredictArgs) -> anyhow::Result<()> {
    use crate::learn::Labels;
    use crate::learn::export::{self, Input};
    let (model, mut learner) = export::read(&args.model)?;
    let files = &args.data;
    let format = match args.format {
        Some(f) => f,
        None => {
            let ext = |p: &PathBuf| {
                p.extension()
                    .map(|e| e.to_string_lossy().to_lowercase())
                    .unwrap_or_default()
            };
            match ext(&files[0]).as_str() {
                "shard" => PredictFormat::Shard,
                "csv" => PredictFormat::Csv,
                "bin" => PredictFormat::Cifar10,
                _ if files.len() == 1 && files[0].is_dir() => PredictFormat::Images,
                _ if files.len() == 2 => PredictFormat::Idx,
                _ => anyhow::bail!(
                    "cannot tell the format of {} from its name: give --format",
                    files[0].display()
                ),
            }
        }
    };
    let one = |what: &str| -> anyhow::Result<PathBuf> {
        match files.as_slice() {
            [f] => Ok(f.clone()),
            _ => anyhow::bail!("--format {what} takes one --data file, got {}", files.len()),
        }
    };
    let input = match format {
        PredictFormat::Shard => Input::Shard {
            path: one("shard")?,
            train: args.train_split,
        },
        PredictFormat::Csv => Input::Csv {
            path: one("csv")?,
            label_column: args.label_column,
        },
        PredictFormat::Idx => match files.as_slice() {
            [images, labels] => Input::Idx {
                images: images.clone(),
                labels: labels.clone(),
            },
            _ => anyhow::bail!("--format idx takes two --data files: images, then labels"),
        },
        PredictFormat::Cifar10 => Input::Cifar10(files.clone()),
        PredictFormat::Images => Input::Images {
            dir: one("images")?,
            class_names: args.class_names.clone(),
        },
    };
    let (names, from) = match (&args.class_names, &model.card.class_names) {
        (Some(n), _) => (Some(n), "--class-names".to_string()),
        (None, Some(n)) => (Some(n), format!("{}'s class_names", args.model.display())),
        (None, None) => (None, String::new()),
    };
    if let Some(names) = names
        && names.len() != learner.outputs()
    {
        anyhow::bail!(
            "{from} lists {} names, but the model has {} classes",
            names.len(),
            learner.outputs()
        );
    }
    let inputs = model.card.input_shape.iter().product();
    let rows = input.load(inputs, learner.outputs(), names.map(Vec::as_slice))?;
    let labelled = rows.labelled;
    let mut data = rows.data;
    // A model that learned on standardized columns carries their constants; new rows come in
    // their own units. A shard's rows were standardized when it was written.
    let scale = match (&args.scale, format == PredictFormat::Shard) {
        (Some(_), true) => anyhow::bail!(
            "--scale is for rows in their own units: {} is a shard, whose rows were \
             standardized when it was written; drop --scale",
            files[0].display()
        ),
        (Some(path), false) => Some((crate::learn::FeatureScale::read(path)?, path)),
        (None, false) => model.card.scale.clone().map(|s| (s, &args.model)),
        (None, true) => None,
    };
    if let Some((scale, from)) = scale {
        scale
            .apply_checked(&mut data, &files[0].display().to_string())
            .with_context(|| format!("the feature scale in {}", from.display()))?;
    }
    let mixed = model.predict(&mut learner, &data)?;
    let width = learner.outputs();
    let mut text = String::new();
    let mut correct = 0usize;
    // A class by its name where the model's labels had names, else by its id.
    let class = |id: usize| match names {
        Some(n) => csv_cell(&n[id]),
        None => id.to_string(),
    };
    match &data.labels {
        Labels::Class { ids, .. } => {
            // The label before the probability, as before the probability was added.
            text += if labelled {
                "row,predicted,label,probability\n"
            } else {
                "row,predicted,probability\n"
            };
            for (i, (row, &y)) in mixed.chunks(width).zip(ids).enumerate() {
                let (best, p) = row
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or((0, 0.0), |(c, &p)| (c, p));
                text += &format!("{i},{}", class(best));
                if labelled {
                    correct += usize::from(best == y as usize);
                    text += &format!(",{}", class(y as usize));
                }
                text += &format!(",{p:.4}\n");
            }
        }
        Labels::Real(ys) => {
            text += "row,predicted,target\n";
            for (i, (row, y)) in mixed.chunks(width).zip(ys).enumerate() {
                text += &format!("{i},{},{y}\n", row[0]);
            }
        }
    }
    match &args.out {
        Some(path) => crate::store::write_atomic(path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?,
        None => {
            let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
        }
    }
    let card = &model.card;
    let parts: Vec<String> = card
        .parts
        .iter()
        .map(|p| format!("{} {:.3}", p.owner, p.weight))
        .collect();
    let mut summary = format!(
        "{}'s model after round {} ({}): {} samples",
        card.silo,
        card.round,
        parts.join(", "),
        data.len()
    );
    if !labelled {
        summary += " (no label column: predictions only)";
    } else if matches!(data.labels, Labels::Class { .. }) && !data.is_empty() {
        summary += &format!(
            ", accuracy {:.2} % ({correct} correct)",
            100.0 * correct as f64 / data.len() as f64
        );
        if let Some(a) = card.test_accuracy {
            summary += &format!(
                "; the run that wrote it reported {:.2} % on the silo's test split",
                100.0 * a
            );
        }
    }
    eprintln!("{summary}");
    Ok(())
}

fn partition(args: PartitionArgs) -> anyhow::Result<()> {
    let scenario = read_scenario(&args.scenario, &args.set)?;
    let seed = args.seed.unwrap_or(scenario.seeds[0]);
    let (written, epoch_steps) =
        crate::launch::write_shards(&scenario, seed, args.data_dir.as_deref(), &args.out)?;
    println!(
        "{} shards of {} (seed {seed}) in {}/: {}",
        written.len(),
        scenario.name,
        args.out.display(),
        written
            .iter()
            .map(|p| p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "for the manifest, with train.batch_size = {}: epoch_steps = {epoch_steps} (the \
         sub-steps per round of FedeRiCo's default M-step)",
        scenario.train.batch_size
    );
    if scenario.privacy.is_some() {
        // Shards are rows, not settings: a node privatises what its own config says.
        println!(
            "the scenario's [privacy] is not in the shards: put it in each node's config \
             (a node draws its noise from a secret source; docs/privacy.md)"
        );
    }
    Ok(())
}

/// Short commands print the library's warnings (a stray colour image, a checkpoint that fell
/// back) as `WARN <message>` lines on stderr; `RUST_LOG` filters (default `warn`). Nodes and
/// the coordinator log everything instead ([`init_tracing`]).
fn init_warnings() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .try_init();
}

/// Sets up logging for long-running commands: human text by default, JSON lines on request;
/// `RUST_LOG` filters (default `info`).
fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Log lines print above the node's progress line when there is one.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(crate::net::progress::LogLine::default);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn node(args: NodeArgs) -> anyhow::Result<()> {
    init_tracing(args.log_json);
    let cfg = crate::net::NodeConfig::load(&args.config)?;
    // One thread moves bytes; training has its own thread (never inside the event loop).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if cfg.coordinated.is_some() {
        rt.block_on(crate::net::coordinated::run(cfg, shutdown_signal()))?;
        tracing::info!("coordinated node stopped");
        return Ok(());
    }
    crate::net::progress::start(args.log_json);
    let ending = rt.block_on(crate::net::node::run(cfg, shutdown_signal()));
    crate::net::progress::finish();
    let ending = ending?;
    tracing::info!(?ending, "node stopped");
    Ok(())
}

fn coordinator(args: CoordinatorArgs) -> anyhow::Result<()> {
    init_tracing(args.log_json);
    let cfg = crate::net::coordinator::CoordinatorConfig::load(&args.config)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(crate::net::coordinator::run(cfg, shutdown_signal()))?;
    tracing::info!("coordinator stopped");
    Ok(())
}

fn relay(args: RelayArgs) -> anyhow::Result<()> {
    init_tracing(args.log_json);
    let opts = crate::net::relay::RelayOptions {
        key: args.key,
        manifest: args.manifest,
        listen: args.listen,
        external: args.external,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(crate::net::relay::run(opts, shutdown_signal()))?;
    tracing::info!("relay stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Loads a scenario with `--set` overrides, then the flags that replace whole fields, and
/// validates the result (flags take precedence over the file).
fn load_scenario(
    path: &std::path::Path,
    set: &[String],
    seed: Option<u64>,
    rounds: Option<usize>,
    more: impl FnOnce(&mut Scenario),
) -> anyhow::Result<Scenario> {
    let mut scenario = read_scenario(path, set)?;
    if let Some(seed) = seed {
        scenario.seeds = vec![seed];
    }
    if let Some(rounds) = rounds {
        scenario.rounds = rounds;
    }
    more(&mut scenario);
    scenario.validate().context("command-line overrides")?;
    Ok(scenario)
}

/// The fault checks of every seed, when the scenario has a fault schedule.
fn fault_lines(outcome: &sim::Outcome) -> String {
    let mut text = String::new();
    for run in &outcome.summary.runs {
        let Some(v) = &run.faults else { continue };
        match serde_json::from_value::<crate::faults::checks::Report>(v.clone()) {
            Ok(report) => {
                text += &format!("fault checks, seed {}:\n{}", run.seed, report.render());
            }
            Err(e) => text += &format!("fault checks, seed {}: unreadable ({e})\n", run.seed),
        }
    }
    for run in &outcome.summary.runs {
        for (algorithm, v) in &run.coordinated_faults {
            match serde_json::from_value::<crate::faults::checks::Report>(v.clone()) {
                Ok(report) => {
                    text += &format!(
                        "fault checks, seed {}, {algorithm}:\n{}",
                        run.seed,
                        report.render()
                    );
                }
                Err(e) => {
                    text += &format!(
                        "fault checks, seed {}, {algorithm}: unreadable ({e})\n",
                        run.seed
                    )
                }
            }
        }
    }
    text
}

/// FedeRiCo's same-group weight mass, when the split has groups, and how much each silo
/// relies on itself and, of the rest, on its own group.
fn same_group_line(outcome: &sim::Outcome) -> String {
    let name = crate::report::names::display_name(crate::scenario::Algorithm::Federico);
    let algorithms = &outcome.summary.algorithms;
    let mut text = algorithms
        .iter()
        .find_map(|a| a.same_group_mass)
        .map(|m| format!("{name} weight on same-group peers (self included): {m:.3}\n"))
        .unwrap_or_default();
    if let Some(r) = algorithms
        .iter()
        .map(|a| &a.reliance)
        .find(|r| r.self_weight.is_some())
    {
        let highest = r
            .per_client_self_weight
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1));
        text += &format!(
            "{name} self-weight: {:.3} mean",
            r.self_weight.unwrap_or(0.0)
        );
        if let Some((i, w)) = highest {
            text += &format!(", {w:.3} highest (silo {i})");
        }
        if let Some(p) = r.peer_mass {
            text += &format!("; of the weight on others, on the own group: {p:.3}");
        }
        text += "\n";
    }
    if let Some(p) = algorithms.iter().find_map(|a| a.privacy.as_ref()) {
        let max = p.per_client_epsilon.iter().copied().fold(0.0, f64::max);
        let delta = p.per_client_delta.iter().copied().fold(0.0, f64::max);
        let sigma = p
            .per_client_noise
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        text += &format!(
            "{name} privacy: epsilon spent {:.2} mean, {max:.2} highest, of a budget of {} (delta at most {delta:.1e}, noise multiplier at least {sigma:.2}); silos out of budget: {}\n",
            p.epsilon, p.budget, p.exhausted
        );
    }
    if let Some(a) = algorithms.iter().find_map(|a| a.audit.as_ref()) {
        let (lo, hi) = a
            .per_client_auc
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        text += &format!(
            "{name} membership audit (a member's loss-threshold attack on each silo's own model, {} training rows against {} held-out; mean loss {:.3} against {:.3}): AUC {:.3} mean ({lo:.3} to {hi:.3}; 0.5 is a coin), epsilon proven at least {:.2} (95 %)\n",
            a.members,
            a.non_members,
            a.member_loss,
            a.non_member_loss,
            a.auc,
            a.epsilon_lower_bound
        );
    }
    text
}

fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    let scenario = load_scenario(&args.scenario, &args.set, args.seed, args.rounds, |s| {
        if let Some(threads) = args.threads {
            s.threads = threads;
        }
    })?;
    // Never over an earlier run, as `swarm` and `report`.
    let default = PathBuf::from("runs").join(&scenario.name);
    let out =
        crate::store::fresh_folder(args.out.as_deref(), &default).map_err(anyhow::Error::msg)?;
    let started = std::time::Instant::now();
    let outcome = sim::run(
        &scenario,
        &sim::Options {
            out: out.clone(),
            data_dir: args.data_dir,
            progress: !args.quiet,
            export: args.export,
            audit: args.audit,
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
    text += &same_group_line(&outcome);
    text += &fault_lines(&outcome);
    text += &format!(
        "results in {}/ (summary.json, table.txt, seed-*/rounds.jsonl, plots *.svg)\n",
        out.display()
    );
    if args.export {
        text += &format!(
            "models in {}/seed-*/models/<algorithm>/silo-*/model.json: `federico predict --model \
             <model.json> --data <rows>`, with new rows of your own, or the silo's shard from \
             `federico partition {} --seed <s> --out shards`\n",
            out.display(),
            args.scenario.display()
        );
    }
    // A reader that went away (`| head`) is not an error: the results are on disk.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(())
}

/// `s` as one CSV cell: quoted (with `"` doubled) where it holds a comma, a quote or a line break.
fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}
