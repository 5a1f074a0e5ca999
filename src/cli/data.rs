//! `federico data`: its arguments, and downloading or verifying the standard data sets with
//! [`crate::datasets`].
//! Owns: the subcommand's flags, the data directory's default (`data/`), and what it prints.
//! Must not: fetch, hash or unpack anything itself (that is `crate::datasets`).

use clap::Subcommand;
use std::path::PathBuf;

/// `federico data`.
#[derive(Debug, clap::Args)]
pub struct DataArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: DataCommand,
}

/// `federico data` subcommands.
#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Download data sets into the data directory, in the layout federico reads. Files already
    /// there and verified are skipped; an interrupted download resumes; every file is checked
    /// by its SHA-256 before it is put in place. Every named set is tried; those that failed
    /// are listed at the end.
    #[command(after_help = "Examples:
  federico data download fashion-mnist
  federico data download mnist optdigits --data-dir /srv/data
  federico data download all --base-url http://mirror.example/federico-data")]
    Download(DataDownloadArgs),
    /// Check the data sets' files in the data directory against their published SHA-256s.
    #[command(after_help = "Examples:
  federico data verify
  federico data verify fashion-mnist --data-dir /srv/data")]
    Verify(DataVerifyArgs),
}

/// The names `federico data` takes (the data sets of `crate::datasets::SETS`, and `all`).
const DATA_SET_NAMES: [&str; 5] = ["mnist", "fashion-mnist", "cifar-10", "optdigits", "all"];

/// `federico data download`.
#[derive(Debug, clap::Args)]
pub struct DataDownloadArgs {
    /// The data sets to download.
    #[arg(required = true, value_name = "NAME", value_parser = DATA_SET_NAMES)]
    pub names: Vec<String>,
    /// Data directory [env: FEDERICO_DATA_DIR] [default: data].
    #[arg(long = "data-dir", visible_alias = "dir", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Fetch every file from URL/<path under the data directory> (the CIFAR-10 archive from
    /// URL/cifar-10/cifar-10-binary.tar.gz) instead of the canonical sources, e.g. a mirror
    /// [env: FEDERICO_DATA_BASE_URL].
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// No progress bar (one line per file instead).
    #[arg(long, short)]
    pub quiet: bool,
}

/// `federico data verify`.
#[derive(Debug, clap::Args)]
pub struct DataVerifyArgs {
    /// The data sets to check [default: all; those not present are reported, not an error].
    #[arg(value_name = "NAME", value_parser = DATA_SET_NAMES)]
    pub names: Vec<String>,
    /// Data directory [env: FEDERICO_DATA_DIR] [default: data].
    #[arg(long = "data-dir", visible_alias = "dir", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// `--data-dir`, else `FEDERICO_DATA_DIR`, else `data` (relative to the working directory).
fn data_dir_or_default(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os(crate::scenario::DATA_DIR_ENV).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(crate::scenario::DEFAULT_DATA_DIR))
}

/// The data sets `names` stand for, each once, in table order (`all` is every one).
fn data_sets(names: &[String]) -> Vec<&'static crate::datasets::SetSpec<'static>> {
    let all = names.is_empty() || names.iter().any(|n| n == "all");
    crate::datasets::SETS
        .iter()
        .filter(|s| all || names.iter().any(|n| n == s.name))
        .collect()
}

pub(super) fn download(args: DataDownloadArgs) -> anyhow::Result<()> {
    let dir = data_dir_or_default(args.data_dir);
    let base_url = args.base_url.or_else(|| {
        std::env::var(crate::datasets::BASE_URL_ENV)
            .ok()
            .filter(|u| !u.is_empty())
    });
    let fetcher = crate::datasets::Fetcher::new();
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut printer = crate::datasets::progress::Printer::new(terminal && !args.quiet);
    // Every set is tried: one that fails (a mirror without the CIFAR-10 archive) must not
    // keep the others from coming. The failures are listed at the end.
    let sets = data_sets(&args.names);
    let mut failed: Vec<(&str, anyhow::Error)> = Vec::new();
    for set in &sets {
        match crate::datasets::download(&fetcher, set, &dir, base_url.as_deref(), &mut |e| {
            printer.show(e)
        }) {
            Ok(report) => println!("{}", report.render()),
            Err(e) => {
                let e = anyhow::Error::new(e).context(format!("downloading {}", set.name));
                if sets.len() > 1 {
                    eprintln!("error: {e:#}");
                }
                failed.push((set.name, e));
            }
        }
    }
    match failed.len() {
        0 => Ok(()),
        1 if sets.len() == 1 => Err(failed.remove(0).1),
        _ => {
            let names: Vec<&str> = failed.iter().map(|(n, _)| *n).collect();
            let rest = if failed.len() < sets.len() {
                format!(", the others are in {}", dir.display())
            } else {
                String::new()
            };
            anyhow::bail!(
                "{} of the data sets failed ({}; each error above){rest}",
                failed.len(),
                names.join(", ")
            )
        }
    }
}

pub(super) fn verify(args: DataVerifyArgs) -> anyhow::Result<()> {
    let dir = data_dir_or_default(args.data_dir);
    let named = !args.names.is_empty();
    let mut mismatched = Vec::new();
    let mut lacking = Vec::new();
    let mut text = String::new();
    for set in data_sets(&args.names) {
        let report = crate::datasets::verify(set, &dir)?;
        text += &report.render(&dir);
        if report.has_mismatch() {
            mismatched.push(set.name);
        } else if named && !report.is_complete() {
            lacking.push(set.name);
        }
    }
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    if !mismatched.is_empty() {
        anyhow::bail!(
            "files of {} in {} are not the published ones (listed above); `federico data \
             download {}` fetches them again",
            mismatched.join(", "),
            dir.display(),
            mismatched.join(" ")
        );
    }
    if !lacking.is_empty() {
        anyhow::bail!(
            "{} incomplete in {}; `federico data download {}` completes them",
            lacking.join(", "),
            dir.display(),
            lacking.join(" ")
        );
    }
    Ok(())
}
