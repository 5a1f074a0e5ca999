//! The one way a coordinated or FedCollab node talks to its swarm (rust-libp2p's file-sharing
//! pattern): a cloneable [`Client`] sends commands over a bounded channel to the event loop
//! that owns the swarm; each request carries a [`Reply`] the event loop keeps in a
//! [`Pending`] map until the answer or the failure arrives.
//! Owns: why an exchange gave no answer ([`ExchangeError`]), which answers mean "not yet"
//! ([`Answer`]), waiting for an answer within a limit and retrying within a budget
//! ([`Client::request_until`], decided on typed errors only), routing an exchange's answers to
//! the requests waiting for them ([`Pending`], [`route_coord_event`]), and racing a node's work
//! against its shutdown ([`or_stop`]).
//! Must not: own a swarm or a behaviour (each node's event loop does), decide what a node does
//! with an answer (its round loop does), or serve coordinator requests (nodes serve none).

use super::behaviour::{Exchange, Message};
use crate::protocol::{CollabResponse, CoordRequest, CoordResponse};
use libp2p::futures::FutureExt;
use libp2p::request_response::{self as rr, OutboundRequestId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Room in a node's command channel: every task of a node waits for its answers, so a few
/// dozen requests in flight is the most a node has.
pub(super) const COMMANDS: usize = 64;

/// Why a request made of a swarm task got no answer. A refusal is an answer
/// (`CoordResponse::Error`), not one of these.
#[derive(Debug, thiserror::Error)]
pub(super) enum ExchangeError {
    /// The request failed in libp2p (dial, timeout, connection closed, protocol unsupported).
    #[error(transparent)]
    Failed(#[from] rr::OutboundFailure),
    /// The request named a silo index the node does not know.
    #[error("no silo {0}")]
    NoSilo(usize),
    /// The swarm task is gone (the node is shutting down).
    #[error("swarm task ended")]
    SwarmEnded,
    /// No answer within the caller's limit.
    #[error("timed out")]
    TimedOut,
}

impl ExchangeError {
    /// Worth asking again: the peer may be reachable later (not a node shutting down or a
    /// silo that does not exist).
    pub(super) fn transient(&self) -> bool {
        matches!(self, ExchangeError::Failed(_) | ExchangeError::TimedOut)
    }
}

/// An answer that may say "not yet": [`Client::request_until`] asks again on it as on a
/// transient failure.
pub(super) trait Answer {
    /// The peer cannot answer yet and asks to be asked again.
    fn not_ready(&self) -> bool {
        false
    }
}

/// The coordinator holds what is not ready (or refuses): it never says "not yet".
impl Answer for CoordResponse {}

impl Answer for CollabResponse {
    fn not_ready(&self) -> bool {
        matches!(self, CollabResponse::NotReady { .. })
    }
}

/// Where the event loop sends the answer to one request.
pub(super) type Reply<T> = oneshot::Sender<Result<T, ExchangeError>>;

/// A node's handle on its event loop: commands of type `C` over a bounded channel.
pub(super) struct Client<C> {
    commands: mpsc::Sender<C>,
}

impl<C> Clone for Client<C> {
    fn clone(&self) -> Self {
        Self {
            commands: self.commands.clone(),
        }
    }
}

impl<C> Client<C> {
    /// A client and the receiving end its event loop reads.
    pub(super) fn new() -> (Self, mpsc::Receiver<C>) {
        let (commands, rx) = mpsc::channel(COMMANDS);
        (Self { commands }, rx)
    }

    /// Hands the event loop a command that needs no answer.
    pub(super) async fn tell(&self, cmd: C) -> Result<(), ExchangeError> {
        self.commands
            .send(cmd)
            .await
            .map_err(|_| ExchangeError::SwarmEnded)
    }

    /// Hands the event loop a request made by `make` and waits for its answer (for requests
    /// the event loop answers itself; one that goes to a peer needs a limit).
    pub(super) async fn ask<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> C,
    ) -> Result<T, ExchangeError> {
        let (tx, rx) = oneshot::channel();
        self.tell(make(tx)).await?;
        rx.await.unwrap_or(Err(ExchangeError::SwarmEnded))
    }

    /// One request, answered within `limit` (else [`ExchangeError::TimedOut`]).
    pub(super) async fn request_within<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> C,
        limit: Duration,
    ) -> Result<T, ExchangeError> {
        tokio::time::timeout(limit, self.ask(make))
            .await
            .unwrap_or(Err(ExchangeError::TimedOut))
    }

    /// A request asked again every `retry_every` while it fails transiently or the answer is
    /// "not ready", as long as another try fits before `until`: the last answer or failure (a
    /// request cut short by `until` is [`ExchangeError::TimedOut`]). Refusals and other answers
    /// come back at once.
    pub(super) async fn request_until<T: Answer>(
        &self,
        make: impl Fn(Reply<T>) -> C,
        until: Instant,
        retry_every: Duration,
    ) -> Result<T, ExchangeError> {
        let end = tokio::time::sleep_until(until);
        // Past this, a pause and another try would not fit before `until`.
        let last_try = tokio::time::sleep_until(until.checked_sub(retry_every).unwrap_or(until));
        tokio::pin!(end, last_try);
        loop {
            let r = tokio::select! {
                biased;
                _ = &mut end => return Err(ExchangeError::TimedOut),
                r = self.ask(&make) => r,
            };
            let again = match &r {
                Ok(a) => a.not_ready(),
                Err(e) => e.transient(),
            };
            if !again || last_try.as_mut().now_or_never().is_some() {
                return r;
            }
            tokio::time::sleep(retry_every).await;
        }
    }
}

