//! The coordinator protocol `/federico/coord/2` (coordinated mode: FedDisco, HCCT, FedSaC and
//! FedCollab): what a node and the thin coordinator say to each other, and the checks a
//! received message must pass before it reaches the coordinator's state.
//!
//! Owns: the node ↔ coordinator messages, the protocol name, and their payload validation.
//! Framing (8-byte length, bincode-2 body, bound checked before allocation) is `frame.rs`'s, so
//! the same size-capped codec serves this protocol.
//! Must not: know about swarms or rounds in progress; define types the coordinator algorithms
//! need (those live in [`crate::coord`], which never imports this module).
//!
//! What crosses the wire: a node's sample count and, for FedDisco, its label-distribution
//! discrepancy (`DiscoReport`, computed locally — the label histogram never leaves the node);
//! its locally trained parameters once per round; and the model it starts the next round from
//! back (FedDisco's global, or for HCCT its group's model); for FedSaC also the node's feature
//! subspace (k directions of its penultimate layer, never the features themselves), and back
//! its personalised model, regulariser direction and cohort membership; for FedCollab only the
//! sample count and one scalar distance per partner (back: the plan's m_train and the silo's own
//! coalition), while discriminator weights and coalition models go silo to silo (`collab.rs`).
//! The sender is the authenticated libp2p peer (Noise), so no message carries its sender's id.

use super::frame::check_vector;
use crate::coord::PairDistance;
use crate::coord::engine::{Answer, Request};
use crate::coord::feddisco::{DiscoReport, Metric};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Node ↔ coordinator requests and responses.
pub const COORD_PROTOCOL: &str = "/federico/coord/2";

/// The most directions a FedSaC subspace may have (the paper uses k = 3).
pub const MAX_SUBSPACE_RANK: usize = 64;

/// Node → coordinator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CoordRequest {
    /// Join (or rejoin) the federation: `(N_k, δ_k)`. Answered with [`CoordResponse::Ack`].
    Register {
        /// `N_k`: labelled training samples.
        n_train: u64,
        /// `δ_k`: discrepancy of the node's label distribution to the uniform target.
        discrepancy: f64,
    },
    /// "Give me the global model of round `round`" (the model the round starts from). Held by
    /// the coordinator until that round's aggregate exists; answered at once if it does.
    Fetch {
        /// The round wanted (0 = the initial model).
        round: u64,
    },
    /// The node's locally trained model of round `round` (trained from global `round`).
    Update {
        /// The round trained.
        round: u64,
        /// Flat parameters in name-sorted order.
        #[serde(with = "super::floats")]
        params: Arc<Vec<f32>>,
        /// `N_k` again (informational; the registered report is used for the weights).
        n_train: u64,
    },
    /// Join (or rejoin) an HCCT federation: the sample count `D_i` is all HCCT weighs by
    /// (the end models sent as [`CoordRequest::Update`] give the coordinator the
    /// pseudo-gradients). Answered with [`CoordResponse::Ack`].
    Join {
        /// `D_i`: training samples.
        n_train: u64,
    },
    /// FedSaC: a cohort member's locally trained model of round `round` and its feature
    /// subspace (`k` orthonormal rows of the penultimate layer's width, computed from its own
    /// samples; `None` when its features had rank below `k`).
    Contribute {
        /// The round trained.
        round: u64,
        /// Flat parameters in name-sorted order.
        #[serde(with = "super::floats")]
        params: Arc<Vec<f32>>,
        /// The subspace's basis rows.
        subspace: Option<Vec<Vec<f64>>>,
    },
    /// FedCollab: the silo's side of every pairwise distance it estimated with its partners
    /// (spec §6 phase 2 → 3): scalars only, never weights or data.
    Distances {
        /// One entry per other silo.
        pairs: Vec<PairDistance>,
    },
}

/// The most silos a FedCollab report may cover.
pub const MAX_PARTNERS: usize = 1 << 16;

