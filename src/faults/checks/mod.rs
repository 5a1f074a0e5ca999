//! Did the federation survive? Pass/fail checks over the per-round traces of a faulty run.
//!
//! Owns: the definition of every check (liveness, memory of collaborators, recovery, crash
//! safety, late join, clean exits), the figures behind each verdict, and their printed and JSON
//! forms. Both drivers feed it the same inputs: every silo's [`NodeRound`] trace, the faults as
//! they were applied on the same clock as the trace's `at`, and what only a driver can know
//! (checkpoint reads, exit statuses).
//! Must not: run, time or apply anything.
//!
//! Clocks: a node's record says when its round ended (`at`, Unix seconds) and the swarm logs the
//! time it applied each fault; the simulator writes round `r` at `at = r` and applies the faults
//! of round `r` at `r − 0.5`. "During a partition" means a record with `at` in (partition, heal].
//!
//! Layout: the inputs, the report and the windows derived from the schedule are here; each
//! check's definition is in `rules.rs`.

mod collab;
mod coordinated;
mod rules;
#[cfg(test)]
mod tests;

pub use collab::{CollabInputs, evaluate_collab};
pub use coordinated::{ClosedRound, CoordInputs, SiloRun, evaluate_coordinated, strikes_within};
use rules::{clean_exit, crash_safety, late_join, liveness, memory, poisoning, recovery};

use super::{Fault, Schedule};
use crate::trace::{EvalRecord, NodeRound};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// A fault as a driver applied it, on the traces' clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// When (see the module doc for the clock).
    pub at: f64,
    /// What.
    pub fault: Fault,
}

impl Applied {
    /// `partition [[0, 1], [2, 3]]`, `crash silo 5`, `heal`, ...
    pub fn describe(&self) -> String {
        match &self.fault {
            Fault::Partition(g) => format!("partition {g:?}"),
            Fault::Delay { silo, ms } => format!("delay silo {silo} by {ms} ms"),
            Fault::Loss { fraction, silos } => match silos {
                Some(s) => format!("loss {fraction} on silos {s:?}"),
                None => format!("loss {fraction}"),
            },
            Fault::Attack { silos, attack } => match attack {
                Some(a) => format!("attack {} by silos {silos:?}", a.describe()),
                None => format!("attack ends on silos {silos:?}"),
            },
            other => match other.silo() {
                Some(silo) => format!("{} silo {silo}", other.kind()),
                None => other.kind().to_string(),
            },
        }
    }
}

/// An applied fault as reports show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppliedRecord {
    /// When, on the traces' clock.
    pub at: f64,
    /// What ([`Applied::describe`]).
    pub what: String,
}

/// What a driver saw of one crash of one silo.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CrashEvidence {
    /// The silo.
    pub silo: u32,
    /// Its checkpoint read back after the kill (`Err`: why not; `Ok(None)`: none written yet).
    pub checkpoint: Result<Option<u64>, String>,
    /// Its peer ID before the crash and after the restart (equal for a healthy restart).
    pub peer_ids: Option<(String, String)>,
}

/// How one process ended (swarm only).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExitEvidence {
    /// The silo.
    pub silo: u32,
    /// Every exit of its processes: `"ok"`, `"killed by the schedule"`, or what went wrong.
    pub exits: Vec<String>,
    /// Lines of its logs that report a panic or an error.
    pub bad_lines: Vec<String>,
}

/// Everything the checks look at.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// The schedule that was run.
    pub schedule: &'a Schedule,
    /// The faults as applied, in order.
    pub applied: &'a [Applied],
    /// Every silo's trace, in round order, all of its lives concatenated.
    pub traces: &'a [Vec<NodeRound>],
    /// The data group of each silo, where the split has groups.
    pub groups: Option<&'a [usize]>,
    /// Each silo's final test score in the same run without faults.
    pub baseline: Option<&'a [Option<EvalRecord>]>,
    /// The longest a round may take: the deadlines plus the driver's compute allowance.
    pub round_budget_s: f64,
    /// On the traces' clock, how long a partition must last for every live silo to be
    /// expected to complete a round in it (the simulator: 1 round; a swarm: the budget).
    pub stall_after: f64,
    /// `suspect_after` of the FedeRiCo configuration.
    pub suspect_after: u32,
    /// One entry per crash applied, in order.
    pub crashes: &'a [CrashEvidence],
    /// Process exits and log scans (swarm only).
    pub exits: Option<&'a [ExitEvidence]>,
}

