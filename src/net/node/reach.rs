//! How a node is reached across NAT: its reservations on the manifest's circuit relays (made
//! again when a relay drops them, as a relay restart does), which of its member connections run
//! through a relay and which are direct, and what hole punching (DCUtR) made of them, in the
//! log and the metrics.
//!
//! Owns: listening through the relays, the `path` of each member connection, the log lines and
//! metrics of reservations and hole punches.
//! Must not: decide anything about rounds or count a relay as a member: a relay carries
//! circuits and is admitted beside the members, nothing more.

use super::Driver;
use libp2p::core::ConnectedPoint;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{PeerId, core::transport::ListenerId, dcutr, relay};
use std::collections::HashMap;
use tracing::{debug, info, warn};

/// What [`Driver`] knows of its reachability.
#[derive(Default)]
pub(super) struct Reach {
    /// The relay listeners open now: the manifest index of their relay.
    listeners: HashMap<ListenerId, usize>,
    /// The relays a reservation is held on now (manifest index).
    reserved: Vec<bool>,
    /// The relays a refused or failed request was already reported for (until one succeeds:
    /// the request is repeated every few seconds and logged once).
    reported: Vec<bool>,
    /// Each open member connection: the peer and whether it runs through a relay.
    paths: HashMap<ConnectionId, (PeerId, bool)>,
}

fn path_name(relayed: bool) -> &'static str {
    if relayed { "relayed" } else { "direct" }
}

impl Driver {
    /// Whether `peer` is one of the manifest's relays.
    pub(super) fn is_relay(&self, peer: &PeerId) -> bool {
        self.manifest.relays.iter().any(|r| &r.peer_id == peer)
    }

    /// Listens through every relay of the manifest that has no listener now (at start, and
    /// again after a relay dropped the reservation: the listener closes then).
    pub(super) fn listen_on_relays(&mut self) {
        let relays = self.manifest.relays.clone();
        self.reach.reserved.resize(relays.len(), false);
        self.reach.reported.resize(relays.len(), false);
        for (i, r) in relays.iter().enumerate() {
            // One reservation per relay: a relay listed once per transport is reserved on
            // through its first entry (a second listener would replace the first).
            if relays[..i].iter().any(|o| o.peer_id == r.peer_id)
                || self.reach.listeners.values().any(|&j| j == i)
            {
                continue;
            }
            let circuit = r.addr.clone().with(Protocol::P2pCircuit);
            match self.swarm.listen_on(circuit.clone()) {
                Ok(id) => {
                    self.reach.listeners.insert(id, i);
                    debug!(relay = %circuit, "asking the relay for a reservation");
                }
                Err(e) => warn!(relay = %circuit, "cannot listen through the relay: {e}"),
            }
        }
    }

    /// A listener closed: a relay's, when the relay refused, dropped or lost the reservation
    /// (it is asked again on the next redial tick).
    pub(super) fn note_listener_closed(
        &mut self,
        id: ListenerId,
        reason: Result<(), std::io::Error>,
    ) {
        if let Some(i) = self.reach.listeners.remove(&id) {
            let relay = &self.manifest.relays[i].addr;
            let why = reason.map_or_else(|e| format!(" ({e})"), |()| String::new());
            if self.reach.reserved[i] {
                warn!(%relay, "reservation on the relay lost{why}; asking again");
            } else if !self.reach.reported[i] {
                warn!(
                    %relay,
                    "no reservation on the relay{why}: it refused this node (not in its \
                     manifest?) or cannot be reached; asking again every 5 s"
                );
            } else {
                debug!(%relay, "no reservation on the relay{why}; asking again");
            }
            self.reach.reported[i] = true;
            self.reach.reserved[i] = false;
            self.show_reservations();
        }
    }

    /// A connection to a member opened: its path, counted and, through a relay, logged.
    pub(super) fn note_connection(&mut self, id: ConnectionId, peer: PeerId, at: &ConnectedPoint) {
        // (An inbound circuit's remote address is a bare `/p2p/<id>`: libp2p checks the local
        // one, the relay's `/p2p-circuit` address, for a listener.)
        let relayed = at.is_relayed();
        self.reach.paths.insert(id, (peer, relayed));
        if relayed {
            info!(%peer, "connected through a relay");
        }
        self.show_paths();
    }

    /// A connection closed.
    pub(super) fn note_closed(&mut self, id: ConnectionId) {
        if self.reach.paths.remove(&id).is_some() {
            self.show_paths();
        }
    }

    fn show_paths(&self) {
        let (direct, relayed) = self.paths();
        for (relayed, n) in [(false, direct), (true, relayed)] {
            self.metrics
                .member_connections
                .get_or_create(&vec![("path".into(), path_name(relayed).into())])
                .set(n as i64);
        }
    }

    fn show_reservations(&self) {
        let n = self.reach.reserved.iter().filter(|&&r| r).count();
        self.metrics.relay_reservations.set(n as i64);
    }

    pub(super) fn handle_relay_event(&mut self, e: relay::client::Event) {
        match e {
            relay::client::Event::ReservationReqAccepted {
                relay_peer_id,
                renewal,
                ..
            } => {
                // A relay may be listed once per transport: every entry of it holds now.
                for (i, r) in self.manifest.relays.iter().enumerate() {
                    if r.peer_id == relay_peer_id {
                        self.reach.reserved[i] = true;
                        self.reach.reported[i] = false;
                    }
                }
                if !renewal {
                    info!(relay = %relay_peer_id, "reachable through the relay");
                }
                self.show_reservations();
            }
            relay::client::Event::OutboundCircuitEstablished { relay_peer_id, .. } => {
                debug!(relay = %relay_peer_id, "circuit opened through the relay");
            }
            relay::client::Event::InboundCircuitEstablished { src_peer_id, .. } => {
                debug!(from = %src_peer_id, "circuit accepted through a relay");
            }
        }
    }

    pub(super) fn handle_dcutr_event(&mut self, e: dcutr::Event) {
        let result = match &e.result {
            Ok(_) => {
                info!(peer = %e.remote_peer_id, "hole punched: the connection is direct now");
                "direct"
            }
            Err(err) => {
                info!(peer = %e.remote_peer_id, "hole punch failed ({err}); staying on the relay");
                "failed"
            }
        };
        self.metrics
            .hole_punches
            .get_or_create(&vec![("result".into(), result.into())])
            .inc();
    }

    /// `(direct, relayed)`: members connected now with at least one direct connection, and
    /// members connected through relays only.
    pub(super) fn paths(&self) -> (usize, usize) {
        let mut direct: HashMap<PeerId, bool> = HashMap::new();
        for (peer, relayed) in self.reach.paths.values() {
            *direct.entry(*peer).or_default() |= !relayed;
        }
        let d = direct.values().filter(|&&d| d).count();
        (d, direct.len() - d)
    }
}
