//! Label groups (FedeRiCo spec §7.1): disjoint label sets, each client in one group.
//!
//! Owns: [`label_groups`] and the group assignment: random with every group non-empty, or
//! balanced ([`Assign`]).
//! Must not: read files or generate data.

use super::{
    build, check_clients, check_fraction, class_labels, label_to_set, shuffled_label_sets,
};
use crate::learn::data::{DataError, Dataset, Federation};
use rand::RngExt;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// Tries at drawing a group assignment with every group non-empty before falling back to a
/// balanced random assignment (only reached when `groups` is close to `clients` and large).
const MAX_GROUP_DRAWS: usize = 100_000;

/// Label groups (spec §7.1): shuffle the labels into `groups` near-equal disjoint sets, assign
/// each client a group uniformly at random (re-drawn until every group has a client), split each
/// group's samples into equal disjoint shards for its clients, then `train_fraction` of each
/// client's samples for training and the rest for test.
///
/// Details: the labels are all of `0..num_classes` (not only those present), shuffled and cut
/// into contiguous chunks whose sizes differ by at most one (the first `num_classes % groups`
/// groups get the extra label); each group's label set is reported sorted in
/// [`Federation::group_labels`], and every client's [`ClientData::group`] is set. A group's
/// samples are shuffled and cut into `floor(n_g / c_g)`-sample shards (the remainder, fewer than
/// `c_g` samples, is left out), given to the group's clients in increasing client id. Each client
/// then shuffles its shard and keeps `round(train_fraction · n)` samples for training.
/// If `MAX_GROUP_DRAWS` (100 000) draws all leave a group empty (only plausible when `groups`
/// is close to a large `clients`), the assignment falls back to a random balanced one.
///
/// Errors ([`DataError::Invalid`]): regression labels, `clients == 0`, `groups` outside
/// `1..=min(clients, num_classes)`, `train_fraction` outside (0, 1), or a client left with no
/// training or no test sample.
///
/// [`ClientData::group`]: crate::learn::ClientData::group
pub fn label_groups(
    pool: &Dataset,
    clients: usize,
    groups: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    label_groups_assigned(pool, clients, groups, Assign::Random, train_fraction, rng)
}

/// How silos are assigned to label groups (`split.assign`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Assign {
    /// Each silo's group uniform at random, re-drawn until every group has one (spec §7.1; the
    /// default, so existing results stay as they were).
    #[default]
    Random,
    /// Groups as even as they can be (sizes differ by at most one): silo `c` gets group
    /// `c mod groups`, then the assignment is shuffled by the run's data stream.
    Balanced,
}

/// [`label_groups`] with the group assignment chosen: [`Assign::Random`] is exactly
/// [`label_groups`]; [`Assign::Balanced`] replaces only the assignment step (one shuffle of
/// `c mod groups`), the rest of the split consumes the stream as before.
pub fn label_groups_assigned(
    pool: &Dataset,
    clients: usize,
    groups: usize,
    assign: Assign,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let (ids, num_classes) = class_labels(pool, "label_groups")?;
    check_clients(clients)?;
    check_fraction(train_fraction)?;
    if groups == 0 || groups > clients || groups > num_classes {
        return Err(DataError::Invalid(format!(
            "label_groups: groups = {groups} is outside the allowed range 1..={} (at most the \
             {clients} clients and the {num_classes} classes)",
            clients.min(num_classes)
        )));
    }
    let group_labels = shuffled_label_sets(num_classes, groups, rng);
    let group_of_label = label_to_set(&group_labels, num_classes);
    let assignment = match assign {
        Assign::Random => assign_groups(clients, groups, rng),
        Assign::Balanced => balanced_groups(clients, groups, rng),
    };

    let mut members: Vec<Vec<usize>> = vec![Vec::new(); groups];
    for (i, &y) in ids.iter().enumerate() {
        members[group_of_label[y as usize]].push(i);
    }
    let mut client_rows: Vec<Vec<usize>> = vec![Vec::new(); clients];
    for (g, rows) in members.iter_mut().enumerate() {
        rows.shuffle(rng);
        let owners: Vec<usize> = (0..clients).filter(|&c| assignment[c] == g).collect();
        let shard = rows.len() / owners.len();
        for (k, &c) in owners.iter().enumerate() {
            client_rows[c] = rows[k * shard..(k + 1) * shard].to_vec();
        }
    }
    let groups_of: Vec<Option<usize>> = assignment.into_iter().map(Some).collect();
    build(
        pool,
        client_rows,
        &groups_of,
        train_fraction,
        Some(group_labels),
        "label_groups",
        rng,
    )
}

