//! What a person sees of the node's rounds and asks of it: each round-engine event as a log
//! line, and `SIGUSR1`, which asks for the model now.
//! Owns: the wording and level of every event's log line (per-round lines at debug while the
//! progress line shows the rounds), and the signal stream.
//! Must not: decide anything (the round engine does) or touch the swarm.

use crate::core::round::Event;
use crate::net::progress;
use tracing::{debug, info, warn};

/// `SIGUSR1` asks for the model now (`kill -USR1 <pid>`); `None` where signals cannot be had.
#[cfg(unix)]
pub(super) fn export_signal() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    signal(SignalKind::user_defined1())
        .inspect_err(|e| warn!("SIGUSR1 cannot ask for an export: {e}"))
        .ok()
}

#[cfg(not(unix))]
pub(super) fn export_signal() -> Option<()> {
    None
}

/// The next `SIGUSR1`; never, without a handler.
#[cfg(unix)]
pub(super) async fn next_signal(sig: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match sig {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(not(unix))]
pub(super) async fn next_signal(_: &mut Option<()>) -> Option<()> {
    std::future::pending().await
}

/// The engine's events, as log lines.
pub(super) fn event(e: &Event) {
    match e {
        Event::WaitingForPeers {
            waited,
            connected,
            members,
        } => warn!(
            waited_s = waited.as_secs(),
            connected,
            members,
            "no peer to train with yet: waiting for the other {} member(s) of the manifest \
             before round 1 (start their nodes, or check their addresses in the manifest); \
             a silo alone is no federation (deadlines.alone_s lets it train alone after a while)",
            members.saturating_sub(1)
        ),
        Event::StartingWithout {
            connected,
            running,
            members,
        } => warn!(
            connected,
            running_federico = running,
            members,
            "starting without every member"
        ),
        Event::RoundStarts { round, sampled } => debug!(round, ?sampled, "round starts"),
        Event::ModelLate { peer, round } => {
            warn!(peer = %peer, round, "model did not arrive in time")
        }
        Event::SteppingPastProbation { round, missing } => {
            let missing: Vec<String> = missing.iter().map(|m| m.to_string()).collect();
            info!(
                round,
                ?missing,
                "stepping after the grace without samplers on probation (each missed a step \
                 within the last 100 rounds and 100 gradient deadlines)"
            )
        }
        Event::SteppingAtDeadline {
            round,
            missing,
            unannounced,
        } => {
            let missing: Vec<String> = missing.iter().map(|m| m.to_string()).collect();
            let unannounced: Vec<String> = unannounced.iter().map(|m| m.to_string()).collect();
            warn!(
                round,
                ?missing,
                ?unannounced,
                "stepping at the gradient deadline (missing: awaited gradients; unannounced: \
                 peers that did not say whether they pull this round)"
            );
        }
        Event::GradientBounded {
            peer,
            round,
            norm,
            bound,
        } => info!(
            peer = %peer,
            round,
            norm,
            bound,
            "a member's gradient was far above the federation's typical norm: it entered the \
             step scaled down to the bound (logged once per member, later ones are scaled \
             silently; an honest member's can be too, early in training, so this alone is no \
             sign of an attack: docs/insiders.md)"
        ),
        Event::GradientOpposed { peer, round } => info!(
            peer = %peer,
            round,
            "a member's gradient pointed against this silo's own and was left out of the step \
             ([defences] drop_opposed; logged once per member, later ones are left out \
             silently; docs/insiders.md)"
        ),
        Event::Distrusted {
            peer,
            round,
            distrusted: true,
        } => warn!(
            peer = %peer,
            round,
            "a member's gradients kept pointing against this silo's own, or kept being far \
             above the norm bound: it gets no weight in this silo's row and its gradients are \
             left out until they agree again ([defences] distrust; docs/insiders.md)"
        ),
        Event::Distrusted {
            peer,
            round,
            distrusted: false,
        } => info!(
            peer = %peer,
            round,
            "a distrusted member's gradients agree with this silo's own again: it has its weight back"
        ),
        Event::Straggler { peer, round } => info!(
            peer = %peer,
            round,
            "a sampler keeps missing the step: its gradients are taken but no longer waited for"
        ),
        Event::FetchLate { peer } => {
            warn!(peer = %peer, "final model did not arrive; dropped from the mixture")
        }
        // On a terminal the progress line shows the rounds; the log then keeps them at debug.
        Event::RoundDone { round, duration } if progress::shown() => {
            debug!(round, seconds = duration.as_secs_f64(), "round done")
        }
        Event::RoundDone { round, duration } => {
            info!(round, seconds = duration.as_secs_f64(), "round done")
        }
        Event::Lingering { round } => info!(
            round,
            "last round done; serving the final model until peers are done"
        ),
    }
}
