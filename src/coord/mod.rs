//! The coordinator algorithms of FedeRiCo's family, as pure, transport-free code: FedDisco,
//! FedCollab, HCCT and FedSaC (specs under `docs/specs/`).
//! Owns: each algorithm's decisions (aggregation weights, coalitions, merges, personalised
//! mixing matrices) from the summaries silos send (sample counts, label discrepancies,
//! pseudo-gradients, model deltas, feature subspaces), all as plain `f32`/`f64` slices.
//! Must not: touch tensors, sockets, clocks or threads (std, rand and serde only). The
//! simulator (`sim::coordinated`) and the libp2p coordinator drive it.
//!
//! Layout: one directory per algorithm, its network coordinator's state in `<alg>/server.rs`
//! (re-exported as `coord::<alg>_server`); `joining.rs` is the registration and start of a run
//! the HCCT, FedSaC and FedCollab servers share (FedDisco's server takes whoever registered);
//! `engine/` is the coordinator's round engine over all four servers (the rules of a run over a
//! network: deadlines, joining, held fetches, excused members), without I/O; `member/` is the
//! other side, a coordinated silo's rounds (budgets, detaching, reattaching, the switch to
//! FedeRiCo), without I/O; `excuse.rs` is the excuse rule both the engine and FedCollab's member
//! engine follow; `robust.rs` holds the bounds FedDisco, HCCT and FedSaC apply to what members
//! send (self-reported sample counts, how far a model moves) and the robust aggregators.

pub mod engine;
pub mod excuse;
pub mod fedcollab;
pub mod feddisco;
pub mod fedsac;
pub mod hcct;
mod joining;
pub mod member;
pub mod robust;

pub use fedcollab::server as fedcollab_server;
pub use feddisco::server as feddisco_server;
pub use fedsac::server as fedsac_server;
pub use hcct::server as hcct_server;

use serde::{Deserialize, Serialize};

/// One pair's distance as one of its two silos reports it (FedCollab: what a silo sends the
/// coordinator after its pairwise discriminator rounds, `fedcollab_server::report`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairDistance {
    /// The other silo's manifest index.
    pub partner: u32,
    /// 2·BalAcc_best − 1 (spec §3.2 step 5); `None` when the pair could not run.
    pub distance: Option<f64>,
    /// Rounds the pair ran.
    pub rounds: u32,
}
