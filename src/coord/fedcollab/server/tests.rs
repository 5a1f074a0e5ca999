//! Unit tests of `coord::fedcollab::server` (moved unchanged from its inline `mod tests`).
//! Owns: the server's unit tests and their fixtures.
//! Must not: hold code the server itself uses.

use super::*;

fn pd(partner: u32, d: f64) -> PairDistance {
    PairDistance {
        partner,
        distance: Some(d),
        rounds: 101,
    }
}

fn cfg() -> FedCollabConfig {
    FedCollabConfig {
        restarts: 10,
        ..Default::default()
    }
}

/// Four silos of two types (distance 1 across, 0 within): the plan waits for every join,
/// the coalitions are the two types, each silo hears only its own, and a restore from the
/// checkpoint answers the same.
#[test]
fn joins_plan_reports_and_a_two_type_structure() {
    let mut s = FedCollabServer::new(cfg(), 4, 7).unwrap();
    for i in 0..3 {
        s.register(i, 100).unwrap();
    }
    assert_eq!(s.fetch(0, 0).unwrap(), FetchAnswer::Hold);
    assert!(s.report(0, vec![]).is_err(), "no plan yet");
    s.register(3, 60).unwrap();
    assert_eq!(
        s.fetch(2, 0).unwrap(),
        FetchAnswer::Plan {
            target: 30.0,
            nodes: 4,
            members: vec![0, 1, 2, 3],
        }
    );
    assert!(s.register(3, 61).is_err(), "the plan was cut from 60");
    s.register(3, 60).unwrap();
    let ty = |i: u32| i % 2;
    let row = |i: u32| -> Vec<PairDistance> {
        (0..4)
            .filter(|&j| j != i)
            .map(|j| pd(j, if ty(i) == ty(j) { 0.0 } else { 1.0 }))
            .collect()
    };
    assert!(
        s.report(0, row(0)[..2].to_vec()).is_err(),
        "a partner missing"
    );
    let mut dup = row(0);
    dup[2] = pd(1, 0.5);
    assert!(s.report(0, dup).is_err(), "a partner twice");
    assert!(
        s.report(0, vec![pd(0, 0.0), pd(1, 0.0), pd(2, 0.0)])
            .is_err()
    );
    for i in 0..3u32 {
        assert!(!s.report(i as usize, row(i)).unwrap());
    }
    assert_eq!(s.fetch(0, 1).unwrap(), FetchAnswer::Hold);
    assert!(s.report(3, row(3)).unwrap());
    let solved = s.solved().unwrap().clone();
    assert_eq!(solved.coalitions, vec![vec![0, 2], vec![1, 3]]);
    assert!(solved.mismatched.is_empty() && solved.failed.is_empty());
    assert_eq!(
        s.fetch(3, 1).unwrap(),
        FetchAnswer::Coalition {
            members: vec![1, 3],
            sizes: vec![100, 60]
        }
    );
    assert!(s.fetch(3, 2).is_err());
    assert!(s.fetch(4, 0).is_err());
    let back = FedCollabServer::decode(cfg(), 7, &s.encode().unwrap()).unwrap();
    assert_eq!(back.solved(), Some(&solved));
    assert_eq!(back.fetch(1, 1).unwrap(), s.fetch(1, 1).unwrap());
    let mut bytes = s.encode().unwrap();
    bytes.push(0);
    assert!(FedCollabServer::decode(cfg(), 7, &bytes).is_err());
}

/// A failed pair counts as far apart, and two reports of a pair that differ are flagged
/// and averaged by the solver's preparation.
#[test]
fn failed_and_mismatched_pairs_are_recorded() {
    let mut s = FedCollabServer::new(cfg(), 3, 1).unwrap();
    for i in 0..3 {
        s.register(i, 50).unwrap();
    }
    let none = |p| PairDistance {
        partner: p,
        distance: None,
        rounds: 0,
    };
    s.report(0, vec![pd(1, 0.1), none(2)]).unwrap();
    s.report(1, vec![pd(0, 0.3), pd(2, 0.9)]).unwrap();
    s.report(2, vec![pd(0, 0.2), pd(1, 0.9)]).unwrap();
    let solved = s.solved().unwrap();
    assert_eq!(solved.failed, vec![(0, 2)]);
    assert_eq!(solved.mismatched, vec![(0, 1), (0, 2)]);
    assert_eq!(solved.distances[0][2], 1.0);
}