/// Coordinator → node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CoordResponse {
    /// The global model the round `round` starts from.
    Global {
        /// Its round.
        round: u64,
        /// Flat parameters in name-sorted order.
        #[serde(with = "super::floats")]
        params: Arc<Vec<f32>>,
    },
    /// FedSaC: the silo's personalised model θ̃ for round `round`, its regulariser direction,
    /// and whether it is in the round's cohort (trains and contributes).
    Assigned {
        /// The round.
        round: u64,
        /// θ̃: train from it, or once the run is over, score it.
        #[serde(with = "super::floats")]
        params: Arc<Vec<f32>>,
        /// c: the direction of its last aggregation.
        #[serde(with = "super::floats::option")]
        direction: Option<Arc<Vec<f32>>>,
        /// In this round's cohort.
        train: bool,
    },
    /// A register or an update was recorded.
    Ack,
    /// The request was refused.
    Error {
        /// Why, in words.
        reason: String,
    },
    /// FedCollab (fetch 0): the plan is out (every silo joined, or the coordinator's join
    /// deadline passed); the discriminator-train target m_train each planned silo cuts its
    /// split to (spec §3.2 step 1), and who estimates distances with whom.
    DiscPlan {
        /// min_i m_i / 2 over the planned silos.
        target: f64,
        /// Silos in the run: manifest members `0..nodes`.
        nodes: u32,
        /// The planned silos, ascending: every pair among them is estimated. A silo not
        /// listed joined too late and trains alone.
        members: Vec<u32>,
    },
    /// FedCollab (fetch 1): the silo's own coalition (ascending manifest indices, itself
    /// included) and the members' sample counts, the FedAvg weights m_j/M_k (spec §6 phase 3,
    /// minimum disclosure).
    Coalition {
        /// Members.
        members: Vec<u32>,
        /// Their m_j, in the same order.
        sizes: Vec<u64>,
    },
    /// HCCT and FedSaC (a fetch): the run started without this silo (it registered after the
    /// coordinator's join deadline closed joining on the silos that came), so it trains alone
    /// for the rest of the run and need not ask again.
    Alone,
}

impl From<CoordRequest> for Request {
    /// The engine's request (`Update`'s `n_train` is informational and dropped).
    fn from(r: CoordRequest) -> Self {
        match r {
            CoordRequest::Register {
                n_train,
                discrepancy,
            } => Request::Register {
                n_train,
                discrepancy,
            },
            CoordRequest::Fetch { round } => Request::Fetch { round },
            CoordRequest::Update { round, params, .. } => Request::Update { round, params },
            CoordRequest::Join { n_train } => Request::Join { n_train },
            CoordRequest::Contribute {
                round,
                params,
                subspace,
            } => Request::Contribute {
                round,
                params,
                subspace,
            },
            CoordRequest::Distances { pairs } => Request::Distances { pairs },
        }
    }
}

impl From<Answer> for CoordResponse {
    fn from(a: Answer) -> Self {
        match a {
            Answer::Global { round, params } => CoordResponse::Global { round, params },
            Answer::Assigned {
                round,
                params,
                direction,
                train,
            } => CoordResponse::Assigned {
                round,
                params,
                direction,
                train,
            },
            Answer::Ack => CoordResponse::Ack,
            Answer::Error { reason } => CoordResponse::Error { reason },
            Answer::DiscPlan {
                target,
                nodes,
                members,
            } => CoordResponse::DiscPlan {
                target,
                nodes,
                members,
            },
            Answer::Coalition { members, sizes } => CoordResponse::Coalition { members, sizes },
            Answer::Alone => CoordResponse::Alone,
        }
    }
}

