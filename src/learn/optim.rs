//! Optimizers on flat parameter vectors.
//! Owns: Adam with state that persists across rounds (the owner of a model keeps it) and can
//! never become non-finite, and SGD with momentum and weight decay (the local optimiser of
//! FedDisco's and FedSaC's code).
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
        let k = StepConsts {
            b1,
            b2,
            a1: 1.0 - b1,
            a2: 1.0 - b2,
            step,
            inv_sc2,
            eps,
        };
        // One read of the gradient: an honest one goes through the step as it is, an extreme
        // one (or a NaN) as a bounded copy, so the step's loop stays as fast as before.
        let in_range = grad.iter().fold(true, |ok, g| ok & (g.abs() <= GRAD_LIMIT));
        let copy: Vec<f32>;
        let grad = if in_range {
            grad
        } else {
            copy = grad.iter().map(|&g| bounded(g)).collect();
            &copy
        };
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU supports AVX, checked just above.
            unsafe { step_avx(&k, params, grad, &mut self.m, &mut self.v) };
            return;
        }
        step_loop(&k, params, grad, &mut self.m, &mut self.v);
    }

    /// Forgets the moments (FedAvg clients restart from the global model each round).
    pub fn reset(&mut self) {
        self.m.fill(0.0);
        self.v.fill(0.0);
        self.t = 0;
    }

    /// Whether every moment is finite. [`Adam::step`] keeps them so; state written by an
    /// older federico may not be (a gradient of 3.4e38 overflowed v to +inf, after which
    /// every step was 0: the model froze for good).
    pub fn is_finite(&self) -> bool {
        self.m.iter().chain(&self.v).all(|x| x.is_finite())
    }

    /// Forgets the moments if any is not finite ([`Adam::is_finite`]); returns whether it did.
    /// The model's parameters are kept: only the optimizer's memory of past gradients goes.
    pub fn repair(&mut self) -> bool {
        if self.is_finite() {
            return false;
        }
        self.reset();
        true
    }

    /// Steps taken since creation or the last reset.
    pub fn steps(&self) -> i32 {
        self.t
    }
}

/// The per-step constants of [`Adam::step`].
struct StepConsts {
    b1: f32,
    b2: f32,
    a1: f32,
    a2: f32,
    step: f32,
    inv_sc2: f32,
    eps: f32,
}

/// The largest gradient coordinate Adam takes as it is; larger ones are clamped to ±this, and
/// a NaN counts as 0. So v, which sums g² with weights below 1, stays below 1e36 and finite,
/// m below 1e18, and a step moves a parameter by a few learning rates at most, whatever the
/// gradient (insiders' review P3: a finite 3.4e38 squared to +inf in v and froze the model).
/// No honest gradient comes near: training gradients are below 1e3 by many orders.
pub const GRAD_LIMIT: f32 = 1e18;

/// `g` as [`Adam::step`] takes it: clamped to ±[`GRAD_LIMIT`], NaN as 0. The identity on
/// every value in range, so honest steps are bit for bit what they were.
#[inline(always)]
fn bounded(g: f32) -> f32 {
    if g.is_nan() {
        0.0
    } else {
        g.clamp(-GRAD_LIMIT, GRAD_LIMIT)
    }
}

/// The element-wise update; inlined into each instruction-set variant.
#[inline(always)]
fn step_loop(k: &StepConsts, params: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32]) {
    for (((p, &g), m), v) in params.iter_mut().zip(grad).zip(m).zip(v) {
        *m = flush_subnormal(k.b1 * *m + k.a1 * g);
        *v = flush_subnormal(k.b2 * *v + k.a2 * g * g);
        *p -= k.step * *m / (v.sqrt() * k.inv_sc2 + k.eps);
    }
}

/// [`step_loop`] compiled for AVX: 8 lanes instead of SSE2's 4 (twice as fast on 159k
/// parameters). No FMA, so results are bit-identical to the SSE2 path: every operation is
/// IEEE-rounded the same way whatever the vector width.
///
/// # Safety
/// The CPU must support AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn step_avx(k: &StepConsts, params: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32]) {
    step_loop(k, params, grad, m, v);
}

/// Zero for subnormal values (below `f32::MIN_POSITIVE` ≈ 1.2e-38).
///
/// The first moments of rarely active inputs (MNIST's edge pixels) decay by `beta1` per step
/// into the subnormal range, where every operation on them takes a slow microcode path: with a
/// few thousand such moments, Adam steps took twice as long (see `benches/train_step.rs`).
/// Their contribution to the step is below `lr · 1e-30`, so dropping them changes nothing.
#[inline(always)]
fn flush_subnormal(x: f32) -> f32 {
    if x.abs() < f32::MIN_POSITIVE { 0.0 } else { x }
}

/// SGD with momentum and L2 weight decay, as PyTorch's `torch.optim.SGD` (no dampening, no
/// Nesterov): `g ← grad + wd·θ`, `buf ← g` on the first step, else `buf ← μ·buf + g`;
/// `θ ← θ − lr·buf`. FedDisco's and FedSaC's official code re-create it every round, so the
/// momentum restarts ([`Sgd::reset`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
    /// Momentum μ (0 for plain SGD).
    pub momentum: f32,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f32,
    buf: Vec<f32>,
    started: bool,
}

impl Sgd {
    /// Zeroed momentum for `n` parameters.
    pub fn new(n: usize, lr: f32, momentum: f32, weight_decay: f32) -> Self {
        Self {
            lr,
            momentum,
            weight_decay,
            buf: vec![0.0; n],
            started: false,
        }
    }

