//! Every config file a `net` process reads: a peer's (`node-config/*.toml`, [`NodeConfig`]),
//! its `[coordinated]` section ([`CoordinatedConfig`]) and a coordinator's
//! ([`CoordinatorConfig`]), and which coordinator algorithm the last two name
//! ([`CoordinatedAlgorithm`]).
//! Owns: the schemas, their defaults, validation with messages naming the field and the
//! allowed values, and resolving relative paths against the file's directory.
//! Must not: open files other than the config itself, or start anything (the drivers,
//! [`super::node`], [`super::coordinated`] and [`super::coordinator`], do).

mod algorithm;
mod coordinated;
mod coordinator;
mod node;

pub use algorithm::{CoordinatedAlgorithm, NotNetworked, SettingsError};
pub use coordinated::{Coordinated, CoordinatedConfig, CoordinatedError, Fallback};
pub use coordinator::{CoordinatorConfig, CoordinatorConfigError, CoordinatorInvalid};
pub use node::{ConfigError, DataFormat, DataSource, Deadlines, NodeConfig};
