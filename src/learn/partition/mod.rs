//! Partitioners: who gets which sample. All are seeded and deterministic for a given RNG.
//!
//! Owns: the unstructured splits (IID, pathological shards, natural partitions as the data
//! came, subsampling a pool by fraction or count), and what every
//! split shares: argument checks, label sets, the per-client train/test split. The structured
//! designs each have a file: label groups (FedeRiCo spec §7.1) in `label_groups.rs`, Dirichlet
//! over label clusters (Table 4) in `dirichlet.rs`, FedCollab's four-type shifts in
//! `fedcollab.rs` and FedDisco's NIID-2 in `feddisco.rs`.
//! Must not: read files or generate data.

mod dirichlet;
mod fedcollab;
mod feddisco;
mod label_groups;

pub use dirichlet::dirichlet;
pub use fedcollab::{
    CONCEPT4_PERMUTATIONS, ROTATE4_DEGREES, cluster4, concept4, rotate_image, rotate4,
};
pub use feddisco::biased_uniform;
pub use label_groups::{Assign, label_groups, label_groups_assigned};

use super::data::{ClientData, DataError, Dataset, Federation, Labels};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// A random `fraction` of `pool` (e.g. the paper's 10% of CIFAR-10's training set).
///
/// Keeps `round(fraction · len)` samples drawn without replacement, in their original order.
/// `fraction` must be in (0, 1] (1 keeps the whole pool) and keep at least one sample.
pub fn subsample(pool: &Dataset, fraction: f64, rng: &mut StdRng) -> Result<Dataset, DataError> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(DataError::Invalid(format!(
            "subsample fraction = {fraction} is outside the allowed range (0, 1]"
        )));
    }
    let n = pool.len();
    let keep = (fraction * n as f64).round() as usize;
    if keep == 0 {
        return Err(DataError::Invalid(format!(
            "subsample fraction = {fraction} of {n} samples keeps none; it must keep at least 1"
        )));
    }
    Ok(draw(pool, keep, rng))
}

/// `samples` samples of `pool` drawn without replacement, in their original order: exactly
/// the draw [`subsample`] makes for a `fraction` with `round(fraction · len) == samples`, so a
/// scenario sized in samples reproduces one sized by that fraction bit for bit. `samples`
/// equal to the pool's size keeps it whole and draws nothing (as `fraction = 1` does).
///
/// Errors ([`DataError::Invalid`]): `samples` is 0 or more than the pool holds.
pub fn subsample_count(
    pool: &Dataset,
    samples: usize,
    rng: &mut StdRng,
) -> Result<Dataset, DataError> {
    let n = pool.len();
    if samples == 0 || samples > n {
        return Err(DataError::Invalid(format!(
            "samples = {samples} is outside the allowed range 1..={n} (the training set holds {n})"
        )));
    }
    if samples == n {
        return Ok(pool.clone());
    }
    Ok(draw(pool, samples, rng))
}

/// `keep` rows of `pool` chosen by one shuffle of all row indices, in their original order.
fn draw(pool: &Dataset, keep: usize, rng: &mut StdRng) -> Dataset {
    let mut idx: Vec<usize> = (0..pool.len()).collect();
    idx.shuffle(rng);
    idx.truncate(keep);
    idx.sort_unstable();
    pool.subset(&idx)
}

/// Natural partitions: silo *i* is `silos[i]`, as the data came (one file or folder per silo,
/// or the rows of one silo-column value); each shuffled and cut `round(train_fraction · n)` /
/// rest into train / test. No groups are known. `names` name the silos in messages.
///
/// Errors ([`DataError::Invalid`]): no silo, silos of different sample shapes or class counts,
/// `train_fraction` outside (0, 1), or a silo left with no training or no test sample.
pub fn natural(
    silos: &[Dataset],
    names: &[String],
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    check_clients(silos.len())?;
    check_fraction(train_fraction)?;
    for (s, name) in silos.iter().zip(names) {
        if !usable(s.len(), train_fraction) {
            return Err(DataError::Invalid(format!(
                "natural partitions: silo {name} has {} samples, which with train_fraction = \
                 {train_fraction} leaves {} for training and {} for test; each silo needs at \
                 least 1 of each",
                s.len(),
                train_count(s.len(), train_fraction),
                s.len() - train_count(s.len(), train_fraction).min(s.len()),
            )));
        }
        if s.sample_shape != silos[0].sample_shape || s.num_classes() != silos[0].num_classes() {
            return Err(DataError::Invalid(format!(
                "natural partitions: silo {name} has samples {:?} of {:?} classes, silo {} has {:?} of {:?}",
                s.sample_shape,
                s.num_classes(),
                names[0],
                silos[0].sample_shape,
                silos[0].num_classes()
            )));
        }
    }
    let clients = silos
        .iter()
        .map(|s| {
            let mut rows: Vec<usize> = (0..s.len()).collect();
            rows.shuffle(rng);
            let t = train_count(rows.len(), train_fraction);
            ClientData {
                train: s.subset(&rows[..t]),
                test: s.subset(&rows[t..]),
                group: None,
            }
        })
        .collect();
    Ok(Federation {
        clients,
        group_labels: None,
    })
}

