//! Unit tests of `coord::fedsac::server` (moved unchanged from its inline `mod tests`).
//! Owns: the server's unit tests and their fixtures.
//! Must not: hold code the server itself uses.

use super::*;

fn settings(cohort: usize) -> Settings {
    Settings {
        alpha: 0.9,
        beta: 1.4,
        alpha_cutoff: 0.7,
        principal_angles: PrincipalAngles::Standard,
        cohort_size: cohort,
        score_trained: false,
        size_cap: None,
        update_clip: None,
        aggregator: crate::coord::robust::Aggregator::Mean,
        trim: crate::coord::robust::DEFAULT_TRIM,
    }
}

fn server(n: usize, cohort: usize) -> FedsacServer {
    let mut s = FedsacServer::new(settings(cohort), n, 6, 7, vec![0.0; 3]).unwrap();
    for i in 0..n {
        s.register(i, 10 + i as u64).unwrap();
    }
    s
}

fn assignment(s: &FedsacServer, i: usize, r: u64) -> Assignment {
    match s.fetch(i, r).unwrap() {
        FetchAnswer::Now(a) => a,
        other => panic!("silo {i} round {r}: {other:?}"),
    }
}

#[test]
fn nothing_starts_before_every_silo_registered() {
    let mut s = FedsacServer::new(settings(0), 2, 6, 7, vec![0.0; 3]).unwrap();
    s.register(0, 5).unwrap();
    assert_eq!(s.fetch(0, 0).unwrap(), FetchAnswer::Hold);
    assert!(s.update(0, 0, Arc::new(vec![0.0; 3]), None).is_err());
    assert!(s.register(2, 5).is_err());
    assert!(s.register(1, 0).is_err());
    s.register(1, 5).unwrap();
    assert_eq!(s.cohort(), [0, 1]);
    let a = assignment(&s, 1, 0);
    assert!(a.train && a.direction.is_none());
    assert!(
        s.register(1, 6).is_err(),
        "sizes are fixed once the run started"
    );
}

/// A full round is the simulator's arithmetic: the graph over the cohort, then each
/// member's mix and direction.
#[test]
fn a_round_aggregates_with_the_core_graph() {
    let mut s = server(3, 0);
    let models = [
        vec![1.0, 0.0, 0.0],
        vec![0.9, 0.1, 0.0],
        vec![0.0, 0.0, 1.0],
    ];
    for (i, m) in models.iter().enumerate() {
        let all = s.update(i, 0, Arc::new(m.clone()), None).unwrap();
        assert_eq!(all, i == 2);
    }
    let log = s.close(false).unwrap();
    let views: Vec<&[f32]> = models.iter().map(Vec::as_slice).collect();
    let p = fedsac::size_prior(&[10, 11, 12]).unwrap();
    let sim = fedsac::similarity_matrix(&views, &[0.0; 3]).unwrap();
    let c = fedsac::complementarity_matrix(&[None, None, None], PrincipalAngles::Standard).unwrap();
    let w = fedsac::collaboration_graph(&p, &sim, &c, 0.9, 1.4).unwrap();
    assert_eq!(log.graph, w);
    for (i, row) in w.iter().enumerate() {
        let a = assignment(&s, i, 1);
        assert_eq!(*a.params, fedsac::mix(&views, row).unwrap());
        assert_eq!(
            *a.direction.unwrap(),
            fedsac::direction(&views, row).unwrap()
        );
    }
}

#[test]
fn cohorts_follow_the_stream_and_outsiders_are_refused() {
    let mut s = server(5, 2);
    let mut want = StdRng::seed_from_u64(7);
    for r in 0..3u64 {
        let mut c = rand::seq::index::sample(&mut want, 5, 2).into_vec();
        c.sort_unstable();
        assert_eq!(s.cohort(), c, "round {r}");
        let out = (0..5).find(|i| !c.contains(i)).unwrap();
        assert!(!assignment(&s, out, r).train);
        assert!(s.update(out, r, Arc::new(vec![1.0; 3]), None).is_err());
        for &i in &c {
            s.update(i, r, Arc::new(vec![i as f32 + 1.0, 0.5, 0.0]), None)
                .unwrap();
        }
        s.close(false).unwrap();
        // Outsiders lose their direction.
        assert!(assignment(&s, out, r + 1).direction.is_none());
    }
}

