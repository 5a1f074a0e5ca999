//! FedCollab's federated training inside a coalition (spec §6 phase 4), carried out: FedAvg
//! peer to peer, all-to-all (every member pulls every other member's trained model of the
//! round and averages with weights m_j/M in ascending index order, so all members hold the
//! same model bit for bit).
//! Owns: the training thread and its batch stream, training and publishing the own model,
//! pulling the others' and averaging, evaluating, the round's log line and checkpoint, waiting
//! for the coalition's last pulls, and the final line.
//! Must not: decide who is pulled, how long to wait, which rounds are scored or when the run
//! ends (the engine, [`crate::coord::fedcollab::member`], does); touch the swarm (the event
//! loop does), or train on the round loop's task.

use super::link::{Cmd, Link, peer_within};
use super::state::{FinalLine, RoundLine, Saved, save};
use crate::coord::fedcollab::coalition_average;
use crate::coord::fedcollab::member::{Action, Coalition, CollabMember, RoundOutcome};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{ClientData, Evaluation, Learner};
use crate::net::config::NodeConfig;
use crate::net::runlog::RunLog;
use crate::net::trainer::SaveHealth;
use crate::net::trainer::{Worker, export_one};
use crate::protocol::{CollabRequest, CollabResponse};
use crate::silo::fedcollab::FL_BATCH_TAG;
use libp2p::futures::StreamExt;
use libp2p::futures::stream::FuturesUnordered;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// What the training thread owns: the learner, the batch stream, the data.
struct Local {
    learner: Learner,
    rng: StdRng,
    data: Arc<ClientData>,
}

/// The FL phase's hands: the training thread and where the rounds are written.
pub(super) struct Fl {
    me: NodeId,
    local: Worker<Local>,
    /// When the round under way started training.
    started: std::time::Instant,
    /// The own model of the last round trained, as published.
    own: Option<(u64, Arc<Vec<f32>>)>,
}

impl Fl {
    /// Starts the training thread with its batch stream where round `state.round` needs it.
    pub(super) fn start(
        cfg: &NodeConfig,
        me: NodeId,
        state: &Saved,
        learner: Learner,
        data: Arc<ClientData>,
    ) -> anyhow::Result<Self> {
        let mut rng =
            StdRng::seed_from_u64(stream_seed(cfg.seed ^ FL_BATCH_TAG, me, Stream::Batches));
        // A resumed silo replays its batch stream to its round: an epoch draws one shuffle of
        // the training rows (`Learner::train_epoch`), so the stream is where an uninterrupted
        // run's would be and the resumed rounds train exactly as they would have.
        for _ in 0..state.round {
            let mut order: Vec<usize> = (0..data.train.len()).collect();
            order.shuffle(&mut rng);
        }
        let local = Worker::spawn("trainer", Local { learner, rng, data })?;
        Ok(Self {
            me,
            local,
            started: std::time::Instant::now(),
            own: None,
        })
    }

    /// Trains one local epoch from the silo's model and publishes the result as its model of
    /// `round`.
    pub(super) async fn train(
        &mut self,
        link: &Link,
        state: &mut Saved,
        round: u64,
    ) -> anyhow::Result<()> {
        self.started = std::time::Instant::now();
        let (mut p, mut opt) = (state.params.clone(), state.adam.clone());
        let (p, opt) = self
            .local
            .run(move |l| {
                l.learner
                    .train_epoch(&mut p, &mut opt, &l.data.train, &mut l.rng)
                    .map(|_| (p, opt))
            })
            .await?
            .map_err(|e| anyhow::anyhow!("training: {e}"))?;
        state.adam = opt;
        let own = Arc::new(p.clone());
        let _ = link.tell(Cmd::Publish(round, own.clone())).await;
        state.last_local = Some((round, p));
        self.own = Some((round, own));
        Ok(())
    }

