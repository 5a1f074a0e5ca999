//! FedSaC: personalised collaboration graphs that balance model similarity and feature
//! complementarity (Yan et al., ICML 2024; spec `docs/specs/fedsac.md`).
//!
//! Owns, as pure functions on numbers:
//! * silo side: [`feature_subspace`], the top-k principal directions of a silo's own centred
//!   features (spec §2.1, §7.1), and [`add_regulariser_grad`], the local cosine regulariser
//!   (spec §4 step 1, §4.3, §7.4);
//! * coordinator side: the model-similarity matrix [`similarity_matrix`] (spec §2.2, the code's
//!   cosine of updates with the 0.9 clip), the feature-complementarity matrix
//!   [`complementarity_matrix`] (spec §2.3), the per-client weights
//!   `W_i = Π_Δ(p + (β S_i − α C_i)/2)` of [`collaboration_graph`] by exact projection onto the
//!   simplex ([`project_to_simplex`], spec §3), the α schedule [`scheduled_alpha`] (spec §4),
//!   and the personalised aggregation [`mix`] / [`direction`] (spec §4 step 4).
//!
//! With α = 0 the graph is exactly pFedGraph's with λ = 1/β (spec §3); α = β = 0 gives FedAvg.
//!
//! Must not: touch tensors, sockets, clocks or threads (std, rand and serde only), run a model
//! (features arrive as numbers), or keep state between rounds: the graph is recomputed from
//! scratch every round (spec §4 step 3).
//!
//! Layout: `subspace.rs` (feature subspaces, complementarity), `graph.rs` (similarity, the
//! simplex projection, the graph and its round composition), `personalise.rs` (mixing, the
//! regulariser); the defaults and errors are here; `server.rs` is the network coordinator's state (also
//! `coord::fedsac_server`).

mod graph;
mod personalise;
pub mod server;
mod subspace;
#[cfg(test)]
mod tests;

pub use graph::{
    GraphSettings, RoundGraph, SIMILARITY_CLIP, collaboration_graph, project_to_simplex,
    round_graph, scheduled_alpha, similarity_matrix, size_prior,
};
pub use personalise::{RegSign, add_regulariser_grad, direction, mix, personalise};
pub use subspace::{
    PrincipalAngles, Subspace, complementarity, complementarity_matrix, feature_subspace,
};

/// Paper defaults (spec §4, §7.5): α (complementarity weight) for Homo and Dirichlet splits.
pub const DEFAULT_ALPHA: f64 = 0.9;
/// β (similarity weight) for Homo and Dirichlet splits.
pub const DEFAULT_BETA: f64 = 1.4;
/// k: dimension of each silo's feature subspace.
pub const DEFAULT_K: usize = 3;
/// λ: weight of the local regulariser.
pub const DEFAULT_LAMBDA: f64 = 0.01;
/// α is set to 0 once `t / T` exceeds this (paper B.1).
pub const DEFAULT_ALPHA_CUTOFF: f64 = 0.7;

/// A round's cohort: `size` of `members` drawn from `rng` without replacement, in increasing
/// order (every member when `size` is 0 or at least their number). The one draw the simulator
/// and the network coordinator both make, so a run with every silo draws the same cohorts in
/// both.
pub fn draw_cohort(rng: &mut impl rand::Rng, members: &[usize], size: usize) -> Vec<usize> {
    let k = members.len();
    if size == 0 || size >= k {
        return members.to_vec();
    }
    let mut v: Vec<usize> = rand::seq::index::sample(rng, k, size)
        .into_iter()
        .map(|j| members[j])
        .collect();
    v.sort_unstable();
    v
}

/// Errors of FedSaC's computations; each names the value and the allowed range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FedsacError {
    /// Features that do not form rows of the stated width.
    #[error("features: {len} values do not make whole rows of dim = {dim} (dim must be >= 1)")]
    FeatureShape {
        /// Values given.
        len: usize,
        /// The stated row width.
        dim: usize,
    },
    /// A subspace dimension outside `1..=dim`.
    #[error("k = {k} is outside the allowed range 1..={dim} (the feature dimension)")]
    BadK {
        /// The requested k.
        k: usize,
        /// The feature dimension.
        dim: usize,
    },
    /// Subspaces of different feature spaces.
    #[error("subspaces in R^{a} and R^{b} cannot be compared; both must be in the same space")]
    DimMismatch {
        /// One dimension.
        a: usize,
        /// The other.
        b: usize,
    },
    /// Basis rows that are not orthonormal.
    #[error("basis rows {i} and {j} have inner product {value}, expected {expected} (within 1e-6)")]
    NotOrthonormal {
        /// First row.
        i: usize,
        /// Second row.
        j: usize,
        /// Their inner product.
        value: f64,
        /// 1 on the diagonal, else 0.
        expected: f64,
    },
    /// Vectors of the wrong length.
    #[error("{what} {index} has length {got}, expected {expected}")]
    Shape {
        /// What was measured.
        what: &'static str,
        /// Its position.
        index: usize,
        /// Its length.
        got: usize,
        /// The length required.
        expected: usize,
    },
    /// A hyperparameter outside its range.
    #[error("{name} must be finite and >= 0, got {value}")]
    BadParameter {
        /// Its name.
        name: &'static str,
        /// The value.
        value: f64,
    },
    /// A prior that is not a distribution.
    #[error("p must be a distribution: entries >= 0 summing to 1 (within 1e-9), got {0:?}")]
    BadPrior(Vec<f64>),
    /// No clients, or no value to project.
    #[error("no clients: at least 1 is needed")]
    Empty,
}
