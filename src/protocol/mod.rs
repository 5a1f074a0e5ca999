//! What nodes say to each other: every libp2p protocol of federico, its messages, their
//! bincode-2 encoding in length-prefixed frames, the size limits, and the checks a received
//! message must pass before anything reaches the core or a coordinator's state.
//!
//! Owns: message types, protocol names, frame encoding/decoding with a bound checked before any
//! allocation, and payload validation. `frame.rs` is the framing every protocol shares;
//! `peer.rs` is FedeRiCo's peer-to-peer protocols (`/federico/model/2`,
//! `/federico/gradient/2`), `coord.rs` the node ↔ coordinator protocol (`/federico/coord/2`)
//! and `collab.rs` FedCollab's silo ↔ silo protocol (`/federico/collab/2`).
//! Must not: know about swarms, rounds in progress or the core's state; it is used by `net` and
//! by tests that speak the protocols by hand. It may use [`crate::coord`]'s report types;
//! `coord` never uses it.
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
//! vectors grow as their elements decode (parameter vectors are
//! borrowed from the received bytes, `floats.rs`), and strings are taken from the received bytes rather
//! than allocated at an announced length. The frame has no version field: the protocol names
//! carry it (`/federico/model/2`), and a peer speaking another version fails protocol
//! negotiation before any frame is exchanged.

mod collab;
mod coord;
mod floats;
mod frame;
mod peer;

pub use collab::{COLLAB_PROTOCOL, CollabRequest, CollabResponse};
pub use coord::{
    COORD_PROTOCOL, CoordRequest, CoordResponse, MAX_PARTNERS, MAX_SUBSPACE_RANK, check_model,
};
pub use frame::{
    Budget, DEFAULT_MAX_MESSAGE, Reservation, WireError, check_len, check_vector, decode, encode,
    invalid, largest_message, message_bound, read_frame, read_frame_within, rejection,
};
pub use peer::{
    GRADIENT_PROTOCOL, GradientRequest, GradientResponse, MODEL_PROTOCOL, ModelPayload,
    ModelRequest, ModelResponse,
};
