//! The per-round schedule of partitions an HCCT coordinator hands out (spec
//! `docs/specs/hcct.md` §3, §5): round 0, every round from scratch or one-shot, stale
//! reports, checkpoints.
//! Owns: [`Coordinator`] and [`CoordinatorSnapshot`] (its settings, `CoordinatorConfig`, are
//! `config.rs`'s).
//! Must not: touch models, sockets or clocks: the server (`server.rs`) and the
//! simulator drive it; ClientPartition itself is `partition.rs`.

use super::{CoordinatorConfig, Gram, HcctError, Merge, Partition, Stop, partition};
use serde::{Deserialize, Serialize};
/// The coordinator's side of HCCT (spec §5): which groups train together in each round.
///
/// Round t's groups are [`Coordinator::groups`]. After every client reported its round-t
/// pseudo-gradient, [`Coordinator::handle_reports`] computes round t+1's partition from them
/// (A2: the newest gradients, g^t, feed Π_{t+1}), from singletons every round (A4) unless
/// `one_shot`. It holds sample counts and the latest gradients, never models or data.
#[derive(Clone, Debug)]
pub struct Coordinator {
    cfg: CoordinatorConfig,
    sizes: Vec<usize>,
    round: usize,
    current: Partition,
    /// The latest pseudo-gradient of each client (reused, flagged stale, when a report is
    /// missing; §5 "missing or late report").
    latest: Vec<Option<Vec<f32>>>,
    /// Clients whose gradient in the last partition was a stale one.
    stale: Vec<bool>,
    /// The Gram matrix the last partition used (clients with a gradient only).
    last_gram: Option<Gram>,
}

impl Coordinator {
    /// A coordinator for clients with `sizes[i]` training samples; round 0's groups are
    /// singletons, or one group with `round0_global`. Invalid sizes (0) or settings are
    /// reported by the first [`Self::handle_reports`].
    pub fn new(sizes: Vec<usize>, cfg: CoordinatorConfig) -> Self {
        let n = sizes.len();
        Self {
            current: if cfg.round0_global {
                Partition::one_group(n)
            } else {
                Partition::singletons(n)
            },
            cfg,
            sizes,
            round: 0,
            latest: vec![None; n],
            stale: vec![false; n],
            last_gram: None,
        }
    }

    /// The round whose groups [`Self::groups`] gives (0-based).
    pub fn round(&self) -> usize {
        self.round
    }

    /// The groups of the current round, sorted members, ordered by smallest member.
    pub fn groups(&self) -> &[Vec<usize>] {
        &self.current.groups
    }

    /// The current round's partition with its merge trace.
    pub fn partition(&self) -> &Partition {
        &self.current
    }

    /// The Gram matrix behind the current partition (clients that had a gradient, in index
    /// order), for logging cosines; `None` before the first partition.
    pub fn last_gram(&self) -> Option<&Gram> {
        self.last_gram.as_ref()
    }

    /// Which clients' gradients in the current partition were stale (reused from an earlier
    /// round because the report was missing).
    pub fn stale(&self) -> &[bool] {
        &self.stale
    }

    /// What a restarted coordinator needs to carry on exactly: the round, its groups and every
    /// client's latest pseudo-gradient (the merge trace and Gram matrix are for logs only).
    pub fn snapshot(&self) -> CoordinatorSnapshot {
        CoordinatorSnapshot {
            round: self.round,
            groups: self.current.groups.clone(),
            latest: self.latest.clone(),
        }
    }

