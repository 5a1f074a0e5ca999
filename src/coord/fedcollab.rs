//! FedCollab (Bao et al., ICML 2023; `../shared/specs/fedcollab.md`): choosing who trains with
//! whom from the silos' sample counts and pairwise distribution distances.
//!
//! Owns: the collaboration-structure objective (spec §2), Algorithm 2 with random restarts and
//! its tie-breaking (spec §4), placing a newcomer (spec §5), and the transport-free parts of the
//! pairwise discriminator protocol (spec §3.2): the discriminator-train split, the label-branch
//! scale, equal pair averaging, the evaluate/early-stop schedule, turning the best balanced
//! accuracy into a distance, and assembling the distance matrix. Also the `[fedcollab]`
//! hyperparameters of a scenario.
//! Must not: touch tensors, sockets, clocks or threads (std, rand and serde only). Training the
//! discriminator and the coalition models is the driver's work (`sim::fedcollab`); every random
//! choice here comes from an RNG the caller passes in.

use rand::Rng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

/// Relative tolerance of a strict improvement (spec §4, §8 item 8): a move is taken only when
/// `v < best − REL_TOL · max(1, |best|)`, so floating noise never creates moves or cycles.
pub const REL_TOL: f64 = 1e-12;

/// Errors of the FedCollab core. Each names the value at fault and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FedCollabError {
    /// No clients at all.
    #[error("sizes must list at least one client, got none")]
    NoClients,
    /// A client with no training data (spec §8 item 16: such clients are left out upstream).
    #[error("client {client} has size 0; every client needs at least 1 training sample")]
    ZeroSize {
        /// The client.
        client: usize,
    },
    /// The distance matrix is not `n × n`.
    #[error(
        "distances must be a {n}x{n} matrix (one row and column per client), but row {row} has {len} entries (of {rows} rows)"
    )]
    Shape {
        /// Clients.
        n: usize,
        /// Rows given.
        rows: usize,
        /// The first row at fault (or `rows` when the row count is wrong).
        row: usize,
        /// Its length.
        len: usize,
    },
    /// A NaN or infinite distance.
    #[error("distance d[{i}][{j}] = {value} must be a finite number")]
    NonFinite {
        /// Row.
        i: usize,
        /// Column.
        j: usize,
        /// The value.
        value: f64,
    },
    /// C outside `[0, ∞)`.
    #[error("capacity C must be a finite number >= 0, got {0}")]
    Capacity(f64),
    /// A solver knob that must be at least 1.
    #[error("{name} must be at least 1, got 0")]
    ZeroKnob {
        /// `restarts` or `max_passes`.
        name: &'static str,
    },
    /// A label vector of the wrong length.
    #[error("labels must have one entry per client ({expected}), got {got}")]
    Labels {
        /// Clients.
        expected: usize,
        /// Entries given.
        got: usize,
    },
    /// Coalitions that are not a partition of the clients they should cover.
    #[error("coalitions must cover each of clients 0..{n} exactly once{except}: {reason}")]
    NotAPartition {
        /// Clients.
        n: usize,
        /// `" except the newcomer k"` when one client is meant to be missing.
        except: String,
        /// What is wrong.
        reason: String,
    },
}

/// How pairwise distances are measured (spec §3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Distance {
    /// The paper's C-divergence estimate: a discriminator trained federatedly by each pair
    /// (Algorithm 1, spec §3.2). The default.
    Discriminator,
    /// Total variation between training label histograms. **Debug/test only** (spec §8 item 12):
    /// exact for pure label shift, blind to feature and concept shift, and it reveals label
    /// histograms, so it is never the default.
    LabelTv,
}

/// `[fedcollab]`: FedCollab's hyperparameters; defaults are the official scripts' (spec §3.2,
/// §4, §8 items 7-9). The FL inside coalitions uses the scenario's `[train]` settings, like the
/// FedAvg baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FedCollabConfig {
    /// C, the model-capacity constant of the generalisation term (spec §2; paper: 10 for
    /// FMNIST and CIFAR-10, 8 for CIFAR-100). In absolute-sample units (spec §8 item 7).
    pub capacity: f64,
    /// Random restarts of Algorithm 2 (spec §4; code: 100).
    pub restarts: usize,
    /// Passes per restart before giving up on convergence (spec §4; code: 100).
    pub max_passes: usize,
    /// How distances are measured.
    pub distance: Distance,
    /// Hidden width of the discriminator MLP (spec §3.2: 200; economy mode: 64).
    pub disc_hidden: usize,
    /// Plain-SGD learning rate of the discriminator (spec §3.2: 0.01 for FMNIST and CIFAR-10).
    pub disc_lr: f64,
    /// Discriminator mini-batch (spec §3.2: 32).
    pub disc_batch_size: usize,
    /// SGD steps each side takes per round before averaging (spec §3.2: 1).
    pub disc_local_steps: usize,
    /// Evaluate every this many rounds (spec §3.2: 10; first evaluation after round 0).
    pub disc_eval_every: usize,
    /// Stop after this many evaluations without a strict improvement (spec §3.2: 10; 0 never
    /// stops early).
    pub disc_patience: usize,
    /// Most rounds per pair (spec §3.2: 2000).
    pub disc_max_rounds: usize,
}

impl Default for FedCollabConfig {
    fn default() -> Self {
        Self {
            capacity: 10.0,
            restarts: 100,
            max_passes: 100,
            distance: Distance::Discriminator,
            disc_hidden: 200,
            disc_lr: 0.01,
            disc_batch_size: 32,
            disc_local_steps: 1,
            disc_eval_every: 10,
            disc_patience: 10,
            disc_max_rounds: 2000,
        }
    }
}

impl FedCollabConfig {
    /// Checks every field; the error names the field, the allowed range and the value.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.capacity.is_finite() && self.capacity >= 0.0) {
            return Err(format!(
                "capacity must be a finite number >= 0, got {}",
                self.capacity
            ));
        }
        if !(self.disc_lr.is_finite() && self.disc_lr > 0.0) {
            return Err(format!("disc_lr must be positive, got {}", self.disc_lr));
        }
        for (name, v) in [
            ("restarts", self.restarts),
            ("max_passes", self.max_passes),
            ("disc_hidden", self.disc_hidden),
            ("disc_batch_size", self.disc_batch_size),
            ("disc_local_steps", self.disc_local_steps),
            ("disc_eval_every", self.disc_eval_every),
            ("disc_max_rounds", self.disc_max_rounds),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1, got 0"));
            }
        }
        Ok(())
    }

    /// The solver knobs of this section.
    pub fn solver(&self) -> SolverConfig {
        SolverConfig {
            restarts: self.restarts,
            max_passes: self.max_passes,
        }
    }
}

/// Restarts and passes of Algorithm 2 (spec §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SolverConfig {
    /// Independent runs from all-singletons, sharing one RNG stream (code: 100).
    pub restarts: usize,
    /// Passes per run; a run stops earlier after a pass without a move (code: 100).
    pub max_passes: usize,
}

impl Default for SolverConfig {
    fn default() -> Self {
        Self {
            restarts: 100,
            max_passes: 100,
        }
    }
}

/// One collaboration structure with its objective.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Structure {
    /// The coalitions in canonical order: members ascending, coalitions by smallest member.
    pub coalitions: Vec<Vec<usize>>,
    /// L, the mean over clients of their costs (spec §2).
    pub objective: f64,
    /// Passes run, the last (moveless) one included: a run that starts at its local optimum
    /// takes 1.
    pub passes: usize,
    /// False when `max_passes` ran out before a pass without a move.
    pub converged: bool,
}

