//! What every frame a node receives passes through, all peers and streams together: the receive
//! budget its bodies are buffered from (each peer limited to a share of it, so one peer cannot
//! starve the others; each member's first bytes set aside for it, so members that fill the
//! rest together cannot either), the bound on requests one peer may have being read at
//! once, the strikes that get a peer sending bad frames disconnected and blocked for a while
//! ([`Blocks`], the behaviour that enforces the block), and the rate-limited warnings for
//! refused frames.
//!
//! Owns: [`Limits`] and their defaults, [`Intake`] (shared by every copy of the codecs),
//! [`Blocks`], and the block list's file (`blocks.json` in the state directory), so a block
//! outlives a restart (insiders' review D2).
//! Must not: read or decode frames (that is `protocol::frame` through the codec), or know about
//! rounds; blocking here is for bad frames only (partitions have their own block list).

use super::metrics::{Metrics, Reason};
use super::throttle::Throttle;
use crate::protocol::{Budget, WireError, largest_message, message_bound};
use libp2p::core::Endpoint;
use libp2p::core::transport::PortUse;
use libp2p::futures::task::AtomicWaker;
use libp2p::swarm::{
    CloseConnection, ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, THandler,
    THandlerInEvent, THandlerOutEvent, ToSwarm, dummy,
};
use libp2p::{Multiaddr, PeerId};
use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tracing::warn;

/// The smallest default receive budget: 24 MiB, so that with what libp2p itself buffers a node
/// stays well within 64 MiB above its normal level under a memory flood.
pub const MIN_RECEIVE_BUDGET: u64 = 24 << 20;

/// The part of the receive budget one peer may hold: a quarter.
pub const PEER_SHARE: u64 = 4;

/// Requests one peer may have being read at once, all its connections and protocols together.
/// An honest peer has a pull, a notice, a fetch and a gradient out at most.
pub const STREAMS_PER_PEER: usize = 16;

/// Bad frames (garbage, truncated, oversized) within [`BAD_FRAME_WINDOW`] that get a peer
/// disconnected and blocked. A peer that crashes mid-message costs one.
pub const BAD_FRAMES: usize = 16;

/// The window [`BAD_FRAMES`] are counted over.
pub const BAD_FRAME_WINDOW: Duration = Duration::from_secs(60);

/// How long a peer stays blocked.
pub const BLOCK_FOR: Duration = Duration::from_secs(300);

/// One warning per peer and reason per this period; the next carries the count held back.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// Streams per yamux connection (yamux's default is 512): each may buffer a 256 KiB window
/// before it is read, so this bounds what one connection can park in memory at 16 MiB.
pub const YAMUX_STREAMS: usize = 64;

/// The bounds an [`Intake`] enforces.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    /// Bytes of frame bodies being received, all peers and streams.
    pub(crate) budget: u64,
    /// Bytes of frame bodies one peer may have being received.
    pub(crate) peer_budget: u64,
    /// The members each given a floor of the budget, set aside for them alone.
    pub(crate) floored: HashSet<PeerId>,
    /// Each floored member's floor, in bytes.
    pub(crate) floor: u64,
    /// Requests one peer may have being read at once.
    pub(crate) streams_per_peer: usize,
    /// Bad frames within `window` that block a peer (`usize::MAX`: never).
    pub(crate) bad_frames: usize,
    pub(crate) window: Duration,
    pub(crate) block_for: Duration,
    pub(crate) warn_every: Duration,
}

impl Limits {
    /// No budget, no stream bound, no blocking; warnings still rate-limited. The base the
    /// others are built on.
    pub(crate) fn unbounded() -> Self {
        Self {
            budget: u64::MAX,
            peer_budget: u64::MAX,
            floored: HashSet::new(),
            floor: 0,
            streams_per_peer: usize::MAX,
            bad_frames: usize::MAX,
            window: BAD_FRAME_WINDOW,
            block_for: BLOCK_FOR,
            warn_every: WARN_EVERY,
        }
    }

    /// A FedeRiCo node's limits: `budget` bytes, a peer [`PEER_SHARE`] of it, the default
    /// bounds for the rest.
    pub(crate) fn node(budget: u64) -> Self {
        Self {
            budget,
            peer_budget: budget / PEER_SHARE,
            streams_per_peer: STREAMS_PER_PEER,
            bad_frames: BAD_FRAMES,
            ..Self::unbounded()
        }
    }

