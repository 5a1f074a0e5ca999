//! Readers for real data sets in their standard file formats.
//! Owns: MNIST / Fashion-MNIST IDX files (gzipped or not), CIFAR-10 binary batches, UCI optdigits,
//! and where they are looked for under a data directory.
//! Must not: split data between silos (that is `partition`), or panic on a bad file: every
//! problem is a [`DataError`] naming the file and what is wrong.

use super::data::{DataError, Dataset, Labels};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// A real data set federico can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RealSource {
    /// MNIST digits, 28×28 grey, 10 classes; folder `mnist/`.
    Mnist,
    /// Fashion-MNIST, 28×28 grey, 10 classes; folder `fashion-mnist/`.
    FashionMnist,
    /// CIFAR-10 binary version, 32×32 RGB, 10 classes; folder `cifar-10/cifar-10-batches-bin/`.
    Cifar10,
    /// UCI optdigits, 8×8 counts in 0..=16, 10 classes; folder `optdigits/`.
    Optdigits,
}

impl RealSource {
    /// Human-readable name, as used in messages.
    pub fn name(self) -> &'static str {
        match self {
            RealSource::Mnist => "MNIST",
            RealSource::FashionMnist => "Fashion-MNIST",
            RealSource::Cifar10 => "CIFAR-10",
            RealSource::Optdigits => "optdigits",
        }
    }

    /// The folder, relative to the data directory, where the files are looked for first.
    pub fn folder(self) -> &'static str {
        match self {
            RealSource::Mnist => "mnist",
            RealSource::FashionMnist => "fashion-mnist",
            RealSource::Cifar10 => "cifar-10/cifar-10-batches-bin",
            RealSource::Optdigits => "optdigits",
        }
    }

    /// Shape of one sample as loaded: `[channels, height, width]`.
    pub fn sample_shape(self) -> [usize; 3] {
        match self {
            RealSource::Mnist | RealSource::FashionMnist => [1, IDX_SIDE, IDX_SIDE],
            RealSource::Cifar10 => [3, CIFAR_SIDE, CIFAR_SIDE],
            RealSource::Optdigits => [1, 8, 8],
        }
    }

    /// Number of classes (10 for every source).
    pub fn num_classes(self) -> usize {
        CLASSES
    }
}

/// The official training and test parts of a real data set; pixels scaled to [0, 1].
#[derive(Clone, Debug)]
pub struct RealData {
    /// Training part.
    pub train: Dataset,
    /// Test part.
    pub test: Dataset,
}

/// Loads `source` from `dir` (the data directory holding one folder per data set; the data
/// set's own folder is accepted too).
///
/// Where files are looked for, in order:
/// - MNIST: `dir/mnist/`, else `dir` itself; Fashion-MNIST: `dir/fashion-mnist/`, else `dir`.
///   Files `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`,
///   `t10k-labels-idx1-ubyte`, each possibly with a `.gz` suffix (gzip is detected by its magic
///   bytes, not by the name). Images must be 28×28.
/// - CIFAR-10: `dir/cifar-10/cifar-10-batches-bin/`, `dir/cifar-10-batches-bin/`, else `dir`.
///   Training = every `data_batch_*.bin` present (at least one, ordered by batch number); test =
///   `test_batch.bin`, or else the first (by name) `test_batch*.bin` (e.g. a
///   `test_batch_first1000.bin` prefix).
/// - optdigits: `dir/optdigits/`, else `dir`; `optdigits.tra` (training), `optdigits.tes` (test).
///
/// Pixels are scaled to [0, 1] (/255, or /16 for optdigits). Sample shapes are `[1, 28, 28]`,
/// `[3, 32, 32]` (R, G, B planes) and `[1, 8, 8]`.
pub fn load(source: RealSource, dir: &Path) -> Result<RealData, DataError> {
    let folder = resolve_folder(source, dir)?;
    match source {
        RealSource::Mnist | RealSource::FashionMnist => Ok(RealData {
            train: load_idx_pair(source, &folder, "train")?,
            test: load_idx_pair(source, &folder, "t10k")?,
        }),
        RealSource::Cifar10 => load_cifar(&folder),
        RealSource::Optdigits => Ok(RealData {
            train: load_optdigits(&require_file(source, &folder, &["optdigits.tra"])?)?,
            test: load_optdigits(&require_file(source, &folder, &["optdigits.tes"])?)?,
        }),
    }
}

const CLASSES: usize = 10;
const IDX_SIDE: usize = 28;
const IDX_IMAGES_MAGIC: u32 = 0x0000_0803;
const IDX_LABELS_MAGIC: u32 = 0x0000_0801;
const CIFAR_SIDE: usize = 32;
const CIFAR_PIXELS: usize = 3 * CIFAR_SIDE * CIFAR_SIDE;
const CIFAR_RECORD: usize = 1 + CIFAR_PIXELS;
const OPTDIGITS_FEATURES: usize = 64;
const IDX_FILES: [&str; 4] = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
];

/// What to put where (`folder`), and how to point federico at it; appended to every `Missing`
/// message.
fn help(source: RealSource, folder: &Path) -> String {
    let files = match source {
        RealSource::Mnist | RealSource::FashionMnist => IDX_FILES.join(", "),
        RealSource::Cifar10 => "data_batch_1.bin ... data_batch_5.bin (at least one) and \
                                test_batch.bin, from the CIFAR-10 binary version \
                                (cifar-10-binary.tar.gz)"
            .to_string(),
        RealSource::Optdigits => "optdigits.tra and optdigits.tes (UCI optdigits, CSV)".to_string(),
    };
    let note = match source {
        RealSource::Mnist | RealSource::FashionMnist => " (each may be gzipped, with a .gz suffix)",
        _ => "",
    };
    format!(
        "{} needs {files} in {}{note}. Put the files there, or point federico at the data directory \
         that holds the `{}/` folder with the FEDERICO_DATA_DIR environment variable, the \
         --data-dir flag or the scenario's `data.dir` field.",
        source.name(),
        folder.display(),
        source.folder(),
    )
}

