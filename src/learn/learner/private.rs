//! DP-SGD's gradient (spec `privacy.md` §2): per-example gradients of several models on one
//! batch, clipped jointly and noised once.
//!
//! Owns: per-example gradient norms from a tapped forward pass (each layer's input and the
//! loss's gradient at its output), the joint clip, the clipped sums and the Gaussian noise.
//! Must not: draw the batch (the caller's Poisson sample) or account for the release (that is
//! [`crate::privacy`]).
//!
//! Every layer is a matrix product `z = input · [weight; bias]` (a convolution through im2col),
//! so example `i`'s gradient of it is `input_iᵀ · g_i`, with `g_i` its rows of ∂L/∂z. A dense
//! layer has one row per example and its norm needs no per-example matrix ("ghost" norm:
//! ‖a_i‖²·‖g_i‖² + ‖g_i‖²); a convolution's per-example matrices are formed by one batched
//! product, the cost of the weight gradient a plain backward pass computes anyway.

use super::{Learner, loss_of};
use crate::learn::data::Dataset;
use crate::learn::error::LearnError;
use crate::learn::net::{Layer, Tap};
use crate::learn::params::with_f32_slice;
use candle_core::Tensor;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};
use std::collections::HashMap;
use std::ops::Range;

/// One DP-SGD release: per model, the noisy sum of jointly clipped per-example gradients.
#[derive(Clone, Debug, PartialEq)]
pub struct PrivateGrads {
    /// Per model, in the order given: Σ_i c_i·∇loss_i + N(0, (σC)²·I).
    pub grads: Vec<Vec<f32>>,
    /// Per model, the summed loss of the batch (not private: for the silo's own log only).
    pub loss_sums: Vec<f64>,
    /// Examples whose joint gradient norm exceeded the clip norm.
    pub clipped: usize,
}

/// One layer's per-example gradients, ready to be scaled by the clip factors and summed.
enum PerExample {
    /// `a` `[n, in]`, `g` `[n, out]`: example i's gradient is `a_iᵀ·g_i` (weight), `g_i` (bias).
    Dense { a: Tensor, g: Tensor },
    /// `[n, 9·c + 1, out]`: each example's `[weight; bias]` gradient.
    Conv(Tensor),
}

/// How each example's gradients on a step's models are clipped. Either way an example's
/// gradients on all the models together have L2 norm at most the total, so the step is one
/// invocation of the Gaussian mechanism with noise σ·total on every coordinate.
#[derive(Clone, Debug, PartialEq)]
pub enum Clip {
    /// One norm for the concatenated gradients (each model gets the share its gradient takes).
    Joint(f64),
    /// A norm per model, in the order of the models, whose squares sum to at most `total`²
    /// (a share of the sensitivity decided in advance, e.g. by the silo's weights).
    Split {
        /// The norm the noise is calibrated to.
        total: f64,
        /// Each model's norm.
        per_model: Vec<f64>,
    },
}

impl From<f64> for Clip {
    fn from(c: f64) -> Self {
        Self::Joint(c)
    }
}

impl Clip {
    /// The norm the noise is calibrated to.
    pub fn total(&self) -> f64 {
        match self {
            Self::Joint(c) | Self::Split { total: c, .. } => *c,
        }
    }

    /// The first thing wrong with it for `models` models, named.
    fn check(&self, models: usize) -> Result<(), String> {
        let total = self.total();
        if !(total.is_finite() && total > 0.0) {
            return Err(format!("DP-SGD needs a positive clip norm, got {total}"));
        }
        if let Self::Split { per_model, .. } = self {
            let sum: f64 = per_model.iter().map(|c| c * c).sum();
            if per_model.len() != models
                || per_model.iter().any(|c| !(c.is_finite() && *c >= 0.0))
                || sum > total * total * (1.0 + 1e-9)
            {
                return Err(format!(
                    "per-model clip norms {per_model:?} for {models} models must be finite, \
                     non-negative and within the total {total} in L2"
                ));
            }
        }
        Ok(())
    }
}

