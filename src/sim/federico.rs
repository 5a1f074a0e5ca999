//! FedeRiCo in lock-step rounds (spec §3.2), every silo in this process, driven by the nodes'
//! own round engines: [`Engines`] without faults, [`FaultNet`] under a fault schedule — every
//! M-step mode (`full`, and the mini-batch sub-steps of `epoch` and `minibatch`) is the engine's.
//! Owns: choosing the driver, and scoring the silos.
//! Must not: decide anything the core or the round engine decides (sampling, weights, sub-steps,
//! acceptance of gradients).

use super::engines::Engines;
use super::network::FaultNet;
use super::pool::{Owner, par_silos, score_each};
use super::{ClientEval, Ctx, SimError};
use crate::core::Peer;
use crate::faults::Schedule;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::privacy::audit;
use crate::report::records::{MembershipAudit, PrivacySpent};

/// Per-silo state of a FedeRiCo run.
pub(crate) struct FedericoRun {
    driver: Driver,
    /// Peers each silo sampled in the last round (for the run log).
    pub(crate) last_sampled: Vec<Vec<NodeId>>,
}

/// What drives the silos' round engines.
enum Driver {
    /// A fault-free run: every message arrives at once.
    Engines(Engines),
    /// A run under a fault schedule, on a simulated network.
    Faults(Box<FaultNet>),
}

impl FedericoRun {
    /// A fault-free run.
    pub(crate) fn new(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Self {
        let engines = Engines::new(ctx, &ctx.scenario.federico, peers(ctx), init);
        Self::driven(ctx, Driver::Engines(engines))
    }

    /// The same run under a fault schedule of `rounds` rounds.
    pub(crate) fn with_faults(
        ctx: &Ctx<'_>,
        init: &[Vec<f32>],
        schedule: Schedule,
        rounds: u64,
    ) -> Result<Self, SimError> {
        let cfg = &ctx.scenario.federico;
        let net = FaultNet::new(ctx, cfg, peers(ctx), init, schedule, rounds)?;
        Ok(Self::driven(ctx, Driver::Faults(Box::new(net))))
    }

    fn driven(ctx: &Ctx<'_>, driver: Driver) -> Self {
        Self {
            driver,
            last_sampled: vec![Vec::new(); ctx.clients()],
        }
    }

    /// The simulated network of a run under faults.
    pub(crate) fn faults(&self) -> Option<&FaultNet> {
        match &self.driver {
            Driver::Faults(f) => Some(&**f),
            Driver::Engines(_) => None,
        }
    }

    /// One round on every silo.
    pub(crate) fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        match &mut self.driver {
            Driver::Faults(f) => {
                f.round(ctx)?;
                self.last_sampled = f.last_sampled.clone();
            }
            Driver::Engines(e) => {
                e.round(ctx)?;
                self.last_sampled = e.last_sampled().to_vec();
            }
        }
        Ok(())
    }

