//! The checks of a faulty coordinated run (FedDisco, HCCT, FedSaC): did the silos finish, did
//! the coordinator keep its pace, did the silos come back to it after it restarted, and how
//! much accuracy did the faults cost.
//! Owns: [`CoordInputs`], what a driver saw of such a run (each silo's rounds, each closed
//! coordinator round), and the verdicts over it ([`evaluate_coordinated`]): `liveness`,
//! `pace`, `reattach` and `accuracy`, or under an attack `poisoning` (the honest silos'
//! accuracy, the attackers' own left out).
//! Must not: run, time or apply anything; or know how a round closes (the engine's excuse rule
//! appears here only as the bound it promises: [`strikes_within`]).
//!
//! Clock: rounds. The faults of federation round `r` are applied at `r − 0.5`.

use super::{Applied, Report, accuracy, check, records};
use crate::faults::{Fault, Schedule};
use crate::trace::EvalRecord;
use serde_json::json;

/// One silo's run, as its driver saw it.
#[derive(Clone, Debug, Default)]
pub struct SiloRun {
    /// It left (the schedule's `leave`): it is not expected to finish.
    pub left: bool,
    /// It finished every round and took its final model.
    pub finished: bool,
    /// The federation rounds it trained from the coordinator's model (attached), ascending.
    pub attached: Vec<u64>,
    /// Its final score (`None`: it did not finish).
    pub last: Option<EvalRecord>,
}

/// One closed coordinator round.
#[derive(Clone, Debug)]
pub struct ClosedRound {
    /// The coordinator's round.
    pub round: u64,
    /// It closed at its deadline, without every awaited member.
    pub timed_out: bool,
    /// The algorithm's record of the round, as in its round log (`Null` when none).
    pub record: serde_json::Value,
}

/// What the checks of a coordinated run read.
pub struct CoordInputs<'a> {
    /// The schedule that was run.
    pub schedule: &'a Schedule,
    /// The faults as applied (at `r − 0.5` for round `r`).
    pub applied: &'a [Applied],
    /// Rounds of the run.
    pub rounds: u64,
    /// Every silo's run.
    pub silos: &'a [SiloRun],
    /// Every round the coordinator closed, in order (all of its lives).
    pub closed: &'a [ClosedRound],
    /// Each silo's final score in the same run without faults.
    pub baseline: Option<&'a [EvalRecord]>,
}

/// How many times one member that stays silent from the start of a run of `rounds` rounds can
/// make a round time out under the excuse rule: each time costs one round at the deadline,
/// then `excuse_rounds` × 1, 2, 4, … (at most 64) rounds that do not wait for it. With
/// `excuse_rounds = 0` every round can.
pub fn strikes_within(rounds: u64, excuse_rounds: u64) -> u64 {
    if excuse_rounds == 0 {
        return rounds;
    }
    let (mut used, mut strikes) = (0u64, 0u64);
    while used < rounds {
        strikes += 1;
        let factor = 1u64 << (strikes - 1).min(6);
        used = used
            .saturating_add(1)
            .saturating_add(excuse_rounds.saturating_mul(factor));
    }
    strikes
}

/// Every verdict of a faulty coordinated run.
pub fn evaluate_coordinated(i: &CoordInputs<'_>) -> Report {
    let mut checks = vec![liveness(i), pace(i)];
    let restarts: Vec<u64> = i
        .applied
        .iter()
        .filter(|a| a.fault == Fault::CoordinatorRestart)
        .map(|a| (a.at + 0.5) as u64)
        .collect();
    if !restarts.is_empty() {
        checks.push(reattach(i, &restarts));
    }
    let (acc, base) = accuracies(i);
    let attacked = i.schedule.events.iter().any(|e| e.fault.kind() == "attack");
    if attacked {
        checks.push(poisoning(i));
    } else {
        checks.extend(accuracy_check(i.schedule, acc, base));
    }
    Report {
        pass: checks.iter().all(|c| c.pass),
        checks,
        applied: records(i.applied),
        accuracy: acc,
        baseline_accuracy: base,
    }
}

