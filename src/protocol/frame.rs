//! The framing every protocol shares: an 8-byte little-endian length, then one bincode-2
//! message, read with the bound checked before any allocation.
//!
//! Owns: [`encode`], [`check_len`], [`read_frame`] (and [`read_frame_within`], which charges
//! what it buffers to a shared [`Budget`]), [`decode`], [`WireError`] (and its I/O error form,
//! [`invalid`] / [`rejection`]), the default message bound, [`message_bound`] (the bound a model
//! needs), and [`check_vector`], the parameter-vector check every protocol applies.
//! Must not: know any message type or protocol name (those are `peer.rs`, `coord.rs` and
//! `collab.rs`).

use libp2p::futures::{AsyncRead, AsyncReadExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Default bound on one encoded message: 256 MiB, enough for an 11 M-parameter ResNet-18
/// (≈ 45 MB) five times over. Set per node (`max_message_mib`).
pub const DEFAULT_MAX_MESSAGE: u64 = 256 << 20;

/// The bound on one message that a model of `num_params` parameters needs: its largest message
/// (a model or a weighted gradient: 4 bytes a parameter plus a few varints) twice over, plus
/// 64 KiB for everything else. An 11 M-parameter ResNet-18 gets ≈ 84 MiB; the quickstart's
/// 335-parameter model 66 KiB.
pub fn message_bound(num_params: usize) -> u64 {
    2 * largest_message(num_params) + (64 << 10)
}

/// The largest honest message of a model of `num_params` parameters: a model or a weighted
/// gradient, 4 bytes a parameter plus a few varints.
pub fn largest_message(num_params: usize) -> u64 {
    4 * num_params as u64 + 64
}

/// Bytes that every frame being read, from every peer on every stream, draws from while its body
/// is buffered: [`read_frame_within`] reserves each step of its buffer's growth before it
/// allocates it and refuses the frame ([`WireError::OverBudget`]) when the budget cannot cover
/// it. Clones share one budget. A budget made by [`Budget::share`] draws from its parent too, so
/// one peer's share bounds what that peer can hold, and the parent what all hold together. A
/// share made by [`Budget::share_with_floor`] holds its first `floor` bytes on its own (set
/// aside for it out of the whole by whoever sized the parent), so peers that fill the parent
/// cannot refuse it a message that fits its floor.
#[derive(Clone, Debug)]
pub struct Budget {
    total: u64,
    used: Arc<AtomicU64>,
    parent: Option<Arc<Budget>>,
    /// Bytes held without drawing from the parent.
    floor: u64,
}

impl Budget {
    /// A budget of `total` bytes.
    pub fn new(total: u64) -> Self {
        Self {
            total,
            used: Arc::default(),
            parent: None,
            floor: 0,
        }
    }

    /// A budget of at most `total` bytes that also draws every byte from this one.
    pub fn share(&self, total: u64) -> Self {
        self.share_with_floor(total, 0)
    }

    /// A budget of at most `total` bytes whose first `floor` bytes are its own and the rest
    /// drawn from this one.
    pub fn share_with_floor(&self, total: u64, floor: u64) -> Self {
        Self {
            total,
            used: Arc::default(),
            parent: Some(Arc::new(self.clone())),
            floor: floor.min(total),
        }
    }

    /// The budget's size in bytes.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes held without drawing from the parent.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Bytes reserved right now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation, grown with [`Reservation::grow`].
    pub fn reservation(&self) -> Reservation {
        Reservation {
            budget: self.clone(),
            held: 0,
        }
    }

    /// Of a move of `used` from `a` to `b` bytes, the part above the floor (what the parent
    /// holds of it).
    fn above_floor(&self, a: u64, b: u64) -> u64 {
        b.saturating_sub(self.floor)
            .abs_diff(a.saturating_sub(self.floor))
    }

    /// Takes `n` bytes here, and what passes the floor from every parent, or nothing. The
    /// parent's part is taken before the move here is committed (and given back when another
    /// move came first), so the parent never holds less than this budget's bytes above its
    /// floor.
    fn take(&self, n: u64) -> Result<(), u64> {
        loop {
            let used = self.used.load(Ordering::Acquire);
            let after = used
                .checked_add(n)
                .filter(|&u| u <= self.total)
                .ok_or(self.total)?;
            let over = self.above_floor(used, after);
            if let Some(p) = &self.parent {
                p.take(over)?;
            }
            let moved =
                self.used
                    .compare_exchange(used, after, Ordering::AcqRel, Ordering::Acquire);
            if moved.is_ok() {
                return Ok(());
            }
            if let Some(p) = &self.parent {
                p.give(over);
            }
        }
    }

    fn give(&self, n: u64) {
        let used = self.used.fetch_sub(n, Ordering::AcqRel);
        if let Some(p) = &self.parent {
            p.give(self.above_floor(used, used - n));
        }
    }
}

/// Bytes held from a [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Budget,
    held: u64,
}

