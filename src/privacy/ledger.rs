//! One silo's privacy ledger: every release of its rows, composed against everyone together and
//! against each peer alone (spec `privacy.md` §3), and its budget.
//!
//! Owns: which releases each audience has seen, their composed RDP per order, the ε each view
//! has spent at the silo's δ, and whether a next release still fits the budget.
//! Must not: compute a release (that is `learn` and `silo`) or decide what to release (the
//! recipe, and later the core's budget-aware sampling).

use super::rdp;
use crate::ids::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A privacy budget: (ε, δ)-DP for each record of the silo's rows.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// The most ε the silo will spend against everyone together.
    pub epsilon: f64,
    /// The δ every ε is stated at.
    pub delta: f64,
}

impl Budget {
    /// Checks that ε is positive and finite and δ in (0, 1).
    pub fn validate(&self) -> Result<(), String> {
        if !(self.epsilon.is_finite() && self.epsilon > 0.0) {
            return Err(format!(
                "privacy epsilon must be positive and finite, got {}",
                self.epsilon
            ));
        }
        if !(self.delta > 0.0 && self.delta < 1.0) {
            return Err(format!(
                "privacy delta must be in (0, 1), got {}",
                self.delta
            ));
        }
        Ok(())
    }
}

/// One kind of release: `count` invocations of the Gaussian mechanism with noise multiplier
/// `sigma` on Poisson samples of rate `q` (the noise standard deviation is `sigma` times the
/// sensitivity, the clip norm).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Release {
    /// Poisson sampling rate: expected batch over the silo's rows.
    pub q: f64,
    /// Noise multiplier σ.
    pub sigma: f64,
    /// Invocations.
    pub count: u32,
}

/// Who sees a release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Audience {
    /// Every member: what reaches the silo's own model (any member may pull it), and what the
    /// silo reveals to all (whom it samples).
    Everyone,
    /// These peers only (a gradient sent to its owner).
    Peers(BTreeSet<NodeId>),
}

/// The ε a silo has spent, against everyone together and against each peer alone.
#[derive(Clone, Debug, PartialEq)]
pub struct Spent {
    /// All releases composed (every member colluding).
    pub everyone: f64,
    /// What each peer alone has seen: the public releases and those sent to it.
    pub per_peer: BTreeMap<NodeId, f64>,
}

/// A silo's ledger: composed RDP per order, per audience. Checkpointed with the silo.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    budget: Budget,
    orders: Vec<f64>,
    /// RDP of every release (against everyone).
    everyone: Vec<f64>,
    /// RDP of the releases every member sees.
    public: Vec<f64>,
    /// RDP of the releases each peer alone has seen, beyond the public ones.
    private_to: BTreeMap<NodeId, Vec<f64>>,
}

impl Ledger {
    /// An empty ledger with the default orders.
    pub fn new(budget: Budget) -> Self {
        let orders = rdp::default_orders();
        let zeros = vec![0.0; orders.len()];
        Ledger {
            budget,
            everyone: zeros.clone(),
            public: zeros,
            orders,
            private_to: BTreeMap::new(),
        }
    }

    /// The budget.
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// This ledger's releases under another budget (a silo restarted with a changed config:
    /// what it released stays spent). `None` when the ledger's orders are not the default ones
    /// (a file that is not a ledger of this version).
    pub fn rebudgeted(self, budget: Budget) -> Option<Self> {
        let n = self.orders.len();
        let sound = self.orders == rdp::default_orders()
            && self.everyone.len() == n
            && self.public.len() == n
            && self.private_to.values().all(|v| v.len() == n)
            && self
                .everyone
                .iter()
                .chain(&self.public)
                .all(|v| v.is_finite() && *v >= 0.0);
        sound.then_some(Self { budget, ..self })
    }

    /// RDP of a release, per order.
    fn cost(&self, r: Release) -> Vec<f64> {
        self.orders
            .iter()
            .map(|&a| f64::from(r.count) * rdp::sampled_gaussian(r.q, r.sigma, a))
            .collect()
    }

    /// ε against everyone after `r` would have been released too.
    pub fn epsilon_after(&self, r: Release) -> f64 {
        let total: Vec<f64> = self
            .everyone
            .iter()
            .zip(self.cost(r))
            .map(|(a, b)| a + b)
            .collect();
        rdp::epsilon(&self.orders, &total, self.budget.delta).0
    }

