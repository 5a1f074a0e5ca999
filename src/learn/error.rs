//! The error type of the learning layer.
//!
//! Owns: [`LearnError`], returned by models, parameters and optimizers.
//! Must not: depend on any other module of [`crate::learn`] (it breaks the old
//! models ↔ params cycle).

/// Errors from building or running a model.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    /// An error inside candle.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// Parameters or data that do not fit the architecture.
    #[error("{0}")]
    Shape(String),
}