/// Pathological shards (McMahan et al.): sort by label, cut into `clients * shards_per_client`
/// shards, give each client `shards_per_client` random shards.
///
/// Samples of one label are in random order; shards have `floor(n / (clients ·
/// shards_per_client))` samples (the remainder is left out). No groups are known.
///
/// Errors ([`DataError::Invalid`]): regression labels, `clients == 0`, `shards_per_client == 0`,
/// `train_fraction` outside (0, 1), or a client left with no training or no test sample.
pub fn shards(
    pool: &Dataset,
    clients: usize,
    shards_per_client: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let (ids, _) = class_labels(pool, "shards")?;
    check_clients(clients)?;
    check_fraction(train_fraction)?;
    if shards_per_client == 0 {
        return Err(DataError::Invalid(
            "shards: shards_per_client = 0 is outside the allowed range 1..".to_string(),
        ));
    }
    let mut order: Vec<usize> = (0..pool.len()).collect();
    order.shuffle(rng);
    order.sort_by_key(|&i| ids[i]);
    let total = clients * shards_per_client;
    let size = order.len() / total;
    let mut shard_ids: Vec<usize> = (0..total).collect();
    shard_ids.shuffle(rng);
    let client_rows: Vec<Vec<usize>> = shard_ids
        .chunks(shards_per_client)
        .map(|mine| {
            mine.iter()
                .flat_map(|&s| order[s * size..(s + 1) * size].iter().copied())
                .collect()
        })
        .collect();
    build(
        pool,
        client_rows,
        &vec![None; clients],
        train_fraction,
        None,
        "shards",
        rng,
    )
}

/// IID: a uniformly random equal split.
///
/// Each client gets `floor(n / clients)` samples (the remainder is left out). Works for
/// regression data too. No groups are known.
///
/// Errors ([`DataError::Invalid`]): `clients == 0`, `train_fraction` outside (0, 1), or a
/// client left with no training or no test sample.
pub fn iid(
    pool: &Dataset,
    clients: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    check_clients(clients)?;
    check_fraction(train_fraction)?;
    let mut order: Vec<usize> = (0..pool.len()).collect();
    order.shuffle(rng);
    let size = order.len() / clients;
    let client_rows: Vec<Vec<usize>> = (0..clients)
        .map(|c| order[c * size..(c + 1) * size].to_vec())
        .collect();
    build(
        pool,
        client_rows,
        &vec![None; clients],
        train_fraction,
        None,
        "iid",
        rng,
    )
}

/// Class ids and class count, or `Invalid` for regression data.
fn class_labels<'a>(pool: &'a Dataset, split: &str) -> Result<(&'a [u32], usize), DataError> {
    match &pool.labels {
        Labels::Class { ids, num_classes } => Ok((ids, *num_classes)),
        Labels::Real(_) => Err(DataError::Invalid(format!(
            "{split}: the data set has real-valued (regression) labels; this split needs class labels"
        ))),
    }
}

fn check_clients(clients: usize) -> Result<(), DataError> {
    if clients == 0 {
        return Err(DataError::Invalid(
            "clients = 0 is outside the allowed range 1..".to_string(),
        ));
    }
    Ok(())
}

fn check_fraction(train_fraction: f64) -> Result<(), DataError> {
    if !(train_fraction > 0.0 && train_fraction < 1.0) {
        return Err(DataError::Invalid(format!(
            "train_fraction = {train_fraction} is outside the allowed range (0, 1)"
        )));
    }
    Ok(())
}

/// Training samples a client with `n` samples keeps.
fn train_count(n: usize, train_fraction: f64) -> usize {
    (train_fraction * n as f64).round() as usize
}

/// True when `n` samples give at least one training and one test sample.
fn usable(n: usize, train_fraction: f64) -> bool {
    let t = train_count(n, train_fraction);
    t >= 1 && t < n
}

