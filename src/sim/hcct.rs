//! HCCT as a simulator run (spec `docs/specs/hcct.md` §3, Algorithm 1).
//!
//! Owns: the driver's side of a round — each group's start model (the size-weighted average of
//! its members' models), E local epochs per silo in parallel (plain SGD at η_t by default,
//! [`crate::silo::hcct::sgd_epoch`], or the baselines' Adam), the pseudo-gradients g_i = (ŵ_k − w_i^end) / η_t, handing them to the
//! coordinator core, and the group aggregation every member adopts; evaluation of each silo's
//! model on its own test split.
//! Must not: decide groups, utilities or merges: those are [`crate::coord::hcct`]'s.
//!
//! All silos start from one common model w⁰ (§3: silo 0's initial weights, which FedAvg starts
//! from too). Batch orders come from `stream_seed(seed ^ 0x4CC7, silo, Stream::Batches)`.
//! Setting `FEDERICO_HCCT_TRACE` prints each round's groups (and round 1's pairwise cosines,
//! for calibrating α, §6.4) to stderr.

use super::coordinated::CoordinatedRun;
use super::pool::{Owner, score_each};
use super::{ClientEval, Ctx, SimError};
use crate::coord::hcct::{
    Coordinator, HcctConfig, HcctError, Optimizer, group_average, pseudo_gradient, select_layer,
};
use crate::ids::{NodeId, Stream, stream_seed};
use crate::learn::Adam;
use crate::silo::hcct::{BATCH_TAG, sgd_epoch};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;

/// Mixed into [`BATCH_TAG`] for HCCT-E's discarded layer-selection pass.
const LAYER_TAG: u64 = 0xE000;

/// One seed's HCCT run.
pub(crate) struct HcctRun {
    cfg: HcctConfig,
    /// Whose groups train together this round; fed the pseudo-gradients after each round.
    coord: Coordinator,
    /// D_i: each silo's training-sample count.
    sizes: Vec<usize>,
    /// Each silo's current model: its group's model after the last aggregation.
    models: Vec<Vec<f32>>,
    /// One persistent Adam per silo ([`Optimizer::Adam`] only).
    opts: Vec<Adam>,
    /// Each silo's batch-order stream.
    rngs: Vec<StdRng>,
    /// t, the 0-based round about to run.
    round: usize,
    /// Print groups per round to stderr (`FEDERICO_HCCT_TRACE`).
    trace: bool,
    /// HCCT-E: the chosen layer's name and the flat ranges of its tensors, once chosen (before
    /// round 0).
    layer: Option<(String, Vec<std::ops::Range<usize>>)>,
}

fn core_err(e: HcctError) -> SimError {
    SimError::Invariant(format!("hcct: {e}"))
}

