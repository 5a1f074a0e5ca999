//! The simulator's parallel loops over silos, on the run's worker pool.
//! Owns: running one closure per silo (largest silos first, results in silo order, independent
//! of which worker ran what), and scoring every silo's mixture on its own test split.
//! Must not: decide what a silo computes (the algorithm drivers beside it pass that in) or
//! depend on the number of threads for any result.

use super::{ClientEval, Ctx, SimError};
use crate::learn::{Dataset, Learner};
use rayon::prelude::*;

/// Scores every silo on its own test split, in parallel: silo `i` predicts with the mixture
/// `model(i)` (one `(parameters, weight)` part per model; a single part is the model itself).
pub(crate) fn score_each<'p>(
    ctx: &mut Ctx<'_>,
    model: impl Fn(usize) -> Vec<(&'p [f32], f64)> + Sync,
) -> Result<Vec<ClientEval>, SimError> {
    let fed = ctx.fed;
    ctx.pool.install(|| {
        ctx.learners
            .par_iter_mut()
            .enumerate()
            .map(|(i, learner)| mix_eval(learner, &model(i), &fed.clients[i].test))
            .collect()
    })
}

/// Runs `f(i, learner_i)` for every silo on the worker pool, the largest silos first, each worker
/// taking the next silo when it is free (longest-processing-time order: two workers finish
/// within one small silo of each other, where a split by index can leave one with 60 % of the
/// work). Results come back in silo order and do not depend on which worker ran what.
pub(crate) fn par_silos<T: Send>(
    ctx: &mut Ctx<'_>,
    f: impl Fn(usize, &mut Learner) -> T + Sync,
) -> Vec<T> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let fed = ctx.fed;
    let mut order: Vec<(usize, &mut Learner)> = ctx.learners.iter_mut().enumerate().collect();
    order.sort_by_key(|(i, _)| (std::cmp::Reverse(fed.clients[*i].train.len()), *i));
    let n = order.len();
    let jobs: Vec<Mutex<Option<(usize, &mut Learner)>>> =
        order.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let results: Vec<Mutex<Option<T>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let workers = ctx.pool.current_num_threads().min(n).max(1);
    ctx.pool.scope(|s| {
        for _ in 0..workers {
            s.spawn(|_| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= n {
                        break;
                    }
                    let job = jobs[k].lock().expect("job lock").take();
                    if let Some((i, learner)) = job {
                        let out = f(i, learner);
                        *results[i].lock().expect("result lock") = Some(out);
                    }
                }
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .expect("result lock")
                .expect("every silo ran")
        })
        .collect()
}

/// Scores a mixture `Σ w_j · model_j` on `test`: mixed class probabilities (accuracy and the
/// mixture's cross-entropy) or mixed regression outputs (squared error).
pub(crate) fn mix_eval(
    learner: &mut Learner,
    parts: &[(&[f32], f64)],
    test: &Dataset,
) -> Result<ClientEval, SimError> {
    Ok(learner.evaluate_mixture(parts, test)?.into())
}
