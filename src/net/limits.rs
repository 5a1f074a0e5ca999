//! How many connections a process accepts and how long a connection may take to handshake,
//! sized from the federation, and the process's open-files limit.
//!
//! Owns: the connection caps every swarm of ours carries (a node's, a coordinator's, a
//! coordinated node's): counts, and new connections refused while the process's memory is
//! near the machine's ([`memory`]); the handshake timeout, and raising `RLIMIT_NOFILE` to its
//! hard limit.
//! Must not: decide who is a member (the allow list does) or close established connections.
//!
//! Why these caps: each connection holds a file descriptor, and a connection that never
//! completes its handshake holds one for the whole handshake timeout. Without a cap on pending
//! connections an outsider with 2,000 raw sockets exhausted a node's descriptors before any
//! allow list could see a peer ID (hostile-load review, W1); without a per-peer cap one member
//! key held 500 connections (W3).

use libp2p::connection_limits::{self, ConnectionLimits};
use libp2p::memory_connection_limits;
use std::time::Duration;
use tracing::{info, warn};

/// Established connections one peer may hold with us. Two members that dial each other at the
/// same moment hold two; a restart may leave a dying third for a moment.
pub(crate) const PER_PEER: u32 = 3;

/// How long a new connection has to finish its security and multiplexing handshake (libp2p's
/// default is 10 s). A raw socket that sends nothing is closed after this.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Members assumed when the federation is open (its manifest may grow at run time).
const OPEN_FLOOR: usize = 128;

/// The number of members the caps and budgets of a federation of `members` are sized for
/// (`open`: anyone may join, so at least [`OPEN_FLOOR`]).
pub(crate) fn sized_for(members: usize, open: bool) -> usize {
    if open {
        members.max(OPEN_FLOOR)
    } else {
        members
    }
}

/// The caps of a swarm in a federation of `members` (`open`: anyone may join).
///
/// - pending incoming (connections still handshaking, not yet a peer ID): 4 per member + 32.
///   At start every member may dial at once; beyond this, new sockets are closed at once.
/// - established: [`PER_PEER`] per peer, and in total [`PER_PEER`] per member + 16 (outsiders
///   never get that far in a closed federation: the allow list refuses them first).
pub(crate) fn caps(members: usize, open: bool) -> ConnectionLimits {
    let n = u32::try_from(sized_for(members, open)).unwrap_or(u32::MAX / 8);
    ConnectionLimits::default()
        .with_max_pending_incoming(Some(4 * n + 32))
        .with_max_established_per_peer(Some(PER_PEER))
        .with_max_established(Some(PER_PEER * n + 16))
}

/// The behaviour enforcing [`caps`].
pub(crate) fn behaviour(members: usize, open: bool) -> connection_limits::Behaviour {
    connection_limits::Behaviour::new(caps(members, open))
}

/// The share of the machine's physical memory above which a process refuses new connections
/// (established ones go on). What a process receives is bounded by its receive budget
/// (`net::intake`); this is the last guard, for memory that grows for any other reason: a
/// process that refuses newcomers near the machine's limit keeps serving its members instead of
/// being killed by the kernel.
pub(crate) const MEMORY_SHARE: f64 = 0.9;

/// The behaviour that refuses new connections, inbound and outbound, while this process's
/// memory is above [`MEMORY_SHARE`] of the machine's.
pub(crate) fn memory() -> memory_connection_limits::Behaviour {
    memory_connection_limits::Behaviour::with_max_percentage(MEMORY_SHARE)
}

/// Whether a refused connection was refused by [`caps`] or [`memory`] (not by the allow list).
pub(crate) fn exceeded(cause: &libp2p::swarm::ConnectionDenied) -> bool {
    cause
        .downcast_ref::<connection_limits::Exceeded>()
        .is_some()
        || cause
            .downcast_ref::<memory_connection_limits::MemoryUsageLimitExceeded>()
            .is_some()
}

/// Raises this process's soft open-files limit to its hard limit, and logs both: sockets,
/// checkpoints and logs share it. Returns the limit now in force (`None` if it could not be
/// read).
pub(crate) fn raise_open_files() -> Option<libc::rlim_t> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own; no other memory is touched.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        warn!(
            "reading the open-files limit: {}",
            std::io::Error::last_os_error()
        );
        return None;
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            warn!(
                soft = before,
                hard = lim.rlim_max,
                "raising the open-files limit: {}",
                std::io::Error::last_os_error()
            );
            return Some(before);
        }
        lim = raised;
    }
    info!(before, now = lim.rlim_cur, "open-files limit");
    Some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_grow_with_the_federation() {
        let small = format!("{:?}", caps(3, false));
        assert!(small.contains("max_pending_incoming: Some(44)"), "{small}");
        assert!(
            small.contains("max_established_per_peer: Some(3)"),
            "{small}"
        );
        assert!(small.contains("max_established_total: Some(25)"), "{small}");
        let open = format!("{:?}", caps(3, true));
        assert!(open.contains("max_pending_incoming: Some(544)"), "{open}");
    }

    #[test]
    fn the_open_files_limit_ends_at_the_hard_limit() {
        let now = raise_open_files().expect("getrlimit works here");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(now, lim.rlim_cur);
    }
}
