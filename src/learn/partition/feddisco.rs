//! FedDisco's NIID-2 split (FedDisco spec §5.2): biased clients holding a few whole classes,
//! then uniform clients holding every class.
//!
//! Owns: [`biased_uniform`].
//! Must not: read files or generate data.

use super::{build, check_clients, check_fraction, class_labels};
use crate::learn::data::{DataError, Dataset, Federation};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// FedDisco's NIID-2 (FedDisco spec §5.2): `clients − uniform` biased clients that each hold
/// `classes_per_client` whole classes, then `uniform` clients that hold every class equally,
/// all of (nearly) the same size.
///
/// Biased client `i` holds classes `(c·i + j) mod C` for `j < c` (`c = classes_per_client`;
/// with C = 10, c = 2: classes 2i and 2i + 1, as the official code). Each class's samples are
/// shuffled and cut in client order: every biased holder of the class takes `⌊C/c⌋·shard`
/// samples, then every uniform client `shard`, where `shard` is the largest size every class
/// can supply. So a biased client has `c·⌊C/c⌋·shard` samples and a uniform one `C·shard`
/// (equal when `c` divides `C`); the rest of the pool is left out. Each client then shuffles
/// its samples and keeps `round(train_fraction · n)` for training. No groups are known.
///
/// Errors ([`DataError::Invalid`]): regression labels, `clients == 0`, `uniform > clients`,
/// `classes_per_client` outside `1..=C`, `train_fraction` outside (0, 1), or a class too small
/// to give every client at least one sample.
pub fn biased_uniform(
    pool: &Dataset,
    clients: usize,
    uniform: usize,
    classes_per_client: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let (ids, num_classes) = class_labels(pool, "biased_uniform")?;
    check_clients(clients)?;
    check_fraction(train_fraction)?;
    if uniform > clients {
        return Err(DataError::Invalid(format!(
            "biased_uniform: uniform clients = {uniform} is outside the allowed range 0..={clients} (the clients)"
        )));
    }
    if classes_per_client == 0 || classes_per_client > num_classes {
        return Err(DataError::Invalid(format!(
            "biased_uniform: classes per biased client = {classes_per_client} is outside the allowed range 1..={num_classes}"
        )));
    }
    let biased = clients - uniform;
    let classes_of = |i: usize| -> Vec<usize> {
        (0..classes_per_client)
            .map(|j| (classes_per_client * i + j) % num_classes)
            .collect()
    };
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); num_classes];
    for (i, &y) in ids.iter().enumerate() {
        members[y as usize].push(i);
    }
    let mut holders: Vec<Vec<usize>> = vec![Vec::new(); num_classes];
    for i in 0..biased {
        for y in classes_of(i) {
            holders[y].push(i);
        }
    }
    let per_biased = num_classes / classes_per_client;
    let shard = (0..num_classes)
        .filter_map(|y| {
            let demand = holders[y].len() * per_biased + uniform;
            (demand > 0).then(|| members[y].len() / demand)
        })
        .min()
        .unwrap_or(0);
    if shard == 0 {
        return Err(DataError::Invalid(format!(
            "biased_uniform: some class has too few samples to give each of its {clients} clients \
             one ({} samples in all); use more data or fewer clients",
            pool.len()
        )));
    }
    let mut client_rows: Vec<Vec<usize>> = vec![Vec::new(); clients];
    for (y, rows) in members.iter_mut().enumerate() {
        rows.shuffle(rng);
        let mut start = 0;
        let takers = holders[y]
            .iter()
            .map(|&c| (c, per_biased * shard))
            .chain((biased..clients).map(|c| (c, shard)));
        for (c, take) in takers {
            client_rows[c].extend_from_slice(&rows[start..start + take]);
            start += take;
        }
    }
    build(
        pool,
        client_rows,
        &vec![None; clients],
        train_fraction,
        None,
        "biased_uniform",
        rng,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::partition::tests::{assert_disjoint, assert_invalid, pool, rng, same};
    use std::collections::BTreeSet;

    #[test]
    fn biased_uniform_is_feddiscos_niid2() {
        let p = pool(6000, 10);
        let f = biased_uniform(&p, 6, 1, 2, 0.8, &mut rng(1)).unwrap();
        assert_disjoint(&f);
        // 600 per class, each held by one biased client (5 shards) and the uniform one (1):
        // shard = 100, and every client has 1000 samples.
        for (i, c) in f.clients.iter().enumerate() {
            let mut counts = c.train.class_counts();
            for (k, t) in counts.iter_mut().zip(c.test.class_counts()) {
                *k += t;
            }
            assert_eq!(counts.iter().sum::<usize>(), 1000, "client {i}");
            if i < 5 {
                let mut want = vec![0; 10];
                want[2 * i] = 500;
                want[2 * i + 1] = 500;
                assert_eq!(counts, want, "client {i}");
            } else {
                assert_eq!(counts, vec![100; 10]);
            }
            assert_eq!(c.train.len(), 800);
        }
        let again = biased_uniform(&p, 6, 1, 2, 0.8, &mut rng(1)).unwrap();
        assert!(same(&f, &again));
        // Many clients: classes wrap around, sizes stay equal.
        let f = biased_uniform(&p, 60, 10, 2, 0.8, &mut rng(2)).unwrap();
        assert_disjoint(&f);
        let sizes: BTreeSet<usize> = f
            .clients
            .iter()
            .map(|c| c.train.len() + c.test.len())
            .collect();
        assert_eq!(sizes.len(), 1, "{sizes:?}");
        assert_invalid(
            biased_uniform(&p, 6, 7, 2, 0.8, &mut rng(1)),
            &["uniform", "7"],
        );
        assert_invalid(
            biased_uniform(&p, 6, 1, 11, 0.8, &mut rng(1)),
            &["11", "1..=10"],
        );
        assert_invalid(
            biased_uniform(&pool(50, 10), 6, 1, 2, 0.8, &mut rng(1)),
            &["too few"],
        );
    }
}
