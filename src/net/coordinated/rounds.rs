//! The coordinated node's rounds (FedDisco, HCCT, FedSaC): opening its state, then per round
//! registering, fetching the model the round starts from, training on the node's training
//! thread, sending the update and logging; the fallback when the coordinator is unreachable.
//! Owns: the round loop and the node's state between rounds (round, last global, model,
//! trainings done), the run log and the checkpoint's writing.
//! Must not: weigh, group or aggregate (the coordinator does), touch the swarm (the event loop
//! in `link.rs` does) or train on the round loop's task (the [`Worker`] does).

use super::federico::run_rest_as_federico;
use super::link::{self, Link, SwarmConfig, ask, fetch_until, register_until};
use super::state::{FinalLine, MAGIC, RoundLine, SENT_MAGIC, Saved, Sent, VERSION};
use super::state::{catch_up, read_saved};
use crate::coord::feddisco;
use crate::core::is_evaluation_round;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{ClientData, Evaluation, Learner};
use crate::net::client::or_stop;
use crate::net::collab_node::Prelude;
use crate::net::config::{Coordinated, CoordinatedAlgorithm, NodeConfig};
use crate::net::runlog::RunLog;
use crate::net::trainer::SaveHealth;
use crate::net::trainer::{Worker, export_one};
use crate::protocol::{CoordRequest, CoordResponse};
use crate::silo::{BatchCursor, LocalRecipe};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// What the training thread owns: the learner, the recipe with its random streams, the data.
struct Local {
    learner: Learner,
    recipe: LocalRecipe,
    data: Arc<ClientData>,
}

/// How a round ended.
enum Next {
    /// On to the next round.
    Round,
    /// The coordinator is past its last round: nothing left to train.
    Done,
    /// `fallback = "federico"`: switch after this many rounds.
    FallBack(u64),
    /// Stopped by a signal.
    Stopped,
}

/// The coordinated node between rounds.
struct Node {
    cfg: NodeConfig,
    me: NodeId,
    peer_id: String,
    /// Training rows and batch size (the streams' replay needs both).
    rows: usize,
    batch: usize,
    n_train: u64,
    /// The per-round budget for registering and fetching, and for each exchange.
    fetch: Duration,
    register: CoordRequest,
    /// FedSaC: updates are contributions with a subspace.
    contributes: bool,
    link: Link,
    local: Worker<Local>,
    round: u64,
    last_global: Option<u64>,
    model: Vec<f32>,
    trained: u64,
    /// The last-update marker read at start, until the first global says what it means.
    sent: Option<Sent>,
    sent_path: PathBuf,
    ckpt: PathBuf,
    /// How the checkpoint writes are going (a failed one is logged and tried again).
    saves: SaveHealth,
    log: RunLog,
    registered: bool,
    /// The coordinator's run started without this silo: no more asking.
    alone: bool,
    /// Rounds in a row without a model from the coordinator.
    streak: u64,
    falls_back: Option<u64>,
}

/// Runs a FedDisco, HCCT or FedSaC node from its checked prelude until its rounds are done or
/// `shutdown` resolves.
pub(super) async fn run(p: Prelude, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let manifest = p.manifest.clone();
    let (me, coordinator) = (p.me, p.coordinator);
    let (mut node, task) = open(p)?;
    tokio::pin!(shutdown);
    let result = node.drive(&mut shutdown).await;
    task.abort();
    // The swarm must be gone (its listen addresses free) before FedeRiCo's starts.
    let _ = task.await;
    let Some(at) = result? else {
        return Ok(());
    };
    let model = std::mem::take(&mut node.model);
    let cfg = &node.cfg;
    let Some(line) =
        run_rest_as_federico(cfg, &manifest, me, coordinator, model, at, &mut shutdown).await?
    else {
        return Ok(());
    };
    node.log.write(at + 1, &line);
    node.log.close();
    info!(after = at, "coordinated run done (the rest as FedeRiCo)");
    Ok(())
}

/// The registration: FedDisco's `(N_k, δ_k)` from the node's own label counts (the histogram
/// never leaves it), HCCT's and FedSaC's sample count.
fn registration(cc: &Coordinated, data: &ClientData) -> anyhow::Result<CoordRequest> {
    let n_train = data.train.len() as u64;
    Ok(match cc.mode() {
        CoordinatedAlgorithm::Hcct | CoordinatedAlgorithm::Fedsac => CoordRequest::Join { n_train },
        // FedDisco (FedCollab's node runs in `collab_node`).
        _ => {
            let counts: Vec<u64> = data
                .train
                .class_counts()
                .iter()
                .map(|&n| n as u64)
                .collect();
            let report = feddisco::report(&counts, cc.config().feddisco.metric)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            CoordRequest::Register {
                n_train: report.num_samples,
                discrepancy: report.discrepancy,
            }
        }
    })
}

