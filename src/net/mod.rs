//! The libp2p driver: one real peer per silo (`federico node`).
//! Owns: identity and membership ([`identity`]), every config file of a node or coordinator
//! ([`config`]), the wire codec and behaviour, the round driver that moves models and gradients
//! between the FedeRiCo core and the network ([`node`]), the coordinated node
//! ([`coordinated`], FedCollab's in `collab_node`, both talking to their swarm through the one
//! client/event-loop pattern of `client`), the coordinator ([`coordinator`]), the circuit relay
//! for silos behind NAT ([`relay`]; a node's side of it in `node::reach`), the training
//! threads (`trainer`: one dedicated thread per node over bounded channels), checkpoints,
//! metrics, connection caps and the open-files limit (`limits`), rate-limited warnings
//! (`throttle`) and the progress line on a terminal ([`progress`]).
//! Must not: decide anything the core decides (sampling, weights, acceptance of gradients),
//! or train inside the swarm event loop: training runs on its own thread.

mod behaviour;
mod client;
mod collab_node;
pub mod config;
pub mod control;
pub mod coordinated;
pub mod coordinator;
pub mod identity;
mod impair;
pub mod intake;
mod limits;
mod metrics;
pub mod node;
pub mod progress;
pub mod relay;
mod runlog;
mod throttle;
mod trainer;

pub use crate::silo::federico::Checkpoint;
pub use config::NodeConfig;
pub use identity::{Manifest, Member, keygen, load_key};
