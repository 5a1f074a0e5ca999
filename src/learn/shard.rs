//! One silo's data on disk (`federico partition` writes them, `federico node` reads its own):
//! features, labels and the train/test split, so each node loads only its own data.
//! Owns: the shard file format (header `FEDSHARD`, version 1, then bincode-2) and its checks.
//! Must not: partition anything (that is [`super::partition`]) or know about peers.

use super::data::{ClientData, DataError, Dataset};
use serde::{Deserialize, Serialize};
use std::path::Path;

const MAGIC: &[u8; 8] = b"FEDSHARD";
const VERSION: u32 = 1;

/// A shard: one silo's data and where it came from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Shard {
    /// The silo's name.
    pub silo: String,
    /// Its index in the federation (the manifest order).
    pub node: u32,
    /// The scenario and seed that produced the split (provenance).
    pub provenance: String,
    /// The data.
    pub data: ClientData,
}

fn bad(path: &Path, reason: impl Into<String>) -> DataError {
    DataError::Invalid(format!("shard {}: {}", path.display(), reason.into()))
}

impl Shard {
    /// Writes the shard atomically.
    pub fn write(&self, path: &Path) -> Result<(), DataError> {
        let mut bytes = crate::store::header(MAGIC, VERSION);
        bincode::serde::encode_into_std_write(self, &mut bytes, bincode::config::standard())
            .map_err(|e| bad(path, e.to_string()))?;
        crate::store::write_atomic(path, &bytes).map_err(|e| bad(path, e.to_string()))
    }

    /// Reads and checks a shard: header, decoding, and that features and labels agree.
    pub fn read(path: &Path) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|e| bad(path, e.to_string()))?;
        let body = crate::store::strip_header(&bytes, MAGIC, VERSION).map_err(|e| bad(path, e))?;
        let (shard, used): (Shard, usize) = crate::store::decode_bounded(body).map_err(|e| {
            // bincode's reason is a Rust debug dump; what a user can act on is the file.
            tracing::debug!(path = %path.display(), "shard decoding: {e}");
            let why = if e.starts_with("UnexpectedEnd") {
                "it ends early (truncated?)"
            } else {
                "its contents do not decode (corrupt, or written by another version?)"
            };
            bad(
                path,
                format!("{why}; write it again with `federico partition` or `federico init`"),
            )
        })?;
        if used != body.len() {
            return Err(bad(path, format!("{} trailing bytes", body.len() - used)));
        }
        for (part, d) in [("train", &shard.data.train), ("test", &shard.data.test)] {
            Dataset::new(d.features.clone(), d.sample_shape.clone(), d.labels.clone())
                .map_err(|e| bad(path, format!("{part} split: {e}")))?;
        }
        if shard.data.train.is_empty() {
            return Err(bad(path, "no training samples"));
        }
        Ok(shard)
    }
}