/// The simulator's local recipe of the node's algorithm, its streams seeded as there.
fn recipe(cc: &Coordinated, cfg: &NodeConfig, me: NodeId, rows: usize) -> LocalRecipe {
    match cc.mode() {
        CoordinatedAlgorithm::Fedsac => {
            let rng =
                |tag: u64| StdRng::seed_from_u64(stream_seed(cfg.seed ^ tag, me, Stream::Batches));
            LocalRecipe::Fedsac {
                cfg: Box::new(cc.config().fedsac.clone()),
                cursor: BatchCursor::new(rows, rng(crate::silo::fedsac::STREAM_TAG)),
                features: rng(crate::silo::fedsac::FEATURE_TAG),
            }
        }
        CoordinatedAlgorithm::Hcct => LocalRecipe::Hcct {
            cfg: cc.config().hcct.clone(),
            rng: StdRng::seed_from_u64(stream_seed(
                cfg.seed ^ crate::silo::hcct::BATCH_TAG,
                me,
                Stream::Batches,
            )),
        },
        _ => LocalRecipe::Feddisco {
            cfg: cc.config().feddisco.clone(),
            cursor: BatchCursor::new(
                rows,
                StdRng::seed_from_u64(stream_seed(
                    cfg.seed ^ crate::silo::feddisco::STREAM_TAG,
                    me,
                    Stream::Batches,
                )),
            ),
        },
    }
}

/// What a node resumes with: round, last global, model and trainings.
type Resumed = (u64, Option<u64>, Vec<f32>, u64);

/// The checkpoint's round, last global, model and trainings (`init`'s model at round 0 when
/// there is none), and whether it is the previous generation (the latest was damaged). One of
/// an older federico resumes without replaying the batch order.
fn resume(
    ckpt: &std::path::Path,
    peer_id: &str,
    init: impl FnOnce() -> Vec<f32>,
) -> anyhow::Result<(Resumed, bool)> {
    let loaded = read_saved(ckpt)?;
    let fell_back = loaded.as_ref().is_some_and(|l| l.fell_back.is_some());
    let saved = loaded.map(|l| l.value);
    if saved.as_ref().is_some_and(|(s, _)| s.peer_id != peer_id) {
        anyhow::bail!("checkpoint {} belongs to another peer", ckpt.display());
    }
    let state = match saved {
        Some((s, true)) => (s.round, s.last_global, s.params, s.trained),
        Some((s, false)) => {
            warn!(
                round = s.round,
                "checkpoint from an older federico: resuming without replaying the batch order"
            );
            (s.round, s.last_global, s.params, 0)
        }
        None => (0, None, init(), 0),
    };
    Ok((state, fell_back))
}