/// What [`Problem::solve`] returns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Solution {
    /// The run with the strictly lowest objective (the first one wins ties).
    pub best: Structure,
    /// Runs made.
    pub restarts: usize,
    /// Runs that reached the best objective (within [`REL_TOL`]).
    pub hits: usize,
}

/// A FedCollab instance: client sizes m, prepared distances D and the capacity C.
///
/// The objective (spec §2) of a partition with coalition `k = p(i)` of total size M_k is the
/// mean over clients of `cost_i = C/√M_k + Σ_{j∈k} (m_j/M_k)·d_ij`.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    sizes: Vec<u64>,
    d: Vec<Vec<f64>>,
    capacity: f64,
    asymmetric: Vec<(usize, usize)>,
}

/// The stream tag (mixed into the run seed) of Algorithm 2's restarts.
pub const SOLVE_TAG: u64 = 0xFC01_0005;

/// Gap above which `d_ij` and `d_ji` count as different reports.
const ASYMMETRY: f64 = 1e-9;

impl Problem {
    /// Builds an instance from the sizes m_i, raw distance reports and C.
    ///
    /// The distances are prepared as the solver needs them (spec §2, §8 items 3 and 16): the
    /// mean of `d_ij` and `d_ji` (pairs that differ are kept in
    /// [`asymmetric_pairs`](Self::asymmetric_pairs)), negatives clamped to 0 (a below-chance
    /// discriminator is noise, not distance), values above 1 clipped to 1, and `d_ii = 0`.
    pub fn new(
        sizes: &[u64],
        distances: &[Vec<f64>],
        capacity: f64,
    ) -> Result<Self, FedCollabError> {
        let n = sizes.len();
        if n == 0 {
            return Err(FedCollabError::NoClients);
        }
        if let Some(client) = sizes.iter().position(|&m| m == 0) {
            return Err(FedCollabError::ZeroSize { client });
        }
        if distances.len() != n {
            return Err(FedCollabError::Shape {
                n,
                rows: distances.len(),
                row: distances.len(),
                len: distances.first().map_or(0, Vec::len),
            });
        }
        if let Some((row, r)) = distances.iter().enumerate().find(|(_, r)| r.len() != n) {
            return Err(FedCollabError::Shape {
                n,
                rows: n,
                row,
                len: r.len(),
            });
        }
        for (i, row) in distances.iter().enumerate() {
            for (j, &value) in row.iter().enumerate() {
                if !value.is_finite() {
                    return Err(FedCollabError::NonFinite { i, j, value });
                }
            }
        }
        if !(capacity.is_finite() && capacity >= 0.0) {
            return Err(FedCollabError::Capacity(capacity));
        }
        let mut asymmetric = Vec::new();
        let mut d = vec![vec![0.0; n]; n];
        for i in 0..n {
            for j in i + 1..n {
                let (a, b) = (distances[i][j], distances[j][i]);
                if (a - b).abs() > ASYMMETRY {
                    asymmetric.push((i, j));
                }
                let v = ((a + b) / 2.0).clamp(0.0, 1.0);
                d[i][j] = v;
                d[j][i] = v;
            }
        }
        Ok(Self {
            sizes: sizes.to_vec(),
            d,
            capacity,
            asymmetric,
        })
    }

    /// The same instance with another C (for sweeps, spec §8 item 7).
    pub fn with_capacity(&self, capacity: f64) -> Result<Self, FedCollabError> {
        if !(capacity.is_finite() && capacity >= 0.0) {
            return Err(FedCollabError::Capacity(capacity));
        }
        Ok(Self {
            capacity,
            ..self.clone()
        })
    }

    /// Number of clients N.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Always false: an instance has at least one client.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// C.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The sizes m_i.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// The prepared distances (symmetric, in [0, 1], zero diagonal).
    pub fn distances(&self) -> &[Vec<f64>] {
        &self.d
    }

    /// Pairs `(i, j)`, `i < j`, whose two reports differed (their mean was used).
    pub fn asymmetric_pairs(&self) -> &[(usize, usize)] {
        &self.asymmetric
    }

    /// Each client's cost `C/√M_k + Σ_{j∈k} (m_j/M_k)·d_ij` under coalition labels `labels`
    /// (any ids; clients with equal ids share a coalition). Spec §2, eq. 10 first line.
    pub fn client_costs(&self, labels: &[usize]) -> Result<Vec<f64>, FedCollabError> {
        self.check_labels(labels)?;
        let n = self.len();
        Ok((0..n)
            .map(|i| {
                let members: Vec<usize> = (0..n).filter(|&j| labels[j] == labels[i]).collect();
                let mass: u64 = members.iter().map(|&j| self.sizes[j]).sum();
                let mass = mass as f64;
                let shift: f64 = members
                    .iter()
                    .map(|&j| self.sizes[j] as f64 * self.d[i][j])
                    .sum();
                self.capacity / mass.sqrt() + shift / mass
            })
            .collect())
    }

    /// L: the mean of [`client_costs`](Self::client_costs) (the code's "unweighted average";
    /// the golden convention, spec §2).
    pub fn objective(&self, labels: &[usize]) -> Result<f64, FedCollabError> {
        let costs = self.client_costs(labels)?;
        Ok(costs.iter().sum::<f64>() / costs.len() as f64)
    }

    /// L of a structure given as coalitions (a partition of `0..N`).
    pub fn objective_of(&self, coalitions: &[Vec<usize>]) -> Result<f64, FedCollabError> {
        self.objective(&labels_of(self.len(), coalitions)?)
    }

    /// One run of Algorithm 2 (spec §4) whose every pass visits the clients in a fresh uniform
    /// random order drawn from `rng` (a shuffle of `0..N`).
    pub fn greedy<R: Rng + ?Sized>(&self, max_passes: usize, rng: &mut R) -> Structure {
        self.run_greedy(max_passes, |order| order.shuffle(rng))
    }

    /// One run of Algorithm 2 visiting clients in the order `0..N` every pass: deterministic,
    /// and the golden file's `deterministic_identity_order_greedy`.
    pub fn greedy_identity(&self, max_passes: usize) -> Structure {
        self.run_greedy(max_passes, |_| {})
    }

    /// Algorithm 2 with restarts (spec §4): `cfg.restarts` runs of [`greedy`](Self::greedy)
    /// sharing `rng`; keeps the strictly lowest objective, the first run winning ties.
    pub fn solve<R: Rng + ?Sized>(
        &self,
        cfg: &SolverConfig,
        rng: &mut R,
    ) -> Result<Solution, FedCollabError> {
        if cfg.restarts == 0 {
            return Err(FedCollabError::ZeroKnob { name: "restarts" });
        }
        if cfg.max_passes == 0 {
            return Err(FedCollabError::ZeroKnob { name: "max_passes" });
        }
        let runs: Vec<Structure> = (0..cfg.restarts)
            .map(|_| self.greedy(cfg.max_passes, rng))
            .collect();
        let mut best = 0;
        for (r, run) in runs.iter().enumerate().skip(1) {
            if improves(run.objective, runs[best].objective) {
                best = r;
            }
        }
        let top = runs[best].objective;
        let hits = runs
            .iter()
            .filter(|r| (r.objective - top).abs() <= REL_TOL * top.abs().max(1.0))
            .count();
        Ok(Solution {
            best: runs[best].clone(),
            restarts: cfg.restarts,
            hits,
        })
    }

