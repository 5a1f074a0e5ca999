//! CPU custom ops of the CNN: im2col for 3×3 convolutions and a 2×2 max-pool fused with ReLU,
//! each with its backward pass.
//!
//! Owns: the hand-written kernels and their gradients (candle `CustomOp1`/`CustomOp2`).
//! Must not: know about layers, parameters or data sets (the layers are in `net.rs`).

use super::spec::KERNEL;
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
fn conv_dims(layout: Layout4, shape: &Shape) -> Result<(usize, usize, usize, usize, usize, usize)> {
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
fn for_each_window(x: &[f32], shape: &Shape, mut f: impl FnMut(usize, usize, f32)) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use crate::learn::ops;
    use candle_core::{Device, Tensor};
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

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
}
