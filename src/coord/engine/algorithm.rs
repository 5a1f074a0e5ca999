//! The four coordinator algorithms as the coordinator's round engine sees them: one
//! [`CoordAlgorithm`] over the engine's [`Request`]s and [`Answer`]s, implemented by each server
//! of [`crate::coord`] (FedDisco with its weighting [`Params`]), so the engine is generic over
//! it instead of a `match` per method.
//! Owns: translating requests to each server's calls and its answers back, the refusal reasons
//! for requests an algorithm does not take, and what the engine asks of every algorithm (round,
//! joining, who the open round still awaits, checkpoint bytes, log line).
//! Must not: decide weights, groups, coalitions or models (the servers do), decide when a round
//! closes ([`super::Engine`] does), or hold time, sockets or files.

use super::{Answer, Request};
use crate::coord::fedcollab_server::{self, FedCollabServer, Solved};
use crate::coord::feddisco::{DiscoReport, Params, Robust};
use crate::coord::feddisco_server::{FetchAnswer, ServerState};
use crate::coord::fedsac_server::{self, FedsacServer};
use crate::coord::hcct_server::{self, HcctServer};
use std::sync::Arc;

/// The refusal of a request from a peer that is not one of the run's silos.
pub const NOT_A_SILO: &str = "not a silo of this federation's manifest";

/// The refusal of distances sent to a coordinator of rounds.
const DISTANCES_ARE_FEDCOLLABS: &str = "distances are for a fedcollab coordinator";

/// The refusal of a registration or a fetch sent as an update.
const SEND_A_MODEL: &str = "send the trained model as an update";

/// One coordinator algorithm behind the driver. Errors are the reasons sent back to the peer
/// (`Answer::Error`). `index` is the peer's silo index in the manifest (`None`: not a
/// silo of the run); `who` its peer ID.
pub trait CoordAlgorithm {
    /// The round open now (FedCollab has no rounds at the coordinator: 0).
    fn round(&self) -> u64;

    /// Silos (FedDisco: nodes) registered so far.
    fn registered(&self) -> usize;

    /// The round clock may run: FedDisco once anyone registered, HCCT and FedSaC once the run
    /// started; never for FedCollab.
    fn clock_may_run(&self) -> bool;

    /// FedCollab's plan is out, HCCT's or FedSaC's run started (FedDisco needs neither).
    fn plan_out(&self) -> bool;

    /// Every update a round awaits can have come: FedDisco's round closes early only once
    /// `nodes` nodes registered; HCCT's and FedSaC's `all_in` already covers the run's silos
    /// (every silo, or those that came before the join deadline).
    fn complete(&self, _nodes: usize) -> bool {
        true
    }

    /// Silos still awaited before the run can start (none once it started, and none for
    /// FedDisco, which awaits nobody).
    fn missing(&self) -> Vec<usize> {
        Vec::new()
    }

    /// The run started without silo `index` (joining closed before it came).
    fn left_out(&self, _index: usize) -> bool {
        false
    }

    /// Joining may close on the silos that came (the algorithm says how many it needs).
    fn may_close_joining(&self) -> bool {
        false
    }

    /// Closes joining on the silos that came (the join deadline passed); the silos left out.
    fn close_joining(&mut self) -> Result<Vec<usize>, String>;

    /// Parameters per model (0: no model reaches this coordinator).
    fn num_params(&self) -> usize;

    /// Handles a `Register` or a `Join`.
    fn register(&mut self, who: &str, index: Option<usize>, req: &Request) -> Result<(), String>;

    /// Handles an `Update`, a `Contribute` or `Distances`; true when every expected sender has
    /// sent (FedCollab: the structure is solved).
    fn update(&mut self, who: &str, index: Option<usize>, req: Request) -> Result<bool, String>;

    /// The members the open round still awaits an update from, by name (`names`: the manifest's
    /// members by silo index, for the algorithms that index their silos). Empty once all are
    /// in, and whenever no round is open.
    fn waiting(&self, names: &[String]) -> Vec<String>;

    /// The answer to a fetch of `round`, or `None` to hold it.
    fn fetch(&self, index: Option<usize>, round: u64) -> Result<Option<Answer>, String>;