    /// These limits with a floor of the budget set aside for each of `members` (insiders'
    /// review M4b: four colluding members could fill a node's whole budget and get every other
    /// member's frames refused): [`message_bound`] of a model of `num_params` parameters (its
    /// largest message twice over), at most half the budget over all members. The rest of the
    /// budget is shared as before.
    pub(crate) fn with_floors(
        self,
        members: impl IntoIterator<Item = PeerId>,
        num_params: usize,
    ) -> Self {
        let floored: HashSet<PeerId> = members.into_iter().collect();
        let n = floored.len().max(1) as u64;
        let floor = message_bound(num_params)
            .min(self.budget / (2 * n))
            .min(self.peer_budget);
        Self {
            floored,
            floor,
            ..self
        }
    }

    /// Whether every member's floor holds its largest message, for a model of `num_params`
    /// parameters (else colluders filling the shared rest can still refuse a member's
    /// message).
    pub(crate) fn floors_hold_a_message(&self, num_params: usize) -> bool {
        self.floored.is_empty() || self.floor >= largest_message(num_params)
    }

    /// A coordinator's limits, for `members` silos and a model of `num_params` parameters. All
    /// silos upload in the same round, so every member gets a share of its own: each peer may
    /// hold [`message_bound`] bytes (two of its largest honest messages, and at least a
    /// [`PEER_SHARE`] of [`MIN_RECEIVE_BUDGET`]), and the budget is that share for every member
    /// (at least [`PEER_SHARE`] of them). Streams and bad frames are bounded as at a node.
    pub(crate) fn coordinator(members: usize, num_params: usize) -> Self {
        let share = message_bound(num_params).max(MIN_RECEIVE_BUDGET / PEER_SHARE);
        let members = members.max(PEER_SHARE as usize) as u64;
        let budget = share.saturating_mul(members).max(MIN_RECEIVE_BUDGET);
        Self {
            peer_budget: share,
            ..Self::node(budget)
        }
    }
}

/// The default receive budget for a model of `num_params` parameters: four of its largest
/// messages, and never under [`MIN_RECEIVE_BUDGET`].
pub fn default_receive_budget(num_params: usize) -> u64 {
    (4 * message_bound(num_params)).max(MIN_RECEIVE_BUDGET)
}

/// A peer refused a connection because it is blocked.
#[derive(Debug, thiserror::Error)]
#[error("peer {peer} is blocked for {} s more after repeated bad frames", left.as_secs())]
pub(crate) struct Blocked {
    peer: PeerId,
    left: Duration,
}

#[derive(Default)]
struct State {
    /// Requests being read, by sender.
    reading: HashMap<PeerId, usize>,
    /// When each peer's recent bad frames came.
    strikes: HashMap<PeerId, VecDeque<Instant>>,
    /// Blocked peers, until when.
    blocked: HashMap<PeerId, Instant>,
    /// Peers to disconnect ([`Blocks`] does).
    to_close: Vec<PeerId>,
    /// Where the block list is kept across restarts (`None`: in memory only).
    file: Option<std::path::PathBuf>,
    /// Each peer's share of the receive budget.
    shares: HashMap<PeerId, Budget>,
}

/// The shared state behind the limits: one per node, in every copy of its codecs.
pub(crate) struct Intake {
    limits: Limits,
    budget: Budget,
    metrics: Metrics,
    state: Mutex<State>,
    /// Wakes [`Blocks`] when a peer is to be disconnected.
    waker: AtomicWaker,
    warns: Throttle<(Option<PeerId>, &'static str)>,
}

impl Intake {
    pub(crate) fn new(limits: Limits, metrics: Metrics) -> Arc<Self> {
        let set_aside = limits.floor.saturating_mul(limits.floored.len() as u64);
        Arc::new(Self {
            budget: Budget::new(limits.budget.saturating_sub(set_aside)),
            warns: Throttle::new(limits.warn_every),
            limits,
            metrics,
            state: Mutex::default(),
            waker: AtomicWaker::new(),
        })
    }