    /// [`solve`](Self::solve) with the run's restarts stream: the RNG seeded from the run
    /// seed and [`SOLVE_TAG`], so `simulate` and the networked coordinator find the same
    /// structure from the same distances.
    pub fn solve_for_run(&self, cfg: &SolverConfig, seed: u64) -> Result<Solution, FedCollabError> {
        let mut rng =
            <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(crate::ids::stream_seed(
                seed ^ SOLVE_TAG,
                crate::ids::NodeId(u32::MAX),
                crate::ids::Stream::Sampling,
            ));
        self.solve(cfg, &mut rng)
    }

    /// Where a newcomer goes (spec §5, "recommended exact procedure" step 3): `self` covers the
    /// N+1 clients, `coalitions` partitions all of them but `newcomer`. Starting with the
    /// newcomer alone, joining each coalition is evaluated in the given order and the strictly
    /// best is kept (same strictness as Algorithm 2). Returns the index into `coalitions` to
    /// join, or `None` when staying alone is best.
    pub fn place_newcomer(
        &self,
        coalitions: &[Vec<usize>],
        newcomer: usize,
    ) -> Result<Option<usize>, FedCollabError> {
        let n = self.len();
        let bad = |reason: String| FedCollabError::NotAPartition {
            n,
            except: format!(" except the newcomer {newcomer}"),
            reason,
        };
        if newcomer >= n {
            return Err(bad(format!("newcomer {newcomer} is not a client")));
        }
        let mut labels = vec![usize::MAX; n];
        for (k, c) in coalitions.iter().enumerate() {
            for &i in c {
                if i >= n || i == newcomer || labels[i] != usize::MAX {
                    return Err(bad(format!("client {i} is out of range or listed twice")));
                }
                labels[i] = k;
            }
        }
        if let Some(i) = (0..n).find(|&i| i != newcomer && labels[i] == usize::MAX) {
            return Err(bad(format!("client {i} is in no coalition")));
        }
        labels[newcomer] = coalitions.len();
        let mut best_val = self.objective(&labels)?;
        let mut best = None;
        for k in 0..coalitions.len() {
            labels[newcomer] = k;
            let v = self.objective(&labels)?;
            if improves(v, best_val) {
                best_val = v;
                best = Some(k);
            }
        }
        Ok(best)
    }

    fn check_labels(&self, labels: &[usize]) -> Result<(), FedCollabError> {
        if labels.len() != self.len() {
            return Err(FedCollabError::Labels {
                expected: self.len(),
                got: labels.len(),
            });
        }
        Ok(())
    }

    /// A coalition's contribution to N·L: `n_k·C/√M_k + W_k/M_k`, 0 when empty.
    fn term(&self, count: usize, mass: u64, w: f64) -> f64 {
        if count == 0 {
            return 0.0;
        }
        let mass = mass as f64;
        count as f64 * self.capacity / mass.sqrt() + w / mass
    }

    /// W_k = Σ_{i∈k} Σ_{j∈k} m_j·d_ij over the clients labelled `label`, from scratch.
    fn w_of(&self, labels: &[usize], label: usize) -> f64 {
        let members: Vec<usize> = (0..self.len()).filter(|&j| labels[j] == label).collect();
        let mut w = 0.0;
        for &i in &members {
            for &j in &members {
                w += self.sizes[j] as f64 * self.d[i][j];
            }
        }
        w
    }

    /// Algorithm 2 (spec §4) with the incremental evaluator: coalition counts, masses and W_k
    /// are kept per label, so each candidate move costs O(1) after an O(N) sweep per visited
    /// client. Labels are `0..N`, all singletons at the start; candidates are scanned in
    /// ascending label order and replace the incumbent only on a strict improvement.
    fn run_greedy(&self, max_passes: usize, mut reorder: impl FnMut(&mut [usize])) -> Structure {
        let n = self.len();
        let m = &self.sizes;
        let mut p: Vec<usize> = (0..n).collect();
        let mut count = vec![1usize; n];
        let mut mass: Vec<u64> = m.clone();
        let mut w = vec![0.0f64; n];
        let mut s = vec![0.0f64; n];
        let mut order: Vec<usize> = (0..n).collect();
        let mut passes = 0;
        let mut converged = false;
        while passes < max_passes {
            passes += 1;
            for (k, o) in order.iter_mut().enumerate() {
                *o = k;
            }
            reorder(&mut order);
            let mut moved = false;
            for &q in &order {
                let a = p[q];
                // s[c]: how much W_c changes when q joins (or leaves) label c.
                s.fill(0.0);
                for j in (0..n).filter(|&j| j != q) {
                    s[p[j]] += m[j] as f64 * self.d[q][j] + m[q] as f64 * self.d[j][q];
                }
                let terms: Vec<f64> = (0..n).map(|c| self.term(count[c], mass[c], w[c])).collect();
                let total: f64 = terms.iter().sum();
                let leave = self.term(count[a] - 1, mass[a] - m[q], w[a] - s[a]) - terms[a];
                let mut best_val = total / n as f64;
                let mut best = a;
                for c in (0..n).filter(|&c| c != a) {
                    let join = self.term(count[c] + 1, mass[c] + m[q], w[c] + s[c]) - terms[c];
                    let v = (total + (leave + join)) / n as f64;
                    if improves(v, best_val) {
                        best_val = v;
                        best = c;
                    }
                }
                if best != a {
                    p[q] = best;
                    count[a] -= 1;
                    mass[a] -= m[q];
                    count[best] += 1;
                    mass[best] += m[q];
                    w[a] = self.w_of(&p, a);
                    w[best] = self.w_of(&p, best);
                    moved = true;
                }
            }
            if !moved {
                converged = true;
                break;
            }
        }
        let objective = self
            .objective(&p)
            .expect("p has one label per client by construction");
        Structure {
            coalitions: coalitions_of(&p),
            objective,
            passes,
            converged,
        }
    }
}

/// True when `v` strictly improves on `best` beyond floating noise (spec §8 item 8).
fn improves(v: f64, best: f64) -> bool {
    v < best - REL_TOL * best.abs().max(1.0)
}

/// The canonical coalitions of a label vector: members ascending, coalitions ordered by their
/// smallest member (spec §4, "canonical output").
pub fn coalitions_of(labels: &[usize]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut slot: Vec<(usize, usize)> = Vec::new();
    for (i, &l) in labels.iter().enumerate() {
        match slot.iter().find(|(label, _)| *label == l) {
            Some(&(_, k)) => out[k].push(i),
            None => {
                slot.push((l, out.len()));
                out.push(vec![i]);
            }
        }
    }
    out
}

/// Coalition index per client of a partition of `0..n` given as coalitions.
pub fn labels_of(n: usize, coalitions: &[Vec<usize>]) -> Result<Vec<usize>, FedCollabError> {
    let bad = |reason: String| FedCollabError::NotAPartition {
        n,
        except: String::new(),
        reason,
    };
    let mut labels = vec![usize::MAX; n];
    for (k, c) in coalitions.iter().enumerate() {
        for &i in c {
            if i >= n {
                return Err(bad(format!("client {i} is out of range")));
            }
            if labels[i] != usize::MAX {
                return Err(bad(format!("client {i} is listed twice")));
            }
            labels[i] = k;
        }
    }
    if let Some(i) = labels.iter().position(|&l| l == usize::MAX) {
        return Err(bad(format!("client {i} is in no coalition")));
    }
    Ok(labels)
}

// ---------------------------------------------------------------------------------------------
// The pairwise discriminator protocol (spec §3.2), minus the tensor work.
// ---------------------------------------------------------------------------------------------