    /// Whether `r` still fits the budget against everyone (the strictest view).
    pub fn affords(&self, r: Release) -> bool {
        self.epsilon_after(r) <= self.budget.epsilon
    }

    /// Records a release seen by `audience`.
    pub fn record(&mut self, r: Release, audience: &Audience) {
        let cost = self.cost(r);
        add(&mut self.everyone, &cost);
        match audience {
            Audience::Everyone => add(&mut self.public, &cost),
            Audience::Peers(peers) => {
                for p in peers {
                    let n = self.orders.len();
                    add(
                        self.private_to.entry(*p).or_insert_with(|| vec![0.0; n]),
                        &cost,
                    );
                }
            }
        }
    }

    /// ε against everyone together.
    pub fn epsilon(&self) -> f64 {
        rdp::epsilon(&self.orders, &self.everyone, self.budget.delta).0
    }

    /// ε against `peer` alone: the public releases and those sent to it.
    pub fn epsilon_against(&self, peer: NodeId) -> f64 {
        match self.private_to.get(&peer) {
            None => rdp::epsilon(&self.orders, &self.public, self.budget.delta).0,
            Some(own) => {
                let seen: Vec<f64> = self.public.iter().zip(own).map(|(a, b)| a + b).collect();
                rdp::epsilon(&self.orders, &seen, self.budget.delta).0
            }
        }
    }

    /// Both views, for `peers` (those not yet sent anything see the public releases only).
    pub fn spent(&self, peers: impl IntoIterator<Item = NodeId>) -> Spent {
        Spent {
            everyone: self.epsilon(),
            per_peer: peers
                .into_iter()
                .map(|p| (p, self.epsilon_against(p)))
                .collect(),
        }
    }
}

fn add(into: &mut [f64], cost: &[f64]) {
    into.iter_mut().zip(cost).for_each(|(a, b)| *a += b);
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Budget = Budget {
        epsilon: 3.0,
        delta: 1e-5,
    };

    fn peers(ids: &[u32]) -> Audience {
        Audience::Peers(ids.iter().map(|&i| NodeId(i)).collect())
    }

    #[test]
    fn a_peer_sees_the_public_releases_and_its_own() {
        let mut l = Ledger::new(B);
        let r = Release {
            q: 0.05,
            sigma: 1.0,
            count: 100,
        };
        l.record(r, &Audience::Everyone);
        let public = l.epsilon();
        assert_eq!(l.epsilon_against(NodeId(1)), public);
        l.record(r, &peers(&[1]));
        l.record(r, &peers(&[1, 2]));
        let spent = l.spent([NodeId(1), NodeId(2), NodeId(3)]);
        // Everyone composes all three; peer 1 saw all three too; peer 2 two; peer 3 one.
        assert!((spent.per_peer[&NodeId(1)] - spent.everyone).abs() < 1e-12);
        assert!(spent.per_peer[&NodeId(2)] < spent.everyone);
        assert!(spent.per_peer[&NodeId(2)] > public);
        assert_eq!(spent.per_peer[&NodeId(3)], public);
        // The same three releases composed by hand.
        let mut by_hand = Ledger::new(B);
        by_hand.record(Release { count: 300, ..r }, &Audience::Everyone);
        assert!((by_hand.epsilon() - spent.everyone).abs() < 1e-12);
    }

    #[test]
    fn the_budget_refuses_the_release_that_would_exceed_it() {
        let mut l = Ledger::new(B);
        let step = Release {
            q: 0.01,
            sigma: 1.5,
            count: 1,
        };
        let mut steps = 0;
        while l.affords(step) {
            l.record(step, &Audience::Everyone);
            steps += 1;
            assert!(steps < 100_000, "the budget never ran out");
        }
        assert!(steps > 100, "only {steps} steps fit ε = 3");
        assert!(l.epsilon() <= B.epsilon);
        assert!(l.epsilon_after(step) > B.epsilon);
        assert_eq!(l.epsilon(), l.spent([]).everyone);
    }

    #[test]
    fn a_budget_must_be_positive_and_delta_a_probability() {
        for (e, d) in [(0.0, 1e-5), (f64::INFINITY, 1e-5), (1.0, 0.0), (1.0, 1.0)] {
            assert!(
                Budget {
                    epsilon: e,
                    delta: d
                }
                .validate()
                .is_err()
            );
        }
        assert!(B.validate().is_ok());
    }
}
