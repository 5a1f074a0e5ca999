//! The thin FedDisco coordinator's state, without a network (issue 5, coordinated mode): who
//! registered with which `(N_k, δ_k)`, the current global model and its round, the updates
//! received for that round, closing a round, answering fetches, and the checkpoint.
//! Owns: the round rule — a round closes when every registered node sent its update, or at
//! the deadline with whoever did; the weights are [`feddisco::weights`] over the reports of
//! the nodes that sent (so renormalised over them), in peer-id order, and the new global is
//! [`feddisco::aggregate`] of their models. A round with no update keeps the global.
//! Must not: train, see data, or wait on anything (the network driver owns the clock).

use crate::coord::feddisco::{DiscoReport, Params, Robust};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the coordinator knows. `round` is the round the current global starts: nodes fetch
/// global `round`, train it, and send an update for `round`; closing makes global `round + 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerState {
    /// The round the current global starts (0 = the initial model).
    pub round: u64,
    /// The current global model.
    pub global: Arc<Vec<f32>>,
    /// Registered nodes (peer id → report), in peer-id order.
    pub reports: BTreeMap<String, DiscoReport>,
    /// Updates received for `round` (not checkpointed: a restarted coordinator waits for the
    /// deadline or fresh updates).
    pub pending: BTreeMap<String, Arc<Vec<f32>>>,
}

/// The answer to a fetch.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchAnswer {
    /// The global of `round` (the newest one when an older round was asked for).
    Now {
        /// Its round.
        round: u64,
        /// Its parameters.
        params: Arc<Vec<f32>>,
    },
    /// That round's global does not exist yet: hold the request until it does.
    Hold,
}