/// The discriminator-train size every client aims at: half the smallest client's training set,
/// `min_i m_i / 2` (spec §3.2 step 1; one global minimum over all clients, so every pair's
/// estimate sees the same amount of training data). As in the official code the target is not
/// floored (the spec's §8 item 4 writes ⌊·⌋; the two differ only for an odd minimum).
pub fn disc_train_target(sizes: &[u64]) -> f64 {
    sizes.iter().copied().min().unwrap_or(0) as f64 / 2.0
}

/// Splits one client's training rows (given by their class ids) into a discriminator-train and
/// a validation part, stratified by label (spec §3.2 step 1): each label's rows are shuffled
/// with `rng` and the first `⌊rate·n_l + 0.49⌋` go to training, the rest to validation, where
/// `rate = target / m_i` (see [`disc_train_target`]). Labels are visited in ascending order;
/// the row indices returned are grouped by label. The realised size can differ from the target
/// by a few rows.
pub fn disc_split<R: Rng + ?Sized>(
    labels: &[u32],
    num_classes: usize,
    target: f64,
    rng: &mut R,
) -> (Vec<usize>, Vec<usize>) {
    let rate = if labels.is_empty() {
        0.0
    } else {
        (target / labels.len() as f64).clamp(0.0, 1.0)
    };
    let mut train = Vec::new();
    let mut valid = Vec::new();
    for class in 0..num_classes {
        let mut rows: Vec<usize> = (0..labels.len())
            .filter(|&i| labels[i] as usize == class)
            .collect();
        rows.shuffle(rng);
        let k = ((rate * rows.len() as f64 + 0.49) as usize).min(rows.len());
        train.extend_from_slice(&rows[..k]);
        valid.extend_from_slice(&rows[k..]);
    }
    (train, valid)
}

/// ν = L/√(L−1): the scale of the discriminator's one-hot label input for L ≥ 2 classes
/// (spec §3.2, "label branch"; the code uses `max(2, classes)`).
pub fn label_branch_scale(classes: usize) -> f64 {
    let l = classes.max(2) as f64;
    l / (l - 1.0).sqrt()
}

/// The equal pair average `(a + b)/2` of two discriminator weight vectors (spec §3.2 step 4,
/// whatever the sample counts). IEEE addition commutes, so both peers of a pair computing it
/// from their own and the received vector hold bit-identical results (spec §6 phase 2).
///
/// # Panics
/// If the lengths differ (both sides train the same architecture).
pub fn average_pair(a: &[f32], b: &[f32]) -> Vec<f32> {
    assert_eq!(
        a.len(),
        b.len(),
        "a pair averages two weight vectors of one architecture"
    );
    a.iter().zip(b).map(|(x, y)| (x + y) / 2.0).collect()
}

/// The evaluate/early-stop schedule of one pair (spec §3.2 step 4): evaluate after rounds
/// 0, k, 2k, …; keep the best metric `acc_i + acc_j` (= 2·BalAcc); stop once `patience`
/// evaluations in a row fail to strictly beat it, or after `max_rounds` rounds.
///
/// Drive it as: for each round r from 0, train and average, then if
/// [`evaluates_after(r)`](Self::evaluates_after) evaluate and [`record`](Self::record) the metric;
/// stop when `record` returns true or r + 1 reaches [`max_rounds`](Self::max_rounds).
#[derive(Clone, Debug, PartialEq)]
pub struct EarlyStop {
    eval_every: usize,
    patience: usize,
    max_rounds: usize,
    best: f64,
    stale: usize,
    evaluations: usize,
}

impl EarlyStop {
    /// A fresh schedule; `patience = 0` never stops early. `eval_every` and `max_rounds` are at
    /// least 1 (validated in [`FedCollabConfig::validate`]; 0 is treated as 1).
    pub fn new(eval_every: usize, patience: usize, max_rounds: usize) -> Self {
        Self {
            eval_every: eval_every.max(1),
            patience,
            max_rounds: max_rounds.max(1),
            best: f64::NEG_INFINITY,
            stale: 0,
            evaluations: 0,
        }
    }

    /// Most rounds the pair may run.
    pub fn max_rounds(&self) -> usize {
        self.max_rounds
    }

    /// True when the averaged model of round `round` (0-based) must be evaluated.
    pub fn evaluates_after(&self, round: usize) -> bool {
        round % self.eval_every == 0
    }

    /// Records one evaluation's metric (`acc_i + acc_j`); returns true when the pair stops.
    pub fn record(&mut self, metric: f64) -> bool {
        self.evaluations += 1;
        if metric > self.best {
            self.best = metric;
            self.stale = 0;
            false
        } else {
            self.stale += 1;
            self.patience > 0 && self.stale >= self.patience
        }
    }

    /// Evaluations recorded.
    pub fn evaluations(&self) -> usize {
        self.evaluations
    }

    /// The distance estimate `best − 1` = 2·BalAcc_best − 1 (spec §3.2 step 5): the best
    /// validation value seen, not the final model's; may be slightly negative (the solver
    /// clamps it). `None` before any evaluation.
    pub fn estimate(&self) -> Option<f64> {
        (self.evaluations > 0).then_some(self.best - 1.0)
    }
}

/// Total variation `½ Σ_l |p_i(l) − p_j(l)|` between two label histograms: the
/// [`Distance::LabelTv`] debug distance (spec §8 item 12). Empty histograms are at distance 1
/// from anything non-empty and 0 from each other.
pub fn label_tv(counts_i: &[usize], counts_j: &[usize]) -> f64 {
    let (si, sj) = (
        counts_i.iter().sum::<usize>() as f64,
        counts_j.iter().sum::<usize>() as f64,
    );
    if si == 0.0 || sj == 0.0 {
        return if si == sj { 0.0 } else { 1.0 };
    }
    let len = counts_i.len().max(counts_j.len());
    let at = |c: &[usize], l: usize| c.get(l).copied().unwrap_or(0) as f64;
    0.5 * (0..len)
        .map(|l| (at(counts_i, l) / si - at(counts_j, l) / sj).abs())
        .sum::<f64>()
}

/// The N×N raw distance matrix from pair results `((i, j), d_ij)`: symmetric, zero diagonal,
/// and 1 for every pair without a result (a failed pair is treated as far apart, which
/// discourages grouping; spec §6 "failure handling"). Returns the matrix and the pairs that
/// had no result, `i < j`, ascending.
pub fn distance_matrix(
    n: usize,
    pairs: &[((usize, usize), Option<f64>)],
) -> (Vec<Vec<f64>>, Vec<(usize, usize)>) {
    let mut d = vec![vec![f64::NAN; n]; n];
    for &((i, j), v) in pairs {
        if i < n && j < n && i != j {
            if let Some(v) = v {
                d[i][j] = v;
                d[j][i] = v;
            }
        }
    }
    let missing: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .filter(|&(i, j)| d[i][j].is_nan())
        .collect();
    for &(i, j) in &missing {
        d[i][j] = 1.0;
        d[j][i] = 1.0;
    }
    for (i, row) in d.iter_mut().enumerate() {
        row[i] = 0.0;
    }
    (d, missing)
}

