//! The training thread of a node: owns the candle model workspace, the silo's data and its own
//! model ([`FedericoSilo`]), and runs the jobs the round engine asks for, one at a time.
//! Owns: every tensor computation of a node (through [`FedericoSilo`], the simulator's own
//! arithmetic) and writing checkpoints (file I/O stays off the event loop too).
//! Must not: decide anything (weights come in with the jobs) or touch the network.
//!
//! Channels are bounded both ways: the event loop never blocks on a full job queue (it only
//! ever has a learner job and a checkpoint in flight, [`QUEUE`] leaves room), and the thread
//! waits for the event loop to take its results.

use crate::core::Peer;
use crate::core::round::{Done, Job};
use crate::learn::{ClientData, Learner, ModelSpec};
use crate::silo::federico::{Checkpoint, FedericoSilo};
use std::path::PathBuf;
use std::sync::mpsc;

/// Room in each channel between the event loop and the thread.
pub(crate) const QUEUE: usize = 8;

/// Work for the training thread.
pub(crate) enum Work {
    /// A learner job of the round.
    Learn(Job),
    /// Write the checkpoint after `round` with the core's state.
    Checkpoint { round: u64, peer: Box<Peer> },
}

/// What the thread produced.
pub(crate) enum Output {
    /// A learner job is done.
    Done(Done),
    /// The checkpoint of `round` is on disk.
    Saved { round: u64 },
    /// A job failed; the node stops.
    Failed(String),
}

/// The thread's state.
pub(crate) struct Trainer {
    learner: Learner,
    data: ClientData,
    silo: FedericoSilo,
    peer_id: String,
    checkpoint: PathBuf,
}

impl Trainer {
    pub(crate) fn new(
        spec: &ModelSpec,
        batch_size: usize,
        data: ClientData,
        silo: FedericoSilo,
        peer_id: String,
        checkpoint: PathBuf,
    ) -> Result<Self, String> {
        Ok(Self {
            learner: Learner::new(spec, batch_size).map_err(|e| e.to_string())?,
            data,
            silo,
            peer_id,
            checkpoint,
        })
    }

    /// Runs jobs until the job channel closes; each result goes to `done`.
    pub(crate) fn run(
        mut self,
        jobs: mpsc::Receiver<Work>,
        done: tokio::sync::mpsc::Sender<Output>,
    ) {
        crate::learn::runtime::flush_denormals_to_zero();
        while let Ok(work) = jobs.recv() {
            let out = self.handle(work).unwrap_or_else(Output::Failed);
            if done.blocking_send(out).is_err() {
                break;
            }
        }
    }

    fn handle(&mut self, work: Work) -> Result<Output, String> {
        match work {
            Work::Learn(job) => self
                .silo
                .run(&mut self.learner, &self.data, job)
                .map(Output::Done)
                .map_err(|e| e.to_string()),
            Work::Checkpoint { round, peer } => {
                let c = Checkpoint {
                    peer_id: self.peer_id.clone(),
                    round,
                    version: self.silo.version,
                    params: self.silo.params.clone(),
                    adam: self.silo.adam.clone(),
                    peer: *peer,
                };
                let bytes = c.encode()?;
                crate::store::write_atomic(&self.checkpoint, &bytes).map_err(|e| {
                    format!("writing checkpoint {}: {e}", self.checkpoint.display())
                })?;
                Ok(Output::Saved { round })
            }
        }
    }
}