    /// Each silo's test score with its mixture of measured peers (spec §3 inference).
    pub(crate) fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let e = match &mut self.driver {
            Driver::Faults(f) => return evaluate_faulty(ctx, f),
            Driver::Engines(e) => &*e,
        };
        let mixes: Vec<Vec<(NodeId, f64)>> = e.peers().map(Peer::inference_weights).collect();
        score_each(ctx, |i| {
            mixes[i]
                .iter()
                .map(|&(j, w)| (Owner::Silo(j.index()), e.params(j.index()), w))
                .collect()
        })
    }

    /// What each silo spent of its privacy budget (`None`: no `[privacy]`).
    pub(crate) fn privacy(&self) -> Option<PrivacySpent> {
        let spent: Vec<_> = match &self.driver {
            Driver::Engines(e) => e.silos().filter_map(|s| s.privacy_record()).collect(),
            Driver::Faults(f) => f.silos().filter_map(|s| s.privacy_record()).collect(),
        };
        PrivacySpent::of(&spent)
    }

    /// A curious member's membership-inference attack on every silo's own model as it is now
    /// (what a pull returns): per-row losses on the silo's training rows against its held-out
    /// rows, one AUC per silo and one ε lower bound over every silo's rows together, at the
    /// largest δ of the silos' budgets (0 without `[privacy]`).
    pub(crate) fn audit(&self, ctx: &mut Ctx<'_>) -> Result<MembershipAudit, SimError> {
        let fed = ctx.fed;
        let losses = par_silos(ctx, |i, learner| {
            let params = self.params(i);
            let c = &fed.clients[i];
            Ok::<_, SimError>((
                learner.row_losses(params, &c.train)?,
                learner.row_losses(params, &c.test)?,
            ))
        })
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        let delta = self.privacy().map_or(0.0, |p| {
            p.per_client_delta.iter().copied().fold(0.0, f64::max)
        });
        let per_client_auc: Vec<f64> = losses
            .iter()
            .map(|(m, n)| audit::audit(m, n, delta).auc)
            .collect();
        let members: Vec<f64> = losses.iter().flat_map(|(m, _)| m.iter().copied()).collect();
        let non: Vec<f64> = losses.iter().flat_map(|(_, n)| n.iter().copied()).collect();
        let pooled = audit::audit(&members, &non, delta);
        Ok(MembershipAudit {
            auc: per_client_auc.iter().sum::<f64>() / per_client_auc.len().max(1) as f64,
            per_client_auc,
            epsilon_lower_bound: pooled.epsilon_lower_bound,
            members: pooled.members,
            non_members: pooled.non_members,
            member_loss: finite_mean(&members),
            non_member_loss: finite_mean(&non),
        })
    }

    /// Silo `i`'s own model now.
    fn params(&self, i: usize) -> &[f32] {
        match &self.driver {
            Driver::Faults(f) => f.params(i),
            Driver::Engines(e) => e.params(i),
        }
    }

    /// The K×K weight matrix w_ij (row i: silo, column j: model), self included.
    pub(crate) fn weight_matrix(&self) -> Vec<Vec<f64>> {
        let row = |p: &Peer| p.weights().into_iter().map(|(_, w)| w).collect();
        match &self.driver {
            Driver::Faults(f) => (0..self.last_sampled.len())
                .map(|i| row(f.peer(i)))
                .collect(),
            Driver::Engines(e) => e.peers().map(row).collect(),
        }
    }
}

/// The mean of the finite values of `xs` (a diverged model's infinite loss is left out).
fn finite_mean(xs: &[f64]) -> f64 {
    let (sum, n) = xs
        .iter()
        .filter(|x| x.is_finite())
        .fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    sum / n.max(1) as f64
}

/// Each silo's core, its sampling stream seeded from the run seed and its id.
fn peers(ctx: &Ctx<'_>) -> Vec<Peer> {
    let ids: Vec<NodeId> = (0..ctx.clients() as u32).map(NodeId).collect();
    ids.iter()
        .map(|&me| {
            Peer::new(
                me,
                ids.iter().copied(),
                ctx.scenario.federico.clone(),
                stream_seed(ctx.seed, me, Stream::Sampling),
            )
        })
        .collect()
}

/// Each silo's score under faults: a node fetches the models of its mixture; the unreachable
/// ones are dropped and the rest renormalised (spec §6). A silo that is down is scored on its
/// own model. The score goes into the silo's latest record when that has none yet.
fn evaluate_faulty(ctx: &mut Ctx<'_>, f: &mut FaultNet) -> Result<Vec<ClientEval>, SimError> {
    let k = f.traces.len();
    let mut mixes: Vec<Vec<(NodeId, f64)>> =
        (0..k).map(|i| f.peer(i).inference_weights()).collect();
    for (i, mix) in mixes.iter_mut().enumerate() {
        let me = i as u32;
        if !f.state.is_up(me) {
            *mix = vec![(NodeId(me), 1.0)];
            continue;
        }
        let reachable = |j: NodeId| j.0 == me || f.state.connected(me, j.0);
        *mix = crate::core::incomplete_mixture(mix, reachable, NodeId(me));
    }
    let net = &*f;
    let evals = score_each(ctx, |i| {
        mixes[i]
            .iter()
            .map(|&(j, w)| (Owner::Silo(j.index()), net.params(j.index()), w))
            .collect()
    })?;
    for (i, (t, e)) in f.traces.iter_mut().zip(&evals).enumerate() {
        if let Some(rec) = t.last_mut().filter(|r| r.eval.is_none())
            && f.state.is_up(i as u32)
        {
            rec.eval = Some((*e).into());
        }
    }
    Ok(evals)
}
