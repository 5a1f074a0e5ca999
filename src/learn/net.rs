//! The network of a [`ModelSpec`](super::ModelSpec): dense and 3×3 convolution layers built
//! on named tensors, and the forward pass.
//!
//! Owns: the layers (their weight layouts) and how a batch flows through them.
//! Must not: own variables, parameters or losses (that is `learner.rs`), or implement kernels
//! (that is `ops.rs`).

use super::ops;
use super::spec::{KERNEL, Plan};
use candle_core::Tensor;

/// A dense layer `x · W + b`. The weight is stored `[in, out]` (the transpose of PyTorch's
/// layout) so that its gradient, `xᵀ · g`, comes out of backprop contiguous and is flattened
/// without a copy.
struct Dense {
    weight: Tensor,
    bias: Tensor,
}

impl Dense {
    fn forward(&self, x: &Tensor, tap: Tapping<'_>) -> candle_core::Result<Tensor> {
        let z = x.matmul(&self.weight)?.broadcast_add(&self.bias)?;
        tap.record(x, z, 1)
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
    fn forward(
        &self,
        x: &Tensor,
        layout: ops::Layout4,
        tap: Tapping<'_>,
    ) -> candle_core::Result<Tensor> {
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
        let z = cols.matmul(&w)?;
        tap.record(&cols, z, oh * ow)?.reshape((n, oh, ow, cout))
    }
}

/// Which layer a [`Tap`] belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layer {
    /// `conv{i}`.
    Conv(usize),
    /// `fc{i}`.
    Dense(usize),
}

/// What a tapped forward pass keeps of one layer, for per-example gradients: the layer's output
/// is `input · [weight; bias]`, so example `i`'s weight gradient is its rows of `input`,
/// transposed, times its rows of the probe's gradient.
pub(super) struct Tap {
    /// The layer.
    pub(super) layer: Layer,
    /// The layer's input as its matrix product takes it: `[n, in]` for a dense layer,
    /// im2col's `[n·positions, 9·c + 1]` (a column of ones last) for a convolution.
    pub(super) input: Tensor,
    /// A zero variable added to the layer's output (`[n·positions, out]`): its gradient is the
    /// loss's gradient with respect to that output.
    pub(super) probe: candle_core::Var,
    /// Output positions per example (1 for a dense layer).
    pub(super) positions: usize,
}

/// Where a layer's forward pass records its [`Tap`], if anywhere.
struct Tapping<'a>(Option<(&'a mut Vec<Tap>, Layer)>);

impl Tapping<'_> {
    /// `z`, plus a zero probe recorded with `input` when tapping.
    fn record(self, input: &Tensor, z: Tensor, positions: usize) -> candle_core::Result<Tensor> {
        let Some((taps, layer)) = self.0 else {
            return Ok(z);
        };
        let probe = candle_core::Var::zeros(z.shape(), z.dtype(), z.device())?;
        let z = (z + probe.as_tensor())?;
        taps.push(Tap {
            layer,
            input: input.clone(),
            probe,
            positions,
        });
        Ok(z)
    }
}

/// The network of a [`ModelSpec`], built on tensors that are either the variables (training,
/// records a graph) or detached views of the same storage (inference, no graph).
pub(super) struct Net {
    convs: Vec<Conv>,
    dense: Vec<Dense>,
}

impl Net {
    /// Builds the layers of `plan`, fetching each tensor by name.
    pub(super) fn build(
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
    pub(super) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.run(x, None)
    }

    /// [`Self::forward`] with a zero probe added to every layer's output, and what per-example
    /// gradients need of each layer ([`Tap`]), in layer order. Built on detached tensors, the
    /// probes are the graph's only variables.
    pub(super) fn forward_tapped(&self, x: &Tensor) -> candle_core::Result<(Tensor, Vec<Tap>)> {
        let mut taps = Vec::with_capacity(self.convs.len() + self.dense.len());
        let out = self.run(x, Some(&mut taps))?;
        Ok((out, taps))
    }

    /// The forward pass, recording taps when given somewhere to put them.
    fn run(&self, x: &Tensor, mut taps: Option<&mut Vec<Tap>>) -> candle_core::Result<Tensor> {
        let x = self.hidden(x, taps.as_deref_mut())?;
        match self.dense.last() {
            Some(last) => last.forward(&x, tap(taps, Layer::Dense(self.dense.len() - 1))),
            None => Ok(x),
        }
    }

    /// The input of the last dense layer, `[n, width]`: every layer but the last (post-ReLU).
    pub(super) fn penultimate(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.hidden(x, None)
    }

    fn hidden(&self, x: &Tensor, mut taps: Option<&mut Vec<Tap>>) -> candle_core::Result<Tensor> {
        let mut x = x.clone();
        let mut layout = ops::Layout4::Nchw;
        for (i, conv) in self.convs.iter().enumerate() {
            x = conv
                .forward(&x, layout, tap(taps.as_deref_mut(), Layer::Conv(i)))?
                .apply_op1(ops::MaxPoolRelu)?;
            layout = ops::Layout4::Nhwc;
        }
        if !self.convs.is_empty() {
            x = x.flatten_from(1)?;
        }
        for (i, layer) in self
            .dense
            .iter()
            .enumerate()
            .take(self.dense.len().saturating_sub(1))
        {
            x = layer
                .forward(&x, tap(taps.as_deref_mut(), Layer::Dense(i)))?
                .relu()?;
        }
        Ok(x)
    }
}

fn tap(taps: Option<&mut Vec<Tap>>, layer: Layer) -> Tapping<'_> {
    Tapping(taps.map(|t| (t, layer)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

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
        let out = conv
            .forward(&xt, ops::Layout4::Nchw, Tapping(None))
            .unwrap();
        assert_eq!(out.dims(), [1, 2, 3, co]);
        let from_nhwc = conv
            .forward(
                &xt.permute((0, 2, 3, 1)).unwrap().contiguous().unwrap(),
                ops::Layout4::Nhwc,
                Tapping(None),
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
}