fn missing(source: RealSource, folder: &Path, what: String) -> DataError {
    DataError::Missing(format!("{what}. {}", help(source, folder)))
}

/// True when `dir` directly holds at least one file of `source`.
fn holds_files(source: RealSource, dir: &Path) -> bool {
    match source {
        RealSource::Mnist | RealSource::FashionMnist => IDX_FILES
            .iter()
            .any(|f| dir.join(f).is_file() || dir.join(format!("{f}.gz")).is_file()),
        RealSource::Cifar10 => std::fs::read_dir(dir)
            .map(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.ends_with(".bin")
                        && (name.starts_with("data_batch_") || name.starts_with("test_batch"))
                })
            })
            .unwrap_or(false),
        RealSource::Optdigits => {
            dir.join("optdigits.tra").is_file() || dir.join("optdigits.tes").is_file()
        }
    }
}

/// The folder holding the files of `source`: a sub-folder of `dir`, or `dir` itself.
fn resolve_folder(source: RealSource, dir: &Path) -> Result<PathBuf, DataError> {
    if !dir.is_dir() {
        return Err(missing(
            source,
            &dir.join(source.folder()),
            format!(
                "{} not found: the data directory {} does not exist",
                source.name(),
                dir.display()
            ),
        ));
    }
    let mut candidates = vec![dir.join(source.folder())];
    if source == RealSource::Cifar10 {
        candidates.push(dir.join("cifar-10-batches-bin"));
    }
    for c in &candidates {
        if c.is_dir() {
            return Ok(c.clone());
        }
    }
    if holds_files(source, dir) {
        return Ok(dir.to_path_buf());
    }
    let tried: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    Err(missing(
        source,
        &candidates[0],
        format!(
            "{} not found: no folder {} and no {} files directly in {}",
            source.name(),
            tried.join(" or "),
            source.name(),
            dir.display()
        ),
    ))
}

/// The first of `names` that exists in `folder`, or `Missing`.
fn require_file(source: RealSource, folder: &Path, names: &[&str]) -> Result<PathBuf, DataError> {
    for n in names {
        let p = folder.join(n);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(missing(
        source,
        folder,
        format!(
            "{} incomplete: {} has no {}",
            source.name(),
            folder.display(),
            names.join(" or ")
        ),
    ))
}

fn corrupt(path: &Path, reason: impl Into<String>) -> DataError {
    DataError::Corrupt {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn io_err(path: &Path, source: io::Error) -> DataError {
    DataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// An opened file, transparently gunzipped when it starts with the gzip magic `1f 8b`.
struct Opened {
    reader: Box<dyn Read>,
    /// Byte length of a plain (not gzipped) file; `None` when gzipped.
    plain_len: Option<u64>,
}

fn open_maybe_gz(path: &Path) -> Result<Opened, DataError> {
    let mut file = File::open(path).map_err(|e| io_err(path, e))?;
    let len = file.metadata().map_err(|e| io_err(path, e))?.len();
    let mut head = [0u8; 2];
    let mut got = 0;
    while got < 2 {
        match file.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(path, e)),
        }
    }
    file.seek(SeekFrom::Start(0)).map_err(|e| io_err(path, e))?;
    if got == 2 && head == [0x1f, 0x8b] {
        Ok(Opened {
            reader: Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(file))),
            plain_len: None,
        })
    } else {
        Ok(Opened {
            reader: Box::new(BufReader::new(file)),
            plain_len: Some(len),
        })
    }
}

/// Maps a read error: a broken gzip stream is a `Corrupt` file, anything else an `Io` error.
fn read_err(path: &Path, gz: bool, e: io::Error) -> DataError {
    if gz
        && matches!(
            e.kind(),
            io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput | io::ErrorKind::UnexpectedEof
        )
    {
        corrupt(path, format!("broken gzip stream: {e}"))
    } else {
        io_err(path, e)
    }
}

/// Reads as many bytes as possible into `buf` (stops early only at end of stream).
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// An IDX ubyte file: its dimensions and payload.
struct Idx {
    dims: Vec<usize>,
    data: Vec<u8>,
}

/// Reads an IDX unsigned-byte file with `ndims` dimensions and the given magic number, checking
/// that the payload length is exactly the product of the dimensions (no truncation, no trailing
/// bytes) before trusting the header with any allocation.
/// `have` bytes follow an IDX header that declares `payload`: too few is truncation, too many
/// is trailing garbage. (Reading stops one byte past `payload`, so `have` may undercount the
/// trailing bytes of a gzipped file.)
fn check_payload(
    path: &Path,
    declared: &str,
    have: u64,
    payload: u64,
    suffix: &str,
) -> Result<(), DataError> {
    if have < payload {
        return Err(corrupt(
            path,
            format!("truncated: {declared} but only {have} follow the header{suffix}"),
        ));
    }
    if have > payload {
        return Err(corrupt(
            path,
            format!("trailing bytes: {declared} but {have} follow the header{suffix}"),
        ));
    }
    Ok(())
}

