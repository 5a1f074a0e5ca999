//! Which coordinator algorithm a `net` process runs: `[coordinated] mode` in a node config and
//! `algorithm` in a coordinator's, and the checks of that algorithm's section that both
//! configs share.
//! Owns: [`CoordinatedAlgorithm`] (its names are [`Algorithm::name`]'s), reading it with a
//! message that names the field and the allowed values, and what an algorithm's settings must
//! be over the network ([`check_settings`]).
//! Must not: hold the algorithms' own validation (`coord` and `scenario` do; this only calls
//! it), or decide anything at run time.

use crate::coord::fedcollab::{Distance, FedCollabConfig};
use crate::coord::hcct::HcctConfig;
use crate::coord::hcct_server::HcctServer;
use crate::scenario::{Algorithm, FedsacConfig};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;

/// A coordinator algorithm that runs over the network (a coordinator process and coordinated
/// nodes). Written in config files by its [`Algorithm::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CoordinatedAlgorithm {
    /// FedDisco: rounds of a global model with discrepancy-aware weights.
    Feddisco,
    /// HCCT: rounds of hierarchical groups, each with its group model.
    Hcct,
    /// FedSaC: rounds of per-silo models from the collaboration graph, over cohorts.
    Fedsac,
    /// FedCollab: one solved coalition structure, FedAvg inside each coalition peer to peer.
    Fedcollab,
}

impl CoordinatedAlgorithm {
    /// Every one, in the order error messages list them.
    pub const ALL: [Self; 4] = [Self::Feddisco, Self::Hcct, Self::Fedsac, Self::Fedcollab];

    /// The name config files use (the scenario's name for it).
    pub fn as_str(self) -> &'static str {
        Algorithm::from(self).name()
    }

    /// The allowed values as a config file writes them: `"feddisco", "hcct", …`.
    fn allowed() -> String {
        Self::ALL.map(|a| format!("{:?}", a.as_str())).join(", ")
    }

    /// The fewest silos its coordinator may be configured with (`nodes`; 0: any, the
    /// coordinator takes whoever registered).
    pub fn min_nodes(self) -> usize {
        match self {
            Self::Feddisco => 0,
            Self::Hcct | Self::Fedsac => 1,
            Self::Fedcollab => 2,
        }
    }

    /// Whether its run starts once silos joined (HCCT, FedSaC, FedCollab: the run's silos are
    /// fixed then, and `join_s` may close joining); FedDisco waits for nobody.
    pub fn has_joining(self) -> bool {
        self != Self::Feddisco
    }
}

impl From<CoordinatedAlgorithm> for Algorithm {
    fn from(a: CoordinatedAlgorithm) -> Self {
        match a {
            CoordinatedAlgorithm::Feddisco => Algorithm::Feddisco,
            CoordinatedAlgorithm::Hcct => Algorithm::Hcct,
            CoordinatedAlgorithm::Fedsac => Algorithm::Fedsac,
            CoordinatedAlgorithm::Fedcollab => Algorithm::Fedcollab,
        }
    }
}

/// A scenario algorithm that has no network mode.
#[derive(Debug, thiserror::Error)]
#[error("{} has no network mode; coordinators run {}", .0.name(), CoordinatedAlgorithm::ALL.map(|a| a.as_str()).join(", "))]
pub struct NotNetworked(pub Algorithm);

impl TryFrom<Algorithm> for CoordinatedAlgorithm {
    type Error = NotNetworked;

    fn try_from(a: Algorithm) -> Result<Self, NotNetworked> {
        Self::ALL
            .into_iter()
            .find(|&c| Algorithm::from(c) == a)
            .ok_or(NotNetworked(a))
    }
}

impl fmt::Display for CoordinatedAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with the name a config file uses (`algorithm == "hcct"`).
impl PartialEq<&str> for CoordinatedAlgorithm {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

/// Reads the algorithm of field `field`; an unknown name is refused with
/// `<field> = "<name>"; allowed: "feddisco", "hcct", "fedsac", "fedcollab"`.
pub(super) fn read_algorithm<'de, D: Deserializer<'de>>(
    d: D,
    field: &str,
) -> Result<CoordinatedAlgorithm, D::Error> {
    let name = String::deserialize(d)?;
    CoordinatedAlgorithm::ALL
        .into_iter()
        .find(|a| *a == name.as_str())
        .ok_or_else(|| {
            D::Error::custom(format!(
                "{field} = {name:?}; allowed: {}",
                CoordinatedAlgorithm::allowed()
            ))
        })
}

/// An algorithm's section that its network run cannot use; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// `[hcct]` (the message names `hcct.<field>`).
    #[error("{0}")]
    Hcct(String),
    /// `[fedsac]`.
    #[error("fedsac.{0}")]
    Fedsac(String),
    /// `[fedcollab]`.
    #[error("fedcollab.{0}")]
    Fedcollab(String),
}

/// Checks the section of `algorithm` as its network run uses it (the coordinator and the
/// nodes hold the same sections).
pub(super) fn check_settings(
    algorithm: CoordinatedAlgorithm,
    hcct: &HcctConfig,
    fedsac: &FedsacConfig,
    fedcollab: &FedCollabConfig,
) -> Result<(), SettingsError> {
    match algorithm {
        CoordinatedAlgorithm::Feddisco => Ok(()),
        CoordinatedAlgorithm::Hcct => HcctServer::check_config(hcct).map_err(SettingsError::Hcct),
        CoordinatedAlgorithm::Fedsac => fedsac.validate().map_err(SettingsError::Fedsac),
        CoordinatedAlgorithm::Fedcollab => {
            fedcollab_over_network(fedcollab).map_err(SettingsError::Fedcollab)
        }
    }
}

/// `[fedcollab]` as the network runs it: valid, and with the discriminator protocol (the
/// label-histogram distance is a simulator debug mode that would reveal label histograms).
fn fedcollab_over_network(fc: &FedCollabConfig) -> Result<(), String> {
    fc.validate()?;
    if fc.distance != Distance::Discriminator {
        return Err(
            "distance = \"label_tv\" is a simulator debug mode (it reveals label histograms); \
             over the network FedCollab measures distances with the discriminator protocol"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_scenarios_and_round_trip() {
        for a in CoordinatedAlgorithm::ALL {
            assert_eq!(a.to_string(), Algorithm::from(a).name());
            assert_eq!(
                CoordinatedAlgorithm::try_from(Algorithm::from(a)).unwrap(),
                a
            );
            let written =
                toml::to_string(&std::collections::BTreeMap::from([("mode", a)])).unwrap();
            assert_eq!(written.trim(), format!("mode = {:?}", a.as_str()));
        }
        let e = CoordinatedAlgorithm::try_from(Algorithm::Federico).unwrap_err();
        assert!(
            e.to_string().contains("federico has no network mode"),
            "{e}"
        );
    }
}
