//! A model to take home: a silo's personalised predictor as `model.safetensors` with a small
//! `model.json` beside it, and reading it back.
//!
//! Owns: the file pair's format. The safetensors file holds one set of the architecture's
//! tensors per part, named `m<j>.<tensor>` (`m0.fc0.weight`, …); the JSON names the
//! architecture ([`ModelSpec`]), each part's owner and weight, and what new rows need
//! ([`CardData`]: the feature constants, the class names). Also the rows `predict` reads
//! ([`Input`]: a CSV with or without its label column, labels by id or by name). A FedeRiCo silo's predictor
//! is the mixture Σ w_j · softmax(model_j(x)) of its own and its measured peers' models (spec
//! §5.3); a coordinated silo's is one part of weight 1.
//! Must not: decide what to export (the drivers do) or run a model (the [`Learner`] does).

use super::{Dataset, FeatureScale, LearnError, Learner, ModelSpec};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The `format` field of every `model.json`.
pub const FORMAT: &str = "federico-model/1";

/// One part of an exported predictor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Part {
    /// Tensor name prefix in the safetensors file (`m0`, `m1`, …).
    pub prefix: String,
    /// Whose model it is (a silo name).
    pub owner: String,
    /// Its weight in the mixture (the weights sum to 1).
    pub weight: f64,
}

/// `model.json`: what the safetensors file holds and how to predict with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// Always [`FORMAT`].
    pub format: String,
    /// The silo that exported it.
    pub silo: String,
    /// The architecture every part shares.
    pub model: ModelSpec,
    /// Input shape of one sample.
    pub input_shape: Vec<usize>,
    /// The parts and their weights.
    pub parts: Vec<Part>,
    /// Rounds completed when it was written.
    pub round: u64,
    /// Its accuracy on the silo's test split when it was written (classifiers).
    pub test_accuracy: Option<f64>,
    /// The safetensors file, relative to this one.
    pub weights: String,
    /// The feature constants the parts were trained with (standardized CSV columns), which
    /// `predict` applies to rows in their own units; absent when the rows were used as read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<FeatureScale>,
    /// The class names by class id: `predict` reads labels (CSV cells, image folders) by
    /// these names and writes its predictions with them. Every classifier's card has them
    /// (where the labels were class ids, `"0"`, `"1"`, …); absent for regression, and in
    /// cards written before this rule, where the labels were ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_names: Option<Vec<String>>,
}

/// What a card says about the silo's rows besides the weights: how to read new rows in their
/// own units and what to call the classes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CardData {
    /// The feature constants the rows were standardized with, if any.
    pub scale: Option<FeatureScale>,
    /// The class names by class id, where the labels had names (CSV text labels, image
    /// folders); `None` where the class ids are the labels.
    pub class_names: Option<Vec<String>>,
}

/// The file `init` and `partition` write beside shards whose labels had names: a JSON list of
/// the class names by class id.
pub const CLASSES_FILE: &str = "classes.json";

/// Checks a list of class names: at least two, none empty, none twice. The message says what
/// is wrong; the caller says where the list came from.
pub fn check_class_names(names: &[String]) -> Result<(), String> {
    if names.len() < 2 {
        return Err(format!("needs at least 2 names, got {}", names.len()));
    }
    if names.iter().any(|n| n.trim().is_empty()) {
        return Err("holds an empty name".into());
    }
    match names
        .iter()
        .enumerate()
        .find_map(|(i, n)| names[..i].contains(n).then_some(n))
    {
        Some(d) => Err(format!("lists {d:?} twice")),
        None => Ok(()),
    }
}

/// Reads a [`CLASSES_FILE`]: a JSON list of class names ([`check_class_names`]).
pub fn read_class_names(path: &Path) -> Result<Vec<String>, super::DataError> {
    let bad = |what: String| super::DataError::Invalid(format!("{}: {what}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|error| super::DataError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    let names: Vec<String> = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not a JSON list of class names: {e}")))?;
    check_class_names(&names).map_err(bad)?;
    Ok(names)
}