    /// Closes the open round: its number, how many sent, and the log line's fields.
    fn close(&mut self, timed_out: bool) -> Result<(u64, usize, serde_json::Value), String>;

    /// The checkpoint's bytes.
    fn encode(&self) -> Result<Vec<u8>, String>;

    /// FedCollab: the solved structure (`fedcollab.json`), once solved.
    fn solved(&self) -> Option<&Solved> {
        None
    }

    /// The model silo `index` is scored with now: FedDisco's global, the last aggregate of
    /// HCCT's group, FedSaC's personalised model (with `score = "trained"`, the last model
    /// the silo trained); `None` for FedCollab, whose models never reach the coordinator.
    fn scored(&self, _index: usize) -> Option<Arc<Vec<f32>>> {
        None
    }
}

/// FedDisco's server with the weighting it aggregates with and its defences.
pub struct Disco {
    /// The round state.
    pub state: ServerState,
    /// The weighting.
    pub params: Params,
    /// The defences against members' lies.
    pub robust: Robust,
}

impl CoordAlgorithm for Disco {
    fn round(&self) -> u64 {
        self.state.round
    }

    fn registered(&self) -> usize {
        self.state.reports.len()
    }

    fn clock_may_run(&self) -> bool {
        !self.state.reports.is_empty()
    }

    fn plan_out(&self) -> bool {
        true
    }

    fn complete(&self, nodes: usize) -> bool {
        self.state.reports.len() >= nodes
    }

    fn close_joining(&mut self) -> Result<Vec<usize>, String> {
        Err("feddisco has no joining to close".into())
    }

    fn num_params(&self) -> usize {
        self.state.global.len()
    }

    fn register(&mut self, who: &str, _index: Option<usize>, req: &Request) -> Result<(), String> {
        match req {
            Request::Register {
                n_train,
                discrepancy,
            } => {
                self.state.register(
                    who,
                    DiscoReport {
                        num_samples: *n_train,
                        discrepancy: *discrepancy,
                    },
                );
                Ok(())
            }
            _ => Err("this coordinator runs feddisco: register with (n_train, discrepancy)".into()),
        }
    }

    fn update(&mut self, who: &str, _index: Option<usize>, req: Request) -> Result<bool, String> {
        match req {
            Request::Update { round, params, .. } => self.state.update(who, round, params),
            Request::Distances { .. } => Err(DISTANCES_ARE_FEDCOLLABS.into()),
            _ => Err(SEND_A_MODEL.into()),
        }
    }

    fn waiting(&self, _names: &[String]) -> Vec<String> {
        self.state.waiting()
    }

    fn fetch(&self, _index: Option<usize>, round: u64) -> Result<Option<Answer>, String> {
        Ok(match self.state.fetch(round) {
            FetchAnswer::Now { round, params } => Some(Answer::Global { round, params }),
            FetchAnswer::Hold => None,
        })
    }

    fn close(&mut self, timed_out: bool) -> Result<(u64, usize, serde_json::Value), String> {
        let l = self.state.close(&self.params, &self.robust, timed_out)?;
        let v = serde_json::to_value(&l).map_err(|e| e.to_string())?;
        Ok((l.round, l.peers.len(), v))
    }

    fn encode(&self) -> Result<Vec<u8>, String> {
        self.state.encode()
    }

    fn scored(&self, _index: usize) -> Option<Arc<Vec<f32>>> {
        Some(self.state.global.clone())
    }
}

impl CoordAlgorithm for HcctServer {
    fn round(&self) -> u64 {
        HcctServer::round(self)
    }

    fn registered(&self) -> usize {
        HcctServer::registered(self)
    }

    fn clock_may_run(&self) -> bool {
        self.ready()
    }

    fn plan_out(&self) -> bool {
        self.ready()
    }

    fn missing(&self) -> Vec<usize> {
        if self.ready() {
            Vec::new()
        } else {
            HcctServer::missing(self)
        }
    }

    fn left_out(&self, index: usize) -> bool {
        HcctServer::left_out(self, index)
    }