    /// Keeps the block list in `path` from now on, after taking in the blocks it holds that
    /// have not run out. A file that cannot be read is logged and replaced, never fatal.
    pub(crate) fn remember_blocks(&self, path: std::path::PathBuf) {
        let now = Instant::now();
        let wall = unix_now();
        let saved: Vec<SavedBlock> = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                warn!(path = %path.display(), error = %e, "block list unreadable; starting without it");
                Vec::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "block list unreadable; starting without it");
                Vec::new()
            }
        };
        let mut s = self.state();
        for b in saved {
            let Ok(peer) = b.peer.parse::<PeerId>() else {
                continue;
            };
            // A block longer than the configured one (a clock set back, an edited file) is
            // cut to it.
            let left = b
                .until_unix_s
                .saturating_sub(wall)
                .min(self.limits.block_for.as_secs());
            if left > 0 {
                s.blocked.insert(peer, now + Duration::from_secs(left));
            }
        }
        let resumed = s.blocked.len();
        s.file = Some(path);
        drop(s);
        if resumed > 0 {
            warn!(peers = resumed, "blocks resumed from the block list");
        }
    }

    /// Writes the block list, when it is kept in a file (a failed write is logged).
    fn save_blocks(&self, s: &State, now: Instant) {
        let Some(path) = &s.file else { return };
        let wall = unix_now();
        let list: Vec<SavedBlock> = s
            .blocked
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(p, until)| SavedBlock {
                peer: p.to_string(),
                until_unix_s: wall + (*until - now).as_secs_f64().ceil() as u64,
            })
            .collect();
        let written = serde_json::to_vec(&list)
            .map_err(std::io::Error::other)
            .and_then(|b| crate::store::write_atomic(path, &b));
        if let Err(e) = written {
            warn!(path = %path.display(), error = %e, "block list not written; the block holds until a restart");
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The budget a frame body from `peer` is buffered from: its share of the receive budget,
    /// with its floor when it is a floored member (the shared budget when the sender is not
    /// known).
    pub(crate) fn budget(&self, peer: Option<PeerId>) -> Budget {
        let Some(peer) = peer else {
            return self.budget.clone();
        };
        let floored = &self.limits.floored;
        let mut s = self.state();
        if s.shares.len() > 1024 {
            // A member's share is kept: a second one would hold a second floor.
            s.shares.retain(|p, b| b.used() > 0 || floored.contains(p));
        }
        let floor = if floored.contains(&peer) {
            self.limits.floor
        } else {
            0
        };
        s.shares
            .entry(peer)
            .or_insert_with(|| self.budget.share_with_floor(self.limits.peer_budget, floor))
            .clone()
    }

    /// Publishes the budget's use (the shared part and every floor's).
    pub(crate) fn show_use(&self) {
        let floors: u64 = self
            .state()
            .shares
            .values()
            .map(|b| b.used().min(b.floor()))
            .sum();
        let used = self.budget.used().saturating_add(floors);
        self.metrics
            .receiving_bytes
            .set(used.min(i64::MAX as u64) as i64);
    }

    /// Starts reading a request from `peer`: refused when it already has as many being read as
    /// it may. The slot is given back when dropped.
    pub(crate) fn open_read(self: &Arc<Self>, peer: PeerId) -> Result<ReadSlot, WireError> {
        let mut s = self.state();
        let n = s.reading.entry(peer).or_default();
        if *n >= self.limits.streams_per_peer {
            return Err(WireError::TooManyStreams {
                max: self.limits.streams_per_peer,
            });
        }
        *n += 1;
        Ok(ReadSlot {
            intake: self.clone(),
            peer,
        })
    }

    /// A frame from `peer` on `protocol` refused for `e`: counted, logged (one line per peer and
    /// reason per period, with the count held back), and for a bad frame a strike against the
    /// peer.
    pub(crate) fn refused(&self, peer: Option<PeerId>, protocol: &str, e: &WireError) {
        let reason = Reason::from(e);
        self.metrics.reject(reason);
        let now = Instant::now();
        if let Some(held) = self.warns.allow(&(peer, reason.label()), now) {
            let who = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
            warn!(peer = %who, %protocol, %reason, held_back = held, "refused a frame: {e}");
        }
        let bad = matches!(
            reason,
            Reason::Garbage | Reason::Truncated | Reason::Oversized
        );
        if let (true, Some(peer)) = (bad, peer) {
            self.strike(peer, now);
        }
    }

    fn strike(&self, peer: PeerId, now: Instant) {
        let window = self.limits.window;
        let mut s = self.state();
        if s.strikes.len() > 1024 {
            s.strikes
                .retain(|_, q| q.back().is_some_and(|t| now.duration_since(*t) < window));
        }
        let q = s.strikes.entry(peer).or_default();
        while q.front().is_some_and(|t| now.duration_since(*t) >= window) {
            q.pop_front();
        }
        q.push_back(now);
        if q.len() < self.limits.bad_frames {
            return;
        }
        let frames = q.len();
        s.strikes.remove(&peer);
        s.blocked.insert(peer, now + self.limits.block_for);
        s.to_close.push(peer);
        self.save_blocks(&s, now);
        drop(s);
        self.metrics.blocked_peers.inc();
        if let Some(held) = self.warns.allow(&(Some(peer), "blocked"), now) {
            warn!(
                %peer,
                bad_frames = frames,
                window_s = window.as_secs(),
                block_s = self.limits.block_for.as_secs(),
                held_back = held,
                "disconnected and blocked a peer for repeated bad frames"
            );
        }
        self.waker.wake();
    }

    /// How much longer `peer` stays blocked, if it is.
    fn blocked(&self, peer: PeerId, now: Instant) -> Option<Duration> {
        let mut s = self.state();
        let until = *s.blocked.get(&peer)?;
        if until <= now {
            s.blocked.remove(&peer);
            return None;
        }
        Some(until - now)
    }

    /// Refuses a connection with a blocked peer (logged once per period).
    fn admit(&self, peer: PeerId) -> Result<(), ConnectionDenied> {
        let now = Instant::now();
        let Some(left) = self.blocked(peer, now) else {
            return Ok(());
        };
        if let Some(held) = self.warns.allow(&(Some(peer), "blocked_connection"), now) {
            warn!(%peer, left_s = left.as_secs(), held_back = held, "refused a connection with a blocked peer");
        }
        Err(ConnectionDenied::new(Blocked { peer, left }))
    }
}