/// One closed round, as logged (one JSONL line per round).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoundLog {
    /// The round that closed (its global was the start model).
    pub round: u64,
    /// Registered nodes at closing.
    pub registered: usize,
    /// Nodes whose update was aggregated, in weight order.
    pub peers: Vec<String>,
    /// Their FedDisco weights `p_k` (empty when nobody sent: the global is kept).
    pub weights: Vec<f64>,
    /// Their `n_k`.
    pub n: Vec<f64>,
    /// Their `d_k`.
    pub d: Vec<f64>,
    /// Scores clipped at 0.
    pub clipped: usize,
    /// Every score ≤ 0, so `p = n`.
    pub fell_back: bool,
    /// Closed at the deadline rather than with every registered node.
    pub timed_out: bool,
    /// Senders whose `n_k` was capped ([`Robust`]; absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub sizes_capped: usize,
    /// Updates scaled back ([`Robust`]; absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub updates_clipped: usize,
    /// Weights cut to the cap ([`Robust`]; absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub weights_capped: usize,
    /// Models `Krum` left out, each at weight 0 in `weights` ([`Robust`]; absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub models_dropped: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl ServerState {
    /// A fresh coordinator holding the initial model.
    pub fn new(initial: Vec<f32>) -> Self {
        Self {
            round: 0,
            global: Arc::new(initial),
            reports: BTreeMap::new(),
            pending: BTreeMap::new(),
        }
    }

    /// Records (or replaces) a node's report.
    pub fn register(&mut self, peer: &str, report: DiscoReport) {
        self.reports.insert(peer.to_string(), report);
    }

    /// Records a node's update for `round`. Refused: an unregistered node, another round than
    /// the open one, or a model of the wrong size. A second update for the round replaces the
    /// first. Returns true when every registered node has now sent (the round may close).
    pub fn update(
        &mut self,
        peer: &str,
        round: u64,
        params: Arc<Vec<f32>>,
    ) -> Result<bool, String> {
        if !self.reports.contains_key(peer) {
            return Err(format!("{peer} sent an update without registering"));
        }
        if round != self.round {
            return Err(format!(
                "update for round {round}, but round {} is open",
                self.round
            ));
        }
        if params.len() != self.global.len() {
            return Err(format!(
                "{} parameters where the model has {}",
                params.len(),
                self.global.len()
            ));
        }
        self.pending.insert(peer.to_string(), params);
        Ok(self.all_in())
    }

    /// Every registered node has sent its update for the open round.
    pub fn all_in(&self) -> bool {
        !self.reports.is_empty() && self.reports.keys().all(|p| self.pending.contains_key(p))
    }

    /// The registered nodes the open round still awaits an update from.
    pub fn waiting(&self) -> Vec<String> {
        self.reports
            .keys()
            .filter(|p| !self.pending.contains_key(*p))
            .cloned()
            .collect()
    }

    /// Closes the open round: weights over the senders' reports, aggregate, bump the round.
    /// `timed_out` is only recorded.
    pub fn close(
        &mut self,
        params: &Params,
        robust: &Robust,
        timed_out: bool,
    ) -> Result<RoundLog, String> {
        let senders: Vec<&String> = self.pending.keys().collect();
        let mut log = RoundLog {
            round: self.round,
            registered: self.reports.len(),
            peers: senders.iter().map(|s| s.to_string()).collect(),
            weights: vec![],
            n: vec![],
            d: vec![],
            clipped: 0,
            fell_back: false,
            timed_out,
            sizes_capped: 0,
            updates_clipped: 0,
            weights_capped: 0,
            models_dropped: 0,
        };
        if !senders.is_empty() {
            let reports: Vec<DiscoReport> = senders.iter().map(|p| self.reports[*p]).collect();
            let models: Vec<&[f32]> = self.pending.values().map(|m| m.as_slice()).collect();
            let (w, global, defended) = robust
                .aggregate(&reports, &models, &self.global, params)
                .map_err(|e| e.to_string())?;
            self.global = Arc::new(global);
            log.sizes_capped = defended.sizes_capped;
            log.updates_clipped = defended.updates_clipped;
            log.weights_capped = defended.weights_capped;
            log.models_dropped = defended.models_dropped;
            log.weights = w.p;
            log.n = w.n;
            log.d = w.d;
            log.clipped = w.clipped;
            log.fell_back = w.fell_back;
        }
        self.pending.clear();
        self.round += 1;
        Ok(log)
    }

    /// Answers a fetch of global `round`.
    pub fn fetch(&self, round: u64) -> FetchAnswer {
        if round > self.round {
            FetchAnswer::Hold
        } else {
            FetchAnswer::Now {
                round: self.round,
                params: self.global.clone(),
            }
        }
    }

    /// The checkpoint's bytes: versioned header, then round, global and reports.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = crate::store::header(MAGIC, VERSION);
        let body = Saved {
            round: self.round,
            global: self.global.to_vec(),
            reports: self.reports.iter().map(|(p, r)| (p.clone(), *r)).collect(),
        };
        bincode::serde::encode_into_std_write(&body, &mut out, bincode::config::standard())
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Restores a checkpoint (header, version and body checked; no pending updates).
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let body = crate::store::strip_header(bytes, MAGIC, VERSION)?;
        let (s, n): (Saved, usize) =
            bincode::serde::decode_from_slice(body, bincode::config::standard())
                .map_err(|e| format!("undecodable ({e})"))?;
        if n != body.len() {
            return Err("trailing bytes".into());
        }
        Ok(Self {
            round: s.round,
            global: Arc::new(s.global),
            reports: s.reports.into_iter().collect(),
            pending: BTreeMap::new(),
        })
    }

    /// Writes the checkpoint to `path`: sealed, atomically, the previous generation kept
    /// ([`crate::store::save`]).
    pub fn save(&self, path: &std::path::Path) -> Result<(), String> {
        crate::store::save(path, &self.encode()?).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Reads a checkpoint; `None` when there is none yet; a damaged latest falls back to the
    /// previous generation ([`crate::store::load`]).
    pub fn load(path: &std::path::Path) -> Result<Option<Self>, String> {
        Ok(crate::store::load(path, Self::decode)
            .map_err(|e| format!("checkpoint {e}"))?
            .map(|l| l.value))
    }
}