fn read_idx(path: &Path, magic: u32, ndims: usize, what: &str) -> Result<Idx, DataError> {
    let Opened {
        mut reader,
        plain_len,
    } = open_maybe_gz(path)?;
    let gz = plain_len.is_none();
    let header_len = 4 + 4 * ndims;
    let mut header = vec![0u8; header_len];
    let got = read_full(&mut reader, &mut header).map_err(|e| read_err(path, gz, e))?;
    if got < 4 {
        return Err(corrupt(
            path,
            format!("only {got} bytes: too short for an IDX magic number"),
        ));
    }
    let found = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    if found != magic {
        return Err(corrupt(
            path,
            format!("bad magic number: expected 0x{magic:08x} ({what}), found 0x{found:08x}"),
        ));
    }
    if got < header_len {
        return Err(corrupt(
            path,
            format!("truncated header: {got} bytes, the {what} header needs {header_len}"),
        ));
    }
    let dims: Vec<usize> = header[4..]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let payload = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| corrupt(path, format!("header dimensions {dims:?} overflow")))?;
    let declared = format!("the header declares dimensions {dims:?}, i.e. {payload} data bytes");
    // Checked on the file length first, so a lying header never causes a large allocation.
    if let Some(len) = plain_len {
        check_payload(path, &declared, len - header_len as u64, payload, "")?;
    }
    // Grow only with bytes actually read, so a lying header in a gzipped file cannot make us
    // allocate more than the stream really holds.
    let cap = match plain_len {
        Some(_) => payload,
        None => payload.min(1 << 24),
    };
    let mut data = Vec::with_capacity(cap as usize);
    reader
        .by_ref()
        .take(payload.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| read_err(path, gz, e))?;
    let suffix = if gz { " (after gunzip)" } else { "" };
    check_payload(path, &declared, data.len() as u64, payload, suffix)?;
    Ok(Idx { dims, data })
}

/// Finds `name` or `name.gz` in `folder`.
fn idx_file(source: RealSource, folder: &Path, name: &str) -> Result<PathBuf, DataError> {
    require_file(source, folder, &[name, &format!("{name}.gz")])
}

/// Loads one IDX images/labels pair (`prefix` is `train` or `t10k`).
fn load_idx_pair(source: RealSource, folder: &Path, prefix: &str) -> Result<Dataset, DataError> {
    let img_path = idx_file(source, folder, &format!("{prefix}-images-idx3-ubyte"))?;
    let lbl_path = idx_file(source, folder, &format!("{prefix}-labels-idx1-ubyte"))?;
    let images = read_idx(&img_path, IDX_IMAGES_MAGIC, 3, "IDX3 unsigned-byte images")?;
    if images.dims[1] != IDX_SIDE || images.dims[2] != IDX_SIDE {
        return Err(corrupt(
            &img_path,
            format!(
                "images are {}×{}, {} images must be {IDX_SIDE}×{IDX_SIDE}",
                images.dims[1],
                images.dims[2],
                source.name()
            ),
        ));
    }
    let labels = read_idx(&lbl_path, IDX_LABELS_MAGIC, 1, "IDX1 unsigned-byte labels")?;
    let (n_img, n_lbl) = (images.dims[0], labels.dims[0]);
    if n_img == 0 {
        return Err(corrupt(&img_path, "the header declares 0 images"));
    }
    if n_img != n_lbl {
        return Err(corrupt(
            &lbl_path,
            format!(
                "{n_lbl} labels but {} holds {n_img} images",
                img_path.display()
            ),
        ));
    }
    let ids = class_ids(&lbl_path, &labels.data)?;
    let features = images.data.iter().map(|&b| f32::from(b) / 255.0).collect();
    dataset(&img_path, features, source.sample_shape().to_vec(), ids)
}

/// Checks every label byte is a class id in 0..10.
fn class_ids(path: &Path, bytes: &[u8]) -> Result<Vec<u32>, DataError> {
    if let Some((i, &b)) = bytes
        .iter()
        .enumerate()
        .find(|(_, b)| usize::from(**b) >= CLASSES)
    {
        return Err(corrupt(
            path,
            format!(
                "label {b} of sample {i} is out of range 0..={}",
                CLASSES - 1
            ),
        ));
    }
    Ok(bytes.iter().map(|&b| u32::from(b)).collect())
}

fn dataset(
    path: &Path,
    features: Vec<f32>,
    shape: Vec<usize>,
    ids: Vec<u32>,
) -> Result<Dataset, DataError> {
    Dataset::new(
        features,
        shape,
        Labels::Class {
            ids,
            num_classes: CLASSES,
        },
    )
    .map_err(|e| corrupt(path, e.to_string()))
}

/// Orders `data_batch_<n>.bin` by `n` (then by name, for odd names).
fn batch_key(name: &str) -> (u64, String) {
    let n = name
        .strip_prefix("data_batch_")
        .and_then(|s| s.strip_suffix(".bin"))
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    (n, name.to_string())
}

