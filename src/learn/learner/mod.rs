//! The [`Learner`]: a candle model that evaluates, differentiates and trains *any* flat
//! parameter vector of its architecture.
//!
//! Owns: the variables and their flattening order, seeded initialisation, losses, summed
//! gradients, inference, training epochs, [`Evaluation`].
//! Must not: keep parameters between calls (callers pass them in) or know about peers.

mod private;

pub use private::{Clip, PrivateGrads};

use super::data::{Dataset, Labels};
use super::error::LearnError;
use super::net::Net;
use super::optim::Adam;
use super::params::{FlatVars, with_f32_slice};
use super::spec::{ModelSpec, Plan};
use candle_core::{D, DType, Device, Tensor};
use candle_nn::{Init, VarMap};
use rand::RngExt;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use std::collections::HashMap;

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

/// Smallest chunk [`Learner::evaluate`] and [`Learner::predict`] use for dense models (larger
/// matrix products run faster; the CNN keeps the batch size, its temporaries grow quickly).
const EVAL_CHUNK: usize = 500;

/// A candle model used as a workspace: each call loads the parameters it is given.
///
/// Build one per thread and reuse it: the variables, the training network and the inference
/// network (detached views of the same storage) are made once in [`Learner::new`].
///
/// # Parameter layout
/// One f32 vector: the variables sorted by name (`conv0.bias`, `conv0.weight`, `conv1.bias`,
/// …, `fc0.bias`, `fc0.weight`, `fc1.bias`, …), each row-major. Dense weights are `[in, out]`
/// (`y = x·W + b`), conv weights `[3, 3, in, out]`, and the CNN flattens its last feature map
/// channels-last (`h, w, c`) before `fc0`. This is the crate's own order, not PyTorch's
/// `state_dict`; [`ModelSpec::fingerprint`] checks the architecture, not this layout.
pub struct Learner {
    /// The architecture.
    spec: ModelSpec,
    /// Rows per chunk for gradients and training steps.
    batch_size: usize,
    /// Rows per chunk for inference.
    eval_chunk: usize,
    /// Where tensors live (the CPU).
    dev: Device,
    /// The variables, in flattening order.
    vars: FlatVars,
    /// `(values, bound)` per variable, in flattening order: init draws U(−bound, bound).
    init_bounds: Vec<(usize, f32)>,
    /// Network on the variables: records a graph for backprop.
    train_net: Net,
    /// Network on detached views of the variables: inference without a graph.
    eval_net: Net,
    /// Shape of one sample as the network takes it.
    input_shape: Vec<usize>,
    /// Reused buffer for gathered feature rows.
    xbuf: Vec<f32>,
    /// Reused buffer for one batch's gradient (training).
    gbuf: Vec<f32>,
}

/// The targets of one chunk, as the loss needs them.
enum Target {
    /// Class ids, `[n]` u32.
    Class(Tensor),
    /// Real targets, `[n, 1]` f32.
    Real(Tensor),
}

impl Learner {
    /// Builds the workspace for `spec`; `batch_size` chunks every pass over data.
    pub fn new(spec: &ModelSpec, batch_size: usize) -> Result<Self, LearnError> {
        spec.validate()?;
        if batch_size == 0 {
            return Err(LearnError::Shape(
                "batch size must be positive, got 0".into(),
            ));
        }
        let dev = Device::Cpu;
        let plan = Plan::of(spec);
        let vm = VarMap::new();
        // Zero-initialised here; real values come from `init_params` (candle's CPU init is unseeded).
        let train_net = Net::build(&plan, |name, shape| {
            vm.get(shape, name, Init::Const(0.0), DType::F32, &dev)
        })?;
        let detached: HashMap<String, Tensor> = {
            let data = vm
                .data()
                .lock()
                .expect("the VarMap lock is only taken briefly, never across a panic");
            data.iter()
                .map(|(k, v)| (k.clone(), v.as_tensor().detach()))
                .collect()
        };
        let eval_net = Net::build(&plan, |name, _| {
            detached
                .get(name)
                .cloned()
                .ok_or_else(|| candle_core::Error::Msg(format!("no variable {name}")))
        })?;
        let vars = FlatVars::new(&vm);
        let fan_in: HashMap<String, usize> = plan
            .variables()
            .into_iter()
            .map(|(n, _, f)| (n, f))
            .collect();
        let init_bounds = vars
            .layout()
            .map(|(name, dims)| {
                (
                    dims.iter().product(),
                    1.0 / (fan_in[name].max(1) as f32).sqrt(),
                )
            })
            .collect();
        debug_assert_eq!(vars.len(), spec.num_params());
        let eval_chunk = if matches!(spec, ModelSpec::Cnn { .. }) {
            batch_size
        } else {
            batch_size.max(EVAL_CHUNK)
        };
        Ok(Learner {
            spec: spec.clone(),
            batch_size,
            eval_chunk,
            dev,
            gbuf: vec![0.0; vars.len()],
            vars,
            init_bounds,
            train_net,
            eval_net,
            input_shape: spec.input_shape(),
            xbuf: Vec::new(),
        })
    }

