//! Dirichlet over label clusters (FedeRiCo spec §7.1, Table 4; FedEM's
//! `split_dataset_by_labels`).
//!
//! Owns: [`dirichlet`], Dirichlet proportions and multinomial counts.
//! Must not: read files or generate data.

use super::{
    build, check_clients, check_fraction, class_labels, label_to_set, shuffled_label_sets, usable,
};
use crate::learn::data::{DataError, Dataset, Federation};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand_distr::{Binomial, Distribution, Gamma};

/// Tries at drawing Dirichlet counts that leave every client at least one train and one test
/// sample before giving up with [`DataError::Invalid`].
const MAX_DIRICHLET_DRAWS: usize = 1_000;

/// Dirichlet over label clusters (spec §7.1, Table 4; FedEM's `split_dataset_by_labels`).
///
/// The labels `0..num_classes` are shuffled into `clusters` near-equal disjoint clusters (as in
/// [`label_groups`]); each cluster's samples are shuffled; for each cluster the client proportions
/// are drawn from Dirichlet(`alpha` · 1_K) and the cluster's samples are cut into contiguous
/// slices of multinomial(n_cluster, proportions) sizes, client 0 first. Each client then shuffles
/// its samples and keeps `round(train_fraction · n)` for training. Small `alpha` gives very
/// unequal mixtures (and sizes), large `alpha` near-IID clients.
///
/// [`ClientData::group`] is `None` (clients are mixtures); [`Federation::group_labels`] holds the
/// clusters' label sets, sorted. When a draw leaves a client with no training or no test sample
/// the whole draw is repeated (up to `MAX_DIRICHLET_DRAWS` = 1 000 times, so the split is
/// conditioned on every client being usable), then [`DataError::Invalid`] is returned.
///
/// Errors ([`DataError::Invalid`]): regression labels, `clients == 0`, `clusters` outside
/// `1..=num_classes`, `alpha` not a finite value > 0, `train_fraction` outside (0, 1), or no
/// usable draw.
///
/// [`label_groups`]: super::label_groups
/// [`ClientData::group`]: crate::learn::ClientData::group
pub fn dirichlet(
    pool: &Dataset,
    clients: usize,
    clusters: usize,
    alpha: f64,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let (ids, num_classes) = class_labels(pool, "dirichlet")?;
    check_clients(clients)?;
    check_fraction(train_fraction)?;
    if clusters == 0 || clusters > num_classes {
        return Err(DataError::Invalid(format!(
            "split.clusters = {clusters} is outside the allowed range 1..={num_classes} (the number of classes of the data)"
        )));
    }
    if !(alpha > 0.0 && alpha.is_finite()) {
        return Err(DataError::Invalid(format!(
            "dirichlet: alpha = {alpha} is outside the allowed range (0, ∞)"
        )));
    }
    let cluster_labels = shuffled_label_sets(num_classes, clusters, rng);
    let cluster_of_label = label_to_set(&cluster_labels, num_classes);
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); clusters];
    for (i, &y) in ids.iter().enumerate() {
        members[cluster_of_label[y as usize]].push(i);
    }
    for rows in &mut members {
        rows.shuffle(rng);
    }
    let gamma = Gamma::new(alpha, 1.0)
        .map_err(|e| DataError::Invalid(format!("dirichlet: alpha = {alpha}: {e}")))?;
    for _ in 0..MAX_DIRICHLET_DRAWS {
        let mut client_rows: Vec<Vec<usize>> = vec![Vec::new(); clients];
        for rows in &members {
            let p = dirichlet_draw(&gamma, clients, rng);
            let counts = multinomial(rows.len(), &p, rng);
            let mut start = 0;
            for (c, &k) in counts.iter().enumerate() {
                client_rows[c].extend_from_slice(&rows[start..start + k]);
                start += k;
            }
        }
        if client_rows.iter().all(|r| usable(r.len(), train_fraction)) {
            let groups_of = vec![None; clients];
            return build(
                pool,
                client_rows,
                &groups_of,
                train_fraction,
                Some(cluster_labels),
                "dirichlet",
                rng,
            );
        }
    }
    Err(DataError::Invalid(format!(
        "dirichlet: {MAX_DIRICHLET_DRAWS} draws with alpha = {alpha} over {} samples all left some of \
         the {clients} clients without a training or test sample; use a larger alpha, fewer \
         clients or more data",
        pool.len()
    )))
}

/// Proportions ~ Dirichlet(alpha · 1_k), from normalised Gamma(alpha, 1) draws (re-drawn in the
/// rare case that all underflow to 0 for a tiny alpha).
fn dirichlet_draw(gamma: &Gamma<f64>, k: usize, rng: &mut StdRng) -> Vec<f64> {
    loop {
        let g: Vec<f64> = (0..k).map(|_| gamma.sample(rng)).collect();
        let s: f64 = g.iter().sum();
        if s > 0.0 && s.is_finite() {
            return g.into_iter().map(|x| x / s).collect();
        }
    }
}

