//! `federico data download`: fetch a data set's missing files and put each in place once its
//! size and SHA-256 match.
//! Owns: which files a run fetches (none that verify already), the `.part` → file rename after
//! the hash check, the removal of a download that fails it, and unpacking the members of a
//! tar.gz archive that are files of the set.
//! Must not: speak HTTP itself (that is `fetch.rs`) or leave a file that failed its check
//! where a loader reads.

use super::progress::Event;
use super::verify::{FileState, check_file, part_path, sha256_file};
use super::{FetchError, Fetcher, FileSpec, SetSpec, Source, io_err};
use std::io::Read as _;
use std::path::{Path, PathBuf};

/// What a download did for one data set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownloadReport {
    /// The data set.
    pub set: String,
    /// Files that were verified on disk already.
    pub present: usize,
    /// Files fetched (or unpacked) and verified by this run.
    pub fetched: usize,
    /// The data set's folder.
    pub folder: PathBuf,
}

impl DownloadReport {
    /// One line for the user.
    pub fn render(&self) -> String {
        let total = self.present + self.fetched;
        let how = match (self.fetched, self.present) {
            (0, _) => "already present, verified".to_string(),
            (_, 0) => "downloaded, verified".to_string(),
            (f, p) => format!("verified ({f} downloaded, {p} already present)"),
        };
        format!(
            "{}: {total} files in {}, {how}",
            self.set,
            self.folder.display()
        )
    }
}

/// Downloads the files of `set` that `dir` lacks (or holds with the wrong content) into the
/// layout `learn::loaders` reads, fetching from `base_url` instead of the canonical sources
/// when given. Files that verify already are not fetched again. Each download goes to
/// `<file>.part` first; an interrupted one is continued by the next call. A file is renamed
/// into place only once its size and SHA-256 match, and a download that fails the check is
/// removed, with an error naming the file and both hashes.
pub fn download(
    fetcher: &Fetcher,
    set: &SetSpec<'_>,
    dir: &Path,
    base_url: Option<&str>,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<DownloadReport, FetchError> {
    let mut todo = Vec::new();
    let mut present = 0;
    for file in set.files {
        let dest = dir.join(file.path);
        match check_file(dir, file)? {
            FileState::Verified => {
                present += 1;
                on(Event::Present { path: &dest });
            }
            FileState::WrongHash { actual } => {
                on(Event::Replacing {
                    path: &dest,
                    actual: &actual,
                });
                todo.push(file);
            }
            FileState::WrongSize { .. } | FileState::Missing { .. } => todo.push(file),
        }
    }
    if !todo.is_empty() {
        let fetched = fetch_and_place(fetcher, set, dir, base_url, &todo, on);
        if fetched.is_err() {
            // Only an empty folder this run created goes; never one with files in it.
            let _ = std::fs::remove_dir(dir.join(set.name));
        }
        fetched?;
    }
    Ok(DownloadReport {
        set: set.name.to_string(),
        present,
        fetched: todo.len(),
        folder: dir.join(set.name),
    })
}

/// Fetches the files `todo` of `set` (all of them for a `Files` source, through the archive for
/// a `TarGz` one) and puts each in place once it verifies.
fn fetch_and_place(
    fetcher: &Fetcher,
    set: &SetSpec<'_>,
    dir: &Path,
    base_url: Option<&str>,
    todo: &[&FileSpec<'_>],
    on: &mut dyn FnMut(Event<'_>),
) -> Result<(), FetchError> {
    match set.source {
        Source::Files { .. } => {
            for file in todo {
                let dest = dir.join(file.path);
                let part = part_path(&dest);
                create_parent(&part)?;
                let url = set.file_url(file, base_url);
                fetcher.fetch_to_part(&url, &part, file.bytes, on)?;
                put_in_place(&part, &dest, file.bytes, file.sha256)?;
                on(Event::Verified { path: &dest });
            }
        }
        Source::TarGz {
            mirror_path,
            into,
            bytes,
            sha256,
            ..
        } => {
            let part = part_path(&dir.join(mirror_path));
            create_parent(&part)?;
            let url = set
                .archive_url(base_url)
                .expect("a TarGz source has an archive URL");
            fetcher.fetch_to_part(&url, &part, bytes, on)?;
            check_part(&part, &dir.join(mirror_path), bytes, sha256)?;
            unpack(&part, dir, into, todo, on)?;
            // Every file it held for us is in place and verified.
            std::fs::remove_file(&part).map_err(io_err(&part))?;
        }
    }
    Ok(())
}

fn create_parent(path: &Path) -> Result<(), FetchError> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => std::fs::create_dir_all(p).map_err(io_err(p)),
        _ => Ok(()),
    }
}

/// Checks `part` against `bytes` and `sha256`; removes it when it fails. Errors name `dest`,
/// the file the user asked for.
fn check_part(part: &Path, dest: &Path, bytes: u64, sha256: &str) -> Result<(), FetchError> {
    let len = std::fs::metadata(part).map_err(io_err(part))?.len();
    if len != bytes {
        let _ = std::fs::remove_file(part);
        return Err(FetchError::Size {
            path: dest.to_path_buf(),
            expected: bytes,
            actual: len,
        });
    }
    let actual = sha256_file(part).map_err(io_err(part))?;
    if actual != sha256 {
        let removed = std::fs::remove_file(part).is_ok();
        return Err(FetchError::Mismatch {
            path: dest.to_path_buf(),
            expected: sha256.to_string(),
            actual,
            removed,
        });
    }
    Ok(())
}

/// Checks `part`, then renames it to `dest` and syncs the folder, so that `dest` is either
/// absent, the old file, or the verified new one.
fn put_in_place(part: &Path, dest: &Path, bytes: u64, sha256: &str) -> Result<(), FetchError> {
    check_part(part, dest, bytes, sha256)?;
    std::fs::rename(part, dest).map_err(io_err(dest))?;
    if let Some(folder) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(folder)
            .and_then(|f| f.sync_all())
            .map_err(io_err(folder))?;
    }
    Ok(())
}