    /// The architecture.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.vars.len()
    }

    /// Every variable's name (`fc0.bias`, `conv1.weight`, …) and its range in the flat
    /// parameter vector, in flattening order.
    pub fn tensors(&self) -> Vec<(String, std::ops::Range<usize>)> {
        let mut at = 0;
        self.vars
            .layout()
            .map(|(name, dims)| {
                let len: usize = dims.iter().product();
                at += len;
                (name.to_string(), at - len..at)
            })
            .collect()
    }

    /// Every variable's name and shape, in flattening order (for exporting).
    pub fn layout(&self) -> Vec<(String, Vec<usize>)> {
        self.vars
            .layout()
            .map(|(name, dims)| (name.to_string(), dims.to_vec()))
            .collect()
    }

    /// Width of the output (classes, or regression outputs).
    pub fn outputs(&self) -> usize {
        self.spec.outputs()
    }

    /// Fresh parameters from the caller's seeded RNG (candle's CPU init cannot be seeded).
    ///
    /// PyTorch's default: weights and biases of a layer drawn from U(−1/√fan_in, 1/√fan_in).
    pub fn init_params(&self, rng: &mut StdRng) -> Vec<f32> {
        let mut p = Vec::with_capacity(self.vars.len());
        for &(n, bound) in &self.init_bounds {
            p.extend((0..n).map(|_| (rng.random::<f32>() * 2.0 - 1.0) * bound));
        }
        p
    }

    /// Summed loss and accuracy of `params` on `data`, in inference mode, without a graph.
    pub fn evaluate(&mut self, params: &[f32], data: &Dataset) -> Result<Evaluation, LearnError> {
        let mut ev = Evaluation {
            count: data.len(),
            ..Evaluation::default()
        };
        self.each_row(params, data, |loss, correct| {
            ev.loss_sum += loss;
            ev.correct += usize::from(correct);
        })?;
        Ok(ev)
    }

    /// Each row's loss under `params`, in inference mode: cross-entropy for classifiers,
    /// squared error for regression (what a membership-inference attack thresholds).
    pub fn row_losses(&mut self, params: &[f32], data: &Dataset) -> Result<Vec<f64>, LearnError> {
        let mut losses = Vec::with_capacity(data.len());
        self.each_row(params, data, |loss, _| losses.push(loss))?;
        Ok(losses)
    }

    /// Calls `f(loss, correct)` for each row of `data` in order, in inference mode, without a
    /// graph (`correct` is false in regression).
    fn each_row(
        &mut self,
        params: &[f32],
        data: &Dataset,
        mut f: impl FnMut(f64, bool),
    ) -> Result<(), LearnError> {
        self.vars.set(params)?;
        self.check_data(data)?;
        let k = self.outputs();
        for start in (0..data.len()).step_by(self.eval_chunk) {
            let end = (start + self.eval_chunk).min(data.len());
            let out = self
                .eval_net
                .forward(&self.x_contiguous(data, start, end)?)?;
            with_f32_slice(&out, |out| match &data.labels {
                Labels::Class { ids, .. } => {
                    for (row, &y) in out.chunks_exact(k).zip(&ids[start..end]) {
                        let (loss, arg) = log_loss_and_argmax(row, y as usize);
                        f(loss, arg == y as usize);
                    }
                }
                Labels::Real(ys) => {
                    for (&o, &y) in out.iter().zip(&ys[start..end]) {
                        f((f64::from(o) - f64::from(y)).powi(2), false);
                    }
                }
            })?;
        }
        Ok(())
    }

    /// Summed loss and **summed** gradient (over samples) of `params` on the given rows of
    /// `data` (all rows when `None`), in chunks of the batch size.
    pub fn loss_and_grad(
        &mut self,
        params: &[f32],
        data: &Dataset,
        rows: Option<&[usize]>,
    ) -> Result<(f64, Vec<f32>), LearnError> {
        self.vars.set(params)?;
        self.check_data(data)?;
        if let Some(rows) = rows {
            check_rows(rows, data.len())?;
        }
        let mut grad = vec![0.0; self.vars.len()];
        let mut loss_sum = 0.0;
        let n = rows.map_or(data.len(), <[usize]>::len);
        for start in (0..n).step_by(self.batch_size) {
            let end = (start + self.batch_size).min(n);
            let (x, y) = match rows {
                None => (
                    self.x_contiguous(data, start, end)?,
                    self.y_contiguous(data, start, end)?,
                ),
                Some(rows) => self.xy_gathered(data, &rows[start..end])?,
            };
            let loss = self.loss(&x, &y, 1.0)?;
            loss_sum += f64::from(loss.to_scalar::<f32>()?);
            self.vars.grads_into(&loss.backward()?, &mut grad, true)?;
        }
        Ok((loss_sum, grad))
    }

    /// Scores a mixture `Σ w_j · model_j` on `data` (FedeRiCo inference, spec §5.3): mixed
    /// class probabilities (accuracy and the mixture's cross-entropy) or mixed regression
    /// outputs (squared error). One part is plain [`Self::evaluate`].
    pub fn evaluate_mixture(
        &mut self,
        parts: &[(&[f32], f64)],
        data: &Dataset,
    ) -> Result<Evaluation, LearnError> {
        if let [(params, _)] = parts {
            return self.evaluate(params, data);
        }
        let width = self.outputs();
        let mixed = self.predict_mixture(parts, data)?;
        let mut eval = Evaluation {
            count: data.len(),
            ..Default::default()
        };
        match &data.labels {
            Labels::Class { ids, .. } => {
                for (row, &y) in mixed.chunks(width).zip(ids) {
                    let best = row
                        .iter()
                        .enumerate()
                        .max_by(|a, b| a.1.total_cmp(b.1))
                        .map_or(0, |b| b.0);
                    eval.correct += (best == y as usize) as usize;
                    eval.loss_sum -= row[y as usize].clamp(1e-12, 1.0).ln();
                }
            }
            Labels::Real(ys) => {
                for (row, &y) in mixed.chunks(width).zip(ys) {
                    eval.loss_sum += (row[0] - y as f64).powi(2);
                }
            }
        }
        Ok(eval)
    }

    /// The mixture `Σ w_j · predict(model_j)` for every sample, row-major `len × outputs()`
    /// (FedeRiCo inference, spec §5.3).
    pub fn predict_mixture(
        &mut self,
        parts: &[(&[f32], f64)],
        data: &Dataset,
    ) -> Result<Vec<f64>, LearnError> {
        let mut mixed = vec![0f64; data.len() * self.outputs()];
        for &(params, w) in parts {
            for (m, p) in mixed.iter_mut().zip(self.predict(params, data)?) {
                *m += w * p as f64;
            }
        }
        Ok(mixed)
    }

    /// Outputs for every sample, row-major `len × outputs()`: class probabilities (softmax)
    /// for classifiers, raw outputs for regression.
    pub fn predict(&mut self, params: &[f32], data: &Dataset) -> Result<Vec<f32>, LearnError> {
        self.vars.set(params)?;
        self.check_data(data)?;
        let k = self.outputs();
        let mut all = Vec::with_capacity(data.len() * k);
        for start in (0..data.len()).step_by(self.eval_chunk) {
            let end = (start + self.eval_chunk).min(data.len());
            let out = self
                .eval_net
                .forward(&self.x_contiguous(data, start, end)?)?;
            with_f32_slice(&out, |out| {
                if self.spec.is_regression() {
                    all.extend_from_slice(out);
                } else {
                    for row in out.chunks_exact(k) {
                        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                        let base = all.len();
                        all.extend(row.iter().map(|&v| (v - max).exp()));
                        let sum: f32 = all[base..].iter().sum();
                        all[base..].iter_mut().for_each(|p| *p /= sum);
                    }
                }
            })?;
        }
        Ok(all)
    }

    /// The flat ranges of the classifier: the last dense layer's weight and bias (a
    /// single-layer model's whole parameter vector). HCCT-P keeps it local.
    pub fn head(&self) -> Vec<std::ops::Range<usize>> {
        let last = format!("fc{}.", Plan::of(&self.spec).dense.len().saturating_sub(1));
        self.tensors()
            .into_iter()
            .filter(|(name, _)| name.starts_with(&last))
            .map(|(_, r)| r)
            .collect()
    }

    /// Width of [`Learner::features`]: the input width of the last dense layer.
    pub fn feature_width(&self) -> usize {
        Plan::of(&self.spec).dense.last().map_or(0, |&(din, _)| din)
    }

    /// The penultimate activations of `params` on the given rows of `data`, in inference mode
    /// (the input of the classifier: an MLP's last hidden layer or a CNN's flattened feature
    /// map, after ReLU; a single-layer model's raw inputs), row-major
    /// `rows.len() × feature_width()`. FedSaC builds each silo's feature subspace from them.
    pub fn features(
        &mut self,
        params: &[f32],
        data: &Dataset,
        rows: &[usize],
    ) -> Result<Vec<f32>, LearnError> {
        self.vars.set(params)?;
        self.check_data(data)?;
        check_rows(rows, data.len())?;
        let mut all = Vec::with_capacity(rows.len() * self.feature_width());
        for chunk in rows.chunks(self.eval_chunk) {
            let (x, _) = self.xy_gathered(data, chunk)?;
            let h = self.eval_net.penultimate(&x)?;
            with_f32_slice(&h, |h| all.extend_from_slice(h))?;
        }
        Ok(all)
    }

    /// One epoch of mini-batch training: shuffle with `rng`, one optimizer step per batch on
    /// the batch-mean loss. Returns the mean training loss over the epoch (the loss of each
    /// batch before its step, averaged over samples; 0 for an empty data set).
    pub fn train_epoch(
        &mut self,
        params: &mut [f32],
        opt: &mut Adam,
        data: &Dataset,
        rng: &mut StdRng,
    ) -> Result<f64, LearnError> {
        if params.len() != self.vars.len() {
            return Err(LearnError::Shape(format!(
                "expected {} parameters, got {}",
                self.vars.len(),
                params.len()
            )));
        }
        if opt.num_params() != self.vars.len() {
            return Err(LearnError::Shape(format!(
                "optimizer state for {} parameters, model has {}",
                opt.num_params(),
                self.vars.len()
            )));
        }
        self.check_data(data)?;
        let mut order: Vec<usize> = (0..data.len()).collect();
        order.shuffle(rng);
        let mut grad = std::mem::take(&mut self.gbuf);
        let mut loss_sum = 0.0;
        let result = (|| {
            for batch in order.chunks(self.batch_size) {
                self.vars.set(params)?;
                let (x, y) = self.xy_gathered(data, batch)?;
                let loss = self.loss(&x, &y, 1.0 / batch.len() as f64)?;
                loss_sum += f64::from(loss.to_scalar::<f32>()?) * batch.len() as f64;
                self.vars.grads_into(&loss.backward()?, &mut grad, false)?;
                opt.step(params, &grad);
            }
            Ok(())
        })();
        self.gbuf = grad;
        result.map(|()| loss_sum / data.len().max(1) as f64)
    }

    /// `scale ×` the summed loss of a chunk, on the training network (records a graph).
    fn loss(&self, x: &Tensor, y: &Target, scale: f64) -> Result<Tensor, LearnError> {
        loss_of(&self.train_net.forward(x)?, y, scale)
    }

    /// Features of rows `start..end`, straight from the data set's slice.
    fn x_contiguous(&self, data: &Dataset, start: usize, end: usize) -> Result<Tensor, LearnError> {
        let d = data.feature_len();
        Ok(Tensor::from_slice(
            &data.features[start * d..end * d],
            self.batch_shape(end - start),
            &self.dev,
        )?)
    }

    /// Targets of rows `start..end`.
    fn y_contiguous(&self, data: &Dataset, start: usize, end: usize) -> Result<Target, LearnError> {
        Ok(match &data.labels {
            Labels::Class { ids, .. } => Target::Class(Tensor::from_slice(
                &ids[start..end],
                end - start,
                &self.dev,
            )?),
            Labels::Real(ys) => Target::Real(Tensor::from_slice(
                &ys[start..end],
                (end - start, 1),
                &self.dev,
            )?),
        })
    }

    /// Features and targets of the given rows (in bounds), gathered into one chunk.
    fn xy_gathered(
        &mut self,
        data: &Dataset,
        rows: &[usize],
    ) -> Result<(Tensor, Target), LearnError> {
        self.xbuf.clear();
        for &i in rows {
            self.xbuf.extend_from_slice(data.row(i));
        }
        let x = Tensor::from_slice(&self.xbuf, self.batch_shape(rows.len()), &self.dev)?;
        let y = match &data.labels {
            Labels::Class { ids, .. } => {
                let ys: Vec<u32> = rows.iter().map(|&i| ids[i]).collect();
                Target::Class(Tensor::from_vec(ys, rows.len(), &self.dev)?)
            }
            Labels::Real(v) => {
                let ys: Vec<f32> = rows.iter().map(|&i| v[i]).collect();
                Target::Real(Tensor::from_vec(ys, (rows.len(), 1), &self.dev)?)
            }
        };
        Ok((x, y))
    }

    /// `[n, ..sample shape]`.
    fn batch_shape(&self, n: usize) -> Vec<usize> {
        std::iter::once(n)
            .chain(self.input_shape.iter().copied())
            .collect()
    }

    /// Data the model cannot take: wrong feature count, or labels of the other kind.
    ///
    /// Images are read channel-first: a CNN takes `[c, h, w]` samples, or flat ones of `c·h·w`
    /// values in that order; an image of another 3-d shape is refused rather than misread.
    fn check_data(&self, data: &Dataset) -> Result<(), LearnError> {
        let want: usize = self.input_shape.iter().product();
        if self.input_shape.len() == 3
            && data.sample_shape.len() > 1
            && data.sample_shape != self.input_shape
        {
            return Err(LearnError::Shape(format!(
                "model expects samples of shape {:?} (channels, height, width), got {:?}",
                self.input_shape, data.sample_shape
            )));
        }
        if data.feature_len() != want {
            return Err(LearnError::Shape(format!(
                "model expects samples of {want} features {:?}, got {} (sample shape {:?})",
                self.input_shape,
                data.feature_len(),
                data.sample_shape
            )));
        }
        let n = data.len();
        if data.features.len() != n * want {
            return Err(LearnError::Shape(format!(
                "{} feature values do not make {n} samples of {want}",
                data.features.len()
            )));
        }
        match (&data.labels, self.spec.is_regression()) {
            (Labels::Real(_), true) => Ok(()),
            (Labels::Class { ids, num_classes }, false) => {
                let classes = self.outputs();
                match ids.iter().find(|&&c| c as usize >= classes) {
                    Some(bad) => Err(LearnError::Shape(format!(
                        "label {bad} out of range for a model of {classes} classes (data has {num_classes})"
                    ))),
                    None => Ok(()),
                }
            }
            (Labels::Real(_), false) => Err(LearnError::Shape(
                "expected class labels for a classifier, got real targets".into(),
            )),
            (Labels::Class { .. }, true) => Err(LearnError::Shape(
                "expected real targets for a regression model, got class labels".into(),
            )),
        }
    }
}