/// The node's state (resumed from its checkpoint, or fresh), its training thread, its swarm
/// and its run log (cut back to the checkpoint).
fn open(p: Prelude) -> anyhow::Result<(Node, tokio::task::JoinHandle<()>)> {
    let Prelude {
        cfg,
        cc,
        key,
        manifest,
        me,
        coordinator,
        coord_addrs,
        data,
        spec,
    } = p;
    let peer_id = key.public().to_peer_id();
    let batch = cfg.train.batch_size;
    let learner = Learner::new(&spec, batch).map_err(|e| anyhow::anyhow!("{e}"))?;
    let rows = data.train.len();
    let register = registration(&cc, &data)?;

    std::fs::create_dir_all(&cfg.state_dir)?;
    let _lock = crate::store::lock_dir(&cfg.state_dir).map_err(|e| anyhow::anyhow!(e))?;
    let ckpt = cfg.state_dir.join("coordinated.bin");
    let init = || {
        let seed = stream_seed(cfg.seed, me, Stream::Init);
        learner.init_params(&mut StdRng::seed_from_u64(seed))
    };
    let ((round, last_global, model, replay), fell_back) =
        resume(&ckpt, &peer_id.to_string(), init)?;
    let mut recipe = recipe(&cc, &cfg, me, rows);
    // Resumed: the streams go where an uninterrupted run's are after its trainings.
    recipe.skip(replay, rows, batch);
    let sent_path = cfg.state_dir.join("coordinated.sent");
    let sent: Option<Sent> = crate::store::read_versioned(&sent_path, SENT_MAGIC, 1)
        .unwrap_or_else(|e| {
            warn!(error = %e, "ignoring the last-update marker");
            None
        })
        .filter(|s: &Sent| {
            // Resumed one save earlier than the last: the marker may be more than one round
            // past the checkpoint, which catching up does not cover; train those rounds again
            // (the same batches, as after a kill before the marker was written).
            if fell_back {
                warn!(
                    sent_round = s.round,
                    "checkpoint from its previous generation: ignoring the last-update marker"
                );
            }
            !fell_back
        });
    let contributes = matches!(recipe, LocalRecipe::Fedsac { .. });
    let local = Worker::spawn(
        "trainer",
        Local {
            learner,
            recipe,
            data: Arc::new(data),
        },
    )?;

    // The swarm, in its own task.
    let fetch = cc.fetch();
    let (link, task) = link::start(
        key,
        SwarmConfig {
            listen: &cfg.listen,
            allowed: (!manifest.open).then(|| manifest.members.iter().map(|m| m.peer_id).collect()),
            max_message: cfg.max_message(),
            receive_budget: cfg.receive_budget_for(model.len()),
            request_timeout: fetch,
            coordinator,
            coord_addrs,
        },
    )?;

    // Each round's line is written before its checkpoint: cut what the checkpoint lacks.
    let log = RunLog::open(&cfg.state_dir, round).map_err(|e| anyhow::anyhow!(e))?;
    info!(node = %me, peer = %peer_id, round, "coordinated node started");
    let node = Node {
        me,
        peer_id: peer_id.to_string(),
        rows,
        batch,
        n_train: rows as u64,
        fetch,
        register,
        contributes,
        link,
        local,
        round,
        last_global,
        model,
        trained: replay,
        sent,
        sent_path,
        ckpt,
        saves: SaveHealth::new(Default::default()),
        log,
        registered: false,
        alone: false,
        streak: 0,
        // `fallback = "federico"`: the rounds after the switch run as FedeRiCo
        // (`run_rest_as_federico`).
        falls_back: cc.federico_after(),
        cfg,
    };
    Ok((node, task))
}

