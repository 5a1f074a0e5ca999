//! `federico data download` / `verify` against a local HTTP server (tests/http_fixture): fresh
//! downloads, resumption, servers that ignore `Range`, hash and size mismatches, HTTP errors,
//! the CIFAR-10 style tar.gz, and the real table against what `learn::loaders` reads. Offline:
//! the fixtures are small generated files with their own hashes; only the last test reads real
//! files, from FEDERICO_DATA_DIR, and says so when it skips that part.

mod common;
mod http_fixture;

use federico::datasets::progress::Event;
use federico::datasets::{
    FetchError, Fetcher, FileSpec, FileState, SETS, SetSpec, Source, download, verify,
};
use http_fixture::{Behaviour, Server};
use sha2::{Digest, Sha256};
use std::path::Path;

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Deterministic bytes that differ from file to file.
fn bytes(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// A set of separately fetched files `(path, content)` with their true sizes and hashes.
fn files_set(name: &'static str, files: &[(&'static str, &[u8])]) -> SetSpec<'static> {
    let specs: Vec<FileSpec<'static>> = files
        .iter()
        .map(|(path, content)| FileSpec {
            path,
            bytes: content.len() as u64,
            sha256: leak(sha(content)),
        })
        .collect();
    SetSpec {
        name,
        // Never used: every test gives a base URL.
        source: Source::Files {
            base: "http://192.0.2.1/unused/",
        },
        files: Box::leak(specs.into_boxed_slice()),
    }
}

fn serve(files: &[(&str, &[u8])], behaviour: Behaviour) -> Server {
    Server::start(
        files
            .iter()
            .map(|(p, c)| (p.to_string(), c.to_vec()))
            .collect(),
        behaviour,
    )
}

fn honouring() -> Behaviour {
    Behaviour {
        honour_range: true,
        ..Behaviour::default()
    }
}

fn quiet(_: Event<'_>) {}

fn get(
    set: &SetSpec<'_>,
    dir: &Path,
    server: &Server,
) -> Result<federico::datasets::DownloadReport, FetchError> {
    download(&Fetcher::new(), set, dir, Some(&server.url()), &mut quiet)
}

fn part_of(path: &Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(".part");
    p.into()
}

#[test]
fn fresh_download_lands_in_place_verifies_and_is_not_fetched_again() {
    let tra = bytes(5_000, 1);
    let tes = bytes(2_000, 2);
    let files = [
        ("optdigits/optdigits.tra", &tra[..]),
        ("optdigits/optdigits.tes", &tes[..]),
    ];
    let set = files_set("optdigits", &files);
    let server = serve(&files, honouring());
    let tmp = tempfile::tempdir().unwrap();
    let report = get(&set, tmp.path(), &server).unwrap();
    assert_eq!((report.present, report.fetched), (0, 2));
    assert_eq!(
        std::fs::read(tmp.path().join("optdigits/optdigits.tra")).unwrap(),
        tra
    );
    assert_eq!(
        std::fs::read(tmp.path().join("optdigits/optdigits.tes")).unwrap(),
        tes
    );
    assert!(!part_of(&tmp.path().join("optdigits/optdigits.tra")).exists());
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    assert!(hits.iter().all(|h| h.status == 200 && h.range.is_none()));

    let checked = verify(&set, tmp.path()).unwrap();
    assert!(checked.is_complete(), "{}", checked.render(tmp.path()));
    assert!(
        checked
            .render(tmp.path())
            .contains("complete, 2 of 2 files verified")
    );

    let again = get(&set, tmp.path(), &server).unwrap();
    assert_eq!((again.present, again.fetched), (2, 0));
    assert!(
        again.render().contains("already present, verified"),
        "{}",
        again.render()
    );
    assert_eq!(server.hits().len(), 2, "nothing fetched the second time");
}

#[test]
fn truncated_part_is_resumed_with_a_range_request() {
    let content = bytes(50_000, 3);
    let files = [("mnist/train-labels-idx1-ubyte.gz", &content[..])];
    let set = files_set("mnist", &files);
    let server = serve(&files, honouring());
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("mnist/train-labels-idx1-ubyte.gz");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::write(part_of(&dest), &content[..12_345]).unwrap();

    let mut started = Vec::new();
    let report = download(
        &Fetcher::new(),
        &set,
        tmp.path(),
        Some(&server.url()),
        &mut |e| {
            if let Event::Started { from, total, .. } = e {
                started.push((from, total));
            }
        },
    )
    .unwrap();
    assert_eq!(report.fetched, 1);
    assert_eq!(started, [(12_345, 50_000)]);
    let hits = server.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].range.as_deref(), Some("bytes=12345-"));
    assert_eq!((hits[0].status, hits[0].sent), (206, 50_000 - 12_345));
    assert_eq!(std::fs::read(&dest).unwrap(), content);
    assert!(!part_of(&dest).exists());
}

