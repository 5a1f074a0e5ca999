//! FedDisco, HCCT and FedSaC as the network runs them: the coordinator's round engine
//! ([`Engine`], the one `net::coordinator` drives) and one member engine per silo ([`Member`],
//! the one a coordinated node drives), on a simulated network where every request is answered
//! at once, with each silo training by the node's recipe ([`LocalRecipe`], its streams seeded
//! as a node seeds them). A fault-free `simulate` and a fault-free swarm make the same decisions
//! by construction: the same engines decide, the same recipe trains.
//!
//! Owns: carrying each member's questions to the coordinator's engine and its answers back (a
//! request's ticket is the asking silo's index), holding what a node's driver holds (its
//! model, the last model offered, FedSaC's direction and subspace), running the trainings the
//! members ask for in parallel batches, and keeping the run lock-step: a call runs exactly one
//! round on every silo.
//! Must not: decide anything about a round (the engines do) or combine models (the servers
//! behind [`CoordAlgorithm`] do). Nothing here reads a clock: the engines' clock never moves,
//! so no deadline is ever reached, every round closes on its last update, and a member that
//! detaches, is refused or falls back is a broken invariant, reported as an error.

use super::coordinated::CoordinatedRun;
use super::pool::{Owner, par_silos_with, score_each};
use super::{ClientEval, Ctx, SimError};

mod collab;
mod coordinator;
mod faulty;
mod faulty_collab;
mod under_faults;
use crate::coord::engine::{self, Answer, CoordAlgorithm, Engine, EngineConfig, Request};
use crate::coord::feddisco::{self, DiscoReport};
use crate::coord::feddisco_server::ServerState;
use crate::coord::fedsac_server::FedsacServer;
use crate::coord::hcct_server::HcctServer;
use crate::coord::member::{self, Action, Ask, Member, MemberConfig, Reply};
use crate::ids::NodeId;
use crate::scenario::Algorithm;
use crate::silo::LocalRecipe;
pub(crate) use collab::CollabRun;
use std::sync::Arc;
use std::time::{Duration, Instant};
pub(crate) use under_faults::UnderFaults;

/// What a coordinated node's driver holds for its engine.
struct Silo {
    /// The model it trains and sends.
    model: Vec<f32>,
    /// The last model the coordinator sent, until adopted.
    offered: Option<Arc<Vec<f32>>>,
    /// FedSaC: the direction sent with it.
    direction: Option<Arc<Vec<f32>>>,
    /// FedSaC: the subspace of the last training.
    subspace: Option<Vec<Vec<f64>>>,
    recipe: LocalRecipe,
    /// The registration it sends.
    register: Request,
    /// The coordinator round its pending training follows.
    job: Option<u64>,
    /// The poisoning it plays (a fault schedule's `attack`), rewriting what it sends.
    poisoner: Option<crate::silo::attack::Poisoner>,
}

impl Silo {
    fn new(register: Request, recipe: LocalRecipe, num_params: usize) -> Self {
        Self {
            model: vec![0.0; num_params],
            offered: None,
            direction: None,
            subspace: None,
            recipe,
            register,
            job: None,
            poisoner: None,
        }
    }

    /// The member's question as the request its node sends.
    fn request(&self, ask: Ask) -> Request {
        match ask {
            Ask::Register => self.register.clone(),
            Ask::Fetch { round } => Request::Fetch { round },
            Ask::Update { round } => {
                let params = Arc::new(self.model.clone());
                match self.recipe {
                    LocalRecipe::Fedsac { .. } => Request::Contribute {
                        round,
                        params,
                        subspace: self.subspace.clone(),
                    },
                    _ => Request::Update { round, params },
                }
            }
        }
    }

    /// The coordinator's answer as the node's driver reads it (the parameters wait in
    /// `offered`).
    fn read(&mut self, answer: Answer) -> Reply {
        match answer {
            Answer::Ack => Reply::Ack,
            Answer::Error { reason } => Reply::Refused(reason),
            Answer::Alone => Reply::Alone,
            Answer::Global { round, params } => {
                self.offered = Some(params);
                self.direction = None;
                Reply::Model { round, train: true }
            }
            Answer::Assigned {
                round,
                params,
                direction,
                train,
            } => {
                self.offered = Some(params);
                self.direction = direction;
                Reply::Model { round, train }
            }
            other => Reply::Unusable(format!("an answer to another question: {other:?}")),
        }
    }

