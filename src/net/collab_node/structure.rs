//! FedCollab's exchanges with the coordinator (spec §6 phases 1 and 3): joining and the
//! distance plan, then reporting the distances and receiving this silo's coalition.
//! Owns: checking what the coordinator sends (a plan of ascending silos, a coalition that
//! holds this silo), and asking again while the coordinator is gone or restarted.
//! Must not: estimate distances or train, or decide the structure (the coordinator solves it).

use super::link::{Link, coord_until, coord_within};
use super::state::Saved;
use crate::net::client::ExchangeError;
use crate::protocol::{CoordRequest, CoordResponse};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// Joins and fetches the distance plan, retrying until the coordinator answers (it holds the
/// plan until every silo joined): `(m_train target, silos, planned silos)`.
pub(super) async fn plan(
    link: &Link,
    join: &CoordRequest,
    fetch: Duration,
) -> anyhow::Result<(f64, usize, Vec<usize>)> {
    let mut joined = false;
    loop {
        if !joined {
            match coord_within(link, join, fetch).await {
                Ok(CoordResponse::Ack) => joined = true,
                Ok(CoordResponse::Error { reason }) => {
                    anyhow::bail!("the coordinator refused this silo: {reason}")
                }
                other => {
                    warn!(?other, "could not join the coordinator; trying again");
                    continue;
                }
            }
        }
        match coord_within(link, &CoordRequest::Fetch { round: 0 }, fetch).await {
            Ok(CoordResponse::DiscPlan {
                target,
                nodes,
                members,
            }) => {
                let ascending = members.windows(2).all(|w| w[0] < w[1]);
                if !(target.is_finite() && target >= 0.0)
                    || nodes < 2
                    || members.len() < 2
                    || !ascending
                    || members.iter().any(|&m| m >= nodes)
                {
                    anyhow::bail!(
                        "the coordinator sent a bad plan (target {target}, {nodes} silos, \
                         planned {members:?})"
                    );
                }
                let members = members.into_iter().map(|m| m as usize).collect();
                return Ok((target, nodes as usize, members));
            }
            Ok(CoordResponse::Error { reason }) => {
                // Typically a restarted coordinator that lost the registration.
                warn!(%reason, "plan refused; joining again");
                joined = false;
            }
            other => warn!(?other, "no distance plan yet; asking again"),
        }
    }
}

/// Phase 3: sends the distances until acknowledged, then fetches the coalition, until
/// `until`. Leaves `state.coalition` unset when the coordinator did not answer in time.
pub(super) async fn attach(
    link: &Link,
    join: &CoordRequest,
    state: &mut Saved,
    reported: &mut bool,
    until: Instant,
    me: usize,
) {
    let asked = tokio::time::timeout_at(until, ask(link, join, state, reported, until, me));
    if !matches!(asked.await, Ok(true)) {
        warn!("no collaboration structure yet: training alone this round");
    }
}

/// [`attach`]'s exchanges, until the coalition (or a malformed one, or no report) is in:
/// false when `until` cut them short.
async fn ask(
    link: &Link,
    join: &CoordRequest,
    state: &mut Saved,
    reported: &mut bool,
    until: Instant,
    me: usize,
) -> bool {
    loop {
        if !*reported {
            let Some(pairs) = state.report.clone() else {
                return true;
            };
            match coord_until(link, &CoordRequest::Distances { pairs }, until).await {
                Ok(CoordResponse::Ack) => *reported = true,
                Err(ExchangeError::TimedOut) => return false,
                Ok(CoordResponse::Error { reason }) => {
                    // A restarted coordinator without this silo's join: join again.
                    warn!(%reason, "distances refused; joining again");
                    let _ = coord_until(link, join, until).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                other => {
                    warn!(?other, "could not report the distances");
                    continue;
                }
            }
        }
        match coord_until(link, &CoordRequest::Fetch { round: 1 }, until).await {
            Ok(CoordResponse::Coalition { members, sizes }) => {
                let ok = members.len() == sizes.len()
                    && members.contains(&(me as u32))
                    && members.windows(2).all(|w| w[0] < w[1])
                    && sizes.iter().all(|&s| s > 0);
                if ok {
                    info!(?members, "coalition received");
                    state.coalition = Some((members, sizes));
                } else {
                    warn!(?members, ?sizes, "a malformed coalition; ignored");
                }
                return true;
            }
            Err(ExchangeError::TimedOut) => return false,
            Ok(CoordResponse::Error { reason }) => {
                warn!(%reason, "coalition refused; reporting again");
                *reported = false;
            }
            other => warn!(?other, "no coalition yet"),
        }
    }
}
