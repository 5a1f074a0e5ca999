//! A FedCollab node (issue 5; spec §6): `[coordinated] mode = "fedcollab"`.
//! Owns: joining the coordinator with the sample count only; the pairwise discriminator protocol
//! with every other silo, peer to peer on `/federico/collab/2` (the higher index of a pair
//! drives it, the lower answers from its own thread; neither weights nor data reach the
//! coordinator); reporting the scalar distances; receiving its own coalition; FedAvg inside the
//! coalition peer to peer (all-to-all: every member pulls every other member's trained model of
//! the round and averages with weights m_j/M in ascending index order, so all members hold the
//! same model bit for bit; a member that does not answer within `fetch_s` is left out of that
//! round and the weights are renormalised); the run log and the checkpoint.
//! Must not: decide the structure (the coordinator solves it) or the distances' arithmetic
//! ([`crate::silo::fedcollab::PairHalf`] and [`crate::coord::fedcollab`] do), or train inside
//! the event loop: the swarm runs in its own task (`link.rs`), discriminator steps and training
//! on dedicated threads ([`super::trainer::Worker`], `answer.rs`).
//!
//! Files: this one opens the node and runs its phases in order; `link.rs` is the event loop,
//! `structure.rs` the exchanges with the coordinator, `pairs.rs` and `answer.rs` the two sides
//! of the distance phase, `coalition.rs` the FL rounds, `state.rs` the checkpoint and log
//! lines.
//!
//! A node whose coordinator is gone keeps what it has: pairs and FL run without it; with no
//! structure yet after `structure_s`, it trains alone (FedCollab's singleton) and asks again
//! every round, joining its coalition once the coordinator answers. A node that is not in the
//! plan (it joined after the coordinator's `join_s` closed joining) runs no pair and trains
//! alone for the whole run.

mod answer;
mod coalition;
mod link;
mod pairs;
mod state;
mod structure;

use super::client::or_stop;
use super::config::{Coordinated, NodeConfig};
use super::identity::Manifest;
use crate::coord::fedcollab::FedCollabConfig;
use crate::coord::fedcollab::member::{
    Action, Coalition, CollabMember, CollabMemberConfig, Event, Resume,
};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{ClientData, Learner, ModelSpec};
use crate::net::runlog::RunLog;
use crate::net::trainer::SaveHealth;
use crate::protocol::CoordRequest;
use libp2p::{Multiaddr, PeerId};
use link::Cmd;
use rand::SeedableRng;
use rand::rngs::StdRng;
use state::{Saved, save};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// A round that starts without a coalition asks for it this long before training alone.
const ATTACH_WAIT: Duration = Duration::from_millis(500);
/// The pause before asking the coordinator again after an answer that was none.
const RETRY: Duration = Duration::from_millis(200);
/// What an excused coalition member's model is given at least (two normal pulls otherwise).
const EXCUSED_GRACE: Duration = Duration::from_millis(100);

/// What [`super::coordinated::run`] hands over once it has checked the config, the key, the
/// manifest and loaded the data.
pub(super) struct Prelude {
    pub(super) cfg: NodeConfig,
    pub(super) cc: Coordinated,
    pub(super) key: libp2p::identity::Keypair,
    pub(super) manifest: Manifest,
    pub(super) me: NodeId,
    pub(super) coordinator: PeerId,
    pub(super) coord_addrs: Vec<Multiaddr>,
    pub(super) data: ClientData,
    pub(super) spec: ModelSpec,
}

/// The node once open: what its phases share.
struct Node {
    cfg: NodeConfig,
    fc: FedCollabConfig,
    me: NodeId,
    n_train: u64,
    fetch: Duration,
    structure_wait: Duration,
    excuse_rounds: u64,
    link: link::Link,
    data: Arc<ClientData>,
    ckpt: PathBuf,
    /// How the checkpoint writes are going (a failed one is logged and tried again).
    saves: SaveHealth,
    pairs_path: PathBuf,
    log: RunLog,
    join: CoordRequest,
}