impl Learner {
    /// The DP-SGD gradients of `models` on `rows` of `data`: for every example, its gradients
    /// on all the models together are clipped to L2 norm `clip` (one joint clip, so the step is
    /// one invocation of the Gaussian mechanism, spec §2); each model's clipped sum then gets
    /// independent N(0, (`sigma`·`clip`)²) noise on every coordinate, drawn from `rng`.
    ///
    /// `rows` is the caller's Poisson sample and may be empty (the release is then noise).
    pub fn private_grads(
        &mut self,
        models: &[&[f32]],
        data: &Dataset,
        rows: &[usize],
        clip: impl Into<Clip>,
        sigma: f64,
        rng: &mut StdRng,
    ) -> Result<PrivateGrads, LearnError> {
        let clip = clip.into();
        clip.check(models.len()).map_err(LearnError::Shape)?;
        if !(sigma.is_finite() && sigma >= 0.0) {
            return Err(LearnError::Shape(format!(
                "DP-SGD needs a non-negative noise multiplier, got {sigma}"
            )));
        }
        self.check_data(data)?;
        super::check_rows(rows, data.len())?;
        let ranges: HashMap<String, Range<usize>> = self.tensors().into_iter().collect();
        let p = self.vars.len();
        let mut out = PrivateGrads {
            grads: vec![vec![0.0; p]; models.len()],
            loss_sums: vec![0.0; models.len()],
            clipped: 0,
        };
        for chunk in rows.chunks(self.batch_size) {
            let (x, y) = self.xy_gathered(data, chunk)?;
            let mut layers = Vec::with_capacity(models.len());
            // Each example's squared norm on all the models (summed in the order of the
            // layers, model after model), and per model.
            let mut joint = vec![0.0_f64; chunk.len()];
            let mut sq = vec![vec![0.0_f64; chunk.len()]; models.len()];
            for (m, params) in models.iter().enumerate() {
                self.vars.set(params)?;
                let (logits, taps) = self.eval_net.forward_tapped(&x)?;
                let loss = loss_of(&logits, &y, 1.0)?;
                out.loss_sums[m] += f64::from(loss.to_scalar::<f32>()?);
                let grads = loss.backward()?;
                let per = taps
                    .into_iter()
                    .map(|tap| per_example(&tap, &grads, chunk.len(), (&mut joint, &mut sq[m])))
                    .collect::<Result<Vec<_>, LearnError>>()?;
                layers.push(per);
            }
            let factors = clip_factors(&clip, &joint, &sq, &mut out.clipped);
            for ((per, grad), f) in layers.iter().zip(&mut out.grads).zip(factors) {
                let c = Tensor::from_vec(f, (chunk.len(), 1), &self.dev)?;
                for (tap_layer, pe) in per {
                    add_clipped(pe, &c, &ranges, *tap_layer, grad)?;
                }
            }
        }
        if sigma > 0.0 {
            let std = sigma * clip.total();
            let noise = Normal::new(0.0, std).map_err(|e| {
                LearnError::Shape(format!("noise of standard deviation {std}: {e}"))
            })?;
            for g in &mut out.grads {
                g.iter_mut()
                    .for_each(|v| *v += noise.sample(&mut *rng) as f32);
            }
        }
        Ok(out)
    }
}