    /// Carries out the engine's pull of `round`: every other member's model pulled at once,
    /// each within `within`; each that comes or fails is told to `m`, its timeouts served in
    /// between, until `m` ends the pull with [`Action::Average`]; then the silo's model is the
    /// average of the members it names (pulls still under way are dropped).
    pub(super) async fn pull(
        &self,
        link: &Link,
        m: &mut CollabMember,
        state: &mut Saved,
        round: u64,
        coalition: &Coalition,
        within: Duration,
    ) -> anyhow::Result<()> {
        let own = match &self.own {
            Some((r, p)) if *r == round => p.clone(),
            _ => Arc::new(state.params.clone()),
        };
        let len = own.len();
        let mut pulls: FuturesUnordered<_> = coalition
            .members
            .iter()
            .filter(|&&mate| mate != self.me.0)
            .map(|&mate| async move { (mate, pull_one(link, mate, round, within, len).await) })
            .collect();
        let mut got: BTreeMap<u32, Arc<Vec<f32>>> = BTreeMap::from([(self.me.0, own)]);
        loop {
            match m.poll_action() {
                Some(Action::Average {
                    coalition,
                    averaged,
                    ..
                }) => {
                    let models: Vec<Option<&[f32]>> = coalition
                        .members
                        .iter()
                        .map(|c| averaged.contains(c).then(|| got.get(c)).flatten())
                        .map(|p| p.map(|v| v.as_slice()))
                        .collect();
                    state.params = coalition_average(&models, &coalition.sizes);
                    return Ok(());
                }
                Some(other) => anyhow::bail!("{other:?} during a pull (a bug)"),
                None => {}
            }
            let grace = m.poll_timeout();
            let timer = async move {
                match grace {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some((mate, model)) = pulls.next() => {
                    let came = model.is_some();
                    if let Some(p) = model {
                        got.insert(mate, p);
                    }
                    m.handle_model(Instant::now(), mate, came);
                }
                () = timer, if grace.is_some() => m.handle_timeout(Instant::now()),
                else => anyhow::bail!("the pull of round {round} waits for nothing (a bug)"),
            }
        }
    }

    /// The round is over: scored when asked, its line written, the checkpoint saved.
    pub(super) async fn end_round(
        &self,
        state: &mut Saved,
        o: RoundOutcome,
        log: &mut RunLog,
        ckpt: &Path,
        saves: &mut SaveHealth,
    ) -> anyhow::Result<()> {
        state.round = o.round;
        let eval = if o.evaluate {
            let ev = self.evaluate(state.params.clone()).await?;
            Some(crate::trace::EvalRecord::from(ev))
        } else {
            None
        };
        let line = RoundLine {
            node: self.me.0,
            round: o.round,
            global_round: o.attached.then_some(o.round - 1),
            attached: o.attached,
            trained: true,
            update_acked: o.complete,
            averaged: o.averaged,
            seconds: self.started.elapsed().as_secs_f64(),
            at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            eval,
        };
        log.write(o.round - 1, &line);
        save(ckpt, state, saves);
        Ok(())
    }

    /// `params` on the test set, on the training thread.
    async fn evaluate(&self, params: Vec<f32>) -> anyhow::Result<Evaluation> {
        self.local
            .run(move |l| l.learner.evaluate(&params, &l.data.test))
            .await?
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Scores the model, writes the final line and exports the model.
    pub(super) async fn finish(
        &self,
        cfg: &NodeConfig,
        state: &Saved,
        log: &mut RunLog,
    ) -> anyhow::Result<()> {
        let ev = self.evaluate(state.params.clone()).await?;
        let accuracy = ev.accuracy();
        let line = FinalLine {
            node: self.me.0,
            final_global_round: state.coalition.as_ref().map(|_| cfg.rounds),
            model_hash: crate::ids::model_hash(&state.params),
            coalition: state.coalition.as_ref().map(|c| c.0.clone()),
            eval: crate::trace::EvalRecord::from(ev),
        };
        log.write(cfg.rounds, &line);
        log.close();
        let model = export_one(
            &self.local,
            |l| &l.learner,
            cfg,
            state.params.clone(),
            cfg.rounds,
            accuracy,
        )
        .await;
        info!(accuracy, coalition = ?state.coalition.as_ref().map(|c| &c.0), model = %model.display(), "fedcollab run done");
        Ok(())
    }
}

/// Waits until `others` peers fetched this silo's model of `round`, at most `within`.
pub(super) async fn await_served(link: &Link, round: u64, others: usize, within: Duration) {
    let all_served = async {
        while link.ask(|r| Cmd::Served(round, r)).await.unwrap_or(0) < others {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let _ = tokio::time::timeout(within, all_served).await;
}

/// Member `m`'s trained model of `round`, checked; `None` when it does not come within
/// `fetch` or is not a model of the round's shape.
async fn pull_one(
    link: &Link,
    m: u32,
    round: u64,
    fetch: Duration,
    len: usize,
) -> Option<Arc<Vec<f32>>> {
    match peer_within(link, m as usize, CollabRequest::Model { round }, fetch).await {
        Ok(resp @ CollabResponse::Model { round: r, .. }) if r == round => match resp.check(len) {
            Ok(()) => match resp {
                CollabResponse::Model { params, .. } => Some(params),
                _ => None,
            },
            Err(reason) => {
                warn!(member = m, %reason, "refused a member's model");
                None
            }
        },
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
