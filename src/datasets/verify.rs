//! `federico data verify`: what of a data set is on disk, and is it the published file?
//! Owns: the check of one file (absent, partly downloaded, wrong size, wrong hash, verified),
//! a data set's report and its wording, and SHA-256 over a file.
//! Must not: change anything on disk.

use super::{FetchError, FileSpec, SetSpec, io_err};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// What is on disk for one file of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileState {
    /// The file has the published size and SHA-256.
    Verified,
    /// No file; `partial` is the size of its `.part` download, if one is there.
    Missing {
        /// Bytes in `<file>.part`.
        partial: Option<u64>,
    },
    /// The file has another size than the published one (its hash is not computed).
    WrongSize {
        /// Its size.
        actual: u64,
    },
    /// The file has the published size but another SHA-256.
    WrongHash {
        /// Its SHA-256.
        actual: String,
    },
}

impl FileState {
    /// A file that is there but is not the published one.
    pub fn is_mismatch(&self) -> bool {
        matches!(
            self,
            FileState::WrongSize { .. } | FileState::WrongHash { .. }
        )
    }
}

/// The state of `file` under the data directory `dir`.
pub(super) fn check_file(dir: &Path, file: &FileSpec<'_>) -> Result<FileState, FetchError> {
    let path = dir.join(file.path);
    let len = match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => m.len(),
        Ok(_) => return Ok(FileState::WrongSize { actual: 0 }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let partial = std::fs::metadata(part_path(&path)).ok().map(|m| m.len());
            return Ok(FileState::Missing { partial });
        }
        Err(e) => return Err(io_err(&path)(e)),
    };
    if len != file.bytes {
        return Ok(FileState::WrongSize { actual: len });
    }
    let actual = sha256_file(&path).map_err(io_err(&path))?;
    Ok(if actual == file.sha256 {
        FileState::Verified
    } else {
        FileState::WrongHash { actual }
    })
}

/// The SHA-256 of the file at `path`, lower-case hex.
pub(super) fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// What `verify` found for one data set.
#[derive(Clone, Debug)]
pub struct SetReport<'a> {
    /// The data set.
    pub set: SetSpec<'a>,
    /// Each file of the set with its state, in table order.
    pub files: Vec<(FileSpec<'a>, FileState)>,
}

impl SetReport<'_> {
    /// Every file is there and verified.
    pub fn is_complete(&self) -> bool {
        self.files.iter().all(|(_, s)| *s == FileState::Verified)
    }

    /// Nothing of the set is there, not even a partial download.
    pub fn is_absent(&self) -> bool {
        self.files
            .iter()
            .all(|(_, s)| *s == FileState::Missing { partial: None })
    }

    /// Some file is there with the wrong content.
    pub fn has_mismatch(&self) -> bool {
        self.files.iter().any(|(_, s)| s.is_mismatch())
    }

    /// The report for the user: one line for the set, then one per file that is not verified.
    pub fn render(&self, dir: &Path) -> String {
        let name = self.set.name;
        let folder = dir.join(name);
        let verified = self
            .files
            .iter()
            .filter(|(_, s)| *s == FileState::Verified)
            .count();
        let n = self.files.len();
        if self.is_complete() {
            return format!(
                "{name}: complete, {n} of {n} files verified in {}\n",
                folder.display()
            );
        }
        if self.is_absent() {
            return format!(
                "{name}: not present in {} (get it with `federico data download {name}`)\n",
                dir.display()
            );
        }
        let state = if self.has_mismatch() {
            "MISMATCH"
        } else {
            "incomplete"
        };
        let mut text = format!(
            "{name}: {state}, {verified} of {n} files verified in {}\n",
            folder.display()
        );
        for (file, s) in &self.files {
            let path = dir.join(file.path);
            let path = path.display();
            text += &match s {
                FileState::Verified => continue,
                FileState::Missing { partial: None } => format!("  missing {path}\n"),
                FileState::Missing { partial: Some(got) } => format!(
                    "  missing {path} ({got} of {} bytes downloaded; `federico data download \
                     {name}` resumes)\n",
                    file.bytes
                ),
                FileState::WrongSize { actual } => format!(
                    "  MISMATCH {path}: expected {} bytes, found {actual}\n",
                    file.bytes
                ),
                FileState::WrongHash { actual } => format!(
                    "  MISMATCH {path}: expected SHA-256 {}, found {actual}\n",
                    file.sha256
                ),
            };
        }
        text
    }
}

/// Checks every file of `set` under the data directory `dir`; changes nothing.
pub fn verify<'a>(set: &SetSpec<'a>, dir: &Path) -> Result<SetReport<'a>, FetchError> {
    let mut files = Vec::with_capacity(set.files.len());
    for file in set.files {
        files.push((*file, check_file(dir, file)?));
    }
    Ok(SetReport { set: *set, files })
}

/// `file.part` beside `file`.
pub(super) fn part_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    file.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_a_known_string() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("abc");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            sha256_file(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