#[test]
fn bad_updates_change_nothing() {
    let mut s = server(2, 0);
    assert!(s.update(0, 1, Arc::new(vec![0.0; 3]), None).is_err());
    assert!(s.update(0, 0, Arc::new(vec![0.0; 4]), None).is_err());
    let skew = Some(vec![vec![1.0, 1.0]]);
    assert!(s.update(0, 0, Arc::new(vec![0.0; 3]), skew).is_err());
    // A subspace of another width than the round's first is refused; the round still
    // closes.
    s.update(0, 0, Arc::new(vec![0.0; 3]), Some(vec![vec![1.0, 0.0]]))
        .unwrap();
    let wide = Some(vec![vec![1.0, 0.0, 0.0]]);
    let e = s.update(1, 0, Arc::new(vec![0.0; 3]), wide).unwrap_err();
    assert!(e.contains("dimensions"), "{e}");
    s.update(1, 0, Arc::new(vec![0.0; 3]), Some(vec![vec![0.0, 1.0]]))
        .unwrap();
    s.close(false).unwrap();
    let mut s = server(2, 0);
    assert!(s.update(9, 0, Arc::new(vec![0.0; 3]), None).is_err());
    assert!(!s.all_in());
    assert!(s.fetch(9, 0).is_err());
}

#[test]
fn a_deadline_round_uses_the_senders_only() {
    let mut s = server(3, 0);
    s.update(1, 0, Arc::new(vec![1.0, 2.0, 3.0]), None).unwrap();
    let log = s.close(true).unwrap();
    assert_eq!(log.senders, [1]);
    assert_eq!(log.graph, [vec![1.0]]);
    assert_eq!(*assignment(&s, 1, 1).params, vec![1.0, 2.0, 3.0]);
    assert_eq!(*assignment(&s, 0, 1).params, vec![0.0; 3]);
    assert!(assignment(&s, 0, 1).direction.is_none());
}

#[test]
fn checkpoints_resume_exactly_and_refuse_damage() {
    let mut s = server(5, 3);
    for r in 0..2u64 {
        for i in s.cohort().to_vec() {
            s.update(i, r, Arc::new(vec![i as f32, r as f32, 1.0]), None)
                .unwrap();
        }
        s.close(false).unwrap();
    }
    let bytes = s.encode().unwrap();
    let mut back = FedsacServer::decode(settings(3), 6, 7, &bytes).unwrap();
    assert_eq!(back.round(), 2);
    assert_eq!(back.cohort(), s.cohort());
    for i in 0..5 {
        assert_eq!(back.fetch(i, 2).unwrap(), s.fetch(i, 2).unwrap());
    }
    for t in [&mut s, &mut back] {
        for i in t.cohort().to_vec() {
            t.update(i, 2, Arc::new(vec![1.0, i as f32, 0.0]), None)
                .unwrap();
        }
    }
    assert_eq!(back.close(false).unwrap(), s.close(false).unwrap());
    assert_eq!(back.cohort(), s.cohort());
    assert!(FedsacServer::decode(settings(3), 6, 7, &bytes[..bytes.len() - 1]).is_err());
    let mut other = bytes.clone();
    other[0] = b'X';
    assert!(FedsacServer::decode(settings(3), 6, 7, &other).is_err());
}

#[test]
fn the_final_fetch_scores_the_aggregate_or_the_trained_model() {
    for trained in [false, true] {
        let mut st = settings(0);
        st.score_trained = trained;
        let mut s = FedsacServer::new(st, 2, 1, 7, vec![0.0; 2]).unwrap();
        s.register(0, 5).unwrap();
        s.register(1, 5).unwrap();
        s.update(0, 0, Arc::new(vec![1.0, 0.0]), None).unwrap();
        s.update(1, 0, Arc::new(vec![0.0, 1.0]), None).unwrap();
        s.close(false).unwrap();
        let a = assignment(&s, 0, 1);
        assert!(!a.train && a.direction.is_none());
        if trained {
            assert_eq!(*a.params, vec![1.0, 0.0]);
        } else {
            assert_eq!(*a.params, *s.params[0]);
        }
    }
}

