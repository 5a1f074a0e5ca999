//! The work a round hands to a silo's learner, and what comes back.
//!
//! Owns: the [`Job`] / [`Done`] vocabulary between the round engine and whoever holds the
//! silo's model (the node's training thread, the simulator's pool), and [`Score`], a test score
//! as plain numbers.
//! Must not: compute anything: `crate::silo::federico` runs the jobs. Saving the silo's
//! state is not a learner's job: it is an [`super::Action::Checkpoint`].

use crate::core::GradientInbox;
use crate::ids::NodeId;
use std::sync::Arc;

/// Work for the silo's learner, in the order the round asks for it.
#[derive(Debug)]
pub enum Job {
    /// E-step inputs: mean training loss of each model (self included, last) and its
    /// gradient: summed over all the silo's training data, or (`batched`) over the silo's next
    /// mini-batch, rescaled to the whole data's size (spec §5.4).
    Measure {
        /// The models to measure, with their owners.
        models: Vec<(NodeId, Arc<Vec<f32>>)>,
        /// The first sub-step of a mini-batch M-step (one batch drawn for all models).
        batched: bool,
    },
    /// Scale the gradients of the last `Measure` by the fresh weights and hand them over.
    Scale {
        /// The fresh weight of each measured model's owner.
        weights: Vec<(NodeId, f64)>,
    },
    /// A later sub-step of a mini-batch M-step: each model's gradient over the silo's next
    /// mini-batch (one batch for all), rescaled as in `Measure`, scaled by its held weight;
    /// answered by [`Done::Scaled`].
    Descend {
        /// `(owner, parameters, weight)`, self included, last.
        models: Vec<(NodeId, Arc<Vec<f32>>, f64)>,
    },
    /// One optimizer step on the inbox's sum.
    Step {
        /// The owner's inbox for the version it steps from.
        inbox: GradientInbox,
    },
    /// Test score of the inference mixture after `round`.
    Evaluate {
        /// Rounds completed.
        round: u64,
        /// `(owner, parameters, weight)`; the weights sum to 1.
        parts: Vec<(NodeId, Arc<Vec<f32>>, f64)>,
    },
}

/// What a job produced.
#[derive(Debug)]
pub enum Done {
    /// Mean training loss of each measured model.
    Measured {
        /// `(owner, mean loss)`, in the order of the `Measure` job.
        losses: Vec<(NodeId, f64)>,
    },
    /// The measured gradients, each scaled by its owner's weight.
    Scaled {
        /// `(owner, weighted gradient)`; the silo's own is among them.
        grads: Vec<(NodeId, Vec<f32>)>,
    },
    /// The step was taken.
    Stepped {
        /// The new parameters, to serve.
        params: Arc<Vec<f32>>,
        /// The new version v_i.
        version: u64,
    },
    /// The mixture's test score.
    Evaluated {
        /// The round the `Evaluate` job named.
        round: u64,
        /// Its score.
        score: Score,
    },
}

/// A test score, as numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Score {
    /// Summed loss.
    pub loss_sum: f64,
    /// Correct predictions.
    pub correct: usize,
    /// Test samples.
    pub count: usize,
}