/// Multinomial(n, p) counts by sequential conditional binomials.
fn multinomial(n: usize, p: &[f64], rng: &mut StdRng) -> Vec<usize> {
    let mut counts = vec![0; p.len()];
    let mut left = n as u64;
    let mut mass = 1.0f64;
    for (c, &pc) in p.iter().enumerate() {
        if left == 0 {
            break;
        }
        if c + 1 == p.len() {
            counts[c] = left as usize;
            break;
        }
        let q = if mass > 0.0 {
            (pc / mass).clamp(0.0, 1.0)
        } else {
            1.0
        };
        let k = Binomial::new(left, q)
            .map(|b| b.sample(rng))
            .unwrap_or(left);
        counts[c] = k as usize;
        left -= k;
        mass -= pc;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::data::Labels;
    use crate::learn::partition::tests::{
        assert_disjoint, assert_invalid, labels, pool, rng, same,
    };
    use std::collections::BTreeSet;

    #[test]
    fn dirichlet_structure_and_counts() {
        let p = pool(2000, 10);
        let f = dirichlet(&p, 8, 4, 0.4, 0.8, &mut rng(3)).unwrap();
        assert_eq!(f.clients.len(), 8);
        assert!(f.clients.iter().all(|c| c.group.is_none()));
        let cl = f.group_labels.clone().unwrap();
        assert_eq!(cl.len(), 4);
        let sizes: Vec<usize> = cl.iter().map(Vec::len).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 10);
        assert!(sizes.iter().all(|&s| s == 2 || s == 3), "{sizes:?}");
        assert_eq!(
            cl.iter().flatten().copied().collect::<BTreeSet<_>>(),
            (0..10).collect()
        );
        // Every sample is given out exactly once (multinomial counts sum to the cluster sizes).
        let used = assert_disjoint(&f);
        assert_eq!(used.len(), 2000);
        for c in &f.clients {
            let n = c.train.len() + c.test.len();
            assert!(!c.test.is_empty() && !c.train.is_empty());
            assert_eq!(c.train.len(), (0.8 * n as f64).round() as usize);
        }
        let again = dirichlet(&p, 8, 4, 0.4, 0.8, &mut rng(3)).unwrap();
        assert!(same(&f, &again));
        assert!(!same(
            &f,
            &dirichlet(&p, 8, 4, 0.4, 0.8, &mut rng(4)).unwrap()
        ));
    }

    /// Mean total-variation distance between each client's cluster mixture and the pool's.
    fn heterogeneity(f: &Federation) -> f64 {
        let cl = f.group_labels.as_ref().unwrap();
        let cluster_of = label_to_set(cl, 10);
        let mut total = 0.0;
        for c in &f.clients {
            let ys: Vec<u32> = labels(&c.train)
                .into_iter()
                .chain(labels(&c.test))
                .collect();
            let mut share = vec![0.0; cl.len()];
            for y in &ys {
                share[cluster_of[*y as usize]] += 1.0 / ys.len() as f64;
            }
            let global: Vec<f64> = cl.iter().map(|s| s.len() as f64 / 10.0).collect();
            total += 0.5
                * share
                    .iter()
                    .zip(&global)
                    .map(|(a, b)| (a - b).abs())
                    .sum::<f64>();
        }
        total / f.clients.len() as f64
    }

    #[test]
    fn dirichlet_alpha_controls_heterogeneity() {
        let p = pool(4000, 10);
        let mut low = 0.0;
        let mut high = 0.0;
        for s in 0..5 {
            low += heterogeneity(&dirichlet(&p, 8, 4, 0.1, 0.8, &mut rng(s)).unwrap());
            high += heterogeneity(&dirichlet(&p, 8, 4, 100.0, 0.8, &mut rng(s)).unwrap());
        }
        let (low, high) = (low / 5.0, high / 5.0);
        assert!(low > 0.4, "alpha 0.1 should give skewed clients, TV {low}");
        assert!(
            high < 0.1,
            "alpha 100 should give near-IID clients, TV {high}"
        );
    }

    #[test]
    fn dirichlet_errors() {
        let p = pool(200, 10);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_invalid(
                dirichlet(&p, 4, 2, bad, 0.8, &mut rng(0)),
                &["alpha", "(0, ∞)"],
            );
        }
        assert_invalid(
            dirichlet(&p, 4, 0, 0.4, 0.8, &mut rng(0)),
            &["clusters = 0", "1..=10"],
        );
        assert_invalid(
            dirichlet(&p, 4, 11, 0.4, 0.8, &mut rng(0)),
            &["clusters = 11"],
        );
        assert_invalid(dirichlet(&p, 0, 2, 0.4, 0.8, &mut rng(0)), &["clients = 0"]);
        assert_invalid(
            dirichlet(&p, 4, 2, 0.4, 1.0, &mut rng(0)),
            &["train_fraction = 1"],
        );
        // 20 samples, 50 clients: impossible.
        assert_invalid(
            dirichlet(&pool(20, 10), 50, 2, 0.4, 0.8, &mut rng(0)),
            &["alpha = 0.4", "draws"],
        );
        let real = Dataset::new(vec![0.0; 10], vec![1], Labels::Real(vec![0.0; 10])).unwrap();
        assert_invalid(
            dirichlet(&real, 2, 1, 0.4, 0.8, &mut rng(0)),
            &["regression"],
        );
    }
}
