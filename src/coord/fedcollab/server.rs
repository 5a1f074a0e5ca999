//! FedCollab's thin coordinator state (issue 5 over libp2p; spec §6): who joined with how many
//! samples, the distance plan, the silos' distance reports, and the collaboration structure
//! solved from them.
//! Owns: the phases (joining → estimating → solved), who is in the plan (every silo, or —
//! when the driver closes joining early — those that had joined; a silo that joins after the
//! plan went out trains alone, FedCollab's singleton), the check that a silo's report covers
//! every other planned silo exactly once, the agreement check between the two reports of a pair, the
//! solve (Algorithm 2 with the simulator's seed stream, so a swarm forms the coalitions
//! `simulate` forms), each silo's answer (the plan, then its own coalition only — minimum
//! disclosure, spec §6 phase 3), and the checkpoint.
//! Must not: see data, discriminator weights or models (the silos estimate distances among
//! themselves and run FedAvg inside their coalitions peer to peer), or know about transports
//! or clocks (the driver decides when joining closes).
//!
//! Silos are named by their index in the federation's manifest, as in the simulator.

use crate::coord::PairDistance;
use crate::coord::fedcollab::{
    FedCollabConfig, Problem, Solution, coalitions_of, disc_train_target, labels_of,
};
use crate::coord::joining::{CloseRefused, Joining, Refused};
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"FEDCOLB1";
const VERSION: u32 = 2;

/// The answer to a fetch.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchAnswer {
    /// Not yet: hold the fetch.
    Hold,
    /// Round 0: the plan is out (every silo joined, or joining was closed).
    Plan {
        /// The discriminator-train target m_train, from the planned silos' sizes.
        target: f64,
        /// Silos in the run (the manifest's first `nodes`).
        nodes: u32,
        /// The silos in the plan, ascending: they estimate distances among themselves. A silo
        /// not listed joined too late and trains alone.
        members: Vec<u32>,
    },
    /// Round 1: the silo's coalition.
    Coalition {
        /// Ascending indices, the silo included.
        members: Vec<u32>,
        /// The members' sample counts.
        sizes: Vec<u64>,
    },
}

/// The structure and how it was reached (the coordinator's log line).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Solved {
    /// Canonical coalitions of the planned silos (manifest indices).
    pub coalitions: Vec<Vec<usize>>,
    /// L of the structure.
    pub objective: f64,
    /// m_i (0 for a silo that never joined).
    pub sizes: Vec<u64>,
    /// The planned silos, ascending: every silo unless joining was closed early.
    pub participants: Vec<usize>,
    /// The raw reports among the planned silos, in `participants` order: `distances[a][b]`
    /// is what `participants[a]` reported for `participants[b]` (1 where it had none).
    pub distances: Vec<Vec<f64>>,
    /// Pairs whose two reports differ (both sides run the same protocol on the same numbers,
    /// so a difference means a failed pair or a misbehaving silo), `i < j`, manifest indices.
    pub mismatched: Vec<(usize, usize)>,
    /// Pairs one side could not run (their distance counts as 1), `i < j`, manifest indices.
    pub failed: Vec<(usize, usize)>,
    /// Restarts that reached the best objective.
    pub hits: usize,
}

#[derive(Serialize, Deserialize)]
struct Saved {
    sizes: Vec<Option<u64>>,
    participants: Option<Vec<usize>>,
    reports: Vec<Option<Vec<PairDistance>>>,
    solved: Option<Solved>,
}

/// The coordinator's FedCollab state.
pub struct FedCollabServer {
    cfg: FedCollabConfig,
    seed: u64,
    /// Who joined with how many samples, and the planned silos once the plan is out.
    joining: Joining<u64>,
    reports: Vec<Option<Vec<PairDistance>>>,
    solved: Option<Solved>,
}

