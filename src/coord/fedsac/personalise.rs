//! FedSaC's personalised aggregation and local regulariser (spec `docs/specs/fedsac.md`
//! §4 steps 1 and 4, §4.3, §7.4): each sender's mixed model and regulariser direction from its
//! row of the graph, and the regulariser's gradient.
//! Owns: [`personalise`], [`mix`], [`direction`], [`add_regulariser_grad`] and [`RegSign`].
//! Must not: build the graph (`graph.rs`) or train (the silo's work, `silo::fedsac`).

use super::FedsacError;
use serde::{Deserialize, Serialize};
/// The sign of the local regulariser `sign · λ ⟨c, θ⟩ / ‖θ‖` (spec §7.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegSign {
    /// The paper's `−λ cos`: pulls θ towards the aggregate direction (default).
    #[default]
    Attract,
    /// The official code's (and pFedGraph's) `+λ`: pushes θ away.
    Repel,
}

/// A sender's personalised model [`mix`] and next round's regulariser [`direction`] from its
/// row of the graph (spec §4 step 4), in that order.
pub fn personalise(models: &[&[f32]], row: &[f64]) -> Result<(Vec<f32>, Vec<f32>), FedsacError> {
    Ok((mix(models, row)?, direction(models, row)?))
}

fn check_row(models: &[&[f32]], row: &[f64]) -> Result<usize, FedsacError> {
    if models.len() != row.len() {
        return Err(FedsacError::Shape {
            what: "weight row",
            index: 0,
            got: row.len(),
            expected: models.len(),
        });
    }
    let len = models.first().map(|m| m.len()).ok_or(FedsacError::Empty)?;
    if let Some((index, m)) = models.iter().enumerate().find(|(_, m)| m.len() != len) {
        return Err(FedsacError::Shape {
            what: "model",
            index,
            got: m.len(),
            expected: len,
        });
    }
    Ok(len)
}

/// Personalised aggregation (spec §4 step 4): `θ̃^i = Σ_j W_ij θ^j`, accumulated in f64.
pub fn mix(models: &[&[f32]], row: &[f64]) -> Result<Vec<f32>, FedsacError> {
    let len = check_row(models, row)?;
    let mut acc = vec![0f64; len];
    for (m, &w) in models.iter().zip(row) {
        if w != 0.0 {
            acc.iter_mut()
                .zip(m.iter())
                .for_each(|(a, &x)| *a += w * f64::from(x));
        }
    }
    Ok(acc.into_iter().map(|x| x as f32).collect())
}

/// The regulariser's direction for next round (spec §4 step 4, §4.3):
/// `c^i = Σ_j W_ij θ^j / ‖θ^j‖` (unit-normalised neighbour models, not `θ̃^i`).
pub fn direction(models: &[&[f32]], row: &[f64]) -> Result<Vec<f32>, FedsacError> {
    let len = check_row(models, row)?;
    let mut acc = vec![0f64; len];
    for (m, &w) in models.iter().zip(row) {
        let nm = m.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        if w != 0.0 && nm > 0.0 {
            let s = w / nm;
            acc.iter_mut()
                .zip(m.iter())
                .for_each(|(a, &x)| *a += s * f64::from(x));
        }
    }
    Ok(acc.into_iter().map(|x| x as f32).collect())
}

/// Adds the gradient of the local regulariser `sign · λ · ⟨c, θ⟩ / ‖θ‖` to `grad` (spec §4
/// step 1, §7.4): `sign · λ · (c / ‖θ‖ − ⟨c, θ⟩ θ / ‖θ‖³)`, with `sign = −1` for
/// [`RegSign::Attract`]. Nothing is added when `θ = 0` or `λ = 0`.
pub fn add_regulariser_grad(
    theta: &[f32],
    c: &[f32],
    lambda: f64,
    sign: RegSign,
    grad: &mut [f32],
) {
    let nt = theta
        .iter()
        .map(|&x| f64::from(x).powi(2))
        .sum::<f64>()
        .sqrt();
    if nt == 0.0 || lambda == 0.0 {
        return;
    }
    let ct: f64 = c
        .iter()
        .zip(theta)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum();
    let s = match sign {
        RegSign::Attract => -lambda,
        RegSign::Repel => lambda,
    };
    let (a, b) = (s / nt, s * ct / nt.powi(3));
    for ((g, &ci), &ti) in grad.iter_mut().zip(c).zip(theta) {
        *g += (a * f64::from(ci) - b * f64::from(ti)) as f32;
    }
}
