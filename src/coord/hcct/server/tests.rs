//! Unit tests of `coord::hcct::server` (moved unchanged from its inline `mod tests`).
//! Owns: the server's unit tests and their fixtures.
//! Must not: hold code the server itself uses.

use super::*;
use crate::coord::hcct::Alpha;

fn cfg() -> HcctConfig {
    HcctConfig {
        alpha: Alpha::Constant(0.0),
        ..HcctConfig::default()
    }
}

fn registered(n: usize) -> HcctServer {
    let mut s = HcctServer::new(cfg(), n, 5, vec![0.0; 3]).unwrap();
    for i in 0..n {
        s.register(i, 10 * (i as u64 + 1)).unwrap();
    }
    s
}

#[test]
fn nothing_starts_before_every_silo_registered() {
    let mut s = HcctServer::new(cfg(), 3, 5, vec![0.0; 3]).unwrap();
    s.register(0, 10).unwrap();
    s.register(2, 30).unwrap();
    assert!(!s.ready());
    assert_eq!(s.fetch(0, 0).unwrap(), FetchAnswer::Hold);
    assert!(s.update(0, 0, Arc::new(vec![1.0; 3])).is_err());
    assert!(s.close(true).is_err());
    assert!(s.register(3, 10).is_err());
    assert!(s.register(1, 0).is_err());
    s.register(1, 20).unwrap();
    assert!(s.ready());
    assert_eq!(s.groups(), [vec![0], vec![1], vec![2]]);
    assert!(
        s.register(1, 21).is_err(),
        "sizes are fixed once the run started"
    );
    s.register(1, 20).unwrap();
    match s.fetch(1, 0).unwrap() {
        FetchAnswer::Now { round, params } => {
            assert_eq!(round, 0);
            assert_eq!(*params, vec![0.0; 3]);
        }
        other => panic!("round 0 is open: {other:?}"),
    }
}

/// With α = 0 nobody merges (independent training): every silo keeps its own end model.
#[test]
fn alpha_zero_keeps_silos_apart_and_their_models_their_own() {
    let mut s = registered(3);
    assert!(!s.update(0, 0, Arc::new(vec![1.0, 0.0, 0.0])).unwrap());
    assert!(!s.update(1, 0, Arc::new(vec![0.0, 1.0, 0.0])).unwrap());
    assert!(s.update(2, 0, Arc::new(vec![0.0, 0.0, 1.0])).unwrap());
    let log = s.close(false).unwrap();
    assert_eq!(log.next_groups, [vec![0], vec![1], vec![2]]);
    assert_eq!(log.senders, [0, 1, 2]);
    assert_eq!(s.round(), 1);
    match s.fetch(1, 1).unwrap() {
        FetchAnswer::Now { params, .. } => assert_eq!(*params, vec![0.0, 1.0, 0.0]),
        other => panic!("round 1 is open: {other:?}"),
    }
    assert_eq!(s.fetch(1, 2).unwrap(), FetchAnswer::Hold);
}

/// Identical pseudo-gradients merge into one group (spec degenerate case), and the group's
/// start model is the size-weighted average of its members' models.
#[test]
fn identical_updates_merge_and_start_from_the_weighted_average() {
    // The sizes as registered (30 is more than twice the lower median of two, 10).
    let cfg = HcctConfig {
        size_cap: 0.0,
        ..HcctConfig::default()
    };
    let mut s = HcctServer::new(cfg, 2, 5, vec![0.0; 2]).unwrap();
    s.register(0, 10).unwrap();
    s.register(1, 30).unwrap();
    s.update(0, 0, Arc::new(vec![-1.0, -1.0])).unwrap();
    s.update(1, 0, Arc::new(vec![-1.0, -1.0])).unwrap();
    let log = s.close(false).unwrap();
    assert_eq!(log.next_groups, [vec![0, 1]]);
    // Round 1: both start from the same average; they send different ends.
    s.update(0, 1, Arc::new(vec![0.0, 4.0])).unwrap();
    s.update(1, 1, Arc::new(vec![4.0, 0.0])).unwrap();
    s.close(false).unwrap();
    let want = group_average(&[&[0.0, 4.0], &[4.0, 0.0]], &[10, 30]).unwrap();
    for i in 0..2 {
        match s.fetch(i, 2).unwrap() {
            FetchAnswer::Now { params, .. } => assert_eq!(*params, want),
            other => panic!("round 2 is open: {other:?}"),
        }
    }
}