impl FedCollabServer {
    /// A fresh run over `nodes` silos; `seed` is the run seed.
    pub fn new(cfg: FedCollabConfig, nodes: usize, seed: u64) -> Result<Self, String> {
        cfg.validate().map_err(|e| format!("fedcollab.{e}"))?;
        if nodes < 2 {
            return Err(format!("fedcollab needs at least 2 silos, got {nodes}"));
        }
        Ok(Self {
            cfg,
            seed,
            joining: Joining::new(nodes, 2),
            reports: vec![None; nodes],
            solved: None,
        })
    }

    /// Silos of the run.
    pub fn nodes(&self) -> usize {
        self.joining.nodes()
    }

    /// Silos that joined.
    pub fn registered(&self) -> usize {
        self.joining.registered()
    }

    /// The plan is out: every silo joined, or joining was closed.
    pub fn ready(&self) -> bool {
        self.joining.started()
    }

    /// Silos that have not joined, ascending.
    pub fn missing(&self) -> Vec<usize> {
        self.joining.missing()
    }

    /// The planned silos, once the plan is out.
    pub fn participants(&self) -> Option<&[usize]> {
        self.joining.participants()
    }

    /// Sends the plan out to the silos that have joined, without waiting for the rest (the
    /// driver's join deadline passed). Returns the silos left out; each trains alone if it
    /// joins later. Refused with fewer than 2 joined (no pair to estimate) or once the plan is
    /// out.
    pub fn close_joining(&mut self) -> Result<Vec<usize>, String> {
        self.joining.close().map_err(|e| match e {
            CloseRefused::Started => "the plan is already out".into(),
            CloseRefused::TooFew { joined, nodes } => {
                format!("{joined} of {nodes} silos joined; a plan needs at least 2")
            }
        })
    }

    /// Joining may close now: the plan is not out and a pair has joined.
    pub fn may_close_joining(&self) -> bool {
        self.joining.may_close()
    }

    /// The plan went out without silo `i`.
    pub fn left_out(&self, i: usize) -> bool {
        self.joining.left_out(i)
    }

    fn planned(&self, i: usize) -> bool {
        self.joining.in_run(i)
    }

    /// The structure, once solved.
    pub fn solved(&self) -> Option<&Solved> {
        self.solved.as_ref()
    }

    /// Silo `i` joins with `n_train` samples; the last silo to join sends the plan out.
    /// Rejoining with the same count is fine (a restarted silo); a planned silo's changed count
    /// once the plan is out is refused, since every silo's discriminator split was cut from the
    /// sizes it was given. A silo joining after the plan went out is accepted: it is told to
    /// train alone.
    pub fn register(&mut self, i: usize, n_train: u64) -> Result<(), String> {
        let solved = self.solved.is_some();
        match self.joining.register(i, n_train) {
            Ok(_) => Ok(()),
            Err(Refused::NotASilo { nodes }) => {
                Err(format!("silo {i} is not one of the run's {nodes} silos"))
            }
            Err(Refused::Changed { old }) if solved => Err(format!(
                "silo {i} joined with {old} samples and now says {n_train}; the structure is \
                 already solved on {old}"
            )),
            Err(Refused::Changed { old }) => Err(format!(
                "silo {i} joined with {old} samples and now says {n_train}; the distance plan \
                 was cut from {old}"
            )),
        }
    }

    /// Round 0 is the distance plan, round 1 the silo's coalition (its own singleton for a
    /// silo outside the plan).
    pub fn fetch(&self, i: usize, round: u64) -> Result<FetchAnswer, String> {
        if i >= self.nodes() {
            return Err(format!(
                "silo {i} is not one of the run's {} silos",
                self.nodes()
            ));
        }
        match (round, self.joining.participants()) {
            (0, None) => Ok(FetchAnswer::Hold),
            (0, Some(planned)) => {
                let sizes: Vec<u64> = planned
                    .iter()
                    .filter_map(|&j| self.joining.size(j))
                    .collect();
                Ok(FetchAnswer::Plan {
                    target: disc_train_target(&sizes),
                    nodes: self.nodes() as u32,
                    members: planned.iter().map(|&j| j as u32).collect(),
                })
            }
            (1, Some(_)) if !self.planned(i) => match self.joining.size(i) {
                Some(m) => Ok(FetchAnswer::Coalition {
                    members: vec![i as u32],
                    sizes: vec![m],
                }),
                None => Err(format!("silo {i} has not joined")),
            },
            (1, _) => Ok(match &self.solved {
                None => FetchAnswer::Hold,
                Some(s) => {
                    let mine = s
                        .coalitions
                        .iter()
                        .find(|c| c.contains(&i))
                        .ok_or_else(|| format!("silo {i} is in no coalition"))?;
                    FetchAnswer::Coalition {
                        members: mine.iter().map(|&j| j as u32).collect(),
                        sizes: mine.iter().map(|&j| s.sizes[j]).collect(),
                    }
                }
            }),
            (r, _) => Err(format!(
                "fedcollab has two fetches: 0 (the distance plan) and 1 (the coalition), not {r}"
            )),
        }
    }

