//! Durable files: whole-file atomic replacement (temporary file, fsync, rename, fsync of the
//! directory), so a crash at any instant leaves either the old file or the new one.
//! Owns: that write discipline; the framed, versioned file header used by shards and
//! checkpoints; the checksum seal around state files and their previous generation
//! (`<name>.prev`), with the fallback to it when the latest does not check out; the lock a
//! process holds on its state directory; the append-only line log that a failed write (a full
//! disk) neither tears nor loses ([`LineLog`]); the rule that an output folder never goes over
//! an earlier one ([`fresh_folder`]).
//! Must not: know what the bytes mean (a caller's decoder says whether they decode).
//!
//! A sealed file is [`SEAL`] (8 bytes), a little-endian CRC-32 (IEEE) of the rest, then the
//! rest: the format's own header and body, unchanged. The CRC-32 detects every error burst of
//! up to 32 bits, so every single-byte corruption of the payload or the sum; one in the seal's
//! magic leaves a file that does not start with a format's magic, which its decoder refuses.
//! A file without the seal was written by a build before it (format 1 of the store): it is read
//! as before, with a warning that it has no checksum, rather than refused, so that an upgraded
//! node resumes its run; its next write seals it.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The first 8 bytes of a sealed file.
pub const SEAL: &[u8; 8] = b"FEDSEAL2";

/// `inner` behind the seal: [`SEAL`], the CRC-32 of `inner`, `inner`.
pub fn seal(inner: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(inner.len() + 12);
    out.extend_from_slice(SEAL);
    out.extend(crc32fast::hash(inner).to_le_bytes());
    out.extend_from_slice(inner);
    out
}

/// What [`unseal`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Unsealed<'a> {
    /// A sealed file whose checksum matches: the bytes inside.
    Checked(&'a [u8]),
    /// A file without the seal (written before it): all of it, unchecked.
    Unsealed(&'a [u8]),
}

impl<'a> Unsealed<'a> {
    /// The bytes inside, checked or not.
    pub fn bytes(&self) -> &'a [u8] {
        match self {
            Unsealed::Checked(b) | Unsealed::Unsealed(b) => b,
        }
    }
}

/// Checks and strips the seal of `bytes`; an error when the checksum does not match.
pub fn unseal(bytes: &[u8]) -> Result<Unsealed<'_>, String> {
    if !bytes.starts_with(SEAL) {
        return Ok(Unsealed::Unsealed(bytes));
    }
    if bytes.len() < 12 {
        return Err(format!(
            "truncated: {} bytes, shorter than the 12-byte seal",
            bytes.len()
        ));
    }
    let want = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    let inner = &bytes[12..];
    let got = crc32fast::hash(inner);
    if got != want {
        return Err(format!(
            "checksum mismatch (CRC-32 {got:08x}, the file says {want:08x}): the file is corrupt"
        ));
    }
    Ok(Unsealed::Checked(inner))
}

/// Where the previous generation of `path` is kept: `<name>.prev` beside it.
pub fn prev_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".prev");
    path.with_file_name(name)
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(path, |out| out.write_all(bytes), false)
}

/// Writes to `path` atomically what `write` streams into its (buffered) temporary file.
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    replace(path, write, false)
}

/// Writes `inner` sealed ([`seal`]) to `path` atomically, keeping the file it replaces as
/// [`prev_path`]: at every instant `path` holds the old or the new generation and the previous
/// file the one before or the old one (a hard link, renamed over it, before the new file is
/// renamed over `path`).
pub fn save(path: &Path, inner: &[u8]) -> std::io::Result<()> {
    let sealed = seal(inner);
    replace(path, |out| out.write_all(&sealed), true)
}

fn replace(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
    keep_prev: bool,
) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("path has no file name"))?
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let prev_tmp = dir.join(format!(".{name}.prev.tmp-{}", std::process::id()));
    let result = (|| {
        let mut out = std::io::BufWriter::with_capacity(1 << 16, std::fs::File::create(&tmp)?);
        write(&mut out)?;
        let f = out.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        drop(f);
        if keep_prev {
            keep_previous(path, &prev_tmp)?;
        }
        std::fs::rename(&tmp, path)?;
        // The renames themselves are durable only once the directory is synced.
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_file(&prev_tmp);
    }
    result
}

