//! The thin FedSaC coordinator's state, without a network (issue 5, coordinated mode): which
//! silo registered with how many samples, each silo's personalised model θ̃^i and regulariser
//! direction c^i, the round's cohort, the cohort's trained models and feature subspaces,
//! closing a round (the collaboration graph and the personalised aggregation), answering
//! fetches, and the checkpoint.
//! Owns: the round rule of FedSaC over a network — nothing starts until every expected silo
//! registered (the cohort is drawn over all of them, with the simulator's stream), or the
//! driver closes joining on the silos that came ([`FedsacServer::close_joining`]: cohorts are
//! drawn over them, and a silo registering later is told to train alone); a round
//! closes when every cohort member sent, or at the deadline with whoever did (the graph is
//! built over the senders; a member that did not send keeps its model and loses its direction,
//! as a silo outside the cohort does).
//! Must not: train, see data, or wait on anything (the network driver owns the clock).
//!
//! Silos are named by their index in the federation's manifest (the simulator's silo index).

use crate::coord::fedsac::{
    self, FedsacError, GraphSettings, PrincipalAngles, RoundGraph, Subspace,
};
use crate::coord::joining::{CloseRefused, Joining, Refused};
use crate::coord::robust::Aggregator;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the coordinator needs of `[fedsac]` (the local recipe is the silos').
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    /// α: complementarity weight.
    pub alpha: f64,
    /// β: similarity weight.
    pub beta: f64,
    /// α is 0 once t / rounds exceeds this.
    pub alpha_cutoff: f64,
    /// Principal angles between subspaces.
    pub principal_angles: PrincipalAngles,
    /// Silos per round (0 or ≥ silos: all).
    pub cohort_size: usize,
    /// Score the model right after local training instead of the aggregate.
    pub score_trained: bool,
    /// A sample count counts at most this many times the lower median of the round's
    /// (insiders' review: the size prior otherwise hands a member that registered
    /// `n_train = 10^12` every silo's mixing weight); `None`: as registered.
    pub size_cap: Option<f64>,
    /// A sender's move from the personalised model it started from counts at most this many
    /// times the round's median move (`coord::robust::clip_moves`); `None`: no bound.
    pub update_clip: Option<f64>,
    /// How a row of the graph combines the senders' models.
    pub aggregator: crate::coord::robust::Aggregator,
    /// `TrimmedMean`: the share of a row's weight cut from each end; `Krum`: the share of a
    /// row's senders taken to be hostile.
    pub trim: f64,
}

/// What a silo gets for a round.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    /// The round (the run's round count for the final model).
    pub round: u64,
    /// θ̃^i: the model to train from, or once the run is over the model to score.
    pub params: Arc<Vec<f32>>,
    /// c^i: the regulariser's direction, if the silo was aggregated last round.
    pub direction: Option<Arc<Vec<f32>>>,
    /// Whether the silo is in this round's cohort (trains and sends).
    pub train: bool,
}

/// The answer to a fetch.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchAnswer {
    /// The silo's assignment.
    Now(Assignment),
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
    /// Its cohort.
    pub cohort: Vec<usize>,
    /// Cohort members whose model was aggregated.
    pub senders: Vec<usize>,
    /// The α used (after the schedule).
    pub alpha: f64,
    /// The collaboration graph's rows, one per sender, then one per stale member (columns:
    /// senders, then stale members).
    pub graph: Vec<Vec<f64>>,
    /// Cohort members that sent nothing this round but trained recently: their last trained
    /// model stands in for them in the graph (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stale: Vec<usize>,
    /// Closed at the deadline rather than with every cohort member.
    pub timed_out: bool,
    /// Members whose model `Krum` left out of every row (their entries in `graph` were not
    /// mixed; absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<usize>,
}

