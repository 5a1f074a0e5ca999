//! The coordinator algorithms of the same family as FedeRiCo (FedDisco, FedCollab, HCCT,
//! FedSaC) as simulator runs, beside FedeRiCo and the baselines.
//! Owns: the trait every such run implements, [`CoordinatedRun`] (the engines the network runs,
//! `members/`, and the lock-step loops of the simulator-only modes), which
//! `run_seed` drives (`seed.rs` builds the runs: this file names none of them, so they can all
//! depend on it).
//! Must not: hold algorithm decisions (weights, coalitions, merges): those live in
//! [`crate::coord`], which knows nothing of tensors or threads.

use super::{ClientEval, Ctx, SimError};

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
    /// The fault checks of a run under a fault schedule (`None`: it ran without faults).
    fn fault_report(&self) -> Option<crate::faults::checks::Report> {
        None
    }
}