/// Row indices beyond the data set are a shape error, not a panic.
fn check_rows(rows: &[usize], len: usize) -> Result<(), LearnError> {
    match rows.iter().find(|&&i| i >= len) {
        Some(bad) => Err(LearnError::Shape(format!(
            "row {bad} out of range for {len} samples"
        ))),
        None => Ok(()),
    }
}

/// Cross-entropy of one row of logits against class `y` (in f64), and the row's argmax (first
/// of ties). Computed as ln(1 + Σ_{j≠y} e^{x_j − x_y}) with `ln_1p`, so a confident row's small
/// loss keeps its digits (as `lse − x_y` it rounds to exactly 0 once the margin passes about
/// 37, and a membership attack sees ties where the model still ranks its rows).
fn log_loss_and_argmax(logits: &[f32], y: usize) -> (f64, usize) {
    let (mut arg, mut max) = (0, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > max {
            (arg, max) = (i, v);
        }
    }
    let (max, own) = (f64::from(max), f64::from(logits[y]));
    // Relative to the row's largest logit, so no exponent overflows.
    let others: f64 = logits
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != y)
        .map(|(_, &v)| (f64::from(v) - max).exp())
        .sum();
    let gap = own - max; // ≤ 0
    // ln(e^{gap} + others) − gap = ln(1 + others · e^{−gap}).
    let loss = if gap == 0.0 {
        others.ln_1p()
    } else {
        (gap.exp() + others).ln() - gap
    };
    (loss, arg)
}

/// `scale ×` the summed loss of raw outputs `out` against `y`.
fn loss_of(out: &Tensor, y: &Target, scale: f64) -> Result<Tensor, LearnError> {
    let loss = match y {
        Target::Class(ids) => {
            let logp = candle_nn::ops::log_softmax(out, D::Minus1)?;
            logp.gather(&ids.unsqueeze(1)?, 1)?
                .sum_all()?
                .affine(-scale, 0.0)?
        }
        Target::Real(ys) => (out - ys)?.sqr()?.sum_all()?.affine(scale, 0.0)?,
    };
    Ok(loss)
}

#[cfg(test)]
mod tests;
