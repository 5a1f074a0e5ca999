//! A fault schedule applied in-process, deterministically (issue 4, `federico simulate`).
//!
//! Owns: the simulated network of a FedeRiCo run — which pull, model and gradient gets through
//! in round `g` (partitions, crashes, message loss, delays against the deadlines), what each
//! round would have waited (timeouts, not instant errors: a message that does not arrive costs
//! its deadline), crash checkpoints through the real checkpoint format, and every silo's trace
//! in the same form a node writes.
//! Must not: decide what the core decides. Failed and successful pulls are reported to the
//! [`crate::core::Peer`] as a node's driver reports them; the core keeps losses, marks suspects
//! and picks peers.

use crate::core::Stragglers;
use crate::faults::checks::{Applied, CrashEvidence};
use crate::faults::{Fault, NetState, Schedule, Timeline};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::trace::NodeRound;

/// The network side of a faulty FedeRiCo run.
pub(crate) struct FaultSim {
    pub(crate) schedule: Schedule,
    timeline: Timeline,
    seed: u64,
    /// τ_model and τ_grad, in seconds.
    pub(crate) tau_model: f64,
    pub(crate) tau_grad: f64,
    /// The federation's round in progress (1-based once started).
    pub(crate) round: u64,
    /// The network during the previous round.
    pub(crate) prev: NetState,
    /// Rounds each silo has completed.
    pub(crate) own_round: Vec<u64>,
    /// Each silo's trace.
    pub(crate) traces: Vec<Vec<NodeRound>>,
    pub(crate) applied: Vec<Applied>,
    pub(crate) crashes: Vec<CrashEvidence>,
    /// Checkpoints of silos that are down, as the bytes a node writes.
    pub(crate) saved: Vec<Option<Vec<u8>>>,
    /// The silo's next record is its first after a restart.
    pub(crate) resumed: Vec<bool>,
    /// Each owner's stragglers (samplers it no longer waits for), as a node keeps them: not
    /// checkpointed, so a restart forgets them.
    pub(crate) stragglers: Vec<Stragglers>,
}

/// What kind of message a loss draw is for.
#[derive(Clone, Copy)]
pub(crate) enum Msg {
    Pull = 1,
    Model = 2,
    Gradient = 3,
}

impl FaultSim {
    pub(crate) fn new(schedule: Schedule, rounds: u64, seed: u64, suspect_after: u32) -> Self {
        let k = schedule.clients;
        let timeline = schedule.timeline(rounds);
        let tau_model = schedule.config.model_deadline_s;
        let tau_grad = schedule.config.gradient_deadline_s;
        let prev = timeline.at(1).clone();
        Self {
            schedule,
            timeline,
            seed,
            tau_model,
            tau_grad,
            round: 0,
            prev,
            own_round: vec![0; k],
            traces: vec![Vec::new(); k],
            applied: Vec::new(),
            crashes: Vec::new(),
            saved: vec![None; k],
            resumed: vec![false; k],
            stragglers: vec![Stragglers::new(suspect_after); k],
        }
    }

    /// Starts the next round: returns its number, the network during it and what fired.
    pub(crate) fn begin(&mut self) -> (u64, NetState, Vec<Fault>) {
        self.round += 1;
        let g = self.round;
        let fired = self.timeline.fired(g).to_vec();
        for f in &fired {
            self.applied.push(Applied {
                at: g as f64 - 0.5,
                fault: f.clone(),
            });
        }
        (g, self.timeline.at(g).clone(), fired)
    }

    /// Whether a message of kind `msg` from `from` to `to` in round `g` is dropped by the loss
    /// in force: a draw from the run seed, the round, both ends and the kind.
    pub(crate) fn lost(&self, st: &NetState, g: u64, from: u32, to: u32, msg: Msg) -> bool {
        let p = st.loss_between(from, to);
        if p <= 0.0 {
            return false;
        }
        let k = self.schedule.clients as u64;
        let salt = stream_seed(
            self.seed ^ g.wrapping_mul(0xA24B_AED4_963E_E407),
            NodeId((from as u64 * k + to as u64) as u32),
            Stream::Faults,
        ) ^ (msg as u64).wrapping_mul(0x9FB2_1C65_1E98_DF25);
        let u = (stream_seed(salt, NodeId(msg as u32), Stream::Faults) >> 11) as f64
            / (1u64 << 53) as f64;
        u < p
    }

    /// Seconds a message from `from` takes beyond the usual (its delay).
    pub(crate) fn delay_s(st: &NetState, from: u32) -> f64 {
        st.delay_ms[from as usize] as f64 / 1000.0
    }
}