    /// A coordinator carrying on from `snap`. Refused when the snapshot does not fit `sizes`
    /// (another client count, or groups that are not a partition of the clients).
    pub fn restore(
        sizes: Vec<usize>,
        cfg: CoordinatorConfig,
        snap: CoordinatorSnapshot,
    ) -> Result<Self, HcctError> {
        let n = sizes.len();
        if snap.latest.len() != n {
            return Err(HcctError::Count {
                what: "saved gradients",
                expected: n,
                got: snap.latest.len(),
            });
        }
        let mut seen = vec![false; n];
        for &i in snap.groups.iter().flatten() {
            if i >= n || std::mem::replace(&mut seen[i], true) {
                return Err(HcctError::Count {
                    what: "clients in the saved groups",
                    expected: n,
                    got: i + 1,
                });
            }
        }
        if seen.iter().any(|s| !s) {
            return Err(HcctError::Count {
                what: "clients in the saved groups",
                expected: n,
                got: seen.iter().filter(|s| **s).count(),
            });
        }
        Ok(Self {
            cfg,
            sizes,
            round: snap.round,
            current: Partition {
                groups: snap.groups,
                merges: Vec::new(),
                utilities: Vec::new(),
            },
            latest: snap.latest,
            stale: vec![false; n],
            last_gram: None,
        })
    }

    /// Call after round t's local training with each client's pseudo-gradient (`None` for a
    /// missing report): computes round t+1's partition and advances the round. A client with
    /// no gradient yet stays a singleton; a missing report reuses the previous gradient (§5).
    pub fn handle_reports(&mut self, grads: &[Option<&[f32]>]) -> Result<&Partition, HcctError> {
        let n = self.sizes.len();
        if grads.len() != n {
            return Err(HcctError::Count {
                what: "reports",
                expected: n,
                got: grads.len(),
            });
        }
        if let Some(client) = self.sizes.iter().position(|&d| d == 0) {
            return Err(HcctError::Size { client, size: 0 });
        }
        self.cfg.partition.alpha.validate()?;
        if self.cfg.partition.stop == Stop::Groups(0) {
            return Err(HcctError::Groups(0));
        }
        for (i, g) in grads.iter().enumerate() {
            self.stale[i] = g.is_none() && self.latest[i].is_some();
            if let Some(g) = g {
                self.latest[i] = Some(g.to_vec());
            }
        }
        self.round += 1;
        if self.cfg.one_shot && self.round > 1 {
            return Ok(&self.current);
        }
        let have: Vec<usize> = (0..n).filter(|&i| self.latest[i].is_some()).collect();
        let vecs: Vec<&[f32]> = have
            .iter()
            .filter_map(|&i| self.latest[i].as_deref())
            .collect();
        let gram = Gram::from_gradients(&vecs)?;
        let sizes: Vec<usize> = have.iter().map(|&i| self.sizes[i]).collect();
        let sub = partition(&gram, &sizes, &self.cfg.partition)?;
        self.current = lift(&sub, &have, n);
        self.last_gram = Some(gram);
        Ok(&self.current)
    }
}

/// A [`Coordinator`]'s state for a checkpoint ([`Coordinator::snapshot`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoordinatorSnapshot {
    /// The round whose groups `groups` are.
    pub round: usize,
    /// That round's groups.
    pub groups: Vec<Vec<usize>>,
    /// Each client's latest pseudo-gradient.
    pub latest: Vec<Option<Vec<f32>>>,
}

/// A partition of the clients `have` (sub-indices) as one of all `n` clients: the others are
/// singletons; groups re-keyed and re-ordered by smallest member.
fn lift(sub: &Partition, have: &[usize], n: usize) -> Partition {
    if have.len() == n {
        return sub.clone();
    }
    let mut groups: Vec<Vec<usize>> = sub
        .groups
        .iter()
        .map(|g| g.iter().map(|&j| have[j]).collect())
        .collect();
    groups.extend((0..n).filter(|i| !have.contains(i)).map(|i| vec![i]));
    groups.sort();
    let mut utilities = vec![f64::NAN; n];
    for (j, &i) in have.iter().enumerate() {
        utilities[i] = sub.utilities[j];
    }
    Partition {
        groups,
        merges: sub
            .merges
            .iter()
            .map(|m| Merge {
                kept: have[m.kept],
                absorbed: have[m.absorbed],
                ..m.clone()
            })
            .collect(),
        utilities,
    }
}