    /// One step on the (mean) gradient `grad`.
    ///
    /// # Panics
    /// If `params` or `grad` do not have as many entries as the state (a caller bug).
    pub fn step(&mut self, params: &mut [f32], grad: &[f32]) {
        let n = self.buf.len();
        assert!(
            params.len() == n && grad.len() == n,
            "SGD state for {n} parameters given {} parameters and {} gradients",
            params.len(),
            grad.len()
        );
        let (lr, mu, wd, first) = (self.lr, self.momentum, self.weight_decay, !self.started);
        for ((p, &g), b) in params.iter_mut().zip(grad).zip(&mut self.buf) {
            let g = g + wd * *p;
            *b = if first {
                g
            } else {
                flush_subnormal(mu * *b + g)
            };
            *p -= lr * *b;
        }
        self.started = true;
    }

    /// Forgets the momentum.
    pub fn reset(&mut self) {
        self.buf.fill(0.0);
        self.started = false;
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
    fn moments_never_become_subnormal() {
        let mut opt = Adam::new(2, 0.1);
        let mut p = [0.0f32; 2];
        opt.step(&mut p, &[1e-38, 1e-20]);
        // 1e-21 · 0.9^t falls below 1.2e-38 after 372 steps.
        for _ in 0..400 {
            opt.step(&mut p, &[0.0, 0.0]);
            assert!(
                opt.m.iter().chain(&opt.v).all(|x| !x.is_subnormal()),
                "{opt:?}"
            );
        }
        assert_eq!(opt.m, [0.0, 0.0]);
        assert!(p.iter().all(|x| x.is_finite()));
    }

    /// Insiders' review P3: one gradient of the largest finite f32 overflowed v to +inf, and
    /// every later step was 0 for good. Fails without [`bounded`]. (A clamped extreme gradient
    /// still inflates v for a long time; keeping gradients at the federation's scale is the
    /// owner's norm bound's job, `core::NormBound`.)
    #[test]
    fn an_extreme_gradient_leaves_the_state_finite_and_the_step_bounded() {
        for bad in [f32::MAX, f32::MIN, f32::INFINITY, f32::NAN, 1e30] {
            let mut opt = Adam::new(3, 0.01);
            let mut p = vec![0.5f32, -0.5, 0.0];
            opt.step(&mut p, &[bad, bad, 0.1]);
            assert!(opt.is_finite(), "{bad}: {opt:?}");
            assert!(p.iter().all(|x| x.is_finite()), "{bad}: {p:?}");
            // The step of an extreme gradient is bounded like any Adam step.
            assert!((p[0] - 0.5).abs() <= 0.011, "{bad}: {p:?}");
            for _ in 0..1000 {
                opt.step(&mut p, &[0.3, -0.2, 0.1]);
                assert!(opt.is_finite() && p.iter().all(|x| x.is_finite()), "{bad}");
            }
        }
    }

    #[test]
    fn repair_forgets_non_finite_moments_only() {
        let mut opt = Adam::new(2, 0.1);
        opt.step(&mut [0.0; 2], &[1.0, 1.0]);
        let good = opt.clone();
        assert!(!opt.repair());
        assert_eq!(opt, good);
        opt.v[1] = f32::INFINITY; // as an older federico could checkpoint it
        assert!(!opt.is_finite());
        assert!(opt.repair());
        assert_eq!(opt, Adam::new(2, 0.1));
    }

    #[test]
    fn vector_and_scalar_paths_agree_bit_for_bit() {
        let n = 1003; // not a multiple of the vector width
        let g: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
            .collect();
        let (mut fast, mut slow) = (Adam::new(n, 0.01), Adam::new(n, 0.01));
        let (mut p, mut q) = (vec![0.5f32; n], vec![0.5f32; n]);
        for _ in 0..3 {
            fast.step(&mut p, &g);
            slow.t += 1;
            let k = StepConsts {
                b1: 0.9,
                b2: 0.999,
                a1: 1.0 - 0.9,
                a2: 1.0 - 0.999,
                step: 0.01 / (1.0 - 0.9f32.powi(slow.t)),
                inv_sc2: 1.0 / (1.0 - 0.999f32.powi(slow.t)).sqrt(),
                eps: 1e-8,
            };
            step_loop(&k, &mut q, &g, &mut slow.m, &mut slow.v);
        }
        assert_eq!(p, q);
        assert_eq!(fast, slow);
    }

    #[test]
    fn sgd_matches_torch_momentum_and_weight_decay() {
        let mut opt = Sgd::new(1, 0.1, 0.9, 0.01);
        let mut p = [1.0f32];
        opt.step(&mut p, &[0.5]);
        // g = 0.5 + 0.01 = 0.51; buf = 0.51; p = 1 − 0.051.
        assert!((p[0] - 0.949).abs() < 1e-6);
        opt.step(&mut p, &[0.5]);
        // g = 0.5 + 0.00949; buf = 0.9·0.51 + 0.50949 = 0.96849; p = 0.949 − 0.096849.
        assert!((p[0] - (0.949 - 0.096849)).abs() < 1e-6, "{}", p[0]);
        opt.reset();
        let mut q = [0.0f32];
        opt.step(&mut q, &[1.0]);
        assert!((q[0] + 0.1).abs() < 1e-7);
    }

    #[test]
    #[should_panic(expected = "Adam state for 2 parameters")]
    fn step_with_the_wrong_length_panics() {
        Adam::new(2, 0.1).step(&mut [0.0; 3], &[0.0; 3]);
    }
}
