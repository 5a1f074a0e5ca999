//! A node in coordinated mode (issue 5): `[coordinated] mode = "feddisco"`, `"hcct"` or
//! `"fedsac"` in its config runs that algorithm against the coordinator named there instead of
//! FedeRiCo; `"fedcollab"` is handed to [`super::collab_node`] once config, key, manifest and
//! data are checked.
//! Owns: checking a coordinated node's config, key and manifest and loading its data (here),
//! registering (FedDisco: `(N_k, δ_k)`, computed from the node's own label counts — the
//! histogram never leaves it; HCCT: the sample count only), and carrying out the rounds its
//! engine ([`crate::coord::member::Member`]: budgets, retries, detached rounds, reattaching,
//! training alone, the catch-up after a kill, the switch to FedeRiCo) decides (`rounds.rs`:
//! fetch the model the round starts from — FedDisco's global, HCCT's group model — train
//! locally with the simulator's recipe for the algorithm on the node's training thread, send
//! the trained model, evaluate), the run log and the checkpoint (`state.rs`), the switch to
//! FedeRiCo (`federico.rs`) and the node's swarm (`link.rs`).
//! Must not: weigh, group or aggregate (the coordinator does), or train inside the event loop: the
//! swarm runs in its own task and training on the node's training thread
//! ([`super::trainer::Worker`]).

mod federico;
mod link;
mod rounds;
mod state;

use super::collab_node::Prelude;
use super::config::{CoordinatedAlgorithm, NodeConfig};
use super::identity::{self, Manifest};
use crate::learn::Shard;

/// Runs a coordinated node until its rounds are done or `shutdown` resolves.
pub async fn run(
    cfg: NodeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let cc = cfg
        .coordinated
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("no [coordinated] section"))?
        .check()?;
    let coordinator = cc.coordinator();
    super::limits::raise_open_files();
    let key = identity::load_key(&cfg.key)?;
    let peer_id = key.public().to_peer_id();
    let manifest = Manifest::load(&cfg.manifest)?;
    let (me, member) = manifest
        .by_name(&cfg.name)
        .ok_or_else(|| anyhow::anyhow!("name {:?} is not in the manifest", cfg.name))?;
    if member.peer_id != peer_id {
        anyhow::bail!(
            "key has peer ID {peer_id}, the manifest lists {}",
            member.peer_id
        );
    }
    let coord_addrs = manifest
        .members
        .iter()
        .find(|m| m.peer_id == coordinator)
        .map(|m| m.addrs.clone())
        .ok_or_else(|| anyhow::anyhow!("the coordinator {coordinator} is not in the manifest"))?;
    let data = match &cfg.data.shard {
        Some(path) => Shard::read(path)?.data,
        None => cfg.data.load()?,
    };
    let spec = cfg
        .model
        .spec(&data.train.sample_shape, data.train.num_classes())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let prelude = Prelude {
        cfg,
        cc,
        key,
        manifest,
        me,
        coordinator,
        coord_addrs,
        data,
        spec,
    };
    if prelude.cc.mode() == CoordinatedAlgorithm::Fedcollab {
        return super::collab_node::run(prelude, shutdown).await;
    }
    rounds::run(prelude, shutdown).await
}