/// Joining closed on silos 0, 1 and 3 of 5 with cohorts of 2: cohorts are the stream's
/// draws over those three (mapped to their indices), the rounds are exactly a 3-silo run's,
/// silos 2 and 4 are told to train alone and their updates are refused; the checkpoint
/// keeps the members and the cohort.
#[test]
fn a_run_started_without_silos_is_the_run_of_those_that_came() {
    let members = [0, 1, 3];
    let mut s = FedsacServer::new(settings(2), 5, 6, 7, vec![0.0; 3]).unwrap();
    assert!(s.close_joining().is_err(), "nobody registered");
    for i in members {
        s.register(i, 10 + i as u64).unwrap();
    }
    assert_eq!(s.missing(), vec![2, 4]);
    assert_eq!(s.fetch(0, 0).unwrap(), FetchAnswer::Hold);
    assert_eq!(s.close_joining().unwrap(), vec![2, 4]);
    assert!(s.close_joining().is_err(), "already started");
    assert_eq!(s.members(), members);
    s.register(4, 3).unwrap();
    assert_eq!(s.fetch(4, 0).unwrap(), FetchAnswer::Alone);
    assert_eq!(s.fetch(2, 0).unwrap(), FetchAnswer::Alone);
    let e = s.update(4, 0, Arc::new(vec![1.0; 3]), None).unwrap_err();
    assert!(e.contains("trains alone"), "{e}");

    let mut three = FedsacServer::new(settings(2), 3, 6, 7, vec![0.0; 3]).unwrap();
    for (j, i) in members.into_iter().enumerate() {
        three.register(j, 10 + i as u64).unwrap();
    }
    for r in 0..4u64 {
        let mapped: Vec<usize> = three.cohort().iter().map(|&j| members[j]).collect();
        assert_eq!(s.cohort(), mapped, "round {r}");
        for (j, i) in members.into_iter().enumerate() {
            let (a, b) = (assignment(&s, i, r), assignment(&three, j, r));
            assert_eq!(a, b, "silo {i} round {r}");
            if a.train {
                let m = Arc::new(vec![i as f32 + r as f32, 0.5, 1.0]);
                s.update(i, r, m.clone(), None).unwrap();
                three.update(j, r, m, None).unwrap();
            }
        }
        assert!(s.all_in());
        let (a, b) = (s.close(false).unwrap(), three.close(false).unwrap());
        assert_eq!(a.graph, b.graph);
        assert_eq!(
            a.senders,
            b.senders.iter().map(|&j| members[j]).collect::<Vec<_>>()
        );
    }
    let bytes = s.encode().unwrap();
    let back = FedsacServer::decode(settings(2), 6, 7, &bytes).unwrap();
    assert_eq!(back.members(), members);
    assert_eq!(back.cohort(), s.cohort());
    for i in 0..5 {
        assert_eq!(back.fetch(i, 4).unwrap(), s.fetch(i, 4).unwrap());
    }
}

/// A checkpoint written before joining could close (version 1) resumes with every silo in
/// the run and the same cohort.
#[test]
fn a_version_1_checkpoint_resumes_with_every_silo() {
    let mut s = server(4, 2);
    for i in s.cohort().to_vec() {
        s.update(i, 0, Arc::new(vec![i as f32, 1.0, 0.0]), None)
            .unwrap();
    }
    s.close(false).unwrap();
    let vec_of = |v: &[Option<Arc<Vec<f32>>>]| -> Vec<Option<Vec<f32>>> {
        v.iter().map(|d| d.as_ref().map(|d| d.to_vec())).collect()
    };
    let body = SavedV1 {
        round: s.round,
        sizes: s.joining.sizes().to_vec(),
        init: s.init.to_vec(),
        params: s.params.iter().map(|m| m.to_vec()).collect(),
        directions: vec_of(&s.directions),
        trained: vec_of(&s.trained),
    };
    let mut v1 = crate::store::header(MAGIC, 1);
    bincode::serde::encode_into_std_write(&body, &mut v1, bincode::config::standard()).unwrap();
    let back = FedsacServer::decode(settings(2), 6, 7, &v1).unwrap();
    assert_eq!(back.members(), [0, 1, 2, 3]);
    assert_eq!(back.cohort(), s.cohort());
    for i in 0..4 {
        assert_eq!(back.fetch(i, 1).unwrap(), s.fetch(i, 1).unwrap());
    }
}

/// Found under faults (`coordinator-faults.toml`, seed 2): a round that closed with one silo
/// of each group mixed the two, and a silo whose group-mates were silent ended 55 points down.
/// A cohort member that sent nothing this round but trained recently stands in with its last
/// trained model: the sender mixes with its own kind. Without that the row of silo 0 (group
/// A, alone with silo 3 of group B) puts weight on silo 3.
#[test]
fn a_round_with_few_senders_mixes_with_recent_group_mates_not_whoever_sent() {
    let mut s = FedsacServer::new(settings(0), 4, 20, 7, vec![0.0; 3]).unwrap();
    for i in 0..4 {
        s.register(i, 10).unwrap();
    }
    let a = [vec![1.0, 0.0, 0.0], vec![0.95, 0.05, 0.0]];
    let b = [vec![0.0, 0.0, 1.0], vec![0.0, 0.05, 0.95]];
    for (i, m) in [&a[0], &a[1], &b[0], &b[1]].into_iter().enumerate() {
        s.update(i, 0, Arc::new(m.clone()), None).unwrap();
    }
    assert!(s.close(false).unwrap().stale.is_empty());
    // Round 1: only silos 0 (group A) and 3 (group B) send.
    s.update(0, 1, Arc::new(a[0].clone()), None).unwrap();
    s.update(3, 1, Arc::new(b[1].clone()), None).unwrap();
    let log = s.close(true).unwrap();
    assert_eq!(log.senders, [0, 3]);
    assert_eq!(log.stale, [1, 2]);
    // Columns: senders 0, 3, then stale 1, 2. Silo 0 leans on silo 1, not on silo 3.
    let row = &log.graph[0];
    assert!(row[2] > 0.2 && row[1] < 0.05, "{row:?}");
    let mixed = assignment(&s, 0, 2).params;
    assert!(mixed[2] < 0.05, "{mixed:?}");
    // Long-silent members do not stand in: after STALE_ROUNDS rounds without silos 1 and 2,
    // the rounds are the senders' alone again.
    for r in 2..=(1 + STALE_ROUNDS) {
        s.update(0, r, Arc::new(a[0].clone()), None).unwrap();
        s.update(3, r, Arc::new(b[1].clone()), None).unwrap();
        let log = s.close(true).unwrap();
        assert_eq!(log.stale.is_empty(), r > STALE_ROUNDS, "round {r}");
    }
}

