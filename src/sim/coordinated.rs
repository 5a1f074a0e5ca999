//! The coordinator algorithms of the same family as FedeRiCo (FedDisco, FedCollab, HCCT,
//! FedSaC) as simulator runs, beside FedeRiCo and the baselines.
//! Owns: the per-round driver work of each (local training on the silos, handing what the
//! algorithm needs to its pure core in [`crate::coord`], applying the models it returns), and
//! the hook [`build`] through which `run_seed` finds them.
//! Must not: hold algorithm decisions (weights, coalitions, merges): those live in
//! [`crate::coord`], which knows nothing of tensors or threads.

use super::feddisco::FeddiscoRun;
use super::fedsac::FedsacRun;
use super::hcct::HcctRun;
use super::{ClientEval, Ctx, SimError};
use crate::scenario::Algorithm;

/// One coordinated algorithm's state across the rounds of one seed.
pub(crate) trait CoordinatedRun {
    /// One communication round: local work on every silo, then the coordinator's step.
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError>;
    /// Scores every silo's current (personalised or shared) model on its test split.
    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError>;
    /// A JSON record of the algorithm's decisions (e.g. FedCollab's distances and coalitions),
    /// written to `<seed dir>/<algorithm>.json` after the last round; `None` writes nothing.
    fn record(&self) -> Option<serde_json::Value> {
        None
    }
}

/// The run for `algorithm`, or `None` when it is not a coordinated algorithm (Local, FedAvg,
/// FedAvg+ and FedeRiCo have their own drivers). `init[i]` is silo i's initial weights,
/// identical for every algorithm.
pub(crate) fn build(
    algorithm: Algorithm,
    ctx: &Ctx<'_>,
    init: &[Vec<f32>],
) -> Option<Box<dyn CoordinatedRun>> {
    match algorithm {
        Algorithm::Local | Algorithm::Fedavg | Algorithm::FedavgPlus | Algorithm::Federico => None,
        Algorithm::Fedcollab => Some(Box::new(super::fedcollab::FedCollabRun::new(ctx, init))),
        Algorithm::Hcct => Some(Box::new(HcctRun::new(ctx, init))),
        Algorithm::Feddisco => Some(Box::new(FeddiscoRun::new(ctx, init))),
        Algorithm::Fedsac => Some(Box::new(FedsacRun::new(ctx, init))),
    }
}
