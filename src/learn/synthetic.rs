//! Synthetic federations that need no files.
//! Owns: the sine toy of the FedeRiCo paper's Figure 1 (spec §7.6) and a label-group Gaussian
//! mixture classification task.
//! Must not: read files.

use super::data::{DataError, Federation};
use rand::rngs::StdRng;

/// The sine toy: `[-π, π]` cut into `groups` equal intervals, `clients / groups` clients per
/// interval; each client draws `train` x-values uniformly from its interval (plus `test` held-out
/// ones) with `y = sin(x) + N(0, noise²)`. Features are `[x]`, labels real.
pub fn sine(
    clients: usize,
    groups: usize,
    train: usize,
    test: usize,
    noise: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let _ = (clients, groups, train, test, noise, rng);
    todo!()
}

/// Parameters of [`label_group_mixture`].
#[derive(Clone, Debug, PartialEq)]
pub struct MixtureParams {
    /// Number of silos.
    pub clients: usize,
    /// Number of groups (distributions).
    pub groups: usize,
    /// Input clusters; each group labels them with its own disjoint label set.
    pub classes_per_group: usize,
    /// Feature dimension.
    pub dim: usize,
    /// Training samples per client.
    pub train: usize,
    /// Test samples per client.
    pub test: usize,
    /// Distance scale between cluster centres relative to the unit noise.
    pub separation: f64,
}

/// A label-group classification task with concept shift: all clients share the same input
/// distribution (a mixture of `classes_per_group` Gaussian clusters, satisfying the paper's
/// equal-marginals assumption B.1), but group `g` labels cluster `c` as `g * classes_per_group + c`,
/// so groups have disjoint labels and one global model cannot serve them all.
pub fn label_group_mixture(p: &MixtureParams, rng: &mut StdRng) -> Result<Federation, DataError> {
    let _ = (p, rng);
    todo!()
}