    /// Takes the model the coordinator sent.
    fn adopt(&mut self) {
        if let Some(p) = self.offered.take() {
            self.model = p.to_vec();
        }
    }

    /// Trains the model on `data` on the schedule of coordinator round `at`, with the direction
    /// that came with it (FedSaC).
    fn train(
        &mut self,
        learner: &mut crate::learn::Learner,
        data: &crate::learn::Dataset,
        batch: usize,
        at: u64,
    ) -> Result<(), String> {
        let direction = self.direction.take();
        let start = self.poisoner.as_ref().map(|_| self.model.clone());
        let flipped = self.poisoner.as_mut().and_then(|p| p.train_rows(data));
        self.subspace = self.recipe.train(
            learner,
            &mut self.model,
            flipped.as_deref().unwrap_or(data),
            batch,
            at,
            direction.as_deref().map(|d| d.as_slice()),
        )?;
        if let (Some(p), Some(start)) = (self.poisoner.as_mut(), start) {
            p.sent_model(&start, &mut self.model);
        }
        Ok(())
    }
}

/// One coordinator algorithm's run over its engines.
pub(crate) struct MemberRun {
    engine: Engine<usize>,
    members: Vec<Member>,
    silos: Vec<Silo>,
    /// The members' names at the coordinator, sorted as their indices (FedDisco keeps its
    /// registrations in name order, and sums in that order).
    names: Vec<String>,
    /// FedSaC's personalised models are the silos' own; the others are shared.
    personal: bool,
    /// The engines' clock, which never moves.
    now: Instant,
}

impl MemberRun {
    /// A fault-free run of `parts` for `ctx`'s silos.
    pub(crate) fn new(ctx: &Ctx<'_>, parts: Parts) -> Self {
        let Parts {
            alg,
            register,
            recipes,
            personal,
            ..
        } = parts;
        let k = ctx.clients();
        let now = Instant::now();
        let rounds = ctx.scenario.rounds as u64;
        // Deadlines exist (the engines need them) but are never reached: time does not move.
        let day = Duration::from_secs(86_400);
        let names: Vec<String> = (0..k).map(|i| format!("silo-{i:06}")).collect();
        let mut engine = Engine::new(
            alg,
            EngineConfig {
                rounds,
                nodes: k,
                round_deadline: day,
                join_deadline: None,
                linger: Duration::ZERO,
                excuse_rounds: 0,
                names: names.clone(),
            },
        );
        // A fresh engine cannot fail to start: nothing is resumed.
        let _ = engine.handle_start(now);
        let members = (0..k)
            .map(|_| {
                Member::new(
                    MemberConfig {
                        rounds,
                        budget: day,
                        retry: Duration::from_millis(500),
                        final_budget: day,
                        // The simulator scores the silos itself, between rounds.
                        eval_every: 0,
                        fall_back_after: None,
                    },
                    member::Resume::default(),
                )
            })
            .collect();
        let num_params = engine.algorithm().num_params();
        let silos = register
            .into_iter()
            .zip(recipes)
            .map(|(register, recipe)| Silo::new(register, recipe, num_params))
            .collect();
        let mut run = Self {
            engine,
            members,
            silos,
            names,
            personal,
            now,
        };
        for m in &mut run.members {
            m.handle_start(now);
        }
        run
    }

    /// Carries every action and answer until the engines are quiet.
    fn pump(&mut self) -> Result<(), SimError> {
        loop {
            let mut moved = false;
            for i in 0..self.members.len() {
                while let Some(action) = self.members[i].poll_action() {
                    moved = true;
                    self.act(i, action)?;
                }
            }
            if !moved {
                return Ok(());
            }
        }
    }

