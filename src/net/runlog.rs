//! A node's run log (`<state_dir>/rounds.jsonl`), as every kind of node writes it: the FedeRiCo
//! node, the coordinated node and the FedCollab node; and the coordinator's round log
//! (`coordinator.jsonl`).
//!
//! Owns: opening it (cut back to the rounds the checkpoint holds, so a resumed node never logs
//! a round twice), appending one JSON record per line through [`crate::store::LineLog`] (never a
//! torn line; lines that a full disk refused wait in memory, in order), and saying so once at
//! WARN when writes start failing and once at INFO when they go through again.
//! Must not: decide what a record holds, or stop a node: a full disk is a warning and a retry,
//! like a checkpoint that cannot be written (insiders' review S1).

use crate::store::LineLog;
use serde::Serialize;
use std::path::{Path, PathBuf};
use tracing::{info, warn};

/// The run log of one node.
#[derive(Debug)]
pub(crate) struct RunLog {
    log: LineLog,
    path: PathBuf,
    /// The round of the first record that could not be written, while writes fail.
    failing: Option<u64>,
}

impl RunLog {
    /// Opens `<state_dir>/rounds.jsonl` for a node resuming after `round` rounds; the error
    /// names the file.
    pub(crate) fn open(state_dir: &Path, round: u64) -> Result<Self, String> {
        Self::open_file(state_dir.join("rounds.jsonl"), round + 1)
    }

    /// Opens the log at `path`, keeping the lines of rounds before `next_round` (those the
    /// checkpoint holds); the error names the file.
    pub(crate) fn open_file(path: PathBuf, next_round: u64) -> Result<Self, String> {
        let cut = crate::trace::trim_log(&path, next_round)?;
        if cut > 0 {
            warn!(
                lines = cut,
                path = %path.display(),
                "run log cut back to the checkpoint (rounds it had not saved, or a torn line)"
            );
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(LineLog::new)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self {
            log,
            path,
            failing: None,
        })
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `record`, the line of `round`. Never fails: a line the disk refuses waits for the
    /// next write, and the first refusal is logged.
    pub(crate) fn write(&mut self, round: u64, record: &impl Serialize) {
        let line = match serde_json::to_vec(record) {
            Ok(l) => l,
            Err(e) => {
                warn!(round, error = %e, "a run-log record could not be encoded; it is skipped");
                return;
            }
        };
        match self.log.append(&line) {
            Ok(()) => {
                if let Some(since) = self.failing.take() {
                    info!(
                        round,
                        since_round = since,
                        "run log written again: the rounds that waited are in it"
                    );
                }
            }
            Err(u) => {
                if self.failing.is_none() {
                    warn!(
                        round,
                        error = %u.error,
                        waiting = u.waiting,
                        path = %self.path.display(),
                        "run log not written (the disk is full?); its lines wait in memory \
                         and are written once a write goes through"
                    );
                    self.failing = Some(round);
                }
                if u.dropped > 0 {
                    warn!(
                        dropped = u.dropped,
                        "run log: too many lines waited; the oldest were given up"
                    );
                }
            }
        }
    }

    /// Writes the lines still waiting, at the end of a run; what cannot be written is lost,
    /// and logged.
    pub(crate) fn close(&mut self) {
        if let Err(u) = self.log.flush() {
            warn!(
                error = %u.error,
                lines = u.waiting,
                path = %self.path.display(),
                "the run log's last lines could not be written: they are lost"
            );
        }
    }
}
