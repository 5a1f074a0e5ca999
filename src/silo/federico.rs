//! FedeRiCo's work on one silo's data: the learner jobs of [`crate::core::round`] — measure,
//! scale, step, evaluate.
//!
//! Owns: the silo's own model between rounds (parameters, Adam state, version) and the
//! arithmetic of a round: mean loss = summed loss / n; each measured gradient scaled in f32 by
//! its owner's fresh weight; one Adam step on the owner's inbox sum (summed in node order by
//! the inbox), then the version bumped. The node's training thread and the simulator both run
//! exactly this, so a fault-free swarm makes the simulator's decisions.
//! Must not: decide anything (weights come in with the jobs), touch the network, read a clock
//! or write files (the [`Checkpoint`] format is here; the drivers write it).

use crate::core::Peer;
use crate::core::round::{Done, Job, Score};
use crate::ids::NodeId;
use crate::learn::{Adam, ClientData, Evaluation, LearnError, Learner};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One silo's FedeRiCo model and what it holds between the jobs of a round.
#[derive(Clone, Debug)]
pub struct FedericoSilo {
    /// φ_i: the silo's own parameters.
    pub params: Vec<f32>,
    /// Its optimizer state.
    pub adam: Adam,
    /// v_i: bumped after every step.
    pub version: u64,
    /// Gradients of the last `Measure`, waiting for their weights.
    pending: Vec<(NodeId, Vec<f32>)>,
}

impl FedericoSilo {
    /// A silo holding `params` as version `version`, with its optimizer.
    pub fn new(params: Vec<f32>, adam: Adam, version: u64) -> Self {
        Self {
            params,
            adam,
            version,
            pending: Vec::new(),
        }
    }

    /// Runs one job on `learner` over the silo's `data`.
    pub fn run(
        &mut self,
        learner: &mut Learner,
        data: &ClientData,
        job: Job,
    ) -> Result<Done, LearnError> {
        let train = &data.train;
        Ok(match job {
            Job::Measure { models } => {
                self.pending.clear();
                let mut losses = Vec::with_capacity(models.len());
                for (b, params) in models {
                    let (loss_sum, grad) = learner.loss_and_grad(&params, train, None)?;
                    losses.push((b, loss_sum / train.len() as f64));
                    self.pending.push((b, grad));
                }
                Done::Measured { losses }
            }
            Job::Scale { weights } => {
                let mut grads = std::mem::take(&mut self.pending);
                for (b, g) in &mut grads {
                    let w = weights.iter().find(|(id, _)| id == b).map_or(0.0, |x| x.1);
                    scale(g, w);
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
                let eval = learner.evaluate_mixture(&parts, &data.test)?;
                Done::Evaluated {
                    round,
                    score: score(&eval),
                }
            }
        })
    }
}

/// Multiplies a gradient by a weight, in f32 (the weight rounded once).
pub fn scale(g: &mut [f32], w: f64) {
    let w = w as f32;
    for x in g {
        *x *= w;
    }
}

/// A learner's evaluation as the round's numbers.
pub fn score(e: &Evaluation) -> Score {
    Score {
        loss_sum: e.loss_sum,
        correct: e.correct,
        count: e.count,
    }
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
