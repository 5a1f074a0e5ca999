//! Flat parameter vectors <-> candle variables.
//! Owns: the fixed, name-sorted order in which a model's variables are flattened.
//! Must not: be visible outside `learn` (callers only see `&[f32]`).

use super::error::LearnError;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, InplaceOp1, Layout, Storage, Tensor, Var};
use candle_nn::VarMap;

/// The variables of a model in flattening order: sorted by name, because a [`VarMap`] is a
/// `HashMap` whose iteration order differs between processes.
pub(crate) struct FlatVars {
    /// `(name, variable)`, sorted by name.
    vars: Vec<(String, Var)>,
    /// Total number of f32 values.
    len: usize,
}

impl FlatVars {
    /// Snapshot of the variables of `vm`, in name order. Build it after the model is built.
    pub(crate) fn new(vm: &VarMap) -> Self {
        let mut vars: Vec<(String, Var)> = vm
            .data()
            .lock()
            .expect("the VarMap lock is only taken briefly, never across a panic")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let len = vars.iter().map(|(_, v)| v.elem_count()).sum();
        Self { vars, len }
    }

    /// Total number of parameters.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `(name, dims)` of every variable, in flattening order.
    pub(crate) fn layout(&self) -> impl Iterator<Item = (&str, &[usize])> {
        self.vars.iter().map(|(k, v)| (k.as_str(), v.dims()))
    }

    /// Copies `flat` into the variables (in place: models built on them see the new values).
    pub(crate) fn set(&self, flat: &[f32]) -> Result<(), LearnError> {
        if flat.len() != self.len {
            return Err(LearnError::Shape(format!(
                "expected {} parameters, got {}",
                self.len,
                flat.len()
            )));
        }
        let mut o = 0;
        for (_, v) in &self.vars {
            let n = v.elem_count();
            // Straight into the variable's storage: no temporary tensor, one copy.
            v.as_tensor().inplace_op1(&CopyFrom(&flat[o..o + n]))?;
            o += n;
        }
        Ok(())
    }

    /// Writes (or, with `accumulate`, adds) the gradients of all variables into `out`, in
    /// flattening order; a variable absent from `grads` (not part of the loss) counts as zero.
    pub(crate) fn grads_into(
        &self,
        grads: &GradStore,
        out: &mut [f32],
        accumulate: bool,
    ) -> Result<(), LearnError> {
        if out.len() != self.len {
            return Err(LearnError::Shape(format!(
                "expected a gradient buffer of {} values, got {}",
                self.len,
                out.len()
            )));
        }
        let mut o = 0;
        for (name, v) in &self.vars {
            let n = v.elem_count();
            let dst = &mut out[o..o + n];
            match grads.get(v.as_tensor()) {
                Some(g) => with_f32_slice(g, |src| {
                    if src.len() != n {
                        return Err(LearnError::Shape(format!(
                            "gradient of {name} has {} values, expected {n}",
                            src.len()
                        )));
                    }
                    if accumulate {
                        dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
                    } else {
                        dst.copy_from_slice(src);
                    }
                    Ok(())
                })??,
                None if !accumulate => dst.fill(0.0),
                None => {}
            }
            o += n;
        }
        Ok(())
    }
}

/// Overwrites a contiguous f32 CPU tensor with the given values (same count).
struct CopyFrom<'a>(&'a [f32]);

impl InplaceOp1 for CopyFrom<'_> {
    fn name(&self) -> &'static str {
        "copy-from-slice"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let CpuStorage::F32(values) = storage else {
            candle_core::bail!("copy-from-slice expects f32 storage");
        };
        match layout.contiguous_offsets() {
            Some((start, end)) if end - start == self.0.len() => {
                values[start..end].copy_from_slice(self.0);
                Ok(())
            }
            _ => candle_core::bail!(
                "copy-from-slice: {} values into {:?}",
                self.0.len(),
                layout.shape()
            ),
        }
    }
}

/// Runs `f` on the values of an f32 CPU tensor in row-major order, without copying them when the
/// tensor is contiguous.
pub(crate) fn with_f32_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R, LearnError> {
    let contiguous;
    let t = if t.is_contiguous() {
        t
    } else {
        contiguous = t.contiguous()?;
        &contiguous
    };
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(LearnError::Shape("expected a tensor on the CPU".into()));
    };
    let all = cpu.as_slice::<f32>()?;
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| LearnError::Shape("expected a contiguous tensor".into()))?;
    Ok(f(&all[start..end]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::Init;

    #[test]
    fn flattens_in_name_order_and_zero_fills_unused_gradients() {
        let (vm, dev) = (VarMap::new(), Device::Cpu);
        let b = vm
            .get((2, 2), "b", Init::Const(0.0), DType::F32, &dev)
            .unwrap();
        let a = vm.get(3, "a", Init::Const(0.0), DType::F32, &dev).unwrap();
        let unused = vm.get(1, "c", Init::Const(0.0), DType::F32, &dev).unwrap();
        let fv = FlatVars::new(&vm);
        assert_eq!(fv.len(), 8);
        let names: Vec<&str> = fv.layout().map(|(n, _)| n).collect();
        assert_eq!(names, ["a", "b", "c"]);
        fv.set(&[1., 2., 3., 4., 5., 6., 7., 8.]).unwrap();
        assert_eq!(a.to_vec1::<f32>().unwrap(), [1., 2., 3.]);
        assert_eq!(b.to_vec2::<f32>().unwrap(), [[4., 5.], [6., 7.]]);
        assert_eq!(unused.to_vec1::<f32>().unwrap(), [8.]);
        assert!(matches!(fv.set(&[0.0; 7]), Err(LearnError::Shape(_))));

        // loss = sum(a) + sum(bᵀ ⊙ [[1,2],[3,4]]): grad b = [[1,3],[2,4]] (through a transpose).
        let k = Tensor::new(&[[1f32, 2.], [3., 4.]], &dev).unwrap();
        let loss =
            (a.sum_all().unwrap() + (b.t().unwrap() * &k).unwrap().sum_all().unwrap()).unwrap();
        let grads = loss.backward().unwrap();
        let mut out = vec![9.0; 8];
        fv.grads_into(&grads, &mut out, false).unwrap();
        assert_eq!(out, [1., 1., 1., 1., 3., 2., 4., 0.]);
        fv.grads_into(&grads, &mut out, true).unwrap();
        assert_eq!(out, [2., 2., 2., 2., 6., 4., 8., 0.]);
    }

    #[test]
    fn reads_non_contiguous_tensors_in_row_major_order() {
        let t = Tensor::new(&[[1f32, 2., 3.], [4., 5., 6.]], &Device::Cpu).unwrap();
        let v = with_f32_slice(&t.t().unwrap(), <[f32]>::to_vec).unwrap();
        assert_eq!(v, [1., 4., 2., 5., 3., 6.]);
        let v = with_f32_slice(&t.narrow(1, 1, 2).unwrap(), <[f32]>::to_vec).unwrap();
        assert_eq!(v, [2., 3., 5., 6.]);
    }
}