fn load_cifar(folder: &Path) -> Result<RealData, DataError> {
    let source = RealSource::Cifar10;
    let entries = std::fs::read_dir(folder).map_err(|e| io_err(folder, e))?;
    let mut names = Vec::new();
    for e in entries {
        let e = e.map_err(|e| io_err(folder, e))?;
        if e.path().is_file() {
            names.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    let mut train: Vec<String> = names
        .iter()
        .filter(|n| n.starts_with("data_batch_") && n.ends_with(".bin"))
        .cloned()
        .collect();
    train.sort_by_key(|n| batch_key(n));
    if train.is_empty() {
        return Err(missing(
            source,
            folder,
            format!(
                "CIFAR-10 incomplete: {} has no data_batch_*.bin",
                folder.display()
            ),
        ));
    }
    let test = if names.iter().any(|n| n == "test_batch.bin") {
        "test_batch.bin".to_string()
    } else {
        let mut tests: Vec<&String> = names
            .iter()
            .filter(|n| n.starts_with("test_batch") && n.ends_with(".bin"))
            .collect();
        tests.sort();
        match tests.first() {
            Some(t) => (*t).clone(),
            None => {
                return Err(missing(
                    source,
                    folder,
                    format!(
                        "CIFAR-10 incomplete: {} has no test_batch.bin",
                        folder.display()
                    ),
                ));
            }
        }
    };
    let mut features = Vec::new();
    let mut ids = Vec::new();
    for name in &train {
        read_cifar_batch(&folder.join(name), &mut features, &mut ids)?;
    }
    let first = folder.join(&train[0]);
    let train = dataset(&first, features, source.sample_shape().to_vec(), ids)?;
    let (mut features, mut ids) = (Vec::new(), Vec::new());
    let test_path = folder.join(test);
    read_cifar_batch(&test_path, &mut features, &mut ids)?;
    let test = dataset(&test_path, features, source.sample_shape().to_vec(), ids)?;
    Ok(RealData { train, test })
}

/// One silo's own data in the MNIST IDX format: an images file (IDX3 unsigned bytes, any
/// height × width) and a labels file (IDX1, class ids 0..=9), each possibly gzipped. Pixels are
/// scaled to [0, 1]; samples are `[1, height, width]`.
pub fn load_idx_files(images: &Path, labels: &Path) -> Result<Dataset, DataError> {
    let img = read_idx(images, IDX_IMAGES_MAGIC, 3, "IDX3 unsigned-byte images")?;
    let lbl = read_idx(labels, IDX_LABELS_MAGIC, 1, "IDX1 unsigned-byte labels")?;
    if img.dims[0] == 0 {
        return Err(corrupt(images, "the header declares 0 images"));
    }
    if img.dims[0] != lbl.dims[0] {
        return Err(corrupt(
            labels,
            format!(
                "{} labels but {} holds {} images",
                lbl.dims[0],
                images.display(),
                img.dims[0]
            ),
        ));
    }
    let ids = class_ids(labels, &lbl.data)?;
    let features = img.data.iter().map(|&b| f32::from(b) / 255.0).collect();
    dataset(images, features, vec![1, img.dims[1], img.dims[2]], ids)
}

/// One silo's own data as CIFAR-10 binary batches (1 label byte + 3072 pixel bytes per record),
/// concatenated in the order given.
pub fn load_cifar_files(batches: &[PathBuf]) -> Result<Dataset, DataError> {
    let first = batches
        .first()
        .ok_or_else(|| DataError::Invalid("no CIFAR-10 batch files given".into()))?;
    let (mut features, mut ids) = (Vec::new(), Vec::new());
    for b in batches {
        read_cifar_batch(b, &mut features, &mut ids)?;
    }
    dataset(
        first,
        features,
        RealSource::Cifar10.sample_shape().to_vec(),
        ids,
    )
}

/// One silo's own data as CSV: one sample per line, numeric features and an integer class id in
/// `label_column` (0-based; `None` = the last column), `classes` classes in the federation. A
/// first line that is not numeric is taken as a header. Errors name the file, line and column.
pub fn load_csv(
    path: &Path,
    label_column: Option<usize>,
    classes: usize,
) -> Result<Dataset, DataError> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    let (mut features, mut ids) = (Vec::new(), Vec::new());
    let mut width = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let numeric = cells.iter().all(|c| c.parse::<f64>().is_ok());
        if !numeric && i == 0 {
            continue; // header
        }
        let at = |what: String| corrupt(path, format!("line {}: {what}", i + 1));
        if cells.len() < 2 {
            return Err(at(format!(
                "{} column(s); need features and a label",
                cells.len()
            )));
        }
        if *width.get_or_insert(cells.len()) != cells.len() {
            return Err(at(format!(
                "{} columns where the first row has {}",
                cells.len(),
                width.unwrap_or(0)
            )));
        }
        let lc = label_column.unwrap_or(cells.len() - 1);
        if lc >= cells.len() {
            return Err(at(format!(
                "label_column {lc} but only {} columns",
                cells.len()
            )));
        }
        for (c, cell) in cells.iter().enumerate() {
            if c == lc {
                let y: u32 = cell
                    .parse()
                    .map_err(|_| at(format!("label {cell:?} (column {c}) is not a class id")))?;
                if y as usize >= classes {
                    return Err(at(format!(
                        "label {y} is out of range 0..={} (data.classes = {classes})",
                        classes - 1
                    )));
                }
                ids.push(y);
            } else {
                let v: f32 = cell
                    .parse()
                    .map_err(|_| at(format!("column {c}: {cell:?} is not a number")))?;
                if !v.is_finite() {
                    return Err(at(format!("column {c}: {cell:?} is not finite")));
                }
                features.push(v);
            }
        }
    }
    let d = width.ok_or_else(|| corrupt(path, "no samples"))? - 1;
    Dataset::new(
        features,
        vec![d],
        Labels::Class {
            ids,
            num_classes: classes,
        },
    )
    .map_err(|e| corrupt(path, e.to_string()))
}

