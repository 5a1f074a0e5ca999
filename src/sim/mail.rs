//! The messages between the simulator's round engines, as the nodes' protocol carries them.
//!
//! Owns: turning a [`Round`]'s outgoing actions into messages ([`Msg::from_action`]), handing a
//! message to the receiving engine ([`deliver`]), and saying which request a lost message
//! belonged to ([`Msg::request`]).
//! Must not: decide when or whether a message arrives (the two networks beside it do:
//! [`super::engines`] at once, [`super::network`] on a virtual clock with faults), or anything
//! about a round (the engines do).

use crate::core::Rejection;
use crate::core::round::{Action, ReqId, Round};
use crate::ids::NodeId;
use std::sync::Arc;
use std::time::Instant;

/// An inbound model request's handle: the requester and its name for the request.
pub(crate) type Handle = (usize, ReqId);

/// A message between two engines.
pub(crate) enum Msg {
    Pull {
        from: usize,
        round: u64,
        req: ReqId,
    },
    Notice {
        from: usize,
        round: u64,
        req: ReqId,
    },
    Fetch {
        from: usize,
        version: u64,
        req: ReqId,
    },
    Finished {
        from: usize,
        req: ReqId,
    },
    Model {
        req: ReqId,
        version: u64,
        params: Arc<Vec<f32>>,
    },
    Ack {
        req: ReqId,
    },
    Gradient {
        from: usize,
        version: u64,
        grad: Vec<f32>,
    },
    Skip {
        from: usize,
        version: u64,
    },
}

impl Msg {
    /// The message an action of engine `from` sends, with its receiver; any other action
    /// (a job, a report, a checkpoint, a log line) comes back as it is.
    // The `Err` is the caller's own action handed back (moved), not an error to propagate.
    #[allow(clippy::result_large_err)]
    pub(crate) fn from_action(
        from: usize,
        action: Action<Handle>,
    ) -> Result<(usize, Msg), Action<Handle>> {
        Ok(match action {
            Action::Pull { req, to, round } => (to.index(), Msg::Pull { from, round, req }),
            Action::Notice { req, to, round } => (to.index(), Msg::Notice { from, round, req }),
            Action::Fetch { req, to, version } => (to.index(), Msg::Fetch { from, version, req }),
            Action::Finished { req, to } => (to.index(), Msg::Finished { from, req }),
            Action::Serve {
                handle: (requester, req),
                version,
                params,
                ..
            } => (
                requester,
                Msg::Model {
                    req,
                    version,
                    params,
                },
            ),
            Action::Gradient {
                to, version, grad, ..
            } => (
                to.index(),
                Msg::Gradient {
                    from,
                    version,
                    grad,
                },
            ),
            Action::Skip { to, version } => (to.index(), Msg::Skip { from, version }),
            other => return Err(other),
        })
    }

    /// The request this message (sent by `from` to `to`) belongs to, as `(requester, request)`;
    /// `None` for the one-way gradients and skips.
    pub(crate) fn request(&self, from: usize, to: usize) -> Option<(usize, ReqId)> {
        match *self {
            Msg::Pull { req, .. }
            | Msg::Notice { req, .. }
            | Msg::Fetch { req, .. }
            | Msg::Finished { req, .. } => Some((from, req)),
            Msg::Model { req, .. } | Msg::Ack { req } => Some((to, req)),
            Msg::Gradient { .. } | Msg::Skip { .. } => None,
        }
    }

    /// A model or a gradient: what a node's impairment holds back or drops
    /// (`net::impair` routes exactly these two).
    pub(crate) fn is_payload(&self) -> bool {
        matches!(self, Msg::Model { .. } | Msg::Gradient { .. })
    }

    /// What it costs a link, as a node's message of the same kind does.
    pub(crate) fn wire_bytes(&self) -> u64 {
        crate::faults::link::wire_bytes(match self {
            Msg::Model { params, .. } => params.len(),
            Msg::Gradient { grad, .. } => grad.len(),
            _ => 0,
        })
    }
}

/// A gradient or a skip an engine's inbox refused: its sender and why.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) from: usize,
    pub(crate) why: Rejection,
}

/// Hands `msg` to engine `r`; returns the answer it calls for (an acknowledgement, to its
/// sender), or why the engine refused it.
pub(crate) fn deliver(
    r: &mut Round<Handle>,
    now: Instant,
    msg: Msg,
) -> Result<Option<(usize, Msg)>, Refused> {
    match msg {
        Msg::Pull { from, round, req } => {
            r.handle_pull(now, NodeId(from as u32), round, (from, req))
        }
        Msg::Notice { from, round, req } => {
            r.handle_notice(now, NodeId(from as u32), round);
            return Ok(Some((from, Msg::Ack { req })));
        }
        Msg::Fetch { from, version, req } => {
            r.handle_fetch(now, NodeId(from as u32), version, (from, req))
        }
        Msg::Finished { from, req } => {
            r.handle_peer_finished(now, NodeId(from as u32));
            return Ok(Some((from, Msg::Ack { req })));
        }
        Msg::Model {
            req,
            version,
            params,
        } => r.handle_model(now, req, version, params),
        Msg::Ack { req } => r.handle_ack(req),
        Msg::Gradient {
            from,
            version,
            grad,
        } => r
            .handle_gradient(now, NodeId(from as u32), version, grad)
            .map_err(|why| Refused { from, why })?,
        Msg::Skip { from, version } => r
            .handle_skip(now, NodeId(from as u32), version)
            .map_err(|why| Refused { from, why })?,
    }
    Ok(None)
}
