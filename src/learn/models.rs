//! Model architectures and the [`Learner`]: a candle model that evaluates, differentiates and
//! trains *any* flat parameter vector of its architecture.
//! Owns: architectures, seeded initialisation, losses, summed gradients, inference.
//! Must not: keep parameters between calls (callers pass them in) or know about peers.

use super::data::{Dataset, Labels};
use super::optim::Adam;
use super::params::{FlatVars, with_f32_slice};
use candle_core::{D, DType, Device, Tensor};
use candle_nn::{Init, VarMap};
use rand::RngExt;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

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
    ///
    /// FNV-1a (64 bit) over the spec's JSON form, so it is the same in every process and build.
    pub fn fingerprint(&self) -> u64 {
        let json = serde_json::to_vec(self)
            .expect("a ModelSpec has only integer fields and always serializes");
        json.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// Number of f32 parameters.
    pub fn num_params(&self) -> usize {
        let plan = Plan::of(self);
        let conv: usize = plan
            .convs
            .iter()
            .map(|&(i, o)| o * i * KERNEL * KERNEL + o)
            .sum();
        let dense: usize = plan.dense.iter().map(|&(i, o)| i * o + o).sum();
        conv + dense
    }

    /// Width of the model's output: classes, or regression outputs.
    pub fn outputs(&self) -> usize {
        match self {
            ModelSpec::Linear { outputs, .. } => *outputs,
            ModelSpec::Softmax { classes, .. }
            | ModelSpec::Mlp { classes, .. }
            | ModelSpec::Cnn { classes, .. } => *classes,
        }
    }

    /// Shape of one input sample: `[inputs]`, or `[channels, height, width]` for the CNN.
    pub fn input_shape(&self) -> Vec<usize> {
        match self {
            ModelSpec::Linear { inputs, .. }
            | ModelSpec::Softmax { inputs, .. }
            | ModelSpec::Mlp { inputs, .. } => vec![*inputs],
            ModelSpec::Cnn {
                channels,
                height,
                width,
                ..
            } => vec![*channels, *height, *width],
        }
    }

    /// Checks that the architecture can be built: every width positive, a regression model with
    /// one output (labels hold one target per sample), and a CNN input large enough for its
    /// conv layers.
    pub fn validate(&self) -> Result<(), LearnError> {
        let bad = |what: &str| Err(LearnError::Shape(format!("invalid model {self:?}: {what}")));
        if self.input_shape().contains(&0) {
            return bad("input sizes must be positive");
        }
        if self.outputs() == 0 {
            return bad("the output width must be positive");
        }
        match self {
            ModelSpec::Linear { outputs, .. } if *outputs != 1 => bad(&format!(
                "regression has one target per sample, so outputs must be 1, got {outputs}"
            )),
            ModelSpec::Mlp { hidden, .. } if hidden.contains(&0) => {
                bad("hidden widths must be positive")
            }
            ModelSpec::Cnn {
                height,
                width,
                conv,
                ..
            } => {
                if conv.contains(&0) {
                    return bad("conv channels must be positive");
                }
                let (mut h, mut w) = (*height, *width);
                for (i, _) in conv.iter().enumerate() {
                    if h < KERNEL + 1 || w < KERNEL + 1 {
                        return bad(&format!(
                            "conv layer {i} gets a {h}x{w} input; a 3x3 conv then 2x2 pool needs at least 4x4"
                        ));
                    }
                    (h, w) = (pooled(h), pooled(w));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// Side of the (square) convolution kernels.
const KERNEL: usize = 3;

/// Side after a 3×3 convolution without padding and a 2×2 max-pool (floor).
fn pooled(side: usize) -> usize {
    side.saturating_sub(KERNEL - 1) / 2
}

/// The layers of an architecture: conv layers as `(in_channels, out_channels)`, then dense
/// layers as `(in, out)`. Conv layers are named `conv{i}`, dense layers `fc{i}`.
struct Plan {
    convs: Vec<(usize, usize)>,
    dense: Vec<(usize, usize)>,
}

impl Plan {
    /// Never fails: sizes of an invalid spec saturate at zero ([`ModelSpec::validate`] rejects it).
    fn of(spec: &ModelSpec) -> Self {
        match spec {
            ModelSpec::Linear { inputs, outputs } => Plan {
                convs: vec![],
                dense: vec![(*inputs, *outputs)],
            },
            ModelSpec::Softmax { inputs, classes } => Plan {
                convs: vec![],
                dense: vec![(*inputs, *classes)],
            },
            ModelSpec::Mlp {
                inputs,
                hidden,
                classes,
            } => {
                let widths: Vec<usize> = std::iter::once(*inputs)
                    .chain(hidden.iter().copied())
                    .chain([*classes])
                    .collect();
                Plan {
                    convs: vec![],
                    dense: widths.windows(2).map(|w| (w[0], w[1])).collect(),
                }
            }
            ModelSpec::Cnn {
                channels,
                height,
                width,
                conv,
                classes,
            } => {
                let (mut c, mut h, mut w) = (*channels, *height, *width);
                let mut convs = Vec::with_capacity(conv.len());
                for &out in conv {
                    convs.push((c, out));
                    (c, h, w) = (out, pooled(h), pooled(w));
                }
                Plan {
                    convs,
                    dense: vec![(c * h * w, *classes)],
                }
            }
        }
    }

    /// `(name, shape, fan_in)` of every variable.
    fn variables(&self) -> Vec<(String, Vec<usize>, usize)> {
        let mut v = Vec::new();
        for (i, &(cin, cout)) in self.convs.iter().enumerate() {
            let fan_in = cin * KERNEL * KERNEL;
            v.push((
                format!("conv{i}.weight"),
                vec![KERNEL, KERNEL, cin, cout],
                fan_in,
            ));
            v.push((format!("conv{i}.bias"), vec![cout], fan_in));
        }
        for (i, &(din, dout)) in self.dense.iter().enumerate() {
            v.push((format!("fc{i}.weight"), vec![din, dout], din));
            v.push((format!("fc{i}.bias"), vec![dout], din));
        }
        v
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

/// A dense layer `x · W + b`. The weight is stored `[in, out]` (the transpose of PyTorch's
/// layout) so that its gradient, `xᵀ · g`, comes out of backprop contiguous and is flattened
/// without a copy.
struct Dense {
    weight: Tensor,
    bias: Tensor,
}

impl Dense {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.matmul(&self.weight)?.broadcast_add(&self.bias)
    }
}

/// A 3×3 convolution without padding, as im2col then one matrix product. The weight is stored
/// `[3, 3, in, out]` so that it reshapes, without a copy, to the `[9·in, out]` matrix the
/// product takes; its output is channels-last (`[n, h, w, c]`), which the next im2col reads in
/// runs of `c` contiguous values.
///
/// candle's own `conv2d` backward goes through a direct-loop `conv_transpose2d` and a conv with
/// the gradient as kernel; this layer's backward is two matrix products and a scatter.
struct Conv {
    weight: Tensor,
    bias: Tensor,
}

impl Conv {
    /// `x` is `[n, c, h, w]` (`layout` [`ops::Layout4::Nchw`], the data) or `[n, h, w, c]`.
    fn forward(&self, x: &Tensor, layout: ops::Layout4) -> candle_core::Result<Tensor> {
        let (n, h, w, c) = layout.dims(x.dims4()?);
        let (oh, ow) = (h + 1 - KERNEL, w + 1 - KERNEL);
        let cout = self.bias.dim(0)?;
        // The bias is the last row of the matrix, against im2col's column of ones: no separate
        // broadcast add (and its gradient passes) over the whole output.
        let cols = x.apply_op1(ops::Im2col { layout })?;
        let w = Tensor::cat(
            &[
                &self.weight.reshape((KERNEL * KERNEL * c, cout))?,
                &self.bias.reshape((1, cout))?,
            ],
            0,
        )?;
        cols.matmul(&w)?.reshape((n, oh, ow, cout))
    }
}

/// The network of a [`ModelSpec`], built on tensors that are either the variables (training,
/// records a graph) or detached views of the same storage (inference, no graph).
struct Net {
    convs: Vec<Conv>,
    dense: Vec<Dense>,
}

impl Net {
    /// Builds the layers of `plan`, fetching each tensor by name.
    fn build(
        plan: &Plan,
        mut get: impl FnMut(&str, &[usize]) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Self> {
        let mut convs = Vec::with_capacity(plan.convs.len());
        for (i, &(cin, cout)) in plan.convs.iter().enumerate() {
            let weight = get(&format!("conv{i}.weight"), &[KERNEL, KERNEL, cin, cout])?;
            let bias = get(&format!("conv{i}.bias"), &[cout])?;
            convs.push(Conv { weight, bias });
        }
        let mut dense = Vec::with_capacity(plan.dense.len());
        for (i, &(din, dout)) in plan.dense.iter().enumerate() {
            let weight = get(&format!("fc{i}.weight"), &[din, dout])?;
            let bias = get(&format!("fc{i}.bias"), &[dout])?;
            dense.push(Dense { weight, bias });
        }
        Ok(Net { convs, dense })
    }

    /// Raw outputs (logits) for a batch: `[n, features]` or `[n, c, h, w]` in, `[n, outputs]` out.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.penultimate(x)?;
        match self.dense.last() {
            Some(last) => last.forward(&x),
            None => Ok(x),
        }
    }

    /// The input of the last dense layer, `[n, width]`: every layer but the last (post-ReLU).
    fn penultimate(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut x = x.clone();
        let mut layout = ops::Layout4::Nchw;
        for conv in &self.convs {
            x = conv.forward(&x, layout)?.apply_op1(ops::MaxPoolRelu)?;
            layout = ops::Layout4::Nhwc;
        }
        if !self.convs.is_empty() {
            x = x.flatten_from(1)?;
        }
        for layer in self.dense.iter().take(self.dense.len().saturating_sub(1)) {
            x = layer.forward(&x)?.relu()?;
        }
        Ok(x)
    }
}

/// CPU custom ops of the CNN: im2col for 3×3 convolutions and a 2×2 max-pool fused with ReLU,
/// each with its backward pass.
mod ops {
    use super::KERNEL;
    use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, bail};

    /// Memory order of a 4-d activation tensor.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Layout4 {
        /// `[n, c, h, w]`: the data as stored in a [`super::Dataset`].
        Nchw,
        /// `[n, h, w, c]`: conv outputs (a channel's values for one pixel are contiguous).
        Nhwc,
    }

    impl Layout4 {
        /// `(n, h, w, c)` from the dims of a tensor in this layout.
        pub(super) fn dims(self, d: (usize, usize, usize, usize)) -> (usize, usize, usize, usize) {
            match self {
                Layout4::Nchw => (d.0, d.2, d.3, d.1),
                Layout4::Nhwc => d,
            }
        }

        /// Strides of `(n, y, x, c)` for a contiguous tensor of sizes `(h, w, c)`.
        fn strides(self, h: usize, w: usize, c: usize) -> (usize, usize, usize, usize) {
            match self {
                Layout4::Nchw => (c * h * w, w, 1, h * w),
                Layout4::Nhwc => (h * w * c, w * c, c, 1),
            }
        }
    }

    /// Contiguous f32 values of a CPU storage under `layout`.
    fn contiguous_f32<'a>(s: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
        match layout.contiguous_offsets() {
            Some((start, end)) => Ok(&s.as_slice::<f32>()?[start..end]),
            None => bail!("expected a contiguous tensor"),
        }
    }

    /// Unfolds each 3×3 patch into a row: `[n, ..]` in `layout` → `[n·oh·ow, 9·c + 1]`,
    /// columns in `(ky, kx, channel)` order, matching a `[3, 3, c, out]` weight, then a 1 for
    /// the bias.
    pub(super) struct Im2col {
        pub(super) layout: Layout4,
    }

    /// The backward pass of [`Im2col`]: adds each row's values back onto the input positions
    /// they came from (`[n·oh·ow, 9·c + 1]` → the input's shape and layout; the bias column
    /// has no input).
    struct Col2im {
        layout: Layout4,
        input: Shape,
    }

    /// `(n, h, w, c, oh, ow)` of an im2col input.
    fn conv_dims(
        layout: Layout4,
        shape: &Shape,
    ) -> Result<(usize, usize, usize, usize, usize, usize)> {
        let (n, h, w, c) = layout.dims(shape.dims4()?);
        if h < KERNEL || w < KERNEL {
            bail!("3x3 convolution of a {h}x{w} input");
        }
        Ok((n, h, w, c, h + 1 - KERNEL, w + 1 - KERNEL))
    }

    impl CustomOp1 for Im2col {
        fn name(&self) -> &'static str {
            "im2col-3x3"
        }

        fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
            let x = contiguous_f32(storage, layout)?;
            let (n, h, w, c, oh, ow) = conv_dims(self.layout, layout.shape())?;
            let (sn, sy, sx, sc) = self.layout.strides(h, w, c);
            let patch = KERNEL * KERNEL * c;
            let row_len = patch + 1;
            let mut cols = Vec::with_capacity(n * oh * ow * row_len);
            for b in 0..n {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let base = b * sn + oy * sy + ox * sx;
                        match self.layout {
                            // The three pixels of a kernel row are 3·c contiguous values.
                            Layout4::Nhwc => {
                                for ky in 0..KERNEL {
                                    let at = base + ky * sy;
                                    cols.extend_from_slice(&x[at..at + KERNEL * c]);
                                }
                            }
                            Layout4::Nchw => {
                                for k in 0..KERNEL * KERNEL {
                                    let at = base + (k / KERNEL) * sy + (k % KERNEL) * sx;
                                    cols.extend((0..c).map(|ci| x[at + ci * sc]));
                                }
                            }
                        }
                        cols.push(1.0);
                    }
                }
            }
            debug_assert_eq!(cols.len(), n * oh * ow * row_len);
            Ok((CpuStorage::F32(cols), (n * oh * ow, row_len).into()))
        }

        fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
            let op = Col2im {
                layout: self.layout,
                input: arg.shape().clone(),
            };
            Ok(Some(grad_res.contiguous()?.apply_op1_no_bwd(&op)?))
        }
    }

    impl CustomOp1 for Col2im {
        fn name(&self) -> &'static str {
            "col2im-3x3"
        }

        fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
            let g = contiguous_f32(storage, layout)?;
            let (n, h, w, c, oh, ow) = conv_dims(self.layout, &self.input)?;
            let (sn, sy, sx, sc) = self.layout.strides(h, w, c);
            let patch = KERNEL * KERNEL * c;
            let row_len = patch + 1;
            if g.len() != n * oh * ow * row_len {
                bail!(
                    "col2im: {} values for {n}x{oh}x{ow} rows of {row_len}",
                    g.len()
                );
            }
            let mut dx = vec![0f32; n * h * w * c];
            let mut rows = g.chunks_exact(row_len);
            for b in 0..n {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let row = &rows.next().expect("length checked above")[..patch];
                        let base = b * sn + oy * sy + ox * sx;
                        match self.layout {
                            Layout4::Nhwc => {
                                for (ky, src) in row.chunks_exact(KERNEL * c).enumerate() {
                                    let at = base + ky * sy;
                                    let dst = &mut dx[at..at + KERNEL * c];
                                    dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
                                }
                            }
                            Layout4::Nchw => {
                                for (k, src) in row.chunks_exact(c).enumerate() {
                                    let at = base + (k / KERNEL) * sy + (k % KERNEL) * sx;
                                    for (ci, s) in src.iter().enumerate() {
                                        dx[at + ci * sc] += s;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Ok((CpuStorage::F32(dx), self.input.clone()))
        }
    }

    /// 2×2 max-pool (stride 2, floor) fused with ReLU, on contiguous f32 `[n, h, w, c]` tensors.
    ///
    /// candle 0.11.1's own `max_pool2d` backward is wrong: it scales the gradient of each
    /// window's maximum by 1/4 (k²) and, for odd sizes, aligns its mask with the wrong windows
    /// (its nearest-neighbour upsampling does not follow the floor). This op sends the whole
    /// gradient to the first maximum of each window (as PyTorch does) when the pooled value is
    /// positive.
    pub(super) struct MaxPoolRelu;

    /// The backward pass of [`MaxPoolRelu`]: `(input, output gradient)` → input gradient.
    struct MaxPoolReluGrad;

    /// `(n, h, w, c, h/2, w/2)` of a pool input.
    fn pool_dims(shape: &Shape) -> Result<(usize, usize, usize, usize, usize, usize)> {
        let (n, h, w, c) = shape.dims4()?;
        if h < 2 || w < 2 {
            bail!("2x2 max-pool of a {h}x{w} input");
        }
        Ok((n, h, w, c, h / 2, w / 2))
    }

    /// Calls `f(output index, input index of the window's first maximum, that maximum)` for
    /// every output of the pool.
    #[inline]
    fn for_each_window(
        x: &[f32],
        shape: &Shape,
        mut f: impl FnMut(usize, usize, f32),
    ) -> Result<()> {
        let (n, h, w, c, h2, w2) = pool_dims(shape)?;
        let mut o = 0;
        for b in 0..n {
            for i in 0..h2 {
                for j in 0..w2 {
                    let top = ((b * h + 2 * i) * w + 2 * j) * c;
                    let others = [top + c, top + w * c, top + w * c + c];
                    for ch in 0..c {
                        let mut best = (top + ch, x[top + ch]);
                        for k in others {
                            if x[k + ch] > best.1 {
                                best = (k + ch, x[k + ch]);
                            }
                        }
                        f(o, best.0, best.1);
                        o += 1;
                    }
                }
            }
        }
        Ok(())
    }

    impl CustomOp1 for MaxPoolRelu {
        fn name(&self) -> &'static str {
            "max-pool-2x2-relu"
        }

        fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
            let x = contiguous_f32(storage, layout)?;
            let (n, _, _, c, h2, w2) = pool_dims(layout.shape())?;
            let mut out = vec![0f32; n * h2 * w2 * c];
            for_each_window(x, layout.shape(), |o, _, v| out[o] = v.max(0.0))?;
            Ok((CpuStorage::F32(out), (n, h2, w2, c).into()))
        }

        fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
            Ok(Some(arg.apply_op2_no_bwd(
                &grad_res.contiguous()?,
                &MaxPoolReluGrad,
            )?))
        }
    }

    impl candle_core::CustomOp2 for MaxPoolReluGrad {
        fn name(&self) -> &'static str {
            "max-pool-2x2-relu-grad"
        }

        fn cpu_fwd(
            &self,
            s1: &CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            let (x, g) = (contiguous_f32(s1, l1)?, contiguous_f32(s2, l2)?);
            let (n, _, _, c, h2, w2) = pool_dims(l1.shape())?;
            if g.len() != n * h2 * w2 * c {
                bail!(
                    "max-pool gradient of {} values for {n}x{h2}x{w2}x{c} outputs",
                    g.len()
                );
            }
            let mut dx = vec![0f32; x.len()];
            for_each_window(x, l1.shape(), |o, k, v| {
                if v > 0.0 {
                    dx[k] = g[o];
                }
            })?;
            Ok((CpuStorage::F32(dx), l1.shape().clone()))
        }
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
        self.vars.set(params)?;
        self.check_data(data)?;
        let mut ev = Evaluation {
            count: data.len(),
            ..Evaluation::default()
        };
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
                        ev.loss_sum += loss;
                        ev.correct += usize::from(arg == y as usize);
                    }
                }
                Labels::Real(ys) => {
                    for (&o, &y) in out.iter().zip(&ys[start..end]) {
                        ev.loss_sum += (f64::from(o) - f64::from(y)).powi(2);
                    }
                }
            })?;
        }
        Ok(ev)
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
        let mut mixed = vec![0f64; data.len() * width];
        for &(params, w) in parts {
            for (m, p) in mixed.iter_mut().zip(self.predict(params, data)?) {
                *m += w * p as f64;
            }
        }
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
        let out = self.train_net.forward(x)?;
        let loss = match y {
            Target::Class(ids) => {
                let logp = candle_nn::ops::log_softmax(&out, D::Minus1)?;
                logp.gather(&ids.unsqueeze(1)?, 1)?
                    .sum_all()?
                    .affine(-scale, 0.0)?
            }
            Target::Real(ys) => (out - ys)?.sqr()?.sum_all()?.affine(scale, 0.0)?,
        };
        Ok(loss)
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
/// of ties).
fn log_loss_and_argmax(logits: &[f32], y: usize) -> (f64, usize) {
    let (mut arg, mut max) = (0, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > max {
            (arg, max) = (i, v);
        }
    }
    let max = f64::from(max);
    let lse = logits
        .iter()
        .map(|&v| (f64::from(v) - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    (lse - f64::from(logits[y]), arg)
}

/// Sets flush-to-zero and denormals-are-zero (MXCSR bits 15 and 6) for the **calling thread**
/// on x86_64; a no-op elsewhere.
///
/// Denormal floats can slow CPU arithmetic by orders of magnitude per operation. Call it at the
/// start of a training thread; rayon's (gemm's) worker threads keep their own (default)
/// setting, so it covers all the work only with `RAYON_NUM_THREADS=1`. Results then differ
/// from IEEE arithmetic only for values below 1.2e-38, which become zero.
///
/// Measured (`benches/train_step.rs`, MLP 784-200-10 on MNIST, AMD EPYC): the subnormals of
/// that training were Adam's first moments, which [`Adam`] now flushes itself; candle's matrix
/// products showed no penalty even on all-subnormal inputs. So this is optional there; CPUs
/// with costlier denormal assists (many Intel parts) may still gain from it.
pub fn flush_denormals_to_zero() {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr: u32 = 0;
        // SAFETY: stmxcsr/ldmxcsr only read and write the 4 bytes given and the MXCSR register;
        // the value written is the current one with the FTZ and DAZ bits set, which all x86_64
        // CPUs support (SSE2 is baseline, DAZ is on every SSE2 CPU made since 2001).
        unsafe {
            core::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
            csr |= (1 << 15) | (1 << 6);
            core::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags));
        }
    }
}