/// A predictor read back: the card and each part's flat parameters.
#[derive(Debug)]
pub struct Exported {
    /// The description.
    pub card: ModelCard,
    /// Flat parameters of each part, in the card's order (the learner's flattening order).
    pub params: Vec<Vec<f32>>,
}

impl Exported {
    /// Mixed class probabilities (or regression outputs), row-major `len × outputs`.
    pub fn predict(&self, learner: &mut Learner, data: &Dataset) -> Result<Vec<f64>, LearnError> {
        let parts: Vec<(&[f32], f64)> = self
            .card
            .parts
            .iter()
            .zip(&self.params)
            .map(|(part, params)| (params.as_slice(), part.weight))
            .collect();
        learner.predict_mixture(&parts, data)
    }
}

fn err(path: &Path, what: impl std::fmt::Display) -> LearnError {
    LearnError::Shape(format!("{}: {what}", path.display()))
}

/// Writes `<dir>/model.safetensors` and `<dir>/model.json` (each through a temporary file and a
/// rename, the JSON last: a reader never sees a card without its weights). `parts` are
/// `(owner, parameters, weight)`; `data`, what the card says about the silo's rows.
pub fn write(
    dir: &Path,
    learner: &Learner,
    silo: &str,
    parts: &[(String, &[f32], f64)],
    round: u64,
    test_accuracy: Option<f64>,
    data: &CardData,
) -> Result<PathBuf, LearnError> {
    if let Some(names) = &data.class_names
        && names.len() != learner.outputs()
    {
        return Err(LearnError::Shape(format!(
            "{} class names for a model of {} classes",
            names.len(),
            learner.outputs()
        )));
    }
    let layout = learner.layout();
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let mut cards = Vec::with_capacity(parts.len());
    for (j, (owner, params, weight)) in parts.iter().enumerate() {
        if params.len() != learner.num_params() {
            return Err(LearnError::Shape(format!(
                "part {owner}: {} parameters, the model has {}",
                params.len(),
                learner.num_params()
            )));
        }
        let prefix = format!("m{j}");
        let mut at = 0;
        for (name, dims) in &layout {
            let len: usize = dims.iter().product();
            let t = Tensor::from_slice(&params[at..at + len], dims.as_slice(), &Device::Cpu)?;
            tensors.insert(format!("{prefix}.{name}"), t);
            at += len;
        }
        cards.push(Part {
            prefix,
            owner: owner.clone(),
            weight: *weight,
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    let weights = dir.join("model.safetensors");
    let tmp = dir.join(".model.safetensors.tmp");
    candle_core::safetensors::save(&tensors, &tmp)?;
    std::fs::rename(&tmp, &weights).map_err(|e| err(&weights, e))?;
    let card = ModelCard {
        format: FORMAT.into(),
        silo: silo.into(),
        model: learner.spec().clone(),
        input_shape: learner.spec().input_shape(),
        parts: cards,
        round,
        test_accuracy,
        weights: "model.safetensors".into(),
        scale: data.scale.clone(),
        class_names: data.class_names.clone().or_else(|| {
            // Every classifier names its classes, so that `predict` maps labels (CSV cells,
            // image folders) by name, never by position: where the labels were class ids,
            // a class's name is its id.
            (!learner.spec().is_regression())
                .then(|| (0..learner.outputs()).map(|i| i.to_string()).collect())
        }),
    };
    let json = dir.join("model.json");
    let text = serde_json::to_string_pretty(&card).map_err(|e| err(&json, e))? + "\n";
    crate::store::write_atomic(&json, text.as_bytes()).map_err(|e| err(&json, e))?;
    Ok(json)
}

/// Reads a predictor from its `model.json` (or from the `.safetensors` file beside it), checking
/// every tensor's name and shape against the architecture.
pub fn read(path: &Path) -> Result<(Exported, Learner), LearnError> {
    let json = if path.extension().is_some_and(|e| e == "safetensors") {
        path.with_extension("json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&json).map_err(|e| err(&json, e))?;
    let card: ModelCard = serde_json::from_str(&text).map_err(|e| err(&json, e))?;
    if card.format != FORMAT {
        return Err(err(
            &json,
            format!("format {:?}, expected {FORMAT:?}", card.format),
        ));
    }
    if card.parts.is_empty() {
        return Err(err(&json, "no parts"));
    }
    let total: f64 = card.parts.iter().map(|p| p.weight).sum();
    if card
        .parts
        .iter()
        .any(|p| !p.weight.is_finite() || p.weight < 0.0)
        || (total - 1.0).abs() > 1e-6
    {
        return Err(err(
            &json,
            format!("part weights must be ≥ 0 and sum to 1, got {total}"),
        ));
    }
    let weights = json.parent().unwrap_or(Path::new(".")).join(&card.weights);
    let learner = Learner::new(&card.model, 256)?;
    let tensors =
        candle_core::safetensors::load(&weights, &Device::Cpu).map_err(|e| err(&weights, e))?;
    let layout = learner.layout();
    let mut params = Vec::with_capacity(card.parts.len());
    for part in &card.parts {
        let mut flat = Vec::with_capacity(learner.num_params());
        for (name, dims) in &layout {
            let key = format!("{}.{name}", part.prefix);
            let t = tensors
                .get(&key)
                .ok_or_else(|| err(&weights, format!("no tensor {key}")))?;
            if t.dims() != dims.as_slice() {
                return Err(err(
                    &weights,
                    format!(
                        "tensor {key} has shape {:?}, the model needs {dims:?}",
                        t.dims()
                    ),
                ));
            }
            flat.extend(
                t.flatten_all()?
                    .to_dtype(candle_core::DType::F32)?
                    .to_vec1::<f32>()?,
            );
        }
        if flat.iter().any(|x| !x.is_finite()) {
            return Err(err(
                &weights,
                format!("part {} holds non-finite values", part.prefix),
            ));
        }
        params.push(flat);
    }
    Ok((Exported { card, params }, learner))
}

/// Files to predict on, in the formats a node reads.
#[derive(Clone, Debug)]
pub enum Input {
    /// A shard from `federico partition` / `init`: its test split, or its training split.
    Shard {
        /// The shard file.
        path: PathBuf,
        /// The training split instead of the test split.
        train: bool,
    },
    /// CSV of numeric features, with or without a label column: a row as wide as the model's
    /// input has no label; one column more has one (`label_column`, default the last), a class
    /// id or one of the class names.
    Csv {
        /// The CSV file.
        path: PathBuf,
        /// The label column, by header name or 0-based position (default: the last).
        label_column: Option<super::loaders::Column>,
    },
    /// IDX images and labels (MNIST-style, any image size, gzip or not).
    Idx {
        /// The images file.
        images: PathBuf,
        /// The labels file.
        labels: PathBuf,
    },
    /// CIFAR-10 binary batches.
    Cifar10(Vec<PathBuf>),
    /// A folder of class sub-folders of PNG/JPEG images.
    Images {
        /// The folder.
        dir: PathBuf,
        /// Class names in class-id order (default: the model's, else the sub-folders sorted
        /// by name).
        class_names: Option<Vec<String>>,
    },
}

/// Samples read to predict on.
#[derive(Debug)]
pub struct Rows {
    /// The samples (unlabelled rows carry class 0, unused).
    pub data: Dataset,
    /// Whether the samples came with labels (CSV rows may not).
    pub labelled: bool,
}

impl Input {
    /// Loads the samples for a model of `inputs` features per sample (CSV) and `classes`
    /// classes named `names` (by class id, where the labels had names): CSV and image labels
    /// are read by these names, CSV labels that are class ids as they are.
    pub fn load(
        &self,
        inputs: usize,
        classes: usize,
        names: Option<&[String]>,
    ) -> Result<Rows, super::DataError> {
        use super::loaders;
        let labelled = |data| Rows {
            data,
            labelled: true,
        };
        match self {
            Input::Shard { path, train } => {
                let data = super::Shard::read(path)?.data;
                Ok(labelled(if *train { data.train } else { data.test }))
            }
            Input::Csv { path, label_column } => {
                read_csv_rows(path, label_column.as_ref(), inputs, classes, names)
            }
            Input::Images { dir, class_names } => {
                let set = loaders::read_image_folder(dir)?;
                let list =
                    image_classes(dir, &set.names, classes, class_names.as_deref().or(names))?;
                let (mut sets, _) = loaders::unify_named(&[&set], Some(classes), Some(&list))?;
                Ok(labelled(
                    sets.pop().expect("unify returns one set per part"),
                ))
            }
            Input::Idx { images, labels } => loaders::load_idx_files(images, labels).map(labelled),
            Input::Cifar10(files) => loaders::load_cifar_files(files).map(labelled),
        }
    }
}

/// The model's class names by id for an image folder whose class sub-folders are `found`: a
/// folder is its class by name, never by its position among the folders (a folder holding
/// classes 5 to 9 must not read `5` as class 0). `names` are the model's (or `--class-names`);
/// a card without them (written before every card named its classes) is read as naming class
/// `i` `"i"` where every folder's name is a class id, and refused otherwise. A folder that is
/// not one of the model's classes is an error naming it and the classes.
fn image_classes(
    dir: &Path,
    found: &[String],
    classes: usize,
    names: Option<&[String]>,
) -> Result<Vec<String>, super::DataError> {
    let bad = |what: String| super::DataError::Invalid(format!("{}: {what}", dir.display()));
    let list: Vec<String> = match names {
        Some(n) => n.to_vec(),
        None if found
            .iter()
            .all(|n| n.parse::<usize>().is_ok_and(|id| id < classes)) =>
        {
            (0..classes).map(|i| i.to_string()).collect()
        }
        None => {
            return Err(bad(format!(
                "the model names no classes, so its class folders ({}) cannot be matched to \
                 its {classes} classes: give --class-names with the class names in class-id \
                 order",
                found.join(", ")
            )));
        }
    };
    if let Some(n) = found.iter().find(|n| !list.contains(n)) {
        return Err(bad(format!(
            "class folder {n:?} is not one of the model's classes ({})",
            list.join(", ")
        )));
    }
    Ok(list)
}

/// A label's class id for a model of `classes` classes named `names`: its position among the
/// names, else the label read as a class id.
fn class_id(label: &str, classes: usize, names: Option<&[String]>) -> Result<u32, String> {
    if let Some(id) = names.and_then(|l| l.iter().position(|x| x == label)) {
        return Ok(id as u32);
    }
    match (label.parse::<u32>(), names) {
        (Ok(id), _) if (id as usize) < classes => Ok(id),
        (Ok(id), _) => Err(format!(
            "label {id} is out of range: the model has {classes} classes (0..={})",
            classes - 1
        )),
        (Err(_), Some(l)) => Err(format!(
            "label {label:?} is not one of the model's classes ({})",
            l.join(", ")
        )),
        (Err(_), None) => Err(format!(
            "label {label:?} is not a class id, and the model names no classes: give \
             --class-names with the class names in class-id order"
        )),
    }
}

/// A CSV file's rows for a model of `inputs` features: without a label column when a row has
/// `inputs` columns, with one when it has one more.
fn read_csv_rows(
    path: &Path,
    label_column: Option<&super::loaders::Column>,
    inputs: usize,
    classes: usize,
    names: Option<&[String]>,
) -> Result<Rows, super::DataError> {
    use super::loaders::{CsvColumns, read_csv};
    use super::{DataError, Labels};
    let corrupt = |what: String| DataError::Invalid(format!("{}: {what}", path.display()));
    let read = |unlabelled| {
        read_csv(
            path,
            CsvColumns {
                label: label_column,
                unlabelled,
                ..CsvColumns::default()
            },
        )
        .map(|t| t.set)
    };
    let set = read(false)?;
    let width = set.sample_shape.iter().product::<usize>();
    let (set, labelled) = if width == inputs {
        (set, true)
    } else if label_column.is_none() && width + 1 == inputs {
        (read(true)?, false)
    } else {
        return Err(corrupt(format!(
            "rows of {} columns, but the model takes {inputs} features: a row needs {inputs} \
             (no label) or {} (features and a label{})",
            width + 1,
            inputs + 1,
            if label_column.is_some() {
                ", as label_column says"
            } else {
                ""
            }
        )));
    };
    let ids = if labelled {
        let map = set
            .names
            .iter()
            .map(|n| class_id(n, classes, names).map_err(corrupt))
            .collect::<Result<Vec<u32>, _>>()?;
        set.labels.iter().map(|&l| map[l as usize]).collect()
    } else {
        vec![0; set.len()]
    };
    let data = Dataset::new(
        set.features,
        set.sample_shape,
        Labels::Class {
            ids,
            num_classes: classes,
        },
    )
    .map_err(|e| corrupt(e.to_string()))?;
    Ok(Rows { data, labelled })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::Labels;

    #[test]
    fn a_written_mixture_reads_back_and_predicts_as_the_learner_scores_it() {
        let spec = ModelSpec::Mlp {
            inputs: 4,
            hidden: vec![3],
            classes: 2,
        };
        let learner = Learner::new(&spec, 8).unwrap();
        let a: Vec<f32> = (0..learner.num_params())
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let b: Vec<f32> = (0..learner.num_params())
            .map(|i| (i as f32 * 0.11).cos())
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let parts = vec![
            ("silo-0".to_string(), a.as_slice(), 0.25),
            ("silo-3".to_string(), b.as_slice(), 0.75),
        ];
        let scale = FeatureScale {
            mean: vec![0.5; 4],
            std: vec![2.0; 4],
        };
        let names = ["no", "yes"].map(String::from).to_vec();
        let data = CardData {
            scale: Some(scale.clone()),
            class_names: Some(names.clone()),
        };
        let json = write(dir.path(), &learner, "silo-0", &parts, 7, Some(0.5), &data);
        let (got, _) = read(&json.unwrap()).unwrap();
        assert_eq!(got.params, vec![a.clone(), b.clone()]);
        assert_eq!(got.card.scale, Some(scale));
        assert_eq!(got.card.class_names, Some(names));
        let three = CardData {
            class_names: Some(["a", "b", "c"].map(String::from).to_vec()),
            ..CardData::default()
        };
        let e = write(dir.path(), &learner, "silo-0", &parts, 7, None, &three).unwrap_err();
        assert!(e.to_string().contains("3 class names"), "{e}");
        let json = write(
            dir.path(),
            &learner,
            "silo-0",
            &parts,
            7,
            Some(0.5),
            &CardData::default(),
        )
        .unwrap();
        let (got, mut learner) = read(&json).unwrap();
        assert_eq!(got.card.scale, None, "no scale: rows used as read");
        assert_eq!(
            got.card.class_names,
            Some(vec!["0".to_string(), "1".to_string()]),
            "labels that were ids name their classes by id"
        );
        assert_eq!(got.card.parts[1].owner, "silo-3");
        let data = Dataset::new(
            (0..40).map(|i| (i as f32 * 0.3).sin()).collect(),
            vec![4],
            Labels::Class {
                ids: (0..10).map(|i| i % 2).collect(),
                num_classes: 2,
            },
        )
        .unwrap();
        let mixed = got.predict(&mut learner, &data).unwrap();
        let correct = mixed
            .chunks(2)
            .zip(0..10u32)
            .filter(|(row, i)| (row[1] > row[0]) as u32 == i % 2)
            .count();
        let eval = learner
            .evaluate_mixture(&[(&a, 0.25), (&b, 0.75)], &data)
            .unwrap();
        assert_eq!(correct, eval.correct);
        // Read from the safetensors path too; a damaged file is an error naming it.
        read(&dir.path().join("model.safetensors")).unwrap();
        std::fs::write(dir.path().join("model.safetensors"), b"not safetensors").unwrap();
        let e = read(&json)
            .err()
            .expect("a damaged file is refused")
            .to_string();
        assert!(e.contains("model.safetensors"), "{e}");
    }

    /// An image folder's classes by name: folders `5` and `7` are classes 5 and 7 of a
    /// ten-class model, not 0 and 1 (the folders' positions), with or without names on the
    /// card; text names map to their position in the card's list; a folder the model does not
    /// know is refused by name, and so are text folders for a card that names no classes.
    #[test]
    fn image_folders_are_read_by_class_name_never_by_position() {
        use crate::learn::loaders::write_image_folder as write_folder;
        let ids = |r: Rows| match r.data.labels {
            Labels::Class { ids, .. } => ids,
            Labels::Real(_) => panic!("class labels"),
        };
        let digits: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        let tmp = tempfile::tempdir().unwrap();
        write_folder(tmp.path(), &["5", "7"], 2, 2, 2, false);
        let input = Input::Images {
            dir: tmp.path().to_path_buf(),
            class_names: None,
        };
        assert_eq!(ids(input.load(4, 10, Some(&digits)).unwrap()), [5, 5, 7, 7]);
        assert_eq!(
            ids(input.load(4, 10, None).unwrap()),
            [5, 5, 7, 7],
            "legacy card"
        );
        let e = input.load(4, 6, None).unwrap_err().to_string();
        assert!(e.contains("--class-names"), "7 is no class of 6: {e}");
        let tmp = tempfile::tempdir().unwrap();
        write_folder(tmp.path(), &["dog", "emu"], 1, 2, 2, false);
        let pets = ["cat", "dog", "emu"].map(String::from).to_vec();
        let input = Input::Images {
            dir: tmp.path().to_path_buf(),
            class_names: None,
        };
        assert_eq!(ids(input.load(4, 3, Some(&pets)).unwrap()), [1, 2]);
        let e = input.load(4, 3, None).unwrap_err().to_string();
        assert!(
            e.contains("names no classes") && e.contains("dog, emu"),
            "{e}"
        );
        let e = input.load(4, 10, Some(&digits)).unwrap_err().to_string();
        assert!(
            e.contains("class folder \"dog\" is not one of the model's classes (0, 1,"),
            "{e}"
        );
    }

    #[test]
    fn csv_rows_come_with_a_label_by_id_or_name_or_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let names = ["healthy", "mild", "severe"].map(String::from).to_vec();
        let load = |p: &Path, names: Option<&[String]>| read_csv_rows(p, None, 2, 3, names);
        let ids = |r: &Rows| match &r.data.labels {
            Labels::Class { ids, .. } => ids.clone(),
            Labels::Real(_) => panic!("class labels"),
        };
        let by_name = file("named.csv", "a,b,outcome\n1,2,mild\n3,4,severe\n5,6,2\n");
        let rows = load(&by_name, Some(&names)).unwrap();
        assert!(rows.labelled);
        assert_eq!(ids(&rows), [1, 2, 2], "a name by position, an id as it is");
        assert_eq!(rows.data.features, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let e = load(&by_name, None).unwrap_err().to_string();
        assert!(
            e.contains("\"mild\" is not a class id") && e.contains("--class-names"),
            "{e}"
        );
        let other = file("other.csv", "a,b,outcome\n1,2,critical\n");
        let e = load(&other, Some(&names)).unwrap_err().to_string();
        assert!(
            e.contains("other.csv") && e.contains("\"critical\" is not one"),
            "{e}"
        );
        let far = file("far.csv", "1,2,3\n");
        let e = load(&far, None).unwrap_err().to_string();
        assert!(e.contains("label 3 is out of range"), "{e}");
        // As wide as the model's input: new rows, no label.
        let new = file("new.csv", "a,b\n1,2\n3,4\n");
        let rows = load(&new, Some(&names)).unwrap();
        assert!(!rows.labelled);
        assert_eq!(rows.data.features, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(rows.data.len(), 2);
        // Any other width names both.
        let wide = file("wide.csv", "1,2,3,0\n");
        let e = load(&wide, None).unwrap_err().to_string();
        assert!(
            e.contains("rows of 4 columns") && e.contains("takes 2 features"),
            "{e}"
        );
        let col = crate::learn::loaders::Column::Name("b".into());
        let e = read_csv_rows(&new, Some(&col), 2, 3, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("as label_column says"), "{e}");
    }
}
