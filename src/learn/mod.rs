//! Machine learning with candle: models, flat parameters, optimizers, data and partitioners.
//!
//! Owns: everything that touches tensors or sample data.
//! Must not: know about rounds, peers, weights between silos or algorithms; those live in
//! [`crate::core`] and the drivers.

pub mod data;
pub mod loaders;
pub mod models;
pub mod optim;
mod params;
pub mod partition;
pub mod shard;
pub mod synthetic;

pub use data::{ClientData, DataError, Dataset, Federation, Labels};
pub use models::{Evaluation, LearnError, Learner, ModelSpec};
pub use optim::{Adam, Sgd};
pub use shard::Shard;
