//! The definition of each fault check: liveness, memory of collaborators, recovery, crash
//! safety, late join and clean exits, each with the figures behind its verdict.
//! Owns: one function per check, from the [`Inputs`] and the windows `mod.rs` derives.
//! Must not: decide which checks a schedule calls for ([`evaluate`](super::evaluate)), or run,
//! time or apply anything.

use super::{Check, ExitEvidence, Fault, Inputs, Window, against_baseline, check, is_down, lookup};
use serde_json::{Value, json};
/// Every live silo keeps completing rounds through every partition, and no round takes longer
/// than the deadline budget.
pub(super) fn liveness(inputs: &Inputs<'_>, windows: &[Window], down: &[Vec<(f64, f64)>]) -> Check {
    let mut slowest = 0.0f64;
    let mut slowest_at = None;
    let mut over = 0usize;
    let mut rounds = 0usize;
    for (i, t) in inputs.traces.iter().enumerate() {
        for r in t {
            rounds += 1;
            if r.seconds > slowest {
                slowest = r.seconds;
                slowest_at = Some((i, r.round));
            }
            if r.seconds > inputs.round_budget_s {
                over += 1;
            }
        }
    }
    // Rounds each silo completed inside each partition window (silos up the whole window).
    let mut min_in_window: Option<usize> = None;
    let mut stalled: Vec<String> = Vec::new();
    let last_at = inputs
        .traces
        .iter()
        .flat_map(|t| t.last().map(|r| r.at))
        .fold(f64::NEG_INFINITY, f64::max);
    for w in windows {
        let to = w.to.min(last_at);
        for (i, t) in inputs.traces.iter().enumerate() {
            let up_all = !down[i].iter().any(|&(a, b)| a < to && b > w.from);
            // A silo whose own run ended before the window closed is not stalled.
            let ended = t.last().is_none_or(|r| r.at < to);
            if !up_all || ended {
                continue;
            }
            let n = t.iter().filter(|r| r.at > w.from && r.at <= to).count();
            min_in_window = Some(min_in_window.map_or(n, |m| m.min(n)));
            if n == 0 && to - w.from >= inputs.stall_after {
                stalled.push(format!("silo {i}"));
            }
        }
    }
    let pass = over == 0 && stalled.is_empty() && rounds > 0;
    let detail = if rounds == 0 {
        "no round was logged".to_string()
    } else if !stalled.is_empty() {
        format!(
            "completed no round during a partition: {}",
            stalled.join(", ")
        )
    } else if over > 0 {
        format!(
            "{over} rounds took longer than the {:.1} s budget (slowest {slowest:.2} s)",
            inputs.round_budget_s
        )
    } else {
        format!(
            "every live silo kept completing rounds; slowest round {slowest:.2} s ≤ {:.1} s budget",
            inputs.round_budget_s
        )
    };
    let mut figures = vec![
        ("rounds_logged", json!(rounds)),
        ("slowest_round_s", json!(round3(slowest))),
        ("budget_s", json!(inputs.round_budget_s)),
        ("rounds_over_budget", json!(over)),
    ];
    if let Some((i, r)) = slowest_at {
        figures.push(("slowest_at", json!(format!("silo {i} round {r}"))));
    }
    if let Some(m) = min_in_window {
        figures.push(("min_rounds_in_partition", json!(m)));
    }
    check("liveness", pass, detail, figures)
}