/// `work`'s output, or `None` once `shutdown` resolves first.
pub(super) async fn or_stop<S: Future<Output = ()>, T>(
    shutdown: &mut Pin<&mut S>,
    work: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        _ = shutdown.as_mut() => None,
        t = work => Some(t),
    }
}

/// The requests an event loop sent on one exchange, waiting for their answers.
pub(super) struct Pending<Resp>(HashMap<OutboundRequestId, Reply<Resp>>);

impl<Resp> Default for Pending<Resp> {
    fn default() -> Self {
        Self(HashMap::new())
    }
}

impl<Resp: Message> Pending<Resp> {
    /// Sends `req` to `peer` on `exchange`; its answer goes to `reply`.
    pub(super) fn send<Req: Message>(
        &mut self,
        exchange: &mut Exchange<Req, Resp>,
        peer: &libp2p::PeerId,
        req: Req,
        reply: Reply<Resp>,
    ) {
        let id = exchange.send_request(peer, req);
        self.0.insert(id, reply);
    }

    /// One event of the exchange: an answer or a failure goes to the request waiting for it;
    /// anything else (requests from peers, notices about responses sent) comes back.
    pub(super) fn route<Req: Message>(
        &mut self,
        ev: rr::Event<Req, Resp>,
    ) -> Option<rr::Event<Req, Resp>> {
        match ev {
            rr::Event::Message {
                message:
                    rr::Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => {
                if let Some(r) = self.0.remove(&request_id) {
                    let _ = r.send(Ok(response));
                }
                None
            }
            rr::Event::OutboundFailure {
                request_id, error, ..
            } => {
                if let Some(r) = self.0.remove(&request_id) {
                    let _ = r.send(Err(ExchangeError::Failed(error)));
                }
                None
            }
            ev => Some(ev),
        }
    }
}

/// One event of a node's coordinator exchange: answers and failures go to their requests; a
/// request is refused (nodes serve none).
pub(super) fn route_coord_event(
    ev: rr::Event<CoordRequest, CoordResponse>,
    pending: &mut Pending<CoordResponse>,
    exchange: &mut Exchange<CoordRequest, CoordResponse>,
) {
    if let Some(rr::Event::Message {
        message: rr::Message::Request { channel, .. },
        ..
    }) = pending.route(ev)
    {
        let _ = exchange.send_response(
            channel,
            CoordResponse::Error {
                reason: "nodes serve no coordinator requests".into(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake event loop: answers each request with the next of `answers`.
    fn serve(mut rx: mpsc::Receiver<Reply<CollabResponse>>, answers: Vec<CollabResponse>) {
        tokio::spawn(async move {
            let mut answers = answers.into_iter();
            while let Some(reply) = rx.recv().await {
                let _ = reply.send(answers.next().ok_or(ExchangeError::NoSilo(9)));
            }
        });
    }

    // Paused time: the retries run on tokio's virtual clock, so a loaded machine cannot push a
    // retry past the budget.
    #[tokio::test(start_paused = true)]
    async fn not_ready_is_asked_again_and_a_refusal_is_final() {
        let (client, rx) = Client::<Reply<CollabResponse>>::new();
        let not_ready = || CollabResponse::NotReady {
            reason: "no plan".into(),
        };
        let refused = CollabResponse::Error {
            reason: "no".into(),
        };
        serve(
            rx,
            vec![
                not_ready(),
                not_ready(),
                refused.clone(),
                CollabResponse::Ack,
            ],
        );
        let until = Instant::now() + Duration::from_secs(10);
        let r = client
            .request_until(|r| r, until, Duration::from_millis(10))
            .await;
        assert_eq!(r.unwrap(), refused);
    }

    // Paused time: the retries run on tokio's virtual clock, so a loaded machine cannot push a
    // retry past the budget.
    #[tokio::test(start_paused = true)]
    async fn the_budget_ends_with_the_last_answer() {
        let (client, rx) = Client::<Reply<CollabResponse>>::new();
        let not_ready = CollabResponse::NotReady {
            reason: "no plan".into(),
        };
        serve(rx, vec![not_ready.clone(); 100]);
        let until = Instant::now() + Duration::from_millis(300);
        let r = client
            .request_until(|r| r, until, Duration::from_millis(20))
            .await;
        assert_eq!(r.unwrap(), not_ready);
        // A gone event loop is not asked again.
        let (client, rx) = Client::<Reply<CollabResponse>>::new();
        drop(rx);
        let r = client
            .request_until(
                |r| r,
                until + Duration::from_secs(5),
                Duration::from_millis(200),
            )
            .await;
        assert!(matches!(r, Err(ExchangeError::SwarmEnded)), "{r:?}");
    }
}
