//! Differential privacy at the source (spec `privacy.md`): the accountant and each silo's ledger.
//!
//! Owns: the Rényi-DP accountant of the Poisson-subsampled Gaussian mechanism ([`rdp`]), its
//! conversion to (ε, δ), a silo's ledger of what it has released to whom ([`ledger`]), how a
//! step's clip norm is shared among its models ([`split`]), and the membership-inference audit
//! a curious member can run ([`audit`]).
//! Must not: touch tensors, sockets, clocks or threads (std, serde and libm only): the noisy
//! gradients themselves are computed in `learn`, on a silo's rows.

pub mod audit;
pub mod config;
pub mod ledger;
pub mod rdp;
pub mod split;

pub use config::{NoiseSource, PrivacyConfig};
pub use ledger::{Audience, Budget, Ledger, Release, Spent};
pub use split::ClipSplit;

/// Why `[privacy]` refuses `mstep = "local_epoch"` (a node's config and a scenario alike).
pub const REFUSES_LOCAL_EPOCH: &str = "[privacy] with federico.mstep = \"local_epoch\" is not built: the owner's own sub-steps would be releases the ledger does not plan; use mstep = \"epoch\" or \"full\"";
