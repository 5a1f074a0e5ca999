//! Unit tests of `faults::checks` (moved unchanged from its inline `mod tests`).
//! Owns: the module's unit tests and their fixtures.
//! Must not: hold code the module itself uses.

use super::*;
use crate::faults::FaultsConfig;

/// Two silos, one on each side of a partition in rounds 3..=4, healed at round 5.
fn schedule() -> Schedule {
    let text = "[[events]]\nround = 3\npartition = [[0], [1]]\n[[events]]\nround = 5\nheal = true";
    toml::from_str::<FaultsConfig>(text)
        .unwrap()
        .schedule(2)
        .unwrap()
}

fn rec(node: u32, round: u64, sampled: &[u32], answered: &[u32], other_loss: f64) -> NodeRound {
    let other = 1 - node;
    NodeRound {
        node,
        round,
        version: round,
        sampled: sampled.to_vec(),
        answered: answered.to_vec(),
        gradients: 1,
        weights: vec![(0, 0.5), (1, 0.5)],
        eval: Some(EvalRecord {
            loss_sum: 1.0,
            correct: 9,
            count: 10,
        }),
        seconds: 1.0,
        bytes_sent: 0,
        stream_bytes_sent: 0,
        at: round as f64,
        start: round as f64 - 0.4,
        tracked: vec![(node, 0.5), (other, other_loss)],
        last: vec![(node, 0.5), (other, other_loss)],
        suspects: Vec::new(),
        resumed: false,
        privacy: None,
    }
}

/// Silo `n`'s healthy trace: pulls its peer in rounds 1, 2 and 5–6, fails in 3–4.
fn healthy(n: u32) -> Vec<NodeRound> {
    let o = 1 - n;
    vec![
        rec(n, 1, &[o], &[o], 1.0),
        rec(n, 2, &[o], &[o], 1.0),
        rec(n, 3, &[o], &[], 1.0),
        rec(n, 4, &[o], &[], 1.0),
        rec(n, 5, &[o], &[o], 1.2),
        rec(n, 6, &[o], &[o], 1.1),
    ]
}

fn judge(traces: &[Vec<NodeRound>], suspect_after: u32) -> Report {
    let s = schedule();
    let applied = vec![
        Applied {
            at: 2.5,
            fault: s.events[0].fault.clone(),
        },
        Applied {
            at: 4.5,
            fault: Fault::Heal,
        },
    ];
    let base = vec![
        Some(EvalRecord {
            loss_sum: 1.0,
            correct: 9,
            count: 10,
        });
        2
    ];
    evaluate(&Inputs {
        schedule: &s,
        applied: &applied,
        traces,
        groups: None,
        baseline: Some(&base),
        round_budget_s: 4.0,
        stall_after: 1.0,
        suspect_after,
        crashes: &[],
        exits: None,
    })
}

fn pass(r: &Report, name: &str) -> bool {
    r.checks.iter().find(|c| c.name == name).unwrap().pass
}

#[test]
fn a_healthy_trace_passes() {
    let r = judge(&[healthy(0), healthy(1)], 3);
    assert!(r.pass, "{}", r.render());
}

#[test]
fn a_reset_loss_fails_memory() {
    let mut t = healthy(0);
    t[3].last[1].1 = 0.0; // ℓ forgotten during the partition
    t[3].tracked[1].1 = 0.0;
    let r = judge(&[t, healthy(1)], 3);
    assert!(!pass(&r, "memory"), "{}", r.render());
}

#[test]
fn retrying_a_cut_peer_before_its_backoff_fails_memory() {
    let r = judge(&[healthy(0), healthy(1)], 1);
    assert!(!pass(&r, "memory"), "{}", r.render());
}

#[test]
fn no_cross_pull_after_the_heal_fails_recovery() {
    let mut t0 = healthy(0);
    let mut t1 = healthy(1);
    for t in [&mut t0, &mut t1] {
        for r in t.iter_mut().skip(4) {
            r.answered.clear();
        }
    }
    let r = judge(&[t0, t1], 3);
    assert!(!pass(&r, "recovery"), "{}", r.render());
}

