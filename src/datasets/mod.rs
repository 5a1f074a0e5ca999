//! Getting the standard data sets: `federico data download` and `federico data verify`.
//!
//! Owns: the table of every file federico reads from a data directory (where it comes from,
//! its size and SHA-256, [`SETS`]), downloading them over HTTP with resumption (`fetch.rs`),
//! unpacking the CIFAR-10 archive and putting each file in place only once its hash matches
//! (`download.rs`), checking what is on disk (`verify.rs`), and showing progress
//! (`progress.rs`).
//! Must not: parse or load a data set (that is `learn::loaders`, which reads the layout this
//! module writes), know anything of training, or leave a file that failed its hash where a
//! loader would read it.
//!
//! # Layout and sources
//!
//! Every file lands at `DIR/<path>`, `path` as in [`FileSpec::path`]: `mnist/…`,
//! `fashion-mnist/…`, `cifar-10/cifar-10-batches-bin/…`, `optdigits/…`, the folders
//! `learn::loaders` looks in. A download first goes to `DIR/<path>.part`; a later run continues
//! it with an HTTP `Range` request. The file is renamed into place only after its size and
//! SHA-256 match.
//!
//! A base URL (`--base-url`, `FEDERICO_DATA_BASE_URL`) replaces every canonical source, for
//! mirrors and tests: a file is then fetched from `BASE/<path>` (`BASE/mnist/train-images-idx3-
//! ubyte.gz`) and an archive from `BASE/<its mirror path>` (`BASE/cifar-10/cifar-10-binary.
//! tar.gz`). A directory laid out like a data directory, plus that archive, served over HTTP is
//! a mirror.

mod download;
mod fetch;
pub mod progress;
mod verify;

pub use download::{DownloadReport, download};
pub use fetch::Fetcher;
pub use verify::{FileState, SetReport, verify};

use std::path::PathBuf;

/// One file federico reads, as it lies under the data directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileSpec<'a> {
    /// Path under the data directory, `/`-separated; its first component is the data set's
    /// folder (`mnist/train-images-idx3-ubyte.gz`).
    pub path: &'a str,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256, lower-case hex.
    pub sha256: &'a str,
}

impl FileSpec<'_> {
    /// The file's name, the last component of [`FileSpec::path`].
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(self.path)
    }
}

/// Where a data set's files come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source<'a> {
    /// Each file on its own, at `base` followed by the file's name.
    Files {
        /// The canonical folder URL, ending in `/`.
        base: &'a str,
    },
    /// One gzipped tar archive holding every file. Its member `M` becomes `DIR/<into>/M`; only
    /// the members that are files of the set are unpacked, each checked by its own hash.
    TarGz {
        /// The canonical URL of the archive.
        url: &'a str,
        /// Where the archive is under a base URL, and (with `.part`) where it is downloaded to
        /// under the data directory.
        mirror_path: &'a str,
        /// The folder under the data directory that the members are unpacked into.
        into: &'a str,
        /// The archive's size in bytes.
        bytes: u64,
        /// The archive's SHA-256, lower-case hex.
        sha256: &'a str,
    },
}

/// A data set: its name on the command line (also its folder) and its files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetSpec<'a> {
    /// `mnist`, `fashion-mnist`, `cifar-10`, `optdigits`.
    pub name: &'a str,
    /// Where the files come from.
    pub source: Source<'a>,
    /// Every file of the set.
    pub files: &'a [FileSpec<'a>],
}

impl<'a> SetSpec<'a> {
    /// The URL of `file` (one of this set's files, for a [`Source::Files`] set): the canonical
    /// one, or `BASE/<path>` under a base URL.
    pub fn file_url(&self, file: &FileSpec<'_>, base_url: Option<&str>) -> String {
        match (base_url, self.source) {
            (Some(base), _) => join_url(base, file.path),
            (None, Source::Files { base }) => join_url(base, file.name()),
            (None, Source::TarGz { url, .. }) => url.to_string(),
        }
    }

    /// The URL of the archive of a [`Source::TarGz`] set: the canonical one, or
    /// `BASE/<mirror_path>` under a base URL.
    pub fn archive_url(&self, base_url: Option<&str>) -> Option<String> {
        match self.source {
            Source::TarGz {
                url, mirror_path, ..
            } => Some(match base_url {
                Some(base) => join_url(base, mirror_path),
                None => url.to_string(),
            }),
            Source::Files { .. } => None,
        }
    }
}

