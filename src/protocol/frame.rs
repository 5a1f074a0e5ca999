//! The framing every protocol shares: an 8-byte little-endian length, then one bincode-2
//! message, read with the bound checked before any allocation.
//!
//! Owns: [`encode`], [`check_len`], [`read_frame`], [`decode`], [`WireError`] (and its I/O
//! error form, [`invalid`] / [`rejection`]), the default message bound, and [`check_vector`],
//! the parameter-vector check every protocol applies.
//! Must not: know any message type or protocol name (those are `peer.rs`, `coord.rs` and
//! `collab.rs`).

use libp2p::futures::{AsyncRead, AsyncReadExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io;

/// Default bound on one encoded message: 256 MiB, enough for an 11 M-parameter ResNet-18
/// (≈ 45 MB) five times over. Set per node (`max_message_mib`).
pub const DEFAULT_MAX_MESSAGE: u64 = 256 << 20;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ModelRequest, ModelResponse};

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
}