/// Makes the current `path` (if any) its previous generation, through `prev_tmp`: a hard link
/// where the file system has them, else a synced copy.
fn keep_previous(path: &Path, prev_tmp: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(prev_tmp);
    match std::fs::hard_link(path, prev_tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(_) => match std::fs::copy(path, prev_tmp) {
            Ok(_) => std::fs::File::open(prev_tmp)?.sync_all()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        },
    }
    std::fs::rename(prev_tmp, prev_path(path))?;
    // Where the previous generation already is this file (put back by [`restore_previous`]),
    // the rename of one link over another does nothing and leaves the temporary name.
    let _ = std::fs::remove_file(prev_tmp);
    Ok(())
}

/// After [`load`] fell back: puts the previous generation back as `path` (atomically: a hard
/// link, or a synced copy, renamed over it), after keeping the refused latest as
/// `<name>.corrupt` for inspection. Without this the next [`save`] would keep the refused file
/// as the previous generation; with it, that save keeps the good one. Only the process that
/// resumes from the file calls it (a reader that only inspects leaves the files as they are).
pub fn restore_previous(path: &Path) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("path has no file name"))?
        .to_string_lossy()
        .into_owned();
    let corrupt = dir.join(format!("{name}.corrupt"));
    let _ = std::fs::remove_file(&corrupt);
    if let Err(e) = std::fs::hard_link(path, &corrupt)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        // Not kept for inspection (e.g. the latest is a directory): restore all the same.
        tracing::debug!(error = %e, file = %path.display(), "refused state file not kept");
    }
    let tmp = dir.join(format!(".{name}.restore-{}", std::process::id()));
    let prev = prev_path(path);
    let result = (|| {
        let _ = std::fs::remove_file(&tmp);
        if std::fs::hard_link(&prev, &tmp).is_err() {
            std::fs::copy(&prev, &tmp)?;
            std::fs::File::open(&tmp)?.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    // Gone after the rename, unless `path` already was the previous generation (then the
    // rename did nothing), or the restore failed.
    let _ = std::fs::remove_file(&tmp);
    result
}

/// A state file read by [`load`].
#[derive(Debug)]
pub struct Loaded<T> {
    /// The value.
    pub value: T,
    /// The file it came from: the latest, or its previous generation.
    pub from: PathBuf,
    /// Why the latest was not used, when the value is the previous generation's.
    pub fell_back: Option<String>,
}

/// Reads one file through `decode`: `Ok(None)` when it does not exist.
fn load_one<T>(
    path: &Path,
    decode: &impl Fn(&[u8]) -> Result<T, String>,
) -> Result<Option<(T, bool)>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let inner = unseal(&bytes)?;
    let value = decode(inner.bytes())?;
    Ok(Some((value, matches!(inner, Unsealed::Checked(_)))))
}

/// Reads the state file `path` written by [`save`], its bytes inside the seal decoded by
/// `decode`. `Ok(None)` when there is none (a missing latest is a fresh start even where a
/// previous generation lies beside it, which is then named in a warning). A latest that cannot
/// be read, fails its checksum or does not decode falls back to the previous generation, with a
/// warning naming the file and the reason; when that fails too, or there is none, the error
/// names both files. A file without the seal is read with a warning.
pub fn load<T>(
    path: &Path,
    decode: impl Fn(&[u8]) -> Result<T, String>,
) -> Result<Option<Loaded<T>>, String> {
    let prev = prev_path(path);
    let warn_unsealed = |p: &Path| {
        tracing::warn!(
            file = %p.display(),
            "state file has no checksum (written by an older federico): read unchecked; \
             the next write seals it"
        )
    };
    let latest_err = match load_one(path, &decode) {
        Ok(Some((value, sealed))) => {
            if !sealed {
                warn_unsealed(path);
            }
            return Ok(Some(Loaded {
                value,
                from: path.to_path_buf(),
                fell_back: None,
            }));
        }
        Ok(None) => {
            if prev.exists() {
                tracing::warn!(
                    file = %path.display(),
                    previous = %prev.display(),
                    "no state file, only its previous generation: starting fresh, the \
                     previous generation is ignored"
                );
            }
            return Ok(None);
        }
        Err(e) => e,
    };
    match load_one(&prev, &decode) {
        Ok(Some((value, sealed))) => {
            if !sealed {
                warn_unsealed(&prev);
            }
            tracing::warn!(
                file = %path.display(),
                reason = %latest_err,
                previous = %prev.display(),
                "state file refused: resuming from its previous generation (one save earlier)"
            );
            Ok(Some(Loaded {
                value,
                from: prev,
                fell_back: Some(latest_err),
            }))
        }
        Ok(None) => Err(format!(
            "{}: {latest_err}; no previous generation ({} does not exist)",
            path.display(),
            prev.display()
        )),
        Err(e) => Err(format!(
            "{}: {latest_err}; its previous generation {}: {e}",
            path.display(),
            prev.display()
        )),
    }
}

/// A file header: 8 magic bytes, then a little-endian u32 format version.
pub fn header(magic: &[u8; 8], version: u32) -> Vec<u8> {
    let mut h = magic.to_vec();
    h.extend(version.to_le_bytes());
    h
}

/// Checks and strips a [`header`]; the error says what is wrong.
pub fn strip_header<'a>(
    bytes: &'a [u8],
    magic: &[u8; 8],
    version: u32,
) -> Result<&'a [u8], String> {
    if bytes.len() < 12 {
        return Err(format!(
            "truncated: {} bytes, shorter than the 12-byte header",
            bytes.len()
        ));
    }
    if &bytes[..8] != magic {
        return Err(format!(
            "bad magic {:?}, expected {:?}",
            String::from_utf8_lossy(&bytes[..8]),
            String::from_utf8_lossy(magic)
        ));
    }
    let v = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if v != version {
        return Err(format!(
            "format version {v}, this build reads version {version}"
        ));
    }
    Ok(&bytes[12..])
}