/// The mean final accuracy of the silos that finished, and theirs without the faults.
pub(super) fn accuracies(i: &CoordInputs<'_>) -> (Option<f64>, Option<f64>) {
    let finished: Vec<usize> = (0..i.silos.len())
        .filter(|&s| i.silos[s].finished)
        .collect();
    let acc = accuracy(finished.iter().filter_map(|&s| i.silos[s].last));
    let base = i
        .baseline
        .and_then(|b| accuracy(finished.iter().filter_map(|&s| b.get(s).copied())));
    (acc, base)
}

/// The faults cost at most the schedule's tolerance in accuracy (no check without a
/// baseline).
pub(super) fn accuracy_check(
    schedule: &Schedule,
    acc: Option<f64>,
    base: Option<f64>,
) -> Option<super::Check> {
    let (a, b) = (acc?, base?);
    let tol = schedule.config.accuracy_tolerance;
    Some(check(
        "accuracy",
        a >= b - tol,
        format!(
            "the silos that finished score {a:.2} % against {b:.2} % without the faults \
             (tolerance {tol} points)"
        ),
        vec![("accuracy", json!(a)), ("fault_free", json!(b))],
    ))
}

/// Members that poison the models they send (issue 38): the honest silos that finished score
/// within `attack_tolerance` points of the same silos in the run without faults; the
/// attackers' own scores are left out of both. The weight the coordinator gave the attackers in
/// its last round is reported, not judged ([`attackers_share`]).
pub(super) fn poisoning(i: &CoordInputs<'_>) -> super::Check {
    let (attacker, kinds) = super::rules::attackers(i.schedule);
    let honest: Vec<usize> = (0..i.silos.len())
        .filter(|&s| i.silos[s].finished && !attacker[s])
        .collect();
    let acc = accuracy(honest.iter().filter_map(|&s| i.silos[s].last));
    let base = i
        .baseline
        .and_then(|b| accuracy(honest.iter().filter_map(|&s| b.get(s).copied())));
    let tol = i.schedule.config.attack_tolerance;
    let attackers: Vec<usize> = (0..attacker.len()).filter(|&s| attacker[s]).collect();
    let mut figures = vec![
        ("attacks", json!(kinds)),
        ("attackers", json!(attackers)),
        ("honest_silos_compared", json!(honest.len())),
        ("tolerance", json!(tol)),
    ];
    let share = i
        .closed
        .last()
        .and_then(|c| attackers_share(&c.record, &attacker));
    if let Some((mean, max)) = share {
        figures.push(("attacker_weight_mean", json!(super::rules::round3(mean))));
        figures.push(("attacker_weight_max", json!(super::rules::round3(max))));
    }
    let (pass, detail) = match (acc, base) {
        (Some(a), Some(b)) => {
            figures.push(("honest_accuracy", json!(a)));
            figures.push(("clean_accuracy", json!(b)));
            let mut verdict = format!("honest silos {a:.2} % vs {b:.2} % without the attack");
            if let Some((mean, max)) = share {
                verdict += &format!(
                    "; attackers hold {mean:.3} of honest rows on average (at most {max:.3})"
                );
            }
            match b - a > tol {
                true => (
                    false,
                    format!("{verdict}: {:.2} points lost (> {tol})", b - a),
                ),
                false => (true, verdict),
            }
        }
        _ => (
            false,
            "no fault-free run to compare the honest silos' accuracy with (set faults.baseline)"
                .into(),
        ),
    };
    check("poisoning", pass, detail, figures)
}

