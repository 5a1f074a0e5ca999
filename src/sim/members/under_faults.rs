//! A coordinated run under a fault schedule beside the same run without faults: the faulty
//! driver ([`FaultyMembers`] for FedDisco, HCCT and FedSaC, [`FaultyCollab`] for FedCollab) and
//! the fault-free one ([`MemberRun`], [`CollabRun`]) step together, and the fault-free run's
//! final scores are the accuracy check's reference.
//! Owns: stepping both, and handing the faulty driver its reference.
//! Must not: run a round itself, or judge it (the faulty driver's checks do).

use super::super::coordinated::CoordinatedRun;
use super::super::{ClientEval, Ctx, SimError};
use super::faulty::{FaultyMembers, FaultyRun};
use super::faulty_collab::FaultyCollab;
use super::{CollabRun, MemberRun, Parts};
use crate::faults::Schedule;
use crate::faults::checks::Report;

/// A coordinated run under faults (`F`), with the same run without them beside it (`R`, the
/// accuracy check's reference, when `faults.baseline` is on).
pub(crate) struct UnderFaults<F, R> {
    faulty: F,
    fault_free: Option<R>,
    fault_free_finals: Option<Vec<crate::trace::EvalRecord>>,
}

impl UnderFaults<FaultyMembers, MemberRun> {
    /// FedDisco, HCCT or FedSaC (`parts`) under `schedule`, and `beside` (the same parts
    /// again) without faults.
    pub(crate) fn members(
        ctx: &Ctx<'_>,
        parts: Parts,
        beside: Option<Parts>,
        schedule: Schedule,
    ) -> Result<Self, SimError> {
        Ok(Self {
            faulty: FaultyMembers::new(ctx, parts, schedule)?,
            fault_free: beside.map(|p| MemberRun::new(ctx, p)),
            fault_free_finals: None,
        })
    }
}

impl UnderFaults<FaultyCollab, CollabRun> {
    /// FedCollab under `schedule`, and (`baseline`) the same run without faults beside.
    pub(crate) fn collab(
        ctx: &Ctx<'_>,
        init: &[Vec<f32>],
        baseline: bool,
        schedule: Schedule,
    ) -> Result<Self, SimError> {
        Ok(Self {
            faulty: FaultyCollab::new(ctx, init, schedule)?,
            fault_free: match baseline {
                true => Some(CollabRun::new(ctx, init)?),
                false => None,
            },
            fault_free_finals: None,
        })
    }
}

impl<F: FaultyRun, R: CoordinatedRun> CoordinatedRun for UnderFaults<F, R> {
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        self.faulty.round(ctx)?;
        if let Some(run) = self.fault_free.as_mut() {
            run.round(ctx)?;
            if self.faulty.is_last() {
                let finals = run.evaluate(ctx)?;
                self.fault_free_finals = Some(finals.into_iter().map(Into::into).collect());
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        self.faulty.evaluate(ctx)
    }

    fn record(&self) -> Option<serde_json::Value> {
        self.faulty.record()
    }

    fn fault_report(&self) -> Option<Report> {
        Some(self.faulty.report(self.fault_free_finals.as_deref()))
    }
}
