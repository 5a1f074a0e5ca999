//! The coordinator of a coordinated run under faults, as both faulty drivers
//! (`faulty.rs`, `faulty_collab.rs`) see it: its round engine while it is up, the checkpoint
//! it last wrote, its crash, and its restart from that checkpoint.
//! Owns: the engine's life (up, down, restarted from the checkpoint bytes) and turning its
//! actions into what a driver carries: answers to deliver, rounds closed.
//! Must not: carry or lose messages, read the schedule (the drivers do), or decide anything
//! about a round (the engine does).

use super::Decode;
use crate::coord::engine::{self, Answer, CoordAlgorithm, Engine, EngineConfig, Request};
use crate::faults::checks::ClosedRound;
use crate::sim::SimError;
use std::time::Instant;

/// A request's handle at the coordinator: the asking silo and its exchange.
pub(super) type Ticket = (usize, u64);

/// What the coordinator did that a driver carries out or records.
pub(super) enum Out {
    /// Answer exchange `id` of silo `to`.
    Respond { to: usize, id: u64, answer: Answer },
    /// A round closed.
    Closed(ClosedRound),
}

/// The coordinator: up (its engine) or down, and its last checkpoint.
pub(super) struct SimCoordinator {
    /// `None` while it is down.
    engine: Option<Engine<Ticket>>,
    cfg: EngineConfig,
    decode: Decode,
    saved: Option<Vec<u8>>,
}

fn invariant(e: impl std::fmt::Display) -> SimError {
    SimError::Invariant(format!("coordinator: {e}"))
}

impl SimCoordinator {
    /// A coordinator over `alg`, started at `now`; `decode` reads its checkpoint back.
    pub(super) fn start(
        alg: Box<dyn CoordAlgorithm>,
        cfg: EngineConfig,
        decode: Decode,
        now: Instant,
    ) -> Result<(Self, Vec<Out>), SimError> {
        let mut c = Self {
            engine: None,
            cfg,
            decode,
            saved: None,
        };
        let outs = c.up(alg, now)?;
        Ok((c, outs))
    }

    /// When its engine next wants [`SimCoordinator::timeout`] (never while it is down).
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.engine.as_ref().and_then(Engine::poll_timeout)
    }

    /// Silo `from`'s request `id` reaches it: what follows, or `None` while it is down (the
    /// request is refused at once).
    pub(super) fn request(
        &mut self,
        now: Instant,
        from: usize,
        id: u64,
        req: Request,
    ) -> Result<Option<Vec<Out>>, SimError> {
        let Some(e) = self.engine.as_mut() else {
            return Ok(None);
        };
        if let Err(reason) = wire_check(&req, e.algorithm().num_params()) {
            let answer = Answer::Error { reason };
            return Ok(Some(vec![Out::Respond {
                to: from,
                id,
                answer,
            }]));
        }
        e.handle_request(now, &self.cfg.names[from], Some(from), req, (from, id))
            .map_err(invariant)?;
        Ok(Some(self.drain()))
    }

    /// Its deadline, if due by `now`.
    pub(super) fn timeout(&mut self, now: Instant) -> Result<Vec<Out>, SimError> {
        match self.engine.as_mut() {
            Some(e) if e.poll_timeout().is_some_and(|t| t <= now) => {
                e.handle_timeout(now).map_err(invariant)?;
                Ok(self.drain())
            }
            _ => Ok(Vec::new()),
        }
    }

    /// Killed: everything since its last checkpoint is lost.
    pub(super) fn crash(&mut self) {
        self.engine = None;
    }

    /// Restarted from its last checkpoint at `now`.
    pub(super) fn restart(&mut self, now: Instant) -> Result<Vec<Out>, SimError> {
        let bytes = self.saved.as_deref().ok_or_else(|| {
            SimError::Invariant("the coordinator restarts without a checkpoint".into())
        })?;
        let alg = (self.decode)(bytes)
            .map_err(|e| SimError::Invariant(format!("coordinator checkpoint: {e}")))?;
        self.up(alg, now)
    }

    fn up(&mut self, alg: Box<dyn CoordAlgorithm>, now: Instant) -> Result<Vec<Out>, SimError> {
        let mut e = Engine::new(alg, self.cfg.clone());
        e.handle_start(now).map_err(invariant)?;
        self.engine = Some(e);
        Ok(self.drain())
    }

    /// The engine's actions: answers and closed rounds out, checkpoints kept.
    fn drain(&mut self) -> Vec<Out> {
        let mut outs = Vec::new();
        // The round's log line comes before its close.
        let mut record = serde_json::Value::Null;
        while let Some(action) = self.engine.as_mut().and_then(Engine::poll_action) {
            match action {
                engine::Action::Respond {
                    ticket: (to, id),
                    answer,
                } => outs.push(Out::Respond { to, id, answer }),
                engine::Action::Save { bytes: Ok(b), .. } => self.saved = Some(b),
                engine::Action::LogRound(line) => record = line.record,
                engine::Action::Event(engine::Event::RoundClosed {
                    round, timed_out, ..
                }) => outs.push(Out::Closed(ClosedRound {
                    round,
                    timed_out,
                    record: std::mem::take(&mut record),
                })),
                _ => {}
            }
        }
        outs
    }
}

/// The network coordinator's check of a model before the engine sees it
/// ([`crate::protocol::check_model`]): a silo whose training diverged under a poisoned mix
/// sends non-finite values, and is refused as over the wire.
fn wire_check(req: &Request, num_params: usize) -> Result<(), String> {
    match req {
        Request::Update { params, .. } => crate::protocol::check_model(params, None, num_params),
        Request::Contribute {
            params, subspace, ..
        } => crate::protocol::check_model(params, subspace.as_deref(), num_params),
        _ => Ok(()),
    }
}
