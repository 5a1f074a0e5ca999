//! Every config file a `net` process reads: a peer's (`node-config/*.toml`, [`NodeConfig`]),
//! its `[coordinated]` section ([`CoordinatedConfig`]) and a coordinator's
//! ([`CoordinatorConfig`]).
//! Owns: the schemas, their defaults, validation with messages naming the field and the
//! allowed values, and resolving relative paths against the file's directory.
//! Must not: open files other than the config itself, or start anything (the drivers,
//! [`super::node`], [`super::coordinated`] and [`super::coordinator`], do).

mod coordinated;
mod coordinator;
mod node;

pub use coordinated::CoordinatedConfig;
pub(crate) use coordinated::fedcollab_over_network;
pub use coordinator::CoordinatorConfig;
pub use node::{ConfigError, DataFormat, DataSource, Deadlines, NodeConfig};
