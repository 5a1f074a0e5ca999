//! The per-round trace of one silo: what a node writes to its `rounds.jsonl`, and what the
//! simulator records for the same silo when it runs a fault schedule.
//! Owns: the record and its serde form (every field added later has a serde default, so older
//! logs still read).
//! Must not: compute anything; drivers fill it, `faults::checks` and `launch` read it.

use crate::learn::Evaluation;
use serde::{Deserialize, Serialize};

/// One line of a node's run log (`rounds.jsonl` in its state directory).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeRound {
    /// This node's index in the manifest.
    pub node: u32,
    /// The round completed.
    pub round: u64,
    /// The node's model version after the round's step.
    pub version: u64,
    /// Peers sampled this round.
    pub sampled: Vec<u32>,
    /// Sampled peers whose model arrived in time.
    pub answered: Vec<u32>,
    /// Gradients (self included) the step summed.
    pub gradients: usize,
    /// The weight row after the E-step: `(peer, w)`, self included, by id.
    pub weights: Vec<(u32, f64)>,
    /// The test score of the inference mixture, on evaluation rounds.
    pub eval: Option<EvalRecord>,
    /// Wall time of the round.
    pub seconds: f64,
    /// Encoded message bytes this process has sent so far (frames of both protocols).
    #[serde(default)]
    pub bytes_sent: u64,
    /// Stream bytes this process has sent so far (libp2p's bandwidth metrics: frames plus
    /// protocol negotiation; not Noise, Yamux or TCP framing).
    #[serde(default)]
    pub stream_bytes_sent: u64,
    /// When the round ended: Unix seconds (a node) or the federation's round number (the
    /// simulator). Checks compare it with the times the faults were applied.
    #[serde(default)]
    pub at: f64,
    /// When the round started, on the same clock as `at` (the simulator: `at − 0.4`, after
    /// the round's faults at `at − 0.5`).
    #[serde(default)]
    pub start: f64,
    /// L̂ per known peer after the E-step, `(peer, tracked loss)`, self included.
    #[serde(default)]
    pub tracked: Vec<(u32, f64)>,
    /// ℓ per known peer after the E-step, `(peer, last measured loss)` (kept when not measured).
    #[serde(default)]
    pub last: Vec<(u32, f64)>,
    /// Peers excluded from sampling (suspects) after the round.
    #[serde(default)]
    pub suspects: Vec<u32>,
    /// The first round after the node resumed from a checkpoint.
    #[serde(default)]
    pub resumed: bool,
}

/// A test score in a node's run log.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct EvalRecord {
    /// Summed loss.
    pub loss_sum: f64,
    /// Correct predictions.
    pub correct: usize,
    /// Test samples.
    pub count: usize,
}

impl From<Evaluation> for EvalRecord {
    fn from(e: Evaluation) -> Self {
        Self {
            loss_sum: e.loss_sum,
            correct: e.correct,
            count: e.count,
        }
    }
}
