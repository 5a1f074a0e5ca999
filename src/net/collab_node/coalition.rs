//! FedCollab's federated training inside a coalition (spec §6 phase 4): FedAvg peer to peer,
//! all-to-all (every member pulls every other member's trained model of the round and averages
//! with weights m_j/M in ascending index order, so all members hold the same model bit for
//! bit; a member that does not answer within `fetch_s` is left out of that round and the
//! weights are renormalised).
//! Owns: the FL rounds (training on the node's training thread, publishing the own model,
//! pulling the others', averaging, evaluating), their log lines and checkpoints, asking for the
//! structure again every round while it is unknown, and waiting for the coalition to fetch the
//! last model before leaving.
//! Must not: touch the swarm (the event loop does), or train on the round loop's task.

use super::link::{Cmd, Link, peer_within};
use super::state::{FinalLine, RoundLine, Saved, save};
use super::structure::attach;
use crate::coord::fedcollab::coalition_average;
use crate::core::is_evaluation_round;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{ClientData, Evaluation, Learner};
use crate::net::client::or_stop;
use crate::net::config::NodeConfig;
use crate::net::runlog::RunLog;
use crate::net::trainer::SaveHealth;
use crate::net::trainer::{Worker, export_one};
use crate::protocol::{CollabRequest, CollabResponse, CoordRequest};
use crate::silo::fedcollab::FL_BATCH_TAG;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// What the FL phase needs from the node.
pub(super) struct Fl<'a> {
    pub(super) cfg: &'a NodeConfig,
    pub(super) me: NodeId,
    pub(super) n_train: u64,
    pub(super) fetch: Duration,
    pub(super) link: &'a Link,
    pub(super) join: &'a CoordRequest,
    pub(super) ckpt: &'a Path,
    pub(super) saves: &'a mut SaveHealth,
    pub(super) log: &'a mut RunLog,
}

/// What the training thread owns: the learner, the batch stream, the data.
struct Local {
    learner: Learner,
    rng: StdRng,
    data: Arc<ClientData>,
}

/// Phase 4: the FL rounds from `state.round`, then the final line. Returns early (`Ok`) when
/// `shutdown` resolves.
pub(super) async fn rounds<S: Future<Output = ()>>(
    mut fl: Fl<'_>,
    state: &mut Saved,
    learner: Learner,
    data: Arc<ClientData>,
    mut reported: bool,
    shutdown: &mut Pin<&mut S>,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(stream_seed(
        fl.cfg.seed ^ FL_BATCH_TAG,
        fl.me,
        Stream::Batches,
    ));
    // A resumed silo replays its batch stream to its round: an epoch draws one shuffle of
    // the training rows (`Learner::train_epoch`), so the stream is where an uninterrupted
    // run's would be and the resumed rounds train exactly as they would have.
    for _ in 0..state.round {
        let mut order: Vec<usize> = (0..data.train.len()).collect();
        order.shuffle(&mut rng);
    }
    // Resumed: the last round's own model may not have reached every member yet.
    if let Some((r, p)) = &state.last_local {
        let _ = fl.link.tell(Cmd::Publish(*r, Arc::new(p.clone()))).await;
    }
    let local = Worker::spawn("trainer", Local { learner, rng, data })?;
    while state.round < fl.cfg.rounds {
        let Some(r) = or_stop(shutdown, one_round(&mut fl, state, &local, &mut reported)).await
        else {
            info!("stopped by a signal");
            return Ok(());
        };
        r?;
    }
    finish(&mut fl, state, &local).await
}

