//! What one silo computes on its own data, the same in both drivers: the simulator
//! (`sim`) runs it for every silo in one process, the libp2p nodes ([`crate::net`])
//! each for their own silo.
//! Owns: each algorithm's local recipe (FedeRiCo's round jobs and checkpoint format,
//! mini-batch orders, the SGD steps, FedSaC's feature subspace, FedCollab's discriminator
//! halves), the stream tags that keep their random
//! streams apart, and the replay of those streams for a resumed silo.
//! Must not: drive rounds, talk to peers or a coordinator, or decide weights, groups or
//! coalitions (that is [`crate::core`] and [`crate::coord`]); it uses [`crate::learn`] and
//! their types only.

pub mod attack;
pub(crate) mod batches;
pub(crate) mod fedcollab;
pub(crate) mod feddisco;
pub mod federico;
pub(crate) mod fedsac;
pub(crate) mod hcct;
pub(crate) mod private;
pub(crate) mod recipe;

pub(crate) use batches::{BatchCursor, sgd_steps, skip_steps};
pub(crate) use recipe::LocalRecipe;

use crate::coord::fedsac::FedsacError;
use crate::learn::LearnError;

/// Errors of a silo's local computation.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SiloError {
    /// A model failed.
    #[error(transparent)]
    Learn(#[from] LearnError),
    /// FedSaC's feature subspace could not be formed.
    #[error("fedsac: {0}")]
    Fedsac(#[from] FedsacError),
    /// Something that cannot happen with a well-formed model and data did.
    #[error("silo invariant broken: {0}")]
    Invariant(String),
}