/// Decodes bincode-2 (standard configuration) from `body`, with every length inside checked
/// against a bound before anything is allocated for it: the smallest of 64 KiB, 1 MiB, 16 MiB,
/// 256 MiB, 4 GiB and 64 GiB that is at least twice the body. Corrupt or hostile bytes then give
/// an error, never an allocation of what a bogus length claims (which aborts the process).
/// Returns the value and the bytes read.
pub fn decode_bounded<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<(T, usize), String> {
    fn with<T: serde::de::DeserializeOwned, const L: usize>(
        body: &[u8],
    ) -> Result<(T, usize), String> {
        bincode::serde::decode_from_slice(body, bincode::config::standard().with_limit::<L>())
            .map_err(|e| e.to_string())
    }
    match body.len().saturating_mul(2) {
        n if n <= 1 << 16 => with::<T, { 1 << 16 }>(body),
        n if n <= 1 << 20 => with::<T, { 1 << 20 }>(body),
        n if n <= 1 << 24 => with::<T, { 1 << 24 }>(body),
        n if n <= 1 << 28 => with::<T, { 1 << 28 }>(body),
        n if n <= 1 << 32 => with::<T, { 1 << 32 }>(body),
        n if n <= 1 << 36 => with::<T, { 1 << 36 }>(body),
        _ => Err(format!(
            "{} bytes is more than this build decodes",
            body.len()
        )),
    }
}

/// Decodes a whole body with [`decode_bounded`]: undecodable or trailing bytes are an error.
pub fn decode_exact<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let (value, used): (T, usize) =
        decode_bounded(body).map_err(|e| format!("undecodable ({e})"))?;
    if used != body.len() {
        return Err("trailing bytes".into());
    }
    Ok(value)
}

/// Decodes a checkpoint of format `version` as `T`, or one of the `previous` format as `Old`
/// converted to `T` (a migration); any other header is refused with the current format's error.
pub fn decode_migrating<T, Old>(
    bytes: &[u8],
    magic: &[u8; 8],
    version: u32,
    previous: u32,
) -> Result<T, String>
where
    T: serde::de::DeserializeOwned,
    Old: serde::de::DeserializeOwned + Into<T>,
{
    match strip_header(bytes, magic, version) {
        Ok(body) => decode_exact(body),
        Err(e) => match strip_header(bytes, magic, previous) {
            Ok(body) => decode_exact::<Old>(body).map(Into::into),
            Err(_) => Err(e),
        },
    }
}

/// Checks and strips a [`header`], then decodes the whole body ([`decode_exact`]).
pub fn decode_versioned<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    magic: &[u8; 8],
    version: u32,
) -> Result<T, String> {
    decode_exact(strip_header(bytes, magic, version)?)
}