/// One verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// `liveness`, `memory`, `recovery`, `crash_safety`, `late_join`, `clean_exit`.
    pub name: String,
    /// Passed?
    pub pass: bool,
    /// One line saying why.
    pub detail: String,
    /// The figures behind the verdict.
    pub figures: BTreeMap<String, Value>,
}

/// All verdicts of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Every check passed.
    pub pass: bool,
    /// The verdicts.
    pub checks: Vec<Check>,
    /// The faults as applied.
    pub applied: Vec<AppliedRecord>,
    /// Final accuracy (percent, test-size weighted) of this run and of the fault-free run, over
    /// the silos that finished.
    pub accuracy: Option<f64>,
    /// The same for the fault-free run.
    pub baseline_accuracy: Option<f64>,
}

impl Report {
    /// `PASS liveness: …` lines, one per check, with the figures.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let applied: Vec<String> = self
            .applied
            .iter()
            .map(|a| format!("{} @ {}", a.what, a.at))
            .collect();
        out.push_str(&format!("faults applied: {}\n", applied.join(", ")));
        for c in &self.checks {
            let figures: Vec<String> = c.figures.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!(
                "{} {:<13} {}\n    {}\n",
                if c.pass { "PASS" } else { "FAIL" },
                c.name,
                c.detail,
                figures.join("  ")
            ));
        }
        out.push_str(if self.pass {
            "all checks passed\n"
        } else {
            "SOME CHECKS FAILED\n"
        });
        out
    }
}

fn check(name: &'static str, pass: bool, detail: String, figures: Vec<(&str, Value)>) -> Check {
    Check {
        name: name.to_string(),
        pass,
        detail,
        figures: figures
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    }
}

/// A partition window: when it started and ended, and each silo's side.
struct Window {
    from: f64,
    to: f64,
    side: Vec<Option<usize>>,
}

fn partition_windows(inputs: &Inputs<'_>) -> Vec<Window> {
    let k = inputs.schedule.clients;
    let mut out = Vec::new();
    let mut open: Option<(f64, Vec<Option<usize>>)> = None;
    for a in inputs.applied {
        match &a.fault {
            Fault::Partition(groups) => {
                let mut side = vec![None; k];
                for (g, members) in groups.iter().enumerate() {
                    for &s in members {
                        side[s as usize] = Some(g);
                    }
                }
                open = Some((a.at, side));
            }
            Fault::Heal => {
                if let Some((from, side)) = open.take() {
                    out.push(Window {
                        from,
                        to: a.at,
                        side,
                    });
                }
            }
            _ => {}
        }
    }
    if let Some((from, side)) = open {
        out.push(Window {
            from,
            to: f64::INFINITY,
            side,
        });
    }
    out
}

/// When each silo was down (crashed until restart, left, or not yet joined): `(from, to)`.
fn down_windows(inputs: &Inputs<'_>) -> Vec<Vec<(f64, f64)>> {
    let k = inputs.schedule.clients;
    let mut out = vec![Vec::new(); k];
    let mut since: Vec<Option<f64>> = vec![None; k];
    for e in &inputs.schedule.events {
        if let Fault::Join(s) = e.fault {
            since[s as usize] = Some(f64::NEG_INFINITY);
        }
    }
    for a in inputs.applied {
        match a.fault {
            Fault::Crash { silo, .. } | Fault::Leave(silo) => since[silo as usize] = Some(a.at),
            Fault::Restart(silo) | Fault::Join(silo) => {
                if let Some(from) = since[silo as usize].take() {
                    out[silo as usize].push((from, a.at));
                }
            }
            _ => {}
        }
    }
    for (s, from) in since.into_iter().enumerate() {
        if let Some(from) = from {
            out[s].push((from, f64::INFINITY));
        }
    }
    out
}