/// FedAvg inside one coalition (spec §5; §6 phase 4): the m_j-weighted average of the
/// members' trained models, `None` for a member whose model did not arrive (the weights are
/// renormalised over the others, spec §6 "failure handling"). Summed in f64 in the given order
/// (ascending member index), so every member computing it from the same models holds the same
/// result bit for bit. Empty when no model arrived.
pub fn coalition_average(models: &[Option<&[f32]>], sizes: &[u64]) -> Vec<f32> {
    let total: f64 = models
        .iter()
        .zip(sizes)
        .filter(|(m, _)| m.is_some())
        .map(|(_, &s)| s as f64)
        .sum();
    let len = models.iter().flatten().next().map_or(0, |m| m.len());
    let mut avg = vec![0f64; len];
    for (m, &s) in models.iter().zip(sizes) {
        if let Some(m) = m {
            let w = s as f64 / total;
            for (a, &x) in avg.iter_mut().zip(m.iter()) {
                *a += w * x as f64;
            }
        }
    }
    avg.into_iter().map(|x| x as f32).collect()
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_coalition_average_renormalises_over_the_models_that_arrived() {
        let (a, b) = ([1.0f32, 2.0], [3.0f32, 6.0]);
        assert_eq!(
            coalition_average(&[Some(&a[..]), Some(&b[..])], &[1, 3]),
            vec![2.5, 5.0]
        );
        assert_eq!(
            coalition_average(&[Some(&a[..]), None], &[1, 3]),
            vec![1.0, 2.0]
        );
        assert!(coalition_average(&[None, None], &[1, 3]).is_empty());
    }
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    fn toy_a() -> Problem {
        // Spec §2 "Toy A" (the unit test in the official `evaluate.py`).
        let d = vec![
            vec![0.0, 0.5, 1.0, 1.0],
            vec![0.5, 0.0, 1.0, 1.0],
            vec![1.0, 1.0, 0.0, 0.5],
            vec![1.0, 1.0, 0.5, 0.0],
        ];
        Problem::new(&[4, 6, 3, 7], &d, 1.0).unwrap()
    }

    fn toy_b(c: f64) -> Problem {
        // Spec §2 "Toy B": two types, mixed sizes.
        let d = vec![
            vec![0.0, 0.02, 0.03, 0.60, 0.62, 0.65],
            vec![0.02, 0.0, 0.01, 0.61, 0.60, 0.64],
            vec![0.03, 0.01, 0.0, 0.63, 0.66, 0.60],
            vec![0.60, 0.61, 0.63, 0.0, 0.05, 0.20],
            vec![0.62, 0.60, 0.66, 0.05, 0.0, 0.15],
            vec![0.65, 0.64, 0.60, 0.20, 0.15, 0.0],
        ];
        Problem::new(&[1000, 800, 50, 900, 40, 30], &d, c).unwrap()
    }

    /// Every set partition of `0..n` as label vectors (restricted growth strings).
    fn all_partitions(n: usize) -> Vec<Vec<usize>> {
        fn rec(i: usize, n: usize, cur: &mut Vec<usize>, max: usize, out: &mut Vec<Vec<usize>>) {
            if i == n {
                out.push(cur.clone());
                return;
            }
            for l in 0..=max + 1 {
                if i == 0 && l > 0 {
                    break;
                }
                cur.push(l);
                rec(i + 1, n, cur, if i == 0 { 0 } else { max.max(l) }, out);
                cur.pop();
            }
        }
        let mut out = Vec::new();
        rec(0, n, &mut Vec::new(), 0, &mut out);
        out
    }

    fn brute_force(p: &Problem) -> (Vec<Vec<usize>>, f64) {
        let mut best: Option<(Vec<usize>, f64)> = None;
        for labels in all_partitions(p.len()) {
            let v = p.objective(&labels).unwrap();
            if best.as_ref().is_none_or(|(_, b)| v < *b) {
                best = Some((labels, v));
            }
        }
        let (labels, v) = best.unwrap();
        (coalitions_of(&labels), v)
    }

    #[test]
    fn partitions_enumerator_counts_bell_numbers() {
        let counts: Vec<usize> = (1..=6).map(|n| all_partitions(n).len()).collect();
        assert_eq!(counts, vec![1, 2, 5, 15, 52, 203]);
    }

    #[test]
    fn toy_a_costs_match_the_official_unit_test() {
        let p = toy_a();
        let costs = p.client_costs(&[0, 0, 1, 1]).unwrap();
        for (c, want) in costs
            .iter()
            .zip([0.616227766, 0.516227766, 0.666227766, 0.466227766])
        {
            assert!(close(*c, want, 1e-9), "{costs:?}");
        }
        let local = p.client_costs(&[0, 1, 2, 3]).unwrap();
        for (c, want) in local
            .iter()
            .zip([0.5, 0.408248290, 0.577350269, 0.377964473])
        {
            assert!(close(*c, want, 1e-9), "{local:?}");
        }
        for (labels, want) in [
            (vec![0, 0, 1, 1], 0.566227766),
            (vec![0, 1, 2, 3], 0.465890758),
            (vec![0, 0, 0, 0], 0.848606798),
            (vec![0, 1, 0, 1], 0.827657286),
            (vec![0, 0, 1, 2], 0.521942569),
        ] {
            let v = p.objective(&labels).unwrap();
            assert!(close(v, want, 1e-9), "{labels:?}: {v} vs {want}");
        }
    }

    #[test]
    fn hand_checked_two_client_objective() {
        // m = [1, 3], d = 0.4, C = 2. Together: M = 4, C/√M = 1; client 0 pays 3/4·0.4 = 0.3,
        // client 1 pays 1/4·0.4 = 0.1, so L = (1.3 + 1.1)/2 = 1.2. Alone: (2/1 + 2/√3)/2.
        let p = Problem::new(&[1, 3], &[vec![0.0, 0.4], vec![0.4, 0.0]], 2.0).unwrap();
        assert!(close(p.objective(&[7, 7]).unwrap(), 1.2, 1e-15));
        let alone = (2.0 + 2.0 / 3f64.sqrt()) / 2.0;
        assert!(close(p.objective(&[0, 1]).unwrap(), alone, 1e-15));
        // The big client loses little by admitting the small one; the small one pays a lot.
        let c = p.client_costs(&[0, 0]).unwrap();
        assert!(c[0] > c[1]);
        // Algorithm 2 joins them (1.2 < 1.577).
        assert_eq!(p.greedy_identity(100).coalitions, vec![vec![0, 1]]);
    }

    #[test]
    fn labels_are_ids_not_positions_and_empty_labels_cost_nothing() {
        let p = toy_a();
        let a = p.objective(&[0, 0, 1, 1]).unwrap();
        let b = p.objective(&[42, 42, 9, 9]).unwrap();
        assert_eq!(a, b);
        assert!(matches!(
            p.objective(&[0, 0]),
            Err(FedCollabError::Labels {
                expected: 4,
                got: 2
            })
        ));
    }

    #[test]
    fn preparation_clamps_symmetrises_and_flags() {
        let d = vec![
            vec![0.3, -0.2, 1.4],
            vec![-0.2, 0.0, 0.5],
            vec![1.4, 0.7, 0.0],
        ];
        let p = Problem::new(&[1, 1, 1], &d, 1.0).unwrap();
        assert_eq!(
            p.distances(),
            &[
                vec![0.0, 0.0, 1.0],
                vec![0.0, 0.0, 0.6],
                vec![1.0, 0.6, 0.0]
            ]
        );
        assert_eq!(p.asymmetric_pairs(), &[(1, 2)]);
    }

    #[test]
    fn invalid_inputs_name_the_value() {
        let d2 = vec![vec![0.0, 0.1], vec![0.1, 0.0]];
        let e = Problem::new(&[], &[], 1.0).unwrap_err();
        assert_eq!(e, FedCollabError::NoClients);
        let e = Problem::new(&[3, 0], &d2, 1.0).unwrap_err();
        assert!(e.to_string().contains("client 1 has size 0"), "{e}");
        let e = Problem::new(&[3, 2], &d2, -1.0).unwrap_err();
        assert!(e.to_string().contains(">= 0, got -1"), "{e}");
        let e = Problem::new(&[3, 2], &[vec![0.0, 0.1], vec![0.1]], 1.0).unwrap_err();
        assert!(e.to_string().contains("row 1 has 1 entries"), "{e}");
        let e = Problem::new(&[3, 2], &[vec![0.0, f64::NAN], vec![0.1, 0.0]], 1.0).unwrap_err();
        assert!(e.to_string().contains("d[0][1] = NaN"), "{e}");
        let p = Problem::new(&[3, 2], &d2, 1.0).unwrap();
        let cfg = SolverConfig {
            restarts: 0,
            max_passes: 1,
        };
        let e = p.solve(&cfg, &mut StdRng::seed_from_u64(0)).unwrap_err();
        assert!(e.to_string().contains("restarts must be at least 1"), "{e}");
        let e = labels_of(3, &[vec![0, 1], vec![1]]).unwrap_err();
        assert!(e.to_string().contains("client 1 is listed twice"), "{e}");
        let e = labels_of(3, &[vec![0, 1]]).unwrap_err();
        assert!(e.to_string().contains("client 2 is in no coalition"), "{e}");
    }

    #[test]
    fn toy_a_optimum_is_local_found_in_one_pass() {
        let p = toy_a();
        let (best, v) = brute_force(&p);
        assert_eq!(best, vec![vec![0], vec![1], vec![2], vec![3]]);
        assert!(close(v, 0.465890758, 1e-9));
        let s = p.greedy_identity(100);
        assert_eq!(s.coalitions, best);
        assert_eq!(s.passes, 1);
        assert!(s.converged);
    }

    #[test]
    fn toy_b_matches_the_specs_table() {
        let singletons: Vec<Vec<usize>> = (0..6).map(|i| vec![i]).collect();
        let two = vec![vec![0, 1, 2], vec![3, 4, 5]];
        // (C, brute-force optimum, L*, passes of the identity-order run when the spec gives them)
        type Case = (f64, Vec<Vec<usize>>, f64, Option<usize>);
        let cases: [Case; 4] = [
            (0.0, singletons, 0.0, None),
            (
                1.0,
                vec![vec![0], vec![1, 2], vec![3, 4], vec![5]],
                0.068004867,
                None,
            ),
            (1.5, two.clone(), 0.090203529, None),
            (2.0, two.clone(), 0.104042928, Some(2)),
        ];
        for (c, want, value, passes) in cases {
            let p = toy_b(c);
            let (bf, bv) = brute_force(&p);
            assert_eq!(bf, want, "brute force at C = {c}");
            assert!(close(bv, value, 1e-9), "C = {c}: {bv}");
            let s = p.greedy_identity(100);
            assert_eq!(s.coalitions, want, "Algorithm 2 at C = {c}");
            assert!(close(s.objective, value, 1e-9));
            if let Some(k) = passes {
                assert_eq!(s.passes, k, "passes at C = {c}");
            }
        }
        let s = toy_b(10.0).greedy_identity(100);
        assert_eq!(s.coalitions, two);
        assert!(close(s.objective, 0.325473298, 1e-9));
        assert_eq!(s.passes, 3);
    }

    #[test]
    fn toy_b_at_c40_single_moves_miss_the_global_optimum() {
        let p = toy_b(40.0);
        let (bf, bv) = brute_force(&p);
        assert_eq!(bf, vec![(0..6).collect::<Vec<_>>()]);
        assert!(close(bv, 1.081370055, 1e-9));
        let s = p.greedy_identity(100);
        assert_eq!(s.coalitions, vec![vec![0, 1, 2], vec![3, 4, 5]]);
        assert!(close(s.objective, 1.155837189, 1e-9));
        // Restarts do not help: no single-client move leaves this local optimum.
        let cfg = SolverConfig {
            restarts: 20,
            max_passes: 100,
        };
        let sol = p.solve(&cfg, &mut StdRng::seed_from_u64(3)).unwrap();
        assert!(close(sol.best.objective, 1.155837189, 1e-9));
    }

    /// Algorithm 2 exactly as the spec's pseudocode writes it, with the full O(N²) objective:
    /// the oracle for the incremental solver.
    fn naive_greedy(p: &Problem, max_passes: usize, rng: &mut StdRng) -> (Vec<usize>, usize) {
        let n = p.len();
        let mut labels: Vec<usize> = (0..n).collect();
        let mut passes = 0;
        while passes < max_passes {
            passes += 1;
            let mut order: Vec<usize> = (0..n).collect();
            order.shuffle(rng);
            let mut moved = false;
            for q in order {
                let mut best_label = labels[q];
                let mut best_val = p.objective(&labels).unwrap();
                for c in 0..n {
                    labels[q] = c;
                    let v = p.objective(&labels).unwrap();
                    if improves(v, best_val) {
                        best_label = c;
                        best_val = v;
                        moved = true;
                    }
                }
                labels[q] = best_label;
            }
            if !moved {
                break;
            }
        }
        (labels, passes)
    }

    fn random_problem(rng: &mut StdRng, n: usize) -> Problem {
        use rand::RngExt;
        let sizes: Vec<u64> = (0..n).map(|_| rng.random_range(1..500)).collect();
        let mut d = vec![vec![0.0; n]; n];
        let types: Vec<usize> = (0..n).map(|_| rng.random_range(0..3)).collect();
        for i in 0..n {
            for j in i + 1..n {
                let base = if types[i] == types[j] { 0.02 } else { 0.5 };
                let v = base + rng.random::<f64>() * 0.2 - 0.05;
                d[i][j] = v;
                d[j][i] = v;
            }
        }
        Problem::new(&sizes, &d, rng.random_range(0.0..15.0)).unwrap()
    }

    #[test]
    fn incremental_solver_agrees_with_the_naive_oracle() {
        let mut maker = StdRng::seed_from_u64(11);
        for case in 0..40 {
            let n = 2 + case % 11;
            let p = random_problem(&mut maker, n);
            let mut r1 = StdRng::seed_from_u64(case as u64);
            let mut r2 = StdRng::seed_from_u64(case as u64);
            for _ in 0..3 {
                let fast = p.greedy(100, &mut r1);
                let (labels, passes) = naive_greedy(&p, 100, &mut r2);
                assert_eq!(fast.coalitions, coalitions_of(&labels), "case {case}");
                assert_eq!(fast.passes, passes, "case {case}");
                assert!(close(fast.objective, p.objective(&labels).unwrap(), 1e-12));
            }
        }
    }

    #[test]
    fn zero_capacity_keeps_everyone_alone_and_zero_distances_go_global() {
        let mut maker = StdRng::seed_from_u64(5);
        for n in [1, 3, 8] {
            let p = random_problem(&mut maker, n).with_capacity(0.0).unwrap();
            let s = p.solve(&SolverConfig::default(), &mut maker).unwrap();
            assert_eq!(s.best.coalitions.len(), n);
            // Corollary 3.4(1): with every D = 0, global FL is each client's best.
            let zero = Problem::new(p.sizes(), &vec![vec![0.0; n]; n], 3.0).unwrap();
            let s = zero.solve(&SolverConfig::default(), &mut maker).unwrap();
            assert_eq!(s.best.coalitions, vec![(0..n).collect::<Vec<_>>()]);
        }
    }

    #[test]
    fn own_best_coalition_has_no_client_beyond_the_corollary_threshold() {
        // Corollary 3.5 in objective units (spec §1): the coalition S ∋ i that minimises
        // client i's own cost contains no j with d_ij > C·√m / (2·m_i).
        let mut maker = StdRng::seed_from_u64(21);
        for _ in 0..60 {
            use rand::RngExt;
            let n = maker.random_range(2..=7);
            let p = random_problem(&mut maker, n)
                .with_capacity(maker.random_range(0.5..40.0))
                .unwrap();
            let m_total: u64 = p.sizes().iter().sum();
            for i in 0..n {
                let mut best: Option<(u32, f64)> = None;
                for mask in 0u32..(1 << n) {
                    if mask & (1 << i) == 0 {
                        continue;
                    }
                    let labels: Vec<usize> =
                        (0..n).map(|j| usize::from(mask & (1 << j) == 0)).collect();
                    let cost = p.client_costs(&labels).unwrap()[i];
                    if best.is_none_or(|(_, b)| cost < b) {
                        best = Some((mask, cost));
                    }
                }
                let (mask, _) = best.unwrap();
                let thr = p.capacity() * (m_total as f64).sqrt() / (2.0 * p.sizes()[i] as f64);
                for j in (0..n).filter(|&j| mask & (1 << j) != 0) {
                    assert!(
                        p.distances()[i][j] <= thr,
                        "client {i}'s best coalition holds {j} at d = {} > {thr}",
                        p.distances()[i][j]
                    );
                }
            }
        }
    }

    #[test]
    fn solve_is_deterministic_for_a_seed_and_canonical() {
        let mut maker = StdRng::seed_from_u64(8);
        let p = random_problem(&mut maker, 12);
        let a = p
            .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(1))
            .unwrap();
        let b = p
            .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(1))
            .unwrap();
        assert_eq!(a, b);
        let firsts: Vec<usize> = a.best.coalitions.iter().map(|c| c[0]).collect();
        assert!(firsts.windows(2).all(|w| w[0] < w[1]));
        assert!(
            a.best
                .coalitions
                .iter()
                .all(|c| c.windows(2).all(|w| w[0] < w[1]))
        );
        assert!(a.hits >= 1 && a.hits <= a.restarts);
    }

    #[test]
    fn restarts_never_do_worse_than_their_first_run() {
        let mut maker = StdRng::seed_from_u64(9);
        for _ in 0..10 {
            let p = random_problem(&mut maker, 10);
            let first = p.greedy(100, &mut StdRng::seed_from_u64(4));
            let all = p
                .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(4))
                .unwrap();
            assert!(all.best.objective <= first.objective);
        }
    }

    #[test]
    fn newcomer_joins_its_own_type_or_stays_alone() {
        // Toy B at C = 10 with client 2 arriving last: it belongs with {0, 1}.
        let p = toy_b(10.0);
        let k = p.place_newcomer(&[vec![0, 1], vec![3, 4, 5]], 2).unwrap();
        assert_eq!(k, Some(0));
        let k = p.place_newcomer(&[vec![0, 1, 2], vec![3, 4]], 5).unwrap();
        assert_eq!(k, Some(1));
        // With C = 0 nobody gains by company.
        let p0 = toy_b(0.0);
        assert_eq!(
            p0.place_newcomer(&[vec![0, 1], vec![3, 4, 5]], 2).unwrap(),
            None
        );
        assert!(p.place_newcomer(&[vec![0, 1], vec![3, 4]], 2).is_err());
    }

    #[test]
    fn disc_split_is_stratified_with_the_codes_rounding() {
        // 10 rows of class 0, 4 of class 1, 1 of class 2; target 3 of 15 → rate 0.2:
        // class 0 → ⌊2.0 + .49⌋ = 2, class 1 → ⌊0.8 + .49⌋ = 1, class 2 → ⌊0.2 + .49⌋ = 0.
        let labels: Vec<u32> = [vec![0; 10], vec![1; 4], vec![2; 1]].concat();
        let mut rng = StdRng::seed_from_u64(0);
        let (train, valid) = disc_split(&labels, 3, 3.0, &mut rng);
        let count = |rows: &[usize], c: u32| rows.iter().filter(|&&r| labels[r] == c).count();
        assert_eq!(
            [count(&train, 0), count(&train, 1), count(&train, 2)],
            [2, 1, 0]
        );
        assert_eq!(train.len() + valid.len(), 15);
        let mut all: Vec<usize> = train.iter().chain(&valid).copied().collect();
        all.sort();
        assert_eq!(all, (0..15).collect::<Vec<_>>());
        assert_eq!(disc_train_target(&[2100, 14, 30]), 7.0);
        assert_eq!(disc_train_target(&[15, 40]), 7.5);
    }

    #[test]
    fn label_scale_and_pair_average() {
        assert!(close(label_branch_scale(10), 10.0 / 3.0, 1e-15));
        assert!(close(label_branch_scale(1), 2.0, 1e-15));
        let a = [1.0f32, -3.0, 0.1];
        let b = [0.5f32, 2.0, 0.2];
        assert_eq!(average_pair(&a, &b), average_pair(&b, &a));
        assert_eq!(average_pair(&a, &b)[..2], [0.75, -0.5]);
    }

    #[test]
    fn early_stop_earliest_stop_is_after_round_100() {
        // A metric that never improves after the first evaluation: evaluations at rounds
        // 0, 10, …, 100, the 10th stale one stops the pair after round 100 (101 rounds).
        let mut es = EarlyStop::new(10, 10, 2000);
        let mut stopped_after = None;
        for r in 0..es.max_rounds() {
            if es.evaluates_after(r) && es.record(if r == 0 { 1.4 } else { 1.2 }) {
                stopped_after = Some(r);
                break;
            }
        }
        assert_eq!(stopped_after, Some(100));
        assert!(close(es.estimate().unwrap(), 0.4, 1e-12));
        // An equal value is not an improvement; a better one resets the count.
        let mut es = EarlyStop::new(1, 2, 100);
        assert!(!es.record(1.0));
        assert!(!es.record(1.0));
        assert!(!es.record(1.5));
        assert!(!es.record(1.5));
        assert!(es.record(1.1));
        assert!(close(es.estimate().unwrap(), 0.5, 1e-12));
        assert_eq!(EarlyStop::new(10, 0, 5).estimate(), None);
        let mut never = EarlyStop::new(1, 0, 100);
        assert!((0..50).all(|_| !never.record(0.0)));
    }

    #[test]
    fn label_tv_of_the_papers_partner_types_is_one_seventh() {
        // cluster4 with k = 0.25: type 0 holds labels 0 (half share), 1, 2, 3; type 1 holds
        // 1, 2, 3, 4 (half share): TV = 1/7 (spec §3.1).
        let t0 = [50, 100, 100, 100, 0];
        let t1 = [0, 100, 100, 100, 50];
        assert!(close(label_tv(&t0, &t1), 1.0 / 7.0, 1e-12));
        assert!(close(label_tv(&t0, &[0, 0, 0, 0, 0, 7]), 1.0, 1e-12));
        assert_eq!(label_tv(&t0, &t0), 0.0);
        assert_eq!(label_tv(&[], &[]), 0.0);
    }

    #[test]
    fn distance_matrix_fills_missing_pairs_with_one() {
        let (d, missing) = distance_matrix(3, &[((0, 1), Some(0.2)), ((1, 2), None)]);
        assert_eq!(
            d,
            vec![
                vec![0.0, 0.2, 1.0],
                vec![0.2, 0.0, 1.0],
                vec![1.0, 1.0, 0.0]
            ]
        );
        assert_eq!(missing, vec![(0, 2), (1, 2)]);
    }

    #[test]
    fn config_defaults_are_the_specs_and_validation_names_fields() {
        let c = FedCollabConfig::default();
        assert_eq!(c.capacity, 10.0);
        assert_eq!((c.restarts, c.max_passes), (100, 100));
        assert_eq!(c.distance, Distance::Discriminator);
        assert_eq!(
            (c.disc_hidden, c.disc_batch_size, c.disc_local_steps),
            (200, 32, 1)
        );
        assert_eq!(
            (c.disc_eval_every, c.disc_patience, c.disc_max_rounds),
            (10, 10, 2000)
        );
        assert_eq!(c.disc_lr, 0.01);
        assert!(c.validate().is_ok());
        let e = FedCollabConfig {
            capacity: -1.0,
            ..c.clone()
        }
        .validate()
        .unwrap_err();
        assert!(e.starts_with("capacity") && e.contains("-1"), "{e}");
        let e = FedCollabConfig {
            disc_eval_every: 0,
            ..c
        }
        .validate()
        .unwrap_err();
        assert!(e.starts_with("disc_eval_every"), "{e}");
    }

    // -----------------------------------------------------------------------------------------
    // Golden: the official distance matrices.
    // -----------------------------------------------------------------------------------------

    /// `fedcollab_golden.json`, beside the spec: the three official 20×20 distance matrices from
    /// github.com/baowenxuan/FedCollab @ 4c8ac1d (`divergence/*.pkl`, rounded to 4 decimals), the
    /// client sizes from the same files, and objective values recomputed independently in f64;
    /// the expected structures match the official `collab/*.pkl`.
    fn golden() -> serde_json::Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/specs/fedcollab_golden.json"
        );
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading the golden file {path}: {e}"));
        serde_json::from_str(&text).expect("the golden file is JSON")
    }

    const SETTINGS: [&str; 3] = [
        "label_shift_fmnist",
        "feature_shift_rotated_cifar10",
        "concept_shift_coarse_cifar100",
    ];

    fn structure(v: &serde_json::Value) -> Vec<Vec<usize>> {
        serde_json::from_value(v.clone()).expect("a list of coalitions")
    }

    fn golden_problem(g: &serde_json::Value) -> Problem {
        let m: Vec<u64> = serde_json::from_value(g["m"].clone()).unwrap();
        let d: Vec<Vec<f64>> = serde_json::from_value(g["D_raw_rounded4"].clone()).unwrap();
        Problem::new(&m, &d, g["C"].as_f64().unwrap()).unwrap()
    }

    fn range(a: usize, b: usize) -> Vec<usize> {
        (a..b).collect()
    }

    #[test]
    fn golden_objective_values_of_named_structures() {
        let all = golden();
        for name in SETTINGS {
            let g = &all[name];
            let p = golden_problem(g);
            let want = &g["objective_mean_over_clients_after_clamp"];
            let named: [(&str, Vec<Vec<usize>>); 5] = [
                ("local", (0..20).map(|i| vec![i]).collect()),
                ("global", vec![range(0, 20)]),
                (
                    "four_types",
                    vec![range(0, 5), range(5, 10), range(10, 15), range(15, 20)],
                ),
                ("large_vs_small", vec![range(0, 10), range(10, 20)]),
                (
                    "fedcollab_expected",
                    structure(&g["expected_best_structure_100_restarts"]),
                ),
            ];
            for (key, s) in named {
                let v = p.objective_of(&s).unwrap();
                let w = want[key].as_f64().unwrap();
                assert!(close(v, w, 5e-7), "{name} {key}: {v} vs golden {w}");
            }
        }
    }

    #[test]
    fn golden_identity_order_greedy() {
        let all = golden();
        for name in SETTINGS {
            let g = &all[name];
            let want = &g["deterministic_identity_order_greedy"];
            let s = golden_problem(g).greedy_identity(100);
            assert_eq!(s.coalitions, structure(&want["structure"]), "{name}");
            let w = want["objective"].as_f64().unwrap();
            assert!(
                close(s.objective, w, 5e-7),
                "{name}: {} vs {w}",
                s.objective
            );
            assert_eq!(s.passes as u64, want["passes"].as_u64().unwrap(), "{name}");
        }
    }

    #[test]
    fn golden_capacity_sweep_coarsens_the_structure() {
        // Spec §7.2 "C sensitivity", at the grid points where the best structure is reached by
        // many restarts (at C = 15 on CIFAR-10 and C = 12 on CIFAR-100 only 1-2 % of runs reach
        // the best structure, so 100 restarts find it or not depending on the RNG stream).
        let all = golden();
        let target = vec![range(0, 5), range(5, 10), range(10, 20)];
        let types = vec![range(0, 5), range(5, 10), range(10, 15), range(15, 20)];
        let global = vec![range(0, 20)];
        let cases: [(&str, f64, Vec<Vec<usize>>); 11] = [
            ("label_shift_fmnist", 6.0, target.clone()),
            ("label_shift_fmnist", 8.0, target.clone()),
            ("label_shift_fmnist", 12.0, vec![range(0, 5), range(5, 20)]),
            ("label_shift_fmnist", 15.0, global.clone()),
            ("label_shift_fmnist", 20.0, global.clone()),
            ("feature_shift_rotated_cifar10", 4.0, types.clone()),
            ("feature_shift_rotated_cifar10", 6.0, types),
            ("feature_shift_rotated_cifar10", 8.0, target.clone()),
            ("feature_shift_rotated_cifar10", 12.0, target.clone()),
            ("concept_shift_coarse_cifar100", 6.0, target),
            ("concept_shift_coarse_cifar100", 20.0, global),
        ];
        for (name, c, want) in cases {
            let p = golden_problem(&all[name]).with_capacity(c).unwrap();
            let sol = p
                .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(0))
                .unwrap();
            assert_eq!(sol.best.coalitions, want, "{name} at C = {c}");
        }
        // Over the spec's logging grid: all singletons at C = 0, one coalition at C = 20 on
        // every matrix, and never more coalitions at a larger C.
        for name in SETTINGS {
            let base = golden_problem(&all[name]);
            let counts: Vec<usize> = [0.0, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0]
                .iter()
                .map(|&c| {
                    let p = base.with_capacity(c).unwrap();
                    let sol = p
                        .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(0))
                        .unwrap();
                    sol.best.coalitions.len()
                })
                .collect();
            assert_eq!(counts[0], 20, "{name}: {counts:?}");
            assert_eq!(counts[counts.len() - 1], 1, "{name}: {counts:?}");
            assert!(
                counts.windows(2).all(|w| w[0] >= w[1]),
                "{name}: {counts:?}"
            );
        }
    }

    #[test]
    fn golden_restarts_recover_the_official_structures() {
        let all = golden();
        for name in SETTINGS {
            let g = &all[name];
            let p = golden_problem(g);
            let want = structure(&g["expected_best_structure_100_restarts"]);
            let w = g["objective_mean_over_clients_after_clamp"]["fedcollab_expected"]
                .as_f64()
                .unwrap();
            for seed in 0..3 {
                let sol = p
                    .solve(&SolverConfig::default(), &mut StdRng::seed_from_u64(seed))
                    .unwrap();
                assert_eq!(sol.best.coalitions, want, "{name}, seed {seed}");
                assert!(
                    close(sol.best.objective, w, 5e-7),
                    "{name}: {}",
                    sol.best.objective
                );
                assert!(sol.best.converged);
            }
        }
    }
}
