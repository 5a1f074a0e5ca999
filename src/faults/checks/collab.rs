//! The checks of a faulty FedCollab run: did the silos finish, did each get its coalition, did
//! a silent or slow coalition member cost its coalition only what the excuse rule promises, and
//! how much accuracy did the faults cost.
//! Owns: [`CollabInputs`], what a driver saw of such a run (each silo's rounds, its coalition,
//! the rounds whose pull waited its whole budget), and the verdicts over it
//! ([`evaluate_collab`]): `liveness` and `accuracy` (as a coordinated run's), `coalition` and
//! `pace`.
//! Must not: run, time or apply anything; or know how a pull ends (the member engine's excuse
//! rule appears here only as the bound it promises: [`strikes_within`]).
//!
//! Clock: rounds. The faults of federation round `r` are applied at `r − 0.5`; a pull's round
//! counts from 0 (FL round `r` pulls round `r − 1`).

use super::coordinated::{accuracies, accuracy_check, liveness};
use super::{Applied, CoordInputs, Report, SiloRun, check, records, strikes_within};
use crate::faults::{Presence, Schedule};
use crate::trace::EvalRecord;
use serde_json::json;

/// What the checks of a FedCollab run read.
pub struct CollabInputs<'a> {
    /// The schedule that was run.
    pub schedule: &'a Schedule,
    /// The faults as applied.
    pub applied: &'a [Applied],
    /// Rounds of the run.
    pub rounds: u64,
    /// Every silo's run (`attached`: the federation rounds it trained in a coalition).
    pub silos: &'a [SiloRun],
    /// Each silo's coalition, itself included (empty: it never got one).
    pub coalitions: &'a [Vec<usize>],
    /// Each silo's FL rounds (from 0) whose pull waited its whole budget for an awaited member.
    pub waited: &'a [Vec<u64>],
    /// Each silo's final score in the same run without faults.
    pub baseline: Option<&'a [EvalRecord]>,
}

/// Every verdict of a faulty FedCollab run.
pub fn evaluate_collab(i: &CollabInputs<'_>) -> Report {
    let as_coord = CoordInputs {
        schedule: i.schedule,
        applied: i.applied,
        rounds: i.rounds,
        silos: i.silos,
        closed: &[],
        baseline: i.baseline,
    };
    let mut checks = vec![liveness(&as_coord), coalition(i), pace(i)];
    let (acc, base) = accuracies(&as_coord);
    checks.extend(accuracy_check(i.schedule, acc, base));
    Report {
        pass: checks.iter().all(|c| c.pass),
        checks,
        applied: records(i.applied),
        accuracy: acc,
        baseline_accuracy: base,
    }
}

/// Every silo that stayed got its coalition and trained its last round in it.
fn coalition(i: &CollabInputs<'_>) -> super::Check {
    let stayed: Vec<usize> = (0..i.silos.len()).filter(|&s| !i.silos[s].left).collect();
    let without: Vec<usize> = stayed
        .iter()
        .copied()
        .filter(|&s| i.coalitions[s].is_empty() || !i.silos[s].attached.contains(&i.rounds))
        .collect();
    let sizes: Vec<usize> = stayed.iter().map(|&s| i.coalitions[s].len()).collect();
    check(
        "coalition",
        without.is_empty(),
        if without.is_empty() {
            format!(
                "all {} silos that stayed trained their last round in their coalition",
                stayed.len()
            )
        } else {
            format!("silos {without:?} did not train their last round in a coalition")
        },
        vec![("without", json!(without)), ("sizes", json!(sizes))],
    )
}

/// The rounds whose pull waited out its budget stay within what the faults explain, for every
/// silo that stayed: per coalition member that went silent or slower than the budget, the
/// excuse rule's strikes (with a first excuse of at least one round); per round this silo was
/// itself that slow, one; per round with message loss in force, one, and one more per loss
/// window. A coordinator restart explains none: the coalitions run without it.
fn pace(i: &CollabInputs<'_>) -> super::Check {
    let timeline = i.schedule.timeline(i.rounds);
    let fetch_ms = (i.schedule.config.fetch_s * 1e3) as u64;
    let k = i.schedule.clients;
    let mut silent = vec![false; k];
    let mut slow_rounds = vec![0u64; k];
    let (mut lossy_rounds, mut lossy_before) = (0u64, false);
    for r in 1..=i.rounds {
        let st = timeline.at(r);
        for s in 0..k {
            let slow = st.delay_ms[s] >= fetch_ms;
            silent[s] |= st.presence[s] == Presence::Left || slow;
            slow_rounds[s] += u64::from(slow);
        }
        let lossy = st.loss.is_some();
        lossy_rounds += u64::from(lossy) + u64::from(lossy && !lossy_before);
        lossy_before = lossy;
    }
    let per_member = strikes_within(i.rounds, i.schedule.config.excuse_rounds.max(1));
    let mut over = Vec::new();
    let mut worst = (0u64, 0u64);
    for s in (0..i.silos.len()).filter(|&s| !i.silos[s].left) {
        let mates = i.coalitions[s]
            .iter()
            .filter(|&&m| m != s && silent[m])
            .count() as u64;
        let allowed = mates * per_member + slow_rounds[s] + lossy_rounds;
        let waited = i.waited[s].len() as u64;
        if waited > allowed {
            over.push((s, waited, allowed));
        }
        if waited >= worst.0 {
            worst = (waited, allowed);
        }
    }
    check(
        "pace",
        over.is_empty(),
        if over.is_empty() {
            format!(
                "no silo's pulls waited out their budget more often than the faults explain \
                 (at most {} rounds, allowed {})",
                worst.0, worst.1
            )
        } else {
            format!("(silo, rounds that waited, allowed): {over:?}")
        },
        vec![
            ("over", json!(over)),
            ("waited", json!(i.waited)),
            ("per_silent_member", json!(per_member)),
            ("lossy_rounds", json!(lossy_rounds)),
        ],
    )
}
