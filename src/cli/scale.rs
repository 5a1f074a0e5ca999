//! `federico scale`: the federation's feature constants (`scale.json`) from per-silo column
//! summaries, so that no silo shows another its rows. Each silo runs `summarize` on its own
//! training CSV and sends the small file it writes; anyone runs `combine` on all of them and
//! every silo uses the result as its node's `data.scale`.
//! Owns: the subcommand's flags, reading the silo's CSV for it, and what it prints.
//! Must not: compute the statistics itself (`learn::scale` does) or talk to the network.

use crate::learn::loaders::{self, Column, CsvColumns};
use crate::learn::scale::{ColumnSums, FeatureScale};
use anyhow::Context;
use clap::Subcommand;
use std::path::PathBuf;

/// `federico scale`.
#[derive(Debug, clap::Args)]
pub struct ScaleArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ScaleCommand,
}

/// `federico scale` subcommands.
#[derive(Debug, Subcommand)]
pub enum ScaleCommand {
    /// Summarise this silo's training CSV per feature column (row count, mean, sum of squared
    /// deviations; no row) into a small JSON file to send to the federation.
    #[command(after_help = "Examples:
  federico scale summarize site-0/train.csv --label-column diagnosis --out site-0.sums.json")]
    Summarize(SummarizeArgs),
    /// Pool every silo's summary into the federation's `scale.json` (the mean and standard
    /// deviation of each column over all silos' training rows), for each node's `data.scale`.
    #[command(after_help = "Examples:
  federico scale combine site-*.sums.json --out scale.json")]
    Combine(CombineArgs),
}

/// `federico scale summarize`.
#[derive(Debug, clap::Args)]
pub struct SummarizeArgs {
    /// The silo's training CSV (the file its node config names in `data.train`).
    pub data: PathBuf,
    /// The label column, a header name or a 0-based position [default: the last].
    #[arg(long)]
    pub label_column: Option<Column>,
    /// Where to write the summary.
    #[arg(long)]
    pub out: PathBuf,
}

/// `federico scale combine`.
#[derive(Debug, clap::Args)]
pub struct CombineArgs {
    /// Every silo's summary, one file each.
    #[arg(required = true)]
    pub sums: Vec<PathBuf>,
    /// Where to write the federation's constants [default: scale.json].
    #[arg(long, default_value = "scale.json")]
    pub out: PathBuf,
}

/// Runs `federico scale`.
pub(super) fn scale(args: ScaleArgs) -> anyhow::Result<()> {
    match args.command {
        ScaleCommand::Summarize(a) => summarize(a),
        ScaleCommand::Combine(a) => combine(a),
    }
}

fn summarize(args: SummarizeArgs) -> anyhow::Result<()> {
    let table = loaders::read_csv(
        &args.data,
        CsvColumns {
            label: args.label_column.as_ref(),
            ..CsvColumns::default()
        },
    )?;
    let set = &table.set;
    let sums = ColumnSums::of(&set.features, set.sample_shape[0], table.columns);
    let text = serde_json::to_string_pretty(&sums)? + "\n";
    crate::store::write_atomic(&args.out, text.as_bytes())
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "{}: {} rows, {} feature columns summarised into {} (counts, means and sums of squares; \
         no row)",
        args.data.display(),
        sums.rows,
        sums.mean.len(),
        args.out.display()
    );
    Ok(())
}

fn combine(args: CombineArgs) -> anyhow::Result<()> {
    let parts = args
        .sums
        .iter()
        .map(|p| Ok((ColumnSums::read(p)?, p.display().to_string())))
        .collect::<Result<Vec<_>, crate::learn::DataError>>()?;
    let scale = FeatureScale::combine(&parts)?;
    let text = serde_json::to_string_pretty(&scale)? + "\n";
    crate::store::write_atomic(&args.out, text.as_bytes())
        .with_context(|| format!("writing {}", args.out.display()))?;
    let rows: u64 = parts.iter().map(|(s, _)| s.rows).sum();
    let largest = parts.iter().map(|(s, _)| s.rows).max().unwrap_or(0);
    eprintln!(
        "{} silos, {rows} rows: {} ({} columns); every node reads it with `scale = \"{}\"` \
         in its [data]\nthe largest silo has {largest} training rows: the manifest's \
         epoch_steps (mstep = \"epoch\") is {largest} / batch_size rounded up",
        parts.len(),
        args.out.display(),
        scale.mean.len(),
        args.out.display()
    );
    Ok(())
}
