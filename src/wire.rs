//! What peers say to each other (spec `federico.md` §3.3): the messages, their bincode-2
//! encoding in length-prefixed frames, the size limits, and the checks a received model or
//! gradient must pass before anything reaches the core.
//! Owns: message types, protocol names, frame encoding/decoding with a bound checked before any
//! allocation, and payload validation (architecture fingerprint, parameter count, finiteness).
//! Must not: know about swarms, rounds in progress or the core's state; it is used by `net` and
//! by tests that speak the protocol by hand.
//!
//! The sender of every message is the authenticated libp2p peer (Noise), so no message carries
//! its sender's id: a peer cannot speak for another.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Model pulls, round notices and final-model fetches (request → response).
pub const MODEL_PROTOCOL: &str = "/federico/model/1";
/// Weighted gradients and skips, sampler → owner (request → acknowledgement).
pub const GRADIENT_PROTOCOL: &str = "/federico/gradient/1";

/// Default bound on one encoded message: 256 MiB, enough for an 11 M-parameter ResNet-18
/// (≈ 45 MB) five times over. Set per node (`max_message_mib`).
pub const DEFAULT_MAX_MESSAGE: u64 = 256 << 20;

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
        reason: String,
    },
}

/// A payload that must not reach the core.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    /// The frame announced more bytes than the limit allows.
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced length.
        len: u64,
        /// The configured limit.
        max: u64,
    },
    /// The bytes are not a valid message.
    #[error("undecodable message: {0}")]
    Decode(String),
    /// Bytes left after the message.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// A model of another architecture.
    #[error("architecture fingerprint {got:#018x} does not match ours ({want:#018x})")]
    Fingerprint {
        /// Received.
        got: u64,
        /// Expected.
        want: u64,
    },
    /// A model or gradient of the wrong size.
    #[error("{got} parameters where the model has {want}")]
    Length {
        /// Received.
        got: usize,
        /// Expected.
        want: usize,
    },
    /// NaN or infinity in a payload.
    #[error("non-finite value at index {0}")]
    NonFinite(usize),
}

fn bincode_config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes `msg` as one frame: an 8-byte little-endian length, then the bincode-2 bytes.
pub fn encode<M: Serialize>(msg: &M) -> Result<Vec<u8>, WireError> {
    let mut out = vec![0u8; 8];
    bincode::serde::encode_into_std_write(msg, &mut out, bincode_config())
        .map_err(|e| WireError::Decode(e.to_string()))?;
    let len = (out.len() - 8) as u64;
    out[..8].copy_from_slice(&len.to_le_bytes());
    Ok(out)
}

/// Checks a frame's announced length against `max`, before anything is allocated for it.
pub fn check_len(header: [u8; 8], max: u64) -> Result<usize, WireError> {
    let len = u64::from_le_bytes(header);
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    Ok(len as usize)
}

/// Decodes one message body (the bytes after the length), refusing trailing bytes. Lengths
/// inside the message are bounded before allocation ([`crate::store::decode_bounded`]):
/// without that, a peer could claim a 3 EB string in a 20-byte message and abort the node
/// (found by `the_decoder_survives_hostile_bytes`).
pub fn decode<M: DeserializeOwned>(body: &[u8]) -> Result<M, WireError> {
    let (m, n) = crate::store::decode_bounded(body).map_err(WireError::Decode)?;
    if n != body.len() {
        return Err(WireError::Trailing(body.len() - n));
    }
    Ok(m)
}