/// Makes glibc keep freed memory for reuse instead of returning it to the kernel; a no-op
/// (returning false) off glibc. Returns whether both settings took.
///
/// candle allocates a fresh buffer for every tensor op; above glibc's mmap threshold each one
/// is a new mapping that the kernel must zero and fault in page by page, then unmap. Raising the
/// threshold to its maximum (32 MiB) and never trimming the heap made CNN gradients 1.6× faster
/// (`benches/train_step.rs`, `FEDERICO_BENCH_MALLOPT=1`) at the cost of a resident set that stays
/// at its peak. Process-wide: call it once, at the start of `main`, before spawning threads.
pub fn retain_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: mallopt only changes glibc's allocator parameters (under its own lock); the
        // values are in range (the mmap threshold's maximum is 32 MiB on 64-bit targets).
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, i32::MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Whether [`flush_denormals_to_zero`] is in effect on the calling thread (always false off
/// x86_64).
pub fn denormals_flushed() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr: u32 = 0;
        // SAFETY: stmxcsr only stores the MXCSR register into the 4 bytes given.
        unsafe {
            core::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
        }
        csr & ((1 << 15) | (1 << 6)) == (1 << 15) | (1 << 6)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// `n` samples of shape `shape` with features in [-1, 1): class labels for a classifier
    /// spec, real targets for regression.
    fn random_data(spec: &ModelSpec, n: usize, rng: &mut StdRng) -> Dataset {
        let shape = spec.input_shape();
        let d: usize = shape.iter().product();
        let features = (0..n * d)
            .map(|_| rng.random::<f32>() * 2.0 - 1.0)
            .collect();
        let labels = if spec.is_regression() {
            Labels::Real((0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect())
        } else {
            let k = spec.outputs();
            Labels::Class {
                ids: (0..n).map(|_| rng.random_range(0..k as u32)).collect(),
                num_classes: k,
            }
        };
        Dataset::new(features, shape, labels).unwrap()
    }

    fn tiny_specs() -> Vec<ModelSpec> {
        vec![
            ModelSpec::Linear {
                inputs: 3,
                outputs: 1,
            },
            ModelSpec::Softmax {
                inputs: 4,
                classes: 3,
            },
            ModelSpec::Mlp {
                inputs: 4,
                hidden: vec![5, 4],
                classes: 3,
            },
            ModelSpec::Cnn {
                channels: 2,
                height: 6,
                width: 7,
                conv: vec![2],
                classes: 3,
            },
            ModelSpec::Cnn {
                channels: 1,
                height: 10,
                width: 10,
                conv: vec![3, 2],
                classes: 3,
            },
        ]
    }

    #[test]
    fn features_are_the_classifiers_input() {
        let mut rng = StdRng::seed_from_u64(11);
        for spec in tiny_specs().iter().filter(|s| !s.is_regression()) {
            let data = random_data(spec, 9, &mut rng);
            let mut l = Learner::new(spec, 4).unwrap();
            let p = l.init_params(&mut rng);
            let rows = [8, 0, 3];
            let h = l.features(&p, &data, &rows).unwrap();
            let width = l.feature_width();
            assert_eq!(h.len(), rows.len() * width, "{spec:?}");
            // The last layer (`fc{last}.bias`, then `.weight` as [in, out]) applied to the
            // features gives the model's own predictions.
            let (mut offset, mut bias, mut weight) = (0, 0, 0);
            let last = format!("fc{}.", Plan::of(spec).dense.len() - 1);
            for (name, dims) in l.vars.layout() {
                if name == format!("{last}bias") {
                    bias = offset;
                } else if name == format!("{last}weight") {
                    weight = offset;
                }
                offset += dims.iter().product::<usize>();
            }
            let k = l.outputs();
            let probs = l.predict(&p, &data.subset(&rows)).unwrap();
            for (r, feats) in h.chunks(width).enumerate() {
                if matches!(spec, ModelSpec::Softmax { .. }) {
                    assert_eq!(feats, data.row(rows[r]));
                } else {
                    assert!(feats.iter().all(|&x| x >= 0.0), "post-ReLU");
                }
                let logits: Vec<f32> = (0..k)
                    .map(|o| {
                        p[bias + o]
                            + feats
                                .iter()
                                .enumerate()
                                .map(|(i, &f)| f * p[weight + i * k + o])
                                .sum::<f32>()
                    })
                    .collect();
                let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let z: f32 = logits.iter().map(|v| (v - max).exp()).sum();
                for o in 0..k {
                    let want = (logits[o] - max).exp() / z;
                    assert!((probs[r * k + o] - want).abs() < 1e-5, "{spec:?}");
                }
            }
        }
    }

    /// Central differences of the summed loss (from `evaluate`, the inference path) against
    /// the summed gradient (from `loss_and_grad`, backprop), coordinate by coordinate.
    fn check_gradient(spec: &ModelSpec, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let data = random_data(spec, 7, &mut rng);
        let mut l = Learner::new(spec, 3).unwrap();
        let p = l.init_params(&mut rng);
        let (loss, g) = l.loss_and_grad(&p, &data, None).unwrap();
        let ev = l.evaluate(&p, &data).unwrap();
        assert!(
            (loss - ev.loss_sum).abs() <= 1e-4 * ev.loss_sum.abs().max(1.0),
            "{loss} vs {}",
            ev.loss_sum
        );
        let norm: f64 = g.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
        assert!(
            norm > 1e-2,
            "{spec:?}: gradient norm {norm} too small to test anything"
        );
        let h = 3e-4f32;
        let mut q = p.clone();
        for j in 0..p.len() {
            q[j] = p[j] + h;
            let up = l.evaluate(&q, &data).unwrap().loss_sum;
            q[j] = p[j] - h;
            let down = l.evaluate(&q, &data).unwrap().loss_sum;
            let width = f64::from(p[j] + h) - f64::from(p[j] - h);
            q[j] = p[j];
            let fd = (up - down) / width;
            let gj = f64::from(g[j]);
            assert!(
                (fd - gj).abs() <= 2e-3 + 1e-2 * fd.abs().max(gj.abs()),
                "{spec:?}: parameter {j}: finite difference {fd}, backprop {gj}"
            );
        }
    }

    #[test]
    fn gradients_match_finite_differences_for_every_architecture() {
        for (i, spec) in tiny_specs().iter().enumerate() {
            check_gradient(spec, 10 + i as u64);
        }
    }

    #[test]
    fn cnn_of_the_paper_has_303882_parameters() {
        let spec = ModelSpec::Cnn {
            channels: 3,
            height: 32,
            width: 32,
            conv: vec![128, 128, 128],
            classes: 10,
        };
        assert_eq!(spec.num_params(), 303_882);
        assert_eq!(Learner::new(&spec, 50).unwrap().num_params(), 303_882);
    }

    #[test]
    fn analytic_parameter_count_matches_the_built_model() {
        let mut specs = tiny_specs();
        specs.push(ModelSpec::Mlp {
            inputs: 784,
            hidden: vec![200],
            classes: 10,
        });
        for spec in specs {
            assert_eq!(
                spec.num_params(),
                Learner::new(&spec, 4).unwrap().num_params(),
                "{spec:?}"
            );
        }
        assert_eq!(
            ModelSpec::Mlp {
                inputs: 784,
                hidden: vec![200],
                classes: 10
            }
            .num_params(),
            159_010
        );
    }

    #[test]
    fn fingerprint_is_pinned_and_tells_specs_apart() {
        let spec = ModelSpec::Mlp {
            inputs: 784,
            hidden: vec![200],
            classes: 10,
        };
        // FNV-1a 64 of {"kind":"mlp","inputs":784,"hidden":[200],"classes":10}, computed
        // independently in Python (offset 0xcbf29ce484222325, prime 0x100000001b3).
        assert_eq!(spec.fingerprint(), PINNED_FINGERPRINT);
        let other = ModelSpec::Mlp {
            inputs: 784,
            hidden: vec![201],
            classes: 10,
        };
        assert_ne!(spec.fingerprint(), other.fingerprint());
    }
    const PINNED_FINGERPRINT: u64 = 0xeed5_ac80_1eb7_764f;

    #[test]
    fn loss_and_grad_sums_over_samples() {
        let spec = ModelSpec::Mlp {
            inputs: 4,
            hidden: vec![6],
            classes: 3,
        };
        let mut rng = StdRng::seed_from_u64(1);
        let data = random_data(&spec, 7, &mut rng);
        let mut l = Learner::new(&spec, 3).unwrap();
        let p = l.init_params(&mut rng);
        let (loss, grad) = l.loss_and_grad(&p, &data, None).unwrap();
        let (mut loss_rows, mut grad_rows) = (0.0, vec![0.0f32; p.len()]);
        for i in 0..data.len() {
            let (li, gi) = l.loss_and_grad(&p, &data, Some(&[i])).unwrap();
            loss_rows += li;
            grad_rows.iter_mut().zip(&gi).for_each(|(a, b)| *a += b);
        }
        assert!(
            (loss - loss_rows).abs() < 1e-5 * loss.abs(),
            "{loss} vs {loss_rows}"
        );
        for (j, (a, b)) in grad.iter().zip(&grad_rows).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 + 1e-4 * a.abs(),
                "parameter {j}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn loss_and_grad_on_rows_equals_the_subset() {
        let spec = ModelSpec::Cnn {
            channels: 1,
            height: 6,
            width: 6,
            conv: vec![2],
            classes: 4,
        };
        let mut rng = StdRng::seed_from_u64(2);
        let data = random_data(&spec, 9, &mut rng);
        let mut l = Learner::new(&spec, 2).unwrap();
        let p = l.init_params(&mut rng);
        let rows = [4, 1, 8, 1, 5];
        let (loss, grad) = l.loss_and_grad(&p, &data, Some(&rows)).unwrap();
        let (loss_sub, grad_sub) = l.loss_and_grad(&p, &data.subset(&rows), None).unwrap();
        assert_eq!(loss, loss_sub);
        assert_eq!(grad, grad_sub);
        let (all, _) = l.loss_and_grad(&p, &data, None).unwrap();
        assert_ne!(loss, all);
        let (none, zero) = l.loss_and_grad(&p, &data, Some(&[])).unwrap();
        assert_eq!(none, 0.0);
        assert!(zero.iter().all(|&v| v == 0.0));
        assert!(matches!(
            l.loss_and_grad(&p, &data, Some(&[9])),
            Err(LearnError::Shape(_))
        ));
    }

    #[test]
    fn flatten_order_is_the_same_in_every_learner() {
        // Each VarMap is a HashMap with its own random order: without sorting, these differ.
        let spec = ModelSpec::Mlp {
            inputs: 5,
            hidden: vec![4, 3, 4],
            classes: 3,
        };
        let mut rng = StdRng::seed_from_u64(3);
        let data = random_data(&spec, 6, &mut rng);
        let p = Learner::new(&spec, 4).unwrap().init_params(&mut rng);
        let reference = Learner::new(&spec, 4)
            .unwrap()
            .loss_and_grad(&p, &data, None)
            .unwrap();
        for _ in 0..8 {
            let mut l = Learner::new(&spec, 4).unwrap();
            assert_eq!(l.loss_and_grad(&p, &data, None).unwrap(), reference);
        }
        let names: Vec<String> = Learner::new(&spec, 4)
            .unwrap()
            .vars
            .layout()
            .map(|(n, _)| n.to_string())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(names[0], "fc0.bias");
    }

    #[test]
    fn wrong_sizes_are_errors_not_panics() {
        let spec = ModelSpec::Softmax {
            inputs: 4,
            classes: 3,
        };
        let mut rng = StdRng::seed_from_u64(4);
        let data = random_data(&spec, 5, &mut rng);
        let mut l = Learner::new(&spec, 2).unwrap();
        let p = l.init_params(&mut rng);
        let short = &p[..p.len() - 1];
        let shape_err = |r: Result<(), LearnError>| match r {
            Err(LearnError::Shape(m)) => m,
            other => panic!("expected a shape error, got {other:?}"),
        };
        let m = shape_err(l.evaluate(short, &data).map(drop));
        assert!(m.contains("15") && m.contains("14"), "{m}");
        shape_err(l.loss_and_grad(short, &data, None).map(drop));
        shape_err(l.predict(short, &data).map(drop));
        let mut long = p.clone();
        long.push(0.0);
        let mut opt = Adam::new(p.len(), 0.1);
        shape_err(
            l.train_epoch(&mut long, &mut opt, &data, &mut rng)
                .map(drop),
        );
        shape_err(
            l.train_epoch(&mut p.clone(), &mut Adam::new(3, 0.1), &data, &mut rng)
                .map(drop),
        );

        let wide = random_data(
            &ModelSpec::Softmax {
                inputs: 5,
                classes: 3,
            },
            5,
            &mut rng,
        );
        let m = shape_err(l.evaluate(&p, &wide).map(drop));
        assert!(m.contains('4') && m.contains('5'), "{m}");
        let many = random_data(
            &ModelSpec::Softmax {
                inputs: 4,
                classes: 9,
            },
            50,
            &mut rng,
        );
        shape_err(l.loss_and_grad(&p, &many, None).map(drop));
        let real = random_data(
            &ModelSpec::Linear {
                inputs: 4,
                outputs: 1,
            },
            5,
            &mut rng,
        );
        shape_err(l.evaluate(&p, &real).map(drop));

        assert!(
            Learner::new(
                &ModelSpec::Linear {
                    inputs: 3,
                    outputs: 2
                },
                4
            )
            .is_err()
        );
        assert!(Learner::new(&spec, 0).is_err());
        assert!(
            Learner::new(
                &ModelSpec::Cnn {
                    channels: 1,
                    height: 8,
                    width: 8,
                    conv: vec![2, 2],
                    classes: 2
                },
                4
            )
            .is_err()
        );
        assert!(
            Learner::new(
                &ModelSpec::Mlp {
                    inputs: 3,
                    hidden: vec![0],
                    classes: 2
                },
                4
            )
            .is_err()
        );
    }

    #[test]
    fn a_learner_can_move_to_a_trainer_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Learner>();
    }

    #[test]
    fn cnn_takes_flat_samples_of_the_right_size() {
        let spec = ModelSpec::Cnn {
            channels: 2,
            height: 6,
            width: 6,
            conv: vec![2],
            classes: 3,
        };
        let mut rng = StdRng::seed_from_u64(5);
        let data = random_data(&spec, 4, &mut rng);
        let flat = Dataset {
            sample_shape: vec![72],
            ..data.clone()
        };
        let mut l = Learner::new(&spec, 3).unwrap();
        let p = l.init_params(&mut rng);
        assert_eq!(
            l.evaluate(&p, &data).unwrap(),
            l.evaluate(&p, &flat).unwrap()
        );
        let transposed = Dataset {
            sample_shape: vec![6, 6, 2],
            ..data.clone()
        };
        assert!(matches!(
            l.evaluate(&p, &transposed),
            Err(LearnError::Shape(_))
        ));
    }

    /// Three well-separated clusters in the plane (centres 3 apart on a circle, noise in a
    /// unit square): linearly separable.
    fn clusters(n: usize, rng: &mut StdRng) -> Dataset {
        let centres = [(3.0f32, 0.0f32), (-1.5, 2.6), (-1.5, -2.6)];
        let mut features = Vec::with_capacity(2 * n);
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            let c = rng.random_range(0..3u32);
            let (x, y) = centres[c as usize];
            features.push(x + rng.random::<f32>() * 2.0 - 1.0);
            features.push(y + rng.random::<f32>() * 2.0 - 1.0);
            ids.push(c);
        }
        Dataset::new(
            features,
            vec![2],
            Labels::Class {
                ids,
                num_classes: 3,
            },
        )
        .unwrap()
    }

    #[test]
    fn softmax_learns_separable_clusters() {
        let spec = ModelSpec::Softmax {
            inputs: 2,
            classes: 3,
        };
        let mut rng = StdRng::seed_from_u64(6);
        let (train, test) = (clusters(300, &mut rng), clusters(200, &mut rng));
        let mut l = Learner::new(&spec, 20).unwrap();
        let mut p = l.init_params(&mut rng);
        let mut opt = Adam::new(p.len(), 0.05);
        let before = l.evaluate(&p, &test).unwrap();
        let mut losses = Vec::new();
        for _ in 0..20 {
            losses.push(l.train_epoch(&mut p, &mut opt, &train, &mut rng).unwrap());
        }
        assert_eq!(opt.steps(), 20 * 15);
        let after = l.evaluate(&p, &test).unwrap();
        assert!(
            after.accuracy() > 0.95,
            "accuracy {} (before {})",
            after.accuracy(),
            before.accuracy()
        );
        assert!(losses[19] < losses[0] / 2.0, "{losses:?}");
        assert!(after.mean_loss() < before.mean_loss());
    }

    #[test]
    fn linear_regression_fits_a_line() {
        let spec = ModelSpec::Linear {
            inputs: 1,
            outputs: 1,
        };
        let mut rng = StdRng::seed_from_u64(7);
        let xs: Vec<f32> = (0..200).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
        let ys = xs.iter().map(|x| 2.0 * x + 1.0).collect();
        let data = Dataset::new(xs, vec![1], Labels::Real(ys)).unwrap();
        let mut l = Learner::new(&spec, 10).unwrap();
        let mut p = l.init_params(&mut rng);
        let mut opt = Adam::new(p.len(), 0.05);
        for epoch in 0..60 {
            if epoch == 40 {
                opt.lr = 0.005;
            }
            l.train_epoch(&mut p, &mut opt, &data, &mut rng).unwrap();
        }
        // Name order: fc0.bias, then fc0.weight.
        assert!(
            (p[0] - 1.0).abs() < 0.02 && (p[1] - 2.0).abs() < 0.02,
            "{p:?}"
        );
        let ev = l.evaluate(&p, &data).unwrap();
        assert!(ev.mean_loss() < 1e-3, "{}", ev.mean_loss());
        assert_eq!(ev.correct, 0);
        let out = l.predict(&p, &data).unwrap();
        assert_eq!(out.len(), data.len());
        assert!((out[0] - (2.0 * data.features[0] + 1.0)).abs() < 0.05);
    }

    #[test]
    fn predicted_probabilities_sum_to_one() {
        for spec in &tiny_specs()[1..] {
            let mut rng = StdRng::seed_from_u64(8);
            let data = random_data(spec, 11, &mut rng);
            let mut l = Learner::new(spec, 4).unwrap();
            let p = l.init_params(&mut rng);
            let probs = l.predict(&p, &data).unwrap();
            assert_eq!(probs.len(), 11 * 3);
            for row in probs.chunks(3) {
                assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{row:?}");
                assert!(row.iter().all(|&q| q > 0.0 && q < 1.0));
            }
            // The most probable class is the one evaluate counts as the prediction.
            let Labels::Class { ids, .. } = &data.labels else {
                unreachable!()
            };
            let hits = probs
                .chunks(3)
                .zip(ids)
                .filter(|(row, y)| log_loss_and_argmax(row, 0).1 == **y as usize)
                .count();
            assert_eq!(hits, l.evaluate(&p, &data).unwrap().correct);
        }
    }

    #[test]
    fn init_is_seeded_and_bounded_by_fan_in() {
        let spec = ModelSpec::Mlp {
            inputs: 16,
            hidden: vec![4],
            classes: 2,
        };
        let l = Learner::new(&spec, 4).unwrap();
        let a = l.init_params(&mut StdRng::seed_from_u64(9));
        assert_eq!(a, l.init_params(&mut StdRng::seed_from_u64(9)));
        assert_ne!(a, l.init_params(&mut StdRng::seed_from_u64(10)));
        // Sorted: fc0.bias (4), fc0.weight (64): fan-in 16; fc1.bias (2), fc1.weight (8): fan-in 4.
        assert!(a[..68].iter().all(|v| v.abs() <= 0.25));
        assert!(a[..68].iter().any(|v| v.abs() > 0.2));
        assert!(a[68..].iter().any(|v| v.abs() > 0.25) && a[68..].iter().all(|v| v.abs() <= 0.5));
    }

    #[test]
    fn inference_builds_no_graph() {
        let spec = ModelSpec::Mlp {
            inputs: 3,
            hidden: vec![4],
            classes: 2,
        };
        let l = Learner::new(&spec, 4).unwrap();
        let x = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(!l.eval_net.forward(&x).unwrap().track_op());
        assert!(l.train_net.forward(&x).unwrap().track_op());
    }

    #[test]
    fn max_pool_sends_the_whole_gradient_to_the_first_positive_maximum() {
        // candle 0.11.1's max_pool2d backward gives 0.25 here instead of 1.
        let dev = Device::Cpu;
        // Two 3x5 channels, written channel-first for reading, then made channels-last.
        #[rustfmt::skip]
        let nchw = Tensor::new(&[[
            [[1f32, 2., 9., 9., 7.], [3., 4., -1., 0., 7.], [5., 5., 5., 5., 5.]],
            [[-1f32, -2., 0., 0., 1.], [-3., -4., 0., 0., 1.], [1., 1., 1., 1., 1.]],
        ]], &dev).unwrap();
        let x = candle_core::Var::from_tensor(&nchw.permute((0, 2, 3, 1)).unwrap()).unwrap();
        let y = x.as_tensor().apply_op1(ops::MaxPoolRelu).unwrap();
        assert_eq!(y.dims(), [1, 1, 2, 2]);
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(&y), [4., 0., 9., 0.]);
        let w = Tensor::new(&[[[[10f32, 30.], [20., 40.]]]], &dev).unwrap();
        let grads = (y * w).unwrap().sum_all().unwrap().backward().unwrap();
        let g = grads
            .get(x.as_tensor())
            .unwrap()
            .permute((0, 3, 1, 2))
            .unwrap();
        #[rustfmt::skip]
        let want = [
            0., 0., 20., 0., 0., 0., 10., 0., 0., 0., 0., 0., 0., 0., 0.,
            0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.,
        ];
        assert_eq!(flat(&g), want);
    }

    #[test]
    fn im2col_matches_a_direct_convolution() {
        // One sample, 2 channels, 4x5, 3 output channels: compare with the textbook sum.
        let (c, h, w, co) = (2, 4, 5, 3);
        let mut rng = StdRng::seed_from_u64(11);
        let x: Vec<f32> = (0..c * h * w).map(|_| rng.random::<f32>() - 0.5).collect();
        let k: Vec<f32> = (0..9 * c * co).map(|_| rng.random::<f32>() - 0.5).collect();
        let dev = Device::Cpu;
        let conv = Conv {
            weight: Tensor::from_slice(&k, (3, 3, c, co), &dev).unwrap(),
            bias: Tensor::zeros(co, DType::F32, &dev).unwrap(),
        };
        let xt = Tensor::from_slice(&x, (1, c, h, w), &dev).unwrap();
        let out = conv.forward(&xt, ops::Layout4::Nchw).unwrap();
        assert_eq!(out.dims(), [1, 2, 3, co]);
        let from_nhwc = conv
            .forward(
                &xt.permute((0, 2, 3, 1)).unwrap().contiguous().unwrap(),
                ops::Layout4::Nhwc,
            )
            .unwrap();
        let out = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(
            out,
            from_nhwc.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        for (y, x0, o) in
            (0..2).flat_map(|y| (0..3).flat_map(move |x0| (0..co).map(move |o| (y, x0, o))))
        {
            let mut want = 0.0;
            for ky in 0..3 {
                for kx in 0..3 {
                    for ci in 0..c {
                        want += x[(ci * h + y + ky) * w + x0 + kx]
                            * k[((ky * 3 + kx) * c + ci) * co + o];
                    }
                }
            }
            let got = out[(y * 3 + x0) * co + o];
            assert!((got - want).abs() < 1e-5, "({y},{x0},{o}): {got} vs {want}");
        }
    }

    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        // <im2col(x), g> = <x, col2im(g)> for every x, g: the backward pass is exact.
        let dev = Device::Cpu;
        let mut rng = StdRng::seed_from_u64(12);
        for (layout, dims) in [
            (ops::Layout4::Nchw, (2, 3, 4, 5)),
            (ops::Layout4::Nhwc, (2, 4, 5, 3)),
        ] {
            let n = dims.0 * dims.1 * dims.2 * dims.3;
            let xv: Vec<f32> = (0..n).map(|_| rng.random::<f32>() - 0.5).collect();
            let x = candle_core::Var::from_tensor(&Tensor::from_slice(&xv, dims, &dev).unwrap())
                .unwrap();
            let cols = x.as_tensor().apply_op1(ops::Im2col { layout }).unwrap();
            assert_eq!(cols.dims(), [2 * 2 * 3, 9 * 3 + 1]);
            // Zero against the bias column of ones, which has no input to flow back to.
            let gv: Vec<f32> = (0..cols.elem_count())
                .map(|i| {
                    if i % 28 == 27 {
                        0.0
                    } else {
                        rng.random::<f32>() - 0.5
                    }
                })
                .collect();
            let g = Tensor::from_slice(&gv, cols.shape(), &dev).unwrap();
            let lhs = (&cols * &g)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            let dx = (cols * g).unwrap().sum_all().unwrap().backward().unwrap();
            let dx = dx
                .get(x.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let rhs: f32 = xv.iter().zip(&dx).map(|(a, b)| a * b).sum();
            assert!((lhs - rhs).abs() < 1e-4, "{layout:?}: {lhs} vs {rhs}");
        }
    }

    #[test]
    fn flushing_denormals_affects_only_the_calling_thread() {
        let tiny = std::hint::black_box(1e-39f32);
        assert!(tiny * std::hint::black_box(1.0f32) != 0.0 || !cfg!(target_arch = "x86_64"));
        std::thread::spawn(move || {
            flush_denormals_to_zero();
            if cfg!(target_arch = "x86_64") {
                assert!(denormals_flushed());
                assert_eq!(tiny * std::hint::black_box(1.0f32), 0.0);
            }
        })
        .join()
        .unwrap();
        assert!(!denormals_flushed());
    }
}
