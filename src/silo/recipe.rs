//! A coordinated silo's local training between two fetches, one recipe per algorithm, with the
//! simulator's batch streams: a swarm trains exactly as `federico simulate` does.
//! Owns: [`LocalRecipe`], the per-algorithm state a silo carries from round to round (its batch
//! order, its feature-sample stream) and which recipe of [`super::feddisco`], [`super::hcct`]
//! or [`super::fedsac`] a round runs; replaying the streams for a resumed silo.
//! Must not: fetch, send or schedule anything (the node's round loop does), or hold a model.

use super::{BatchCursor, feddisco, fedsac, hcct};
use crate::coord::hcct::HcctConfig;
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::{Dataset, Learner};
use crate::scenario::{FeddiscoConfig, FedsacConfig};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Silo `me`'s batch stream under `tagged` (the run seed mixed with the recipe's tag).
fn stream(tagged: u64, me: NodeId) -> StdRng {
    StdRng::seed_from_u64(stream_seed(tagged, me, Stream::Batches))
}

/// A silo's local training between two fetches, with the simulator's recipe and batch
/// stream for each algorithm, so a swarm trains exactly as `federico simulate` does.
// One per node, moved to the training thread and back each round: size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum LocalRecipe {
    /// FedDisco: `local_epochs` epochs' worth of SGD steps (momentum, weight decay), a fresh
    /// optimiser every round, batches from a recycled shuffled order.
    Feddisco {
        /// The recipe's hyperparameters.
        cfg: FeddiscoConfig,
        /// The batch order (stream [`feddisco::STREAM_TAG`]).
        cursor: BatchCursor,
    },
    /// HCCT: E epochs of plain mini-batch SGD at η_t, each epoch a fresh shuffle.
    Hcct {
        /// The recipe's hyperparameters (E, the η_t schedule).
        cfg: HcctConfig,
        /// The batch-order stream (stream [`hcct::BATCH_TAG`]).
        rng: StdRng,
    },
    /// FedSaC: `local_steps` SGD steps with the cosine regulariser, then the feature subspace.
    Fedsac {
        /// The recipe's hyperparameters.
        cfg: Box<FedsacConfig>,
        /// The batch order (stream [`fedsac::STREAM_TAG`]).
        cursor: BatchCursor,
        /// The feature-sample stream (stream [`fedsac::FEATURE_TAG`]).
        features: StdRng,
    },
}

impl LocalRecipe {
    /// FedDisco's recipe for silo `me` of `rows` training rows in a run of seed `seed`.
    pub(crate) fn feddisco(cfg: &FeddiscoConfig, seed: u64, me: NodeId, rows: usize) -> Self {
        LocalRecipe::Feddisco {
            cfg: cfg.clone(),
            cursor: BatchCursor::new(rows, stream(seed ^ feddisco::STREAM_TAG, me)),
        }
    }

    /// HCCT's recipe for silo `me` in a run of seed `seed`.
    pub(crate) fn hcct(cfg: &HcctConfig, seed: u64, me: NodeId) -> Self {
        LocalRecipe::Hcct {
            cfg: cfg.clone(),
            rng: stream(seed ^ hcct::BATCH_TAG, me),
        }
    }

    /// FedSaC's recipe for silo `me` of `rows` training rows in a run of seed `seed`.
    pub(crate) fn fedsac(cfg: &FedsacConfig, seed: u64, me: NodeId, rows: usize) -> Self {
        LocalRecipe::Fedsac {
            cfg: Box::new(cfg.clone()),
            cursor: BatchCursor::new(rows, stream(seed ^ fedsac::STREAM_TAG, me)),
            features: stream(seed ^ fedsac::FEATURE_TAG, me),
        }
    }

    /// Advances the random streams past `trainings` rounds of [`LocalRecipe::train`] on
    /// `rows` rows without training: the draws depend only on the row count, so a resumed
    /// node trains on the batches an uninterrupted run would.
    pub(crate) fn skip(&mut self, trainings: u64, rows: usize, batch: usize) {
        for _ in 0..trainings {
            match self {
                LocalRecipe::Feddisco { cfg, cursor } => {
                    feddisco::skip_silo(cursor, rows, batch, cfg)
                }
                LocalRecipe::Fedsac {
                    cfg,
                    cursor,
                    features,
                } => fedsac::skip_silo(cursor, features, rows, batch, cfg),
                LocalRecipe::Hcct { cfg, rng } => {
                    for _ in 0..cfg.epochs {
                        hcct::skip_epoch(rows, rng);
                    }
                }
            }
        }
    }

