//! The silo side of `/federico/coord/2`, shared by the coordinated node ([`super::coordinated`])
//! and the FedCollab node ([`super::collab_node`]).
//! Owns: the reply a request made of a swarm task waits on ([`Reply`]), why an exchange gave
//! no answer ([`ExchangeError`]), and routing the coordinator exchange's events to those
//! replies ([`route_coord_event`]).
//! Must not: decide what a node does with an answer (its round loop does), retry (the callers'
//! budgets do), or serve coordinator requests (nodes serve none).

use super::behaviour::Exchange;
use crate::protocol::{CoordRequest, CoordResponse};
use libp2p::request_response::{self as rr, OutboundRequestId};
use std::collections::HashMap;
use tokio::sync::oneshot;

/// Why a request made of a swarm task got no answer. A refusal is an answer
/// (`CoordResponse::Error`), not one of these.
#[derive(Debug, thiserror::Error)]
pub(super) enum ExchangeError {
    /// The request failed in libp2p (dial, timeout, connection closed, protocol unsupported).
    #[error(transparent)]
    Failed(#[from] rr::OutboundFailure),
    /// The request named a silo index the node does not know.
    #[error("no silo {0}")]
    NoSilo(usize),
    /// The swarm task is gone (the node is shutting down).
    #[error("swarm task ended")]
    SwarmEnded,
    /// No answer within the caller's limit.
    #[error("timed out")]
    TimedOut,
}

/// Where the swarm task sends the answer to one coordinator request.
pub(super) type Reply = oneshot::Sender<Result<CoordResponse, ExchangeError>>;

/// One event of a node's coordinator exchange: an answer or a failure goes to the request
/// waiting for it; a request is refused (nodes serve none).
pub(super) fn route_coord_event(
    ev: rr::Event<CoordRequest, CoordResponse>,
    pending: &mut HashMap<OutboundRequestId, Reply>,
    exchange: &mut Exchange<CoordRequest, CoordResponse>,
) {
    match ev {
        rr::Event::Message {
            message:
                rr::Message::Response {
                    request_id,
                    response,
                },
            ..
        } => {
            if let Some(r) = pending.remove(&request_id) {
                let _ = r.send(Ok(response));
            }
        }
        rr::Event::OutboundFailure {
            request_id, error, ..
        } => {
            if let Some(r) = pending.remove(&request_id) {
                let _ = r.send(Err(ExchangeError::Failed(error)));
            }
        }
        rr::Event::Message {
            message: rr::Message::Request { channel, .. },
            ..
        } => {
            let _ = exchange.send_response(
                channel,
                CoordResponse::Error {
                    reason: "nodes serve no coordinator requests".into(),
                },
            );
        }
        _ => {}
    }
}
