//! Machine learning with candle: models, flat parameters, optimizers, data and partitioners.
//!
//! Owns: everything that touches tensors or sample data.
//! Must not: know about rounds, peers, weights between silos or algorithms; those live in
//! [`crate::core`] and the drivers.

pub mod data;
mod error;
pub mod export;
#[cfg(test)]
mod fixtures;
mod learner;
pub mod loaders;
mod net;
mod ops;
pub mod optim;
mod params;
pub mod partition;
pub mod runtime;
pub mod scale;
pub mod shard;
mod spec;
pub mod synthetic;

pub use data::{ClientData, DataError, Dataset, Federation, Labels};
pub use error::LearnError;
pub use learner::{Clip, Evaluation, Learner, PrivateGrads};
pub use optim::{Adam, Sgd};
pub use scale::FeatureScale;
pub use shard::Shard;
pub use spec::ModelSpec;
