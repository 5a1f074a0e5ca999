//! Identifiers and seed derivation.
//! Owns: [`NodeId`] and the rule that derives every random stream from (run seed, node id, purpose).
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
}