    /// Carries out member `i`'s action.
    fn act(&mut self, i: usize, action: Action) -> Result<(), SimError> {
        let broken = |what: String| Err(SimError::Invariant(format!("silo-{i}: {what}")));
        match action {
            Action::Ask { ask, .. } => self.ask(i, ask)?,
            Action::Adopt { .. } => self.silos[i].adopt(),
            Action::Train { at } => {
                if self.silos[i].job.replace(at).is_some() {
                    return broken("asked to train with a training in flight".into());
                }
            }
            // Nothing is written: the simulator keeps no checkpoints or run logs.
            Action::MarkSent(_) => {}
            Action::EndRound(_) => self.members[i].handle_round_written(self.now),
            Action::Finish { final_round } => {
                if final_round.is_some() {
                    self.silos[i].adopt();
                }
            }
            Action::Event(e) => return broken(format!("{e:?} in a fault-free run")),
            Action::Recover { .. } => return broken("recovered in a run without kills".into()),
            Action::FallBack { at } => return broken(format!("fell back after round {at}")),
        }
        Ok(())
    }

    /// Member `i`'s question to the coordinator's engine; the answers it gives (to `i`, or to
    /// silos whose held fetches it now serves) go back to their members.
    fn ask(&mut self, i: usize, ask: Ask) -> Result<(), SimError> {
        let request = self.silos[i].request(ask);
        for (ticket, answer) in
            answered_at_once(&mut self.engine, self.now, &self.names[i], i, request)?
        {
            let reply = self.read(ticket, answer);
            self.members[ticket].handle_reply(self.now, reply);
        }
        Ok(())
    }

    /// The coordinator's answer as silo `i`'s driver reads it.
    fn read(&mut self, i: usize, answer: Answer) -> Reply {
        self.silos[i].read(answer)
    }
}

impl CoordinatedRun for MemberRun {
    /// Runs one coordinator round. A training of the next round (a silo whose next model
    /// came already) waits for the next call.
    fn round(&mut self, ctx: &mut Ctx<'_>) -> Result<(), SimError> {
        let target = self.engine.round() + 1;
        loop {
            self.pump()?;
            let jobs: Vec<Option<u64>> = self
                .silos
                .iter_mut()
                .zip(&self.members)
                .map(|(s, m)| {
                    if m.round() < target {
                        s.job.take()
                    } else {
                        None
                    }
                })
                .collect();
            if jobs.iter().all(Option::is_none) {
                break;
            }
            let (fed, batch) = (ctx.fed, ctx.batch_size());
            let items: Vec<_> = jobs.into_iter().zip(self.silos.iter_mut()).collect();
            let out = par_silos_with(ctx, items, |i, learner, (job, s)| {
                let Some(at) = job else {
                    return Ok(false);
                };
                s.train(learner, &fed.clients[i].train, batch, at)
                    .map_err(|e| SimError::Invariant(format!("silo-{i} training: {e}")))?;
                Ok::<bool, SimError>(true)
            });
            for (i, trained) in out.into_iter().enumerate() {
                if trained? {
                    self.members[i].handle_trained(self.now);
                }
            }
        }
        // A silo outside FedSaC's cohort trains nothing: it may be a round ahead, waiting for
        // the coordinator's next round.
        if let Some(i) = (0..self.members.len()).find(|&i| self.members[i].round() < target) {
            return Err(SimError::Invariant(format!(
                "silo-{i} did not complete round {target} in a fault-free round"
            )));
        }
        if self.engine.round() != target {
            return Err(SimError::Invariant(format!(
                "the coordinator did not close round {target} in a fault-free round"
            )));
        }
        Ok(())
    }