fn lookup(row: &[(u32, f64)], peer: u32) -> Option<f64> {
    row.iter().find(|x| x.0 == peer).map(|x| x.1)
}

fn final_eval(trace: &[NodeRound]) -> Option<EvalRecord> {
    trace.iter().rev().find_map(|r| r.eval)
}

/// Over those of `silos` that finished both this run and the fault-free one: the final accuracy
/// of each run, and how many silos that is.
fn against_baseline(
    inputs: &Inputs<'_>,
    silos: impl Iterator<Item = usize>,
) -> (Option<f64>, Option<f64>, usize) {
    let Some(base) = inputs.baseline else {
        return (None, None, 0);
    };
    let both: Vec<(EvalRecord, EvalRecord)> = silos
        .filter_map(|i| Some((final_eval(inputs.traces.get(i)?)?, (*base.get(i)?)?)))
        .collect();
    (
        accuracy(both.iter().map(|p| p.0)),
        accuracy(both.iter().map(|p| p.1)),
        both.len(),
    )
}

/// The faults as reports show them.
fn records(applied: &[Applied]) -> Vec<AppliedRecord> {
    applied
        .iter()
        .map(|a| AppliedRecord {
            at: a.at,
            what: a.describe(),
        })
        .collect()
}

fn accuracy(evals: impl Iterator<Item = EvalRecord>) -> Option<f64> {
    let (c, n) = evals.fold((0usize, 0usize), |(c, n), e| (c + e.correct, n + e.count));
    (n > 0).then(|| 100.0 * c as f64 / n as f64)
}

/// The longest a round may take under a schedule with deadlines `model_s` (τ_model) and
/// `gradient_s` (τ_grad), in seconds: a pull's τ_model, the gradients' τ_grad and an evaluation
/// fetch's τ_model, plus a compute allowance of 3× the median of the run's round times
/// (`seconds`) and 1 s. Both drivers judge their rounds by it.
pub fn round_budget(model_s: f64, gradient_s: f64, seconds: &[f64]) -> f64 {
    let mut v = seconds.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    };
    2.0 * model_s + gradient_s + 1.0 + 3.0 * median
}

/// Runs every check that the schedule calls for.
pub fn evaluate(inputs: &Inputs<'_>) -> Report {
    let windows = partition_windows(inputs);
    let down = down_windows(inputs);
    let mut checks = vec![liveness(inputs, &windows, &down)];
    let kinds: Vec<&str> = inputs
        .schedule
        .events
        .iter()
        .map(|e| e.fault.kind())
        .collect();
    let unreachable_kinds = ["partition", "crash", "leave"];
    if kinds.iter().any(|k| unreachable_kinds.contains(k)) {
        checks.push(memory(inputs, &windows, &down));
    }
    // Accuracy against the fault-free run, over the silos that finished in both.
    let finals: Vec<Option<EvalRecord>> = inputs.traces.iter().map(|t| final_eval(t)).collect();
    let acc = accuracy(finals.iter().flatten().copied());
    let (acc_both, base_both, compared) = against_baseline(inputs, 0..inputs.traces.len());
    if kinds
        .iter()
        .any(|k| ["heal", "crash", "delay", "loss", "leave", "join"].contains(k))
    {
        checks.push(recovery(inputs, &windows, acc_both, base_both, compared));
    }
    if kinds.contains(&"crash") {
        checks.push(crash_safety(inputs));
    }
    if kinds.contains(&"join") {
        checks.push(late_join(inputs));
    }
    if kinds.contains(&"attack") {
        checks.push(poisoning(inputs));
    }
    if let Some(exits) = inputs.exits {
        checks.push(clean_exit(exits));
    }
    Report {
        pass: checks.iter().all(|c| c.pass),
        checks,
        applied: records(inputs.applied),
        accuracy: acc_both.or(acc),
        baseline_accuracy: base_both,
    }
}

fn is_down(down: &[(f64, f64)], at: f64) -> bool {
    down.iter().any(|&(a, b)| at > a && at <= b)
}