/// Seconds since the epoch, for the log lines.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Node {
    /// The rounds, then the final line. `Some(round)`: switch to FedeRiCo after `round`;
    /// `None`: done, or stopped by a signal.
    async fn drive<S: Future<Output = ()>>(
        &mut self,
        shutdown: &mut Pin<&mut S>,
    ) -> anyhow::Result<Option<u64>> {
        if self.falls_back.is_some() && self.cfg.state_dir.join("federico/checkpoint.bin").exists()
        {
            // Switched before a restart: go on as FedeRiCo.
            return Ok(Some(self.round));
        }
        while self.round < self.cfg.rounds {
            match self.one_round(shutdown).await? {
                Next::Round => {}
                Next::Done => break,
                Next::FallBack(at) => return Ok(Some(at)),
                Next::Stopped => {
                    info!("stopped by a signal");
                    return Ok(None);
                }
            }
        }
        self.finish().await?;
        Ok(None)
    }

    /// One round: register if needed, fetch the round's model (or train from the own one),
    /// train, send the update, log, checkpoint.
    async fn one_round<S: Future<Output = ()>>(
        &mut self,
        shutdown: &mut Pin<&mut S>,
    ) -> anyhow::Result<Next> {
        let started = std::time::Instant::now();
        // One budget per round for registering and fetching: a coordinator that is not
        // up yet (or restarting) is retried within it.
        let until = Instant::now() + self.fetch;
        if !self.registered && !self.alone {
            let register = register_until(&self.link, &self.register, until);
            let Some(r) = or_stop(shutdown, register).await else {
                return Ok(Next::Stopped);
            };
            self.registered = r;
        }
        let want = self.last_global.map_or(0, |g| g + 1);
        let got = if self.alone {
            Ok(CoordResponse::Alone)
        } else {
            match or_stop(shutdown, fetch_until(&self.link, want, until)).await {
                Some(r) => r,
                None => return Ok(Next::Stopped),
            }
        };
        let (global_round, direction, train) = self.take(got);
        // The coordinator is already past its last round (this node skipped rounds it
        // was not needed in, e.g. outside FedSaC's cohorts): nothing left to train.
        if global_round.is_some_and(|g| g >= self.cfg.rounds) {
            return Ok(Next::Done);
        }
        if let Some(g) = global_round {
            self.recover(want, g).await?;
        }
        let (local, subspace) = if train {
            self.train(global_round, direction).await?
        } else {
            (self.model.clone(), None)
        };
        let acked = match global_round.filter(|_| train) {
            Some(g) => self.send_update(g, &local, subspace).await?,
            None => false,
        };
        // Detached: the own model carries on; attached: the next global replaces it.
        self.model = local;
        self.round += 1;
        let eval = self.eval_at(self.model.clone(), self.round).await?;
        self.write_line(&RoundLine {
            node: self.me.0,
            round: self.round,
            global_round,
            attached: global_round.is_some(),
            trained: train,
            update_acked: acked,
            seconds: started.elapsed().as_secs_f64(),
            at: now(),
            eval,
            recovered: false,
            alone: self.alone,
        })?;
        self.save();
        self.streak = if global_round.is_some() || self.alone {
            0
        } else {
            self.streak + 1
        };
        if self.falls_back.is_some_and(|after| self.streak >= after) && self.round < self.cfg.rounds
        {
            warn!(
                round = self.round,
                rounds_without = self.streak,
                "the coordinator is gone: switching to FedeRiCo with the other silos"
            );
            return Ok(Next::FallBack(self.round));
        }
        Ok(Next::Round)
    }

    /// Takes the coordinator's answer: the global round trained from (`None`: detached), the
    /// regulariser direction, and whether to train.
    fn take(
        &mut self,
        got: Result<CoordResponse, crate::net::client::ExchangeError>,
    ) -> (Option<u64>, Option<Arc<Vec<f32>>>, bool) {
        let round = self.round;
        let len = self.model.len();
        let fits = |p: &[f32]| p.len() == len;
        match got {
            Ok(CoordResponse::Global { round: g, params }) if fits(&params) => {
                self.model = params.to_vec();
                self.last_global = Some(g);
                (Some(g), None, true)
            }
            Ok(CoordResponse::Assigned {
                round: g,
                params,
                direction,
                train,
            }) if fits(&params) && direction.as_deref().is_none_or(|d| fits(d)) => {
                self.model = params.to_vec();
                self.last_global = Some(g);
                (Some(g), direction, train)
            }
            Ok(CoordResponse::Alone) => {
                if !self.alone {
                    warn!(
                        round,
                        "the coordinator's run started without this silo (it joined after \
                         the join deadline): training alone for the remaining rounds"
                    );
                    self.alone = true;
                }
                (None, None, true)
            }
            other => {
                warn!(
                    round,
                    ?other,
                    "no model from the coordinator: training from the last model (fallback)"
                );
                self.registered = false;
                (None, None, true)
            }
        }
    }

    /// The first global after a restart: a training whose update went out before the kill
    /// and whose round the coordinator has closed counts (its line rebuilt, its draws skipped).
    async fn recover(&mut self, want: u64, got: u64) -> anyhow::Result<()> {
        let Some(s) = self.sent.take() else {
            return Ok(());
        };
        let skip = catch_up(Some(&s), want, got, self.trained);
        if skip == 0 {
            return Ok(());
        }
        info!(
            round = s.round,
            "the last update went out before the kill: not training it again"
        );
        let (rows, batch) = (self.rows, self.batch);
        self.local
            .run(move |l| l.recipe.skip(skip, rows, batch))
            .await?;
        self.trained += skip;
        // The round after the checkpoint, as it ended before the kill.
        self.round += 1;
        let eval = self.eval_at(s.params, self.round).await?;
        self.write_line(&RoundLine {
            node: self.me.0,
            round: self.round,
            global_round: Some(s.round),
            attached: true,
            trained: true,
            update_acked: false,
            seconds: 0.0,
            at: now(),
            eval,
            recovered: true,
            alone: false,
        })
    }

    /// Local training on the training thread, with the simulator's recipe. Detached, the
    /// round's schedule (HCCT's η_t) follows the node's own round. The trained model and
    /// FedSaC's subspace.
    async fn train(
        &mut self,
        global_round: Option<u64>,
        direction: Option<Arc<Vec<f32>>>,
    ) -> anyhow::Result<(Vec<f32>, Option<Vec<Vec<f64>>>)> {
        let (batch, at, mut p) = (
            self.batch,
            global_round.unwrap_or(self.round),
            self.model.clone(),
        );
        let trained = self
            .local
            .run(move |l| {
                let d = direction.as_ref().map(|d| d.as_slice());
                let q = l
                    .recipe
                    .train(&mut l.learner, &mut p, &l.data.train, batch, at, d)?;
                Ok::<_, String>((p, q))
            })
            .await?
            .map_err(|e| anyhow::anyhow!("training: {e}"))?;
        self.trained += 1;
        Ok(trained)
    }

    /// Marks the update as made, then sends it to the coordinator: acknowledged or not.
    async fn send_update(
        &mut self,
        g: u64,
        local: &[f32],
        subspace: Option<Vec<Vec<f64>>>,
    ) -> anyhow::Result<bool> {
        let mark = Sent {
            round: g,
            trained: self.trained,
            params: local.to_vec(),
        };
        crate::store::write_versioned(&self.sent_path, SENT_MAGIC, 1, &mark)
            .map_err(|e| anyhow::anyhow!(e))?;
        let params = Arc::new(local.to_vec());
        let up = if self.contributes {
            CoordRequest::Contribute {
                round: g,
                params,
                subspace,
            }
        } else {
            CoordRequest::Update {
                round: g,
                params,
                n_train: self.n_train,
            }
        };
        let (link, fetch) = (&self.link, self.fetch);
        Ok(match ask(link, up.clone(), fetch).await {
            Ok(CoordResponse::Ack) => true,
            // Refused, typically because the registration was lost (a node that
            // started before the coordinator listened, or a coordinator restarted
            // without it): register again and resend once.
            Ok(CoordResponse::Error { reason }) => {
                warn!(round = self.round, %reason, "update refused; registering again");
                self.registered = matches!(
                    ask(link, self.register.clone(), fetch).await,
                    Ok(CoordResponse::Ack)
                );
                self.registered && matches!(ask(link, up, fetch).await, Ok(CoordResponse::Ack))
            }
            _ => false,
        })
    }

    /// The evaluation of a round's model on the rounds evaluated on the way (the last is
    /// evaluated in the final line), and its export.
    async fn eval_at(
        &self,
        params: Vec<f32>,
        round: u64,
    ) -> anyhow::Result<Option<crate::trace::EvalRecord>> {
        let cfg = &self.cfg;
        // The last round is scored in the final line.
        if is_evaluation_round(round, cfg.eval_every, Some(cfg.rounds)) && round < cfg.rounds {
            let ev = self.evaluate(params.clone()).await?;
            // The model just scored is the silo's model to take home until the next one.
            self.export(params, ev.accuracy()).await;
            Ok(Some(crate::trace::EvalRecord::from(ev)))
        } else {
            Ok(None)
        }
    }

    /// `params` on the test set, on the training thread.
    async fn evaluate(&self, params: Vec<f32>) -> anyhow::Result<Evaluation> {
        self.local
            .run(move |l| l.learner.evaluate(&params, &l.data.test))
            .await?
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// A full disk is a warning and a retry ([`RunLog`]).
    fn write_line(&mut self, line: &RoundLine) -> anyhow::Result<()> {
        self.log.write(line.round, line);
        Ok(())
    }

    /// The checkpoint after a round. A write that fails is counted and logged, never fatal:
    /// the previous checkpoint stays, and the next round writes again.
    fn save(&mut self) {
        let saved = Saved {
            peer_id: self.peer_id.clone(),
            round: self.round,
            last_global: self.last_global,
            params: self.model.clone(),
            trained: self.trained,
        };
        match crate::store::write_versioned(&self.ckpt, MAGIC, VERSION, &saved) {
            Ok(()) => self.saves.saved(self.round),
            Err(e) => self
                .saves
                .failed(self.round, &e.to_string(), std::time::Instant::now()),
        }
    }

    /// The final model: the coordinator's after its last round (or the own model when it
    /// cannot be had). That round (`rounds`, shared with the coordinator's config) may lie
    /// ahead when rounds were spent detached: wait for it a little longer.
    async fn finish(&mut self) -> anyhow::Result<()> {
        let want = self.cfg.rounds;
        let until = Instant::now() + self.fetch * 4;
        let mut final_round = None;
        if !self.alone
            && let Ok(
                CoordResponse::Global { round: g, params }
                | CoordResponse::Assigned {
                    round: g, params, ..
                },
            ) = fetch_until(&self.link, want, until).await
            && params.len() == self.model.len()
        {
            self.model = params.to_vec();
            final_round = Some(g);
        }
        let ev = self.evaluate(self.model.clone()).await?;
        let accuracy = ev.accuracy();
        let line = FinalLine {
            node: self.me.0,
            final_global_round: final_round,
            model_hash: crate::ids::model_hash(&self.model),
            eval: crate::trace::EvalRecord::from(ev),
            fell_back_to_federico_at: None,
        };
        self.log.write(final_round.unwrap_or(self.round) + 1, &line);
        self.log.close();
        let written = self.export(self.model.clone(), accuracy).await;
        info!(accuracy, final_round, model = %written.display(), "coordinated run done");
        Ok(())
    }

    /// Writes `params` as the silo's model to take home, on the training thread.
    async fn export(&self, params: Vec<f32>, accuracy: f64) -> PathBuf {
        let c = &self.cfg;
        export_one(&self.local, |l| &l.learner, c, params, self.round, accuracy).await
    }
}