/// Labels `0..num_classes` shuffled and cut into `sets` chunks of near-equal size (the first
/// `num_classes % sets` get one more); each chunk sorted.
fn shuffled_label_sets(num_classes: usize, sets: usize, rng: &mut StdRng) -> Vec<Vec<u32>> {
    let mut labels: Vec<u32> = (0..num_classes as u32).collect();
    labels.shuffle(rng);
    let (base, extra) = (num_classes / sets, num_classes % sets);
    let mut out = Vec::with_capacity(sets);
    let mut start = 0;
    for s in 0..sets {
        let len = base + usize::from(s < extra);
        let mut set = labels[start..start + len].to_vec();
        set.sort_unstable();
        out.push(set);
        start += len;
    }
    out
}

/// For each label, the index of the set holding it.
fn label_to_set(sets: &[Vec<u32>], num_classes: usize) -> Vec<usize> {
    let mut of = vec![0; num_classes];
    for (s, labels) in sets.iter().enumerate() {
        for &y in labels {
            of[y as usize] = s;
        }
    }
    of
}

/// Per client: shuffle its rows, split `round(train_fraction · n)` / rest into train / test.
fn build(
    pool: &Dataset,
    client_rows: Vec<Vec<usize>>,
    groups_of: &[Option<usize>],
    train_fraction: f64,
    group_labels: Option<Vec<Vec<u32>>>,
    split: &str,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    for (c, rows) in client_rows.iter().enumerate() {
        if !usable(rows.len(), train_fraction) {
            return Err(DataError::Invalid(format!(
                "{split}: client {c} gets {} samples, which with train_fraction = {train_fraction} \
                 leaves {} for training and {} for test; each client needs at least 1 of each \
                 (use more data, fewer clients or another train_fraction)",
                rows.len(),
                train_count(rows.len(), train_fraction),
                rows.len() - train_count(rows.len(), train_fraction).min(rows.len()),
            )));
        }
    }
    let clients = client_rows
        .into_iter()
        .zip(groups_of)
        .map(|(mut rows, &group)| {
            rows.shuffle(rng);
            let t = train_count(rows.len(), train_fraction);
            ClientData {
                train: pool.subset(&rows[..t]),
                test: pool.subset(&rows[t..]),
                group,
            }
        })
        .collect();
    Ok(Federation {
        clients,
        group_labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use std::collections::{BTreeSet, HashSet};

    /// `n` samples whose single feature is their index; label `i % classes`.
    pub(super) fn pool(n: usize, classes: usize) -> Dataset {
        let ids = (0..n).map(|i| (i % classes) as u32).collect();
        Dataset::new(
            (0..n).map(|i| i as f32).collect(),
            vec![1],
            Labels::Class {
                ids,
                num_classes: classes,
            },
        )
        .unwrap()
    }

    pub(super) fn rows(d: &Dataset) -> Vec<usize> {
        d.features.iter().map(|&x| x as usize).collect()
    }

    pub(super) fn labels(d: &Dataset) -> Vec<u32> {
        match &d.labels {
            Labels::Class { ids, .. } => ids.clone(),
            Labels::Real(_) => panic!("real labels"),
        }
    }

    pub(super) fn rng(seed: u64) -> StdRng {
        StdRng::seed_from_u64(seed)
    }

    /// Asserts no sample is used twice; returns the set of samples used.
    pub(super) fn assert_disjoint(f: &Federation) -> HashSet<usize> {
        let mut seen = HashSet::new();
        for c in &f.clients {
            for r in rows(&c.train).into_iter().chain(rows(&c.test)) {
                assert!(seen.insert(r), "sample {r} given twice");
            }
        }
        seen
    }

    pub(super) fn same(a: &Federation, b: &Federation) -> bool {
        a.group_labels == b.group_labels
            && a.clients.len() == b.clients.len()
            && a.clients
                .iter()
                .zip(&b.clients)
                .all(|(x, y)| x.train == y.train && x.test == y.test && x.group == y.group)
    }

    pub(super) fn assert_invalid<T: std::fmt::Debug>(r: Result<T, DataError>, needles: &[&str]) {
        match r.expect_err("expected an error") {
            DataError::Invalid(msg) => {
                for n in needles {
                    assert!(msg.contains(n), "message lacks {n:?}: {msg}");
                }
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn shards_structure() {
        let p = pool(1000, 10);
        let f = shards(&p, 10, 2, 0.8, &mut rng(1)).unwrap();
        assert_eq!(f.clients.len(), 10);
        assert!(f.group_labels.is_none() && f.clients.iter().all(|c| c.group.is_none()));
        let used = assert_disjoint(&f);
        assert_eq!(used.len(), 1000);
        for c in &f.clients {
            assert_eq!(c.train.len() + c.test.len(), 100);
            assert_eq!(c.train.len(), 80);
            // 2 shards of 50 samples, each inside one label (100 samples per label).
            let set: BTreeSet<u32> = labels(&c.train)
                .into_iter()
                .chain(labels(&c.test))
                .collect();
            assert!(set.len() <= 2, "client has labels {set:?}");
        }
        assert!(same(&f, &shards(&p, 10, 2, 0.8, &mut rng(1)).unwrap()));
        assert_invalid(
            shards(&p, 10, 0, 0.8, &mut rng(1)),
            &["shards_per_client = 0"],
        );
        assert_invalid(shards(&p, 600, 1, 0.8, &mut rng(1)), &["client"]);
    }

    #[test]
    fn iid_structure() {
        let p = pool(1003, 10);
        let f = iid(&p, 4, 0.75, &mut rng(2)).unwrap();
        let used = assert_disjoint(&f);
        assert_eq!(used.len(), 1000);
        for c in &f.clients {
            assert_eq!((c.train.len(), c.test.len()), (188, 62));
            assert_eq!(c.group, None);
        }
        assert!(same(&f, &iid(&p, 4, 0.75, &mut rng(2)).unwrap()));
        // Regression data is fine for IID.
        let real = Dataset::new(
            (0..10).map(|i| i as f32).collect(),
            vec![1],
            Labels::Real(vec![0.5; 10]),
        )
        .unwrap();
        let f = iid(&real, 2, 0.8, &mut rng(0)).unwrap();
        assert_eq!(f.clients[0].train.len(), 4);
        assert_invalid(iid(&p, 0, 0.8, &mut rng(0)), &["clients = 0"]);
        assert_invalid(iid(&p, 600, 0.8, &mut rng(0)), &["client 0 gets 1 samples"]);
    }

    #[test]
    fn subsample_by_count_draws_what_the_fraction_drew() {
        let p = pool(5000, 10);
        for (fraction, samples, seed) in [(0.1, 500, 9), (0.25, 1250, 1), (0.05, 250, 3)] {
            assert_eq!(
                subsample_count(&p, samples, &mut rng(seed)).unwrap(),
                subsample(&p, fraction, &mut rng(seed)).unwrap()
            );
        }
        assert_eq!(subsample_count(&p, 5000, &mut rng(0)).unwrap(), p);
        assert_invalid(
            subsample_count(&p, 5001, &mut rng(0)),
            &["samples = 5001", "holds 5000"],
        );
        assert_invalid(subsample_count(&p, 0, &mut rng(0)), &["samples = 0"]);
    }

    #[test]
    fn natural_keeps_each_silo_whole_and_names_a_silo_too_small() {
        let silos = vec![pool(10, 3), pool(20, 3), pool(5, 3)];
        let names: Vec<String> = ["a.csv", "b.csv", "c.csv"].map(String::from).to_vec();
        let f = natural(&silos, &names, 0.8, &mut rng(1)).unwrap();
        assert_eq!(f.clients.len(), 3);
        for (c, s) in f.clients.iter().zip(&silos) {
            assert_eq!(c.train.len() + c.test.len(), s.len());
            assert_eq!(c.train.len(), train_count(s.len(), 0.8));
            let mut all: Vec<usize> = rows(&c.train).into_iter().chain(rows(&c.test)).collect();
            all.sort_unstable();
            assert_eq!(all, (0..s.len()).collect::<Vec<_>>());
        }
        assert!(same(
            &f,
            &natural(&silos, &names, 0.8, &mut rng(1)).unwrap()
        ));
        let tiny = vec![pool(10, 3), pool(1, 3)];
        assert_invalid(
            natural(&tiny, &names[..2], 0.8, &mut rng(1)),
            &["silo b.csv has 1 samples"],
        );
    }

    #[test]
    fn subsample_fraction() {
        let p = pool(5000, 10);
        let s = subsample(&p, 0.1, &mut rng(9)).unwrap();
        assert_eq!(s.len(), 500);
        let r = rows(&s);
        assert!(
            r.windows(2).all(|w| w[0] < w[1]),
            "distinct, original order"
        );
        assert_eq!(
            labels(&s),
            r.iter().map(|&i| (i % 10) as u32).collect::<Vec<_>>()
        );
        assert_eq!(s, subsample(&p, 0.1, &mut rng(9)).unwrap());
        assert_ne!(s, subsample(&p, 0.1, &mut rng(10)).unwrap());
        assert_eq!(subsample(&p, 1.0, &mut rng(9)).unwrap(), p);
        for bad in [0.0, -0.1, 1.01, f64::NAN] {
            assert_invalid(subsample(&p, bad, &mut rng(0)), &["fraction", "(0, 1]"]);
        }
        assert_invalid(subsample(&pool(3, 3), 0.1, &mut rng(0)), &["keeps none"]);
    }
}
