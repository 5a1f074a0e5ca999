//! The node's Prometheus metrics (with the client libp2p's own metrics use) and a minimal
//! text endpoint for them.
//! Owns: metric definitions, the stable `reason` labels of rejected messages ([`Reason`]), and
//! serving `GET /metrics` on the configured local address.
//! Must not: compute what it reports or decide what is rejected; the codec and the round driver
//! set the values.

use crate::core::Rejection;
use crate::protocol::WireError;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Labels = Vec<(String, String)>;

/// Why a message from a peer was dropped: the `reason` label of
/// `federico_rejected_messages_total`. The labels are part of the node's interface (dashboards
/// and alerts key on them): add new ones, never rename.
///
/// There is no `wrong_version`: frames carry no version, the protocol names do
/// (`/federico/model/2`), and a peer speaking another version fails protocol negotiation before
/// any frame reaches the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// `truncated`: the stream ended inside a frame (codec).
    Truncated,
    /// `oversized`: a frame announced more than `max_message_mib` (codec, before allocation).
    Oversized,
    /// `garbage`: the bytes are not a message of the protocol, or bytes follow it (codec).
    Garbage,
    /// `wrong_shape`: a model or gradient with another number of parameters.
    WrongShape,
    /// `wrong_fingerprint`: a model or gradient of another architecture.
    WrongFingerprint,
    /// `non_finite`: NaN or infinity in a model, a gradient or its weight.
    NonFinite,
    /// `duplicate`: a second gradient or skip from one sender for one version.
    Duplicate,
    /// `stale`: a gradient or skip for a version older than the owner's.
    Stale,
    /// `future_version`: a gradient or skip for a version the owner has not reached.
    FutureVersion,
    /// `unexpected`: a gradient or skip from a peer not served that version, or a response of
    /// the wrong kind (an acknowledgement to a pull, a model to a notice).
    Unexpected,
    /// `not_a_member`: a connection or message from a peer outside the manifest.
    NotAMember,
    /// `over_budget`: a frame refused because the bytes being received, all peers and streams
    /// together, would pass the node's receive budget (codec).
    OverBudget,
    /// `too_many_streams`: a request refused because its sender already had as many requests
    /// being read as a peer may (codec).
    TooManyStreams,
    /// `connection_limit`: a connection over the caps (pending handshakes, connections per
    /// peer, in total).
    ConnectionLimit,
}

impl Reason {
    /// Every reason, in the order of the docs.
    #[cfg(test)]
    pub(crate) const ALL: [Reason; 14] = [
        Reason::Truncated,
        Reason::Oversized,
        Reason::Garbage,
        Reason::WrongShape,
        Reason::WrongFingerprint,
        Reason::NonFinite,
        Reason::Duplicate,
        Reason::Stale,
        Reason::FutureVersion,
        Reason::Unexpected,
        Reason::NotAMember,
        Reason::OverBudget,
        Reason::TooManyStreams,
        Reason::ConnectionLimit,
    ];

    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Reason::Truncated => "truncated",
            Reason::Oversized => "oversized",
            Reason::Garbage => "garbage",
            Reason::WrongShape => "wrong_shape",
            Reason::WrongFingerprint => "wrong_fingerprint",
            Reason::NonFinite => "non_finite",
            Reason::Duplicate => "duplicate",
            Reason::Stale => "stale",
            Reason::FutureVersion => "future_version",
            Reason::Unexpected => "unexpected",
            Reason::NotAMember => "not_a_member",
            Reason::OverBudget => "over_budget",
            Reason::TooManyStreams => "too_many_streams",
            Reason::ConnectionLimit => "connection_limit",
        }
    }
}