    /// Silo `i`'s distances to every other planned silo. True when this was the last report
    /// missing and the structure was solved. A report must name every other planned silo
    /// exactly once; a silo may resend (the same or a corrected report) until the structure is
    /// solved.
    pub fn report(&mut self, i: usize, pairs: Vec<PairDistance>) -> Result<bool, String> {
        let n = self.nodes();
        if i >= n {
            return Err(format!("silo {i} is not one of the run's {n} silos"));
        }
        let Some(planned) = self.joining.participants().map(<[usize]>::to_vec) else {
            return Err("distances before the plan went out".into());
        };
        if !planned.contains(&i) {
            return Err(format!(
                "silo {i} joined after the plan went out: it is in no pair and trains alone"
            ));
        }
        if self.solved.is_some() {
            // The structure is fixed before FL (spec §5): a late resend changes nothing.
            return Ok(false);
        }
        let mut seen = vec![false; n];
        for p in &pairs {
            let j = p.partner as usize;
            if j == i || !planned.contains(&j) {
                return Err(format!(
                    "a distance to silo {j}, which is not a partner of {i}"
                ));
            }
            if std::mem::replace(&mut seen[j], true) {
                return Err(format!("two distances to silo {j}"));
            }
        }
        if seen.iter().filter(|&&s| s).count() != planned.len() - 1 {
            return Err(format!(
                "{} distances; silo {i} has {} partners",
                pairs.len(),
                planned.len() - 1
            ));
        }
        self.reports[i] = Some(pairs);
        if planned.iter().all(|&j| self.reports[j].is_some()) {
            self.solve()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Algorithm 2 on the planned silos' reports (spec §6 phase 3), seeded as the simulator
    /// seeds it. With every silo planned this is exactly the simulator's problem; otherwise the
    /// problem is the planned silos alone, solved in their ascending order.
    fn solve(&mut self) -> Result<(), String> {
        let planned = self
            .joining
            .participants()
            .map(<[usize]>::to_vec)
            .ok_or("no plan")?;
        let n = planned.len();
        let sizes: Vec<u64> = self
            .joining
            .sizes()
            .iter()
            .map(|s| s.unwrap_or(0))
            .collect();
        let planned_sizes: Vec<u64> = planned.iter().map(|&i| sizes[i]).collect();
        let mut d = vec![vec![0.0; n]; n];
        let mut failed = Vec::new();
        for (a, &i) in planned.iter().enumerate() {
            for p in self.reports[i].iter().flatten() {
                let j = p.partner as usize;
                let b = planned
                    .iter()
                    .position(|&x| x == j)
                    .ok_or_else(|| format!("silo {i} reported unplanned silo {j}"))?;
                d[a][b] = p.distance.unwrap_or(1.0);
                if p.distance.is_none() {
                    failed.push((i.min(j), i.max(j)));
                }
            }
        }
        failed.sort_unstable();
        failed.dedup();
        let mismatched: Vec<(usize, usize)> = (0..n)
            .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
            .filter(|&(a, b)| d[a][b] != d[b][a])
            .map(|(a, b)| (planned[a], planned[b]))
            .collect();
        let problem =
            Problem::new(&planned_sizes, &d, self.cfg.capacity).map_err(|e| e.to_string())?;
        let Solution { best, hits, .. } = problem
            .solve_for_run(&self.cfg.solver(), self.seed)
            .map_err(|e| e.to_string())?;
        // `planned` is ascending, so mapping back keeps the coalitions canonical.
        let coalitions = best
            .coalitions
            .iter()
            .map(|c| c.iter().map(|&a| planned[a]).collect())
            .collect();
        self.solved = Some(Solved {
            coalitions,
            objective: best.objective,
            sizes,
            participants: planned,
            distances: d,
            mismatched,
            failed,
            hits,
        });
        Ok(())
    }

    /// The checkpoint's bytes.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = crate::store::header(MAGIC, VERSION);
        let body = Saved {
            sizes: self.joining.sizes().to_vec(),
            participants: self.participants().map(<[usize]>::to_vec),
            reports: self.reports.clone(),
            solved: self.solved.clone(),
        };
        bincode::serde::encode_into_std_write(&body, &mut out, bincode::config::standard())
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Restores a checkpoint for this run's settings (version 1, written before joining could
    /// close early, is read as a plan of every silo once all had joined).
    pub fn decode(cfg: FedCollabConfig, seed: u64, bytes: &[u8]) -> Result<Self, String> {
        let s = crate::store::decode_migrating::<Saved, SavedV1>(bytes, MAGIC, VERSION, 1)?;
        let n = s.sizes.len();
        let mut out = Self::new(cfg, n, seed)?;
        if s.reports.len() != n {
            return Err(format!("{} reports for {n} silos", s.reports.len()));
        }
        if let Some(p) = &s.participants {
            let ascending = p.windows(2).all(|w| w[0] < w[1]);
            if p.len() < 2 || !ascending || p.iter().any(|&i| i >= n || s.sizes[i].is_none()) {
                return Err(format!("planned silos {p:?} are not joined silos of {n}"));
            }
        }
        if let Some(solved) = &s.solved {
            let planned = s
                .participants
                .as_ref()
                .filter(|p| **p == solved.participants)
                .ok_or("a saved structure of other silos than the plan's")?;
            let local: Vec<Vec<usize>> = solved
                .coalitions
                .iter()
                .map(|c| {
                    c.iter()
                        .map(|i| planned.iter().position(|p| p == i))
                        .collect::<Option<Vec<usize>>>()
                })
                .collect::<Option<_>>()
                .ok_or("a saved coalition with a silo outside the plan")?;
            let labels = labels_of(planned.len(), &local).map_err(|e| e.to_string())?;
            if coalitions_of(&labels) != local {
                return Err("a saved structure that is not a canonical partition".into());
            }
        }
        out.joining = Joining::restore(s.sizes, s.participants, 2);
        out.reports = s.reports;
        out.solved = s.solved;
        Ok(out)
    }
}

/// The checkpoint before joining could close early: the plan went out once every silo joined.
#[derive(Serialize, Deserialize)]
struct SavedV1 {
    sizes: Vec<Option<u64>>,
    reports: Vec<Option<Vec<PairDistance>>>,
    solved: Option<SolvedV1>,
}

#[derive(Serialize, Deserialize)]
struct SolvedV1 {
    coalitions: Vec<Vec<usize>>,
    objective: f64,
    sizes: Vec<u64>,
    distances: Vec<Vec<f64>>,
    mismatched: Vec<(usize, usize)>,
    failed: Vec<(usize, usize)>,
    hits: usize,
}

impl From<SavedV1> for Saved {
    fn from(v: SavedV1) -> Self {
        let all: Vec<usize> = (0..v.sizes.len()).collect();
        let participants = v.sizes.iter().all(Option::is_some).then(|| all.clone());
        Saved {
            sizes: v.sizes,
            participants,
            reports: v.reports,
            solved: v.solved.map(|s| Solved {
                coalitions: s.coalitions,
                objective: s.objective,
                sizes: s.sizes,
                participants: all,
                distances: s.distances,
                mismatched: s.mismatched,
                failed: s.failed,
                hits: s.hits,
            }),
        }
    }
}

#[cfg(test)]
mod tests;
