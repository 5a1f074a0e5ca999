//! `fallback = "federico"`: a coordinated node whose coordinator is gone runs its remaining
//! rounds as a FedeRiCo node with the other silos.
//! Owns: the FedeRiCo run's state directory and manifest (the federation minus its
//! coordinator), and the coordinated run's final line made from FedeRiCo's last round.
//! Must not: run rounds itself ([`crate::net::node`] does) or talk to the coordinator.

use super::state::FinalLine;
use crate::ids::NodeId;
use crate::net::config::NodeConfig;
use crate::net::identity::Manifest;
use libp2p::PeerId;
use tracing::info;

/// `fallback = "federico"`: the rounds after the first `at` as a FedeRiCo node in
/// `<state_dir>/federico/` (resumed from its checkpoint there, else started from `model`), with
/// the manifest minus the coordinator. Returns the final line (`None` when stopped by a signal).
pub(super) async fn run_rest_as_federico(
    cfg: &NodeConfig,
    manifest: &Manifest,
    me: NodeId,
    coordinator: PeerId,
    model: Vec<f32>,
    at: u64,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Option<FinalLine>> {
    let dir = cfg.state_dir.join("federico");
    std::fs::create_dir_all(&dir)?;
    // The federation without its coordinator: the silos' FedeRiCo.
    let mut silos = manifest.clone();
    silos.members.retain(|m| m.peer_id != coordinator);
    let manifest_path = dir.join("manifest.toml");
    std::fs::write(&manifest_path, silos.to_toml())?;
    let mut fed = cfg.clone();
    fed.coordinated = None;
    fed.rounds = cfg.rounds - at;
    fed.state_dir = dir.clone();
    fed.manifest = manifest_path;
    info!(
        after = at,
        rounds = fed.rounds,
        "running the remaining rounds as FedeRiCo"
    );
    let ending = crate::net::node::run_from(fed, Some(model), shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("FedeRiCo after the coordinator: {e}"))?;
    if ending == crate::net::node::Ending::Interrupted {
        return Ok(None);
    }
    // The final line: FedeRiCo's last round (always evaluated) and the model it ended with.
    let fed_log = std::fs::read_to_string(dir.join("rounds.jsonl"))?;
    let last: crate::trace::NodeRound = fed_log
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<crate::trace::NodeRound>(l).ok())
        .ok_or_else(|| anyhow::anyhow!("the FedeRiCo run logged no round"))?;
    let eval = last
        .eval
        .ok_or_else(|| anyhow::anyhow!("FedeRiCo's last round was not evaluated"))?;
    let ckpt = crate::silo::federico::Checkpoint::read(&dir.join("checkpoint.bin"))
        .map_err(|e| anyhow::anyhow!(e))?
        .ok_or_else(|| anyhow::anyhow!("the FedeRiCo run left no checkpoint"))?;
    Ok(Some(FinalLine {
        node: me.0,
        final_global_round: None,
        model_hash: crate::ids::model_hash(&ckpt.params),
        eval,
        fell_back_to_federico_at: Some(at),
    }))
}
