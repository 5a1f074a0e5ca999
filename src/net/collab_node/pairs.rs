//! FedCollab's distance phase (spec §6 phase 2, Algorithm 1) on a silo: every pair with
//! another planned silo, the higher index driving it peer to peer on `/federico/collab/2`.
//! Owns: driving this silo's pairs with lower-index partners ([`drive_pair`], each on its own
//! training thread), starting the answering side's thread, collecting one distance per
//! partner, and the record of finished pairs (`fedcollab.pairs`) a restarted silo resumes from.
//! Must not: do the distances' arithmetic ([`PairHalf`] does), or talk to the coordinator.

use super::answer::{Answering, answer_pairs};
use super::link::{Cmd, DISC_QUEUE, Link, peer_within};
use crate::coord::PairDistance;
use crate::coord::fedcollab::FedCollabConfig;
use crate::coord::fedcollab::pairs::{Drive, Driving, Heard};
use crate::learn::{ClientData, Learner};
use crate::net::trainer::Worker;
use crate::protocol::{CollabRequest, CollabResponse};
use crate::silo::fedcollab::{DiscModel, PairHalf};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// Pairs this silo finished in the distance phase (`fedcollab.pairs`, rewritten after each),
/// for the plan they belong to: a silo restarted before its report runs only the others.
#[derive(Serialize, Deserialize)]
struct PairsDone {
    target: f64,
    planned: Vec<usize>,
    pairs: Vec<PairDistance>,
}

const PAIRS_MAGIC: &[u8; 8] = b"FEDCPRS1";

/// The pairs of `path` that belong to this plan (none when it is absent or was written for
/// another plan); an unreadable file is an error naming it.
pub(super) fn pairs_done(
    path: &std::path::Path,
    target: f64,
    planned: &[usize],
) -> anyhow::Result<Vec<PairDistance>> {
    let saved: Option<PairsDone> = crate::store::read_versioned(path, PAIRS_MAGIC, 1)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(match saved {
        Some(p) if p.target == target && p.planned == planned => p.pairs,
        Some(_) => {
            warn!(file = %path.display(), "finished pairs of another plan: ignored");
            Vec::new()
        }
        None => Vec::new(),
    })
}

/// What the distance phase needs: the silo, the plan and where finished pairs are kept.
pub(super) struct Phase<'a> {
    pub(super) link: &'a Link,
    pub(super) fc: &'a FedCollabConfig,
    pub(super) data: &'a ClientData,
    pub(super) seed: u64,
    pub(super) me: usize,
    pub(super) planned: &'a [usize],
    /// The plan's m_train target.
    pub(super) target: f64,
    pub(super) fetch: Duration,
    pub(super) pairs_path: &'a std::path::Path,
}