/// Each client's group, uniform at random, re-drawn until every group has a client.
fn assign_groups(clients: usize, groups: usize, rng: &mut StdRng) -> Vec<usize> {
    for _ in 0..MAX_GROUP_DRAWS {
        let a: Vec<usize> = (0..clients).map(|_| rng.random_range(0..groups)).collect();
        let mut seen = vec![false; groups];
        for &g in &a {
            seen[g] = true;
        }
        if seen.iter().all(|&s| s) {
            return a;
        }
    }
    balanced_groups(clients, groups, rng)
}

/// Silo `c` in group `c mod groups`, shuffled: group sizes differ by at most one.
fn balanced_groups(clients: usize, groups: usize, rng: &mut StdRng) -> Vec<usize> {
    let mut a: Vec<usize> = (0..clients).map(|c| c % groups).collect();
    a.shuffle(rng);
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::data::{ClientData, Labels};
    use crate::learn::partition::tests::{
        assert_disjoint, assert_invalid, labels, pool, rng, same,
    };
    use std::collections::{BTreeSet, HashSet};

    #[test]
    fn balanced_assignment_evens_the_groups_and_follows_the_seed() {
        let p = pool(1000, 10);
        let mut seen = BTreeSet::new();
        for seed in 0..20 {
            for (clients, groups) in [(8, 3), (10, 4), (5, 5), (9, 2)] {
                let f = label_groups_assigned(
                    &p,
                    clients,
                    groups,
                    Assign::Balanced,
                    0.8,
                    &mut rng(seed),
                )
                .unwrap();
                let mut sizes = vec![0; groups];
                for c in &f.clients {
                    sizes[c.group.unwrap()] += 1;
                }
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "group sizes {sizes:?}");
                let again = label_groups_assigned(
                    &p,
                    clients,
                    groups,
                    Assign::Balanced,
                    0.8,
                    &mut rng(seed),
                )
                .unwrap();
                assert!(same(&f, &again), "same seed, same split");
                if (clients, groups) == (8, 3) {
                    seen.insert(f.groups().unwrap());
                }
            }
        }
        assert!(seen.len() > 5, "the assignment follows the seed");
        // Random stays the default and stays what it was.
        let a = label_groups(&p, 8, 3, 0.8, &mut rng(4)).unwrap();
        let b = label_groups_assigned(&p, 8, 3, Assign::Random, 0.8, &mut rng(4)).unwrap();
        assert!(same(&a, &b));
    }

    #[test]
    fn label_groups_structure() {
        let p = pool(1000, 10);
        for (seed, clients, groups) in [(1, 8, 2), (2, 8, 3), (3, 8, 4), (4, 5, 5), (5, 10, 10)] {
            let f = label_groups(&p, clients, groups, 0.8, &mut rng(seed)).unwrap();
            assert_eq!(f.clients.len(), clients);
            let gl = f.group_labels.clone().unwrap();
            assert_eq!(gl.len(), groups);
            // Label sets: disjoint, covering, near-equal.
            let all: Vec<u32> = gl.iter().flatten().copied().collect();
            assert_eq!(
                all.iter().copied().collect::<BTreeSet<_>>(),
                (0..10).collect()
            );
            assert_eq!(all.len(), 10);
            let sizes: Vec<usize> = gl.iter().map(Vec::len).collect();
            assert!(
                sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
                "{sizes:?}"
            );
            // Every group has a client; labels stay within the group.
            let groups_of = f.groups().unwrap();
            for g in 0..groups {
                assert!(groups_of.contains(&g), "group {g} empty: {groups_of:?}");
            }
            for c in &f.clients {
                let set = &gl[c.group.unwrap()];
                for y in labels(&c.train).into_iter().chain(labels(&c.test)) {
                    assert!(set.contains(&y), "label {y} outside group {set:?}");
                }
                // 80/20.
                let n = c.train.len() + c.test.len();
                assert_eq!(c.train.len(), (0.8 * n as f64).round() as usize);
            }
            // Disjoint; coverage up to the shard remainders (< clients of the group per group).
            let used = assert_disjoint(&f);
            for (g, set) in gl.iter().enumerate() {
                let members: Vec<&ClientData> =
                    f.clients.iter().filter(|c| c.group == Some(g)).collect();
                let n_g = 100 * set.len();
                let sizes: Vec<usize> = members
                    .iter()
                    .map(|c| c.train.len() + c.test.len())
                    .collect();
                assert!(
                    sizes.iter().all(|&s| s == n_g / members.len()),
                    "unequal shards {sizes:?}"
                );
            }
            assert!(
                used.len() > 1000 - clients,
                "only {} of 1000 samples used",
                used.len()
            );
        }
    }

    #[test]
    fn label_groups_deterministic_and_seed_dependent() {
        let p = pool(600, 10);
        let a = label_groups(&p, 8, 3, 0.8, &mut rng(7)).unwrap();
        let b = label_groups(&p, 8, 3, 0.8, &mut rng(7)).unwrap();
        let c = label_groups(&p, 8, 3, 0.8, &mut rng(8)).unwrap();
        assert!(same(&a, &b));
        assert!(!same(&a, &c));
        // Assignments are random, not a fixed pattern: over seeds several distinct ones appear,
        // including unbalanced ones.
        let assignments: HashSet<Vec<usize>> = (0..20)
            .map(|s| {
                label_groups(&p, 8, 2, 0.8, &mut rng(s))
                    .unwrap()
                    .groups()
                    .unwrap()
            })
            .collect();
        assert!(assignments.len() > 10);
        assert!(
            assignments
                .iter()
                .any(|a| a.iter().filter(|&&g| g == 0).count() != 4)
        );
    }

    #[test]
    fn label_groups_errors() {
        let p = pool(200, 10);
        assert_invalid(
            label_groups(&p, 0, 1, 0.8, &mut rng(0)),
            &["clients = 0", "1.."],
        );
        assert_invalid(
            label_groups(&p, 4, 5, 0.8, &mut rng(0)),
            &["groups = 5", "1..=4"],
        );
        assert_invalid(
            label_groups(&p, 12, 11, 0.8, &mut rng(0)),
            &["groups = 11", "1..=10"],
        );
        assert_invalid(label_groups(&p, 4, 0, 0.8, &mut rng(0)), &["groups = 0"]);
        for bad in [0.0, 1.0, -0.2, 1.5, f64::NAN] {
            assert_invalid(
                label_groups(&p, 4, 2, bad, &mut rng(0)),
                &["train_fraction", "(0, 1)"],
            );
        }
        // 20 samples for 10 clients in 1 group: 2 each, round(1.6) = 2 train, 0 test.
        assert_invalid(
            label_groups(&pool(20, 10), 10, 1, 0.8, &mut rng(0)),
            &["client", "0 for test"],
        );
        let real = Dataset::new(vec![0.0; 10], vec![1], Labels::Real(vec![0.0; 10])).unwrap();
        assert_invalid(label_groups(&real, 2, 1, 0.8, &mut rng(0)), &["regression"]);
    }
}