impl CoordRequest {
    /// The checks a coordinator applies before a request touches its state: a finite
    /// discrepancy in `[0, max]` for the run's metric and class count, at least one sample, and
    /// for updates the right parameter count and finite values. The error is the reason sent
    /// back in [`CoordResponse::Error`].
    pub fn check(&self, metric: Metric, classes: usize, num_params: usize) -> Result<(), String> {
        match self {
            CoordRequest::Register {
                n_train,
                discrepancy,
            } => {
                if *n_train == 0 {
                    return Err("n_train is 0; a node needs at least 1 labelled sample".into());
                }
                DiscoReport {
                    num_samples: *n_train,
                    discrepancy: *discrepancy,
                }
                .check(metric, classes)
                .map_err(|e| e.to_string())
            }
            CoordRequest::Fetch { .. } => Ok(()),
            CoordRequest::Contribute {
                params, subspace, ..
            } => check_model(params, subspace.as_deref(), num_params),
            CoordRequest::Distances { pairs } => {
                if pairs.len() > MAX_PARTNERS {
                    return Err(format!(
                        "{} distances; at most {MAX_PARTNERS} allowed",
                        pairs.len()
                    ));
                }
                match pairs.iter().find(|p| {
                    p.distance
                        .is_some_and(|d| !(d.is_finite() && (-1.0..=1.0).contains(&d)))
                }) {
                    Some(p) => Err(format!(
                        "distance {:?} to silo {}: a distance is 2·BalAcc − 1, in [-1, 1]",
                        p.distance, p.partner
                    )),
                    None => Ok(()),
                }
            }
            CoordRequest::Join { n_train } => {
                if *n_train == 0 {
                    return Err("n_train is 0; a node needs at least 1 labelled sample".into());
                }
                Ok(())
            }
            CoordRequest::Update {
                params, n_train, ..
            } => {
                if *n_train == 0 {
                    return Err("n_train is 0; an update needs at least 1 sample".into());
                }
                check_model(params, None, num_params)
            }
        }
    }
}

