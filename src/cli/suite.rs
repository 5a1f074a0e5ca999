//! `federico suite`: its arguments, and running a suite file with [`crate::suite`].
//! Owns: the subcommand's flags (which columns, the output folder, overrides) and what it
//! prints.
//! Must not: expand columns, run them or build the table itself (that is `crate::suite`).

use anyhow::Context;
use std::path::PathBuf;

/// `federico suite`.
#[derive(Debug, clap::Args)]
pub struct SuiteArgs {
    /// The suite file (TOML), e.g. simulations/quality/suite.toml.
    pub suite: PathBuf,
    /// Output folder [default: runs/<suite name>]; a column already there, run with the same
    /// scenario, is reused.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run only the columns this selects (repeatable): whole dash-separated parts of a column's
    /// name, e.g. `--only mnist` (not fmnist), `--only g4`, `--only fmnist-g4`, `--only n50`.
    #[arg(long, value_name = "TEXT")]
    pub only: Vec<String>,
    /// Override a field of every column's scenario, e.g. `--set rounds=20` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Data directory with mnist/, fashion-mnist/, cifar-10/... [env: FEDERICO_DATA_DIR].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Run every column again, even those with results for the same scenario.
    #[arg(long)]
    pub rerun: bool,
    /// List the columns and their simulate commands, run nothing.
    #[arg(long)]
    pub list: bool,
    /// Run the columns' algorithms only, not the suite file's FedeRiCo variants (the ablation
    /// runs, FedeRiCo alone once per variant and column).
    #[arg(long)]
    pub no_variants: bool,
}

/// Runs `federico suite`.
pub(super) fn suite(args: SuiteArgs) -> anyhow::Result<()> {
    use crate::suite::{RunOptions, SuiteFile};
    let mut file = SuiteFile::load(&args.suite)?;
    if args.no_variants {
        file.variant.clear();
    }
    let columns = file.columns(&args.suite, &args.set, &args.only)?;
    if columns.is_empty() {
        anyhow::bail!(
            "no column of {} matches --only {:?}",
            args.suite.display(),
            args.only
        );
    }
    if args.list {
        let text: String = columns
            .iter()
            .map(|c| format!("{}: {}\n", c.id, c.command()))
            .collect();
        // A reader that went away (`| head`) is not an error.
        let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
        return Ok(());
    }
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from("runs").join(&file.name));
    let mut command = format!("federico suite {}", args.suite.display());
    for o in &args.only {
        command += &format!(" --only {o}");
    }
    for s in &args.set {
        command += &format!(" --set '{s}'");
    }
    if args.no_variants {
        command += " --no-variants";
    }
    eprintln!(
        "{}: {} columns × {} seeds, {} variant(s); results in {}/",
        file.name,
        columns.len(),
        file.seeds.len(),
        file.variant.len(),
        out.display()
    );
    let opts = RunOptions {
        out: out.clone(),
        data_dir: args.data_dir,
        rerun: args.rerun,
    };
    let text = crate::suite::run(&file, &columns, &command, &opts, |line| eprintln!("{line}"))
        .with_context(|| format!("suite {}", args.suite.display()))?;
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    eprintln!("table in {}/table.md", out.display());
    Ok(())
}
