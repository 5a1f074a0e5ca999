//! Scheduled impairments of a node's own traffic: a straggler's added latency and message
//! loss (issue 4), set by `federico swarm` through the control channel; and the emulated
//! wide-area links of a scenario's `[faults.links]` (issue 41), from the node's config: every
//! message the node sends to a peer (pulls, notices, models, acknowledgements, gradients,
//! skips; not the gradient receipts, which only get logged) waits on its link as
//! [`crate::faults::link::Wire`] says, the simulator's rule.
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

use crate::faults::link::{self, Fate, Wan, Wire};
use libp2p::PeerId;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::{HashMap, HashSet};
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
    /// The emulated wide-area link to each peer that has one.
    links: HashMap<PeerId, (Wan, Wire)>,
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
            links: HashMap::new(),
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

    /// Emulates a wide-area link to each of these peers, for the whole run.
    pub(crate) fn set_links(&mut self, links: Vec<(PeerId, Wan)>) {
        self.links = links
            .into_iter()
            .map(|(p, w)| (p, (w, Wire::default())))
            .collect();
    }

    /// The fate of one model or gradient of `bytes` this node sends to `peer` at `now`: lost,
    /// held for the delay and its link, or sent ([`link::fate`], then [`Wire::send`]: the
    /// simulator's rule).
    pub(crate) fn route(&mut self, now: Instant, peer: &PeerId, bytes: u64) -> Route {
        let loss = self.loss_to(peer);
        match link::fate(&mut self.rng, loss, self.delay) {
            Fate::Lost => {
                self.lost += 1;
                Route::Lost
            }
            Fate::After(d) => {
                let d = d + self.on_link(now, peer, bytes);
                self.held_for(now, d)
            }
        }
    }

    /// When one of the other messages (a pull, a notice, an acknowledgement, a skip) this node
    /// sends to `peer` at `now` goes: the scheduled delay and loss leave them alone, a
    /// wide-area link does not.
    pub(crate) fn route_small(&mut self, now: Instant, peer: &PeerId) -> Route {
        let d = self.on_link(now, peer, link::wire_bytes(0));
        self.held_for(now, d)
    }

    /// The time on the link to `peer`, if it has one (no draw otherwise).
    fn on_link(&mut self, now: Instant, peer: &PeerId, bytes: u64) -> Duration {
        match self.links.get_mut(peer) {
            Some((wan, wire)) => wire.send(&mut self.rng, wan, now, bytes),
            None => Duration::ZERO,
        }
    }

    fn held_for(&mut self, now: Instant, d: Duration) -> Route {
        if d > Duration::ZERO {
            self.delayed += 1;
            Route::At(now + d)
        } else {
            Route::Now
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
            "links": self.links.len(),
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
            assert_eq!(im.route(Instant::now(), &p, 64), Route::Now);
        }
        assert_eq!(im.describe()["lost"], 0);
        assert_eq!(im.describe()["delayed"], 0);
    }

    #[test]
    fn a_delay_holds_until_due_and_zero_ends_it() {
        let mut im: Impairment<u32> = Impairment::new(1);
        let p = PeerId::random();
        im.set_delay(Duration::from_millis(3000));
        let Route::At(at) = im.route(Instant::now(), &p, 64) else {
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
        assert_eq!(im.route(Instant::now(), &p, 64), Route::Now);
    }

    #[test]
    fn a_link_holds_every_message_to_its_peer_and_only_to_it() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let mut im: Impairment<u32> = Impairment::new(3);
        im.set_links(vec![(
            a,
            Wan {
                one_way: Duration::from_millis(80),
                jitter: Duration::ZERO,
                bits_per_s: 50e6,
            },
        )]);
        let t0 = Instant::now();
        let Route::At(small) = im.route_small(t0, &a) else {
            panic!("a pull on a link must be held")
        };
        assert_eq!((small - t0).as_micros(), 80_010, "80 ms and 64 bytes");
        assert_eq!(im.route_small(t0, &b), Route::Now);
        // 636 KB waits behind the small message, then takes 101.7 ms of wire and the latency.
        let Route::At(at) = im.route(t0, &a, link::wire_bytes(159_010)) else {
            panic!("a model on a slow link must be held")
        };
        assert!(at - t0 > Duration::from_millis(181), "{:?}", at - t0);
        assert_eq!(im.route(t0, &b, link::wire_bytes(159_010)), Route::Now);
        assert_eq!(im.describe()["links"], 1);
    }

    #[test]
    fn loss_drops_about_the_fraction_and_only_for_the_named_peers() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let mut im: Impairment<u32> = Impairment::new(42);
        im.set_loss(0.2, vec![a]);
        let lost = (0..10_000)
            .filter(|_| im.route(Instant::now(), &a, 64) == Route::Lost)
            .count();
        assert!((1800..2200).contains(&lost), "{lost} of 10000 lost at 0.2");
        assert!((0..1000).all(|_| im.route(Instant::now(), &b, 64) == Route::Now));
        im.set_loss(0.0, vec![]);
        assert!((0..1000).all(|_| im.route(Instant::now(), &a, 64) == Route::Now));
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