impl From<&WireError> for Reason {
    fn from(e: &WireError) -> Self {
        match e {
            WireError::TooLarge { .. } => Reason::Oversized,
            WireError::Truncated { .. } => Reason::Truncated,
            WireError::Decode(_) | WireError::Trailing(_) => Reason::Garbage,
            WireError::Fingerprint { .. } => Reason::WrongFingerprint,
            WireError::Length { .. } => Reason::WrongShape,
            WireError::NonFinite(_) => Reason::NonFinite,
            WireError::OverBudget { .. } => Reason::OverBudget,
            WireError::TooManyStreams { .. } => Reason::TooManyStreams,
        }
    }
}

impl From<&Rejection> for Reason {
    fn from(r: &Rejection) -> Self {
        match r {
            Rejection::Stale { .. } => Reason::Stale,
            Rejection::FutureVersion { .. } => Reason::FutureVersion,
            Rejection::Unexpected => Reason::Unexpected,
            Rejection::Duplicate => Reason::Duplicate,
            Rejection::WrongLength { .. } => Reason::WrongShape,
            Rejection::NonFinite => Reason::NonFinite,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Handles to every metric the round driver updates.
#[derive(Clone, Default)]
pub(crate) struct Metrics {
    /// Rounds completed.
    pub(crate) rounds: Gauge,
    /// Peers with a live connection.
    pub(crate) connected_peers: Gauge,
    /// Peers currently excluded from sampling.
    pub(crate) suspects: Gauge,
    /// Encoded message bytes by protocol and direction (libp2p's bandwidth metrics count the
    /// transport bytes beside them).
    pub(crate) message_bytes: Family<Labels, Counter>,
    /// Messages dropped before reaching the core, by reason.
    pub(crate) rejected: Family<Labels, Counter>,
    /// w_ij by peer.
    pub(crate) weight: Family<Labels, Gauge<f64, AtomicU64>>,
    /// L̂_ij by peer.
    pub(crate) tracked_loss: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Test accuracy of the inference mixture at the last evaluation.
    pub(crate) test_accuracy: Gauge<f64, AtomicU64>,
    /// Encoded message bytes sent, all protocols.
    pub(crate) sent: Counter,
    /// Checkpoint writes that failed (each retried at the next round's write).
    pub(crate) checkpoint_failures: Counter,
    /// Times a peer was disconnected and blocked for repeated bad frames.
    pub(crate) blocked_peers: Counter,
    /// Bytes of frames being received right now, all peers and streams (the receive budget's use).
    pub(crate) receiving_bytes: Gauge,
    /// Under `[privacy]`: ε spent so far against everyone (and against each peer: under this
    /// recipe every release reaches every member, `docs/privacy.md`).
    pub(crate) privacy_epsilon: Gauge<f64, AtomicU64>,
    /// Under `[privacy]`: 1 once the budget is spent and the silo releases nothing new.
    pub(crate) privacy_exhausted: Gauge,
    /// Members connected now, by `path`: `direct` (at least one direct connection) or
    /// `relayed` (only through a circuit relay of the manifest).
    pub(crate) member_connections: Family<Labels, Gauge>,
    /// Hole punches (DCUtR) by `result`: `direct` (a relayed connection became direct) or
    /// `failed`.
    pub(crate) hole_punches: Family<Labels, Counter>,
    /// Reservations held now on the manifest's relays.
    pub(crate) relay_reservations: Gauge,
}

impl Metrics {
    /// Registers every metric under the `federico` prefix.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("federico");
        r.register("rounds", "Rounds completed", m.rounds.clone());
        r.register(
            "connected_peers",
            "Peers with a live connection",
            m.connected_peers.clone(),
        );
        r.register(
            "suspects",
            "Peers excluded from sampling after repeated failures",
            m.suspects.clone(),
        );
        r.register(
            "message_bytes",
            "Encoded message bytes by protocol and direction",
            m.message_bytes.clone(),
        );
        r.register(
            "rejected_messages",
            "Messages dropped before the core, by reason",
            m.rejected.clone(),
        );
        r.register(
            "blocked_peers",
            "Peers disconnected and blocked for repeated bad frames",
            m.blocked_peers.clone(),
        );
        r.register(
            "receiving_bytes",
            "Bytes of frames being received now, all peers and streams",
            m.receiving_bytes.clone(),
        );
        r.register(
            "weight",
            "Collaborator weight w_ij by peer",
            m.weight.clone(),
        );
        r.register(
            "tracked_loss",
            "Tracked (EMA) loss by peer",
            m.tracked_loss.clone(),
        );
        r.register(
            "test_accuracy",
            "Test accuracy at the last evaluation",
            m.test_accuracy.clone(),
        );
        r.register(
            "checkpoint_failures",
            "Checkpoint writes that failed (retried at the next round)",
            m.checkpoint_failures.clone(),
        );
        r.register(
            "members_by_path",
            "Members connected now, by path (direct, or relayed only)",
            m.member_connections.clone(),
        );
        r.register(
            "hole_punches",
            "Hole punches by result (direct or failed)",
            m.hole_punches.clone(),
        );
        r.register(
            "relay_reservations",
            "Reservations held now on the manifest's relays",
            m.relay_reservations.clone(),
        );
        m
    }

    /// Registers the privacy metrics (a node under `[privacy]` only: without it nothing is
    /// private, and a 0 would read as nothing spent).
    pub(crate) fn register_privacy(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("federico");
        r.register(
            "privacy_epsilon",
            "Epsilon spent so far against everyone (equal to that against each peer)",
            self.privacy_epsilon.clone(),
        );
        r.register(
            "privacy_exhausted",
            "1 once the privacy budget is spent: nothing new is released",
            self.privacy_exhausted.clone(),
        );
    }

    pub(crate) fn count_bytes(&self, protocol: &str, direction: &str, n: usize) {
        if direction == "out" {
            self.sent.inc_by(n as u64);
        }
        self.message_bytes
            .get_or_create(&vec![
                ("protocol".into(), protocol.into()),
                ("direction".into(), direction.into()),
            ])
            .inc_by(n as u64);
    }

    /// Counts one rejected message. The caller logs it, naming the peer.
    pub(crate) fn reject(&self, reason: Reason) {
        self.rejected
            .get_or_create(&vec![("reason".into(), reason.label().into())])
            .inc();
    }

    pub(crate) fn set_peer(&self, peer: &str, weight: f64, tracked: f64) {
        let l = vec![("peer".into(), peer.into())];
        self.weight.get_or_create(&l).set(weight);
        self.tracked_loss.get_or_create(&l).set(tracked);
    }
}

/// Stream bytes sent, from libp2p's bandwidth metrics in `registry` (it counts what goes through
/// the multiplexed streams: our frames plus protocol negotiation, not Noise or Yamux framing).
pub(crate) fn stream_bytes_sent(registry: &Registry) -> u64 {
    let mut text = String::new();
    if encode(&mut text, registry).is_err() {
        return 0;
    }
    text.lines()
        .filter(|l| {
            l.starts_with("libp2p_bandwidth_bytes_total{") && l.contains("direction=\"Outbound\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Serves the registry as Prometheus text on `listener` until the task is dropped. Any request
/// gets the metrics; this is a scrape endpoint, not a web server.
pub(crate) async fn serve(listener: tokio::net::TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            // Read the request head (bounded), then answer.
            let mut buf = vec![0u8; 4096];
            let mut seen = 0;
            while seen < buf.len() {
                match sock.read(&mut buf[seen..]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen += n,
                }
                if buf[..seen].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let mut body = String::new();
            if encode(&mut body, &registry).is_err() {
                return;
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_labels_are_distinct_snake_case_and_reach_the_endpoint_text() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let mut seen = std::collections::BTreeSet::new();
        for r in Reason::ALL {
            let l = r.label();
            assert!(l.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{l}");
            assert!(seen.insert(l), "{l} twice");
            m.reject(r);
        }
        m.reject(Reason::Stale);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("federico_rejected_messages_total{reason=\"stale\"} 2"),
            "{text}"
        );
    }
}
