//! What an HCCT coordinator computes from models and gradients (spec
//! `docs/specs/hcct.md` §1.3, §2.5, §3): the size-weighted group average, the
//! pseudo-gradient, and HCCT-E's layer choice.
//! Owns: [`group_average`], [`pseudo_gradient`], [`layer_scores`] and [`select_layer`].
//! Must not: choose groups (`partition.rs`, `schedule.rs`) or train (the driver's work).

use super::HcctError;
use std::ops::Range;
// ------------------------------------------------------------------------------------------------
// Models and pseudo-gradients (§1.3, §3)
// ------------------------------------------------------------------------------------------------

/// Σ_j (D_j / D̂) · model_j, accumulated in f64 in the given (canonical, member) order and
/// rounded once to f32 (§3 steps 2 and 4; §5 step 4's one canonical path). Averaging identical
/// models gives them back bit for bit (the f64 error is far below half an f32 ulp), so a group
/// whose membership did not change keeps its model exactly.
pub fn group_average(models: &[&[f32]], sizes: &[usize]) -> Result<Vec<f32>, HcctError> {
    if models.len() != sizes.len() {
        return Err(HcctError::Count {
            what: "sample counts",
            expected: models.len(),
            got: sizes.len(),
        });
    }
    if let Some(client) = sizes.iter().position(|&d| d == 0) {
        return Err(HcctError::Size { client, size: 0 });
    }
    let m = models.first().map_or(0, |p| p.len());
    if let Some(client) = models.iter().position(|p| p.len() != m) {
        return Err(HcctError::Length {
            client,
            expected: m,
            got: models[client].len(),
        });
    }
    let total: f64 = sizes.iter().map(|&d| d as f64).sum();
    let mut acc = vec![0f64; m];
    for (p, &d) in models.iter().zip(sizes) {
        let w = d as f64 / total;
        for (a, &x) in acc.iter_mut().zip(p.iter()) {
            *a += w * f64::from(x);
        }
    }
    Ok(acc.into_iter().map(|x| x as f32).collect())
}

/// g = (w_start − w_end) / η (§1.3, eq. 5): for plain SGD at a constant η this is exactly the
/// sum of the mini-batch-mean gradients of the round, so that ŵ − η Σ a_i g_i is the group
/// update.
pub fn pseudo_gradient(start: &[f32], end: &[f32], lr: f64) -> Vec<f32> {
    let inv = (1.0 / lr) as f32;
    start
        .iter()
        .zip(end)
        .map(|(&s, &e)| (s - e) * inv)
        .collect()
}

// ------------------------------------------------------------------------------------------------
// HCCT-E (§2.5)
// ------------------------------------------------------------------------------------------------

/// HCCT-E's score of each layer (§2.5, the code's formula, A6 "faithful"): for each parameter
/// tensor of the layer, the variance (unbiased, as `torch.var`) over all entries of all clients
/// pooled, divided by their *signed* pooled mean (0 where the mean is exactly 0, the guard A6
/// asks for); a layer's score is the sum over its tensors (weight and bias). `layers[l]` lists
/// the flat ranges of layer l's tensors.
pub fn layer_scores(grads: &[&[f32]], layers: &[Vec<Range<usize>>]) -> Result<Vec<f64>, HcctError> {
    let len = grads.first().map_or(0, |g| g.len());
    if let Some(client) = grads.iter().position(|g| g.len() != len) {
        return Err(HcctError::Length {
            client,
            expected: len,
            got: grads[client].len(),
        });
    }
    layers
        .iter()
        .map(|tensors| {
            let mut score = 0.0;
            for r in tensors {
                if r.start > r.end || r.end > len {
                    return Err(HcctError::Block {
                        start: r.start,
                        end: r.end,
                        len,
                    });
                }
                let count = (r.len() * grads.len()) as f64;
                let mean = grads
                    .iter()
                    .flat_map(|g| &g[r.clone()])
                    .map(|&x| f64::from(x))
                    .sum::<f64>()
                    / count;
                let ss: f64 = grads
                    .iter()
                    .flat_map(|g| &g[r.clone()])
                    .map(|&x| (f64::from(x) - mean).powi(2))
                    .sum();
                let var = if count > 1.0 { ss / (count - 1.0) } else { 0.0 };
                if mean != 0.0 && mean.is_finite() {
                    score += var / mean;
                }
            }
            Ok(score)
        })
        .collect()
}

/// l* = argmax of [`layer_scores`] (the first on ties; `None` without layers). The code chooses
/// it once, from one local pass of every client from the common initial model.
pub fn select_layer(
    grads: &[&[f32]],
    layers: &[Vec<Range<usize>>],
) -> Result<Option<usize>, HcctError> {
    let scores = layer_scores(grads, layers)?;
    Ok(scores
        .iter()
        .enumerate()
        .fold(None, |best: Option<(usize, f64)>, (l, &s)| match best {
            Some((_, b)) if s <= b => best,
            _ => Some((l, s)),
        })
        .map(|(l, _)| l))
}
