//! FedCollab (Bao et al., ICML 2023; `docs/specs/fedcollab.md`): choosing who trains with
//! whom from the silos' sample counts and pairwise distribution distances.
//!
//! Owns: the collaboration-structure objective (spec §2), Algorithm 2 with random restarts and
//! its tie-breaking (spec §4), placing a newcomer (spec §5), and the transport-free parts of the
//! pairwise discriminator protocol (spec §3.2): the discriminator-train split, the label-branch
//! scale, equal pair averaging, the evaluate/early-stop schedule, turning the best balanced
//! accuracy into a distance, and assembling the distance matrix. Also the `[fedcollab]`
//! hyperparameters of a scenario.
//! Must not: touch tensors, sockets, clocks or threads (std, rand and serde only). Training the
//! discriminator and the coalition models is the driver's work (`sim::fedcollab`); every random
//! choice here comes from an RNG the caller passes in.
//!
//! Layout: `config.rs` (the `[fedcollab]` section), `solver.rs` (objective and Algorithm 2),
//! `distance.rs` (the pairwise discriminator protocol's numbers), `pairs.rs` (both sides'
//! rules of a pair over the network: budgets, restarts, silent partners), `member/` (a silo's
//! run over the network, sans-IO: phases, deadlines, what the coordinator's answers mean);
//! the coalition average is here; `server.rs` is the network coordinator's state (also `coord::fedcollab_server`).

mod config;
mod distance;
pub mod member;
pub mod pairs;
pub mod server;
mod solver;
#[cfg(test)]
mod tests;

pub use config::{Distance, FedCollabConfig};
pub use distance::{
    EarlyStop, average_pair, disc_split, disc_train_target, distance_matrix, label_branch_scale,
    label_tv,
};
pub use solver::{
    Problem, REL_TOL, SOLVE_TAG, Solution, SolverConfig, Structure, coalitions_of, labels_of,
};

/// Errors of the FedCollab core. Each names the value at fault and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FedCollabError {
    /// No clients at all.
    #[error("sizes must list at least one client, got none")]
    NoClients,
    /// A client with no training data (spec §8 item 16: such clients are left out upstream).
    #[error("client {client} has size 0; every client needs at least 1 training sample")]
    ZeroSize {
        /// The client.
        client: usize,
    },
    /// The distance matrix is not `n × n`.
    #[error(
        "distances must be a {n}x{n} matrix (one row and column per client), but row {row} has {len} entries (of {rows} rows)"
    )]
    Shape {
        /// Clients.
        n: usize,
        /// Rows given.
        rows: usize,
        /// The first row at fault (or `rows` when the row count is wrong).
        row: usize,
        /// Its length.
        len: usize,
    },
    /// A NaN or infinite distance.
    #[error("distance d[{i}][{j}] = {value} must be a finite number")]
    NonFinite {
        /// Row.
        i: usize,
        /// Column.
        j: usize,
        /// The value.
        value: f64,
    },
    /// C outside `[0, ∞)`.
    #[error("capacity C must be a finite number >= 0, got {0}")]
    Capacity(f64),
    /// A solver knob that must be at least 1.
    #[error("{name} must be at least 1, got 0")]
    ZeroKnob {
        /// `restarts` or `max_passes`.
        name: &'static str,
    },
    /// A label vector of the wrong length.
    #[error("labels must have one entry per client ({expected}), got {got}")]
    Labels {
        /// Clients.
        expected: usize,
        /// Entries given.
        got: usize,
    },
    /// Coalitions that are not a partition of the clients they should cover.
    #[error("coalitions must cover each of clients 0..{n} exactly once{except}: {reason}")]
    NotAPartition {
        /// Clients.
        n: usize,
        /// `" except the newcomer k"` when one client is meant to be missing.
        except: String,
        /// What is wrong.
        reason: String,
    },
}

/// FedAvg inside one coalition (spec §5; §6 phase 4): the m_j-weighted average of the
/// members' trained models, `None` for a member whose model did not arrive (the weights are
/// renormalised over the others, spec §6 "failure handling"). Summed in f64 in the given order
/// (ascending member index), so every member computing it from the same models holds the same
/// result bit for bit. Empty when no model arrived.
pub fn coalition_average(models: &[Option<&[f32]>], sizes: &[u64]) -> Vec<f32> {
    let total: f64 = models
        .iter()
        .zip(sizes)
        .filter(|(m, _)| m.is_some())
        .map(|(_, &s)| s as f64)
        .sum();
    let len = models.iter().flatten().next().map_or(0, |m| m.len());
    let mut avg = vec![0f64; len];
    for (m, &s) in models.iter().zip(sizes) {
        if let Some(m) = m {
            let w = s as f64 / total;
            for (a, &x) in avg.iter_mut().zip(m.iter()) {
                *a += w * x as f64;
            }
        }
    }
    avg.into_iter().map(|x| x as f32).collect()
}