/// Phase 2: Algorithm 1 with every other planned silo. This silo drives the pairs with
/// lower-index partners (its requests) and answers those with higher-index partners (its
/// discriminator thread); returns one distance per partner, ascending. Each pair that ends
/// with a distance is kept in `pairs_path` at once; restarted, the silo runs only the pairs
/// not kept there, and a pair it restarts or that its partner restarted is run again from
/// round 0 on both sides ([`CollabResponse::Restart`]), which ends as the first run would.
pub(super) async fn estimate(ph: Phase<'_>) -> anyhow::Result<Vec<PairDistance>> {
    let (me, planned, seed, fc) = (ph.me, ph.planned, ph.seed, ph.fc);
    let mut kept: Vec<PairDistance> = pairs_done(ph.pairs_path, ph.target, planned)?
        .into_iter()
        .filter(|p| {
            let j = p.partner as usize;
            j != me && planned.contains(&j) && p.distance.is_some()
        })
        .collect();
    if !kept.is_empty() {
        info!(
            pairs = kept.len(),
            "resuming the distance phase: these pairs finished before the restart"
        );
    }
    let is_kept = |j: usize| kept.iter().any(|p| p.partner as usize == j);
    let model = Arc::new(
        DiscModel::new(&ph.data.train, fc, seed)
            .map_err(|e| anyhow::anyhow!("discriminator: {e}"))?,
    );
    let disc = Arc::new(
        model
            .silo_data(&ph.data.train, me, seed, ph.target)
            .map_err(|e| anyhow::anyhow!("discriminator data: {e}"))?,
    );
    let lower: Vec<usize> = planned
        .iter()
        .copied()
        .filter(|&p| p < me && !is_kept(p))
        .collect();
    let higher: Vec<usize> = planned.iter().copied().filter(|&p| p > me).collect();
    let higher_kept: HashMap<usize, u32> = kept
        .iter()
        .filter(|p| p.partner as usize > me)
        .map(|p| (p.partner as usize, p.rounds))
        .collect();
    let expected = lower.len() + higher.len() - higher_kept.len();
    // Room for every result: neither side ever waits to hand one over.
    let (done_tx, mut done_rx) = mpsc::channel(expected.max(1));
    let learner = || {
        Learner::new(&model.spec, fc.disc_batch_size)
            .map_err(|e| anyhow::anyhow!("discriminator: {e}"))
    };
    // The answering side, on its own thread.
    let answering = Answering {
        me,
        higher,
        kept: higher_kept,
        model: model.clone(),
        disc: disc.clone(),
        fc: fc.clone(),
        seed,
        learner: learner()?,
        done: done_tx.clone(),
        idle: ph.fetch * 3,
    };
    answer_on_thread(ph.link, answering).await?;
    // The driving side: one task per lower-index partner.
    for partner in lower {
        let (link, model, disc, fc, done) = (
            ph.link.clone(),
            model.clone(),
            disc.clone(),
            fc.clone(),
            done_tx.clone(),
        );
        let (learner, fetch) = (learner()?, ph.fetch);
        tokio::spawn(async move {
            let fresh = || PairHalf::new(&fc, &model, disc.clone(), me, partner, seed);
            let r = drive_pair(&link, fresh, learner, partner, fetch).await;
            let _ = done.send(pair_result(partner, r)).await;
        });
    }
    drop(done_tx);
    let mut out: Vec<PairDistance> = kept.clone();
    for _ in 0..expected {
        let Some(p) = done_rx.recv().await else {
            break;
        };
        if p.distance.is_some() {
            kept.push(p.clone());
            let record = PairsDone {
                target: ph.target,
                planned: planned.to_vec(),
                pairs: kept.clone(),
            };
            crate::store::write_versioned(ph.pairs_path, PAIRS_MAGIC, 1, &record)
                .map_err(|e| anyhow::anyhow!("{}: {e}", ph.pairs_path.display()))?;
        }
        out.push(p);
    }
    // The answering thread outlives the phase: a partner restarted before it kept a pair's
    // end runs the pair again (answer.rs). The event loop lets it go with the coalition.
    for &partner in planned.iter().filter(|&&p| p != me) {
        if !out.iter().any(|p| p.partner as usize == partner) {
            out.push(PairDistance {
                partner: partner as u32,
                distance: None,
                rounds: 0,
            });
        }
    }
    out.sort_by_key(|p| p.partner);
    Ok(out)
}

/// Starts the answering side's thread and points the event loop's pair requests at it. The
/// thread ends when the event loop lets go of its requests ([`Cmd::PairsOver`]).
async fn answer_on_thread(link: &Link, answering: Answering) -> anyhow::Result<()> {
    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel(DISC_QUEUE);
    std::thread::Builder::new()
        .name("pairs".into())
        .spawn(move || answer_pairs(answering, jobs_rx))?;
    link.tell(Cmd::DiscServer(jobs_tx))
        .await
        .map_err(|_| anyhow::anyhow!("swarm task ended"))
}

/// A driven pair's result: its distance, or none when it failed.
fn pair_result(partner: usize, r: Result<(Option<f64>, u32), String>) -> PairDistance {
    match r {
        Ok((d, rounds)) => PairDistance {
            partner: partner as u32,
            distance: d,
            rounds,
        },
        Err(e) => {
            warn!(partner, error = %e, "pair failed: its distance counts as 1");
            PairDistance {
                partner: partner as u32,
                distance: None,
                rounds: 0,
            }
        }
    }
}