/// What the coordinator knows.
#[derive(Debug)]
pub struct FedsacServer {
    settings: Settings,
    /// T: rounds in the run.
    rounds: u64,
    /// t: the round open now (= rounds completed).
    round: u64,
    sampler: StdRng,
    /// n^i of every silo, once registered, and the silos in the run (every silo, unless
    /// joining was closed without some). Cohorts are drawn over the members.
    joining: Joining<u64>,
    /// θ^0: similarity is measured on θ − θ^0.
    init: Arc<Vec<f32>>,
    /// θ̃^i.
    params: Vec<Arc<Vec<f32>>>,
    /// c^i.
    directions: Vec<Option<Arc<Vec<f32>>>>,
    /// θ^i right after its last local training (scored with `score_trained`).
    trained: Vec<Option<Arc<Vec<f32>>>>,
    /// The round of each silo's last training this coordinator saw, and its subspace (not
    /// checkpointed: a restarted coordinator counts nobody stale until they send again).
    seen: Vec<Option<(u64, Option<Subspace>)>>,
    /// The open round's cohort, increasing; empty until the run started.
    cohort: Vec<usize>,
    /// Models and subspaces received for the open round (not checkpointed).
    pending: BTreeMap<usize, (Arc<Vec<f32>>, Option<Subspace>)>,
}

fn err(e: FedsacError) -> String {
    e.to_string()
}

impl FedsacServer {
    /// A coordinator for `nodes` silos over `rounds` rounds, every silo starting from
    /// `initial`; the cohort stream is seeded with `sampler_seed`.
    pub fn new(
        settings: Settings,
        nodes: usize,
        rounds: u64,
        sampler_seed: u64,
        initial: Vec<f32>,
    ) -> Result<Self, String> {
        if nodes == 0 {
            return Err("fedsac needs the number of silos (`nodes` ≥ 1)".into());
        }
        let init = Arc::new(initial);
        Ok(Self {
            settings,
            rounds,
            round: 0,
            sampler: StdRng::seed_from_u64(sampler_seed),
            joining: Joining::new(nodes, 1),
            params: (0..nodes).map(|_| init.clone()).collect(),
            init,
            directions: vec![None; nodes],
            trained: vec![None; nodes],
            seen: vec![None; nodes],
            cohort: Vec::new(),
            pending: BTreeMap::new(),
        })
    }

    /// The round open now.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The model silo `i` is scored with: θ̃^i, or with `score_trained` the model its last
    /// local training produced (θ̃^i before its first).
    pub fn scored(&self, i: usize) -> Option<Arc<Vec<f32>>> {
        match (self.trained.get(i)?, self.settings.score_trained) {
            (Some(t), true) => Some(t.clone()),
            _ => self.params.get(i).cloned(),
        }
    }

    /// Silos in this run.
    pub fn nodes(&self) -> usize {
        self.joining.nodes()
    }