#[test]
fn interrupted_download_keeps_its_part_and_the_next_run_resumes() {
    let content = bytes(40_000, 4);
    let files = [("fashion-mnist/t10k-labels-idx1-ubyte.gz", &content[..])];
    let set = files_set("fashion-mnist", &files);
    let server = serve(
        &files,
        Behaviour {
            honour_range: true,
            cut_first_after: Some(10_000),
        },
    );
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("fashion-mnist/t10k-labels-idx1-ubyte.gz");
    let err = get(&set, tmp.path(), &server).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, FetchError::Network { kept: 10_000, .. }),
        "{msg}"
    );
    assert!(
        msg.contains(&format!(
            "{}/fashion-mnist/t10k-labels-idx1-ubyte.gz",
            server.url()
        )),
        "{msg}"
    );
    assert!(!dest.exists(), "nothing in place before it verifies");
    assert_eq!(std::fs::metadata(part_of(&dest)).unwrap().len(), 10_000);
    assert!(
        verify(&set, tmp.path())
            .unwrap()
            .render(tmp.path())
            .contains("10000 of 40000 bytes downloaded"),
    );

    get(&set, tmp.path(), &server).unwrap();
    let hits = server.hits();
    assert_eq!(hits[1].range.as_deref(), Some("bytes=10000-"));
    assert_eq!((hits[1].status, hits[1].sent), (206, 30_000));
    assert_eq!(std::fs::read(&dest).unwrap(), content);
}

#[test]
fn server_ignoring_range_gets_a_whole_download_over_the_part() {
    let content = bytes(30_000, 5);
    let files = [("optdigits/optdigits.tes", &content[..])];
    let set = files_set("optdigits", &files);
    let server = serve(&files, Behaviour::default());
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("optdigits/optdigits.tes");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    // A stale part that is not even a prefix of the file: it must not survive.
    std::fs::write(part_of(&dest), vec![0xAA; 7_000]).unwrap();
    get(&set, tmp.path(), &server).unwrap();
    let hits = server.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].range.as_deref(), Some("bytes=7000-"));
    assert_eq!((hits[0].status, hits[0].sent), (200, 30_000));
    assert_eq!(std::fs::read(&dest).unwrap(), content);
}

#[test]
fn hash_mismatch_names_the_file_both_hashes_and_leaves_nothing() {
    let published = bytes(8_000, 6);
    let mut served = published.clone();
    served[4_000] ^= 1;
    let set = files_set("optdigits", &[("optdigits/optdigits.tra", &published[..])]);
    let server = serve(&[("optdigits/optdigits.tra", &served[..])], honouring());
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("optdigits/optdigits.tra");
    let err = get(&set, tmp.path(), &server).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, FetchError::Mismatch { removed: true, .. }),
        "{msg}"
    );
    for needle in [&dest.display().to_string(), &sha(&published), &sha(&served)] {
        assert!(msg.contains(needle.as_str()), "{msg} lacks {needle}");
    }
    assert!(!dest.exists() && !part_of(&dest).exists());

    // A body of another size is refused the same way, by its size.
    let short = &published[..7_000];
    let server = serve(&[("optdigits/optdigits.tra", short)], honouring());
    let msg = get(&set, tmp.path(), &server).unwrap_err().to_string();
    assert!(
        msg.contains("expected 8000 bytes, got 7000") && msg.contains("optdigits.tra"),
        "{msg}"
    );
    assert!(!dest.exists() && !part_of(&dest).exists());
    let long = [&published[..], b"trailing junk"].concat();
    let server = serve(&[("optdigits/optdigits.tra", &long[..])], honouring());
    let msg = get(&set, tmp.path(), &server).unwrap_err().to_string();
    assert!(msg.contains("expected 8000 bytes, got 8001"), "{msg}");
    assert!(!dest.exists() && !part_of(&dest).exists());
}