/// The weight the coordinator gave the attackers in a closed round's `record` (its round log
/// line): `(mean, max)` over the honest silos' rows, or `None` for a record that says nothing
/// of weights.
/// - FedDisco (`peers`, `weights`): the attackers' share of the global, the same for every
///   silo.
/// - FedSaC (`senders`, `graph`): each honest sender's graph row, its entries on attackers
///   (with `Krum`, over the row's kept entries: the `dropped` count 0).
/// - HCCT (`groups`): each honest silo's group, the attackers' share of its members (HCCT
///   weighs them by their sizes; this counts heads).
pub(super) fn attackers_share(record: &serde_json::Value, attacker: &[bool]) -> Option<(f64, f64)> {
    let is_attacker = |s: usize| attacker.get(s) == Some(&true);
    // A member's index from its name (`silo-000003`) or index.
    let index = |v: &serde_json::Value| -> Option<usize> {
        v.as_u64().map(|x| x as usize).or_else(|| {
            v.as_str()
                .and_then(|n| n.rsplit('-').next())
                .and_then(|d| d.parse().ok())
        })
    };
    let rows: Vec<f64> = if let (Some(peers), Some(weights)) =
        (record["peers"].as_array(), record["weights"].as_array())
    {
        let w: f64 = peers
            .iter()
            .zip(weights)
            .filter(|(p, _)| index(p).is_some_and(is_attacker))
            .filter_map(|(_, w)| w.as_f64())
            .sum();
        vec![w]
    } else if let (Some(senders), Some(graph)) =
        (record["senders"].as_array(), record["graph"].as_array())
    {
        // Columns: the senders, then the stale members.
        let cols: Vec<Option<usize>> = senders
            .iter()
            .chain(record["stale"].as_array().into_iter().flatten())
            .map(index)
            .collect();
        let dropped: Vec<usize> = record["dropped"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(index)
            .collect();
        let mixed = |c: &Option<usize>| c.is_none_or(|c| !dropped.contains(&c));
        senders
            .iter()
            .zip(graph)
            .filter(|(s, _)| index(s).is_some_and(|s| !is_attacker(s)))
            .filter_map(|(_, row)| row.as_array())
            .map(|row| {
                let entries = || {
                    row.iter()
                        .zip(&cols)
                        .filter(|(_, c)| mixed(c))
                        .filter_map(|(w, c)| Some((w.as_f64()?, c)))
                };
                let kept: f64 = entries().map(|(w, _)| w).sum();
                let bad: f64 = entries()
                    .filter(|(_, c)| c.is_some_and(is_attacker))
                    .map(|(w, _)| w)
                    .sum();
                if kept > 0.0 { bad / kept } else { 0.0 }
            })
            .collect()
    } else if let Some(groups) = record["groups"].as_array() {
        groups
            .iter()
            .filter_map(|g| g.as_array())
            .map(|g| g.iter().filter_map(index).collect::<Vec<usize>>())
            .flat_map(|g| {
                let bad = g.iter().filter(|&&s| is_attacker(s)).count() as f64 / g.len() as f64;
                let honest = g.iter().filter(|&&s| !is_attacker(s)).count();
                std::iter::repeat_n(bad, honest)
            })
            .collect()
    } else {
        return None;
    };
    if rows.is_empty() {
        return None;
    }
    let max = rows.iter().copied().fold(0.0f64, f64::max);
    Some((rows.iter().sum::<f64>() / rows.len() as f64, max))
}

/// Every silo that did not leave finished every round.
pub(super) fn liveness(i: &CoordInputs<'_>) -> super::Check {
    let expected: Vec<usize> = (0..i.silos.len()).filter(|&s| !i.silos[s].left).collect();
    let stuck: Vec<usize> = expected
        .iter()
        .copied()
        .filter(|&s| !i.silos[s].finished)
        .collect();
    check(
        "liveness",
        stuck.is_empty(),
        if stuck.is_empty() {
            format!(
                "all {} silos that stayed finished the {} rounds",
                expected.len(),
                i.rounds
            )
        } else {
            format!("silos {stuck:?} did not finish")
        },
        vec![
            ("expected", json!(expected.len())),
            ("unfinished", json!(stuck)),
        ],
    )
}

/// The coordinator's rounds that waited out their deadline stay within what the faults
/// explain: per silo that went silent or slow, the excuse rule's strikes (with a first excuse
/// of at least one round, so every such silo costs ever fewer deadlines); per coordinator
/// restart, three (the round the crash cut, the first after the restart, which excuses
/// nobody, and the next, whose updates come late from silos still training detached when it
/// came back); per round with message loss in force, one, and one more per loss window (an
/// update lost in its last round is given up only after the exchange's `within`).
fn pace(i: &CoordInputs<'_>) -> super::Check {
    let timeline = i.schedule.timeline(i.rounds);
    let tau_ms = (i.schedule.config.update_deadline_s * 1e3) as u64;
    let mut silent = vec![false; i.schedule.clients];
    let mut lossy_rounds = 0u64;
    let mut restarts = 0u64;
    let mut lossy_before = false;
    for r in 1..=i.rounds {
        let st = timeline.at(r);
        for (s, flag) in silent.iter_mut().enumerate() {
            *flag |= st.presence[s] == crate::faults::Presence::Left || st.delay_ms[s] >= tau_ms;
        }
        let lossy = st.loss.is_some();
        // Each loss window counts its rounds and one more.
        lossy_rounds += u64::from(lossy) + u64::from(lossy && !lossy_before);
        lossy_before = lossy;
        restarts += timeline
            .fired(r)
            .iter()
            .filter(|f| **f == Fault::CoordinatorRestart)
            .count() as u64;
    }
    let silent_n = silent.iter().filter(|&&s| s).count() as u64;
    // The promise is the excuse rule's with at least one round of excuse: a run configured
    // to wait for everyone every round (excuse_rounds = 0) does not keep it.
    let per_silo = strikes_within(i.rounds, i.schedule.config.excuse_rounds.max(1));
    let allowed = silent_n * per_silo + 3 * restarts + lossy_rounds;
    let timed_out: Vec<u64> = i
        .closed
        .iter()
        .filter(|c| c.timed_out)
        .map(|c| c.round)
        .collect();
    check(
        "pace",
        timed_out.len() as u64 <= allowed,
        format!(
            "{} of {} coordinator rounds waited out their deadline; the faults explain at most \
             {allowed} ({silent_n} silent or slow silos × {per_silo}, {restarts} restarts × 3, \
             {lossy_rounds} for lost messages)",
            timed_out.len(),
            i.closed.len()
        ),
        vec![("timed_out", json!(timed_out)), ("allowed", json!(allowed))],
    )
}

/// After each coordinator restart, every silo that stayed trains from the coordinator's model
/// again within `recovery_rounds` rounds.
fn reattach(i: &CoordInputs<'_>, restarts: &[u64]) -> super::Check {
    let within = i.schedule.config.recovery_rounds;
    let mut late = Vec::new();
    let mut worst = 0u64;
    for &r in restarts {
        for (s, silo) in i.silos.iter().enumerate().filter(|(_, s)| !s.left) {
            match silo.attached.iter().find(|&&a| a >= r) {
                Some(&a) if a - r < within => worst = worst.max(a - r),
                _ => late.push(s),
            }
        }
    }
    late.sort_unstable();
    late.dedup();
    check(
        "reattach",
        late.is_empty(),
        if late.is_empty() {
            format!(
                "every silo trained from the restarted coordinator's model within {worst} \
                 rounds (allowed {within})"
            )
        } else {
            format!(
                "silos {late:?} did not train from the coordinator's model within {within} rounds of its restart"
            )
        },
        vec![
            ("restarts", json!(restarts)),
            ("late", json!(late)),
            ("worst_rounds", json!(worst)),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_member_can_strike_ever_less_often() {
        // 100 rounds, first excuse 10: strikes at rounds 1, 12, 33, 74 (1 + 10, 1 + 20, 1 + 40).
        assert_eq!(strikes_within(100, 10), 4);
        assert_eq!(strikes_within(60, 100), 1);
        assert_eq!(strikes_within(5, 0), 5);
        assert_eq!(strikes_within(0, 3), 0);
        // Past 64× the first excuse stops growing.
        assert_eq!(strikes_within(1 + 127 + 64 * 2, 1), 9);
    }
}