    /// Parameters per model.
    pub fn num_params(&self) -> usize {
        self.init.len()
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

    /// The silos in the run, ascending (empty before it started).
    pub fn members(&self) -> &[usize] {
        self.joining.members()
    }

    fn in_run(&self, i: usize) -> bool {
        self.joining.in_run(i)
    }

    /// Starts the run with the silos registered so far, without waiting for the rest (the
    /// driver's join deadline passed), and draws round 0's cohort among them. Returns the
    /// silos left out; each is told to train alone if it registers later. Refused with nobody
    /// registered or once the run started.
    pub fn close_joining(&mut self) -> Result<Vec<usize>, String> {
        let left = self.joining.close().map_err(|e| match e {
            CloseRefused::Started => "the run has already started",
            CloseRefused::TooFew { .. } => "no silo has registered",
        })?;
        self.draw();
        Ok(left)
    }

    /// The open round's cohort.
    pub fn cohort(&self) -> &[usize] {
        &self.cohort
    }

    /// The next cohort from the stream, as the simulator draws it (over the run's members:
    /// with every silo in the run, exactly the simulator's cohorts).
    fn draw(&mut self) {
        let members = self.joining.members();
        self.cohort = fedsac::draw_cohort(&mut self.sampler, members, self.settings.cohort_size);
    }

    /// Records silo `index`'s sample count; the last registration draws round 0's cohort. A
    /// silo that registers again must give the same count once the run started. A silo that
    /// registers after joining closed without it is recorded, and its fetches answered
    /// [`FetchAnswer::Alone`].
    pub fn register(&mut self, index: usize, n_train: u64) -> Result<(), String> {
        let refused = |e| match e {
            Refused::NotASilo { nodes } => {
                format!("silo {index} is not one of the {nodes} silos of this run")
            }
            Refused::Changed { old } => format!(
                "silo {index} registered {old} samples before and now {n_train}; sizes are fixed for the run"
            ),
        };
        self.joining.check(index).map_err(refused)?;
        if n_train == 0 {
            return Err("n_train = 0; a silo needs at least 1 sample".into());
        }
        if self.joining.register(index, n_train).map_err(refused)? {
            self.draw();
        }
        Ok(())
    }

    /// Records cohort member `index`'s trained model and subspace rows for `round`. Refused:
    /// a silo outside the cohort, another round, a model of the wrong size, or rows that are
    /// not an orthonormal basis. Returns true when every cohort member has sent.
    pub fn update(
        &mut self,
        index: usize,
        round: u64,
        params: Arc<Vec<f32>>,
        subspace: Option<Vec<Vec<f64>>>,
    ) -> Result<bool, String> {
        if !self.ready() {
            return Err("not every silo has registered yet".into());
        }
        if round != self.round {
            return Err(format!(
                "update for round {round}, but round {} is open",
                self.round
            ));
        }
        if !self.in_run(index) {
            return Err(format!(
                "silo {index} registered after the run started without it: it trains alone"
            ));
        }
        if !self.cohort.contains(&index) {
            return Err(format!("silo {index} is not in round {round}'s cohort"));
        }
        if params.len() != self.init.len() {
            return Err(format!(
                "{} parameters where the model has {}",
                params.len(),
                self.init.len()
            ));
        }
        let q = subspace
            .map(Subspace::from_rows)
            .transpose()
            .map_err(|e| format!("feature subspace: {e}"))?;
        // Subspaces are compared pairwise at closing: one of another width or rank would fail
        // the whole round, so it is refused here.
        if let Some(q) = &q
            && let Some(other) = self.pending.values().find_map(|(_, o)| o.as_ref())
            && (other.dim(), other.rank()) != (q.dim(), q.rank())
        {
            return Err(format!(
                "a subspace of {} directions in {} dimensions; this round's have {} in {}",
                q.rank(),
                q.dim(),
                other.rank(),
                other.dim()
            ));
        }
        self.pending.insert(index, (params, q));
        Ok(self.all_in())
    }

    /// Every cohort member has sent for the open round.
    pub fn all_in(&self) -> bool {
        self.ready() && self.cohort.iter().all(|i| self.pending.contains_key(i))
    }

    /// The cohort members the open round still awaits (none before the run started).
    pub fn waiting(&self) -> Vec<usize> {
        if !self.ready() {
            return Vec::new();
        }
        self.cohort
            .iter()
            .copied()
            .filter(|i| !self.pending.contains_key(i))
            .collect()
    }

    /// Closes the open round: the graph over the senders (size prior, similarity,
    /// complementarity, scheduled α), each sender's personalised model and direction.
    pub fn close(&mut self, timed_out: bool) -> Result<RoundLog, String> {
        if !self.ready() {
            return Err("no round is open before every silo registered".into());
        }
        let senders: Vec<usize> = self.pending.keys().copied().collect();
        let stale = self.stale();
        let s = &self.settings;
        // A sender's move from the model it started from, bounded by `update_clip`.
        let sent: Vec<&[f32]> = senders
            .iter()
            .map(|i| self.pending[i].0.as_slice())
            .collect();
        let bases: Vec<&[f32]> = senders.iter().map(|&i| self.params[i].as_slice()).collect();
        let clipped = crate::coord::robust::clip_moves(&sent, &bases, s.update_clip);
        let views: Vec<&[f32]> = sent
            .iter()
            .zip(&clipped)
            .map(|(m, c)| c.as_deref().unwrap_or(m))
            .chain(
                stale
                    .iter()
                    .filter_map(|&i| self.trained[i].as_deref().map(|t| t.as_slice())),
            )
            .collect();
        let counts: Vec<u64> = senders
            .iter()
            .chain(&stale)
            .map(|&i| self.joining.size(i).unwrap_or(0))
            .collect();
        let (counts, _) = crate::coord::robust::cap_sizes(&counts, s.size_cap);
        let subspaces: Vec<Option<Subspace>> = senders
            .iter()
            .map(|i| self.pending[i].1.clone())
            .chain(
                stale
                    .iter()
                    .map(|&i| self.seen[i].as_ref().and_then(|s| s.1.clone())),
            )
            .collect();
        let settings = GraphSettings {
            alpha: s.alpha,
            alpha_cutoff: s.alpha_cutoff,
            beta: s.beta,
            principal_angles: s.principal_angles,
        };
        let RoundGraph { alpha, graph } = fedsac::round_graph(
            &views,
            &self.init,
            &counts,
            &subspaces,
            &settings,
            self.round as usize,
            self.rounds as usize,
        )
        .map_err(err)?;
        // Krum judges the round's models once; each row then mixes the kept (its own weights,
        // renormalised), the direction too.
        let krum = (s.aggregator == Aggregator::Krum)
            .then(|| crate::coord::robust::krum_keep(&views, s.trim));
        // `views`' columns are the senders, then the stale members (each has a trained model).
        let dropped: Vec<usize> = senders
            .iter()
            .chain(&stale)
            .zip(krum.iter().flatten())
            .filter(|(_, k)| !**k)
            .map(|(&i, _)| i)
            .collect();
        let mixed = graph
            .iter()
            .take(senders.len())
            .map(|row| match (s.aggregator, &krum) {
                (Aggregator::Mean, _) => fedsac::personalise(&views, row),
                (_, Some(keep)) => {
                    fedsac::personalise(&views, &crate::coord::robust::kept_weights(row, keep))
                }
                (rule, None) => Ok((
                    crate::coord::robust::combine(&views, row, rule, s.trim),
                    fedsac::direction(&views, row)?,
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        for (&i, (model, dir)) in senders.iter().zip(mixed) {
            self.seen[i] = Some((self.round, self.pending[&i].1.clone()));
            self.trained[i] = Some(self.pending[&i].0.clone());
            self.params[i] = Arc::new(model);
            self.directions[i] = Some(Arc::new(dir));
        }
        for (i, d) in self.directions.iter_mut().enumerate() {
            if !self.pending.contains_key(&i) {
                *d = None;
            }
        }
        let log = RoundLog {
            round: self.round,
            cohort: self.cohort.clone(),
            senders,
            alpha,
            graph,
            stale,
            timed_out,
            dropped,
        };
        self.pending.clear();
        self.round += 1;
        if self.round < self.rounds {
            self.draw();
        }
        Ok(log)
    }

    /// The open round's cohort members that sent nothing but trained within the last
    /// [`STALE_ROUNDS`] rounds: a round that closes with few senders still mixes each with its
    /// own kind, not with whoever happened to send (found under faults: a silo whose group
    /// was silent mixed with the other group's only sender, and ended 50 points down).
    fn stale(&self) -> Vec<usize> {
        self.cohort
            .iter()
            .copied()
            .filter(|i| !self.pending.contains_key(i))
            .filter(|&i| {
                self.trained[i].is_some()
                    && self.seen[i]
                        .as_ref()
                        .is_some_and(|(r, _)| r + STALE_ROUNDS >= self.round)
            })
            .collect()
    }

    /// Answers silo `index`'s fetch of round `round`: its model, direction and whether it is
    /// in the cohort; once the run is over, the model it is scored with. An older round is
    /// answered with the open one.
    pub fn fetch(&self, index: usize, round: u64) -> Result<FetchAnswer, String> {
        if index >= self.nodes() {
            return Err(format!(
                "silo {index} is not one of the {} silos of this run",
                self.nodes()
            ));
        }
        if !self.ready() {
            return Ok(FetchAnswer::Hold);
        }
        if !self.in_run(index) {
            return Ok(FetchAnswer::Alone);
        }
        if round > self.round {
            return Ok(FetchAnswer::Hold);
        }
        let over = self.round >= self.rounds;
        let params = match (&self.trained[index], over && self.settings.score_trained) {
            (Some(t), true) => t.clone(),
            _ => self.params[index].clone(),
        };
        Ok(FetchAnswer::Now(Assignment {
            round: self.round,
            params,
            direction: if over {
                None
            } else {
                self.directions[index].clone()
            },
            train: !over && self.cohort.contains(&index),
        }))
    }

    /// The checkpoint's bytes: versioned header, then round, sizes, models and directions
    /// (the cohort stream is replayed from its seed on restore).
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = crate::store::header(MAGIC, VERSION);
        let body = Saved {
            round: self.round,
            sizes: self.joining.sizes().to_vec(),
            init: self.init.to_vec(),
            params: self.params.iter().map(|m| m.to_vec()).collect(),
            directions: self
                .directions
                .iter()
                .map(|d| d.as_ref().map(|d| d.to_vec()))
                .collect(),
            trained: self
                .trained
                .iter()
                .map(|d| d.as_ref().map(|d| d.to_vec()))
                .collect(),
            members: self.members().to_vec(),
        };
        bincode::serde::encode_into_std_write(&body, &mut out, bincode::config::standard())
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Restores a checkpoint (header, version, body and shapes checked; no pending updates):
    /// the cohort stream is replayed to the saved round. A version 1 checkpoint (before
    /// joining could close) restores with every registered silo in the run once all were.
    pub fn decode(
        settings: Settings,
        rounds: u64,
        sampler_seed: u64,
        bytes: &[u8],
    ) -> Result<Self, String> {
        let s = crate::store::decode_migrating::<Saved, SavedV1>(bytes, MAGIC, VERSION, 1)?;
        let n = s.sizes.len();
        let d = s.init.len();
        if !s.members.is_sorted_by(|a, b| a < b)
            || s.members
                .iter()
                .any(|&i| s.sizes.get(i).is_none_or(Option::is_none))
        {
            return Err(format!(
                "run members {:?} are not registered silos of 0..{n}",
                s.members
            ));
        }
        if n == 0
            || s.params.len() != n
            || s.directions.len() != n
            || s.trained.len() != n
            || s.params.iter().any(|p| p.len() != d)
            || s.directions
                .iter()
                .chain(&s.trained)
                .flatten()
                .any(|p| p.len() != d)
        {
            return Err("models of the wrong number or size".into());
        }
        let mut me = Self::new(settings, n, rounds, sampler_seed, s.init)?;
        let members = (!s.members.is_empty()).then_some(s.members);
        me.joining = Joining::restore(s.sizes, members, 1);
        me.params = s.params.into_iter().map(Arc::new).collect();
        me.directions = s.directions.into_iter().map(|d| d.map(Arc::new)).collect();
        me.trained = s.trained.into_iter().map(|d| d.map(Arc::new)).collect();
        if me.ready() {
            for _ in 0..=s.round.min(rounds.saturating_sub(1)) {
                me.draw();
            }
        }
        me.round = s.round;
        Ok(me)
    }
}

/// How old a member's last trained model may be to stand in for it in a round it sent nothing.
const STALE_ROUNDS: u64 = 5;

const MAGIC: &[u8; 8] = b"FEDSACC1";
/// 2: the run's members (joining can close without some silos).
const VERSION: u32 = 2;

#[derive(Serialize, Deserialize)]
struct Saved {
    round: u64,
    sizes: Vec<Option<u64>>,
    init: Vec<f32>,
    params: Vec<Vec<f32>>,
    directions: Vec<Option<Vec<f32>>>,
    trained: Vec<Option<Vec<f32>>>,
    members: Vec<usize>,
}

/// Version 1: the run started once every silo registered, with all of them.
#[derive(Serialize, Deserialize)]
struct SavedV1 {
    round: u64,
    sizes: Vec<Option<u64>>,
    init: Vec<f32>,
    params: Vec<Vec<f32>>,
    directions: Vec<Option<Vec<f32>>>,
    trained: Vec<Option<Vec<f32>>>,
}

impl From<SavedV1> for Saved {
    fn from(v: SavedV1) -> Self {
        let members = if v.sizes.iter().all(Option::is_some) {
            (0..v.sizes.len()).collect()
        } else {
            Vec::new()
        };
        Saved {
            round: v.round,
            sizes: v.sizes,
            init: v.init,
            params: v.params,
            directions: v.directions,
            trained: v.trained,
            members,
        }
    }
}

#[cfg(test)]
mod tests;
