//! FedCollab's exchanges with the coordinator (spec §6 phases 1 and 3), translated: each
//! question of the member engine ([`Ask`]) becomes a request, each answer a [`Reply`].
//! Owns: that translation, and what each request carries (the join's sample count, the
//! distances the silo holds).
//! Must not: decide what an answer means, when to ask again or how long to wait (the engine,
//! [`crate::coord::fedcollab::member`], does); estimate distances or train.

use super::link::{Link, coord_within};
use crate::coord::PairDistance;
use crate::coord::fedcollab::member::{Ask, Reply};
use crate::net::client::ExchangeError;
use crate::protocol::{CoordRequest, CoordResponse};
use std::time::Duration;

/// Asks the coordinator `ask` within `within` (an unreachable coordinator is dialled again
/// every 500 ms inside it): the engine's reading of the answer.
pub(super) async fn ask(
    link: &Link,
    ask: Ask,
    within: Duration,
    join: &CoordRequest,
    report: Option<&[PairDistance]>,
) -> Reply {
    let req = match ask {
        Ask::Join => join.clone(),
        Ask::Plan => CoordRequest::Fetch { round: 0 },
        Ask::Distances => match report {
            Some(pairs) => CoordRequest::Distances {
                pairs: pairs.to_vec(),
            },
            None => return Reply::Other("no distances to report".into()),
        },
        Ask::Coalition => CoordRequest::Fetch { round: 1 },
    };
    match coord_within(link, &req, within).await {
        Ok(CoordResponse::Ack) => Reply::Ack,
        Ok(CoordResponse::Error { reason }) => Reply::Refused(reason),
        Ok(CoordResponse::DiscPlan {
            target,
            nodes,
            members,
        }) => Reply::Plan {
            target,
            nodes,
            members,
        },
        Ok(CoordResponse::Coalition { members, sizes }) => Reply::Coalition { members, sizes },
        Err(ExchangeError::TimedOut) => Reply::TimedOut,
        other => Reply::Other(format!("{other:?}")),
    }
}
