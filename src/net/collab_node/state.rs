//! What a FedCollab node keeps: its checkpoint (`<state_dir>/fedcollab.bin`: the distances,
//! the coalition, the FL round, the model and the optimiser) and its run log's lines.
//! Owns: those formats, and opening the checkpoint (or the fresh state) for a node.
//! Must not: talk to the network or train.

use crate::coord::PairDistance;
use crate::learn::{Adam, ModelSpec};
use crate::net::trainer::SaveHealth;
use serde::{Deserialize, Serialize};

/// The node's state on disk (`<state_dir>/fedcollab.bin`).
#[derive(Serialize, Deserialize)]
pub(super) struct Saved {
    pub(super) peer_id: String,
    /// The distances it reported (or has to report).
    pub(super) report: Option<Vec<PairDistance>>,
    /// Its coalition and the members' sizes.
    pub(super) coalition: Option<(Vec<u32>, Vec<u64>)>,
    /// FL rounds done.
    pub(super) round: u64,
    pub(super) params: Vec<f32>,
    pub(super) adam: Adam,
    /// This silo's own trained model of its last round, served to its coalition again after a
    /// restart (a partner may still be waiting for it).
    pub(super) last_local: Option<(u64, Vec<f32>)>,
}

pub(super) const MAGIC: &[u8; 8] = b"FEDCLND1";
pub(super) const VERSION: u32 = 1;

/// One line of `rounds.jsonl`.
#[derive(Serialize)]
pub(super) struct RoundLine {
    pub(super) node: u32,
    pub(super) round: u64,
    /// The FL round this line closes (the coalition's round), once the coalition is known.
    pub(super) global_round: Option<u64>,
    /// In a coalition (false: training alone while the structure is not known).
    pub(super) attached: bool,
    pub(super) trained: bool,
    /// Every other member's model arrived in time.
    pub(super) update_acked: bool,
    /// Members whose model went into the average, this silo included.
    pub(super) averaged: Vec<u32>,
    pub(super) seconds: f64,
    pub(super) at: f64,
    pub(super) eval: Option<crate::trace::EvalRecord>,
}

/// The final line.
#[derive(Serialize)]
pub(super) struct FinalLine {
    pub(super) node: u32,
    pub(super) final_global_round: Option<u64>,
    pub(super) model_hash: String,
    /// The coalition the model belongs to.
    pub(super) coalition: Option<Vec<u32>>,
    pub(super) eval: crate::trace::EvalRecord,
}

/// Writes the checkpoint. A write that fails is counted and logged by `saves`, never fatal:
/// the previous checkpoint stays, and the next save tries again.
pub(super) fn save(path: &std::path::Path, s: &Saved, saves: &mut SaveHealth) {
    match crate::store::write_versioned(path, MAGIC, VERSION, s) {
        Ok(()) => saves.saved(s.round),
        Err(e) => saves.failed(s.round, &e.to_string(), std::time::Instant::now()),
    }
}

/// The checkpoint at `path` if there is one (checked against the peer and the model), else a
/// fresh state from `init` with an Adam of learning rate `lr`.
pub(super) fn open(
    path: &std::path::Path,
    peer_id: &str,
    spec: &ModelSpec,
    lr: f32,
    init: impl FnOnce() -> Vec<f32>,
) -> anyhow::Result<Saved> {
    let saved: Option<Saved> = crate::store::read_versioned(path, MAGIC, VERSION)
        .map_err(|e| anyhow::anyhow!("checkpoint {e}"))?;
    if saved.as_ref().is_some_and(|s| s.peer_id != peer_id) {
        anyhow::bail!("checkpoint {} belongs to another peer", path.display());
    }
    Ok(match saved {
        Some(s) => {
            if s.params.len() != spec.num_params() || s.adam.num_params() != spec.num_params() {
                anyhow::bail!(
                    "checkpoint {}: a model of {} parameters, the config's has {}",
                    path.display(),
                    s.params.len(),
                    spec.num_params()
                );
            }
            s
        }
        None => {
            let params = init();
            Saved {
                peer_id: peer_id.to_string(),
                report: None,
                coalition: None,
                round: 0,
                adam: Adam::new(params.len(), lr),
                last_local: None,
                params,
            }
        }
    })
}