/// Reads a file written by [`write_versioned`] through [`load`] (checksum, fallback to the
/// previous generation): `None` when it does not exist; an error naming the file(s) when it
/// cannot be read, has another header or does not decode.
pub fn read_versioned<T: serde::de::DeserializeOwned>(
    path: &Path,
    magic: &[u8; 8],
    version: u32,
) -> Result<Option<T>, String> {
    Ok(load(path, |b| decode_versioned(b, magic, version))?.map(|l| l.value))
}

/// Writes `value` behind the versioned header with [`save`] (sealed, previous generation kept).
pub fn write_versioned<T: serde::Serialize>(
    path: &Path,
    magic: &[u8; 8],
    version: u32,
    value: &T,
) -> Result<(), String> {
    let mut bytes = header(magic, version);
    bincode::serde::encode_into_std_write(value, &mut bytes, bincode::config::standard())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    save(path, &bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// A process's hold on a state directory: while it lives, no other process (and no second
/// holder in this one) can lock the same directory, so two copies of one silo cannot append
/// to one run log or overwrite each other's checkpoints. The lock is the operating system's
/// (`flock` on `<dir>/lock`), so it goes with the process, however that ends: a killed node's
/// restart is never refused for a stale lock.
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

/// The file in a state directory that [`lock_dir`] locks.
pub const LOCK_FILE: &str = "lock";

/// Locks `dir` (which must exist) for this process, writing its process ID into the lock
/// file; refuses, naming the directory and the holder's process ID, while another holds it.
pub fn lock_dir(dir: &Path) -> Result<DirLock, String> {
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::WouldBlock {
                return Err(format!("locking {}: {e}", path.display()));
            }
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = match holder.trim() {
                "" => String::new(),
                pid => format!(" (process {pid})"),
            };
            return Err(format!(
                "{} is in use by another federico process{holder}: one silo runs once; stop \
                 the other process, or give this one another state_dir",
                dir.display()
            ));
        }
    }
    file.set_len(0)
        .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(DirLock { _file: file })
}

/// An output folder that never goes over an earlier run or report: `out` when given and free
/// (missing or empty), else the first free of `default`, `default-2`, `default-3`, …. The
/// message names a taken `out`; the caller says what was being written.
pub fn fresh_folder(out: Option<&Path>, default: &Path) -> Result<PathBuf, String> {
    if let Some(out) = out {
        if std::fs::read_dir(out).is_ok_and(|mut d| d.next().is_some()) {
            return Err(format!(
                "{} already exists and is not empty; choose another --out (an earlier run or \
                 report is never overwritten)",
                out.display()
            ));
        }
        return Ok(out.to_owned());
    }
    Ok((1..)
        .map(|n| match n {
            1 => default.to_owned(),
            n => PathBuf::from(format!("{}-{n}", default.display())),
        })
        .find(|p| !p.exists())
        .expect("some suffix is free"))
}

/// Where a [`LineLog`] writes: a file opened for appending, or in tests a sink that fills up.
pub trait LineSink {
    /// Appends `bytes` whole, or fails (possibly after writing part of them).
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// Cuts the sink back to `len` bytes.
    fn cut(&mut self, len: u64) -> std::io::Result<()>;
    /// Its length in bytes now.
    fn size(&self) -> std::io::Result<u64>;
}

impl LineSink for std::fs::File {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.write_all(bytes)
    }

    fn cut(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)
    }

    fn size(&self) -> std::io::Result<u64> {
        self.metadata().map(|m| m.len())
    }
}

/// An append-only file of lines (a node's run log) that a failed write never leaves torn and
/// that loses no line while the failure lasts: a line that could not be written (a full disk)
/// is kept, in order, and written before the next one, and the file is cut back to its last
/// whole line. At most [`LineLog::MAX_PENDING`] lines wait; beyond that the oldest go, counted.
#[derive(Debug)]
pub struct LineLog<F: LineSink = std::fs::File> {
    sink: F,
    /// The sink's length up to its last whole line.
    good: u64,
    /// Lines (each with its newline) not written yet, oldest first.
    pending: std::collections::VecDeque<Vec<u8>>,
    /// Lines given up because too many waited.
    dropped: u64,
}

/// A [`LineLog::append`] that could not write everything: why, and what waits.
#[derive(Debug)]
pub struct Unwritten {
    /// The write's error.
    pub error: std::io::Error,
    /// Lines waiting for the next write, the one just given included.
    pub waiting: usize,
    /// Lines given up so far because too many waited.
    pub dropped: u64,
}

