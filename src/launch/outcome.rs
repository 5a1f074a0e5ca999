//! What a finished swarm run produced beyond the report (`report::logs` merges the nodes' run
//! logs into it): the speed and size figures (`swarm.json`) and the fault checks.
//! Owns: [`SwarmFigures`], [`read_run_log`] (the lenient reader progress and tests poll), and
//! the fault report's inputs.
//! Must not: start or stop processes (`procs.rs`), define a check (`faults::checks`), or run
//! the simulator (the baseline is [`SwarmOptions::baseline`], the caller's).

use super::{Proc, SwarmOptions, faults};
use crate::faults::checks;
use crate::net::node::NodeRound;
use crate::scenario::Scenario;
use anyhow::Context;
use std::path::Path;
/// Speed and size of one swarm run (`seed-<n>/swarm.json`), the figures of issue 3.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SwarmFigures {
    /// Node processes.
    pub nodes: usize,
    /// Model parameters d.
    pub num_params: usize,
    /// M.
    pub neighbours: usize,
    /// The payload minimum per node per round: 2·M·4d bytes (M gradients sent, M models served
    /// on average).
    pub payload_min_bytes: f64,
    /// Encoded message bytes sent per node per round (mean over rounds without evaluation).
    pub message_bytes: f64,
    /// Stream bytes sent per node per round (libp2p's count: messages plus negotiation).
    pub stream_bytes: f64,
    /// `message_bytes / payload_min_bytes`.
    pub message_ratio: f64,
    /// `stream_bytes / payload_min_bytes`.
    pub stream_ratio: f64,
    /// Median round wall time over nodes and rounds without evaluation.
    pub median_round_seconds: f64,
    /// Every round evaluated, so the figures include the evaluation fetches.
    pub includes_evaluation: bool,
    /// Largest resident set of any node (MiB).
    pub max_rss_mib: f64,
    /// Median over nodes of their largest resident set (MiB).
    pub median_rss_mib: f64,
    /// From starting the processes until every node had finished round 1.
    pub first_round_seconds: f64,
    /// The whole run, start to last exit.
    pub total_seconds: f64,
    /// Behind relays (`--nat`): how the nodes' member connections ended, from their logs.
    #[serde(default)]
    pub paths: Option<Paths>,
}

/// How the member connections of a swarm behind relays ended, summed over the nodes (each pair
/// counted once from each side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Paths {
    /// Members a node was connected to directly at its end.
    pub direct: usize,
    /// Members a node was connected to through a relay only at its end.
    pub relayed: usize,
    /// Hole punches that made a connection direct.
    pub hole_punched: usize,
    /// Hole punches that failed.
    pub hole_punch_failed: usize,
}