/// One block in `blocks.json`: the peer and when the block runs out (wall clock, so it means
/// the same to the next process).
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedBlock {
    peer: String,
    until_unix_s: u64,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A request being read; gives its slot back when dropped.
pub(crate) struct ReadSlot {
    intake: Arc<Intake>,
    peer: PeerId,
}

impl Drop for ReadSlot {
    fn drop(&mut self) {
        let mut s = self.intake.state();
        if let Some(n) = s.reading.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                s.reading.remove(&self.peer);
            }
        }
    }
}

/// Enforces the blocks [`Intake`] decides: disconnects a peer when it is blocked, and refuses
/// its connections (both ways) until the block runs out. The refusal is a
/// [`ConnectionDenied`] holding a [`Blocked`].
pub(crate) struct Blocks {
    intake: Arc<Intake>,
}

impl Blocks {
    pub(crate) fn new(intake: Arc<Intake>) -> Self {
        Self { intake }
    }
}

/// Whether a refused connection was refused by [`Blocks`].
pub(crate) fn is_blocked(cause: &ConnectionDenied) -> bool {
    cause.downcast_ref::<Blocked>().is_some()
}

impl NetworkBehaviour for Blocks {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_established_inbound_connection(
        &mut self,
        _: ConnectionId,
        peer: PeerId,
        _: &Multiaddr,
        _: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.intake.admit(peer)?;
        Ok(dummy::ConnectionHandler)
    }

    fn handle_pending_outbound_connection(
        &mut self,
        _: ConnectionId,
        peer: Option<PeerId>,
        _: &[Multiaddr],
        _: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        if let Some(p) = peer {
            self.intake.admit(p)?;
        }
        Ok(Vec::new())
    }

    fn handle_established_outbound_connection(
        &mut self,
        _: ConnectionId,
        peer: PeerId,
        _: &Multiaddr,
        _: Endpoint,
        _: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.intake.admit(peer)?;
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, _: FromSwarm) {}