impl<F: LineSink> LineLog<F> {
    /// Lines kept while writes fail (about 64 MiB of run-log records at most).
    pub const MAX_PENDING: usize = 65_536;

    /// A log appending to `sink`, which ends with a whole line (or is empty).
    pub fn new(sink: F) -> std::io::Result<Self> {
        Ok(Self {
            good: sink.size()?,
            sink,
            pending: std::collections::VecDeque::new(),
            dropped: 0,
        })
    }

    /// Lines waiting for a write that goes through.
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// Appends `line` (without its newline) after the lines still waiting. On a failed write the
    /// sink is cut back to its last whole line and the lines not written wait for the next call.
    pub fn append(&mut self, line: &[u8]) -> Result<(), Unwritten> {
        if self.pending.len() == Self::MAX_PENDING {
            self.pending.pop_front();
            self.dropped += 1;
        }
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line);
        bytes.push(b'\n');
        self.pending.push_back(bytes);
        self.flush()
    }

    /// Writes the lines still waiting, oldest first.
    pub fn flush(&mut self) -> Result<(), Unwritten> {
        while let Some(bytes) = self.pending.front() {
            if let Err(error) = self.sink.append(bytes) {
                // Part of the line may be there: a reader must never see a torn line.
                let _ = self.sink.cut(self.good);
                return Err(Unwritten {
                    error,
                    waiting: self.pending.len(),
                    dropped: self.dropped,
                });
            }
            self.good += bytes.len() as u64;
            self.pending.pop_front();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_bogus_length_is_an_error_not_an_allocation() {
        // A string claiming 2^62 bytes (varint marker 253 + u64), then nothing.
        let mut body = vec![253u8];
        body.extend((1u64 << 62).to_le_bytes());
        let r = super::decode_bounded::<String>(&body);
        assert!(r.is_err(), "{r:?}");
        let r = super::decode_bounded::<(u64, Vec<String>)>(&[7, 1, 253, 0, 0, 0, 0, 0, 0, 0, 64]);
        assert!(r.is_err(), "{r:?}");
        // A real value still decodes.
        let ok = bincode::serde::encode_to_vec("hello", bincode::config::standard()).unwrap();
        assert_eq!(super::decode_bounded::<String>(&ok).unwrap().0, "hello");
    }
    use super::*;

    #[test]
    fn replaces_whole_files_and_checks_headers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/f.bin");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
        let mut b = header(b"FEDTEST1", 3);
        b.extend(b"body");
        assert_eq!(strip_header(&b, b"FEDTEST1", 3).unwrap(), b"body");
        assert!(
            strip_header(&b, b"FEDTEST1", 4)
                .unwrap_err()
                .contains("version 3")
        );
        assert!(
            strip_header(&b, b"FEDOTHER", 3)
                .unwrap_err()
                .contains("magic")
        );
        assert!(
            strip_header(&b[..5], b"FEDTEST1", 3)
                .unwrap_err()
                .contains("truncated")
        );
    }

    #[test]
    fn versioned_files_round_trip_and_refuse_other_headers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.bin");
        assert_eq!(read_versioned::<Vec<u32>>(&path, b"TESTFIL1", 1), Ok(None));
        write_versioned(&path, b"TESTFIL1", 1, &vec![3u32, 5]).unwrap();
        assert_eq!(
            read_versioned::<Vec<u32>>(&path, b"TESTFIL1", 1),
            Ok(Some(vec![3, 5]))
        );
        assert!(read_versioned::<Vec<u32>>(&path, b"OTHERFL1", 1).is_err());
        assert!(read_versioned::<Vec<u32>>(&path, b"TESTFIL1", 2).is_err());
        std::fs::write(&path, b"garbage").unwrap();
        let e = read_versioned::<Vec<u32>>(&path, b"TESTFIL1", 1).unwrap_err();
        assert!(e.contains("state.bin"), "{e}");
        assert!(e.contains("no previous generation"), "{e}");
    }

    fn decode(b: &[u8]) -> Result<Vec<u32>, String> {
        decode_versioned(b, b"TESTFIL1", 1)
    }

    #[test]
    fn a_save_keeps_the_previous_generation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.bin");
        write_versioned(&path, b"TESTFIL1", 1, &vec![1u32]).unwrap();
        assert!(!prev_path(&path).exists());
        write_versioned(&path, b"TESTFIL1", 1, &vec![2u32]).unwrap();
        write_versioned(&path, b"TESTFIL1", 1, &vec![3u32]).unwrap();
        let latest = load(&path, decode).unwrap().unwrap();
        assert_eq!((latest.value, latest.fell_back), (vec![3], None));
        assert_eq!(prev_path(&path), dir.path().join("state.bin.prev"));
        let prev = load(&prev_path(&path), decode).unwrap().unwrap();
        assert_eq!(prev.value, vec![2]);
        // Just the two files: no temporary left.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_corrupt_latest_falls_back_to_the_previous_generation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.bin");
        write_versioned(&path, b"TESTFIL1", 1, &vec![1u32, 2]).unwrap();
        write_versioned(&path, b"TESTFIL1", 1, &vec![3u32, 4]).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01; // 4 → 5: it would decode, the checksum says no
        std::fs::write(&path, &bytes).unwrap();
        let l = load(&path, decode).unwrap().unwrap();
        assert_eq!(l.value, vec![1, 2]);
        assert_eq!(l.from, prev_path(&path));
        assert!(l.fell_back.unwrap().contains("checksum"));
        // Latest truncated to nothing: the same.
        std::fs::write(&path, b"").unwrap();
        assert_eq!(load(&path, decode).unwrap().unwrap().value, vec![1, 2]);
        // A latest that cannot even be read (a directory): the same.
        let d = dir.path().join("dir.bin");
        write_versioned(&d, b"TESTFIL1", 1, &vec![9u32]).unwrap();
        write_versioned(&d, b"TESTFIL1", 1, &vec![10u32]).unwrap();
        std::fs::remove_file(&d).unwrap();
        std::fs::create_dir(&d).unwrap();
        assert_eq!(load(&d, decode).unwrap().unwrap().value, vec![9]);
    }

    #[test]
    fn restoring_the_previous_generation_keeps_it_through_the_next_save() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.bin");
        write_versioned(&path, b"TESTFIL1", 1, &vec![1u32]).unwrap();
        write_versioned(&path, b"TESTFIL1", 1, &vec![2u32]).unwrap();
        std::fs::write(&path, b"damaged").unwrap();
        let l = load(&path, decode).unwrap().unwrap();
        assert_eq!((l.value, l.fell_back.is_some()), (vec![1], true));
        restore_previous(&path).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("state.bin.corrupt")).unwrap(),
            b"damaged"
        );
        let l = load(&path, decode).unwrap().unwrap();
        assert_eq!((l.value, l.fell_back), (vec![1], None));
        // The next save keeps the good generation as the previous one.
        write_versioned(&path, b"TESTFIL1", 1, &vec![3u32]).unwrap();
        assert_eq!(
            load(&prev_path(&path), decode).unwrap().unwrap().value,
            vec![1]
        );
        assert_eq!(load(&path, decode).unwrap().unwrap().value, vec![3]);
        // No temporary left: state, prev, corrupt.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
    }

    #[test]
    fn both_generations_corrupt_is_an_error_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.bin");
        write_versioned(&path, b"TESTFIL1", 1, &vec![1u32]).unwrap();
        write_versioned(&path, b"TESTFIL1", 1, &vec![2u32]).unwrap();
        for p in [path.clone(), prev_path(&path)] {
            let mut b = std::fs::read(&p).unwrap();
            b[14] ^= 0x80;
            std::fs::write(&p, &b).unwrap();
        }
        let e = load(&path, decode).unwrap_err();
        assert!(e.contains("state.bin:"), "{e}");
        assert!(e.contains("state.bin.prev:"), "{e}");
        assert_eq!(e.matches("checksum mismatch").count(), 2, "{e}");
    }

    #[test]
    fn a_missing_latest_is_a_fresh_start_and_unsealed_files_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.bin");
        write_versioned(&path, b"TESTFIL1", 1, &vec![1u32]).unwrap();
        write_versioned(&path, b"TESTFIL1", 1, &vec![2u32]).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(load(&path, decode).unwrap().is_none());
        // A file of a build before the seal: header and body alone.
        let mut old = header(b"TESTFIL1", 1);
        bincode::serde::encode_into_std_write(vec![7u32], &mut old, bincode::config::standard())
            .unwrap();
        write_atomic(&path, &old).unwrap();
        let l = load(&path, decode).unwrap().unwrap();
        assert_eq!((l.value, l.fell_back), (vec![7], None));
        assert_eq!(unseal(&old), Ok(Unsealed::Unsealed(&old[..])));
        assert_eq!(unseal(&seal(&old)), Ok(Unsealed::Checked(&old[..])));
        assert!(unseal(&seal(&old)[..10]).is_err());
    }

    /// Every single-byte change of a sealed file, at every offset and with every one of the
    /// 255 non-zero xor values, is refused: by the checksum, or (in the seal's own magic) by
    /// the format's header check.
    #[test]
    fn every_single_byte_corruption_of_a_sealed_file_is_refused() {
        let mut inner = header(b"TESTFIL1", 1);
        let value: Vec<u32> = (0..40).map(|i| i * 7919).collect();
        bincode::serde::encode_into_std_write(&value, &mut inner, bincode::config::standard())
            .unwrap();
        let good = seal(&inner);
        let check = |b: &[u8]| unseal(b).and_then(|u| decode(u.bytes()));
        assert_eq!(check(&good).unwrap(), value);
        let mut refused = 0;
        for offset in 0..good.len() {
            for flip in 1..=255u8 {
                let mut bad = good.clone();
                bad[offset] ^= flip;
                assert!(check(&bad).is_err(), "offset {offset} ^{flip:#x}");
                refused += 1;
            }
        }
        assert_eq!(refused, good.len() * 255);
    }

    /// A locked state directory refuses a second holder, naming the holder's process ID, and
    /// is free again once the first is dropped (as when its process ends).
    #[cfg(unix)]
    #[test]
    fn a_locked_directory_refuses_a_second_holder_until_the_first_goes() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_dir(dir.path()).unwrap();
        let e = lock_dir(dir.path()).unwrap_err();
        assert!(
            e.contains("in use by another federico process")
                && e.contains(&format!("(process {})", std::process::id())),
            "{e}"
        );
        drop(first);
        lock_dir(dir.path()).unwrap();
    }

    /// A sink with room for `room` bytes, like a disk that fills: a write past it puts what fits
    /// and fails with "no space".
    struct Filling {
        bytes: Vec<u8>,
        room: usize,
    }

    impl LineSink for Filling {
        fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
            let fits = bytes.len().min(self.room.saturating_sub(self.bytes.len()));
            self.bytes.extend_from_slice(&bytes[..fits]);
            if fits < bytes.len() {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            Ok(())
        }

        fn cut(&mut self, len: u64) -> std::io::Result<()> {
            self.bytes.truncate(len as usize);
            Ok(())
        }

        fn size(&self) -> std::io::Result<u64> {
            Ok(self.bytes.len() as u64)
        }
    }

    /// A full disk mid-line: the log is cut back to its last whole line, the lines wait in
    /// order, and once there is room again every one is written, none twice, none torn (a node
    /// used to die on the first failed append).
    #[test]
    fn a_full_disk_neither_tears_nor_loses_a_line() {
        let mut log = LineLog::new(Filling {
            bytes: Vec::new(),
            room: 20,
        })
        .unwrap();
        log.append(b"round 1").unwrap();
        log.append(b"round 2").unwrap();
        let e = log.append(b"round 3").unwrap_err();
        assert_eq!(e.error.raw_os_error(), Some(28));
        assert_eq!((e.waiting, e.dropped), (1, 0));
        assert_eq!(log.sink.bytes, b"round 1\nround 2\n", "cut back, not torn");
        assert_eq!(log.append(b"round 4").unwrap_err().waiting, 2);
        log.sink.room = 1000;
        log.append(b"round 5").unwrap();
        assert_eq!(log.waiting(), 0);
        assert_eq!(
            String::from_utf8(log.sink.bytes.clone()).unwrap(),
            "round 1\nround 2\nround 3\nround 4\nround 5\n"
        );
        // Past MAX_PENDING waiting lines the oldest go, counted.
        log.sink.room = 0;
        log.sink.bytes.clear();
        log.good = 0;
        for i in 0..LineLog::<Filling>::MAX_PENDING + 2 {
            let _ = log.append(format!("{i}").as_bytes());
        }
        let e = log.append(b"last").unwrap_err();
        assert_eq!((e.waiting, e.dropped), (LineLog::<Filling>::MAX_PENDING, 3));
    }
}
