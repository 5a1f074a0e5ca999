//! federico: decentralized personalized federated learning.
//!
//! Every silo owns one model and learns *whom to learn from* (FedeRiCo: ε-greedy neighbour
//! sampling, exponential-moving-average loss tracking, softmax collaborator weights), exchanging
//! models and weighted gradients directly with its peers.
//!
//! # Layout
//!
//! The crate is layered; a layer may use the ones above it, never the ones below
//! (`docs/architecture.md` draws the layers and says which file owns which decision).
//!
//! | module | owns | must not |
//! |---|---|---|
//! | [`ids`] | node identifiers | — |
//! | [`core`] | the FedeRiCo state machine: sampling, loss tracking, weights, gradient inbox, and the round protocol ([`core::round`], time passed in) | touch tensors, sockets, clocks or threads (std, rand and serde only) |
//! | [`coord`] | the coordinator algorithms (FedDisco, FedCollab, HCCT, FedSaC): weights, coalitions, merges | touch tensors, sockets, clocks or threads (std, rand and serde only) |
//! | [`privacy`] | differential privacy's accountant (RDP of the subsampled Gaussian, (ε, δ)) and each silo's ledger, against everyone and against each peer | touch tensors, sockets, clocks or threads (std, serde and libm only) |
//! | [`learn`] | candle models, flat parameters, optimizers, data sets, loaders, partitioners | know about rounds, peers or algorithms |
//! | [`trace`] | the per-round record of one silo (a node's run log, the simulator's fault traces) | compute anything |
//! | [`faults`] | fault schedules (schema, validation, round timeline) and the pass/fail checks over traces | apply anything |
//! | [`scenario`] | the validated scenario file (data, split, model, algorithms, hyperparameters) | run anything |
//! | [`silo`] | what one silo computes on its own data, the same in both drivers: FedeRiCo's round jobs and checkpoint format, local training recipes, batch orders and their stream tags, FedSaC's feature subspace, FedCollab's discriminator halves | drive rounds, talk to peers, or decide weights, groups or coalitions ([`core`], [`coord`]) |
//! | [`report`] | `rounds.jsonl`, `summary.json`, plots and the final table | compute anything but summaries of what it is given |
//! | [`sim`] | the in-process driver: all silos in one process, lock-step rounds, deterministic | hold algorithm decisions that belong in [`core`] |
//! | [`datasets`] | `federico data`: the table of data-set files (sources, sizes, SHA-256s), resumable downloads, unpacking, verification | load or parse a data set, or leave a file that failed its hash in place |
//! | [`store`] | atomic file replacement and versioned file headers (shards, checkpoints) | know what the bytes mean |
//! | [`protocol`] | every wire protocol (peer, coordinator, FedCollab silo-to-silo): messages, their bounded bincode framing and payload checks | trust a length or a value from the network; be imported by [`coord`] |
//! | [`net`] | the libp2p node, coordinated node and coordinator: identity, manifest, behaviour, round drivers, training thread, checkpoints, control channel, metrics | decide anything [`core`] or [`coord`] decides; train inside the event loop |
//! | [`launch`] | `federico swarm` and `federico partition`: run directories, node, coordinator and network-namespace set-up, fault schedules on processes, merged reports | take part in a round |
//! | [`cli`] | the command line: flags, their precedence over scenario fields, printing | hold logic beyond parsing and printing |
//!
//! Randomness: every stream derives from the run seed and the node id ([`ids::stream_seed`]).
#![warn(missing_docs, unreachable_pub)]

pub mod cli;
pub mod coord;
pub mod core;
pub mod datasets;
pub mod faults;
pub mod ids;
pub mod launch;
pub mod learn;
pub mod net;
pub mod privacy;
pub mod protocol;
pub mod report;
pub mod scenario;
pub mod silo;
pub mod sim;
pub mod store;
pub mod suite;
#[cfg(test)]
mod testkit;
pub mod trace;
