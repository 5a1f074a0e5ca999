//! The engine's vocabulary towards its driver: the actions it asks for, the requests it names,
//! the events it reports and the record of a round.
//!
//! Owns: these types.
//! Must not: hold logic: the engine ([`super::Round`]) decides when each is produced.

use super::{Job, Score};
use crate::core::Peer;
use crate::ids::NodeId;
use std::sync::Arc;
use std::time::Duration;

/// Names one request this peer sent; its answer or failure comes back with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReqId(pub u64);

/// What one of our model requests asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// A model for round `round` from `to` (a gradient follows).
    Pull {
        /// The round of the pull.
        round: u64,
        /// The owner asked.
        to: NodeId,
    },
    /// A post-step model of `to` for evaluation.
    Fetch {
        /// The owner asked.
        to: NodeId,
    },
    /// A round notice or a done notice (answered by an acknowledgement).
    Notice,
}

/// What the driver must do, in order.
#[derive(Debug)]
pub enum Action<H> {
    /// Ask `to` for its model for round `round`.
    Pull {
        /// Names the request.
        req: ReqId,
        /// The owner.
        to: NodeId,
        /// This peer's round.
        round: u64,
    },
    /// Tell `to` this peer is in round `round` and will not pull from it.
    Notice {
        /// Names the request.
        req: ReqId,
        /// The peer told.
        to: NodeId,
        /// This peer's round.
        round: u64,
    },
    /// Ask `to` for its model of version `version` (or later), for evaluation.
    Fetch {
        /// Names the request.
        req: ReqId,
        /// The owner.
        to: NodeId,
        /// The version wanted.
        version: u64,
    },
    /// Tell `to` this peer ran its last round.
    Finished {
        /// Names the request.
        req: ReqId,
        /// The peer told.
        to: NodeId,
    },
    /// Answer a held or new request of `to` with this peer's model.
    Serve {
        /// The requester.
        to: NodeId,
        /// The driver's handle of the request.
        handle: H,
        /// The version served.
        version: u64,
        /// The parameters served.
        params: Arc<Vec<f32>>,
    },
    /// Send a weighted gradient for version `version` of `to`'s model.
    Gradient {
        /// The owner.
        to: NodeId,
        /// The version measured.
        version: u64,
        /// The weight it was scaled by.
        weight: f64,
        /// The weighted gradient.
        grad: Vec<f32>,
    },
    /// Release `to`: its model of version `version` came too late to be used.
    Skip {
        /// The owner.
        to: NodeId,
        /// The version that came.
        version: u64,
    },
    /// Hand a job to the silo's learner; its [`super::Done`] comes back through
    /// [`super::Round::handle_done`]. One job is in flight at a time.
    Run(Job),
    /// The round's record, before the round's checkpoint.
    Report(RoundReport),
    /// Save the silo's whole state after `round` (its model, optimizer and version, with this
    /// core): a restart resumes from it.
    Checkpoint {
        /// Rounds completed.
        round: u64,
        /// The FedeRiCo core as it stands after the round.
        peer: Box<Peer>,
    },
    /// Something worth a line in the log.
    Log(Event),
}

/// What a round did, for the run log (the driver adds wall times and byte counts).
#[derive(Clone, Debug, PartialEq)]
pub struct RoundReport {
    /// The round completed.
    pub round: u64,
    /// The version after the step.
    pub version: u64,
    /// Peers sampled.
    pub sampled: Vec<NodeId>,
    /// Sampled peers whose model arrived in time, in sampled order.
    pub answered: Vec<NodeId>,
    /// Gradients (self included) the round's steps summed (over all its sub-steps).
    pub gradients: usize,
    /// The weight row after the E-step, by id, self included.
    pub weights: Vec<(NodeId, f64)>,
    /// Tracked loss per known peer after the E-step.
    pub tracked: Vec<(NodeId, f64)>,
    /// Last measured loss per known peer after the E-step.
    pub last: Vec<(NodeId, f64)>,
    /// Suspects after the round.
    pub suspects: Vec<NodeId>,
    /// The mixture's test score, on evaluation rounds.
    pub eval: Option<Score>,
    /// Time from the round's start to its end.
    pub duration: Duration,
    /// The first round since the peer resumed from a checkpoint.
    pub resumed: bool,
}

/// Events of a round, for the driver's log.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Round 1's deadline passed with no peer to train with: the silo keeps waiting (a
    /// federation of one is no federation) and says so once a start deadline.
    WaitingForPeers {
        /// How long it has waited.
        waited: Duration,
        /// Connected members (none of them known to run FedeRiCo yet).
        connected: usize,
        /// Members, this peer included.
        members: usize,
    },
    /// Round 1 starts at its deadline without every member.
    StartingWithout {
        /// Connected members.
        connected: usize,
        /// Of those, the ones known to run FedeRiCo.
        running: usize,
        /// Members, this peer included.
        members: usize,
    },
    /// A round starts.
    RoundStarts {
        /// The round.
        round: u64,
        /// Peers sampled.
        sampled: Vec<NodeId>,
    },
    /// A pulled model did not arrive within τ_model.
    ModelLate {
        /// The owner.
        peer: NodeId,
        /// The round.
        round: u64,
    },
    /// The owner steps at τ_grad without everything it waited for.
    SteppingAtDeadline {
        /// The round.
        round: u64,
        /// Senders whose gradient it awaited and did not get.
        missing: Vec<NodeId>,
        /// Connected peers it waited to hear from (a pull or notice for the round) and did not.
        unannounced: Vec<NodeId>,
    },
    /// The owner steps after the grace without the gradients of samplers on probation (each
    /// missed a step in the last [`crate::core::PROBATION_ROUNDS`] rounds).
    SteppingPastProbation {
        /// The round.
        round: u64,
        /// The samplers on probation it stopped waiting for.
        missing: Vec<NodeId>,
    },
    /// A peer's gradient was far above the federation's typical norm and entered the step scaled
    /// down to the owner's bound (reported once per peer; later ones are scaled silently).
    GradientBounded {
        /// The sender.
        peer: NodeId,
        /// The round.
        round: u64,
        /// The gradient's L2 norm.
        norm: f64,
        /// The bound it was scaled to.
        bound: f64,
    },
    /// A peer's gradient pointed against the owner's own and was left out of the step
    /// ([`crate::core::Defences::drop_opposed`]; reported once per peer).
    GradientOpposed {
        /// The sender.
        peer: NodeId,
        /// The round.
        round: u64,
    },
    /// A member's recent gradients kept pointing against the owner's own or kept being over the
    /// norm bound, or agree again: it lost its weight in the row and its gradients are left out
    /// (`distrusted`), or it has them back ([`crate::core::Defences::distrust`]).
    Distrusted {
        /// The member.
        peer: NodeId,
        /// The round.
        round: u64,
        /// Distrusted now (`false`: trusted again).
        distrusted: bool,
    },
    /// A sampler keeps missing the step: its gradients are taken but no longer waited for.
    Straggler {
        /// The sampler.
        peer: NodeId,
        /// The round.
        round: u64,
    },
    /// A fetched model for evaluation did not arrive: it leaves the mixture.
    FetchLate {
        /// The owner.
        peer: NodeId,
    },
    /// A round is complete.
    RoundDone {
        /// The round.
        round: u64,
        /// Its duration.
        duration: Duration,
    },
    /// The last round is done; the peer serves its final model until the others are done.
    Lingering {
        /// Rounds completed.
        round: u64,
    },
}