/// `base` and `path` with exactly one `/` between them.
fn join_url(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

/// The environment variable that replaces every canonical source (`--base-url`).
pub const BASE_URL_ENV: &str = "FEDERICO_DATA_BASE_URL";

/// The data sets `federico data` knows, by name.
pub const SETS: &[SetSpec<'static>] = &[MNIST, FASHION_MNIST, CIFAR_10, OPTDIGITS];

/// The data set called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static SetSpec<'static>> {
    SETS.iter().find(|s| s.name == name)
}

// The table. Sizes and hashes are the official ones, as published with each data set or by
// the loaders that pin them; each block says where its values come from.

/// MNIST. Source: the PyTorch mirror of LeCun's files (torchvision's first MNIST mirror; the
/// original yann.lecun.com site no longer serves them reliably). Sizes and SHA-256s of the
/// original `.gz` files as loaders that fetch from this mirror pin them (e.g.
/// ankane/torchvision-ruby, `lib/torchvision/datasets/mnist.rb`); their md5s equal
/// torchvision's (`f68b3c2d…`, `d53e105e…`, `9fb629c4…`, `ec29112d…`).
const MNIST: SetSpec<'static> = SetSpec {
    name: "mnist",
    source: Source::Files {
        base: "https://ossci-datasets.s3.amazonaws.com/mnist/",
    },
    files: &[
        FileSpec {
            path: "mnist/train-images-idx3-ubyte.gz",
            bytes: 9_912_422,
            sha256: "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
        },
        FileSpec {
            path: "mnist/train-labels-idx1-ubyte.gz",
            bytes: 28_881,
            sha256: "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
        },
        FileSpec {
            path: "mnist/t10k-images-idx3-ubyte.gz",
            bytes: 1_648_877,
            sha256: "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        },
        FileSpec {
            path: "mnist/t10k-labels-idx1-ubyte.gz",
            bytes: 4_542,
            sha256: "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        },
    ],
};

/// Fashion-MNIST. Source: Zalando Research's own S3 site, as the data set's README links it.
/// SHA-256s of the `.gz` files as loaders that fetch from this site pin them; their md5s equal
/// those in zalandoresearch/fashion-mnist's README (`8d4fb7e6…`, `25c81989…`, `bef4ecab…`,
/// `bb300cfd…`).
const FASHION_MNIST: SetSpec<'static> = SetSpec {
    name: "fashion-mnist",
    source: Source::Files {
        base: "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    },
    files: &[
        FileSpec {
            path: "fashion-mnist/train-images-idx3-ubyte.gz",
            bytes: 26_421_880,
            sha256: "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        },
        FileSpec {
            path: "fashion-mnist/train-labels-idx1-ubyte.gz",
            bytes: 29_515,
            sha256: "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        },
        FileSpec {
            path: "fashion-mnist/t10k-images-idx3-ubyte.gz",
            bytes: 4_422_102,
            sha256: "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
        },
        FileSpec {
            path: "fashion-mnist/t10k-labels-idx1-ubyte.gz",
            bytes: 5_148,
            sha256: "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        },
    ],
};

/// CIFAR-10, binary version. Source: Alex Krizhevsky's page at the University of Toronto,
/// which publishes the archive's md5 (`c32a1d4ab5d03f1284b67883e8d87530`) but no SHA-256. The
/// archive's size and SHA-256 are those TensorFlow Datasets pins for this URL
/// (`url_checksums/cifar10.txt`; ankane/torchvision-ruby pins the same). The unpacked files'
/// SHA-256s are those torchvision-ruby (`lib/torchvision/datasets/cifar10.rb`) checks; the
/// five training batches' values were also reproduced independently from files with the
/// official per-file md5s (`5dd7e06a…`, `5ea93a67…`, `942cd6a4…`, `ae636b3b…`, `53f37980…`).
/// The archive also holds `batches.meta.txt` and `readme.html`, which federico does not read
/// and does not unpack.
const CIFAR_10: SetSpec<'static> = SetSpec {
    name: "cifar-10",
    source: Source::TarGz {
        url: "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
        mirror_path: "cifar-10/cifar-10-binary.tar.gz",
        into: "cifar-10",
        bytes: 170_052_171,
        sha256: "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
    },
    files: &[
        FileSpec {
            path: "cifar-10/cifar-10-batches-bin/data_batch_1.bin",
            bytes: CIFAR_BATCH_BYTES,
            sha256: "cee916563c9f80d84e3cc88e17fdc0941787f1244f00a67874d45b261883ada5",
        },
        FileSpec {
            path: "cifar-10/cifar-10-batches-bin/data_batch_2.bin",
            bytes: CIFAR_BATCH_BYTES,
            sha256: "a591ca11fa1708a91ee40f54b3da4784ccd871ecf2137de63f51ada8b3fa57ed",
        },
        FileSpec {
            path: "cifar-10/cifar-10-batches-bin/data_batch_3.bin",
            bytes: CIFAR_BATCH_BYTES,
            sha256: "bbe8596564c0f86427f876058170b84dac6670ddf06d79402899d93ceea26f67",
        },
        FileSpec {
            path: "cifar-10/cifar-10-batches-bin/data_batch_4.bin",
            bytes: CIFAR_BATCH_BYTES,
            sha256: "014e562d6e23c72197cc727519169a60359f5eccd8945ad5a09d710285ff4e48",
        },
        FileSpec {
            path: "cifar-10/cifar-10-batches-bin/data_batch_5.bin",
            bytes: CIFAR_BATCH_BYTES,
            sha256: "755304fc0b379caeae8c14f0dac912fbc7d6cd469eb67a1029a08a39453a9add",
        },
        FileSpec {
            path: "cifar-10/cifar-10-batches-bin/test_batch.bin",
            bytes: CIFAR_BATCH_BYTES,
            sha256: "8e2eb146ae340b09e24670f29cabc6326dba54da8789dab6768acf480273f65b",
        },
    ],
};

/// 10,000 records of 1 label byte and 3 × 1024 pixel bytes.
const CIFAR_BATCH_BYTES: u64 = 10_000 * 3_073;

/// UCI optdigits. Source: the UCI Machine Learning Repository's file archive. UCI publishes no
/// checksum: these SHA-256s were computed (`sha256sum`) over copies of UCI's two files whose
/// sizes, row counts (3,823 and 1,797) and class counts match UCI's `optdigits.names`, and whose
/// md5s (`268ce7771f3f15afbc54402478b1d454`, `a0339c30a8a5312a1b6f9e5c719dcce5`) equal the
/// ones published PyTorch loaders pin when they download from this URL.
const OPTDIGITS: SetSpec<'static> = SetSpec {
    name: "optdigits",
    source: Source::Files {
        base: "https://archive.ics.uci.edu/ml/machine-learning-databases/optdigits/",
    },
    files: &[
        FileSpec {
            path: "optdigits/optdigits.tra",
            bytes: 563_639,
            sha256: "e1b683cc211604fe8fd8c4417e6a69f31380e0c61d4af22e93cc21e9257ffedd",
        },
        FileSpec {
            path: "optdigits/optdigits.tes",
            bytes: 264_712,
            sha256: "6ebb3d2fee246a4e99363262ddf8a00a3c41bee6014c373ed9d9216ba7f651b8",
        },
    ],
};

/// Why a download or a check failed. Every variant names the file or URL.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The server answered with a status that is not success.
    #[error("GET {url}: HTTP {status}")]
    Status {
        /// The URL requested.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The request failed before or while the body arrived (DNS, connect, TLS, timeout, a
    /// dropped connection); what was received is kept in the `.part` file.
    #[error("GET {url}: {reason}; run the command again to resume from the {kept} bytes kept")]
    Network {
        /// The URL requested.
        url: String,
        /// What went wrong.
        reason: String,
        /// How many bytes the `.part` file holds now.
        kept: u64,
    },
    /// A file's content is not the published one; the bad download was removed.
    #[error(
        "{}: SHA-256 mismatch: expected {expected}, got {actual}{}",
        path.display(),
        if *removed { " (the download was removed)" } else { "" }
    )]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// The published SHA-256.
        expected: String,
        /// The SHA-256 of the bytes received.
        actual: String,
        /// Whether the bad file was deleted.
        removed: bool,
    },
    /// A file has not the published size; the bad download was removed.
    #[error("{}: expected {expected} bytes, got {actual} (the download was removed)", path.display())]
    Size {
        /// The file.
        path: PathBuf,
        /// The published size.
        expected: u64,
        /// The size received.
        actual: u64,
    },
    /// The archive could not be read, or lacks files of the set.
    #[error("{}: {reason}", path.display())]
    Archive {
        /// The archive.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A local file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> FetchError + '_ {
    move |source| FetchError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_canonical_or_under_the_base() {
        let mnist = find("mnist").unwrap();
        let f = &mnist.files[0];
        assert_eq!(
            mnist.file_url(f, None),
            "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz"
        );
        for base in ["http://127.0.0.1:8/m", "http://127.0.0.1:8/m/"] {
            assert_eq!(
                mnist.file_url(f, Some(base)),
                "http://127.0.0.1:8/m/mnist/train-images-idx3-ubyte.gz"
            );
        }
        let cifar = find("cifar-10").unwrap();
        assert_eq!(
            cifar.archive_url(None).unwrap(),
            "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
        );
        assert_eq!(
            cifar.archive_url(Some("http://h/")).unwrap(),
            "http://h/cifar-10/cifar-10-binary.tar.gz"
        );
        assert_eq!(mnist.archive_url(None), None);
    }

    #[test]
    fn every_file_lies_in_its_set_folder_with_a_well_formed_hash() {
        for set in SETS {
            assert!(!set.files.is_empty(), "{}", set.name);
            for f in set.files {
                assert!(
                    f.path.starts_with(&format!("{}/", set.name)),
                    "{} is outside {}/",
                    f.path,
                    set.name
                );
                assert!(f.bytes > 0);
                assert!(
                    f.sha256.len() == 64
                        && f.sha256
                            .bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                    "{}: bad hash {}",
                    f.path,
                    f.sha256
                );
            }
        }
        assert_eq!(
            SETS.iter().map(|s| s.name).collect::<Vec<_>>(),
            ["mnist", "fashion-mnist", "cifar-10", "optdigits"]
        );
    }
}
