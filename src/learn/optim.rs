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
        Self {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            m: vec![0.0; n],
            v: vec![0.0; n],
            t: 0,
        }
    }

    /// Number of parameters the state was made for.
    pub fn num_params(&self) -> usize {
        self.m.len()
    }

    /// One step: `params -= lr * m̂ / (sqrt(v̂) + eps)`.
    ///
    /// # Panics
    /// If `params` or `grad` do not have [`Adam::num_params`] entries (a caller bug: the
    /// state belongs to one model).
    pub fn step(&mut self, params: &mut [f32], grad: &[f32]) {
        let n = self.m.len();
        assert!(
            params.len() == n && grad.len() == n,
            "Adam state for {n} parameters given {} parameters and {} gradients",
            params.len(),
            grad.len()
        );
        self.t += 1;
        let (b1, b2, eps) = (self.beta1, self.beta2, self.eps);
        // As PyTorch: lr * (m / c1) / (sqrt(v) / sqrt(c2) + eps), with the per-step constants
        // hoisted out of the loop.
        let c1 = 1.0 - b1.powi(self.t);
        let inv_sc2 = 1.0 / (1.0 - b2.powi(self.t)).sqrt();
        let step = self.lr / c1;
        let (a1, a2) = (1.0 - b1, 1.0 - b2);
        for (((p, &g), m), v) in params
            .iter_mut()
            .zip(grad)
            .zip(&mut self.m)
            .zip(&mut self.v)
        {
            *m = b1 * *m + a1 * g;
            *v = b2 * *v + a2 * g * g;
            *p -= step * *m / (v.sqrt() * inv_sc2 + eps);
        }
    }

    /// Forgets the moments (FedAvg clients restart from the global model each round).
    pub fn reset(&mut self) {
        self.m.fill(0.0);
        self.v.fill(0.0);
        self.t = 0;
    }

    /// Steps taken since creation or the last reset.
    pub fn steps(&self) -> i32 {
        self.t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_step_moves_each_parameter_by_lr_against_the_gradient_sign() {
        let mut opt = Adam::new(5, 0.01);
        let mut p = vec![1.0, -2.0, 0.5, 3.0, 0.0];
        let start = p.clone();
        let g = [0.3, -4.0, 1e-3, -1e-2, 50.0];
        opt.step(&mut p, &g);
        for i in 0..5 {
            let moved = p[i] - start[i];
            assert!(
                (moved + 0.01 * g[i].signum()).abs() < 1e-6,
                "parameter {i} moved {moved}"
            );
        }
        assert_eq!(opt.steps(), 1);
    }

    #[test]
    fn state_persists_between_steps_and_reset_forgets_it() {
        let mut opt = Adam::new(1, 0.1);
        let mut p = [0.0f32];
        opt.step(&mut p, &[1.0]);
        opt.step(&mut p, &[-1.0]);
        // m = 0.9*0.1 - 0.1 = -0.01, v = 0.999*0.001 + 0.001; m̂ = -0.01/0.19, v̂ = v/(1-0.999²).
        let m_hat = -0.01f32 / 0.19;
        let v_hat = (0.999f32 * 0.001 + 0.001) / (1.0 - 0.999f32 * 0.999);
        let expected = -0.1 - 0.1 * m_hat / (v_hat.sqrt() + 1e-8);
        assert!((p[0] - expected).abs() < 1e-6, "{} vs {expected}", p[0]);
        opt.reset();
        assert_eq!(opt.steps(), 0);
        assert_eq!(opt, Adam::new(1, 0.1));
        let mut q = [0.0f32];
        opt.step(&mut q, &[-1.0]);
        assert!((q[0] - 0.1).abs() < 1e-6);
    }

    #[test]
    #[should_panic(expected = "Adam state for 2 parameters")]
    fn step_with_the_wrong_length_panics() {
        Adam::new(2, 0.1).step(&mut [0.0; 3], &[0.0; 3]);
    }
}
