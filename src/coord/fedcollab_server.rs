//! FedCollab's thin coordinator state (issue 5 over libp2p; spec §6): who joined with how many
//! samples, the distance plan, the silos' distance reports, and the collaboration structure
//! solved from them.
//! Owns: the phases (joining → estimating → solved), the check that a silo's report covers
//! every other silo exactly once, the agreement check between the two reports of a pair, the
//! solve (Algorithm 2 with the simulator's seed stream, so a swarm forms the coalitions
//! `simulate` forms), each silo's answer (the plan, then its own coalition only — minimum
//! disclosure, spec §6 phase 3), and the checkpoint.
//! Must not: see data, discriminator weights or models (the silos estimate distances among
//! themselves and run FedAvg inside their coalitions peer to peer), or know about transports.
//!
//! Silos are named by their index in the federation's manifest, as in the simulator.

use super::fedcollab::{
    FedCollabConfig, Problem, Solution, coalitions_of, disc_train_target, labels_of,
};
use crate::coord_wire::PairDistance;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"FEDCOLB1";
const VERSION: u32 = 1;

/// The answer to a fetch.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchAnswer {
    /// Not yet: hold the fetch.
    Hold,
    /// Round 0: every silo joined.
    Plan {
        /// The discriminator-train target m_train.
        target: f64,
        /// Silos in the run.
        nodes: u32,
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
    /// Canonical coalitions.
    pub coalitions: Vec<Vec<usize>>,
    /// L of the structure.
    pub objective: f64,
    /// m_i.
    pub sizes: Vec<u64>,
    /// The raw reports, `d[i][j]` as silo i reported it (1 where it had none).
    pub distances: Vec<Vec<f64>>,
    /// Pairs whose two reports differ (both sides run the same protocol on the same numbers,
    /// so a difference means a failed pair or a misbehaving silo), `i < j`.
    pub mismatched: Vec<(usize, usize)>,
    /// Pairs one side could not run (their distance counts as 1), `i < j`.
    pub failed: Vec<(usize, usize)>,
    /// Restarts that reached the best objective.
    pub hits: usize,
}

#[derive(Serialize, Deserialize)]
struct Saved {
    sizes: Vec<Option<u64>>,
    reports: Vec<Option<Vec<PairDistance>>>,
    solved: Option<Solved>,
}