/// Runs the FedCollab node until its rounds are done or `shutdown` resolves.
pub(super) async fn run(p: Prelude, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
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
    let n_train = data.train.len() as u64;
    let fetch = cc.fetch();
    let structure_wait = cc.structure_wait();
    let learner = Learner::new(&spec, cfg.train.batch_size).map_err(|e| anyhow::anyhow!("{e}"))?;

    std::fs::create_dir_all(&cfg.state_dir)?;
    let _lock = crate::store::lock_dir(&cfg.state_dir).map_err(|e| anyhow::anyhow!(e))?;
    let ckpt = cfg.state_dir.join("fedcollab.bin");
    // Every coalition starts from silo 0's seeded initialisation (spec §5), as in `simulate`.
    let init = || {
        learner.init_params(&mut StdRng::seed_from_u64(stream_seed(
            cfg.seed,
            NodeId(0),
            Stream::Init,
        )))
    };
    let mut state = state::open(
        &ckpt,
        &peer_id.to_string(),
        &spec,
        cfg.train.lr as f32,
        init,
    )?;

    // The swarm, in its own task. Silos are the manifest's members other than the
    // coordinator, by index.
    let peers: Vec<(PeerId, Vec<Multiaddr>)> = manifest
        .members
        .iter()
        .filter(|m| m.peer_id != coordinator)
        .map(|m| (m.peer_id, m.addrs.clone()))
        .collect();
    let (link, task) = link::start(
        key,
        link::SwarmConfig {
            listen: &cfg.listen,
            allowed: (!manifest.open).then(|| manifest.members.iter().map(|m| m.peer_id).collect()),
            max_message: cfg.max_message(),
            receive_budget: cfg.receive_budget_for(spec.num_params()),
            num_params: spec.num_params(),
            coord_timeout: fetch.max(structure_wait),
            peer_timeout: fetch,
            coordinator: (coordinator, coord_addrs),
            peers,
        },
    )?;

    let log = RunLog::open(&cfg.state_dir, state.round).map_err(|e| anyhow::anyhow!(e))?;
    info!(node = %me, peer = %peer_id, round = state.round, "fedcollab node started");
    tokio::pin!(shutdown);
    let mut node = Node {
        fc: cc.config().fedcollab.clone(),
        me,
        n_train,
        fetch,
        structure_wait,
        excuse_rounds: cc.excuse_rounds(),
        link,
        data: Arc::new(data),
        ckpt,
        saves: SaveHealth::new(Default::default()),
        pairs_path: cfg.state_dir.join("fedcollab.pairs"),
        log,
        join: CoordRequest::Join { n_train },
        cfg,
    };
    let result = node.drive(&mut state, learner, &mut shutdown).await;
    task.abort();
    result
}

impl Node {
    /// Carries out the member engine's actions until it is done or `shutdown` resolves.
    async fn drive<S: Future<Output = ()>>(
        &mut self,
        state: &mut Saved,
        learner: Learner,
        shutdown: &mut Pin<&mut S>,
    ) -> anyhow::Result<()> {
        let cfg = CollabMemberConfig {
            me: self.me.0,
            n_train: self.n_train,
            rounds: self.cfg.rounds,
            fetch: self.fetch,
            structure_wait: self.structure_wait,
            attach_wait: ATTACH_WAIT,
            retry: RETRY,
            eval_every: self.cfg.eval_every,
            excuse_rounds: self.excuse_rounds,
            excused_grace: EXCUSED_GRACE,
        };
        let resume = Resume {
            round: state.round,
            reported: state.report.is_some(),
            coalition: state
                .coalition
                .clone()
                .map(|(members, sizes)| Coalition { members, sizes }),
            last_local: state.last_local.is_some(),
        };
        let mut m = CollabMember::new(cfg, resume);
        let mut fl = coalition::Fl::start(&self.cfg, self.me, state, learner, self.data.clone())?;
        m.handle_start(now());
        loop {
            let waited = match m.poll_action() {
                None if m.is_over() => return Ok(()),
                None => match m.poll_timeout() {
                    Some(at) => {
                        let pause = tokio::time::sleep_until(at.into());
                        or_stop(shutdown, pause)
                            .await
                            .map(|()| m.handle_timeout(now()))
                    }
                    None => anyhow::bail!("the FedCollab member waits for nothing (a bug)"),
                },
                // The long ones: cut short by a signal.
                Some(a) if a.waits_on_the_network() => {
                    or_stop(shutdown, self.exchange(&mut m, &mut fl, state, a))
                        .await
                        .transpose()?
                }
                Some(a) => Some(self.act(&mut m, &fl, state, a).await?),
            };
            if waited.is_none() {
                info!("stopped by a signal");
                return Ok(());
            }
        }
    }

