//! Whole-scenario validation: every value in range, and the sections consistent with each
//! other (algorithms, split, data source, model, faults).
//! Owns: `Scenario::validate`; errors name the field, the allowed range and the value.
//! Must not: parse (`mod.rs`) or build anything from the scenario (`data.rs`, `model.rs`).

use super::{Algorithm, ModelKind, Scenario, ScenarioError, Source, SplitKind, check};
use crate::learn::partition::Assign;

fn synthetic_source(s: Source) -> bool {
    matches!(s, Source::Mixture | Source::Sine)
}

impl Scenario {
    /// Checks every value; errors name the field, the allowed range and the value.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        check(!self.seeds.is_empty(), || {
            "seeds must list at least one seed".into()
        })?;
        check(self.rounds >= 1, || {
            format!("rounds must be at least 1, got {}", self.rounds)
        })?;
        check(self.eval_every >= 1, || {
            format!("eval_every must be at least 1, got {}", self.eval_every)
        })?;
        check(!self.algorithms.is_empty(), || {
            "algorithms must name at least one of \"local\", \"fedavg\", \"fedavg_plus\", \"federico\", \"fedcollab\", \"hcct\", \"feddisco\", \"fedsac\"".into()
        })?;
        let mut algs = self.algorithms.clone();
        algs.sort();
        algs.dedup();
        check(algs.len() == self.algorithms.len(), || {
            "algorithms lists an algorithm twice".into()
        })?;
        if let Some(p) = &self.privacy {
            p.validate().map_err(ScenarioError::Invalid)?;
            check(self.algorithms == [Algorithm::Federico], || {
                format!(
                    "[privacy] is built for federico only so far: set algorithms = [\"federico\"] (a private silo alone is federico with federico.neighbours = 0), got {:?}",
                    self.algorithms.iter().map(|a| a.name()).collect::<Vec<_>>()
                )
            })?;
            check(
                self.federico.mstep() != crate::core::MStep::LocalEpoch,
                || crate::privacy::REFUSES_LOCAL_EPOCH.into(),
            )?;
        }
        let d = &self.data;
        let sp = &self.split;
        check(sp.clients >= 1, || {
            format!("split.clients must be at least 1, got {}", sp.clients)
        })?;
        check(sp.groups >= 1 && sp.groups <= sp.clients, || {
            format!(
                "split.groups must be in [1, split.clients = {}], got {}",
                sp.clients, sp.groups
            )
        })?;
        check(sp.train_fraction > 0.0 && sp.train_fraction < 1.0, || {
            format!(
                "split.train_fraction must be in (0, 1), got {}",
                sp.train_fraction
            )
        })?;
        check(sp.alpha > 0.0 && sp.alpha.is_finite(), || {
            format!("split.alpha must be positive, got {}", sp.alpha)
        })?;
        check(sp.clusters.is_none_or(|c| c >= 1), || {
            format!(
                "split.clusters must be at least 1, got {}",
                sp.clusters.unwrap_or(0)
            )
        })?;
        check(sp.shards_per_client >= 1, || {
            format!(
                "split.shards_per_client must be at least 1, got {}",
                sp.shards_per_client
            )
        })?;
        if matches!(
            sp.kind,
            SplitKind::Cluster4 | SplitKind::Concept4 | SplitKind::Rotate4
        ) {
            check(sp.clients % 4 == 0, || {
                format!(
                    "split.clients must be a multiple of 4 for split.kind \"{}\" (four types), got {}",
                    match sp.kind {
                        SplitKind::Cluster4 => "cluster4",
                        SplitKind::Concept4 => "concept4",
                        _ => "rotate4",
                    },
                    sp.clients
                )
            })?;
        }
        check(
            sp.quantity_decay.is_finite() && sp.quantity_decay >= 0.0,
            || {
                format!(
                    "split.quantity_decay must be a finite number >= 0, got {}",
                    sp.quantity_decay
                )
            },
        )?;
        if let Some(f) = d.fraction {
            check(f > 0.0 && f <= 1.0, || {
                format!("data.fraction must be in (0, 1], got {f}")
            })?;
        }
        if let Some(n) = d.samples {
            check(n >= 1, || "data.samples must be at least 1, got 0".into())?;
        }
        check(d.fraction.is_none() || d.samples.is_none(), || {
            "give data.samples or data.fraction, not both (samples is the pool's size in samples)"
                .into()
        })?;
        self.validate_own()?;
        check(
            sp.kind != SplitKind::LabelGroups
                || sp.assign == Assign::Random
                || !synthetic_source(d.source),
            || {
                "split.assign = \"balanced\" is for label_groups on real or own data (synthetic sources draw their own groups)".into()
            },
        )?;
        let synthetic = matches!(d.source, Source::Mixture | Source::Sine);
        if synthetic {
            check(sp.kind == SplitKind::LabelGroups, || {
                "split.kind must be \"label_groups\" for synthetic sources (they generate their own groups)".into()
            })?;
            check(d.train >= 1, || {
                format!("data.train must be at least 1, got {}", d.train)
            })?;
            check(d.test >= 1, || {
                format!("data.test must be at least 1, got {}", d.test)
            })?;
        }
        if d.source == Source::Mixture {
            check(d.classes_per_group >= 2, || {
                format!(
                    "data.classes_per_group must be at least 2, got {}",
                    d.classes_per_group
                )
            })?;
            check(d.dim >= 1, || {
                format!("data.dim must be at least 1, got {}", d.dim)
            })?;
            check(d.separation > 0.0, || {
                format!("data.separation must be positive, got {}", d.separation)
            })?;
        }
        if d.source == Source::Sine {
            check(d.noise >= 0.0, || {
                format!("data.noise must be >= 0, got {}", d.noise)
            })?;
            check(self.model.kind == ModelKind::Linear, || {
                "model.kind must be \"linear\" for the sine source (a regression task)".into()
            })?;
        } else {
            check(self.model.kind != ModelKind::Linear, || {
                format!(
                    "model.kind \"linear\" is for regression (source \"sine\"), not {:?}",
                    d.source
                )
            })?;
        }
        if self.model.kind == ModelKind::Mlp {
            check(self.model.hidden.iter().all(|&h| h >= 1), || {
                "model.hidden widths must be at least 1".into()
            })?;
        }
        if self.model.kind == ModelKind::Cnn {
            check(
                !self.model.conv.is_empty() && self.model.conv.iter().all(|&c| c >= 1),
                || "model.conv must list at least one positive channel count".into(),
            )?;
            check(
                matches!(
                    d.source,
                    Source::Mnist
                        | Source::FashionMnist
                        | Source::Cifar10
                        | Source::Optdigits
                        | Source::Idx
                        | Source::Images
                ),
                || {
                    "model.kind \"cnn\" needs image data (mnist, fashion_mnist, cifar10, optdigits, idx, images)"
                        .into()
                },
            )?;
        }
        check(self.train.lr > 0.0 && self.train.lr.is_finite(), || {
            format!("train.lr must be positive, got {}", self.train.lr)
        })?;
        check(self.train.batch_size >= 1, || {
            format!(
                "train.batch_size must be at least 1, got {}",
                self.train.batch_size
            )
        })?;
        self.defences
            .validate()
            .map_err(|m| ScenarioError::Invalid(format!("defences.{m}")))?;
        self.federico
            .validate()
            .map_err(|m| ScenarioError::Invalid(format!("federico.{m}")))?;
        self.fedcollab
            .validate()
            .map_err(|m| ScenarioError::Invalid(format!("fedcollab.{m}")))?;
        self.hcct
            .validate()
            .map_err(|e| ScenarioError::Invalid(format!("hcct.{e}")))?;
        self.feddisco
            .validate(sp.clients)
            .map_err(|m| ScenarioError::Invalid(format!("feddisco.{m}")))?;
        self.fedsac
            .validate()
            .map_err(|m| ScenarioError::Invalid(format!("fedsac.{m}")))?;
        if sp.kind == SplitKind::BiasedUniform {
            check(sp.uniform_clients <= sp.clients, || {
                format!(
                    "split.uniform_clients must be in [0, split.clients = {}], got {}",
                    sp.clients, sp.uniform_clients
                )
            })?;
        }
        if d.source == Source::Sine {
            let needs_classes =
                |a: &&Algorithm| matches!(a, Algorithm::Feddisco | Algorithm::Fedsac);
            if let Some(a) = self.algorithms.iter().find(needs_classes) {
                return Err(ScenarioError::Invalid(format!(
                    "algorithm \"{}\" needs class labels; source \"sine\" is a regression task",
                    a.name()
                )));
            }
        }
        self.fault_schedule()?;
        Ok(())
    }

    /// The own-data fields: present exactly where the source and the split use them.
    pub(super) fn validate_own(&self) -> Result<(), ScenarioError> {
        let d = &self.data;
        let natural = self.natural();
        if !d.source.is_own() {
            let stray = [
                (!d.files.is_empty(), "files"),
                (!d.test_files.is_empty(), "test_files"),
                (d.silos.is_some(), "silos"),
                (d.silo_tests.is_some(), "silo_tests"),
                (d.label_column.is_some(), "label_column"),
                (d.silo_column.is_some(), "silo_column"),
                (d.silo_groups.is_some(), "silo_groups"),
                (d.classes.is_some(), "classes"),
                (d.standardize.is_some(), "standardize"),
            ];
            if let Some((_, f)) = stray.iter().find(|(on, _)| *on) {
                return Err(ScenarioError::Invalid(format!(
                    "data.{f} is for own data (source = \"csv\", \"idx\" or \"images\"), not source \"{}\"",
                    d.source.name()
                )));
            }
            return check(self.split.kind != SplitKind::Natural, || {
                "split.kind \"natural\" needs own data (source = \"csv\", \"idx\" or \"images\") with data.silos or data.silo_column".into()
            });
        }
        let name = d.source.name();
        check(
            d.source == Source::Csv || (d.label_column.is_none() && d.silo_column.is_none()),
            || {
                format!(
                    "data.label_column and data.silo_column are for source \"csv\", not \"{name}\""
                )
            },
        )?;
        check(natural || d.silo_groups.is_none(), || {
            "data.silo_groups is for natural partitions (data.silos or data.silo_column): other \
             splits know their groups"
                .into()
        })?;
        check(d.silo_tests.is_none() || d.silos.is_some(), || {
            "data.silo_tests gives each silo of data.silos its test set: it needs data.silos".into()
        })?;
        check(d.silo_tests.is_none() || d.test_files.is_empty(), || {
            "give data.test_files (one test set for every silo) or data.silo_tests (one per silo), \
             not both"
                .into()
        })?;
        check(!(d.silos.is_some() && d.silo_column.is_some()), || {
            "give data.silos or data.silo_column, not both".into()
        })?;
        check(d.silos.is_none() || d.files.is_empty(), || {
            "give data.files (one pool, or with data.silo_column) or data.silos (one entry per silo), not both".into()
        })?;
        check(d.silos.is_some() || !d.files.is_empty(), || {
            format!(
                "source \"{name}\" needs data.files (the pool; with data.silo_column, its silos) or data.silos (one entry per silo)"
            )
        })?;
        check(natural == (self.split.kind == SplitKind::Natural), || {
            if natural {
                "data.silos / data.silo_column give natural partitions: set split.kind = \"natural\"".into()
            } else {
                "split.kind \"natural\" needs data.silos or data.silo_column (the silos as the data has them)".into()
            }
        })?;
        check(
            !natural || (d.samples.is_none() && d.fraction.is_none()),
            || {
                "data.samples and data.fraction size a pool; with natural partitions every silo keeps all its samples".into()
            },
        )?;
        if let Some(c) = d.classes {
            check(c >= 2, || {
                format!("data.classes must be at least 2, got {c}")
            })?;
        }
        let shape = |files: &[std::path::PathBuf], field: &str| -> Result<(), ScenarioError> {
            if files.is_empty() {
                return Ok(());
            }
            let ok = match d.source {
                Source::Idx => files.len() == 2,
                Source::Images => files.len() == 1,
                _ => true,
            };
            check(ok, || {
                format!(
                    "data.{field} for source \"{name}\": {}, got {} path(s)",
                    if d.source == Source::Idx {
                        "[images, labels]"
                    } else {
                        "[folder] (one folder of class sub-folders)"
                    },
                    files.len()
                )
            })
        };
        shape(&d.files, "files")?;
        shape(&d.test_files, "test_files")
    }
}