/// The coordinator's FedCollab state.
pub struct FedCollabServer {
    cfg: FedCollabConfig,
    seed: u64,
    sizes: Vec<Option<u64>>,
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
            sizes: vec![None; nodes],
            reports: vec![None; nodes],
            solved: None,
        })
    }

    /// Silos of the run.
    pub fn nodes(&self) -> usize {
        self.sizes.len()
    }

    /// Silos that joined.
    pub fn registered(&self) -> usize {
        self.sizes.iter().flatten().count()
    }

    /// Every silo joined: the plan is out.
    pub fn ready(&self) -> bool {
        self.sizes.iter().all(Option::is_some)
    }

    /// The structure, once solved.
    pub fn solved(&self) -> Option<&Solved> {
        self.solved.as_ref()
    }

    /// Silo `i` joins with `n_train` samples. Rejoining with the same count is fine (a
    /// restarted silo); a changed count once the plan is out is refused, since every silo's
    /// discriminator split was cut from the sizes it was given.
    pub fn register(&mut self, i: usize, n_train: u64) -> Result<(), String> {
        let n = self.nodes();
        let plan_out = self.ready();
        let solved = self.solved.is_some();
        let slot = self
            .sizes
            .get_mut(i)
            .ok_or_else(|| format!("silo {i} is not one of the run's {n} silos"))?;
        match *slot {
            Some(old) if old != n_train && solved => Err(format!(
                "silo {i} joined with {old} samples and now says {n_train}; the structure is \
                 already solved on {old}"
            )),
            Some(old) if old != n_train && plan_out => Err(format!(
                "silo {i} joined with {old} samples and now says {n_train}; the distance plan \
                 was cut from {old}"
            )),
            _ => {
                *slot = Some(n_train);
                Ok(())
            }
        }
    }

    /// Round 0 is the distance plan, round 1 the silo's coalition.
    pub fn fetch(&self, i: usize, round: u64) -> Result<FetchAnswer, String> {
        if i >= self.nodes() {
            return Err(format!(
                "silo {i} is not one of the run's {} silos",
                self.nodes()
            ));
        }
        match round {
            0 if !self.ready() => Ok(FetchAnswer::Hold),
            0 => {
                let sizes: Vec<u64> = self.sizes.iter().flatten().copied().collect();
                Ok(FetchAnswer::Plan {
                    target: disc_train_target(&sizes),
                    nodes: self.nodes() as u32,
                })
            }
            1 => Ok(match &self.solved {
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
            r => Err(format!(
                "fedcollab has two fetches: 0 (the distance plan) and 1 (the coalition), not {r}"
            )),
        }
    }

    /// Silo `i`'s distances to every other silo. True when this was the last report missing
    /// and the structure was solved. A report must name every other silo exactly once; a silo
    /// may resend (the same or a corrected report) until the structure is solved.
    pub fn report(&mut self, i: usize, pairs: Vec<PairDistance>) -> Result<bool, String> {
        let n = self.nodes();
        if i >= n {
            return Err(format!("silo {i} is not one of the run's {n} silos"));
        }
        if !self.ready() {
            return Err("distances before every silo joined (no plan was issued)".into());
        }
        if self.solved.is_some() {
            // The structure is fixed before FL (spec §5): a late resend changes nothing.
            return Ok(false);
        }
        let mut seen = vec![false; n];
        for p in &pairs {
            let j = p.partner as usize;
            if j >= n || j == i {
                return Err(format!(
                    "a distance to silo {j}, which is not a partner of {i}"
                ));
            }
            if std::mem::replace(&mut seen[j], true) {
                return Err(format!("two distances to silo {j}"));
            }
        }
        if seen.iter().filter(|&&s| s).count() != n - 1 {
            return Err(format!(
                "{} distances; silo {i} has {} partners",
                pairs.len(),
                n - 1
            ));
        }
        self.reports[i] = Some(pairs);
        if self.reports.iter().all(Option::is_some) {
            self.solve()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Algorithm 2 on the reports (spec §6 phase 3), seeded as the simulator seeds it.
    fn solve(&mut self) -> Result<(), String> {
        let n = self.nodes();
        let sizes: Vec<u64> = self.sizes.iter().map(|s| s.unwrap_or(0)).collect();
        let mut d = vec![vec![0.0; n]; n];
        let mut failed = Vec::new();
        for (i, report) in self.reports.iter().enumerate() {
            for p in report.iter().flatten() {
                let j = p.partner as usize;
                d[i][j] = p.distance.unwrap_or(1.0);
                if p.distance.is_none() {
                    failed.push((i.min(j), i.max(j)));
                }
            }
        }
        failed.sort_unstable();
        failed.dedup();
        let mismatched: Vec<(usize, usize)> = (0..n)
            .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
            .filter(|&(i, j)| d[i][j] != d[j][i])
            .collect();
        let problem = Problem::new(&sizes, &d, self.cfg.capacity).map_err(|e| e.to_string())?;
        let Solution { best, hits, .. } = problem
            .solve_for_run(&self.cfg.solver(), self.seed)
            .map_err(|e| e.to_string())?;
        self.solved = Some(Solved {
            coalitions: best.coalitions,
            objective: best.objective,
            sizes,
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
            sizes: self.sizes.clone(),
            reports: self.reports.clone(),
            solved: self.solved.clone(),
        };
        bincode::serde::encode_into_std_write(&body, &mut out, bincode::config::standard())
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Restores a checkpoint for this run's settings.
    pub fn decode(cfg: FedCollabConfig, seed: u64, bytes: &[u8]) -> Result<Self, String> {
        let body = crate::store::strip_header(bytes, MAGIC, VERSION)?;
        let (s, used): (Saved, usize) =
            crate::store::decode_bounded(body).map_err(|e| format!("undecodable ({e})"))?;
        if used != body.len() {
            return Err("trailing bytes".into());
        }
        let mut out = Self::new(cfg, s.sizes.len(), seed)?;
        if s.reports.len() != s.sizes.len() {
            return Err(format!(
                "{} reports for {} silos",
                s.reports.len(),
                s.sizes.len()
            ));
        }
        if let Some(solved) = &s.solved {
            let labels = labels_of(s.sizes.len(), &solved.coalitions).map_err(|e| e.to_string())?;
            if coalitions_of(&labels) != solved.coalitions {
                return Err("a saved structure that is not a canonical partition".into());
            }
        }
        out.sizes = s.sizes;
        out.reports = s.reports;
        out.solved = s.solved;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pd(partner: u32, d: f64) -> PairDistance {
        PairDistance {
            partner,
            distance: Some(d),
            rounds: 101,
        }
    }

    fn cfg() -> FedCollabConfig {
        FedCollabConfig {
            restarts: 10,
            ..Default::default()
        }
    }

    /// Four silos of two types (distance 1 across, 0 within): the plan waits for every join,
    /// the coalitions are the two types, each silo hears only its own, and a restore from the
    /// checkpoint answers the same.
    #[test]
    fn joins_plan_reports_and_a_two_type_structure() {
        let mut s = FedCollabServer::new(cfg(), 4, 7).unwrap();
        for i in 0..3 {
            s.register(i, 100).unwrap();
        }
        assert_eq!(s.fetch(0, 0).unwrap(), FetchAnswer::Hold);
        assert!(s.report(0, vec![]).is_err(), "no plan yet");
        s.register(3, 60).unwrap();
        assert_eq!(
            s.fetch(2, 0).unwrap(),
            FetchAnswer::Plan {
                target: 30.0,
                nodes: 4
            }
        );
        assert!(s.register(3, 61).is_err(), "the plan was cut from 60");
        s.register(3, 60).unwrap();
        let ty = |i: u32| i % 2;
        let row = |i: u32| -> Vec<PairDistance> {
            (0..4)
                .filter(|&j| j != i)
                .map(|j| pd(j, if ty(i) == ty(j) { 0.0 } else { 1.0 }))
                .collect()
        };
        assert!(
            s.report(0, row(0)[..2].to_vec()).is_err(),
            "a partner missing"
        );
        let mut dup = row(0);
        dup[2] = pd(1, 0.5);
        assert!(s.report(0, dup).is_err(), "a partner twice");
        assert!(
            s.report(0, vec![pd(0, 0.0), pd(1, 0.0), pd(2, 0.0)])
                .is_err()
        );
        for i in 0..3u32 {
            assert!(!s.report(i as usize, row(i)).unwrap());
        }
        assert_eq!(s.fetch(0, 1).unwrap(), FetchAnswer::Hold);
        assert!(s.report(3, row(3)).unwrap());
        let solved = s.solved().unwrap().clone();
        assert_eq!(solved.coalitions, vec![vec![0, 2], vec![1, 3]]);
        assert!(solved.mismatched.is_empty() && solved.failed.is_empty());
        assert_eq!(
            s.fetch(3, 1).unwrap(),
            FetchAnswer::Coalition {
                members: vec![1, 3],
                sizes: vec![100, 60]
            }
        );
        assert!(s.fetch(3, 2).is_err());
        assert!(s.fetch(4, 0).is_err());
        let back = FedCollabServer::decode(cfg(), 7, &s.encode().unwrap()).unwrap();
        assert_eq!(back.solved(), Some(&solved));
        assert_eq!(back.fetch(1, 1).unwrap(), s.fetch(1, 1).unwrap());
        let mut bytes = s.encode().unwrap();
        bytes.push(0);
        assert!(FedCollabServer::decode(cfg(), 7, &bytes).is_err());
    }

    /// A failed pair counts as far apart, and two reports of a pair that differ are flagged
    /// and averaged by the solver's preparation.
    #[test]
    fn failed_and_mismatched_pairs_are_recorded() {
        let mut s = FedCollabServer::new(cfg(), 3, 1).unwrap();
        for i in 0..3 {
            s.register(i, 50).unwrap();
        }
        let none = |p| PairDistance {
            partner: p,
            distance: None,
            rounds: 0,
        };
        s.report(0, vec![pd(1, 0.1), none(2)]).unwrap();
        s.report(1, vec![pd(0, 0.3), pd(2, 0.9)]).unwrap();
        s.report(2, vec![pd(0, 0.2), pd(1, 0.9)]).unwrap();
        let solved = s.solved().unwrap();
        assert_eq!(solved.failed, vec![(0, 2)]);
        assert_eq!(solved.mismatched, vec![(0, 1), (0, 2)]);
        assert_eq!(solved.distances[0][2], 1.0);
    }
}
