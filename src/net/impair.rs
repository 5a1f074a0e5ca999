//! Scheduled impairments of a node's own traffic: a straggler's added latency and message
//! loss (issue 4), set by `federico swarm` through the control channel.
//!
//! Owns: the current delay and loss settings, the node's stream of loss draws (what one draw
//! decides is [`crate::faults::link`], the simulator's rule), and the queue of messages held
//! back until they are due. It mirrors the simulator's
//! model (`sim::faults`): a delay holds back everything the silo *sends* (its models and its
//! gradients); a loss drops pulls, models and gradients, each with the given probability, to or
//! from the named peers. A lost message is never sent, so the other side waits out its
//! deadline, as on a real network; a lost answer is held unanswered for [`LOST_HOLD`] so the
//! requester sees a timeout, not an instant error.
//! Must not: touch the swarm or the core. The node's event loop asks [`Impairment::route`]
//! before it sends, and sends what [`Impairment::due`] gives back.

use crate::faults::link::{self, Fate};
use libp2p::PeerId;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// How long a lost answer is held before its channel is dropped: past any deadline, so the
/// requester has given up by then.
pub(crate) const LOST_HOLD: Duration = Duration::from_secs(120);

/// The longest delay the control channel accepts.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(3600);

/// What to do with one outgoing message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Send it now.
    Now,
    /// Hold it until then.
    At(Instant),
    /// It is lost.
    Lost,
}

/// A node's impairments and the messages they hold back.
pub(crate) struct Impairment<T> {
    delay: Duration,
    loss: f64,
    /// `None`: every peer.
    loss_peers: Option<HashSet<PeerId>>,
    rng: StdRng,
    held: Vec<(Instant, T)>,
    lost: u64,
    delayed: u64,
}

impl<T> Impairment<T> {
    /// No impairment; loss draws from `seed` (the node's fault stream).
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            delay: Duration::ZERO,
            loss: 0.0,
            loss_peers: None,
            rng: StdRng::seed_from_u64(seed),
            held: Vec::new(),
            lost: 0,
            delayed: 0,
        }
    }

    /// Sets the added latency of what this node sends (zero ends it).
    pub(crate) fn set_delay(&mut self, delay: Duration) {
        self.delay = delay.min(MAX_DELAY);
    }

    /// Drops `fraction` of messages to or from `peers` (empty: every peer); 0 ends it.
    pub(crate) fn set_loss(&mut self, fraction: f64, peers: Vec<PeerId>) {
        self.loss = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.loss_peers = (!peers.is_empty()).then(|| peers.into_iter().collect());
    }

    /// The loss on the link to or from `peer`.
    fn loss_to(&self, peer: &PeerId) -> f64 {
        match &self.loss_peers {
            Some(s) if !s.contains(peer) => 0.0,
            _ => self.loss,
        }
    }

    /// Whether a message to or from `peer` is lost (one draw per message on a lossy link).
    pub(crate) fn lost(&mut self, peer: &PeerId) -> bool {
        let loss = self.loss_to(peer);
        let lost = link::lost(&mut self.rng, loss);
        self.lost += u64::from(lost);
        lost
    }

    /// The fate of one message this node sends to `peer` at `now`: lost, held for the delay,
    /// or sent ([`link::fate`], the simulator's rule).
    pub(crate) fn route(&mut self, now: Instant, peer: &PeerId) -> Route {
        let loss = self.loss_to(peer);
        match link::fate(&mut self.rng, loss, self.delay) {
            Fate::Lost => {
                self.lost += 1;
                Route::Lost
            }
            Fate::After(d) if d > Duration::ZERO => {
                self.delayed += 1;
                Route::At(now + d)
            }
            Fate::After(_) => Route::Now,
        }
    }

    /// Holds `item` until `at`.
    pub(crate) fn hold(&mut self, at: Instant, item: T) {
        self.held.push((at, item));
    }

    /// When the next held message is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.held.iter().map(|h| h.0).min()
    }

    /// Takes the held messages that are due at `now`, in the order they were held.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<T> {
        let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.0 <= now);
        self.held = keep;
        due.into_iter().map(|h| h.1).collect()
    }

    /// The settings, for the control channel's answer.
    pub(crate) fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "delay_ms": self.delay.as_millis() as u64,
            "loss": self.loss,
            "loss_peers": self.loss_peers.as_ref().map_or(0, HashSet::len),
            "lost": self.lost,
            "delayed": self.delayed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_impairment_sends_now() {
        let mut im: Impairment<u32> = Impairment::new(1);
        let p = PeerId::random();
        for _ in 0..100 {
            assert_eq!(im.route(Instant::now(), &p), Route::Now);
        }
        assert_eq!(im.describe()["lost"], 0);
        assert_eq!(im.describe()["delayed"], 0);
    }

    #[test]
    fn a_delay_holds_until_due_and_zero_ends_it() {
        let mut im: Impairment<u32> = Impairment::new(1);
        let p = PeerId::random();
        im.set_delay(Duration::from_millis(3000));
        let Route::At(at) = im.route(Instant::now(), &p) else {
            panic!("a delayed message must be held")
        };
        assert!(at >= Instant::now() + Duration::from_millis(2900));
        im.hold(at, 7);
        im.hold(at + Duration::from_secs(1), 8);
        assert_eq!(im.next_due(), Some(at));
        assert!(im.due(Instant::now()).is_empty());
        assert_eq!(im.due(at), vec![7]);
        assert_eq!(im.due(at + Duration::from_secs(5)), vec![8]);
        assert_eq!(im.next_due(), None);
        im.set_delay(Duration::ZERO);
        assert_eq!(im.route(Instant::now(), &p), Route::Now);
    }

    #[test]
    fn loss_drops_about_the_fraction_and_only_for_the_named_peers() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let mut im: Impairment<u32> = Impairment::new(42);
        im.set_loss(0.2, vec![a]);
        let lost = (0..10_000)
            .filter(|_| im.route(Instant::now(), &a) == Route::Lost)
            .count();
        assert!((1800..2200).contains(&lost), "{lost} of 10000 lost at 0.2");
        assert!((0..1000).all(|_| im.route(Instant::now(), &b) == Route::Now));
        im.set_loss(0.0, vec![]);
        assert!((0..1000).all(|_| im.route(Instant::now(), &a) == Route::Now));
        // Same seed, same draws.
        let draws = |seed| {
            let mut im: Impairment<u32> = Impairment::new(seed);
            im.set_loss(0.5, vec![]);
            (0..64).map(|_| im.lost(&a)).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
    }
}