/// The checks of spec §3.3 for a received vector of parameters or a gradient: the right count
/// and finite values.
pub fn check_vector(v: &[f32], want_len: usize) -> Result<(), WireError> {
    if v.len() != want_len {
        return Err(WireError::Length {
            got: v.len(),
            want: want_len,
        });
    }
    match v.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(WireError::NonFinite(i)),
        None => Ok(()),
    }
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
    fn an_oversized_frame_is_refused_before_allocation() {
        let header = (1u64 << 40).to_le_bytes();
        assert_eq!(
            check_len(header, 1 << 20),
            Err(WireError::TooLarge {
                len: 1 << 40,
                max: 1 << 20
            })
        );
    }

    #[test]
    fn garbage_and_trailing_bytes_are_errors_not_panics() {
        assert!(matches!(
            decode::<ModelRequest>(&[0xFF, 0xFF, 0xFF]),
            Err(WireError::Decode(_))
        ));
        let mut frame = encode(&ModelRequest::Done).unwrap();
        frame.push(0);
        assert_eq!(
            decode::<ModelRequest>(&frame[8..]),
            Err(WireError::Trailing(1))
        );
        // A vector that claims 2^60 elements but has none: an error, no huge allocation.
        let mut lie = vec![0u8]; // variant Model
        lie.extend([1u8, 1u8]); // version, fingerprint (varints)
        lie.push(253); // varint marker for a u64 length
        lie.extend((1u64 << 60).to_le_bytes());
        assert!(decode::<ModelResponse>(&lie).is_err());
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

    /// Every message type, encoded, for the decoder fuzz below.
    fn samples() -> Vec<(&'static str, usize, Vec<u8>)> {
        let grad = GradientRequest::Gradient {
            version: 7,
            fingerprint: 0xFEDE,
            n_train: 40,
            weight: 0.25,
            grad: vec![0.5; 33],
        };
        let model = ModelResponse::Model(ModelPayload {
            version: 3,
            fingerprint: 0xFEDE,
            params: Arc::new(vec![1.0; 65]),
        });
        let body = |f: Vec<u8>| f[8..].to_vec();
        vec![
            (
                "pull",
                0,
                body(encode(&ModelRequest::Pull { round: 9 }).unwrap()),
            ),
            (
                "notice",
                0,
                body(encode(&ModelRequest::Notice { round: 9 }).unwrap()),
            ),
            (
                "fetch",
                0,
                body(encode(&ModelRequest::Fetch { version: 2 }).unwrap()),
            ),
            ("done", 0, body(encode(&ModelRequest::Done).unwrap())),
            ("model", 1, body(encode(&model).unwrap())),
            ("ack", 1, body(encode(&ModelResponse::Ack).unwrap())),
            ("gradient", 2, body(encode(&grad).unwrap())),
            (
                "skip",
                2,
                body(encode(&GradientRequest::Skip { version: 1 }).unwrap()),
            ),
            (
                "rejected",
                3,
                body(
                    encode(&GradientResponse::Rejected {
                        reason: "stale".into(),
                    })
                    .unwrap(),
                ),
            ),
        ]
    }

    /// Decodes `bytes` as every message type; a panic fails the test, an error is fine.
    fn decode_all(bytes: &[u8]) -> [bool; 4] {
        [
            decode::<ModelRequest>(bytes).is_ok(),
            decode::<ModelResponse>(bytes).is_ok(),
            decode::<GradientRequest>(bytes).is_ok(),
            decode::<GradientResponse>(bytes).is_ok(),
        ]
    }

    /// A long-running property test of the decoder: truncations, bit flips, spliced huge
    /// lengths and random bytes never panic or allocate beyond what the bytes hold, and a
    /// truncated message never decodes. Cases: `FEDERICO_FUZZ_CASES` (default 3,000 per
    /// message type).
    #[test]
    fn the_decoder_survives_hostile_bytes() {
        use rand::{Rng, RngExt, SeedableRng};
        let cases: usize = std::env::var("FEDERICO_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3000);
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xF022);
        for (name, ty, good) in samples() {
            assert!(decode_all(&good)[ty], "{name} decodes");
            for c in 0..cases {
                let mut b = good.clone();
                match c % 4 {
                    0 => {
                        // Truncated: never a message.
                        let cut = rng.random_range(0..b.len());
                        b.truncate(cut);
                        assert!(
                            !decode_all(&b)[ty],
                            "{name} truncated to {cut} bytes decoded"
                        );
                    }
                    1 => {
                        for _ in 0..rng.random_range(1..4) {
                            let i = rng.random_range(0..b.len());
                            b[i] ^= 1 << rng.random_range(0..8);
                        }
                        decode_all(&b);
                    }
                    2 => {
                        // A varint claiming a huge length (u64 marker 253 + 8 bytes) spliced in.
                        let i = rng.random_range(0..b.len());
                        let mut huge = vec![253u8];
                        huge.extend(rng.random::<u64>().to_le_bytes());
                        b.splice(i..i, huge);
                        decode_all(&b);
                    }
                    _ => {
                        let mut r = vec![0u8; rng.random_range(0..256)];
                        rng.fill_bytes(&mut r);
                        decode_all(&r);
                    }
                }
            }
        }
    }
}
