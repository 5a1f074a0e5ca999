//! The collaborator table: last loss, tracked loss and `seen` flag per known peer, self included
//! (FedeRiCo spec §3.1 and §3.2 step 4).
//! Owns: the E-step bookkeeping (keep stale losses, EMA or running sum over *every* entry) and the
//! softmax weights derived from it.
//! Must not: choose peers (that is `sampling.rs`) or know how losses were measured.

use super::softmax::softmax;
use crate::ids::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How per-round losses become the tracked loss L̂ (spec §4 and Appendix A).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossTracking {
    /// `L̂ ← (1−β)·L̂ + β·ℓ` (Algorithm 1).
    #[default]
    Ema,
    /// `L̂ ← L̂ + ℓ`: the accumulated loss of the exact-EM view (the paper's ablation).
    Accumulated,
}

/// One row entry: what peer `j` looks like from this node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// ℓ_ij: the last measured (scaled) loss; kept when `j` is not measured this round.
    pub last_loss: f64,
    /// L̂_ij: the tracked loss the weights are computed from.
    pub tracked_loss: f64,
    /// Whether ℓ_ij has ever been measured (spec §5.3: unseen peers get no inference weight).
    pub seen: bool,
}

/// `L̂ ← (1−β)·L̂ + β·ℓ`, β weighting the *new* loss (spec §1, §9 item 17).
pub fn ema_update(tracked: f64, loss: f64, beta: f64) -> f64 {
    (1.0 - beta) * tracked + beta * loss
}

/// A node's row of the collaboration matrix, ordered by node id.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CollaboratorTable {
    entries: BTreeMap<NodeId, Entry>,
    /// w_i· = softmax(−a · L̂_i·), aligned with `entries` (recomputed after every change); a,
    /// the multiplier of the tracked losses, is 1 but under [`super::Soften`] and comes with
    /// each change.
    weights: Vec<f64>,
}

impl CollaboratorTable {
    /// A table knowing `ids`, all unmeasured (ℓ = L̂ = 0, spec §3.1): weights are uniform.
    pub fn new(ids: impl IntoIterator<Item = NodeId>) -> Self {
        let mut t = Self {
            entries: ids.into_iter().map(|id| (id, Entry::default())).collect(),
            weights: Vec::new(),
        };
        t.recompute(1.0);
        t
    }

    /// Adds a peer with the optimistic initial entry if it is new, recomputing the weights with
    /// multiplier `a`; returns whether it was new.
    pub fn insert(&mut self, id: NodeId, a: f64) -> bool {
        if self.entries.contains_key(&id) {
            return false;
        }
        self.entries.insert(id, Entry::default());
        self.recompute(a);
        true
    }

    /// The E-step of one round: set ℓ for the `measured` entries (unknown ids are added first),
    /// keep the previous ℓ for all others, then update L̂ for **every** entry and recompute the
    /// weights as softmax(−a · L̂).
    pub fn record_round(
        &mut self,
        measured: &[(NodeId, f64)],
        beta: f64,
        tracking: LossTracking,
        a: f64,
    ) {
        for &(id, loss) in measured {
            let e = self.entries.entry(id).or_default();
            e.last_loss = loss;
            e.seen = true;
        }
        for e in self.entries.values_mut() {
            e.tracked_loss = match tracking {
                LossTracking::Ema => ema_update(e.tracked_loss, e.last_loss, beta),
                LossTracking::Accumulated => e.tracked_loss + e.last_loss,
            };
        }
        self.recompute(a);
    }

    fn recompute(&mut self, a: f64) {
        let scores: Vec<f64> = self.entries.values().map(|e| -a * e.tracked_loss).collect();
        self.weights = softmax(&scores);
    }

    /// Number of known nodes, self included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no node is known.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of `id`.
    pub fn entry(&self, id: NodeId) -> Option<&Entry> {
        self.entries.get(&id)
    }

    /// Current weight of `id` (0 for unknown ids).
    pub fn weight(&self, id: NodeId) -> f64 {
        self.entries
            .keys()
            .position(|&k| k == id)
            .map_or(0.0, |p| self.weights[p])
    }

    /// The row without the entries `drop` names: softmax over the others (each weight
    /// renormalised over them), 0 for a dropped one, by id. A row that drops nothing, or would
    /// drop every entry, is the plain row (bit for bit).
    pub fn row_without(&self, drop: impl Fn(NodeId, &Entry) -> bool) -> Vec<(NodeId, f64)> {
        let dropped: Vec<bool> = self.iter().map(|(j, e, _)| drop(j, e)).collect();
        let kept: f64 = self
            .iter()
            .zip(&dropped)
            .filter(|(_, d)| !**d)
            .map(|(x, _)| x.2)
            .sum();
        let plain = !dropped.contains(&true) || kept <= 0.0;
        self.iter()
            .zip(dropped)
            .map(|((j, _, w), d)| match () {
                _ if plain => (j, w),
                _ if d => (j, 0.0),
                _ => (j, w / kept),
            })
            .collect()
    }

