//! HCCT, hierarchical clustering-based collaborative training (Sun, Kountouris & Zhang, "How to
//! Collaborate", IEEE TMC 2024; spec `docs/specs/hcct.md`), as pure, transport-free code.
//!
//! Owns: the client utility (spec §1.4, eq. 9) and the merge benefit (§2.2, eqs. 13–16) on the
//! Gram matrix of the pseudo-gradients (§2.4, accumulated in f64); ClientPartition (Algorithm 2,
//! §2.3), greedy agglomerative merging from singletons with deterministic tie-breaking; the
//! per-round schedule of partitions a coordinator hands out ([`Coordinator`]: round 0, every
//! round from scratch or one-shot, stale reports, §3 and §5); the size-weighted group average
//! (§3 steps 2 and 4), the pseudo-gradient and learning-rate schedule (§1.3, §3); HCCT-E's layer
//! choice (§2.5); and the `[hcct]` hyperparameters with the spec's defaults.
//! Must not: touch tensors, sockets, clocks or threads (std, rand and serde only). Local
//! training is the driver's (`sim::hcct`); this module sees flat `f32` slices and sample counts.
//!
//! Layout: `config.rs` (hyperparameters), `gram.rs` (Gram matrix, utility, benefit),
//! `partition.rs` (ClientPartition), `schedule.rs` ([`Coordinator`]), `models.rs` (group
//! average, pseudo-gradient, HCCT-E), `server.rs` (the network coordinator's state, also
//! `coord::hcct_server`).
//!
//! Privacy note (spec §5): the coordinator sees each client's pseudo-gradient, the same exposure
//! to gradient inversion as a FedAvg server; it never sees data.

mod config;
mod gram;
mod models;
mod partition;
mod schedule;
pub mod server;
#[cfg(test)]
mod tests;

pub use config::{
    Alpha, CoordinatorConfig, HcctConfig, Optimizer, PartitionConfig, Stop, learning_rate,
};
pub use gram::{Gram, client_utilities, merge_benefit};
pub use models::{group_average, layer_scores, pseudo_gradient, select_layer};
pub use partition::{Merge, Partition, partition, partition_gradients};
pub use schedule::{Coordinator, CoordinatorSnapshot};

/// Errors of the HCCT core. Each names the value at fault and what was allowed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum HcctError {
    /// α must be a finite number ≥ 0 (spec §1.3).
    #[error("alpha must be a finite number >= 0 or \"client_size\", got {0}")]
    Alpha(f64),
    /// The forced group count of the `fix_D` ablation (§2.3) must be at least 1.
    #[error("groups must be at least 1, got {0}")]
    Groups(usize),
    /// The update clip must be 0 (off) or at least 1.
    #[error("update_clip must be 0 (off) or at least 1, got {0}")]
    UpdateClip(f64),
    /// The trimmed mean's `trim` is outside [0, 0.5).
    #[error("{0}")]
    Trim(String),
    /// The size cap must be 0 (off) or at least 1.
    #[error("size_cap must be 0 (off) or at least 1, got {0}")]
    SizeCap(f64),
    /// The SGD learning rate η₀ (§3) must be finite and > 0.
    #[error("lr must be a finite number > 0, got {0}")]
    Lr(f64),
    /// The per-round decay of η (§3) must be in (0, 1].
    #[error("lr_decay must be in (0, 1], got {0}")]
    LrDecay(f64),
    /// E, local epochs per round (§3), must be at least 1.
    #[error("epochs must be at least 1, got {0}")]
    Epochs(usize),
    /// Every client needs at least one training sample (D_i ≥ 1, §1.3).
    #[error("client {client} has {size} training samples; D_i must be at least 1")]
    Size {
        /// The client.
        client: usize,
        /// Its reported sample count.
        size: usize,
    },
    /// One value per client was expected.
    #[error("{what}: expected one per client ({expected}), got {got}")]
    Count {
        /// What was counted.
        what: &'static str,
        /// Clients.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// All pseudo-gradients (and models) must have the same length (one parameter layout, §5).
    #[error("client {client}: expected {expected} values, got {got}")]
    Length {
        /// The client.
        client: usize,
        /// The length of the first vector.
        expected: usize,
        /// This vector's length.
        got: usize,
    },
    /// A NaN or infinite value in a pseudo-gradient or Gram matrix.
    #[error("client {client}: non-finite value in its pseudo-gradient or Gram row")]
    NonFinite {
        /// The client.
        client: usize,
    },
    /// A Gram matrix whose entries (i, j) and (j, i) differ.
    #[error("Gram matrix is not symmetric: entry ({i}, {j}) is {ij}, entry ({j}, {i}) is {ji}")]
    Asymmetric {
        /// Row.
        i: usize,
        /// Column.
        j: usize,
        /// Γ_ij.
        ij: f64,
        /// Γ_ji.
        ji: f64,
    },
    /// A parameter block of HCCT-E lies outside the gradient.
    #[error("layer block {start}..{end} is outside a pseudo-gradient of {len} values")]
    Block {
        /// Block start.
        start: usize,
        /// Block end.
        end: usize,
        /// Gradient length.
        len: usize,
    },
}