    fn may_close_joining(&self) -> bool {
        HcctServer::may_close_joining(self)
    }

    fn close_joining(&mut self) -> Result<Vec<usize>, String> {
        HcctServer::close_joining(self)
    }

    fn num_params(&self) -> usize {
        HcctServer::num_params(self)
    }

    fn register(&mut self, _who: &str, index: Option<usize>, req: &Request) -> Result<(), String> {
        match req {
            Request::Join { n_train } => {
                HcctServer::register(self, index.ok_or(NOT_A_SILO)?, *n_train)
            }
            _ => Err("this coordinator runs hcct: join with n_train".into()),
        }
    }

    fn update(&mut self, _who: &str, index: Option<usize>, req: Request) -> Result<bool, String> {
        match req {
            Request::Update { round, params, .. } => {
                HcctServer::update(self, index.ok_or(NOT_A_SILO)?, round, params)
            }
            Request::Distances { .. } => Err(DISTANCES_ARE_FEDCOLLABS.into()),
            _ => Err(SEND_A_MODEL.into()),
        }
    }

    fn waiting(&self, names: &[String]) -> Vec<String> {
        named(HcctServer::waiting(self), names)
    }

    fn fetch(&self, index: Option<usize>, round: u64) -> Result<Option<Answer>, String> {
        Ok(
            match HcctServer::fetch(self, index.ok_or(NOT_A_SILO)?, round)? {
                hcct_server::FetchAnswer::Now { round, params } => {
                    Some(Answer::Global { round, params })
                }
                hcct_server::FetchAnswer::Hold => None,
                hcct_server::FetchAnswer::Alone => Some(Answer::Alone),
            },
        )
    }

    fn close(&mut self, timed_out: bool) -> Result<(u64, usize, serde_json::Value), String> {
        let l = HcctServer::close(self, timed_out)?;
        let v = serde_json::to_value(&l).map_err(|e| e.to_string())?;
        Ok((l.round, l.senders.len(), v))
    }

    fn encode(&self) -> Result<Vec<u8>, String> {
        HcctServer::encode(self)
    }

    fn scored(&self, index: usize) -> Option<Arc<Vec<f32>>> {
        HcctServer::model(self, index)
    }
}

impl CoordAlgorithm for FedsacServer {
    fn round(&self) -> u64 {
        FedsacServer::round(self)
    }

    fn registered(&self) -> usize {
        FedsacServer::registered(self)
    }

    fn clock_may_run(&self) -> bool {
        self.ready()
    }

    fn plan_out(&self) -> bool {
        self.ready()
    }

    fn missing(&self) -> Vec<usize> {
        if self.ready() {
            Vec::new()
        } else {
            FedsacServer::missing(self)
        }
    }

    fn left_out(&self, index: usize) -> bool {
        FedsacServer::left_out(self, index)
    }

    fn may_close_joining(&self) -> bool {
        FedsacServer::may_close_joining(self)
    }

    fn close_joining(&mut self) -> Result<Vec<usize>, String> {
        FedsacServer::close_joining(self)
    }

    fn num_params(&self) -> usize {
        FedsacServer::num_params(self)
    }

    fn register(&mut self, _who: &str, index: Option<usize>, req: &Request) -> Result<(), String> {
        match req {
            Request::Join { n_train } => {
                FedsacServer::register(self, index.ok_or(NOT_A_SILO)?, *n_train)
            }
            _ => Err("this coordinator runs fedsac: join with n_train".into()),
        }
    }

    fn update(&mut self, _who: &str, index: Option<usize>, req: Request) -> Result<bool, String> {
        match req {
            Request::Contribute {
                round,
                params,
                subspace,
            } => FedsacServer::update(self, index.ok_or(NOT_A_SILO)?, round, params, subspace),
            _ => Err("this coordinator runs fedsac: contribute a model and a subspace".into()),
        }
    }

    fn waiting(&self, names: &[String]) -> Vec<String> {
        named(FedsacServer::waiting(self), names)
    }