#[test]
fn a_present_file_with_the_wrong_hash_is_replaced_once_the_new_one_verifies() {
    let content = bytes(3_000, 7);
    let files = [("optdigits/optdigits.tes", &content[..])];
    let set = files_set("optdigits", &files);
    let server = serve(&files, honouring());
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("optdigits/optdigits.tes");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::write(&dest, bytes(3_000, 8)).unwrap();
    let mut replaced = false;
    download(
        &Fetcher::new(),
        &set,
        tmp.path(),
        Some(&server.url()),
        &mut |e| {
            replaced |= matches!(e, Event::Replacing { .. });
        },
    )
    .unwrap();
    assert!(replaced);
    assert_eq!(std::fs::read(&dest).unwrap(), content);
    assert!(verify(&set, tmp.path()).unwrap().is_complete());
}

#[test]
fn http_404_names_the_url_and_leaves_nothing() {
    let content = bytes(100, 9);
    let set = files_set(
        "mnist",
        &[("mnist/t10k-labels-idx1-ubyte.gz", &content[..])],
    );
    let server = serve(&[], honouring());
    let tmp = tempfile::tempdir().unwrap();
    let err = get(&set, tmp.path(), &server).unwrap_err();
    let msg = err.to_string();
    let url = format!("{}/mnist/t10k-labels-idx1-ubyte.gz", server.url());
    assert!(
        matches!(err, FetchError::Status { status: 404, .. }),
        "{msg}"
    );
    assert!(msg.contains(&url) && msg.contains("404"), "{msg}");
    let dest = tmp.path().join("mnist/t10k-labels-idx1-ubyte.gz");
    assert!(!dest.exists() && !part_of(&dest).exists());
    assert!(!tmp.path().join("mnist").exists(), "no empty folder left");

    // Nothing listening: an error naming the URL, not a panic.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let err = download(&Fetcher::new(), &set, tmp.path(), Some(&base), &mut quiet).unwrap_err();
    assert!(err.to_string().contains(&format!("{base}/mnist/")), "{err}");
}