/// Appends the records of one CIFAR-10 binary batch (1 label byte + 3072 pixel bytes each).
fn read_cifar_batch(
    path: &Path,
    features: &mut Vec<f32>,
    ids: &mut Vec<u32>,
) -> Result<(), DataError> {
    let len = std::fs::metadata(path).map_err(|e| io_err(path, e))?.len();
    if len == 0 || len % CIFAR_RECORD as u64 != 0 {
        return Err(corrupt(
            path,
            format!(
                "{len} bytes is not a positive multiple of the {CIFAR_RECORD}-byte CIFAR-10 record \
                 (1 label byte + {CIFAR_PIXELS} pixel bytes); {} trailing bytes",
                len % CIFAR_RECORD as u64
            ),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    if bytes.len() as u64 != len || bytes.is_empty() {
        return Err(corrupt(
            path,
            format!(
                "file changed while reading ({len} then {} bytes)",
                bytes.len()
            ),
        ));
    }
    let n = bytes.len() / CIFAR_RECORD;
    features.reserve(n * CIFAR_PIXELS);
    ids.reserve(n);
    for (i, rec) in bytes.chunks_exact(CIFAR_RECORD).enumerate() {
        let label = rec[0];
        if usize::from(label) >= CLASSES {
            return Err(corrupt(
                path,
                format!(
                    "label {label} of record {i} is out of range 0..={}",
                    CLASSES - 1
                ),
            ));
        }
        ids.push(u32::from(label));
        features.extend(rec[1..].iter().map(|&b| f32::from(b) / 255.0));
    }
    Ok(())
}

/// Reads a UCI optdigits CSV file: per line, 64 counts in 0..=16 then the class 0..=9.
fn load_optdigits(path: &Path) -> Result<Dataset, DataError> {
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    let text =
        String::from_utf8(bytes).map_err(|e| corrupt(path, format!("not UTF-8 text: {e}")))?;
    let mut features = Vec::new();
    let mut ids = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != OPTDIGITS_FEATURES + 1 {
            return Err(corrupt(
                path,
                format!(
                    "line {}: expected {} comma-separated integers (64 counts and the class), found {}",
                    ln + 1,
                    OPTDIGITS_FEATURES + 1,
                    fields.len()
                ),
            ));
        }
        for (k, f) in fields.iter().enumerate() {
            let v: u32 = f.parse().map_err(|_| {
                corrupt(
                    path,
                    format!("line {}, field {}: {f:?} is not an integer", ln + 1, k + 1),
                )
            })?;
            if k < OPTDIGITS_FEATURES {
                if v > 16 {
                    return Err(corrupt(
                        path,
                        format!(
                            "line {}, field {}: count {v} is out of range 0..=16",
                            ln + 1,
                            k + 1
                        ),
                    ));
                }
                features.push(v as f32 / 16.0);
            } else {
                if v as usize >= CLASSES {
                    return Err(corrupt(
                        path,
                        format!(
                            "line {}: class {v} is out of range 0..={}",
                            ln + 1,
                            CLASSES - 1
                        ),
                    ));
                }
                ids.push(v);
            }
        }
    }
    if ids.is_empty() {
        return Err(corrupt(path, "no samples"));
    }
    dataset(
        path,
        features,
        RealSource::Optdigits.sample_shape().to_vec(),
        ids,
    )
}

#[cfg(test)]
mod csv_tests {
    use super::*;

    #[test]
    fn csv_reads_features_and_labels_and_names_bad_cells() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.csv");
        std::fs::write(&p, "x1,x2,y\n0.5,1,2\n-1,2e-3,0\n").unwrap();
        let d = load_csv(&p, None, 3).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d.features, vec![0.5, 1.0, -1.0, 0.002]);
        assert_eq!(
            d.labels,
            Labels::Class {
                ids: vec![2, 0],
                num_classes: 3
            }
        );
        let q = dir.path().join("b.csv");
        std::fs::write(&q, "2,0.5,1\n0,-1,2e-3\n").unwrap();
        let d = load_csv(&q, Some(0), 3).unwrap();
        assert_eq!(d.features, vec![0.5, 1.0, -1.0, 0.002]);
        assert_eq!(
            d.labels,
            Labels::Class {
                ids: vec![2, 0],
                num_classes: 3
            }
        );
        for (text, needle) in [
            ("1,2,5\n", "line 1: label 5 is out of range 0..=2"),
            (
                "1,2,0\n1,0\n",
                "line 2: 2 columns where the first row has 3",
            ),
            ("1,2,0\n1,x,0\n", "line 2: column 1: \"x\" is not a number"),
            ("1,2,0.5\n", "label \"0.5\""),
            ("", "no samples"),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = load_csv(&p, None, 3).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("a.csv"), "{text:?}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;

    fn idx_images(n: u32, rows: u32, cols: u32, magic: u32) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [magic, n, rows, cols] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        b.extend((0..n as usize * rows as usize * cols as usize).map(|i| (i % 251) as u8));
        b
    }

    fn idx_labels(labels: &[u8], magic: u32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&magic.to_be_bytes());
        b.extend_from_slice(&(labels.len() as u32).to_be_bytes());
        b.extend_from_slice(labels);
        b
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    /// Writes a 3-train / 2-test IDX set into `folder`, gzipped or not; returns the folder.
    fn write_idx_set(folder: &Path, gzipped: bool) {
        std::fs::create_dir_all(folder).unwrap();
        let files = [
            (
                "train-images-idx3-ubyte",
                idx_images(3, 28, 28, IDX_IMAGES_MAGIC),
            ),
            (
                "train-labels-idx1-ubyte",
                idx_labels(&[5, 0, 9], IDX_LABELS_MAGIC),
            ),
            (
                "t10k-images-idx3-ubyte",
                idx_images(2, 28, 28, IDX_IMAGES_MAGIC),
            ),
            (
                "t10k-labels-idx1-ubyte",
                idx_labels(&[7, 2], IDX_LABELS_MAGIC),
            ),
        ];
        for (name, bytes) in files {
            if gzipped {
                std::fs::write(folder.join(format!("{name}.gz")), gz(&bytes)).unwrap();
            } else {
                std::fs::write(folder.join(name), bytes).unwrap();
            }
        }
    }

    /// Replaces one file of an IDX set (plain or gz, as `name` says).
    fn put(folder: &Path, name: &str, bytes: Vec<u8>) {
        let plain = folder.join(name.trim_end_matches(".gz"));
        let zipped = folder.join(format!("{}.gz", name.trim_end_matches(".gz")));
        let _ = std::fs::remove_file(&plain);
        let _ = std::fs::remove_file(&zipped);
        if name.ends_with(".gz") {
            std::fs::write(zipped, gz(&bytes)).unwrap();
        } else {
            std::fs::write(plain, bytes).unwrap();
        }
    }

    /// Asserts `r` is a `Corrupt` error for file `file` whose message contains all of `needles`.
    fn assert_corrupt<T: std::fmt::Debug>(r: Result<T, DataError>, file: &str, needles: &[&str]) {
        let err = r.expect_err("expected an error");
        let msg = err.to_string();
        match &err {
            DataError::Corrupt { path, .. } => {
                assert_eq!(
                    path.file_name().unwrap().to_string_lossy(),
                    file,
                    "wrong file in {msg}"
                )
            }
            other => panic!("expected Corrupt for {file}, got {other:?}"),
        }
        assert!(msg.contains(file), "message does not name {file}: {msg}");
        for n in needles {
            assert!(msg.contains(n), "message lacks {n:?}: {msg}");
        }
    }

    fn assert_missing<T: std::fmt::Debug>(r: Result<T, DataError>, needles: &[&str]) {
        match r.expect_err("expected an error") {
            DataError::Missing(msg) => {
                for n in needles {
                    assert!(msg.contains(n), "message lacks {n:?}: {msg}");
                }
            }
            other => panic!("expected Missing, got {other:?}"),
        }
    }

    fn class_ids(d: &Dataset) -> Vec<u32> {
        match &d.labels {
            Labels::Class { ids, num_classes } => {
                assert_eq!(*num_classes, 10);
                ids.clone()
            }
            Labels::Real(_) => panic!("real labels"),
        }
    }

    #[test]
    fn idx_round_trip_plain_and_gz() {
        for (gzipped, source) in [(false, RealSource::Mnist), (true, RealSource::FashionMnist)] {
            let tmp = tempfile::tempdir().unwrap();
            write_idx_set(&tmp.path().join(source.folder()), gzipped);
            let d = load(source, tmp.path()).unwrap();
            assert_eq!(d.train.len(), 3);
            assert_eq!(d.test.len(), 2);
            assert_eq!(d.train.sample_shape, vec![1, 28, 28]);
            assert_eq!(class_ids(&d.train), vec![5, 0, 9]);
            assert_eq!(class_ids(&d.test), vec![7, 2]);
            // Pixel i of the file is (i % 251) / 255.
            let px = |k: usize| (k % 251) as f32 / 255.0;
            assert_eq!(d.train.row(0)[250], px(250));
            assert_eq!(d.train.row(0)[251], 0.0);
            assert_eq!(d.train.row(2)[100], px(2 * 784 + 100));
            assert!(d.train.features.iter().all(|&v| (0.0..=1.0).contains(&v)));
            // The data set's own folder works too.
            let own = load(source, &tmp.path().join(source.folder())).unwrap();
            assert_eq!(own.train, d.train);
            assert_eq!(own.test, d.test);
        }
    }

    #[test]
    fn gzip_is_detected_by_magic_not_name() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("mnist");
        write_idx_set(&f, false);
        // A gzipped stream under the plain name still loads.
        std::fs::write(
            f.join("t10k-labels-idx1-ubyte"),
            gz(&idx_labels(&[7, 2], IDX_LABELS_MAGIC)),
        )
        .unwrap();
        let d = load(RealSource::Mnist, tmp.path()).unwrap();
        assert_eq!(class_ids(&d.test), vec![7, 2]);
    }

    #[test]
    fn idx_bad_magic() {
        for gzipped in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let f = tmp.path().join("mnist");
            write_idx_set(&f, gzipped);
            let sfx = if gzipped { ".gz" } else { "" };
            put(
                &f,
                &format!("train-images-idx3-ubyte{sfx}"),
                idx_images(3, 28, 28, 0x0804),
            );
            assert_corrupt(
                load(RealSource::Mnist, tmp.path()),
                &format!("train-images-idx3-ubyte{sfx}"),
                &["magic", "expected 0x00000803", "found 0x00000804"],
            );
            write_idx_set(&f, gzipped);
            put(
                &f,
                &format!("t10k-labels-idx1-ubyte{sfx}"),
                idx_labels(&[7, 2], IDX_IMAGES_MAGIC),
            );
            assert_corrupt(
                load(RealSource::Mnist, tmp.path()),
                &format!("t10k-labels-idx1-ubyte{sfx}"),
                &["magic", "expected 0x00000801", "found 0x00000803"],
            );
        }
    }

    #[test]
    fn idx_truncated_and_trailing_bytes() {
        for gzipped in [false, true] {
            let sfx = if gzipped { ".gz" } else { "" };
            let name = format!("train-images-idx3-ubyte{sfx}");
            let tmp = tempfile::tempdir().unwrap();
            let f = tmp.path().join("mnist");
            write_idx_set(&f, gzipped);
            let mut short = idx_images(3, 28, 28, IDX_IMAGES_MAGIC);
            short.pop();
            put(&f, &name, short);
            assert_corrupt(
                load(RealSource::Mnist, tmp.path()),
                &name,
                &["truncated", "2352"],
            );
            let mut long = idx_images(3, 28, 28, IDX_IMAGES_MAGIC);
            long.extend_from_slice(&[1, 2]);
            put(&f, &name, long);
            assert_corrupt(load(RealSource::Mnist, tmp.path()), &name, &["trailing"]);
            // Truncated inside the header.
            put(
                &f,
                &name,
                idx_images(3, 28, 28, IDX_IMAGES_MAGIC)[..10].to_vec(),
            );
            assert_corrupt(load(RealSource::Mnist, tmp.path()), &name, &["header"]);
            // Labels too.
            put(&f, &name, idx_images(3, 28, 28, IDX_IMAGES_MAGIC));
            let lname = format!("train-labels-idx1-ubyte{sfx}");
            let mut lab = idx_labels(&[5, 0, 9], IDX_LABELS_MAGIC);
            lab.pop();
            put(&f, &lname, lab);
            assert_corrupt(load(RealSource::Mnist, tmp.path()), &lname, &["truncated"]);
        }
    }

    #[test]
    fn idx_lying_header_does_not_allocate() {
        for gzipped in [false, true] {
            let sfx = if gzipped { ".gz" } else { "" };
            let name = format!("train-images-idx3-ubyte{sfx}");
            let tmp = tempfile::tempdir().unwrap();
            let f = tmp.path().join("mnist");
            write_idx_set(&f, gzipped);
            // Header claims 4 billion 65535×65535 images; the payload is tiny.
            let mut b = idx_images(0, 28, 28, IDX_IMAGES_MAGIC);
            b[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
            b[8..12].copy_from_slice(&65535u32.to_be_bytes());
            b[12..16].copy_from_slice(&65535u32.to_be_bytes());
            b.extend_from_slice(&[0; 100]);
            put(&f, &name, b);
            assert_corrupt(load(RealSource::Mnist, tmp.path()), &name, &["truncated"]);
        }
    }

    #[test]
    fn idx_wrong_dimensions() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("mnist");
        write_idx_set(&f, false);
        put(
            &f,
            "train-images-idx3-ubyte",
            idx_images(3, 27, 28, IDX_IMAGES_MAGIC),
        );
        assert_corrupt(
            load(RealSource::Mnist, tmp.path()),
            "train-images-idx3-ubyte",
            &["27×28", "28×28"],
        );
    }

    #[test]
    fn idx_count_mismatch_and_label_range() {
        for gzipped in [false, true] {
            let sfx = if gzipped { ".gz" } else { "" };
            let lname = format!("train-labels-idx1-ubyte{sfx}");
            let tmp = tempfile::tempdir().unwrap();
            let f = tmp.path().join("fashion-mnist");
            write_idx_set(&f, gzipped);
            put(&f, &lname, idx_labels(&[5, 0], IDX_LABELS_MAGIC));
            assert_corrupt(
                load(RealSource::FashionMnist, tmp.path()),
                &lname,
                &["2 labels", "3 images", "train-images-idx3-ubyte"],
            );
            put(&f, &lname, idx_labels(&[5, 10, 9], IDX_LABELS_MAGIC));
            assert_corrupt(
                load(RealSource::FashionMnist, tmp.path()),
                &lname,
                &["label 10", "sample 1", "0..=9"],
            );
        }
    }

    #[test]
    fn missing_directory_folder_or_file() {
        let tmp = tempfile::tempdir().unwrap();
        let help = ["FEDERICO_DATA_DIR", "--data-dir", "data.dir"];
        // No data directory at all.
        let nowhere = tmp.path().join("nowhere");
        let mut needles = vec!["does not exist", "nowhere", "train-images-idx3-ubyte"];
        needles.extend(help);
        assert_missing(load(RealSource::Mnist, &nowhere), &needles);
        // A data directory without the data set's folder.
        let mut needles = vec!["fashion-mnist", "t10k-labels-idx1-ubyte"];
        needles.extend(help);
        assert_missing(load(RealSource::FashionMnist, tmp.path()), &needles);
        let mut needles = vec![
            "cifar-10/cifar-10-batches-bin",
            "data_batch_1.bin",
            "test_batch.bin",
        ];
        needles.extend(help);
        assert_missing(load(RealSource::Cifar10, tmp.path()), &needles);
        let mut needles = vec!["optdigits.tra", "optdigits.tes"];
        needles.extend(help);
        assert_missing(load(RealSource::Optdigits, tmp.path()), &needles);
        // The folder exists but one file is missing.
        let f = tmp.path().join("mnist");
        write_idx_set(&f, true);
        std::fs::remove_file(f.join("t10k-labels-idx1-ubyte.gz")).unwrap();
        let mut needles = vec!["t10k-labels-idx1-ubyte", "mnist"];
        needles.extend(help);
        assert_missing(load(RealSource::Mnist, tmp.path()), &needles);
    }

    /// A CIFAR-10 record: label byte, then R, G, B planes with pixel value `seed + plane`.
    fn cifar_record(label: u8, seed: u8) -> Vec<u8> {
        let mut r = vec![label];
        for plane in 0..3u8 {
            r.extend(std::iter::repeat_n(seed.wrapping_add(plane * 50), 1024));
        }
        r
    }

    fn write_cifar(folder: &Path, test_name: &str) {
        std::fs::create_dir_all(folder).unwrap();
        let b1: Vec<u8> = [cifar_record(6, 0), cifar_record(9, 1)].concat();
        let b2 = cifar_record(1, 2);
        std::fs::write(folder.join("data_batch_2.bin"), b2).unwrap();
        std::fs::write(folder.join("data_batch_1.bin"), b1).unwrap();
        std::fs::write(folder.join(test_name), cifar_record(3, 3)).unwrap();
    }

    #[test]
    fn cifar_round_trip() {
        for sub in ["cifar-10/cifar-10-batches-bin", "cifar-10-batches-bin"] {
            let tmp = tempfile::tempdir().unwrap();
            write_cifar(&tmp.path().join(sub), "test_batch_first1000.bin");
            let d = load(RealSource::Cifar10, tmp.path()).unwrap();
            assert_eq!(d.train.sample_shape, vec![3, 32, 32]);
            assert_eq!(
                class_ids(&d.train),
                vec![6, 9, 1],
                "batches in number order"
            );
            assert_eq!(class_ids(&d.test), vec![3]);
            let row = d.train.row(1);
            assert_eq!(row[0], 1.0 / 255.0);
            assert_eq!(row[1023], 1.0 / 255.0);
            assert_eq!(row[1024], 51.0 / 255.0);
            assert_eq!(row[3071], 101.0 / 255.0);
            // The folder itself works too.
            let own = load(RealSource::Cifar10, &tmp.path().join(sub)).unwrap();
            assert_eq!(own.train, d.train);
        }
        // test_batch.bin wins over a prefix file.
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("cifar-10-batches-bin");
        write_cifar(&f, "test_batch_first1000.bin");
        std::fs::write(
            f.join("test_batch.bin"),
            [cifar_record(8, 0), cifar_record(0, 0)].concat(),
        )
        .unwrap();
        let d = load(RealSource::Cifar10, tmp.path()).unwrap();
        assert_eq!(class_ids(&d.test), vec![8, 0]);
    }

    #[test]
    fn cifar_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("cifar-10").join("cifar-10-batches-bin");
        write_cifar(&f, "test_batch.bin");
        let mut bad = cifar_record(6, 0);
        bad.pop();
        std::fs::write(f.join("data_batch_2.bin"), bad).unwrap();
        assert_corrupt(
            load(RealSource::Cifar10, tmp.path()),
            "data_batch_2.bin",
            &["3072 bytes", "multiple", "3073"],
        );
        std::fs::write(f.join("data_batch_2.bin"), Vec::<u8>::new()).unwrap();
        assert_corrupt(
            load(RealSource::Cifar10, tmp.path()),
            "data_batch_2.bin",
            &["0 bytes"],
        );
        std::fs::write(
            f.join("data_batch_2.bin"),
            [cifar_record(1, 0), cifar_record(12, 0)].concat(),
        )
        .unwrap();
        assert_corrupt(
            load(RealSource::Cifar10, tmp.path()),
            "data_batch_2.bin",
            &["label 12", "record 1"],
        );
        std::fs::write(f.join("data_batch_2.bin"), cifar_record(1, 0)).unwrap();
        std::fs::remove_file(f.join("test_batch.bin")).unwrap();
        assert_missing(
            load(RealSource::Cifar10, tmp.path()),
            &["test_batch.bin", "FEDERICO_DATA_DIR"],
        );
        std::fs::write(f.join("test_batch.bin"), cifar_record(1, 0)).unwrap();
        std::fs::remove_file(f.join("data_batch_1.bin")).unwrap();
        std::fs::remove_file(f.join("data_batch_2.bin")).unwrap();
        assert_missing(
            load(RealSource::Cifar10, tmp.path()),
            &["data_batch_", "FEDERICO_DATA_DIR"],
        );
    }

    fn optdigits_line(v: u32, class: u32) -> String {
        let mut f: Vec<String> = (0..64).map(|k| ((k + v) % 17).to_string()).collect();
        f.push(class.to_string());
        f.join(",")
    }

    #[test]
    fn optdigits_round_trip_and_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("optdigits");
        std::fs::create_dir_all(&f).unwrap();
        let tra = format!("{}\n{}\n", optdigits_line(0, 4), optdigits_line(3, 9));
        std::fs::write(f.join("optdigits.tra"), &tra).unwrap();
        std::fs::write(
            f.join("optdigits.tes"),
            format!("{}\r\n\n", optdigits_line(16, 0)),
        )
        .unwrap();
        let d = load(RealSource::Optdigits, tmp.path()).unwrap();
        assert_eq!(d.train.sample_shape, vec![1, 8, 8]);
        assert_eq!(class_ids(&d.train), vec![4, 9]);
        assert_eq!(class_ids(&d.test), vec![0]);
        assert_eq!(d.train.row(1)[0], 3.0 / 16.0);
        assert_eq!(d.train.row(0)[16], 16.0 / 16.0);
        assert_eq!(d.test.row(0)[1], 0.0);
        let own = load(RealSource::Optdigits, &f).unwrap();
        assert_eq!(own.train, d.train);

        let mut short = optdigits_line(0, 4);
        short.truncate(short.rfind(',').unwrap());
        std::fs::write(
            f.join("optdigits.tes"),
            format!("{}\n{short}\n", optdigits_line(0, 1)),
        )
        .unwrap();
        assert_corrupt(
            load(RealSource::Optdigits, tmp.path()),
            "optdigits.tes",
            &["line 2", "expected 65", "found 64"],
        );
        std::fs::write(f.join("optdigits.tes"), optdigits_line(0, 10)).unwrap();
        assert_corrupt(
            load(RealSource::Optdigits, tmp.path()),
            "optdigits.tes",
            &["class 10"],
        );
        std::fs::write(
            f.join("optdigits.tes"),
            optdigits_line(0, 1).replacen("0,", "17,", 1),
        )
        .unwrap();
        assert_corrupt(
            load(RealSource::Optdigits, tmp.path()),
            "optdigits.tes",
            &["17", "0..=16"],
        );
        std::fs::write(
            f.join("optdigits.tes"),
            optdigits_line(0, 1).replacen("0,", "x,", 1),
        )
        .unwrap();
        assert_corrupt(
            load(RealSource::Optdigits, tmp.path()),
            "optdigits.tes",
            &["not an integer"],
        );
        std::fs::write(f.join("optdigits.tes"), "\n").unwrap();
        assert_corrupt(
            load(RealSource::Optdigits, tmp.path()),
            "optdigits.tes",
            &["no samples"],
        );
    }

    /// Loads the real Fashion-MNIST and CIFAR-10 copies from `$FEDERICO_DATA_DIR`.
    #[test]
    fn real_fashion_mnist_and_cifar10() {
        let dir = std::env::var_os("FEDERICO_DATA_DIR").expect(
            "FEDERICO_DATA_DIR is not set: point it at the data directory holding fashion-mnist/ \
             and cifar-10/ to run this test",
        );
        let dir = Path::new(&dir);
        let f = load(RealSource::FashionMnist, dir).unwrap();
        assert_eq!((f.train.len(), f.test.len()), (60_000, 10_000));
        assert_eq!(f.train.sample_shape, vec![1, 28, 28]);
        assert_eq!(class_ids(&f.train)[..3], [9, 0, 0]);
        assert_eq!(class_ids(&f.test)[..3], [9, 2, 1]);
        assert_eq!(f.train.class_counts(), vec![6000; 10]);
        // Row 14 of the first training image starts 0, 0, 1, 4, 6, 7, 2, 0.
        assert_eq!(f.train.row(0)[14 * 28 + 3], 4.0 / 255.0);
        assert_eq!(f.train.row(0)[14 * 28 + 25], 1.0);
        drop(f);
        let c = load(RealSource::Cifar10, dir).unwrap();
        assert_eq!((c.train.len(), c.test.len()), (20_000, 1_000));
        assert_eq!(c.train.sample_shape, vec![3, 32, 32]);
        assert_eq!(class_ids(&c.train)[..5], [6, 9, 9, 4, 1]);
        assert_eq!(
            class_ids(&c.train)[10_000],
            1,
            "data_batch_2 follows data_batch_1"
        );
        assert_eq!(class_ids(&c.test)[..5], [3, 8, 8, 0, 6]);
        assert_eq!(c.train.row(0)[0], 59.0 / 255.0);
    }
}