/// [`Paths`] from the nodes' logs, or `None` when no node reported its connections at the end
/// (a swarm without relays).
pub(super) fn paths(procs: &[Proc]) -> Option<Paths> {
    let mut p = Paths::default();
    let mut seen = false;
    for proc in procs {
        let Ok(text) = std::fs::read_to_string(&proc.log) else {
            continue;
        };
        p.hole_punched += text.matches("hole punched").count();
        p.hole_punch_failed += text.matches("hole punch failed").count();
        let Some(end) = text
            .lines()
            .rev()
            .find(|l| l.contains("members connected at the end"))
        else {
            continue;
        };
        let field = |key: &str| -> usize {
            end.split(&format!(" {key}="))
                .nth(1)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        seen = true;
        p.direct += field("direct");
        p.relayed += field("relayed");
    }
    seen.then_some(p)
}

/// The checks of a faulty swarm. The round budget ([`checks::round_budget`], the simulator's
/// too) is τ_model (pulls) + τ_grad (gradients) + τ_model (the evaluation fetch) plus a compute
/// allowance of 3× the median round of the run
/// and 1 s; the baseline is the simulator's fault-free run of the same seed, which the
/// fault-free swarm reproduces decision for decision (`tests/swarm.rs`).
pub(super) fn fault_report(
    scenario: &Scenario,
    seed: u64,
    opts: &SwarmOptions,
    driver: &faults::FaultDriver,
    procs: &[Proc],
    logs: &[Vec<NodeRound>],
    groups: Option<&[usize]>,
) -> anyhow::Result<checks::Report> {
    let cfg = &scenario.faults;
    let all: Vec<f64> = logs.iter().flatten().map(|r| r.seconds).collect();
    let budget = checks::round_budget(cfg.model_deadline_s, cfg.gradient_deadline_s, &all);
    // The baseline is a simulation, not a report: the caller runs it.
    let baseline = if cfg.baseline {
        let run = opts.baseline.context(
            "faults.baseline asks for the simulator's fault-free run, and this swarm was given none (SwarmOptions::baseline)",
        )?;
        Some(run(scenario, seed, opts.data_dir.as_deref()).context("the fault-free baseline run")?)
    } else {
        None
    };
    let exits: Vec<checks::ExitEvidence> = procs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut exits = p.lives.clone();
            exits.push(match p.status {
                Some(s) if s.success() => "ok".into(),
                Some(_) if p.by_schedule => "killed by the schedule".into(),
                Some(s) => format!("exited {s}"),
                None => "still running".into(),
            });
            let bad_lines = p
                .logs
                .iter()
                .flat_map(|l| {
                    std::fs::read_to_string(l)
                        .unwrap_or_default()
                        .lines()
                        .filter(|x| x.contains("panicked") || x.contains(" ERROR "))
                        .map(|x| x.chars().take(200).collect::<String>())
                        .collect::<Vec<_>>()
                })
                .collect();
            checks::ExitEvidence {
                silo: i as u32,
                exits,
                bad_lines,
            }
        })
        .collect();
    let schedule = scenario.fault_schedule()?;
    Ok(checks::evaluate(&checks::Inputs {
        schedule: &schedule,
        applied: &driver.applied,
        traces: logs,
        groups,
        baseline: baseline.as_deref(),
        round_budget_s: budget,
        stall_after: budget,
        suspect_after: scenario.federico.suspect_after,
        crashes: &driver.crashes,
        exits: Some(&exits),
    }))
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Per-round figures from the run logs: rounds that evaluated (and fetched models for it)
/// and round 1 (start-up) are left out of the byte and time medians.
pub(super) fn figures(
    logs: &[Vec<NodeRound>],
    scenario: &Scenario,
    num_params: usize,
    procs: &[Proc],
    first_round_seconds: f64,
    total_seconds: f64,
) -> SwarmFigures {
    let m = scenario.federico.neighbours;
    let payload = 2.0 * m as f64 * 4.0 * num_params as f64;
    let rounds = logs.iter().map(|l| l.len()).min().unwrap_or(0);
    let consecutive = |r: usize| logs.iter().all(|l| l[r - 1].round + 1 == l[r].round);
    let plain = |r: usize| consecutive(r) && logs.iter().all(|l| l[r].eval.is_none());
    // Evaluation rounds also fetch models for the mixture; leave them out when there are others.
    let includes_evaluation = !(1..rounds).any(plain);
    let (mut msg, mut stream, mut secs) = (Vec::new(), Vec::new(), Vec::new());
    for r in 1..rounds {
        let keep = if includes_evaluation {
            consecutive(r)
        } else {
            plain(r)
        };
        if !keep {
            continue;
        }
        let k = logs.len() as f64;
        msg.push(
            logs.iter()
                .map(|l| (l[r].bytes_sent - l[r - 1].bytes_sent.min(l[r].bytes_sent)) as f64)
                .sum::<f64>()
                / k,
        );
        stream.push(
            logs.iter()
                .map(|l| {
                    (l[r].stream_bytes_sent
                        - l[r - 1].stream_bytes_sent.min(l[r].stream_bytes_sent))
                        as f64
                })
                .sum::<f64>()
                / k,
        );
        secs.extend(logs.iter().map(|l| l[r].seconds));
    }
    let rss: Vec<f64> = procs
        .iter()
        .map(|p| p.max_rss_kib as f64 / 1024.0)
        .collect();
    // Bytes are averaged, not medianed: a pull served early for the next round lands in this
    // round's count, so single rounds scatter around the mean while their sum does not.
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (message_bytes, stream_bytes) = (mean(&msg), mean(&stream));
    SwarmFigures {
        nodes: logs.len(),
        num_params,
        neighbours: m,
        payload_min_bytes: payload,
        message_bytes,
        stream_bytes,
        message_ratio: message_bytes / payload,
        stream_ratio: stream_bytes / payload,
        median_round_seconds: median(secs),
        includes_evaluation,
        max_rss_mib: rss.iter().copied().fold(0.0, f64::max),
        median_rss_mib: median(rss),
        first_round_seconds,
        total_seconds,
        paths: paths(procs),
    }
}

/// A node's run log; a torn last line (the node was killed mid-write) is ignored.
pub fn read_run_log(path: &Path) -> anyhow::Result<Vec<NodeRound>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<NodeRound>(l).ok())
        .collect())
}