impl HcctRun {
    /// Every silo starts from `init[0]`, the common w⁰ (§3).
    pub(crate) fn new(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Self {
        let cfg = ctx.scenario.hcct.clone();
        let rows: Vec<usize> = ctx.fed.clients.iter().map(|c| c.train.len()).collect();
        let sizes = cfg.run_sizes(&rows);
        let coord = Coordinator::new(sizes.clone(), cfg.coordinator_config());
        let n = ctx.clients();
        let opts = match cfg.optimizer {
            Optimizer::Adam => (0..n).map(|_| Adam::new(init[0].len(), ctx.lr())).collect(),
            Optimizer::Sgd => Vec::new(),
        };
        Self {
            coord,
            sizes,
            models: vec![init[0].clone(); n],
            opts,
            rngs: (0..n)
                .map(|i| {
                    StdRng::seed_from_u64(stream_seed(
                        ctx.seed ^ BATCH_TAG,
                        NodeId(i as u32),
                        Stream::Batches,
                    ))
                })
                .collect(),
            round: 0,
            trace: std::env::var_os("FEDERICO_HCCT_TRACE").is_some(),
            layer: None,
            cfg,
        }
    }

    /// Each silo's current model.
    #[cfg(test)]
    fn models(&self) -> &[Vec<f32>] {
        &self.models
    }

    /// The learning rate of round t: η_t for SGD, `train.lr` for Adam.
    fn lr(&self, ctx: &Ctx<'_>) -> f64 {
        match self.cfg.optimizer {
            Optimizer::Sgd => self.cfg.sgd_lr(self.round),
            Optimizer::Adam => f64::from(ctx.lr()),
        }
    }

    /// HCCT-E's layer choice (spec §2.5), once before training as the code does it: every silo
    /// trains one local pass from the common w⁰ on a batch stream of its own (then discarded:
    /// the run's streams and models are untouched), and [`select_layer`] picks the layer from
    /// those pseudo-gradients.
    fn choose_layer(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let lr = self.lr(ctx);
        let (optimizer, batch) = (self.cfg.optimizer, ctx.batch_size());
        let (fed, seed, w0) = (ctx.fed, ctx.seed, self.models[0].clone());
        let w0_ref = &w0;
        let ends: Vec<Result<Vec<f32>, SimError>> = ctx.pool.install(|| {
            ctx.learners
                .par_iter_mut()
                .enumerate()
                .map(|(i, learner)| {
                    let mut rng = StdRng::seed_from_u64(stream_seed(
                        seed ^ BATCH_TAG ^ LAYER_TAG,
                        NodeId(i as u32),
                        Stream::Batches,
                    ));
                    let mut p = w0_ref.clone();
                    let data = &fed.clients[i].train;
                    match optimizer {
                        Optimizer::Adam => {
                            let mut opt = Adam::new(p.len(), lr as f32);
                            learner.train_epoch(&mut p, &mut opt, data, &mut rng)?;
                        }
                        Optimizer::Sgd => {
                            sgd_epoch(learner, &mut p, data, lr as f32, batch, &mut rng)?
                        }
                    }
                    Ok(p)
                })
                .collect()
        });
        let grads: Vec<Vec<f32>> = ends
            .into_iter()
            .map(|e| e.map(|e| pseudo_gradient(&w0, &e, lr)))
            .collect::<Result<_, _>>()?;
        let refs: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
        // Layers from the tensor names (`fc0.bias` and `fc0.weight` make layer `fc0`).
        let mut layers: Vec<(String, Vec<std::ops::Range<usize>>)> = Vec::new();
        for (tensor, range) in ctx.learners[0].tensors() {
            let name = tensor.rsplit_once('.').map_or(tensor.as_str(), |(l, _)| l);
            match layers.iter_mut().find(|l| l.0 == name) {
                Some(l) => l.1.push(range),
                None => layers.push((name.to_string(), vec![range])),
            }
        }
        let ranges: Vec<Vec<std::ops::Range<usize>>> = layers.iter().map(|l| l.1.clone()).collect();
        let best = select_layer(&refs, &ranges)
            .map_err(core_err)?
            .ok_or_else(|| SimError::Invariant("hcct-e: a model without layers".into()))?;
        let (name, blocks) = layers.swap_remove(best);
        if self.trace {
            let size: usize = blocks.iter().map(|r| r.len()).sum();
            eprintln!(
                "hcct-e seed {}: layer {name} ({size} of {} parameters)",
                ctx.seed,
                w0.len()
            );
        }
        self.layer = Some((name, blocks));
        Ok(())
    }

    /// HCCT-E's layer, once chosen.
    #[cfg(test)]
    fn layer(&self) -> Option<&(String, Vec<std::ops::Range<usize>>)> {
        self.layer.as_ref()
    }

    /// The size-weighted average of `members`' models (member order: canonical).
    fn average(&self, members: &[usize], models: &[Vec<f32>]) -> Result<Vec<f32>, SimError> {
        let ms: Vec<&[f32]> = members.iter().map(|&i| models[i].as_slice()).collect();
        let ds: Vec<usize> = members.iter().map(|&i| self.sizes[i]).collect();
        group_average(&ms, &ds).map_err(core_err)
    }
}

impl CoordinatedRun for HcctRun {
    /// Algorithm 1, round t: start models ŵ_k (§3 step 2), E local epochs per silo (step 3),
    /// pseudo-gradients to the coordinator, which partitions round t+1 (A2), then each group's
    /// aggregate Σ a_i w_i^end, adopted by every member (step 4; under HCCT-P each member
    /// starts from the group body with its own head and keeps its own trained head).
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        if self.cfg.efficient && self.layer.is_none() {
            self.choose_layer(ctx)?;
        }
        let groups = self.coord.groups().to_vec();
        let n = ctx.clients();
        let mut group_of = vec![0; n];
        let mut starts = Vec::with_capacity(groups.len());
        for (k, g) in groups.iter().enumerate() {
            for &i in g {
                group_of[i] = k;
            }
            starts.push(self.average(g, &self.models)?);
        }
        // HCCT-P: each member's start is its group's body with its own head.
        let head = if self.cfg.personal {
            ctx.learners[0].head()
        } else {
            Vec::new()
        };
        let with_head = |mut p: Vec<f32>, own: &[f32]| {
            for r in &head {
                p[r.clone()].copy_from_slice(&own[r.clone()]);
            }
            p
        };
        let starts: Vec<Vec<f32>> = (0..n)
            .map(|i| with_head(starts[group_of[i]].clone(), &self.models[i]))
            .collect();
        let lr = self.lr(ctx);
        let (epochs, optimizer, batch) = (self.cfg.epochs, self.cfg.optimizer, ctx.batch_size());
        let fed = ctx.fed;
        let mut opts: Vec<Option<&mut Adam>> = self.opts.iter_mut().map(Some).collect();
        opts.resize_with(n, || None);
        let jobs: Vec<_> = ctx
            .learners
            .iter_mut()
            .zip(self.rngs.iter_mut().zip(opts))
            .collect();
        let starts_ref = &starts;
        let ends: Vec<Result<Vec<f32>, SimError>> = ctx.pool.install(|| {
            jobs.into_par_iter()
                .enumerate()
                .map(|(i, (learner, (rng, mut opt)))| {
                    let mut p = starts_ref[i].clone();
                    let data = &fed.clients[i].train;
                    for _ in 0..epochs {
                        match (optimizer, opt.as_deref_mut()) {
                            (Optimizer::Adam, Some(opt)) => {
                                learner.train_epoch(&mut p, opt, data, rng)?;
                            }
                            _ => sgd_epoch(learner, &mut p, data, lr as f32, batch, rng)?,
                        }
                    }
                    Ok(p)
                })
                .collect()
        });
        let ends = ends.into_iter().collect::<Result<Vec<_>, _>>()?;
        let grads: Vec<Vec<f32>> = (0..n)
            .map(|i| pseudo_gradient(&starts[i], &ends[i], lr))
            .collect();
        // HCCT-E: the similarities see only the chosen layer's entries.
        let grads: Vec<Vec<f32>> = match &self.layer {
            Some((_, blocks)) => grads
                .iter()
                .map(|g| {
                    blocks
                        .iter()
                        .flat_map(|r| g[r.clone()].iter().copied())
                        .collect()
                })
                .collect(),
            None => grads,
        };
        let reports: Vec<Option<&[f32]>> = grads.iter().map(|g| Some(g.as_slice())).collect();
        let next = self.coord.handle_reports(&reports).map_err(core_err)?;
        if self.trace {
            eprintln!(
                "hcct seed {} round {}: {} groups {:?} (next round)",
                ctx.seed,
                self.round + 1,
                next.len(),
                next.groups
            );
            if let Some(gram) = self.coord.last_gram().filter(|_| self.round == 0) {
                for (i, row) in gram.cosines().iter().enumerate() {
                    let row: Vec<String> = row.iter().map(|c| format!("{c:+.3}")).collect();
                    eprintln!("hcct cos g{i}: {}", row.join(" "));
                }
            }
        }
        for g in &groups {
            let avg = self.average(g, &ends)?;
            for &i in g {
                self.models[i] = with_head(avg.clone(), &ends[i]);
            }
        }
        self.round += 1;
        Ok(())
    }

