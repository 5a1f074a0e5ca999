//! The thin HCCT coordinator's state, without a network (issue 5, coordinated mode): which
//! silo registered with how many samples, each silo's model, the round's end models, closing a
//! round (pseudo-gradients, the next partition, the group aggregates), answering fetches, and
//! the checkpoint.
//! Owns: the round rule of HCCT over a network — nothing starts until every expected silo has
//! registered (the partition weighs every silo's size), or the driver closes joining on the
//! silos that came ([`HcctServer::close_joining`]: the run is theirs, and a silo registering
//! later is told to train alone); a round closes when every silo in the run sent
//! its end model, or at the deadline with whoever did (a missing silo's pseudo-gradient is
//! its previous one, flagged stale, as [`Coordinator::handle_reports`] does; a group aggregates
//! over the members that sent, and a group where nobody sent keeps its start model).
//! Must not: train, see data, or wait on anything (the network driver owns the clock).
//!
//! Silos are identified by their index in the federation's manifest (the simulator's silo
//! index), so merges break ties exactly as `federico simulate` does. The round arithmetic is
//! the simulator's (`sim::hcct`): silo i starts round t from the size-weighted average of its
//! round-t group's models, sends its end model w_i, and the coordinator forms
//! g_i = (ŵ_k − w_i) / η_t itself: it sent ŵ_k, so a model is all a silo needs to send.

use crate::coord::hcct::{
    Coordinator, CoordinatorSnapshot, HcctConfig, HcctError, Optimizer, group_average,
    pseudo_gradient,
};
use crate::coord::joining::{CloseRefused, Joining, Refused};
use crate::coord::robust::{Aggregator, clip_moves, combine};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The answer to a fetch.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchAnswer {
    /// The model silo i starts round `round` from; once every round is done, its final model.
    Now {
        /// The round it starts (the run's round count for the final model).
        round: u64,
        /// Its parameters.
        params: Arc<Vec<f32>>,
    },
    /// Not yet: some silo has not registered, or the round asked for is not open.
    Hold,
    /// The run started without this silo (it registered after joining closed): it trains
    /// alone.
    Alone,
}

/// One closed round, as logged (one JSONL line per round).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoundLog {
    /// The round that closed.
    pub round: u64,
    /// This round's groups (silo indices).
    pub groups: Vec<Vec<usize>>,
    /// Silos whose end model was aggregated.
    pub senders: Vec<usize>,
    /// Next round's groups.
    pub next_groups: Vec<Vec<usize>>,
    /// Silos whose pseudo-gradient in the next partition is a stale one.
    pub stale: Vec<usize>,
    /// Closed at the deadline rather than with every silo.
    pub timed_out: bool,
}

/// What the coordinator knows.
#[derive(Clone, Debug)]
pub struct HcctServer {
    cfg: HcctConfig,
    /// T: rounds in the run.
    rounds: u64,
    /// The round open now (= rounds completed).
    round: u64,
    /// D_i of every silo, once registered, and the silos in the run (every silo, unless
    /// joining was closed without some); the partition schedule's client j is silo
    /// `members()[j]`.
    joining: Joining<usize>,
    /// w_i: each silo's model after the last aggregation (w⁰ before the first).
    models: Vec<Arc<Vec<f32>>>,
    /// The partition schedule over the members, once the run started.
    coord: Option<Coordinator>,
    /// ŵ of each silo's group for the open round (shared within a group), computed once when
    /// the round opens; empty before every silo registered.
    starts: Vec<Arc<Vec<f32>>>,
    /// End models received for the open round (not checkpointed).
    pending: BTreeMap<usize, Arc<Vec<f32>>>,
}

fn err(e: HcctError) -> String {
    e.to_string()
}