/// One FL round: train, publish, pull the coalition's models, average, log, checkpoint.
async fn one_round(
    fl: &mut Fl<'_>,
    state: &mut Saved,
    local: &Worker<Local>,
    reported: &mut bool,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let me = fl.me;
    if state.coalition.is_none() {
        let until = Instant::now() + Duration::from_millis(500);
        attach(fl.link, fl.join, state, reported, until, me.0 as usize).await;
    }
    let round = state.round;
    let (mut p, mut opt) = (state.params.clone(), state.adam.clone());
    let (p, opt) = local
        .run(move |l| {
            l.learner
                .train_epoch(&mut p, &mut opt, &l.data.train, &mut l.rng)
                .map(|_| (p, opt))
        })
        .await?
        .map_err(|e| anyhow::anyhow!("training: {e}"))?;
    state.adam = opt;
    let own = Arc::new(p);
    let _ = fl.link.tell(Cmd::Publish(round, own.clone())).await;
    state.last_local = Some((round, own.to_vec()));
    let (members, sizes) = state
        .coalition
        .clone()
        .unwrap_or_else(|| (vec![me.0], vec![fl.n_train]));
    let len = own.len();
    let got = pull_models(fl.link, &members, me.0, round, own, fl.fetch, len).await;
    let heard: Vec<u32> = members
        .iter()
        .zip(&got)
        .filter(|(_, g)| g.is_some())
        .map(|(&m, _)| m)
        .collect();
    let arrived: Vec<Option<&[f32]>> = got
        .iter()
        .map(|m| m.as_deref().map(|v| v.as_slice()))
        .collect();
    state.params = coalition_average(&arrived, &sizes);
    state.round += 1;
    let cfg = fl.cfg;
    let eval =
        // The last round is scored in the final line.
        if is_evaluation_round(state.round, cfg.eval_every, Some(cfg.rounds))
            && state.round < cfg.rounds
        {
            let ev = evaluate(local, state.params.clone()).await?;
            Some(crate::trace::EvalRecord::from(ev))
        } else {
            None
        };
    let line = RoundLine {
        node: me.0,
        round: state.round,
        global_round: state.coalition.as_ref().map(|_| round),
        attached: state.coalition.is_some(),
        trained: true,
        update_acked: heard.len() == members.len(),
        averaged: heard,
        seconds: started.elapsed().as_secs_f64(),
        at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        eval,
    };
    fl.log.write(round, &line);
    save(fl.ckpt, state, fl.saves);
    Ok(())
}

/// `params` on the test set, on the training thread.
async fn evaluate(local: &Worker<Local>, params: Vec<f32>) -> anyhow::Result<Evaluation> {
    local
        .run(move |l| l.learner.evaluate(&params, &l.data.test))
        .await?
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Lets every other member fetch the last round's model (at most `fetch`), then the final
/// line.
async fn finish(fl: &mut Fl<'_>, state: &Saved, local: &Worker<Local>) -> anyhow::Result<()> {
    if let Some((members, _)) = &state.coalition {
        let others = members.len().saturating_sub(1);
        let last = fl.cfg.rounds.saturating_sub(1);
        let link = fl.link;
        let all_served = async {
            while link.ask(|r| Cmd::Served(last, r)).await.unwrap_or(0) < others {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let _ = tokio::time::timeout(fl.fetch, all_served).await;
    }
    let ev = evaluate(local, state.params.clone()).await?;
    let accuracy = ev.accuracy();
    let line = FinalLine {
        node: fl.me.0,
        final_global_round: state.coalition.as_ref().map(|_| fl.cfg.rounds),
        model_hash: crate::ids::model_hash(&state.params),
        coalition: state.coalition.as_ref().map(|c| c.0.clone()),
        eval: crate::trace::EvalRecord::from(ev),
    };
    fl.log.write(fl.cfg.rounds, &line);
    fl.log.close();
    let model = export_one(
        local,
        |l| &l.learner,
        fl.cfg,
        state.params.clone(),
        fl.cfg.rounds,
        accuracy,
    )
    .await;
    info!(accuracy, coalition = ?state.coalition.as_ref().map(|c| &c.0), model = %model.display(), "fedcollab run done");
    Ok(())
}

/// Every coalition member's trained model of `round` (this silo's own included, at its
/// position), pulled concurrently; `None` for a member that did not answer within `fetch`.
async fn pull_models(
    link: &Link,
    members: &[u32],
    me: u32,
    round: u64,
    own: Arc<Vec<f32>>,
    fetch: Duration,
    len: usize,
) -> Vec<Option<Arc<Vec<f32>>>> {
    let pulls = members.iter().map(|&m| {
        let (link, own) = (link.clone(), own.clone());
        async move {
            if m == me {
                return Some(own);
            }
            match peer_within(&link, m as usize, CollabRequest::Model { round }, fetch).await {
                Ok(resp @ CollabResponse::Model { round: r, .. }) if r == round => {
                    match resp.check(len) {
                        Ok(()) => match resp {
                            CollabResponse::Model { params, .. } => Some(params),
                            _ => None,
                        },
                        Err(reason) => {
                            warn!(member = m, %reason, "refused a member's model");
                            None
                        }
                    }
                }
                other => {
                    warn!(
                        member = m,
                        round,
                        ?other,
                        "no model from a coalition member this round"
                    );
                    None
                }
            }
        }
    });
    libp2p::futures::future::join_all(pulls).await
}