pub(super) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Losses of unreachable peers are kept (ℓ unchanged, L̂ not reset) and a peer that keeps
/// failing is pulled at a backed-off pace: after `suspect_after` failures in a row, the n-th
/// further try comes at least `backoff_rounds(n)` rounds (2, 4, 8, …) after the one before.
pub(super) fn memory(inputs: &Inputs<'_>, windows: &[Window], down: &[Vec<(f64, f64)>]) -> Check {
    let k = inputs.schedule.clients;
    let unreachable = |i: usize, j: usize, at: f64| -> bool {
        is_down(&down[j], at)
            || windows
                .iter()
                .any(|w| at > w.from && at <= w.to && w.side[i].is_some() && w.side[i] != w.side[j])
    };
    let mut pairs_checked = 0usize;
    let mut changed: Vec<String> = Vec::new();
    let mut reset: Vec<String> = Vec::new();
    let mut failed_pulls = 0usize;
    let mut max_run = 0u32;
    let mut worst = None;
    let mut too_soon: Vec<String> = Vec::new();
    let mut retries = 0usize;
    for (i, t) in inputs.traces.iter().enumerate() {
        for j in 0..k {
            if j == i {
                continue;
            }
            let mut before: Option<(f64, f64)> = None; // (last, tracked) before the stretch
            let mut run = 0u32;
            let mut last_fail = 0u64;
            let mut in_stretch = false;
            for r in t {
                // A round counts as cut off if it started and ended while `j` was out of
                // reach; a round that straddles the change may have pulled `j` before it and
                // is left out of both the baseline and the check.
                let start = if r.start > 0.0 {
                    r.start
                } else {
                    r.at - r.seconds
                };
                let (cut_start, cut_end) = (unreachable(i, j, start), unreachable(i, j, r.at));
                let last = lookup(&r.last, j as u32);
                let tracked = lookup(&r.tracked, j as u32);
                if cut_start != cut_end {
                    in_stretch = false;
                    if let (Some(l), Some(tr)) = (last, tracked) {
                        before = Some((l, tr));
                    }
                    continue;
                }
                let cut = cut_end;
                if cut {
                    if !in_stretch {
                        in_stretch = true;
                        pairs_checked += 1;
                        run = 0;
                    }
                    if let (Some((l0, t0)), Some(l), Some(tr)) = (before, last, tracked) {
                        if l.to_bits() != l0.to_bits() && changed.len() < 5 {
                            changed.push(format!("silo {i}→{j} ℓ {l0:.4}→{l:.4}"));
                        }
                        // EMA moves L̂ towards the kept ℓ; it never jumps back to 0.
                        let (lo, hi) = (t0.min(l0), t0.max(l0));
                        if !(tr >= lo - 1e-9 && tr <= hi + 1e-9) && reset.len() < 5 {
                            reset.push(format!("silo {i}→{j} L̂ {t0:.4}→{tr:.4}"));
                        }
                    }
                    if r.sampled.contains(&(j as u32)) && !r.answered.contains(&(j as u32)) {
                        failed_pulls += 1;
                        run += 1;
                        if run > inputs.suspect_after {
                            retries += 1;
                            let need = crate::core::backoff_rounds(run - inputs.suspect_after);
                            let gap = r.round.saturating_sub(last_fail);
                            if gap < need && too_soon.len() < 5 {
                                too_soon.push(format!(
                                    "silo {i}→{j} tried again {gap} rounds after a failure in round {last_fail} (backoff {need})"
                                ));
                            }
                        }
                        last_fail = r.round;
                        if run > max_run {
                            max_run = run;
                            worst = Some(format!("silo {i}→{j}"));
                        }
                    }
                } else {
                    in_stretch = false;
                    if let (Some(l), Some(tr)) = (last, tracked) {
                        before = Some((l, tr));
                    }
                }
            }
        }
    }
    let kept = changed.is_empty() && reset.is_empty();
    let avoided = too_soon.is_empty();
    let detail = match (kept, avoided) {
        (true, true) => format!(
            "losses of unreachable peers kept; suspects after {} failures, {retries} retries all backed off",
            inputs.suspect_after
        ),
        (false, _) => format!(
            "losses of unreachable peers changed: {}",
            changed
                .iter()
                .chain(&reset)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ),
        (true, false) => format!(
            "a suspect was tried before its backoff ran out: {}",
            too_soon.join("; ")
        ),
    };
    check(
        "memory",
        kept && avoided && pairs_checked > 0,
        if pairs_checked == 0 {
            "no silo had an unreachable peer in its trace".into()
        } else {
            detail
        },
        vec![
            ("unreachable_pairs", json!(pairs_checked)),
            ("losses_changed", json!(changed.len() + reset.len())),
            ("failed_pulls", json!(failed_pulls)),
            ("max_failed_in_a_row", json!(max_run)),
            ("worst_pair", json!(worst)),
            ("retries_after_suspect", json!(retries)),
            ("suspect_after", json!(inputs.suspect_after)),
        ],
    )
}

