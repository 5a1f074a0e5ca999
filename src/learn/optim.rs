//! Optimizers on flat parameter vectors.
//! Owns: Adam with state that persists across rounds (the owner of a model keeps it).
//! Must not: touch tensors.

use serde::{Deserialize, Serialize};

/// Adam (Kingma & Ba) with bias correction; betas 0.9 / 0.999, eps 1e-8 by default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Adam {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator guard.
    pub eps: f32,
    m: Vec<f32>,
    v: Vec<f32>,
    t: i32,
}

impl Adam {
    /// Zeroed state for `n` parameters.
    pub fn new(n: usize, lr: f32) -> Self {
        let _ = (n, lr);
        todo!()
    }

    /// One step: `params -= lr * m̂ / (sqrt(v̂) + eps)`.
    pub fn step(&mut self, params: &mut [f32], grad: &[f32]) {
        let _ = (params, grad);
        todo!()
    }

    /// Forgets the moments (FedAvg clients restart from the global model each round).
    pub fn reset(&mut self) {
        todo!()
    }

    /// Steps taken since creation or the last reset.
    pub fn steps(&self) -> i32 {
        self.t
    }
}
