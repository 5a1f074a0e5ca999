//! Model specifications: which architecture a run trains, and the layers it is made of.
//!
//! Owns: [`ModelSpec`] (schema, validation, fingerprint, parameter count) and the layer plan
//! every network and parameter layout is built from.
//! Must not: build tensors (that is `net.rs` and `learner.rs`) or hold parameters.

use super::error::LearnError;
use serde::{Deserialize, Serialize};

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
pub(super) const KERNEL: usize = 3;

/// Side after a 3×3 convolution without padding and a 2×2 max-pool (floor).
fn pooled(side: usize) -> usize {
    side.saturating_sub(KERNEL - 1) / 2
}

/// The layers of an architecture: conv layers as `(in_channels, out_channels)`, then dense
/// layers as `(in, out)`. Conv layers are named `conv{i}`, dense layers `fc{i}`.
pub(super) struct Plan {
    pub(super) convs: Vec<(usize, usize)>,
    pub(super) dense: Vec<(usize, usize)>,
}

impl Plan {
    /// Never fails: sizes of an invalid spec saturate at zero ([`ModelSpec::validate`] rejects it).
    pub(super) fn of(spec: &ModelSpec) -> Self {
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
    pub(super) fn variables(&self) -> Vec<(String, Vec<usize>, usize)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::Learner;
    use crate::learn::fixtures::tiny_specs;

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
}
