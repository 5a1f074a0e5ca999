//! Unit tests of `core` (moved unchanged from its inline `mod tests`).
//! Owns: the module's unit tests and their fixtures.
//! Must not: hold code the module itself uses.

use super::*;

fn peer(me: u32, k: u32, cfg: FedericoConfig) -> Peer {
    Peer::new(NodeId(me), (0..k).map(NodeId), cfg, 42)
}

#[test]
fn sampling_stream_is_the_std_rng_stream() {
    use rand::RngExt;
    let mut a = ChaCha12Rng::seed_from_u64(7);
    let mut b = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..100 {
        assert_eq!(a.random::<u64>(), b.random::<u64>());
    }
}

#[test]
fn a_restored_peer_continues_the_same_run() {
    let mut p = peer(1, 6, FedericoConfig::default());
    for r in 0..3 {
        let s = p.sample();
        let m: Vec<(NodeId, f64)> = p
            .round_models(&s)
            .iter()
            .map(|&b| (b, 0.1 * (b.0 + r) as f64))
            .collect();
        p.handle_losses(50, &m);
        p.handle_unreachable(NodeId(4));
    }
    let bytes = bincode::serde::encode_to_vec(&p, bincode::config::standard()).unwrap();
    let (mut q, _): (Peer, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    assert_eq!(q.table(), p.table());
    assert_eq!(q.rounds(), p.rounds());
    for _ in 0..20 {
        assert_eq!(q.sample(), p.sample());
    }
    let json = serde_json::to_string(&p).unwrap();
    let mut r: Peer = serde_json::from_str(&json).unwrap();
    assert_eq!(r.sample(), p.sample());
}

#[test]
fn sample_excludes_self_and_takes_m() {
    let mut p = peer(2, 8, FedericoConfig::default());
    for _ in 0..100 {
        let s = p.sample();
        assert_eq!(s.len(), 3);
        assert!(!s.contains(&NodeId(2)));
    }
}

#[test]
fn every_round_evaluates_itself_besides_the_sampled() {
    let mut p = peer(2, 8, FedericoConfig::default());
    let s = p.sample();
    let models = p.round_models(&s);
    assert_eq!(models.len(), 4);
    assert_eq!(models.last(), Some(&NodeId(2)));
    assert_eq!(&models[..3], &s[..]);
}

#[test]
fn m_zero_samples_nobody_and_infers_with_self_only() {
    let cfg = FedericoConfig {
        neighbours: 0,
        ..Default::default()
    };
    let mut p = peer(0, 8, cfg);
    for _ in 0..5 {
        assert!(p.sample().is_empty());
        p.handle_losses(100, &[(NodeId(0), 0.5)]);
    }
    assert_eq!(p.inference_weights(), vec![(NodeId(0), 1.0)]);
}

#[test]
fn unseen_peers_get_no_inference_weight() {
    let mut p = peer(0, 4, FedericoConfig::default());
    p.handle_losses(10, &[(NodeId(0), 1.0), (NodeId(1), 1.0)]);
    // peers 2, 3 are unmeasured: they hold the largest weights but must not be mixed in
    assert!(p.weight(NodeId(2)) > p.weight(NodeId(0)));
    let w = p.inference_weights();
    assert_eq!(
        w.iter().map(|x| x.0).collect::<Vec<_>>(),
        vec![NodeId(0), NodeId(1)]
    );
    assert!((w[0].1 - 0.5).abs() < 1e-12);
}

#[test]
fn inference_drops_tiny_weights_and_renormalises() {
    let mut p = peer(0, 3, FedericoConfig::default());
    p.handle_losses(10, &[(NodeId(0), 1.0), (NodeId(1), 1.0), (NodeId(2), 50.0)]);
    let w = p.inference_weights();
    assert_eq!(w.len(), 2);
    assert!((w.iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-12);
}

#[test]
fn loss_scale_sum_sharpens_weights() {
    let run = |scale| {
        let mut p = peer(
            0,
            2,
            FedericoConfig {
                loss_scale: Some(scale),
                ..Default::default()
            },
        );
        p.handle_losses(500, &[(NodeId(0), 0.50), (NodeId(1), 0.52)]);
        p.weight(NodeId(0))
    };
    let mean = run(LossScale::Mean);
    let sum = run(LossScale::Sum);
    assert!(mean < 0.51 && sum > 0.99, "mean {mean} sum {sum}");
    assert_eq!(LossScale::Fixed(50.0).kappa(500), 50.0);
}

/// `"auto"`, the default of `variant = "federico"`: κ = n_i / P where that exceeds the
/// default's temperature, else exactly the default.
#[test]
fn auto_loss_scale_sharpens_only_where_samples_outnumber_parameters() {
    // Eight silos, so that the default softens from round 5 (members > M + 1).
    let losses: Vec<(NodeId, f64)> = (0..8).map(|j| (NodeId(j), 0.5 + 0.02 * j as f64)).collect();
    let weights = |cfg: FedericoConfig, n: usize, params: usize| {
        let mut p = peer(0, 8, cfg);
        p.set_data_ratio(n, params);
        let mut rows = Vec::new();
        for _ in 0..8 {
            p.handle_losses(n, &losses);
            rows.push([0, 1, 7].map(|j| p.weight(NodeId(j))));
        }
        rows
    };
    let default = FedericoConfig::default();
    assert_eq!(default.loss_scale(), LossScale::Auto);
    let mean = FedericoConfig {
        loss_scale: Some(LossScale::Mean),
        ..Default::default()
    };
    // More parameters than samples (every model of the quality suite): bit for bit κ = 1,
    // `soften` included (it halves the default's κ from round 5 here).
    assert_eq!(
        weights(default.clone(), 600, 159_010),
        weights(mean.clone(), 600, 159_010)
    );
    // A softmax regression of 21 parameters on 120 rows: κ = 120 / 21 in every round.
    let fixed = FedericoConfig {
        loss_scale: Some(LossScale::Fixed(120.0 / 21.0)),
        soften: Some(Soften {
            from_round: 1,
            factor: 1.0,
        }),
        ..Default::default()
    };
    let auto = weights(default.clone(), 120, 21);
    for (a, f) in auto.iter().zip(weights(fixed, 120, 21)) {
        for (x, y) in a.iter().zip(f) {
            assert!((x - y).abs() < 1e-12, "{a:?} against {f:?}");
        }
    }
    assert!(auto[7][0] > weights(mean, 120, 21)[7][0] + 0.05, "{auto:?}");
    // The paper's variant keeps κ = 1 and refuses "auto".
    let paper = FedericoConfig {
        variant: Variant::Paper,
        ..Default::default()
    };
    assert_eq!(paper.loss_scale(), LossScale::Mean);
    let bad = FedericoConfig {
        loss_scale: Some(LossScale::Auto),
        ..paper
    };
    assert!(
        bad.validate()
            .unwrap_err()
            .contains("\"auto\" is not the paper's")
    );
}

#[test]
fn weights_used_for_gradients_are_the_fresh_ones() {
    // E-step first, then M-step (spec §3.2, §9 item 4): after handle_losses the weight that
    // scales a gradient already reflects this round's losses.
    let mut p = peer(
        0,
        2,
        FedericoConfig {
            beta: 1.0,
            ..Default::default()
        },
    );
    assert_eq!(p.weight(NodeId(1)), 0.5);
    p.handle_losses(1, &[(NodeId(0), 0.0), (NodeId(1), 3.0)]);
    let expect = (-3.0f64).exp() / (1.0 + (-3.0f64).exp());
    assert!((p.weight(NodeId(1)) - expect).abs() < 1e-12);
}

#[test]
fn sampling_uses_the_previous_rounds_weights() {
    // ε = 0: after peer 1 is measured as bad, greedy slots go to the others.
    let cfg = FedericoConfig {
        neighbours: 1,
        epsilon: 0.0,
        beta: 1.0,
        ..Default::default()
    };
    let mut p = peer(0, 3, cfg);
    p.handle_losses(1, &[(NodeId(0), 1.0), (NodeId(1), 5.0), (NodeId(2), 0.5)]);
    for _ in 0..10 {
        assert_eq!(p.sample(), vec![NodeId(2)]);
    }
}

#[test]
fn suspects_are_not_sampled_until_reachable_and_keep_their_loss() {
    let cfg = FedericoConfig {
        neighbours: 2,
        epsilon: 1.0,
        ..Default::default()
    };
    let mut p = peer(0, 3, cfg);
    p.handle_losses(1, &[(NodeId(0), 1.0), (NodeId(1), 0.2), (NodeId(2), 0.3)]);
    let before = *p.table().entry(NodeId(1)).unwrap();
    for _ in 0..3 {
        p.handle_unreachable(NodeId(1));
    }
    assert!(p.is_suspect(NodeId(1)));
    for _ in 0..20 {
        assert_eq!(p.sample(), vec![NodeId(2)]);
    }
    assert_eq!(*p.table().entry(NodeId(1)).unwrap(), before);
    p.handle_reachable(NodeId(1));
    assert_eq!(p.sample().len(), 2);
}

#[test]
fn suspects_are_retried_with_exponential_backoff() {
    let cfg = FedericoConfig {
        neighbours: 2,
        epsilon: 1.0,
        ..Default::default()
    };
    let mut p = peer(0, 3, cfg);
    let losses = [(NodeId(0), 1.0), (NodeId(1), 0.2), (NodeId(2), 0.3)];
    // Peer 1 never answers; note the rounds in which it is sampled (and fails).
    let mut tried = Vec::new();
    for round in 1..=80u64 {
        if p.sample().contains(&NodeId(1)) {
            tried.push(round);
            p.handle_unreachable(NodeId(1));
        }
        p.handle_losses(1, &losses);
    }
    // ε = 1 with M = 2 of 2 candidates: tried whenever it is not backing off. Three in a
    // row, then gaps of 2, 4, 8, 16, 32 (and 64 after that).
    let gaps: Vec<u64> = tried.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(
        gaps,
        vec![1, 1, 2, 4, 8, 16, 32],
        "tried in rounds {tried:?}"
    );
    assert!(p.is_suspect(NodeId(1)));
    // An answer clears it at once.
    p.handle_reachable(NodeId(1));
    assert!(!p.is_suspect(NodeId(1)) && !p.is_backing_off(NodeId(1)));
    assert_eq!(backoff_rounds(1), 2);
    assert_eq!(backoff_rounds(40), MAX_BACKOFF_ROUNDS);
}

#[test]
fn a_heartbeat_grants_one_early_try_per_run_of_failures() {
    let cfg = FedericoConfig {
        neighbours: 2,
        epsilon: 1.0,
        ..Default::default()
    };
    let mut p = peer(0, 3, cfg);
    let losses = [(NodeId(0), 1.0), (NodeId(1), 0.2), (NodeId(2), 0.3)];
    for _ in 0..6 {
        p.handle_unreachable(NodeId(1));
        p.handle_losses(1, &losses);
    }
    // Six failures: backing off for 16 rounds from the last.
    assert!(p.is_backing_off(NodeId(1)));
    let weight = p.weight(NodeId(1));
    p.handle_heard_from(NodeId(1));
    assert!(!p.is_backing_off(NodeId(1)) && p.is_suspect(NodeId(1)));
    assert!(p.sample().contains(&NodeId(1)));
    // The try fails: back to the backoff, and further heartbeats grant nothing more.
    p.handle_unreachable(NodeId(1));
    p.handle_heard_from(NodeId(1));
    assert!(p.is_backing_off(NodeId(1)));
    assert_eq!(p.weight(NodeId(1)), weight, "a heartbeat changes no weight");
    // An answer ends the run: the next run of failures gets its own early try.
    p.handle_reachable(NodeId(1));
    for _ in 0..3 {
        p.handle_unreachable(NodeId(1));
    }
    p.handle_heard_from(NodeId(1));
    assert!(!p.is_backing_off(NodeId(1)));
    // A heartbeat from a peer that is not a suspect changes nothing.
    p.handle_heard_from(NodeId(2));
    assert!(!p.is_suspect(NodeId(2)));
}

#[test]
fn late_joiner_is_picked_by_a_greedy_slot() {
    let cfg = FedericoConfig {
        neighbours: 1,
        epsilon: 0.0,
        ..Default::default()
    };
    let mut p = peer(0, 3, cfg);
    for _ in 0..5 {
        p.handle_losses(1, &[(NodeId(0), 1.0), (NodeId(1), 1.0), (NodeId(2), 1.0)]);
    }
    p.handle_peer_joined(NodeId(9));
    assert_eq!(p.sample(), vec![NodeId(9)]);
}

#[test]
fn nan_loss_is_not_recorded() {
    let mut p = peer(0, 2, FedericoConfig::default());
    p.handle_losses(1, &[(NodeId(0), 1.0), (NodeId(1), f64::NAN)]);
    assert!(!p.table().entry(NodeId(1)).unwrap().seen);
    assert!(p.weights().iter().all(|w| w.1.is_finite()));
}

#[test]
fn config_validation_names_the_field() {
    let bad = FedericoConfig {
        epsilon: 1.5,
        ..Default::default()
    };
    assert!(bad.validate().unwrap_err().contains("epsilon"));
    let bad = FedericoConfig {
        beta: 0.0,
        ..Default::default()
    };
    assert!(bad.validate().unwrap_err().contains("beta"));
    let bad = FedericoConfig {
        loss_scale: Some(LossScale::Fixed(-1.0)),
        ..Default::default()
    };
    assert!(bad.validate().unwrap_err().contains("loss_scale"));
    for c in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let bad = FedericoConfig {
            clip_norm: Some(c),
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("clip_norm"), "{c}");
    }
    let clipped = FedericoConfig {
        clip_norm: Some(5.0),
        ..Default::default()
    };
    assert!(clipped.validate().is_ok());
    assert!(FedericoConfig::default().validate().is_ok());
}

#[test]
fn push_cut_holds_gradients_back_from_models_below_the_cut_but_never_from_self() {
    let losses = [(NodeId(0), 2.0), (NodeId(1), 0.5), (NodeId(2), 3.0)];
    // The paper: every measured model gets its weighted gradient.
    let paper_cfg = FedericoConfig {
        variant: Variant::Paper,
        ..Default::default()
    };
    let mut paper = peer(0, 3, paper_cfg);
    paper.handle_losses(10, &losses);
    for j in 0..3 {
        assert_eq!(paper.push_weight(NodeId(j)), Some(paper.weight(NodeId(j))));
    }
    // The default variant holds back below half the top weight.
    assert_eq!(FedericoConfig::default().push_cut(), 0.5);
    let mut p = peer(0, 3, FedericoConfig::default());
    p.handle_losses(10, &losses);
    // Peer 1 holds the top weight; peer 2's is e^-1.5 ≈ 0.22 of it, below the cut.
    let top = p.weight(NodeId(1));
    assert_eq!(p.push_weight(NodeId(1)), Some(top));
    assert_eq!(p.push_weight(NodeId(2)), None);
    // Self is e^-0.9 ≈ 0.41 of the top: below the cut, yet it always trains its own model.
    assert!(p.weight(NodeId(0)) < 0.5 * top);
    assert_eq!(p.push_weight(NodeId(0)), Some(p.weight(NodeId(0))));
    assert_eq!(paper.push_weight(NodeId(0)), Some(paper.weight(NodeId(0))));
    // `own_floor` (off by default) scales its own gradient by at least the floor: far below
    // it, the floor; above it, its weight.
    let far = [(NodeId(0), 5.0), (NodeId(1), 0.5), (NodeId(2), 3.0)];
    let floor = FedericoConfig {
        own_floor: 0.25,
        ..Default::default()
    };
    assert!(floor.validate().is_ok());
    let mut q = peer(0, 3, floor.clone());
    q.handle_losses(10, &far);
    assert!(q.weight(NodeId(0)) < 0.1);
    assert_eq!(q.push_weight(NodeId(0)), Some(0.25));
    assert_eq!(q.push_weight(NodeId(1)), Some(q.weight(NodeId(1))));
    let mut top1 = peer(1, 3, floor);
    top1.handle_losses(10, &far);
    assert!(top1.weight(NodeId(1)) > 0.25);
    assert_eq!(top1.push_weight(NodeId(1)), Some(top1.weight(NodeId(1))));
    let mut off = peer(0, 3, FedericoConfig::default());
    off.handle_losses(10, &far);
    assert_eq!(off.push_weight(NodeId(0)), Some(off.weight(NodeId(0))));
    // Checked like every other field, and refused with the paper's algorithm.
    for f in [-0.1, 1.5, f64::NAN] {
        let bad = FedericoConfig {
            own_floor: f,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("own_floor"), "{f}");
    }
    let paper_floor = FedericoConfig {
        variant: Variant::Paper,
        own_floor: 0.25,
        ..Default::default()
    };
    assert!(paper_floor.validate().unwrap_err().contains("own_floor"));
    // `score_share` too (off by default); the paper's algorithm trains and scores on every row.
    assert_eq!(FedericoConfig::default().score_share, 0.0);
    for h in [-0.1, 0.6, f64::NAN] {
        let bad = FedericoConfig {
            score_share: h,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("score_share"), "{h}");
    }
    let held = FedericoConfig {
        variant: Variant::Paper,
        score_share: 0.2,
        ..Default::default()
    };
    assert!(held.validate().unwrap_err().contains("score_share"));
    // The cut is checked like every other field.
    let bad = FedericoConfig {
        push_cut: Some(1.5),
        ..Default::default()
    };
    assert!(bad.validate().unwrap_err().contains("push_cut"));
    let mixed = FedericoConfig {
        variant: Variant::Paper,
        push_cut: Some(0.5),
        ..Default::default()
    };
    assert!(
        mixed
            .validate()
            .unwrap_err()
            .contains("variant = \"paper\"")
    );
}

#[test]
fn soften_is_the_federico_default_and_off_for_the_paper() {
    let d = FedericoConfig::default();
    // On where a silo samples only some models (8 members, M = 3), off where it samples all.
    assert_eq!(d.soften(8), Some(DEFAULT_SOFTEN));
    assert_eq!(d.soften(d.neighbours + 1), None);
    assert_eq!(d.sharpness(DEFAULT_SOFTEN.from_round - 1, 8), 1.0);
    assert_eq!(
        d.sharpness(DEFAULT_SOFTEN.from_round, 8),
        DEFAULT_SOFTEN.factor
    );
    assert_eq!(d.sharpness(1000, 4), 1.0);
    let paper = FedericoConfig {
        variant: Variant::Paper,
        ..Default::default()
    };
    assert_eq!(paper.soften(8), None);
    assert_eq!(paper.sharpness(1000, 8), 1.0);
    let off = FedericoConfig {
        soften: Some(Soften {
            from_round: 1,
            factor: 1.0,
        }),
        ..Default::default()
    };
    assert_eq!(off.soften(8), None);
    // Given, it holds in a federation of any size.
    let given = FedericoConfig {
        soften: Some(DEFAULT_SOFTEN),
        ..Default::default()
    };
    assert_eq!(given.soften(2), Some(DEFAULT_SOFTEN));
    assert!(off.validate().is_ok());
    // Off is allowed beside the paper's variant; anything else is not.
    let paper_off = FedericoConfig {
        variant: Variant::Paper,
        ..off.clone()
    };
    assert!(paper_off.validate().is_ok());
    let paper_soft = FedericoConfig {
        variant: Variant::Paper,
        soften: Some(DEFAULT_SOFTEN),
        ..Default::default()
    };
    assert!(paper_soft.validate().unwrap_err().contains("paper"));
    for f in [0.0, -0.5, f64::NAN, f64::INFINITY] {
        let bad = FedericoConfig {
            soften: Some(Soften {
                from_round: 3,
                factor: f,
            }),
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("soften.factor"), "{f}");
    }
}

#[test]
fn soften_divides_the_loss_gaps_from_its_round_on() {
    // β = 1: the tracked loss is the last one, so the weights are exactly softmax(−a·ℓ).
    let cfg = FedericoConfig {
        beta: 1.0,
        soften: Some(Soften {
            from_round: 3,
            factor: 0.5,
        }),
        ..Default::default()
    };
    let mut p = peer(0, 2, cfg);
    let other = |a: f64| (-2.0 * a).exp() / (1.0 + (-2.0 * a).exp());
    for round in 1..=4u64 {
        p.handle_losses(100, &[(NodeId(0), 0.0), (NodeId(1), 2.0)]);
        let want = if round < 3 { other(1.0) } else { other(0.5) };
        assert!(
            (p.weight(NodeId(1)) - want).abs() < 1e-12,
            "round {round}: {} against {want}",
            p.weight(NodeId(1))
        );
    }
    // A peer joining later enters the softened row: its optimistic 0 ties with self.
    p.handle_peer_joined(NodeId(7));
    assert!((p.weight(NodeId(7)) - p.weight(NodeId(0))).abs() < 1e-12);
    // A checkpoint keeps the softened weights and the multiplier.
    let bytes = bincode::serde::encode_to_vec(&p, bincode::config::standard()).unwrap();
    let (mut q, _): (Peer, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    assert_eq!(q.weights(), p.weights());
    q.handle_peer_joined(NodeId(8));
    p.handle_peer_joined(NodeId(8));
    assert_eq!(q.weights(), p.weights());
}

#[test]
fn evaluation_rounds_are_every_nth_and_the_last() {
    let scored = |every, rounds, upto| -> Vec<u64> {
        (1..=upto)
            .filter(|&r| is_evaluation_round(r, every, rounds))
            .collect()
    };
    assert_eq!(scored(5, Some(12), 12), [5, 10, 12]);
    assert_eq!(scored(5, Some(10), 10), [5, 10]);
    assert_eq!(scored(1, Some(3), 3), [1, 2, 3]);
    assert_eq!(
        scored(0, Some(7), 9),
        [7, 8, 9],
        "from the last on, every round is"
    );
    assert_eq!(scored(4, None, 12), [4, 8, 12]);
}

#[test]
fn an_incomplete_mixture_is_renormalised_over_what_arrived_and_a_complete_one_is_kept() {
    let mix = [
        (NodeId(0), 0.3),
        (NodeId(1), 0.3000000001),
        (NodeId(2), 0.4),
    ];
    // Complete: the weights exactly as they were (no division by a sum of about 1).
    assert_eq!(incomplete_mixture(&mix, |_| true, NodeId(0)), mix.to_vec());
    // Silo 2's model did not come: the rest share its weight in proportion.
    let w = incomplete_mixture(&mix, |j| j != NodeId(2), NodeId(0));
    assert_eq!(w.len(), 2);
    assert!((w[0].1 - 0.3 / 0.6000000001).abs() < 1e-12);
    assert!((w.iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-12);
    // Nothing with weight left (the own model was below the inference cut-off): itself alone.
    let only_peers = [(NodeId(1), 0.5), (NodeId(2), 0.5)];
    assert_eq!(
        incomplete_mixture(&only_peers, |_| false, NodeId(0)),
        vec![(NodeId(0), 1.0)]
    );
}

#[test]
fn a_member_whose_gradients_keep_opposing_the_owners_loses_its_weight_until_they_agree() {
    let mut p = peer(0, 4, FedericoConfig::default());
    p.set_distrust(true);
    let fair = p.weight(NodeId(2));
    assert!(fair > 0.2, "{fair}");
    // The row changes at E-steps only: a verdict alone does not move it.
    let mut q = p.clone();
    for _ in 0..50 {
        q.handle_verdicts(&[(NodeId(3), -1.0)]);
    }
    assert!(!q.is_distrusted(NodeId(3)));
    q.handle_losses(50, &[]);
    assert!(q.is_distrusted(NodeId(3)));
    // Scattered opposed gradients are not enough: an honest member's single gradients scatter
    // around the owner's, and half of them opposed leave the average above the line.
    for i in 0..200 {
        let c = if i % 2 == 0 { -0.6 } else { 0.6 };
        p.handle_verdicts(&[(NodeId(1), c), (NodeId(2), 0.3)]);
        p.handle_losses(50, &[]);
    }
    assert!(!p.is_distrusted(NodeId(1)));
    // A sustained run of sign-flipped gradients is: within a few dozen steps.
    let mut steps = 0;
    while !p.is_distrusted(NodeId(2)) {
        p.handle_verdicts(&[(NodeId(2), -0.5)]);
        p.handle_losses(50, &[]);
        steps += 1;
        assert!(steps < 40, "still trusted after {steps} opposed gradients");
    }
    assert_eq!(p.weight(NodeId(2)), 0.0);
    assert!((p.weights().iter().map(|x| x.1).sum::<f64>() - 1.0).abs() < 1e-12);
    assert_eq!(p.push_weight(NodeId(2)), None);
    assert!(p.weight(NodeId(1)) > fair);
    // Oversized gradients (−1 each, whatever their direction) are caught faster.
    let mut big = 0;
    while !p.is_distrusted(NodeId(3)) {
        p.handle_verdicts(&[(NodeId(3), -1.0)]);
        p.handle_losses(50, &[]);
        big += 1;
    }
    assert!(big < steps, "{big} oversized against {steps} opposed");
    // The owner never judges itself, whatever a caller passes.
    for _ in 0..100 {
        p.handle_verdicts(&[(NodeId(0), -1.0)]);
        p.handle_losses(50, &[]);
    }
    assert!(!p.is_distrusted(NodeId(0)));
    // Nothing is permanent: a member whose gradients agree again gets its weight back.
    for _ in 0..100 {
        p.handle_verdicts(&[(NodeId(2), f64::NAN)]);
        p.handle_losses(50, &[]);
    }
    assert!(p.is_distrusted(NodeId(2)));
    let mut agree = 0;
    while p.is_distrusted(NodeId(2)) {
        p.handle_verdicts(&[(NodeId(2), 0.2)]);
        p.handle_losses(50, &[]);
        agree += 1;
        assert!(
            agree < 60,
            "still distrusted after {agree} agreeing gradients"
        );
    }
    // A checkpoint keeps the record; with distrust off, the row is the paper's.
    let bytes = bincode::serde::encode_to_vec(&p, bincode::config::standard()).unwrap();
    let (mut q, _): (Peer, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
    q.set_distrust(true);
    assert!(q.is_distrusted(NodeId(3)));
    q.set_distrust(false);
    assert!(!q.is_distrusted(NodeId(3)));
    assert_eq!(q.weight(NodeId(3)), q.table().weight(NodeId(3)));
}