/// Insiders' review (D3's FedSaC form): a member that registers `n_train = 10^12` owns the
/// size prior, and with it a large share of every silo's mix. With `size_cap` its count is at
/// most `size_cap` times the round's median, and the round of honest counts is unchanged.
#[test]
fn a_member_lying_about_its_size_does_not_take_every_silos_mix() {
    let run = |size_cap: Option<f64>, liar: u64| {
        let mut s = FedsacServer::new(
            Settings {
                size_cap,
                ..settings(0)
            },
            3,
            6,
            7,
            vec![0.0; 3],
        )
        .unwrap();
        for (i, n) in [40, 40, liar].into_iter().enumerate() {
            s.register(i, n).unwrap();
        }
        let models = [
            vec![1.0, 0.0, 0.0],
            vec![0.9, 0.1, 0.0],
            vec![0.0, 0.2, 1.0],
        ];
        for (i, m) in models.iter().enumerate() {
            s.update(i, 0, Arc::new(m.clone()), None).unwrap();
        }
        s.close(false).unwrap().graph
    };
    let lie = 1_000_000_000_000;
    let undefended = run(None, lie);
    let capped = run(Some(2.0), lie);
    // Silo 0's weight on the liar: the prior's 1.0 against its 0.5 capped (80 of 160).
    let (before, after) = (undefended[0][2], capped[0][2]);
    assert!(before > after + 0.2, "{before} → {after}");
    assert_eq!(capped, run(None, 80), "capped, the lie is a count of 80");
    // Honest counts within the cap: the graph of the undefended run, bit for bit.
    assert_eq!(run(Some(2.0), 60), run(None, 60));
}

/// Issue 38: one of five senders sends its model scaled ×10⁶. Its direction is honest, so the
/// graph's similarity gives it an honest share of every silo's mix (a sign-flipped model gets
/// none: the graph already drops it); the paper's mix is then the attacker's; with `aggregator = "median"` each honest silo's mix stays
/// within the honest values, and with `update_clip` the attacker's model counts as at most 3
/// median moves from where it started.
#[test]
fn a_poisoned_model_is_outvoted_by_the_median_and_bounded_by_the_clip() {
    let run = |aggregator: Aggregator, update_clip: Option<f64>| {
        let mut s = FedsacServer::new(
            Settings {
                aggregator,
                update_clip,
                ..settings(0)
            },
            5,
            6,
            7,
            vec![0.0; 3],
        )
        .unwrap();
        for i in 0..5 {
            s.register(i, 40).unwrap();
        }
        for i in 0..4 {
            let x = 1.0 + 0.1 * i as f32;
            s.update(i, 0, Arc::new(vec![x, 0.5 * x, -x]), None)
                .unwrap();
        }
        s.update(4, 0, Arc::new(vec![1.2e6, 6e5, -1.2e6]), None)
            .unwrap();
        s.close(false).unwrap();
        let FetchAnswer::Now(a) = s.fetch(0, 1).unwrap() else {
            panic!("silo 0 has its model")
        };
        a.params.to_vec()
    };
    let mean = run(Aggregator::Mean, None);
    assert!(
        mean[0] > 1e3,
        "the attacker takes a share of silo 0's mix: {mean:?}"
    );
    for rule in [
        Aggregator::Median,
        Aggregator::TrimmedMean,
        Aggregator::Krum,
    ] {
        let m = run(rule, None);
        assert!(
            (1.0..=1.3).contains(&m[0]) && (-1.3..=-1.0).contains(&m[2]),
            "{rule:?}: {m:?}"
        );
    }
    let clipped = run(Aggregator::Mean, Some(3.0));
    let norm = clipped.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!(norm < 3.0 * 1.9, "{clipped:?}");
}