impl Reservation {
    /// Takes `n` more bytes from the budget, or refuses (taking nothing) when it cannot cover
    /// them.
    pub fn grow(&mut self, n: u64) -> Result<(), WireError> {
        self.budget
            .take(n)
            .map_err(|budget| WireError::OverBudget {
                want: self.held + n,
                budget,
            })?;
        self.held += n;
        Ok(())
    }

    /// Bytes this reservation holds.
    pub fn held(&self) -> u64 {
        self.held
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give(self.held);
    }
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
    /// Buffering the frame would take the bytes being received past the node's budget.
    #[error("{want} bytes buffered for this frame would exceed a receive budget of {budget} bytes")]
    OverBudget {
        /// Bytes this frame would hold.
        want: u64,
        /// The budget it would exceed: the sender's share, or all peers' together.
        budget: u64,
    },
    /// The peer already has as many requests being read as it may.
    #[error("the peer already has {max} requests being read, the most it may")]
    TooManyStreams {
        /// The bound per peer.
        max: usize,
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
    let unbounded = Budget::new(u64::MAX);
    Ok(read_frame_within(io, max, &unbounded).await?.0)
}

/// [`read_frame`], with every step of the buffer's growth reserved from `budget` before it is
/// allocated: a frame the budget cannot cover is refused ([`WireError::OverBudget`], as an
/// `InvalidData` error) at once, not queued. The reservation comes back with the body; drop it
/// once the body is decoded.
pub async fn read_frame_within<R: AsyncRead + Unpin>(
    io: &mut R,
    max: u64,
    budget: &Budget,
) -> io::Result<(Vec<u8>, Reservation)> {
    let mut held = budget.reservation();
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
            held.grow(grow as u64).map_err(invalid)?;
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
    Ok((body, held))
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
    fn a_budget_covers_every_frame_being_read_and_refuses_past_it() {
        let budget = Budget::new(200 << 10);
        let frame = |n: usize| {
            let mut f = (n as u64).to_le_bytes().to_vec();
            f.resize(8 + n, 7);
            f
        };
        let read = |bytes: &[u8]| {
            libp2p::futures::executor::block_on(read_frame_within(
                &mut &bytes[..],
                1 << 30,
                &budget,
            ))
        };
        // A frame that fits is read, and holds its buffer's size until dropped.
        let (body, held) = read(&frame(150 << 10)).unwrap();
        assert_eq!(body.len(), 150 << 10);
        assert_eq!((held.held(), budget.used()), (150 << 10, 150 << 10));
        // While it is held, a second one that would pass the budget is refused, taking nothing.
        let e = read(&frame(100 << 10)).unwrap_err();
        assert!(
            matches!(rejection(&e), Some(WireError::OverBudget { budget: b, .. }) if *b == 200 << 10),
            "{e}"
        );
        assert_eq!(budget.used(), 150 << 10);
        drop(held);
        assert_eq!(budget.used(), 0);
        // A lying length costs nothing until bytes come: 1 GiB announced, 3 bytes sent.
        let mut lie = (1u64 << 30).to_le_bytes().to_vec();
        lie.extend([1, 2, 3]);
        let e = read(&lie).unwrap_err();
        assert!(matches!(rejection(&e), Some(WireError::Truncated { .. })));
        assert_eq!(budget.used(), 0);
        // Now with room: the 100 KiB frame passes.
        assert_eq!(read(&frame(100 << 10)).unwrap().0.len(), 100 << 10);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_share_bounds_one_peer_and_draws_from_the_whole() {
        let all = Budget::new(300);
        let (a, b) = (all.share(200), all.share(200));
        let mut ra = a.reservation();
        ra.grow(150).unwrap();
        assert_eq!(
            ra.grow(100),
            Err(WireError::OverBudget {
                want: 250,
                budget: 200
            }),
            "past its share"
        );
        let mut rb = b.reservation();
        assert_eq!(
            rb.grow(200),
            Err(WireError::OverBudget {
                want: 200,
                budget: 300
            }),
            "within its share, past the whole"
        );
        assert_eq!((a.used(), b.used(), all.used()), (150, 0, 150));
        rb.grow(150).unwrap();
        drop(ra);
        assert_eq!((a.used(), b.used(), all.used()), (0, 150, 150));
        drop(rb);
        assert_eq!(all.used(), 0);
    }

    /// Attack M4b (insiders' review): members that fill the whole budget between them used to
    /// get every other member's frames refused. A member's floor is its own.
    #[test]
    fn a_floor_is_held_when_others_fill_the_whole() {
        // Three floors of 100 set aside out of 600: the whole the shares draw from is 300.
        let all = Budget::new(300);
        let (a, b, c) = (
            all.share_with_floor(250, 100),
            all.share_with_floor(250, 100),
            all.share_with_floor(250, 100),
        );
        let (mut ra, mut rb) = (a.reservation(), b.reservation());
        ra.grow(250).unwrap();
        rb.grow(250).unwrap();
        assert_eq!((a.used(), b.used(), all.used()), (250, 250, 300));
        // The whole is full: c's floor still holds a message, and not a byte more.
        let mut rc = c.reservation();
        rc.grow(100).unwrap();
        assert_eq!(
            rc.grow(1),
            Err(WireError::OverBudget {
                want: 101,
                budget: 300
            })
        );
        // Without a floor, the same share is refused outright.
        let d = all.share(250);
        assert!(d.reservation().grow(1).is_err());
        // Bytes given back leave the floor last: the whole gets back what passed it.
        drop(ra);
        assert_eq!(all.used(), 150);
        rc.grow(60).unwrap();
        assert_eq!((c.used(), all.used()), (160, 210));
        drop(rc);
        assert_eq!(all.used(), 150);
        drop(rb);
        assert_eq!((a.used(), b.used(), c.used(), all.used()), (0, 0, 0, 0));
    }

    #[test]
    fn floored_shares_account_exactly_under_concurrent_use() {
        let all = Budget::new(1 << 20);
        let shares: Vec<Budget> = (0..4)
            .map(|_| all.share_with_floor(1 << 18, 1000))
            .collect();
        std::thread::scope(|s| {
            for b in &shares {
                s.spawn(move || {
                    for i in 0..2000u64 {
                        let mut r = b.reservation();
                        let _ = r.grow(1 + i % 700);
                        let _ = r.grow(1 + i % 900);
                    }
                });
            }
        });
        assert_eq!(all.used(), 0);
        assert!(shares.iter().all(|b| b.used() == 0));
    }

    #[test]
    fn the_derived_bound_covers_a_model_and_a_gradient() {
        for n in [1usize, 335, 100_000] {
            let max = message_bound(n);
            let model = encode(&crate::protocol::ModelResponse::Model(
                crate::protocol::ModelPayload {
                    version: u64::MAX,
                    fingerprint: u64::MAX,
                    params: std::sync::Arc::new(vec![1.5; n]),
                },
            ))
            .unwrap();
            let grad = encode(&crate::protocol::GradientRequest::Gradient {
                version: u64::MAX,
                fingerprint: u64::MAX,
                n_train: u64::MAX,
                weight: 0.5,
                grad: vec![1.5; n],
            })
            .unwrap();
            for f in [model, grad] {
                assert!(
                    (f.len() as u64 - 8) * 2 <= max,
                    "{n} parameters: {}",
                    f.len()
                );
            }
        }
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
