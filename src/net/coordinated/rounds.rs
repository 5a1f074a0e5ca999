//! The coordinated node's driver (FedDisco, HCCT, FedSaC): opening its state, then carrying
//! out what its round engine ([`crate::coord::member::Member`]) decides: asking the
//! coordinator, training on the node's training thread, writing the last-update marker, the
//! round's line and the checkpoint, and the final line.
//! Owns: the node's state besides the engine's (the model, what the coordinator last sent, the
//! trained subspace), translating the engine's questions to the wire and the answers back
//! (checking a model's length), the run log and the checkpoint's writing.
//! Must not: decide when to register, fetch, retry, detach, reattach, catch up or switch (the
//! engine does), compare a deadline with the clock (it passes `now` in), weigh, group or
//! aggregate (the coordinator does), touch the swarm (the event loop in `link.rs` does) or
//! train on the driver's task (the [`Worker`] does).

use super::federico::run_rest_as_federico;
use super::link::{self, Link, SwarmConfig};
use super::state::{FinalLine, MAGIC, RoundLine, SENT_MAGIC, Saved, Sent, VERSION, read_saved};
use crate::coord::feddisco;
use crate::coord::member::{self, Action, Ask, Member, MemberConfig, Reply, RoundOutcome};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{ClientData, Evaluation, Learner};
use crate::net::client::or_stop;
use crate::net::collab_node::Prelude;
use crate::net::config::{Coordinated, CoordinatedAlgorithm, NodeConfig};
use crate::net::runlog::RunLog;
use crate::net::trainer::SaveHealth;
use crate::net::trainer::{Worker, export_one};
use crate::protocol::{CoordRequest, CoordResponse};
use crate::silo::LocalRecipe;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How often an unreachable coordinator is asked again within a budget.
const RETRY: Duration = Duration::from_millis(500);

/// What the training thread owns: the learner, the recipe with its random streams, the data.
struct Local {
    learner: Learner,
    recipe: LocalRecipe,
    data: Arc<ClientData>,
}

/// The coordinated node: its engine and what the driver holds for it.
struct Node {
    cfg: NodeConfig,
    me: NodeId,
    peer_id: String,
    /// Training rows and batch size (the streams' replay needs both).
    rows: usize,
    batch: usize,
    n_train: u64,
    register: CoordRequest,
    /// FedSaC: updates are contributions with a subspace.
    contributes: bool,
    link: Link,
    local: Worker<Local>,
    engine: Member,
    model: Vec<f32>,
    /// The last model the coordinator sent and FedSaC's direction with it, until adopted.
    offered: Option<Arc<Vec<f32>>>,
    direction: Option<Arc<Vec<f32>>>,
    /// FedSaC: the subspace of the last training.
    subspace: Option<Vec<Vec<f64>>>,
    /// The model of the last-update marker read at start (the engine decides whether it
    /// counts).
    sent_model: Option<Vec<f32>>,
    sent_path: PathBuf,
    ckpt: PathBuf,
    /// How the checkpoint writes are going (a failed one is logged and tried again).
    saves: SaveHealth,
    log: RunLog,
    /// When the round under way started.
    started: Instant,
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
    let shared = cc.config();
    match cc.mode() {
        CoordinatedAlgorithm::Fedsac => LocalRecipe::fedsac(&shared.fedsac, cfg.seed, me, rows),
        CoordinatedAlgorithm::Hcct => LocalRecipe::hcct(&shared.hcct, cfg.seed, me),
        _ => LocalRecipe::feddisco(&shared.feddisco, cfg.seed, me, rows),
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
    let mut sent: Option<Sent> = crate::store::read_versioned(&sent_path, SENT_MAGIC, 1)
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
            num_params: model.len(),
            request_timeout: fetch,
            coordinator,
            coord_addrs,
        },
    )?;

    // Each round's line is written before its checkpoint: cut what the checkpoint lacks.
    let log = RunLog::open(&cfg.state_dir, round).map_err(|e| anyhow::anyhow!(e))?;
    info!(node = %me, peer = %peer_id, round, "coordinated node started");
    let resume = member::Resume {
        round,
        last_global,
        trained: replay,
        sent: sent.as_ref().map(|s| member::SentMark {
            round: s.round,
            trained: s.trained,
        }),
        switched: cc.federico_after().is_some()
            && cfg.state_dir.join("federico/checkpoint.bin").exists(),
    };
    let engine = engine(&cfg, &cc, fetch, resume);
    let node = Node {
        me,
        peer_id: peer_id.to_string(),
        rows,
        batch,
        n_train: rows as u64,
        register,
        contributes,
        link,
        local,
        engine,
        model,
        offered: None,
        direction: None,
        subspace: None,
        sent_model: sent.take().map(|s| s.params),
        sent_path,
        ckpt,
        saves: SaveHealth::new(Default::default()),
        log,
        started: Instant::now(),
        cfg,
    };
    Ok((node, task))
}

