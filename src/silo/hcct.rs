//! An HCCT silo's local epoch (spec `docs/specs/hcct.md` §3 step 3), the same in
//! `simulate` and in a coordinated node.
//! Owns: one epoch of plain mini-batch SGD (momentum 0, no weight decay) over a fresh shuffle,
//! the batch-stream tag, and skipping an epoch's draws for a resumed silo.
//! Must not: choose the learning-rate schedule, the start model or the groups (that is
//! [`crate::coord::hcct`]), or run the Adam variant (the simulator's, on [`Learner`]).

use crate::learn::{Dataset, LearnError, Learner};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// The tag that keeps HCCT's batch streams apart from the other algorithms'.
pub(crate) const BATCH_TAG: u64 = 0x4CC7;

/// The draws of one [`sgd_epoch`] over `rows` rows, without training (a resumed silo replays
/// its batch stream).
pub(crate) fn skip_epoch(rows: usize, rng: &mut StdRng) {
    let mut order: Vec<usize> = (0..rows).collect();
    order.shuffle(rng);
}

/// One epoch of plain mini-batch SGD (§3 step 3: momentum 0, no weight decay): shuffle with
/// `rng`, then per batch `p −= lr · (mean gradient of the batch)`; the last batch may be short.
pub(crate) fn sgd_epoch(
    learner: &mut Learner,
    params: &mut [f32],
    data: &Dataset,
    lr: f32,
    batch: usize,
    rng: &mut StdRng,
) -> Result<(), LearnError> {
    let mut order: Vec<usize> = (0..data.len()).collect();
    order.shuffle(rng);
    for rows in order.chunks(batch.max(1)) {
        let (_, grad) = learner.loss_and_grad(params, data, Some(rows))?;
        let step = lr / rows.len() as f32;
        for (p, g) in params.iter_mut().zip(&grad) {
            *p -= step * g;
        }
    }
    Ok(())
}