/// The checks of a model a member sends a coordinator (`Update`, `Contribute`), and of
/// FedSaC's subspace with it: the right parameter count, finite values, 1 to
/// [`MAX_SUBSPACE_RANK`] rows, none wider than the model. The error is the reason sent back.
pub fn check_model(
    params: &[f32],
    subspace: Option<&[Vec<f64>]>,
    num_params: usize,
) -> Result<(), String> {
    check_vector(params, num_params).map_err(|e| e.to_string())?;
    if let Some(rows) = subspace {
        if rows.is_empty() || rows.len() > MAX_SUBSPACE_RANK {
            return Err(format!(
                "a subspace of {} rows; 1 to {MAX_SUBSPACE_RANK} allowed",
                rows.len()
            ));
        }
        if rows.iter().flatten().any(|v| !v.is_finite()) {
            return Err("a non-finite value in the subspace".into());
        }
        // A feature is narrower than the model that computes it.
        if let Some(r) = rows.iter().find(|r| r.len() > num_params) {
            return Err(format!(
                "a subspace row of {} values for a model of {num_params} parameters",
                r.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{check_len, decode, encode};

    fn roundtrip<M: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(m: M) {
        let frame = encode(&m).unwrap();
        let len = check_len(frame[..8].try_into().unwrap(), 1 << 20).unwrap();
        assert_eq!(len, frame.len() - 8);
        let back: M = decode(&frame[8..]).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn every_message_roundtrips() {
        roundtrip(CoordRequest::Register {
            n_train: 120,
            discrepancy: 0.25,
        });
        roundtrip(CoordRequest::Fetch { round: 7 });
        roundtrip(CoordRequest::Join { n_train: 40 });
        roundtrip(CoordRequest::Contribute {
            round: 2,
            params: Arc::new(vec![0.5; 3]),
            subspace: Some(vec![vec![1.0, 0.0], vec![0.0, 1.0]]),
        });
        roundtrip(CoordResponse::Assigned {
            round: 2,
            params: Arc::new(vec![0.5; 3]),
            direction: Some(Arc::new(vec![0.1; 3])),
            train: true,
        });
        roundtrip(CoordRequest::Update {
            round: 3,
            params: Arc::new(vec![1.0, -2.5, 0.0]),
            n_train: 9,
        });
        roundtrip(CoordResponse::Global {
            round: 4,
            params: Arc::new(vec![0.5; 10]),
        });
        roundtrip(CoordRequest::Distances {
            pairs: vec![PairDistance {
                partner: 3,
                distance: Some(0.25),
                rounds: 101,
            }],
        });
        roundtrip(CoordResponse::DiscPlan {
            target: 7.5,
            nodes: 4,
            members: vec![0, 1, 3],
        });
        roundtrip(CoordResponse::Coalition {
            members: vec![0, 2],
            sizes: vec![40, 41],
        });
        roundtrip(CoordResponse::Ack);
        roundtrip(CoordResponse::Alone);
        roundtrip(CoordResponse::Error {
            reason: "no".into(),
        });
    }

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        // Truncations of a valid frame, garbage, an absurd vector length, trailing bytes.
        let frame = encode(&CoordRequest::Update {
            round: 1,
            params: Arc::new(vec![1.0; 16]),
            n_train: 3,
        })
        .unwrap();
        for cut in 0..frame.len() - 8 {
            assert!(
                decode::<CoordRequest>(&frame[8..8 + cut]).is_err(),
                "cut {cut}"
            );
        }
        assert!(decode::<CoordRequest>(&[0xff; 32]).is_err());
        // Variant 2 (Update), round 1, then a varint length of u64::MAX with no data behind it.
        let absurd = [2u8, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert!(decode::<CoordRequest>(&absurd).is_err());
        let mut trailing = frame[8..].to_vec();
        trailing.push(0);
        assert!(decode::<CoordRequest>(&trailing).is_err());
        for b in [[9u8], [3u8]] {
            assert!(decode::<CoordResponse>(&b).is_err());
        }
        // The frame bound is checked before allocation.
        assert!(check_len((u64::MAX).to_le_bytes(), 1 << 20).is_err());
    }

    #[test]
    fn checks_refuse_bad_reports_and_updates() {
        let ok = CoordRequest::Register {
            n_train: 10,
            discrepancy: 0.3,
        };
        assert!(ok.check(Metric::Kl, 10, 4).is_ok());
        for d in [f64::NAN, -0.1, f64::INFINITY, 1e9] {
            let r = CoordRequest::Register {
                n_train: 10,
                discrepancy: d,
            };
            assert!(r.check(Metric::Kl, 10, 4).is_err(), "{d}");
        }
        let empty = CoordRequest::Register {
            n_train: 0,
            discrepancy: 0.0,
        };
        assert!(empty.check(Metric::Kl, 10, 4).is_err());
        assert!(
            CoordRequest::Join { n_train: 0 }
                .check(Metric::Kl, 10, 4)
                .is_err()
        );
        assert!(
            CoordRequest::Join { n_train: 1 }
                .check(Metric::Kl, 10, 4)
                .is_ok()
        );
        let contribute = |params: Vec<f32>, subspace: Option<Vec<Vec<f64>>>| {
            CoordRequest::Contribute {
                round: 0,
                params: Arc::new(params),
                subspace,
            }
            .check(Metric::Kl, 10, 4)
        };
        assert!(contribute(vec![0.0; 4], Some(vec![vec![1.0, 0.0]])).is_ok());
        assert!(contribute(vec![0.0; 4], None).is_ok());
        assert!(contribute(vec![0.0; 3], None).is_err());
        assert!(contribute(vec![0.0; 4], Some(vec![])).is_err());
        assert!(contribute(vec![0.0; 4], Some(vec![vec![f64::NAN]])).is_err());
        assert!(contribute(vec![0.0; 4], Some(vec![vec![1.0]; 65])).is_err());
        assert!(contribute(vec![0.0; 4], Some(vec![vec![0.0; 5]])).is_err());
        let up = |params: Vec<f32>| CoordRequest::Update {
            round: 0,
            params: Arc::new(params),
            n_train: 5,
        };
        assert!(up(vec![0.0; 4]).check(Metric::Kl, 10, 4).is_ok());
        assert!(up(vec![0.0; 3]).check(Metric::Kl, 10, 4).is_err());
        assert!(
            up(vec![0.0, f32::NAN, 0.0, 0.0])
                .check(Metric::Kl, 10, 4)
                .is_err()
        );
        assert!(
            CoordRequest::Fetch { round: 99 }
                .check(Metric::Kl, 10, 4)
                .is_ok()
        );
        let dist = |d: Option<f64>| CoordRequest::Distances {
            pairs: vec![PairDistance {
                partner: 1,
                distance: d,
                rounds: 5,
            }],
        };
        assert!(dist(Some(0.5)).check(Metric::Kl, 10, 4).is_ok());
        assert!(dist(Some(-0.02)).check(Metric::Kl, 10, 4).is_ok());
        assert!(dist(None).check(Metric::Kl, 10, 4).is_ok());
        for bad in [f64::NAN, 1.5, -2.0, f64::INFINITY] {
            assert!(dist(Some(bad)).check(Metric::Kl, 10, 4).is_err(), "{bad}");
        }
    }
}
