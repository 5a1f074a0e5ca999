//! FedCollab's silo ↔ silo protocol `/federico/collab/2` (FedCollab spec §6 phases 2 and 4):
//! pairwise discriminator rounds and coalition models, with no coordinator in the loop.
//!
//! Owns: the silo ↔ silo messages, the protocol name, and their payload validation (weight
//! counts, finiteness, accuracies in [0, 1]).
//! Must not: frame or decode bytes (that is `frame.rs`), or know about pairs in progress.

use super::frame::check_vector;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// FedCollab's silo ↔ silo protocol (spec §6 phases 2 and 4): the pairwise discriminator
/// rounds and the FedAvg model exchange inside a coalition, with no coordinator in the loop.
pub const COLLAB_PROTOCOL: &str = "/federico/collab/2";

/// Silo → silo (FedCollab). The sender is the authenticated peer; its manifest index says
/// which pair or coalition member it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CollabRequest {
    /// From a pair's higher-index silo: its discriminator weights after the SGD steps of round
    /// `round` (from the pair's current average), and its validation accuracy of the pair's
    /// previous evaluation, if that round was evaluated. Answered with
    /// [`CollabResponse::DiscStep`].
    DiscStep {
        /// The pair's round (0-based).
        round: u32,
        /// The sender's weights.
        #[serde(with = "super::floats")]
        weights: Arc<Vec<f32>>,
        /// The sender's accuracy of the previous evaluated average.
        acc: Option<f64>,
    },
    /// From a pair's higher-index silo: the pair stopped after `rounds` rounds; its accuracy of
    /// the last evaluation, if the last round was evaluated. Answered with
    /// [`CollabResponse::Ack`].
    DiscDone {
        /// Rounds run.
        rounds: u32,
        /// The sender's accuracy of the last evaluated average.
        acc: Option<f64>,
    },
    /// From a coalition member: this silo's locally trained model of FL round `round`. Held
    /// until the silo has trained that round.
    Model {
        /// The FL round (0-based).
        round: u64,
    },
}

/// Silo → silo answers (FedCollab).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CollabResponse {
    /// The lower-index silo's weights of the same round, and its accuracy of the round's
    /// average when the round is evaluated.
    DiscStep {
        /// Its weights.
        #[serde(with = "super::floats")]
        weights: Arc<Vec<f32>>,
        /// Its accuracy of this round's average, if evaluated.
        acc: Option<f64>,
    },
    /// A trained model of an FL round.
    Model {
        /// The round.
        round: u64,
        /// Flat parameters in name-sorted order.
        #[serde(with = "super::floats")]
        params: Arc<Vec<f32>>,
    },
    /// Recorded.
    Ack,
    /// Refused (final: asking again gets the same answer).
    Error {
        /// Why, in words.
        reason: String,
    },
    /// To a pair's driver: this side does not hold the pair the request continues (it was
    /// restarted and its pair had not finished): start the pair over from round 0. Both
    /// halves are deterministic, so the rerun ends with the distance the first run would have.
    Restart,
    /// Not possible yet (the silo has no distance plan, so no discriminator): ask again.
    NotReady {
        /// Why, in words.
        reason: String,
    },
}

/// An accuracy a silo reports must be a fraction.
fn check_acc(acc: Option<f64>) -> Result<(), String> {
    match acc {
        Some(a) if !(a.is_finite() && (0.0..=1.0).contains(&a)) => {
            Err(format!("accuracy {a} is not a fraction in [0, 1]"))
        }
        _ => Ok(()),
    }
}

impl CollabRequest {
    /// Checks before a request reaches a silo's state: finite weights of the discriminator's
    /// size, accuracies in [0, 1].
    pub fn check(&self, disc_params: usize) -> Result<(), String> {
        match self {
            CollabRequest::DiscStep { weights, acc, .. } => {
                check_acc(*acc)?;
                check_vector(weights, disc_params).map_err(|e| e.to_string())
            }
            CollabRequest::DiscDone { acc, .. } => check_acc(*acc),
            CollabRequest::Model { .. } => Ok(()),
        }
    }
}

impl CollabResponse {
    /// Checks before an answer reaches a silo's state (`expected`: the vector length).
    pub fn check(&self, expected: usize) -> Result<(), String> {
        match self {
            CollabResponse::DiscStep { weights, acc } => {
                check_acc(*acc)?;
                check_vector(weights, expected).map_err(|e| e.to_string())
            }
            CollabResponse::Model { params, .. } => {
                check_vector(params, expected).map_err(|e| e.to_string())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collab_checks_refuse_bad_weights_and_accuracies() {
        let step = |w: Vec<f32>, acc| CollabRequest::DiscStep {
            round: 0,
            weights: Arc::new(w),
            acc,
        };
        assert!(step(vec![0.0; 3], Some(0.5)).check(3).is_ok());
        assert!(step(vec![0.0; 3], None).check(3).is_ok());
        assert!(step(vec![0.0; 2], None).check(3).is_err());
        assert!(step(vec![0.0, f32::NAN, 0.0], None).check(3).is_err());
        assert!(step(vec![0.0; 3], Some(1.5)).check(3).is_err());
        assert!(step(vec![0.0; 3], Some(f64::NAN)).check(3).is_err());
        assert!(
            CollabRequest::DiscDone {
                rounds: 3,
                acc: Some(-0.1)
            }
            .check(3)
            .is_err()
        );
        let model = |p: Vec<f32>| CollabResponse::Model {
            round: 1,
            params: Arc::new(p),
        };
        assert!(model(vec![1.0; 4]).check(4).is_ok());
        assert!(model(vec![1.0; 5]).check(4).is_err());
        assert!(model(vec![f32::INFINITY; 4]).check(4).is_err());
    }
}
