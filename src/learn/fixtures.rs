//! Test fixtures shared by the unit tests of `spec.rs`, `net.rs` and `learner.rs`.
//!
//! Owns: a few tiny architectures and random data sets that fit them.
//! Must not: be compiled outside `cfg(test)`, or hold assertions.

use super::data::{Dataset, Labels};
use super::spec::ModelSpec;
use rand::RngExt;
use rand::rngs::StdRng;

/// `n` samples of shape `shape` with features in [-1, 1): class labels for a classifier
/// spec, real targets for regression.
pub(super) fn random_data(spec: &ModelSpec, n: usize, rng: &mut StdRng) -> Dataset {
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

pub(super) fn tiny_specs() -> Vec<ModelSpec> {
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