#[test]
fn a_worse_final_accuracy_fails_recovery() {
    let mut t = healthy(0);
    t[5].eval = Some(EvalRecord {
        loss_sum: 1.0,
        correct: 5,
        count: 10,
    });
    let r = judge(&[t, healthy(1)], 3);
    assert!(!pass(&r, "recovery"), "{}", r.render());
}

#[test]
fn a_slow_or_missing_round_fails_liveness() {
    let mut t = healthy(0);
    t[4].seconds = 9.0;
    let r = judge(&[t, healthy(1)], 3);
    assert!(!pass(&r, "liveness"), "{}", r.render());
    let mut t = healthy(0);
    t.retain(|r| !(3..=4).contains(&r.round));
    let r = judge(&[t, healthy(1)], 3);
    assert!(!pass(&r, "liveness"), "{}", r.render());
}

#[test]
fn a_panic_fails_clean_exit() {
    let exits = [ExitEvidence {
        silo: 0,
        exits: vec!["ok".into()],
        bad_lines: vec!["thread 'main' panicked at src/x.rs".into()],
    }];
    let c = clean_exit(&exits);
    assert!(!c.pass);
    let exits = [ExitEvidence {
        silo: 0,
        exits: vec!["killed by the schedule".into(), "ok".into()],
        bad_lines: Vec::new(),
    }];
    assert!(clean_exit(&exits).pass);
}

#[test]
fn the_coordinators_weight_on_attackers_is_read_from_each_algorithms_round_record() {
    use super::coordinated::attackers_share;
    use serde_json::json;
    // Silos 1 and 3 attack.
    let attacker = [false, true, false, true];
    // FedDisco: the attackers' p of the global, for every silo alike.
    let disco = json!({"peers": ["silo-000000", "silo-000001", "silo-000003"],
                       "weights": [0.5, 0.3, 0.2]});
    let (mean, max) = attackers_share(&disco, &attacker).unwrap();
    assert!((mean - 0.5).abs() < 1e-12 && (max - 0.5).abs() < 1e-12);
    // FedSaC: honest senders' rows (0 and 2), columns senders then stale (silo 3).
    let sac = json!({"senders": [0, 1, 2], "stale": [3],
                     "graph": [[0.6, 0.1, 0.2, 0.1], [0.0, 1.0, 0.0, 0.0], [0.3, 0.0, 0.7, 0.0]]});
    let (mean, max) = attackers_share(&sac, &attacker).unwrap();
    assert!(
        (mean - 0.1).abs() < 1e-12 && (max - 0.2).abs() < 1e-12,
        "{mean} {max}"
    );
    // With Krum, a dropped member's entries were not mixed: silo 1 dropped, rows over the rest.
    let mut krum = sac.clone();
    krum["dropped"] = json!([1]);
    let (mean, max) = attackers_share(&krum, &attacker).unwrap();
    assert!(
        (mean - 0.1 / 0.9 / 2.0).abs() < 1e-12 && (max - 0.1 / 0.9).abs() < 1e-12,
        "{mean} {max}"
    );
    // HCCT: silo 0 shares its group with attacker 1; silo 2 is alone with attacker 3 too.
    let hcct = json!({"groups": [[0, 1], [2, 3]]});
    let (mean, max) = attackers_share(&hcct, &attacker).unwrap();
    assert!((mean - 0.5).abs() < 1e-12 && (max - 0.5).abs() < 1e-12);
    let hcct = json!({"groups": [[0, 2], [1, 3]]});
    assert_eq!(attackers_share(&hcct, &attacker), Some((0.0, 0.0)));
    // A record with no weights says nothing.
    assert_eq!(attackers_share(&json!({"round": 3}), &attacker), None);
    assert_eq!(attackers_share(&serde_json::Value::Null, &attacker), None);
}