    /// Each silo's model (its group's) on its own test split.
    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let models = &self.models;
        score_each(ctx, |i| vec![(Owner::Shared, models[i].as_slice(), 1.0)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    /// 8 silos of a synthetic label-group task (G = 2: same inputs, disjoint label sets) with
    /// `[hcct]` settings from `hcct`.
    fn scenario(hcct: &str) -> Scenario {
        Scenario::parse(&format!(
            "algorithms = [\"hcct\"]\n[data]\nsource = \"mixture\"\ntrain = 40\ntest = 50\n\
             [split]\nclients = 8\ngroups = 2\n[model]\nkind = \"softmax\"\n\
             [train]\nbatch_size = 16\n[hcct]\n{hcct}"
        ))
        .unwrap()
    }

    /// Runs `rounds` HCCT rounds of `s` (seed 3) and hands the run and its context to `check`.
    fn with_run(
        s: &Scenario,
        rounds: usize,
        check: impl FnOnce(&HcctRun, &mut Ctx<'_>, &[Vec<f32>]),
    ) {
        super::super::with_ctx(s, 3, |ctx, init| {
            let mut run = HcctRun::new(ctx, init);
            for _ in 0..rounds {
                run.round(ctx).unwrap();
            }
            check(&run, ctx, init);
        });
    }

    fn batch_rng(i: usize) -> StdRng {
        StdRng::seed_from_u64(stream_seed(
            3 ^ BATCH_TAG,
            NodeId(i as u32),
            Stream::Batches,
        ))
    }

    #[test]
    fn alpha_zero_is_independent_sgd_from_the_common_model() {
        let s = scenario("alpha = 0\nepochs = 2\n");
        with_run(&s, 3, |run, ctx, init| {
            assert_eq!(run.coord.groups().len(), 8);
            for i in 0..8 {
                let mut p = init[0].clone();
                let mut rng = batch_rng(i);
                for t in 0..3 {
                    for _ in 0..2 {
                        let lr = s.hcct.sgd_lr(t) as f32;
                        let data = &ctx.fed.clients[i].train;
                        sgd_epoch(&mut ctx.learners[i], &mut p, data, lr, 16, &mut rng).unwrap();
                    }
                }
                assert!(
                    run.models()[i] == p,
                    "silo {i} differs from independent training"
                );
            }
        });
    }

    /// FedAvg with HCCT's local routine: everyone starts each round from the global model, which
    /// becomes the size-weighted average of the ends.
    fn fedavg_sgd(ctx: &mut Ctx<'_>, init: &[Vec<f32>], rounds: usize, s: &Scenario) -> Vec<f32> {
        let sizes: Vec<usize> = ctx.fed.clients.iter().map(|c| c.train.len()).collect();
        let mut rngs: Vec<StdRng> = (0..8).map(batch_rng).collect();
        let mut global = init[0].clone();
        for t in 0..rounds {
            let ends: Vec<Vec<f32>> = (0..8)
                .map(|i| {
                    let mut p = global.clone();
                    let data = &ctx.fed.clients[i].train;
                    let lr = s.hcct.sgd_lr(t) as f32;
                    sgd_epoch(&mut ctx.learners[i], &mut p, data, lr, 16, &mut rngs[i]).unwrap();
                    p
                })
                .collect();
            let refs: Vec<&[f32]> = ends.iter().map(Vec::as_slice).collect();
            global = group_average(&refs, &sizes).unwrap();
        }
        global
    }

    #[test]
    fn huge_alpha_is_fedavg_with_the_same_routine() {
        // Paper round 0 (singletons) then one group: after round 1 on, the same as FedAvg.
        for extra in ["", "round0_global = true\n"] {
            let s = scenario(&format!("alpha = 1e12\n{extra}"));
            with_run(&s, 3, |run, ctx, init| {
                assert_eq!(run.coord.groups(), &[(0..8).collect::<Vec<_>>()]);
                let global = fedavg_sgd(ctx, init, 3, &s);
                for (i, m) in run.models().iter().enumerate() {
                    assert!(*m == global, "silo {i} differs from FedAvg ({extra:?})");
                }
            });
        }
    }

    #[test]
    fn hcct_e_on_a_one_layer_model_is_hcct() {
        // Softmax regression has one layer (fc0), so HCCT-E's block is every parameter and the
        // run is HCCT's, model for model (the selection pass uses streams of its own).
        let mut full = Vec::new();
        with_run(&scenario("alpha = 10\n"), 4, |run, _, _| {
            full = run.models().to_vec();
        });
        with_run(
            &scenario("alpha = 10\nefficient = true\n"),
            4,
            |run, ctx, _| {
                let (name, blocks) = run.layer().expect("a layer was chosen");
                assert_eq!(name, "fc0");
                assert_eq!(
                    blocks.iter().map(|r| r.len()).sum::<usize>(),
                    ctx.learners[0].num_params()
                );
                assert_eq!(run.models(), &full[..]);
            },
        );
    }

    #[test]
    fn hcct_e_chooses_one_layer_of_an_mlp_and_uses_only_it() {
        let s = Scenario::parse(
            "algorithms = [\"hcct\"]\n[data]\nsource = \"mixture\"\ntrain = 40\ntest = 50\n\
             [split]\nclients = 8\ngroups = 2\n[model]\nkind = \"mlp\"\nhidden = [16]\n\
             [train]\nbatch_size = 16\n[hcct]\nalpha = 10\nefficient = true\n",
        )
        .unwrap();
        let mut chosen = None;
        with_run(&s, 3, |run, ctx, _| {
            let (name, blocks) = run.layer().expect("a layer was chosen").clone();
            assert!(name == "fc0" || name == "fc1", "{name}");
            let size: usize = blocks.iter().map(|r| r.len()).sum();
            assert!(size < ctx.learners[0].num_params());
            // The coordinator partitioned on that block.
            assert!(run.coord.last_gram().is_some());
            chosen = Some((name, blocks));
        });
        // The same seed chooses the same layer.
        with_run(&s, 1, |run, _, _| {
            assert_eq!(run.layer().cloned(), chosen);
        });
    }

    #[test]
    fn calibrated_alpha_recovers_the_label_groups() {
        // 40 samples per silo. From the common w⁰, within-group pseudo-gradients have cosines
        // ≈ 0.65 and cross-group ones ≈ −0.1, so α/D = 0.25 lies between the two gaps (§6.4:
        // 2 − 2·sqrt((1 + c)/2) = 0.18 and 0.66) and the first partition finds G = 2. (Later
        // partitions may split: near a group optimum the members' gradients no longer agree;
        // one-shot keeps this first one.)
        let s = scenario("alpha = 10\none_shot = true\n");
        with_run(&s, 4, |run, ctx, _| {
            let truth = ctx.fed.groups().unwrap();
            let mut want: Vec<Vec<usize>> = (0..2)
                .map(|g| (0..8).filter(|&i| truth[i] == g).collect())
                .collect();
            want.sort();
            assert_eq!(run.coord.groups(), &want[..]);
            // Members of a group end each round with one model.
            for g in run.coord.groups() {
                assert!(g.iter().all(|&i| run.models()[i] == run.models()[g[0]]));
            }
        });
    }

    #[test]
    fn hcct_p_on_a_one_layer_model_is_independent_training() {
        // Softmax regression is all head: under HCCT-P every silo keeps its whole model, so
        // whatever the groups, the models are those of independent training (α = 0).
        let mut independent = Vec::new();
        with_run(
            &scenario(
                "alpha = 0
",
            ),
            4,
            |run, _, _| {
                independent = run.models().to_vec();
            },
        );
        with_run(
            &scenario(
                "alpha = 10
personal = true
",
            ),
            4,
            |run, ctx, _| {
                let covered: usize = ctx.learners[0].head().iter().map(|r| r.len()).sum();
                assert_eq!(covered, ctx.learners[0].num_params());
                assert!(run.coord.groups().len() < 8, "groups formed");
                assert_eq!(run.models(), &independent[..]);
            },
        );
    }

    #[test]
    fn hcct_p_members_share_the_body_and_keep_their_heads() {
        let s = Scenario::parse(
            "algorithms = [\"hcct\"]\n[data]\nsource = \"mixture\"\ntrain = 40\ntest = 50\n\
             [split]\nclients = 8\ngroups = 2\n[model]\nkind = \"mlp\"\nhidden = [16]\n\
             [train]\nbatch_size = 16\n[hcct]\nalpha = 1e12\npersonal = true\n",
        )
        .unwrap();
        with_run(&s, 3, |run, ctx, _| {
            let head = ctx.learners[0].head();
            assert_eq!(head.len(), 2, "fc1.bias and fc1.weight");
            let in_head = |k: usize| head.iter().any(|r| r.contains(&k));
            let n = ctx.learners[0].num_params();
            let models = run.models();
            assert_eq!(run.coord.groups().len(), 1);
            for m in &models[1..] {
                assert!(
                    (0..n)
                        .filter(|&k| !in_head(k))
                        .all(|k| m[k] == models[0][k])
                );
                assert!((0..n).filter(|&k| in_head(k)).any(|k| m[k] != models[0][k]));
            }
        });
    }
}