impl Learner {
    /// The E-step's private losses: per model, the sum over `rows` of every example's loss
    /// clipped to [0, `loss_clip`], plus N(0, (`sigma`·`loss_clip`·√models)²) noise (an example's
    /// losses on all the models have L2 norm at most `loss_clip`·√models: one Gaussian
    /// mechanism).
    pub fn private_losses(
        &mut self,
        models: &[&[f32]],
        data: &Dataset,
        rows: &[usize],
        loss_clip: f64,
        sigma: f64,
        rng: &mut StdRng,
    ) -> Result<Vec<f64>, LearnError> {
        if !(loss_clip.is_finite() && loss_clip > 0.0 && sigma.is_finite() && sigma >= 0.0) {
            return Err(LearnError::Shape(format!(
                "private losses need a positive loss clip and a non-negative noise multiplier, got {loss_clip} and {sigma}"
            )));
        }
        self.check_data(data)?;
        super::check_rows(rows, data.len())?;
        let k = self.outputs();
        let mut sums = vec![0.0; models.len()];
        for (params, sum) in models.iter().zip(&mut sums) {
            self.vars.set(params)?;
            for chunk in rows.chunks(self.eval_chunk) {
                let (x, _) = self.xy_gathered(data, chunk)?;
                let out = self.eval_net.forward(&x)?;
                with_f32_slice(&out, |out| {
                    for (r, &row) in chunk.iter().enumerate() {
                        let loss = match &data.labels {
                            crate::learn::Labels::Class { ids, .. } => {
                                super::log_loss_and_argmax(
                                    &out[r * k..(r + 1) * k],
                                    ids[row] as usize,
                                )
                                .0
                            }
                            crate::learn::Labels::Real(ys) => {
                                (f64::from(out[r]) - f64::from(ys[row])).powi(2)
                            }
                        };
                        *sum += loss.clamp(0.0, loss_clip);
                    }
                })?;
            }
        }
        if sigma > 0.0 {
            let sd = sigma * loss_clip * (models.len() as f64).sqrt();
            let noise = Normal::new(0.0, sd)
                .map_err(|e| LearnError::Shape(format!("noise of standard deviation {sd}: {e}")))?;
            sums.iter_mut().for_each(|s| *s += noise.sample(&mut *rng));
        }
        Ok(sums)
    }
}

/// A layer's per-example gradients from its tap; adds each example's squared norm to `sq`.
fn per_example(
    tap: &Tap,
    grads: &candle_core::backprop::GradStore,
    n: usize,
    sq: (&mut [f64], &mut [f64]),
) -> Result<(Layer, PerExample), LearnError> {
    let g = grads
        .get(tap.probe.as_tensor())
        .ok_or_else(|| LearnError::Shape(format!("no gradient reached layer {:?}", tap.layer)))?;
    let pe = match tap.layer {
        Layer::Dense(_) => {
            let a_sq = tap.input.sqr()?.sum(1)?;
            let g_sq = g.sqr()?.sum(1)?;
            let norms = ((a_sq + 1.0)? * g_sq)?;
            add_norms(&norms, sq)?;
            PerExample::Dense {
                a: tap.input.clone(),
                g: g.clone(),
            }
        }
        Layer::Conv(_) => {
            let k = tap.input.dim(1)?;
            let cout = g.dim(1)?;
            let cols = tap.input.reshape((n, tap.positions, k))?;
            let g = g.reshape((n, tap.positions, cout))?;
            let m = cols.transpose(1, 2)?.matmul(&g)?;
            add_norms(&m.sqr()?.sum((1, 2))?, sq)?;
            PerExample::Conv(m)
        }
    };
    Ok((tap.layer, pe))
}

/// Per model, each example's clip factor (`min(1, norm allowed / norm)`) from its squared
/// norms on all the models (`joint`) and per model (`sq`); counts into `clipped` the examples
/// any factor shrinks.
fn clip_factors(clip: &Clip, joint: &[f64], sq: &[Vec<f64>], clipped: &mut usize) -> Vec<Vec<f32>> {
    let n = joint.len();
    let factor = |allowed: f64, s: f64| {
        let norm = s.sqrt();
        if norm > allowed {
            (allowed / norm) as f32
        } else {
            1.0
        }
    };
    let factors: Vec<Vec<f32>> = match clip {
        Clip::Joint(c) => vec![joint.iter().map(|&s| factor(*c, s)).collect(); sq.len()],
        Clip::Split { per_model, .. } => sq
            .iter()
            .zip(per_model)
            .map(|(m, &c)| m.iter().map(|&s| factor(c, s)).collect())
            .collect(),
    };
    *clipped += (0..n)
        .filter(|&i| factors.iter().any(|f| f[i] < 1.0))
        .count();
    factors
}

/// Adds each example's squared norm `norms` into both accumulators.
fn add_norms(norms: &Tensor, (joint, own): (&mut [f64], &mut [f64])) -> Result<(), LearnError> {
    with_f32_slice(norms, |v| {
        for ((j, o), &x) in joint.iter_mut().zip(own.iter_mut()).zip(v) {
            *j += f64::from(x);
            *o += f64::from(x);
        }
    })
}