    /// Carries out a question, the distance phase, a training or a pull, and reports it to
    /// `m`.
    async fn exchange(
        &mut self,
        m: &mut CollabMember,
        fl: &mut coalition::Fl,
        state: &mut Saved,
        action: Action,
    ) -> anyhow::Result<()> {
        match action {
            Action::Ask { ask, within } => {
                let report = state.report.as_deref();
                let reply = structure::ask(&self.link, ask, within, &self.join, report).await;
                m.handle_reply(now(), reply);
            }
            Action::RunPairs { target, planned } => {
                state.report = Some(self.distances(target, &planned).await?);
                m.handle_pairs(now());
            }
            Action::Train { round } => {
                fl.train(&self.link, state, round).await?;
                m.handle_trained(now());
            }
            Action::Pull {
                round,
                coalition,
                within,
            } => {
                fl.pull(&self.link, m, state, round, &coalition, within)
                    .await?
            }
            other => anyhow::bail!("{other:?} is not an exchange (a bug)"),
        }
        Ok(())
    }

    /// Carries out any other action, and reports it to `m` where it waits for one.
    async fn act(
        &mut self,
        m: &mut CollabMember,
        fl: &coalition::Fl,
        state: &mut Saved,
        action: Action,
    ) -> anyhow::Result<()> {
        let link = &self.link;
        match action {
            Action::Adopt(c) => {
                state.coalition = Some((c.members, c.sizes));
                // The structure is solved: a pair run again would count no more.
                let _ = link.tell(Cmd::PairsOver).await;
            }
            Action::Save => save(&self.ckpt, state, &mut self.saves),
            Action::Republish => {
                if let Some((r, p)) = &state.last_local {
                    let _ = link.tell(Cmd::Publish(*r, Arc::new(p.clone()))).await;
                }
            }
            Action::EndRound(o) => {
                fl.end_round(state, o, &mut self.log, &self.ckpt, &mut self.saves)
                    .await?;
                m.handle_round_written(now());
            }
            Action::AwaitServed {
                round,
                others,
                within,
            } => {
                coalition::await_served(link, round, others, within).await;
                m.handle_served(now());
            }
            Action::Finish => fl.finish(&self.cfg, state, &mut self.log).await?,
            Action::Fail(why) => anyhow::bail!(why),
            Action::Event(e) => log_event(e),
            other => anyhow::bail!("{other:?} is an exchange (a bug)"),
        }
        Ok(())
    }

    /// Phase 2: the distances to the other planned silos.
    async fn distances(
        &mut self,
        target: f64,
        planned: &[usize],
    ) -> anyhow::Result<Vec<crate::coord::PairDistance>> {
        let started = std::time::Instant::now();
        let report = pairs::estimate(pairs::Phase {
            link: &self.link,
            fc: &self.fc,
            data: &self.data,
            seed: self.cfg.seed,
            me: self.me.0 as usize,
            planned,
            target,
            fetch: self.fetch,
            pairs_path: &self.pairs_path,
        })
        .await?;
        let failed = report.iter().filter(|p| p.distance.is_none()).count();
        info!(
            pairs = report.len(),
            failed,
            seconds = started.elapsed().as_secs_f64(),
            distances = ?report.iter().map(|p| p.distance).collect::<Vec<_>>(),
            "distances estimated"
        );
        Ok(report)
    }
}

/// The clock the engine is given.
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// The engine's events, as log lines.
fn log_event(e: Event) {
    match e {
        Event::NotJoined(why) => warn!(%why, "could not join the coordinator; trying again"),
        Event::NoPlan(why) => info!(%why, "no distance plan yet; asking again"),
        Event::PlanRefused(why) => warn!(%why, "plan refused; joining again"),
        Event::NotPlanned { planned } => warn!(
            ?planned,
            "this silo joined after the distance plan went out: it is in no pair and \
             trains alone (FedCollab's singleton)"
        ),
        Event::DistancesRefused(why) => warn!(%why, "distances refused; joining again"),
        Event::NotReported(why) => warn!(%why, "could not report the distances"),
        Event::CoalitionRefused(why) => warn!(%why, "coalition refused; reporting again"),
        Event::NoCoalition(why) => warn!(%why, "no coalition yet"),
        Event::CoalitionReceived(members) => info!(?members, "coalition received"),
        Event::MalformedCoalition { members, sizes } => {
            warn!(?members, ?sizes, "a malformed coalition; ignored")
        }
        Event::NoStructure => warn!("no collaboration structure yet: training alone this round"),
        Event::Excused {
            member,
            round,
            until,
            strikes,
        } => warn!(
            member,
            round,
            until,
            strikes,
            "a coalition member's model did not come: not waited for until round `until`"
        ),
    }
}
