//! Model architectures and the [`Learner`]: a candle model that evaluates, differentiates and
//! trains *any* flat parameter vector of its architecture.
//! Owns: architectures, seeded initialisation, losses, summed gradients, inference.
//! Must not: keep parameters between calls (callers pass them in) or know about peers.

use super::data::Dataset;
use super::optim::Adam;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

/// Errors from building or running a model.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    /// An error inside candle.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// Parameters or data that do not fit the architecture.
    #[error("{0}")]
    Shape(String),
}

/// An architecture. All silos of a run share one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelSpec {
    /// Linear regression `y = W x + b`, squared-error loss.
    Linear {
        /// Input features.
        inputs: usize,
        /// Outputs (1 for the sine toy).
        outputs: usize,
    },
    /// Multinomial logistic (softmax) regression, cross-entropy loss.
    Softmax {
        /// Input features.
        inputs: usize,
        /// Classes.
        classes: usize,
    },
    /// Multi-layer perceptron with ReLU, cross-entropy loss.
    Mlp {
        /// Input features.
        inputs: usize,
        /// Hidden layer widths.
        hidden: Vec<usize>,
        /// Classes.
        classes: usize,
    },
    /// Small CNN (CNN2-like, FedeRiCo spec §7.2): per conv layer a 3×3 convolution without
    /// padding, 2×2 max-pool and ReLU; then one fully connected layer.
    Cnn {
        /// Input channels.
        channels: usize,
        /// Input height.
        height: usize,
        /// Input width.
        width: usize,
        /// Output channels of each conv layer.
        conv: Vec<usize>,
        /// Classes.
        classes: usize,
    },
}

impl ModelSpec {
    /// True for regression models (squared-error loss, real outputs).
    pub fn is_regression(&self) -> bool {
        matches!(self, ModelSpec::Linear { .. })
    }

    /// A stable hash of the architecture, sent with every model so peers can refuse a mismatch.
    pub fn fingerprint(&self) -> u64 {
        todo!()
    }

    /// Number of f32 parameters.
    pub fn num_params(&self) -> usize {
        todo!()
    }
}

/// Result of evaluating one parameter vector on a data set (inference mode).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Evaluation {
    /// Sum over samples of the per-sample loss (cross-entropy, or squared error).
    pub loss_sum: f64,
    /// Correctly classified samples (0 for regression).
    pub correct: usize,
    /// Samples evaluated.
    pub count: usize,
}

impl Evaluation {
    /// Mean per-sample loss.
    pub fn mean_loss(&self) -> f64 {
        self.loss_sum / self.count.max(1) as f64
    }
    /// Fraction correct.
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.count.max(1) as f64
    }
}

/// A candle model used as a workspace: each call loads the parameters it is given.
pub struct Learner {
    _todo: (),
}

impl Learner {
    /// Builds the workspace for `spec`; `batch_size` chunks every pass over data.
    pub fn new(spec: &ModelSpec, batch_size: usize) -> Result<Self, LearnError> {
        let _ = (spec, batch_size);
        todo!()
    }

    /// The architecture.
    pub fn spec(&self) -> &ModelSpec {
        todo!()
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        todo!()
    }

    /// Width of the output (classes, or regression outputs).
    pub fn outputs(&self) -> usize {
        todo!()
    }

    /// Fresh parameters from the caller's seeded RNG (candle's CPU init cannot be seeded).
    pub fn init_params(&self, rng: &mut StdRng) -> Vec<f32> {
        let _ = rng;
        todo!()
    }

    /// Summed loss and accuracy of `params` on `data`, in inference mode, without a graph.
    pub fn evaluate(&mut self, params: &[f32], data: &Dataset) -> Result<Evaluation, LearnError> {
        let _ = (params, data);
        todo!()
    }

    /// Summed loss and **summed** gradient (over samples) of `params` on the given rows of
    /// `data` (all rows when `None`), in chunks of the batch size.
    pub fn loss_and_grad(
        &mut self,
        params: &[f32],
        data: &Dataset,
        rows: Option<&[usize]>,
    ) -> Result<(f64, Vec<f32>), LearnError> {
        let _ = (params, data, rows);
        todo!()
    }

    /// Outputs for every sample, row-major `len × outputs()`: class probabilities (softmax)
    /// for classifiers, raw outputs for regression.
    pub fn predict(&mut self, params: &[f32], data: &Dataset) -> Result<Vec<f32>, LearnError> {
        let _ = (params, data);
        todo!()
    }

    /// One epoch of mini-batch training: shuffle with `rng`, one optimizer step per batch on
    /// the batch-mean loss. Returns the mean training loss over the epoch.
    pub fn train_epoch(
        &mut self,
        params: &mut [f32],
        opt: &mut Adam,
        data: &Dataset,
        rng: &mut StdRng,
    ) -> Result<f64, LearnError> {
        let _ = (params, opt, data, rng);
        todo!()
    }
}