    fn fetch(&self, index: Option<usize>, round: u64) -> Result<Option<Answer>, String> {
        Ok(
            match FedsacServer::fetch(self, index.ok_or(NOT_A_SILO)?, round)? {
                fedsac_server::FetchAnswer::Now(a) => Some(Answer::Assigned {
                    round: a.round,
                    params: a.params,
                    direction: a.direction,
                    train: a.train,
                }),
                fedsac_server::FetchAnswer::Hold => None,
                fedsac_server::FetchAnswer::Alone => Some(Answer::Alone),
            },
        )
    }

    fn close(&mut self, timed_out: bool) -> Result<(u64, usize, serde_json::Value), String> {
        let l = FedsacServer::close(self, timed_out)?;
        let v = serde_json::to_value(&l).map_err(|e| e.to_string())?;
        Ok((l.round, l.senders.len(), v))
    }

    fn encode(&self) -> Result<Vec<u8>, String> {
        FedsacServer::encode(self)
    }

    fn scored(&self, index: usize) -> Option<Arc<Vec<f32>>> {
        FedsacServer::scored(self, index)
    }
}

/// FedCollab has no rounds at the coordinator: it plans, collects distances and solves.
impl CoordAlgorithm for FedCollabServer {
    fn round(&self) -> u64 {
        0
    }

    fn registered(&self) -> usize {
        FedCollabServer::registered(self)
    }

    fn clock_may_run(&self) -> bool {
        false
    }

    fn plan_out(&self) -> bool {
        self.ready()
    }

    fn missing(&self) -> Vec<usize> {
        if self.ready() {
            Vec::new()
        } else {
            FedCollabServer::missing(self)
        }
    }

    fn left_out(&self, index: usize) -> bool {
        FedCollabServer::left_out(self, index)
    }

    fn may_close_joining(&self) -> bool {
        FedCollabServer::may_close_joining(self)
    }

    fn close_joining(&mut self) -> Result<Vec<usize>, String> {
        FedCollabServer::close_joining(self)
    }

    /// No model reaches a FedCollab coordinator.
    fn num_params(&self) -> usize {
        0
    }

    fn register(&mut self, _who: &str, index: Option<usize>, req: &Request) -> Result<(), String> {
        match req {
            Request::Join { n_train } => {
                FedCollabServer::register(self, index.ok_or(NOT_A_SILO)?, *n_train)
            }
            _ => Err("this coordinator runs fedcollab: join with n_train".into()),
        }
    }

    fn update(&mut self, _who: &str, index: Option<usize>, req: Request) -> Result<bool, String> {
        match req {
            Request::Distances { pairs } => self.report(index.ok_or(NOT_A_SILO)?, pairs),
            _ => Err(
                "this coordinator runs fedcollab: it takes distances; models stay within \
                 the coalitions"
                    .into(),
            ),
        }
    }

    /// No rounds: nobody is awaited.
    fn waiting(&self, _names: &[String]) -> Vec<String> {
        Vec::new()
    }

    fn fetch(&self, index: Option<usize>, round: u64) -> Result<Option<Answer>, String> {
        Ok(
            match FedCollabServer::fetch(self, index.ok_or(NOT_A_SILO)?, round)? {
                fedcollab_server::FetchAnswer::Hold => None,
                fedcollab_server::FetchAnswer::Plan {
                    target,
                    nodes,
                    members,
                } => Some(Answer::DiscPlan {
                    target,
                    nodes,
                    members,
                }),
                fedcollab_server::FetchAnswer::Coalition { members, sizes } => {
                    Some(Answer::Coalition { members, sizes })
                }
            },
        )
    }

    fn close(&mut self, _timed_out: bool) -> Result<(u64, usize, serde_json::Value), String> {
        Err("fedcollab has no rounds to close".into())
    }

    fn encode(&self) -> Result<Vec<u8>, String> {
        FedCollabServer::encode(self)
    }

    fn solved(&self) -> Option<&Solved> {
        FedCollabServer::solved(self)
    }
}

/// Silo indices by name (an index past `names` keeps its number, so it stays distinct).
fn named(indices: Vec<usize>, names: &[String]) -> Vec<String> {
    indices
        .into_iter()
        .map(|i| names.get(i).cloned().unwrap_or_else(|| format!("silo-{i}")))
        .collect()
}
