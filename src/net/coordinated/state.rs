//! What a coordinated node keeps: its run log's lines, its checkpoint
//! (`<state_dir>/coordinated.bin`, read back in both its versions) and the last-update marker
//! (`<state_dir>/coordinated.sent`).
//! Owns: those formats (which trainings a resumed node skips is the round engine's
//! [`crate::coord::member::catch_up`]).
//! Must not: do I/O beyond reading the checkpoint, talk to the network or train.

use serde::{Deserialize, Serialize};

/// One line of the coordinated node's `rounds.jsonl`.
#[derive(Serialize)]
pub(super) struct RoundLine {
    pub(super) node: u32,
    pub(super) round: u64,
    /// The coordinator's round of the global trained from (None when detached).
    pub(super) global_round: Option<u64>,
    pub(super) attached: bool,
    /// Trained this round (a FedSaC silo outside the cohort does not).
    pub(super) trained: bool,
    pub(super) update_acked: bool,
    pub(super) seconds: f64,
    pub(super) at: f64,
    pub(super) eval: Option<crate::trace::EvalRecord>,
    /// Rebuilt on restart from the last-update marker ([`Sent`]): the node was killed after
    /// making this round's update and before its checkpoint, and the coordinator closed the
    /// round meanwhile (whether with this update is not known here: `update_acked` is false).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) recovered: bool,
    /// The coordinator's run started without this silo (it joined after the join deadline):
    /// it trains alone and no longer asks.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) alone: bool,
}

/// The final line.
#[derive(Serialize)]
pub(super) struct FinalLine {
    pub(super) node: u32,
    pub(super) final_global_round: Option<u64>,
    /// FNV-1a of the final model's bytes: equal on every node that holds the same global.
    pub(super) model_hash: String,
    pub(super) eval: crate::trace::EvalRecord,
    /// `fallback = "federico"`: the coordinated rounds done before the switch (the rest ran as
    /// FedeRiCo, logged in `<state_dir>/federico/rounds.jsonl`; `eval` is then FedeRiCo's
    /// inference mixture on the last round).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) fell_back_to_federico_at: Option<u64>,
}

/// The node's state on disk (`<state_dir>/coordinated.bin`).
#[derive(Serialize, Deserialize)]
pub(super) struct Saved {
    pub(super) peer_id: String,
    pub(super) round: u64,
    pub(super) last_global: Option<u64>,
    pub(super) params: Vec<f32>,
    /// Local trainings done: a resumed node replays its random streams past them
    /// ([`crate::silo::LocalRecipe::skip`]), so it trains on the batches an uninterrupted run
    /// would.
    pub(super) trained: u64,
}

/// Version 1: [`Saved`] without `trained` (written before restarts replayed the batches).
#[derive(Deserialize)]
struct SavedV1 {
    peer_id: String,
    round: u64,
    last_global: Option<u64>,
    params: Vec<f32>,
}

pub(super) const MAGIC: &[u8; 8] = b"FEDCNOD1";
pub(super) const VERSION: u32 = 2;

/// Written after training, before the update goes (`<state_dir>/coordinated.sent`): the
/// coordinator round the update is for, the trainings done with it and the trained model. A
/// node killed after sending but before its checkpoint finds the coordinator past that round
/// on restart: it takes the round as done (this model, its log line rebuilt) and skips that
/// training's draws instead of training again (see [`crate::coord::member::catch_up`]).
#[derive(Serialize, Deserialize)]
pub(super) struct Sent {
    pub(super) round: u64,
    pub(super) trained: u64,
    pub(super) params: Vec<f32>,
}

pub(super) const SENT_MAGIC: &[u8; 8] = b"FEDCSNT1";

/// The node's checkpoint, if any, and whether it is of the current version (one of version 1
/// is read without its training count). A damaged latest falls back to the previous generation
/// ([`crate::store::load`]; `fell_back` then says why).
pub(super) fn read_saved(
    path: &std::path::Path,
) -> anyhow::Result<Option<crate::store::Loaded<(Saved, bool)>>> {
    let decode = |b: &[u8]| match crate::store::decode_versioned::<Saved>(b, MAGIC, VERSION) {
        Ok(s) => Ok((s, true)),
        Err(e) => match crate::store::decode_versioned::<SavedV1>(b, MAGIC, 1) {
            Ok(v1) => Ok((
                Saved {
                    peer_id: v1.peer_id,
                    round: v1.round,
                    last_global: v1.last_global,
                    params: v1.params,
                    trained: 0,
                },
                false,
            )),
            Err(_) => Err(e),
        },
    };
    crate::store::load(path, decode).map_err(|e| anyhow::anyhow!("checkpoint {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_1_checkpoint_resumes_without_its_training_count() {
        #[derive(Serialize)]
        struct V1 {
            peer_id: String,
            round: u64,
            last_global: Option<u64>,
            params: Vec<f32>,
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coordinated.bin");
        let v1 = V1 {
            peer_id: "p".into(),
            round: 4,
            last_global: Some(3),
            params: vec![1.0, 2.0],
        };
        crate::store::write_versioned(&path, MAGIC, 1, &v1).unwrap();
        let (s, current) = read_saved(&path).unwrap().unwrap().value;
        assert!(!current);
        assert_eq!(
            (s.round, s.last_global, s.params),
            (4, Some(3), vec![1.0, 2.0])
        );
        let now = Saved {
            peer_id: "p".into(),
            round: 5,
            last_global: Some(4),
            params: vec![3.0],
            trained: 5,
        };
        crate::store::write_versioned(&path, MAGIC, VERSION, &now).unwrap();
        let (s, current) = read_saved(&path).unwrap().unwrap().value;
        assert!(current);
        assert_eq!((s.round, s.trained), (5, 5));
        // A damaged latest: the previous generation (the version-1 file) is read instead.
        std::fs::write(&path, b"garbage").unwrap();
        let (s, current) = read_saved(&path).unwrap().unwrap().value;
        assert_eq!((s.round, current), (4, false));
        // Neither version and no previous generation: the error names the file.
        std::fs::remove_file(crate::store::prev_path(&path)).unwrap();
        let Err(e) = read_saved(&path) else {
            panic!("garbage read as a checkpoint")
        };
        let e = e.to_string();
        assert!(e.contains("coordinated.bin"), "{e}");
        assert!(read_saved(&dir.path().join("none.bin")).unwrap().is_none());
    }
}
