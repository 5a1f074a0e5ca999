//! ClientPartition (spec `docs/specs/hcct.md` Algorithm 2, §2.3): greedy agglomerative
//! merging from singletons with deterministic tie-breaking.
//! Owns: [`partition`], [`partition_gradients`], [`Partition`] and [`Merge`] (its settings,
//! `PartitionConfig`, are `config.rs`'s).
//! Must not: compute the utility or benefit itself (`gram.rs`), or decide which gradients a
//! round uses (`schedule.rs`).

use super::gram::sorted_union;
use super::{Gram, HcctError, PartitionConfig, Stop, client_utilities, merge_benefit};
/// One merge of ClientPartition.
#[derive(Clone, Debug, PartialEq)]
pub struct Merge {
    /// Key (smallest member) of the group that absorbed the other; the smaller of the two.
    pub kept: usize,
    /// Key of the absorbed group.
    pub absorbed: usize,
    /// B of the merge (eq. 15); > 0 unless [`Stop::Groups`] forced it.
    pub benefit: f64,
    /// Σ_i U_i (β dropped) after the merge.
    pub total_utility: f64,
}

/// A partition of the clients and how it was reached.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    /// Disjoint groups covering every client, each sorted by client index, ordered by their
    /// smallest member (the group key).
    pub groups: Vec<Vec<usize>>,
    /// The merges in the order they were made (empty for singletons).
    pub merges: Vec<Merge>,
    /// U_i − β of every client in its final group.
    pub utilities: Vec<f64>,
}

impl Partition {
    /// N singletons (the paper's round 0, §3).
    pub fn singletons(clients: usize) -> Self {
        Self {
            groups: (0..clients).map(|i| vec![i]).collect(),
            merges: Vec::new(),
            utilities: Vec::new(),
        }
    }

    /// One group of every client (the code's round 0, A1).
    pub fn one_group(clients: usize) -> Self {
        Self {
            groups: if clients == 0 {
                Vec::new()
            } else {
                vec![(0..clients).collect()]
            },
            merges: Vec::new(),
            utilities: Vec::new(),
        }
    }

    /// K, the number of groups.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// True when there are no clients.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The index in [`Self::groups`] of each client's group.
    pub fn group_of(&self) -> Vec<usize> {
        let n = self.groups.iter().map(Vec::len).sum();
        let mut of = vec![0; n];
        for (k, g) in self.groups.iter().enumerate() {
            for &i in g {
                of[i] = k;
            }
        }
        of
    }

    /// Σ_i (U_i − β) in the final groups.
    pub fn total_utility(&self) -> f64 {
        self.utilities.iter().sum()
    }
}

/// ClientPartition (Algorithm 2, spec §2.3) on the Gram matrix of the pseudo-gradients.
///
/// From N singletons (u_i = −α_i/D_i + 1), repeatedly: compute B for every pair of current
/// groups, scanning groups in ascending key order (outer c_i, inner c_j < c_i) and keeping the
/// first strict maximum, so ties go to the smallest c_i, then the smallest c_j; stop when the
/// best B ≤ 0 ([`Stop::PositiveBenefit`]; the best starts at 0.0 and must be beaten strictly,
/// A3) or when the forced group count is reached ([`Stop::Groups`]); otherwise the smaller key
/// absorbs the other and its members' utilities are updated. At most N − 1 merges.
///
/// `sizes[i]` is D_i, client i's raw training-sample count (A5), at least 1.
pub fn partition(
    gram: &Gram,
    sizes: &[usize],
    cfg: &PartitionConfig,
) -> Result<Partition, HcctError> {
    let n = gram.len();
    if sizes.len() != n {
        return Err(HcctError::Count {
            what: "sample counts",
            expected: n,
            got: sizes.len(),
        });
    }
    if let Some(client) = sizes.iter().position(|&d| d == 0) {
        return Err(HcctError::Size { client, size: 0 });
    }
    cfg.alpha.validate()?;
    let floor = match cfg.stop {
        Stop::PositiveBenefit => 1,
        Stop::Groups(0) => return Err(HcctError::Groups(0)),
        Stop::Groups(k) => k,
    };
    let mut groups: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    let mut u: Vec<f64> = (0..n)
        .map(|i| client_utilities(gram, sizes, cfg.alpha, &[i])[0])
        .collect();
    let mut merges = Vec::new();
    while groups.len() > floor {
        // (benefit, c_i, c_j) of the best pair, c_j < c_i in key order.
        let mut best: Option<(f64, usize, usize)> = None;
        let threshold = match cfg.stop {
            Stop::PositiveBenefit => 0.0,
            Stop::Groups(_) => f64::NEG_INFINITY,
        };
        for ci in 0..groups.len() {
            for cj in 0..ci {
                let b = merge_benefit(gram, sizes, cfg.alpha, &u, &groups[cj], &groups[ci]);
                if b > best.map_or(threshold, |x| x.0) {
                    best = Some((b, ci, cj));
                }
            }
        }
        let Some((benefit, ci, cj)) = best else {
            break;
        };
        let absorbed = groups.remove(ci);
        let merged = sorted_union(&groups[cj], &absorbed);
        for (&i, v) in merged
            .iter()
            .zip(client_utilities(gram, sizes, cfg.alpha, &merged))
        {
            u[i] = v;
        }
        groups[cj] = merged;
        merges.push(Merge {
            kept: groups[cj][0],
            absorbed: absorbed[0],
            benefit,
            total_utility: u.iter().sum(),
        });
    }
    Ok(Partition {
        groups,
        merges,
        utilities: u,
    })
}

/// ClientPartition straight from the pseudo-gradients: [`Gram::from_gradients`], then
/// [`partition`].
pub fn partition_gradients(
    grads: &[&[f32]],
    sizes: &[usize],
    cfg: &PartitionConfig,
) -> Result<Partition, HcctError> {
    partition(&Gram::from_gradients(grads)?, sizes, cfg)
}