impl HcctServer {
    /// A coordinator for `nodes` silos over `rounds` rounds, every silo starting from
    /// `initial`. Refused: settings the network mode cannot run (HCCT-E, Adam) or invalid ones.
    pub fn new(
        cfg: HcctConfig,
        nodes: usize,
        rounds: u64,
        initial: Vec<f32>,
    ) -> Result<Self, String> {
        Self::check_config(&cfg)?;
        if nodes == 0 {
            return Err("hcct needs the number of silos (`nodes` ≥ 1)".into());
        }
        let initial = Arc::new(initial);
        Ok(Self {
            cfg,
            rounds,
            round: 0,
            joining: Joining::new(nodes, 1),
            // Shared until the first aggregation replaces them.
            models: (0..nodes).map(|_| initial.clone()).collect(),
            coord: None,
            starts: Vec::new(),
            pending: BTreeMap::new(),
        })
    }

    /// Computes the open round's start models (once per group).
    fn open_round(&mut self) -> Result<(), String> {
        if self.coord.is_none() {
            return Ok(());
        }
        // Silos outside the run keep the initial model here (never served).
        let mut starts: Vec<Option<Arc<Vec<f32>>>> = (0..self.nodes())
            .map(|i| (!self.in_run(i)).then(|| self.models[i].clone()))
            .collect();
        for g in self.groups() {
            let start = Arc::new(self.start(&g)?);
            for &i in &g {
                starts[i] = Some(start.clone());
            }
        }
        self.starts = starts
            .into_iter()
            .map(|s| s.ok_or("a silo in no group"))
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// The settings a coordinated HCCT run supports.
    pub fn check_config(cfg: &HcctConfig) -> Result<(), String> {
        cfg.validate().map_err(err)?;
        if cfg.efficient {
            return Err("hcct.efficient (HCCT-E) runs in `federico simulate` only".into());
        }
        if cfg.personal {
            return Err("hcct.personal (HCCT-P) runs in `federico simulate` only".into());
        }
        if cfg.optimizer == Optimizer::Adam {
            return Err(
                "hcct.optimizer = \"adam\" runs in `federico simulate` only; use \"sgd\"".into(),
            );
        }
        Ok(())
    }

    /// The round open now.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Silos registered so far.
    pub fn registered(&self) -> usize {
        self.joining.registered()
    }

    /// The run started (every silo registered, or joining was closed): rounds may run.
    pub fn ready(&self) -> bool {
        self.joining.started()
    }

    /// Silos that have not registered.
    pub fn missing(&self) -> Vec<usize> {
        self.joining.missing()
    }

    /// Joining may close now: the run has not started and a silo has registered.
    pub fn may_close_joining(&self) -> bool {
        self.joining.may_close()
    }

    /// The run started without silo `i`: it trains alone.
    pub fn left_out(&self, i: usize) -> bool {
        self.joining.left_out(i)
    }

    /// Silo `i`'s model: its group's last aggregate (the common start before round 0).
    pub fn model(&self, i: usize) -> Option<Arc<Vec<f32>>> {
        self.models.get(i).cloned()
    }

    /// The silos in the run, ascending (empty before it started).
    pub fn members(&self) -> &[usize] {
        self.joining.members()
    }

    fn in_run(&self, i: usize) -> bool {
        self.joining.in_run(i)
    }

    /// The current round's groups in silo indices (empty until the run started).
    pub fn groups(&self) -> Vec<Vec<usize>> {
        self.coord
            .as_ref()
            .map_or(Vec::new(), |c| self.silos(c.groups()))
    }

    /// The schedule's client groups as silo indices.
    fn silos(&self, groups: &[Vec<usize>]) -> Vec<Vec<usize>> {
        groups
            .iter()
            .map(|g| g.iter().map(|&j| self.members()[j]).collect())
            .collect()
    }

    /// The rounds of the run joining just started: the partition schedule over its members'
    /// sizes, and round 0's start models.
    fn start_run(&mut self) -> Result<(), String> {
        let sizes: Vec<usize> = self
            .members()
            .iter()
            .map(|&i| {
                self.joining
                    .size(i)
                    .ok_or("an unregistered silo in the run")
            })
            .collect::<Result<_, _>>()?;
        let sizes = self.cfg.run_sizes(&sizes);
        self.coord = Some(Coordinator::new(sizes, self.cfg.coordinator_config()));
        self.open_round()
    }

    /// Starts the run with the silos registered so far, without waiting for the rest (the
    /// driver's join deadline passed). Returns the silos left out; each is told to train alone
    /// if it registers later. Refused with nobody registered or once the run started.
    pub fn close_joining(&mut self) -> Result<Vec<usize>, String> {
        let left = self.joining.close().map_err(|e| match e {
            CloseRefused::Started => "the run has already started",
            CloseRefused::TooFew { .. } => "no silo has registered",
        })?;
        self.start_run()?;
        Ok(left)
    }

    /// Records silo `index`'s sample count. A silo that registers again (a restart) must give
    /// the same count once the run started: the partition weighs fixed sizes. A silo that
    /// registers after joining closed without it is recorded, and its fetches answered
    /// [`FetchAnswer::Alone`].
    pub fn register(&mut self, index: usize, n_train: u64) -> Result<(), String> {
        let refused = |e| match e {
            Refused::NotASilo { nodes } => {
                format!("silo {index} is not one of the {nodes} silos of this run")
            }
            Refused::Changed { old } => format!(
                "silo {index} registered {old} samples before and now {n_train}; HCCT keeps sizes fixed for the run"
            ),
        };
        self.joining.check(index).map_err(refused)?;
        let d = usize::try_from(n_train)
            .ok()
            .filter(|&d| d > 0)
            .ok_or_else(|| format!("n_train = {n_train}; a silo needs at least 1 sample"))?;
        if self.joining.register(index, d).map_err(refused)? {
            self.start_run()?;
        }
        Ok(())
    }

    /// Records silo `index`'s end model of `round`. Refused: before every silo registered,
    /// another round than the open one, or a model of the wrong size. Returns true when every
    /// silo has sent.
    pub fn update(
        &mut self,
        index: usize,
        round: u64,
        params: Arc<Vec<f32>>,
    ) -> Result<bool, String> {
        if self.coord.is_none() {
            return Err("not every silo has registered yet".into());
        }
        if self.joining.size(index).is_none() {
            return Err(format!("silo {index} sent an update without registering"));
        }
        if !self.in_run(index) {
            return Err(format!(
                "silo {index} registered after the run started without it: it trains alone"
            ));
        }
        if round != self.round {
            return Err(format!(
                "update for round {round}, but round {} is open",
                self.round
            ));
        }
        if params.len() != self.models[0].len() {
            return Err(format!(
                "{} parameters where the model has {}",
                params.len(),
                self.models[0].len()
            ));
        }
        // Finite values can still give an infinite pseudo-gradient (a hostile |w| near f32's
        // limit, divided by η): refuse it here, before it reaches the partition.
        let lr = self.cfg.sgd_lr(self.round as usize);
        if pseudo_gradient(&self.starts[index], &params, lr)
            .iter()
            .any(|g| !g.is_finite())
        {
            return Err("the model's pseudo-gradient is not finite".into());
        }
        self.pending.insert(index, params);
        Ok(self.all_in())
    }

    /// Every silo in the run has sent its end model for the open round.
    pub fn all_in(&self) -> bool {
        self.coord.is_some() && self.pending.len() == self.members().len()
    }

    /// The run's silos the open round still awaits (none before the run started).
    pub fn waiting(&self) -> Vec<usize> {
        if self.coord.is_none() {
            return Vec::new();
        }
        let members = self.members();
        members
            .iter()
            .copied()
            .filter(|i| !self.pending.contains_key(i))
            .collect()
    }

    /// Every silo's sample count as the run weighs it (capped by `size_cap` among the run's
    /// silos; 0 for a silo outside the run that never registered).
    fn sizes(&self) -> Vec<usize> {
        let mut all: Vec<usize> = self
            .joining
            .sizes()
            .iter()
            .map(|d| d.unwrap_or(0))
            .collect();
        let members = self.members();
        let theirs: Vec<usize> = members.iter().map(|&i| all[i]).collect();
        for (&i, d) in members.iter().zip(self.cfg.run_sizes(&theirs)) {
            all[i] = d;
        }
        all
    }

    /// ŵ of `group`: the size-weighted average of its members' models.
    fn start(&self, group: &[usize]) -> Result<Vec<f32>, String> {
        let ms: Vec<&[f32]> = group.iter().map(|&i| self.models[i].as_slice()).collect();
        let sizes = self.sizes();
        let ds: Vec<usize> = group.iter().map(|&i| sizes[i]).collect();
        group_average(&ms, &ds).map_err(err)
    }

    /// Each end model of the open round whose move from its group's start model is longer
    /// than `update_clip` times the round's median move, scaled back along its direction.
    fn clip_pending(&mut self) {
        if self.cfg.update_clip <= 0.0 {
            return;
        }
        let clip = Some(self.cfg.update_clip);
        let ids: Vec<usize> = self.pending.keys().copied().collect();
        let ends: Vec<&[f32]> = ids.iter().map(|i| self.pending[i].as_slice()).collect();
        let bases: Vec<&[f32]> = ids.iter().map(|&i| self.starts[i].as_slice()).collect();
        let clipped = clip_moves(&ends, &bases, clip);
        for (i, c) in ids.into_iter().zip(clipped) {
            if let Some(c) = c {
                self.pending.insert(i, Arc::new(c));
            }
        }
    }

    /// Closes the open round: pseudo-gradients of the senders against their group's start
    /// model, the next partition, and each group's aggregate adopted by its members.
    pub fn close(&mut self, timed_out: bool) -> Result<RoundLog, String> {
        if self.coord.is_none() {
            return Err("no round is open before every silo registered".into());
        }
        let groups = self.groups();
        let lr = self.cfg.sgd_lr(self.round as usize);
        self.clip_pending();
        // The schedule's clients are the run's members, in order.
        let grads: Vec<Option<Vec<f32>>> = self
            .members()
            .iter()
            .map(|i| {
                self.pending
                    .get(i)
                    .map(|end| pseudo_gradient(&self.starts[*i], end, lr))
            })
            .collect();
        let refs: Vec<Option<&[f32]>> = grads.iter().map(Option::as_deref).collect();
        let sizes = self.sizes();
        let coord = self.coord.as_mut().expect("checked above");
        let next = coord.handle_reports(&refs).map_err(err)?.groups.clone();
        let members = self.joining.members();
        let stale = (0..members.len())
            .filter(|&j| coord.stale()[j])
            .map(|j| members[j])
            .collect();
        let next = self.silos(&next);
        for g in &groups {
            let senders: Vec<usize> = g
                .iter()
                .copied()
                .filter(|i| self.pending.contains_key(i))
                .collect();
            let model = if senders.is_empty() {
                self.starts[g[0]].clone()
            } else {
                let ms: Vec<&[f32]> = senders.iter().map(|i| self.pending[i].as_slice()).collect();
                let ds: Vec<usize> = senders.iter().map(|&i| sizes[i]).collect();
                Arc::new(match self.cfg.aggregator {
                    Aggregator::Mean => group_average(&ms, &ds).map_err(err)?,
                    rule => {
                        let w: Vec<f64> = ds.iter().map(|&d| d as f64).collect();
                        combine(&ms, &w, rule, self.cfg.trim)
                    }
                })
            };
            for &i in g {
                self.models[i] = model.clone();
            }
        }
        let log = RoundLog {
            round: self.round,
            groups,
            senders: self.pending.keys().copied().collect(),
            next_groups: next,
            stale,
            timed_out,
        };
        self.pending.clear();
        self.round += 1;
        self.open_round()?;
        Ok(log)
    }

    /// Answers silo `index`'s fetch of round `round`: its group's start model, or once the
    /// run is over its final model. An older round is answered with the open one; a silo
    /// outside the run is told it trains alone.
    pub fn fetch(&self, index: usize, round: u64) -> Result<FetchAnswer, String> {
        if self.coord.is_none() {
            return Ok(FetchAnswer::Hold);
        }
        if index >= self.nodes() {
            return Err(format!(
                "silo {index} is not one of the {} silos of this run",
                self.nodes()
            ));
        }
        if !self.in_run(index) {
            return Ok(FetchAnswer::Alone);
        }
        if round > self.round {
            return Ok(FetchAnswer::Hold);
        }
        let params = if self.round >= self.rounds {
            self.models[index].clone()
        } else {
            self.starts[index].clone()
        };
        Ok(FetchAnswer::Now {
            round: self.round,
            params,
        })
    }

    /// The checkpoint's bytes: versioned header, then round, sizes, models and the partition
    /// schedule's state.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = crate::store::header(MAGIC, VERSION);
        let body = Saved {
            round: self.round,
            sizes: self.joining.sizes().to_vec(),
            models: self.models.iter().map(|m| m.to_vec()).collect(),
            coord: self.coord.as_ref().map(Coordinator::snapshot),
            members: self.members().to_vec(),
        };
        bincode::serde::encode_into_std_write(&body, &mut out, bincode::config::standard())
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Restores a checkpoint for this run's settings (header, version, body and its fit to
    /// `cfg`/`nodes` checked; no pending updates). A version 1 checkpoint (before joining
    /// could close) restores with every silo in the run.
    pub fn decode(cfg: HcctConfig, rounds: u64, bytes: &[u8]) -> Result<Self, String> {
        Self::check_config(&cfg)?;
        let s = crate::store::decode_migrating::<Saved, SavedV1>(bytes, MAGIC, VERSION, 1)?;
        let n = s.sizes.len();
        if n == 0 || s.models.len() != n {
            return Err(format!("{} models for {n} silos", s.models.len()));
        }
        if s.models.iter().any(|m| m.len() != s.models[0].len()) {
            return Err("models of different sizes".into());
        }
        if !s.members.is_sorted_by(|a, b| a < b) || s.members.last().is_some_and(|&i| i >= n) {
            return Err(format!(
                "run members {:?} are not silos of 0..{n}",
                s.members
            ));
        }
        let coord = match s.coord {
            Some(snap) => {
                let sizes: Vec<usize> =
                    s.members.iter().map(|&i| s.sizes[i].unwrap_or(0)).collect();
                if sizes.is_empty() || sizes.contains(&0) {
                    return Err("a partition saved before its silos registered".into());
                }
                let sizes = cfg.run_sizes(&sizes);
                Some(Coordinator::restore(sizes, cfg.coordinator_config(), snap).map_err(err)?)
            }
            None if s.members.is_empty() => None,
            None => return Err("run members without a partition".into()),
        };
        let mut me = Self {
            cfg,
            rounds,
            round: s.round,
            joining: Joining::restore(s.sizes, (!s.members.is_empty()).then_some(s.members), 1),
            models: s.models.into_iter().map(Arc::new).collect(),
            coord,
            starts: Vec::new(),
            pending: BTreeMap::new(),
        };
        me.open_round()?;
        Ok(me)
    }

    /// Silos in this run.
    pub fn nodes(&self) -> usize {
        self.joining.nodes()
    }

    /// Parameters per model.
    pub fn num_params(&self) -> usize {
        self.models[0].len()
    }
}

const MAGIC: &[u8; 8] = b"FEDHCCT1";
/// 2: the run's members (joining can close without some silos).
const VERSION: u32 = 2;

#[derive(Serialize, Deserialize)]
struct Saved {
    round: u64,
    sizes: Vec<Option<usize>>,
    models: Vec<Vec<f32>>,
    coord: Option<CoordinatorSnapshot>,
    members: Vec<usize>,
}

/// Version 1: every silo was in the run once it started.
#[derive(Serialize, Deserialize)]
struct SavedV1 {
    round: u64,
    sizes: Vec<Option<usize>>,
    models: Vec<Vec<f32>>,
    coord: Option<CoordinatorSnapshot>,
}

impl From<SavedV1> for Saved {
    fn from(v: SavedV1) -> Self {
        let members = if v.coord.is_some() {
            (0..v.sizes.len()).collect()
        } else {
            Vec::new()
        };
        Saved {
            round: v.round,
            sizes: v.sizes,
            models: v.models,
            coord: v.coord,
            members,
        }
    }
}

#[cfg(test)]
mod tests;
