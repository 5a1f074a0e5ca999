//! Swarm events into the round engine's inputs.
//!
//! Owns: who a libp2p peer is (a member, a late joiner of an open federation, or an outsider
//! refused with a count and a rate-limited warning), the wire-level checks of what arrives (a model's
//! fingerprint, length and values; a gradient's fingerprint and weight) before the engine sees
//! it, acknowledgements, and the log lines and metrics of refusals.
//! Must not: keep round state or decide what a message means for the round: the engine does.

use super::Driver;
use crate::core::round::Asked;
use crate::ids::NodeId;
use crate::net::behaviour::BehaviourEvent;
use crate::net::intake;
use crate::net::limits;
use crate::net::metrics::Reason;
use crate::protocol::{
    self as wire, GradientRequest, GradientResponse, ModelRequest, ModelResponse, WireError,
};
use libp2p::PeerId;
use libp2p::request_response::{self as rr, OutboundRequestId};
use libp2p::swarm::{DialError, ListenError, SwarmEvent};
use std::time::Instant;
use tracing::{debug, info, warn};

impl Driver {
    /// The node id of `peer`: a member's, a new one for a newcomer to an open federation, or
    /// none for an outsider.
    fn node_of(&mut self, peer: &PeerId) -> Option<NodeId> {
        if let Some(&n) = self.nodes.get(peer) {
            return Some(n);
        }
        if !self.manifest.open || self.is_relay(peer) {
            return None;
        }
        // Open federation: a new peer joins late, with the optimistic initial loss (spec §6).
        let n = self.round.handle_peer_joined();
        debug_assert_eq!(n.index(), self.peer_ids.len());
        self.peer_ids.push(*peer);
        self.nodes.insert(*peer, n);
        info!(%peer, node = %n, "a new peer joined the open federation");
        Some(n)
    }

