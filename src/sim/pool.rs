//! The simulator's parallel loops over silos, on the run's worker pool.
//! Owns: running one closure per silo (largest silos first, results in silo order, independent
//! of which worker ran what), and scoring every silo's mixture on its own test split.
//! Must not: decide what a silo computes (the algorithm drivers beside it pass that in) or
//! depend on the number of threads for any result.

use super::{ClientEval, Ctx, SimError};
use crate::learn::{Dataset, Learner};
use rayon::prelude::*;

/// Whose model a part of a silo's predictor is: a silo's own (personal) model, or one shared by
/// several silos (a global, group or coalition model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Silo `i`'s model.
    Silo(usize),
    /// A model several silos share.
    Shared,
}

/// Scores every silo on its own test split, in parallel: silo `i` predicts with the mixture
/// `model(i)` (one `(owner, parameters, weight)` part per model; a single part is the model
/// itself). With `ctx.export` set, each silo's predictor is also written to take home.
pub(crate) fn score_each<'p>(
    ctx: &mut Ctx<'_>,
    model: impl Fn(usize) -> Vec<(Owner, &'p [f32], f64)> + Sync,
) -> Result<Vec<ClientEval>, SimError> {
    let fed = ctx.fed;
    let export = ctx.export.as_ref();
    ctx.pool.install(|| {
        ctx.learners
            .par_iter_mut()
            .enumerate()
            .map(|(i, learner)| {
                let parts = model(i);
                let mix: Vec<(&[f32], f64)> = parts.iter().map(|&(_, p, w)| (p, w)).collect();
                let eval = mix_eval(learner, &mix, &fed.clients[i].test)?;
                if let Some(to) = export {
                    to.write(learner, i, &parts, eval)?;
                }
                Ok(eval)
            })
            .collect()
    })
}

/// Where `simulate --export` writes an algorithm's final predictors:
/// `<dir>/silo-<i>/model.{safetensors,json}`.
#[derive(Clone, Debug)]
pub(crate) struct ExportTo {
    /// `<seed dir>/models/<algorithm>`.
    pub(crate) dir: std::path::PathBuf,
    /// The round the models are of.
    pub(crate) round: u64,
    /// What every card says about the run's rows: the constants its features were
    /// standardized with, the class names of its own data.
    pub(crate) data: crate::learn::export::CardData,
}

impl ExportTo {
    /// Writes silo `i`'s predictor (its parts named `silo-<j>` or `shared`).
    pub(crate) fn write(
        &self,
        learner: &Learner,
        i: usize,
        parts: &[(Owner, &[f32], f64)],
        eval: ClientEval,
    ) -> Result<(), SimError> {
        let name = |o: Owner| match o {
            Owner::Silo(j) => format!("silo-{j}"),
            Owner::Shared => "shared".to_string(),
        };
        let named: Vec<(String, &[f32], f64)> =
            parts.iter().map(|&(o, p, w)| (name(o), p, w)).collect();
        let accuracy = (eval.count > 0).then(|| eval.correct as f64 / eval.count as f64);
        let dir = self.dir.join(format!("silo-{i}"));
        crate::learn::export::write(
            &dir,
            learner,
            &name(Owner::Silo(i)),
            &named,
            self.round,
            accuracy,
            &self.data,
        )?;
        Ok(())
    }
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

/// [`par_silos`] with one item per silo moved into its call (a job and the silo's state, say).
pub(crate) fn par_silos_with<T: Send, R: Send>(
    ctx: &mut Ctx<'_>,
    items: Vec<T>,
    f: impl Fn(usize, &mut Learner, T) -> R + Sync,
) -> Vec<R> {
    use std::sync::Mutex;
    let cells: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    par_silos(ctx, |i, learner| {
        let item = cells[i]
            .lock()
            .expect("one worker per silo")
            .take()
            .expect("each silo runs once");
        f(i, learner, item)
    })
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