#[test]
fn verify_reports_corrupt_missing_and_partial_files() {
    let a = bytes(1_000, 10);
    let b = bytes(1_000, 11);
    let c = bytes(1_000, 12);
    let set = files_set(
        "fashion-mnist",
        &[
            ("fashion-mnist/train-images-idx3-ubyte.gz", &a[..]),
            ("fashion-mnist/train-labels-idx1-ubyte.gz", &b[..]),
            ("fashion-mnist/t10k-images-idx3-ubyte.gz", &c[..]),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    assert!(verify(&set, tmp.path()).unwrap().is_absent());
    let folder = tmp.path().join("fashion-mnist");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("train-images-idx3-ubyte.gz"), &a).unwrap();
    let mut corrupt = b.clone();
    corrupt[10] ^= 0xFF;
    std::fs::write(folder.join("train-labels-idx1-ubyte.gz"), &corrupt).unwrap();
    std::fs::write(folder.join("t10k-images-idx3-ubyte.gz.part"), &c[..400]).unwrap();

    let report = verify(&set, tmp.path()).unwrap();
    assert!(report.has_mismatch() && !report.is_complete() && !report.is_absent());
    assert_eq!(report.files[0].1, FileState::Verified);
    assert_eq!(
        report.files[1].1,
        FileState::WrongHash {
            actual: sha(&corrupt)
        }
    );
    assert_eq!(report.files[2].1, FileState::Missing { partial: Some(400) });
    let text = report.render(tmp.path());
    assert!(
        text.starts_with("fashion-mnist: MISMATCH, 1 of 3 files verified"),
        "{text}"
    );
    assert!(
        text.contains("MISMATCH")
            && text.contains("train-labels-idx1-ubyte.gz")
            && text.contains(&sha(&b))
            && text.contains(&sha(&corrupt)),
        "{text}"
    );
    assert!(
        text.contains("missing") && text.contains("400 of 1000 bytes downloaded"),
        "{text}"
    );
}

/// A gzipped tar with `members` under `cifar-10-batches-bin/`, as the CIFAR-10 archive is.
fn tar_gz(members: &[(&str, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    tar.append_dir("cifar-10-batches-bin", std::env::temp_dir())
        .unwrap();
    for (name, content) in members {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(
            &mut header,
            format!("cifar-10-batches-bin/{name}"),
            *content,
        )
        .unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

fn archive_set(archive: &[u8], files: &[(&'static str, &[u8])]) -> SetSpec<'static> {
    let mut set = files_set("cifar-10", files);
    set.source = Source::TarGz {
        url: "http://192.0.2.1/unused.tar.gz",
        mirror_path: "cifar-10/cifar-10-binary.tar.gz",
        into: "cifar-10",
        bytes: archive.len() as u64,
        sha256: leak(sha(archive)),
    };
    set
}

#[test]
fn tar_gz_members_that_are_files_of_the_set_are_unpacked_and_checked() {
    let b1 = bytes(3_073 * 3, 13);
    let t = bytes(3_073, 14);
    let archive = tar_gz(&[
        ("data_batch_1.bin", &b1),
        ("readme.html", b"<html>"),
        ("test_batch.bin", &t),
    ]);
    let set = archive_set(
        &archive,
        &[
            ("cifar-10/cifar-10-batches-bin/data_batch_1.bin", &b1[..]),
            ("cifar-10/cifar-10-batches-bin/test_batch.bin", &t[..]),
        ],
    );
    let server = serve(
        &[("cifar-10/cifar-10-binary.tar.gz", &archive[..])],
        honouring(),
    );
    let tmp = tempfile::tempdir().unwrap();
    let report = get(&set, tmp.path(), &server).unwrap();
    assert_eq!(report.fetched, 2);
    let bin = tmp.path().join("cifar-10/cifar-10-batches-bin");
    assert_eq!(std::fs::read(bin.join("data_batch_1.bin")).unwrap(), b1);
    assert_eq!(std::fs::read(bin.join("test_batch.bin")).unwrap(), t);
    assert!(
        !bin.join("readme.html").exists(),
        "only the set's files are unpacked"
    );
    assert!(
        !tmp.path()
            .join("cifar-10/cifar-10-binary.tar.gz.part")
            .exists(),
        "archive removed"
    );
    assert!(verify(&set, tmp.path()).unwrap().is_complete());
    assert_eq!(server.hits()[0].path, "cifar-10/cifar-10-binary.tar.gz");

    // An archive whose member is not the published file: an error naming the member's file,
    // nothing of it in place.
    let other = bytes(3_073, 15);
    let bad = tar_gz(&[("data_batch_1.bin", &b1), ("test_batch.bin", &other)]);
    let mut set = set;
    if let Source::TarGz { bytes, sha256, .. } = &mut set.source {
        *bytes = bad.len() as u64;
        *sha256 = leak(sha(&bad));
    }
    let server = serve(
        &[("cifar-10/cifar-10-binary.tar.gz", &bad[..])],
        honouring(),
    );
    let tmp = tempfile::tempdir().unwrap();
    let msg = get(&set, tmp.path(), &server).unwrap_err().to_string();
    assert!(
        msg.contains("test_batch.bin") && msg.contains(&sha(&t)) && msg.contains(&sha(&other)),
        "{msg}"
    );
    assert!(!bin_path(tmp.path(), "test_batch.bin").exists());
    assert!(!part_of(&bin_path(tmp.path(), "test_batch.bin")).exists());

    // An archive lacking a file of the set.
    let short = tar_gz(&[("data_batch_1.bin", &b1)]);
    if let Source::TarGz { bytes, sha256, .. } = &mut set.source {
        *bytes = short.len() as u64;
        *sha256 = leak(sha(&short));
    }
    let server = serve(
        &[("cifar-10/cifar-10-binary.tar.gz", &short[..])],
        honouring(),
    );
    let tmp = tempfile::tempdir().unwrap();
    let msg = get(&set, tmp.path(), &server).unwrap_err().to_string();
    assert!(
        msg.contains("cifar-10-binary.tar.gz")
            && msg.contains("no member for cifar-10/cifar-10-batches-bin/test_batch.bin"),
        "{msg}"
    );
}

fn bin_path(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join("cifar-10/cifar-10-batches-bin").join(name)
}

/// Minimal valid files of each format, at the real table's paths, load with `learn::loaders`:
/// the table puts every file where the loaders look.
#[test]
fn real_table_puts_every_file_where_the_loaders_read_it() {
    use federico::learn::loaders::{RealSource, load};
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    for set in SETS {
        let source = match set.name {
            "mnist" => RealSource::Mnist,
            "fashion-mnist" => RealSource::FashionMnist,
            "cifar-10" => RealSource::Cifar10,
            "optdigits" => RealSource::Optdigits,
            other => panic!("no loader for data set {other}"),
        };
        for file in set.files {
            let path = tmp.path().join(file.path);
            assert_eq!(
                path.parent().unwrap(),
                tmp.path().join(source.folder()),
                "{} is not in the loaders' folder",
                file.path
            );
            let name = file.name();
            let content = if name.contains("images-idx3") {
                let mut b = vec![0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28];
                b.extend(vec![7u8; 28 * 28]);
                b
            } else if name.contains("labels-idx1") {
                vec![0, 0, 8, 1, 0, 0, 0, 1, 4]
            } else if name.ends_with(".bin") {
                let mut b = vec![3u8];
                b.extend(vec![9u8; 3 * 32 * 32]);
                b
            } else {
                let mut row: Vec<String> = (0..64).map(|i| (i % 17).to_string()).collect();
                row.push("5".into());
                format!("{}\n", row.join(",")).into_bytes()
            };
            let content = if name.ends_with(".gz") {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(&content).unwrap();
                gz.finish().unwrap()
            } else {
                content
            };
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, content).unwrap();
        }
        let data = load(source, tmp.path())
            .unwrap_or_else(|e| panic!("{}: the loader refuses the table's layout: {e}", set.name));
        let train = if source == RealSource::Cifar10 { 5 } else { 1 };
        assert_eq!(
            (data.train.len(), data.test.len()),
            (train, 1),
            "{}",
            set.name
        );
    }
}

/// The optdigits files a mirror serves, by path: the real ones from the data directory `real`,
/// or, without it, right-sized zeros (their SHA-256 fails).
fn optdigits_files(real: Option<&Path>) -> Vec<(String, Vec<u8>)> {
    let optdigits = SETS.iter().find(|s| s.name == "optdigits").unwrap();
    optdigits
        .files
        .iter()
        .map(|f| {
            let bytes = match real {
                Some(d) => std::fs::read(d.join(f.path)).unwrap(),
                None => vec![b'0'; f.bytes as usize],
            };
            (f.path.to_string(), bytes)
        })
        .collect()
}

fn federico() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_federico"));
    cmd.env_remove("FEDERICO_DATA_DIR")
        .env_remove("FEDERICO_DATA_BASE_URL");
    cmd
}

/// The binary as a user runs it, from a working directory with a relative data directory:
/// files of the right size but the wrong content are refused by name and nothing is left;
/// `verify` fails on a corrupt file and on a named data set that is missing; with the real
/// optdigits files (FEDERICO_DATA_DIR) served, the download succeeds and verifies.
#[test]
fn cli_downloads_into_a_relative_data_dir_and_refuses_a_bad_file() {
    let optdigits = SETS.iter().find(|s| s.name == "optdigits").unwrap();
    let server = Server::start(optdigits_files(None), honouring());
    let cwd = tempfile::tempdir().unwrap();
    let out = federico()
        .current_dir(cwd.path())
        .args([
            "data",
            "download",
            "optdigits",
            "--quiet",
            "--base-url",
            &server.url(),
            "--dir",
            "rel/data",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("rel/data/optdigits/optdigits.tra: SHA-256 mismatch")
            && err.contains(optdigits.files[0].sha256)
            && err.contains(&format!("{}/optdigits/optdigits.tra", server.url())),
        "{err}"
    );
    let tra = cwd.path().join("rel/data/optdigits/optdigits.tra");
    assert!(!tra.exists() && !part_of(&tra).exists());

    // A corrupt file fails `verify`, naming it; a named, missing set fails it; unnamed
    // missing sets are only reported.
    std::fs::create_dir_all(tra.parent().unwrap()).unwrap();
    std::fs::write(&tra, vec![b'0'; optdigits.files[0].bytes as usize]).unwrap();
    let out = federico()
        .current_dir(cwd.path())
        .args(["data", "verify", "--dir", "rel/data"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("optdigits: MISMATCH") && text.contains("rel/data/optdigits/optdigits.tra"),
        "{text}"
    );
    assert!(text.contains("mnist: not present"), "{text}");
    std::fs::remove_file(&tra).unwrap();
    let out = federico()
        .current_dir(cwd.path())
        .args(["data", "verify", "--dir", "rel/data"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = federico()
        .current_dir(cwd.path())
        .args(["data", "verify", "mnist", "--dir", "rel/data"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    let Some(data) = common::data_dir(
        "cli_downloads_into_a_relative_data_dir (real optdigits)",
        &["optdigits"],
    ) else {
        return;
    };
    let server = Server::start(optdigits_files(Some(&data)), honouring());
    // The base URL from the environment this time, and the default data directory `data`.
    let out = federico()
        .current_dir(cwd.path())
        .env("FEDERICO_DATA_BASE_URL", server.url())
        .args(["data", "download", "optdigits", "--quiet"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("optdigits: 2 files in data/optdigits, downloaded, verified"),
        "{text}"
    );
    let out = federico()
        .current_dir(cwd.path())
        .args(["data", "verify", "optdigits"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("optdigits: complete, 2 of 2 files verified")
    );
}

/// `download all` against a mirror that serves only optdigits (as the newcomer's did, a served
/// data directory without the CIFAR-10 archive): every set is tried, each failure is said as it
/// happens, and the last line names them all; optdigits, last in the table, is not skipped
/// because an earlier set failed (it used to stop at the first failure). The optdigits served
/// are right-sized zeros (their hashes fail) without real data, the real files with it.
#[test]
fn download_all_tries_every_set_and_names_each_failure() {
    let data = common::data_dir(
        "download_all_tries_every_set (real optdigits)",
        &["optdigits"],
    );
    let server = Server::start(optdigits_files(data.as_deref()), honouring());
    let cwd = tempfile::tempdir().unwrap();
    let out = federico()
        .current_dir(cwd.path())
        .args([
            "data",
            "download",
            "all",
            "--quiet",
            "--base-url",
            &server.url(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for set in ["mnist", "fashion-mnist", "cifar-10"] {
        assert!(
            err.contains(&format!("error: downloading {set}: ")),
            "{err}"
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    if data.is_some() {
        assert!(
            text.contains("optdigits: 2 files in data/optdigits, downloaded, verified"),
            "{text}\n{err}"
        );
        assert!(
            err.contains("3 of the data sets failed (mnist, fashion-mnist, cifar-10;"),
            "{err}"
        );
    } else {
        assert!(
            err.contains("error: downloading optdigits: ") && err.contains("SHA-256 mismatch"),
            "optdigits was tried after the others failed: {err}"
        );
        assert!(
            err.contains("4 of the data sets failed (mnist, fashion-mnist, cifar-10, optdigits;"),
            "{err}"
        );
    }
}
