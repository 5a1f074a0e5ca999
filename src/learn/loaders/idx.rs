//! The IDX format of MNIST and Fashion-MNIST: unsigned-byte images and labels, gzipped or not.
//!
//! Owns: IDX headers and payload checks, transparent gunzip, the MNIST-style file pairs, and
//! [`load_idx_files`] for one silo's own IDX files and [`read_idx_labelled`] for a scenario's.
//! Must not: allocate what a header claims before the file proves it, or look for folders
//! (that is `mod.rs`).

use super::own::Labelled;
use super::{CLASSES, RealSource, corrupt, dataset, io_err, require_file};
use crate::learn::data::{DataError, Dataset};
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

pub(super) const IDX_SIDE: usize = 28;
const IDX_IMAGES_MAGIC: u32 = 0x0000_0803;
const IDX_LABELS_MAGIC: u32 = 0x0000_0801;
pub(super) const IDX_FILES: [&str; 4] = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
];

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
pub(super) fn load_idx_pair(
    source: RealSource,
    folder: &Path,
    prefix: &str,
) -> Result<Dataset, DataError> {
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

/// An images file and its labels file, checked to agree in count (and hold at least one).
fn read_pair(images: &Path, labels: &Path) -> Result<(Idx, Idx), DataError> {
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
    Ok((img, lbl))
}

/// One silo's own data in the MNIST IDX format: an images file (IDX3 unsigned bytes, any
/// height × width) and a labels file (IDX1, class ids 0..=9), each possibly gzipped. Pixels are
/// scaled to [0, 1]; samples are `[1, height, width]`.
pub fn load_idx_files(images: &Path, labels: &Path) -> Result<Dataset, DataError> {
    let (img, lbl) = read_pair(images, labels)?;
    let ids = class_ids(labels, &lbl.data)?;
    let features = img.data.iter().map(|&b| f32::from(b) / 255.0).collect();
    dataset(images, features, vec![1, img.dims[1], img.dims[2]], ids)
}

/// A scenario's own IDX data: an images file (IDX3 unsigned bytes, any height × width) and a
/// labels file (IDX1 unsigned bytes, any value 0..=255, numbered by [`unify`](super::unify)),
/// each possibly gzipped. The same reader as [`load_idx_files`]; pixels scaled to [0, 1],
/// samples `[1, height, width]`.
pub fn read_idx_labelled(images: &Path, labels: &Path) -> Result<Labelled, DataError> {
    let (img, lbl) = read_pair(images, labels)?;
    let top = lbl.data.iter().copied().max().unwrap_or(0);
    Ok(Labelled {
        features: img.data.iter().map(|&b| f32::from(b) / 255.0).collect(),
        sample_shape: vec![1, img.dims[1], img.dims[2]],
        labels: lbl.data.iter().map(|&b| u32::from(b)).collect(),
        names: (0..=top).map(|b| b.to_string()).collect(),
        numbered: true,
        path: images.to_path_buf(),
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::learn::loaders::load;
    use crate::learn::loaders::tests::{assert_corrupt, class_ids};
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
    pub(in crate::learn::loaders) fn write_idx_set(folder: &Path, gzipped: bool) {
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
}