/// After a heal, pulls across the old divide succeed again within `recovery_rounds` rounds on
/// every side; the final accuracy is within `accuracy_tolerance` of the fault-free run.
pub(super) fn recovery(
    inputs: &Inputs<'_>,
    windows: &[Window],
    acc: Option<f64>,
    base: Option<f64>,
    silos: usize,
) -> Check {
    let cfg = &inputs.schedule.config;
    let mut problems = Vec::new();
    let mut figures: Vec<(&str, Value)> = Vec::new();
    let mut resumed_after: Vec<Value> = Vec::new();
    for w in windows.iter().filter(|w| w.to.is_finite()) {
        let sides = w.side.iter().flatten().max().map_or(0, |m| m + 1);
        for side in 0..sides {
            // Rounds (of the silo that did it) from the heal to the first answered pull
            // across the divide, over the silos of this side.
            let mut best: Option<u64> = None;
            for (i, t) in inputs.traces.iter().enumerate() {
                if w.side[i] != Some(side) {
                    continue;
                }
                let last_before = t.iter().rev().find(|r| r.at <= w.to).map_or(0, |r| r.round);
                if let Some(r) = t.iter().find(|r| {
                    r.at > w.to
                        && r.answered
                            .iter()
                            .any(|&b| w.side[b as usize].is_some_and(|s| s != side))
                }) {
                    let n = r.round - last_before;
                    best = Some(best.map_or(n, |b| b.min(n)));
                }
            }
            match best {
                Some(n) => {
                    resumed_after.push(json!(n));
                    if n > cfg.recovery_rounds {
                        problems.push(format!(
                            "side {side} first pulled across after {n} rounds (> {})",
                            cfg.recovery_rounds
                        ));
                    }
                }
                None => {
                    resumed_after.push(Value::Null);
                    problems.push(format!("side {side} never pulled across after the heal"));
                }
            }
        }
    }
    if !resumed_after.is_empty() {
        figures.push(("rounds_to_cross_pull_per_side", Value::Array(resumed_after)));
        figures.push(("recovery_rounds", json!(cfg.recovery_rounds)));
    }
    match (acc, base) {
        (Some(a), Some(b)) => {
            figures.push(("accuracy", json!(round3(a))));
            figures.push(("fault_free_accuracy", json!(round3(b))));
            figures.push(("silos_compared", json!(silos)));
            figures.push(("tolerance", json!(cfg.accuracy_tolerance)));
            if (a - b).abs() > cfg.accuracy_tolerance {
                problems.push(format!(
                    "final accuracy {a:.2} % is {:.2} points from the fault-free {b:.2} %",
                    (a - b).abs()
                ));
            }
        }
        _ => problems.push("no fault-free run to compare the final accuracy with".into()),
    }
    let pass = problems.is_empty();
    let detail = if pass {
        let mut d = String::new();
        if windows.iter().any(|w| w.to.is_finite()) {
            d.push_str("every side pulled across the healed divide in time; ");
        }
        d.push_str(&format!(
            "final accuracy {:.2} % vs {:.2} % without faults",
            acc.unwrap_or(f64::NAN),
            base.unwrap_or(f64::NAN)
        ));
        d
    } else {
        problems.join("; ")
    };
    check("recovery", pass, detail, figures)
}

