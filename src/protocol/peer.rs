//! What FedeRiCo peers say to each other (spec `federico.md` §3.3): model pulls, round
//! notices and fetches on `/federico/model/2`, weighted gradients and skips on
//! `/federico/gradient/2`, and the checks a received model must pass.
//!
//! Owns: those messages, their protocol names, and model validation (architecture
//! fingerprint, parameter count, finiteness).
//! Must not: frame or decode bytes (that is `frame.rs`), or know about rounds in progress.

use super::frame::{WireError, check_vector};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Model pulls, round notices and final-model fetches (request → response).
pub const MODEL_PROTOCOL: &str = "/federico/model/2";
/// Weighted gradients and skips, sampler → owner (request → acknowledgement).
pub const GRADIENT_PROTOCOL: &str = "/federico/gradient/2";

/// Sampler → owner on [`MODEL_PROTOCOL`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ModelRequest {
    /// "I am in round `round` and sampled you": send the model you hold for that round
    /// (spec §3.2 step 2). The owner then expects a gradient or a skip from the sender.
    Pull {
        /// The sender's round.
        round: u64,
    },
    /// "I am in round `round` and did not sample you": lets the owner close its round without
    /// waiting for a pull that will never come (lock-step when nothing fails).
    Notice {
        /// The sender's round.
        round: u64,
    },
    /// "Send me your model once it has taken `version` steps" (evaluation and inference at the
    /// end of a round, spec §6 "departed peers at inference"); no gradient follows.
    Fetch {
        /// The version wanted.
        version: u64,
    },
    /// "I have finished my last round": the owner need not wait for this peer any more.
    Done,
}

/// Owner → sampler on [`MODEL_PROTOCOL`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ModelResponse {
    /// The owner's parameters.
    Model(ModelPayload),
    /// A notice or a done was recorded.
    Ack,
}

/// A model on the wire (spec §3.3 message 2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelPayload {
    /// v_b: optimizer steps the owner has taken; gradients for this model carry it back.
    pub version: u64,
    /// The architecture fingerprint (`ModelSpec::fingerprint`): a different model is refused.
    pub fingerprint: u64,
    /// Flat parameters in name-sorted order.
    #[serde(with = "super::floats")]
    pub params: Arc<Vec<f32>>,
}

/// Sampler → owner on [`GRADIENT_PROTOCOL`] (spec §3.3 message 3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum GradientRequest {
    /// g_{b←i} = w_ib ∇ Σ ℓ, taken at the owner's `version`.
    Gradient {
        /// The owner version the gradient was taken at.
        version: u64,
        /// Architecture fingerprint, as served.
        fingerprint: u64,
        /// n_i, the sampler's training-set size (informational).
        n_train: u64,
        /// w_ib, already folded into `grad` (informational).
        weight: f64,
        /// The weighted summed gradient.
        #[serde(with = "super::floats")]
        grad: Vec<f32>,
    },
    /// No gradient will come for `version` (the sampler gave up or its weight underflowed).
    Skip {
        /// The owner version the skip is for.
        version: u64,
    },
}

/// Owner → sampler on [`GRADIENT_PROTOCOL`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum GradientResponse {
    /// Taken into the owner's next step.
    Accepted,
    /// Dropped, with the reason (stale, duplicate, unexpected, wrong length, not finite…).
    Rejected {
        /// Why, in words.
        #[serde(deserialize_with = "string_from_input")]
        reason: String,
    },
}

/// Deserializes a `String` through `deserialize_str`: bincode then takes it from the received
/// bytes (its announced length checked against them) instead of allocating whatever length a
/// peer announces, which `deserialize_string` would do before reading a byte.
fn string_from_input<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<String, E> {
            Ok(s.to_owned())
        }
    }
    d.deserialize_str(Text)
}

impl ModelPayload {
    /// Whether this model can be used here: same architecture, right size, finite.
    pub fn check(&self, fingerprint: u64, num_params: usize) -> Result<(), WireError> {
        if self.fingerprint != fingerprint {
            return Err(WireError::Fingerprint {
                got: self.fingerprint,
                want: fingerprint,
            });
        }
        check_vector(&self.params, num_params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{DEFAULT_MAX_MESSAGE, check_len, decode, encode};
    use serde::de::DeserializeOwned;

    fn roundtrip<M: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(m: M) {
        let frame = encode(&m).unwrap();
        let len = check_len(frame[..8].try_into().unwrap(), DEFAULT_MAX_MESSAGE).unwrap();
        assert_eq!(len, frame.len() - 8);
        assert_eq!(decode::<M>(&frame[8..]).unwrap(), m);
    }

    #[test]
    fn every_message_survives_the_wire() {
        roundtrip(ModelRequest::Pull { round: 7 });
        roundtrip(ModelRequest::Notice { round: 1 << 40 });
        roundtrip(ModelRequest::Fetch { version: 3 });
        roundtrip(ModelRequest::Done);
        roundtrip(ModelResponse::Ack);
        roundtrip(ModelResponse::Model(ModelPayload {
            version: 9,
            fingerprint: 0xDEAD_BEEF,
            params: Arc::new(vec![1.5, -2.0, 0.0]),
        }));
        roundtrip(GradientRequest::Gradient {
            version: 2,
            fingerprint: 1,
            n_train: 40,
            weight: 0.25,
            grad: vec![0.5; 10],
        });
        roundtrip(GradientRequest::Skip { version: 4 });
        roundtrip(GradientResponse::Rejected {
            reason: "stale".into(),
        });
    }

    #[test]
    fn the_payload_costs_four_bytes_per_parameter_plus_a_few() {
        let d = 100_000;
        let frame = encode(&ModelResponse::Model(ModelPayload {
            version: 1,
            fingerprint: u64::MAX,
            params: Arc::new(vec![0.1; d]),
        }))
        .unwrap();
        assert!(
            frame.len() >= 4 * d && frame.len() <= 4 * d + 32,
            "{}",
            frame.len()
        );
    }

    #[test]
    fn models_of_another_shape_or_with_nan_are_refused() {
        let m = ModelPayload {
            version: 0,
            fingerprint: 5,
            params: Arc::new(vec![0.0, f32::NAN, 1.0]),
        };
        assert_eq!(
            m.check(6, 3),
            Err(WireError::Fingerprint { got: 5, want: 6 })
        );
        assert_eq!(m.check(5, 4), Err(WireError::Length { got: 3, want: 4 }));
        assert_eq!(m.check(5, 3), Err(WireError::NonFinite(1)));
    }

    #[test]
    fn a_string_that_claims_more_bytes_than_it_has_is_refused() {
        // Rejected { reason } with a reason claiming 2^60 bytes: without care, bincode
        // allocates the announced length before reading (an abort, not an error).
        let mut lie = vec![1u8]; // variant Rejected
        lie.push(253); // varint marker for a u64 length
        lie.extend((1u64 << 60).to_le_bytes());
        lie.extend(b"short");
        assert!(matches!(
            decode::<GradientResponse>(&lie),
            Err(WireError::Decode(_))
        ));
        roundtrip(GradientResponse::Rejected {
            reason: "duplicate: ünïcode".into(),
        });
    }
}
