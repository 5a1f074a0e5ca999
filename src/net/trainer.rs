//! The training threads of the nodes: one dedicated thread per node (or per pair of
//! FedCollab's discriminators) that owns the candle model workspace and runs jobs one at a
//! time, over bounded channels. [`Trainer`] is the FedeRiCo node's (its silo's data and its own
//! model, [`FedericoSilo`], and the jobs the round engine asks for); [`Worker`] is the same
//! thread for the coordinated and FedCollab nodes, whose jobs are closures over its state.
//! Owns: every tensor computation of a node (through [`FedericoSilo`], the simulator's own
//! arithmetic, or the closures a [`Worker`] is handed), writing the FedeRiCo checkpoints and
//! the exported predictor (file I/O stays off the event loop too).
//! Must not: decide anything (weights come in with the jobs) or touch the network.
//!
//! Channels are bounded both ways: the event loop never blocks on a full job queue (it only
//! ever has a learner job and a checkpoint in flight, [`QUEUE`] leaves room; a [`Worker`]'s
//! caller waits for each result before the next job), and the thread waits for the event loop
//! to take its results.

use crate::core::Peer;
use crate::core::round::{Done, Job};
use crate::learn::{ClientData, Learner, ModelSpec};
use crate::silo::federico::{Checkpoint, FedericoSilo};
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use tokio::sync::oneshot;

/// Room in each channel between the event loop and the thread.
pub(crate) const QUEUE: usize = 8;

/// Work for the training thread.
pub(crate) enum Work {
    /// A learner job of the round.
    Learn(Job),
    /// Write the checkpoint after `round` with the core's state.
    Checkpoint { round: u64, peer: Box<Peer> },
    /// Write the predictor the silo evaluated after `round` (`crate::learn::export`).
    Export {
        round: u64,
        /// `(owner name, parameters, weight)`.
        parts: Vec<(String, Arc<Vec<f32>>, f64)>,
        accuracy: Option<f64>,
    },
}

/// What the thread produced.
pub(crate) enum Output {
    /// A learner job is done.
    Done(Done),
    /// The checkpoint of `round` is on disk.
    Saved { round: u64 },
    /// The predictor of `round` was written (the path of its `model.json`), or why not (not
    /// fatal: the next evaluation tries again).
    Exported {
        round: u64,
        written: Result<PathBuf, String>,
    },
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
    /// This silo's name (for the exported model's description).
    name: String,
}

impl Trainer {
    pub(crate) fn new(
        spec: &ModelSpec,
        batch_size: usize,
        data: ClientData,
        silo: FedericoSilo,
        peer_id: String,
        checkpoint: PathBuf,
        name: String,
    ) -> Result<Self, String> {
        Ok(Self {
            learner: Learner::new(spec, batch_size).map_err(|e| e.to_string())?,
            data,
            silo,
            peer_id,
            checkpoint,
            name,
        })
    }

    /// Runs jobs until the job channel closes; each result goes to `done`.
    pub(crate) fn run(
        mut self,
        jobs: mpsc::Receiver<Work>,
        done: tokio::sync::mpsc::Sender<Output>,
    ) {
        crate::learn::runtime::flush_denormals_to_zero();
        each_job(jobs, |work| {
            let out = self.handle(work).unwrap_or_else(Output::Failed);
            done.blocking_send(out).is_ok()
        });
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
            Work::Export {
                round,
                parts,
                accuracy,
            } => {
                let dir = self
                    .checkpoint
                    .parent()
                    .map_or_else(|| PathBuf::from("."), PathBuf::from);
                let parts: Vec<(String, &[f32], f64)> = parts
                    .iter()
                    .map(|(owner, p, w)| (owner.clone(), p.as_slice(), *w))
                    .collect();
                let written = crate::learn::export::write(
                    &dir,
                    &self.learner,
                    &self.name,
                    &parts,
                    round,
                    accuracy,
                )
                .map_err(|e| e.to_string());
                Ok(Output::Exported { round, written })
            }
        }
    }
}

/// The loop of every training thread: `handle` runs each job until the job channel closes or
/// `handle` says stop (its results have no taker).
fn each_job<J>(jobs: mpsc::Receiver<J>, mut handle: impl FnMut(J) -> bool) {
    while let Ok(job) = jobs.recv() {
        if !handle(job) {
            break;
        }
    }
}

/// A job for a [`Worker`]: runs on its state, sends its own result.
type WorkerJob<S> = Box<dyn FnOnce(&mut S) + Send>;

/// The training thread is gone (it panicked, or its state could not be built).
#[derive(Debug, thiserror::Error)]
#[error("the training thread stopped")]
pub(crate) struct WorkerGone;

/// A dedicated training thread that owns `S` (a learner, its data, its random streams) and runs
/// the closures it is handed on it, one at a time. Dropping the worker ends the thread once
/// the jobs already queued are done. Unlike the [`Trainer`], it keeps IEEE denormals: the
/// coordinated and FedCollab nodes match `federico simulate` bit for bit, which keeps them too.
pub(crate) struct Worker<S> {
    jobs: mpsc::SyncSender<WorkerJob<S>>,
}

impl<S: Send + 'static> Worker<S> {
    /// Starts the thread `name` with `state`.
    pub(crate) fn spawn(name: &str, mut state: S) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::sync_channel::<WorkerJob<S>>(QUEUE);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                each_job(rx, |job| {
                    job(&mut state);
                    true
                })
            })?;
        Ok(Self { jobs })
    }

    /// Runs `f` on the thread's state and waits for its result.
    pub(crate) async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut S) -> R + Send + 'static,
    ) -> Result<R, WorkerGone> {
        let (tx, rx) = oneshot::channel();
        let job: WorkerJob<S> = Box::new(move |s| {
            let _ = tx.send(f(s));
        });
        // The callers wait for each result before the next job: the queue never fills.
        self.jobs.try_send(job).map_err(|_| WorkerGone)?;
        rx.await.map_err(|_| WorkerGone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_worker_runs_its_jobs_in_order_on_its_own_state() {
        let w = Worker::spawn("test", Vec::new()).unwrap();
        for i in 0..3 {
            w.run(move |v: &mut Vec<i32>| v.push(i)).await.unwrap();
        }
        assert_eq!(w.run(|v| v.clone()).await.unwrap(), vec![0, 1, 2]);
        let r = w.run(|_| -> i32 { panic!("a job that panics") }).await;
        assert!(r.is_err());
        assert!(w.run(|v| v.len()).await.is_err(), "the thread is gone");
    }
}
