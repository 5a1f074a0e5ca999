//! Mini-batch orders and the plain local SGD loop that FedDisco and FedSaC silos run.
//! Owns: [`BatchCursor`] (batches without replacement, reshuffled when exhausted), the
//! `steps`-step SGD loop over it, and skipping its draws for a resumed silo.
//! Must not: pick the recipe's hyperparameters or streams (that is each algorithm's file
//! beside this one), or know about rounds or peers.

use crate::learn::{Dataset, LearnError, Learner, Sgd};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// Mini-batches without replacement over one silo's rows, reshuffled when exhausted.
#[derive(Debug)]
pub(crate) struct BatchCursor {
    order: Vec<usize>,
    pos: usize,
    rng: StdRng,
}

impl BatchCursor {
    /// A cursor over `n` rows whose shuffles draw from `rng`; the first batch shuffles.
    pub(crate) fn new(n: usize, rng: StdRng) -> Self {
        Self {
            order: (0..n).collect(),
            pos: n,
            rng,
        }
    }

    /// The next `batch` rows (all rows when the silo has fewer).
    pub(crate) fn next(&mut self, batch: usize) -> Vec<usize> {
        let batch = batch.min(self.order.len());
        if self.pos + batch > self.order.len() {
            self.order.shuffle(&mut self.rng);
            self.pos = 0;
        }
        let rows = self.order[self.pos..self.pos + batch].to_vec();
        self.pos += batch;
        rows
    }
}

/// Advances `cursor` past the batches of `steps` steps of [`sgd_steps`] without training: a
/// resumed silo replays its batch stream (the draws depend only on the row count).
pub(crate) fn skip_steps(cursor: &mut BatchCursor, batch: usize, steps: usize) {
    for _ in 0..steps {
        cursor.next(batch);
    }
}

/// `steps` steps of mini-batch SGD on `data`, batches from `cursor`: each step on the
/// batch-mean gradient plus whatever `extra(params, grad)` adds to it in place (a
/// regulariser's gradient). The local recipe of FedDisco and FedSaC (their official code).
#[allow(clippy::too_many_arguments)] // the recipe's parts, each needed
pub(crate) fn sgd_steps(
    learner: &mut Learner,
    params: &mut [f32],
    opt: &mut Sgd,
    data: &Dataset,
    cursor: &mut BatchCursor,
    batch: usize,
    steps: usize,
    mut extra: impl FnMut(&[f32], &mut [f32]),
) -> Result<(), LearnError> {
    for _ in 0..steps {
        let rows = cursor.next(batch);
        let (_, mut grad) = learner.loss_and_grad(params, data, Some(&rows))?;
        let scale = 1.0 / rows.len().max(1) as f32;
        grad.iter_mut().for_each(|g| *g *= scale);
        extra(params, &mut grad);
        opt.step(params, &grad);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn batch_cursor_covers_every_row_once_per_epoch() {
        let mut c = BatchCursor::new(10, StdRng::seed_from_u64(1));
        let mut seen: Vec<usize> = (0..5).flat_map(|_| c.next(2)).collect();
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        assert_eq!(c.next(50).len(), 10);
    }
}