/// The node's round engine, resumed at `resume`; `fetch` is the per-round budget.
fn engine(cfg: &NodeConfig, cc: &Coordinated, fetch: Duration, resume: member::Resume) -> Member {
    Member::new(
        MemberConfig {
            rounds: cfg.rounds,
            budget: fetch,
            retry: RETRY,
            final_budget: fetch * 4,
            eval_every: cfg.eval_every,
            // `fallback = "federico"`: the rounds after the switch run as FedeRiCo
            // (`run_rest_as_federico`).
            fall_back_after: cc.federico_after(),
        },
        resume,
    )
}

/// Seconds since the epoch, for the log lines.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Node {
    /// Carries out the engine's actions until it finishes or switches. `Some(round)`: switch
    /// to FedeRiCo after `round`; `None`: done, or stopped by a signal.
    async fn drive<S: Future<Output = ()>>(
        &mut self,
        shutdown: &mut Pin<&mut S>,
    ) -> anyhow::Result<Option<u64>> {
        self.engine.handle_start(Instant::now());
        loop {
            let Some(action) = self.engine.poll_action() else {
                let Some(at) = self.engine.poll_timeout() else {
                    anyhow::bail!("the coordinated rounds wait for nothing (a bug)");
                };
                let pause = tokio::time::sleep_until(at.into());
                if or_stop(shutdown, pause).await.is_none() {
                    info!("stopped by a signal");
                    return Ok(None);
                }
                self.engine.handle_timeout(Instant::now());
                continue;
            };
            match action {
                Action::Ask { ask, within } => {
                    let Some(reply) = or_stop(shutdown, self.ask(ask, within)).await else {
                        info!("stopped by a signal");
                        return Ok(None);
                    };
                    self.engine.handle_reply(Instant::now(), reply);
                }
                Action::Adopt { .. } => {
                    if let Some(p) = self.offered.take() {
                        self.model = p.to_vec();
                    }
                }
                Action::Recover { skip, outcome } => self.recover(skip, outcome).await?,
                Action::Train { at } => {
                    self.train(at).await?;
                    self.engine.handle_trained(Instant::now());
                }
                Action::MarkSent(mark) => {
                    let mark = Sent {
                        round: mark.round,
                        trained: mark.trained,
                        params: self.model.clone(),
                    };
                    // Only a restart's shortcut: without it a node killed before its next
                    // checkpoint trains the round again. A full disk is a warning (insiders
                    // review S1), and no older mark is left to be misread.
                    if let Err(error) =
                        crate::store::write_versioned(&self.sent_path, SENT_MAGIC, 1, &mark)
                    {
                        warn!(
                            round = mark.round,
                            %error,
                            "send mark not written (the disk is full?); a restart before the \
                             next checkpoint trains this round again"
                        );
                        let _ = std::fs::remove_file(&self.sent_path);
                    }
                }
                Action::EndRound(outcome) => {
                    self.end_round(outcome).await?;
                    self.engine.handle_round_written(Instant::now());
                }
                Action::Event(e) => log_event(e),
                Action::FallBack { at } => return Ok(Some(at)),
                Action::Finish { final_round } => {
                    self.finish(final_round).await?;
                    return Ok(None);
                }
            }
        }
    }

    /// Asks the coordinator, and reads the answer for the engine (a model of the wrong length
    /// is unusable; the parameters of a usable one wait in `offered`).
    async fn ask(&mut self, ask: Ask, within: Duration) -> Reply {
        let req = match ask {
            Ask::Register => self.register.clone(),
            Ask::Fetch { round } => CoordRequest::Fetch { round },
            Ask::Update { round } => {
                let params = Arc::new(self.model.clone());
                if self.contributes {
                    CoordRequest::Contribute {
                        round,
                        params,
                        subspace: self.subspace.clone(),
                    }
                } else {
                    CoordRequest::Update {
                        round,
                        params,
                        n_train: self.n_train,
                    }
                }
            }
        };
        let len = self.model.len();
        let misfit = |p: &[f32]| {
            (p.len() != len)
                .then(|| Reply::Unusable(format!("a model of {} parameters, not {len}", p.len())))
        };
        match link::ask(&self.link, req, within).await {
            Ok(CoordResponse::Ack) => Reply::Ack,
            Ok(CoordResponse::Error { reason }) => Reply::Refused(reason),
            Ok(CoordResponse::Alone) => Reply::Alone,
            Ok(CoordResponse::Global { round, params }) => {
                if let Some(bad) = misfit(&params) {
                    return bad;
                }
                self.offered = Some(params);
                self.direction = None;
                Reply::Model { round, train: true }
            }
            Ok(CoordResponse::Assigned {
                round,
                params,
                direction,
                train,
            }) => {
                if let Some(bad) =
                    misfit(&params).or_else(|| direction.as_deref().and_then(|d| misfit(d)))
                {
                    return bad;
                }
                self.offered = Some(params);
                self.direction = direction;
                Reply::Model { round, train }
            }
            Ok(_) => Reply::Unusable("an answer to another question".into()),
            Err(e) if e.transient() => Reply::Failed(e.to_string()),
            Err(e) => Reply::Unusable(e.to_string()),
        }
    }

    /// The round a kill cut off after its update went out: the streams move past its
    /// trainings, and its line is written again (with the marker's model).
    async fn recover(&mut self, skip: u64, o: RoundOutcome) -> anyhow::Result<()> {
        info!(
            round = o.global_round,
            "the last update went out before the kill: not training it again"
        );
        let (rows, batch) = (self.rows, self.batch);
        self.local
            .run(move |l| l.recipe.skip(skip, rows, batch))
            .await?;
        let params = self.sent_model.take().unwrap_or_default();
        let eval = self.eval_at(params, o).await?;
        self.write_line(o, eval, 0.0);
        Ok(())
    }

    /// Local training on the training thread, with the simulator's recipe, on round `at`'s
    /// schedule (HCCT's η_t), with the direction the coordinator sent (FedSaC).
    async fn train(&mut self, at: u64) -> anyhow::Result<()> {
        let (batch, mut p, direction) = (self.batch, self.model.clone(), self.direction.take());
        let (p, q) = self
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
        self.model = p;
        self.subspace = q;
        Ok(())
    }

    /// The round's evaluation (when due), line and checkpoint.
    async fn end_round(&mut self, o: RoundOutcome) -> anyhow::Result<()> {
        let eval = self.eval_at(self.model.clone(), o).await?;
        self.write_line(o, eval, self.started.elapsed().as_secs_f64());
        self.save();
        self.offered = None;
        self.direction = None;
        self.subspace = None;
        self.started = Instant::now();
        Ok(())
    }

    /// The evaluation of a round's model when the engine asks for one, and its export.
    async fn eval_at(
        &self,
        params: Vec<f32>,
        o: RoundOutcome,
    ) -> anyhow::Result<Option<crate::trace::EvalRecord>> {
        if !o.evaluate {
            return Ok(None);
        }
        let ev = self.evaluate(params.clone()).await?;
        // The model just scored is the silo's model to take home until the next one.
        self.export(params, ev.accuracy()).await;
        Ok(Some(crate::trace::EvalRecord::from(ev)))
    }

    /// `params` on the test set, on the training thread.
    async fn evaluate(&self, params: Vec<f32>) -> anyhow::Result<Evaluation> {
        self.local
            .run(move |l| l.learner.evaluate(&params, &l.data.test))
            .await?
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// A full disk is a warning and a retry ([`RunLog`]).
    fn write_line(&mut self, o: RoundOutcome, eval: Option<crate::trace::EvalRecord>, s: f64) {
        let line = RoundLine {
            node: self.me.0,
            round: o.round,
            global_round: o.global_round,
            attached: o.global_round.is_some(),
            trained: o.trained,
            update_acked: o.acked,
            seconds: s,
            at: now(),
            eval,
            recovered: o.recovered,
            alone: o.alone,
        };
        self.log.write(line.round, &line);
    }

    /// The checkpoint after a round. A write that fails is counted and logged, never fatal:
    /// the previous checkpoint stays, and the next round writes again.
    fn save(&mut self) {
        let round = self.engine.round();
        let saved = Saved {
            peer_id: self.peer_id.clone(),
            round,
            last_global: self.engine.last_global(),
            params: self.model.clone(),
            trained: self.engine.trained(),
        };
        match crate::store::write_versioned(&self.ckpt, MAGIC, VERSION, &saved) {
            Ok(()) => self.saves.saved(round),
            Err(e) => self.saves.failed(round, &e.to_string(), Instant::now()),
        }
    }

    /// The final model (the coordinator's when `final_round` is set, else the own), its score,
    /// the final line and the export.
    async fn finish(&mut self, final_round: Option<u64>) -> anyhow::Result<()> {
        if final_round.is_some()
            && let Some(p) = self.offered.take()
        {
            self.model = p.to_vec();
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
        let round = self.engine.round();
        self.log.write(final_round.unwrap_or(round) + 1, &line);
        self.log.close();
        let written = self.export(self.model.clone(), accuracy).await;
        info!(accuracy, final_round, model = %written.display(), "coordinated run done");
        Ok(())
    }

    /// Writes `params` as the silo's model to take home, on the training thread.
    async fn export(&self, params: Vec<f32>, accuracy: f64) -> PathBuf {
        let c = &self.cfg;
        let round = self.engine.round();
        export_one(&self.local, |l| &l.learner, c, params, round, accuracy).await
    }
}

/// The engine's events, as log lines.
fn log_event(e: member::Event) {
    use member::Event;
    match e {
        Event::NotRegistered(reason) => warn!(%reason, "not registered this round"),
        Event::Detached { round, reason } => warn!(
            round,
            %reason,
            "no model from the coordinator: training from the last model (fallback)"
        ),
        Event::Alone { round } => warn!(
            round,
            "the coordinator's run started without this silo (it joined after the join \
             deadline): training alone for the remaining rounds"
        ),
        Event::UpdateRefused { round, reason } => {
            warn!(round, %reason, "update refused; registering again")
        }
        Event::FallingBack { round, without } => warn!(
            round,
            rounds_without = without,
            "the coordinator is gone: switching to FedeRiCo with the other silos"
        ),
    }
}
