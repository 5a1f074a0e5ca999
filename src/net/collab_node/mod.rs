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
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{ClientData, Learner, ModelSpec};
use crate::net::runlog::RunLog;
use crate::net::trainer::SaveHealth;
use crate::protocol::CoordRequest;
use libp2p::{Multiaddr, PeerId};
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
    /// The phases in order, each skipped when the checkpoint already holds its outcome.
    async fn drive<S: Future<Output = ()>>(
        &mut self,
        state: &mut Saved,
        learner: Learner,
        shutdown: &mut Pin<&mut S>,
    ) -> anyhow::Result<()> {
        // Phases 0-2: join, the plan, the pairs (skipped once the distances are in hand).
        if state.report.is_none()
            && state.coalition.is_none()
            && or_stop(shutdown, self.distances(state))
                .await
                .transpose()?
                .is_none()
        {
            info!("stopped by a signal");
            return Ok(());
        }
        // Phase 3: report, then the coalition (retried every round while unknown).
        let until = Instant::now() + self.structure_wait;
        let mut reported = false;
        let me = self.me.0 as usize;
        if state.coalition.is_none() {
            let attach = structure::attach(&self.link, &self.join, state, &mut reported, until, me);
            if or_stop(shutdown, attach).await.is_none() {
                info!("stopped by a signal");
                return Ok(());
            }
            save(&self.ckpt, state, &mut self.saves);
        }
        // Phase 4: FedAvg inside the coalition.
        let fl = coalition::Fl {
            cfg: &self.cfg,
            me: self.me,
            n_train: self.n_train,
            fetch: self.fetch,
            link: &self.link,
            join: &self.join,
            ckpt: &self.ckpt,
            saves: &mut self.saves,
            log: &mut self.log,
        };
        coalition::rounds(fl, state, learner, self.data.clone(), reported, shutdown).await
    }

    /// Phases 0-2: joins, fetches the plan and estimates the distances to the other planned
    /// silos (none for a silo left out of the plan: it trains alone).
    async fn distances(&mut self, state: &mut Saved) -> anyhow::Result<()> {
        let me_i = self.me.0 as usize;
        let (target, nodes, planned) = structure::plan(&self.link, &self.join, self.fetch).await?;
        if me_i >= nodes {
            anyhow::bail!("this silo has index {me_i}; the coordinator runs {nodes} silos");
        }
        if !planned.contains(&me_i) {
            warn!(
                ?planned,
                "this silo joined after the distance plan went out: it is in no pair and \
                 trains alone (FedCollab's singleton)"
            );
            state.coalition = Some((vec![self.me.0], vec![self.n_train]));
            save(&self.ckpt, state, &mut self.saves);
            return Ok(());
        }
        let started = std::time::Instant::now();
        let report = pairs::estimate(pairs::Phase {
            link: &self.link,
            fc: &self.fc,
            data: &self.data,
            seed: self.cfg.seed,
            me: me_i,
            planned: &planned,
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
        state.report = Some(report);
        save(&self.ckpt, state, &mut self.saves);
        Ok(())
    }
}