/// Unpacks the members of the gzipped tar `archive` that are `wanted` files: member `M` is
/// file `<into>/M` (a leading `./` ignored). Each goes through `.part` and its own check.
/// Other members are skipped; a wanted file the archive lacks is an error.
fn unpack(
    archive: &Path,
    dir: &Path,
    into: &str,
    wanted: &[&FileSpec<'_>],
    on: &mut dyn FnMut(Event<'_>),
) -> Result<(), FetchError> {
    let bad = |reason: String| FetchError::Archive {
        path: archive.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(archive).map_err(io_err(archive))?;
    let gz = flate2::read::GzDecoder::new(std::io::BufReader::with_capacity(1 << 16, file));
    let mut tar = tar::Archive::new(gz);
    let mut done = vec![false; wanted.len()];
    let entries = tar
        .entries()
        .map_err(|e| bad(format!("not a tar.gz archive ({e})")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("unreadable entry ({e})")))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let member = entry
            .path()
            .map_err(|e| bad(format!("unreadable member name ({e})")))?
            .to_string_lossy()
            .into_owned();
        let path = format!("{into}/{}", member.trim_start_matches("./"));
        let Some(i) = wanted.iter().position(|f| f.path == path) else {
            continue;
        };
        // The destination comes from the table, never from the archive's member name.
        let spec = wanted[i];
        let dest = dir.join(spec.path);
        let part = part_path(&dest);
        create_parent(&part)?;
        let mut out = std::fs::File::create(&part).map_err(io_err(&part))?;
        // At most one byte more than the file should have: enough to tell it is wrong.
        let copied = std::io::copy(&mut (&mut entry).take(spec.bytes + 1), &mut out);
        if let Err(e) = copied.and_then(|_| out.sync_all()) {
            let _ = std::fs::remove_file(&part);
            return Err(bad(format!("unpacking {member}: {e}")));
        }
        drop(out);
        put_in_place(&part, &dest, spec.bytes, spec.sha256)?;
        on(Event::Verified { path: &dest });
        done[i] = true;
    }
    let lacking: Vec<&str> = wanted
        .iter()
        .zip(&done)
        .filter(|(_, d)| !**d)
        .map(|(f, _)| f.path)
        .collect();
    if !lacking.is_empty() {
        return Err(bad(format!(
            "the archive has no member for {}",
            lacking.join(", ")
        )));
    }
    Ok(())
}
