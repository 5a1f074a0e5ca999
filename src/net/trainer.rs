//! The training thread of a node: owns the candle model workspace, the silo's data, its own
//! parameters and its optimizer, and runs jobs the round driver sends, one at a time.
//! Owns: every tensor computation of a node (losses, gradients, the optimizer step, test
//! scores) and writing checkpoints (file I/O stays off the event loop too).
//! Must not: decide anything (weights come in with the jobs) or touch the network.
//!
//! The arithmetic is the simulator's, operation for operation (mean loss = summed loss / n,
//! gradient scaled in f32 by the fresh weight, the owner's inbox summed in node order, one Adam
//! step), so a fault-free swarm makes the same decisions as `simulate`.

use crate::core::{GradientInbox, Peer};
use crate::ids::NodeId;
use crate::learn::{Adam, ClientData, Evaluation, Learner, ModelSpec};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;

/// Work for the training thread.
pub(crate) enum Job {
    /// E-step inputs: mean training loss and summed gradient of each model (self included).
    Measure {
        models: Vec<(NodeId, Arc<Vec<f32>>)>,
    },
    /// Scale the gradients of the last `Measure` by the fresh weights and hand them over.
    Scale { weights: Vec<(NodeId, f64)> },
    /// One optimizer step on the inbox's sum.
    Step { inbox: GradientInbox },
    /// Test score of the inference mixture after `round`.
    Evaluate {
        round: u64,
        parts: Vec<(NodeId, Arc<Vec<f32>>, f64)>,
    },
    /// Write the checkpoint after `round` with the core's state.
    Checkpoint { round: u64, peer: Box<Peer> },
}

/// What a job produced.
pub(crate) enum Done {
    Measured { losses: Vec<(NodeId, f64)> },
    Scaled { grads: Vec<(NodeId, Vec<f32>)> },
    Stepped { params: Arc<Vec<f32>>, version: u64 },
    Evaluated { round: u64, eval: Evaluation },
    Saved { round: u64 },
    Failed(String),
}

/// A node's whole state on disk (DESIGN: model, optimizer, collaborator table, round, RNG),
/// written atomically after every round (`<state_dir>/checkpoint.bin`).
#[derive(Serialize, Deserialize)]
pub struct Checkpoint {
    /// The key's peer ID, to refuse a checkpoint of another silo.
    pub peer_id: String,
    /// Rounds completed.
    pub round: u64,
    /// v_i.
    pub version: u64,
    /// The silo's own parameters.
    pub params: Vec<f32>,
    /// Its optimizer state.
    pub adam: Adam,
    /// The FedeRiCo core: table, sampling RNG position, liveness.
    pub peer: Peer,
}

const MAGIC: &[u8; 8] = b"FEDCKPT1";
/// 2: `FedericoConfig` (inside the core's state) gained `clip_norm`.
/// 3: the core's per-peer failures gained the round of the last one and the heartbeat probe
/// (suspects back off exponentially); an older checkpoint is refused by name, not misread.
const VERSION: u32 = 3;

impl Checkpoint {
    /// The file's bytes.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = crate::store::header(MAGIC, VERSION);
        bincode::serde::encode_into_std_write(self, &mut out, bincode::config::standard())
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Reads a checkpoint; `None` when there is none yet.
    pub fn read(path: &std::path::Path) -> Result<Option<Self>, String> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        Self::decode(&bytes)
            .map(Some)
            .map_err(|e| format!("checkpoint {}: {e}", path.display()))
    }

    /// Decodes a checkpoint's bytes (header, version and body checked).
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let body = crate::store::strip_header(bytes, MAGIC, VERSION)?;
        let (c, n): (Self, usize) =
            crate::store::decode_bounded(body).map_err(|e| format!("undecodable ({e})"))?;
        if n != body.len() {
            return Err("trailing bytes".into());
        }
        Ok(c)
    }
}

/// The silo's own model as the trainer starts with it (fresh or from a checkpoint).
pub(crate) struct OwnModel {
    pub(crate) params: Vec<f32>,
    pub(crate) adam: Adam,
    pub(crate) version: u64,
}

/// The thread's state.
pub(crate) struct Trainer {
    pub(crate) learner: Learner,
    pub(crate) data: ClientData,
    pub(crate) params: Vec<f32>,
    pub(crate) adam: Adam,
    pub(crate) version: u64,
    pub(crate) peer_id: String,
    pub(crate) checkpoint: PathBuf,
    /// Gradients of the last `Measure`, waiting for their weights.
    pending: Vec<(NodeId, Vec<f32>)>,
}

impl Trainer {
    pub(crate) fn new(
        spec: &ModelSpec,
        batch_size: usize,
        data: ClientData,
        own: OwnModel,
        peer_id: String,
        checkpoint: PathBuf,
    ) -> Result<Self, String> {
        let OwnModel {
            params,
            adam,
            version,
        } = own;
        Ok(Self {
            learner: Learner::new(spec, batch_size).map_err(|e| e.to_string())?,
            data,
            params,
            adam,
            version,
            peer_id,
            checkpoint,
            pending: Vec::new(),
        })
    }

    /// Runs jobs until the job channel closes; each result goes to `done`.
    pub(crate) fn run(
        mut self,
        jobs: mpsc::Receiver<Job>,
        done: tokio::sync::mpsc::UnboundedSender<Done>,
    ) {
        crate::learn::runtime::flush_denormals_to_zero();
        while let Ok(job) = jobs.recv() {
            let out = self.handle(job).unwrap_or_else(Done::Failed);
            if done.send(out).is_err() {
                break;
            }
        }
    }

    fn handle(&mut self, job: Job) -> Result<Done, String> {
        let train = &self.data.train;
        Ok(match job {
            Job::Measure { models } => {
                self.pending.clear();
                let mut losses = Vec::with_capacity(models.len());
                for (b, params) in models {
                    let (loss_sum, grad) = self
                        .learner
                        .loss_and_grad(&params, train, None)
                        .map_err(|e| e.to_string())?;
                    losses.push((b, loss_sum / train.len() as f64));
                    self.pending.push((b, grad));
                }
                Done::Measured { losses }
            }
            Job::Scale { weights } => {
                let mut grads = std::mem::take(&mut self.pending);
                for (b, g) in &mut grads {
                    let w = weights.iter().find(|(id, _)| id == b).map_or(0.0, |x| x.1) as f32;
                    for x in g.iter_mut() {
                        *x *= w;
                    }
                }
                Done::Scaled { grads }
            }
            Job::Step { inbox } => {
                self.adam.step(&mut self.params, &inbox.sum());
                self.version += 1;
                Done::Stepped {
                    params: Arc::new(self.params.clone()),
                    version: self.version,
                }
            }
            Job::Evaluate { round, parts } => {
                let parts: Vec<(&[f32], f64)> =
                    parts.iter().map(|(_, p, w)| (p.as_slice(), *w)).collect();
                let eval = self
                    .learner
                    .evaluate_mixture(&parts, &self.data.test)
                    .map_err(|e| e.to_string())?;
                Done::Evaluated { round, eval }
            }
            Job::Checkpoint { round, peer } => {
                let c = Checkpoint {
                    peer_id: self.peer_id.clone(),
                    round,
                    version: self.version,
                    params: self.params.clone(),
                    adam: self.adam.clone(),
                    peer: *peer,
                };
                let bytes = c.encode()?;
                crate::store::write_atomic(&self.checkpoint, &bytes).map_err(|e| {
                    format!("writing checkpoint {}: {e}", self.checkpoint.display())
                })?;
                Done::Saved { round }
            }
        })
    }
}
