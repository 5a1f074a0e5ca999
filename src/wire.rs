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
//!
//! # Untrusted input
//!
//! Every byte read here comes from a peer that may be broken or hostile. [`read_frame`] and
//! [`decode`] return an error for anything that is not exactly one well-formed message, never
//! panic, and never allocate more than the bytes actually received (plus a small constant): the
//! frame length is checked against the bound before reading, the body is buffered as it arrives,
//! vectors grow as their elements decode, and strings are taken from the received bytes rather
//! than allocated at an announced length. The frame has no version field: the protocol names
//! carry it (`/federico/model/1`), and a peer speaking another version fails protocol
//! negotiation before any frame is exchanged.

use libp2p::futures::{AsyncRead, AsyncReadExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io;
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
    /// The stream ended inside a frame.
    #[error("truncated frame: {got} of {want} bytes")]
    Truncated {
        /// Bytes received (header included).
        got: u64,
        /// Bytes the frame needed (header included; 8 while the header itself is cut).
        want: u64,
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

/// Reads one frame from `io` and returns its body (the bytes after the length).
///
/// The announced length is checked against `max` before anything is allocated for it, and the
/// buffer grows only as the body arrives, so a peer that announces a large frame and sends little
/// costs little. A [`WireError`] (too large, truncated) comes back as an
/// [`io::ErrorKind::InvalidData`] error that [`rejection`] recognises; a stream that ends before
/// the first byte is a plain [`io::ErrorKind::UnexpectedEof`] (the peer said nothing, which is
/// not a malformed message: a responder that drops a request does exactly that).
pub async fn read_frame<R: AsyncRead + Unpin>(io: &mut R, max: u64) -> io::Result<Vec<u8>> {
    let mut header = [0u8; 8];
    let mut got = 0;
    while got < header.len() {
        match io.read(&mut header[got..]).await? {
            0 if got == 0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the stream closed before a message",
                ));
            }
            0 => {
                return Err(invalid(WireError::Truncated {
                    got: got as u64,
                    want: 8,
                }));
            }
            n => got += n,
        }
    }
    let len = check_len(header, max).map_err(invalid)?;
    // The buffer doubles as bytes arrive, from 64 KiB and never past the announced length:
    // memory follows what was received, and ends exactly the frame's size.
    let mut body = Vec::new();
    let mut filled = 0;
    while filled < len {
        if filled == body.len() {
            let grow = body.len().max(64 << 10).min(len - body.len());
            body.reserve_exact(grow);
            body.resize(body.len() + grow, 0);
        }
        match io.read(&mut body[filled..]).await? {
            0 => {
                return Err(invalid(WireError::Truncated {
                    got: 8 + filled as u64,
                    want: 8 + len as u64,
                }));
            }
            n => filled += n,
        }
    }
    Ok(body)
}

/// `e` as the error [`read_frame`] and the codec give for a rejected frame.
pub fn invalid(e: WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// The [`WireError`] inside an I/O error from [`read_frame`] or the codec, if it is one: a
/// message refused, rather than a connection that failed.
pub fn rejection(e: &io::Error) -> Option<&WireError> {
    if e.kind() != io::ErrorKind::InvalidData {
        return None;
    }
    e.get_ref()?.downcast_ref::<WireError>()
}

/// Decodes one message body (the bytes after the length), refusing trailing bytes. Lengths
/// inside the message are bounded before allocation ([`crate::store::decode_bounded`]):
/// without that, a peer could claim a 3 EB string in a 20-byte message and abort the node
/// (found by the decoder's property test, `tests/wire_fuzz.rs`).
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

    fn read(bytes: &[u8], max: u64) -> io::Result<Vec<u8>> {
        libp2p::futures::executor::block_on(read_frame(&mut &bytes[..], max))
    }

    #[test]
    fn a_frame_is_read_whole_or_refused_with_its_reason() {
        let frame = encode(&ModelRequest::Pull { round: 3 }).unwrap();
        assert_eq!(read(&frame, 1 << 20).unwrap(), frame[8..]);
        // Cut anywhere after the first byte: truncated.
        for cut in 1..frame.len() {
            let e = read(&frame[..cut], 1 << 20).unwrap_err();
            assert!(
                matches!(rejection(&e), Some(WireError::Truncated { .. })),
                "cut at {cut}: {e}"
            );
        }
        // Nothing at all: not a message, and not a rejection.
        let e = read(&[], 1 << 20).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(rejection(&e).is_none());
        // A header that announces more than the bound, with nothing behind it.
        let e = read(&u64::MAX.to_le_bytes(), 1 << 20).unwrap_err();
        assert!(matches!(rejection(&e), Some(WireError::TooLarge { .. })));
        // A header that announces 200 MiB (within the bound) and sends 3 bytes: truncated.
        let mut lie = (200u64 << 20).to_le_bytes().to_vec();
        lie.extend([1, 2, 3]);
        let e = read(&lie, 256 << 20).unwrap_err();
        assert_eq!(
            rejection(&e),
            Some(&WireError::Truncated {
                got: 11,
                want: 8 + (200 << 20)
            })
        );
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