#[test]
fn a_deadline_round_aggregates_the_senders_and_flags_the_missing_as_stale() {
    let mut s = registered(3);
    for i in 0..3 {
        s.update(i, 0, Arc::new(vec![i as f32; 3])).unwrap();
    }
    s.close(false).unwrap();
    s.update(0, 1, Arc::new(vec![5.0; 3])).unwrap();
    let log = s.close(true).unwrap();
    assert!(log.timed_out);
    assert_eq!(log.senders, [0]);
    assert_eq!(log.stale, [1, 2]);
    // Silo 2 sent nothing: its singleton keeps its start model.
    match s.fetch(2, 2).unwrap() {
        FetchAnswer::Now { params, .. } => assert_eq!(*params, vec![2.0; 3]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_updates_change_nothing() {
    let mut s = registered(2);
    let huge = Arc::new(vec![f32::MAX, -f32::MAX, 0.0]);
    let e = s.update(0, 0, huge).unwrap_err();
    assert!(e.contains("not finite"), "{e}");
    assert!(s.update(5, 0, Arc::new(vec![0.0; 3])).is_err());
    assert!(s.update(0, 1, Arc::new(vec![0.0; 3])).is_err());
    assert!(s.update(0, 0, Arc::new(vec![0.0; 4])).is_err());
    assert!(!s.all_in());
    assert!(s.fetch(9, 0).is_err());
}

#[test]
fn the_final_fetch_gives_each_silo_its_own_model() {
    let mut s = HcctServer::new(cfg(), 2, 1, vec![0.0; 1]).unwrap();
    s.register(0, 1).unwrap();
    s.register(1, 1).unwrap();
    s.update(0, 0, Arc::new(vec![3.0])).unwrap();
    s.update(1, 0, Arc::new(vec![7.0])).unwrap();
    s.close(false).unwrap();
    for (i, want) in [(0, 3.0), (1, 7.0)] {
        assert_eq!(
            s.fetch(i, 1).unwrap(),
            FetchAnswer::Now {
                round: 1,
                params: Arc::new(vec![want])
            }
        );
    }
}

#[test]
fn the_unsupported_variants_are_refused_by_name() {
    let e = HcctServer::new(
        HcctConfig {
            efficient: true,
            ..cfg()
        },
        2,
        1,
        vec![0.0],
    )
    .unwrap_err();
    assert!(e.contains("hcct.efficient"), "{e}");
    let e = HcctServer::new(
        HcctConfig {
            optimizer: Optimizer::Adam,
            ..cfg()
        },
        2,
        1,
        vec![0.0],
    )
    .unwrap_err();
    assert!(e.contains("adam"), "{e}");
    assert!(HcctServer::new(cfg(), 0, 1, vec![0.0]).is_err());
}

/// A restarted coordinator carries on exactly: same groups, models and next partition.
#[test]
fn checkpoints_resume_exactly_and_refuse_damage() {
    let mut s = HcctServer::new(HcctConfig::default(), 3, 9, vec![0.0; 2]).unwrap();
    for i in 0..3 {
        s.register(i, 10).unwrap();
    }
    let ends = [[1.0, 1.0], [1.1, 0.9], [-1.0, 1.0]];
    for (i, e) in ends.iter().enumerate() {
        s.update(i, 0, Arc::new(e.to_vec())).unwrap();
    }
    s.close(false).unwrap();
    let bytes = s.encode().unwrap();
    let mut back = HcctServer::decode(HcctConfig::default(), 9, &bytes).unwrap();
    assert_eq!(back.round(), 1);
    assert_eq!(back.groups(), s.groups());
    for i in 0..3 {
        assert_eq!(back.fetch(i, 1).unwrap(), s.fetch(i, 1).unwrap());
    }
    for t in [&mut s, &mut back] {
        for i in 0..3 {
            t.update(i, 1, Arc::new(vec![i as f32, 1.0])).unwrap();
        }
    }
    assert_eq!(back.close(false).unwrap(), s.close(false).unwrap());
    assert!(HcctServer::decode(HcctConfig::default(), 9, &bytes[..bytes.len() - 1]).is_err());
    assert!(HcctServer::decode(HcctConfig::default(), 9, &bytes[..10]).is_err());
    let mut other = bytes.clone();
    other[0] = b'X';
    assert!(HcctServer::decode(HcctConfig::default(), 9, &other).is_err());
    let mut longer = bytes;
    longer.push(0);
    assert!(HcctServer::decode(HcctConfig::default(), 9, &longer).is_err());
}

fn params(a: FetchAnswer) -> Vec<f32> {
    match a {
        FetchAnswer::Now { params, .. } => params.to_vec(),
        other => panic!("no model: {other:?}"),
    }
}

/// Joining closed on silos 0, 2 and 3 of 4: the run is exactly a 3-silo run over their
/// sizes (groups, merges and models under the index map), silo 1 is told to train alone
/// and its updates are refused; the checkpoint keeps the members.
#[test]
fn a_run_started_without_a_silo_is_the_run_of_those_that_came() {
    let mut s = HcctServer::new(HcctConfig::default(), 4, 9, vec![0.0; 2]).unwrap();
    assert!(s.close_joining().is_err(), "nobody registered");
    let sizes = [10, 0, 30, 20];
    for i in [0, 2, 3] {
        s.register(i, sizes[i]).unwrap();
    }
    assert_eq!(s.missing(), vec![1]);
    assert_eq!(s.fetch(0, 0).unwrap(), FetchAnswer::Hold);
    assert_eq!(s.close_joining().unwrap(), vec![1]);
    assert!(s.close_joining().is_err(), "already started");
    assert_eq!(s.members(), [0, 2, 3]);
    assert_eq!(s.groups(), [vec![0], vec![2], vec![3]]);
    assert_eq!(s.fetch(1, 0).unwrap(), FetchAnswer::Alone);
    s.register(1, 50).unwrap();
    assert_eq!(s.fetch(1, 0).unwrap(), FetchAnswer::Alone);
    let e = s.update(1, 0, Arc::new(vec![0.0; 2])).unwrap_err();
    assert!(e.contains("trains alone"), "{e}");

    let mut three = HcctServer::new(HcctConfig::default(), 3, 9, vec![0.0; 2]).unwrap();
    for (j, i) in [0, 2, 3].into_iter().enumerate() {
        three.register(j, sizes[i]).unwrap();
    }
    let map = |g: Vec<Vec<usize>>| -> Vec<Vec<usize>> {
        g.into_iter()
            .map(|g| g.into_iter().map(|j| [0, 2, 3][j]).collect())
            .collect()
    };
    // Silos 0 and 2 move alike (they merge), silo 3 elsewhere.
    let ends = [
        [[1.0, 1.0], [1.1, 0.9], [-1.0, 1.0]],
        [[2.0, 1.0], [1.0, 2.0], [0.5, -3.0]],
    ];
    let mut merged = false;
    for (t, round) in ends.iter().enumerate() {
        for (j, e) in round.iter().enumerate() {
            let all = s
                .update([0, 2, 3][j], t as u64, Arc::new(e.to_vec()))
                .unwrap();
            three.update(j, t as u64, Arc::new(e.to_vec())).unwrap();
            assert_eq!(all, j == 2, "all in once the third member sent");
        }
        let (a, b) = (s.close(false).unwrap(), three.close(false).unwrap());
        assert_eq!(a.next_groups, map(b.next_groups.clone()));
        assert_eq!(a.senders, [0, 2, 3]);
        merged |= a.next_groups.len() < 3;
        for (j, i) in [0, 2, 3].into_iter().enumerate() {
            let r = t as u64 + 1;
            assert_eq!(
                params(s.fetch(i, r).unwrap()),
                params(three.fetch(j, r).unwrap())
            );
        }
    }
    assert!(merged, "the test should exercise a merge");

    let bytes = s.encode().unwrap();
    let back = HcctServer::decode(HcctConfig::default(), 9, &bytes).unwrap();
    assert_eq!(back.members(), [0, 2, 3]);
    assert_eq!(back.groups(), s.groups());
    assert_eq!(back.fetch(1, 2).unwrap(), FetchAnswer::Alone);
    assert_eq!(
        params(back.fetch(3, 2).unwrap()),
        params(s.fetch(3, 2).unwrap())
    );
}

/// A checkpoint written before joining could close (version 1) resumes with every silo in
/// the run.
#[test]
fn a_version_1_checkpoint_resumes_with_every_silo() {
    let mut s = registered(3);
    for i in 0..3 {
        s.update(i, 0, Arc::new(vec![i as f32; 3])).unwrap();
    }
    s.close(false).unwrap();
    let mut v1 = crate::store::header(MAGIC, 1);
    let body = SavedV1 {
        round: s.round,
        sizes: s.joining.sizes().to_vec(),
        models: s.models.iter().map(|m| m.to_vec()).collect(),
        coord: s.coord.as_ref().map(Coordinator::snapshot),
    };
    bincode::serde::encode_into_std_write(&body, &mut v1, bincode::config::standard()).unwrap();
    let back = HcctServer::decode(cfg(), 5, &v1).unwrap();
    assert_eq!(back.members(), [0, 1, 2]);
    assert_eq!(back.groups(), s.groups());
    for i in 0..3 {
        assert_eq!(back.fetch(i, 1).unwrap(), s.fetch(i, 1).unwrap());
    }
    let mut bad = v1.clone();
    bad[8] = 7;
    let e = HcctServer::decode(cfg(), 5, &bad).unwrap_err();
    assert!(e.contains("version 7"), "{e}");
}

/// Insiders' review (D3's HCCT form): a member that registers `n_train = 10^12` owns its
/// group's average. With `size_cap` its count weighs at most `size_cap` times the run's
/// median.
#[test]
fn a_member_lying_about_its_size_does_not_own_its_groups_model() {
    let run = |size_cap: f64| {
        let cfg = HcctConfig {
            round0_global: true,
            size_cap,
            ..HcctConfig::default()
        };
        let mut s = HcctServer::new(cfg, 3, 1, vec![0.0; 3]).unwrap();
        for (i, n) in [40, 40, 1_000_000_000_000].into_iter().enumerate() {
            s.register(i, n).unwrap();
        }
        // Round 0 is one FedAvg group of all three.
        assert_eq!(s.groups(), [vec![0, 1, 2]]);
        s.update(0, 0, Arc::new(vec![1.0, 0.0, 0.0])).unwrap();
        s.update(1, 0, Arc::new(vec![0.0, 1.0, 0.0])).unwrap();
        s.update(2, 0, Arc::new(vec![0.0, 0.0, 1.0])).unwrap();
        s.close(false).unwrap();
        // The run is over: each silo's model is its group's average; the liar's coordinate
        // is its weight in it.
        params(s.fetch(0, 1).unwrap())[2]
    };
    let undefended = run(0.0);
    assert!(
        undefended > 0.999_999,
        "the liar owns the average: {undefended}"
    );
    // Capped at 2 × the median (40): 80 of 160.
    let capped = run(2.0);
    assert!((capped - 0.5).abs() < 1e-6, "{capped}");
    assert!(
        HcctServer::new(
            HcctConfig {
                size_cap: 0.5,
                ..HcctConfig::default()
            },
            3,
            1,
            vec![0.0; 3]
        )
        .is_err()
    );
}

/// Issue 38: a member of a group sends a model far from the group's start (scaled ×10⁶ and
/// sign-flipped). The paper's average is the attacker's; with `aggregator = "median"` the
/// group's model stays within the honest members' values, and with `update_clip` the
/// attacker moves it no further than 3 median moves.
#[test]
fn a_poisoned_model_is_outvoted_by_the_median_and_bounded_by_the_clip() {
    let run = |aggregator: Aggregator, update_clip: f64| {
        let cfg = HcctConfig {
            round0_global: true,
            aggregator,
            update_clip,
            ..HcctConfig::default()
        };
        let mut s = HcctServer::new(cfg, 5, 1, vec![0.0; 3]).unwrap();
        for i in 0..5 {
            s.register(i, 40).unwrap();
        }
        assert_eq!(s.groups(), [vec![0, 1, 2, 3, 4]]);
        for i in 0..4 {
            let x = 1.0 + 0.1 * i as f32;
            s.update(i, 0, Arc::new(vec![x, x, -x])).unwrap();
        }
        s.update(4, 0, Arc::new(vec![-1e6, -1e6, 1e6])).unwrap();
        s.close(false).unwrap();
        params(s.fetch(0, 1).unwrap())
    };
    let mean = run(Aggregator::Mean, 0.0);
    assert!(mean[0] < -1e5, "the attacker owns the average: {mean:?}");
    let median = run(Aggregator::Median, 0.0);
    assert_eq!(median, vec![1.1, 1.1, -1.1]);
    let trimmed = run(Aggregator::TrimmedMean, 0.0);
    assert!((trimmed[0] - 1.1).abs() < 1e-6, "{trimmed:?}");
    // Krum (⌈0.2 · 5⌉ = 1 taken to be hostile) drops the attacker whole: the mean of the four
    // honest models.
    let krum = run(Aggregator::Krum, 0.0);
    assert!(
        (krum[0] - 1.15).abs() < 1e-6 && (krum[2] + 1.15).abs() < 1e-6,
        "{krum:?}"
    );
    // The clip: the attacker's move is cut to 3 × the median move (|(1.2, 1.2, −1.2)| ≈ 2.08)
    // and the mean of the five moves is small.
    let clipped = run(Aggregator::Mean, 3.0);
    let norm = clipped.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!(norm < 3.0 * 2.1, "{clipped:?}");
    // The simulator's own modes have no robust aggregation, and say so.
    assert!(
        HcctConfig {
            update_clip: 3.0,
            efficient: true,
            ..HcctConfig::default()
        }
        .validate()
        .is_err(),
        "HCCT-E has no robust aggregation and says so"
    );
}