/// Each crashed silo resumed from its checkpoint, lost at most the round in flight and kept its
/// peer ID; no checkpoint was unreadable.
pub(super) fn crash_safety(inputs: &Inputs<'_>) -> Check {
    let mut problems = Vec::new();
    let mut per_crash = Vec::new();
    let crash_times: Vec<(u32, f64, Option<f64>)> = {
        let mut v = Vec::new();
        for a in inputs.applied {
            match a.fault {
                Fault::Crash { silo, .. } => v.push((silo, a.at, None)),
                Fault::Restart(silo) => {
                    if let Some(c) = v.iter_mut().rev().find(|c| c.0 == silo && c.2.is_none()) {
                        c.2 = Some(a.at);
                    }
                }
                _ => {}
            }
        }
        v
    };
    for (n, &(silo, at, restart)) in crash_times.iter().enumerate() {
        let t = &inputs.traces[silo as usize];
        let before = t.iter().rev().find(|r| r.at <= at);
        let after = restart.and_then(|r0| t.iter().find(|r| r.at > r0));
        let ev = inputs.crashes.get(n).filter(|e| e.silo == silo);
        let mut fig = json!({
            "silo": silo,
            "last_round_before": before.map(|r| r.round),
            "first_round_after": after.map(|r| r.round),
        });
        match ev.map(|e| &e.checkpoint) {
            Some(Ok(round)) => fig["checkpoint_round"] = json!(round),
            Some(Err(e)) => problems.push(format!("silo {silo}: checkpoint unreadable: {e}")),
            None => problems.push(format!(
                "silo {silo}: the driver did not read its checkpoint"
            )),
        }
        if let Some((a, b)) = ev.and_then(|e| e.peer_ids.as_ref()) {
            fig["same_peer_id"] = json!(a == b);
            if a != b {
                problems.push(format!("silo {silo} came back as {b}, not {a}"));
            }
        }
        if restart.is_some() {
            let last = before.map_or(0, |r| r.round);
            match after {
                None => problems.push(format!("silo {silo} logged no round after its restart")),
                Some(r) => {
                    // A restart cuts the log back to its checkpoint, so the round in flight
                    // at the kill is redone: r = last + 1.
                    if r.round != last + 1 {
                        problems.push(format!(
                            "silo {silo} resumed at round {} after round {last}",
                            r.round
                        ));
                    }
                    if !r.resumed {
                        problems.push(format!("silo {silo} did not resume from its checkpoint"));
                    }
                    if let Some(b) = before {
                        if r.version < b.version {
                            problems.push(format!(
                                "silo {silo} model went back from version {} to {}",
                                b.version, r.version
                            ));
                        }
                    }
                }
            }
        }
        per_crash.push(fig);
    }
    let pass = problems.is_empty() && !crash_times.is_empty();
    let detail = if crash_times.is_empty() {
        "no crash was applied".into()
    } else if pass {
        format!(
            "{} crash(es): every checkpoint readable, every restarted silo resumed where it stopped",
            crash_times.len()
        )
    } else {
        problems.join("; ")
    };
    check(
        "crash_safety",
        pass,
        detail,
        vec![("crashes", Value::Array(per_crash))],
    )
}

/// A late joiner is pulled from by a silo of its own group within `join_rounds` rounds.
pub(super) fn late_join(inputs: &Inputs<'_>) -> Check {
    let cfg = &inputs.schedule.config;
    let mut problems = Vec::new();
    let mut per = Vec::new();
    for a in inputs.applied {
        let Fault::Join(j) = a.fault else { continue };
        let mates: Vec<usize> = (0..inputs.traces.len())
            .filter(|&i| {
                i != j as usize && inputs.groups.is_none_or(|g| g.get(i) == g.get(j as usize))
            })
            .collect();
        // Rounds after the join (of the silo that pulled) until a group mate pulled j.
        let mut found: Option<u64> = None;
        for &i in &mates {
            let t = &inputs.traces[i];
            let base = t.iter().rev().find(|r| r.at <= a.at).map_or(0, |r| r.round);
            if let Some(r) = t.iter().find(|r| r.at > a.at && r.answered.contains(&j)) {
                let n = r.round - base;
                found = Some(found.map_or(n, |f| f.min(n)));
            }
        }
        // At the end: the mates' mean weight on j against uniform.
        let ws: Vec<f64> = mates
            .iter()
            .filter_map(|&i| inputs.traces[i].last().and_then(|r| lookup(&r.weights, j)))
            .collect();
        let mean_w = ws.iter().sum::<f64>() / ws.len().max(1) as f64;
        let uniform = 1.0 / inputs.traces.len() as f64;
        per.push(json!({
            "silo": j,
            "group_mates": mates.len(),
            "rounds_to_first_pull_by_mate": found,
            "mates_final_mean_weight": round3(mean_w),
            "uniform_weight": round3(uniform),
        }));
        match found {
            Some(n) if n <= cfg.join_rounds => {}
            Some(n) => problems.push(format!(
                "silo {j} first pulled by its group after {n} rounds (> {})",
                cfg.join_rounds
            )),
            None => problems.push(format!("silo {j} was never pulled by its group")),
        }
        if inputs.groups.is_some() && mean_w <= uniform {
            problems.push(format!(
                "silo {j}'s group gives it {mean_w:.3} weight at the end, no more than uniform {uniform:.3}"
            ));
        }
    }
    let pass = problems.is_empty() && !per.is_empty();
    let detail = if per.is_empty() {
        "no join was applied".into()
    } else if pass {
        "every late joiner was found by its group and weighted above uniform".into()
    } else {
        problems.join("; ")
    };
    check(
        "late_join",
        pass,
        detail,
        vec![("joins", Value::Array(per))],
    )
}

