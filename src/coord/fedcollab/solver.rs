//! FedCollab's collaboration-structure objective (spec `docs/specs/fedcollab.md` §2) and
//! Algorithm 2 with random restarts and its tie-breaking (§4), plus placing a newcomer (§5).
//! Owns: [`Problem`], [`Solution`], [`Structure`], [`SolverConfig`], the improvement tolerance
//! [`REL_TOL`], and the conversions between coalitions and label vectors.
//! Must not: measure distances (`distance.rs`) or draw randomness of its own: every random
//! choice comes from the RNG the caller passes in.

use super::FedCollabError;
use rand::Rng;
use rand::seq::SliceRandom;
use serde::Serialize;

/// Relative tolerance of a strict improvement (spec §4, §8 item 8): a move is taken only when
/// `v < best − REL_TOL · max(1, |best|)`, so floating noise never creates moves or cycles.
pub const REL_TOL: f64 = 1e-12;

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
pub(super) fn improves(v: f64, best: f64) -> bool {
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