/// Joining closed with silo 2 absent: the plan is silos 0, 1 and 3 (their target), their
/// reports name only each other, the structure is theirs in manifest indices, and silo 2,
/// joining late, hears it trains alone and cannot report. The checkpoint keeps all of it.
#[test]
fn a_plan_without_an_absent_silo() {
    let mut s = FedCollabServer::new(cfg(), 4, 7).unwrap();
    s.register(0, 100).unwrap();
    assert!(s.close_joining().is_err(), "one silo cannot pair");
    assert!(!s.ready());
    s.register(1, 80).unwrap();
    s.register(3, 60).unwrap();
    assert_eq!(s.missing(), vec![2]);
    assert_eq!(s.fetch(0, 0).unwrap(), FetchAnswer::Hold);
    assert_eq!(s.close_joining().unwrap(), vec![2]);
    assert!(s.close_joining().is_err(), "already out");
    let plan = FetchAnswer::Plan {
        target: 30.0,
        nodes: 4,
        members: vec![0, 1, 3],
    };
    assert_eq!(s.fetch(3, 0).unwrap(), plan);
    assert!(s.fetch(2, 1).is_err(), "silo 2 has not joined");
    s.register(2, 10).unwrap();
    assert_eq!(s.fetch(2, 0).unwrap(), plan, "the plan does not grow");
    assert_eq!(
        s.fetch(2, 1).unwrap(),
        FetchAnswer::Coalition {
            members: vec![2],
            sizes: vec![10]
        }
    );
    assert!(
        s.report(2, vec![pd(0, 0.0)]).is_err(),
        "silo 2 is in no pair"
    );
    assert!(
        s.report(0, vec![pd(1, 0.0), pd(2, 0.0), pd(3, 1.0)])
            .is_err(),
        "2 is not a partner"
    );
    assert!(s.report(0, vec![pd(1, 0.0)]).is_err(), "3 is missing");
    assert!(!s.report(0, vec![pd(1, 0.0), pd(3, 1.0)]).unwrap());
    assert!(!s.report(1, vec![pd(0, 0.0), pd(3, 1.0)]).unwrap());
    assert_eq!(s.fetch(0, 1).unwrap(), FetchAnswer::Hold);
    assert!(s.report(3, vec![pd(0, 1.0), pd(1, 1.0)]).unwrap());
    let solved = s.solved().unwrap().clone();
    assert_eq!(solved.participants, vec![0, 1, 3]);
    assert_eq!(solved.coalitions, vec![vec![0, 1], vec![3]]);
    assert_eq!(solved.distances.len(), 3);
    assert_eq!(solved.sizes, vec![100, 80, 10, 60]);
    assert_eq!(
        s.fetch(1, 1).unwrap(),
        FetchAnswer::Coalition {
            members: vec![0, 1],
            sizes: vec![100, 80]
        }
    );
    // The same as solving the three silos on their own.
    let mut alone = FedCollabServer::new(cfg(), 3, 7).unwrap();
    for (i, m) in [100, 80, 60].into_iter().enumerate() {
        alone.register(i, m).unwrap();
    }
    alone.report(0, vec![pd(1, 0.0), pd(2, 1.0)]).unwrap();
    alone.report(1, vec![pd(0, 0.0), pd(2, 1.0)]).unwrap();
    alone.report(2, vec![pd(0, 1.0), pd(1, 1.0)]).unwrap();
    assert_eq!(alone.solved().unwrap().objective, solved.objective);
    assert_eq!(alone.solved().unwrap().distances, solved.distances);

    let back = FedCollabServer::decode(cfg(), 7, &s.encode().unwrap()).unwrap();
    assert_eq!(back.solved(), Some(&solved));
    assert_eq!(back.participants(), Some(&[0, 1, 3][..]));
    assert_eq!(back.fetch(2, 1).unwrap(), s.fetch(2, 1).unwrap());
}

/// A version 1 checkpoint (every silo planned, no participant list) still resumes; a
/// checkpoint that is neither version is refused with the reason.
#[test]
fn a_version_1_checkpoint_resumes() {
    let v1 = SavedV1 {
        sizes: vec![Some(50), Some(40)],
        reports: vec![Some(vec![pd(1, 0.2)]), Some(vec![pd(0, 0.2)])],
        solved: Some(SolvedV1 {
            coalitions: vec![vec![0, 1]],
            objective: 0.5,
            sizes: vec![50, 40],
            distances: vec![vec![0.0, 0.2], vec![0.2, 0.0]],
            mismatched: vec![],
            failed: vec![],
            hits: 3,
        }),
    };
    let mut bytes = crate::store::header(MAGIC, 1);
    bincode::serde::encode_into_std_write(&v1, &mut bytes, bincode::config::standard()).unwrap();
    let s = FedCollabServer::decode(cfg(), 7, &bytes).unwrap();
    assert!(s.ready());
    assert_eq!(s.solved().unwrap().participants, vec![0, 1]);
    assert_eq!(
        s.fetch(1, 1).unwrap(),
        FetchAnswer::Coalition {
            members: vec![0, 1],
            sizes: vec![50, 40]
        }
    );
    let mut other = crate::store::header(MAGIC, 9);
    other.extend([0; 8]);
    let e = FedCollabServer::decode(cfg(), 7, &other).err().unwrap();
    assert!(e.contains("format version 9"), "{e}");
}
