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
    /// Play a poisoning member from the next job on (`None`: stop); fault schedules only.
    Attack {
        attack: Option<crate::silo::attack::Attack>,
        me: crate::ids::NodeId,
        seed: u64,
    },
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
    /// A learner job is done; the silo's privacy ledger after it (under `[privacy]`).
    Done(Done, Option<crate::trace::PrivacyRecord>),
    /// The checkpoint of `round` is on disk.
    Saved { round: u64 },
    /// The predictor of `round` was written (the path of its `model.json`), or why not (not
    /// fatal: the next evaluation tries again).
    Exported {
        round: u64,
        written: Result<PathBuf, String>,
    },
    /// The checkpoint of `round` could not be written (`error` says why: a full disk, no file
    /// descriptors left). Not fatal: the previous checkpoint stays, the next round's write
    /// tries again.
    SaveFailed { round: u64, error: String },
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
    /// What the exported card says about this silo's rows (feature constants, class names).
    card_data: crate::learn::export::CardData,
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
            card_data: Default::default(),
        })
    }

    /// What exported cards say about this silo's rows (feature constants, class names).
    pub(crate) fn with_card_data(mut self, data: crate::learn::export::CardData) -> Self {
        self.card_data = data;
        self
    }

    /// Runs jobs until the job channel closes; each result goes to `done`.
    pub(crate) fn run(
        mut self,
        jobs: mpsc::Receiver<Work>,
        done: tokio::sync::mpsc::Sender<Output>,
    ) {
        crate::learn::runtime::flush_denormals_to_zero();
        // Once the event loop stopped taking results (shutdown), learner jobs are skipped but
        // a checkpoint or an export already queued is still written whole.
        each_job(jobs, |work| {
            if done.is_closed() && matches!(work, Work::Learn(_)) {
                return true;
            }
            if let Work::Attack { attack, me, seed } = work {
                // Nothing to report: the next job's results carry it.
                self.silo.set_attack(attack, me, seed);
                return true;
            }
            let out = self.handle(work).unwrap_or_else(Output::Failed);
            let _ = done.blocking_send(out);
            true
        });
    }

    fn handle(&mut self, work: Work) -> Result<Output, String> {
        match work {
            Work::Attack { .. } => Err("an attack is not a job with a result".into()),
            Work::Learn(job) => self
                .silo
                .run(&mut self.learner, &self.data, job)
                .map(|done| Output::Done(done, self.silo.privacy_record()))
                .map_err(|e| e.to_string()),
            Work::Checkpoint { round, peer } => {
                let c = Checkpoint {
                    peer_id: self.peer_id.clone(),
                    round,
                    version: self.silo.version,
                    params: self.silo.params.clone(),
                    adam: self.silo.adam.clone(),
                    peer: *peer,
                    privacy: self.silo.privacy().map(|(l, _, _)| l.clone()),
                };
                Ok(match c.save(&self.checkpoint) {
                    Ok(()) => Output::Saved { round },
                    Err(error) => Output::SaveFailed { round, error },
                })
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
                    &self.card_data,
                )
                .map_err(|e| e.to_string());
                Ok(Output::Exported { round, written })
            }
        }
    }
}

/// How the node's checkpoint writes are going: a failed write is counted and logged (the first
/// at once, then at most one line per [`SaveHealth::QUIET`] with the count meanwhile), never
/// fatal; the next round's write tries again.
pub(crate) struct SaveHealth {
    failures: prometheus_client::metrics::counter::Counter,
    /// Failures since the last write that went through.
    failing: u64,
    /// Failures since the last warning.
    unlogged: u64,
    last_warning: Option<std::time::Instant>,
}

impl SaveHealth {
    /// The least time between two warnings about failed writes.
    pub(crate) const QUIET: std::time::Duration = std::time::Duration::from_secs(10);

    /// Counts failures in `failures` (the node's metric).
    pub(crate) fn new(failures: prometheus_client::metrics::counter::Counter) -> Self {
        Self {
            failures,
            failing: 0,
            unlogged: 0,
            last_warning: None,
        }
    }

