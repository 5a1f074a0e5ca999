//! What one silo computes on its own data, for both drivers (the simulator and the libp2p
//! node): the same code, so the two make the same arithmetic.
//!
//! Owns: running a round's jobs on the silo's learner and data.
//! Must not: decide anything an algorithm core decides, touch the network, read a clock or
//! spawn threads: drivers call it where they run training.

pub mod federico;
