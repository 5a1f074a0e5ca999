//! Budget-aware collaboration (issue 40, item 4): how a silo shares one release's sensitivity
//! among the models of a step, by what its weights say each is worth.
//!
//! Owns: the per-model clip norms of a step from the silo's weights.
//! Must not: compute gradients or weights (that is `learn` and `core`), or account (a split
//! changes no ε: the norms' L2 total is the clip the noise is calibrated to).
//!
//! Why weights, and why linearly: the step adds noise N(0, σ²C²) to every model's sum whatever
//! the split, and owner j receives this silo's gradient times w_j. With per-model norms c_j
//! (Σ c_j² = C²) the weighted signal a clipped example carries is at most Σ_j w_j·c_j, largest
//! (Cauchy–Schwarz) at c_j = C·w_j / ‖w‖₂; the joint clip instead gives each model the share its
//! gradient happens to take, so a model the silo barely trusts takes as much of C as its own.

use crate::ids::NodeId;
use serde::{Deserialize, Serialize};

/// How a step's clip norm is shared among its models (`privacy.clip_split`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClipSplit {
    /// One norm for the concatenated gradients (DP-SGD's textbook joint clip).
    #[default]
    Joint,
    /// A norm per model, proportional to the silo's weight on it.
    Weights,
}

/// The share of a uniform split mixed into the weights, so a model weighted 0 (one the silo
/// has just sampled to explore) still gets some signal.
const UNIFORM_MIX: f64 = 0.1;

/// Per-model clip norms for a step over `models`, whose L2 total is `clip`: proportional to
/// each model's weight (from `weights`; a model without one gets the mean of the others', or
/// all the same when none has one), mixed with a tenth of the uniform split.
pub fn by_weight(clip: f64, models: &[NodeId], weights: &[(NodeId, f64)]) -> Vec<f64> {
    let k = models.len();
    if k == 0 {
        return Vec::new();
    }
    let known: Vec<Option<f64>> = models
        .iter()
        .map(|b| {
            weights
                .iter()
                .find(|(id, _)| id == b)
                .map(|x| x.1)
                .filter(|w| w.is_finite() && *w >= 0.0)
        })
        .collect();
    let n_known = known.iter().flatten().count();
    let mean = if n_known == 0 {
        1.0
    } else {
        known.iter().flatten().sum::<f64>() / n_known as f64
    };
    let raw: Vec<f64> = known.iter().map(|w| w.unwrap_or(mean)).collect();
    let total: f64 = raw.iter().sum();
    let w: Vec<f64> = raw
        .iter()
        .map(|&w| {
            let share = if total > 0.0 {
                w / total
            } else {
                1.0 / k as f64
            };
            (1.0 - UNIFORM_MIX) * share + UNIFORM_MIX / k as f64
        })
        .collect();
    let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
    w.iter().map(|x| clip * x / norm).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> Vec<NodeId> {
        (0..n).map(NodeId).collect()
    }

    #[test]
    fn the_norms_spend_the_clip_and_follow_the_weights() {
        let c = by_weight(
            2.0,
            &ids(3),
            &[(NodeId(0), 0.6), (NodeId(1), 0.3), (NodeId(2), 0.1)],
        );
        let l2 = c.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((l2 - 2.0).abs() < 1e-12, "{c:?}");
        assert!(c[0] > c[1] && c[1] > c[2], "{c:?}");
        // A tenth of the uniform split: a weight of 0 still gets some signal.
        let c = by_weight(1.0, &ids(2), &[(NodeId(0), 1.0), (NodeId(1), 0.0)]);
        assert!(c[1] > 0.0 && c[1] < 0.1, "{c:?}");
        // Equal weights, none known, or an empty step: the uniform split.
        for w in [vec![(NodeId(0), 0.2), (NodeId(1), 0.2)], vec![]] {
            let c = by_weight(1.0, &ids(2), &w);
            assert!((c[0] - c[1]).abs() < 1e-15 && (c[0] - 0.5f64.sqrt()).abs() < 1e-12);
        }
        assert!(by_weight(1.0, &[], &[]).is_empty());
        // A model without a weight gets the mean of the others'; a NaN counts as none.
        let c = by_weight(
            1.0,
            &ids(3),
            &[(NodeId(0), 0.5), (NodeId(1), f64::NAN), (NodeId(2), 0.1)],
        );
        let mid = by_weight(
            1.0,
            &ids(3),
            &[(NodeId(0), 0.5), (NodeId(1), 0.3), (NodeId(2), 0.1)],
        );
        assert!((c[1] - mid[1]).abs() < 1e-12, "{c:?} {mid:?}");
    }
}