    /// The weight of `id` in [`Self::row_without`] (0 for an unknown id).
    pub fn weight_without(&self, id: NodeId, drop: impl Fn(NodeId, &Entry) -> bool) -> f64 {
        self.row_without(drop)
            .into_iter()
            .find(|&(j, _)| j == id)
            .map_or(0.0, |x| x.1)
    }

    /// `(id, entry, weight)` for every known node, by id.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, &Entry, f64)> + '_ {
        self.entries
            .iter()
            .zip(&self.weights)
            .map(|((&id, e), &w)| (id, e, w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> Vec<NodeId> {
        (0..n).map(NodeId).collect()
    }

    #[test]
    fn ema_weights_the_new_loss_by_beta() {
        assert!((ema_update(1.0, 3.0, 0.6) - 2.2).abs() < 1e-12);
        assert_eq!(ema_update(5.0, 1.0, 1.0), 1.0);
    }

    #[test]
    fn fresh_table_is_uniform_and_unseen() {
        let t = CollaboratorTable::new(ids(4));
        assert!(
            t.iter()
                .all(|(_, e, w)| !e.seen && (w - 0.25).abs() < 1e-15)
        );
    }

    #[test]
    fn unmeasured_entries_keep_their_last_loss_and_still_move() {
        let mut t = CollaboratorTable::new(ids(3));
        t.record_round(
            &[(NodeId(0), 1.0), (NodeId(1), 2.0)],
            0.5,
            LossTracking::Ema,
            1.0,
        );
        assert_eq!(t.entry(NodeId(1)).unwrap().tracked_loss, 1.0);
        // round 2: only node 0 measured; node 1 keeps ℓ = 2 and L̂ moves toward it (spec §9.5)
        t.record_round(&[(NodeId(0), 1.0)], 0.5, LossTracking::Ema, 1.0);
        let e1 = t.entry(NodeId(1)).unwrap();
        assert_eq!(e1.last_loss, 2.0);
        assert!((e1.tracked_loss - 1.5).abs() < 1e-12);
        // node 2 was never measured: ℓ = L̂ = 0, largest weight (optimistic exploration)
        let e2 = t.entry(NodeId(2)).unwrap();
        assert!(!e2.seen && e2.tracked_loss == 0.0);
        assert!(t.weight(NodeId(2)) > t.weight(NodeId(0)));
        assert!((t.iter().map(|x| x.2).sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn accumulated_mode_sums_losses_and_goes_one_hot() {
        let mut t = CollaboratorTable::new(ids(2));
        for _ in 0..100 {
            t.record_round(
                &[(NodeId(0), 1.0), (NodeId(1), 1.2)],
                0.6,
                LossTracking::Accumulated,
                1.0,
            );
        }
        assert!((t.entry(NodeId(1)).unwrap().tracked_loss - 120.0).abs() < 1e-9);
        assert!(t.weight(NodeId(0)) > 0.999_999);
    }

    #[test]
    fn ema_mode_stays_soft_for_the_same_losses() {
        let mut t = CollaboratorTable::new(ids(2));
        for _ in 0..100 {
            t.record_round(
                &[(NodeId(0), 1.0), (NodeId(1), 1.2)],
                0.6,
                LossTracking::Ema,
                1.0,
            );
        }
        let w0 = t.weight(NodeId(0));
        assert!((w0 - 1.0 / (1.0 + (-0.2f64).exp())).abs() < 1e-9, "{w0}");
    }

    /// Insiders' review L4: members that never came hold the optimistic weight of a loss of 0
    /// (0.70 of a row went to 8 absent members); without them they hold none, and the others
    /// keep their proportions.
    #[test]
    fn a_row_without_absent_members_keeps_the_others_proportions() {
        let mut t = CollaboratorTable::new(ids(12));
        let measured: Vec<(NodeId, f64)> = (0..4).map(|i| (NodeId(i), 1.0 + i as f64)).collect();
        for _ in 0..20 {
            t.record_round(&measured, 0.6, LossTracking::Ema, 1.0);
        }
        let absent: f64 = (4..12).map(|i| t.weight(NodeId(i))).sum();
        assert!(absent > 0.9, "the optimistic row gives them {absent}");
        let drop = |j: NodeId, e: &Entry| j.0 >= 4 && !e.seen;
        let row: Vec<f64> = (0..12).map(|i| t.weight_without(NodeId(i), drop)).collect();
        assert!(row[4..].iter().all(|&w| w == 0.0), "{row:?}");
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let ratio = t.weight(NodeId(0)) / t.weight(NodeId(1));
        assert!((row[0] / row[1] - ratio).abs() < 1e-9);
        // Dropping everything: the plain row.
        let fresh = CollaboratorTable::new(ids(4));
        assert!((fresh.weight_without(NodeId(2), |_, _| true) - 0.25).abs() < 1e-15);
    }

    #[test]
    fn insert_is_idempotent_and_optimistic() {
        let mut t = CollaboratorTable::new(ids(2));
        t.record_round(
            &[(NodeId(0), 2.0), (NodeId(1), 2.0)],
            1.0,
            LossTracking::Ema,
            1.0,
        );
        assert!(t.insert(NodeId(7), 1.0));
        assert!(!t.insert(NodeId(7), 1.0));
        assert!(t.weight(NodeId(7)) > 0.7);
    }
}
