//! A FedDisco silo's local training (FedDisco spec §5.1, A9): the official code's recipe, the
//! same in `simulate` and in a coordinated node.
//! Owns: the recipe (E epochs' worth of ⌊N_k/B⌋ mini-batch SGD steps with momentum and weight
//! decay, a fresh optimiser every round, batches from a recycled shuffled order), its stream
//! tag, and skipping its draws for a resumed silo.
//! Must not: compute the silo's report or weights (that is [`crate::coord::feddisco`]), or
//! choose who trains in a round.

use super::{BatchCursor, sgd_steps, skip_steps};
use crate::learn::{Dataset, LearnError, Learner, Sgd};
use crate::scenario::FeddiscoConfig;

/// Keeps FedDisco's streams apart from the other algorithms' (mixed into the run seed).
pub(crate) const STREAM_TAG: u64 = 0xD15C_0000;

/// Steps per round: `local_epochs` epochs' worth of batches of `batch` over `rows` rows (at
/// least one per epoch).
pub(crate) fn local_steps(cfg: &FeddiscoConfig, rows: usize, batch: usize) -> usize {
    cfg.local_epochs * (rows / batch).max(1)
}

/// One round of a FedDisco silo: [`local_steps`] steps of SGD from `p` on `data` with a fresh
/// optimiser, batches from `cursor`.
pub(crate) fn train_silo(
    learner: &mut Learner,
    p: &mut [f32],
    data: &Dataset,
    cursor: &mut BatchCursor,
    batch: usize,
    cfg: &FeddiscoConfig,
) -> Result<(), LearnError> {
    let mut opt = Sgd::new(
        p.len(),
        cfg.lr as f32,
        cfg.momentum as f32,
        cfg.weight_decay as f32,
    );
    let steps = local_steps(cfg, data.len(), batch);
    sgd_steps(learner, p, &mut opt, data, cursor, batch, steps, |_, _| {})
}

/// The draws of one [`train_silo`] on `rows` rows, without training (a resumed silo replays
/// its batch stream).
pub(crate) fn skip_silo(cursor: &mut BatchCursor, rows: usize, batch: usize, cfg: &FeddiscoConfig) {
    skip_steps(cursor, batch, local_steps(cfg, rows, batch));
}