/// Drives one pair as its higher-index silo: per round, the own step, the exchange, the
/// average, and every evaluation's accuracies, the steps on the pair's own training thread.
/// `(estimate, rounds)`. What each answer means, each exchange's budget and how often the pair
/// may start over are [`Driving`]'s rules; when the partner lost the pair (it was restarted),
/// both start it over from round 0 with fresh halves (`fresh`).
async fn drive_pair(
    link: &Link,
    fresh: impl Fn() -> Result<PairHalf, String>,
    learner: Learner,
    partner: usize,
    fetch: Duration,
) -> Result<(Option<f64>, u32), String> {
    let worker = Worker::spawn("pair", learner).map_err(|e| e.to_string())?;
    let mut half = fresh()?;
    let mut acc_prev: Option<f64> = None;
    let mut rules = Driving::new();
    let start_over = |half: &mut PairHalf, at: u32| -> Result<(), String> {
        info!(
            partner,
            at, "the partner lost the pair (restarted): starting it over"
        );
        *half = fresh()?;
        Ok(())
    };
    loop {
        let (h, own) = worker
            .run(move |l| {
                let own = half.step(l);
                (half, own)
            })
            .await
            .map_err(|e| e.to_string())?;
        half = h;
        let own = own.map_err(|e| e.to_string())?;
        let round = half.rounds() as u32;
        let req = CollabRequest::DiscStep {
            round,
            weights: Arc::new(own.clone()),
            acc: acc_prev.take(),
        };
        let budget = rules.budget(fetch);
        let resp = peer_within(link, partner, req, budget)
            .await
            .map_err(|e| e.to_string())?;
        let (theirs, acc_lo) = match resp {
            CollabResponse::DiscStep { weights, acc } => {
                let _ = rules.on_step(round, Heard::Answer);
                (weights, acc)
            }
            other => match rules.on_step(round, heard(other)) {
                Drive::StartOver => {
                    start_over(&mut half, round)?;
                    acc_prev = None;
                    continue;
                }
                Drive::Fail(why) => return Err(why),
                Drive::Go => unreachable!("only a step goes on"),
            },
        };
        let (h, r) = worker
            .run(move |l| {
                let r = combine(&mut half, l, &own, &theirs, acc_lo);
                (half, r)
            })
            .await
            .map_err(|e| e.to_string())?;
        half = h;
        acc_prev = r?;
        if half.done() {
            let rounds = half.rounds() as u32;
            let stop = CollabRequest::DiscDone {
                rounds,
                acc: acc_prev,
            };
            let resp = peer_within(link, partner, stop, fetch)
                .await
                .map_err(|e| e.to_string())?;
            let answer = match resp {
                CollabResponse::Ack => Heard::Answer,
                other => heard(other),
            };
            match rules.on_done(answer) {
                Drive::Go => return Ok((half.estimate(), rounds)),
                Drive::StartOver => {
                    start_over(&mut half, rounds)?;
                    acc_prev = None;
                }
                Drive::Fail(why) => return Err(why),
            }
        }
    }
}

/// What an answer that is not the one asked for says, for [`Driving`].
fn heard(resp: CollabResponse) -> Heard {
    match resp {
        CollabResponse::Restart => Heard::Restart,
        other => Heard::Other(format!("{other:?}")),
    }
}

/// The driver's half of a round after the exchange: the average of both steps and, when the
/// round is evaluated, both accuracies recorded. This side's accuracy when evaluated.
fn combine(
    half: &mut PairHalf,
    learner: &mut Learner,
    own: &[f32],
    theirs: &[f32],
    acc_lo: Option<f64>,
) -> Result<Option<f64>, String> {
    if !half.combine(own, theirs)? {
        return Ok(None);
    }
    let acc_hi = half.accuracy(learner).map_err(|e| e.to_string())?;
    let acc_lo = acc_lo.ok_or("the partner sent no accuracy for an evaluated round")?;
    if !(acc_lo.is_finite() && (0.0..=1.0).contains(&acc_lo)) {
        return Err(format!("the partner's accuracy {acc_lo} is not a fraction"));
    }
    half.record(acc_lo, acc_hi);
    Ok(Some(acc_hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pd(partner: u32, d: Option<f64>) -> PairDistance {
        PairDistance {
            partner,
            distance: d,
            rounds: 120,
        }
    }

    /// The finished pairs are read back for the plan they were written for; another plan's
    /// are ignored, a missing file is none, and a corrupt one is an error naming the file.
    #[test]
    fn finished_pairs_belong_to_their_plan() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fedcollab.pairs");
        assert!(pairs_done(&path, 20.0, &[0, 1, 2]).unwrap().is_empty());
        let record = PairsDone {
            target: 20.0,
            planned: vec![0, 1, 2],
            pairs: vec![pd(0, Some(0.25)), pd(2, Some(1.0))],
        };
        crate::store::write_versioned(&path, PAIRS_MAGIC, 1, &record).unwrap();
        assert_eq!(
            pairs_done(&path, 20.0, &[0, 1, 2]).unwrap(),
            record.pairs,
            "the same plan"
        );
        assert!(pairs_done(&path, 19.0, &[0, 1, 2]).unwrap().is_empty());
        assert!(pairs_done(&path, 20.0, &[0, 1, 3]).unwrap().is_empty());
        std::fs::write(&path, b"FEDCPRS1\x01\x00\x00\x00garbage").unwrap();
        let e = pairs_done(&path, 20.0, &[0, 1, 2]).unwrap_err().to_string();
        assert!(e.contains("fedcollab.pairs"), "{e}");
    }
}
