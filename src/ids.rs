//! Identifiers and seed derivation.
//! Owns: [`NodeId`], the rule that derives every random stream from (run seed, node id, purpose),
//! and [`model_hash`], the fingerprint run logs print for a model.
//! Must not: hold state.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A silo in the federation. In the simulator it is the client index `0..K`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The index of this node, for indexing per-client vectors.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "silo-{}", self.0)
    }
}

/// What a random stream is used for; part of the seed derivation so streams never overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Stream {
    /// Data generation and partitioning (shared by all nodes of a run: node id is ignored).
    Data = 1,
    /// Initial model weights of one node.
    Init = 2,
    /// Neighbour sampling of one node (the FedeRiCo core's own RNG).
    Sampling = 3,
    /// Mini-batch shuffling of one node.
    Batches = 4,
    /// Message-loss draws of a simulated fault schedule.
    Faults = 5,
    /// The noise of a poisoning member (`crate::silo::attack`).
    Attack = 6,
    /// Differential privacy's Poisson samples and noise (`crate::silo::private`).
    Privacy = 7,
}

/// Derives the seed of one random stream from the run seed, a node and a purpose
/// (SplitMix64 finaliser over the three, so nearby inputs give unrelated seeds).
pub fn stream_seed(run_seed: u64, node: NodeId, stream: Stream) -> u64 {
    let mut z = run_seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((node.0 as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
        .wrapping_add((stream as u64).wrapping_mul(0x8CB9_2BA7_2F3D_8DD7));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a (64 bit) of a model's parameters as little-endian bytes, in hex: equal on every node
/// that holds the same model bit for bit (the run logs' `model_hash`).
pub fn model_hash(params: &[f32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in params {
        for b in v.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_differ_by_node_and_purpose() {
        let a = stream_seed(1, NodeId(0), Stream::Init);
        assert_ne!(a, stream_seed(1, NodeId(1), Stream::Init));
        assert_ne!(a, stream_seed(1, NodeId(0), Stream::Sampling));
        assert_ne!(a, stream_seed(2, NodeId(0), Stream::Init));
        assert_eq!(a, stream_seed(1, NodeId(0), Stream::Init));
    }

    #[test]
    fn model_hash_is_fnv_1a_of_the_little_endian_bytes() {
        // No bytes: FNV-1a's offset basis.
        assert_eq!(model_hash(&[]), "cbf29ce484222325");
        let a = model_hash(&[1.0, 2.0]);
        assert_eq!(a, model_hash(&[1.0, 2.0]));
        assert_ne!(a, model_hash(&[2.0, 1.0]));
        assert_eq!(a.len(), 16);
    }
}