/// Adds Σ_i c_i · (example i's gradient of `layer`) into the flat gradient `out`.
fn add_clipped(
    pe: &PerExample,
    c: &Tensor,
    ranges: &HashMap<String, Range<usize>>,
    layer: Layer,
    out: &mut [f32],
) -> Result<(), LearnError> {
    let (weight, bias) = match layer {
        Layer::Conv(i) => (format!("conv{i}.weight"), format!("conv{i}.bias")),
        Layer::Dense(i) => (format!("fc{i}.weight"), format!("fc{i}.bias")),
    };
    let (w, b) = match pe {
        PerExample::Dense { a, g } => {
            let gc = g.broadcast_mul(c)?;
            (a.t()?.matmul(&gc)?, gc.sum(0)?)
        }
        PerExample::Conv(m) => {
            let total = m.broadcast_mul(&c.unsqueeze(2)?)?.sum(0)?;
            let rows = total.dim(0)?;
            (total.narrow(0, 0, rows - 1)?, total.narrow(0, rows - 1, 1)?)
        }
    };
    for (name, t) in [(weight, w), (bias, b)] {
        let range = ranges
            .get(&name)
            .ok_or_else(|| LearnError::Shape(format!("no variable {name}")))?
            .clone();
        let t = t.flatten_all()?.contiguous()?;
        with_f32_slice(&t, |v| {
            if v.len() != range.len() {
                return Err(LearnError::Shape(format!(
                    "{name}: {} per-example values for {} parameters",
                    v.len(),
                    range.len()
                )));
            }
            out[range].iter_mut().zip(v).for_each(|(o, &x)| *o += x);
            Ok(())
        })??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::fixtures::{random_data, tiny_specs};
    use rand::SeedableRng;

    fn norm(v: &[f32]) -> f64 {
        v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()
    }

    /// The textbook computation: each example's gradient on each model from a batch of one,
    /// the joint norm, the clip, the sum.
    fn by_hand(
        l: &mut Learner,
        models: &[&[f32]],
        data: &Dataset,
        rows: &[usize],
        clip: f64,
    ) -> Vec<Vec<f32>> {
        let mut sums = vec![vec![0.0_f32; l.num_params()]; models.len()];
        for &r in rows {
            let per: Vec<Vec<f32>> = models
                .iter()
                .map(|p| l.loss_and_grad(p, data, Some(&[r])).unwrap().1)
                .collect();
            let joint = per.iter().map(|g| norm(g).powi(2)).sum::<f64>().sqrt();
            let c = (clip / joint).min(1.0) as f32;
            for (s, g) in sums.iter_mut().zip(&per) {
                s.iter_mut().zip(g).for_each(|(s, &g)| *s += c * g);
            }
        }
        sums
    }

    /// A clip split among the models: each model's example gradients clipped to its own
    /// norm, as a loop over examples does it; norms over the total are refused.
    #[test]
    fn a_split_clip_matches_the_textbook_per_model() {
        let mut rng = StdRng::seed_from_u64(8);
        for spec in tiny_specs() {
            let data = random_data(&spec, 9, &mut rng);
            let mut l = Learner::new(&spec, 4).unwrap();
            let (a, b) = (l.init_params(&mut rng), l.init_params(&mut rng));
            let models = [a.as_slice(), b.as_slice()];
            let rows = [0, 1, 2, 3, 4, 5, 6, 7, 8];
            let per: Vec<Vec<Vec<f32>>> = rows
                .iter()
                .map(|&r| {
                    models
                        .iter()
                        .map(|p| l.loss_and_grad(p, &data, Some(&[r])).unwrap().1)
                        .collect()
                })
                .collect();
            // Each model's norm at its examples' median: about half of them clipped.
            let median = |m: usize| {
                let mut n: Vec<f64> = per.iter().map(|g| norm(&g[m])).collect();
                n.sort_by(f64::total_cmp);
                n[n.len() / 2]
            };
            let per_model = vec![median(0), 0.5 * median(1)];
            let total = per_model.iter().map(|c| c * c).sum::<f64>().sqrt();
            let clip = Clip::Split {
                total,
                per_model: per_model.clone(),
            };
            let got = l
                .private_grads(&models, &data, &rows, clip, 0.0, &mut rng)
                .unwrap();
            for (m, g) in got.grads.iter().enumerate() {
                let mut want = vec![0.0_f32; l.num_params()];
                for ex in &per {
                    let c = (per_model[m] / norm(&ex[m])).min(1.0) as f32;
                    want.iter_mut().zip(&ex[m]).for_each(|(s, &x)| *s += c * x);
                }
                let scale = norm(&want).max(1e-6);
                for (x, y) in g.iter().zip(&want) {
                    assert!(
                        f64::from((x - y).abs()) / scale < 1e-4,
                        "{spec:?} model {m}: {x} vs {y}"
                    );
                }
            }
            assert!(got.clipped >= 1 && got.clipped <= rows.len(), "{spec:?}");
            let over = Clip::Split {
                total: 1.0,
                per_model: vec![0.8, 0.8],
            };
            let short = Clip::Split {
                total: 1.0,
                per_model: vec![0.5],
            };
            for bad in [over, short] {
                assert!(
                    l.private_grads(&models, &data, &rows, bad, 1.0, &mut rng)
                        .is_err()
                );
            }
        }
    }

    #[test]
    fn per_example_clipping_matches_the_textbook_on_every_architecture() {
        let mut rng = StdRng::seed_from_u64(7);
        for spec in tiny_specs() {
            let data = random_data(&spec, 11, &mut rng);
            // A batch size that splits the rows into chunks, one row an outlier.
            let mut l = Learner::new(&spec, 4).unwrap();
            let (a, b) = (l.init_params(&mut rng), l.init_params(&mut rng));
            let models = [a.as_slice(), b.as_slice()];
            let rows = [3, 0, 10, 3, 7, 5, 1, 9, 2];
            // The median joint norm as clip: about half the examples are clipped.
            let mut joint: Vec<f64> = rows
                .iter()
                .map(|&r| {
                    models
                        .iter()
                        .map(|p| norm(&l.loss_and_grad(p, &data, Some(&[r])).unwrap().1).powi(2))
                        .sum::<f64>()
                        .sqrt()
                })
                .collect();
            joint.sort_by(f64::total_cmp);
            // Between two distinct norms, so the ghost and the direct norm agree on the side.
            let k = (rows.len() / 2..rows.len() - 1)
                .find(|&k| joint[k + 1] > joint[k] * 1.01)
                .unwrap();
            let clip = (joint[k] + joint[k + 1]) / 2.0;
            let want = by_hand(&mut l, &models, &data, &rows, clip);
            let got = l
                .private_grads(&models, &data, &rows, clip, 0.0, &mut rng)
                .unwrap();
            assert_eq!(got.clipped, rows.len() - k - 1, "{spec:?}");
            assert!(got.clipped >= 1 && got.clipped < rows.len());
            for (g, w) in got.grads.iter().zip(&want) {
                let scale = norm(w).max(1e-6);
                for (i, (x, y)) in g.iter().zip(w).enumerate() {
                    assert!(
                        f64::from((x - y).abs()) / scale < 1e-4,
                        "{spec:?} parameter {i}: {x} vs {y}"
                    );
                }
            }
            // Unclipped, it is the plain summed gradient; and its loss is the plain loss.
            let plain = l
                .private_grads(&models, &data, &rows, 1e12, 0.0, &mut rng)
                .unwrap();
            assert_eq!(plain.clipped, 0);
            for (m, p) in models.iter().enumerate() {
                let (loss, g) = l.loss_and_grad(p, &data, Some(&rows)).unwrap();
                assert!((plain.loss_sums[m] - loss).abs() < 1e-3 * loss.abs().max(1.0));
                let scale = norm(&g).max(1e-6);
                for (x, y) in plain.grads[m].iter().zip(&g) {
                    assert!(
                        f64::from((x - y).abs()) / scale < 1e-4,
                        "{spec:?}: {x} vs {y}"
                    );
                }
            }
        }
    }

    #[test]
    fn one_example_moves_the_release_by_at_most_the_clip_norm() {
        // The attack DP bounds: a row with extreme features (×1000). Without the clip its
        // gradient dominates; with it, the example's contribution to all the models together
        // is at most C.
        let mut rng = StdRng::seed_from_u64(3);
        let spec = ModelSpecFixture::mlp();
        let mut data = random_data(&spec, 6, &mut rng);
        let d = data.feature_len();
        data.features[..d].iter_mut().for_each(|x| *x *= 1000.0);
        let mut l = Learner::new(&spec, 8).unwrap();
        let (a, b) = (l.init_params(&mut rng), l.init_params(&mut rng));
        let models = [a.as_slice(), b.as_slice()];
        let with = l
            .private_grads(&models, &data, &[0, 1, 2], 0.5, 0.0, &mut rng)
            .unwrap();
        let without = l
            .private_grads(&models, &data, &[1, 2], 0.5, 0.0, &mut rng)
            .unwrap();
        let moved: f64 = with
            .grads
            .iter()
            .zip(&without.grads)
            .map(|(x, y)| {
                x.iter()
                    .zip(y)
                    .map(|(x, y)| f64::from(x - y).powi(2))
                    .sum::<f64>()
            })
            .sum::<f64>()
            .sqrt();
        assert!(
            moved <= 0.5 * (1.0 + 1e-4),
            "the outlier moved the release by {moved}"
        );
        assert!(moved > 0.49, "the outlier was clipped to {moved}, not to C");
        let raw = norm(&l.loss_and_grad(&a, &data, Some(&[0])).unwrap().1);
        assert!(raw > 50.0, "the outlier's raw gradient is only {raw}");
    }

    #[test]
    fn the_noise_has_the_promised_spread_and_follows_the_seed() {
        let spec = ModelSpec::Mlp {
            inputs: 20,
            hidden: vec![40],
            classes: 5,
        };
        let mut rng = StdRng::seed_from_u64(5);
        let data = random_data(&spec, 4, &mut rng);
        let mut l = Learner::new(&spec, 8).unwrap();
        let p = l.init_params(&mut rng);
        let (clip, sigma) = (0.5, 2.0);
        let run = |l: &mut Learner, seed| {
            l.private_grads(
                &[&p, &p],
                &data,
                &[],
                clip,
                sigma,
                &mut StdRng::seed_from_u64(seed),
            )
            .unwrap()
        };
        let noise = run(&mut l, 9);
        assert_eq!(noise, run(&mut l, 9), "the same seed gives the same noise");
        assert_ne!(
            noise.grads[0], noise.grads[1],
            "each model gets its own noise"
        );
        let all: Vec<f64> = noise.grads.concat().iter().map(|&x| f64::from(x)).collect();
        let mean = all.iter().sum::<f64>() / all.len() as f64;
        let sd = (all.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / all.len() as f64).sqrt();
        assert!(all.len() > 1500);
        assert!(mean.abs() < 0.1, "noise mean {mean}");
        assert!(
            (sd - sigma * clip).abs() < 0.05 * sigma * clip,
            "noise sd {sd}, want {}",
            sigma * clip
        );
    }

    #[test]
    fn a_bad_clip_or_noise_is_refused() {
        let spec = ModelSpecFixture::mlp();
        let mut rng = StdRng::seed_from_u64(1);
        let data = random_data(&spec, 3, &mut rng);
        let mut l = Learner::new(&spec, 8).unwrap();
        let p = l.init_params(&mut rng);
        for (c, s) in [
            (0.0, 1.0),
            (f64::NAN, 1.0),
            (1.0, -1.0),
            (1.0, f64::INFINITY),
        ] {
            assert!(l.private_grads(&[&p], &data, &[0], c, s, &mut rng).is_err());
        }
        assert!(
            l.private_grads(&[&p], &data, &[3], 1.0, 1.0, &mut rng)
                .is_err(),
            "row out of range"
        );
    }

    struct ModelSpecFixture;
    impl ModelSpecFixture {
        fn mlp() -> crate::learn::ModelSpec {
            crate::learn::ModelSpec::Mlp {
                inputs: 4,
                hidden: vec![5, 4],
                classes: 3,
            }
        }
    }
    use crate::learn::ModelSpec;
}
