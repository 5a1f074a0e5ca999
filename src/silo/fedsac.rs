//! A FedSaC silo's round (FedSaC spec §4 step 1, §2.1), the same in `simulate` and in a
//! coordinated node.
//! Owns: local SGD with momentum from the silo's personalised model (a fresh optimiser every
//! round, plus the cosine regulariser towards last round's direction `c^i`), the feature
//! subspace of the freshly trained model on the silo's own samples, the stream tags, and
//! skipping a round's draws for a resumed silo.
//! Must not: draw the cohort or build the collaboration graph (that is [`crate::coord::fedsac`]).

use super::{BatchCursor, SiloError, sgd_steps, skip_steps};
use crate::coord::fedsac::{self, Subspace};
use crate::learn::{Dataset, Learner, Sgd};
use crate::scenario::FedsacConfig;
use rand::rngs::StdRng;

/// Keeps FedSaC's streams apart from the other algorithms' (mixed into the run seed).
pub(crate) const STREAM_TAG: u64 = 0x5AC0_0000;
/// Keeps each silo's feature-sample draws apart from its batch order.
pub(crate) const FEATURE_TAG: u64 = 0x5AC0_FEA7;

/// The seed of the coordinator's cohort stream in a run of seed `seed` (the same in
/// `simulate` and over the network).
pub(crate) fn cohort_seed(seed: u64) -> u64 {
    crate::ids::stream_seed(
        seed ^ STREAM_TAG,
        crate::ids::NodeId(u32::MAX),
        crate::ids::Stream::Sampling,
    )
}

/// The draws of one [`train_silo`] on `rows` rows, without training: its batches and its
/// feature sample (a resumed silo replays its streams).
pub(crate) fn skip_silo(
    cursor: &mut BatchCursor,
    frng: &mut StdRng,
    rows: usize,
    batch: usize,
    cfg: &FedsacConfig,
) {
    skip_steps(cursor, batch, cfg.local_steps);
    let m = cfg.feature_samples.min(rows);
    let _ = rand::seq::index::sample(frng, rows, m);
}

/// One FedSaC silo's round (spec §4 step 1, §2.1): local SGD with momentum from `p` (a fresh
/// optimiser, `local_steps` mini-batches from the recycled order `cursor`, plus the cosine
/// regulariser towards `dir` when the silo has one), then its feature subspace from the
/// trained model on `feature_samples` of its own samples drawn with `frng`. Shared by the
/// simulator and the coordinated node, so both train exactly alike.
#[allow(clippy::too_many_arguments)]
pub(crate) fn train_silo(
    learner: &mut Learner,
    p: &mut [f32],
    data: &Dataset,
    cursor: &mut BatchCursor,
    frng: &mut StdRng,
    batch: usize,
    cfg: &FedsacConfig,
    dir: Option<&[f32]>,
) -> Result<Option<Subspace>, SiloError> {
    let mut opt = Sgd::new(
        p.len(),
        cfg.lr as f32,
        cfg.momentum as f32,
        cfg.weight_decay as f32,
    );
    sgd_steps(
        learner,
        p,
        &mut opt,
        data,
        cursor,
        batch,
        cfg.local_steps,
        |theta, grad| {
            if let Some(c) = dir {
                fedsac::add_regulariser_grad(theta, c, cfg.lambda, cfg.reg_sign, grad);
            }
        },
    )?;
    let m = cfg.feature_samples.min(data.len());
    let mut rows = rand::seq::index::sample(frng, data.len(), m).into_vec();
    rows.sort_unstable();
    let feats = learner.features(p, data, &rows)?;
    Ok(fedsac::feature_subspace(
        &feats,
        learner.feature_width(),
        cfg.k,
    )?)
}