    fn on_connection_handler_event(
        &mut self,
        _: PeerId,
        _: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {}
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<ToSwarm<Infallible, THandlerInEvent<Self>>> {
        self.intake.waker.register(cx.waker());
        match self.intake.state().to_close.pop() {
            Some(peer_id) => Poll::Ready(ToSwarm::CloseConnection {
                peer_id,
                connection: CloseConnection::All,
            }),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intake(bad_frames: usize) -> Arc<Intake> {
        Intake::new(
            Limits {
                bad_frames,
                streams_per_peer: 2,
                ..Limits::node(1 << 20)
            },
            Metrics::default(),
        )
    }

    /// Insiders' review D2: a block held only in memory ended with the process.
    #[test]
    fn a_block_outlives_a_restart_and_ends_when_it_would_have() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blocks.json");
        let (bad, good) = (PeerId::random(), PeerId::random());
        let first = intake(2);
        first.remember_blocks(path.clone());
        let e = WireError::Decode("x".into());
        first.refused(Some(bad), "/p", &e);
        first.refused(Some(bad), "/p", &e);
        assert!(first.admit(bad).is_err());
        // The next process.
        let second = intake(2);
        assert!(second.admit(bad).is_ok(), "no block without the file");
        second.remember_blocks(path.clone());
        assert!(second.admit(bad).is_err(), "the block came back");
        assert!(second.admit(good).is_ok());
        let left = second.blocked(bad, Instant::now()).unwrap();
        assert!(left <= second.limits.block_for, "{left:?}");
        // A block that ran out meanwhile does not come back.
        let saved = format!(r#"[{{"peer":"{bad}","until_unix_s":{}}}]"#, unix_now() - 1);
        std::fs::write(&path, saved).unwrap();
        let third = intake(2);
        third.remember_blocks(path.clone());
        assert!(third.admit(bad).is_ok());
        // A damaged file is set aside: no block, no failure, and the next block rewrites it.
        std::fs::write(&path, b"{not json").unwrap();
        let fourth = intake(2);
        fourth.remember_blocks(path.clone());
        assert!(fourth.admit(bad).is_ok());
        fourth.refused(Some(good), "/p", &e);
        fourth.refused(Some(good), "/p", &e);
        let fifth = intake(2);
        fifth.remember_blocks(path);
        assert!(fifth.admit(good).is_err());
    }

    #[test]
    fn a_coordinator_gives_every_member_a_share_of_its_own() {
        // The quick start's tiny model: the floors hold.
        let small = Limits::coordinator(2, 335);
        assert_eq!(small.peer_budget, MIN_RECEIVE_BUDGET / PEER_SHARE);
        assert_eq!(small.budget, MIN_RECEIVE_BUDGET);
        // 8 silos of an 11M-parameter model: all 8 may upload at once, one peer holds at most
        // two of its messages, and the stream and bad-frame bounds are a node's.
        let big = Limits::coordinator(8, 11_000_000);
        assert_eq!(big.peer_budget, message_bound(11_000_000));
        assert!(big.peer_budget >= 2 * 4 * 11_000_000);
        assert_eq!(big.budget, 8 * big.peer_budget);
        assert_eq!(big.streams_per_peer, STREAMS_PER_PEER);
        assert_eq!(big.bad_frames, BAD_FRAMES);
    }

    /// Attack M4b (insiders' review): four colluding members each fill their share of a node's
    /// receive budget (a quarter each), so together the whole; an honest member's gradient is
    /// then refused. With floors its message fits in its own.
    #[test]
    fn colluding_members_that_fill_the_budget_cannot_refuse_another_members_message() {
        let params = 335;
        let budget = super::MIN_RECEIVE_BUDGET;
        let colluders: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        let honest: Vec<PeerId> = (0..3).map(|_| PeerId::random()).collect();
        let members = colluders.iter().chain(&honest).copied();
        let attempt = |limits: Limits| {
            let i = Intake::new(limits, Metrics::default());
            // Each colluder holds as much as its share lets it (frames trickled in, never
            // finished).
            let held: Vec<_> = colluders
                .iter()
                .map(|&c| {
                    let b = i.budget(Some(c));
                    let mut r = b.reservation();
                    while r.grow(64 << 10).is_ok() {}
                    while r.grow(1).is_ok() {}
                    r
                })
                .collect();
            let filled: u64 = held.iter().map(|r| r.held()).sum();
            // Each honest member sends a largest message: a model or a gradient.
            let honest_ok = honest.iter().all(|&h| {
                let b = i.budget(Some(h));
                let mut r = b.reservation();
                r.grow(crate::protocol::largest_message(params)).is_ok()
            });
            (filled, honest_ok)
        };
        // Before: the colluders hold the whole budget and every honest message is refused.
        let (filled, honest_ok) = attempt(Limits::node(budget));
        assert_eq!(filled, budget);
        assert!(!honest_ok);
        // With the floors: they hold all they may, and each honest member still gets through.
        let limits = Limits::node(budget).with_floors(members, params);
        assert!(limits.floors_hold_a_message(params));
        assert_eq!(limits.floor, message_bound(params));
        let (filled, honest_ok) = attempt(limits.clone());
        assert!(honest_ok);
        // What they hold together: the shared rest and their own floors, within the budget.
        let shared = budget - 7 * limits.floor;
        assert_eq!(filled, shared + 4 * limits.floor);
    }

    #[test]
    fn floors_are_at_most_half_the_budget_and_say_when_they_cannot_hold_a_message() {
        let members: Vec<PeerId> = (0..16).map(|_| PeerId::random()).collect();
        // An 11 M-parameter model with the default budget: 16 floors of a whole message do
        // not fit in half of it.
        let params = 11_000_000;
        let limits = Limits::node(default_receive_budget(params)).with_floors(members, params);
        assert_eq!(limits.floor, limits.budget / 32);
        assert!(!limits.floors_hold_a_message(params));
        // Without members, nothing is set aside.
        let none = Limits::node(1 << 20).with_floors([], 335);
        assert!(none.floored.is_empty() && none.floors_hold_a_message(335));
    }

    #[test]
    fn a_peer_has_a_bounded_number_of_requests_being_read() {
        let i = intake(3);
        let (a, b) = (PeerId::random(), PeerId::random());
        let s1 = i.open_read(a).unwrap();
        let _s2 = i.open_read(a).unwrap();
        assert_eq!(
            i.open_read(a).err(),
            Some(WireError::TooManyStreams { max: 2 })
        );
        let _other = i.open_read(b).expect("another peer has its own bound");
        drop(s1);
        let _s3 = i.open_read(a).expect("a slot given back is free again");
    }

    #[test]
    fn repeated_bad_frames_block_a_peer_and_only_bad_frames_count() {
        let i = intake(3);
        let (bad, other) = (PeerId::random(), PeerId::random());
        let garbage = WireError::Decode("x".into());
        // Budget and stream refusals are not the sender's fault alone: no strike.
        for _ in 0..10 {
            i.refused(
                Some(bad),
                "/p",
                &WireError::OverBudget { want: 2, budget: 1 },
            );
            i.refused(Some(bad), "/p", &WireError::TooManyStreams { max: 2 });
        }
        i.refused(Some(bad), "/p", &garbage);
        i.refused(Some(other), "/p", &garbage);
        i.refused(Some(bad), "/p", &WireError::Truncated { got: 1, want: 8 });
        assert!(i.admit(bad).is_ok(), "two strikes");
        i.refused(Some(bad), "/p", &WireError::TooLarge { len: 2, max: 1 });
        let denied = i.admit(bad).unwrap_err();
        assert!(is_blocked(&denied), "{denied}");
        assert!(i.admit(other).is_ok(), "one strike");
        assert_eq!(i.state().to_close, vec![bad]);
        assert_eq!(i.metrics.blocked_peers.get(), 1);
        // The block runs out.
        let later = Instant::now() + BLOCK_FOR + Duration::from_secs(1);
        assert_eq!(i.blocked(bad, later), None);
    }

    #[test]
    fn strikes_outside_the_window_are_forgotten() {
        let i = intake(3);
        let p = PeerId::random();
        let t0 = Instant::now();
        i.strike(p, t0);
        i.strike(p, t0 + Duration::from_secs(1));
        i.strike(p, t0 + BAD_FRAME_WINDOW + Duration::from_secs(2));
        assert!(
            i.blocked(p, t0 + BAD_FRAME_WINDOW + Duration::from_secs(2))
                .is_none()
        );
        i.strike(p, t0 + BAD_FRAME_WINDOW + Duration::from_secs(3));
        i.strike(p, t0 + BAD_FRAME_WINDOW + Duration::from_secs(4));
        assert!(
            i.blocked(p, t0 + BAD_FRAME_WINDOW + Duration::from_secs(4))
                .is_some()
        );
    }
}