/// No process panicked or exited abnormally, outside the kills of the schedule.
pub(super) fn clean_exit(exits: &[ExitEvidence]) -> Check {
    let bad: Vec<String> = exits
        .iter()
        .flat_map(|e| {
            e.exits
                .iter()
                .filter(|x| *x != "ok" && *x != "killed by the schedule")
                .map(move |x| format!("silo {}: {x}", e.silo))
                .chain(
                    e.bad_lines
                        .iter()
                        .map(move |l| format!("silo {}: {l}", e.silo)),
                )
        })
        .collect();
    let processes: usize = exits.iter().map(|e| e.exits.len()).sum();
    check(
        "clean_exit",
        bad.is_empty() && processes > 0,
        if bad.is_empty() {
            format!("{processes} processes, no panic, no abnormal exit, logs clean")
        } else {
            bad.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        },
        vec![
            ("processes", json!(processes)),
            ("problems", json!(bad.len())),
        ],
    )
}

/// Which silos of `schedule` ever attack, and the attacks played.
pub(super) fn attackers(schedule: &crate::faults::Schedule) -> (Vec<bool>, Vec<String>) {
    let mut attacker = vec![false; schedule.clients];
    let mut kinds = Vec::new();
    for e in &schedule.events {
        if let Fault::Attack {
            silos,
            attack: Some(a),
        } = &e.fault
        {
            silos.iter().for_each(|&s| attacker[s as usize] = true);
            kinds.push(a.describe());
        }
    }
    (attacker, kinds)
}

/// Members that poison what they send: the honest silos' final accuracy stays within
/// `attack_tolerance` points of the same run without faults (the attackers' own scores are left
/// out of both). The weight the honest silos give the attackers at the end is reported, not
/// judged: FedeRiCo weighs *models* by their loss on the silo's rows, so an attacker that
/// trains honestly and poisons only its gradients keeps the weight of an honest peer.
pub(super) fn poisoning(inputs: &Inputs<'_>) -> Check {
    let cfg = &inputs.schedule.config;
    let k = inputs.schedule.clients;
    let (attacker, kinds) = attackers(inputs.schedule);
    let honest: Vec<usize> = (0..k).filter(|&i| !attacker[i]).collect();
    let (a, b, compared) = against_baseline(inputs, honest.iter().copied());
    // Each honest silo's last weight row: the share of it on the attackers.
    let shares: Vec<f64> = honest
        .iter()
        .filter_map(|&i| inputs.traces[i].last())
        .map(|r| {
            r.weights
                .iter()
                .filter(|(p, _)| attacker.get(*p as usize) == Some(&true))
                .map(|x| x.1)
                .sum()
        })
        .collect();
    let max_share = shares.iter().copied().fold(0.0f64, f64::max);
    let mean_share = shares.iter().sum::<f64>() / shares.len().max(1) as f64;
    let attackers: Vec<usize> = (0..k).filter(|&i| attacker[i]).collect();
    let mut figures: Vec<(&str, Value)> = vec![
        ("attacks", json!(kinds)),
        ("attackers", json!(attackers)),
        ("honest_silos_compared", json!(compared)),
        ("tolerance", json!(cfg.attack_tolerance)),
        ("attacker_weight_max", json!(round3(max_share))),
        ("attacker_weight_mean", json!(round3(mean_share))),
    ];
    let (pass, detail) = match (a, b) {
        (Some(a), Some(b)) => {
            figures.push(("honest_accuracy", json!(round3(a))));
            figures.push(("clean_accuracy", json!(round3(b))));
            let drop = b - a;
            let verdict = format!(
                "honest silos {a:.2} % vs {b:.2} % without the attack; attackers hold \
                 {mean_share:.3} of honest rows on average (at most {max_share:.3})"
            );
            if drop > cfg.attack_tolerance {
                (
                    false,
                    format!(
                        "{verdict}: {drop:.2} points lost (> {})",
                        cfg.attack_tolerance
                    ),
                )
            } else {
                (true, verdict)
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
