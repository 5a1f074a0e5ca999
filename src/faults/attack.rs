//! The kinds of poisoning a fault schedule can play (issue 38), as the schedule writes them.
//! Owns: [`Attack`], its parsing and its short name.
//! Must not: carry out an attack (`crate::silo::attack::Poisoner` does, in every driver).

use serde::{Deserialize, Serialize};

/// One kind of poisoning, as a schedule writes it: `kind = "scale", factor = 1e6`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Attack {
    /// Every gradient sent to another owner is negated and multiplied by `factor` (1: a plain
    /// sign flip).
    SignFlip {
        /// Magnitude multiplier (positive).
        factor: f64,
    },
    /// Every gradient sent is multiplied by `factor`.
    Scale {
        /// Multiplier (positive).
        factor: f64,
    },
    /// Every gradient sent is replaced by Gaussian noise with `factor` times the honest
    /// gradient's norm.
    Noise {
        /// Norm of the noise relative to the honest gradient's.
        factor: f64,
    },
    /// Every coordinate sent is ±3.4e38, the largest finite f32, with the honest sign.
    Extreme,
    /// The first gradient sent to each owner after the attack began is sent again, every time.
    Stale,
    /// Serves the model it had when the attack began, whatever it trains, and sends zero
    /// gradients: it takes models and gives nothing.
    FreeRide,
    /// Trains and measures on flipped labels (class c becomes C − 1 − c); what it sends is
    /// computed honestly on those rows.
    Labels,
}

impl Attack {
    /// Parses a schedule's `kind` and optional `factor`; the error names what is wrong.
    pub fn parse(kind: &str, factor: Option<f64>) -> Result<Self, String> {
        let need = |default: f64| -> Result<f64, String> {
            let f = factor.unwrap_or(default);
            if f.is_finite() && f > 0.0 {
                Ok(f)
            } else {
                Err(format!("attack factor must be a positive number, got {f}"))
            }
        };
        let none = |a: Attack| -> Result<Attack, String> {
            match factor {
                Some(_) => Err(format!("attack kind \"{kind}\" takes no factor")),
                None => Ok(a),
            }
        };
        match kind {
            "sign_flip" => Ok(Attack::SignFlip { factor: need(1.0)? }),
            "scale" => Ok(Attack::Scale {
                factor: need(f64::NAN).map_err(|_| {
                    "attack kind \"scale\" needs a positive factor (e.g. factor = 10)".to_string()
                })?,
            }),
            "noise" => Ok(Attack::Noise { factor: need(1.0)? }),
            "extreme" => none(Attack::Extreme),
            "stale" => none(Attack::Stale),
            "free_ride" => none(Attack::FreeRide),
            "labels" => none(Attack::Labels),
            other => Err(format!(
                "unknown attack kind \"{other}\"; one of sign_flip, scale, noise, extreme, \
                 stale, free_ride, labels, or none to end an attack"
            )),
        }
    }

    /// The `kind` a schedule writes for it.
    pub fn kind(&self) -> &'static str {
        match self {
            Attack::SignFlip { .. } => "sign_flip",
            Attack::Scale { .. } => "scale",
            Attack::Noise { .. } => "noise",
            Attack::Extreme => "extreme",
            Attack::Stale => "stale",
            Attack::FreeRide => "free_ride",
            Attack::Labels => "labels",
        }
    }

    /// Its `factor`, for the kinds that take one.
    pub fn factor(&self) -> Option<f64> {
        match self {
            Attack::SignFlip { factor } | Attack::Scale { factor } | Attack::Noise { factor } => {
                Some(*factor)
            }
            _ => None,
        }
    }

    /// A short name for reports: `scale x1000000`, `sign_flip`, ...
    pub fn describe(&self) -> String {
        match self {
            Attack::SignFlip { factor } if *factor == 1.0 => "sign_flip".into(),
            Attack::SignFlip { factor } => format!("sign_flip x{factor}"),
            Attack::Scale { factor } => format!("scale x{factor}"),
            Attack::Noise { factor } => format!("noise x{factor}"),
            Attack::Extreme => "extreme".into(),
            Attack::Stale => "stale".into(),
            Attack::FreeRide => "free_ride".into(),
            Attack::Labels => "labels".into(),
        }
    }
}