    /// The checkpoint of `round` could not be written.
    pub(crate) fn failed(&mut self, round: u64, error: &str, now: std::time::Instant) {
        self.failures.inc();
        self.failing += 1;
        self.unlogged += 1;
        if self
            .last_warning
            .is_none_or(|t| now.duration_since(t) >= Self::QUIET)
        {
            tracing::warn!(
                round,
                error,
                failed_writes = self.unlogged,
                "checkpoint not written; the previous one stays, the next round tries again"
            );
            self.unlogged = 0;
            self.last_warning = Some(now);
        }
    }

    /// The checkpoint of `round` is on disk.
    pub(crate) fn saved(&mut self, round: u64) {
        if self.failing > 0 {
            tracing::info!(
                round,
                failed_writes = self.failing,
                "checkpoint written again after failed writes"
            );
        }
        self.failing = 0;
        self.unlogged = 0;
        self.last_warning = None;
    }

    /// Failed writes since the last one that went through.
    #[cfg(test)]
    pub(crate) fn failing(&self) -> u64 {
        self.failing
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

/// Writes a coordinated silo's model to take home — `params` as one part of weight 1, in
/// `<state_dir>/model.json` and `model.safetensors` — on `worker`'s thread, and returns the
/// card's path. A failure is reported, never fatal: the run log and checkpoint stand.
pub(crate) async fn export_one<S: Send + 'static>(
    worker: &Worker<S>,
    learner: fn(&S) -> &crate::learn::Learner,
    cfg: &super::config::NodeConfig,
    params: Vec<f32>,
    round: u64,
    accuracy: f64,
) -> PathBuf {
    let dir = cfg.state_dir.clone();
    let name = cfg.name.clone();
    let card = dir.join("model.json");
    // A scale or class list that cannot be read now was readable when the data loaded;
    // without it the card says the rows were used as read and the labels are ids.
    let data = cfg.card_data().unwrap_or_default();
    let written = worker
        .run(move |s| {
            let parts = [(name.clone(), params.as_slice(), 1.0)];
            crate::learn::export::write(
                &dir,
                learner(s),
                &name,
                &parts,
                round,
                Some(accuracy),
                &data,
            )
        })
        .await;
    match written {
        Ok(Ok(path)) => path,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not export the model");
            card
        }
        Err(WorkerGone) => {
            tracing::warn!("could not export the model: the training thread stopped");
            card
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint that cannot be written (its path is a directory with something in it, as
    /// when the disk or the file descriptors run out) is an error the node counts and logs,
    /// then the next write, once the path is free again, goes through and keeps the last good
    /// one as the previous generation.
    #[test]
    fn a_failed_checkpoint_write_is_counted_and_retried() {
        use crate::core::FedericoConfig;
        use crate::ids::NodeId;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.bin");
        let c = |round| Checkpoint {
            peer_id: "p".into(),
            round,
            version: round,
            params: vec![0.5; 8],
            adam: crate::learn::Adam::new(8, 0.01),
            peer: Peer::new(NodeId(0), (0..2).map(NodeId), FedericoConfig::default(), 1),
            privacy: None,
        };
        let counter = prometheus_client::metrics::counter::Counter::default();
        let mut health = SaveHealth::new(counter.clone());
        let t0 = std::time::Instant::now();
        c(1).save(&path).unwrap();
        health.saved(1);
        // The path taken by a directory that is not empty: every write fails.
        std::fs::rename(&path, dir.path().join("kept.bin")).unwrap();
        std::fs::create_dir_all(path.join("in-the-way")).unwrap();
        for round in 2..5 {
            let e = c(round).save(&path).unwrap_err();
            assert!(e.contains("writing checkpoint"), "{e}");
            assert!(e.contains("checkpoint.bin"), "{e}");
            health.failed(round, &e, t0 + std::time::Duration::from_millis(round));
        }
        assert_eq!((counter.get(), health.failing()), (3, 3));
        // No temporary file is left behind by the failed writes.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        // Free again: the next round's write goes through.
        std::fs::remove_dir_all(&path).unwrap();
        c(5).save(&path).unwrap();
        health.saved(5);
        assert_eq!((counter.get(), health.failing()), (3, 0));
        assert_eq!(Checkpoint::read(&path).unwrap().unwrap().round, 5);
    }

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