    /// Trains `p` on `data` for the round that started from the coordinator's round `round`
    /// (FedSaC: regularised towards `direction`); FedSaC's feature subspace rows, if any.
    pub(crate) fn train(
        &mut self,
        learner: &mut Learner,
        p: &mut [f32],
        data: &Dataset,
        batch: usize,
        round: u64,
        direction: Option<&[f32]>,
    ) -> Result<Option<Vec<Vec<f64>>>, String> {
        match self {
            LocalRecipe::Feddisco { cfg, cursor } => {
                feddisco::train_silo(learner, p, data, cursor, batch, cfg)
                    .map(|_| None)
                    .map_err(|e| e.to_string())
            }
            LocalRecipe::Fedsac {
                cfg,
                cursor,
                features,
            } => fedsac::train_silo(learner, p, data, cursor, features, batch, cfg, direction)
                .map(|q| q.map(|q| q.rows().to_vec()))
                .map_err(|e| e.to_string()),
            LocalRecipe::Hcct { cfg, rng } => {
                let lr = cfg.sgd_lr(round as usize) as f32;
                for _ in 0..cfg.epochs {
                    hcct::sgd_epoch(learner, p, data, lr, batch, rng).map_err(|e| e.to_string())?;
                }
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::{Labels, ModelSpec};
    use rand::RngExt;

    fn data(n: usize) -> Dataset {
        let mut rng = StdRng::seed_from_u64(5);
        let x: Vec<f32> = (0..n * 6).map(|_| rng.random::<f32>() - 0.5).collect();
        let ids = (0..n).map(|_| rng.random_range(0..3u32)).collect();
        Dataset::new(
            x,
            vec![6],
            Labels::Class {
                ids,
                num_classes: 3,
            },
        )
        .unwrap()
    }

    fn recipes() -> Vec<LocalRecipe> {
        let rng = |t: u64| StdRng::seed_from_u64(t);
        let fedsac = FedsacConfig {
            local_steps: 7,
            feature_samples: 20,
            ..FedsacConfig::default()
        };
        vec![
            LocalRecipe::Feddisco {
                cfg: FeddiscoConfig::default(),
                cursor: BatchCursor::new(50, rng(1)),
            },
            LocalRecipe::Hcct {
                cfg: HcctConfig {
                    epochs: 2,
                    ..HcctConfig::default()
                },
                rng: rng(2),
            },
            LocalRecipe::Fedsac {
                cfg: Box::new(fedsac),
                cursor: BatchCursor::new(50, rng(3)),
                features: rng(4),
            },
        ]
    }

    /// A resumed node's replay: `skip` makes exactly the draws of `train`, so after three
    /// trainings on one side and three skips on the other, the next round trains identically.
    #[test]
    fn skipping_trainings_leaves_the_streams_where_training_does() {
        let spec = ModelSpec::Mlp {
            inputs: 6,
            hidden: vec![5],
            classes: 3,
        };
        let d = data(50);
        let batch = 8;
        for (mut trained, mut skipped) in recipes().into_iter().zip(recipes()) {
            let mut learner = Learner::new(&spec, batch).unwrap();
            let start = learner.init_params(&mut StdRng::seed_from_u64(9));
            let mut p = start.clone();
            for r in 0..3 {
                trained
                    .train(&mut learner, &mut p, &d, batch, r, None)
                    .unwrap();
            }
            skipped.skip(3, d.len(), batch);
            let (mut a, mut b) = (start.clone(), start.clone());
            let qa = trained
                .train(&mut learner, &mut a, &d, batch, 3, None)
                .unwrap();
            let qb = skipped
                .train(&mut learner, &mut b, &d, batch, 3, None)
                .unwrap();
            assert_eq!(a, b);
            assert_eq!(qa, qb);
            // And differently from a stream that was not advanced (the check can fail).
            let mut fresh = recipes().remove(match trained {
                LocalRecipe::Feddisco { .. } => 0,
                LocalRecipe::Hcct { .. } => 1,
                LocalRecipe::Fedsac { .. } => 2,
            });
            let mut c = start.clone();
            fresh
                .train(&mut learner, &mut c, &d, batch, 3, None)
                .unwrap();
            assert_ne!(a, c);
        }
    }
}
