//! Partitioners: who gets which sample. All are seeded and deterministic for a given RNG.
//! Owns: label-group (FedeRiCo spec §7.1), Dirichlet over label clusters (Table 4), pathological
//! shards, IID; the per-client train/test split; subsampling a pool.
//! Must not: read files or generate data.

use super::data::{DataError, Dataset, Federation};
use rand::rngs::StdRng;

/// A random `fraction` of `pool` (e.g. the paper's 10% of CIFAR-10's training set).
pub fn subsample(pool: &Dataset, fraction: f64, rng: &mut StdRng) -> Result<Dataset, DataError> {
    let _ = (pool, fraction, rng);
    todo!()
}

/// Label groups (spec §7.1): shuffle the labels into `groups` near-equal disjoint sets, assign
/// each client a group uniformly at random (re-drawn until every group has a client), split each
/// group's samples into equal disjoint shards for its clients, then `train_fraction` of each
/// client's samples for training and the rest for test.
pub fn label_groups(
    pool: &Dataset,
    clients: usize,
    groups: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let _ = (pool, clients, groups, train_fraction, rng);
    todo!()
}

/// Dirichlet over label clusters (spec §7.1, Table 4; FedEM's `split_dataset_by_labels`).
pub fn dirichlet(
    pool: &Dataset,
    clients: usize,
    clusters: usize,
    alpha: f64,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let _ = (pool, clients, clusters, alpha, train_fraction, rng);
    todo!()
}

/// Pathological shards (McMahan et al.): sort by label, cut into `clients * shards_per_client`
/// shards, give each client `shards_per_client` random shards.
pub fn shards(
    pool: &Dataset,
    clients: usize,
    shards_per_client: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let _ = (pool, clients, shards_per_client, train_fraction, rng);
    todo!()
}

/// IID: a uniformly random equal split.
pub fn iid(
    pool: &Dataset,
    clients: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let _ = (pool, clients, train_fraction, rng);
    todo!()
}
