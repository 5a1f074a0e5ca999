//! The `[model]` and `[train]` sections of a scenario: the architecture family and its sizes,
//! turned into a [`ModelSpec`] once the data's shape is known, and the optimisation shared by
//! every algorithm.
//! Owns: [`ModelConfig`], [`ModelKind`] and [`TrainConfig`].
//! Must not: build or train a model (`learn`).

use super::{ScenarioError, check};
use crate::learn::ModelSpec;
use serde::{Deserialize, Serialize};
/// Architecture family; sizes of inputs and outputs come from the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// Linear regression (the sine toy).
    Linear,
    /// Softmax regression.
    Softmax,
    /// Multi-layer perceptron.
    Mlp,
    /// Small CNN.
    Cnn,
}

/// `[model]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Architecture family.
    pub kind: ModelKind,
    /// MLP hidden widths.
    pub hidden: Vec<usize>,
    /// CNN conv channels per layer.
    pub conv: Vec<usize>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            kind: ModelKind::Softmax,
            hidden: vec![200],
            conv: vec![32, 64],
        }
    }
}

impl ModelConfig {
    /// The architecture for data whose samples have `sample_shape` and `classes` classes
    /// (`None` for regression).
    pub fn spec(
        &self,
        sample_shape: &[usize],
        classes: Option<usize>,
    ) -> Result<ModelSpec, ScenarioError> {
        let inputs: usize = sample_shape.iter().product();
        let m = self;
        let need_classes = || {
            classes.ok_or_else(|| {
                ScenarioError::Invalid(format!(
                    "model.kind {:?} needs a classification task",
                    m.kind
                ))
            })
        };
        Ok(match m.kind {
            ModelKind::Linear => ModelSpec::Linear { inputs, outputs: 1 },
            ModelKind::Softmax => ModelSpec::Softmax {
                inputs,
                classes: need_classes()?,
            },
            ModelKind::Mlp => ModelSpec::Mlp {
                inputs,
                hidden: m.hidden.clone(),
                classes: need_classes()?,
            },
            ModelKind::Cnn => {
                let [channels, height, width] = sample_shape else {
                    return Err(ScenarioError::Invalid(format!(
                        "model.kind \"cnn\" needs image samples [channels, height, width], got {sample_shape:?}"
                    )));
                };
                let mut side = (*height).min(*width);
                for _ in &m.conv {
                    if side < 4 {
                        break;
                    }
                    side = (side - 2) / 2;
                }
                check(
                    side >= 1 && (*height).min(*width) >= 4 * m.conv.len(),
                    || {
                        format!(
                            "model.conv has {} layers, too many for {height}x{width} images",
                            m.conv.len()
                        )
                    },
                )?;
                ModelSpec::Cnn {
                    channels: *channels,
                    height: *height,
                    width: *width,
                    conv: m.conv.clone(),
                    classes: need_classes()?,
                }
            }
        })
    }
}

/// `[train]`: optimisation shared by every algorithm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Adam learning rate (paper: 0.01).
    pub lr: f64,
    /// Mini-batch size for local epochs and for chunking full passes (paper: 50).
    pub batch_size: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            lr: 0.01,
            batch_size: 50,
        }
    }
}