    pub(super) fn handle_swarm(&mut self, event: SwarmEvent<BehaviourEvent>) {
        let now = Instant::now();
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                info!(%address, "listening");
            }
            SwarmEvent::ListenerClosed {
                listener_id,
                reason,
                ..
            } => self.note_listener_closed(listener_id, reason),
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                endpoint,
                ..
            } => {
                if let Some(n) = self.node_of(&peer_id) {
                    self.note_connection(connection_id, peer_id, &endpoint);
                    let starting = self.round.is_starting();
                    if self.round.handle_connected(now, n) {
                        debug!(peer = %n, "connected");
                        if starting {
                            // What a person starting silos by hand watches for.
                            info!(
                                "waiting for peers ({} of {} connected)",
                                self.round.connected(),
                                self.manifest.members.len().saturating_sub(1)
                            );
                        }
                    }
                    self.metrics
                        .connected_peers
                        .set(self.round.connected() as i64);
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                ..
            } => {
                self.note_closed(connection_id);
                if num_established > 0 {
                    return;
                }
                if let Some(&n) = self.nodes.get(&peer_id) {
                    self.round.handle_disconnected(now, n);
                    debug!(peer = %n, "disconnected");
                    self.metrics
                        .connected_peers
                        .set(self.round.connected() as i64);
                }
            }
            // A blocked peer: counted and logged (once per period) by the intake.
            SwarmEvent::IncomingConnectionError {
                error: ListenError::Denied { cause },
                ..
            }
            | SwarmEvent::OutgoingConnectionError {
                error: DialError::Denied { cause },
                ..
            } if intake::is_blocked(&cause) => {}
            SwarmEvent::IncomingConnectionError {
                error: ListenError::Denied { cause },
                send_back_addr,
                ..
            } => {
                let reason = if limits::exceeded(&cause) {
                    Reason::ConnectionLimit
                } else {
                    Reason::NotAMember
                };
                self.metrics.reject(reason);
                if let Some(held_back) = self.refused_in.allow(&(), now) {
                    warn!(from = %send_back_addr, %reason, held_back, "refused a connection: {cause}");
                }
            }
            SwarmEvent::OutgoingConnectionError {
                error: DialError::Denied { cause },
                peer_id,
                ..
            } => {
                if let Some(held_back) = self.refused_out.allow(&(), now) {
                    warn!(peer = ?peer_id, held_back, "refused to dial: {cause}");
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Ping(libp2p::ping::Event {
                peer,
                result: Err(e),
                ..
            })) => {
                debug!(%peer, "ping failed: {e}");
            }
            SwarmEvent::Behaviour(BehaviourEvent::RelayClient(e)) => self.handle_relay_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Dcutr(e)) => self.handle_dcutr_event(e),
            SwarmEvent::Behaviour(BehaviourEvent::Model(e)) => self.handle_model_event(now, e),
            SwarmEvent::Behaviour(BehaviourEvent::Gradient(e)) => {
                self.handle_gradient_event(now, e)
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(
                libp2p::identify::Event::Received { peer_id, info, .. },
            )) => {
                if let Some(&n) = self.nodes.get(&peer_id)
                    && info
                        .protocols
                        .iter()
                        .any(|p| p.as_ref() == wire::MODEL_PROTOCOL)
                {
                    self.round.handle_speaking(now, n);
                }
                for a in info.listen_addrs {
                    self.swarm.behaviour_mut().kad.add_address(&peer_id, a);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(libp2p::mdns::Event::Discovered(list))) => {
                for (p, a) in list {
                    self.swarm.add_peer_address(p, a);
                    if self.nodes.contains_key(&p) || self.manifest.open {
                        let _ = self.swarm.dial(p);
                    }
                }
            }
            _ => {}
        }
    }

    fn handle_model_event(&mut self, now: Instant, event: rr::Event<ModelRequest, ModelResponse>) {
        match event {
            rr::Event::Message {
                peer,
                message:
                    rr::Message::Request {
                        request, channel, ..
                    },
                ..
            } => {
                let Some(from) = self.node_of(&peer) else {
                    // Dropping the channel answers nothing.
                    self.metrics.reject(Reason::NotAMember);
                    warn!(%peer, reason = %Reason::NotAMember, "refused a model request from outside the manifest");
                    return;
                };
                match request {
                    ModelRequest::Pull { round } => {
                        self.round.handle_pull(now, from, round, channel)
                    }
                    ModelRequest::Notice { round } => {
                        self.round.handle_notice(now, from, round);
                        self.acknowledge(from, channel);
                    }
                    ModelRequest::Fetch { version } => {
                        self.round.handle_fetch(now, from, version, channel)
                    }
                    ModelRequest::Done => {
                        self.round.handle_peer_finished(now, from);
                        self.acknowledge(from, channel);
                    }
                }
            }
            rr::Event::Message {
                peer,
                message:
                    rr::Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => self.handle_model_response(now, peer, request_id, response),
            rr::Event::OutboundFailure {
                peer,
                request_id,
                error,
                ..
            } => {
                // A response the codec refused was logged and counted there.
                let reason = outbound_rejection(&error).map(Reason::from);
                let asked = self
                    .reqs
                    .remove(&request_id)
                    .and_then(|req| self.round.handle_failed(now, req));
                match asked {
                    Some(Asked::Pull { round, to }) => {
                        if let Some(held) = self.failed_pulls.allow(&to, now) {
                            warn!(
                                peer = %to,
                                round,
                                reason = reason.map(Reason::label),
                                earlier_failures_not_logged = held,
                                "pull failed (logged once a minute per peer): {error}"
                            );
                        }
                    }
                    Some(Asked::Fetch { to }) => {
                        warn!(peer = %to, reason = reason.map(Reason::label), "fetch failed: {error}");
                    }
                    _ => match reason {
                        Some(reason) => {
                            warn!(%peer, %reason, "refused the answer to a notice: {error}")
                        }
                        None => debug!("notice failed: {error}"),
                    },
                }
            }
            // A request the codec refused never gets here: the codec logs and counts it.
            rr::Event::InboundFailure { peer, error, .. } => {
                debug!(%peer, "inbound model request failed: {error}");
            }
            rr::Event::ResponseSent { .. } => {}
        }
    }

    /// An answer to one of our model requests: checked, then handed to the engine; a refused
    /// one counts as a failed request there (nothing of it is kept).
    fn handle_model_response(
        &mut self,
        now: Instant,
        peer: PeerId,
        request_id: OutboundRequestId,
        response: ModelResponse,
    ) {
        let req = self.reqs.remove(&request_id);
        let Some(from) = self.nodes.get(&peer).copied() else {
            if let Some(req) = req {
                self.round.forget(req);
            }
            self.metrics.reject(Reason::NotAMember);
            warn!(%peer, reason = %Reason::NotAMember, "refused a response from outside the manifest");
            return;
        };
        let asked = req.and_then(|r| self.round.asked(r).map(|a| (r, a)));
        match (response, asked) {
            (ModelResponse::Model(p), Some((req, Asked::Pull { .. } | Asked::Fetch { .. }))) => {
                if let Err(e) = p.check(self.fingerprint, self.num_params) {
                    let reason = Reason::from(&e);
                    self.metrics.reject(reason);
                    warn!(peer = %from, %reason, "refused a model: {e}");
                    self.round.handle_failed(now, req);
                } else {
                    self.round.handle_model(now, req, p.version, p.params);
                }
            }
            (ModelResponse::Ack, Some((req, Asked::Notice))) => self.round.handle_ack(req),
            (response, asked) => {
                // A model for a notice, an acknowledgement for a pull or a fetch, or an answer
                // to nothing we asked.
                let reason = Reason::Unexpected;
                self.metrics.reject(reason);
                let got = match response {
                    ModelResponse::Model(_) => "a model",
                    ModelResponse::Ack => "an acknowledgement",
                };
                let what = asked.map(|a| a.1);
                warn!(peer = %from, %reason, "refused {got} in answer to {what:?}");
                if let Some(req) = req {
                    self.round.handle_failed(now, req);
                }
            }
        }
    }

    fn handle_gradient_event(
        &mut self,
        now: Instant,
        event: rr::Event<GradientRequest, GradientResponse>,
    ) {
        match event {
            rr::Event::Message {
                peer,
                message:
                    rr::Message::Request {
                        request, channel, ..
                    },
                ..
            } => {
                let Some(from) = self.nodes.get(&peer).copied() else {
                    self.metrics.reject(Reason::NotAMember);
                    warn!(%peer, reason = %Reason::NotAMember, "refused a gradient from outside the manifest");
                    return;
                };
                let resp = match self.check_gradient(now, from, request) {
                    Ok(()) => GradientResponse::Accepted,
                    Err((reason, text)) => {
                        self.metrics.reject(reason);
                        // Late gradients are routine under faults (info); anything else is a
                        // warning. Both name the sender.
                        if reason == Reason::Stale {
                            info!(peer = %from, peer_id = %peer, %reason, "refused a gradient: {text}");
                        } else {
                            warn!(peer = %from, peer_id = %peer, %reason, "refused a gradient: {text}");
                        }
                        GradientResponse::Rejected { reason: text }
                    }
                };
                let _ = self
                    .swarm
                    .behaviour_mut()
                    .gradient
                    .send_response(channel, resp);
            }
            rr::Event::Message {
                message:
                    rr::Message::Response {
                        response: GradientResponse::Rejected { reason },
                        ..
                    },
                peer,
                ..
            } => {
                // The peer's words: shortened and escaped before they reach our log.
                let reason: String = reason.chars().take(200).collect();
                debug!(%peer, "our gradient was rejected: {reason:?}");
            }
            rr::Event::OutboundFailure { peer, error, .. } => {
                let reason = outbound_rejection(&error).map(Reason::from);
                warn!(%peer, reason = reason.map(Reason::label), "gradient not delivered: {error}");
            }
            _ => {}
        }
    }

    /// Every check runs before the engine's inbox is touched; the inbox's own checks leave it
    /// as it was when they refuse.
    fn check_gradient(
        &mut self,
        now: Instant,
        from: NodeId,
        request: GradientRequest,
    ) -> Result<(), (Reason, String)> {
        match request {
            GradientRequest::Gradient {
                version,
                fingerprint,
                weight,
                grad,
                ..
            } => {
                if fingerprint != self.fingerprint {
                    let e = WireError::Fingerprint {
                        got: fingerprint,
                        want: self.fingerprint,
                    };
                    Err((Reason::WrongFingerprint, e.to_string()))
                } else if !weight.is_finite() {
                    Err((Reason::NonFinite, format!("non-finite weight {weight}")))
                } else {
                    self.round
                        .handle_gradient(now, from, version, grad)
                        .map_err(|r| (Reason::from(&r), r.to_string()))
                }
            }
            GradientRequest::Skip { version } => self
                .round
                .handle_skip(now, from, version)
                .map_err(|r| (Reason::from(&r), r.to_string())),
        }
    }
}

/// The frame the codec refused on an outbound stream (the answer), if that is why it failed.
fn outbound_rejection(e: &rr::OutboundFailure) -> Option<&WireError> {
    match e {
        rr::OutboundFailure::Io(e) => wire::rejection(e),
        _ => None,
    }
}