const MAGIC: &[u8; 8] = b"FEDCOORD";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Saved {
    round: u64,
    global: Vec<f32>,
    reports: Vec<(String, DiscoReport)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(n: u64, d: f64) -> DiscoReport {
        DiscoReport {
            num_samples: n,
            discrepancy: d,
        }
    }

    fn three() -> ServerState {
        let mut s = ServerState::new(vec![0.0; 2]);
        s.register("a", rep(10, 0.1));
        s.register("b", rep(30, 0.5));
        s.register("c", rep(60, 0.0));
        s
    }

    #[test]
    fn a_full_round_uses_feddisco_weights_in_peer_order() {
        let mut s = three();
        assert!(!s.update("b", 0, Arc::new(vec![2.0, 0.0])).unwrap());
        assert!(!s.update("a", 0, Arc::new(vec![1.0, 1.0])).unwrap());
        assert!(s.update("c", 0, Arc::new(vec![0.0, 3.0])).unwrap());
        let p = Params::default();
        let log = s.close(&p, &Robust::NONE, false).unwrap();
        let want = crate::coord::feddisco::weights(&[rep(10, 0.1), rep(30, 0.5), rep(60, 0.0)], &p)
            .unwrap();
        assert_eq!(log.peers, ["a", "b", "c"]);
        assert_eq!(log.weights, want.p);
        let g =
            crate::coord::feddisco::aggregate(&[&[1.0, 1.0], &[2.0, 0.0], &[0.0, 3.0]], &want.p)
                .unwrap();
        assert_eq!(*s.global, g);
        assert_eq!(s.round, 1);
        assert!(s.pending.is_empty());
    }

    #[test]
    fn a_deadline_round_renormalises_over_the_senders() {
        let mut s = three();
        s.update("a", 0, Arc::new(vec![1.0, 1.0])).unwrap();
        s.update("c", 0, Arc::new(vec![0.0, 3.0])).unwrap();
        assert!(!s.all_in());
        let p = Params::default();
        let log = s.close(&p, &Robust::NONE, true).unwrap();
        let want = crate::coord::feddisco::weights(&[rep(10, 0.1), rep(60, 0.0)], &p).unwrap();
        assert_eq!(log.weights, want.p);
        assert!((log.weights.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(log.timed_out);
        assert_eq!(log.registered, 3);
    }

    /// Insiders' review D3, as the member did it: it registers with `n_train = 10^12` and
    /// sends ±10^6 parameters; the honest three send models near the global.
    #[test]
    fn a_member_lying_about_its_size_and_sending_huge_parameters_is_contained() {
        let run = |robust: &Robust| {
            let mut s = ServerState::new(vec![0.0; 4]);
            for (p, n) in [("a", 40), ("b", 40), ("c", 40), ("liar", 1_000_000_000_000)] {
                s.register(p, rep(n, 0.1));
            }
            s.update("a", 0, Arc::new(vec![0.1, 0.0, 0.0, 0.0]))
                .unwrap();
            s.update("b", 0, Arc::new(vec![0.0, 0.1, 0.0, 0.0]))
                .unwrap();
            s.update("c", 0, Arc::new(vec![0.0, 0.0, 0.1, 0.0]))
                .unwrap();
            s.update("liar", 0, Arc::new(vec![1e6, -1e6, 1e6, -1e6]))
                .unwrap();
            let log = s.close(&Params::default(), robust, false).unwrap();
            let liar = log.peers.iter().position(|p| p == "liar").unwrap();
            let moved = s
                .global
                .iter()
                .map(|x| f64::from(*x).powi(2))
                .sum::<f64>()
                .sqrt();
            (log.weights[liar], moved, log)
        };
        let (w, moved, _) = run(&Robust::NONE);
        assert!(w > 0.75, "undefended, the liar takes the weight: {w}");
        assert!(moved > 1e5, "and the global: {moved}");
        let robust = Robust {
            size_cap: Some(2.0),
            update_clip: Some(3.0),
            weight_cap: Some(1.5),
            ..Robust::NONE
        };
        let (w, moved, log) = run(&robust);
        // Its size counts as twice the median (80 rows against 3 × 40): about 0.42 of the
        // weight, where a silo of the median's size gets about 0.19; the cap is 1.5 / 4.
        assert!(w <= 0.375 + 1e-12, "{w}");
        // Its move is cut to 3 × the median move (0.1): the global moves about 0.42 × 0.3,
        // plus the honest 0.58 × 0.1 spread over three coordinates.
        assert!(moved < 0.2, "{moved}");
        assert_eq!(
            (log.sizes_capped, log.updates_clipped, log.weights_capped),
            (1, 1, 1)
        );
        // The honest round alone is bit for bit the undefended one.
        let honest = |robust: &Robust| {
            let mut s = three();
            s.update("a", 0, Arc::new(vec![1.0, 1.0])).unwrap();
            s.update("b", 0, Arc::new(vec![2.0, 0.0])).unwrap();
            s.update("c", 0, Arc::new(vec![0.0, 3.0])).unwrap();
            s.close(&Params::default(), robust, false).unwrap();
            s.global
        };
        let loose = Robust {
            size_cap: Some(6.0),
            update_clip: Some(3.0),
            weight_cap: Some(3.0),
            ..Robust::NONE
        };
        assert_eq!(honest(&loose), honest(&Robust::NONE));
    }

    #[test]
    fn an_empty_round_keeps_the_global() {
        let mut s = three();
        let before = s.global.clone();
        let log = s.close(&Params::default(), &Robust::NONE, true).unwrap();
        assert!(log.peers.is_empty() && log.weights.is_empty());
        assert_eq!(s.global, before);
        assert_eq!(s.round, 1);
    }

    #[test]
    fn bad_updates_are_refused() {
        let mut s = three();
        assert!(s.update("z", 0, Arc::new(vec![0.0; 2])).is_err());
        assert!(s.update("a", 1, Arc::new(vec![0.0; 2])).is_err());
        assert!(s.update("a", 0, Arc::new(vec![0.0; 3])).is_err());
        assert!(s.pending.is_empty());
    }

    #[test]
    fn fetches_are_held_until_the_round_exists() {
        let mut s = three();
        assert_eq!(s.fetch(1), FetchAnswer::Hold);
        for p in ["a", "b", "c"] {
            s.update(p, 0, Arc::new(vec![1.0, 1.0])).unwrap();
        }
        s.close(&Params::default(), &Robust::NONE, false).unwrap();
        match s.fetch(1) {
            FetchAnswer::Now { round, params } => {
                assert_eq!(round, 1);
                assert_eq!(*params, vec![1.0, 1.0]);
            }
            FetchAnswer::Hold => panic!("round 1 exists"),
        }
        // An older round is answered with the newest global.
        assert!(matches!(s.fetch(0), FetchAnswer::Now { round: 1, .. }));
    }

    #[test]
    fn checkpoints_roundtrip_and_refuse_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coordinator.bin");
        assert_eq!(ServerState::load(&path).unwrap(), None);
        let mut s = three();
        for p in ["a", "b", "c"] {
            s.update(p, 0, Arc::new(vec![0.5, -1.0])).unwrap();
        }
        s.close(&Params::default(), &Robust::NONE, false).unwrap();
        s.update("a", 1, Arc::new(vec![9.0, 9.0])).unwrap();
        s.save(&path).unwrap();
        let back = ServerState::load(&path).unwrap().unwrap();
        assert_eq!(back.round, 1);
        assert_eq!(back.global, s.global);
        assert_eq!(back.reports, s.reports);
        assert!(back.pending.is_empty());
        let file = std::fs::read(&path).unwrap();
        let bytes = crate::store::unseal(&file).unwrap().bytes().to_vec();
        assert!(matches!(
            crate::store::unseal(&file),
            Ok(crate::store::Unsealed::Checked(_))
        ));
        assert!(ServerState::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(ServerState::decode(&bytes[..10]).is_err());
        let mut other = bytes.clone();
        other[0] = b'X';
        assert!(ServerState::decode(&other).is_err());
        let mut longer = bytes;
        longer.push(0);
        assert!(ServerState::decode(&longer).is_err());
    }
}