    /// Every silo's model as the coordinator holds it for the silo.
    fn evaluate(&mut self, ctx: &mut Ctx<'_>) -> Result<Vec<ClientEval>, SimError> {
        let alg = self.engine.algorithm();
        let models = (0..self.members.len())
            .map(|i| {
                alg.scored(i).ok_or_else(|| {
                    SimError::Invariant(format!("the coordinator holds no model for silo-{i}"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let personal = self.personal;
        score_each(ctx, |i| {
            let owner = if personal {
                Owner::Silo(i)
            } else {
                Owner::Shared
            };
            vec![(owner, models[i].as_slice(), 1.0)]
        })
    }
}

/// Silo `i`'s request (named `name` at the coordinator) handed to the coordinator's `engine`
/// on a network that answers at once: the answers it gives, in order, each with the index of
/// the silo it goes to (`i`, or silos whose held fetches it now serves). A refusal is a broken
/// invariant of a fault-free run; checkpoints, log lines and events are the coordinator
/// process's business.
pub(super) fn answered_at_once(
    engine: &mut Engine<usize>,
    now: Instant,
    name: &str,
    i: usize,
    request: Request,
) -> Result<Vec<(usize, Answer)>, SimError> {
    engine
        .handle_request(now, name, Some(i), request, i)
        .map_err(|e| SimError::Invariant(format!("coordinator: {e}")))?;
    let mut answers = Vec::new();
    while let Some(action) = engine.poll_action() {
        match action {
            engine::Action::Respond { ticket, answer } => answers.push((ticket, answer)),
            engine::Action::Event(engine::Event::Refused { who, what, reason }) => {
                return Err(SimError::Invariant(format!(
                    "the coordinator refused {what} of {who}: {reason}"
                )));
            }
            _ => {}
        }
    }
    Ok(answers)
}

/// Reads a coordinator's checkpoint back (a restart).
pub(crate) type Decode = Box<dyn Fn(&[u8]) -> Result<Box<dyn CoordAlgorithm>, String>>;

/// What a coordinated run is built from, as the coordinator and the nodes build theirs.
pub(crate) struct Parts {
    /// The coordinator's algorithm, fresh.
    pub(crate) alg: Box<dyn CoordAlgorithm>,
    /// How its checkpoint is read back.
    pub(crate) decode: Decode,
    /// Each silo's registration.
    pub(crate) register: Vec<Request>,
    /// Each silo's recipe.
    pub(crate) recipes: Vec<LocalRecipe>,
    /// The silos' models are their own (FedSaC), not shared.
    pub(crate) personal: bool,
}

/// The parts of a FedDisco, HCCT or FedSaC run for `ctx`'s silos; `None` for the simulator's
/// own modes, which no node runs (FedDisco's partial participation, HCCT-E, HCCT-P, HCCT with
/// Adam) and for the other algorithms.
pub(crate) fn parts(
    algorithm: Algorithm,
    ctx: &Ctx<'_>,
    init: &[Vec<f32>],
) -> Result<Option<Parts>, SimError> {
    let (k, rounds, seed) = (ctx.clients(), ctx.scenario.rounds as u64, ctx.seed);
    let w0 = init[0].clone();
    let invariant = |what: &str, e: String| SimError::Invariant(format!("{what}: {e}"));
    Ok(Some(match algorithm {
        Algorithm::Feddisco => {
            let cfg = ctx.scenario.feddisco.clone();
            if cfg.clients_per_round != 0 && cfg.clients_per_round < k {
                return Ok(None);
            }
            let register = ctx
                .fed
                .clients
                .iter()
                .map(|c| {
                    // The silo's own computation: only the report leaves it.
                    let counts: Vec<u64> =
                        c.train.class_counts().iter().map(|&n| n as u64).collect();
                    let r = feddisco::report(&counts, cfg.metric).unwrap_or(DiscoReport {
                        num_samples: 0,
                        discrepancy: 0.0,
                    });
                    Request::Register {
                        n_train: r.num_samples,
                        discrepancy: r.discrepancy,
                    }
                })
                .collect();
            let recipes = (0..k)
                .map(|i| LocalRecipe::feddisco(&cfg, seed, NodeId(i as u32), rows(ctx, i)))
                .collect();
            let (params, robust) = (cfg.params(), cfg.robust());
            Parts {
                alg: Box::new(engine::Disco {
                    state: ServerState::new(w0),
                    params,
                    robust,
                }),
                decode: Box::new(move |b| {
                    Ok(Box::new(engine::Disco {
                        state: ServerState::decode(b)?,
                        params,
                        robust,
                    }))
                }),
                register,
                recipes,
                personal: false,
            }
        }
        Algorithm::Hcct => {
            let cfg = ctx.scenario.hcct.clone();
            if HcctServer::check_config(&cfg).is_err() {
                return Ok(None);
            }
            let alg =
                HcctServer::new(cfg.clone(), k, rounds, w0).map_err(|e| invariant("hcct", e))?;
            let recipes = (0..k)
                .map(|i| LocalRecipe::hcct(&cfg, seed, NodeId(i as u32)))
                .collect();
            Parts {
                alg: Box::new(alg),
                decode: Box::new(move |b| {
                    Ok(Box::new(HcctServer::decode(cfg.clone(), rounds, b)?))
                }),
                register: joins(ctx),
                recipes,
                personal: false,
            }
        }
        Algorithm::Fedsac => {
            let cfg = ctx.scenario.fedsac.clone();
            let cohort = crate::silo::fedsac::cohort_seed(seed);
            let alg = FedsacServer::new(cfg.settings(), k, rounds, cohort, w0)
                .map_err(|e| invariant("fedsac", e))?;
            let recipes = (0..k)
                .map(|i| LocalRecipe::fedsac(&cfg, seed, NodeId(i as u32), rows(ctx, i)))
                .collect();
            let settings = cfg.settings();
            Parts {
                alg: Box::new(alg),
                decode: Box::new(move |b| {
                    Ok(Box::new(FedsacServer::decode(settings, rounds, cohort, b)?))
                }),
                register: joins(ctx),
                recipes,
                personal: true,
            }
        }
        _ => return Ok(None),
    }))
}

impl MemberRun {
    /// FedDisco on the engines (`None`: partial participation, a simulator mode).
    #[cfg(test)]
    fn feddisco(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Option<Self> {
        parts(Algorithm::Feddisco, ctx, init)
            .unwrap()
            .map(|p| Self::new(ctx, p))
    }

    /// HCCT on the engines (`None`: HCCT-E, HCCT-P or Adam, simulator modes).
    #[cfg(test)]
    fn hcct(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Result<Option<Self>, SimError> {
        Ok(parts(Algorithm::Hcct, ctx, init)?.map(|p| Self::new(ctx, p)))
    }

    /// FedSaC on the engines.
    #[cfg(test)]
    fn fedsac(ctx: &Ctx<'_>, init: &[Vec<f32>]) -> Result<Self, SimError> {
        let p = parts(Algorithm::Fedsac, ctx, init)?.expect("every fedsac setting");
        Ok(Self::new(ctx, p))
    }
}

/// Silo `i`'s training rows.
fn rows(ctx: &Ctx<'_>, i: usize) -> usize {
    ctx.fed.clients[i].train.len()
}

/// Every silo's `Join` with its sample count.
fn joins(ctx: &Ctx<'_>) -> Vec<Request> {
    (0..ctx.clients())
        .map(|i| Request::Join {
            n_train: rows(ctx, i) as u64,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::feddisco::FeddiscoRun;
    use super::super::hcct::HcctRun;
    use super::*;
    use crate::scenario::Scenario;

    /// 6 silos of a synthetic label-group task with `extra` settings.
    fn scenario(extra: &str) -> Scenario {
        Scenario::parse(&format!(
            "rounds = 6\nalgorithms = [\"feddisco\", \"hcct\", \"fedsac\"]\n\
             [data]\nsource = \"mixture\"\ntrain = 40\ntest = 50\n\
             [split]\nclients = 6\ngroups = 2\n[model]\nkind = \"softmax\"\n\
             [train]\nbatch_size = 16\n{extra}"
        ))
        .unwrap()
    }

    /// Runs `check` with a context for `s` (seed 3) and the silos' initial models.
    fn with_ctx(s: &Scenario, check: impl FnOnce(&mut Ctx<'_>, &[Vec<f32>])) {
        super::super::with_ctx(s, 3, check)
    }

    /// Every round's scores of `a` and `b`, run side by side.
    fn side_by_side(
        ctx: &mut Ctx<'_>,
        mut a: Box<dyn CoordinatedRun>,
        mut b: Box<dyn CoordinatedRun>,
    ) -> Vec<(Vec<ClientEval>, Vec<ClientEval>)> {
        (0..ctx.scenario.rounds)
            .map(|_| {
                a.round(ctx).unwrap();
                b.round(ctx).unwrap();
                (a.evaluate(ctx).unwrap(), b.evaluate(ctx).unwrap())
            })
            .collect()
    }

    /// The engines of the network and the lock-step loops of the papers' recipes make the same
    /// decisions, bit for bit, every round: FedDisco's weights and aggregate, HCCT's groups
    /// and group models. (FedSaC has no second loop: `tests/coordinator.rs` checks it against
    /// a swarm.)
    #[test]
    fn the_engines_score_every_round_as_the_lock_step_loops() {
        let s = scenario("[hcct]\nalpha = 2.0\n");
        with_ctx(&s, |ctx, init| {
            let engines = Box::new(MemberRun::feddisco(ctx, init).unwrap());
            let lock_step = Box::new(FeddiscoRun::new(ctx, init));
            let rounds = side_by_side(ctx, engines, lock_step);
            for (r, (a, b)) in rounds.iter().enumerate() {
                assert_eq!(a, b, "feddisco round {r}");
            }
            // The rounds learn (the check compares something that moves).
            assert_ne!(rounds[0].0, rounds[5].0);

            let engines = Box::new(MemberRun::hcct(ctx, init).unwrap().unwrap());
            let lock_step = Box::new(HcctRun::new(ctx, init));
            for (r, (a, b)) in side_by_side(ctx, engines, lock_step).iter().enumerate() {
                assert_eq!(a, b, "hcct round {r}");
            }
        });
    }

    /// The simulator's modes the network does not run keep their lock-step loops.
    #[test]
    fn simulator_only_modes_have_no_engine_run() {
        let s = scenario("[feddisco]\nclients_per_round = 3\n[hcct]\nefficient = true\n");
        with_ctx(&s, |ctx, init| {
            assert!(MemberRun::feddisco(ctx, init).is_none());
            assert!(MemberRun::hcct(ctx, init).unwrap().is_none());
        });
        let s = scenario("[feddisco]\nclients_per_round = 6\n");
        with_ctx(&s, |ctx, init| {
            assert!(MemberRun::feddisco(ctx, init).is_some());
        });
    }

    /// FedSaC with a cohort of 2: only the cohort trains and sends each round, the others take
    /// their model and wait, and every round closes on its cohort's contributions.
    #[test]
    fn a_fedsac_cohort_round_closes_on_the_cohort() {
        let s = scenario("[fedsac]\ncohort_size = 2\n");
        with_ctx(&s, |ctx, init| {
            let mut run = MemberRun::fedsac(ctx, init).unwrap();
            let before: Vec<Vec<f32>> = (0..6).map(|i| run.scored(i)).collect();
            run.round(ctx).unwrap();
            let after: Vec<Vec<f32>> = (0..6).map(|i| run.scored(i)).collect();
            let moved = (0..6).filter(|&i| before[i] != after[i]).count();
            assert_eq!(moved, 2, "only the cohort's models change");
            assert_eq!(run.engine.round(), 1);
            for _ in 1..6 {
                run.round(ctx).unwrap();
            }
            assert_eq!(run.engine.round(), 6);
            assert!(run.members.iter().all(|m| m.round() == 6));
        });
    }

    /// A member the coordinator refuses is a broken invariant in a fault-free run: the run
    /// stops and says who was refused and why, instead of going on without the silo.
    #[test]
    fn a_refusal_stops_the_run_naming_it() {
        let s = scenario("");
        with_ctx(&s, |ctx, init| {
            let mut run = MemberRun::feddisco(ctx, init).unwrap();
            // Silo 4 joins a FedDisco coordinator as if it ran HCCT.
            run.silos[4].register = Request::Join { n_train: 40 };
            let e = run.round(ctx).unwrap_err().to_string();
            assert!(e.contains("refused a registration of silo-000004"), "{e}");
            assert!(e.contains("register with (n_train, discrepancy)"), "{e}");
        });
    }

    impl MemberRun {
        /// The model the coordinator holds for silo `i`.
        fn scored(&self, i: usize) -> Vec<f32> {
            self.engine.algorithm().scored(i).unwrap().to_vec()
        }
    }
}
